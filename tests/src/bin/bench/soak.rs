//! `cargo xtask soak`: repeated pressure episodes on a private containerd for a fixed time,
//! with the runtime restarted now and then. Each episode starts one pod that grows past the
//! node's hard threshold; evictd must evict it, once, and nothing else. At the end: the
//! counts, and evictd's resident memory and open file descriptors at the start and the end,
//! which must stay flat.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use evictd_tests::{
    containerd::{Containerd, PodSpec},
    evictd_proc::Evictd,
};

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
}

impl Opts {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.minutes > 0.0, "--minutes must be positive");
        Ok(())
    }
}

/// evictd's resident set (KiB) and open file descriptors.
fn footprint(pid: u32) -> (u64, usize) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:").and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    (rss, fds)
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
}

/// What each node-wide pod holds, and what the node is given for each.
const BYSTANDER_MIB: u64 = 4;
const NODE_MIB_PER_BYSTANDER: u64 = 8;

pub async fn soak(o: &Opts) -> anyhow::Result<()> {
    let capacity = (1024 + NODE_MIB_PER_BYSTANDER * o.pods as u64) * MI;
    let mut ctd = Containerd::start(capacity);
    let mut bystanders = Vec::with_capacity(o.pods);
    for i in 0..o.pods {
        let pod = ctd.run_pod(PodSpec::besteffort(&format!("bystander{i}"))).await;
        pod.set_mib(BYSTANDER_MIB);
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
    let evictd = Evictd::start(&ctd, None, &["--eviction-hard", "memory.available<300Mi"]);
    let deadline = Instant::now() + Duration::from_secs_f64(o.minutes * 60.0);
    eprintln!(
        "[soak] {:.1} min of pressure episodes beside {} pods, runtime restarted every {} episodes; each episode's pod grows to {grow_mib} MiB",
        o.minutes, o.pods, o.restart_every
    );
    let mut c = Counts::default();
    let mut start = None;
    while Instant::now() < deadline {
        episode(&mut ctd, &evictd, &mut c, grow_mib).await;
        // The footprint after the first episode: everything is loaded and warm by then.
        start.get_or_insert_with(|| footprint(evictd.pid()));
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
    println!(
        "pods {}  episodes {}  evicted {}  missed {}  wrong-or-twice {}  runtime restarts {}",
        o.pods, c.episodes, c.evicted, c.missed, c.wrong_or_twice, c.restarts
    );
    println!("evictd RSS {rss0} KiB -> {rss1} KiB, open fds {fds0} -> {fds1}");
    anyhow::ensure!(c.missed == 0 && c.wrong_or_twice == 0, "soak failed: {c:?}");
    anyhow::ensure!(fds1 <= fds0 + 4, "evictd's open file descriptors grew: {fds0} -> {fds1}");
    anyhow::ensure!(rss1 <= rss0 + rss0 / 4 + 2048, "evictd's RSS grew: {rss0} KiB -> {rss1} KiB");
    Ok(())
}

/// One pod grows past the threshold; evictd must evict exactly it, once — not one of the
/// node's other pods, which hold a few MiB each.
async fn episode(ctd: &mut Containerd, evictd: &Evictd, c: &mut Counts, grow_mib: u64) {
    c.episodes += 1;
    let seen = evictd.evictions().len();
    let name = format!("soak{}", c.episodes);
    let pod = ctd.run_pod(PodSpec::besteffort(&name)).await;
    c.episode_pods.insert(pod.uid.clone());
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
                // What evictd saw and said, for whoever looks into it.
                let dump = std::env::temp_dir().join(format!("evictd-soak-episode-{}.log", c.episodes));
                let trace: Vec<String> = evictd.trace().iter().map(|v| v.to_string()).collect();
                let _ =
                    std::fs::write(&dump, format!("{}\n--- trace ---\n{}\n", evictd.log(), trace.join("\n")));
                eprintln!("[soak] episode {}: evictd's log and trace in {}", c.episodes, dump.display());
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
        }
    }
    let client = ctd.client();
    let _ = client.stop_pod_sandbox(&pod.sandbox_id).await;
    let _ = client.remove_pod_sandbox(&pod.sandbox_id).await;
    let _ = std::fs::remove_dir(&pod.cgroup);
    // A pressure that lasts until the runtime's cleanup is done would be a second crossing.
    tokio::time::sleep(Duration::from_millis(300)).await;
}
