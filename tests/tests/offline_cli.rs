//! The offline commands as a user runs them, on the committed examples: the JSON contract,
//! exit codes, and errors that name what is at fault (one line on stderr, nothing on stdout).

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use evictd_tests::evictd_binary;
use serde_json::Value;

fn example(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace").join("examples");
    root.join(name).display().to_string()
}

fn evictd(args: &[&str]) -> Output {
    Command::new(evictd_binary()).args(args).output().expect("running evictd")
}

fn stdout_json_lines(o: &Output) -> Vec<Value> {
    assert!(o.status.success(), "evictd failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect()
}

/// `simulate --output json` on the committed example node and pods, with `extra` flags.
fn simulate_example_json(extra: &[&str]) -> Value {
    let (summary, pods) = (example("summary.json"), example("pods.json"));
    let mut args = vec!["simulate", "--summary", &summary, "--pods", &pods, "--output", "json"];
    args.extend(extra);
    stdout_json_lines(&evictd(&args)).remove(0)
}

#[test]
fn check_config_prints_the_policy_contract() {
    let o = evictd(&[
        "check-config",
        "--eviction-soft",
        "memory.available<1Gi",
        "--eviction-soft-grace-period",
        "memory.available=2m",
        "--output",
        "json",
    ]);
    let v = &stdout_json_lines(&o)[0];
    assert_eq!(v["pressure_transition_period_seconds"], 300);
    assert_eq!(v["max_pod_grace_period_seconds"], 0);
    assert_eq!(v["local_storage_capacity_isolation"], true, "the kubelet's default");
    assert_eq!(v["image_minimum_gc_age_seconds"], 120, "the kubelet's default");
    let t = v["thresholds"].as_array().unwrap();
    let keys: Vec<&str> = t[0].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["grace_period_seconds", "hard", "min_reclaim", "signal", "value"]);
    let soft = t.iter().find(|t| t["hard"] == false).expect("soft threshold");
    assert_eq!(soft["grace_period_seconds"], 120);
    assert_eq!(soft["value"]["quantity"], 1u64 << 30);
    assert!(t.iter().any(|t| t["signal"] == "allocatableMemory.available"));
}

