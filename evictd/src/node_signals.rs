//! Observations read from this node: memory (root memory cgroup, or the cgroup playing the
//! node), allocatable memory (the kubepods cgroup), nodefs/imagefs/containerfs (statvfs of
//! configurable directories) and pid.available. A signal that cannot be read is left out and
//! logged: no decision is ever taken on a number evictd could not read.

use std::{os::unix::fs::MetadataExt as _, path::PathBuf};

use crate::{
    memory::MemoryCgroup,
    observations::{Observation, Observations},
    policy::Signal,
};

pub struct NodeSignalSources {
    pub node: MemoryCgroup,
    /// The pods' memory cgroup (`kubepods` or `kubepods.slice`); missing means no
    /// allocatableMemory observation.
    pub kubepods: Option<MemoryCgroup>,
    pub nodefs: PathBuf,
    pub imagefs: PathBuf,
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

    pub fn observe(&self, now_ns: i64, missing: &mut Vec<Unreadable>) -> Observations {
        let mut out = Observations::new();
        let at = Some(now_ns);
        match self.node.read() {
            Ok(m) => {
                out.insert(
                    Signal::MemoryAvailable,
                    Observation { available: m.available(), capacity: m.capacity as i64, time_ns: at },
                );
            }
            Err(e) => missing.push(Unreadable { signal: Signal::MemoryAvailable, reason: e.to_string() }),
        }
        if let Some(k) = &self.kubepods {
            match k.read() {
                // An unlimited kubepods cgroup reads back MemTotal as its capacity; the kubelet
                // has no availableBytes then, so there is no observation either.
                Ok(m) if m.limited => {
                    out.insert(
                        Signal::AllocatableMemoryAvailable,
                        Observation { available: m.available(), capacity: m.capacity as i64, time_ns: at },
                    );
                }
                Ok(_) => {}
                Err(e) => missing
                    .push(Unreadable { signal: Signal::AllocatableMemoryAvailable, reason: e.to_string() }),
            }
        }
        let node_dev = std::fs::metadata(&self.nodefs).map(|m| m.dev()).ok();
        let image_dev = std::fs::metadata(&self.imagefs).map(|m| m.dev()).ok();
        statvfs_into(&self.nodefs, Signal::NodeFsAvailable, Signal::NodeFsInodesFree, at, &mut out, missing);
        // imagefs on the nodefs filesystem is not a dedicated imagefs: same numbers.
        let image_dir =
            if node_dev.is_some() && node_dev == image_dev { &self.nodefs } else { &self.imagefs };
        statvfs_into(image_dir, Signal::ImageFsAvailable, Signal::ImageFsInodesFree, at, &mut out, missing);
        statvfs_into(
            image_dir,
            Signal::ContainerFsAvailable,
            Signal::ContainerFsInodesFree,
            at,
            &mut out,
            missing,
        );
        match pids() {
            Ok((max, cur)) => {
                out.insert(
                    Signal::PidAvailable,
                    Observation { available: max - cur, capacity: max, time_ns: at },
                );
            }
            Err(reason) => missing.push(Unreadable { signal: Signal::PidAvailable, reason }),
        }
        out
    }

    /// Whether imagefs is a filesystem of its own (the kubelet's dedicated imagefs).
    pub fn dedicated_imagefs(&self) -> bool {
        let dev = |p: &PathBuf| std::fs::metadata(p).map(|m| m.dev()).ok();
        matches!((dev(&self.nodefs), dev(&self.imagefs)), (Some(a), Some(b)) if a != b)
    }
}

fn statvfs_into(
    dir: &PathBuf,
    bytes: Signal,
    inodes: Signal,
    at: Option<i64>,
    out: &mut Observations,
    missing: &mut Vec<Unreadable>,
) {
    match nix::sys::statvfs::statvfs(dir) {
        Ok(s) => {
            let frsize = s.fragment_size() as i64;
            out.insert(
                bytes,
                Observation {
                    available: s.blocks_available() as i64 * frsize,
                    capacity: s.blocks() as i64 * frsize,
                    time_ns: at,
                },
            );
            if s.files() > 0 {
                out.insert(
                    inodes,
                    Observation { available: s.files_free() as i64, capacity: s.files() as i64, time_ns: at },
                );
            }
        }
        Err(e) => {
            for signal in [bytes, inodes] {
                missing.push(Unreadable { signal, reason: format!("statvfs {}: {e}", dir.display()) });
            }
        }
    }
}

/// (max PIDs, current tasks): max is the smaller of pid_max and threads-max, as the kubelet's
/// rlimit stats take it.
fn pids() -> Result<(i64, i64), String> {
    let read = |p: &str| -> Result<i64, String> {
        let s = std::fs::read_to_string(p).map_err(|e| format!("{p}: {e}"))?;
        s.trim().parse().map_err(|_| format!("{p}: cannot parse {:?}", s.trim()))
    };
    let max = read("/proc/sys/kernel/pid_max")?.min(read("/proc/sys/kernel/threads-max")?);
    let cur = nix::sys::sysinfo::sysinfo().map_err(|e| format!("sysinfo: {e}"))?.process_count();
    Ok((max, i64::from(cur)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup_layout::CgroupLayout;

    #[test]
    fn this_node_has_every_node_signal() {
        let layout = CgroupLayout::detect().unwrap();
        let src = NodeSignalSources {
            node: MemoryCgroup::new(&layout.memory_root, layout.memory_version, true),
            kubepods: None,
            nodefs: "/".into(),
            imagefs: "/".into(),
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

    #[test]
    fn unreadable_filesystems_are_reported_not_guessed() {
        let layout = CgroupLayout::detect().unwrap();
        let src = NodeSignalSources {
            node: MemoryCgroup::new("/nonexistent/memcg", layout.memory_version, false),
            kubepods: None,
            nodefs: "/nonexistent/nodefs".into(),
            imagefs: "/nonexistent/imagefs".into(),
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
}
