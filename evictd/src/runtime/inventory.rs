//! The pods on this node, as the container runtime knows them, with their cgroups and
//! specs. Refreshed off the pressure path: a refresh asks the CRI only about sandboxes and
//! containers it has not seen yet, so when pressure wakes the daemon, ranking reads the
//! cached inventory and a few cgroup files, never a full CRI listing.
//!
//! Specs come from the API server's watch on this node's pods (`cluster::pods`), else from
//! a PodList file (`--pods-file`, re-read when it changes), else are inferred from what the
//! node shows (`infer`).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use evictd_policy::podspec::{AnnotationTrust, Pod};
use tokio::sync::{Notify, watch};

use super::infer::{infer_spec, with_trusted_annotations};
use crate::{
    runtime::cri::{CriClient, CriError, api as cri, lists},
    vocab::SpecSource,
};

/// The pods bound to this node, by UID, as the API server last listed and watched them
/// (`cluster::pods` keeps it current). Snapshots share their keys and specs with the map
/// they were taken from: publishing one costs a pointer per pod, not a copy of every spec.
pub type ApiPods = Arc<HashMap<Arc<str>, ApiPod>>;

/// One pod the API server holds for this node.
#[derive(Clone, Debug, PartialEq)]
pub enum ApiPod {
    /// Still active: the spec eviction ranks it by.
    Spec(Arc<Pod>),
    /// Finished (`Succeeded` or `Failed`): never ranked again, even while its sandbox still
    /// runs, so its spec is not kept. The server keeps evicted pods until their controller or
    /// the pod GC deletes them, and a node that runs jobs can hold thousands of finished pods
    /// for each one that runs; kept whole, they would grow evictd with every eviction.
    Finished(&'static str),
}

impl ApiPod {
    /// The spec of an active pod.
    pub fn spec(&self) -> Option<&Pod> {
        match self {
            ApiPod::Spec(spec) => Some(spec),
            ApiPod::Finished(_) => None,
        }
    }
}

/// The latest snapshot, `None` until the first list has completed.
pub type ApiPodsReceiver = watch::Receiver<Option<ApiPods>>;

/// How long the log waits for the API server's first list before it names the pods whose
/// specs are inferred: a list still on its way is not a reason to call them so.
const API_LIST_GRACE: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq)]
pub struct ContainerRecord {
    pub id: String,
    pub name: String,
    pub running: bool,
    /// The kubelet's restart count for this container name: a higher attempt replaces a
    /// lower one.
    pub attempt: u32,
    pub memory_limit: Option<i64>,
    pub oom_score_adj: Option<i64>,
    pub grace_seconds: Option<i64>,
    /// Writable layer bytes/inodes, from the runtime's last stats (`None`: not reported, which
    /// ranking counts as nothing, as the kubelet's summary does).
    pub rootfs: Option<(u64, u64)>,
    /// Listed before the runtime's stats call that follows the list has ended: a disk
    /// decision waits for that call (`layers_unmeasured`) rather than rank the container's
    /// layer as empty.
    pub layer_pending: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PodRecord {
    pub sandbox_id: String,
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub annotations: BTreeMap<String, String>,
    /// The pod cgroup as given to the runtime (cgroupfs path or systemd slice).
    pub cgroup_parent: Option<String>,
    pub log_directory: Option<String>,
    /// The image the sandbox (pause) container runs.
    pub sandbox_image: Option<String>,
    pub containers: Vec<ContainerRecord>,
    pub spec: Pod,
    pub spec_source: SpecSource,
    /// evictd annotations of the pod that do not count: its namespace is not one the
    /// operator named (`--annotation-namespaces`).
    pub ignored_annotations: Vec<String>,
}

impl PodRecord {
    pub fn spec_inferred(&self) -> bool {
        self.spec_source == SpecSource::Inferred
    }
}

/// The pods as the inventory publishes them. Each record is shared with the inventory's own
/// and with the lists sent before, and replaced only when it changes: a list costs a pointer
/// a pod, not a copy of every pod (the records are most of what evictd keeps per pod, and
/// the thread that makes them keeps its peak heap, locked).
pub type PodList = Arc<Vec<Arc<PodRecord>>>;

/// Whether two pod lists name the same pods with the same containers, i.e. the same cgroups:
/// a list that differs only in specs, states or disk usage needs no cgroup opened or walked.
pub fn same_cgroups(a: &[Arc<PodRecord>], b: &[Arc<PodRecord>]) -> bool {
    fn containers(p: &PodRecord) -> impl Iterator<Item = &String> {
        p.containers.iter().map(|c| &c.id)
    }
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.sandbox_id == y.sandbox_id
                && x.cgroup_parent == y.cgroup_parent
                && containers(x).eq(containers(y))
        })
}

