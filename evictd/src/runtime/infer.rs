//! Pod specs inferred from what the node shows, for pods that no PodList describes: the QoS
//! class from the cgroup placement, requests from container limits (Guaranteed) or from
//! `oom_score_adj` (Burstable: the kubelet's `1000 − 1000·request/capacity`, inverted), the
//! grace period from the kubelet's container annotation, critical-ness from the annotations
//! the kubelet copies onto the sandbox. Priority cannot be seen on the node and is 0.

use std::collections::BTreeMap;

use evictd_policy::{
    podspec::{Container, ObjectMeta, Pod, PodSpec, Resources},
    quantity::Quantity,
};

use super::inventory::PodRecord;

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
pub fn infer_spec(rec: &PodRecord, capacity: i64) -> Pod {
    let qos = rec.cgroup_parent.as_deref().map_or(Qos::BestEffort, qos_of_cgroup);
    let containers = rec
        .containers
        .iter()
        .map(|c| {
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
            Container {
                name: c.name.clone(),
                resources: Resources { requests, limits },
                restart_policy: None,
            }
        })
        .collect();
    Pod {
        metadata: ObjectMeta {
            name: rec.name.clone(),
            namespace: rec.namespace.clone(),
            uid: rec.uid.clone(),
            annotations: rec.annotations.clone(),
            labels: BTreeMap::new(),
        },
        spec: PodSpec {
            containers,
            termination_grace_period_seconds: rec.containers.iter().find_map(|c| c.grace_seconds),
            ..Default::default()
        },
        status: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::inventory::tests::{container, record};

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
}
