//! End to end on a real containerd: a test memory cgroup plays the node (its limit is the
//! capacity), pods are created the way the kubelet creates them, evictd runs as the binary
//! users run (`--trace --json`), and the assertions read its eviction lines and the runtime's
//! own view of the pods. Needs root, BPF and containerd; skipped loudly otherwise.
//!
//! The scenarios share one machine's memory, so they run one at a time.

use std::time::{Duration, Instant};

use evictd_tests::{
    api_double::{ApiDouble, free_port},
    containerd::{self, Containerd, PodSpec, TestPod},
    dies_with_harness,
    evictd_proc::Evictd,
    http_get,
    scenario::{PodDef, SOFT_600MI_AFTER_1S, make_pods},
};

const MI: u64 = 1 << 20;
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// (a) Three pods of different QoS and priority; one grows past its request until the
/// node-level threshold is crossed: exactly the pod the engine ranks first is evicted, no
/// other, and its memory is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicts_exactly_the_top_ranked_pod_and_frees_its_memory() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("evicts_exactly_the_top_ranked_pod_and_frees_its_memory") {
        return;
    }
    the_top_ranked_pod_is_evicted_and_its_memory_freed(Containerd::start(1024 * MI)).await;
}

/// (a) with the kubelet's systemd cgroup driver, as most nodes run it: the pods' cgroups are
/// slices systemd makes (`kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`),
/// their containers scopes runc asks systemd for, and the runtime names each pod's cgroup by
/// its slice alone; evictd must find the directory that name spells, read it and stop the
/// right pod. `kubepods.slice` plays the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs systemd as PID 1 on cgroup v2: cargo xtask vm runs it in its trixie-systemd VM"]
async fn evicts_exactly_the_top_ranked_pod_of_the_systemd_slice_layout() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("evicts_exactly_the_top_ranked_pod_of_the_systemd_slice_layout") {
        return;
    }
    the_top_ranked_pod_is_evicted_and_its_memory_freed(Containerd::start_systemd(1024 * MI)).await;
}

async fn the_top_ranked_pod_is_evicted_and_its_memory_freed(mut ctd: Containerd) {
    let (pods, file) = make_pods(
        &mut ctd,
        &[
            PodDef {
                priority: 1000,
                request_mib: Some(200),
                limit_mib: Some(200),
                ..PodDef::new("api", "guaranteed")
            },
            PodDef { request_mib: Some(100), ..PodDef::new("worker", "burstable") },
            PodDef::new("batch", "besteffort"),
        ],
    )
    .await;
    let (api, worker, batch) = (&pods[0], &pods[1], &pods[2]);
    api.set_mib(150);
    batch.set_mib(100);
    worker.set_mib(150);
    for (p, mib) in [(api, 150), (batch, 100), (worker, 150)] {
        p.wait_usage_at_least(mib * MI, Duration::from_secs(10));
    }
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let evictd = Evictd::start(
        &ctd,
        Some(&file),
        &["--eviction-hard", "memory.available<400Mi", "--metrics-addr", &addr],
    );
    assert!(evictd.evictions().is_empty(), "nothing to evict yet");
    let before = ctd.node_usage();
    worker.set_mib(450);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "worker", "{e}");
    assert_eq!(e["signal"], "memory.available");
    assert_eq!(e["grace_period_seconds"], 1, "hard threshold");
    assert!(e["error"].is_null(), "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .starts_with("The node was low on resource: memory. Threshold quantity: 400Mi")
    );
    // No second eviction: the pressure is gone.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(evictd.evictions().len(), 1, "{:?}", evictd.evictions());
    assert!(!ctd.sandbox_ready(&worker.sandbox_id).await, "worker must be stopped");
    assert!(ctd.sandbox_ready(&api.sandbox_id).await && ctd.sandbox_ready(&batch.sandbox_id).await);
    // No process is left; a few KiB of kernel memory may stay charged to the pod cgroup.
    assert!(worker.usage() < MI, "the evicted pod's memory is released: {} bytes left", worker.usage());
    assert!(ctd.node_usage() < before, "memory freed: {} → {}", before, ctd.node_usage());
    // The metrics tell the same story.
    let metrics = http_get(&addr, "/metrics");
    assert!(metrics.contains("evictd_evictions_total{eviction_signal=\"memory.available\"} 1"), "{metrics}");
    assert!(metrics.contains("evictd_eviction_phase_seconds_count{phase=\"stop_sandbox\"} 1"), "{metrics}");
    // `evictd status` tells it on one screen: the threshold, and the eviction with its timings.
    let status = std::process::Command::new(evictd_tests::evictd_binary())
        .args(["status", "--addr", &addr])
        .output()
        .expect("running evictd status");
    let screen = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    assert!(screen.lines().any(|l| l.starts_with("memory.available ") && l.contains("400.0MiB")), "{screen}");
    let last = screen.lines().skip_while(|l| !l.starts_with("last evictions")).nth(2).unwrap_or_default();
    assert!(
        last.contains("/worker ") && last.contains("memory.available") && last.contains("evicted"),
        "{screen}"
    );
    assert!(
        last.split_whitespace().filter(|w| w.ends_with("ms")).count() >= 3,
        "detect, stop, sandbox: {last}"
    );
    let phases = &e["phases"];
    println!(
        "eviction phases: decide {} µs, stop containers {} ms, stop sandbox {} ms, memory released {} ms",
        e["decide_us"], phases["stop_containers_ms"], phases["stop_sandbox_ms"], phases["memory_released_ms"]
    );
}

