//! The disk poll: disk signals woken, not left to the housekeeping timer. statvfs is cheap,
//! but the kubelet's 10 s loop is what lets a fast writer fill a disk between two looks.
//! This source reads every filesystem that has a disk threshold at an interval set by its
//! distance to that threshold and the fastest fill it must see in time (`--disk-fill-rate`,
//! `--inodes-fill-rate`): about a second when far, a millisecond when near, so a fill at up
//! to that rate is seen within one interval of crossing. A crossing says "look now", once per
//! arming; while a threshold stays met it says so again at most every [`MET_RECHECK`], so
//! that soft grace periods run out on time without passes back to back.
//!
//! It decides nothing: the pass observes the node again and the engine decides, as for every
//! other source. A filesystem that cannot be read wakes nobody (the pass reports it).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use evictd_policy::{
    observations::Observation,
    policy::{Resource, Signal, Threshold},
};
use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};

use super::{
    NodeNow, SourceKind, SourceTask, Wake, WakeCause, WakeError, WakeSource,
    poll::{MAX_INTERVAL, interval_for},
};
use crate::node::signals::{NodeSignalSources, filesystem_observations};

/// While a disk threshold stays met after a pass, the next look comes this much later: the
/// engine's grace periods and the settle after reclaim need passes, not a pass a millisecond.
pub const MET_RECHECK: Duration = Duration::from_secs(1);

/// How fast each kind of disk signal may fall, per second.
#[derive(Clone, Copy, Debug)]
pub struct FillRates {
    pub bytes: u64,
    pub inodes: u64,
}

/// A filesystem with disk thresholds, as the poll checks it: read once per look, each
/// threshold's value resolved against the capacity read then (a percentage follows the
/// filesystem).
#[derive(Debug, PartialEq)]
struct Watched {
    dir: PathBuf,
    thresholds: Vec<Threshold>,
}

/// What the task polls for: the filesystems (built when the thresholds change, shared with
/// the task), and the arming, renewed after every pass.
#[derive(Clone, Debug, Default)]
struct Arm {
    filesystems: Arc<[Watched]>,
    /// A new generation lets the task fire again.
    generation: u64,
    /// No wake before this (a threshold was still met when the pass ended).
    quiet_until: Option<Instant>,
}

struct DiskWake {
    signals: NodeSignalSources,
    /// The thresholds `Arm::filesystems` was built from.
    thresholds: Vec<Threshold>,
    arm: watch::Sender<Arm>,
    task: SourceTask<()>,
}

pub fn start(signals: &NodeSignalSources, rates: FillRates, tx: mpsc::Sender<Wake>) -> Box<dyn WakeSource> {
    let (arm, rx) = watch::channel(Arm::default());
    let task = SourceTask::new("the disk poll", tokio::spawn(poll_filesystems(rx, rates, tx)));
    tracing::info!(
        fill_rate_mib_s = rates.bytes >> 20,
        inodes_per_s = rates.inodes,
        "disk poll wake source started ({:?} to {MAX_INTERVAL:?}, per filesystem with a disk threshold)",
        super::poll::MIN_INTERVAL
    );
    Box::new(DiskWake { signals: signals.clone(), thresholds: Vec::new(), arm, task })
}

/// Disk thresholds grouped by the filesystem their signal measures, in first-seen order.
fn watched<'a>(disk_thresholds: impl IntoIterator<Item = (&'a Path, Threshold)>) -> Arc<[Watched]> {
    let mut out: Vec<Watched> = Vec::new();
    for (dir, t) in disk_thresholds {
        match out.iter_mut().find(|w| w.dir == dir) {
            Some(w) => w.thresholds.push(t),
            None => out.push(Watched { dir: dir.to_path_buf(), thresholds: vec![t] }),
        }
    }
    out.into()
}

/// One statvfs: bytes, and inodes where the filesystem counts them.
type FsReading = Option<(Observation, Option<Observation>)>;

