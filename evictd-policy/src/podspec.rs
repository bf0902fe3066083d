//! Pod specs as eviction needs them, read from a Kubernetes PodList (`kubectl get pods -o
//! json`): priority, requests, grace period, volumes, and whether the pod is critical.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use serde::{Deserialize, de::IgnoredAny};

use crate::quantity::Quantity;

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct PodList {
    #[serde(default)]
    pub items: Vec<Pod>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PodSpec,
    #[serde(default)]
    pub status: PodStatus,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, rename = "ownerReferences")]
    pub owner_references: Vec<OwnerReference>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct OwnerReference {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
    pub controller: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default)]
    pub containers: Vec<Container>,
    #[serde(default)]
    pub init_containers: Vec<Container>,
    pub priority: Option<i32>,
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(default)]
    pub overhead: BTreeMap<String, Quantity>,
    /// Pod-level resources (PodLevelResources).
    pub resources: Option<Resources>,
    #[serde(default)]
    pub volumes: Vec<Volume>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct PodStatus {
    pub phase: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    pub name: String,
    #[serde(default)]
    pub resources: Resources,
    /// `Always` on an init container makes it a sidecar.
    pub restart_policy: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Resources {
    #[serde(default)]
    pub requests: BTreeMap<String, Quantity>,
    #[serde(default)]
    pub limits: BTreeMap<String, Quantity>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    pub name: String,
    // Only whether each source is there: a configMap's `items` are the tenant's to make as
    // long as the API server's object limit, and would be kept in locked memory for as long
    // as the pod lives.
    pub host_path: Option<IgnoredAny>,
    pub empty_dir: Option<EmptyDir>,
    pub config_map: Option<IgnoredAny>,
    #[serde(rename = "downwardAPI")]
    pub downward_api: Option<IgnoredAny>,
    pub git_repo: Option<IgnoredAny>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EmptyDir {
    pub medium: Option<String>,
    pub size_limit: Option<Quantity>,
}

/// `Succeeded` or `Failed`, the phases after which a pod runs no more containers (the
/// kubelet's `podutil.IsPodTerminal`); `None` for any other phase, or none.
pub fn terminal_phase(phase: Option<&str>) -> Option<&'static str> {
    match phase {
        Some("Succeeded") => Some("Succeeded"),
        Some("Failed") => Some("Failed"),
        _ => None,
    }
}

/// A PodList file that cannot be used; names the file (and the item at fault).
#[derive(Debug, thiserror::Error)]
pub enum PodListError {
    #[error("reading pods file {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{path}: not a Kubernetes PodList (kubectl get pods -o json): {error}")]
    Parse { path: String, error: serde_json::Error },
    #[error("{path}: items[{index}] ({namespace}/{name}) has no metadata.uid")]
    NoUid { path: String, index: usize, namespace: String, name: String },
}

/// Reads a PodList file (`kubectl get pods -o json`); every pod must have a UID, since that
/// is how pods are joined to their stats and sandboxes.
pub fn read_pod_list(path: &Path) -> Result<Vec<Pod>, PodListError> {
    let p = || path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| PodListError::Read { path: p(), error })?;
    let list: PodList =
        serde_json::from_str(&text).map_err(|error| PodListError::Parse { path: p(), error })?;
    if let Some((index, pod)) = list.items.iter().enumerate().find(|(_, pod)| pod.metadata.uid.is_empty()) {
        return Err(PodListError::NoUid {
            path: p(),
            index,
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
        });
    }
    Ok(list.items)
}

/// A pod's own say in evictd's order (beyond the kubelet): `never` takes it out of the
/// candidates; critical pods are never evicted whatever they say.
pub const EVICTION_ANNOTATION: &str = "evictd.io/eviction";
/// An integer: among pods the kubelet's keys rank equal, a lower order goes first. Unset or
/// not an integer: 0.
pub const EVICTION_ORDER_ANNOTATION: &str = "evictd.io/eviction-order";

/// The pod annotations eviction reads: static and mirror pods (critical), and evictd's own.
/// No other is kept: annotations are the pod author's to fill (`last-applied-configuration`
/// alone can be most of the API's 256 KiB limit), and the kubelet copies every one onto the
/// sandbox, so kept whole they would make evictd's memory a tenant's to grow.
pub const ANNOTATIONS_READ: [&str; 4] = [
    "kubernetes.io/config.source",
    "kubernetes.io/config.mirror",
    EVICTION_ANNOTATION,
    EVICTION_ORDER_ANNOTATION,
];

