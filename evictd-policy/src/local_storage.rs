//! The kubelet's local-storage evictions (`localStorageEviction` in eviction_manager.go, with
//! `localStorageCapacityIsolation`, its default): a pod over one of its own ephemeral-storage
//! limits is evicted whatever the node's thresholds say. Checked before thresholds, and every
//! pod found is evicted in the same tick, each with a 1 s grace period.

use crate::{
    podspec::Pod,
    quantity::Quantity,
    rank::{FsLayout, PodEntry},
    summary::{FsStats, PodStats},
};

/// Which limit a pod exceeded, named as the kubelet's `kubelet_evictions` label names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum LimitKind {
    /// An emptyDir volume over its `sizeLimit`.
    #[serde(rename = "emptydirfs.limit")]
    EmptyDir,
    /// The pod's ephemeral-storage usage over the sum of its containers' limits.
    #[serde(rename = "ephemeralpodfs.limit")]
    Pod,
    /// A container's logs (and writable layer, without a dedicated imagefs) over its limit.
    #[serde(rename = "ephemeralcontainerfs.limit")]
    Container,
}

impl LimitKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::EmptyDir => "emptydirfs.limit",
            LimitKind::Pod => "ephemeralpodfs.limit",
            LimitKind::Container => "ephemeralcontainerfs.limit",
        }
    }
}

/// One pod to evict for exceeding its own limit.
#[derive(Clone, Debug, PartialEq)]
pub struct LimitEviction {
    /// Index into the pods given.
    pub pod: usize,
    pub kind: LimitKind,
    pub message: String,
    pub grace_period_seconds: i64,
}

/// The kubelet's grace period for these evictions.
pub const LIMIT_EVICTION_GRACE_SECONDS: i64 = 1;

/// Every pod over one of its limits, in the given order, each with the first rule it breaks
/// (emptyDir, then the pod's total, then a container). Pods without stats, critical pods and
/// pods evictd must not touch (`protected`, opted out) are skipped.
pub fn limit_evictions(pods: &[PodEntry], layout: FsLayout) -> Vec<LimitEviction> {
    pods.iter()
        .enumerate()
        .filter(|(_, e)| !e.protected && !e.pod.is_critical() && !e.pod.opts_out())
        .filter_map(|(i, e)| {
            let stats = e.stats?;
            let (kind, message) = empty_dir_over_limit(e.pod, stats)
                .map(|m| (LimitKind::EmptyDir, m))
                .or_else(|| pod_over_limit(e.pod, stats).map(|m| (LimitKind::Pod, m)))
                .or_else(|| container_over_limit(e.pod, stats, layout).map(|m| (LimitKind::Container, m)))?;
            Some(LimitEviction { pod: i, kind, message, grace_period_seconds: LIMIT_EVICTION_GRACE_SECONDS })
        })
        .collect()
}

/// `emptyDirLimitEviction`: an emptyDir (any medium) whose usage exceeds its `sizeLimit`.
fn empty_dir_over_limit(pod: &Pod, stats: &PodStats) -> Option<String> {
    pod.sized_empty_dirs().filter(|(_, limit)| limit.nanos() > 0).find_map(|(name, limit)| {
        let used = stats.volume.iter().find(|s| s.name == name)?.used_bytes?;
        (i128::from(used) * 1_000_000_000 > limit.nanos()).then(|| {
            format!("Usage of EmptyDir volume {:?} exceeds the limit {:?}. ", name, limit.to_string())
        })
    })
}

/// `podEphemeralStorageLimitEviction`: the pod's ephemeral-storage usage over its effective
/// limit (containers summed, at least the largest init container, as for requests).
fn pod_over_limit(pod: &Pod, stats: &PodStats) -> Option<String> {
    let limit = pod.limit("ephemeral-storage")?;
    let used = stats.ephemeral_storage.as_ref().and_then(|f| f.used_bytes).unwrap_or(0);
    (i128::from(used) * 1_000_000_000 > limit.nanos())
        .then(|| format!("Pod ephemeral local storage usage exceeds the total limit of containers {limit}. "))
}

