//! Disk pressure end to end on a real containerd whose root is on a small tmpfs of the
//! test's own, which plays nodefs and imagefs in one (the kubelet's usual layout): pods
//! fill their writable layers on purpose, evictd runs as users run it (`--trace --json`)
//! with `--nodefs-path`/`--imagefs-path` on that filesystem, and the assertions read its
//! lines, its log and the runtime's own view. Needs root and containerd; skipped loudly
//! otherwise.

use std::time::{Duration, Instant};

use evictd_tests::{
    containerd::{self, Containerd, PodSpec},
    evictd_proc::Evictd,
};

const MI: u64 = 1 << 20;
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A BestEffort pod whose container keeps `/fill` (in its writable layer) at the MiB its
/// control file says.
fn filler(name: &str) -> PodSpec<'_> {
    PodSpec {
        hog_args: Some(["fill", "/ctl/mib", "/fill"].map(String::from).to_vec()),
        ..PodSpec::besteffort(name)
    }
}

/// A BestEffort pod whose container keeps `/scratch/fill`, in its emptyDir `scratch` (a real
/// directory under the kubelet root `kubelet`, mounted into it), at the MiB its control file
/// says.
fn volume_filler(name: &str, kubelet: std::path::PathBuf) -> PodSpec<'_> {
    PodSpec {
        hog_args: Some(["fill", "/ctl/mib", "/scratch/fill"].map(String::from).to_vec()),
        empty_dir_under: Some(kubelet),
        ..PodSpec::besteffort(name)
    }
}

