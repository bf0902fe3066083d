//! Turns the cgroup ids in wake events into paths a person can read. A cgroup id is the
//! inode number of the cgroup's directory, so a walk of the hierarchy builds the map; ids
//! not seen yet trigger a new walk, at most every `RESCAN_EVERY`, and an id no walk found
//! triggers none again (wakes come from cgroups outside the hierarchy, or removed, many
//! times a second, and a walk of a node's hierarchy lists thousands of directories).

use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use evictd_common::CGROUP_KIND_MEMCG;

use crate::node::cgroups::{CgroupMounts, CgroupVersion};

const RESCAN_EVERY: Duration = Duration::from_millis(250);
/// Ids no walk found, remembered at most: past it the list starts over.
const MAX_UNKNOWN: usize = 4096;
/// Deeper than any kubelet layout (kubepods/<qos>/pod<uid>/<container>) with room to spare.
const MAX_DEPTH: usize = 12;

pub struct CgroupNames {
    layout: CgroupMounts,
    memcg: HashMap<u64, String>,
    unified: HashMap<u64, String>,
    last_scan: Option<Instant>,
    /// (id, memcg) pairs the last walks did not find.
    unknown: HashSet<(u64, bool)>,
}

impl CgroupNames {
    pub fn new(layout: CgroupMounts) -> Self {
        CgroupNames {
            layout,
            memcg: HashMap::new(),
            unified: HashMap::new(),
            last_scan: None,
            unknown: HashSet::new(),
        }
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
        if self.unknown.contains(&(id, memcg)) || self.last_scan.is_some_and(|t| t.elapsed() < RESCAN_EVERY) {
            return None;
        }
        let complete = self.rescan();
        let found = if memcg { self.memcg.get(&id).cloned() } else { self.unified.get(&id).cloned() };
        // A walk that could not list some directory (out of descriptors) proves nothing.
        if found.is_none() && complete {
            if self.unknown.len() >= MAX_UNKNOWN {
                self.unknown.clear();
            }
            self.unknown.insert((id, memcg));
        }
        found
    }

    /// Walks both hierarchies; true when every directory could be listed (or was gone).
    fn rescan(&mut self) -> bool {
        self.last_scan = Some(Instant::now());
        self.memcg.clear();
        let mut complete = walk(&self.layout.memory_root, &self.layout.memory_root, 0, &mut |id, p| {
            self.memcg.insert(id, p);
        });
        self.unified.clear();
        if let Some(root) = self.layout.unified_root.clone() {
            complete &= walk(&root, &root, 0, &mut |id, p| {
                self.unified.insert(id, p);
            });
        }
        complete
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
/// False when some directory could not be listed for another reason.
fn walk(root: &Path, dir: &Path, depth: usize, visit: &mut dyn FnMut(u64, String)) -> bool {
    match std::fs::metadata(dir) {
        Ok(meta) => walk_below(root, dir, meta.ino(), depth, visit),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// `walk` of `dir`, whose id is `ino`. Each sub-directory's id is the inode number its
/// parent's listing gives: no stat per cgroup, where a node of 250 pods has ~750 of them.
fn walk_below(root: &Path, dir: &Path, ino: u64, depth: usize, visit: &mut dyn FnMut(u64, String)) -> bool {
    use std::os::unix::fs::DirEntryExt as _;
    let rel = dir.strip_prefix(root).map(PathBuf::from).unwrap_or_default();
    visit(ino, format!("/{}", rel.display()));
    if depth >= MAX_DEPTH {
        return true;
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => return e.kind() == std::io::ErrorKind::NotFound,
    };
    let mut complete = true;
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            complete &= walk_below(root, &entry.path(), entry.ino(), depth + 1, visit);
        }
    }
    complete
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
    pid_under_cgroup(pid, rel, version) == Some(true)
}

/// `pid_in_cgroup`, with `None` for a process that cannot be read.
pub fn pid_under_cgroup(pid: u32, rel: &Path, version: CgroupVersion) -> Option<bool> {
    memcg_of_pid(pid, version).map(|p| Path::new(&p).starts_with(rel))
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

    /// An id that a walk did not find sets off no further walk; a new cgroup's id does.
    #[test]
    fn unknown_ids_are_looked_for_once() {
        let d = tempfile::tempdir().unwrap();
        let layout = CgroupMounts {
            memory_root: d.path().into(),
            memory_version: CgroupVersion::V1,
            unified_root: None,
        };
        let mut names = CgroupNames::new(layout);
        assert_eq!(names.lookup(u64::MAX, true), None);
        assert!(names.last_scan.is_some(), "the first miss walks");
        names.last_scan = None;
        assert_eq!(names.lookup(u64::MAX, true), None);
        assert!(names.last_scan.is_none(), "the same miss walked again");
        std::fs::create_dir(d.path().join("pod")).unwrap();
        let ino = std::fs::metadata(d.path().join("pod")).unwrap().ino();
        assert_eq!(names.lookup(ino, true).as_deref(), Some("/pod"));
    }

    /// On cgroupfs the listing's inode numbers are the cgroup ids a stat gives (kernfs), in
    /// a cgroup tree of the test's own (a VM's hierarchy may have no other).
    #[test]
    fn cgroup_ids_from_the_listing_are_the_directories_inodes() {
        let test = "cgroup_ids_from_the_listing_are_the_directories_inodes";
        if !nix::unistd::geteuid().is_root() {
            return crate::skip(test, "needs root to make cgroups");
        }
        let layout = CgroupMounts::detect().unwrap();
        let top = layout.memory_root.join(format!("evictd-test-ids-{}", std::process::id()));
        struct Removed(PathBuf);
        impl Drop for Removed {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir(self.0.join("child"));
                let _ = std::fs::remove_dir(&self.0);
            }
        }
        let _cleanup = Removed(top.clone());
        std::fs::create_dir_all(top.join("child")).unwrap();
        let mut seen = Vec::new();
        walk(&top, &top, 0, &mut |id, p| seen.push((id, p)));
        let by_stat: Vec<(u64, String)> = ["", "child"]
            .iter()
            .map(|rel| (std::fs::metadata(top.join(rel)).unwrap().ino(), format!("/{rel}")))
            .collect();
        assert_eq!(seen, by_stat);
    }

    #[test]
    fn own_memcg_from_proc() {
        // On v1 the line that lists `memory`, on v2 the `0::` line (run in the VM matrix).
        let layout = CgroupMounts::detect().unwrap();
        let p = memcg_of_pid(std::process::id(), layout.memory_version);
        assert!(p.as_deref().is_some_and(|p| p.starts_with('/')), "{p:?}");
    }
}
