//! The pods' usage, for ranking and eviction messages: their cgroups found from the
//! runtime's `cgroup_parent` (cgroupfs paths, and systemd slices expanded to their
//! directories, on cgroup v1 and v2), memory and processes read now from those cgroups,
//! writable layers from the inventory's last refresh, logs and volumes from the disk
//! walker's last walk (`disk_usage`): walking directories is never done in a pass.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    sync::Arc,
};

use evictd_policy::{
    policy::Resource,
    rank::PodKeys,
    summary::{ContainerStats, FsStats, MemoryStats, PodRef, PodStats, ProcessStats, VolumeStats},
};

pub use super::disk_usage::{DiskMeasured, PodDisk};
use super::{
    inventory::{PodList, PodRecord, same_cgroups},
    kill::removed,
};
use crate::{
    kernel::ebpf::{ChargeClock, ChargeMark},
    node::{
        cgroups::{CgroupMounts, CgroupVersion},
        memory::{MemoryCgroup, MemoryError, read_kept},
    },
};

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

/// The pod's cgroups, where the layout allows finding them.
pub fn pod_cgroups(rec: &PodRecord, layout: &CgroupMounts) -> Option<PodCgroups> {
    let rel = cgroup_rel_dir(rec.cgroup_parent.as_deref()?);
    let memory = MemoryCgroup::new(layout.memory_root.join(&rel), layout.memory_version, false);
    let pids = match layout.memory_version {
        CgroupVersion::V2 => Some(layout.memory_root.join(&rel)),
        CgroupVersion::V1 => layout.memory_root.parent().map(|p| p.join("pids").join(&rel)),
    };
    Some(PodCgroups { memory, pids })
}

/// The pods' usage files for one pod list, in the list's order: each pod's cgroups found
/// once per list rather than on every decision, and its usage file kept open beside them
/// (`read_kept`). A memory decision on a node of 250 pods then costs a read per pod: no
/// path made, hashed or compared, and no set of open files rebuilt. The first `limit` pods
/// of a list keep their files (the descriptors are shared with the kill path's pidfds);
/// the rest open and close theirs at each read.
#[derive(Debug)]
pub struct PodUsageFiles {
    list: Option<PodList>,
    cgroups: Vec<Option<PodCgroups>>,
    /// Pod `i`'s usage file, kept open; as long as `cgroups`.
    files: Vec<Option<fs::File>>,
    /// Pod `i`'s usage as last read with the node's charge count taken before that read
    /// (`usage_at`, `bound`); as long as `cgroups`.
    seen: Vec<Option<(u64, ChargeMark)>>,
    /// What a memory decision reads of each pod's spec (`PodKeys`), worked out once per list
    /// followed: one array, not 250 specs scattered over the heap.
    keys: Arc<[PodKeys]>,
    limit: usize,
    /// Usage reads made, for `--trace`'s and the tests' count of what a decision read.
    reads: u64,
}

impl Default for PodUsageFiles {
    /// Room for the pods of any node (the kubelet's `--max-pods` is 110 by default).
    fn default() -> Self {
        Self::at_most(2048)
    }
}

impl PodUsageFiles {
    /// Keeping at most `limit` files open.
    pub fn at_most(limit: usize) -> Self {
        PodUsageFiles {
            list: None,
            cgroups: Vec::new(),
            files: Vec::new(),
            seen: Vec::new(),
            keys: Arc::new([]),
            limit,
            reads: 0,
        }
    }

