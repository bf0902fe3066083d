//! The pods' usage, for ranking and eviction messages: their cgroups found from the
//! runtime's `cgroup_parent` (cgroupfs paths, and systemd slices expanded to their
//! directories, on cgroup v1 and v2), memory and processes read now from those cgroups,
//! disk from the inventory's last refresh.

use std::path::{Path, PathBuf};

use evictd_policy::summary::{ContainerStats, FsStats, MemoryStats, PodRef, PodStats, ProcessStats};

use super::inventory::PodRecord;
use crate::node::{
    cgroups::{CgroupMounts, CgroupVersion},
    memory::{MemoryCgroup, MemoryError},
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

/// Why a pod's usage could not be read.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("the runtime gave no cgroup parent for it")]
    NoCgroup,
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

/// The pod's stats for ranking and messages, read now from its cgroups (memory, processes)
/// and from the last refresh (disk). An error when its memory cgroup cannot be read: the
/// caller must not rank such a pod "without stats" (first), since that would evict on data
/// evictd could not read.
pub fn pod_stats(
    rec: &PodRecord,
    cgroups: Option<&PodCgroups>,
    layout: &CgroupMounts,
) -> Result<PodStats, UsageError> {
    let cg = cgroups.ok_or(UsageError::NoCgroup)?;
    let mem = cg.memory.read()?;
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
    Ok(PodStats {
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
