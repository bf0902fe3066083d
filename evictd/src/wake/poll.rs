//! The adaptive poll: the floor under the kernel-driven sources, for nodes that have none of
//! them (no memcg tracepoints, no v1 eventfd, PSI windows too long). It reads the node's
//! memory usage — one small cgroup file; memory.stat too once usage is past the level — at
//! an interval set by how far the node is from the level the last pass armed and how fast
//! memory could fill (earlyoom's idea): about a second when far, a millisecond when near.
//! Past the level it says "look now", once per arming. The level follows the eBPF
//! watermark's rule, half the distance to the nearest memory threshold (the whole distance
//! near it), so a fill at up to `--poll-fill-rate` is seen before it crosses.
//!
//! The level is a working set (`MemoryCgroup::working_set_estimate`: usage less the inactive
//! file pages). Usage is read first, one small file: it is never below the working set, so
//! while usage is below the level nothing more is read. Past it, the estimate decides: on a
//! node full of page cache, usage sits at the limit while anonymous memory displaces the
//! cache, and only the working set climbs to the threshold — a level set on usage would
//! never be reached, and no reclaim tracepoint sees kswapd freeing the cache. There the poll
//! reads memory.stat too, at most every `STAT_MIN_INTERVAL`; elsewhere it reads usage alone.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::sync::{Notify, mpsc};

use super::{
    NodeNow, SourceKind, SourceTask, Wake, WakeCause, WakeError, WakeSource,
    ebpf::{Distance, FineSteps, MIN_AUTO_WATERMARK, Watermark, watermark_for},
};
use crate::{node::memory::MemoryCgroup, vocab::ChargeTier};

/// The shortest interval: a read of one small cgroup file a millisecond costs well under 1 %
/// of a core, and tokio's timer is no finer.
pub const MIN_INTERVAL: Duration = Duration::from_millis(1);
/// The longest: far from every threshold, a read a second.
pub const MAX_INTERVAL: Duration = Duration::from_secs(1);
/// The shortest interval between two reads of memory.stat (usage past the level, the working
/// set not yet): on cgroup v1 a read sums every cgroup below the node, on v2 it may flush the
/// kernel's statistics, too costly at a millisecond on a real-time thread. At the default
/// fill rate (6 GiB/s) a crossing is seen at most ~60 MiB late; the kernel's reclaim wakes
/// come first where a limit is reached.
pub const STAT_MIN_INTERVAL: Duration = Duration::from_millis(10);

/// How long until usage could reach `level` from `usage` at `fill_rate` bytes per second,
/// within [`MIN_INTERVAL`, `MAX_INTERVAL`].
pub fn interval_for(usage: u64, level: u64, fill_rate: u64) -> Duration {
    let remaining = level.saturating_sub(usage);
    Duration::from_secs_f64(remaining as f64 / fill_rate.max(1) as f64).clamp(MIN_INTERVAL, MAX_INTERVAL)
}

/// The working set at which to wake, shared between the task and `rearm`. A new generation lets
/// the task fire again.
struct Arm {
    level: AtomicU64,
    generation: AtomicU64,
    /// Told by `rearm`: a task that fired waits for it instead of reading every
    /// millisecond, at real-time priority, for a whole grace period.
    rearmed: Notify,
    /// Reads of the node's memory, for the test of that.
    reads: AtomicU64,
}

struct PollWake {
    node: MemoryCgroup,
    arm: Arc<Arm>,
    /// Its own ration of levels below the watermark's floor.
    fine: FineSteps,
    task: SourceTask<()>,
}

/// Starts polling `node` for a fill of up to `fill_rate` bytes per second. Until the first
/// pass arms it, growth past the floor wakes evictd.
pub fn start(node: &MemoryCgroup, fill_rate: u64, tx: mpsc::Sender<Wake>) -> Box<dyn WakeSource> {
    let level = node.working_set_estimate().map_or(0, |w| w.saturating_add(MIN_AUTO_WATERMARK));
    let arm = Arc::new(Arm {
        level: AtomicU64::new(level),
        generation: AtomicU64::new(0),
        rearmed: Notify::new(),
        reads: AtomicU64::new(0),
    });
    let task = SourceTask::new(
        "the adaptive poll",
        tokio::spawn(poll_node(node.clone(), arm.clone(), fill_rate, tx)),
    );
    tracing::info!(
        node = %node.dir.display(),
        fill_rate_mib_s = fill_rate >> 20,
        "adaptive poll wake source started ({MIN_INTERVAL:?} to {MAX_INTERVAL:?})"
    );
    Box::new(PollWake { node: node.clone(), arm, fine: FineSteps::default(), task })
}

