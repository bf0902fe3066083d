//! The DaemonSet as a node runs it: the image `cargo xtask image` wrote, imported into a real
//! containerd, run as a pod through the CRI with what `deploy/daemonset.yaml` declares —
//! privileged, the host's PID namespace, every hostPath mount, the downward-API environment,
//! its ports on a pod network, its probes run against the pod's IP at their periods — derived
//! from the manifest (`evictd_tests::kubelet_pod`), not restated here. The pods' cgroups are
//! the machine's own (`kubepods` or `kubepods.slice` at the root, limited as the kubelet
//! limits them to allocatable), so evictd watches the machine from the host's paths as on a
//! node.
//!
//! The kubelet is a stand-in process named `kubelet` (`--kubelet-config=auto` finds it and
//! reads its `--config` through its root); the manifest's host paths of containerd, the
//! kubelet's root and the pod logs are the test node's own directories; and no API server
//! runs here, so the pod has no service account token and evictd takes pod specs from the
//! runtime (see `kubelet_pod`).
//!
//! evictd must find its own pod (the downward API's `POD_UID`), enforce the stand-in's
//! policy, evict the growing pod and not the bystander, and stay live and ready throughout.
//! On this host with the cgroupfs driver; in the VM matrix's trixie-systemd boot (cgroup v2)
//! with the systemd driver (`#[ignore]`d elsewhere: it needs systemd as PID 1).

use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use evictd::runtime::cri::api as cri;
use evictd_tests::{
    containerd::{CgroupDriver, Containerd, PodSpec, make_shared},
    kubelet_pod::{self, HttpProbe, KubeletPod, Node},
    kubelet_stand_in::StandInKubelet,
    patience::patience,
    print_log_tail, skip,
};
use k8s_openapi::api::apps::v1::DaemonSet;

const MIB: u64 = 1 << 20;
/// The pods' cgroup limit (the node's allocatable memory).
const PODS_LIMIT: u64 = 768 * MIB;
/// The stand-in kubelet's hard threshold: with the allocatable copy of the threshold, pods
/// using more than 512 MiB of the 768 MiB are over it.
const HARD_THRESHOLD: u64 = 256 * MIB;

/// The manifest, built into the test (the VM has no source tree).
const MANIFEST: &str = include_str!("../../deploy/daemonset.yaml");

fn daemonset() -> DaemonSet {
    serde_yaml_ng::from_str(MANIFEST).unwrap_or_else(|e| panic!("deploy/daemonset.yaml: {e}"))
}

