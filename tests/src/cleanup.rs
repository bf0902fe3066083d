//! Teardown helpers for the private containerd: find what a test started (by its cgroups
//! and by its socket path on the command line), detach its mounts, remove its cgroup trees.
//! Nothing here touches what a test did not start.

use std::{path::Path, time::Duration};

/// Every PID in `dir`'s cgroup and below it.
pub(crate) fn pids_in_tree(dir: &Path) -> Vec<i32> {
    let mut out: Vec<i32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(pids_in_tree(&e.path()));
            }
        }
    }
    out
}

/// PIDs whose command line mentions `needle` (our shims carry our socket path).
pub(crate) fn pids_with_cmdline(needle: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).replace('\0', " ").contains(needle))
        })
        .collect()
}

pub(crate) fn detach_mounts_under(roots: &[&Path]) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
    let mut points: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|p| roots.iter().any(|r| Path::new(p).starts_with(r)))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Removes /sys/fs/cgroup/<every hierarchy>/<name> (v1) or /sys/fs/cgroup/<name> (v2)
/// depth-first.
pub(crate) fn remove_cgroup_trees(name: &str) {
    let root = Path::new("/sys/fs/cgroup");
    let Ok(hierarchies) = std::fs::read_dir(root) else { return };
    let tops = hierarchies.flatten().map(|h| h.path().join(name)).chain([root.join(name)]);
    for top in tops.filter(|t| t.is_dir()) {
        remove_depth_first(&top);
    }
}

fn remove_depth_first(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_depth_first(&e.path());
            }
        }
    }
    for _ in 0..50 {
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("warning: could not remove cgroup {}", dir.display());
}
