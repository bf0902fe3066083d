//! Faults, on the real kernel and a real containerd: the runtime going away in the middle of
//! an eviction, the pods file turning to garbage, the ring buffer filling, the node
//! cgroup vanishing, a pod's cgroup removed under evictd, the metrics port flooded. For each:
//! evictd keeps running, evicts nobody on data it could not read, and a real crossing
//! afterwards still leads to the right eviction. (A ListPodSandbox over 4 MiB is in
//! `cri_client.rs`.) Needs root, BPF and containerd; skipped loudly otherwise.

use std::time::{Duration, Instant};

use evictd_tests::{
    MemHog, TestCgroup,
    api_double::free_port,
    containerd::{self, Containerd},
    dies_with_harness, evictd_binary,
    evictd_proc::Evictd,
    privileged,
    scenario::{PodDef, SOFT_600MI_AFTER_1S, make_pods},
    try_http_get,
};

const MI: u64 = 1 << 20;
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The pods file turns to garbage while evictd runs: it keeps the specs it read before (and
/// says so), and ranks by them. With the file's priorities `batch` goes first; with specs
/// inferred from the node (priority 0 for all) `worker` would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_file_turned_to_garbage_keeps_the_specs_read_before() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("a_pods_file_turned_to_garbage_keeps_the_specs_read_before") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (pods, file) = make_pods(
        &mut ctd,
        &[
            PodDef { priority: 1000, request_mib: Some(100), ..PodDef::new("worker", "burstable") },
            PodDef::new("batch", "besteffort"),
        ],
    )
    .await;
    let (worker, batch) = (&pods[0], &pods[1]);
    batch.set_mib(100);
    batch.wait_usage_at_least(100 * MI, Duration::from_secs(10));
    let evictd = Evictd::start(&ctd, Some(&file), &["--eviction-hard", "memory.available<400Mi"]);
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&file, "{\"kind\": \"PodList\", \"items\": [ garbage").expect("overwriting the pods file");
    let deadline = Instant::now() + evictd_tests::patience::patience(Duration::from_secs(5));
    while !evictd.log().contains("keeping the specs read before") {
        assert!(Instant::now() < deadline, "no warning about the broken pods file:\n{}", evictd.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(evictd.evictions().is_empty(), "nothing to evict yet");
    worker.set_mib(600);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "batch", "ranked with the specs read before (worker has priority 1000): {e}");
    assert!(e["error"].is_null(), "{e}");
}

/// The ring buffer fills (4 KiB, a wake for every page): the kernel holds charge events back
/// at half of it (counted), evictd keeps running, and the crossing is still acted on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_buffer_full_of_charge_events_still_leads_to_the_eviction() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("a_ring_buffer_full_of_charge_events_still_leads_to_the_eviction") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (pods, file) = make_pods(&mut ctd, &[PodDef::new("hog", "besteffort")]).await;
    let evictd = Evictd::start(
        &ctd,
        Some(&file),
        &[
            "--eviction-hard",
            "memory.available<300Mi",
            "--ring-buffer-size",
            "4Ki",
            "--bpf-watermark",
            "0",
            "--wake-sources",
            "ebpf",
        ],
    );
    pods[0].set_mib(800);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "hog", "{e}");
    evictd.wait_for("a summary counting charge events held back", Duration::from_secs(5), |lines| {
        lines
            .iter()
            .any(|l| l["type"] == "summary" && l["kernel"]["charge_yielded"].as_u64().unwrap_or(0) > 0)
    });
}

/// The cgroup playing the node is removed while evictd runs, then made again: evictd keeps
/// running, decides nothing on the node it cannot read, and sees the pressure on the new one.
#[test]
fn a_node_cgroup_that_vanishes_and_comes_back() {
    if !privileged("a_node_cgroup_that_vanishes_and_comes_back") {
        return;
    }
    let cg = TestCgroup::new(Some(512 * MI));
    let mut evictd = dies_with_harness(&mut std::process::Command::new(evictd_binary()))
        .args(["--dry-run", "--cri-endpoint", "none", "--housekeeping-interval", "100ms"])
        .args(["--eviction-hard", "memory.available<256Mi", "--duration", "8s", "--node-cgroup"])
        .arg(&cg.dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting evictd");
    std::thread::sleep(Duration::from_millis(1000));
    std::fs::remove_dir(&cg.dir).expect("removing the empty node cgroup");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        evictd.try_wait().expect("evictd status").is_none(),
        "evictd stopped when the node cgroup vanished"
    );
    std::fs::create_dir(&cg.dir).expect("making the node cgroup again");
    std::fs::write(cg.dir.join("memory.limit_in_bytes"), (512 * MI).to_string()).expect("limit");
    let mut hog = MemHog::spawn_in(&cg);
    hog.alloc(300);
    let out = evictd.wait_with_output().expect("evictd output");
    drop(hog);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "evictd failed:\n{log}");
    assert!(
        log.contains("pressure on Some(MemoryAvailable) but no eviction: there are no pods to evict"),
        "the crossing on the new node cgroup was not seen:\n{log}"
    );
}

