//! The eBPF wake source: the kernel's programs (loaded by `crate::kernel::ebpf`) sum the
//! node's charge growth and emit a record into a ring buffer when it passes the watermark, when
//! reclaim starts, or when the OOM killer acts. This half drains the ring buffer, and after
//! every pass re-arms the watermark at half the distance to the nearest memory threshold (the
//! whole distance near it), so the kernel wakes evictd again just in time rather than on
//! every page.
//!
//! With the adaptive poll running, the charge programs are attached only within a band
//! below the nearest threshold, wide enough for the fastest fill the poll is set for to not
//! outrun an attach (`Band`): far from every threshold the allocation path runs no program
//! at all, and the poll alone watches.

use std::{
    path::PathBuf,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use evictd_common::WakeEvent;
use evictd_policy::{distance::nearest_memory_threshold, observations::Observations, policy::Threshold};
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::{mpsc, oneshot},
    task::JoinHandle,
};

use super::{
    NodeNow, SourceKind, SourceTask, Wake, WakeError, WakeOptions, WakeSource, WakeStats, monotonic_ns,
};
use crate::{
    kernel::{
        ebpf::{
            ChargeClock, Counters, KernelProbes, RingLosses, WakeRing,
            mover::{ChargeMover, Why},
        },
        sched,
    },
    node::{cgroup_names, signals::NodeSignalSources},
    vocab::{ChargeTier, OnKilled, WakeCause},
};

/// How often the charge programs' scope is walked again without the pod list changing.
const SCOPE_BACKSTOP: Duration = Duration::from_secs(30);
/// A scope walk still running after this is warned about.
const SLOW_WALK: Duration = Duration::from_secs(10);

/// How far ahead the kernel should wake evictd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watermark {
    /// Half the distance to the nearest memory threshold, at least `MIN_AUTO_WATERMARK`;
    /// within twice that of it, the whole distance (`watermark_for`).
    Auto,
    /// A fixed number of bytes of growth (0: every page, for measuring).
    Fixed(u64),
}

/// Below this, wakes on the way to a threshold would come faster than observing is worth,
/// and memory a tenant charges and frees again within it cancels in the count; only the
/// rationed steps that land a wake on a threshold (`FineSteps`) go below it.
pub const MIN_AUTO_WATERMARK: u64 = 1 << 20;
/// The smallest fine step (`FineSteps`): after a pass that read memory closer than this to a
/// threshold, the wake comes at most this far past it, plus what the kernel holds back from
/// the count (the CPUs' unflushed charge, `ChargeSplit`; on the batched hook, the rest of
/// the 64-page batch that reaches it). The stat tracepoints count pages put to use, not the
/// batch the kernel charges ahead of them: a crossing made by that precharge alone waits for
/// the next pages used, or the timer.
pub const MIN_NEAR_WATERMARK: u64 = 64 << 10;
/// At most this many steps below `MIN_AUTO_WATERMARK` a source arms per `FINE_WINDOW`.
const FINE_STEPS: u32 = 16;
const FINE_WINDOW: Duration = Duration::from_millis(100);
/// With no memory threshold at all, still look after this much growth.
const NO_THRESHOLD_WATERMARK: u64 = 256 << 20;

/// How far memory is from its nearest threshold, as far as evictd knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Distance {
    /// available − threshold quantity of the nearest memory threshold.
    Known(i64),
    /// There are memory thresholds, but the signal could not be read: it may be right there.
    Unknown,
    /// No memory threshold is configured at all.
    NoMemoryThreshold,
}

impl Distance {
    pub fn of(thresholds: &[Threshold], obs: &Observations) -> Self {
        match nearest_memory_threshold(thresholds, obs) {
            Some((_, d)) => Distance::Known(d),
            None if thresholds.iter().any(|t| t.signal.is_memory()) => Distance::Unknown,
            None => Distance::NoMemoryThreshold,
        }
    }

