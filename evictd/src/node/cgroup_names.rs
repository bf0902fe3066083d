//! Turns the cgroup ids in wake events into paths a person can read. A cgroup id is the
//! inode number of the cgroup's directory, so a walk of the hierarchy builds the map; ids
//! not seen yet trigger a new walk, at most every `RESCAN_EVERY`.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use evictd_common::CGROUP_KIND_MEMCG;

use crate::node::cgroups::{CgroupMounts, CgroupVersion};

const RESCAN_EVERY: Duration = Duration::from_millis(250);
/// Deeper than any kubelet layout (kubepods/<qos>/pod<uid>/<container>) with room to spare.
const MAX_DEPTH: usize = 12;

pub struct CgroupNames {
    layout: CgroupMounts,
    memcg: HashMap<u64, String>,
    unified: HashMap<u64, String>,
    last_scan: Option<Instant>,
}

impl CgroupNames {
    pub fn new(layout: CgroupMounts) -> Self {
        CgroupNames { layout, memcg: HashMap::new(), unified: HashMap::new(), last_scan: None }
    }

    /// A readable name for an event's cgroup: its path in the memory hierarchy where it can
    /// be known, else its cgroup2 path, else the bare id.
    pub fn describe(&mut self, kind: u32, id: u64, pid: u32) -> String {
        if kind == CGROUP_KIND_MEMCG || self.layout.memory_is_unified() {
            return self.lookup(id, true).unwrap_or_else(|| format!("cgroup-id:{id}"));
        }
        // A cgroup2 id on a v1 memory node: the task's memcg is in /proc/<pid>/cgroup.
        if pid != 0
            && let Some(p) = memcg_of_pid(pid, CgroupVersion::V1)
        {
            return p;
        }
        self.lookup(id, false).map(|p| format!("{p} (cgroup2)")).unwrap_or_else(|| format!("cgroup2-id:{id}"))
    }

    fn lookup(&mut self, id: u64, memcg: bool) -> Option<String> {
        let hit = if memcg { self.memcg.get(&id) } else { self.unified.get(&id) };
        if let Some(p) = hit {
            return Some(p.clone());
        }
        if self.last_scan.is_some_and(|t| t.elapsed() < RESCAN_EVERY) {
            return None;
        }
        self.rescan();
        if memcg { self.memcg.get(&id).cloned() } else { self.unified.get(&id).cloned() }
    }

    fn rescan(&mut self) {
        self.last_scan = Some(Instant::now());
        self.memcg.clear();
        walk(&self.layout.memory_root, &self.layout.memory_root, 0, &mut |id, p| {
            self.memcg.insert(id, p);
        });
        self.unified.clear();
        if let Some(root) = self.layout.unified_root.clone() {
            walk(&root, &root, 0, &mut |id, p| {
                self.unified.insert(id, p);
            });
        }
    }
}

/// The cgroup ids of `dir` and every cgroup below it.
pub fn subtree_ids(dir: &Path) -> Vec<u64> {
    let mut ids = Vec::new();
    walk(dir, dir, 0, &mut |id, _| ids.push(id));
    ids
}

/// `dir` and its sub-directories (to a bounded depth), as paths relative to `dir` with a
/// leading '/'.
pub fn subtree_paths(dir: &Path) -> Vec<String> {
    let mut paths = Vec::new();
    walk(dir, dir, 0, &mut |_, rel| paths.push(rel));
    paths
}

/// Visits `dir` and its sub-directories as (id, path relative to `root` with a leading '/').
/// Directories that vanish during the walk are skipped: cgroups come and go all the time.
fn walk(root: &Path, dir: &Path, depth: usize, visit: &mut dyn FnMut(u64, String)) {
    let Ok(meta) = std::fs::metadata(dir) else { return };
    let rel = dir.strip_prefix(root).map(PathBuf::from).unwrap_or_default();
    visit(meta.ino(), format!("/{}", rel.display()));
    if depth >= MAX_DEPTH {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            walk(root, &entry.path(), depth + 1, visit);
        }
    }
}

/// The memory cgroup of a process, from /proc/<pid>/cgroup: the line of the v1 hierarchy
/// with the memory controller, or the cgroup2 line.
pub fn memcg_of_pid(pid: u32, version: CgroupVersion) -> Option<String> {
    let cgroups = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?.cgroups().ok()?;
    cgroups.0.into_iter().find_map(|cg| {
        let memory_line = match version {
            CgroupVersion::V1 => cg.controllers.iter().any(|c| c == "memory"),
            CgroupVersion::V2 => cg.hierarchy == 0,
        };
        memory_line.then_some(cg.pathname)
    })
}

/// A cgroup's id, as the kernel reports it in events and the eBPF programs compare it: its
/// directory's inode number (1 for a hierarchy's root).
pub fn cgroup_id(dir: &Path) -> std::io::Result<u64> {
    std::fs::metadata(dir).map(|m| m.ino())
}

/// Whether a process is in the memory cgroup `rel` (relative to the hierarchy's root, as
/// `/proc/<pid>/cgroup` shows it) or below it. A process that cannot be read is not.
pub fn pid_in_cgroup(pid: u32, rel: &Path, version: CgroupVersion) -> bool {
    memcg_of_pid(pid, version).is_some_and(|p| Path::new(&p).starts_with(rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_names_subdirectories_by_inode() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("kubepods/burstable/podx")).unwrap();
        let ino = std::fs::metadata(d.path().join("kubepods/burstable")).unwrap().ino();
        let mut seen = HashMap::new();
        walk(d.path(), d.path(), 0, &mut |id, p| {
            seen.insert(id, p);
        });
        assert_eq!(seen.get(&ino).map(String::as_str), Some("/kubepods/burstable"));
        assert_eq!(seen.len(), 4);
        assert_eq!(subtree_ids(&d.path().join("kubepods")).len(), 3);
    }

    #[test]
    fn own_memcg_from_proc() {
        // On v1 the line that lists `memory`, on v2 the `0::` line (run in the VM matrix).
        let layout = CgroupMounts::detect().unwrap();
        let p = memcg_of_pid(std::process::id(), layout.memory_version);
        assert!(p.as_deref().is_some_and(|p| p.starts_with('/')), "{p:?}");
    }
}