pub struct Inventory {
    pods: BTreeMap<String, Arc<PodRecord>>,
    pods_file: Option<(PathBuf, Option<SystemTime>)>,
    specs: HashMap<String, Pod>,
    /// The API server's pods, when evictd has an API: the receiver, and the last snapshot.
    api: Option<(ApiPodsReceiver, Option<ApiPods>)>,
    /// Node memory capacity, to turn oom_score_adj back into a request.
    capacity: i64,
    /// Pods already named in the log as having inferred specs.
    named_inferred: BTreeSet<String>,
    /// Whose evictd annotations count, and the pods already named for ones that do not.
    trust: AnnotationTrust,
    named_untrusted: BTreeSet<String>,
    started: Instant,
    /// Set on SIGHUP: read the pods file at the next refresh even if it looks unchanged.
    reread: Arc<AtomicBool>,
    /// Whether the runtime's last stats call failed (said once when it starts and ends).
    stats_failing: bool,
}

impl Inventory {
    pub fn new(pods_file: Option<PathBuf>, node_capacity: i64) -> Self {
        Inventory {
            pods: BTreeMap::new(),
            pods_file: pods_file.map(|p| (p, None)),
            specs: HashMap::new(),
            api: None,
            capacity: node_capacity,
            named_inferred: BTreeSet::new(),
            trust: AnnotationTrust::default(),
            named_untrusted: BTreeSet::new(),
            started: Instant::now(),
            reread: Arc::default(),
            stats_failing: false,
        }
    }

    /// The pods file is read again, changed or not, at the refresh after `flag` is set.
    pub fn reread_on(mut self, flag: Arc<AtomicBool>) -> Self {
        self.reread = flag;
        self
    }

    /// The namespaces whose pods' evictd annotations count (default: none).
    pub fn with_annotation_trust(mut self, trust: AnnotationTrust) -> Self {
        self.trust = trust;
        self
    }

    /// Specs from the API server's watch, ahead of the pods file.
    pub fn with_api(mut self, pods: ApiPodsReceiver) -> Self {
        self.api = Some((pods, None));
        self
    }

    pub fn pods(&self) -> impl Iterator<Item = &Arc<PodRecord>> {
        self.pods.values()
    }

    /// Re-reads the pods file when it changed, and takes the API server's latest snapshot. A
    /// pods file that cannot be read or parsed keeps the previous specs and is reported: a
    /// half-written file must not erase what is known.
    fn refresh_specs(&mut self) -> Result<(), SpecsError> {
        let file = self.reread_pods_file();
        self.take_api_snapshot();
        file
    }

    fn take_api_snapshot(&mut self) {
        if let Some((rx, latest)) = self.api.as_mut() {
            *latest = rx.borrow_and_update().clone();
        }
    }

    /// Every pod with its best spec (a record is copied only when its spec changes); the pods
    /// whose specs are inferred named once.
    fn give_best_specs(&mut self) {
        let mut pods = std::mem::take(&mut self.pods);
        for rec in pods.values_mut() {
            let (spec, source, ignored) = self.best_spec(rec);
            if spec != rec.spec || source != rec.spec_source || ignored != rec.ignored_annotations {
                let rec = Arc::make_mut(rec);
                (rec.spec, rec.spec_source, rec.ignored_annotations) = (spec, source, ignored);
            }
        }
        self.pods = pods;
        self.name_inferred();
        self.name_ignored_annotations();
    }

    /// Names, once each, the pods whose evictd annotations are ignored; forgets pods gone
    /// from the node, so the list stays the size of the node.
    fn name_ignored_annotations(&mut self) {
        let live: BTreeSet<&String> = self.pods.values().map(|r| &r.uid).collect();
        self.named_untrusted.retain(|uid| live.contains(uid));
        for r in self.pods.values().filter(|r| !r.ignored_annotations.is_empty()) {
            if self.named_untrusted.insert(r.uid.clone()) {
                tracing::warn!(
                    pod = %format!("{}/{}", r.namespace, r.name),
                    annotations = %r.ignored_annotations.join(", "),
                    "ignored: evictd honours its annotations only in the namespaces --annotation-namespaces \
                     names (PriorityClass is the Kubernetes way to order pods)"
                );
            }
        }
    }

    fn reread_pods_file(&mut self) -> Result<(), SpecsError> {
        let forced = self.reread.swap(false, Ordering::Relaxed);
        let Some((path, seen)) = &self.pods_file else { return Ok(()) };
        let mtime = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .map_err(|error| SpecsError::Stat { path: path.display().to_string(), error })?;
        if *seen == Some(mtime) && !forced {
            return Ok(());
        }
        // Seen, good or bad: a broken file is reported once, not on every refresh, and
        // read again when it changes.
        let path = path.clone();
        self.pods_file = Some((path.clone(), Some(mtime)));
        let pods = evictd_policy::podspec::read_pod_list(&path)?;
        self.specs = pods.into_iter().map(|p| (p.metadata.uid.clone(), p)).collect();
        Ok(())
    }