    /// Follows `pods`: a list naming the cgroups of the one followed takes its place (nothing
    /// opened); another has its pods' cgroups found, the files of pods it kept taken along,
    /// its new pods' usage files opened (a read each) and the files of pods gone closed.
    pub fn follow(&mut self, pods: &PodList, layout: &CgroupMounts) {
        match &self.list {
            Some(list) if Arc::ptr_eq(list, pods) => return,
            Some(list) if same_cgroups(list, pods) => {}
            _ => {
                // Forgotten first: a panic below must not leave the old list naming new cgroups.
                self.list = None;
                type Kept = (Option<fs::File>, Option<(u64, ChargeMark)>);
                let mut kept: HashMap<PathBuf, Kept> = std::mem::take(&mut self.cgroups)
                    .into_iter()
                    .zip(std::mem::take(&mut self.files).into_iter().zip(std::mem::take(&mut self.seen)))
                    .filter_map(|(cg, kept)| Some((cg?.memory.dir, kept)))
                    .collect();
                self.cgroups = pods.iter().map(|p| pod_cgroups(p, layout)).collect();
                (self.files, self.seen) = (self.cgroups.iter().enumerate())
                    .map(|(i, cg)| {
                        let (file, seen) =
                            cg.as_ref().and_then(|cg| kept.remove(&cg.memory.dir)).unwrap_or_default();
                        (file.filter(|_| i < self.limit), seen)
                    })
                    .unzip();
                // The files of pods gone are closed before any is opened: never more than
                // `limit` open, even while a whole node's pods are replaced.
                drop(kept);
                for i in 0..self.cgroups.len().min(self.limit) {
                    if self.files[i].is_none() {
                        let _ = self.usage(i);
                    }
                }
            }
        }
        // Never the old list with the new keys.
        self.list = None;
        self.keys = pods.iter().map(|p| PodKeys::of(&p.spec)).collect();
        self.list = Some(pods.clone());
    }

    /// Each pod's `PodKeys`, by its index in the list followed.
    pub fn pod_keys(&self) -> Arc<[PodKeys]> {
        self.keys.clone()
    }

    /// Whether the list followed is `pods` (the same list, not an equal one).
    pub fn follows(&self, pods: &PodList) -> bool {
        self.list.as_ref().is_some_and(|l| Arc::ptr_eq(l, pods))
    }

    /// The cgroups of pod `i` of the list followed (`None`: the runtime gave no parent).
    pub fn cgroups(&self, i: usize) -> Option<&PodCgroups> {
        self.cgroups.get(i)?.as_ref()
    }

    /// The usage of pod `i` of the list followed now: `None` without cgroups, `Ok(None)`
    /// when its cgroup is gone.
    pub fn usage(&mut self, i: usize) -> Option<Result<Option<u64>, MemoryError>> {
        debug_assert_eq!(self.files.len(), self.cgroups.len(), "a file slot for every pod");
        debug_assert_eq!(self.seen.len(), self.cgroups.len(), "a read slot for every pod");
        let cg = self.cgroups.get(i)?.as_ref()?;
        let keep = i < self.limit;
        self.reads += 1;
        Some(read_kept(self.files.get_mut(i)?, &cg.memory, keep))
    }

    /// How many usage reads were made (`usage`).
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// `usage(i)`, remembered with `mark`, the node's charge count read before it (`bound`).
    pub fn usage_at(
        &mut self,
        i: usize,
        mark: Option<ChargeMark>,
    ) -> Option<Result<Option<u64>, MemoryError>> {
        let read = self.usage(i)?;
        if let Some(seen) = self.seen.get_mut(i) {
            *seen = match (&read, mark) {
                (Ok(Some(bytes)), Some(mark)) => Some((*bytes, mark)),
                _ => None,
            };
        }
        Some(read)
    }

    /// The most pod `i`'s usage can be at `now`: as last read (`usage_at`) plus what the
    /// node was charged since; `None` when not read with a mark that compares with `now`.
    pub fn bound(&self, i: usize, clock: &ChargeClock, now: ChargeMark) -> Option<u64> {
        let (bytes, then) = (*self.seen.get(i)?)?;
        Some(bytes.saturating_add(clock.grown_since(then, now)?))
    }

    /// Reads the usage of up to `n` pods from pod `from` on, with one mark read before
    /// them; returns where the next chunk starts (the list's length: all read).
    pub fn refresh(&mut self, from: usize, n: usize, clock: &ChargeClock) -> usize {
        let mark = clock.now();
        let end = from.saturating_add(n).min(self.cgroups.len());
        for i in from..end {
            let _ = self.usage_at(i, mark);
        }
        end
    }

    /// Forgets every usage read (`bound`): they bound nothing any more.
    pub fn forget_reads(&mut self) {
        self.seen.fill(None);
    }

    /// How many pods have a usage read that may bound them (`bound`).
    pub fn remembered(&self) -> usize {
        self.seen.iter().flatten().count()
    }

    /// How many usage files are open.
    pub fn open(&self) -> usize {
        self.files.iter().flatten().count()
    }
}

/// Why a pod's usage could not be read.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("the runtime gave no cgroup parent for it")]
    NoCgroup,
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("its logs and volumes have not been measured yet")]
    DiskNotMeasured,
    #[error("no pids cgroup of it was found (is the pids controller mounted?)")]
    NoPidsCgroup,
    #[error("{path}: {reason}")]
    Processes { path: PathBuf, reason: String },
}