    /// The distance less `bytes` charged since it was read; down to 0 at most where the
    /// threshold was not met (that the count may have crossed it says not that it did: the
    /// count holds charges outside the node, and frees are not taken off).
    pub fn less_charged(self, bytes: u64) -> Self {
        match self {
            Distance::Known(d) if d >= 0 => {
                Distance::Known(d.saturating_sub(i64::try_from(bytes).unwrap_or(i64::MAX)).max(0))
            }
            other => other,
        }
    }

    /// Whether `bytes` charged since the distance was read may have crossed the threshold
    /// it was not past.
    pub fn may_have_crossed(self, bytes: u64) -> bool {
        matches!(self, Distance::Known(d) if d >= 0 && bytes > 0 && bytes >= d as u64)
    }
}

/// The watermark for a given distance to the nearest threshold: half of it, in steps that
/// shrink towards the threshold, down to `MIN_AUTO_WATERMARK`; closer than twice that, the
/// whole distance, so that the wake lands on the threshold rather than up to a floor past it
/// — below the floor (at least `MIN_NEAR_WATERMARK`) only as `fine` allows. Past the
/// threshold (met: the distance is below 0), and when the distance is not known (the
/// threshold may be right there), the floor; never the no-threshold default.
pub fn watermark_for(mode: Watermark, distance: Distance, fine: &mut FineSteps) -> u64 {
    match (mode, distance) {
        (Watermark::Fixed(b), _) => b,
        (Watermark::Auto, Distance::NoMemoryThreshold) => NO_THRESHOLD_WATERMARK,
        (Watermark::Auto, Distance::Unknown) => MIN_AUTO_WATERMARK,
        (Watermark::Auto, Distance::Known(d)) if d < 0 => MIN_AUTO_WATERMARK,
        (Watermark::Auto, Distance::Known(d)) if (d as u64) / 2 >= MIN_AUTO_WATERMARK => d as u64 / 2,
        (Watermark::Auto, Distance::Known(d)) if d as u64 >= MIN_AUTO_WATERMARK => d as u64,
        (Watermark::Auto, Distance::Known(d)) if fine.take(Instant::now()) => {
            (d as u64).max(MIN_NEAR_WATERMARK)
        }
        (Watermark::Auto, Distance::Known(_)) => MIN_AUTO_WATERMARK,
    }
}

/// A source's budget of steps below `MIN_AUTO_WATERMARK`: `FINE_STEPS` per `FINE_WINDOW`.
/// An approach takes a few: the first wake comes early by what the kernel held back, and
/// every pass re-arms every source, so the other sources' wakes in the last MiB (eventfd,
/// PSI, reclaim, the timer) each take one too. A tenant churning memory within 1 MiB of a
/// threshold, each churn a wake under a fine step, gets at most `FINE_STEPS` such wakes a
/// window (~2 % of a CPU), and beyond them the floor's tolerance of ~1 MiB of churn that
/// cancels; so can a storm of other wakes there use them up, and the floor is then the
/// rule this replaced.
#[derive(Debug, Default)]
pub struct FineSteps {
    window: Option<Instant>,
    taken: u32,
}

impl FineSteps {
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        if self.window.is_none_or(|w| now.duration_since(w) >= FINE_WINDOW) {
            self.window = Some(now);
            self.taken = 0;
        }
        self.taken = self.taken.saturating_add(1);
        self.taken <= FINE_STEPS
    }
}

/// Where the charge programs are attached: within `attach_within` bytes of the nearest memory
/// threshold; detached again only beyond `detach_beyond`, so that they never flap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Band {
    pub attach_within: u64,
    pub detach_beyond: u64,
}

/// An attach can take up to ~60 ms when the tracepoint lost its last program moments before
/// (the kernel waits for an RCU grace period); twice that is the time the band must buy.
const ATTACH_BUDGET: Duration = Duration::from_millis(120);

impl Band {
    /// The band for a fill of up to `fill_rate` bytes per second (the poll's setting).
    pub fn for_fill_rate(fill_rate: u64) -> Self {
        let within = (fill_rate as f64 * ATTACH_BUDGET.as_secs_f64()) as u64;
        let within = within.max(MIN_AUTO_WATERMARK);
        Band { attach_within: within, detach_beyond: within.saturating_mul(2) }
    }