/// `annotations` less those eviction does not read (`ANNOTATIONS_READ`); borrowed ones are
/// copied only when kept.
pub fn annotations_read<K, V>(annotations: impl IntoIterator<Item = (K, V)>) -> BTreeMap<String, String>
where
    K: AsRef<str> + Into<String>,
    V: Into<String>,
{
    annotations
        .into_iter()
        .filter(|(k, _)| ANNOTATIONS_READ.contains(&k.as_ref()))
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
}

/// The namespaces whose pods' own evictd annotations count: the operator's word
/// (`--annotation-namespaces`). The kubelet gives pod annotations no say in eviction; a pod
/// author anywhere else could otherwise write `evictd.io/eviction: never` or a huge
/// `evictd.io/eviction-order` and send evictd to another tenant's pods instead. The default
/// trusts no namespace; PriorityClass is the Kubernetes way to order pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnnotationTrust {
    namespaces: BTreeSet<String>,
}

impl AnnotationTrust {
    /// From the flag's comma-separated list; empty entries are ignored.
    pub fn from_list(list: &str) -> Self {
        let namespaces = list.split(',').map(str::trim).filter(|n| !n.is_empty()).map(String::from).collect();
        AnnotationTrust { namespaces }
    }

    pub fn trusts(&self, namespace: &str) -> bool {
        self.namespaces.contains(namespace)
    }

    /// Takes evictd's annotations off a pod whose namespace is not trusted; returns the
    /// ones it took (empty: none, or the pod's word counts).
    pub fn apply(&self, pod: &mut Pod) -> Vec<String> {
        if self.trusts(&pod.metadata.namespace) {
            return Vec::new();
        }
        [EVICTION_ANNOTATION, EVICTION_ORDER_ANNOTATION]
            .into_iter()
            .filter(|a| pod.metadata.annotations.remove(*a).is_some())
            .map(String::from)
            .collect()
    }

    pub fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.namespaces.iter().map(String::as_str)
    }
}

/// The kubelet's `SystemCriticalPriority`: 2 × the highest user-definable priority.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

impl Pod {
    pub fn uid(&self) -> &str {
        &self.metadata.uid
    }

    /// Static, mirror, or system-critical priority: never evicted.
    pub fn is_critical(&self) -> bool {
        let a = &self.metadata.annotations;
        let is_static = a.get("kubernetes.io/config.source").is_some_and(|s| s != "api");
        let is_mirror = a.contains_key("kubernetes.io/config.mirror");
        is_static || is_mirror || self.spec.priority.is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
    }

    /// The pod asked evictd never to evict it (`evictd.io/eviction: never`).
    pub fn opts_out(&self) -> bool {
        self.metadata.annotations.get(EVICTION_ANNOTATION).is_some_and(|v| v.trim() == "never")
    }

