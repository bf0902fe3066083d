//! Pods as the end-to-end and fault tests describe them, run on the private containerd with
//! a PodList written for evictd.

use serde_json::json;

use crate::containerd::{Containerd, PodSpec, TestPod};

const MI: u64 = 1 << 20;

/// evictd's policy flags for a soft threshold the scenarios cross at once: no hard
/// thresholds, memory.available<600Mi with a 1 s grace period.
pub const SOFT_600MI_AFTER_1S: [&str; 5] = [
    "--eviction-hard=",
    "--eviction-soft",
    "memory.available<600Mi",
    "--eviction-soft-grace-period",
    "memory.available=1s",
];

/// A pod as a scenario wants it.
pub struct PodDef {
    pub name: &'static str,
    pub qos: &'static str,
    pub priority: i64,
    pub request_mib: Option<u64>,
    pub limit_mib: Option<u64>,
    pub static_pod: bool,
    pub ignore_sigterm: bool,
    pub grace: i64,
}

impl PodDef {
    pub fn new(name: &'static str, qos: &'static str) -> Self {
        PodDef {
            name,
            qos,
            priority: 0,
            request_mib: None,
            limit_mib: None,
            static_pod: false,
            ignore_sigterm: false,
            grace: 30,
        }
    }

    /// A BestEffort pod that ignores SIGTERM and asks for `grace` seconds: only SIGKILL ends it.
    pub fn stubborn(grace: i64) -> Self {
        PodDef { ignore_sigterm: true, grace, ..PodDef::new("stubborn", "besteffort") }
    }

    /// A Guaranteed pod of high priority (100 MiB) that no scenario may ever evict.
    pub fn bystander() -> Self {
        PodDef {
            priority: 1000,
            request_mib: Some(100),
            limit_mib: Some(100),
            ..PodDef::new("bystander", "guaranteed")
        }
    }
}

/// Runs `defs` as kubelet-style pods and writes their PodList (the specs evictd reads).
pub async fn make_pods(ctd: &mut Containerd, defs: &[PodDef]) -> (Vec<TestPod>, std::path::PathBuf) {
    let mut pods = Vec::new();
    let mut items = Vec::new();
    for d in defs {
        let mut annotations = std::collections::BTreeMap::new();
        if d.static_pod {
            annotations.insert("kubernetes.io/config.source".to_owned(), "file".to_owned());
        }
        let oom = match d.qos {
            "guaranteed" => -997,
            "besteffort" => 1000,
            _ => 900,
        };
        let p = ctd
            .run_pod(PodSpec {
                name: d.name,
                qos: d.qos,
                memory_limit: d.limit_mib.map(|m| m * MI),
                oom_score_adj: oom,
                annotations: annotations.clone(),
                ignore_sigterm: d.ignore_sigterm,
                termination_grace_seconds: d.grace,
                hog_args: None,
                empty_dir_under: None,
                empty_dir_in_memory: false,
            })
            .await;
        let requests = d.request_mib.map_or(json!({}), |r| json!({"memory": format!("{r}Mi")}));
        items.push(json!({
            "metadata": {"name": d.name, "namespace": "e2e", "uid": p.uid, "annotations": annotations},
            "spec": {"priority": d.priority, "terminationGracePeriodSeconds": d.grace,
                     "containers": [{"name": "hog", "resources": {"requests": requests}}]},
            "status": {"phase": "Running"}
        }));
        pods.push(p);
    }
    let file = ctd.tmp.join("pods.json");
    std::fs::write(&file, json!({"kind": "PodList", "items": items}).to_string()).expect("pods file");
    (pods, file)
}