/// Whether this test can run here (the image, the runtime, the CNI plugins); if not, it said
/// why (in CI, failing).
fn can_run(test: &str) -> bool {
    if std::env::var_os("EVICTD_IMAGE").is_none() {
        skip(
            test,
            "EVICTD_IMAGE is not set: run `cargo xtask image`, then this test with EVICTD_IMAGE=<archive>",
        );
        return false;
    }
    if !evictd_tests::containerd::available(test) {
        return false;
    }
    let plugins = ["bridge", "host-local", "loopback"].map(|p| Path::new("/usr/lib/cni").join(p));
    if let Some(p) = plugins.iter().find(|p| !p.exists()) {
        skip(
            test,
            &format!("{} is missing: cargo xtask setup installs containernetworking-plugins", p.display()),
        );
        return false;
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemonset_runs_through_the_cri_and_evicts_the_right_pod() {
    the_daemonset_on(CgroupDriver::Cgroupfs, "the_daemonset_runs_through_the_cri_and_evicts_the_right_pod")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs systemd as PID 1 on cgroup v2: cargo xtask vm runs it in its trixie-systemd VM"]
async fn the_daemonset_runs_through_the_cri_with_the_systemd_driver() {
    the_daemonset_on(CgroupDriver::Systemd, "the_daemonset_runs_through_the_cri_with_the_systemd_driver")
        .await;
}

async fn the_daemonset_on(driver: CgroupDriver, test: &str) {
    if !can_run(test) {
        return;
    }
    let mut ctd = Containerd::start_as_node(driver, PODS_LIMIT);
    let ctd = &mut ctd;
    let archive = std::env::var("EVICTD_IMAGE").unwrap();
    let out = ctd.ctr(&["images", "import", &archive]);
    assert!(out.status.success(), "ctr images import {archive}: {}", String::from_utf8_lossy(&out.stderr));

    // The kubelet: its root a shared mount (as the kubelet makes it), its configuration there.
    let kubelet_root = ctd.tmp.join("kubelet");
    std::fs::create_dir_all(&kubelet_root).unwrap();
    make_shared(&kubelet_root);
    let driver_name = if driver == CgroupDriver::Systemd { "systemd" } else { "cgroupfs" };
    let config = kubelet_root.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             cgroupDriver: {driver_name}\nevictionHard:\n  memory.available: {}Mi\n",
            HARD_THRESHOLD / MIB
        ),
    )
    .unwrap();
    let root_arg = format!("--root-dir={}", kubelet_root.display());
    let bin = ctd.tmp.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let _kubelet =
        StandInKubelet::start(&bin, &kubelet_root, &[&format!("--config={}", config.display()), &root_arg]);

    let ds = daemonset();
    let template = &ds.spec.as_ref().expect("a DaemonSet spec").template;
    let namespace = ds.metadata.namespace.as_deref().unwrap_or("default");
    let name = format!("{}-e2e", ds.metadata.name.as_deref().unwrap_or("evictd"));
    let nanos = std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap().as_nanos() % (1 << 48);
    let uid = format!("{:08x}-0000-4000-8000-{nanos:012x}", std::process::id());
    let node = Node {
        name: "evictd-e2e-node",
        host_paths: BTreeMap::from([
            ("/run/containerd".into(), ctd.run.clone()),
            ("/var/lib/containerd".into(), ctd.root.clone()),
            ("/var/lib/kubelet".into(), kubelet_root.clone()),
            ("/var/log/pods".into(), ctd.tmp.join("pod-logs")),
        ]),
        pod_logs: ctd.tmp.join("pod-logs"),
    };
    let mut pod = kubelet_pod::translate(template, (namespace, &name, &uid), &node)
        .unwrap_or_else(|e| panic!("deploy/daemonset.yaml as the kubelet runs it: {e}"));
    let (sandbox, container) = ctd.run_kubelet_pod(&mut pod).await;
    let log = EvictdLog(pod.container_log_dir.join("0.log"));
    let ip = ctd.pod_ip(&sandbox).await;

    let probes = Prober::start(&ip, &pod);
    probes.wait_ready(patience(Duration::from_secs(60)));
    // Its own pod found through the downward API. (That it is never ranked is not what this
    // test shows: a pod in kube-system without an API spec is off limits to evictd anyway.
    // The exclusion of its own pod by uid is `evictds_own_pod_is_never_chosen`.)
    let said = log.text();
    assert!(said.contains(&format!("own_pod={uid}")), "evictd names its own pod {uid}:\n{said}");
    let metrics_port = *pod.ports.get("metrics").expect("the DaemonSet names its metrics port");
    let metrics = evictd_tests::http_get(&format!("{ip}:{metrics_port}"), "/metrics");
    for series in [
        format!(
            "evictd_eviction_threshold_bytes{{eviction_signal=\"memory.available\",threshold=\"hard\"}} {HARD_THRESHOLD}"
        ),
        "evictd_policy_thresholds 2".to_owned(),
    ] {
        assert!(metrics.contains(&series), "the stand-in kubelet's policy ({series}):\n{metrics}");
    }

    // Two pods of the node: a small one, and one that grows past the threshold.
    let bystander = ctd.run_pod(PodSpec::besteffort("bystander")).await;
    bystander.set_mib(16);
    bystander.wait_usage_at_least(16 * MIB, patience(Duration::from_secs(30)));
    let grower = ctd.run_pod(PodSpec::besteffort("grower")).await;
    grower.set_mib(600);
    let deadline = Instant::now() + patience(Duration::from_secs(60));
    while ctd.sandbox_ready(&grower.sandbox_id).await {
        assert!(Instant::now() < deadline, "evictd did not evict the growing pod:\n{}", log.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ctd.sandbox_ready(&bystander.sandbox_id).await, "the bystander was evicted:\n{}", log.text());

    // It survives: still the same container, running, live and ready a probe period later.
    tokio::time::sleep(probes.readiness_period()).await;
    probes.wait_ready(patience(Duration::from_secs(30)));
    let failures = probes.stop();
    assert!(failures.is_empty(), "the kubelet would have restarted evictd: {failures:?}\n{}", log.text());
    let status = ctd
        .client()
        .runtime()
        .container_status(cri::ContainerStatusRequest { container_id: container, verbose: false })
        .await
        .expect("ContainerStatus")
        .into_inner()
        .status
        .expect("a container status");
    assert_eq!(status.state, cri::ContainerState::ContainerRunning as i32, "evictd's container: {status:?}");
    let metrics = evictd_tests::http_get(&format!("{ip}:{metrics_port}"), "/metrics");
    let evictions: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("evictd_evictions_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(evictions, 1, "one eviction:\n{metrics}");
    assert!(
        metrics.contains("evictd_recent_eviction_timestamp_seconds{namespace=\"e2e\",pod=\"grower\""),
        "the growing pod evicted:\n{metrics}"
    );
}

/// evictd's container log, shown when the test fails (the teardown deletes it).
struct EvictdLog(PathBuf);

impl EvictdLog {
    fn text(&self) -> String {
        std::fs::read_to_string(&self.0).unwrap_or_default()
    }
}

impl Drop for EvictdLog {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_log_tail("evictd (the DaemonSet's pod)", Some(&self.0), &self.text(), 80);
        }
    }
}

/// The kubelet's prober for the pod's liveness and readiness probes: each at its period,
/// against the pod's IP, with its timeout. A liveness probe failing `failureThreshold` times
/// in a row is a restart the kubelet would have made; a readiness probe failing as often once
/// the pod was ready took it out of its service's endpoints. Both are failures of the test.
struct Prober {
    stop: Arc<AtomicBool>,
    ready: Arc<AtomicBool>,
    failures: Arc<Mutex<Vec<String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    readiness_period: Duration,
}

impl Prober {
    fn start(ip: &str, pod: &KubeletPod) -> Prober {
        let liveness = pod.liveness.clone().expect("the DaemonSet declares a liveness probe");
        let readiness = pod.readiness.clone().expect("the DaemonSet declares a readiness probe");
        let (stop, ready) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let readiness_period = readiness.period;
        let mut threads = Vec::new();
        for (probe, live) in [(liveness, true), (readiness, false)] {
            let addr: SocketAddr = format!("{ip}:{}", probe.port).parse().expect("a pod address");
            let (stop, ready, failures) = (stop.clone(), ready.clone(), failures.clone());
            threads.push(std::thread::spawn(move || {
                let (mut in_a_row, mut was_ready) = (0, false);
                while !stop.load(Ordering::Relaxed) {
                    let ok = probe_once(addr, &probe);
                    in_a_row = if ok { 0 } else { in_a_row + 1 };
                    // Before the first success a readiness probe's failures are the start.
                    let counts = live || was_ready;
                    if counts && in_a_row == probe.failure_threshold {
                        let kind = if live { "liveness" } else { "readiness" };
                        failures
                            .lock()
                            .unwrap()
                            .push(format!("{kind} {} failed {in_a_row} times", probe.path));
                    }
                    if !live {
                        was_ready |= ok;
                        ready.store(ok, Ordering::Relaxed);
                    }
                    let next = Instant::now() + probe.period;
                    while Instant::now() < next && !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }));
        }
        Prober { stop, ready, failures, threads, readiness_period }
    }

    fn readiness_period(&self) -> Duration {
        self.readiness_period
    }

    fn wait_ready(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.ready.load(Ordering::Relaxed) {
            assert!(Instant::now() < deadline, "evictd's pod not ready within {within:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        std::mem::take(&mut *self.failures.lock().unwrap())
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One HTTP GET as the kubelet's prober makes it: a 2xx or 3xx within the timeout succeeds.
fn probe_once(addr: SocketAddr, probe: &HttpProbe) -> bool {
    let get = || -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&addr, probe.timeout)?;
        s.set_read_timeout(Some(probe.timeout))?;
        write!(s, "GET {} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n", probe.path)?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    };
    get().is_ok_and(|r| {
        let code = r.split_whitespace().nth(1).and_then(|c| c.parse::<u16>().ok()).unwrap_or(0);
        (200..400).contains(&code)
    })
}