/// (b) A static pod is never evicted, even when it is the largest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pod_is_never_evicted_even_when_largest() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("a_static_pod_is_never_evicted_even_when_largest") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (pods, file) = make_pods(
        &mut ctd,
        &[
            PodDef { static_pod: true, ..PodDef::new("kube-proxy", "besteffort") },
            PodDef::new("app", "besteffort"),
        ],
    )
    .await;
    let (kube_proxy, app) = (&pods[0], &pods[1]);
    kube_proxy.set_mib(400);
    app.set_mib(100);
    kube_proxy.wait_usage_at_least(400 * MI, Duration::from_secs(10));
    app.wait_usage_at_least(100 * MI, Duration::from_secs(10));
    // After app goes, the static pod's 400Mi still leaves less than 700Mi available.
    let evictd = Evictd::start(&ctd, Some(&file), &["--eviction-hard", "memory.available<700Mi"]);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "app", "{e}");
    // Pressure remains (the static pod holds 400Mi), yet it is never chosen.
    std::thread::sleep(Duration::from_secs(1));
    assert!(evictd.evictions().iter().all(|e| e["name"] != "kube-proxy"));
    assert!(ctd.sandbox_ready(&kube_proxy.sandbox_id).await);
    assert!(evictd.log().contains("critical"), "evictd says why it does not evict:\n{}", evictd.log());
}

/// (c) `--dry-run` decides and says so, and kills nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_kills_nothing() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("dry_run_kills_nothing") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (pods, file) =
        make_pods(&mut ctd, &[PodDef::new("hog", "besteffort"), PodDef::new("quiet", "besteffort")]).await;
    pods[0].set_mib(500);
    pods[0].wait_usage_at_least(500 * MI, Duration::from_secs(10));
    // An API server is configured, yet a dry run writes nothing to it.
    let api = ApiDouble::start();
    let evictd = Evictd::start(
        &ctd,
        Some(&file),
        &["--eviction-hard", "memory.available<600Mi", "--dry-run", "--kubeconfig", api.kubeconfig()],
    );
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "hog");
    assert_eq!(e["dry_run"], true);
    // It reads the node's pods (a dry run shows the real ranking), and writes nothing.
    let calls: Vec<String> = api.requests().iter().map(|r| format!("{} {}", r.method, r.path)).collect();
    assert!(calls.iter().any(|c| c.starts_with("GET /api/v1/pods?")), "{calls:?}");
    assert!(calls.iter().all(|c| c.starts_with("GET ")), "a dry run wrote to the API: {calls:?}");
    std::thread::sleep(Duration::from_secs(1));
    for p in &pods {
        assert!(ctd.sandbox_ready(&p.sandbox_id).await, "{} was stopped in a dry run", p.name);
    }
    assert!(pods[0].usage() >= 500 * MI);
    // Every wake (the 200 ms timer here) repeats the decision; the log says it once.
    let said = evictd.log().matches("dry run: would evict").count();
    assert_eq!(said, 1, "a dry-run decision is logged once, not on every wake:\n{}", evictd.log());
}