    /// Whether the charge programs should be attached now, given where they are. Not knowing
    /// the distance means near; no memory threshold at all means nothing to watch.
    pub fn wants_attached(&self, distance: Distance, attached: bool) -> bool {
        match distance {
            Distance::Known(d) if attached => d <= self.detach_beyond as i64,
            Distance::Known(d) => d <= self.attach_within as i64,
            Distance::Unknown => true,
            Distance::NoMemoryThreshold => false,
        }
    }
}

struct EbpfWake {
    probes: KernelProbes,
    mode: Watermark,
    watermark: Option<u64>,
    fine: FineSteps,
    /// `None`: the charge programs stay attached (no poll to watch while they are not).
    band: Option<Band>,
    /// The thread that attaches and detaches the charge programs for the band; `None` where
    /// there is no band, or its thread could not be made (the pass moves them itself).
    mover: Option<ChargeMover>,
    /// The pass's own last move failed (warned once until one works again).
    band_failing: bool,
    /// When a cgroup plays the node, only its subtree's charge counts.
    scope: Option<PathBuf>,
    /// The scope's walk of that subtree, on the blocking pool, and when it began: at 110
    /// pods it lists thousands of cgroupfs entries (tens of ms), and on the daemon's thread
    /// it held every wake behind it. The walk asks for a pass when it is done, which puts its
    /// ids in the map and re-arms on the node as read then.
    scope_walk: Option<(oneshot::Receiver<Vec<u64>>, Instant)>,
    /// Where the walk asks for that pass.
    wakes: mpsc::Sender<Wake>,
    /// Cgroups may have changed since the last walk began.
    scope_stale: bool,
    /// When the last walk began.
    scope_walked: Instant,
    /// A walk ran longer than `SLOW_WALK` (warned once per walk).
    slow_walk_warned: bool,
    /// The batched hook's watched cgroup: its directory, and the id (inode) the hook
    /// compares with, which changes when the directory is made again at the same path.
    watch: Option<(PathBuf, u64)>,
    task: SourceTask<std::io::Result<()>>,
}

pub fn start(
    opts: &WakeOptions,
    signals: &NodeSignalSources,
    tx: mpsc::Sender<Wake>,
    stats: Arc<WakeStats>,
) -> Result<Box<dyn WakeSource>, WakeError> {
    let (mut probes, ring) = KernelProbes::load(&opts.load)?;
    for prog in probes.programs.iter().filter(|p| p.error.is_none()) {
        tracing::info!(tracepoint = %prog.tracepoint, "eBPF wake source attached");
    }
    let wakes = tx.clone();
    let task = spawn_ring_buffer(ring, tx, stats).map_err(WakeError::RingBuffer)?;
    let scope = (!signals.node.is_root).then(|| signals.node.dir.clone());
    let mut watch = None;
    if probes.has_batch_hook() {
        let dir = signals.node.dir.clone();
        let node_id = cgroup_names::cgroup_id(&dir)
            .map_err(|e| WakeError::NodeCgroup { path: dir.clone(), source: e })?;
        probes.watch(node_id)?;
        tracing::info!(
            node_cgroup_id = node_id,
            "batched charge hook (fexit page_counter_try_charge) watches the node"
        );
        watch = Some((dir, node_id));
    }
    let band =
        (opts.charge_probes_near && opts.sources.contains(&SourceKind::Poll) && probes.has_charge_programs())
            .then(|| Band::for_fill_rate(opts.poll_fill_rate));
    // Started on the daemon's thread (after `realtime::enter`): the mover takes its priority.
    let mover = band.and_then(|_| {
        ChargeMover::start(probes.charge_switch(), sched::fifo_priority())
            .inspect_err(|e| {
                tracing::warn!(
                    "cannot start the charge programs' mover thread ({e}): passes attach them themselves"
                )
            })
            .ok()
    });
    if let Some(b) = band {
        tracing::info!(
            attach_within_mib = b.attach_within >> 20,
            detach_beyond_mib = b.detach_beyond >> 20,
            "charge programs attached only near a memory threshold"
        );
    }
    // The first scope is walked here, before any charge program can count.
    probes.set_scope(scope.as_deref().map(cgroup_names::subtree_ids).as_deref())?;
    let source = EbpfWake {
        probes,
        mode: opts.watermark,
        watermark: None,
        fine: FineSteps::default(),
        band,
        mover,
        band_failing: false,
        scope,
        scope_walk: None,
        wakes,
        scope_stale: false,
        scope_walked: Instant::now(),
        slow_walk_warned: false,
        watch,
        task: SourceTask::new("the eBPF wake source's ring-buffer reader", task),
    };
    Ok(Box::new(source))
}

