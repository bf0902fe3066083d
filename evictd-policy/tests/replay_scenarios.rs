//! Multi-step pressure episodes replayed through `offline::replay`, the code path behind
//! `evictd replay`: each step is a kubelet Summary document, the pods a PodList, and the
//! assertions read the JSON the command prints. Pure: no privileges needed.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "test helpers fail the test with a message")]

use evictd_policy::{
    flags::PolicyArgs,
    offline::{self, Session},
    podspec::Pod,
    rank::FsLayout,
};
use serde_json::{Value, json};

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;

/// A pod as the test describes it: name, priority, memory request, and flags.
struct P {
    name: &'static str,
    priority: i64,
    mem_request: &'static str,
    critical_static: bool,
}

fn pods(list: &[P]) -> Vec<Pod> {
    let items: Vec<Value> = list
        .iter()
        .map(|p| {
            let annotations =
                if p.critical_static { json!({"kubernetes.io/config.source": "file"}) } else { json!({}) };
            json!({
                "metadata": {"name": p.name, "namespace": "shop", "uid": format!("uid-{}", p.name), "annotations": annotations},
                "spec": {
                    "priority": p.priority,
                    "terminationGracePeriodSeconds": 60,
                    "containers": [{"name": "main", "resources": {"requests": {"memory": p.mem_request}}}],
                    "volumes": [{"name": "scratch", "emptyDir": {}}]
                },
                "status": {"phase": "Running"}
            })
        })
        .collect();
    // Through a file, as `--pods` reads it.
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("evictd-scenario-pods-{}-{n}.json", std::process::id()));
    std::fs::write(&path, json!({"kind": "PodList", "items": items}).to_string()).expect("write pods file");
    let pods = offline::load_pods(&path, &evictd_policy::podspec::AnnotationTrust::default());
    let _ = std::fs::remove_file(&path);
    pods.expect("pods")
}

/// Per-pod usage in a step: (name, working set, processes, disk bytes in its emptyDir).
type Usage = (&'static str, u64, u64, u64);

/// One Summary document at second `t`.
struct Node {
    mem_available: u64,
    pods_available: Option<u64>,
    fs_available: u64,
    inodes_free: u64,
    curproc: i64,
    image_fs_available: Option<u64>,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            mem_available: 8 * GI,
            pods_available: None,
            fs_available: 80 * GI,
            inodes_free: 900_000,
            curproc: 1000,
            image_fs_available: None,
        }
    }
}

fn summary(t: u64, n: &Node, usage: &[Usage]) -> String {
    let time = format!("2026-01-01T00:{:02}:{:02}Z", t / 60, t % 60);
    let fs = |avail: u64| {
        json!({"time": time, "availableBytes": avail, "capacityBytes": 100 * GI,
               "inodesFree": n.inodes_free, "inodes": 1_000_000, "usedBytes": 100 * GI - avail})
    };
    let mut node = json!({
        "nodeName": "n1",
        "memory": {"time": time, "availableBytes": n.mem_available, "workingSetBytes": 16 * GI - n.mem_available},
        "fs": fs(n.fs_available),
        "rlimit": {"time": time, "maxpid": 4096, "curproc": n.curproc},
        "systemContainers": []
    });
    if let Some(a) = n.pods_available {
        node["systemContainers"] = json!([{"name": "pods", "memory": {"time": time, "availableBytes": a, "workingSetBytes": 12 * GI - a}}]);
    }
    if let Some(a) = n.image_fs_available {
        node["runtime"] = json!({"imageFs": fs(a)});
    }
    let pods: Vec<Value> = usage
        .iter()
        .map(|(name, ws, procs, disk)| {
            json!({
                "podRef": {"name": name, "namespace": "shop", "uid": format!("uid-{name}")},
                "memory": {"time": time, "workingSetBytes": ws},
                "containers": [{"name": "main", "memory": {"workingSetBytes": ws},
                                "rootfs": {"usedBytes": 0, "inodesUsed": 0}, "logs": {"usedBytes": 0, "inodesUsed": 0}}],
                "volume": [{"name": "scratch", "usedBytes": disk, "inodesUsed": disk / 4096}],
                "process_stats": {"process_count": procs}
            })
        })
        .collect();
    json!({"node": node, "pods": pods}).to_string()
}