/// (d) The CRI socket goes away and comes back: evictd says so, keeps running, and evicts
/// correctly afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_the_runtime_going_away_and_evicts_after_it_returns() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("survives_the_runtime_going_away_and_evicts_after_it_returns") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (pods, file) =
        make_pods(&mut ctd, &[PodDef::new("grower", "besteffort"), PodDef::new("idle", "besteffort")]).await;
    pods[1].set_mib(50);
    let evictd = Evictd::start(&ctd, Some(&file), &["--eviction-hard", "memory.available<500Mi"]);
    let seen = |n: usize| move |log: &str| log.matches("container runtime reachable").count() >= n;
    let deadline = Instant::now() + evictd_tests::patience::patience(Duration::from_secs(10));
    while !seen(1)(&evictd.log()) {
        assert!(Instant::now() < deadline, "evictd never reached the runtime:\n{}", evictd.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    ctd.stop_daemon();
    let deadline = Instant::now() + evictd_tests::patience::patience(Duration::from_secs(10));
    while !evictd.log().contains("container runtime unavailable") {
        assert!(Instant::now() < deadline, "evictd did not report the runtime gone:\n{}", evictd.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    ctd.spawn();
    let deadline = Instant::now() + evictd_tests::patience::patience(Duration::from_secs(10));
    while !seen(2)(&evictd.log()) {
        assert!(Instant::now() < deadline, "evictd did not see the runtime back:\n{}", evictd.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    pods[0].set_mib(600);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "grower", "{e}");
    assert!(e["error"].is_null(), "{e}");
    assert!(!ctd.sandbox_ready(&pods[0].sandbox_id).await);
    assert!(ctd.sandbox_ready(&pods[1].sandbox_id).await);
}

/// (e) A pod that ignores SIGTERM, evicted for a soft threshold, is killed after its grace
/// period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_ignoring_sigterm_is_killed_after_its_grace_period() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("a_pod_ignoring_sigterm_is_killed_after_its_grace_period") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (pods, file) = make_pods(&mut ctd, &[PodDef::stubborn(2)]).await;
    pods[0].set_mib(500);
    pods[0].wait_usage_at_least(500 * MI, Duration::from_secs(10));
    let started_ns = evictd::vocab::monotonic_ns();
    let evictd = Evictd::start(&ctd, Some(&file), &SOFT_600MI_AFTER_1S);
    let e = evictd.wait_eviction(Duration::from_secs(30));
    assert_eq!(e["name"], "stubborn");
    assert_eq!(e["grace_period_seconds"], 2, "the pod's own grace period (max-pod-grace 0)");
    assert!(e["error"].is_null(), "{e}");
    let stop_ms = e["phases"]["stop_containers_ms"].as_f64().expect("phase timings");
    assert!(
        stop_ms >= 1900.0,
        "SIGTERM was ignored, so the stop must take the 2 s grace period, took {stop_ms} ms"
    );
    // The threshold was met from evictd's first observation (the pod was at 500 MiB before
    // it started): the decision must come at least the soft grace period (1 s) later. (The
    // stop's own 2 s are after the decision, so they cannot stand in for it.)
    let decided = e["decided_ns"].as_u64().expect("decided_ns");
    assert!(
        decided >= started_ns + 1_000_000_000,
        "decided {} ms after evictd started, before the 1 s soft grace period ran out",
        (decided - started_ns) / 1_000_000
    );
    assert!(!ctd.sandbox_ready(&pods[0].sandbox_id).await);
    assert!(pods[0].usage() < MI, "memory released: {} bytes left", pods[0].usage());
}

/// A process of this test's own, ended by PID when the test ends (also on failure).
struct Squatter(std::process::Child);

impl Drop for Squatter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// (f) The runtime stops the victim, but its cgroup keeps a process the runtime does not
/// own (as one stuck in D state would): the completed stop is the eviction, reported as not
/// released, and the next candidate is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_pod_whose_cgroup_keeps_a_process_is_still_one_eviction() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("a_stopped_pod_whose_cgroup_keeps_a_process_is_still_one_eviction") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (pods, file) = make_pods(
        &mut ctd,
        &[
            PodDef { request_mib: Some(100), ..PodDef::new("worker", "burstable") },
            PodDef::new("batch", "besteffort"),
        ],
    )
    .await;
    let (worker, batch) = (&pods[0], &pods[1]);
    batch.set_mib(100);
    batch.wait_usage_at_least(100 * MI, Duration::from_secs(10));
    let squatter =
        Squatter(dies_with_harness(std::process::Command::new("sleep").arg("600")).spawn().expect("sleep"));
    std::fs::write(worker.cgroup.join("cgroup.procs"), squatter.0.id().to_string())
        .expect("moving the squatter into the worker's pod cgroup");
    let evictd = Evictd::start(
        &ctd,
        Some(&file),
        &["--eviction-hard", "memory.available<400Mi", "--release-timeout", "1s"],
    );
    worker.set_mib(650);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "worker", "{e}");
    assert!(e["error"].is_null(), "a completed stop is the eviction: {e}");
    assert!(e["phases"]["memory_released_ms"].is_null(), "the squatter keeps the cgroup busy: {e}");
    // Past the release timeout, and then some: still one eviction, and batch untouched.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(evictd.evictions().len(), 1, "{:?}", evictd.evictions());
    assert!(ctd.sandbox_ready(&batch.sandbox_id).await, "the next candidate must not be evicted too");
    assert!(!ctd.sandbox_ready(&worker.sandbox_id).await);
    assert!(evictd.log().contains("still holds a process"), "the slow release is reported");
    drop(squatter);
}

/// (i2) Released means the memory came back, not that the processes exited: a pod holding
/// most of its memory in a memory-medium emptyDir (a tmpfs on the host, bind-mounted into
/// its container, so stopping the sandbox does not release it) is evicted; its memory stays
/// charged, the node stays past the threshold, and still the next pod is not evicted while
/// that memory is awaited (the kubelet's `waitForPodsCleanup`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_memory_outlives_its_processes_is_one_eviction() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("a_pod_whose_memory_outlives_its_processes_is_one_eviction") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let holder = ctd
        .run_pod(PodSpec {
            hog_args: Some(["fill", "/ctl/mib", "/scratch/fill"].map(String::from).to_vec()),
            empty_dir_under: Some(ctd.tmp.join("kubelet")),
            empty_dir_in_memory: true,
            ..PodSpec::besteffort("holder")
        })
        .await;
    let bystander = ctd.run_pod(PodSpec::besteffort("bystander")).await;
    bystander.set_mib(50);
    bystander.wait_usage_at_least(50 * MI, Duration::from_secs(10));
    let item = |name: &str, uid: &str| {
        serde_json::json!({"metadata": {"name": name, "namespace": "e2e", "uid": uid},
            "spec": {"containers": [{"name": "hog"}],
                     "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory"}}]},
            "status": {"phase": "Running"}})
    };
    let file = ctd.tmp.join("pods.json");
    let list = serde_json::json!({"kind": "PodList",
        "items": [item("holder", &holder.uid), item("bystander", &bystander.uid)]});
    std::fs::write(&file, list.to_string()).expect("pods file");
    let evictd = Evictd::start(&ctd, Some(&file), &["--eviction-hard", "memory.available<400Mi"]);
    holder.set_mib(650);
    let e = evictd.wait_eviction(Duration::from_secs(30));
    assert_eq!(e["name"], "holder", "{e}");
    assert!(e["error"].is_null(), "{e}");
    // The processes are gone, the tmpfs pages are not. The kill came as the node crossed
    // the threshold, so freeing the processes' own pages can leave it a hair short of it,
    // a dip the wait must outlast: the bystander grows by 30 MiB to put the node past it
    // again (far from the 200Mi emergency), so that a second eviction has a pressure to
    // answer and must be held back by the wait.
    bystander.set_mib(80);
    bystander.wait_usage_at_least(80 * MI, Duration::from_secs(10));
    let charged = ctd.node_usage();
    assert!(
        charged > 624 * MI,
        "the tmpfs and the bystander keep {} MiB charged: the node must be past 400Mi of 1024",
        charged / MI
    );
    std::thread::sleep(Duration::from_secs(5));
    let evictions = evictd.evictions();
    // Why a wait ended, when one did: evictd's log says it ("the evicted pod's memory is back").
    assert_eq!(
        evictions.len(),
        1,
        "one eviction for one pressure: {evictions:?}\nevictd's log:\n{}",
        evictd.log()
    );
    assert!(ctd.sandbox_ready(&bystander.sandbox_id).await, "the bystander frees nothing and stays");
    assert!(evictd.log().contains("waits for that memory"), "the wait is said: {}", evictd.log());
}