impl WakeSource for EbpfWake {
    fn kind(&self) -> SourceKind {
        SourceKind::Ebpf
    }

    fn rearm(&mut self, node: &NodeNow) -> Result<(), WakeError> {
        let read = Distance::of(node.thresholds, node.observations);
        // The band on the distance as read: what the count holds beyond the node's growth
        // (other cgroups, no frees) must not attach the programs far from every threshold,
        // and each attach begins a new epoch of the count (the pods' bounds start over).
        if let Some(band) = self.band {
            self.follow_band(band, read);
        }
        self.follow_scope()?;
        // Counted from the re-arm: what was charged between the read and now is not.
        let distance = read.less_charged(node.charged_since_read);
        let w = watermark_for(self.mode, distance, &mut self.fine);
        self.probes.rearm(w)?;
        self.watermark = Some(w);
        Ok(())
    }

    fn charge_probes_attached(&self) -> Option<bool> {
        self.probes.has_charge_programs().then(|| self.probes.charge_attached())
    }

    /// The names `evictd probe` gives the tiers.
    fn charge_tier(&self) -> Option<ChargeTier> {
        // Without charge programs this source wakes on reclaim and OOM kills only.
        Some(self.probes.charge_tier()).filter(|t| *t != ChargeTier::AdaptivePoll)
    }

    /// New pods mean new cgroups whose charge must count; a node cgroup made again at the
    /// same path is a new cgroup the hook must watch instead of the old one's id.
    fn cgroups_changed(&mut self) -> Result<(), WakeError> {
        self.scope_stale = self.scope.is_some();
        self.follow_scope()?;
        self.follow_watched_cgroup()
    }

    /// A cgroup made below the node without the pod list changing (by hand, or a runtime's
    /// own) is in the scope within `SCOPE_BACKSTOP`.
    fn each_second(&mut self) -> Result<(), WakeError> {
        if self.scope.is_some() && self.scope_walked.elapsed() >= SCOPE_BACKSTOP {
            self.scope_stale = true;
        }
        self.follow_scope()?;
        self.follow_watched_cgroup()
    }

    /// The ring-buffer reader ends only on an error of the ring buffer's fd; without it no
    /// kernel event arrives, so the source is gone (and the others carry on).
    fn supervise(&mut self) -> Result<(), WakeError> {
        self.task.check_running()
    }

    fn kernel_counters(&self) -> Option<Counters> {
        self.probes.counters().inspect_err(|e| tracing::warn!("reading eBPF counters: {e}")).ok()
    }

    fn watermark(&self) -> Option<u64> {
        self.watermark
    }

    /// The programs count every page charged, whichever tier attached.
    fn charge_clock(&self) -> Option<ChargeClock> {
        Some(self.probes.charge_clock())
    }

