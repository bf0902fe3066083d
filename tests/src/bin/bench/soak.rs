//! `cargo xtask soak`: repeated pressure episodes on a private containerd for a fixed time,
//! with the runtime restarted now and then and, with `--api-down-every`, the pods known
//! through a stand-in API server that goes down and comes back. Each episode starts one pod
//! that grows past the node's hard threshold; evictd must evict it, once, and nothing else,
//! and (with the API) its eviction must land on the pod's status, API restarts or not. At
//! the end: the counts, and evictd's resident memory and open file descriptors at the start
//! and the end, which must stay flat.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use evictd_tests::{
    api_double::{ApiDouble, free_port},
    containerd::{Containerd, PodSpec, TestPod},
    evictd_proc::Evictd,
    patience::patience,
    try_http_get,
};
use serde_json::json;

const MI: u64 = 1 << 20;

#[derive(clap::Args, Debug)]
pub struct Opts {
    /// How long to run, minutes (CI runs a short version).
    #[arg(long, default_value_t = 20.0)]
    minutes: f64,
    /// Restart the runtime every this many episodes (0: never).
    #[arg(long, default_value_t = 10)]
    restart_every: usize,
    /// Pods that run on the node throughout, each holding a few MiB, as on a full node
    /// (110 is the kubelet's default maximum): the episodes' pod must still be the one evicted.
    #[arg(long, default_value_t = 0)]
    pods: usize,
    /// Know the pods through a stand-in for the API server (no API server runs here), as a
    /// node with a kubeconfig does, and take it down for one episode every this many
    /// episodes: its watches break, the episode's eviction is recorded after it is back
    /// (0: no API server).
    #[arg(long, default_value_t = 0)]
    api_down_every: usize,
}

impl Opts {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.minutes > 0.0, "--minutes must be positive");
        Ok(())
    }
}

/// evictd's resident set (KiB) and open file descriptors.
fn footprint(pid: u32) -> (u64, usize) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    (status_kib(pid, "VmRSS"), fds)
}

/// A `Key:  N kB` line of evictd's /proc/<pid>/status (0 when it cannot be read).
fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let v = l.strip_prefix(key)?.strip_prefix(':')?;
            v.trim().trim_end_matches("kB").trim().parse().ok()
        })
        .unwrap_or(0)
}

/// How often the footprint is said during the soak: growth that levels off (pages touched
/// once: code, buffers sized by the node) and growth that goes on (a leak) look alike at the
/// two ends alone.
const FOOTPRINT_EVERY: Duration = Duration::from_secs(300);

/// evictd's footprint now, its resident set split into heap and stacks (RssAnon) and mapped
/// files (RssFile: its code, faulted in as paths are first taken).
fn say_footprint(pid: u32, started: Instant, episodes: usize) {
    let (rss, fds) = footprint(pid);
    eprintln!(
        "[soak] {:.0} min, {episodes} episodes: evictd RSS {rss} KiB (anon {} KiB, file {} KiB), open fds {fds}",
        started.elapsed().as_secs_f64() / 60.0,
        status_kib(pid, "RssAnon"),
        status_kib(pid, "RssFile"),
    );
}

#[derive(Default, Debug)]
struct Counts {
    episodes: usize,
    evicted: usize,
    missed: usize,
    /// Eviction records of a pod other than the episode's, or a second one of it.
    wrong_or_twice: usize,
    /// The episodes' pods (uids): every other pod evicted is a wrong eviction.
    episode_pods: BTreeSet<String>,
    restarts: usize,
    /// Times the API server went down and came back.
    api_restarts: usize,
    /// Evicted episode pods whose status the API server does not hold as Failed at the end.
    unrecorded: usize,
    /// Episodes whose pod evictd did not list from the API server before it grew (its watch
    /// did not recover from the last outage, say).
    unlisted: usize,
}

/// The node the stand-in API server serves the pods of.
const NODE: &str = "soak-node";

/// The pod as the API server holds it for the kubelet: BestEffort, running on `NODE`.
fn api_pod(pod: &TestPod) -> serde_json::Value {
    json!({
        "metadata": {"name": pod.name, "namespace": "e2e", "uid": pod.uid},
        "spec": {"nodeName": NODE, "priority": 0, "terminationGracePeriodSeconds": 30,
                 "containers": [{"name": "hog", "resources": {}}]},
        "status": {"phase": "Running"}
    })
}

/// What each node-wide pod holds, and what the node is given for each.
const BYSTANDER_MIB: u64 = 4;
const NODE_MIB_PER_BYSTANDER: u64 = 8;