/// A pod that ignores SIGTERM, under a soft threshold, with a 30 s grace period of its own.
async fn stubborn_under_soft_pressure(ctd: &mut Containerd) -> (TestPod, Evictd) {
    let (mut pods, file) = make_pods(ctd, &[PodDef::stubborn(30)]).await;
    let pod = pods.remove(0);
    pod.set_mib(500);
    pod.wait_usage_at_least(500 * MI, Duration::from_secs(10));
    let evictd = Evictd::start(
        ctd,
        Some(&file),
        &[
            "--eviction-hard",
            "memory.available<250Mi",
            "--eviction-soft",
            "memory.available<600Mi",
            "--eviction-soft-grace-period",
            "memory.available=1s",
        ],
    );
    (pod, evictd)
}

/// (g) A hard threshold is never waiting behind a soft eviction's grace period. The soft
/// eviction gives the pod 30 s; when the node then crosses the hard threshold, the stop is
/// cut to the hard eviction's 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_threshold_cuts_a_soft_evictions_grace_period_short() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("a_hard_threshold_cuts_a_soft_evictions_grace_period_short") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (pod, evictd) = stubborn_under_soft_pressure(&mut ctd).await;
    // Past the soft grace period the stop (30 s, SIGTERM ignored) is under way; then the
    // pod grows past the hard threshold.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(evictd.evictions().is_empty(), "the 30 s stop cannot have ended yet");
    pod.set_mib(850);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "stubborn", "{e}");
    assert_eq!(e["grace_period_seconds"], 30, "decided as a soft eviction: {e}");
    let stop_ms = e["phases"]["stop_containers_ms"].as_f64().expect("phase timings");
    assert!(stop_ms < 10_000.0, "the hard threshold must cut the 30 s grace period short, took {stop_ms} ms");
    assert!(
        evictd.log().contains("a hard threshold is met during the 30 s grace period"),
        "{}",
        evictd.log()
    );
}

/// (h) SIGTERM is answered while a soft eviction's grace period runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_is_answered_during_a_long_grace_period() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("sigterm_is_answered_during_a_long_grace_period") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (_pod, mut evictd) = stubborn_under_soft_pressure(&mut ctd).await;
    std::thread::sleep(Duration::from_millis(2500));
    assert!(evictd.evictions().is_empty(), "the 30 s stop is under way");
    let took = evictd.terminate(Duration::from_secs(5));
    assert!(took.is_some(), "evictd did not exit within 5 s of SIGTERM during a 30 s grace period");
}

/// (i) `--hard-eviction-grace-period 0` kills at once, without the runtime: the pod ignores
/// SIGTERM and asks for 30 s, yet it is killed by evictd (`cgroup.kill` on this node, whose
/// runc places containers in the unified hierarchy too), and the CRI stop that follows only
/// does the runtime's bookkeeping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_hard_grace_period_kills_at_once_without_the_runtime() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("a_zero_hard_grace_period_kills_at_once_without_the_runtime") {
        return;
    }
    a_stubborn_pod_is_killed_at_once_by_its_cgroup(Containerd::start(1024 * MI)).await;
}

/// (i) with the systemd cgroup driver: `cgroup.kill` on the pod's slice ends the processes
/// of the scopes systemd made for runc, and the runtime's stop that follows still succeeds
/// (systemd may already have removed the emptied scope).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs systemd as PID 1 on cgroup v2: cargo xtask vm runs it in its trixie-systemd VM"]
async fn a_zero_hard_grace_period_kills_a_pod_of_the_systemd_slice_layout() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("a_zero_hard_grace_period_kills_a_pod_of_the_systemd_slice_layout") {
        return;
    }
    a_stubborn_pod_is_killed_at_once_by_its_cgroup(Containerd::start_systemd(1024 * MI)).await;
}