    /// The pod's place among pods the kubelet's keys rank equal (`evictd.io/eviction-order`).
    pub fn eviction_order(&self) -> i64 {
        self.metadata
            .annotations
            .get(EVICTION_ORDER_ANNOTATION)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Controlled by a DaemonSet: evicting it frees nothing for long, since the DaemonSet
    /// re-creates it on this same node.
    pub fn is_daemonset_pod(&self) -> bool {
        self.metadata.owner_references.iter().any(|o| o.controller == Some(true) && o.kind == "DaemonSet")
    }

    /// Still running as far as eviction cares, as the kubelet's active pods are: not
    /// terminal (Succeeded or Failed). A pod being deleted stays active, as in the kubelet's
    /// `filterOutInactivePods`: its containers still hold memory until they exit, and
    /// leaving it out would let a tenant shield a pod that ignores SIGTERM behind a long
    /// grace period, and leave a node being drained with no candidate at all.
    pub fn is_active(&self) -> bool {
        terminal_phase(self.status.phase.as_deref()).is_none()
    }

    /// What is left of a finished pod for eviction: who it is and that it has finished. It is
    /// never ranked, so nothing else of its spec is kept.
    pub fn finished(name: &str, namespace: &str, uid: &str, phase: &'static str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: name.to_owned(),
                namespace: namespace.to_owned(),
                uid: uid.to_owned(),
                ..ObjectMeta::default()
            },
            spec: PodSpec::default(),
            status: PodStatus { phase: Some(phase.to_owned()) },
        }
    }

    pub fn priority(&self) -> i32 {
        self.spec.priority.unwrap_or(0)
    }

    /// The pod's effective request of `resource`, in nanos, as the kubelet computes it:
    /// pod-level resources if set; otherwise the sum of the containers plus sidecars, at least
    /// the largest init container (with the sidecars started before it); plus overhead.
    pub fn request_nanos(&self, resource: &str) -> i128 {
        self.effective_nanos(resource, |r| &r.requests).unwrap_or(0)
            + self.spec.overhead.get(resource).map_or(0, Quantity::nanos)
    }

    /// The pod's effective limit of `resource` (resourcehelper's `PodLimits`), by the same
    /// rule as requests; `None` when neither the pod nor any container sets one (overhead is
    /// added only to a limit that is set).
    pub fn limit(&self, resource: &str) -> Option<Quantity> {
        let nanos = self.effective_nanos(resource, |r| &r.limits)?
            + self.spec.overhead.get(resource).map_or(0, Quantity::nanos);
        let first = self
            .spec
            .resources
            .iter()
            .chain(self.spec.containers.iter().chain(&self.spec.init_containers).map(|c| &c.resources));
        let format = first.filter_map(|r| r.limits.get(resource)).map(Quantity::format).next();
        Some(Quantity::from_nanos(nanos, format.unwrap_or(crate::quantity::Format::BinarySi)))
    }

    /// Pod-level resources if set, else containers and sidecars summed and held against the
    /// largest init container; `None` when nothing sets `resource`.
    fn effective_nanos(
        &self,
        resource: &str,
        pick: impl Fn(&Resources) -> &BTreeMap<String, Quantity>,
    ) -> Option<i128> {
        if let Some(q) = self.spec.resources.as_ref().and_then(|r| pick(r).get(resource)) {
            return Some(q.nanos());
        }
        let set = |c: &Container| pick(&c.resources).get(resource).map(Quantity::nanos);
        let any = self.spec.containers.iter().chain(&self.spec.init_containers).any(|c| set(c).is_some());
        let value = |c: &Container| set(c).unwrap_or(0);
        let mut sum: i128 = self.spec.containers.iter().map(value).sum();
        let mut sidecars: i128 = 0;
        let mut init_max: i128 = 0;
        for c in &self.spec.init_containers {
            let r = value(c);
            let effective = if c.restart_policy.as_deref() == Some("Always") {
                sum += r;
                sidecars += r;
                sidecars
            } else {
                r + sidecars
            };
            init_max = init_max.max(effective);
        }
        any.then_some(sum.max(init_max))
    }

    /// Whether the pod sets any limit the kubelet's local-storage evictions enforce: an
    /// emptyDir `sizeLimit`, or an ephemeral-storage limit on the pod or a container.
    pub fn sets_storage_limits(&self) -> bool {
        self.sized_empty_dirs().next().is_some() || self.limit("ephemeral-storage").is_some()
    }

    /// The emptyDir volumes (any medium) with a `sizeLimit`, and that limit.
    pub fn sized_empty_dirs(&self) -> impl Iterator<Item = (&str, Quantity)> {
        self.spec.volumes.iter().filter_map(|v| Some((v.name.as_str(), v.empty_dir.as_ref()?.size_limit?)))
    }

    /// The request of one container (regular or init) by name, as printed in messages.
    pub fn container_request(&self, name: &str, resource: &str) -> Option<Quantity> {
        self.spec
            .containers
            .iter()
            .chain(&self.spec.init_containers)
            .find(|c| c.name == name)
            .map(|c| c.resources.requests.get(resource).copied().unwrap_or(Quantity::from_units(0)))
    }

    /// Volumes whose usage counts against the node's disk: hostPath and local ephemeral
    /// volumes (emptyDir not in memory, configMap, downwardAPI, gitRepo).
    pub fn local_volume_names(&self) -> impl Iterator<Item = &str> {
        self.spec
            .volumes
            .iter()
            .filter(|v| {
                v.host_path.is_some()
                    || v.empty_dir.as_ref().is_some_and(|e| e.medium.as_deref() != Some("Memory"))
                    || v.config_map.is_some()
                    || v.downward_api.is_some()
                    || v.git_repo.is_some()
            })
            .map(|v| v.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn critical_pods() {
        assert!(
            pod(serde_json::json!({"metadata": {"annotations": {"kubernetes.io/config.source": "file"}}}))
                .is_critical()
        );
        assert!(
            !pod(serde_json::json!({"metadata": {"annotations": {"kubernetes.io/config.source": "api"}}}))
                .is_critical()
        );
        assert!(
            pod(serde_json::json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}}))
                .is_critical()
        );
        assert!(pod(serde_json::json!({"spec": {"priority": 2000000000}})).is_critical());
        assert!(!pod(serde_json::json!({"spec": {"priority": 1999999999}})).is_critical());
    }

    #[test]
    fn effective_requests_with_init_containers_sidecars_and_overhead() {
        let p = pod(serde_json::json!({"spec": {
            "containers": [
                {"name": "a", "resources": {"requests": {"memory": "100Mi"}}},
                {"name": "b", "resources": {"requests": {"memory": "50Mi"}}}
            ],
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"memory": "10Mi"}}},
                {"name": "big", "resources": {"requests": {"memory": "300Mi"}}}
            ],
            "overhead": {"memory": "1Mi"}
        }}));
        // max(100+50+10, 300+10) + 1
        assert_eq!(p.request_nanos("memory"), (311i128 << 20) * 1_000_000_000);
        let small_init = pod(serde_json::json!({"spec": {
            "containers": [{"name": "a", "resources": {"requests": {"memory": "100Mi"}}}],
            "initContainers": [{"name": "i", "resources": {"requests": {"memory": "10Mi"}}}]
        }}));
        assert_eq!(small_init.request_nanos("memory"), (100i128 << 20) * 1_000_000_000);
        let pod_level = pod(serde_json::json!({"spec": {
            "resources": {"requests": {"memory": "1Gi"}},
            "containers": [{"name": "a", "resources": {"requests": {"memory": "100Mi"}}}]
        }}));
        assert_eq!(pod_level.request_nanos("memory"), (1i128 << 30) * 1_000_000_000);
        assert_eq!(p.container_request("b", "memory").map(|q| q.to_string()), Some("50Mi".into()));
        assert_eq!(p.container_request("a", "ephemeral-storage").map(|q| q.to_string()), Some("0".into()));
    }

    #[test]
    fn local_volumes() {
        let p = pod(serde_json::json!({"spec": {"volumes": [
            {"name": "host", "hostPath": {"path": "/x"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "tmpfs", "emptyDir": {"medium": "Memory"}},
            {"name": "cfg", "configMap": {"name": "c"}},
            {"name": "pvc", "persistentVolumeClaim": {"claimName": "c"}}
        ]}}));
        assert_eq!(p.local_volume_names().collect::<Vec<_>>(), ["host", "scratch", "cfg"]);
    }

    /// Fields a tenant sets within what the API server accepts never drop the pod's spec
    /// (which would leave evictd guessing at it): a decimal limit too large for an i64 is a
    /// limit nothing reaches; a tiny request with a long fraction is tiny.
    #[test]
    fn a_spec_the_api_server_accepts_reads() {
        let tiny = format!("0.{}1", "0".repeat(40));
        let items: Vec<_> =
            (0..1000).map(|i| serde_json::json!({"key": format!("k{i}"), "path": "p"})).collect();
        let p: Pod = serde_json::from_value(serde_json::json!({"metadata": {"uid": "u"}, "spec": {
            "containers": [{"name": "a", "resources": {
                "requests": {"ephemeral-storage": tiny},
                "limits": {"ephemeral-storage": "1e27", "memory": "99999999999999999999999999999999999999999Ei"}}}],
            "volumes": [
                {"name": "scratch", "emptyDir": {"sizeLimit": "1e27"}},
                {"name": "cfg", "configMap": {"name": "c", "items": items}}
            ]
        }}))
        .expect("a spec the API server accepts");
        assert_eq!(p.limit("ephemeral-storage").map(|q| q.value()), Some(i64::MAX));
        assert_eq!(p.container_request("a", "ephemeral-storage").map(|q| q.nanos()), Some(1));
        let scratch = p.spec.volumes[0].empty_dir.as_ref().and_then(|e| e.size_limit);
        assert_eq!(scratch.map(|q| q.value()), Some(i64::MAX));
        assert_eq!(p.local_volume_names().collect::<Vec<_>>(), ["scratch", "cfg"]);
    }

    /// A pod's own `evictd.io/` annotations count only in a namespace the operator named:
    /// elsewhere a tenant could opt out of eviction or push itself last, and another
    /// tenant's pod would be taken instead.
    #[test]
    fn only_the_operators_namespaces_have_a_say() {
        let tenant = || {
            pod(serde_json::json!({"metadata": {"namespace": "team-a", "annotations": {
                "evictd.io/eviction": "never", "evictd.io/eviction-order": "1000000", "other": "kept"}}}))
        };
        let mut p = tenant();
        let ignored = AnnotationTrust::default().apply(&mut p);
        assert_eq!(ignored, ["evictd.io/eviction", "evictd.io/eviction-order"]);
        assert!(!p.opts_out());
        assert_eq!(p.eviction_order(), 0);
        assert_eq!(p.metadata.annotations.get("other").map(String::as_str), Some("kept"));
        let mut p = tenant();
        assert!(AnnotationTrust::from_list("ops, team-a,").apply(&mut p).is_empty());
        assert!(p.opts_out() && p.eviction_order() == 1_000_000, "the operator named team-a");
    }
}