pub async fn soak(o: &Opts) -> anyhow::Result<()> {
    let capacity = (1024 + NODE_MIB_PER_BYSTANDER * o.pods as u64) * MI;
    let mut ctd = Containerd::start(capacity);
    let mut api = (o.api_down_every > 0).then(ApiDouble::start);
    if let Some(api) = &api {
        api.put_node(json!({"metadata": {"name": NODE}, "status": {"conditions": []}}));
    }
    let mut bystanders = Vec::with_capacity(o.pods);
    for i in 0..o.pods {
        let pod = ctd.run_pod(PodSpec::besteffort(&format!("bystander{i}"))).await;
        pod.set_mib(BYSTANDER_MIB);
        if let Some(api) = &api {
            api.put_pod(api_pod(&pod));
        }
        bystanders.push(pod);
        if (i + 1) % 25 == 0 {
            eprintln!("[soak] {} of {} pods running", i + 1, o.pods);
        }
    }
    for pod in &bystanders {
        pod.wait_usage_at_least(BYSTANDER_MIB * MI, Duration::from_secs(30));
    }
    // Each episode's pod grows until 220 MiB are left, 80 MiB past the threshold: the same
    // crossing whatever the node holds besides.
    let grow_mib = (capacity.saturating_sub(ctd.node_usage()) / MI).saturating_sub(220);
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["--eviction-hard", "memory.available<300Mi"];
    if let Some(api) = &api {
        args.extend(["--kubeconfig", api.kubeconfig(), "--node-name", NODE, "--metrics-addr", &metrics]);
    }
    let evictd = Evictd::start(&ctd, None, &args);
    let deadline = Instant::now() + Duration::from_secs_f64(o.minutes * 60.0);
    eprintln!(
        "[soak] {:.1} min of pressure episodes beside {} pods, runtime restarted every {} episodes, {}; each episode's pod grows to {grow_mib} MiB",
        o.minutes,
        o.pods,
        o.restart_every,
        match o.api_down_every {
            0 => "no API server".to_owned(),
            n => format!("the API server down for one episode in {n}"),
        }
    );
    let mut c = Counts::default();
    let mut start = None;
    let started = Instant::now();
    let mut next_footprint = started;
    while Instant::now() < deadline {
        let api = api.as_mut().map(|api| {
            let down = (c.episodes + 1) % o.api_down_every == 0;
            ApiEpisode { api, down, metrics: &metrics, pods: o.pods }
        });
        episode(&mut ctd, api, &evictd, &mut c, grow_mib).await;
        // The footprint after the first episode: everything is loaded and warm by then.
        start.get_or_insert_with(|| footprint(evictd.pid()));
        if Instant::now() >= next_footprint {
            say_footprint(evictd.pid(), started, c.episodes);
            next_footprint += FOOTPRINT_EVERY;
        }
        if o.restart_every > 0 && c.episodes % o.restart_every == 0 {
            ctd.stop_daemon();
            ctd.spawn();
            ctd.wait_cri_ready().await;
            c.restarts += 1;
        }
    }
    // After the last episode too: a late second eviction shows here. Every record must
    // name an episode's pod, and no pod may appear twice.
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.wrong_or_twice = evictd
        .evictions()
        .iter()
        .filter(|e| e["error"].is_null() && !c.episode_pods.contains(e["uid"].as_str().unwrap_or("")))
        .count();
    let mut per_uid: BTreeMap<String, usize> = BTreeMap::new();
    for e in evictd.evictions().iter().filter(|e| e["error"].is_null()) {
        *per_uid.entry(e["uid"].as_str().unwrap_or("").to_owned()).or_default() += 1;
    }
    c.wrong_or_twice += per_uid.values().filter(|n| **n > 1).count();
    let (rss0, fds0) = start.unwrap_or_default();
    let (rss1, fds1) = footprint(evictd.pid());
    if let Some(api) = &api {
        c.unrecorded = wait_records_landed(api, &evictd, &c.episode_pods).await;
    }
    println!(
        "pods {}  episodes {}  evicted {}  missed {}  wrong-or-twice {}  runtime restarts {}  API restarts {}  not listed from the API {}  records not landed {}",
        o.pods,
        c.episodes,
        c.evicted,
        c.missed,
        c.wrong_or_twice,
        c.restarts,
        c.api_restarts,
        c.unlisted,
        c.unrecorded
    );
    println!("evictd RSS {rss0} KiB -> {rss1} KiB, open fds {fds0} -> {fds1}");
    anyhow::ensure!(
        c.missed == 0 && c.wrong_or_twice == 0 && c.unrecorded == 0 && c.unlisted == 0,
        "soak failed: {c:?}"
    );
    anyhow::ensure!(fds1 <= fds0 + 4, "evictd's open file descriptors grew: {fds0} -> {fds1}");
    anyhow::ensure!(rss1 <= rss0 + rss0 / 4 + 2048, "evictd's RSS grew: {rss0} KiB -> {rss1} KiB");
    Ok(())
}

