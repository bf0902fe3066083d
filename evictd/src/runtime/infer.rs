//! Pod specs inferred from what the node shows, for pods that no PodList describes: the QoS
//! class from the cgroup placement, requests from container limits (Guaranteed) or from
//! `oom_score_adj` (Burstable: the kubelet's `1000 − 1000·request/capacity`, inverted), the
//! grace period from the kubelet's container annotation, critical-ness from the annotations
//! the kubelet copies onto the sandbox. Priority cannot be seen on the node and is 0, except
//! for node-critical pods: the kubelet gives them `oom_score_adj` −997 whatever their QoS
//! class, so −997 under a burstable or besteffort parent means system-node-critical.

use std::collections::BTreeMap;

use evictd_policy::{
    podspec::{Container, ObjectMeta, Pod, PodSpec, Resources, SYSTEM_CRITICAL_PRIORITY},
    quantity::Quantity,
};

use super::inventory::{ContainerRecord, PodRecord};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// The QoS class a cgroup placement means (kubelet layout, cgroupfs or systemd).
pub fn qos_of_cgroup(parent: &str) -> Qos {
    if parent.contains("besteffort") {
        Qos::BestEffort
    } else if parent.contains("burstable") {
        Qos::Burstable
    } else {
        Qos::Guaranteed
    }
}

/// A spec built from what the node shows, for pods the pods file does not describe.
///
/// Only the latest instance of each container name counts (a restarted container's earlier
/// instances are history, not demand). A name whose latest instance runs is a regular
/// container; one whose latest instance has exited while the pod runs is taken as an init
/// container, so the kubelet's rule applies: the pod requests the larger of its biggest
/// init container and the sum of its regular containers.
pub fn infer_spec(rec: &PodRecord, capacity: i64) -> Pod {
    let qos = rec.cgroup_parent.as_deref().map_or(Qos::BestEffort, qos_of_cgroup);
    let (mut containers, mut init_containers) = (Vec::new(), Vec::new());
    for c in latest_instances(&rec.containers) {
        let spec = inferred_container(c, qos, capacity);
        if c.running { containers.push(spec) } else { init_containers.push(spec) }
    }
    let node_critical = qos != Qos::Guaranteed
        && rec.containers.iter().any(|c| c.oom_score_adj == Some(CRITICAL_OOM_SCORE_ADJ));
    Pod {
        metadata: ObjectMeta {
            name: rec.name.clone(),
            namespace: rec.namespace.clone(),
            uid: rec.uid.clone(),
            annotations: rec.annotations.clone(),
            // Not on the node: a DaemonSet's pod with an inferred spec ranks as any other.
            owner_references: Vec::new(),
        },
        spec: PodSpec {
            containers,
            init_containers,
            termination_grace_period_seconds: rec.containers.iter().find_map(|c| c.grace_seconds),
            priority: node_critical.then_some(SYSTEM_NODE_CRITICAL_PRIORITY),
            ..Default::default()
        },
        status: Default::default(),
    }
}

/// The kubelet's `oom_score_adj` for Guaranteed and for node-critical containers
/// (`qos.GetContainerOOMScoreAdjust`).
const CRITICAL_OOM_SCORE_ADJ: i64 = -997;
/// `system-node-critical`'s priority.
const SYSTEM_NODE_CRITICAL_PRIORITY: i32 = SYSTEM_CRITICAL_PRIORITY + 1000;

/// A spec from a PodList, with the annotations that make a pod static or mirror taken from
/// the sandbox (the kubelet writes them there) and never from the list: any tenant can
/// annotate their own pod `kubernetes.io/config.source: file` and so make it unevictable.
pub fn with_trusted_annotations(mut spec: Pod, sandbox: &BTreeMap<String, String>) -> Pod {
    for key in TRUSTED_FROM_SANDBOX {
        spec.metadata.annotations.remove(key);
        if let Some(v) = sandbox.get(key) {
            spec.metadata.annotations.insert(key.to_owned(), v.clone());
        }
    }
    spec
}

const TRUSTED_FROM_SANDBOX: [&str; 2] = ["kubernetes.io/config.source", "kubernetes.io/config.mirror"];

/// The newest instance (highest attempt) of each container name, in first-seen order.
fn latest_instances(all: &[ContainerRecord]) -> Vec<&ContainerRecord> {
    let mut latest: Vec<&ContainerRecord> = Vec::new();
    for c in all {
        match latest.iter_mut().find(|l| l.name == c.name) {
            Some(l) if c.attempt > l.attempt => *l = c,
            Some(_) => {}
            None => latest.push(c),
        }
    }
    latest
}

