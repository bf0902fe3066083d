//! The pods on this node, as the container runtime knows them, with their cgroups and
//! specs. Refreshed off the pressure path: a refresh asks the CRI only about sandboxes and
//! containers it has not seen yet, so when pressure wakes the daemon, ranking reads the
//! cached inventory and a few cgroup files, never a full CRI listing.
//!
//! Specs come from a PodList file (`--pods-file`, re-read when it changes) or, for pods not
//! in it, are inferred from what the node shows: the QoS class from the cgroup placement,
//! requests from container limits and oom_score_adj, the grace period from the kubelet's
//! container annotation, critical-ness from the sandbox annotations.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::sync::{Notify, watch};

use crate::{
    node::cgroups::{CgroupLayout, CgroupVersion},
    node::memory::MemoryCgroup,
    runtime::cri::{CriClient, CriError, api as cri},
};
use evictd_policy::{
    podspec::{Container, ObjectMeta, Pod, PodSpec, Resources},
    quantity::Quantity,
    summary::{ContainerStats, FsStats, MemoryStats, PodRef, PodStats, ProcessStats},
};

#[derive(Clone, Debug)]
pub struct ContainerRecord {
    pub id: String,
    pub name: String,
    pub running: bool,
    pub memory_limit: Option<i64>,
    pub oom_score_adj: Option<i64>,
    pub grace_seconds: Option<i64>,
    /// Writable layer and log bytes/inodes, from the last background refresh.
    pub rootfs: Option<(u64, u64)>,
}

#[derive(Clone, Debug)]
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
    pub spec_inferred: bool,
}

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

/// The directory of a pod cgroup relative to a hierarchy root. cgroupfs parents are paths
/// already; a systemd slice `kubepods-burstable-pod1.slice` lives at
/// `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice`.
pub fn cgroup_rel_dir(parent: &str) -> PathBuf {
    let parent = parent.trim_start_matches('/');
    if let Some(stem) = parent.strip_suffix(".slice")
        && !parent.contains('/')
    {
        let parts: Vec<&str> = stem.split('-').collect();
        let mut dir = PathBuf::new();
        for i in 1..=parts.len() {
            dir.push(format!("{}.slice", parts[..i].join("-")));
        }
        return dir;
    }
    PathBuf::from(parent)
}

/// A pod's cgroup directories in the memory and pids hierarchies.
#[derive(Clone, Debug)]
pub struct PodCgroups {
    pub memory: MemoryCgroup,
    pub pids: Option<PathBuf>,
}

#[derive(Default)]
pub struct Inventory {
    pods: BTreeMap<String, PodRecord>,
    pods_file: Option<(PathBuf, Option<SystemTime>)>,
    specs: HashMap<String, Pod>,
    /// Node memory capacity, to turn oom_score_adj back into a request.
    capacity: i64,
}

impl Inventory {
    pub fn new(pods_file: Option<PathBuf>, node_capacity: i64) -> Self {
        Inventory { pods_file: pods_file.map(|p| (p, None)), capacity: node_capacity, ..Default::default() }
    }

    pub fn pods(&self) -> impl Iterator<Item = &PodRecord> {
        self.pods.values()
    }

    /// Re-reads the pods file when it changed. A file that cannot be read or parsed keeps the
    /// previous specs and is reported: a half-written file must not erase what is known.
    fn refresh_specs(&mut self) -> Result<bool, String> {
        let Some((path, seen)) = &self.pods_file else { return Ok(false) };
        let mtime = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if *seen == Some(mtime) {
            return Ok(false);
        }
        let pods = evictd_policy::podspec::read_pod_list(path).map_err(|e| e.to_string())?;
        self.specs = pods.into_iter().map(|p| (p.metadata.uid.clone(), p)).collect();
        self.pods_file = Some((path.clone(), Some(mtime)));
        Ok(true)
    }