/// Which cgroup files `pod_stats` reads. On a node of 250 pods each file costs a decision
/// tens of microseconds more per pod, and each ranking needs one kind: the kubelet ranks
/// memory pressure by the pod's working set, PID pressure by its process count, disk
/// pressure and storage limits by disk use alone; only the chosen pod's eviction message
/// names its containers' memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reads {
    pub memory: bool,
    pub processes: bool,
    pub container_memory: bool,
}

impl Reads {
    /// No cgroup file: disk use alone (disk ranking, storage limits), or memory read apart.
    pub const NONE: Reads = Reads { memory: false, processes: false, container_memory: false };

    /// Everything the kubelet's summary has for a pod.
    pub const ALL: Reads = Reads { memory: true, processes: true, container_memory: true };

    /// The containers' memory alone: for the chosen pod's record, beside what it was
    /// ranked by.
    pub const CONTAINER_MEMORY: Reads = Reads { memory: false, processes: false, container_memory: true };

    /// What ranking the pods for `resource` reads.
    pub fn ranking(resource: Resource) -> Reads {
        Reads {
            memory: resource == Resource::Memory,
            processes: resource == Resource::Pids,
            container_memory: false,
        }
    }
}

/// The pod's stats for ranking and messages, as the kubelet's CRI stats provider counts
/// them: memory and processes (those `reads` asks for) read now from its cgroups; per
/// running container (exited instances use no memory and the kubelet leaves them out) the
/// writable layer from the last refresh and, with `disk`, its log directory as last walked;
/// with `disk`, the pod's local volumes as last walked. An error when its memory cgroup
/// cannot be read (and memory is asked for), or (with `disk`) it was not walked yet: the
/// caller must not rank such a pod "without stats" (first), since that would evict on data
/// evictd could not read.
pub fn pod_stats(
    rec: &PodRecord,
    cgroups: Option<&PodCgroups>,
    layout: &CgroupMounts,
    disk: Option<&DiskMeasured>,
    reads: Reads,
) -> Result<PodStats, UsageError> {
    let cg = cgroups.ok_or(UsageError::NoCgroup)?;
    let disk = match disk {
        Some(measured) => Some(measured.get(&rec.uid).ok_or(UsageError::DiskNotMeasured)?),
        None => None,
    };
    let working_set = if reads.memory { Some(cg.memory.working_set()?) } else { None };
    let processes = if reads.processes { Some(process_count(cg)?) } else { None };
    let containers: Vec<ContainerStats> = rec
        .containers
        .iter()
        .filter(|c| c.running)
        .map(|c| ContainerStats {
            name: c.name.clone(),
            memory: reads.container_memory.then(|| MemoryStats {
                working_set_bytes: container_working_set(cg, &c.id, layout),
                ..Default::default()
            }),
            rootfs: c.rootfs.map(|(b, i)| fs_stats((b, i))),
            logs: disk.and_then(|d| d.log_usage(&c.name)).map(fs_stats),
        })
        .collect();
    let volume = disk.map(|d| d.volumes.clone()).unwrap_or_default();
    let ephemeral_storage = disk.map(|d| ephemeral_storage(rec, &containers, &volume, d.pod_level));
    Ok(PodStats {
        pod_ref: PodRef { name: rec.name.clone(), namespace: rec.namespace.clone(), uid: rec.uid.clone() },
        containers,
        memory: working_set.map(|ws| MemoryStats { working_set_bytes: Some(ws), ..Default::default() }),
        volume,
        ephemeral_storage,
        process_stats: Some(ProcessStats { process_count: processes }),
    })
}

/// The pod's tasks (`pids.current`), as PID pressure ranks it. A count that could not be read
/// is an error, never a zero: a pod counted as none would rank last, and a bystander would be
/// evicted in place of the pod that forks.
fn process_count(cg: &PodCgroups) -> Result<u64, UsageError> {
    let path = cg.pids.as_ref().ok_or(UsageError::NoPidsCgroup)?.join("pids.current");
    let at_fault = |reason: String| UsageError::Processes { path: path.clone(), reason };
    let text = fs::read_to_string(&path).map_err(|e| at_fault(e.to_string()))?;
    text.trim().parse().map_err(|_| at_fault(format!("not a count: {:?}", text.trim())))
}

