//! One pass of observe → decide → act, run on every wake. Cheap when nothing is near: the
//! engine first decides without pods, and only when a threshold is actionable are the pods'
//! cgroups read for ranking. One pod per decision, and one decision that evicts per pass
//! (its pod list is the inventory's when it began); when a kill fails the next candidate is
//! taken, as the kubelet does (unless the runtime itself is down: then the next pass tries
//! again); after a memory eviction no memory decision evicts again until the evicted pod's
//! memory is back, for at most 30 s, unless in an emergency (the kubelet's
//! `waitForPodsCleanup`). The daemon runs each pass in a task of its own.
//!
//! The steps each have a file: `storage_limits` (the kubelet's `localStorageEviction`),
//! `disk` (`reclaimNodeLevelResources` and the settle after it), `evict_pod` (candidates,
//! ranking's pick, the act step and the record), `cleanup` (the wait for the evicted pod's
//! memory).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use evictd_policy::{
    engine::{self, EngineState},
    local_storage::LimitEviction,
    observations::Observations,
    policy::{NodeCondition, Policy, Resource, Signal, Threshold},
    rank::{FsLayout, PodEntry},
    summary::PodStats,
};
use tokio::sync::watch;

use super::{KillOptions, PressureOptions, urgency};
use crate::{
    cluster::reporter::Reporter,
    kernel::ebpf::{ChargeClock, ChargeMark},
    node::{cgroups::CgroupMounts, signals::NodeSignalSources},
    runtime::{
        cri::CriClient,
        disk_usage::DiskWalker,
        evict::{self, StopPlan},
        inventory::{PodList, PodRecord},
        kill::KillTarget,
        reclaim, usage,
    },
    vocab::{Escalation, EvictionCause, EvictionRecord, OnKilled, monotonic_ns},
    wake::Wake,
};

mod cleanup;
mod disk;
mod evict_pod;
mod storage_limits;

use cleanup::Cleanup;
use disk::{DiskCleanup, DiskSettle};

/// The wake a pass answers, stamped on its first record: detection is timed from it.
fn answer_wake(records: &mut [EvictionRecord], wake: Option<Wake>) {
    if let (Some(w), Some(first)) = (wake, records.first_mut()) {
        first.wake_cause = Some(w.cause);
        first.wake_kernel_ts_ns = w.kernel_ts_ns;
        first.wake_received_ns = Some(w.received_ns);
    }
}

/// A flag set while a job is queued or running, cleared when the job is dropped however it
/// ends: done, given up, panicked, or dropped unrun with the queue of a thread that ended.
struct ClearOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// How often a repeated warning may be logged.
const WARN_EVERY: Duration = Duration::from_secs(10);

