//! Pod specs from the API server: a watch on the pods bound to this node (field selector
//! `spec.nodeName=<node>`, the kubelet's own), kept as a map from UID to what eviction needs
//! of each pod (`ApiPod`). The watch runs on a task of its own; the inventory reads the
//! latest published map, so a slow or absent API server never holds up a pass.
//!
//! kube-runtime's `watcher` does the list-then-watch, the resource versions, re-lists after
//! a 410, and the back-off; this module only turns its events into snapshots.

use std::{collections::HashMap, sync::Arc};

use evictd_policy::podspec::{Pod, annotations_read, terminal_phase};
use futures::{FutureExt as _, StreamExt as _};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, watcher},
};
use tokio::sync::watch;

use super::metrics::{ApiCall, ApiMetrics, ApiOutcome};
use crate::runtime::inventory::{ApiPod, ApiPods, ApiPodsReceiver};

type ApiPodObject = k8s_openapi::api::core::v1::Pod;
type WatchEvent = Result<watcher::Event<ApiPodObject>, watcher::Error>;

/// Starts the watch on `node`'s pods; the receiver sees a new map after the first complete
/// list and after each burst of events that changed it.
pub fn spawn_pod_watch(client: Client, node: &str, metrics: ApiMetrics) -> ApiPodsReceiver {
    let (tx, rx) = watch::channel(None);
    let api: Api<ApiPodObject> = Api::all(client);
    // `any_semantic`: the first list is served from the API server's watch cache
    // (resourceVersion=0), as the kubelet's informer does — one DaemonSet pod per node lists.
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}")).any_semantic();
    let mut watch = PodWatch { node: node.to_owned(), metrics, mirror: PodMirror::default(), healthy: None };
    tokio::spawn(async move {
        let events = watcher(api, config).default_backoff();
        follow(events, &mut watch, |snapshot| tx.send(Some(snapshot)).is_ok()).await;
    });
    rx
}

/// Folds `events` into the mirror, and publishes a snapshot after each burst that changed
/// it, until the events end or `publish` says nobody reads them. The events already waiting
/// (a burst of the pod GC's deletes, a roll-out) make one snapshot: each copies the map, so
/// one for each would cost the square of the burst.
async fn follow(
    events: impl futures::Stream<Item = WatchEvent>,
    watch: &mut PodWatch,
    mut publish: impl FnMut(ApiPods) -> bool,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let mut changed = watch.take(event);
        let ended = loop {
            match events.next().now_or_never() {
                Some(Some(event)) => changed |= watch.take(event),
                Some(None) => break true,
                None => break false,
            }
        };
        if (changed && !publish(watch.mirror.snapshot())) || ended {
            return;
        }
    }
}

/// The watch task's state: the mirror, and whether the watch last worked (said once each
/// time it changes).
struct PodWatch {
    node: String,
    metrics: ApiMetrics,
    mirror: PodMirror,
    healthy: Option<bool>,
}