/// The runtime goes away in the middle of an eviction and comes back: evictd keeps running,
/// the pod is evicted once the runtime is back, and the bystander is never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_restarting_in_the_middle_of_an_eviction() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("the_runtime_restarting_in_the_middle_of_an_eviction") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (pods, file) = make_pods(&mut ctd, &[PodDef::stubborn(3), PodDef::bystander()]).await;
    let (stubborn, bystander) = (&pods[0], &pods[1]);
    stubborn.set_mib(500);
    stubborn.wait_usage_at_least(500 * MI, Duration::from_secs(10));
    let evictd = Evictd::start(&ctd, Some(&file), &SOFT_600MI_AFTER_1S);
    // The soft grace period (1 s) passes, the 3 s stop starts; the runtime goes away in it.
    std::thread::sleep(Duration::from_millis(2000));
    ctd.stop_daemon();
    std::thread::sleep(Duration::from_millis(1500));
    ctd.spawn();
    evictd.wait_for("the eviction of stubborn", Duration::from_secs(30), |lines| {
        lines.iter().any(|l| l["type"] == "eviction" && l["name"] == "stubborn" && l["error"].is_null())
    });
    assert!(ctd.sandbox_ready(&bystander.sandbox_id).await, "the bystander must not be evicted");
    assert!(
        evictd.evictions().iter().all(|e| e["name"] == "stubborn"),
        "only stubborn: {:?}\n{}",
        evictd.evictions(),
        evictd.log()
    );
}

/// A pod's cgroup removed while evictd still lists the pod (the pod ended between two
/// inventory refreshes; a one-hour refresh interval holds that window open): the pod is
/// not ranked at all — "without stats" it would go first, and evictd would stop a pod that
/// is gone and call that the eviction — and the crossing is acted on with the pods that can
/// be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_cgroup_removed_under_evictd_is_never_the_victim() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("a_pod_cgroup_removed_under_evictd_is_never_the_victim") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (pods, file) =
        make_pods(&mut ctd, &[PodDef::new("ended", "besteffort"), PodDef::new("worker", "besteffort")]).await;
    let (ended, worker) = (&pods[0], &pods[1]);
    let evictd = Evictd::start(
        &ctd,
        Some(&file),
        &["--eviction-hard", "memory.available<400Mi", "--inventory-interval", "1h"],
    );
    evictd.wait_for_log("the first inventory", Duration::from_secs(10), |log| {
        log.contains("container runtime reachable")
    });
    std::thread::sleep(Duration::from_millis(300));
    ctd.client().stop_pod_sandbox(&ended.sandbox_id).await.expect("StopPodSandbox");
    remove_cgroup_tree(&ended.cgroup);
    assert!(!ended.cgroup.exists(), "{} still there", ended.cgroup.display());
    worker.set_mib(700);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "worker", "{e}\n{}", evictd.log());
    assert!(e["error"].is_null(), "{e}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(evictd.evictions().len(), 1, "{:?}", evictd.evictions());
}

/// Removes a cgroup and the ones under it, deepest first (the runtime may still be
/// removing its containers' own).
fn remove_cgroup_tree(dir: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
            remove_cgroup_tree(&e.path());
        }
    }
    let deadline = Instant::now() + evictd_tests::patience::patience(Duration::from_secs(5));
    while dir.exists() && std::fs::remove_dir(dir).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The metrics port flooded: more clients than the endpoint serves, each sending half a
/// request and waiting. The crossing meanwhile is acted on as ever (the endpoint has a
/// thread of its own), and once the slow clients are cut off (the header timeout) a scrape
/// is answered and counts the eviction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_metrics_port_delays_no_eviction() {
    use std::io::Write as _;
    let _serial = SERIAL.lock().await;
    if !containerd::available("a_flooded_metrics_port_delays_no_eviction") {
        return;
    }
    let mut ctd = Containerd::start(1024 * MI);
    let (pods, file) = make_pods(&mut ctd, &[PodDef::new("hog", "besteffort"), PodDef::bystander()]).await;
    let (hog, bystander) = (&pods[0], &pods[1]);
    let addr = format!("127.0.0.1:{}", free_port());
    let evictd = Evictd::start(
        &ctd,
        Some(&file),
        &["--eviction-hard", "memory.available<400Mi", "--metrics-addr", &addr],
    );
    // Four times the connections it serves at once, each stuck in its headers.
    let slow: Vec<std::net::TcpStream> = (0..64)
        .filter_map(|_| {
            let mut s = std::net::TcpStream::connect(&addr).ok()?;
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").ok()?;
            Some(s)
        })
        .collect();
    assert!(slow.len() >= 16, "only {} slow clients connected", slow.len());
    hog.set_mib(700);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "hog", "{e}");
    assert!(e["error"].is_null(), "{e}");
    assert!(ctd.sandbox_ready(&bystander.sandbox_id).await);
    // The endpoint cuts slow clients off after 5 s; a scrape is answered by then.
    let deadline = Instant::now() + evictd_tests::patience::patience(Duration::from_secs(10));
    let scrape = loop {
        // Turned away (closed at once) while the slots are full: not an error yet.
        let answer = try_http_get(&addr, "/metrics").unwrap_or_default();
        if answer.starts_with("HTTP/1.1 200") || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(slow);
    assert!(scrape.starts_with("HTTP/1.1 200"), "no scrape answered after the flood: {scrape:?}");
    assert!(scrape.contains("evictd_evictions_total{eviction_signal=\"memory.available\"} 1"), "{scrape}");
}
