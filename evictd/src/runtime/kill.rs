//! The fast kill: evictd kills the pod's processes itself rather than waiting on the runtime
//! (containerd → shim → `runc kill` → exit → `runc delete`: 0.3–0.5 s on this machine), and
//! frees the largest victims' memory on its own CPU time with `process_mrelease(2)` while
//! they exit. The CRI stop still follows, for the runtime's bookkeeping (`evict`).
//!
//! Order matters for safety. Every process is pinned by a pidfd *before* it is checked to be
//! in the pod's cgroup: the pidfd names that one process, so a pid reused after the check can
//! never be signalled. With `cgroup.kill` the write comes first (pinning a fork-bombing pod
//! process by process before it would give the bomb a head start) and only the largest
//! processes are pinned after it, for `process_mrelease`: one reaped before its pidfd was open
//! is simply not reaped on evictd's side. Without it, every process is pinned before it is
//! signalled.
//!
//! How the pod dies, by what the node offers: `cgroup.kill` (cgroup v2, 5.14+; also on
//! hybrid v1 nodes, where runc places containers in the unified hierarchy too) kills the
//! whole tree in one write, forks included; else the v1 freezer holds the tree still while
//! each pinned process gets SIGKILL (runc's own fallback); else rounds of SIGKILL until a
//! listing finds no process that was not signalled already.

use std::{
    collections::BTreeMap,
    io,
    os::fd::{AsRawFd, OwnedFd},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};

use super::{inventory::PodRecord, usage::cgroup_rel_dir};
use crate::{
    node::{
        cgroup_names::{pid_in_cgroup, pid_under_cgroup},
        cgroups::{CgroupMounts, CgroupVersion},
    },
    vocab::{KillMethod, KillReport, OnKilled},
};

/// A v1 freezer may sit in FREEZING while a task is in an uninterruptible sleep; runc
/// retries for about as long.
const FREEZE_TIMEOUT: Duration = Duration::from_millis(100);
/// Listing and signalling rounds without a freezer or `cgroup.kill`: a fork bomb outruns
/// any number, but each round only has to catch what forked during the previous one.
const SIGNAL_ROUNDS: usize = 16;
/// Victims below this hold too little for reaping them on evictd's side to matter.
const REAP_MIN_BYTES: u64 = 1 << 20;

/// The largest victims reaped, at most, each on a blocking thread of its own: a pod of
/// thousands of processes (a fork bomb) must not make thousands of threads, and the
/// largest hold most of the memory.
pub const REAP_MAX: usize = 16;
/// How long the freezer kill (freeze, signal every process, thaw: ~`FREEZE_TIMEOUT` and
/// `SIGNAL_ROUNDS` of signals) may take on the blocking pool before the decision moves on.
const FREEZER_KILL_WAIT: Duration = Duration::from_secs(5);
/// How long a kill waits for its reaps: the caller waits for the cgroup to empty anyway,
/// and a reap that could not get a thread must not hold the pass.
const REAP_WAIT: Duration = Duration::from_secs(2);

/// Where and how the pod's processes can be killed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillTarget {
    /// The pod's cgroup relative to a hierarchy root, as `/proc/<pid>/cgroup` shows it.
    rel: PathBuf,
    /// The pod's memory cgroup directory: the processes are listed from its tree.
    memory: PathBuf,
    memory_version: CgroupVersion,
    /// `cgroup.kill` of the pod's cgroup2 directory, where the kernel has it.
    cgroup_kill: Option<PathBuf>,
    /// The pod's v1 freezer directory, where that controller is mounted.
    freezer: Option<PathBuf>,
    /// evictd itself: a pod that holds it is never killed, whatever the engine was told.
    spare: i32,
}

#[derive(Debug, thiserror::Error)]
pub enum KillError {
    #[error("the pod has no cgroup parent: its processes cannot be found")]
    NoCgroup,
    #[error("listing the pod's processes in {}: {source}", path.display())]
    List { path: PathBuf, source: io::Error },
    #[error("writing {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("the kill task on the blocking pool failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("the freezer kill did not end within {0:?} (a kernel lock, or no blocking thread free for it)")]
    Stuck(Duration),
    #[error("not killed: {} holds evictd itself (pid {pid})", path.display())]
    HoldsEvictd { path: PathBuf, pid: i32 },
}

impl KillTarget {
    /// The pod's cgroups on this node's layout.
    pub fn of(rec: &PodRecord, layout: &CgroupMounts) -> Result<Self, KillError> {
        let rel = cgroup_rel_dir(rec.cgroup_parent.as_deref().ok_or(KillError::NoCgroup)?);
        Ok(Self::at(&rel, layout))
    }

    /// The target for the cgroup at `rel` (relative to each hierarchy's root).
    pub fn at(rel: &Path, layout: &CgroupMounts) -> Self {
        let v2_dir = match layout.memory_version {
            CgroupVersion::V2 => Some(layout.memory_root.join(rel)),
            CgroupVersion::V1 => layout.unified_root.as_ref().map(|u| u.join(rel)),
        };
        let freezer = match layout.memory_version {
            CgroupVersion::V1 => layout.memory_root.parent().map(|p| p.join("freezer").join(rel)),
            CgroupVersion::V2 => None,
        };
        KillTarget {
            rel: Path::new("/").join(rel),
            memory: layout.memory_root.join(rel),
            memory_version: layout.memory_version,
            cgroup_kill: v2_dir.map(|d| d.join("cgroup.kill")).filter(|f| f.exists()),
            freezer: freezer.filter(|d| d.join("freezer.state").exists()),
            spare: std::process::id() as i32,
        }
    }

    /// The pod's memory cgroup directory.
    pub fn memory_dir(&self) -> &Path {
        &self.memory
    }

    /// The memory controller on cgroup v1, with the pod's cgroup2 directory beside it.
    fn is_hybrid(&self) -> bool {
        self.memory_version == CgroupVersion::V1 && self.cgroup_kill.is_some()
    }

    /// The method the node offers (`kill` may fall back from it).
    fn method(&self) -> KillMethod {
        match (&self.cgroup_kill, &self.freezer) {
            (Some(_), _) => KillMethod::CgroupKill,
            (None, Some(_)) => KillMethod::Freezer,
            (None, None) => KillMethod::Signals,
        }
    }
}

/// A process of the pod, pinned.
struct Victim {
    fd: OwnedFd,
    rss_bytes: u64,
}