async fn a_stubborn_pod_is_killed_at_once_by_its_cgroup(mut ctd: Containerd) {
    let (pods, file) = make_pods(&mut ctd, &[PodDef::stubborn(30), PodDef::bystander()]).await;
    let (stubborn, bystander) = (&pods[0], &pods[1]);
    stubborn.set_mib(300);
    stubborn.wait_usage_at_least(300 * MI, Duration::from_secs(10));
    let evictd = Evictd::start(
        &ctd,
        Some(&file),
        &["--eviction-hard", "memory.available<400Mi", "--hard-eviction-grace-period", "0"],
    );
    stubborn.set_mib(700);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "stubborn", "{e}");
    assert!(e["error"].is_null(), "{e}");
    assert_eq!(e["grace_period_seconds"], 0, "{e}");
    let fast = &e["phases"]["fast_kill"];
    assert_eq!(fast["urgency"], "hard", "{e}");
    assert_eq!(fast["method"], "cgroup-kill", "{e}");
    // Pinned after cgroup.kill: the ones still dying then (a 700 MiB hog, as a rule).
    assert!(fast["processes"].as_u64().is_some(), "{e}");
    assert!(e["phases"]["memory_released_ms"].is_number(), "the pod's cgroup must empty: {e}");
    let stop_ms = e["phases"]["stop_containers_ms"].as_f64().expect("phase timings");
    // Killed at once; a runtime whose own stop runs on (containerd under the VMs' TCG) is
    // waited for at most the CRI timeout (10 s) after the kill: either way, not the 30 s.
    assert!(stop_ms < 20_000.0, "a pod ignoring SIGTERM must not get its 30 s: took {stop_ms} ms");
    assert!(ctd.sandbox_ready(&bystander.sandbox_id).await, "the bystander must not be touched");
    assert_eq!(evictd.evictions().len(), 1, "one pod per decision: {:?}", evictd.evictions());
    // Where the charge programs follow the band (the memcg stat tracepoints' tier: this
    // host's kernel), the victim exits without them, and the pass after the kill attaches
    // them again: the node is still within the band. The batched hook (Debian's kernels in
    // the VMs) never runs on an exit.
    let log = evictd.log();
    let batched = log.contains("batched charge hook (fexit page_counter_try_charge) watches the node");
    let banded = log.contains("charge programs attached only near a memory threshold");
    assert!(batched || banded, "neither charge tier is reported; evictd log:\n{log}");
    if banded {
        evictd.wait_for_log(
            "the charge programs off for the exit, then on again",
            Duration::from_secs(10),
            |l| {
                l.find("charge programs detached while an evicted pod exits").is_some_and(|at| {
                    l[at..].contains("charge programs attached: a memory threshold is near")
                })
            },
        );
    }
}

/// (j) A soft eviction's stop (30 s, SIGTERM ignored) is under way when the node falls
/// below the emergency level: the pod is killed at once rather than left to the kernel's
/// OOM killer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emergency_during_a_grace_period_kills_at_once() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("an_emergency_during_a_grace_period_kills_at_once") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (mut pods, file) = make_pods(&mut ctd, &[PodDef::stubborn(30)]).await;
    let pod = pods.remove(0);
    pod.set_mib(500);
    pod.wait_usage_at_least(500 * MI, Duration::from_secs(10));
    let mut args = SOFT_600MI_AFTER_1S.to_vec();
    args.extend(["--emergency-available", "400Mi"]);
    let evictd = Evictd::start(&ctd, Some(&file), &args);
    std::thread::sleep(Duration::from_millis(2500));
    assert!(evictd.evictions().is_empty(), "the 30 s stop cannot have ended yet");
    pod.set_mib(700);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "stubborn", "{e}");
    assert_eq!(e["grace_period_seconds"], 30, "decided as a soft eviction: {e}");
    assert_eq!(e["phases"]["fast_kill"]["urgency"], "emergency", "{e}");
    let stop_ms = e["phases"]["stop_containers_ms"].as_f64().expect("phase timings");
    assert!(stop_ms < 10_000.0, "the emergency must cut the 30 s grace period short, took {stop_ms} ms");
    // The stop cut short names the emergency: the signal below the level, or the kernel.
    let log = evictd.log();
    let said = log.lines().find(|l| l.contains("killing now"));
    assert!(
        said.is_some_and(
            |l| l.contains("below the emergency level of 400.0 MiB") || l.contains("the kernel reclaims")
        ),
        "{log}"
    );
}