pub struct Pressure {
    pub policy: Policy,
    pub thresholds: Vec<Threshold>,
    pub layout: FsLayout,
    pub signals: NodeSignalSources,
    pub cgroups: CgroupMounts,
    pub client: Option<CriClient>,
    pub dry_run: bool,
    pub release_timeout: Duration,
    pub kill: KillOptions,
    pub own_pod_uid: Option<String>,
    pub evict_inferred_kube_system: bool,
    /// The pods' logs and volumes, walked by a thread of its own (`None`: not started), and
    /// since when a disk threshold is met (a walk from before cannot rank for it).
    pub disk_walker: Option<DiskWalker>,
    /// The thread the decision's cgroup reads run on, at the daemon thread's priority
    /// (`None`: the blocking pool).
    pub reader: Option<super::realtime::Reader>,
    /// The pods' usage files, kept open for memory decisions; shared with the reader, which
    /// holds them only while it reads.
    usage_files: Arc<std::sync::Mutex<usage::PodUsageFiles>>,
    /// The pod list the usage files were last opened for, and whether that opening was
    /// skipped (the files held by a reader given up on): then the next pass opens them again.
    usage_files_for: Option<PodList>,
    usage_files_skipped: Arc<std::sync::atomic::AtomicBool>,
    /// Whether an opening of the usage files is queued or running on the reader: one at a
    /// time, so that a reader stuck in a read does not pile up a job (and a pod list) for
    /// every new list.
    usage_files_following: Arc<std::sync::atomic::AtomicBool>,
    /// The node's charge count (the eBPF source's), which bounds a pod's growth since its
    /// usage was last read (`refresh_usage_reads`, `read_memory_candidates`).
    pub charge_clock: Option<ChargeClock>,
    /// The charge count just before the last pass read the node (`charged_since_read`).
    count_at_read: Option<u64>,
    /// When the pods' usage was last read for bounds, and the charge count before it; and
    /// whether that read is still going (one at a time).
    usage_refreshed: Option<(Instant, ChargeMark)>,
    refreshing: Arc<std::sync::atomic::AtomicBool>,
    /// The pods' usage reads of this decision's memory reads (every try), for its record.
    pods_read: Option<usize>,
    disk_met_since: Option<Instant>,
    /// When a walk was last asked for.
    disk_walk_asked: Option<Instant>,
    /// Since when this disk pressure episode waits for the runtime's writable-layer stats
    /// (`layers_unmeasured`), and whether a pass waits for the next pod list to bring them.
    layers_wait_since: Option<Instant>,
    awaiting_layers: bool,
    /// Whether pod specs come from the Kubernetes API: then an inferred one is a guess
    /// while the API is late, evicted only at an emergency.
    pub specs_from_api: bool,
    /// Where evictions are recorded in Kubernetes (`None`: no API, or a dry run).
    pub api: Option<Reporter>,
    /// The node conditions of the last decision (the kubelet's, reported as evictd's own).
    pub conditions: Vec<NodeCondition>,
    /// Raised by the daemon while a stop runs (see `urgency`).
    pub escalate: watch::Receiver<Escalation>,
    /// What a wake source does while a killed pod exits (`WakeSource::on_killed`).
    pub on_killed: Option<OnKilled>,
    state: EngineState,
    /// When each image was first seen, kept current by a task of its own: node-level
    /// reclaim keeps young ones.
    pub image_ages: reclaim::SharedImageAges,
    /// Sandboxes evicted, with the containers the eviction stopped, until the inventory
    /// stops listing them.
    gone: BTreeMap<String, BTreeSet<String>>,
    last_warning: Option<(String, Instant)>,
    /// Set by node-level reclaim that removed something, or a disk eviction: for
    /// `DISK_SETTLE` no pod is evicted for a disk signal.
    disk_settle: Option<DiskSettle>,
    /// When node-level reclaim last removed nothing and left the pressure: it is not run
    /// again for a housekeeping period (`reclaim_due`), unless a pod is evicted meanwhile.
    reclaimed_in_vain: Option<Instant>,
    /// Pods evicted for disk (a disk signal, or their own storage limits), until they are
    /// torn down (`awaits_disk_cleanup`).
    disk_cleanups: Vec<DiskCleanup>,
    /// Whether a read of their volume directories is still under way (`read_teardowns`).
    teardown_reading: Arc<std::sync::atomic::AtomicBool>,
    /// How often pods are checked against their own ephemeral-storage limits, and when
    /// they last were.
    storage_limit_period: Duration,
    limits_checked: Option<Instant>,
    /// Whether the last storage-limit check was cut short for memory: the next is not run
    /// while a hard memory threshold is still met and no memory decision has run since.
    limits_cut: bool,
    /// Pods evicted for memory whose memory is awaited before the next memory eviction, and
    /// for how long at most.
    cleanups: Vec<Cleanup>,
    cleanup_window: Duration,
    /// Whether the last decision met a threshold: only then does a pass look again for the
    /// awaited memory without a wake.
    threshold_met: bool,
}