    /// Brings the inventory up to date with the runtime: new sandboxes and containers are
    /// looked at once, gone ones dropped. Returns the errors of the pods file, if any, as a
    /// warning (the CRI's errors are returned as errors).
    pub async fn refresh(&mut self, client: &CriClient) -> Result<Option<String>, CriError> {
        let spec_warning = match self.refresh_specs() {
            Ok(changed) => {
                if changed {
                    // Re-apply specs to known pods.
                    for rec in self.pods.values_mut() {
                        if let Some(spec) = self.specs.get(&rec.uid) {
                            rec.spec = spec.clone();
                            rec.spec_inferred = false;
                        }
                    }
                }
                None
            }
            Err(e) => Some(e),
        };
        let sandboxes = client.list_pod_sandboxes().await?;
        let containers = client.list_containers().await?;
        let ready: Vec<&cri::PodSandbox> =
            sandboxes.iter().filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32).collect();
        self.pods.retain(|id, _| ready.iter().any(|s| &s.id == id));
        for sb in ready {
            if !self.pods.contains_key(&sb.id) {
                let rec = self.describe_sandbox(client, sb).await?;
                self.pods.insert(sb.id.clone(), rec);
            }
            let Some(rec) = self.pods.get_mut(&sb.id) else { continue };
            let mine: Vec<&cri::Container> =
                containers.iter().filter(|c| c.pod_sandbox_id == sb.id).collect();
            rec.containers.retain(|c| mine.iter().any(|m| m.id == c.id));
            for c in mine {
                let running = c.state == cri::ContainerState::ContainerRunning as i32;
                if let Some(known) = rec.containers.iter_mut().find(|k| k.id == c.id) {
                    known.running = running;
                    continue;
                }
                let status = match client.container_status(&c.id).await {
                    Ok(s) => s,
                    Err(e) if e.is_not_found() => continue,
                    Err(e) => return Err(e),
                };
                rec.containers.push(container_record(c, running, &status));
            }
            if rec.spec_inferred {
                rec.spec = infer_spec(rec, self.capacity);
            }
        }
        // Writable-layer usage for disk ranking: one call for all containers.
        if let Ok(stats) = client.list_container_stats().await {
            for s in stats {
                let Some(attrs) = &s.attributes else { continue };
                let Some(layer) = &s.writable_layer else { continue };
                for rec in self.pods.values_mut() {
                    if let Some(c) = rec.containers.iter_mut().find(|c| c.id == attrs.id) {
                        c.rootfs = Some((
                            layer.used_bytes.as_ref().map_or(0, |v| v.value),
                            layer.inodes_used.as_ref().map_or(0, |v| v.value),
                        ));
                    }
                }
            }
        }
        Ok(spec_warning)
    }

    async fn describe_sandbox(
        &self,
        client: &CriClient,
        sb: &cri::PodSandbox,
    ) -> Result<PodRecord, CriError> {
        let meta = sb.metadata.clone().unwrap_or_default();
        let info = match client.pod_sandbox_status(&sb.id).await {
            Ok(s) => s.info.get("info").and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok()),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e),
        };
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
        let annotations: BTreeMap<String, String> = sb.annotations.clone().into_iter().collect();
        let mut rec = PodRecord {
            sandbox_id: sb.id.clone(),
            uid: meta.uid.clone(),
            namespace: meta.namespace.clone(),
            name: meta.name.clone(),
            annotations,
            cgroup_parent,
            log_directory,
            sandbox_image,
            containers: Vec::new(),
            spec: Pod::default(),
            spec_inferred: true,
        };
        match self.specs.get(&rec.uid) {
            Some(spec) => {
                rec.spec = spec.clone();
                rec.spec_inferred = false;
            }
            None => {
                rec.spec = infer_spec(&rec, self.capacity);
                tracing::info!(
                    pod = %format!("{}/{}", rec.namespace, rec.name),
                    "no spec in the pods file: priority, requests and grace period are inferred from the node"
                );
            }
        }
        Ok(rec)
    }
}

/// The pod's cgroups, where the layout allows finding them.
pub fn pod_cgroups(rec: &PodRecord, layout: &CgroupLayout) -> Option<PodCgroups> {
    let rel = cgroup_rel_dir(rec.cgroup_parent.as_deref()?);
    let memory = MemoryCgroup::new(layout.memory_root.join(&rel), layout.memory_version, false);
    let pids = match layout.memory_version {
        CgroupVersion::V2 => Some(layout.memory_root.join(&rel)),
        CgroupVersion::V1 => layout.memory_root.parent().map(|p| p.join("pids").join(&rel)),
    };
    Some(PodCgroups { memory, pids })
}

fn container_record(
    c: &cri::Container,
    running: bool,
    status: &cri::ContainerStatusResponse,
) -> ContainerRecord {
    let st = status.status.clone().unwrap_or_default();
    let res = st.resources.and_then(|r| r.linux);
    let grace = c
        .annotations
        .get("io.kubernetes.pod.terminationGracePeriod")
        .or_else(|| st.annotations.get("io.kubernetes.pod.terminationGracePeriod"))
        .and_then(|g| g.parse().ok());
    ContainerRecord {
        id: c.id.clone(),
        name: c.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default(),
        running,
        // proto3 omits zeros: 0 means "not set" for both.
        memory_limit: res.as_ref().map(|r| r.memory_limit_in_bytes).filter(|v| *v > 0),
        oom_score_adj: res.as_ref().map(|r| r.oom_score_adj).filter(|v| *v != 0),
        grace_seconds: grace,
        rootfs: None,
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

/// The pod's stats for ranking and messages, read now from its cgroups (memory, processes)
/// and from the last refresh (disk). `None` when its cgroup cannot be read: such a pod ranks
/// as "without stats", as in the kubelet.
pub fn pod_stats(rec: &PodRecord, cgroups: Option<&PodCgroups>, layout: &CgroupLayout) -> Option<PodStats> {
    let cg = cgroups?;
    let mem = cg.memory.read().ok()?;
    let processes = cg
        .pids
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p.join("pids.current")).ok())
        .and_then(|s| s.trim().parse().ok());
    let containers = rec
        .containers
        .iter()
        .map(|c| {
            let dir = container_dir(&cg.memory.dir, &c.id);
            let ws = dir
                .and_then(|d| MemoryCgroup::new(d, layout.memory_version, false).read().ok())
                .map(|m| m.working_set());
            ContainerStats {
                name: c.name.clone(),
                memory: Some(MemoryStats { working_set_bytes: ws, ..Default::default() }),
                rootfs: c.rootfs.map(|(b, i)| FsStats {
                    used_bytes: Some(b),
                    inodes_used: Some(i),
                    ..Default::default()
                }),
                logs: rec.log_directory.as_deref().map(|d| {
                    let (b, i) = du(Path::new(d));
                    FsStats { used_bytes: Some(b), inodes_used: Some(i), ..Default::default() }
                }),
            }
        })
        .collect();
    Some(PodStats {
        pod_ref: PodRef { name: rec.name.clone(), namespace: rec.namespace.clone(), uid: rec.uid.clone() },
        containers,
        memory: Some(MemoryStats { working_set_bytes: Some(mem.working_set()), ..Default::default() }),
        volume: Vec::new(),
        ephemeral_storage: None,
        process_stats: Some(ProcessStats { process_count: processes }),
    })
}

