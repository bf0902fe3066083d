//! Observations read from this node: memory (root memory cgroup, or the cgroup playing the
//! node), allocatable memory (the kubepods cgroup), nodefs/imagefs/containerfs (statvfs of
//! configurable directories) and pid.available. A signal that cannot be read is left out and
//! logged: no decision is ever taken on a number evictd could not read.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use evictd_policy::{
    observations::{Observation, Observations},
    policy::Signal,
};

use crate::node::memory::MemoryCgroup;

#[derive(Clone, Debug)]
pub struct NodeSignalSources {
    pub node: MemoryCgroup,
    /// The pods' memory cgroup (`kubepods` or `kubepods.slice`); missing means no
    /// allocatableMemory observation.
    pub kubepods: Option<MemoryCgroup>,
    pub nodefs: PathBuf,
    pub imagefs: PathBuf,
    /// The writable layers' filesystem when the runtime reports it apart from the images'
    /// (the kubelet's split containerfs); `None`: containerfs is imagefs.
    pub containerfs: Option<PathBuf>,
    pub pids: PidSources,
}

/// Why a signal is missing, for the log.
#[derive(Debug)]
pub struct Unreadable {
    pub signal: Signal,
    pub reason: String,
}

impl NodeSignalSources {
    pub fn kubepods_for(node: &MemoryCgroup, name: &str) -> Option<MemoryCgroup> {
        let dir = node.dir.join(name);
        dir.is_dir().then(|| MemoryCgroup { dir, is_root: false, ..node.clone() })
    }

    /// Every signal this node can show, read now; each one that cannot be read is left out
    /// (and named in `missing`), never guessed.
    pub fn observe(&self, now_ns: i64, missing: &mut Vec<Unreadable>) -> Observations {
        let mut out = Observations::new();
        let at = Some(now_ns);
        self.observe_memory(at, &mut out, missing);
        self.observe_filesystems(at, &mut out, missing);
        match self.pids.read() {
            Ok((max, cur)) => {
                out.insert(
                    Signal::PidAvailable,
                    Observation { available: max - cur, capacity: max, time_ns: at },
                );
            }
            Err(e) => missing.push(Unreadable { signal: Signal::PidAvailable, reason: e.to_string() }),
        }
        out
    }

    /// memory.available of the node cgroup, and allocatableMemory.available of kubepods.
    fn observe_memory(&self, at: Option<i64>, out: &mut Observations, missing: &mut Vec<Unreadable>) {
        match self.node.read() {
            Ok(m) => {
                let o = Observation { available: m.available(), capacity: m.capacity as i64, time_ns: at };
                out.insert(Signal::MemoryAvailable, o);
            }
            Err(e) => missing.push(Unreadable { signal: Signal::MemoryAvailable, reason: e.to_string() }),
        }
        let Some(k) = &self.kubepods else { return };
        match k.read() {
            // An unlimited kubepods cgroup reads back MemTotal as its capacity; the kubelet
            // has no availableBytes then, so there is no observation either.
            Ok(m) if m.limited => {
                let o = Observation { available: m.available(), capacity: m.capacity as i64, time_ns: at };
                out.insert(Signal::AllocatableMemoryAvailable, o);
            }
            Ok(_) => {}
            Err(e) => {
                missing.push(Unreadable { signal: Signal::AllocatableMemoryAvailable, reason: e.to_string() })
            }
        }
    }

    /// nodefs and imagefs by statvfs; containerfs is imagefs unless the layout is split.
    fn observe_filesystems(&self, at: Option<i64>, out: &mut Observations, missing: &mut Vec<Unreadable>) {
        statvfs_into(&self.nodefs, Signal::NodeFsAvailable, Signal::NodeFsInodesFree, at, out, missing);
        let dev = |p: &PathBuf| std::fs::metadata(p).map(|m| m.dev()).ok();
        let node_dev = dev(&self.nodefs);
        if node_dev.is_some() && node_dev == dev(&self.imagefs) {
            // Not a dedicated imagefs: the very same numbers, not a second statvfs that may
            // already differ.
            copy_observation(out, Signal::NodeFsAvailable, Signal::ImageFsAvailable);
            copy_observation(out, Signal::NodeFsInodesFree, Signal::ImageFsInodesFree);
        } else {
            statvfs_into(
                &self.imagefs,
                Signal::ImageFsAvailable,
                Signal::ImageFsInodesFree,
                at,
                out,
                missing,
            );
        }
        match &self.containerfs {
            Some(dir) => statvfs_into(
                dir,
                Signal::ContainerFsAvailable,
                Signal::ContainerFsInodesFree,
                at,
                out,
                missing,
            ),
            None => {
                copy_observation(out, Signal::ImageFsAvailable, Signal::ContainerFsAvailable);
                copy_observation(out, Signal::ImageFsInodesFree, Signal::ContainerFsInodesFree);
            }
        }
    }