    /// The best spec known for `rec`: the API server's, the pods file's, or one inferred from
    /// the node (re-inferred each time: containers come and go); with the evictd annotations
    /// it ignores.
    fn best_spec(&self, rec: &PodRecord) -> (Pod, SpecSource, Vec<String>) {
        let api =
            self.api.as_ref().and_then(|(_, latest)| latest.as_ref()).and_then(|m| m.get(rec.uid.as_str()));
        let known = match (api, self.specs.get(&rec.uid)) {
            (Some(ApiPod::Spec(spec)), _) => Some((Pod::clone(spec), SpecSource::Api)),
            (Some(&ApiPod::Finished(phase)), _) => {
                Some((Pod::finished(&rec.name, &rec.namespace, &rec.uid, phase), SpecSource::Api))
            }
            (None, Some(spec)) => Some((spec.clone(), SpecSource::PodsFile)),
            (None, None) => None,
        };
        let (mut spec, source) = match known {
            Some((spec, source)) => (with_trusted_annotations(spec, &rec.annotations), source),
            None => (infer_spec(rec, self.capacity), SpecSource::Inferred),
        };
        let ignored = self.trust.apply(&mut spec);
        (spec, source, ignored)
    }

    /// Names, once each, the pods whose specs are inferred — after the API server's first
    /// list, or once it has had `API_LIST_GRACE` to send one.
    fn name_inferred(&mut self) {
        let api_pending = self.api.as_ref().is_some_and(|(_, latest)| latest.is_none())
            && self.started.elapsed() < API_LIST_GRACE;
        if api_pending {
            return;
        }
        let new: Vec<String> = self
            .pods
            .values()
            .filter(|r| r.spec_inferred() && !self.named_inferred.contains(&r.uid))
            .map(|r| format!("{}/{}", r.namespace, r.name))
            .collect();
        if new.is_empty() {
            return;
        }
        // Only the node's pods: the list stays the size of the node however many come and go.
        let live: BTreeSet<&String> = self.pods.values().map(|r| &r.uid).collect();
        self.named_inferred.retain(|uid| live.contains(uid));
        self.named_inferred.extend(self.pods.values().filter(|r| r.spec_inferred()).map(|r| r.uid.clone()));
        let from = match (&self.api, &self.pods_file) {
            (Some(_), _) => "not in the API server's list",
            (None, Some(_)) => "not in the pods file",
            (None, None) => "no API server and no pods file",
        };
        tracing::info!(
            pods = %new.join(", "),
            "pod specs inferred from the node ({from}): priority 0 unless node-critical, requests from limits and oom_score_adj"
        );
    }

    /// A new snapshot from the API server (never, without an API).
    async fn api_changed(&mut self) {
        let Some((rx, _)) = self.api.as_mut() else { return std::future::pending().await };
        if rx.changed().await.is_err() {
            // The watch task ended (only at shutdown): nothing more will come.
            std::future::pending::<()>().await;
        }
    }

    /// A new snapshot from the API server: specs only, no runtime call.
    pub fn apply_api_specs(&mut self) {
        self.take_api_snapshot();
        self.give_best_specs();
    }