/// `--config` and `--config-dir` assembled as the kubelet assembles them: a drop-in's map
/// merges into the main file's key by key; a policy left empty is said on stderr.
#[test]
fn check_config_reads_the_kubelets_drop_ins() {
    let d = tempfile::tempdir().unwrap();
    let main = d.path().join("config.yaml");
    std::fs::write(
        &main,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard:\n  memory.available: 500Mi\n  nodefs.available: 10%\n",
    )
    .unwrap();
    let dir = d.path().join("config.d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(
        dir.join("10-memory.conf"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard:\n  memory.available: 1Gi\n",
    )
    .unwrap();
    let (m, c) = (main.display().to_string(), dir.display().to_string());
    let o = evictd(&["check-config", "--config", &m, "--config-dir", &c, "--output", "json"]);
    let v = &stdout_json_lines(&o)[0];
    let hard: Vec<String> = v["thresholds"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["hard"] == true && t["signal"] != "allocatableMemory.available")
        .map(|t| t["signal"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(hard, ["memory.available", "nodefs.available"], "{v}");
    std::fs::write(
        dir.join("20-none.conf"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard: null\n",
    )
    .unwrap();
    std::fs::write(
        &main,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard: {}\n",
    )
    .unwrap();
    let o = evictd(&["check-config", "--config", &m, "--output", "json"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("no eviction threshold"), "{o:?}");
}

/// An emergency level at or above a memory threshold turns each eviction on it into a kill
/// that waits for nothing: `check-config` says so as the daemon does at start, for the
/// daemon's `--emergency-available` (a quantity, or `auto`: half of a hard threshold), and
/// says nothing where the level stays under every threshold.
#[test]
fn check_config_warns_of_thresholds_the_emergency_level_reaches() {
    let warned = |args: &[&str]| {
        let mut all = vec!["check-config", "--output", "json"];
        all.extend(args);
        let o = evictd(&all);
        assert!(o.status.success(), "{all:?}: {}", String::from_utf8_lossy(&o.stderr));
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        err.lines().filter(|l| l.contains("the emergency level")).map(String::from).collect::<Vec<_>>()
    };
    let hard = "memory.available<100Mi";
    let fixed = warned(&["--eviction-hard", hard, "--emergency-available", "200Mi"]);
    assert!(
        fixed.iter().any(|l| l.contains("200.0MiB (--emergency-available)") && l.contains(hard)),
        "a fixed level over the threshold: {fixed:?}"
    );
    assert_eq!(warned(&["--eviction-hard", hard, "--emergency-available", "50Mi"]), Vec::<String>::new());
    // `auto`: the soft threshold at 200Mi is under half of the hard one at 500Mi.
    let soft =
        ["--eviction-hard", "memory.available<500Mi", "--eviction-soft-grace-period", "memory.available=1m"];
    let auto = warned(&[&soft[..], &["--eviction-soft", "memory.available<200Mi"]].concat());
    assert!(
        auto.iter().any(|l| l.contains("250.0MiB (auto") && l.contains("memory.available<200Mi")),
        "auto, a soft threshold under half a hard one: {auto:?}"
    );
    assert_eq!(
        warned(&[&soft[..], &["--eviction-soft", "memory.available<300Mi"]].concat()),
        Vec::<String>::new()
    );
    let o = evictd(&["check-config", "--eviction-hard", hard, "--emergency-available", "lots"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--emergency-available: \"lots\""), "{o:?}");
}

/// A percentage is the kubelet's float32 (`parsePercentage`: the number parsed as float32,
/// divided by 100 in float32), printed as the shortest decimal that reads back as that
/// float32; `check-config` and `simulate`'s `thresholds_met` print the same number for the
/// same threshold (0.7% is 0.0069999998, not 0.007: that is the kubelet's).
#[test]
fn percentages_print_as_the_kubelets_float32_in_every_command() {
    for pct in ["20%", "20.3%", "10.1%", "0.7%", "33.333%", "99.99%"] {
        let flag = format!("memory.available<{pct}");
        let o = evictd(&["check-config", "--eviction-hard", &flag, "--output", "json"]);
        let checked = stdout_json_lines(&o)[0]["thresholds"][0]["value"]["percentage"].clone();
        // 99.99% is met on the example node (80 MiB available of 8 GiB), and so is every other.
        let v = &simulate_example_json(&["--eviction-hard", &flag]);
        let met = v["thresholds_met"].as_array().unwrap();
        let simulated =
            met.iter().find(|t| t["signal"] == "memory.available").map(|t| t["value"]["percentage"].clone());
        let kubelet: f32 = pct.trim_end_matches('%').parse::<f32>().unwrap() / 100.0;
        if simulated.is_none() {
            assert_eq!(pct, "0.7%", "only 0.7% (57 MiB) is not met by 80 MiB available: {v}");
            continue;
        }
        assert_eq!(simulated.as_ref(), Some(&checked), "{pct}");
        let printed = checked.as_f64().unwrap();
        assert_eq!(printed as f32, kubelet, "{pct}: {printed} reads back as the kubelet's float32");
        assert!(printed.to_string().len() <= 12, "{pct}: shortest form, not {printed}");
    }
    let o = evictd(&["check-config", "--eviction-hard", "memory.available<0.7%", "--output", "json"]);
    assert_eq!(stdout_json_lines(&o)[0]["thresholds"][0]["value"]["percentage"], 0.0069999998);
}

/// Pods over their own ephemeral-storage limits are all evicted, with the kubelet's messages
/// and a 1 s grace period, with no threshold met, and instead of any threshold eviction;
/// `--local-storage-capacity-isolation false` turns it off.
#[test]
fn simulate_lists_every_pod_over_its_own_storage_limit() {
    let d = tempfile::tempdir().unwrap();
    let at = "2026-01-01T12:00:00Z";
    let mut summary: Value =
        serde_json::from_str(&std::fs::read_to_string(example("summary.json")).unwrap()).unwrap();
    // Plenty of memory: no threshold is met.
    summary["node"]["memory"]["availableBytes"] = (4u64 << 30).into();
    summary["node"]["systemContainers"][0]["memory"]["availableBytes"] = (4u64 << 30).into();
    let pod_ref =
        |name: &str| serde_json::json!({"name": name, "namespace": "n", "uid": format!("uid-{name}")});
    summary["pods"] = serde_json::json!([
        {"podRef": pod_ref("cache"), "volume": [{"time": at, "name": "scratch", "usedBytes": 150u64 << 20}]},
        {"podRef": pod_ref("chatty"), "containers": [{"name": "app", "logs": {"time": at, "usedBytes": 20u64 << 20}}]},
        {"podRef": pod_ref("calm"), "volume": [{"time": at, "name": "scratch", "usedBytes": 1u64 << 20}]},
    ]);
    let item = |name: &str, spec: Value| {
        serde_json::json!({"metadata": {"name": name, "namespace": "n", "uid": format!("uid-{name}")},
            "spec": spec, "status": {"phase": "Running"}})
    };
    let scratch = serde_json::json!([{"name": "scratch", "emptyDir": {"sizeLimit": "100Mi"}}]);
    let pods = serde_json::json!({"kind": "PodList", "items": [
        item("cache", serde_json::json!({"containers": [{"name": "app"}], "volumes": scratch})),
        item("chatty", serde_json::json!({"containers": [{"name": "app", "resources": {"limits": {"ephemeral-storage": "10Mi"}}}]})),
        item("calm", serde_json::json!({"containers": [{"name": "app"}], "volumes": scratch})),
    ]});
    let (sf, pf) = (d.path().join("summary.json"), d.path().join("pods.json"));
    std::fs::write(&sf, summary.to_string()).unwrap();
    std::fs::write(&pf, pods.to_string()).unwrap();
    let run = |extra: &[&str]| {
        let (sf, pf) = (sf.display().to_string(), pf.display().to_string());
        let mut args = vec!["simulate", "--summary", &sf, "--pods", &pf, "--output", "json"];
        args.extend(extra);
        stdout_json_lines(&evictd(&args)).remove(0)
    };
    let v = run(&[]);
    assert_eq!(v["thresholds_met"], serde_json::json!([]));
    assert_eq!(v["eviction"], Value::Null);
    assert_eq!(
        v["limit_evictions"],
        serde_json::json!([
            {"limit": "emptydirfs.limit", "pod": {"namespace": "n", "name": "cache", "uid": "uid-cache"},
             "grace_period_seconds": 1,
             "message": "Usage of EmptyDir volume \"scratch\" exceeds the limit \"100Mi\". "},
            {"limit": "ephemeralcontainerfs.limit", "pod": {"namespace": "n", "name": "chatty", "uid": "uid-chatty"},
             "grace_period_seconds": 1,
             "message": "Container app exceeded its local ephemeral storage limit \"10Mi\". "},
        ])
    );
    let off = run(&["--local-storage-capacity-isolation", "false"]);
    assert_eq!(off["limit_evictions"], serde_json::json!([]));
}

#[test]
fn invalid_policy_is_one_line_on_stderr_and_nothing_on_stdout() {
    for args in [
        vec!["check-config", "--eviction-hard", "memory.available<0", "--output", "json"],
        vec!["check-config", "--eviction-soft", "memory.available<1Gi"],
        vec!["check-config", "--eviction-hard", "memory.available<0%,bogus<1", "--output", "json"],
        vec!["check-config", "--config", "/nonexistent/kubelet.yaml"],
    ] {
        let o = evictd(&args);
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(o.stdout.is_empty(), "{args:?} printed on stdout");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn simulate_prints_the_decision_contract() {
    let v = &simulate_example_json(&[]);
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "eviction",
            "limit_evictions",
            "node_conditions",
            "node_reclaim",
            "ranking",
            "signals",
            "thresholds_met"
        ]
    );
    assert_eq!(
        v["signals"]["memory.available"],
        serde_json::json!({"available": 83886080, "capacity": 8589934592u64})
    );
    assert_eq!(v["node_conditions"], serde_json::json!(["MemoryPressure"]));
    assert_eq!(
        v["eviction"]["pod"],
        serde_json::json!({"namespace": "shop", "name": "checkout", "uid": "uid-checkout"})
    );
    assert_eq!(v["eviction"]["signal"], "memory.available");
    assert_eq!(v["eviction"]["grace_period_seconds"], 1);
    // The Succeeded pod is not active and is not ranked.
    assert!(v["ranking"].as_array().unwrap().iter().all(|p| p["name"] != "done-job"));
    // Table output works too.
    let o = evictd(&["simulate", "--summary", &example("summary.json"), "--pods", &example("pods.json")]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("eviction: shop/checkout for memory.available"));
}

#[test]
fn replay_prints_one_object_per_step_with_its_time() {
    let o = evictd(&[
        "replay",
        "--summaries",
        &example("episode.jsonl"),
        "--pods",
        &example("pods.json"),
        "--output",
        "json",
    ]);
    let steps = stdout_json_lines(&o);
    assert_eq!(steps.len(), 5);
    assert_eq!(steps[0]["time"], "2026-01-01T12:00:00Z");
    let evicted: Vec<bool> = steps.iter().map(|s| !s["eviction"].is_null()).collect();
    assert_eq!(evicted, [false, false, true, true, false]);
    assert_eq!(steps[4]["node_conditions"], serde_json::json!(["MemoryPressure"]), "transition period");
}

#[test]
fn bad_input_files_are_named() {
    // Removed on drop, also when an assertion fails.
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "{\"node\": [").unwrap();
    let g = garbage.display().to_string();
    for (args, needle) in [
        (vec!["simulate", "--summary", g.as_str(), "--pods", &example("pods.json")], g.clone()),
        (vec!["simulate", "--summary", &example("summary.json"), "--pods", g.as_str()], g.clone()),
        (
            vec!["simulate", "--summary", "/nonexistent/s.json", "--pods", &example("pods.json")],
            "/nonexistent/s.json".into(),
        ),
        (vec!["replay", "--summaries", g.as_str(), "--pods", &example("pods.json")], format!("{g}:1")),
    ] {
        let o = evictd(&args);
        assert!(!o.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(&needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// `simulate` ranks and reclaims by the disk layout it is told. imagefs short of space: with
/// a dedicated imagefs holding the writable layers, dead containers and images are reclaimed
/// and the pod writing most to its layer goes first; with the split containerfs, imagefs
/// holds images only: image GC alone, and no pod's usage counts (PodList order decides).
#[test]
fn simulate_ranks_and_reclaims_by_the_disk_layout_it_is_told() {
    let d = tempfile::tempdir().unwrap();
    let at = "2026-01-01T12:00:00Z";
    let fs = |avail: u64| {
        serde_json::json!({"time": at, "availableBytes": avail, "capacityBytes": 100u64 << 30,
            "inodesFree": 5_000_000, "inodes": 6_000_000})
    };
    let pod_ref =
        |name: &str| serde_json::json!({"name": name, "namespace": "n", "uid": format!("uid-{name}")});
    let container = |rootfs: u64, logs: u64| {
        serde_json::json!([{"name": "app", "rootfs": {"time": at, "usedBytes": rootfs},
            "logs": {"time": at, "usedBytes": logs}}])
    };
    let summary = serde_json::json!({
        "node": {"nodeName": "n1",
            "memory": {"time": at, "availableBytes": 4u64 << 30, "workingSetBytes": 1u64 << 30},
            "fs": fs(50 << 30),
            "runtime": {"imageFs": fs(1 << 30)}},
        "pods": [
            {"podRef": pod_ref("logger"), "containers": container(10 << 20, 3 << 30)},
            {"podRef": pod_ref("writer"), "containers": container(5 << 30, 10 << 20)},
        ]
    });
    let item = |name: &str| {
        serde_json::json!({"metadata": {"name": name, "namespace": "n", "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "app"}]}, "status": {"phase": "Running"}})
    };
    let pods = serde_json::json!({"kind": "PodList", "items": [item("logger"), item("writer")]});
    let (sf, pf) = (d.path().join("summary.json"), d.path().join("pods.json"));
    std::fs::write(&sf, summary.to_string()).unwrap();
    std::fs::write(&pf, pods.to_string()).unwrap();
    let (sf, pf) = (sf.display().to_string(), pf.display().to_string());
    let base = [
        "simulate",
        "--summary",
        &sf,
        "--pods",
        &pf,
        "--output",
        "json",
        "--eviction-hard",
        "imagefs.available<15%",
    ];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend(extra);
        stdout_json_lines(&evictd(&args)).remove(0)
    };
    let victim = |v: &Value| v["eviction"]["pod"]["name"].as_str().map(str::to_owned);
    let dedicated = run(&["--dedicated-imagefs"]);
    assert_eq!(dedicated["node_reclaim"], serde_json::json!(["unused-containers", "unused-images"]));
    assert_eq!(victim(&dedicated).as_deref(), Some("writer"), "{dedicated}");
    let split = run(&["--dedicated-imagefs", "--split-containerfs"]);
    assert_eq!(split["node_reclaim"], serde_json::json!(["unused-images"]));
    assert_eq!(victim(&split).as_deref(), Some("logger"), "{split}");
    // A split without a dedicated imagefs is not a layout the kubelet has.
    let mut args = base.to_vec();
    args.push("--split-containerfs");
    let o = evictd(&args);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--dedicated-imagefs"));
    assert!(o.stdout.is_empty());
}