/// One container's requests and limits, as its QoS class and the kubelet's settings show them.
fn inferred_container(c: &ContainerRecord, qos: Qos, capacity: i64) -> Container {
    let request = match qos {
        Qos::BestEffort => None,
        Qos::Guaranteed => c.memory_limit,
        // The kubelet sets oom_score_adj = 1000 − 1000·request/capacity for burstable
        // containers; invert it (clamped values lose precision, not direction).
        Qos::Burstable => c
            .oom_score_adj
            .filter(|adj| (1..1000).contains(adj))
            .map(|adj| ((1000 - adj) as i128 * capacity as i128 / 1000) as i64),
    };
    let mut requests = BTreeMap::new();
    if let Some(r) = request {
        requests.insert("memory".to_owned(), Quantity::from_units(r));
    }
    let mut limits = BTreeMap::new();
    if let Some(l) = c.memory_limit {
        limits.insert("memory".to_owned(), Quantity::from_units(l));
    }
    Container { name: c.name.clone(), resources: Resources { requests, limits }, restart_policy: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::inventory::tests::{container, record};

    /// CoreDNS, kube-proxy or a CNI agent are Burstable yet system-node-critical;
    /// the kubelet marks them with oom_score_adj −997, and read as "request 0" they would
    /// rank first.
    #[test]
    fn minus_997_outside_guaranteed_is_node_critical() {
        let cap = 1000 << 20;
        let coredns = infer_spec(&record("/kubepods/burstable/pod1", vec![container(None, Some(-997))]), cap);
        assert!(coredns.is_critical(), "{:?}", coredns.spec.priority);
        let besteffort =
            infer_spec(&record("/kubepods/besteffort/pod1", vec![container(None, Some(-997))]), cap);
        assert!(besteffort.is_critical());
        // In a Guaranteed pod −997 is every container's adj: nothing to learn from it.
        let guaranteed =
            infer_spec(&record("/kubepods/pod1", vec![container(Some(1 << 20), Some(-997))]), cap);
        assert!(!guaranteed.is_critical());
        let ordinary = infer_spec(&record("/kubepods/burstable/pod1", vec![container(None, Some(900))]), cap);
        assert!(!ordinary.is_critical());
    }

    #[test]
    fn static_and_mirror_annotations_come_from_the_sandbox_only() {
        let mut listed = Pod::default();
        listed.metadata.annotations.insert("kubernetes.io/config.source".into(), "file".into());
        listed.metadata.annotations.insert("team".into(), "shop".into());
        let tenant = with_trusted_annotations(listed.clone(), &BTreeMap::new());
        assert!(!tenant.is_critical(), "a PodList's own claim to be static is not trusted");
        assert_eq!(tenant.metadata.annotations.get("team").map(String::as_str), Some("shop"));
        let sandbox = BTreeMap::from([("kubernetes.io/config.source".to_string(), "file".to_string())]);
        assert!(with_trusted_annotations(Pod::default(), &sandbox).is_critical(), "the sandbox's is");
    }

    #[test]
    fn qos_from_placement() {
        assert_eq!(qos_of_cgroup("/kubepods/besteffort/pod1"), Qos::BestEffort);
        assert_eq!(qos_of_cgroup("kubepods-burstable-pod1.slice"), Qos::Burstable);
        assert_eq!(qos_of_cgroup("/kubepods/pod1"), Qos::Guaranteed);
    }

    #[test]
    fn inferred_requests_follow_the_qos_class() {
        let cap = 1000 << 20;
        let g = infer_spec(&record("/kubepods/pod1", vec![container(Some(256 << 20), Some(-997))]), cap);
        assert_eq!(g.request_nanos("memory"), (256i128 << 20) * 1_000_000_000);
        assert_eq!(g.spec.termination_grace_period_seconds, Some(45));
        // adj 900 → request = 100/1000 of capacity.
        let b = infer_spec(&record("/kubepods/burstable/pod2", vec![container(None, Some(900))]), cap);
        assert_eq!(b.request_nanos("memory"), (100i128 << 20) * 1_000_000_000);
        let be =
            infer_spec(&record("/kubepods/besteffort/pod3", vec![container(Some(1 << 30), Some(1000))]), cap);
        assert_eq!(be.request_nanos("memory"), 0);
    }

    #[test]
    fn critical_annotations_survive_inference() {
        let mut r = record("/kubepods/pod1", vec![]);
        r.annotations.insert("kubernetes.io/config.source".into(), "file".into());
        assert!(infer_spec(&r, 1).is_critical());
    }

    /// A restarted container and a finished init container must not
    /// add up to a request the pod never made.
    #[test]
    fn only_the_latest_instance_counts_and_init_containers_take_the_max() {
        let cap = 1000 << 20;
        let instance = |name: &str, attempt: u32, running: bool, adj: i64| ContainerRecord {
            name: name.into(),
            attempt,
            running,
            ..container(None, Some(adj))
        };
        // app: request 100/1000 of capacity (adj 900), restarted once; init: 50 (adj 950).
        let r = record(
            "/kubepods/burstable/pod1",
            vec![
                instance("init", 0, false, 950),
                instance("app", 0, false, 900),
                instance("app", 1, true, 900),
            ],
        );
        let spec = infer_spec(&r, cap);
        assert_eq!(spec.spec.containers.len(), 1, "one app, not two: {:?}", spec.spec.containers);
        assert_eq!(spec.spec.init_containers.len(), 1);
        assert_eq!(spec.request_nanos("memory"), (100i128 << 20) * 1_000_000_000, "max(50, 100), not 250");
        // An init container bigger than the regular ones sets the request.
        let r = record(
            "/kubepods/burstable/pod2",
            vec![instance("init", 0, false, 700), instance("app", 0, true, 900)],
        );
        assert_eq!(infer_spec(&r, cap).request_nanos("memory"), (300i128 << 20) * 1_000_000_000);
    }
}