impl Pressure {
    pub fn new(
        policy: Policy,
        opts: PressureOptions,
        cgroups: CgroupMounts,
        client: Option<CriClient>,
        escalate: watch::Receiver<Escalation>,
    ) -> Self {
        let thresholds = engine::thresholds_for_layout(&policy, opts.fs_layout);
        Pressure {
            policy,
            thresholds,
            layout: opts.fs_layout,
            signals: opts.signals,
            cgroups,
            client,
            dry_run: opts.dry_run,
            release_timeout: opts.release_timeout,
            kill: opts.kill,
            own_pod_uid: opts.own_pod_uid,
            evict_inferred_kube_system: opts.evict_inferred_kube_system,
            specs_from_api: false,
            disk_walker: None,
            reader: None,
            usage_files: Default::default(),
            usage_files_for: None,
            usage_files_skipped: Default::default(),
            usage_files_following: Default::default(),
            charge_clock: None,
            count_at_read: None,
            usage_refreshed: None,
            refreshing: Default::default(),
            pods_read: None,
            disk_met_since: None,
            disk_walk_asked: None,
            layers_wait_since: None,
            awaiting_layers: false,
            api: None,
            conditions: Vec::new(),
            escalate,
            on_killed: None,
            state: EngineState::default(),
            gone: BTreeMap::new(),
            image_ages: Default::default(),
            last_warning: None,
            disk_settle: None,
            reclaimed_in_vain: None,
            disk_cleanups: Vec::new(),
            teardown_reading: Default::default(),
            storage_limit_period: opts.storage_limit_period,
            limits_checked: None,
            limits_cut: false,
            cleanups: Vec::new(),
            threshold_met: false,
            cleanup_window: cleanup::CLEANUP_WINDOW,
        }
    }

    /// How often pods are checked against their own storage limits: the housekeeping period.
    pub fn storage_limit_period(&self) -> Duration {
        self.storage_limit_period
    }

    /// A re-read policy (SIGHUP): its thresholds for this node's disk layout, with the
    /// engine's state carried over (`engine::carry_over`).
    pub fn set_policy(&mut self, policy: Policy) {
        let thresholds = engine::thresholds_for_layout(&policy, self.layout);
        if let Some(w) = &self.disk_walker {
            w.walk_all(thresholds.iter().any(|t| t.signal.resource().is_disk()));
        }
        self.state = engine::carry_over(&self.state, &self.thresholds, &thresholds);
        self.thresholds = thresholds;
        self.policy = policy;
    }

    /// Bytes charged since the last pass began to read the node (`ChargeClock::bytes_since`):
    /// what its reading may be behind by when the sources re-arm on it.
    pub fn charged_since_read(&self) -> Option<u64> {
        self.charge_clock.as_ref()?.bytes_since(self.count_at_read?)
    }

    /// `observe`, with the charge count read just before (`charged_since_read`).
    fn observe_counted(&mut self, now_ns: i64) -> Observations {
        self.count_at_read = self.charge_clock.as_ref().and_then(ChargeClock::rough_pages);
        self.observe(now_ns)
    }

    pub fn observe(&self, now_ns: i64) -> Observations {
        let mut missing = Vec::new();
        let obs = self.signals.observe(now_ns, &mut missing);
        for m in missing {
            // No number, no decision on it: the signal simply has no observation.
            tracing::debug!(signal = %m.signal, "signal unreadable: {}", m.reason);
        }
        obs
    }

    /// Whether a hard memory threshold is met, read now: the node itself is short of memory,
    /// and its eviction is not to wait behind other work of the pass.
    fn hard_memory_threshold_met_now(&self, now_ns: i64) -> bool {
        urgency::hard_memory_threshold_met(&self.thresholds, &self.observe(now_ns))
    }