    /// Brings the inventory up to date with the runtime: new sandboxes and containers are
    /// looked at once, gone ones dropped. Returns the errors of the pods file, if any, as a
    /// warning (the CRI's errors are returned as errors).
    pub async fn refresh(&mut self, client: &CriClient) -> Result<Option<String>, CriError> {
        let spec_warning = self.refresh_specs().err().map(|e| e.to_string());
        let sandboxes = client.inventory_sandboxes().await?;
        let containers = client.inventory_containers().await?;
        let ready: Vec<&lists::Sandbox> =
            sandboxes.iter().filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32).collect();
        self.pods.retain(|id, _| ready.iter().any(|s| &s.id == id));
        for sb in ready {
            if !self.pods.contains_key(&sb.id) {
                // One sandbox the runtime cannot describe must not hide all the others.
                match self.describe_sandbox(client, sb).await {
                    Ok(rec) => {
                        self.pods.insert(sb.id.clone(), Arc::new(rec));
                    }
                    Err(e) => {
                        skip_object(e, "sandbox", &sb.id)?;
                        continue;
                    }
                }
            }
            let Some(rec) = self.pods.get_mut(&sb.id) else { continue };
            let mine: Vec<&lists::Container> =
                containers.iter().filter(|c| c.pod_sandbox_id == sb.id).collect();
            refresh_containers(client, rec, &mine).await?;
        }
        self.give_best_specs();
        Ok(spec_warning)
    }

    /// Writable-layer usage for disk ranking: one call for all containers — the slowest of
    /// the refresh on a full node, so it comes after the pod list is published.
    pub async fn refresh_writable_layers(&mut self, client: &CriClient) {
        let stats = client.writable_layers().await;
        // Ended, answered or not: a disk decision waits no longer.
        for rec in self.pods.values_mut().filter(|rec| rec.containers.iter().any(|c| c.layer_pending)) {
            for c in &mut Arc::make_mut(rec).containers {
                c.layer_pending = false;
            }
        }
        let stats = match stats {
            Ok(stats) => {
                if std::mem::take(&mut self.stats_failing) {
                    tracing::info!("the runtime's container stats answer again");
                }
                stats
            }
            Err(e) => {
                if !std::mem::replace(&mut self.stats_failing, true) {
                    tracing::warn!(
                        "{e}: writable layers stay as last reported (a new container's counts as \
                         empty in disk ranking)"
                    );
                }
                return;
            }
        };
        let layers: HashMap<&str, (u64, u64)> = stats
            .iter()
            .filter_map(|s| {
                let id = &s.attributes.as_ref()?.id;
                // Reported without a writable layer: nothing to count, as the kubelet's
                // summary counts such a container.
                let layer = s.writable_layer.as_ref().map_or((0, 0), |layer| {
                    (
                        layer.used_bytes.as_ref().map_or(0, |v| v.value),
                        layer.inodes_used.as_ref().map_or(0, |v| v.value),
                    )
                });
                Some((id.as_str(), layer))
            })
            .collect();
        let reported = |c: &ContainerRecord| layers.get(c.id.as_str()).copied();
        for rec in self.pods.values_mut() {
            // A layer not reported this time stays as last reported.
            if rec.containers.iter().any(|c| reported(c).is_some_and(|l| c.rootfs != Some(l))) {
                for c in &mut Arc::make_mut(rec).containers {
                    c.rootfs = reported(c).or(c.rootfs);
                }
            }
        }
    }

    async fn describe_sandbox(&self, client: &CriClient, sb: &lists::Sandbox) -> Result<PodRecord, CriError> {
        let meta = sb.metadata.clone().unwrap_or_default();
        // A sandbox gone since the list is an error the refresh skips quietly, and a status
        // without its annotations one it skips with a warning: a record made without them
        // would lack those that make a static or mirror pod critical.
        let status = client.pod_sandbox_status(&sb.id).await?;
        let Some(st) = status.status else {
            return Err(client.malformed("PodSandboxStatus", "the answer has no status"));
        };
        let info = status.info.get("info").and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok());
        let annotations = evictd_policy::podspec::annotations_read(st.annotations);
        let config = info.as_ref().and_then(|i| i.get("config"));
        let cgroup_parent = config
            .and_then(|c| c.pointer("/linux/cgroup_parent"))
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        let log_directory =
            config.and_then(|c| c.get("log_directory")).and_then(|v| v.as_str()).map(str::to_owned);
        let sandbox_image =
            info.as_ref().and_then(|i| i.get("image")).and_then(|v| v.as_str()).map(str::to_owned);
        Ok(PodRecord {
            sandbox_id: sb.id.clone(),
            uid: meta.uid.clone(),
            namespace: meta.namespace.clone(),
            name: meta.name.clone(),
            annotations,
            cgroup_parent,
            log_directory,
            sandbox_image,
            containers: Vec::new(),
            // Given its best spec once its containers are known (`with_best_spec`).
            spec: Pod::default(),
            spec_source: SpecSource::Inferred,
            ignored_annotations: Vec::new(),
        })
    }
}

fn container_record(
    c: &lists::Container,
    running: bool,
    status: &cri::ContainerStatusResponse,
) -> ContainerRecord {
    let st = status.status.clone().unwrap_or_default();
    let res = st.resources.and_then(|r| r.linux);
    let grace = st.annotations.get("io.kubernetes.pod.terminationGracePeriod").and_then(|g| g.parse().ok());
    ContainerRecord {
        id: c.id.clone(),
        name: c.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default(),
        running,
        attempt: c.metadata.as_ref().map_or(0, |m| m.attempt),
        // proto3 omits zeros: 0 means "not set" for both.
        memory_limit: res.as_ref().map(|r| r.memory_limit_in_bytes).filter(|v| *v > 0),
        oom_score_adj: res.as_ref().map(|r| r.oom_score_adj).filter(|v| *v != 0),
        grace_seconds: grace,
        rootfs: None,
        layer_pending: true,
    }
}

/// What a refresh does when the runtime cannot describe one object: a runtime that is down
/// ends the refresh (the error), one that is gone is skipped quietly, any other failure is
/// skipped with a warning, and the refresh goes on with the rest.
fn skip_object(e: CriError, kind: &str, id: &str) -> Result<(), CriError> {
    if e.is_unavailable() {
        return Err(e);
    }
    if e.is_not_found() {
        tracing::debug!("{kind} {id} left out of the inventory: gone since the list ({e})");
    } else {
        tracing::warn!("{kind} {id} left out of the inventory for now: {e}");
    }
    Ok(())
}