/// `containerEphemeralStorageLimitEviction`: a regular container whose logs, plus its
/// writable layer unless images live on a dedicated imagefs, exceed its limit.
fn container_over_limit(pod: &Pod, stats: &PodStats, layout: FsLayout) -> Option<String> {
    pod.spec.containers.iter().find_map(|c| {
        let limit = c.resources.limits.get("ephemeral-storage").filter(|l| l.nanos() > 0)?;
        let s = stats.containers.iter().find(|s| s.name == c.name)?;
        let bytes = |f: &Option<FsStats>| f.as_ref().and_then(|f| f.used_bytes).unwrap_or(0);
        let rootfs = if layout.has_image_fs() { 0 } else { bytes(&s.rootfs) };
        let used = Quantity::from_units((bytes(&s.logs) + rootfs) as i64);
        (limit.nanos() < used.nanos()).then(|| {
            format!(
                "Container {} exceeded its local ephemeral storage limit {:?}. ",
                c.name,
                limit.to_string()
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::test_pod::test_pod;

    fn pod(spec: serde_json::Value) -> Pod {
        test_pod("p").uid("u").spec(spec).build()
    }

    fn stats(v: serde_json::Value) -> PodStats {
        serde_json::from_value(v).unwrap()
    }

    fn evict(p: &Pod, s: &PodStats, layout: FsLayout) -> Vec<(LimitKind, String)> {
        limit_evictions(&[PodEntry { pod: p, stats: Some(s), protected: false }], layout)
            .into_iter()
            .map(|e| (e.kind, e.message))
            .collect()
    }

    const MI: u64 = 1 << 20;

    #[test]
    fn an_empty_dir_over_its_size_limit_is_evicted_strictly_above() {
        let p = pod(json!({"containers": [{"name": "c"}],
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "100Mi"}},
                        {"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]}));
        let at = |scratch: u64, ram: u64| {
            stats(json!({"podRef": {"name": "p", "namespace": "n", "uid": "u"},
                "volume": [{"name": "scratch", "usedBytes": scratch}, {"name": "ram", "usedBytes": ram}]}))
        };
        assert_eq!(evict(&p, &at(100 * MI, 0), FsLayout::SingleFs), []);
        assert_eq!(
            evict(&p, &at(100 * MI + 1, 0), FsLayout::SingleFs),
            [(
                LimitKind::EmptyDir,
                "Usage of EmptyDir volume \"scratch\" exceeds the limit \"100Mi\". ".into()
            )]
        );
        // Memory-medium emptyDirs count too.
        assert_eq!(evict(&p, &at(0, 2 * MI), FsLayout::SingleFs)[0].0, LimitKind::EmptyDir);
    }

    #[test]
    fn the_pod_total_is_checked_against_its_containers_limits_summed() {
        let p = pod(json!({"containers": [
            {"name": "a", "resources": {"limits": {"ephemeral-storage": "1Gi"}}},
            {"name": "b", "resources": {"limits": {"ephemeral-storage": "512Mi"}}}]}));
        let at = |used: u64| {
            stats(json!({"podRef": {"name": "p", "namespace": "n", "uid": "u"},
                "ephemeral-storage": {"usedBytes": used}}))
        };
        assert_eq!(evict(&p, &at(1536 * MI), FsLayout::SingleFs), []);
        assert_eq!(
            evict(&p, &at(1536 * MI + 1), FsLayout::SingleFs),
            [(
                LimitKind::Pod,
                "Pod ephemeral local storage usage exceeds the total limit of containers 1536Mi. ".into()
            )]
        );
        // No container sets a limit: no pod limit, however much it uses.
        let unlimited = pod(json!({"containers": [{"name": "a"}]}));
        assert_eq!(evict(&unlimited, &at(100 << 30), FsLayout::SingleFs), []);
    }

    #[test]
    fn a_container_counts_its_logs_and_its_layer_unless_images_have_their_own_filesystem() {
        let p = pod(
            json!({"containers": [{"name": "app", "resources": {"limits": {"ephemeral-storage": "100Mi"}}}]}),
        );
        let s = stats(json!({"podRef": {"name": "p", "namespace": "n", "uid": "u"},
            "containers": [{"name": "app", "rootfs": {"usedBytes": 80 * MI}, "logs": {"usedBytes": 30 * MI}}]}));
        assert_eq!(
            evict(&p, &s, FsLayout::SingleFs),
            [(
                LimitKind::Container,
                "Container app exceeded its local ephemeral storage limit \"100Mi\". ".into()
            )]
        );
        assert_eq!(evict(&p, &s, FsLayout::DedicatedImageFs), [], "logs alone: 30Mi");
        assert_eq!(evict(&p, &s, FsLayout::SplitContainerFs), [], "the kubelet asks dedicatedImageFs only");
    }

    #[test]
    fn critical_protected_opted_out_and_stat_less_pods_are_skipped_and_every_other_is_listed() {
        let spec = json!({"containers": [{"name": "c"}], "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "1Mi"}}]});
        let over = stats(json!({"podRef": {"name": "p", "namespace": "n", "uid": "u"},
            "volume": [{"name": "v", "usedBytes": 2 * MI}]}));
        let plain = pod(spec.clone());
        let critical = pod(json!({"priority": 2_000_000_000, "containers": [{"name": "c"}],
            "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "1Mi"}}]}));
        let mut opted_out = plain.clone();
        opted_out.metadata.annotations.insert("evictd.io/eviction".into(), "never".into());
        let entries = [
            PodEntry { pod: &plain, stats: Some(&over), protected: false },
            PodEntry { pod: &critical, stats: Some(&over), protected: false },
            PodEntry { pod: &plain, stats: Some(&over), protected: true },
            PodEntry { pod: &opted_out, stats: Some(&over), protected: false },
            PodEntry { pod: &plain, stats: None, protected: false },
            PodEntry { pod: &plain, stats: Some(&over), protected: false },
        ];
        let pods: Vec<usize> = limit_evictions(&entries, FsLayout::SingleFs).iter().map(|e| e.pod).collect();
        assert_eq!(pods, [0, 5], "both unprotected pods over their limit, in one pass");
        assert!(limit_evictions(&entries, FsLayout::SingleFs).iter().all(|e| e.grace_period_seconds == 1));
    }

    #[test]
    fn pod_limits_follow_the_request_rule_with_init_containers_and_overhead() {
        let p = pod(json!({
            "initContainers": [{"name": "init", "resources": {"limits": {"ephemeral-storage": "3Gi"}}}],
            "containers": [{"name": "a", "resources": {"limits": {"ephemeral-storage": "1Gi"}}}, {"name": "b"}],
            "overhead": {"ephemeral-storage": "1Gi"}}));
        assert_eq!(p.limit("ephemeral-storage").map(|q| q.to_string()), Some("4Gi".into()));
        assert_eq!(p.limit("memory"), None);
    }
}