impl PodWatch {
    /// Whether `event` changed what a pass should see.
    fn take(&mut self, event: WatchEvent) -> bool {
        match event {
            Ok(event) => {
                let first_list = matches!(event, watcher::Event::InitDone) && !self.mirror.published;
                // The watcher sends `Init` before each attempt to list, answered or not: only
                // a complete list or a watched change says the server answers. The watch
                // resumes after an error without a re-list when the server still has its
                // resource version; then a change is the first sign.
                let answered = !matches!(event, watcher::Event::Init | watcher::Event::InitApply(_));
                let changed = self.mirror.apply(event);
                if answered && self.healthy != Some(true) {
                    if first_list {
                        let pods = self.mirror.pods.len();
                        tracing::info!(node = %self.node, pods, "pod specs from the Kubernetes API");
                    } else {
                        tracing::info!(node = %self.node, "watching this node's pods in the Kubernetes API again");
                    }
                    self.healthy = Some(true);
                }
                changed
            }
            Err(e) => {
                self.metrics.call(ApiCall::WatchPods, ApiOutcome::Error);
                if self.healthy != Some(false) {
                    tracing::warn!(
                        "watching this node's pods in the Kubernetes API: {e}; specs stay as last seen, \
                         retrying with back-off"
                    );
                }
                self.healthy = Some(false);
                false
            }
        }
    }
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
    /// Whether the event changed what a pass should see (nothing is published before the
    /// first complete list).
    fn apply(&mut self, event: watcher::Event<k8s_openapi::api::core::v1::Pod>) -> bool {
        use watcher::Event::*;
        match event {
            Init => {
                self.relist = Some(HashMap::new());
                false
            }
            InitApply(p) => {
                if let (Some(relist), Some((uid, pod))) = (self.relist.as_mut(), entry_of(&p)) {
                    relist.insert(uid, pod);
                }
                false
            }
            InitDone => {
                self.pods = self.relist.take().unwrap_or_default();
                self.published = true;
                true
            }
            Apply(p) => {
                let Some((uid, pod)) = entry_of(&p) else { return false };
                // Most updates are to the status (conditions, container states): nothing
                // eviction reads, nothing to publish.
                if self.pods.get(&uid) == Some(&pod) {
                    return false;
                }
                self.pods.insert(uid, pod);
                self.published
            }
            Delete(p) => {
                let Some(uid) = p.metadata.uid else { return false };
                if self.pods.remove(uid.as_str()).is_none() {
                    return false;
                }
                // A table never shrinks by itself: after the pod GC's purge of thousands of
                // finished pods it, and each snapshot's copy, would keep their size until
                // the next re-list, days later.
                if self.pods.capacity() > 4 * self.pods.len() + 64 {
                    self.pods.shrink_to_fit();
                }
                self.published
            }
        }
    }

    fn snapshot(&self) -> ApiPods {
        Arc::new(self.pods.clone())
    }
}

/// What eviction keeps of an API pod: for an active pod its spec, through the same JSON
/// reading as `--pods-file` (one parser for both sources, so they cannot disagree on what a
/// field means), with only the annotations eviction reads; for a finished one its phase
/// alone. A pod that does not read (never seen
/// from a conforming server) is left out, logged.
fn entry_of(p: &ApiPodObject) -> Option<(Arc<str>, ApiPod)> {
    let uid: Arc<str> = p.metadata.uid.as_deref()?.into();
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    if let Some(phase) = terminal_phase(phase) {
        return Some((uid, ApiPod::Finished(phase)));
    }
    match eviction_view(p, phase).and_then(serde_json::from_value::<Pod>) {
        Ok(spec) => Some((uid, ApiPod::Spec(Arc::new(spec)))),
        Err(e) => {
            let name = p.metadata.name.as_deref().unwrap_or("?");
            tracing::warn!(pod = name, uid = %uid, "a pod from the API server does not read as a pod spec: {e}");
            None
        }
    }
}

/// The part of an API pod `Pod` reads: its identity, owners and the annotations eviction
/// reads, the spec and the phase. The kubelet's status (every container's state and
/// conditions, rewritten all day) and the other annotations (a `last-applied-configuration`
/// of up to 256 KiB) are never copied.
fn eviction_view(p: &ApiPodObject, phase: Option<&str>) -> serde_json::Result<serde_json::Value> {
    let m = &p.metadata;
    let metadata = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        annotations: Some(annotations_read(m.annotations.iter().flatten())),
        owner_references: m.owner_references.clone(),
        ..Default::default()
    };
    let mut view = serde_json::Map::new();
    view.insert("metadata".into(), serde_json::to_value(&metadata)?);
    if let Some(spec) = &p.spec {
        view.insert("spec".into(), serde_json::to_value(spec)?);
    }
    view.insert("status".into(), serde_json::json!({ "phase": phase }));
    Ok(view.into())
}

#[cfg(test)]
mod tests {
    use watcher::Event;

    use super::*;