/// What one read of the filesystems says: whether a threshold is met, and how long the
/// fastest allowed fill needs to cross the nearest one.
#[derive(Debug, PartialEq)]
struct Reading {
    met: Option<Signal>,
    next: Duration,
}

/// Checks each filesystem's thresholds against one read of it (`read` is statvfs). A
/// filesystem that cannot be read counts as neither met nor near: the pass reports it, and
/// the poll must not spin on it.
fn check(filesystems: &[Watched], rates: FillRates, mut read: impl FnMut(&PathBuf) -> FsReading) -> Reading {
    let mut reading = Reading { met: None, next: MAX_INTERVAL };
    for fs in filesystems {
        let Some((bytes, inodes)) = read(&fs.dir) else { continue };
        for t in &fs.thresholds {
            let (o, rate) = match (t.signal.resource(), inodes) {
                (Resource::Inodes, Some(inodes)) => (inodes, rates.inodes),
                (Resource::Inodes, None) => continue,
                _ => (bytes, rates.bytes),
            };
            if t.is_met(o.available, o.capacity, false) {
                reading.met.get_or_insert(t.signal);
            }
            let level = t.value.resolve(o.capacity).max(0) as u64;
            reading.next = reading.next.min(interval_for(level, o.available.max(0) as u64, rate));
        }
    }
    reading
}

async fn poll_filesystems(mut rx: watch::Receiver<Arm>, rates: FillRates, tx: mpsc::Sender<Wake>) {
    let mut fired_for: Option<u64> = None;
    loop {
        let arm = rx.borrow_and_update().clone();
        if arm.filesystems.is_empty() || fired_for == Some(arm.generation) {
            // Nothing to watch, or a wake already sent for this arming: the next re-arm.
            if rx.changed().await.is_err() {
                return;
            }
            continue;
        }
        if let Some(quiet) = arm.quiet_until.filter(|q| *q > Instant::now()) {
            tokio::select! {
                _ = tokio::time::sleep_until(quiet) => {}
                r = rx.changed() => if r.is_err() { return },
            }
            continue;
        }
        let reading = check(&arm.filesystems, rates, |dir| filesystem_observations(dir, None).ok());
        if let Some(signal) = reading.met {
            fired_for = Some(arm.generation);
            tracing::debug!(%signal, "disk poll: threshold met, waking a pass");
            // A full channel means a look is already pending: nothing lost.
            if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(Wake::now(WakeCause::Disk)) {
                return;
            }
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(reading.next) => {}
            r = rx.changed() => if r.is_err() { return },
        }
    }
}

impl WakeSource for DiskWake {
    fn kind(&self) -> SourceKind {
        SourceKind::Disk
    }

    /// A new arming (and the filesystems again when the thresholds changed); a disk
    /// threshold still met after the pass is looked at again only after [`MET_RECHECK`].
    fn rearm(&mut self, node: &NodeNow) -> Result<(), WakeError> {
        let filesystems = (self.thresholds != node.thresholds).then(|| {
            self.thresholds = node.thresholds.to_vec();
            let signals = &self.signals;
            watched(node.thresholds.iter().filter_map(|t| Some((signals.filesystem_of(t.signal)?, *t))))
        });
        let still_met = node.thresholds.iter().any(|t| {
            t.signal.resource().is_disk()
                && node.observations.get(&t.signal).is_some_and(|o| t.is_met(o.available, o.capacity, false))
        });
        self.arm.send_modify(|a| {
            if let Some(f) = filesystems {
                a.filesystems = f;
            }
            a.generation += 1;
            a.quiet_until = still_met.then(|| Instant::now() + MET_RECHECK);
        });
        Ok(())
    }

    fn supervise(&mut self) -> Result<(), WakeError> {
        self.task.check_running()
    }
}

#[cfg(test)]
mod tests {
    use evictd_policy::{policy::ThresholdValue, quantity::Quantity};

    use super::*;
    use crate::wake::poll::MIN_INTERVAL;

    const MI: i64 = 1 << 20;
    const GI: i64 = 1 << 30;
    const RATES: FillRates = FillRates { bytes: 1 << 30, inodes: 100_000 };

