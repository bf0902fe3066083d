//! The daemon keeps itself alive when the node is starved, which is when it is needed: the
//! kernel's OOM killer should pick anything but evictd (`oom_score_adj` −999, as the kubelet
//! sets for itself), and none of its pages may be reclaimed from under it (a page fault on
//! the decision path in a node short of memory waits for reclaim: `mlockall`). Each is said
//! once when the node does not permit it, and evictd runs on.

use std::io;

/// `--oom-score-adj`, `--lock-memory`.
#[derive(Clone, Copy, Debug)]
pub struct SelfProtection {
    /// `None`: left as inherited.
    pub oom_score_adj: Option<i16>,
    pub lock_memory: bool,
}

pub fn protect(p: SelfProtection) {
    if let Some(adj) = p.oom_score_adj {
        match std::fs::write("/proc/self/oom_score_adj", adj.to_string()) {
            Ok(()) => tracing::info!(oom_score_adj = adj, "the kernel's OOM killer spares evictd"),
            Err(e) => tracing::warn!(
                "cannot set evictd's oom_score_adj to {adj} ({e}; lowering it needs CAP_SYS_RESOURCE): \
                 the kernel's OOM killer may pick evictd"
            ),
        }
    }
    if p.lock_memory {
        match lock_memory() {
            Ok(()) => tracing::info!("evictd's memory is locked (mlockall, on fault)"),
            Err(e) => tracing::warn!(
                "cannot lock evictd's memory ({e}; it needs CAP_IPC_LOCK or RLIMIT_MEMLOCK): its pages \
                 can be reclaimed when the node is short of memory"
            ),
        }
    }
}

/// Locks every page evictd has and will have, as each is first touched (`MCL_ONFAULT`):
/// stacks and heap reserved but never used are not made resident.
fn lock_memory() -> io::Result<()> {
    // SAFETY: mlockall takes flags only and touches no memory of ours.
    let r = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Resident and locked memory of this process, in bytes (`VmRSS`, `VmLck`), for the log.
pub fn resident_and_locked() -> Option<(u64, u64)> {
    let status = procfs::process::Process::myself().ok()?.status().ok()?;
    Some((status.vmrss? * 1024, status.vmlck? * 1024))
}