/// The pods file could not be used; the specs read before stay.
#[derive(Debug, thiserror::Error)]
enum SpecsError {
    #[error("{path}: {error}")]
    Stat { path: String, error: std::io::Error },
    #[error(transparent)]
    Read(#[from] evictd_policy::podspec::PodListError),
}

/// A pod's containers as the runtime lists them now: gone ones dropped, known ones' state
/// updated, new ones looked at once (ContainerStatus). The record is copied only when one of
/// these changes it.
async fn refresh_containers(
    client: &CriClient,
    rec: &mut Arc<PodRecord>,
    listed: &[&lists::Container],
) -> Result<(), CriError> {
    let running = |c: &lists::Container| c.state == cri::ContainerState::ContainerRunning as i32;
    let mut new = Vec::new();
    for c in listed.iter().filter(|c| !rec.containers.iter().any(|k| k.id == c.id)) {
        match client.container_status(&c.id).await {
            Ok(status) => new.push(container_record(c, running(c), &status)),
            Err(e) => skip_object(e, "container", &c.id)?,
        }
    }
    let now = |k: &ContainerRecord| listed.iter().find(|c| c.id == k.id).map(|c| running(c));
    if new.is_empty() && rec.containers.iter().all(|k| now(k) == Some(k.running)) {
        return Ok(());
    }
    let rec = Arc::make_mut(rec);
    rec.containers.retain_mut(|k| now(k).map(|running| k.running = running).is_some());
    rec.containers.extend(new);
    Ok(())
}

/// Changes from the API server that come together are applied together.
const API_COALESCE: Duration = Duration::from_millis(100);

/// Keeps the inventory current off the pressure path: refreshes every `every`, or at once
/// when `kick` is notified (after an eviction), applies new specs from the API server as
/// they come, and publishes each snapshot that differs from the last. The pressure path only
/// ever reads the latest one.
pub fn spawn_refresh(
    client: CriClient,
    mut inventory: Inventory,
    every: Duration,
    kick: Arc<Notify>,
) -> watch::Receiver<PodList> {
    let (tx, rx) = watch::channel(Arc::new(Vec::new()));
    tokio::spawn(async move {
        let mut up: Option<bool> = None;
        // The first list, and the one asked for after an eviction, are published even when
        // unchanged: the daemon is ready once it has one, and decides again on one read
        // after the eviction.
        let mut must_publish = true;
        loop {
            let next = tokio::time::Instant::now() + every;
            match inventory.refresh(&client).await {
                Ok(spec_warning) => {
                    if up != Some(true) {
                        tracing::info!(endpoint = client.endpoint(), "container runtime reachable");
                    }
                    up = Some(true);
                    if let Some(w) = spec_warning {
                        tracing::warn!("pods file: {w}; keeping the specs read before");
                    }
                    // The pod list first: a pod just started — maybe the one whose growth
                    // is the pressure — must not wait for the runtime's stats of every
                    // container to become a candidate. The disk stats follow.
                    if !publish(&tx, &inventory, std::mem::take(&mut must_publish)) {
                        return;
                    }
                    inventory.refresh_writable_layers(&client).await;
                    if !publish(&tx, &inventory, false) {
                        return;
                    }
                }
                Err(e) => {
                    if up != Some(false) {
                        tracing::warn!(
                            "container runtime unavailable: {e}; pods stay as last seen, retrying"
                        );
                    }
                    up = Some(false);
                }
            }
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => break,
                    _ = kick.notified() => {
                        must_publish = true;
                        break;
                    }
                    _ = inventory.api_changed() => {
                        tokio::time::sleep(API_COALESCE).await;
                        inventory.apply_api_specs();
                        if !publish(&tx, &inventory, false) {
                            return;
                        }
                    }
                }
            }
        }
    });
    rx
}