/// (k) With an API server (the test's double: none can run here), an eviction ends with the
/// pod's sandbox stopped and its Failed/Evicted status patch recorded, with the pod's uid as
/// precondition, then the events; evictd's node condition turns True and its taint goes on
/// the Node (one an earlier run left came off at start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_is_recorded_in_the_api_as_the_kubelets() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("an_eviction_is_recorded_in_the_api_as_the_kubelets") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (pods, file) = make_pods(
        &mut ctd,
        &[
            PodDef { request_mib: Some(100), ..PodDef::new("worker", "burstable") },
            PodDef::new("quiet", "besteffort"),
        ],
    )
    .await;
    let (worker, quiet) = (&pods[0], &pods[1]);
    let api = ApiDouble::start();
    api.put_node(serde_json::json!({"metadata": {"name": "e2e-node"}, "spec": {"taints": [
        {"key": "evictd.io/memory-pressure", "effect": "NoSchedule"},
        {"key": "dedicated", "effect": "NoSchedule"}]}}));
    let evictd = Evictd::start(
        &ctd,
        Some(&file),
        &[
            "--eviction-hard",
            "memory.available<400Mi",
            "--kubeconfig",
            api.kubeconfig(),
            "--node-name",
            "e2e-node",
        ],
    );
    let taint_keys = || -> Vec<String> {
        let node = api.node("e2e-node").expect("the node");
        let taints = node["spec"]["taints"].as_array().cloned().unwrap_or_default();
        taints.iter().filter_map(|t| t["key"].as_str().map(String::from)).collect()
    };
    // The first pass reports evictd's conditions, all False; the taint a run that died under
    // pressure left comes off then, the other stays.
    api.wait_for("the first node conditions", Duration::from_secs(10), |r| {
        r.iter().any(|r| r.path.starts_with("/api/v1/nodes/e2e-node/status"))
    });
    api.wait_for("the taint left behind removed", Duration::from_secs(10), |r| {
        r.iter().any(|r| r.method == "PATCH" && r.path.starts_with("/api/v1/nodes/e2e-node?"))
    });
    assert_eq!(taint_keys(), ["dedicated"]);
    worker.set_mib(700);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "worker", "{e}");
    assert!(e["error"].is_null(), "{e}");
    let status = format!("/api/v1/namespaces/e2e/pods/{}/status", worker.name);
    let seen =
        api.wait_for("the condition, the status patch and both events", Duration::from_secs(10), |r| {
            r.iter().filter(|r| r.path.starts_with(&status)).count() >= 2
                && r.iter().filter(|r| r.path.contains("/events")).count() >= 2
        });
    assert!(!ctd.sandbox_ready(&worker.sandbox_id).await, "the worker's sandbox is stopped");
    assert!(ctd.sandbox_ready(&quiet.sandbox_id).await);
    // First the DisruptionTarget condition alone, queued before the stop; then the phase.
    let patches: Vec<_> = seen.iter().filter(|r| r.path.starts_with(&status)).collect();
    assert_eq!(patches[0].body["status"]["conditions"][0]["type"], "DisruptionTarget");
    assert!(patches[0].body["status"].get("phase").is_none(), "{}", patches[0].body);
    let patch = patches.iter().find(|r| r.body["status"]["phase"].is_string()).expect("the status patch");
    assert_eq!(patch.body["metadata"]["uid"], worker.uid.as_str());
    assert_eq!(patch.body["status"]["phase"], "Failed");
    assert_eq!(patch.body["status"]["reason"], "Evicted");
    assert_eq!(patch.body["status"]["message"], e["message"]);
    assert_eq!(patch.body["status"]["conditions"][0]["type"], "DisruptionTarget");
    let pod_event = seen.iter().find(|r| r.body["reason"] == "Evicted").expect("the pod's event");
    assert_eq!(pod_event.body["metadata"]["annotations"]["starved_resource"], "memory");
    assert_eq!(pod_event.body["metadata"]["annotations"]["offending_containers"], "hog");
    api.wait_for("EvictdMemoryPressure True", Duration::from_secs(10), |r| {
        r.iter().any(|r| {
            r.path.starts_with("/api/v1/nodes/e2e-node/status")
                && r.body["status"]["conditions"][0]["status"] == "True"
        })
    });
    // And the node is tainted, so the scheduler does not put the worker straight back.
    api.wait_for("the memory-pressure taint", Duration::from_secs(10), |r| {
        r.iter().filter(|r| r.method == "PATCH" && r.path.starts_with("/api/v1/nodes/e2e-node?")).count() >= 2
    });
    assert_eq!(taint_keys(), ["dedicated", "evictd.io/memory-pressure"]);
    let log = evictd.log();
    let window = log.lines().find(|l| l.contains("as Failed/Evicted")).unwrap_or_else(|| panic!("{log}"));
    println!("kill → status patch recorded: {window}");
}

/// (l) An API server that never answers costs the kill nothing: the pod is stopped while
/// evictd's status patch is still waiting for its answer, and evictd still exits promptly on
/// SIGTERM (the flush of what is queued is bounded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_that_never_answers_does_not_delay_the_kill() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("an_api_server_that_never_answers_does_not_delay_the_kill") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (pods, file) = make_pods(&mut ctd, &[PodDef::new("hog", "besteffort")]).await;
    let api = ApiDouble::start();
    api.hold();
    let mut evictd = Evictd::start(
        &ctd,
        Some(&file),
        &[
            "--eviction-hard",
            "memory.available<400Mi",
            "--kubeconfig",
            api.kubeconfig(),
            "--node-name",
            "e2e-node",
        ],
    );
    pods[0].set_mib(700);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "hog", "{e}");
    assert!(e["error"].is_null(), "{e}");
    assert!(!ctd.sandbox_ready(&pods[0].sandbox_id).await, "stopped");
    api.wait_for("the status patch, held", Duration::from_secs(10), |r| {
        r.iter().any(|r| r.path.contains("/pods/hog/status"))
    });
    assert_eq!(api.answered(), 0, "the kill completed while the API server had answered nothing");
    let took = evictd
        .terminate(Duration::from_secs(15))
        .expect("evictd exits on SIGTERM with the API server silent");
    assert!(took < Duration::from_secs(10), "exit took {took:?}");
}

