//! Pod specs from the API server: a watch on the pods bound to this node (field selector
//! `spec.nodeName=<node>`, the kubelet's own), kept as a map from UID to the spec eviction
//! needs. The watch runs on a task of its own; the inventory reads the latest published map,
//! so a slow or absent API server never holds up a pass.
//!
//! kube-runtime's `watcher` does the list-then-watch, the resource versions, re-lists after
//! a 410, and the back-off; this module only turns its events into snapshots.

use std::{collections::HashMap, sync::Arc};

use evictd_policy::podspec::{Pod, terminal_phase};
use futures::StreamExt as _;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, watcher},
};
use tokio::sync::watch;

use super::metrics::{ApiCall, ApiMetrics, ApiOutcome};
use crate::runtime::inventory::{ApiPod, ApiPods, ApiPodsReceiver};

/// Starts the watch on `node`'s pods; the receiver sees a new map after the first complete
/// list and after every change.
pub fn spawn_pod_watch(client: Client, node: &str, metrics: ApiMetrics) -> ApiPodsReceiver {
    let (tx, rx) = watch::channel(None);
    let api: Api<k8s_openapi::api::core::v1::Pod> = Api::all(client);
    // `any_semantic`: the first list is served from the API server's watch cache
    // (resourceVersion=0), as the kubelet's informer does — one DaemonSet pod per node lists.
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}")).any_semantic();
    let node = node.to_owned();
    tokio::spawn(async move {
        let mut stream = watcher(api, config).default_backoff().boxed();
        let mut mirror = PodMirror::default();
        let mut healthy: Option<bool> = None;
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    let listed = matches!(event, watcher::Event::InitDone);
                    let Some(snapshot) = mirror.apply(event) else { continue };
                    if listed && healthy != Some(true) {
                        tracing::info!(node = %node, pods = snapshot.len(), "pod specs from the Kubernetes API");
                        healthy = Some(true);
                    }
                    if tx.send(Some(snapshot)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    metrics.call(ApiCall::WatchPods, ApiOutcome::Error);
                    if healthy != Some(false) {
                        tracing::warn!(
                            "watching this node's pods in the Kubernetes API: {e}; specs stay as last \
                             seen, retrying with back-off"
                        );
                    }
                    healthy = Some(false);
                }
            }
        }
    });
    rx
}

/// The watcher's events folded into a map; a re-list replaces the map only once complete,
/// so a pass never sees half a list. Its size is the server's count of this node's pods,
/// finished ones included, each finished one a UID and its phase (`ApiPod::Finished`).
#[derive(Default)]
struct PodMirror {
    pods: HashMap<Arc<str>, ApiPod>,
    /// Filled between `Init` and `InitDone`.
    relist: Option<HashMap<Arc<str>, ApiPod>>,
    published: bool,
}

impl PodMirror {
    /// The new snapshot, when the event changed what a pass should see.
    fn apply(&mut self, event: watcher::Event<k8s_openapi::api::core::v1::Pod>) -> Option<ApiPods> {
        use watcher::Event::*;
        match event {
            Init => {
                self.relist = Some(HashMap::new());
                None
            }
            InitApply(p) => {
                if let (Some(relist), Some((uid, pod))) = (self.relist.as_mut(), entry_of(&p)) {
                    relist.insert(uid, pod);
                }
                None
            }
            InitDone => {
                self.pods = self.relist.take().unwrap_or_default();
                self.published = true;
                Some(self.snapshot())
            }
            Apply(p) => {
                let (uid, pod) = entry_of(&p)?;
                // Most updates are to the status (conditions, container states): nothing
                // eviction reads, nothing to publish.
                if self.pods.get(&uid) == Some(&pod) {
                    return None;
                }
                self.pods.insert(uid, pod);
                self.published.then(|| self.snapshot())
            }
            Delete(p) => {
                let uid = p.metadata.uid?;
                self.pods.remove(uid.as_str());
                self.published.then(|| self.snapshot())
            }
        }
    }

    fn snapshot(&self) -> ApiPods {
        Arc::new(self.pods.clone())
    }
}