fn policy(args: &[&str]) -> PolicyArgs {
    use clap::Parser as _;
    #[derive(clap::Parser)]
    struct W {
        #[command(flatten)]
        p: PolicyArgs,
    }
    let mut argv = vec!["x"];
    argv.extend_from_slice(args);
    W::try_parse_from(argv).expect("policy flags").p
}

/// Replays `steps` and returns the JSON objects `evictd replay --output json` prints.
fn replay(args: &[&str], pods: &[Pod], layout: FsLayout, steps: &[String]) -> Vec<Value> {
    let (policy, _) = policy(args).policy().expect("valid policy");
    let mut session = Session::new(&policy, layout, pods);
    let mut out = Vec::new();
    offline::replay(&mut session, std::io::Cursor::new(steps.join("\n")), "episode", true, &mut out)
        .expect("replay");
    String::from_utf8(out)
        .expect("utf8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

fn victim(step: &Value) -> Option<&str> {
    step["eviction"]["pod"]["name"].as_str()
}

fn shop() -> Vec<Pod> {
    pods(&[
        P { name: "web", priority: 0, mem_request: "1Gi", critical_static: false },
        P { name: "batch", priority: 0, mem_request: "256Mi", critical_static: false },
        P { name: "cache", priority: 100, mem_request: "128Mi", critical_static: false },
        P { name: "kube-proxy", priority: 0, mem_request: "64Mi", critical_static: true },
    ])
}

fn usage(batch_ws: u64) -> Vec<Usage> {
    vec![
        ("web", 900 * MI, 40, 0),
        ("batch", batch_ws, 10, 0),
        ("cache", 2 * GI, 5, 0),
        ("kube-proxy", 3 * GI, 3, 0),
    ]
}

#[test]
fn memory_episode_hard_threshold_stale_stats_and_transition_period() {
    let n = |avail| Node { mem_available: avail, ..Default::default() };
    let steps = vec![
        summary(0, &n(2 * GI), &usage(MI)),
        summary(10, &n(500 * MI), &usage(GI)),
        summary(20, &n(80 * MI), &usage(2 * GI)),
        summary(20, &n(80 * MI), &usage(2 * GI)), // the same stats again
        summary(30, &n(3 * GI), &usage(MI)),
        summary(319, &n(3 * GI), &usage(MI)),
        summary(320, &n(3 * GI), &usage(MI)),
    ];
    let out = replay(&["--eviction-hard", "memory.available<100Mi"], &shop(), FsLayout::SingleFs, &steps);
    assert_eq!(out.len(), 7);
    assert!(out[0..2].iter().all(|s| s["eviction"].is_null() && s["node_conditions"] == json!([])));
    // kube-proxy exceeds its request the most but is static (critical): skipped. batch is
    // next; cache exceeds too but has a higher priority; web is within its request.
    assert_eq!(victim(&out[2]), Some("batch"));
    assert_eq!(out[2]["eviction"]["grace_period_seconds"], 1);
    assert_eq!(
        out[2]["eviction"]["message"],
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. \
         Container main was using 2Gi, request is 256Mi, has larger consumption of memory. "
    );
    assert_eq!(out[2]["node_conditions"], json!(["MemoryPressure"]));
    assert_eq!(out[2]["time"], "2026-01-01T00:00:20Z");
    let ranking: Vec<&str> =
        out[2]["ranking"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(ranking, ["kube-proxy", "batch", "cache", "web"]);
    assert!(out[3]["eviction"].is_null(), "stale stats must not evict twice");
    // Pressure gone, condition kept for the 5m transition period after t=20 (strictly less).
    assert_eq!(out[4]["node_conditions"], json!(["MemoryPressure"]));
    assert_eq!(out[5]["node_conditions"], json!(["MemoryPressure"]));
    assert_eq!(out[6]["node_conditions"], json!([]));
    assert_eq!(out[4]["signals"]["memory.available"]["available"], 3 * GI);
}

#[test]
fn soft_threshold_grace_period_and_max_pod_grace() {
    let n = |avail| Node { mem_available: avail, ..Default::default() };
    let steps: Vec<String> =
        [0, 30, 59, 60, 61].iter().map(|&t| summary(t, &n(700 * MI), &usage(2 * GI))).collect();
    let args = [
        "--eviction-hard=",
        "--eviction-soft",
        "memory.available<1Gi",
        "--eviction-soft-grace-period",
        "memory.available=1m",
        "--eviction-max-pod-grace-period",
        "20",
    ];
    let out = replay(&args, &shop(), FsLayout::SingleFs, &steps);
    assert!(out[0..3].iter().all(|s| s["eviction"].is_null()), "within the 1m grace period");
    assert!(out.iter().all(|s| s["node_conditions"] == json!(["MemoryPressure"])), "raised at once");
    assert_eq!(victim(&out[3]), Some("batch"));
    assert_eq!(out[3]["eviction"]["grace_period_seconds"], 20, "min(20, pod's 60)");
    assert_eq!(out[3]["thresholds_met"][0]["hard"], false);
    assert_eq!(victim(&out[4]), Some("batch"), "replay does not remove evicted pods");
}

#[test]
fn minimum_reclaim_keeps_the_threshold_met_until_the_band_is_cleared() {
    let n = |avail| Node { mem_available: avail, ..Default::default() };
    let steps = vec![
        summary(0, &n(80 * MI), &usage(2 * GI)),
        summary(10, &n(400 * MI), &usage(2 * GI)),
        summary(20, &n(600 * MI), &usage(2 * GI)),
    ];
    let args =
        ["--eviction-hard", "memory.available<100Mi", "--eviction-minimum-reclaim", "memory.available=400Mi"];
    let out = replay(&args, &shop(), FsLayout::SingleFs, &steps);
    assert_eq!(victim(&out[0]), Some("batch"));
    assert_eq!(victim(&out[1]), Some("batch"), "400Mi < 100Mi + 400Mi: still reclaiming");
    assert!(out[2]["eviction"].is_null(), "600Mi clears 500Mi");
    assert_eq!(out[2]["thresholds_met"], json!([]));
}

#[test]
fn pid_pressure_ranks_by_priority_then_processes() {
    let steps = vec![summary(0, &Node { curproc: 4000, ..Default::default() }, &usage(MI))];
    let out = replay(&["--eviction-hard", "pid.available<200"], &shop(), FsLayout::SingleFs, &steps);
    assert_eq!(out[0]["node_conditions"], json!(["PIDPressure"]));
    assert_eq!(victim(&out[0]), Some("web"), "40 processes, lowest priority; kube-proxy is critical");
    assert_eq!(
        out[0]["eviction"]["message"],
        "The node was low on resource: pids. Threshold quantity: 200, available: 96. "
    );
    assert_eq!(out[0]["signals"]["pid.available"], json!({"available": 96, "capacity": 4096}));
}

#[test]
fn disk_pressure_reports_node_reclaim_and_ranks_by_local_storage() {
    let node = Node { fs_available: 5 * GI, ..Default::default() };
    let usage: Vec<Usage> = vec![
        ("web", MI, 1, 3 * GI),
        ("batch", MI, 1, 10 * GI),
        ("cache", MI, 1, 0),
        ("kube-proxy", MI, 1, 40 * GI),
    ];
    let steps = vec![summary(0, &node, &usage)];
    let out = replay(&["--eviction-hard", "nodefs.available<10%"], &shop(), FsLayout::SingleFs, &steps);
    assert_eq!(out[0]["node_conditions"], json!(["DiskPressure"]));
    assert_eq!(out[0]["node_reclaim"], json!(["unused-containers", "unused-images"]));
    assert_eq!(victim(&out[0]), Some("batch"), "largest emptyDir among evictable pods");
    // 10% of 100Gi through the kubelet's float32 is 10737418400, not 10Gi, and prints plain.
    assert_eq!(
        out[0]["eviction"]["message"],
        "The node was low on resource: ephemeral-storage. Threshold quantity: 10737418400, available: 5Gi. "
    );
    // With a dedicated imagefs, nodefs pressure has no node-level reclaim.
    let dedicated = Node { image_fs_available: Some(50 * GI), ..node };
    let out = replay(
        &["--eviction-hard", "nodefs.available<10%"],
        &shop(),
        FsLayout::DedicatedImageFs,
        &[summary(0, &dedicated, &usage)],
    );
    assert_eq!(out[0]["node_reclaim"], json!([]));
    assert_eq!(victim(&out[0]), Some("batch"));
}

#[test]
fn critical_and_static_pods_are_ranked_but_never_evicted() {
    let only_critical = pods(&[
        P { name: "kube-proxy", priority: 0, mem_request: "64Mi", critical_static: true },
        P { name: "coredns", priority: 2_000_000_000, mem_request: "64Mi", critical_static: false },
    ]);
    let usage: Vec<Usage> = vec![("kube-proxy", 3 * GI, 1, 0), ("coredns", 2 * GI, 1, 0)];
    let steps = vec![summary(0, &Node { mem_available: 10 * MI, ..Default::default() }, &usage)];
    let out =
        replay(&["--eviction-hard", "memory.available<100Mi"], &only_critical, FsLayout::SingleFs, &steps);
    assert_eq!(out[0]["ranking"].as_array().unwrap().len(), 2);
    assert!(out[0]["eviction"].is_null());
    assert_eq!(out[0]["node_conditions"], json!(["MemoryPressure"]));
}

#[test]
fn allocatable_pressure_without_node_pressure() {
    let node = Node { mem_available: 6 * GI, pods_available: Some(50 * MI), ..Default::default() };
    let out = replay(
        &["--eviction-hard", "memory.available<100Mi"],
        &shop(),
        FsLayout::SingleFs,
        &[summary(0, &node, &usage(2 * GI))],
    );
    let met: Vec<&str> =
        out[0]["thresholds_met"].as_array().unwrap().iter().map(|t| t["signal"].as_str().unwrap()).collect();
    assert_eq!(met, ["allocatableMemory.available"]);
    assert_eq!(out[0]["eviction"]["signal"], "allocatableMemory.available");
    assert_eq!(victim(&out[0]), Some("batch"));
    // Without `pods` in enforceNodeAllocatable there is no allocatable threshold.
    let out = replay(
        &["--eviction-hard", "memory.available<100Mi", "--enforce-node-allocatable", "system-reserved"],
        &shop(),
        FsLayout::SingleFs,
        &[summary(0, &node, &usage(2 * GI))],
    );
    assert!(out[0]["eviction"].is_null());
}

#[test]
fn steps_out_of_order_are_rejected_naming_the_line() {
    let n = Node::default();
    let (policy, _) = policy(&[]).policy().unwrap();
    let pods = shop();
    let mut session = Session::new(&policy, FsLayout::SingleFs, &pods);
    let text = [summary(10, &n, &[]), summary(5, &n, &[])].join("\n");
    let err = offline::replay(&mut session, std::io::Cursor::new(text), "ep.jsonl", true, &mut Vec::new())
        .unwrap_err();
    assert!(err.to_string().contains("ep.jsonl:2"), "{err}");
    let mut session = Session::new(&policy, FsLayout::SingleFs, &pods);
    let err =
        offline::replay(&mut session, std::io::Cursor::new("{not json"), "ep.jsonl", true, &mut Vec::new())
            .unwrap_err();
    assert!(format!("{err:#}").contains("ep.jsonl:1"), "{err:#}");
}
