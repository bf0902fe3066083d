//! The cgroup v1 memory-threshold wake source (the kubelet's memcg notifier). Registration:
//! the kernel signals an eventfd when memory.usage_in_bytes crosses a value, in either
//! direction (`cgroup.event_control`). The level is the usage at which a memory threshold
//! would be met; it moves with inactive_file, so it is re-registered after observations
//! when it has drifted — on a thread of its own (`Registrar`): a registration waits for an
//! RCU grace period.

use std::{
    fs::File,
    io::Write as _,
    os::fd::{AsRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use evictd_policy::{distance::distances, policy::Signal};
use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::mpsc,
    task::JoinHandle,
};

use super::{NodeNow, SourceKind, SourceTask, Wake, WakeCause, WakeError, WakeSource};
use crate::{
    kernel::sched,
    node::{cgroup_names, cgroups::CgroupVersion, memory::parse, signals::NodeSignalSources},
};

#[derive(Debug, thiserror::Error)]
pub enum ThresholdError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("creating an eventfd: {0}")]
    EventFd(nix::Error),
    #[error("the eventfd registrar's thread has ended: no threshold is registered any more")]
    RegistrarGone,
}

/// A registered threshold: readable once usage crosses `bytes`. Dropping it unregisters.
pub struct UsageThreshold {
    pub eventfd: OwnedFd,
    pub bytes: u64,
    // The watched file must stay open for the registration to live.
    usage: File,
}

impl UsageThreshold {
    /// The kernel signals only crossings after the registration: a level the usage had
    /// passed already (between the observation that set it and the registration; 10 ms at
    /// 500 MiB/s is 5 MiB) counts as crossed and is never signalled. Read through the
    /// registration's own file; unreadable is not passed (the next pass reads again).
    fn passed_already(&self) -> bool {
        use std::os::unix::fs::FileExt as _;
        let mut buf = [0u8; 32];
        let Ok(n) = self.usage.read_at(&mut buf, 0) else { return false };
        let usage = std::str::from_utf8(&buf[..n]).ok().and_then(|s| parse::number(s.trim()).ok());
        usage.is_some_and(|u| u >= self.bytes)
    }
}

/// Registers a threshold of `bytes` on `<dir>/memory.usage_in_bytes`.
pub fn register(dir: &Path, bytes: u64) -> Result<UsageThreshold, ThresholdError> {
    let io = |p: &Path| {
        let path = p.display().to_string();
        move |source| ThresholdError::Io { path, source }
    };
    let usage_path = dir.join("memory.usage_in_bytes");
    let usage = File::open(&usage_path).map_err(io(&usage_path))?;
    let efd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
        .map_err(ThresholdError::EventFd)?;
    let control_path = dir.join("cgroup.event_control");
    let mut control =
        std::fs::OpenOptions::new().write(true).open(&control_path).map_err(io(&control_path))?;
    // One write(2): the kernel parses each write on its own, and write! may split it.
    let line = format!("{} {} {}", efd.as_raw_fd(), usage.as_raw_fd(), bytes);
    control.write_all(line.as_bytes()).map_err(io(&control_path))?;
    Ok(UsageThreshold { eventfd: efd.into(), bytes, usage })
}

/// Re-register only when the level moved by more than this (or by 1/16 of the distance).
const MIN_DRIFT: u64 = 4 << 20;

/// Starts the source on a cgroup v1 node; on v2 there is no `cgroup.event_control`. It is
/// armed by the first `rearm`, right after the daemon's first observation.
pub fn start(signals: &NodeSignalSources, tx: mpsc::Sender<Wake>) -> Option<Box<dyn WakeSource>> {
    if signals.node.version != CgroupVersion::V1 {
        tracing::info!("eventfd wake source: cgroup v1 only, this node's memory is on v2");
        return None;
    }
    Some(Box::new(EventfdWake::new(tx)))
}

/// Where memory.usage_in_bytes must not go for each memory threshold, per cgroup: the
/// kubelet's notifier level, usage + (available − threshold), i.e.
/// capacity − threshold + inactive_file. With the distance, for drift tolerance.
fn notifier_levels(node: &NodeNow) -> Vec<(PathBuf, u64, u64)> {
    let mut out = Vec::new();
    for (signal, cg) in [
        (Signal::MemoryAvailable, Some(&node.signals.node)),
        (Signal::AllocatableMemoryAvailable, node.signals.kubepods.as_ref()),
    ] {
        let (Some(cg), true) = (cg, node.observations.contains_key(&signal)) else { continue };
        // The usage alone, which is what the notifier compares: a pass re-arms after every
        // wake, and the whole sample (memory.stat, which cgroup v1 formats counter by counter)
        // was a sixth of evictd's CPU beside a tenant that woke it ~600 times a second. A
        // cgroup that cannot be read now keeps no threshold until the next pass.
        let Ok(usage) = cg.usage() else { continue };
        for (_, distance) in distances(node.thresholds, node.observations, signal) {
            let level = (usage as i64 + distance).max(0) as u64;
            out.push((cg.dir.clone(), level, distance.max(0) as u64));
        }
    }
    out
}