/// What eviction keeps of an API pod: for an active pod its spec, through the same JSON
/// reading as `--pods-file` (one parser for both sources, so they cannot disagree on what a
/// field means); for a finished one its phase alone. A pod that does not read (never seen
/// from a conforming server) is left out, logged.
fn entry_of(p: &k8s_openapi::api::core::v1::Pod) -> Option<(Arc<str>, ApiPod)> {
    let uid: Arc<str> = p.metadata.uid.as_deref()?.into();
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    if let Some(phase) = terminal_phase(phase) {
        return Some((uid, ApiPod::Finished(phase)));
    }
    match serde_json::to_value(p).and_then(serde_json::from_value::<Pod>) {
        Ok(spec) => Some((uid, ApiPod::Spec(Arc::new(spec)))),
        Err(e) => {
            let name = p.metadata.name.as_deref().unwrap_or("?");
            tracing::warn!(pod = name, uid = %uid, "a pod from the API server does not read as a pod spec: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use watcher::Event;

    use super::*;

    fn api_pod(uid: &str, json: serde_json::Value) -> k8s_openapi::api::core::v1::Pod {
        let mut v = json;
        v["metadata"]["uid"] = uid.into();
        v["metadata"]["name"] = format!("pod-{uid}").into();
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn an_api_pod_reads_as_the_spec_eviction_needs() {
        let p = api_pod(
            "u1",
            serde_json::json!({
                "metadata": {"namespace": "web", "annotations": {"evictd.io/eviction-order": "3"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
                        "uid": "d", "controller": true}]},
                "spec": {"priority": 100, "terminationGracePeriodSeconds": 20,
                    "overhead": {"memory": "1Mi"},
                    "containers": [{"name": "a", "resources": {"requests": {"memory": "100Mi"}}}],
                    "initContainers": [{"name": "side", "restartPolicy": "Always",
                        "resources": {"requests": {"memory": "10Mi"}}}]},
                "status": {"phase": "Running"}
            }),
        );
        let (uid, ApiPod::Spec(spec)) = entry_of(&p).unwrap() else { panic!("an active pod keeps its spec") };
        assert_eq!(&*uid, "u1");
        assert_eq!(spec.priority(), 100);
        assert_eq!(spec.spec.termination_grace_period_seconds, Some(20));
        assert_eq!(spec.request_nanos("memory"), (111i128 << 20) * 1_000_000_000);
        assert!(spec.is_daemonset_pod());
        assert_eq!(spec.eviction_order(), 3);
        assert!(spec.is_active());
    }

    #[test]
    fn a_relist_is_published_only_when_complete() {
        let mut m = PodMirror::default();
        assert!(m.apply(Event::Init).is_none());
        assert!(m.apply(Event::InitApply(api_pod("a", serde_json::json!({})))).is_none());
        // Before the first complete list, single changes are not published either.
        assert!(m.apply(Event::Apply(api_pod("x", serde_json::json!({})))).is_none());
        assert!(m.apply(Event::InitApply(api_pod("b", serde_json::json!({})))).is_none());
        let s = m.apply(Event::InitDone).unwrap();
        let mut uids: Vec<&str> = s.keys().map(|k| &**k).collect();
        uids.sort();
        assert_eq!(uids, ["a", "b"], "the relist replaces what came before it");
        let s = m.apply(Event::Apply(api_pod("c", serde_json::json!({})))).unwrap();
        assert_eq!(s.len(), 3);
        let ready = serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert!(m.apply(Event::Apply(api_pod("c", ready))).is_none(), "a status update eviction ignores");
        let failed = serde_json::json!({"status": {"phase": "Failed"}});
        assert!(m.apply(Event::Apply(api_pod("c", failed))).is_some(), "the phase it does not");
        let s = m.apply(Event::Delete(api_pod("a", serde_json::json!({})))).unwrap();
        assert!(!s.contains_key("a"));
        // A relist after a broken watch: the old map stays visible until it completes.
        assert!(m.apply(Event::Init).is_none());
        assert!(m.apply(Event::InitApply(api_pod("d", serde_json::json!({})))).is_none());
        let s = m.apply(Event::InitDone).unwrap();
        assert_eq!(s.keys().map(|k| &**k).collect::<Vec<_>>(), ["d"]);
    }

    /// Evicted pods stay in the API server until their controller or the pod GC deletes
    /// them; a node that has evicted thousands must not hold thousands of specs.
    #[test]
    fn a_finished_pod_is_kept_as_its_phase_alone() {
        let mut m = PodMirror::default();
        m.apply(Event::Init);
        m.apply(Event::InitDone);
        let spec = serde_json::json!({
            "metadata": {"namespace": "web", "annotations": {"a": "b"}},
            "spec": {"priority": 100, "containers": [{"name": "a"}]},
            "status": {"phase": "Running"}
        });
        let s = m.apply(Event::Apply(api_pod("u", spec.clone()))).unwrap();
        assert!(matches!(s.get("u"), Some(ApiPod::Spec(p)) if p.priority() == 100));
        for phase in ["Failed", "Succeeded"] {
            let mut done = spec.clone();
            done["status"]["phase"] = phase.into();
            let s = m.apply(Event::Apply(api_pod("u", done))).unwrap();
            assert_eq!(s.get("u"), Some(&ApiPod::Finished(phase)));
        }
        let mut pending = spec;
        pending["status"]["phase"] = "Pending".into();
        let s = m.apply(Event::Apply(api_pod("u", pending))).unwrap();
        assert!(matches!(s.get("u"), Some(ApiPod::Spec(_))), "any other phase is active");
    }

    /// A snapshot is published on every change the passes see; on a node of 250 pods it
    /// must not copy 250 specs each time.
    #[test]
    fn snapshots_share_the_specs() {
        let mut m = PodMirror::default();
        m.apply(Event::Init);
        m.apply(Event::InitApply(api_pod("a", serde_json::json!({}))));
        let first = m.apply(Event::InitDone).unwrap();
        let second = m.apply(Event::Apply(api_pod("b", serde_json::json!({})))).unwrap();
        let (Some(ApiPod::Spec(x)), Some(ApiPod::Spec(y))) = (first.get("a"), second.get("a")) else {
            panic!("both snapshots hold a's spec")
        };
        assert!(Arc::ptr_eq(x, y));
        let (kx, _) = first.get_key_value("a").unwrap();
        let (ky, _) = second.get_key_value("a").unwrap();
        assert!(Arc::ptr_eq(kx, ky));
    }
}