    /// The snapshot a change publishes.
    fn step(m: &mut PodMirror, event: Event<k8s_openapi::api::core::v1::Pod>) -> Option<ApiPods> {
        m.apply(event).then(|| m.snapshot())
    }

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
                "metadata": {"namespace": "web", "labels": {"app": "web"},
                    "annotations": {"evictd.io/eviction-order": "3",
                        "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(200_000)},
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
        let kept: Vec<&String> = spec.metadata.annotations.keys().collect();
        assert_eq!(kept, ["evictd.io/eviction-order"], "a tenant's 200 kB annotation is not kept");
    }

    #[test]
    fn a_relist_is_published_only_when_complete() {
        let mut m = PodMirror::default();
        assert!(step(&mut m, Event::Init).is_none());
        assert!(step(&mut m, Event::InitApply(api_pod("a", serde_json::json!({})))).is_none());
        // Before the first complete list, single changes are not published either.
        assert!(step(&mut m, Event::Apply(api_pod("x", serde_json::json!({})))).is_none());
        assert!(step(&mut m, Event::InitApply(api_pod("b", serde_json::json!({})))).is_none());
        let s = step(&mut m, Event::InitDone).unwrap();
        let mut uids: Vec<&str> = s.keys().map(|k| &**k).collect();
        uids.sort();
        assert_eq!(uids, ["a", "b"], "the relist replaces what came before it");
        let s = step(&mut m, Event::Apply(api_pod("c", serde_json::json!({})))).unwrap();
        assert_eq!(s.len(), 3);
        let ready = serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert!(
            step(&mut m, Event::Apply(api_pod("c", ready))).is_none(),
            "a status update eviction ignores"
        );
        let failed = serde_json::json!({"status": {"phase": "Failed"}});
        assert!(step(&mut m, Event::Apply(api_pod("c", failed))).is_some(), "the phase it does not");
        let s = step(&mut m, Event::Delete(api_pod("a", serde_json::json!({})))).unwrap();
        assert!(!s.contains_key("a"));
        // A relist after a broken watch: the old map stays visible until it completes.
        assert!(step(&mut m, Event::Init).is_none());
        assert!(step(&mut m, Event::InitApply(api_pod("d", serde_json::json!({})))).is_none());
        let s = step(&mut m, Event::InitDone).unwrap();
        assert_eq!(s.keys().map(|k| &**k).collect::<Vec<_>>(), ["d"]);
    }

    /// Evicted pods stay in the API server until their controller or the pod GC deletes
    /// them; a node that has evicted thousands must not hold thousands of specs.
    #[test]
    fn a_finished_pod_is_kept_as_its_phase_alone() {
        let mut m = PodMirror::default();
        step(&mut m, Event::Init);
        step(&mut m, Event::InitDone);
        let spec = serde_json::json!({
            "metadata": {"namespace": "web", "annotations": {"a": "b"}},
            "spec": {"priority": 100, "containers": [{"name": "a"}]},
            "status": {"phase": "Running"}
        });
        let s = step(&mut m, Event::Apply(api_pod("u", spec.clone()))).unwrap();
        assert!(matches!(s.get("u"), Some(ApiPod::Spec(p)) if p.priority() == 100));
        for phase in ["Failed", "Succeeded"] {
            let mut done = spec.clone();
            done["status"]["phase"] = phase.into();
            let s = step(&mut m, Event::Apply(api_pod("u", done))).unwrap();
            assert_eq!(s.get("u"), Some(&ApiPod::Finished(phase)));
        }
        let mut pending = spec;
        pending["status"]["phase"] = "Pending".into();
        let s = step(&mut m, Event::Apply(api_pod("u", pending))).unwrap();
        assert!(matches!(s.get("u"), Some(ApiPod::Spec(_))), "any other phase is active");
    }

    /// Updates to a finished pod (the kubelet's last status writes, a controller's
    /// finalizer) change nothing eviction reads.
    #[test]
    fn a_finished_pods_later_updates_are_not_published() {
        let mut m = PodMirror::default();
        step(&mut m, Event::Init);
        step(&mut m, Event::InitDone);
        let failed = serde_json::json!({"status": {"phase": "Failed", "reason": "Evicted"}});
        assert!(step(&mut m, Event::Apply(api_pod("u", failed))).is_some());
        let later = serde_json::json!({"metadata": {"finalizers": ["x"]},
            "status": {"phase": "Failed", "reason": "Evicted", "message": "later"}});
        assert!(step(&mut m, Event::Apply(api_pod("u", later))).is_none());
    }

    /// After the pod GC deletes thousands of finished pods, the map (and each snapshot,
    /// which copies its table) is the size of what is left, not of what was.
    #[test]
    fn the_map_shrinks_after_a_purge() {
        let mut m = PodMirror::default();
        step(&mut m, Event::Init);
        let failed = serde_json::json!({"status": {"phase": "Failed"}});
        for n in 0..5000 {
            step(&mut m, Event::InitApply(api_pod(&format!("u{n}"), failed.clone())));
        }
        step(&mut m, Event::InitDone);
        assert!(m.pods.capacity() >= 5000);
        for n in 1..5000 {
            step(&mut m, Event::Delete(api_pod(&format!("u{n}"), failed.clone())));
        }
        assert_eq!(m.pods.len(), 1);
        assert!(m.pods.capacity() <= 4 + 64, "capacity {} for one pod", m.pods.capacity());
        assert!(m.snapshot().capacity() <= 4 + 64);
    }

    fn watch_state() -> PodWatch {
        PodWatch {
            node: "node-a".into(),
            metrics: crate::report::metrics::Metrics::default().api,
            mirror: PodMirror::default(),
            healthy: None,
        }
    }

    /// While the server cannot be reached, the watcher sends `Init` before each attempt to
    /// list: that is not the server answering, and the first complete list, whenever it
    /// comes, is the one that says how many pods evictd knows.
    #[test]
    fn the_watch_is_back_only_when_the_server_answers() {
        let mut w = watch_state();
        let refused = || Err(watcher::Error::NoResourceVersion);
        for event in [Ok(Event::Init), refused(), Ok(Event::Init), refused(), Ok(Event::Init)] {
            w.take(event);
        }
        assert_eq!(w.healthy, Some(false), "an Init is no answer");
        w.take(Ok(Event::InitApply(api_pod("a", serde_json::json!({})))));
        assert_eq!(w.healthy, Some(false), "nor is half a list");
        assert!(w.take(Ok(Event::InitDone)));
        assert_eq!(w.healthy, Some(true));
        assert!(!w.take(Ok(Event::Delete(api_pod("gone", serde_json::json!({}))))), "not listed: no change");
    }

    /// The events that are already there when one arrives (a re-list, the pod GC deleting
    /// a thousand finished pods at once) make one snapshot; a later event makes its own.
    #[tokio::test]
    async fn a_burst_of_events_is_one_snapshot() {
        let failed = serde_json::json!({"status": {"phase": "Failed"}});
        let mut burst: Vec<WatchEvent> = vec![Ok(Event::Init)];
        burst.extend((0..1000).map(|n| Ok(Event::InitApply(api_pod(&format!("u{n}"), failed.clone())))));
        burst.push(Ok(Event::InitDone));
        burst.extend((1..1000).map(|n| Ok(Event::Delete(api_pod(&format!("u{n}"), failed.clone())))));
        let later = futures::stream::once(async {
            // Not ready at once: the burst before it ends.
            tokio::task::yield_now().await;
            Ok(Event::Apply(api_pod("v", serde_json::json!({}))))
        });
        let events = futures::stream::iter(burst).chain(later);
        let mut published = Vec::new();
        follow(events, &mut watch_state(), |s| {
            published.push(s.len());
            true
        })
        .await;
        assert_eq!(published, [1, 2], "one snapshot for the burst, one for the later pod");
    }

    /// A snapshot is published on every change the passes see; on a node of 250 pods it
    /// must not copy 250 specs each time.
    #[test]
    fn snapshots_share_the_specs() {
        let mut m = PodMirror::default();
        step(&mut m, Event::Init);
        step(&mut m, Event::InitApply(api_pod("a", serde_json::json!({}))));
        let first = step(&mut m, Event::InitDone).unwrap();
        let second = step(&mut m, Event::Apply(api_pod("b", serde_json::json!({})))).unwrap();
        let (Some(ApiPod::Spec(x)), Some(ApiPod::Spec(y))) = (first.get("a"), second.get("a")) else {
            panic!("both snapshots hold a's spec")
        };
        assert!(Arc::ptr_eq(x, y));
        let (kx, _) = first.get_key_value("a").unwrap();
        let (ky, _) = second.get_key_value("a").unwrap();
        assert!(Arc::ptr_eq(kx, ky));
    }
}