    /// The inventory changed: forget evicted sandboxes it no longer lists, and those whose
    /// containers run again (a sandbox the runtime failed to stop, restarted by the kubelet
    /// when the eviction's record did not land): that pod can be evicted again. True when a
    /// disk decision waits for this list (the writable layers it may bring): decide again.
    #[must_use]
    pub fn inventory_updated(&mut self, pods: &[Arc<PodRecord>]) -> bool {
        let restarted = |p: &PodRecord, stopped: &BTreeSet<String>| {
            p.containers.iter().any(|c| c.running && !stopped.contains(&c.id))
        };
        self.gone.retain(|id, stopped| pods.iter().any(|p| &p.sandbox_id == id && !restarted(p, stopped)));
        self.forget_restarted_cleanups(pods);
        std::mem::take(&mut self.awaiting_layers)
    }

    /// Observe, decide, act: at most one eviction for thresholds. `pods` is the inventory's
    /// latest snapshot; `housekeeping`: a wake of the batch asks for the storage-limit check.
    /// Returns what was done and the node's latest observation.
    pub async fn pass(
        &mut self,
        pods: &PodList,
        now_ns: impl Fn() -> i64,
        wake: Option<Wake>,
        housekeeping: bool,
    ) -> (Vec<EvictionRecord>, Observations) {
        let mut records =
            if housekeeping { self.evict_pods_over_storage_limits(pods, now_ns()).await } else { Vec::new() };
        if !records.is_empty() {
            let observed_ns = monotonic_ns();
            for rec in &mut records {
                rec.observed_ns = observed_ns;
            }
            answer_wake(&mut records, wake);
            // The kubelet returns the pods it evicted over their limits and leaves thresholds
            // to its next tick; so does this pass (its pod list is now a stop old: the next
            // one waits for a newer list). A dry run or failed stops evicted nobody.
            if records.iter().any(|r| r.error.is_none() && !r.dry_run) {
                return (records, self.observe_counted(now_ns()));
            }
        }
        // Stamped as the read begins (memory is read first), as the observations are.
        let observed_ns = monotonic_ns();
        let obs = self.observe_counted(now_ns());
        let mut decided = self.decide_and_act(pods, &obs, now_ns()).await;
        // Memory has had its decision: the pods over their storage limits are next.
        self.limits_cut = false;
        for rec in &mut decided {
            rec.observed_ns = observed_ns;
        }
        if records.is_empty() {
            answer_wake(&mut decided, wake);
        }
        let evicted = decided.iter().any(|r| r.error.is_none() && !r.dry_run);
        records.extend(decided);
        // One eviction per pass, on the pods the pass began with: the next decision waits for
        // the inventory that follows it (the daemon asks for one), since a pod started
        // meanwhile — maybe the one whose growth is the pressure — is not in this list, and
        // deciding again on it would take one bystander after another.
        let obs = if evicted { self.observe_counted(now_ns()) } else { obs };
        self.open_usage_files(pods);
        self.refresh_usage_reads(pods);
        (records, obs)
    }

    /// Forgets the jobs under way on a reader given up on (a refresh, an opening of the usage
    /// files): the next pass may begin them on the new reader.
    pub(super) fn reader_replaced(&mut self) {
        self.refreshing = Default::default();
        self.usage_files_following = Default::default();
        self.usage_files_for = None;
    }