    /// The directory whose filesystem a disk signal measures (`None` for memory and PIDs).
    pub fn filesystem_of(&self, signal: Signal) -> Option<&Path> {
        match signal {
            Signal::NodeFsAvailable | Signal::NodeFsInodesFree => Some(&self.nodefs),
            Signal::ImageFsAvailable | Signal::ImageFsInodesFree => Some(&self.imagefs),
            Signal::ContainerFsAvailable | Signal::ContainerFsInodesFree => {
                Some(self.containerfs.as_deref().unwrap_or(&self.imagefs))
            }
            _ => None,
        }
    }

    /// Whether imagefs is a filesystem of its own (the kubelet's dedicated imagefs).
    pub fn dedicated_imagefs(&self) -> bool {
        let dev = |p: &PathBuf| std::fs::metadata(p).map(|m| m.dev()).ok();
        matches!((dev(&self.nodefs), dev(&self.imagefs)), (Some(a), Some(b)) if a != b)
    }
}

fn statvfs_into(
    dir: &Path,
    bytes: Signal,
    inodes: Signal,
    at: Option<i64>,
    out: &mut Observations,
    missing: &mut Vec<Unreadable>,
) {
    match filesystem_observations(dir, at) {
        Ok((b, i)) => {
            out.insert(bytes, b);
            if let Some(i) = i {
                out.insert(inodes, i);
            }
        }
        Err(e) => {
            for signal in [bytes, inodes] {
                missing.push(Unreadable { signal, reason: format!("statvfs {}: {e}", dir.display()) });
            }
        }
    }
}

/// The filesystem holding `dir`, as the kubelet observes it: bytes available to
/// unprivileged users (`f_bavail`) of the whole size, and free inodes of all inodes — none
/// when the filesystem has no inode count (some report 0).
pub fn filesystem_observations(
    dir: &Path,
    at: Option<i64>,
) -> Result<(Observation, Option<Observation>), nix::Error> {
    let s = nix::sys::statvfs::statvfs(dir)?;
    let frsize = s.fragment_size() as i64;
    let bytes = Observation {
        available: s.blocks_available() as i64 * frsize,
        capacity: s.blocks() as i64 * frsize,
        time_ns: at,
    };
    let inodes = (s.files() > 0).then(|| Observation {
        available: s.files_free() as i64,
        capacity: s.files() as i64,
        time_ns: at,
    });
    Ok((bytes, inodes))
}

fn copy_observation(out: &mut Observations, from: Signal, to: Signal) {
    if let Some(o) = out.get(&from).copied() {
        out.insert(to, o);
    }
}

/// A /proc file or syscall behind pid.available that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {reason}")]
struct PidsError {
    what: String,
    reason: String,
}

/// The /proc files behind pid.available; a test points them at fixtures.
#[derive(Clone, Debug)]
pub struct PidSources {
    pub pid_max: PathBuf,
    pub threads_max: PathBuf,
    pub loadavg: PathBuf,
}

impl Default for PidSources {
    fn default() -> Self {
        PidSources {
            pid_max: "/proc/sys/kernel/pid_max".into(),
            threads_max: "/proc/sys/kernel/threads-max".into(),
            loadavg: "/proc/loadavg".into(),
        }
    }
}

impl PidSources {
    /// (max tasks, tasks now), as the kubelet's `pidlimit.Stats`: the smaller of pid_max and
    /// threads-max, and the task count from /proc/loadavg. Not sysinfo(2): its process count
    /// is a u16 that wraps above 65,535 tasks, so a fork bomb would read as a quiet node.
    fn read(&self) -> Result<(i64, i64), PidsError> {
        let read = |p: &Path| -> Result<String, PidsError> {
            std::fs::read_to_string(p)
                .map_err(|e| PidsError { what: p.display().to_string(), reason: e.to_string() })
        };
        let number = |p: &Path| -> Result<i64, PidsError> {
            let s = read(p)?;
            s.trim().parse().map_err(|_| PidsError {
                what: p.display().to_string(),
                reason: format!("cannot parse {:?}", s.trim()),
            })
        };
        let max = number(&self.pid_max)?.min(number(&self.threads_max)?);
        let tasks = loadavg_tasks(&read(&self.loadavg)?).ok_or_else(|| PidsError {
            what: self.loadavg.display().to_string(),
            reason: "no runnable/total task field (\"1.36 3.49 4.53 2/3518 3715089\")".into(),
        })?;
        Ok((max, tasks))
    }
}