/// Sends the inventory's pods when they differ from the last list sent (or `always`): each
/// new list costs the daemon work per pod (usage files opened, the charge programs' scope
/// walked), and most refreshes of a steady node change nothing. The lists are compared under
/// the channel's read lock; its write lock, which the daemon's real-time thread would wait
/// for, is held only to swap the list (this task is the only sender). A record the refresh
/// did not change is the one sent before (one pointer compared); a list sent shares its
/// records with the inventory. False once nobody listens.
fn publish(tx: &watch::Sender<PodList>, inventory: &Inventory, always: bool) -> bool {
    let changed = always || {
        let sent = tx.borrow();
        sent.len() != inventory.pods.len()
            || !inventory.pods().zip(sent.iter()).all(|(a, b)| Arc::ptr_eq(a, b) || a == b)
    };
    if changed {
        tx.send_replace(Arc::new(inventory.pods().cloned().collect()));
    }
    !tx.is_closed()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn status(code: tonic::Code) -> CriError {
        CriError::Call {
            endpoint: "e".into(),
            call: "ContainerStatus",
            status: Box::new(tonic::Status::new(code, "x")),
        }
    }

    /// One object the runtime cannot describe is skipped; only a runtime
    /// that is down ends the refresh.
    #[test]
    fn one_bad_object_does_not_end_a_refresh() {
        assert!(skip_object(status(tonic::Code::Internal), "container", "c1").is_ok());
        assert!(skip_object(status(tonic::Code::NotFound), "container", "c1").is_ok());
        assert!(skip_object(status(tonic::Code::Unavailable), "container", "c1").is_err());
        let timeout = CriError::Timeout {
            endpoint: "e".into(),
            call: "PodSandboxStatus",
            timeout: Duration::from_secs(1),
        };
        assert!(skip_object(timeout, "sandbox", "s1").is_err());
    }

    /// A sandbox the runtime lists but cannot describe — gone by its status call, or
    /// described without a status (so without the annotations that can make it critical) —
    /// is left out of the pod list, and the sandboxes around it are not.
    /// The runtime is a hand-made one: containerd cannot be made to answer this way.
    #[tokio::test(flavor = "current_thread")]
    async fn a_sandbox_the_runtime_cannot_describe_is_left_out() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

        use k8s_cri::v1 as cri;
        use prost::Message as _;

        use crate::runtime::cri::scripted::answering;
        let sandbox = |id: &str| cri::PodSandbox {
            id: id.into(),
            metadata: Some(cri::PodSandboxMetadata { name: id.into(), uid: id.into(), ..Default::default() }),
            state: cri::PodSandboxState::SandboxReady as i32,
            ..Default::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("cri.sock");
        let statuses = AtomicUsize::new(0);
        answering(&sock, move |path| {
            let answer = match path.rsplit('/').next().unwrap_or_default() {
                "ListPodSandbox" => Ok(cri::ListPodSandboxResponse {
                    items: vec![sandbox("described"), sandbox("gone"), sandbox("bare")],
                }
                .encode_to_vec()),
                "ListContainers" => Ok(cri::ListContainersResponse::default().encode_to_vec()),
                // In the list's order: the refresh describes one sandbox at a time.
                "PodSandboxStatus" => match statuses.fetch_add(1, SeqCst) {
                    0 => Ok(cri::PodSandboxStatusResponse {
                        status: Some(cri::PodSandboxStatus {
                            id: "described".into(),
                            annotations: [("kubernetes.io/config.source".into(), "file".into())].into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }
                    .encode_to_vec()),
                    1 => Err((tonic::Code::NotFound, "an error occurred when try to find sandbox")),
                    _ => Ok(cri::PodSandboxStatusResponse::default().encode_to_vec()),
                },
                _ => Err((tonic::Code::Unimplemented, "not in this test")),
            };
            (answer, Duration::ZERO)
        });
        let client = CriClient::new(sock.to_str().unwrap(), Duration::from_secs(2)).unwrap();
        let mut inv = Inventory::new(None, 1 << 30);
        inv.refresh(&client).await.expect("one sandbox that cannot be described does not end a refresh");
        let ids: Vec<&str> = inv.pods.keys().map(String::as_str).collect();
        assert_eq!(ids, ["described"]);
        assert!(inv.pods["described"].spec.is_critical(), "its annotations came from its status");
        // The next refresh, which asks the runtime again, still leaves them out.
        inv.refresh(&client).await.expect("refresh");
        assert_eq!(inv.pods.len(), 1, "the others still cannot be described");
    }

    /// SIGHUP: the pods file is read again even when its mtime says it has not changed (a
    /// file replaced within the mtime's granularity, or restored with its old time).
    #[test]
    fn a_sighup_reads_the_pods_file_even_when_its_time_is_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pods.json");
        let list = |priority: i32| {
            serde_json::json!({"items": [{"metadata": {"uid": "u1", "name": "a", "namespace": "n"},
                "spec": {"priority": priority}}]})
            .to_string()
        };
        let write = |priority| {
            std::fs::write(&path, list(priority)).unwrap();
            let f = std::fs::File::options().write(true).open(&path).unwrap();
            f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000)).unwrap();
        };
        let flag = Arc::new(AtomicBool::new(false));
        let mut inv = Inventory::new(Some(path.clone()), 1 << 30).reread_on(flag.clone());
        write(1);
        inv.refresh_specs().unwrap();
        assert_eq!(inv.specs["u1"].priority(), 1);
        write(2);
        inv.refresh_specs().unwrap();
        assert_eq!(inv.specs["u1"].priority(), 1, "same mtime: not read again");
        flag.store(true, Ordering::Relaxed);
        inv.refresh_specs().unwrap();
        assert_eq!(inv.specs["u1"].priority(), 2, "read again on SIGHUP");
        assert!(!flag.load(Ordering::Relaxed), "once");
    }

    /// A pod the API server says has finished is never ranked again, even while its sandbox
    /// runs, and whatever an older pods file says of it: the API's word comes first.
    #[test]
    fn a_pod_finished_in_the_api_is_inactive_over_the_pods_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pods.json");
        let list = serde_json::json!({"items": [{"metadata": {"uid": "u1", "name": "a", "namespace": "n"},
            "spec": {"priority": 7}, "status": {"phase": "Running"}}]});
        std::fs::write(&path, list.to_string()).unwrap();
        let finished: ApiPods = Arc::new([(Arc::from("u1"), ApiPod::Finished("Failed"))].into());
        let (_tx, rx) = watch::channel(Some(finished));
        let mut inv = Inventory::new(Some(path), 1 << 30).with_api(rx);
        inv.refresh_specs().unwrap();
        let mut r = record("/kubepods/pod", vec![container(None, None)]);
        (r.uid, r.name, r.namespace) = ("u1".into(), "a".into(), "n".into());
        inv.pods.insert(r.sandbox_id.clone(), Arc::new(r));
        inv.give_best_specs();
        let pod = inv.pods.values().next().unwrap();
        assert_eq!(pod.spec_source, SpecSource::Api);
        assert!(!pod.spec.is_active(), "{:?}", pod.spec);
        assert_eq!((pod.spec.metadata.name.as_str(), pod.spec.metadata.uid.as_str()), ("a", "u1"));
    }

    /// A tenant's `evictd.io/` annotations do not count outside the namespaces the operator
    /// named, whichever source the spec comes from (the pods file here, or the node's own
    /// annotations when the spec is inferred); inside them they do.
    #[test]
    fn a_tenants_evictd_annotations_count_only_where_the_operator_said() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pods.json");
        let never = serde_json::json!({"evictd.io/eviction": "never"});
        let list = serde_json::json!({"items": [
            {"metadata": {"uid": "u1", "name": "a", "namespace": "team-a", "annotations": never}},
            {"metadata": {"uid": "u2", "name": "b", "namespace": "ops", "annotations": never}}]});
        std::fs::write(&path, list.to_string()).unwrap();
        let mut inv =
            Inventory::new(Some(path), 1 << 30).with_annotation_trust(AnnotationTrust::from_list("ops"));
        inv.refresh_specs().unwrap();
        let mut listed = |uid: &str, namespace: &str| {
            let mut r = record("/kubepods/pod", vec![container(None, None)]);
            (r.uid, r.namespace, r.sandbox_id) = (uid.into(), namespace.into(), format!("sb-{uid}"));
            r.annotations.insert("evictd.io/eviction".into(), "never".into());
            inv.pods.insert(r.sandbox_id.clone(), Arc::new(r));
        };
        listed("u1", "team-a");
        listed("u2", "ops");
        listed("u3", "team-b");
        inv.give_best_specs();
        let pod = |uid: &str| inv.pods.values().find(|r| r.uid == uid).unwrap();
        assert!(!pod("u1").spec.opts_out(), "team-a is a tenant: its opt-out is ignored");
        assert_eq!(pod("u1").ignored_annotations, ["evictd.io/eviction"]);
        assert!(pod("u2").spec.opts_out(), "the operator named ops");
        assert!(pod("u2").ignored_annotations.is_empty());
        assert_eq!(pod("u3").spec_source, SpecSource::Inferred);
        assert!(!pod("u3").spec.opts_out(), "an inferred spec carries the node's annotations: ignored too");
        assert_eq!(inv.named_untrusted.len(), 2, "u1 and u3 named once each");
    }

    /// The pods already named in the log (inferred specs, ignored annotations) are the node's
    /// pods, not every pod the node ever ran: on a node where short-lived pods come and go
    /// all day (jobs, CI runners) the lists stay the size of the node.
    #[test]
    fn the_pods_already_named_are_only_the_nodes_pods() {
        let mut inv = Inventory::new(None, 1 << 30);
        let pod = |n: usize| {
            let mut r = record(&format!("/kubepods/pod{n}"), vec![container(None, None)]);
            (r.sandbox_id, r.uid, r.name) = (format!("sb-{n}"), format!("u-{n}"), format!("job-{n}"));
            r.annotations.insert("evictd.io/eviction".into(), "never".into());
            Arc::new(r)
        };
        let resident = pod(0);
        inv.pods.insert(resident.sandbox_id.clone(), resident);
        for n in 1..=1000 {
            // Each job replaces the one before: two pods at a time on the node.
            inv.pods.retain(|_, r| r.uid == "u-0");
            let job = pod(n);
            inv.pods.insert(job.sandbox_id.clone(), job);
            inv.give_best_specs();
            let uids = |named: &BTreeSet<String>| named.iter().cloned().collect::<Vec<_>>();
            let now = vec!["u-0".to_string(), format!("u-{n}")];
            assert_eq!(uids(&inv.named_inferred), now, "inferred, after {n} jobs");
            assert_eq!(uids(&inv.named_untrusted), now, "ignored annotations, after {n} jobs");
        }
    }

    /// Only a list with other pods or containers names other cgroups; a new state, spec or
    /// disk usage does not.
    #[test]
    fn the_same_cgroups_are_the_same_pods_and_containers() {
        let one = record("/kubepods/poda", vec![container(None, None)]);
        let mut restated = one.clone();
        restated.containers[0].running = false;
        restated.containers[0].rootfs = Some((1, 2));
        restated.spec_source = SpecSource::Api;
        assert!(same_cgroups(&list([one.clone()]), &list([restated])));
        let mut other_container = one.clone();
        other_container.containers[0].id = "c2".into();
        assert!(!same_cgroups(&list([one.clone()]), &list([other_container])));
        let more = list([one.clone(), PodRecord { sandbox_id: "sb2".into(), ..one.clone() }]);
        assert!(!same_cgroups(&list([one.clone()]), &more));
        assert!(!same_cgroups(&list([one]), &[]));
    }

    /// A refresh that changes nothing is not sent (the daemon does work per pod on each new
    /// list), unless it must be: the first one, and the one after an eviction.
    #[test]
    fn an_unchanged_list_is_sent_only_when_it_must_be() {
        let inventory = Inventory::new(None, 1 << 30);
        let (tx, mut rx) = watch::channel(Arc::new(Vec::new()));
        assert!(publish(&tx, &inventory, false));
        assert!(!rx.has_changed().unwrap(), "an unchanged list was sent");
        assert!(publish(&tx, &inventory, true));
        assert!(rx.has_changed().unwrap(), "a list that must be sent was not");
        rx.borrow_and_update();
        drop(rx);
        assert!(!publish(&tx, &inventory, true), "nobody listens any more");
    }

    /// A refresh copies only the records it changes: the others stay the ones the last list
    /// sent, so a list costs a pointer a pod rather than a copy of every record, and an
    /// unchanged refresh sends nothing.
    #[tokio::test(flavor = "current_thread")]
    async fn a_refresh_copies_only_the_records_it_changes() {
        let mut inv = Inventory::new(None, 1 << 30);
        for n in ["a", "b"] {
            let mut r = record(&format!("/kubepods/pod{n}"), vec![container(None, None)]);
            (r.sandbox_id, r.uid, r.name) = (format!("sb-{n}"), format!("u-{n}"), n.into());
            inv.pods.insert(r.sandbox_id.clone(), Arc::new(r));
        }
        inv.give_best_specs();
        let (tx, rx) = watch::channel(Arc::new(Vec::new()));
        assert!(publish(&tx, &inv, true));
        let first = rx.borrow().clone();
        let shared = |inv: &Inventory, sent: &PodList| -> Vec<bool> {
            inv.pods().zip(sent.iter()).map(|(a, b)| Arc::ptr_eq(a, b)).collect()
        };
        assert_eq!(shared(&inv, &first), [true, true], "the list sent is the inventory's records");

        // Never called: every container listed is known.
        let client = CriClient::new("/nonexistent/cri.sock", Duration::from_secs(1)).unwrap();
        let listed = |state: cri::ContainerState| lists::Container {
            id: "c".into(),
            state: state as i32,
            ..Default::default()
        };
        let running = listed(cri::ContainerState::ContainerRunning);
        for id in ["sb-a", "sb-b"] {
            refresh_containers(&client, inv.pods.get_mut(id).unwrap(), &[&running]).await.unwrap();
        }
        inv.give_best_specs();
        assert_eq!(shared(&inv, &first), [true, true], "an unchanged refresh copied a record");
        assert!(publish(&tx, &inv, false));
        assert!(Arc::ptr_eq(&rx.borrow(), &first), "an unchanged refresh was sent");

        let exited = listed(cri::ContainerState::ContainerExited);
        refresh_containers(&client, inv.pods.get_mut("sb-b").unwrap(), &[&exited]).await.unwrap();
        inv.give_best_specs();
        assert_eq!(shared(&inv, &first), [true, false], "only the pod whose container stopped is copied");
        assert!(publish(&tx, &inv, false));
        let second = rx.borrow().clone();
        assert!(!second[1].containers[0].running);
        assert!(Arc::ptr_eq(&second[0], &first[0]), "the unchanged pod is shared with the list before");

        // The stats call ends (here: the runtime is not there): only a record with a layer
        // still pending changes.
        Arc::make_mut(inv.pods.get_mut("sb-a").unwrap()).containers[0].layer_pending = true;
        assert!(publish(&tx, &inv, false));
        let third = rx.borrow().clone();
        inv.refresh_writable_layers(&client).await;
        assert!(!inv.pods["sb-a"].containers[0].layer_pending);
        assert_eq!(shared(&inv, &third), [false, true], "a record without a pending layer was copied");
    }

    /// `pods` as the inventory publishes them.
    pub(crate) fn list(pods: impl IntoIterator<Item = PodRecord>) -> PodList {
        Arc::new(pods.into_iter().map(Arc::new).collect())
    }

    pub(crate) fn record(parent: &str, containers: Vec<ContainerRecord>) -> PodRecord {
        PodRecord {
            sandbox_id: "sb".into(),
            uid: "u".into(),
            namespace: "ns".into(),
            name: "p".into(),
            annotations: BTreeMap::new(),
            cgroup_parent: Some(parent.into()),
            log_directory: None,
            sandbox_image: None,
            containers,
            spec: Pod::default(),
            spec_source: SpecSource::Inferred,
            ignored_annotations: Vec::new(),
        }
    }

    pub(crate) fn container(limit: Option<i64>, adj: Option<i64>) -> ContainerRecord {
        ContainerRecord {
            id: "c".into(),
            name: "app".into(),
            running: true,
            attempt: 0,
            memory_limit: limit,
            oom_score_adj: adj,
            grace_seconds: Some(45),
            rootfs: None,
            layer_pending: false,
        }
    }
}