/// One registered threshold and the task waiting on it.
struct Armed {
    dir: PathBuf,
    /// The cgroup directory's inode: a cgroup removed and made again at the same path is a
    /// new cgroup, and the old registration is dead.
    inode: Option<u64>,
    level: u64,
    task: SourceTask<()>,
}

/// The registrations, and the task waiting on each.
struct Registrations {
    armed: Vec<Armed>,
    /// Cgroups of the levels asked for that were gone when they were to be registered: one
    /// made again at the path before the levels change is registered by the next check.
    gone: Vec<PathBuf>,
    tx: mpsc::Sender<Wake>,
}

impl Registrations {
    fn new(tx: mpsc::Sender<Wake>) -> Self {
        Registrations { armed: Vec::new(), gone: Vec::new(), tx }
    }
}

/// Which registrations `Registrations::update` leaves as they are.
#[derive(Clone, Copy)]
enum Keep {
    /// Those within the drift of the levels asked for (a pass registering for itself).
    WithinDrift,
    /// Those at the very levels asked for.
    Same,
    /// None: register everything again.
    Nothing,
}

/// What a pass asks of the registrar.
enum Request {
    /// Arm these levels (`notifier_levels`), or leave what is armed if it is at them.
    Levels(Vec<(PathBuf, u64, u64)>),
    /// A waiter may have ended, or a cgroup been made again at its path: if so, register
    /// the latest levels again.
    Check,
}

/// Where the registrations are made. A registration takes 7.5–32 ms here (the kernel waits
/// for an RCU grace period in it), and in the pass it held every wake behind it: a crossing
/// in that window waited for it. A thread of its own takes the requests in turn, acting on
/// the latest levels; what is armed stays armed until what replaces it is.
enum Registrar {
    Thread {
        requests: std::sync::mpsc::Sender<Request>,
        /// A registration that failed, for the next pass or check to report (the daemon then
        /// drops the source, as when the pass registered).
        failed: Arc<Mutex<Option<ThresholdError>>>,
        /// The levels last sent: a pass whose levels are within drift of them sends
        /// nothing, so that a wake storm's passes do not wake the thread.
        sent: Vec<(PathBuf, u64)>,
    },
    /// Without a thread (it could not be made, or there is no runtime for the waiters): the
    /// pass registers, and waits.
    Inline(Registrations),
}

pub struct EventfdWake {
    registrar: Registrar,
}

/// The registrar's stack: it registers, spawns waiters and logs.
const REGISTRAR_STACK: usize = 256 << 10;

/// What of it is faulted in at start (locked under `mlockall`): a registration on a node
/// short of memory then does not wait for a page of stack.
const STACK_RESERVE: usize = 64 << 10;