    /// A killed pod's exit uncharges every page it held, and each uncharge runs the memcg
    /// stat programs (freed per GiB ~25 % slower with them attached): they come off once
    /// evictd's fast kill has signalled the pod, when nothing is left for a charge wake to
    /// escalate, and the pass after the eviction attaches them again if a threshold is still
    /// within the band. Only where the band detaches them anyway (the poll runs, and watches
    /// again from that pass on). The batched hook runs on charges only, never on an exit.
    fn on_killed(&self) -> Option<OnKilled> {
        self.band?;
        if let Some(mover) = self.mover.clone().filter(ChargeMover::alive) {
            return Some(OnKilled::new(move || mover.request(false, Why::Exit)));
        }
        let switch = self.probes.charge_switch();
        Some(OnKilled::new(move || {
            let switch = switch.clone();
            drop(tokio::task::spawn_blocking(move || {
                if switch.detach().unwrap_or(0) > 0 {
                    tracing::info!("charge programs detached while an evicted pod exits");
                }
            }));
        }))
    }
}

impl EbpfWake {
    /// Puts a finished walk's ids in the scope, and starts a walk when the pod list changed
    /// since the last one began — only while the charge programs are attached, the one time
    /// the scope is read: far from every threshold evictd walks nothing. A new pod's charge
    /// counts once its walk is done and the pass the walk asks for puts it in place (within
    /// the inventory's period and the walk); that pass re-arms on the node as read, what the
    /// pod was charged before included, and the poll, where it runs, sees the pod meanwhile.
    fn follow_scope(&mut self) -> Result<(), WakeError> {
        if let Some((rx, began)) = &mut self.scope_walk {
            match rx.try_recv() {
                Ok(ids) => {
                    self.scope_walk = None;
                    self.probes.set_scope(Some(&ids))?;
                }
                Err(oneshot::error::TryRecvError::Empty) => {
                    if began.elapsed() > SLOW_WALK && !self.slow_walk_warned {
                        self.slow_walk_warned = true;
                        tracing::warn!(
                            "the walk of the node cgroup's subtree for the charge programs' scope has run for over {SLOW_WALK:?}: pods started since the last walk are seen by the poll only"
                        );
                    }
                    return Ok(());
                }
                // The walk panicked: walk again.
                Err(oneshot::error::TryRecvError::Closed) => {
                    self.scope_walk = None;
                    self.scope_stale = true;
                }
            }
        }
        let Some(dir) = self.scope.as_ref().filter(|_| self.scope_stale && self.probes.charge_attached())
        else {
            return Ok(());
        };
        let (tx, rx) = oneshot::channel();
        let (dir, wakes) = (dir.clone(), self.wakes.clone());
        drop(tokio::task::spawn_blocking(move || {
            if tx.send(cgroup_names::subtree_ids(&dir)).is_ok() {
                // A new pod's charge counted from here only: the watermark, armed on a count
                // that missed what the pod was charged before its cgroup was in the scope,
                // would wake that much late (hundreds of MiB for a pod that allocates as it
                // starts). A pass puts the scope in place and re-arms on the node as read,
                // that charge included. A full channel means a pass is coming anyway.
                let _ = wakes.try_send(Wake::now(WakeCause::Recheck));
            }
        }));
        self.scope_walk = Some((rx, Instant::now()));
        (self.scope_stale, self.scope_walked, self.slow_walk_warned) = (false, Instant::now(), false);
        Ok(())
    }

    /// While the node cgroup is gone there is nothing to watch (the poll says it cannot read
    /// it); once it is back, under a new id, the hook watches that.
    fn follow_watched_cgroup(&mut self) -> Result<(), WakeError> {
        let Some((dir, id)) = &mut self.watch else { return Ok(()) };
        let Ok(now) = cgroup_names::cgroup_id(dir) else { return Ok(()) };
        if now != *id {
            self.probes.watch(now)?;
            tracing::info!(
                node_cgroup_id = now,
                was = *id,
                "the node cgroup was made again: the batched charge hook watches the new one"
            );
            *id = now;
        }
        Ok(())
    }