/// Kills every process of the pod, then frees the largest victims' memory in parallel with
/// their own exit; `on_killed` is called once every process is signalled. Returns once
/// every reap has ended (at most `REAP_WAIT`); the caller waits for the cgroup to empty as
/// for any stop.
pub async fn fast_kill(target: &KillTarget, on_killed: Option<&OnKilled>) -> Result<KillReport, KillError> {
    let t = Instant::now();
    let (method, victims) = match target.method() {
        // Waiting for the freezer may take a while: on the blocking pool.
        KillMethod::Freezer => {
            let owned = target.clone();
            tokio::time::timeout(FREEZER_KILL_WAIT, tokio::task::spawn_blocking(move || kill(&owned)))
                .await
                .map_err(|_| KillError::Stuck(FREEZER_KILL_WAIT))???
        }
        // One write, or a few signals: on the daemon's own (real-time) thread, with no
        // hand-off to a thread the scheduler may run late.
        KillMethod::CgroupKill | KillMethod::Signals => kill(target)?,
    };
    let signalled_ms = ms(t);
    // It hands its work off (the charge programs' detach may wait on a kernel lock another
    // BPF user holds): asked for here, in order with the passes' requests.
    if let Some(f) = on_killed {
        f.call();
    }
    let processes = victims.len();
    let reaped = reap(victims).await;
    Ok(KillReport { method, processes, signalled_ms, reaped, reaped_ms: ms(t) })
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Kills the pod by the best method the node has; a method that fails gives way to rounds
/// of signals. Returns the method that did it, and the processes pinned for reaping.
fn kill(target: &KillTarget) -> Result<(KillMethod, Vec<Victim>), KillError> {
    let mut pinned = BTreeMap::new();
    if let Some(file) = &target.cgroup_kill {
        // `cgroup.kill` first: pinning a fork-bombing pod's processes one by one before it
        // would give the bomb a head start. evictd's own process is looked for before it,
        // by listing the trees, with no per-process work.
        not_evictds(target)?;
        match write(file, "1") {
            Ok(()) => {
                // A hybrid node's v1 memory tree, which evictd lists, is not the cgroup2 tree
                // the write killed: a process the runtime put in the v1 tree alone is pinned
                // and signalled here, so that it cannot survive.
                let beyond = match (target.memory_version, file.parent()) {
                    (CgroupVersion::V1, Some(killed)) => pin_beyond_the_write(target, killed, &mut pinned),
                    _ => Ok(()),
                };
                // Only the largest are pinned for process_mrelease: a pod of thousands of
                // processes costs one listing and a statm read each, not a pidfd and two
                // reads each.
                let largest = pin_largest(target, REAP_MAX, REAP_MIN_BYTES, &mut pinned);
                // What joined the pod's cgroup2 tree since the write (a `runc exec`, or a
                // child forked across it on a kernel without the fork race's fix) was not
                // killed, and was listed above as dying: a second write kills it (the dying
                // are skipped).
                let again = write(file, "1");
                if let Err(e) = beyond.and(largest).and(again) {
                    tracing::warn!("after cgroup.kill, the pod's processes could not all be looked at: {e}");
                }
                // The kill of what cgroup.kill did not reach; for the rest, it repeats the
                // kernel's SIGKILL (harmless).
                signal_all(pinned.values());
                return Ok((KillMethod::CgroupKill, pinned.into_values().collect()));
            }
            Err(e) => tracing::warn!("{e}: killing the pod in rounds of signals instead"),
        }
    }
    pin_new(target, &mut pinned)?;
    let tried = match (&target.cgroup_kill, &target.freezer) {
        (None, Some(dir)) => freeze_kill_thaw(target, dir, &mut pinned),
        _ => Ok(KillMethod::Signals),
    };
    let method = tried.unwrap_or_else(|e| {
        tracing::warn!("{e}: killing the pod in rounds of signals instead");
        KillMethod::Signals
    });
    if method == KillMethod::Signals {
        signal_rounds(target, &mut pinned)?;
    }
    Ok((method, pinned.into_values().collect()))
}

/// Freeze, SIGKILL every pinned process, thaw. A freezer stuck in FREEZING makes it
/// `Signals` (the caller then kills in rounds).
fn freeze_kill_thaw(
    target: &KillTarget,
    dir: &Path,
    pinned: &mut BTreeMap<i32, Victim>,
) -> Result<KillMethod, KillError> {
    let state = dir.join("freezer.state");
    let frozen = freeze(&state);
    if matches!(frozen, Ok(false)) {
        tracing::warn!("{} did not reach FROZEN within {FREEZE_TIMEOUT:?}", state.display());
    }
    // Frozen, nothing forks: what is listed now is everything.
    let listed = pin_new(target, pinned);
    signal_all(pinned.values());
    // Fatal signals are delivered once the tasks run again (v1 freezer semantics): thaw
    // whatever happened above.
    let thawed = write(&state, "THAWED");
    listed?;
    thawed?;
    Ok(if frozen? { KillMethod::Freezer } else { KillMethod::Signals })
}

/// Writes FROZEN and waits for the state to read FROZEN, writing it again as runc does.
/// Runs on the blocking pool (see `fast_kill`).
#[expect(clippy::disallowed_methods, reason = "on the blocking pool, never the daemon's thread")]
fn freeze(state: &Path) -> Result<bool, KillError> {
    let t = Instant::now();
    loop {
        write(state, "FROZEN")?;
        let now = std::fs::read_to_string(state)
            .map_err(|source| KillError::List { path: state.to_path_buf(), source })?;
        if now.trim() == "FROZEN" {
            return Ok(true);
        }
        if t.elapsed() > FREEZE_TIMEOUT {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Lists, pins and signals until a listing finds nothing new.
fn signal_rounds(target: &KillTarget, pinned: &mut BTreeMap<i32, Victim>) -> Result<(), KillError> {
    signal_all(pinned.values());
    for _ in 0..SIGNAL_ROUNDS {
        let before = pinned.len();
        pin_new(target, pinned)?;
        if pinned.len() == before {
            return Ok(());
        }
        signal_all(pinned.values());
    }
    tracing::warn!(cgroup = %target.memory.display(), "the pod still forks after {SIGNAL_ROUNDS} rounds of SIGKILL");
    Ok(())
}

fn signal_all<'a>(victims: impl Iterator<Item = &'a Victim>) {
    for v in victims {
        // ESRCH: it has exited meanwhile, which is the point.
        let _ = pidfd_send_signal(&v.fd, Signal::KILL);
    }
}

/// The pod's cgroup trees do not hold evictd's own process (checked before any signal).
fn not_evictds(target: &KillTarget) -> Result<(), KillError> {
    // On a hybrid node the write kills the cgroup2 tree, which evictd's process could be in
    // without being in the v1 one.
    let killed = target.cgroup_kill.as_deref().and_then(Path::parent).filter(|_| target.is_hybrid());
    let trees = std::iter::once((target.memory.as_path(), target.memory_version))
        .chain(killed.map(|k| (k, CgroupVersion::V2)));
    for (tree, version) in trees {
        if tree_holds(tree, &target.rel, version, target.spare)? {
            return Err(KillError::HoldsEvictd { path: tree.to_path_buf(), pid: target.spare });
        }
    }
    Ok(())
}

/// Whether the pod's tree `tree` (`rel` in hierarchy `version`) holds the process `pid`.
/// Answered from the process's own `/proc/<pid>/cgroup` where that tells: one read, whatever
/// the tree's depth or breadth (a tenant with a writable cgroupfs can nest its tree past
/// PATH_MAX, where every listing of it fails; were that read as "holds evictd", the stop
/// would fail and the next candidate, another tenant's pod, be taken). Listed otherwise.
fn tree_holds(tree: &Path, rel: &Path, version: CgroupVersion, pid: i32) -> Result<bool, KillError> {
    if let Some(under) = cgroup_of_pid_tells(pid, rel, version) {
        return Ok(under);
    }
    let mut pids = Vec::new();
    list_tree(tree, &mut pids)?;
    Ok(pids.contains(&pid))
}

/// Whether `pid` is in the cgroup `rel` or below it, from its `/proc/<pid>/cgroup`; `None`
/// where that cannot tell. The paths there are relative to the reader's cgroup namespace:
/// only in the initial one (the host's) are they where the pod's `rel` is; in a private one
/// a path (`/`, `/init`, `/../..`) says nothing of the pod trees, and the tree is listed.
fn cgroup_of_pid_tells(pid: i32, rel: &Path, version: CgroupVersion) -> Option<bool> {
    if !in_initial_cgroup_namespace() {
        return None;
    }
    pid_under_cgroup(u32::try_from(pid).ok()?, rel, version)
}

/// Whether this thread (whose namespace `/proc/<pid>/cgroup` is read in) is in the initial
/// cgroup namespace: its namespace's inode is the one the kernel gives the initial namespace
/// (`PROC_CGROUP_INIT_INO`), never any other.
fn in_initial_cgroup_namespace() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    const PROC_CGROUP_INIT_INO: u64 = 0xEFFF_FFFB;
    std::fs::metadata("/proc/thread-self/ns/cgroup").is_ok_and(|m| m.ino() == PROC_CGROUP_INIT_INO)
}

/// The pids of the pod's memory cgroup tree, refused when evictd's own is among them:
/// checked on every listing, and the first comes before any signal.
fn pod_pids(target: &KillTarget) -> Result<Vec<i32>, KillError> {
    let mut pids = Vec::new();
    list_tree(&target.memory, &mut pids)?;
    match pids.contains(&target.spare) {
        true => Err(KillError::HoldsEvictd { path: target.memory.clone(), pid: target.spare }),
        false => Ok(pids),
    }
}

/// Pins every process of the pod's cgroup tree that is not pinned yet and is still in the
/// pod's cgroup once pinned.
fn pin_new(target: &KillTarget, pinned: &mut BTreeMap<i32, Victim>) -> Result<(), KillError> {
    let pids = pod_pids(target)?;
    for pid in pids {
        if pinned.contains_key(&pid) {
            continue;
        }
        if let Some(v) = pin(pid, target) {
            pinned.insert(pid, v);
        }
    }
    Ok(())
}

/// Pins the processes of the pod's v1 memory tree that are not in the cgroup2 tree at
/// `killed`, whose `cgroup.kill` was written: those the kernel did not kill. The cgroup2 tree
/// is listed first: a process in both that exits between the listings is then in neither
/// (one css_set leaves every hierarchy at once). A cgroup2 tree that cannot be listed
/// excludes nobody: every process of the v1 tree is then pinned and signalled.
fn pin_beyond_the_write(
    target: &KillTarget,
    killed: &Path,
    pinned: &mut BTreeMap<i32, Victim>,
) -> Result<(), KillError> {
    let mut dying = Vec::new();
    if let Err(e) = list_tree(killed, &mut dying) {
        tracing::warn!("{e}: every process of the pod's v1 memory tree is signalled");
        dying.clear();
    }
    let dying: std::collections::HashSet<i32> = dying.into_iter().collect();
    let pids = pod_pids(target)?;
    for pid in pids.into_iter().filter(|p| !dying.contains(p)) {
        if let Some(v) = pin(pid, target) {
            pinned.insert(pid, v);
        }
    }
    Ok(())
}

/// Pins the `max` processes of the pod's cgroup tree with the most resident memory (each at
/// least `min_bytes`): the ones whose reaping on evictd's side frees the most.
fn pin_largest(
    target: &KillTarget,
    max: usize,
    min_bytes: u64,
    pinned: &mut BTreeMap<i32, Victim>,
) -> Result<(), KillError> {
    let pids = pod_pids(target)?;
    let mut sized: Vec<(u64, i32)> = pids.into_iter().map(|pid| (private_resident_bytes(pid), pid)).collect();
    sized.retain(|(rss, pid)| *rss >= min_bytes && !pinned.contains_key(pid));
    sized.sort_unstable_by(|a, b| b.cmp(a));
    for (_, pid) in sized.into_iter().take(max) {
        // Killed already by the kernel: one gone from the cgroup by now is just not reaped.
        if let Some(v) = pin_checked(pid, target) {
            pinned.insert(pid, v);
        }
    }
    Ok(())
}

/// The process's resident memory (0 once it is gone).
fn resident_bytes(pid: i32) -> u64 {
    procfs::process::Process::new(pid).and_then(|p| p.statm()).map_or(0, |s| s.resident * procfs::page_size())
}

/// The resident memory no other process maps (resident less shared: file and shmem pages),
/// what `process_mrelease` frees; 0 once the process is gone.
fn private_resident_bytes(pid: i32) -> u64 {
    procfs::process::Process::new(pid)
        .and_then(|p| p.statm())
        .map_or(0, |s| s.resident.saturating_sub(s.shared) * procfs::page_size())
}

/// A pidfd for `pid` if, once pinned, the process is in the pod's cgroup. The check reads
/// `/proc/<pid>` after the pidfd is open: the pid cannot name another process while the
/// pinned one lives, and a pinned process that died meanwhile cannot be signalled.
fn pin(pid: i32, target: &KillTarget) -> Option<Victim> {
    let victim = pin_checked(pid, target);
    if victim.is_none() && pid_alive(pid) {
        tracing::warn!(pid, pod_cgroup = %target.rel.display(), "not killed: no longer in the pod's cgroup");
    }
    victim
}

/// `pin` without a word: the pidfd, if the process is in the pod's cgroup once pinned.
fn pin_checked(pid: i32, target: &KillTarget) -> Option<Victim> {
    let fd = pidfd_open(Pid::from_raw(pid)?, PidfdFlags::empty()).ok()?;
    // A process that is exiting (a killed one, say) reads `/` on every v1 line of
    // /proc/<pid>/cgroup, while its cgroup2 line keeps its path: on a hybrid node that line
    // counts too, or the victims cgroup.kill just killed could never be reaped.
    let in_pod = pid_in_cgroup(pid as u32, &target.rel, target.memory_version)
        || (target.is_hybrid() && pid_in_cgroup(pid as u32, &target.rel, CgroupVersion::V2));
    if !in_pod {
        return None;
    }
    Some(Victim { fd, rss_bytes: resident_bytes(pid) })
}

fn pid_alive(pid: i32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// Whether the pod's cgroup trees hold evictd's own process (`tree_holds`). One that cannot
/// be told about counts as holding it: a pod evictd cannot tell about is not one it may stop
/// blind.
pub fn holds_evictd(target: &KillTarget) -> bool {
    not_evictds(target).is_err()
}

/// The pids of every `cgroup.procs` in the tree at `dir`. A cgroup removed while it is read
/// has no processes left to list.
fn list_tree(dir: &Path, pids: &mut Vec<i32>) -> Result<(), KillError> {
    let procs = dir.join("cgroup.procs");
    match std::fs::read_to_string(&procs) {
        Ok(s) => pids.extend(s.lines().filter_map(|l| l.trim().parse::<i32>().ok())),
        Err(e) if removed(&e) => return Ok(()),
        Err(source) => return Err(KillError::List { path: procs, source }),
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if removed(&e) => return Ok(()),
        Err(source) => return Err(KillError::List { path: dir.to_path_buf(), source }),
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            list_tree(&entry.path(), pids)?;
        }
    }
    Ok(())
}

/// ENOENT before the open; ENODEV when kernfs removed the cgroup between open and read.
pub(super) fn removed(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENODEV)
}

fn write(path: &Path, value: &str) -> Result<(), KillError> {
    std::fs::write(path, value).map_err(|source| KillError::Write { path: path.to_path_buf(), source })
}

/// Frees the victims' memory from evictd's side, largest first, all at once on the blocking
/// pool: each `process_mrelease` does the exit's unmapping work for its victim, so a victim
/// starved of CPU does not hold the node's memory hostage. Returns how many were reaped.
async fn reap(mut victims: Vec<Victim>) -> usize {
    victims.sort_by_key(|v| std::cmp::Reverse(v.rss_bytes));
    let mut reaps = tokio::task::JoinSet::new();
    for v in victims.into_iter().filter(|v| v.rss_bytes >= REAP_MIN_BYTES).take(REAP_MAX) {
        reaps.spawn_blocking(move || process_mrelease(&v.fd));
    }
    let mut reaped = 0;
    let joined = tokio::time::timeout(REAP_WAIT, async {
        while let Some(r) = reaps.join_next().await {
            match r {
                Ok(Ok(())) => reaped += 1,
                // The victim finished its own teardown first.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Ok(Err(e)) => tracing::debug!("process_mrelease: {e}"),
                Err(e) => tracing::debug!("process_mrelease task: {e}"),
            }
        }
    })
    .await;
    if joined.is_err() {
        // Reaps under way go on where they run; those still queued (every blocking thread
        // busy, and the kernel refusing a new one or the pool at its cap) are dropped.
        tracing::warn!(
            reaped,
            left = reaps.len(),
            "reaps still running or queued after {REAP_WAIT:?}: not waited for"
        );
    }
    reaped
}

/// `process_mrelease(2)` (Linux 5.15+): reap the address space of a process that has a
/// SIGKILL pending. `ESRCH`: it is gone already; `EINVAL`: no SIGKILL pending.
fn process_mrelease(pidfd: &OwnedFd) -> io::Result<()> {
    // SAFETY: the syscall takes an fd and a flags word (0) and touches no memory of ours;
    // `pidfd` is open for the duration of the call.
    let r = unsafe { libc::syscall(libc::SYS_process_mrelease, pidfd.as_raw_fd(), 0) };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{
        collections::BTreeSet,
        os::unix::process::ExitStatusExt as _,
        process::{Child, Command},
        sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        },
    };

    use rusty_fork::rusty_fork_test;

    use super::*;

    /// A pod-like cgroup of this test's own, in the memory, freezer and unified hierarchies,
    /// with `sleep` processes the test started; removed (processes killed by pid) on drop.
    pub(crate) struct TestPod {
        pub(crate) rel: PathBuf,
        dirs: Vec<PathBuf>,
        children: Vec<Child>,
        /// The pod as the kill sees it, for the clean-up of what the children forked.
        target: KillTarget,
    }

    static NEXT: AtomicUsize = AtomicUsize::new(0);

    impl TestPod {
        pub(crate) fn new(layout: &CgroupMounts, processes: usize) -> Self {
            let rel = PathBuf::from(format!(
                "evictd-kill-test-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let mut dirs = vec![layout.memory_root.join(&rel)];
            if let Some(freezer) = layout
                .memory_root
                .parent()
                .map(|p| p.join("freezer"))
                .filter(|d| layout.memory_version == CgroupVersion::V1 && d.is_dir())
            {
                dirs.push(freezer.join(&rel));
            }
            if let Some(u) = &layout.unified_root
                && layout.memory_version == CgroupVersion::V1
            {
                dirs.push(u.join(&rel));
            }
            for d in &dirs {
                std::fs::create_dir(d).unwrap();
            }
            let target = KillTarget::at(&rel, layout);
            let mut pod = TestPod { rel, dirs, children: Vec::new(), target };
            for _ in 0..processes {
                let child = pod.spawn_sleep();
                pod.adopt(child);
            }
            pod
        }

        /// `child`, started by the test, moved into every hierarchy of the pod.
        fn adopt(&mut self, child: Child) {
            for d in &self.dirs {
                std::fs::write(d.join("cgroup.procs"), child.id().to_string()).unwrap();
            }
            self.children.push(child);
        }

        /// `child` moved into the pod's memory cgroup alone, as a runtime that left it out of
        /// the other hierarchies would.
        fn adopt_into_memory_alone(&mut self, child: Child) {
            std::fs::write(self.dirs[0].join("cgroup.procs"), child.id().to_string()).unwrap();
            self.children.push(child);
        }

        fn spawn_sleep(&self) -> Child {
            Command::new("sleep").arg("600").spawn().unwrap()
        }

        /// Every process of the pod ended by SIGKILL within a few seconds.
        #[expect(
            clippy::disallowed_methods,
            reason = "polls test children; nothing else runs on this thread"
        )]
        fn all_killed(&mut self) -> bool {
            let t = Instant::now();
            self.children.iter_mut().all(|c| {
                loop {
                    if let Some(status) = c.try_wait().unwrap() {
                        break status.signal() == Some(libc::SIGKILL);
                    }
                    if t.elapsed() > Duration::from_secs(5) {
                        break false;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        }
    }

    impl Drop for TestPod {
        #[expect(clippy::disallowed_methods, reason = "waits for the kernel to let go of test cgroups")]
        fn drop(&mut self) {
            // What the children forked and left in the pod (a test that failed before its
            // kill) is killed while the pod may still be frozen (it cannot fork meanwhile),
            // and pinned as the kill pins: a pid listed here that exits and is reused by
            // another process of the machine is never signalled.
            if let Some(file) = &self.target.cgroup_kill {
                let _ = std::fs::write(file, "1");
            }
            let mut left = BTreeMap::new();
            let _ = pin_new(&self.target, &mut left);
            signal_all(left.values());
            // A frozen process dies once it runs again.
            if let Some(freezer) = self.dirs.iter().find(|d| d.join("freezer.state").exists()) {
                let _ = std::fs::write(freezer.join("freezer.state"), "THAWED");
            }
            for c in &mut self.children {
                let _ = c.kill();
                let _ = c.wait();
            }
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5) {
                let before = left.len();
                let _ = pin_new(&self.target, &mut left);
                if left.len() == before {
                    break;
                }
                signal_all(left.values());
                std::thread::sleep(Duration::from_millis(10));
            }
            for d in &self.dirs {
                let t = Instant::now();
                while std::fs::remove_dir(d).is_err() && t.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    pub(crate) fn layout_or_skip(test: &str) -> Option<CgroupMounts> {
        if !nix::unistd::geteuid().is_root() {
            crate::skip(test, "needs root to make cgroups");
            return None;
        }
        match CgroupMounts::detect() {
            Ok(l) => Some(l),
            Err(e) => {
                crate::skip(test, &format!("no cgroups: {e}"));
                None
            }
        }
    }

    /// A test pod of `processes` on a hybrid node (the memory controller on cgroup v1, beside
    /// a cgroup2 mount whose `cgroup.kill` the kill writes), and its target; anywhere else
    /// `None`, the skip said.
    fn hybrid_pod_or_skip(test: &str, processes: usize) -> Option<(TestPod, KillTarget)> {
        let layout = layout_or_skip(test)?;
        if layout.memory_version != CgroupVersion::V1 || layout.unified_root.is_none() {
            crate::skip(test, "not a hybrid node (the memory controller on cgroup v1, and a cgroup2 mount)");
            return None;
        }
        let pod = TestPod::new(&layout, processes);
        let target = KillTarget::at(&pod.rel, &layout);
        if !target.is_hybrid() {
            crate::skip(test, "no cgroup.kill in the unified hierarchy (kernel < 5.14)");
            return None;
        }
        Some((pod, target))
    }

    /// Kills the pod with `target`'s method and checks that every process of the pod died by
    /// SIGKILL while a process outside it (a bystander started the same way) lives on.
    async fn kills_the_pod_and_nothing_else(pod: &mut TestPod, target: &KillTarget, method: KillMethod) {
        let mut bystander = pod.spawn_sleep();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let on_killed = OnKilled::new(move || {
            counted.fetch_add(1, Ordering::Relaxed);
        });
        let report = fast_kill(target, Some(&on_killed)).await;
        let bystander_lived = bystander.try_wait().unwrap().is_none();
        // Ended before any assertion: a failing one must not leave it running.
        let _ = bystander.kill();
        let _ = bystander.wait();
        let report = report.unwrap();
        assert_eq!(report.method, method);
        let deadline = Instant::now() + Duration::from_secs(5);
        while calls.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(calls.load(Ordering::Relaxed), 1, "on_killed runs once per kill");
        match method {
            // Pinned after the kill: the ones still dying then.
            KillMethod::CgroupKill => assert!(report.processes <= pod.children.len(), "{report:?}"),
            _ => assert_eq!(report.processes, pod.children.len()),
        }
        assert!(pod.all_killed(), "a process of the pod survived the {method:?} kill");
        assert!(bystander_lived, "the bystander was killed");
    }

    /// After `cgroup.kill` on cgroup v2 only the largest processes are pinned, and only those
    /// of the pod: a pod of thousands costs evictd no pidfd for each.
    #[test]
    #[expect(clippy::disallowed_methods, reason = "waits for a test child; nothing else runs on this thread")]
    fn only_the_largest_processes_are_pinned_for_reaping() {
        let Some(layout) = layout_or_skip("only_the_largest_processes_are_pinned_for_reaping") else {
            return;
        };
        let mut pod = TestPod::new(&layout, 5);
        // One process of the pod holding 16 MB of its own (a shell variable), the rest `sleep`.
        // The shell waits for a line before it allocates: in the pod's cgroup first, so its
        // pipeline (`head`, `tr`) runs there too and is gone before the pinning.
        let mut big = Command::new("sh")
            .args(["-c", "read go; x=$(head -c 16000000 /dev/zero | tr '\\0' a); read y"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let big_pid = big.id() as i32;
        let mut go = big.stdin.take().unwrap();
        pod.adopt(big);
        io::Write::write_all(&mut go, b"go\n").unwrap();
        let t = Instant::now();
        let target = KillTarget::at(&pod.rel, &layout);
        // Held, and its pipeline (`head`, `tr` and the subshell: processes of the pod too)
        // gone: the pod is the test's own processes and nothing else.
        let ours: BTreeSet<i32> = pod.children.iter().map(|c| c.id() as i32).collect();
        let listed = || {
            let mut pids = Vec::new();
            list_tree(&target.memory, &mut pids).map(|()| pids.into_iter().collect::<BTreeSet<i32>>())
        };
        let held = || private_resident_bytes(big_pid) >= 15_000_000;
        let mut pinned = BTreeMap::new();
        let mut tries = 0;
        loop {
            // The test's set-up, not its subject: generous for an emulated VM on a busy host.
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the shell never held its 16 MB: {}",
                sizes(&target)
            );
            if !held() || listed().ok().as_ref() != Some(&ours) {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            pinned.clear();
            pin_largest(&target, 1, 0, &mut pinned).unwrap();
            if pinned.keys().eq([&big_pid]) {
                break;
            }
            // Once in the VM matrix (Linux 6.1) the shell's memory read 4 KiB at the pinning,
            // just after it read 16 MB: a wrong pick is tried again, a few times, in case the
            // reading changed under the pinning; a wrong pick every time is the failure.
            tries += 1;
            assert!(
                tries < 5,
                "the largest alone, in none of 5 tries; pinned {:?}; the pod: {}",
                pinned.keys(),
                sizes(&target)
            );
            eprintln!("a wrong pick ({:?}), tried again; the pod: {}", pinned.keys(), sizes(&target));
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut pinned = BTreeMap::new();
        pin_largest(&target, 3, 0, &mut pinned).unwrap();
        assert_eq!(pinned.len(), 3, "at most the number asked for");
        assert!(pinned.keys().all(|p| ours.contains(p)), "only the pod's processes: {:?}", pinned.keys());
        let mut none = BTreeMap::new();
        pin_largest(&target, 16, u64::MAX, &mut none).unwrap();
        assert!(none.is_empty(), "below the minimum size nothing is pinned");
        drop(go);
    }

    /// Each process of the pod with its private resident bytes, for a failure's message.
    fn sizes(target: &KillTarget) -> String {
        let mut pids = Vec::new();
        let listed = list_tree(&target.memory, &mut pids);
        let comm = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let each: Vec<String> =
            pids.iter().map(|&p| format!("{p} {} {}", comm(p).trim(), private_resident_bytes(p))).collect();
        format!("{listed:?}: {}", each.join(", "))
    }

    #[tokio::test]
    async fn cgroup_kill_kills_the_whole_pod() {
        let Some(layout) = layout_or_skip("cgroup_kill_kills_the_whole_pod") else { return };
        let mut pod = TestPod::new(&layout, 3);
        let target = KillTarget::at(&pod.rel, &layout);
        if target.cgroup_kill.is_none() {
            crate::skip(
                "cgroup_kill_kills_the_whole_pod",
                "no cgroup.kill in the unified hierarchy (kernel < 5.14)",
            );
            return;
        }
        kills_the_pod_and_nothing_else(&mut pod, &target, KillMethod::CgroupKill).await;
    }

    /// `cgroup.kill` comes before any pinning, and only the largest processes are pinned after
    /// it: a pod forking as fast as it can (a shell starting `sleep`s) dies in the one write,
    /// with whatever it forked while it was being killed, and costs evictd no pidfd for each
    /// of its hundreds of processes (pinning them first gave the fork bomb that long a head
    /// start). Its processes are all small: none is pinned for reaping.
    #[tokio::test]
    async fn a_forking_pod_dies_in_one_write_and_is_not_pinned_process_by_process() {
        const TEST: &str = "a_forking_pod_dies_in_one_write_and_is_not_pinned_process_by_process";
        let Some(layout) = layout_or_skip(TEST) else { return };
        let mut pod = TestPod::new(&layout, 0);
        let target = KillTarget::at(&pod.rel, &layout);
        if target.cgroup_kill.is_none() {
            return crate::skip(TEST, "no cgroup.kill in the unified hierarchy (kernel < 5.14)");
        }
        let mut forker = Command::new("sh")
            .args(["-c", "read go; i=0; while [ $i -lt 600 ]; do sleep 600 & i=$((i+1)); done; wait"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut go = forker.stdin.take().unwrap();
        pod.adopt(forker);
        io::Write::write_all(&mut go, b"go\n").unwrap();
        let listed = || {
            let mut pids = Vec::new();
            list_tree(&target.memory, &mut pids).map(|()| pids.len()).unwrap_or(0)
        };
        // Set-up and clean-up, not the subject: generous for an emulated VM on a busy host.
        let patience = Duration::from_secs(60);
        let t = Instant::now();
        while listed() < 200 {
            assert!(t.elapsed() < patience, "the shell forked only {} processes", listed());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let report = fast_kill(&target, None).await.unwrap();
        assert_eq!(report.method, KillMethod::CgroupKill);
        assert!(
            report.processes <= REAP_MAX,
            "{} processes pinned for a pod of hundreds of small ones (at most {REAP_MAX}, the largest)",
            report.processes
        );
        assert!(pod.all_killed(), "the forking shell survived the kill");
        let t = Instant::now();
        while listed() > 0 {
            assert!(t.elapsed() < patience, "{} processes of the pod outlived the kill", listed());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// On a hybrid node the write kills the pod's cgroup2 tree: a process the runtime put in
    /// the pod's v1 memory cgroup alone is not in it, and is killed by its pidfd, while the
    /// pod's processes the write killed are not pinned one by one.
    #[tokio::test]
    async fn a_process_outside_the_cgroup2_tree_dies_with_the_pod() {
        const TEST: &str = "a_process_outside_the_cgroup2_tree_dies_with_the_pod";
        let Some((mut pod, target)) = hybrid_pod_or_skip(TEST, 3) else { return };
        let alone = pod.spawn_sleep();
        pod.adopt_into_memory_alone(alone);
        let report = fast_kill(&target, None).await.unwrap();
        assert_eq!(report.method, KillMethod::CgroupKill);
        assert_eq!(report.processes, 1, "only the process the write did not reach is pinned");
        assert!(pod.all_killed(), "a process of the pod survived");
    }

    /// An exiting process reads `/` on every v1 line of `/proc/<pid>/cgroup` while its
    /// cgroup2 line keeps the pod's path: on a hybrid node it is still found in the pod, so a
    /// victim `cgroup.kill` just killed, whose exit is under way, can be pinned and reaped.
    /// A zombie of the test's own (killed, not yet waited for) is such a process, and stays
    /// one for as long as the test needs.
    #[test]
    fn an_exiting_process_of_a_hybrid_pod_is_still_pinned() {
        const TEST: &str = "an_exiting_process_of_a_hybrid_pod_is_still_pinned";
        let Some((mut pod, target)) = hybrid_pod_or_skip(TEST, 1) else { return };
        let pid = pod.children[0].id() as i32;
        pod.children[0].kill().unwrap();
        let exited =
            || procfs::process::Process::new(pid).and_then(|p| p.stat()).is_ok_and(|s| s.state == 'Z');
        let t = Instant::now();
        while !exited() {
            assert!(t.elapsed() < Duration::from_secs(5), "the killed child did not become a zombie");
            std::thread::yield_now();
        }
        let lines = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let memory = lines
            .lines()
            .find(|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "memory")))
            .expect("a v1 memory line");
        assert!(memory.ends_with(":/"), "the premise: an exiting process reads `/` on v1: {lines}");
        assert!(pin_checked(pid, &target).is_some(), "the exiting process is not pinned: {lines}");
    }

    #[tokio::test]
    async fn the_v1_freezer_holds_the_pod_while_it_is_killed() {
        let Some(layout) = layout_or_skip("the_v1_freezer_holds_the_pod_while_it_is_killed") else { return };
        let mut pod = TestPod::new(&layout, 3);
        let target = KillTarget { cgroup_kill: None, ..KillTarget::at(&pod.rel, &layout) };
        let Some(freezer) = target.freezer.clone() else {
            crate::skip("the_v1_freezer_holds_the_pod_while_it_is_killed", "no v1 freezer hierarchy");
            return;
        };
        kills_the_pod_and_nothing_else(&mut pod, &target, KillMethod::Freezer).await;
        let state = std::fs::read_to_string(freezer.join("freezer.state")).unwrap();
        assert_eq!(state.trim(), "THAWED", "the pod's freezer must be thawed after the kill");
    }

    #[tokio::test]
    async fn rounds_of_signals_without_freezer_or_cgroup_kill() {
        let Some(layout) = layout_or_skip("rounds_of_signals_without_freezer_or_cgroup_kill") else { return };
        let mut pod = TestPod::new(&layout, 3);
        let target = KillTarget { cgroup_kill: None, freezer: None, ..KillTarget::at(&pod.rel, &layout) };
        kills_the_pod_and_nothing_else(&mut pod, &target, KillMethod::Signals).await;
    }

    /// A `cgroup.kill` that cannot be written (a kernel that refuses it) gives way to rounds
    /// of signals: the pod still dies.
    #[tokio::test]
    async fn a_failing_cgroup_kill_falls_back_to_signals() {
        let Some(layout) = layout_or_skip("a_failing_cgroup_kill_falls_back_to_signals") else { return };
        let mut pod = TestPod::new(&layout, 2);
        let target = KillTarget {
            cgroup_kill: Some(PathBuf::from("/nonexistent/evictd-test/cgroup.kill")),
            ..KillTarget::at(&pod.rel, &layout)
        };
        kills_the_pod_and_nothing_else(&mut pod, &target, KillMethod::Signals).await;
    }

    /// The guard before any stop, on a fixture tree where the process's own cgroup cannot
    /// tell: evictd's own pid anywhere in the pod's tree is found; a pod cgroup that is gone
    /// (also between open and read: ENODEV) holds nobody; one that cannot be read holds
    /// evictd, as far as a stop is concerned.
    #[test]
    fn evictd_in_a_pods_tree_is_found() {
        let d = tempfile::tempdir().unwrap();
        let ctr = d.path().join("container");
        std::fs::create_dir(&ctr).unwrap();
        std::fs::write(d.path().join("cgroup.procs"), "").unwrap();
        std::fs::write(ctr.join("cgroup.procs"), "1\n").unwrap();
        // No process has this pid: its own cgroup cannot be read, so the tree is listed.
        let pid = i32::MAX;
        let holds = |dir: &Path| tree_holds(dir, Path::new("/pod"), CgroupVersion::V1, pid);
        assert!(!holds(d.path()).unwrap());
        std::fs::write(ctr.join("cgroup.procs"), format!("1\n{pid}\n")).unwrap();
        assert!(holds(d.path()).unwrap());
        assert!(!holds(&d.path().join("gone")).unwrap());
        assert!(removed(&io::Error::from_raw_os_error(libc::ENODEV)));
        assert!(!removed(&io::Error::from_raw_os_error(libc::EIO)));
        let unreadable = d.path().join("unreadable");
        std::fs::create_dir_all(unreadable.join("cgroup.procs")).unwrap();
        assert!(holds(&unreadable).is_err(), "EISDIR is no cgroup gone");
    }

    rusty_fork_test! {
        /// In a private cgroup namespace `/proc/<pid>/cgroup` is relative to it: a process in
        /// a pod reads `/../../<pod>` (the pod lies outside the namespace's root), which does
        /// not start with the pod's path, and taken at its word would pass for "not in the
        /// pod". There the pod's tree is listed instead; in the initial namespace the
        /// process's own line decides. In a process of its own: the namespace is left behind.
        #[test]
        fn outside_the_initial_cgroup_namespace_the_tree_is_listed() {
            let test = "outside_the_initial_cgroup_namespace_the_tree_is_listed";
            let Some(layout) = layout_or_skip(test) else { return };
            if !in_initial_cgroup_namespace() {
                crate::skip(test, "the tests run outside the initial cgroup namespace");
                return;
            }
            let pod = TestPod::new(&layout, 1);
            let target = KillTarget::at(&pod.rel, &layout);
            let (rel, version) = (&target.rel, target.memory_version);
            let in_pod = pod.children[0].id() as i32;
            assert_eq!(cgroup_of_pid_tells(in_pod, rel, version), Some(true), "its own line, in the initial namespace");
            let own = crate::node::cgroup_names::memcg_of_pid(std::process::id(), version);
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP).unwrap();
            // Rooted at this process's cgroup: where that is not the root, the pod's process
            // reads `/../…` (in a VM the tests run in the root cgroup, and it reads the same).
            if own.as_deref() != Some("/") {
                let seen = crate::node::cgroup_names::memcg_of_pid(in_pod as u32, version);
                assert!(seen.as_deref().is_some_and(|p| p.starts_with("/..")), "relative to the new namespace: {seen:?}");
            }
            assert_eq!(cgroup_of_pid_tells(in_pod, rel, version), None, "a private namespace tells nothing");
            assert!(tree_holds(&target.memory, rel, version, in_pod).unwrap(), "the listing finds it");
        }
    }

    /// A chain of cgroups below `top`, made and removed relative to their parents (their
    /// paths are past PATH_MAX), deepest first on drop.
    struct DeepChain {
        /// Each level's parent, open, and the level's name.
        levels: Vec<(OwnedFd, String)>,
    }

    impl DeepChain {
        fn new(top: &Path, depth: usize, name_len: usize) -> DeepChain {
            use rustix::fs::{Mode, OFlags, mkdirat, open, openat};
            let dir_flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
            let mut parent = open(top, dir_flags, Mode::empty()).unwrap();
            let mut chain = DeepChain { levels: Vec::new() };
            for i in 0..depth {
                let name = format!("{i:0>name_len$}");
                mkdirat(&parent, name.as_str(), Mode::from_raw_mode(0o755)).unwrap();
                let child = openat(&parent, name.as_str(), dir_flags, Mode::empty()).unwrap();
                chain.levels.push((std::mem::replace(&mut parent, child), name));
            }
            chain
        }

        /// Moves `pid` into the deepest cgroup.
        fn adopt(&self, pid: u32) {
            use rustix::fs::{Mode, OFlags, openat};
            let (parent, name) = self.levels.last().unwrap();
            let deepest =
                openat(parent, name.as_str(), OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
            let procs = openat(&deepest, "cgroup.procs", OFlags::WRONLY, Mode::empty()).unwrap();
            rustix::io::write(&procs, pid.to_string().as_bytes()).unwrap();
        }
    }

    impl Drop for DeepChain {
        #[expect(clippy::disallowed_methods, reason = "waits for the kernel to let go of test cgroups")]
        fn drop(&mut self) {
            for (parent, name) in self.levels.iter().rev() {
                let t = Instant::now();
                while rustix::fs::unlinkat(parent, name.as_str(), rustix::fs::AtFlags::REMOVEDIR).is_err()
                    && t.elapsed() < Duration::from_secs(5)
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// A test's own process, killed (by its pid) and reaped on drop.
    struct Started(Child);

    impl Drop for Started {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A tenant that can write its cgroupfs nests its pod's tree past PATH_MAX, where every
    /// listing of it fails. evictd still tells that its own process is not in the tree (were
    /// the tree taken for holding it, the stop would fail and the next candidate, another
    /// tenant's pod, be taken), and that a process deep in it is still there (were that taken
    /// for an empty tree, the wait for the pod's memory would end at once).
    #[test]
    fn a_tree_deeper_than_path_max_is_still_told_about() {
        let test = "a_tree_deeper_than_path_max_is_still_told_about";
        let Some(layout) = layout_or_skip(test) else { return };
        let mut pod = TestPod::new(&layout, 1);
        let elsewhere = TestPod::new(&layout, 1);
        let chain = DeepChain::new(&layout.memory_root.join(&pod.rel), 20, 220);
        let deep = Started(Command::new("sleep").arg("600").spawn().unwrap());
        chain.adopt(deep.0.id());
        let target = KillTarget::at(&pod.rel, &layout);
        assert!(
            list_tree(&target.memory, &mut Vec::new()).is_err(),
            "the tree is past what a listing reaches"
        );

        let evictd_as = |p: &TestPod| KillTarget { spare: p.children[0].id() as i32, ..target.clone() };
        assert!(!holds_evictd(&evictd_as(&elsewhere)), "evictd (played by a process elsewhere) is not in it");
        // Told by its own cgroup, not by a listing that fails (which would also say "holds").
        let in_pod = pod.children[0].id() as i32;
        let told = tree_holds(&target.memory, &target.rel, target.memory_version, in_pod);
        assert!(matches!(told, Ok(true)), "and is when it is in it: {told:?}");

        // The pod's own process ends: only the deep one is left in the tree.
        let _ = pod.children[0].kill();
        let _ = pod.children[0].wait();
        assert!(!crate::runtime::usage::cgroup_tree_empty(&target.memory), "a process deep in the tree");
    }

    /// A pod that holds evictd is never killed (its own pod not recognised, say).
    #[tokio::test]
    async fn a_pod_holding_evictd_is_never_killed() {
        let Some(layout) = layout_or_skip("a_pod_holding_evictd_is_never_killed") else { return };
        let mut pod = TestPod::new(&layout, 2);
        // The first process plays evictd.
        let target = KillTarget { spare: pod.children[0].id() as i32, ..KillTarget::at(&pod.rel, &layout) };
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let on_killed = OnKilled::new(move || {
            counted.fetch_add(1, Ordering::Relaxed);
        });
        let err = fast_kill(&target, Some(&on_killed)).await.expect_err("must refuse");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(calls.load(Ordering::Relaxed), 0, "on_killed ran for a pod that was not killed");
        assert!(matches!(err, KillError::HoldsEvictd { .. }), "{err}");
        for c in &mut pod.children {
            assert!(c.try_wait().unwrap().is_none(), "a process of the pod was killed");
        }
    }

    /// A pid listed for the pod that, once pinned, is not in the pod's cgroup (reused, or
    /// moved out) is never signalled.
    #[test]
    fn a_process_outside_the_pod_is_never_pinned() {
        let Some(layout) = layout_or_skip("a_process_outside_the_pod_is_never_pinned") else { return };
        let pod = TestPod::new(&layout, 1);
        let target = KillTarget::at(&pod.rel, &layout);
        assert!(
            pin(std::process::id() as i32, &target).is_none(),
            "this test's own process is not in the pod"
        );
        assert!(pin(pod.children[0].id() as i32, &target).is_some(), "the pod's process is");
    }
}