impl EventfdWake {
    pub fn new(tx: mpsc::Sender<Wake>) -> Self {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return EventfdWake { registrar: Registrar::Inline(Registrations::new(tx)) };
        };
        let (requests, queue) = std::sync::mpsc::channel();
        let failed = Arc::new(Mutex::new(None));
        let (theirs, their_tx) = (failed.clone(), tx.clone());
        // The daemon's priority: behind a busy node's tenants an ordinary thread could leave
        // a new level (the first, or one for a cgroup made again) unregistered for long.
        let priority = sched::fifo_priority();
        let spawned = std::thread::Builder::new()
            .name("evictd-eventfd".into())
            .stack_size(REGISTRAR_STACK)
            .spawn(move || {
                if let Some(p) = priority
                    && let Err(e) = sched::set_fifo(p)
                {
                    tracing::warn!(priority = p, "the eventfd registrar runs at an ordinary priority: {e}");
                }
                sched::prefault_helper_thread::<STACK_RESERVE>();
                // The waiters are the daemon's runtime's tasks.
                let _runtime = handle.enter();
                register_in_turn(Registrations::new(their_tx), &queue, &theirs);
            });
        match spawned {
            Ok(_) => EventfdWake { registrar: Registrar::Thread { requests, failed, sent: Vec::new() } },
            Err(e) => {
                tracing::warn!(
                    "cannot start the eventfd registrar's thread ({e}): passes register the thresholds themselves"
                );
                EventfdWake { registrar: Registrar::Inline(Registrations::new(tx)) }
            }
        }
    }

    /// Arms one threshold per `(cgroup dir, usage level in bytes, distance)`, on the
    /// registrar's thread where there is one (a failure there is returned by a later call);
    /// leaves registrations whose level has barely moved (on the very same cgroup) alone.
    pub fn update(&mut self, levels: &[(PathBuf, u64, u64)]) -> Result<(), ThresholdError> {
        self.arm(levels.to_vec())
    }

    /// `update` with levels the caller gives up: a pass's, sent to the registrar uncopied.
    fn arm(&mut self, levels: Vec<(PathBuf, u64, u64)>) -> Result<(), ThresholdError> {
        match &mut self.registrar {
            Registrar::Inline(regs) => regs.update(&levels, Keep::WithinDrift),
            Registrar::Thread { requests, failed, sent } => {
                if let Some(e) = lock(failed).take() {
                    return Err(e);
                }
                // A cgroup made again at the same path keeps its levels: the registrar's
                // check each second finds it (`Request::Check`).
                if sent.len() == levels.len()
                    && sent
                        .iter()
                        .zip(&levels)
                        .all(|((d, a), (dir, l, dist))| d == dir && within_drift(*a, *l, *dist))
                {
                    return Ok(());
                }
                *sent = levels.iter().map(|(d, l, _)| (d.clone(), *l)).collect();
                requests.send(Request::Levels(levels)).map_err(|_| ThresholdError::RegistrarGone)
            }
        }
    }
}