    /// Reads every pod's usage again on the reader, after the pass, with the node's charge
    /// count before it, when the node was charged since the last such read: the next
    /// memory decision then reads only the pods whose usage could rank them first
    /// (`read_memory_candidates`) instead of every pod (~0.6 ms at 250 pods here). In chunks
    /// of `REFRESH_CHUNK` pods, each queued behind what the reader was given meanwhile, so a
    /// decision waits for one chunk at most; one read at a time, begun at most once per
    /// `REFRESH_EVERY`, so that a storm of wakes near a threshold costs at most ~3 % of a CPU.
    fn refresh_usage_reads(&mut self, pods: &PodList) {
        use std::sync::atomic::Ordering;
        const REFRESH_EVERY: Duration = Duration::from_millis(20);
        let (Some(clock), Some(reader)) = (&self.charge_clock, &self.reader) else { return };
        if !self.thresholds.iter().any(|t| t.signal.is_memory()) || self.refreshing.load(Ordering::Acquire) {
            return;
        }
        // The cheap test first: reading the count takes syscalls, on the daemon's thread.
        if self.usage_refreshed.is_some_and(|(at, _)| at.elapsed() < REFRESH_EVERY) {
            return;
        }
        let Some(now) = clock.now() else { return };
        if self.usage_refreshed.is_some_and(|(_, then)| clock.charged(then, now) == Some(0)) {
            return;
        }
        self.usage_refreshed = Some((Instant::now(), now));
        self.refreshing.store(true, Ordering::Release);
        let chain = RefreshChain {
            pods: pods.clone(),
            cgroups: self.cgroups.clone(),
            files: self.usage_files.clone(),
            clock: clock.clone(),
            submit: reader.submitter(),
            _refreshing: ClearOnDrop(self.refreshing.clone()),
        };
        let submit = chain.submit.clone();
        submit.submit(move || chain.chunk(0));
    }

    /// Opens the usage files of pods new to the list (and closes those of pods gone), and
    /// works out the specs' keys of every new list, on the reader, after the pass: otherwise
    /// the next memory decision does, on a node of 250 pods ~4 ms of opens (115 ms measured
    /// with the CPUs busy).
    fn open_usage_files(&mut self, pods: &PodList) {
        let memory = self.thresholds.iter().any(|t| t.signal.is_memory());
        if self.usage_files_skipped.swap(false, std::sync::atomic::Ordering::Relaxed) {
            self.usage_files_for = None;
        }
        // A list with the same cgroups opens nothing, but its specs' keys are worked out again
        // (`PodUsageFiles::follow`): here, rather than in the next decision.
        let followed = self.usage_files_for.as_ref().is_some_and(|p| Arc::ptr_eq(p, pods));
        if !memory || followed {
            return;
        }
        let Some(reader) = &self.reader else { return };
        let following = self.usage_files_following.clone();
        if following.swap(true, std::sync::atomic::Ordering::Relaxed) {
            // The last one has not run yet: the pass after it opens this list's.
            return;
        }
        self.usage_files_for = Some(pods.clone());
        let (pods, cgroups, files) = (pods.clone(), self.cgroups.clone(), self.usage_files.clone());
        let skipped = self.usage_files_skipped.clone();
        // Cleared when the job ends, also by a panic, or is dropped unrun with its thread.
        let done = ClearOnDrop(following);
        reader.submit(move || {
            let _done = done;
            match files.try_lock() {
                Ok(mut held) => held.follow(&pods, &cgroups),
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().follow(&pods, &cgroups),
                // Held by a reader given up on: the next pass tries again.
                Err(std::sync::TryLockError::WouldBlock) => {
                    skipped.store(true, std::sync::atomic::Ordering::Relaxed)
                }
            }
        });
    }