/// A container's cgroup under its pod's: `<id>` (cgroupfs) or `cri-containerd-<id>.scope`.
fn container_dir(pod_dir: &Path, id: &str) -> Option<PathBuf> {
    [pod_dir.join(id), pod_dir.join(format!("cri-containerd-{id}.scope"))].into_iter().find(|p| p.is_dir())
}

/// Bytes and inodes under `dir` (files that vanish meanwhile are skipped).
fn du(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt as _;
    let mut total = (0, 0);
    let Ok(entries) = std::fs::read_dir(dir) else { return total };
    for e in entries.flatten() {
        let Ok(m) = e.metadata() else { continue };
        total.1 += 1;
        if m.is_dir() {
            let (b, i) = du(&e.path());
            total.0 += b;
            total.1 += i;
        } else {
            total.0 += m.blocks() * 512;
        }
    }
    total
}

/// Whether a cgroup tree holds no process any more (or is gone).
pub fn cgroup_tree_empty(dir: &Path) -> bool {
    let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) else { return true };
    if !procs.trim().is_empty() {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return true };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .all(|e| cgroup_tree_empty(&e.path()))
}

/// Keeps the inventory current off the pressure path: refreshes every `every`, or at once
/// when `kick` is notified (after an eviction), and publishes each snapshot. The pressure
/// path only ever reads the latest one.
pub fn spawn_refresh(
    client: CriClient,
    mut inventory: Inventory,
    every: Duration,
    kick: Arc<Notify>,
) -> watch::Receiver<Arc<Vec<PodRecord>>> {
    let (tx, rx) = watch::channel(Arc::new(Vec::new()));
    tokio::spawn(async move {
        let mut up: Option<bool> = None;
        loop {
            match inventory.refresh(&client).await {
                Ok(spec_warning) => {
                    if up != Some(true) {
                        tracing::info!(endpoint = client.endpoint(), "container runtime reachable");
                    }
                    up = Some(true);
                    if let Some(w) = spec_warning {
                        tracing::warn!("pods file: {w}; keeping the specs read before");
                    }
                    if tx.send(Arc::new(inventory.pods().cloned().collect())).is_err() {
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
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = kick.notified() => {}
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(parent: &str, containers: Vec<ContainerRecord>) -> PodRecord {
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
            spec_inferred: true,
        }
    }

    fn container(limit: Option<i64>, adj: Option<i64>) -> ContainerRecord {
        ContainerRecord {
            id: "c".into(),
            name: "app".into(),
            running: true,
            memory_limit: limit,
            oom_score_adj: adj,
            grace_seconds: Some(45),
            rootfs: None,
        }
    }

    #[test]
    fn systemd_slices_expand_and_cgroupfs_paths_stay() {
        assert_eq!(
            cgroup_rel_dir("kubepods-burstable-pod12.slice"),
            PathBuf::from("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12.slice")
        );
        assert_eq!(
            cgroup_rel_dir("kubepods-pod9.slice"),
            PathBuf::from("kubepods.slice/kubepods-pod9.slice")
        );
        assert_eq!(cgroup_rel_dir("/kubepods/burstable/pod1"), PathBuf::from("kubepods/burstable/pod1"));
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

    #[test]
    fn empty_tree_detection() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("c1")).unwrap();
        std::fs::write(d.path().join("cgroup.procs"), "").unwrap();
        std::fs::write(d.path().join("c1/cgroup.procs"), "42\n").unwrap();
        assert!(!cgroup_tree_empty(d.path()));
        std::fs::write(d.path().join("c1/cgroup.procs"), "").unwrap();
        assert!(cgroup_tree_empty(d.path()));
        assert!(cgroup_tree_empty(&d.path().join("gone")));
    }
}