/// The total task count, the number after `/` in /proc/loadavg's fourth field.
fn loadavg_tasks(text: &str) -> Option<i64> {
    let field = text.split_whitespace().nth(3)?;
    field.split_once('/')?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::cgroups::{CgroupMounts, CgroupVersion};

    #[test]
    fn this_node_has_every_node_signal() {
        let layout = CgroupMounts::detect().unwrap();
        let src = NodeSignalSources {
            node: MemoryCgroup::new(&layout.memory_root, layout.memory_version, true),
            kubepods: None,
            nodefs: "/".into(),
            imagefs: "/".into(),
            containerfs: None,
            pids: PidSources::default(),
        };
        let mut missing = Vec::new();
        let o = src.observe(1, &mut missing);
        assert!(missing.is_empty(), "{missing:?}");
        for s in
            [Signal::MemoryAvailable, Signal::NodeFsAvailable, Signal::ImageFsAvailable, Signal::PidAvailable]
        {
            let obs = o.get(&s).unwrap_or_else(|| panic!("{s} missing"));
            assert!(obs.capacity > 0 && obs.available <= obs.capacity, "{s}: {obs:?}");
        }
        assert_eq!(o[&Signal::NodeFsAvailable], o[&Signal::ImageFsAvailable], "same filesystem");
        assert!(!src.dedicated_imagefs());
    }

    /// The split layout: containerfs is read from its own directory, never copied from
    /// imagefs, and one that cannot be read is missing, not guessed.
    #[test]
    fn a_split_containerfs_is_observed_on_its_own_filesystem() {
        let (_d, mut src) = fixture(CgroupVersion::V1, None);
        src.containerfs = Some("/nonexistent/containerfs".into());
        assert_eq!(
            src.filesystem_of(Signal::ContainerFsInodesFree),
            Some(Path::new("/nonexistent/containerfs"))
        );
        assert_eq!(src.filesystem_of(Signal::ImageFsAvailable), Some(Path::new("/")));
        let mut missing = Vec::new();
        let o = src.observe(1, &mut missing);
        assert!(o.contains_key(&Signal::ImageFsAvailable));
        assert!(
            !o.contains_key(&Signal::ContainerFsAvailable) && !o.contains_key(&Signal::ContainerFsInodesFree)
        );
        let named: Vec<_> =
            missing.iter().map(|m| (m.signal, m.reason.contains("/nonexistent/containerfs"))).collect();
        assert_eq!(named, [(Signal::ContainerFsAvailable, true), (Signal::ContainerFsInodesFree, true)]);
        src.containerfs = None;
        let o = src.observe(1, &mut Vec::new());
        assert_eq!(
            o[&Signal::ContainerFsAvailable],
            o[&Signal::ImageFsAvailable],
            "no split: containerfs is imagefs"
        );
    }

    /// A node root and its kubepods cgroup as files, for either cgroup version.
    fn fixture(
        version: CgroupVersion,
        kubepods_limit: Option<u64>,
    ) -> (tempfile::TempDir, NodeSignalSources) {
        let d = tempfile::tempdir().unwrap();
        let w = |p: &str, s: &str| std::fs::write(d.path().join(p), s).unwrap();
        // The root uses 2Gi (AnonPages + Cached + Buffers + SwapCached), 1Gi of it inactive
        // file pages; MemTotal − MemFree says 3Gi.
        w(
            "meminfo",
            "MemTotal: 4194304 kB\nMemFree: 1048576 kB\nAnonPages: 1048576 kB\nCached: 1048576 kB\n\
             Buffers: 0 kB\nSwapCached: 0 kB\nInactive(file): 1048576 kB\n",
        );
        std::fs::create_dir(d.path().join("kubepods")).unwrap();
        match version {
            CgroupVersion::V1 => {
                w("kubepods/memory.usage_in_bytes", "1610612736\n");
                w("kubepods/memory.stat", "total_inactive_file 536870912\n");
                let limit = kubepods_limit.unwrap_or(9223372036854771712);
                w("kubepods/memory.limit_in_bytes", &format!("{limit}\n"));
            }
            CgroupVersion::V2 => {
                w("kubepods/memory.current", "1610612736\n");
                w("kubepods/memory.stat", "inactive_file 536870912\n");
                w("kubepods/memory.max", &kubepods_limit.map_or("max".into(), |l| l.to_string()));
            }
        }
        let node =
            MemoryCgroup { meminfo: d.path().join("meminfo"), ..MemoryCgroup::new(d.path(), version, true) };
        let kubepods = NodeSignalSources::kubepods_for(&node, "kubepods");
        let src = NodeSignalSources {
            node,
            kubepods,
            nodefs: "/".into(),
            imagefs: "/".into(),
            containerfs: None,
            pids: PidSources::default(),
        };
        (d, src)
    }

    #[test]
    fn allocatable_comes_from_a_limited_kubepods_cgroup_on_v1_and_v2() {
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let (_d, src) = fixture(version, Some(3 << 30));
            let o = src.observe(7, &mut Vec::new());
            let a = o[&Signal::AllocatableMemoryAvailable];
            // limit 3Gi − working set (1.5Gi − 0.5Gi inactive file) = 2Gi
            assert_eq!((a.available, a.capacity, a.time_ns), (2 << 30, 3 << 30, Some(7)), "{version:?}");
            let m = o[&Signal::MemoryAvailable];
            assert_eq!(m.capacity, 4 << 30, "{version:?}: MemTotal");
            let (_d, unlimited) = fixture(version, None);
            let o = unlimited.observe(7, &mut Vec::new());
            assert!(!o.contains_key(&Signal::AllocatableMemoryAvailable), "{version:?}: unlimited kubepods");
        }
        // Both roots: 4Gi − (2Gi − 1Gi), from /proc/meminfo.
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let (_d, src) = fixture(version, None);
            assert_eq!(src.observe(0, &mut Vec::new())[&Signal::MemoryAvailable].available, 3 << 30);
        }
    }

    #[test]
    fn unreadable_filesystems_are_reported_not_guessed() {
        let layout = CgroupMounts::detect().unwrap();
        let src = NodeSignalSources {
            node: MemoryCgroup::new("/nonexistent/memcg", layout.memory_version, false),
            kubepods: None,
            nodefs: "/nonexistent/nodefs".into(),
            imagefs: "/nonexistent/imagefs".into(),
            containerfs: None,
            pids: PidSources::default(),
        };
        let mut missing = Vec::new();
        let o = src.observe(1, &mut missing);
        assert!(!o.contains_key(&Signal::MemoryAvailable));
        assert!(!o.contains_key(&Signal::NodeFsAvailable));
        assert!(
            missing
                .iter()
                .any(|m| m.signal == Signal::NodeFsAvailable && m.reason.contains("/nonexistent/nodefs"))
        );
        assert!(o.contains_key(&Signal::PidAvailable));
    }

    /// 70,000 tasks (a fork bomb past sysinfo's u16) read as 70,000, and
    /// pid_max/threads-max give the smaller limit, as the kubelet's pidlimit does.
    #[test]
    fn pid_available_counts_tasks_past_65535_from_loadavg() {
        let d = tempfile::tempdir().unwrap();
        let w = |name: &str, text: &str| {
            let p = d.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let pids = PidSources {
            pid_max: w("pid_max", "4194304\n"),
            threads_max: w("threads-max", "96000\n"),
            loadavg: w("loadavg", "12.50 8.10 3.02 131/70000 4021337\n"),
        };
        assert_eq!(pids.read().unwrap(), (96000, 70000));
        w("loadavg", "0.00 0.01\n");
        let e = pids.read().unwrap_err().to_string();
        assert!(e.contains("loadavg") && e.contains("task field"), "{e}");
        w("loadavg", "0.00 0.01 0.05 1/70000 1\n");
        w("threads-max", "lots\n");
        let e = pids.read().unwrap_err().to_string();
        assert!(e.contains("threads-max") && e.contains("lots"), "{e}");
    }

    /// On this machine: the task count from /proc/loadavg is within reach of the number of
    /// threads /proc shows (tasks come and go between the two reads).
    #[test]
    fn pid_available_on_this_node_matches_proc() {
        let (max, tasks) = PidSources::default().read().unwrap();
        let threads: i64 = procfs::process::all_processes()
            .unwrap()
            .flatten()
            .filter_map(|p| p.stat().ok())
            .map(|s| s.num_threads)
            .sum();
        assert!(max > 0 && tasks > 0 && tasks <= max, "max {max}, tasks {tasks}");
        assert!((tasks - threads).abs() <= threads / 4 + 8, "loadavg {tasks} vs /proc threads {threads}");
    }
}