/// Stats that rank a pod as if its working set were `usage`: its working set can be no
/// larger (the kubelet's working set is usage less inactive file pages), so memory ranking
/// places the pod no later than this (`rank::read_memory_contenders`).
pub fn working_set_bound(usage: u64) -> PodStats {
    PodStats {
        memory: Some(MemoryStats { working_set_bytes: Some(usage), ..Default::default() }),
        ..Default::default()
    }
}

/// A pod's stats for memory ranking given its `usage` as just read: its working set is that
/// usage less its inactive file pages (memory.stat), so it never exceeds the bound the
/// ranking read stopped on (`working_set_bound`).
pub fn memory_ranking_stats(
    rec: &PodRecord,
    cg: &PodCgroups,
    layout: &CgroupMounts,
    usage: u64,
) -> Result<PodStats, UsageError> {
    let working_set = cg.memory.working_set_after_usage(usage)?;
    let stats = pod_stats(rec, Some(cg), layout, None, Reads::NONE)?;
    Ok(PodStats {
        memory: Some(MemoryStats { working_set_bytes: Some(working_set), ..Default::default() }),
        ..stats
    })
}

fn fs_stats((bytes, inodes): (u64, u64)) -> FsStats {
    FsStats { used_bytes: Some(bytes), inodes_used: Some(inodes), ..Default::default() }
}

fn container_working_set(pod: &PodCgroups, id: &str, layout: &CgroupMounts) -> Option<u64> {
    let dir = container_dir(&pod.memory.dir, id)?;
    MemoryCgroup::new(dir, layout.memory_version, false).working_set().ok()
}

/// The pod's ephemeral-storage usage, as the kubelet's `calcEphemeralStorage` sums it: its
/// containers' writable layers and logs, its local ephemeral volumes (not those in memory),
/// and its pod-level files (`pod_level_files`).
fn ephemeral_storage(
    rec: &PodRecord,
    containers: &[ContainerStats],
    volumes: &[VolumeStats],
    pod_level: (u64, u64),
) -> FsStats {
    let fs = |f: &Option<FsStats>| {
        f.as_ref().map_or((0, 0), |f| (f.used_bytes.unwrap_or(0), f.inodes_used.unwrap_or(0)))
    };
    let local: Vec<&str> = rec.spec.local_volume_names().collect();
    let parts = containers
        .iter()
        .flat_map(|c| [fs(&c.rootfs), fs(&c.logs)])
        .chain(
            volumes
                .iter()
                .filter(|v| local.contains(&v.name.as_str()))
                .map(|v| (v.used_bytes.unwrap_or(0), v.inodes_used.unwrap_or(0))),
        )
        .chain([pod_level]);
    let (bytes, inodes) = parts.fold((0, 0), |(b, i), (pb, pi)| (b + pb, i + pi));
    fs_stats((bytes, inodes))
}

/// A container's cgroup under its pod's: `<id>` (cgroupfs) or `cri-containerd-<id>.scope`.
fn container_dir(pod_dir: &Path, id: &str) -> Option<PathBuf> {
    [pod_dir.join(id), pod_dir.join(format!("cri-containerd-{id}.scope"))].into_iter().find(|p| p.is_dir())
}

/// Whether a cgroup tree holds no process any more (or is gone). On cgroup v2 the kernel
/// keeps the answer for the whole tree (`populated` in `cgroup.events`): one read, whatever a
/// tenant nested below its pod. On v1 the tree is walked, and a part that cannot be read, but
/// is not gone, is not taken for empty: "empty" ends the wait for the pod's memory and lets
/// the next decision go ahead; the caller's bound ends a wait that never sees it.
pub fn cgroup_tree_empty(dir: &Path) -> bool {
    match fs::read_to_string(dir.join("cgroup.events")) {
        Ok(events) => !events.lines().any(|l| l.trim() == "populated 1"),
        // v1 (no such file), or gone: the walk tells.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => v1_tree_empty(dir),
        Err(e) => removed(&e),
    }
}