    /// One decision: first without pods (cheap, and all a wake far from any threshold
    /// costs), then the wait for the last evicted pod's memory, node-level reclaim for disk
    /// signals, then the pods' usage and the eviction of one pod. Returns its records: those of candidates whose kill failed, then
    /// the eviction (empty: nothing to do).
    async fn decide_and_act(&mut self, pods: &PodList, obs: &Observations, now: i64) -> Vec<EvictionRecord> {
        let t0 = Instant::now();
        let (state, first) = engine::decide(&self.input(obs, &[], now), &self.state);
        self.conditions.clone_from(&first.node_conditions);
        self.note_disk_pressure(&first);
        if !first.thresholds_met.iter().any(|&i| self.thresholds[i].signal.resource().is_disk()) {
            self.disk_pressure_over();
        }
        // The awaited memory stays awaited through a dip below the threshold (the victim's own
        // pages freed, a hair): pressure back while it is still charged is the same pressure,
        // and a second pod would go for it. A wait whose window ended in a dip (maybe with no
        // pass through it) held nothing back, and ends unsaid.
        let was_met = std::mem::replace(&mut self.threshold_met, !first.thresholds_met.is_empty());
        if !was_met || !self.threshold_met {
            self.forget_expired_cleanups(false);
        }
        if first.actionable.is_empty() {
            self.disk_settled();
            self.state = state;
            return Vec::new();
        }
        let signal = self.thresholds[first.actionable[0]].signal;
        let disk = self.drives_on_disk(&first);
        // Asked for first: the walk runs while node-level reclaim does.
        let walk_stale = disk && self.disk_walk_is_stale(pods);
        if self.awaits_cleanup(signal, obs).await
            || self.disk_settling(&first)
            || self.node_level_reclaim_resolves(&first, pods, now).await
            || (disk && self.awaits_disk_cleanup().await)
            || walk_stale
            || (disk && self.layers_unmeasured(pods))
        {
            self.state = state;
            return Vec::new();
        }
        // Something is actionable: now, and only now, read the pods' cgroups.
        let records = self.evict_one(pods, signal, disk, obs, now, t0).await;
        if disk && records.iter().any(|r| r.error.is_none() && !r.dry_run) {
            self.disk_settle = Some(DiskSettle::after("the eviction"));
        }
        records
    }

    fn input<'a>(&'a self, obs: &'a Observations, pods: &'a [PodEntry<'a>], now: i64) -> engine::Input<'a> {
        engine::Input {
            thresholds: &self.thresholds,
            policy: &self.policy,
            layout: self.layout,
            observations: obs,
            pods,
            now_ns: now,
            check_storage_limits: false,
        }
    }

    /// The same warning at most every `WARN_EVERY`: wakes come many times a second.
    fn warn_limited(&mut self, msg: String) {
        if !self.repeated(&msg) {
            tracing::warn!("{msg}");
        }
    }

    /// Whether `msg` was the last message said, less than `WARN_EVERY` ago; records it if not.
    fn repeated(&mut self, msg: &str) -> bool {
        let repeat = self.last_warning.as_ref().is_some_and(|(m, t)| m == msg && t.elapsed() < WARN_EVERY);
        if !repeat {
            self.last_warning = Some((msg.to_owned(), Instant::now()));
        }
        repeat
    }
}

/// Pods read per turn of a usage refresh on the reader (~60–80 µs at 250 pods here).
const REFRESH_CHUNK: usize = 32;

/// One refresh of the pods' usage reads (`Pressure::refresh_usage_reads`), a chunk a turn.
struct RefreshChain {
    pods: PodList,
    cgroups: CgroupMounts,
    files: Arc<std::sync::Mutex<usage::PodUsageFiles>>,
    clock: ChargeClock,
    submit: super::realtime::Submitter,
    /// Ends the refresh (`Pressure::refreshing`) however the chain ends.
    _refreshing: ClearOnDrop,
}

impl RefreshChain {
    /// Reads the chunk from pod `at`, then queues the next; ends the refresh when all are
    /// read, or when the files are held by a read given up on, or follow another list (a
    /// decision's, newer): the next pass refreshes.
    fn chunk(self, at: usize) {
        let next = match self.files.try_lock() {
            Ok(mut held) => self.read(&mut held, at),
            Err(std::sync::TryLockError::Poisoned(p)) => self.read(&mut p.into_inner(), at),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        if let Some(next) = next.filter(|&n| n < self.pods.len()) {
            let submit = self.submit.clone();
            submit.submit(move || self.chunk(next));
        }
    }

    fn read(&self, files: &mut usage::PodUsageFiles, at: usize) -> Option<usize> {
        if at == 0 {
            files.follow(&self.pods, &self.cgroups);
        } else if !files.follows(&self.pods) {
            return None;
        }
        Some(files.refresh(at, REFRESH_CHUNK, &self.clock))
    }
}

#[cfg(test)]
mod tests;