/// Waits until the nodefs has at most `bytes` available (a filler has written its share).
fn wait_available_at_most(ctd: &Containerd, bytes: u64) {
    let deadline = Instant::now() + evictd_tests::patience::patience(Duration::from_secs(20));
    while ctd.nodefs_available() > bytes {
        assert!(
            Instant::now() < deadline,
            "nodefs still has {} MiB available, want ≤ {} MiB",
            ctd.nodefs_available() / MI,
            bytes / MI
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// evictd's log lines about node-level reclaim and released space, for the test's output.
fn print_reclaim_lines(evictd: &Evictd) {
    for l in evictd.log().lines().filter(|l| l.contains("reclaim") || l.contains("disk pressure")) {
        println!("{l}");
    }
}

/// evictd on `ctd`'s filesystems (nodefs: the kubelet root on the test's tmpfs; imagefs:
/// containerd's root) with one hard threshold, `threshold` (no memory threshold: the tests
/// are about disk), and `pods_file` for specs.
fn evictd_on_disk(ctd: &Containerd, threshold: &str, pods_file: Option<&std::path::Path>) -> Evictd {
    let nodefs = ctd.nodefs.as_ref().expect("a nodefs").join("kubelet").display().to_string();
    let root = ctd.root.display().to_string();
    Evictd::start(
        ctd,
        pods_file,
        &["--eviction-hard", threshold, "--nodefs-path", &nodefs, "--imagefs-path", &root],
    )
}

/// (a) The nodefs past its threshold because of dead containers: node-level reclaim (the
/// kubelet's container GC) removes the older dead instance, keeps the newest one of the
/// running pod, and that suffices: nobody is evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_containers_are_reclaimed_before_any_eviction() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("dead_containers_are_reclaimed_before_any_eviction") {
        return;
    }
    let mut ctd = Containerd::start_on_nodefs(1024 * MI, 256 * MI);
    let empty = ctd.nodefs_available();
    let mut app = ctd.run_pod(filler("app")).await;
    app.set_mib(50);
    wait_available_at_most(&ctd, empty - 50 * MI);
    let oldest = app.container_id.clone();
    // Each restart leaves a dead instance holding its 50 MiB; the new one writes 50 more.
    ctd.restart_container(&mut app).await;
    wait_available_at_most(&ctd, empty - 100 * MI);
    let newest_dead = app.container_id.clone();
    ctd.restart_container(&mut app).await;
    wait_available_at_most(&ctd, empty - 150 * MI);
    // Met now (≈150 MiB used); removing the oldest dead instance (50 MiB) resolves it.
    let threshold = (empty - 120 * MI) / MI;
    let before = ctd.nodefs_available();
    let evictd = evictd_on_disk(&ctd, &format!("nodefs.available<{threshold}Mi"), None);
    // Resolved at once, or once containerd's garbage collector has released the snapshot.
    evictd.wait_for_log("node-level reclaim resolving the pressure", Duration::from_secs(20), |log| {
        log.contains("node-level reclaim resolved the pressure")
            || (log.contains("containers_removed=1") && log.contains("disk pressure resolved"))
    });
    std::thread::sleep(Duration::from_secs(1));
    assert!(evictd.evictions().is_empty(), "{:?}\n{}", evictd.evictions(), evictd.log());
    let ids: Vec<String> = ctd.client().list_containers().await.unwrap().into_iter().map(|c| c.id).collect();
    assert!(!ids.contains(&oldest), "the oldest dead instance is removed: {ids:?}");
    assert!(ids.contains(&newest_dead), "the newest dead instance stays: {ids:?}");
    assert!(ctd.sandbox_ready(&app.sandbox_id).await, "the pod runs on");
    print_reclaim_lines(&evictd);
    println!(
        "container GC freed {} MiB (nodefs available {} → {} MiB, threshold {threshold} MiB)",
        (ctd.nodefs_available().saturating_sub(before)) / MI,
        before / MI,
        ctd.nodefs_available() / MI
    );
}

/// (b) Nothing to reclaim: the pod using the most disk (above its request of 0) is evicted,
/// exactly one, with the kubelet's message for ephemeral-storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_using_the_most_disk_is_evicted_when_reclaim_is_not_enough() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("the_pod_using_the_most_disk_is_evicted_when_reclaim_is_not_enough") {
        return;
    }
    let mut ctd = Containerd::start_on_nodefs(1024 * MI, 256 * MI);
    let empty = ctd.nodefs_available();
    let small = ctd.run_pod(filler("small")).await;
    let big = ctd.run_pod(filler("big")).await;
    small.set_mib(30);
    big.set_mib(80);
    wait_available_at_most(&ctd, empty - 110 * MI);
    // Ranking reads the runtime's stats: wait until they show what statvfs already does.
    ctd.wait_writable_layer_at_least(&small, 30 * MI).await;
    ctd.wait_writable_layer_at_least(&big, 80 * MI).await;
    let evictd = evictd_on_disk(&ctd, &format!("nodefs.available<{}Mi", (empty - 90 * MI) / MI), None);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "big", "{e}");
    assert_eq!(e["signal"], "nodefs.available", "{e}");
    assert!(
        e["message"].as_str().unwrap().starts_with("The node was low on resource: ephemeral-storage."),
        "{e}"
    );
    // The evicted pod's layer goes only when its dead container is removed: the next pass's
    // reclaim does it, the space comes back, and no second pod is evicted meanwhile.
    evictd.wait_for_log("the evicted pod's space released", Duration::from_secs(20), |log| {
        log.contains("disk pressure resolved")
    });
    assert_eq!(evictd.evictions().len(), 1, "{:?}", evictd.evictions());
    print_reclaim_lines(&evictd);
    assert!(!ctd.sandbox_ready(&big.sandbox_id).await);
    assert!(ctd.sandbox_ready(&small.sandbox_id).await);
}