/// (m) Pod specs from the API server drive the ranking. No pods file: the double serves this
/// node's pods (and one of another node's). Inferred from the node, the two burstable pods
/// would both be priority 0 and the bigger one would go first (as in (a)); the API says the
/// bigger one has priority 1000, so the smaller one is evicted. A third pod, BestEffort and
/// the furthest over its request, is Failed in the API while its sandbox still runs (the
/// kubelet not yet done tearing it down): a finished pod is never ranked, so it stays too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_specs_from_the_api_server_drive_the_ranking() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("pod_specs_from_the_api_server_drive_the_ranking") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (pods, file) = make_pods(
        &mut ctd,
        &[
            PodDef { priority: 1000, request_mib: Some(100), ..PodDef::new("big", "burstable") },
            PodDef { request_mib: Some(100), ..PodDef::new("small", "burstable") },
            PodDef::new("done", "besteffort"),
        ],
    )
    .await;
    let (big, small, done) = (&pods[0], &pods[1], &pods[2]);
    let api = ApiDouble::start();
    let list: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    for mut pod in list["items"].as_array().unwrap().iter().cloned() {
        pod["spec"]["nodeName"] = "e2e-node".into();
        if pod["metadata"]["name"] == "done" {
            pod["status"]["phase"] = "Failed".into();
        }
        api.put_pod(pod);
    }
    let mut stranger = list["items"][0].clone();
    stranger["metadata"]["uid"] = "not-on-this-node".into();
    stranger["spec"]["nodeName"] = "another-node".into();
    api.put_pod(stranger);
    big.set_mib(150);
    small.set_mib(200);
    done.set_mib(150);
    for (p, mib) in [(big, 150), (small, 200), (done, 150)] {
        p.wait_usage_at_least(mib * MI, Duration::from_secs(10));
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let evictd = Evictd::start(
        &ctd,
        None,
        &[
            "--eviction-hard",
            "memory.available<400Mi",
            "--kubeconfig",
            api.kubeconfig(),
            "--node-name",
            "e2e-node",
            "--metrics-addr",
            &addr,
        ],
    );
    // Both pods have their specs from the API before the pressure comes.
    let t = Instant::now();
    while !http_get(&addr, "/metrics").contains("evictd_pods{spec_source=\"api\"} 3") {
        assert!(t.elapsed() < Duration::from_secs(15), "{}\n{}", http_get(&addr, "/metrics"), evictd.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(http_get(&addr, "/metrics").contains("evictd_pods{spec_source=\"inferred\"} 0"));
    // The DaemonSet's probes: alive, and ready once the inventory is in.
    for probe in ["/healthz", "/readyz"] {
        let answer = http_get(&addr, probe);
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("\r\n\r\nok\n"), "{probe}: {answer}");
    }
    big.set_mib(450);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(
        e["name"], "small",
        "the API's priority 1000 protects the bigger pod, and a finished pod is not ranked: {e}"
    );
    assert!(e["error"].is_null(), "{e}");
    assert!(ctd.sandbox_ready(&big.sandbox_id).await);
    assert!(ctd.sandbox_ready(&done.sandbox_id).await);
    let list = api.requests().into_iter().find(|r| r.method == "GET").expect("the list");
    assert!(list.path.contains("fieldSelector=spec.nodeName%3De2e-node"), "{}", list.path);
}

/// The node's (max tasks, tasks now), read as the kubelet reads them: the lower of pid_max
/// and threads-max, and the task count in /proc/loadavg.
fn node_pids() -> (i64, i64) {
    let read = |p: &str| std::fs::read_to_string(p).expect(p).trim().parse::<i64>().expect(p);
    let max = read("/proc/sys/kernel/pid_max").min(read("/proc/sys/kernel/threads-max"));
    let loadavg = std::fs::read_to_string("/proc/loadavg").expect("/proc/loadavg");
    let tasks = loadavg.split_whitespace().nth(3).and_then(|f| f.split_once('/')).expect("tasks field").1;
    (max, tasks.parse().expect("task count"))
}

/// (n) PID pressure on the real node: a pod forking 400 processes takes pid.available past
/// a threshold set 200 below what the node had; that pod, the one with the most processes
/// (`pids.current` of its cgroup), is evicted, and the quiet pod stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_that_forks_past_pid_pressure_is_evicted() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("the_pod_that_forks_past_pid_pressure_is_evicted") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let forker = ctd
        .run_pod(PodSpec {
            hog_args: Some(["fork", "/ctl/mib"].map(String::from).to_vec()),
            ..PodSpec::besteffort("forker")
        })
        .await;
    let quiet = ctd.run_pod(PodSpec::besteffort("quiet")).await;
    let (max, tasks) = node_pids();
    let threshold = format!("pid.available<{}", max - tasks - 200);
    let evictd = Evictd::start(&ctd, None, &["--eviction-hard", &threshold]);
    std::thread::sleep(Duration::from_secs(1));
    assert!(evictd.evictions().is_empty(), "nothing forked yet: {:?}", evictd.evictions());
    forker.set_mib(400);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "forker", "{e}");
    assert_eq!(e["signal"], "pid.available", "{e}");
    assert!(e["message"].as_str().unwrap().starts_with("The node was low on resource: pids."), "{e}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(evictd.evictions().len(), 1, "{:?}", evictd.evictions());
    assert!(ctd.sandbox_ready(&quiet.sandbox_id).await);
}

/// The inventory's CRI lists, their decoding and its connection run on evictd's background
/// thread (`evictd-io`, not real-time), not on the daemon's real-time thread, where
/// they would sit between a wake and its decision. With a list every 50 ms of a node's pods
/// and no pressure, the background thread works and the daemon's own thread, which then only
/// answers the timer, uses less than it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inventory_runs_off_the_daemon_thread() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("the_inventory_runs_off_the_daemon_thread") {
        return;
    }
    use evictd_tests::evictd_proc::thread_cpu_s;
    let mut ctd = Containerd::start(1024 * MI);
    let names = ["p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "p10", "p11"];
    let defs: Vec<PodDef> = names.iter().map(|n| PodDef::new(n, "besteffort")).collect();
    let (_pods, file) = make_pods(&mut ctd, &defs).await;
    let evictd = Evictd::start(&ctd, Some(&file), &["--inventory-interval", "50ms"]);
    evictd.wait_for_log("the runtime reached", Duration::from_secs(10), |log| {
        log.contains("container runtime reachable")
    });
    let pid = evictd.pid();
    let cpu = || (thread_cpu_s(pid, "evictd"), thread_cpu_s(pid, "evictd-io"));
    let (daemon0, background0) = cpu();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (daemon, background) = cpu();
    let (daemon, background) = (daemon - daemon0, background - background0);
    println!("CPU over 4 s: daemon thread {daemon:.2} s, evictd-io {background:.2} s");
    assert!(background > 0.0, "no CPU on an evictd-io thread: the inventory does not run there");
    assert!(
        daemon < background,
        "the daemon's thread used {daemon:.2} s against evictd-io's {background:.2} s: the inventory runs on it"
    );
}