/// One pod grows past the threshold; evictd must evict exactly it, once — not one of the
/// node's other pods, which hold a few MiB each.
async fn episode(
    ctd: &mut Containerd,
    mut api: Option<ApiEpisode<'_>>,
    evictd: &Evictd,
    c: &mut Counts,
    grow_mib: u64,
) {
    c.episodes += 1;
    let seen = evictd.evictions().len();
    let name = format!("soak{}", c.episodes);
    let pod = ctd.run_pod(PodSpec::besteffort(&name)).await;
    c.episode_pods.insert(pod.uid.clone());
    if let Some(a) = &mut api {
        // The kubelet runs only pods the API server gave it: evictd learns the pod through
        // the watch before it grows, and the API server may go down after that.
        a.api.put_pod(api_pod(&pod));
        if !a.wait_listed_from_api(evictd).await {
            c.unlisted += 1;
        }
        if a.down {
            a.api.go_down();
            c.api_restarts += 1;
        }
    }
    pod.set_mib(grow_mib);
    let until = Instant::now() + Duration::from_secs(30);
    let mine = loop {
        let new: Vec<_> = evictd.evictions().into_iter().skip(seen).collect();
        if let Some(e) = new.iter().find(|e| e["uid"] == pod.uid.as_str() && e["error"].is_null()) {
            let wrong: Vec<_> = new.iter().filter(|x| x["uid"] != pod.uid.as_str()).collect();
            for w in &wrong {
                eprintln!(
                    "[soak] episode {}: evicted {} ({}), not {name}",
                    c.episodes, w["name"], w["signal"]
                );
            }
            if !wrong.is_empty() {
                dump(evictd, &format!("episode-{}", c.episodes));
            }

            break Some(e.clone());
        }
        if Instant::now() > until {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    match mine {
        Some(_) => c.evicted += 1,
        None => {
            c.missed += 1;
            eprintln!("[soak] episode {}: {name} was not evicted within 30 s", c.episodes);
            dump(evictd, &format!("episode-{}", c.episodes));
        }
    }
    if let Some(a) = api {
        a.api.come_back();
    }
    let client = ctd.client();
    let _ = client.stop_pod_sandbox(&pod.sandbox_id).await;
    let _ = client.remove_pod_sandbox(&pod.sandbox_id).await;
    let _ = std::fs::remove_dir(&pod.cgroup);
    // A pressure that lasts until the runtime's cleanup is done would be a second crossing.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// An episode's API server: the pods it serves, and whether it goes down for the episode.
struct ApiEpisode<'a> {
    api: &'a mut ApiDouble,
    down: bool,
    /// evictd's metrics endpoint.
    metrics: &'a str,
    /// Pods running throughout.
    pods: usize,
}

impl ApiEpisode<'_> {
    /// Until evictd's inventory has every pod, the episode's included, with its spec from the
    /// API server; false when it does not within 10 s.
    async fn wait_listed_from_api(&self, evictd: &Evictd) -> bool {
        let want = format!("evictd_pods{{spec_source=\"api\"}} {}\n", self.pods + 1);
        let until = Instant::now() + patience(Duration::from_secs(10));
        while Instant::now() < until {
            let m = try_http_get(self.metrics, "/metrics").unwrap_or_default();
            if m.contains(&want) && m.contains("evictd_pods{spec_source=\"inferred\"} 0\n") {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!("[soak] evictd did not list every pod from the API server within 10 s");
        dump(evictd, "listing");
        false
    }
}

/// Waits up to 90 s (three of the reporter's longest back-offs) until the API server holds
/// every pod evictd evicted as Failed; returns how many it does not.
async fn wait_records_landed(api: &ApiDouble, evictd: &Evictd, episode_pods: &BTreeSet<String>) -> usize {
    let evicted: BTreeSet<String> = evictd
        .evictions()
        .iter()
        .filter(|e| e["error"].is_null())
        .filter_map(|e| e["uid"].as_str().map(str::to_owned))
        .filter(|uid| episode_pods.contains(uid))
        .collect();
    let not_landed = || {
        evicted
            .iter()
            .filter(|uid| api.pod(uid).is_none_or(|p| p["status"]["phase"] != "Failed"))
            .cloned()
            .collect::<Vec<_>>()
    };
    let until = Instant::now() + patience(Duration::from_secs(90));
    loop {
        let left = not_landed();
        if left.is_empty() || Instant::now() > until {
            for uid in &left {
                eprintln!("[soak] the API server never got the eviction of pod {uid}");
            }
            if !left.is_empty() {
                dump(evictd, "api");
                let calls: Vec<String> =
                    api.requests().iter().map(|r| format!("{} {} {}", r.method, r.path, r.body)).collect();
                eprintln!("[soak] the API server's requests:\n{}", calls.join("\n"));
            }
            return left.len();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What evictd saw and said, for whoever looks into a failed episode.
fn dump(evictd: &Evictd, what: &str) {
    let file = std::env::temp_dir().join(format!("evictd-soak-{what}.log"));
    let trace: Vec<String> = evictd.trace().iter().map(|v| v.to_string()).collect();
    let _ = std::fs::write(&file, format!("{}\n--- trace ---\n{}\n", evictd.log(), trace.join("\n")));
    eprintln!("[soak] {what}: evictd's log and trace in {}", file.display());
}