    /// Attaches the charge programs on entering the band, detaches them on leaving it, by
    /// asking the mover (`ChargeMover`): an attach moments after the act step detached them
    /// waits for an RCU grace period (5–20 ms here), and the pass, the daemon's thread with
    /// it, must not. The band's state is the mover's latest request (the act step's detach
    /// included); a pass asks again while the programs are not where it asked and the mover
    /// is idle (a move that failed, or only partly). Meanwhile the poll watches, as it does
    /// while they are detached.
    fn follow_band(&mut self, band: Band, distance: Distance) {
        let Some(mover) = self.mover.as_ref().filter(|m| m.alive()) else {
            return self.move_in_pass(band, distance);
        };
        let asked = mover.wanted();
        let wanted = band.wants_attached(distance, asked);
        let settled = if wanted { self.probes.charge_complete() } else { !self.probes.charge_attached() };
        if wanted != asked || (!settled && mover.idle()) {
            mover.request(wanted, if wanted { Why::Near } else { Why::Far });
        }
    }

    /// `follow_band` without a mover thread (it could not be made, or a move panicked): the
    /// pass attaches or detaches the programs itself, and waits for it.
    fn move_in_pass(&mut self, band: Band, distance: Distance) {
        let attached = self.probes.charge_attached();
        let wanted = band.wants_attached(distance, attached);
        if wanted == attached && (!wanted || self.probes.charge_complete()) {
            return;
        }
        let switch = self.probes.charge_switch();
        let t = Instant::now();
        let done = if wanted {
            switch.attach().unwrap_or(Ok(0)).map(|_| ())
        } else {
            let _ = switch.detach();
            Ok(())
        };
        if let Err(e) = done {
            if !self.band_failing {
                tracing::warn!("{e}; tried again at every pass");
            }
            self.band_failing = true;
            return;
        }
        self.band_failing = false;
        tracing::info!(
            ?distance,
            took_us = t.elapsed().as_micros() as u64,
            "charge programs {}",
            if wanted {
                "attached: a memory threshold is near"
            } else {
                "detached: every memory threshold is far"
            }
        );
    }
}

/// Drains the eBPF ring buffer on every readiness and forwards each event.
pub fn spawn_ring_buffer(
    wake_ring: WakeRing,
    tx: mpsc::Sender<Wake>,
    stats: Arc<WakeStats>,
) -> std::io::Result<JoinHandle<std::io::Result<()>>> {
    let WakeRing { ring, mut losses } = wake_ring;
    let mut warned = false;
    // SAFETY: the RingBuf owns its map fd and keeps it open, unchanged, for as long as it
    // lives, and the AsyncFd owns the RingBuf.
    let mut fd =
        unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }.map_err(std::io::Error::from)?;
    Ok(tokio::spawn(async move {
        loop {
            let mut guard = fd.readable_mut().await?;
            let ring = guard.get_inner_mut();
            let now = monotonic_ns();
            let mut drained = 0;
            while let Some(item) = ring.next() {
                drained += item.len() + RING_RECORD_HEADER;
                let wake = (item.len() >= size_of::<WakeEvent>())
                    // SAFETY: the record holds at least a WakeEvent, which is plain integers
                    // (any bit pattern valid); read_unaligned because the ring gives no alignment promise.
                    .then(|| unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<WakeEvent>()) })
                    .and_then(|ev| Wake::from_kernel(&ev, now));
                let Some(wake) = wake else {
                    stats.malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                match tx.try_send(wake) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        stats.channel_full.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return Ok(()),
                }
            }
            if report_losses(&mut losses, drained, &mut warned, &tx, &stats) {
                return Ok(());
            }
            guard.clear_ready();
        }
    }))
}

/// The kernel's header before each ring-buffer record (`BPF_RINGBUF_HDR_SZ`); records are
/// padded to 8 bytes, which a wake event fills exactly.
const RING_RECORD_HEADER: usize = 8;
const _: () = assert!(size_of::<WakeEvent>().is_multiple_of(8));