/// The API server's watch of the node's pods — the TLS stream, its JSON decoding, each
/// pod's reading as a spec — runs on evictd's background thread (`evictd-io`), where the
/// client was made, not on the daemon's real-time thread. 250 pods of the node, each with a
/// kubelet's status (containers, conditions), are updated in the API server as the kubelet
/// updates them all day: status only, which changes no spec. The background thread does the
/// work; the daemon's own thread, which then only answers the timer, uses under a tenth of
/// it. The API server is the test's double (none can run here), speaking TLS with a CA and a
/// bearer token of its own, as a real one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_watch_runs_off_the_daemon_thread() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("the_api_watch_runs_off_the_daemon_thread") {
        return;
    }
    use evictd_tests::evictd_proc::thread_cpu_s;
    let ctd = Containerd::start(1024 * MI);
    let api = ApiDouble::start_tls();
    const PODS: usize = 250;
    for n in 0..PODS {
        api.put_pod(pod_with_a_kubelets_status(n, 0));
    }
    let evictd = Evictd::start(
        &ctd,
        None,
        &[
            "--dry-run",
            "--kubeconfig",
            api.kubeconfig(),
            "--node-name",
            "e2e-node",
            "--inventory-interval",
            "10s",
        ],
    );
    evictd.wait_for_log("the first list of the node's pods", Duration::from_secs(20), |log| {
        log.contains("pod specs from the Kubernetes API")
    });
    let pid = evictd.pid();
    let cpu = || (thread_cpu_s(pid, "evictd"), thread_cpu_s(pid, "evictd-io"));
    let (daemon0, background0) = cpu();
    let t = Instant::now();
    let mut updates = 0;
    while t.elapsed() < Duration::from_secs(4) {
        for _ in 0..10 {
            updates += 1;
            api.put_pod(pod_with_a_kubelets_status(updates % PODS, updates));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The last updates decoded before the reading.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (daemon, background) = cpu();
    let (daemon, background) = (daemon - daemon0, background - background0);
    println!(
        "{updates} status updates over 4 s: CPU of the daemon thread {daemon:.3} s, evictd-io {background:.3} s"
    );
    // No relist or runtime list comes within these 4 s (a watch lasts minutes, the inventory
    // runs every 10 s here): evictd-io's CPU is the updates'.
    assert!(background > 0.2, "{background:.3} s of CPU on evictd-io: the watch does not run there");
    // A tenth: the decoding on the daemon's thread and the connection on evictd-io would
    // split the work about evenly.
    assert!(
        daemon * 10.0 < background,
        "the daemon's thread used {daemon:.3} s against evictd-io's {background:.3} s: part of the watch runs on it"
    );
    assert!(evictd.evictions().is_empty(), "{:?}", evictd.evictions());
}

/// Pod `n` of the node as the API server holds it once the kubelet runs it: a spec and a
/// status with four containers; `generation` changes the status alone.
fn pod_with_a_kubelets_status(n: usize, generation: usize) -> serde_json::Value {
    let container = |c: usize, env: &[serde_json::Value]| {
        serde_json::json!({
            "name": format!("c{c}"), "image": "registry.example/app:1.2.3",
            "resources": {"requests": {"memory": "64Mi", "cpu": "100m"}, "limits": {"memory": "128Mi"}},
            "env": env,
        })
    };
    let status = |c: usize| {
        serde_json::json!({
            "name": format!("c{c}"), "ready": true, "restartCount": generation % 7, "started": true,
            "image": "registry.example/app:1.2.3", "imageID": format!("registry.example/app@sha256:{:064x}", c),
            "containerID": format!("containerd://{:064x}", n * 16 + c),
            "state": {"running": {"startedAt": format!("2026-11-29T04:{:02}:00Z", generation % 60)}},
        })
    };
    let conditions: Vec<serde_json::Value> = ["Initialized", "Ready", "ContainersReady", "PodScheduled"]
        .iter()
        .map(|t| {
            serde_json::json!({"type": t, "status": "True",
                "lastTransitionTime": format!("2026-11-29T04:00:{:02}Z", generation % 60)})
        })
        .collect();
    let env: Vec<serde_json::Value> =
        (0..8).map(|e| serde_json::json!({"name": format!("VAR_{e}"), "value": "x".repeat(32)})).collect();
    let containers: Vec<serde_json::Value> = (0..4).map(|c| container(c, &env)).collect();
    let statuses: Vec<serde_json::Value> = (0..4).map(status).collect();
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("app-{n}"), "namespace": "team", "uid": format!("api-watch-{n}"),
            "labels": {"app": "app", "pod-template-hash": "5d8f7c9b6"}},
        "spec": {"nodeName": "e2e-node", "priority": 0, "containers": containers},
        "status": {"phase": "Running", "qosClass": "Burstable", "podIP": "10.0.0.1",
            "conditions": conditions, "containerStatuses": statuses},
    })
}
