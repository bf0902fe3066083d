//! Teardown helpers for the private containerd: find what a test started (by its cgroups
//! and by its socket path on the command line), detach its mounts, remove its cgroup trees;
//! and what a killed test process left (`remove_what_killed_runs_left`), which no teardown
//! ran for. Nothing here touches what a test did not start.

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

/// The prefix of every private containerd's name: `evictd-e2e-<pid of the test process>-<n>`.
pub(crate) const RUN_PREFIX: &str = "evictd-e2e-";

/// Runs of the harness whose test process is gone (killed: a timeout, a SIGKILL, a CI job
/// cancelled), so that no teardown ran: their processes (in their cgroups, or shims serving
/// their socket) are killed, their mounts detached, their cgroup trees, `/tmp` and `/run`
/// directories removed. A run whose process is alive is another test's, and is left alone.
pub(crate) fn remove_what_killed_runs_left() {
    let mut names: Vec<String> = ["/tmp", "/run", "/sys/fs/cgroup/memory", "/sys/fs/cgroup"]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|entries| entries.flatten().filter_map(|e| e.file_name().into_string().ok()))
        .filter(|n| run_of_a_dead_process(n))
        .collect();
    names.sort();
    names.dedup();
    for name in names {
        eprintln!("removing what a killed test run left: {name}");
        let (tmp, run) = (Path::new("/tmp").join(&name), Path::new("/run").join(&name));
        thaw_freezer_tree(&Path::new("/sys/fs/cgroup/freezer").join(&name));
        let in_cgroups = ["memory", "pids", ""]
            .iter()
            .flat_map(|h| pids_in_tree(&Path::new("/sys/fs/cgroup").join(h).join(&name)));
        for pid in in_cgroups.chain(pids_with_cmdline(&format!("{}/", run.display()))) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        }
        detach_mounts_under(&[&tmp, &run]);
        remove_cgroup_trees(&name);
        let _ = std::fs::remove_dir_all(&run);
        let _ = std::fs::remove_dir_all(&tmp);
    }
}

/// Whether `name` is a run's (`RUN_PREFIX<pid>-<n>`) whose test process no longer exists.
fn run_of_a_dead_process(name: &str) -> bool {
    let Some((pid, n)) = name.strip_prefix(RUN_PREFIX).and_then(|rest| rest.split_once('-')) else {
        return false;
    };
    let numbers = pid.parse::<u32>().is_ok() && n.parse::<u32>().is_ok();
    numbers && !Path::new("/proc").join(pid).exists()
}

/// A v1 freezer cgroup (and those below it) thawed: a frozen task does not die of SIGKILL
/// until it is, and its cgroup cannot be removed (evictd's fast kill freezes a pod while it
/// kills it, and a killed run may have left it so).
fn thaw_freezer_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let _ = std::fs::write(dir.join("freezer.state"), "THAWED");
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            thaw_freezer_tree(&e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_runs_of_processes_that_are_gone_are_stale() {
        let alive = std::process::id();
        assert!(!run_of_a_dead_process(&format!("{RUN_PREFIX}{alive}-3")), "this process is alive");
        // PIDs never exceed 2^22 (pid_max's limit).
        assert!(run_of_a_dead_process(&format!("{RUN_PREFIX}{}-3", 1u32 << 23)));
        for other in ["evictd-e2e-x-3", "evictd-e2e-12", "evictd-test-12-3", "kubepods"] {
            assert!(!run_of_a_dead_process(other), "{other}");
        }
    }
}