/// (e) A pod over its emptyDir `sizeLimit` is evicted with no node threshold met (the
/// kubelet's local-storage eviction: its message, a 1 s grace period), and only it: a pod
/// using more disk but setting no limit stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_over_its_empty_dir_size_limit_is_evicted_with_no_threshold_met() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("a_pod_over_its_empty_dir_size_limit_is_evicted_with_no_threshold_met") {
        return;
    }
    let mut ctd = Containerd::start_on_nodefs(1024 * MI, 256 * MI);
    let empty = ctd.nodefs_available();
    let kubelet = ctd.nodefs.as_ref().expect("a nodefs").join("kubelet");
    let scratchy = ctd.run_pod(volume_filler("scratchy", kubelet)).await;
    let big = ctd.run_pod(filler("big")).await;
    big.set_mib(60);
    scratchy.set_mib(10);
    wait_available_at_most(&ctd, empty - 70 * MI);
    let item = |name: &str, uid: &str, spec: serde_json::Value| {
        serde_json::json!({"metadata": {"name": name, "namespace": "e2e", "uid": uid},
            "spec": spec, "status": {"phase": "Running"}})
    };
    let pods = serde_json::json!({"kind": "PodList", "items": [
        item("scratchy", &scratchy.uid, serde_json::json!({"containers": [{"name": "hog"}],
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "20Mi"}}]})),
        item("big", &big.uid, serde_json::json!({"containers": [{"name": "hog"}]})),
    ]});
    let file = ctd.tmp.join("pods.json");
    std::fs::write(&file, pods.to_string()).expect("pods file");
    // A threshold that is never met: only the pod's own limit can evict it.
    let evictd = evictd_on_disk(&ctd, "nodefs.available<1Mi", Some(&file));
    std::thread::sleep(Duration::from_secs(1));
    assert!(evictd.evictions().is_empty(), "10Mi of 20Mi: {:?}", evictd.evictions());
    scratchy.set_mib(30);
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "scratchy", "{e}");
    assert_eq!(e["signal"], "emptydirfs.limit", "{e}");
    assert_eq!(e["grace_period_seconds"], 1, "{e}");
    assert_eq!(e["message"], "Usage of EmptyDir volume \"scratch\" exceeds the limit \"20Mi\". ", "{e}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(evictd.evictions().len(), 1, "{:?}", evictd.evictions());
    assert!(!ctd.sandbox_ready(&scratchy.sandbox_id).await);
    assert!(ctd.sandbox_ready(&big.sandbox_id).await, "more disk, but no limit of its own");
}

/// (f) A dedicated imagefs (containerd's root on a filesystem of its own) filling up with an
/// image nobody uses: node-level reclaim removes that image, keeps the one in use, and that
/// suffices: nobody is evicted. Also (c) on a real filesystem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedicated_imagefs_is_relieved_by_image_gc_before_any_eviction() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("a_dedicated_imagefs_is_relieved_by_image_gc_before_any_eviction") {
        return;
    }
    let mut ctd = Containerd::start_with_imagefs(1024 * MI, 64 * MI, 256 * MI);
    let app = ctd.run_pod(filler("app")).await;
    app.set_mib(5);
    let before = ctd.imagefs_available();
    // 40 MiB of image, kept twice on the imagefs (the content blob and the unpacked layer).
    ctd.import("evictd.test/unused:1", &[("blob", vec![7u8; 40 << 20])]);
    let loaded = ctd.imagefs_available();
    assert!(before - loaded >= 60 * MI, "the unused image takes {} MiB", (before - loaded) / MI);
    // Met now; removing the unused image brings imagefs back above it.
    let threshold = format!("imagefs.available<{}Mi", (before - 30 * MI) / MI);
    let evictd = evictd_on_disk(&ctd, &threshold, None);
    assert!(evictd.log().contains("dedicated_imagefs=true"), "{}", evictd.log());
    assert!(evictd.log().contains("fs_layout=\"dedicated-imagefs\""), "{}", evictd.log());
    evictd.wait_for_log("image GC resolving the pressure", Duration::from_secs(20), |log| {
        log.contains("node-level reclaim resolved the pressure")
            || (log.contains("images_removed=1") && log.contains("disk pressure resolved"))
    });
    std::thread::sleep(Duration::from_secs(1));
    assert!(evictd.evictions().is_empty(), "{:?}\n{}", evictd.evictions(), evictd.log());
    let tags: Vec<String> =
        ctd.client().list_images().await.unwrap().into_iter().flat_map(|i| i.repo_tags).collect();
    assert!(!tags.iter().any(|t| t.contains("evictd.test/unused")), "the unused image is removed: {tags:?}");
    assert!(tags.iter().any(|t| t.contains("evictd.test/tools")), "the image in use stays: {tags:?}");
    assert!(ctd.sandbox_ready(&app.sandbox_id).await);
    print_reclaim_lines(&evictd);
    println!(
        "image GC freed {} MiB (imagefs available {} → {} MiB)",
        ctd.imagefs_available().saturating_sub(loaded) / MI,
        loaded / MI,
        ctd.imagefs_available() / MI
    );
}