async fn poll_node(node: MemoryCgroup, arm: Arc<Arm>, fill_rate: u64, tx: mpsc::Sender<Wake>) {
    let mut fired_for: Option<u64> = None;
    let mut failing = false;
    loop {
        let generation = arm.generation.load(Ordering::Acquire);
        if fired_for == Some(generation) {
            // Fired for this level: nothing more to say, and nothing to read, until a pass
            // re-arms (the generation is looked at again each second all the same).
            let _ = tokio::time::timeout(MAX_INTERVAL, arm.rearmed.notified()).await;
            continue;
        }
        let level = arm.level.load(Ordering::Acquire);
        arm.reads.fetch_add(1, Ordering::Relaxed);
        let interval = match past_level(&node, level) {
            Ok((past, read, stat_read)) => {
                failing = false;
                if past {
                    fired_for = Some(generation);
                    // A full channel means a look is already pending: nothing lost.
                    if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(Wake::now(WakeCause::Poll))
                    {
                        return;
                    }
                }
                let interval = interval_for(read, level, fill_rate);
                if stat_read { interval.max(STAT_MIN_INTERVAL) } else { interval }
            }
            // The pass reads (and reports) the node on its own; a poll that cannot read it
            // has nothing to say, and must not spin.
            Err(e) => {
                if !failing {
                    tracing::warn!("adaptive poll: {e}; trying again every {MAX_INTERVAL:?}");
                    failing = true;
                }
                MAX_INTERVAL
            }
        };
        tokio::time::sleep(interval).await;
    }
}

/// Whether the node's working set is at or past `level`, the figure that says so, and
/// whether memory.stat was read for it: usage when it is below the level (the working set is
/// no larger), else the working set estimate.
fn past_level(
    node: &MemoryCgroup,
    level: u64,
) -> Result<(bool, u64, bool), crate::node::memory::MemoryError> {
    if node.usage_is_meminfo() {
        // Usage and working set from one read: a second would only be older.
        let working_set = node.read()?.working_set();
        return Ok((working_set >= level, working_set, false));
    }
    let usage = node.usage()?;
    if usage < level {
        return Ok((false, usage, false));
    }
    let working_set = node.working_set_after_usage(usage)?;
    Ok((working_set >= level, working_set, node.working_set_reads_stat()))
}

impl WakeSource for PollWake {
    fn kind(&self) -> SourceKind {
        SourceKind::Poll
    }

    fn charge_tier(&self) -> Option<ChargeTier> {
        Some(ChargeTier::AdaptivePoll)
    }

    /// The next level is the working set now (as the poll estimates it) plus the eBPF
    /// watermark's step (`watermark_for`: half the distance to the nearest memory threshold,
    /// the whole distance near it). A node that cannot be read arms level 0:
    /// the next read that works wakes a pass at once.
    fn rearm(&mut self, node: &NodeNow) -> Result<(), WakeError> {
        let step =
            watermark_for(Watermark::Auto, Distance::of(node.thresholds, node.observations), &mut self.fine);
        let level = self.node.working_set_estimate().map_or(0, |w| w.saturating_add(step));
        self.arm.level.store(level, Ordering::Release);
        self.arm.generation.fetch_add(1, Ordering::AcqRel);
        self.arm.rearmed.notify_one();
        Ok(())
    }

    fn supervise(&mut self) -> Result<(), WakeError> {
        self.task.check_running()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;

    #[test]
    fn the_interval_shrinks_with_the_distance_within_bounds() {
        // 6 GiB/s: 3 GiB away is half a second, 12 MiB about two milliseconds, and 3 MiB
        // (half a millisecond) is held at the shortest interval.
        assert_eq!(interval_for(0, 3 * GI, 6 * GI), Duration::from_millis(500));
        assert_eq!(interval_for(10 * GI, 10 * GI + 12 * MI, 6 * GI), Duration::from_nanos(1_953_125));
        assert_eq!(interval_for(10 * GI, 10 * GI + 3 * MI, 6 * GI), MIN_INTERVAL);
        // Far away, a read a second; at or past the level, the shortest interval.
        assert_eq!(interval_for(0, 100 * GI, 6 * GI), MAX_INTERVAL);
        assert_eq!(interval_for(5 * GI, GI, 6 * GI), MIN_INTERVAL);
        // A fill rate of 0 is treated as 1 byte/s, not a division by zero.
        assert_eq!(interval_for(0, GI, 0), MAX_INTERVAL);
    }

    /// Once it has fired, the poll reads nothing until a pass re-arms it: not every
    /// millisecond, at real-time priority, for a whole grace period.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_poll_that_fired_waits_for_the_rearm() {
        let d = tempfile::tempdir().unwrap();
        let node = fake_v1_node(d.path(), 5 * GI, 0);
        let (tx, mut rx) = mpsc::channel(8);
        let arm = Arc::new(Arm {
            level: AtomicU64::new(GI),
            generation: AtomicU64::new(0),
            rearmed: Notify::new(),
            reads: AtomicU64::new(0),
        });
        let task = tokio::spawn(poll_node(node, arm.clone(), GI, tx));
        assert_eq!(rx.recv().await.map(|w| w.cause), Some(WakeCause::Poll), "past the level: a wake");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let reads = arm.reads.load(Ordering::Relaxed);
        assert!(reads <= 2, "{reads} reads in 500 ms after firing");
        assert!(rx.try_recv().is_err(), "one wake per arming");
        // A re-arm (still past the level) lets it read and fire again at once.
        arm.generation.fetch_add(1, Ordering::AcqRel);
        arm.rearmed.notify_one();
        assert_eq!(rx.recv().await.map(|w| w.cause), Some(WakeCause::Poll));
        task.abort();
    }