/// A wake per cause of which the kernel lost events to a full ring (`RingLosses`), kept
/// until the channel takes it; true when the daemon is gone. Counts that cannot be read
/// are warned about once (`warned`), and looked at again after the next drain.
fn report_losses(
    losses: &mut RingLosses,
    drained: usize,
    warned: &mut bool,
    tx: &mpsc::Sender<Wake>,
    stats: &WakeStats,
) -> bool {
    if let Err(e) = losses.after_drain(drained)
        && !std::mem::replace(warned, true)
    {
        tracing::warn!("the ring buffer's lost-event counts cannot be read: {e}");
    }
    for cause in RingLosses::REPORTED {
        if !losses.unreported(cause) {
            continue;
        }
        let Some(wake_cause) = WakeCause::from_kernel(cause) else {
            losses.reported(cause);
            continue;
        };
        match tx.try_send(Wake::lost(wake_cause)) {
            Ok(()) => losses.reported(cause),
            Err(mpsc::error::TrySendError::Full(_)) => {
                stats.channel_full.fetch_add(1, Ordering::Relaxed);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return true,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_band_attaches_near_detaches_far_and_never_flaps() {
        const MI: u64 = 1 << 20;
        // 6 GiB/s for 120 ms: ~737 MiB; detached again beyond twice that.
        let band = Band::for_fill_rate(6 << 30);
        assert_eq!(band.attach_within, 6 * 1024 * MI * 12 / 100);
        assert_eq!(band.detach_beyond, 2 * band.attach_within);
        let at = |mib: i64| Distance::Known(mib * MI as i64);
        // Far: stays detached; inside: attaches.
        assert!(!band.wants_attached(at(5000), false));
        assert!(band.wants_attached(at(700), false));
        // Between the two edges it keeps its state, whichever it is.
        assert!(!band.wants_attached(at(1000), false));
        assert!(band.wants_attached(at(1000), true));
        assert!(!band.wants_attached(at(1500), true));
        // Past the threshold, or not knowing where memory is: attached.
        assert!(band.wants_attached(at(-10), false));
        assert!(band.wants_attached(Distance::Unknown, false));
        assert!(!band.wants_attached(Distance::NoMemoryThreshold, true));
        // A tiny fill rate still gets a band of the watermark's floor.
        assert_eq!(Band::for_fill_rate(1).attach_within, MIN_AUTO_WATERMARK);
    }

    /// What was charged since the read comes off the distance a source arms on, down to 0
    /// (the finest step), where the threshold was not met; a met one stays met; a distance
    /// not known stays so.
    #[test]
    fn the_distance_read_loses_what_was_charged_since() {
        const MI: i64 = 1 << 20;
        let mut fine = FineSteps::default();
        let armed = |d: Distance, fine: &mut FineSteps| watermark_for(Watermark::Auto, d, fine);
        let read = Distance::Known(10 * MI);
        assert_eq!(read.less_charged(3 << 20), Distance::Known(7 * MI));
        assert_eq!(armed(read.less_charged(3 << 20), &mut fine), 7 << 19, "half of what is left");
        assert!(!read.may_have_crossed(3 << 20) && !read.may_have_crossed(0));
        assert_eq!(read.less_charged(11 << 20), Distance::Known(0));
        assert!(read.may_have_crossed(11 << 20) && read.may_have_crossed(10 << 20));
        assert_eq!(armed(read.less_charged(11 << 20), &mut fine), MIN_NEAR_WATERMARK, "the finest step");
        assert_eq!(Distance::Known(-MI).less_charged(1 << 20), Distance::Known(-MI));
        assert!(!Distance::Known(-MI).may_have_crossed(1 << 20), "met already: no pass for it");
        assert!(!Distance::Known(0).may_have_crossed(0), "nothing charged: nothing crossed");
        assert_eq!(Distance::Unknown.less_charged(1 << 20), Distance::Unknown);
        assert_eq!(Distance::Known(i64::MAX).less_charged(u64::MAX), Distance::Known(0));
    }

    #[test]
    fn watermark_is_half_the_distance_then_the_distance_near_the_threshold() {
        let known = |d: i64| watermark_for(Watermark::Auto, Distance::Known(d), &mut FineSteps::default());
        assert_eq!(known(1 << 30), 1 << 29);
        assert_eq!(known(2 << 20), MIN_AUTO_WATERMARK);
        // Within twice the floor, the whole distance: the wake lands on the threshold.
        assert_eq!(known((2 << 20) - 4096), (2 << 20) - 4096);
        assert_eq!(known(300 << 10), 300 << 10);
        assert_eq!(known(1000), MIN_NEAR_WATERMARK);
        // On it, not met yet: the next page crosses.
        assert_eq!(known(0), MIN_NEAR_WATERMARK);
        // Past it (a soft threshold's grace period, an evicted pod's memory awaited): the
        // floor, not a wake on every page.
        assert_eq!(known(-5), MIN_AUTO_WATERMARK);
        // From anywhere below the threshold: within 2 MiB a wake at most the near floor past
        // it, never in steps smaller than that floor; beyond, half the distance.
        for d in (0..256).map(|k| k * (37 << 10)) {
            let (w, d) = (known(d), d as u64);
            if d < 2 * MIN_AUTO_WATERMARK {
                assert!(w <= d.max(MIN_NEAR_WATERMARK) && w >= MIN_NEAR_WATERMARK, "{d}: {w}");
            } else {
                assert_eq!(w, d / 2, "{d}");
            }
        }
        let mut fine = FineSteps::default();
        assert_eq!(
            watermark_for(Watermark::Auto, Distance::NoMemoryThreshold, &mut fine),
            NO_THRESHOLD_WATERMARK
        );
        assert_eq!(watermark_for(Watermark::Fixed(0), Distance::Known(1 << 30), &mut fine), 0);
    }

    /// Steps below the floor are rationed: a tenant churning memory 100 KiB from a threshold
    /// gets `FINE_STEPS` of them a window, then the floor until the window ends.
    #[test]
    fn steps_below_the_floor_are_rationed() {
        let start = Instant::now();
        let mut fine = FineSteps::default();
        let taken: Vec<bool> = (0..FINE_STEPS + 2).map(|_| fine.take(start)).collect();
        assert!(taken[..FINE_STEPS as usize].iter().all(|t| *t), "{taken:?}");
        assert!(!taken[FINE_STEPS as usize..].iter().any(|t| *t), "{taken:?}");
        assert!(!fine.take(start + FINE_WINDOW / 2), "still the same window");
        assert!(fine.take(start + FINE_WINDOW), "a new window");
        // What the watermark makes of it: the distance while steps are left, else the floor;
        // between 1 and 2 MiB the whole distance takes nothing from the budget.
        let near = Distance::Known(100 << 10);
        let mut spent = FineSteps { window: Some(Instant::now()), taken: FINE_STEPS };
        assert_eq!(watermark_for(Watermark::Auto, near, &mut spent), MIN_AUTO_WATERMARK);
        assert_eq!(watermark_for(Watermark::Auto, Distance::Known(3 << 19), &mut spent), 3 << 19);
        assert_eq!(watermark_for(Watermark::Auto, near, &mut FineSteps::default()), 100 << 10);
    }

    /// A node whose memory cannot be read has no "nearest threshold",
    /// which must mean the floor (it may be right there), not the no-threshold default.
    #[test]
    fn an_unreadable_node_arms_the_floor() {
        let mut warnings = Vec::new();
        let policy = evictd_policy::policy::build(&Default::default(), &mut warnings).unwrap();
        let unreadable = Observations::new();
        assert_eq!(Distance::of(&policy.thresholds, &unreadable), Distance::Unknown);
        assert_eq!(
            watermark_for(
                Watermark::Auto,
                Distance::of(&policy.thresholds, &unreadable),
                &mut FineSteps::default()
            ),
            MIN_AUTO_WATERMARK
        );
        let no_memory: Vec<Threshold> =
            policy.thresholds.iter().filter(|t| !t.signal.is_memory()).copied().collect();
        assert_eq!(Distance::of(&no_memory, &unreadable), Distance::NoMemoryThreshold);
    }
}