/// (g) One disk pressure, one eviction, where the evicted pod's space is in an emptyDir: its
/// files go only when the kubelet tears the volume down (no kubelet runs here: the test does
/// it, as the kubelet would, once it chooses to), so the next disk eviction waits for that
/// teardown, as the kubelet's `waitForPodsCleanup` does, not just for the 2 s settle after
/// which a second pod would go for space already on its way back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_disk_eviction_waits_for_the_evicted_pods_volume_teardown() {
    let _serial = SERIAL.lock().await;
    if !containerd::available("the_next_disk_eviction_waits_for_the_evicted_pods_volume_teardown") {
        return;
    }
    let mut ctd = Containerd::start_on_nodefs(1024 * MI, 256 * MI);
    let empty = ctd.nodefs_available();
    let kubelet = ctd.nodefs.as_ref().expect("a nodefs").join("kubelet");
    let mut pods = Vec::new();
    for (name, mib) in [("a", 60), ("b", 40), ("c", 30)] {
        let pod = ctd.run_pod(volume_filler(name, kubelet.clone())).await;
        pod.set_mib(mib);
        pods.push(pod);
    }
    wait_available_at_most(&ctd, empty - 125 * MI);
    let items: Vec<serde_json::Value> = pods
        .iter()
        .map(|p| {
            serde_json::json!({"metadata": {"name": p.name, "namespace": "e2e", "uid": p.uid},
                "spec": {"containers": [{"name": "hog"}], "volumes": [{"name": "scratch", "emptyDir": {}}]},
                "status": {"phase": "Running"}})
        })
        .collect();
    let file = ctd.tmp.join("pods.json");
    std::fs::write(&file, serde_json::json!({"kind": "PodList", "items": items}).to_string())
        .expect("pods file");
    // Met with 50 MiB used: a's 60 go first, and b's and c's 70 keep it met.
    let threshold = format!("nodefs.available<{}Mi", (empty - 50 * MI) / MI);
    let evictd = evictd_on_disk(&ctd, &threshold, Some(&file));
    let e = evictd.wait_eviction(Duration::from_secs(20));
    assert_eq!(e["name"], "a", "{e}");
    // Past the settle and node-level reclaim: a's 60 MiB are still in its volume.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(evictd.evictions().len(), 1, "{:?}\n{}", evictd.evictions(), evictd.log());
    assert!(evictd.log().contains("still has its volumes on disk"), "{}", evictd.log());
    let volume = kubelet.join("pods").join(&pods[0].uid).join("volumes/kubernetes.io~empty-dir/scratch");
    std::fs::remove_dir_all(&volume).unwrap_or_else(|e| panic!("{}: {e}", volume.display()));
    evictd.wait_for("the second eviction", Duration::from_secs(20), |l| {
        l.iter().filter(|v| v["type"] == "eviction").count() >= 2
    });
    assert_eq!(evictd.evictions()[1]["name"], "b", "{:?}", evictd.evictions());
    assert!(evictd.log().contains("the pod evicted for disk is torn down"), "{}", evictd.log());
    print_reclaim_lines(&evictd);
}