/// The registrar's loop: every request that came meanwhile, then the latest levels. Ends
/// with the source (its requests' sender dropped), and its registrations with it.
fn register_in_turn(
    mut regs: Registrations,
    queue: &std::sync::mpsc::Receiver<Request>,
    failed: &Mutex<Option<ThresholdError>>,
) {
    let mut latest: Option<Vec<(PathBuf, u64, u64)>> = None;
    while let Ok(first) = queue.recv() {
        // Registered only for levels a pass just sent, or again after a waiter ended or a
        // cgroup was made again: the levels of an older pass may name a cgroup gone since.
        let (mut fresh, mut check) = (false, false);
        for r in std::iter::once(first).chain(queue.try_iter()) {
            match r {
                Request::Levels(l) => (latest, fresh) = (Some(l), true),
                Request::Check => check = true,
            }
        }
        // What is armed stays armed while it is registered again: a crossing meanwhile still
        // wakes evictd if its waiter lives.
        let mut again = false;
        if check && regs.a_waiter_ended() {
            tracing::warn!(
                "eventfd wake source: a threshold waiter stopped; registering the thresholds again"
            );
            again = true;
        }
        if check && regs.a_cgroup_was_made_again() {
            tracing::info!(
                "eventfd wake source: a watched cgroup was made again; registering its threshold again"
            );
            again = true;
        }
        // The passes sent only levels past the drift of what they sent before, which this
        // thread may have skipped (it registers only the latest): any change is registered,
        // so that what is armed is never further off than the drift.
        let keep = if again { Keep::Nothing } else { Keep::Same };
        if (fresh || again)
            && let Some(levels) = &latest
            && let Err(e) = regs.update(levels, keep)
        {
            *lock(failed) = Some(e);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Registrations {
    /// Arms one threshold per `(cgroup dir, usage level in bytes, distance)`; leaves the
    /// registrations alone if `keep` allows them (on the very same cgroups).
    fn update(&mut self, levels: &[(PathBuf, u64, u64)], keep: Keep) -> Result<(), ThresholdError> {
        let unchanged = levels.len() == self.armed.len()
            && levels.iter().zip(&self.armed).all(|((d, l, dist), a)| {
                *d == a.dir
                    && a.inode.is_some()
                    && cgroup_names::cgroup_id(d).ok() == a.inode
                    && match keep {
                        Keep::WithinDrift => within_drift(a.level, *l, *dist),
                        Keep::Same => a.level == *l,
                        Keep::Nothing => false,
                    }
            });
        if unchanged {
            return Ok(());
        }
        // The new levels are registered before the old ones go: a crossing meanwhile still
        // wakes evictd (at the old level).
        let (mut armed, mut gone) = (Vec::with_capacity(levels.len()), Vec::new());
        for (dir, level, _) in levels {
            tracing::debug!(cgroup = %dir.display(), level, "arming memory.usage_in_bytes threshold");
            // Before the registration: a cgroup made again while it waits is then seen as new
            // (`a_cgroup_was_made_again`), not taken for the one registered on.
            let inode = cgroup_names::cgroup_id(dir).ok();
            let t = match register(dir, *level) {
                // A cgroup removed since the levels were read (the check registers the latest
                // levels, which may be seconds old): nothing to watch there, and the next pass
                // leaves it out. Not a reason to drop the whole source.
                Err(ThresholdError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                    tracing::debug!(cgroup = %dir.display(), "the cgroup is gone; no threshold on it");
                    gone.push(dir.clone());
                    continue;
                }
                r => r?,
            };
            let passed = t.passed_already();
            let task = spawn_waiter(t, self.tx.clone())
                .map_err(|source| ThresholdError::Io { path: dir.display().to_string(), source })?;
            armed.push(Armed {
                dir: dir.clone(),
                inode,
                level: *level,
                task: SourceTask::new("a memory threshold's waiter", task),
            });
            if passed {
                tracing::debug!(cgroup = %dir.display(), level, "the usage passed the level before it was armed");
                let _ = self.tx.try_send(Wake::now(WakeCause::Eventfd));
            }
        }
        (self.armed, self.gone) = (armed, gone);
        Ok(())
    }

    fn disarm(&mut self) {
        // Dropping a registration ends its waiter.
        self.armed.clear();
    }
}

impl WakeSource for EventfdWake {
    fn kind(&self) -> SourceKind {
        SourceKind::Eventfd
    }

    fn rearm(&mut self, node: &NodeNow) -> Result<(), WakeError> {
        Ok(self.arm(notifier_levels(node))?)
    }

    /// A waiter that ended (its eventfd failed) is a threshold nobody watches, and so is one
    /// on a cgroup made again at its path: the registrar registers the latest levels again at
    /// once, and a registration of its that failed is returned here. Without the registrar, a
    /// waiter that ended disarms the thresholds and the next `rearm` registers them (and a
    /// cgroup made again is seen by it).
    fn supervise(&mut self) -> Result<(), WakeError> {
        match &mut self.registrar {
            Registrar::Inline(regs) => {
                if regs.a_waiter_ended() {
                    tracing::warn!(
                        "eventfd wake source: a threshold waiter stopped; registering the thresholds again"
                    );
                    regs.disarm();
                }
            }
            Registrar::Thread { requests, failed, .. } => {
                // A registration the check asked for that failed is reported now, not at a
                // later pass's, which may be long on a quiet node.
                if let Some(e) = lock(failed).take() {
                    return Err(e.into());
                }
                requests.send(Request::Check).map_err(|_| ThresholdError::RegistrarGone)?
            }
        }
        Ok(())
    }
}

impl Registrations {
    fn a_waiter_ended(&self) -> bool {
        self.armed.iter().any(|a| a.task.has_ended())
    }

    /// A cgroup removed and made again at its path: its registration died with the old one.
    /// One that is gone is not (the next pass's levels leave it out); one whose inode could not
    /// be read at the registration, or that was gone then, and can be read now, is taken to be.
    fn a_cgroup_was_made_again(&self) -> bool {
        self.armed.iter().any(|a| match (a.inode, cgroup_names::cgroup_id(&a.dir).ok()) {
            (then, Some(now)) => then != Some(now),
            (_, None) => false,
        }) || self.gone.iter().any(|d| cgroup_names::cgroup_id(d).is_ok())
    }
}

/// Whether a level moved from `armed` to `level` by no more than a threshold at `distance`
/// from it may drift before it is registered again.
fn within_drift(armed: u64, level: u64, distance: u64) -> bool {
    level.abs_diff(armed) <= MIN_DRIFT.max(distance / 16)
}

fn spawn_waiter(t: UsageThreshold, tx: mpsc::Sender<Wake>) -> std::io::Result<JoinHandle<()>> {
    // SAFETY: UsageThreshold owns its eventfd for its whole life, and the AsyncFd owns it.
    let fd =
        unsafe { AsyncFd::register_with_interest(t, Interest::READABLE) }.map_err(std::io::Error::from)?;
    Ok(tokio::spawn(async move {
        loop {
            let Ok(mut guard) = fd.readable().await else { return };
            let mut buf = [0u8; 8];
            // SAFETY: reading 8 bytes into an 8-byte buffer from an eventfd we own.
            let n = unsafe { libc::read(guard.get_inner().eventfd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
            if n < 0 {
                guard.clear_ready();
                continue;
            }
            if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(Wake::now(WakeCause::Eventfd)) {
                return;
            }
        }
    }))
}

impl std::os::fd::AsRawFd for UsageThreshold {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.eventfd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source whose registrar is this test: the requests it would take, and the slot for a
    /// registration of its that failed.
    fn on_a_thread() -> (EventfdWake, std::sync::mpsc::Receiver<Request>, Arc<Mutex<Option<ThresholdError>>>)
    {
        let (requests, queue) = std::sync::mpsc::channel();
        let failed = Arc::new(Mutex::new(None));
        let wake = EventfdWake {
            registrar: Registrar::Thread { requests, failed: failed.clone(), sent: Vec::new() },
        };
        (wake, queue, failed)
    }

    /// A wake storm's passes barely move the levels: they must not each wake the registrar
    /// (a thread switch a pass), yet a level past the drift, or another cgroup, is sent at
    /// once.
    #[test]
    fn a_pass_sends_the_registrar_only_levels_past_the_drift() {
        let (mut wake, queue, _) = on_a_thread();
        let node = PathBuf::from("/sys/fs/cgroup/memory/node");
        let mut sent = |levels: Vec<(PathBuf, u64, u64)>| {
            wake.arm(levels).expect("a pass");
            queue.try_iter().count()
        };
        assert_eq!(sent(vec![(node.clone(), 100 << 20, 10 << 20)]), 1, "the first levels");
        assert_eq!(sent(vec![(node.clone(), (100 << 20) + (3 << 20), 10 << 20)]), 0, "3 MiB of drift");
        assert_eq!(sent(vec![(node.clone(), 100 << 20, 10 << 20)]), 0, "back again");
        assert_eq!(sent(vec![(node.clone(), 95 << 20, 10 << 20)]), 1, "5 MiB of drift");
        assert_eq!(sent(vec![(node.clone(), 95 << 20, 10 << 20)]), 0, "no drift");
        let kubepods = node.join("kubepods");
        assert_eq!(sent(vec![(kubepods, 95 << 20, 10 << 20)]), 1, "another cgroup");
        assert_eq!(sent(Vec::new()), 1, "no level at all");
        // 1/16 of a 1 GiB distance is 64 MiB.
        assert_eq!(sent(vec![(node.clone(), 2 << 30, 1 << 30)]), 1);
        assert_eq!(
            sent(vec![(node.clone(), (2 << 30) + (60 << 20), 1 << 30)]),
            0,
            "60 MiB of a 1 GiB distance"
        );
        assert_eq!(sent(vec![(node, (2 << 30) + (70 << 20), 1 << 30)]), 1, "70 MiB past what was sent");
    }

    /// A failed registration reaches the daemon through the next pass, which then drops the
    /// source: a pass within drift must not swallow it.
    #[test]
    fn a_failed_registration_is_returned_by_the_next_pass() {
        let (mut wake, _queue, failed) = on_a_thread();
        let levels = vec![(PathBuf::from("/nowhere"), 100 << 20, 10 << 20)];
        wake.arm(levels.clone()).expect("sent");
        *lock(&failed) = Some(ThresholdError::RegistrarGone);
        assert!(matches!(wake.arm(levels), Err(ThresholdError::RegistrarGone)));
    }

    /// A cgroup removed between the levels' read and their registration is left out, not a
    /// failure that would drop the whole source.
    #[test]
    fn a_cgroup_gone_before_its_registration_is_left_out() {
        let (tx, _rx) = mpsc::channel(1);
        let mut regs = Registrations::new(tx);
        let gone = PathBuf::from("/nonexistent/evictd-test/kubepods");
        regs.update(&[(gone, 100 << 20, 10 << 20)], Keep::Same).expect("a cgroup gone is no failure");
        assert!(regs.armed.is_empty());
        assert!(!regs.a_cgroup_was_made_again(), "still gone");
        // Made again at its path (here: a directory that exists): the check registers it.
        regs.gone = vec![std::env::temp_dir()];
        assert!(regs.a_cgroup_was_made_again());
    }

    /// A registration the registrar's own check made (a cgroup made again) that failed is
    /// reported by the next check, once a second, not left for a pass that may not come.
    #[test]
    fn a_failed_registration_is_returned_by_the_next_check() {
        let (mut wake, queue, failed) = on_a_thread();
        wake.supervise().expect("nothing failed");
        assert_eq!(queue.try_iter().count(), 1, "the check sent");
        *lock(&failed) = Some(ThresholdError::RegistrarGone);
        let err = wake.supervise().expect_err("the failure").to_string();
        assert!(err.contains("registrar"), "{err}");
    }
}