    fn trigger(dir: &str, signal: Signal, value: ThresholdValue) -> (&Path, Threshold) {
        (Path::new(dir), Threshold { signal, value, grace_period_ns: 0, min_reclaim: None })
    }

    fn obs(available: i64, capacity: i64) -> Observation {
        Observation { available, capacity, time_ns: None }
    }

    #[test]
    fn the_interval_is_the_time_the_fastest_fill_needs_to_cross() {
        let t = watched([trigger(
            "/n",
            Signal::NodeFsAvailable,
            ThresholdValue::Quantity(Quantity::parse("10Gi").unwrap()),
        )]);
        // 10 GiB is the threshold; 10.5 GiB available at 1 GiB/s: half a second.
        let r = check(&t, RATES, |_| Some((obs(10 * GI + GI / 2, 100 * GI), None)));
        assert_eq!(r, Reading { met: None, next: Duration::from_millis(500) });
        // Far away: at most a second; at the threshold, still not met (strictly below is).
        assert_eq!(check(&t, RATES, |_| Some((obs(90 * GI, 100 * GI), None))).next, MAX_INTERVAL);
        let at = check(&t, RATES, |_| Some((obs(10 * GI + 1, 100 * GI), None)));
        assert_eq!((at.met, at.next), (None, MIN_INTERVAL));
        let below = check(&t, RATES, |_| Some((obs(10 * GI - 1, 100 * GI), None)));
        assert_eq!(below.met, Some(Signal::NodeFsAvailable));
        // A percentage is of the capacity read with it: 10 % of 200 GiB.
        let p = watched([trigger("/n", Signal::NodeFsAvailable, ThresholdValue::Percentage(0.1))]);
        assert_eq!(
            check(&p, RATES, |_| Some((obs(20 * GI - MI, 200 * GI), None))).met,
            Some(Signal::NodeFsAvailable)
        );
        assert_eq!(check(&p, RATES, |_| Some((obs(15 * GI, 100 * GI), None))).met, None);
    }

    #[test]
    fn the_nearest_threshold_of_every_filesystem_sets_the_pace() {
        let t = watched([
            trigger("/n", Signal::NodeFsAvailable, ThresholdValue::Quantity(Quantity::parse("1Gi").unwrap())),
            trigger(
                "/n",
                Signal::NodeFsInodesFree,
                ThresholdValue::Quantity(Quantity::parse("1000").unwrap()),
            ),
            trigger(
                "/i",
                Signal::ImageFsAvailable,
                ThresholdValue::Quantity(Quantity::parse("1Gi").unwrap()),
            ),
        ]);
        let mut reads = Vec::new();
        let r = check(&t, RATES, |d| {
            reads.push(d.clone());
            match d.to_str() {
                // nodefs far in bytes, 6,000 inodes from its inode threshold: 60 ms.
                Some("/n") => Some((obs(50 * GI, 100 * GI), Some(obs(7_000, 1_000_000)))),
                // imagefs 100 MiB above: ~98 ms.
                _ => Some((obs(GI + 100 * MI, 10 * GI), None)),
            }
        });
        assert_eq!(r, Reading { met: None, next: Duration::from_millis(60) });
        assert_eq!(reads, [PathBuf::from("/n"), PathBuf::from("/i")], "each filesystem read once");
    }

    #[test]
    fn an_unreadable_filesystem_is_neither_met_nor_near() {
        let t = watched([trigger("/gone", Signal::NodeFsAvailable, ThresholdValue::Percentage(0.1))]);
        assert_eq!(check(&t, RATES, |_| None), Reading { met: None, next: MAX_INTERVAL });
        // A filesystem without inode counts has no inode signal to meet.
        let i = watched([trigger("/n", Signal::NodeFsInodesFree, ThresholdValue::Percentage(0.05))]);
        assert_eq!(check(&i, RATES, |_| Some((obs(GI, 2 * GI), None))).met, None);
    }
}