fn v1_tree_empty(dir: &Path) -> bool {
    match fs::read_to_string(dir.join("cgroup.procs")) {
        Ok(procs) if !procs.trim().is_empty() => return false,
        Ok(_) => {}
        Err(e) => return removed(&e),
    }
    match fs::read_dir(dir) {
        Ok(entries) => entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .all(|e| v1_tree_empty(&e.path())),
        Err(e) => removed(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The usage files follow the pod list by position: a list with the same pods' cgroups
    /// keeps what is open, a reordered list reads each pod's own file at its new place, and
    /// a pod the runtime gave no cgroup parent has neither cgroups nor usage. The specs' keys
    /// follow every new list, one with the same cgroups too: a pod made critical since is
    /// never taken for evictable by keys of the list before.
    #[test]
    fn pod_usage_files_follow_the_list_by_position() {
        use crate::runtime::inventory::tests::{list as pod_list, record};
        let d = tempfile::tempdir().unwrap();
        let layout = CgroupMounts {
            memory_root: d.path().join("memory"),
            memory_version: CgroupVersion::V1,
            unified_root: None,
        };
        for (pod, bytes) in [("a", 1u64 << 20), ("b", 2 << 20)] {
            let dir = d.path().join(format!("memory/kubepods/pod{pod}"));
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("memory.usage_in_bytes"), format!("{bytes}\n")).unwrap();
        }
        let records = |pods: &[&str]| -> Vec<PodRecord> {
            pods.iter()
                .map(|p| {
                    let mut r = record(&format!("/kubepods/pod{p}"), Vec::new());
                    r.sandbox_id = format!("sb-{p}");
                    r.cgroup_parent = r.cgroup_parent.filter(|_| *p != "none");
                    r
                })
                .collect()
        };
        let list = |pods: &[&str]| pod_list(records(pods));
        let usage = |files: &mut PodUsageFiles, i| files.usage(i).map(|u| u.unwrap());
        let mut files = PodUsageFiles::default();
        files.follow(&list(&["a", "b"]), &layout);
        assert_eq!(
            (usage(&mut files, 0), usage(&mut files, 1), files.open()),
            (Some(Some(1 << 20)), Some(Some(2 << 20)), 2)
        );
        let evictable = |files: &PodUsageFiles| -> Vec<bool> {
            files.pod_keys().iter().map(|k| evictd_policy::rank::evictable_by_keys(k, false)).collect()
        };
        assert_eq!(evictable(&files), [true, true]);
        let mut restated = records(&["a", "b"]);
        restated[0].namespace = "changed".into();
        restated[0].spec.metadata.annotations.insert("kubernetes.io/config.source".into(), "file".into());
        assert!(restated[0].spec.is_critical());
        files.follow(&pod_list(restated), &layout);
        assert_eq!((usage(&mut files, 0), files.open()), (Some(Some(1 << 20)), 2));
        assert_eq!(evictable(&files), [false, true], "the critical pod's keys");
        files.follow(&list(&["b", "a"]), &layout);
        assert_eq!((usage(&mut files, 0), usage(&mut files, 1)), (Some(Some(2 << 20)), Some(Some(1 << 20))));
        assert_eq!(evictable(&files), [true, true]);
        files.follow(&list(&["a", "none"]), &layout);
        assert_eq!((usage(&mut files, 1), files.cgroups(1).is_none(), files.open()), (None, true, 1));
        assert_eq!(usage(&mut files, 2), None, "past the list");
        // Past the limit a pod's usage is still read, through a file opened for the read.
        let mut files = PodUsageFiles::at_most(1);
        files.follow(&list(&["a", "b"]), &layout);
        assert_eq!(
            (usage(&mut files, 0), usage(&mut files, 1), files.open()),
            (Some(Some(1 << 20)), Some(Some(2 << 20)), 1)
        );
        // Files written since are read anew, through the kept file and the one opened for
        // the read: nothing is cached but the open file.
        let write = |pod: &str, v: &str| {
            fs::write(d.path().join(format!("memory/kubepods/pod{pod}/memory.usage_in_bytes")), v).unwrap()
        };
        write("a", "9\n");
        write("b", "7\n");
        assert_eq!((usage(&mut files, 0), usage(&mut files, 1)), (Some(Some(9)), Some(Some(7))));
        // Reordered across the limit: the pod now first keeps its file, the other's is closed.
        files.follow(&list(&["b", "a"]), &layout);
        assert_eq!(
            (usage(&mut files, 0), usage(&mut files, 1), files.files[0].is_some(), files.open()),
            (Some(Some(7)), Some(Some(9)), true, 1)
        );
    }

    #[test]
    fn empty_tree_detection() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("c1")).unwrap();
        fs::write(d.path().join("cgroup.procs"), "").unwrap();
        fs::write(d.path().join("c1/cgroup.procs"), "42\n").unwrap();
        assert!(!cgroup_tree_empty(d.path()));
        fs::write(d.path().join("c1/cgroup.procs"), "").unwrap();
        assert!(cgroup_tree_empty(d.path()));
        assert!(cgroup_tree_empty(&d.path().join("gone")));
        // A part that cannot be read (here a directory where the file should be: EISDIR) may
        // hold anything.
        fs::remove_file(d.path().join("c1/cgroup.procs")).unwrap();
        fs::create_dir(d.path().join("c1/cgroup.procs")).unwrap();
        assert!(!cgroup_tree_empty(d.path()), "an unreadable part is not empty");
        // cgroup v2: the kernel's word for the whole tree.
        fs::write(d.path().join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        assert!(!cgroup_tree_empty(d.path()));
        fs::write(d.path().join("cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
        assert!(cgroup_tree_empty(d.path()), "populated 0: empty, whatever lies below");
    }

    /// The oracle: (allocated bytes, inodes) of exactly the entries the test made under
    /// `dir`, each named once (`dir` itself first, the hard link not at all) — no walk, and
    /// no `du` (the VM matrix runs these tests where there is none).
    fn made(dir: &Path, entries: &[&str]) -> (u64, u64) {
        use std::os::unix::fs::MetadataExt as _;
        let paths = std::iter::once(dir.to_path_buf()).chain(entries.iter().map(|e| dir.join(e)));
        paths.fold((0, 0), |(b, i), p| (b + fs::metadata(&p).unwrap().blocks() * 512, i + 1))
    }

    /// A pod's disk usage as the kubelet counts it. Only running containers
    /// (the exited first instance of `app`, with a big writable layer, is not counted), each
    /// container's own log directory once (not the pod's whole log directory per container
    /// record), the local volumes of its spec under the kubelet's root (a Memory emptyDir
    /// and a secret are not local disk), and the files directly in the pod's log directory
    /// and its etc-hosts.
    #[test]
    fn disk_usage_counts_running_containers_own_logs_and_local_volumes_once() {
        use crate::runtime::inventory::{
            ContainerRecord,
            tests::{container, record},
        };
        let d = tempfile::tempdir().unwrap();
        let cg = d.path().join("memory/kubepods/podu");
        fs::create_dir_all(&cg).unwrap();
        for (f, v) in [
            ("memory.usage_in_bytes", "1048576"),
            ("memory.stat", "total_inactive_file 0"),
            ("memory.limit_in_bytes", "9223372036854771712"),
        ] {
            fs::write(cg.join(f), v).unwrap();
        }
        pids_current(d.path(), "3\n");
        let file = |rel: &str, bytes: usize| {
            let p = d.path().join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, vec![7u8; bytes]).unwrap();
        };
        file("logs/ns_p_u/app/0.log", 64 << 10);
        file("logs/ns_p_u/app/1.log", 32 << 10);
        file("logs/ns_p_u/sidecar/0.log", 16 << 10);
        // Pod-level: a file directly in the pod's log directory, and the kubelet's etc-hosts.
        file("logs/ns_p_u/pod.log", 8 << 10);
        file("kubelet/pods/u/etc-hosts", 200);
        let volumes = "kubelet/pods/u/volumes";
        file(&format!("{volumes}/kubernetes.io~empty-dir/scratch/data/blob"), 1 << 20);
        file(&format!("{volumes}/kubernetes.io~configmap/conf/app.yaml"), 3000);
        file(&format!("{volumes}/kubernetes.io~secret/token/token"), 900);
        file(&format!("{volumes}/kubernetes.io~empty-dir/ram/x"), 5000);
        // A hard link to the blob is the same inode: counted once.
        fs::hard_link(
            d.path().join(format!("{volumes}/kubernetes.io~empty-dir/scratch/data/blob")),
            d.path().join(format!("{volumes}/kubernetes.io~empty-dir/scratch/blob-link")),
        )
        .unwrap();

        let mut rec = record("/kubepods/podu", Vec::new());
        rec.log_directory = Some(d.path().join("logs/ns_p_u").display().to_string());
        let instance = |name: &str, attempt, running, rootfs| ContainerRecord {
            name: name.into(),
            id: format!("{name}-{attempt}"),
            attempt,
            running,
            rootfs: Some(rootfs),
            ..container(None, None)
        };
        rec.containers = vec![
            instance("app", 0, false, (100 << 20, 1000)),
            instance("app", 1, true, (4096, 3)),
            instance("sidecar", 0, true, (8192, 5)),
        ];
        rec.spec = serde_json::from_value(serde_json::json!({"spec": {"volumes": [
            {"name": "scratch", "emptyDir": {}},
            {"name": "conf", "configMap": {"name": "c"}},
            {"name": "token", "secret": {"secretName": "s"}},
            {"name": "ram", "emptyDir": {"medium": "Memory"}},
        ]}}))
        .unwrap();
        let layout = CgroupMounts {
            memory_root: d.path().join("memory"),
            memory_version: CgroupVersion::V1,
            unified_root: None,
        };
        let cgroups = pod_cgroups(&rec, &layout);
        let walk = |rec: &PodRecord| {
            DiskMeasured::from([(
                rec.uid.clone(),
                crate::runtime::disk_usage::measure_disk(rec, &d.path().join("kubelet")),
            )])
        };
        let stats = pod_stats(&rec, cgroups.as_ref(), &layout, Some(&walk(&rec)), Reads::ALL).unwrap();

        let fs = |f: &Option<FsStats>| f.as_ref().map(|f| (f.used_bytes.unwrap(), f.inodes_used.unwrap()));
        let got: Vec<_> =
            stats.containers.iter().map(|c| (c.name.as_str(), fs(&c.rootfs), fs(&c.logs))).collect();
        let logs_dir = d.path().join("logs/ns_p_u");
        let (app_logs, sidecar_logs) =
            (made(&logs_dir.join("app"), &["0.log", "1.log"]), made(&logs_dir.join("sidecar"), &["0.log"]));
        assert_eq!(
            got,
            [("app", Some((4096, 3)), Some(app_logs)), ("sidecar", Some((8192, 5)), Some(sidecar_logs))]
        );
        let vols: Vec<_> = stats
            .volume
            .iter()
            .map(|v| (v.name.as_str(), (v.used_bytes.unwrap(), v.inodes_used.unwrap())))
            .collect();
        let vol = |rel: &str, entries: &[&str]| made(&d.path().join(volumes).join(rel), entries);
        assert_eq!(
            vols,
            [
                ("scratch", vol("kubernetes.io~empty-dir/scratch", &["data", "data/blob"])),
                ("conf", vol("kubernetes.io~configmap/conf", &["app.yaml"]))
            ]
        );
        assert!(vols[0].1.0 >= 1 << 20 && vols[0].1.0 < 2 << 20, "the hard link counted once: {vols:?}");

        // The pod's total: its running containers' layers and logs, its local volumes, and
        // its pod-level files.
        let total = stats.ephemeral_storage.as_ref().and_then(|f| f.used_bytes).unwrap();
        let file_bytes = |rel: &str| made(&d.path().join(rel), &[]).0;
        let pod_level = file_bytes("logs/ns_p_u/pod.log") + file_bytes("kubelet/pods/u/etc-hosts");
        let sum = 4096 + 8192 + app_logs.0 + sidecar_logs.0 + vols[0].1.0 + vols[1].1.0 + pod_level;
        assert_eq!(total, sum);
        let inodes = stats.ephemeral_storage.as_ref().and_then(|f| f.inodes_used).unwrap();
        assert_eq!(inodes, 3 + 5 + app_logs.1 + sidecar_logs.1 + vols[0].1.1 + vols[1].1.1 + 2);
        // A memory emptyDir with a sizeLimit is measured (its limit applies), not counted in the total.
        rec.spec.spec.volumes[3].empty_dir.as_mut().unwrap().size_limit = Some("1Mi".parse().unwrap());
        let stats = pod_stats(&rec, cgroups.as_ref(), &layout, Some(&walk(&rec)), Reads::ALL).unwrap();
        let ram = stats.volume.iter().find(|v| v.name == "ram").and_then(|v| v.used_bytes);
        assert_eq!(ram, Some(vol("kubernetes.io~empty-dir/ram", &["x"]).0));
        assert_eq!(stats.ephemeral_storage.and_then(|f| f.used_bytes), Some(total));

        // A memory pass walks nothing.
        let stats = pod_stats(&rec, cgroups.as_ref(), &layout, None, Reads::ALL).unwrap();
        assert!(stats.volume.is_empty() && stats.containers.iter().all(|c| c.logs.is_none()));
    }

    /// A pass reads logs and volumes as the walker last measured them, never the disk
    /// itself (a walk of a big volume would hold the pass); a pod not walked yet has no
    /// disk stats, rather than zeros that would rank it wrongly.
    #[test]
    fn disk_stats_come_from_the_last_walk_not_the_disk() {
        let d = tempfile::tempdir().unwrap();
        use crate::runtime::inventory::tests::{container, record};
        let mut rec = record("/kubepods/podu", vec![container(None, None)]);
        rec.uid = "u".into();
        rec.spec = serde_json::from_value(
            serde_json::json!({"spec": {"volumes": [{"name": "scratch", "emptyDir": {}}]}}),
        )
        .unwrap();
        let vol = d.path().join("kubelet/pods/u/volumes/kubernetes.io~empty-dir/scratch");
        fs::create_dir_all(&vol).unwrap();
        fs::write(vol.join("big"), vec![7u8; 1 << 20]).unwrap();
        let layout = CgroupMounts {
            memory_root: d.path().join("memory"),
            memory_version: CgroupVersion::V1,
            unified_root: None,
        };
        let memory = d.path().join("memory/kubepods/podu");
        fs::create_dir_all(&memory).unwrap();
        fs::write(memory.join("memory.usage_in_bytes"), "1048576\n").unwrap();
        fs::write(memory.join("memory.stat"), "total_inactive_file 0\n").unwrap();
        fs::write(memory.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        pids_current(d.path(), "3\n");
        let walked = DiskMeasured::from([(
            rec.uid.clone(),
            crate::runtime::disk_usage::measure_disk(&rec, &d.path().join("kubelet")),
        )]);
        fs::remove_file(vol.join("big")).unwrap();
        let cgroups = pod_cgroups(&rec, &layout);
        let stats = pod_stats(&rec, cgroups.as_ref(), &layout, Some(&walked), Reads::ALL).unwrap();
        let used = stats.volume[0].used_bytes.unwrap();
        assert!(used >= 1 << 20, "the walk's {used} bytes, not the disk's now");
        let e =
            pod_stats(&rec, cgroups.as_ref(), &layout, Some(&DiskMeasured::new()), Reads::ALL).unwrap_err();
        assert!(matches!(e, UsageError::DiskNotMeasured), "{e}");
    }

    /// The pod `/kubepods/podu`'s pids.current in the v1 pids hierarchy beside `root/memory`.
    fn pids_current(root: &Path, text: &str) {
        let dir = root.join("pids/kubepods/podu");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("pids.current"), text).unwrap();
    }

    /// PID pressure ranks by each pod's process count: a count that could not be read is an
    /// error naming the file (the decision leaves the pod out and says so), never a zero that
    /// ranks the pod that forks last and evicts a bystander.
    #[test]
    fn a_process_count_that_cannot_be_read_is_an_error_not_zero() {
        use crate::runtime::inventory::tests::{container, record};
        let d = tempfile::tempdir().unwrap();
        let rec = record("/kubepods/podu", vec![container(None, None)]);
        let layout = CgroupMounts {
            memory_root: d.path().join("memory"),
            memory_version: CgroupVersion::V1,
            unified_root: None,
        };
        let cgroups = pod_cgroups(&rec, &layout);
        let pids = Reads::ranking(Resource::Pids);
        let count = || pod_stats(&rec, cgroups.as_ref(), &layout, None, pids).map(|s| s.process_stats);
        let missing = count().unwrap_err();
        assert!(
            matches!(&missing, UsageError::Processes { path, .. } if path.ends_with("pids/kubepods/podu/pids.current")),
            "{missing}"
        );
        pids_current(d.path(), "lots\n");
        assert!(matches!(count(), Err(UsageError::Processes { .. })), "a count that is not a number");
        pids_current(d.path(), "42\n");
        assert_eq!(count().unwrap().and_then(|p| p.process_count), Some(42));
        // No pids hierarchy found for the pod at all.
        let no_pids = cgroups.clone().map(|c| PodCgroups { pids: None, ..c });
        let e = pod_stats(&rec, no_pids.as_ref(), &layout, None, pids).unwrap_err();
        assert!(matches!(e, UsageError::NoPidsCgroup), "{e}");
        // A memory ranking reads no count.
        let e = pod_stats(&rec, no_pids.as_ref(), &layout, None, Reads::NONE);
        assert!(e.is_ok(), "{e:?}");
    }
}