    /// A v1 memory cgroup's files: `usage` of which `inactive_file` is inactive file pages.
    fn fake_v1_node(dir: &std::path::Path, usage: u64, inactive_file: u64) -> MemoryCgroup {
        std::fs::write(dir.join("memory.usage_in_bytes"), format!("{usage}\n")).unwrap();
        std::fs::write(
            dir.join("memory.stat"),
            format!("cache {inactive_file}\ntotal_inactive_file {inactive_file}\n"),
        )
        .unwrap();
        MemoryCgroup::new(dir, crate::node::cgroups::CgroupVersion::V1, false)
    }

    /// Usage at the limit, full of inactive cache: the working set decides, and the poll
    /// fires once anonymous memory has displaced enough cache to reach the level.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn past_the_level_by_usage_the_working_set_decides() {
        let d = tempfile::tempdir().unwrap();
        let node = fake_v1_node(d.path(), 4 * GI, 3 * GI);
        let (tx, mut rx) = mpsc::channel(8);
        let arm = Arc::new(Arm {
            level: AtomicU64::new(2 * GI),
            generation: AtomicU64::new(0),
            rearmed: Notify::new(),
            reads: AtomicU64::new(0),
        });
        assert_eq!(past_level(&node, 2 * GI).unwrap(), (false, GI, true), "1 GiB of working set");
        let task = tokio::spawn(poll_node(node, arm.clone(), GI, tx));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(rx.try_recv().is_err(), "usage past the level, the working set below it: no wake");
        // Anonymous memory displaces cache: usage stays, the working set reaches the level.
        fake_v1_node(d.path(), 4 * GI, 2 * GI);
        let woke = tokio::time::timeout(Duration::from_secs(2), rx.recv()).await;
        assert_eq!(woke.ok().flatten().map(|w| w.cause), Some(WakeCause::Poll));
        task.abort();
    }

    /// Just below the level by working set, past it by usage: the interval would be a
    /// millisecond, but memory.stat is read at most every `STAT_MIN_INTERVAL`.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn memory_stat_is_read_at_most_every_stat_interval() {
        let d = tempfile::tempdir().unwrap();
        let node = fake_v1_node(d.path(), 4 * GI, 2 * GI + MI);
        let (tx, _rx) = mpsc::channel(8);
        let arm = Arc::new(Arm {
            level: AtomicU64::new(2 * GI),
            generation: AtomicU64::new(0),
            rearmed: Notify::new(),
            reads: AtomicU64::new(0),
        });
        let task = tokio::spawn(poll_node(node, arm.clone(), 6 * GI, tx));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let reads = arm.reads.load(Ordering::Relaxed);
        let most = (Duration::from_secs(1).as_millis() / STAT_MIN_INTERVAL.as_millis()) as u64 + 2;
        assert!((most / 2..=most).contains(&reads), "{reads} reads in 1 s, at most {most}");
        task.abort();
    }

    #[test]
    fn below_the_level_by_usage_nothing_more_is_read() {
        let d = tempfile::tempdir().unwrap();
        let node = fake_v1_node(d.path(), GI, 0);
        std::fs::remove_file(d.path().join("memory.stat")).unwrap();
        assert_eq!(
            past_level(&node, 2 * GI).unwrap(),
            (false, GI, false),
            "usage alone, no memory.stat read"
        );
        assert!(past_level(&node, GI / 2).is_err(), "past the level, memory.stat is read");
    }
}
