//! The daemon: built from its options, then one loop. Every wake source feeds one channel;
//! each batch of wakes runs one pressure pass (observe → decide → act, see `pressure`), then
//! lets every source re-arm on the node as just observed — the eBPF watermark at half the
//! distance to the nearest threshold (the whole distance near it), the eventfd level where a
//! threshold would be met — so the kernel wakes evictd again just in time rather than on every
//! page; only then is the pass reported.
//!
//! The pod inventory is kept current by a task of its own (`runtime::inventory`), so a wake
//! never waits on the CRI; it and the Kubernetes API run on a thread of their own, not
//! real-time (`background`), so their decoding never runs between a wake and its decision.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use evictd_policy::{
    distance::nearest_memory_threshold,
    flags::{FlagsError, PolicyArgs},
    observations::Observations,
    podspec::AnnotationTrust,
    policy::{NodeCondition, Policy, Signal, Threshold},
    rank::FsLayout,
};
use tokio::{
    sync::{Notify, mpsc, watch},
    task::JoinHandle,
};

use crate::{
    cluster::{
        connect::{self, ApiOptions},
        pods,
        reporter::{Reporter, ReporterTask, Retry},
        taints::{NodeTaints, TaintTask},
    },
    node::{cgroups::CgroupMounts, signals::NodeSignalSources},
    report::{
        Report,
        endpoint::{self, Health},
        metrics::Metrics,
        trace::{MemoryView, TraceFormat},
    },
    runtime::{
        cri::CriClient,
        disk_usage::DiskWalker,
        inventory::{self, ApiPodsReceiver, Inventory, PodList, same_cgroups},
    },
    vocab::{Escalation, EvictionRecord, WakeCause, monotonic_ns},
    wake::{
        self, NodeNow, Wake, WakeOptions, WakeSource, WakeStats,
        ebpf::{Distance, FineSteps},
    },
};

mod background;
pub mod pressure;
pub mod protect;
pub mod realtime;
mod start;
pub mod urgency;

use pressure::Pressure;
use urgency::{EmergencyLevel, NodeScope};

/// Wakes buffered between passes; a full channel only means a look is already pending.
const WAKE_CHANNEL: usize = 64 * 1024;
/// Wakes taken into one pass at most.
const WAKE_BATCH: usize = 4096;

pub struct RunOptions {
    pub policy: Policy,
    /// Where the policy came from (flags, `--config`): read again on SIGHUP.
    pub policy_args: PolicyArgs,
    pub pressure: PressureOptions,
    pub wake: WakeOptions,
    pub trace: Option<TraceFormat>,
    /// Stop after this long (scripts, tests); `None` runs until SIGINT/SIGTERM.
    pub duration: Option<Duration>,
    pub cgroups: CgroupMounts,
    /// Serve Prometheus metrics here.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Serve /healthz and /readyz here too, on connections no metrics client can take.
    pub probe_addr: Option<std::net::SocketAddr>,
    /// SCHED_FIFO priority of the daemon's thread; 0: an ordinary thread.
    pub realtime_priority: u8,
    /// Where evictions are recorded in Kubernetes; `None`: nowhere (the log says so).
    pub api: Option<ApiOptions>,
    /// How the daemon protects itself (oom_score_adj, locked memory).
    pub protection: protect::SelfProtection,
}

/// How long queued API reports may still be sent at shutdown.
const API_FLUSH: Duration = Duration::from_secs(5);

/// Everything the pressure pass needs: how the node is read, the runtime, the pods' specs.
pub struct PressureOptions {
    pub signals: NodeSignalSources,
    pub fs_layout: FsLayout,
    pub cri_endpoint: Option<String>,
    pub cri_timeout: Duration,
    /// The deadline of a stop (`CriClient::with_stop_timeout`).
    pub runtime_request_timeout: Duration,
    /// The namespaces whose pods' evictd annotations count.
    pub annotation_trust: AnnotationTrust,
    pub dry_run: bool,
    pub pods_file: Option<PathBuf>,
    pub inventory_interval: Duration,
    pub release_timeout: Duration,
    pub kill: KillOptions,
    /// evictd's own pod, never evicted (`None`: not in a pod).
    pub own_pod_uid: Option<String>,
    /// Whether a `kube-system` pod whose spec is only inferred may be evicted.
    pub evict_inferred_kube_system: bool,
    /// How often pods are checked against their own ephemeral-storage limits (the
    /// housekeeping interval, as the kubelet's monitoring period).
    pub storage_limit_period: Duration,
    /// How often the disk walker measures the pods' logs and volumes (`--volume-stats-agg-period`).
    pub volume_stats_period: Duration,
}

/// How a chosen pod is killed (`--fast-kill`, `--hard-eviction-grace-period`,
/// `--emergency-available`).
#[derive(Clone, Copy, Debug)]
pub struct KillOptions {
    /// Whether evictd may kill a pod itself when there is no time for the runtime.
    pub fast_kill: bool,
    /// A hard eviction's grace period (the kubelet's: 1 s); 0 kills at once.
    pub hard_grace_seconds: i64,
    pub emergency: EmergencyLevel,
}

/// The engine's clock (grace periods, the transition period, stats' freshness): monotonic,
/// so that a wall-clock step (NTP, an operator) can neither cut a grace period short nor
/// hold a pressure condition for hours.
fn engine_ns() -> i64 {
    monotonic_ns() as i64
}

fn memory_view(thresholds: &[Threshold], obs: &Observations) -> MemoryView {
    MemoryView {
        available: obs.get(&Signal::MemoryAvailable).map(|o| o.available),
        nearest: nearest_memory_threshold(thresholds, obs),
    }
}

/// What a pass hands back when it ends: the pressure state, and what it did and saw.
struct PassDone {
    pressure: Pressure,
    wakes: PendingWakes,
    evictions: Vec<EvictionRecord>,
    obs: Observations,
}

/// Whether a pass must follow one whose reading, `read`, may be behind by `charged` bytes:
/// only when they could have crossed a memory threshold the reading was short of, and the
/// node read again (`read_now`, after the sources re-armed: what is charged from then on they
/// count) is past it. Reading the node is what the budget (`budget`, `FineSteps`) rations:
/// the count holds other cgroups' charges and no frees, so page-cache churn near a threshold
/// would ask often. No wake source's budget is spent on it, and no pass unless one is due.
fn read_behind(
    read: Distance,
    charged: u64,
    budget: impl FnOnce() -> bool,
    read_now: impl FnOnce() -> Distance,
) -> bool {
    read.may_have_crossed(charged) && budget() && matches!(read_now(), Distance::Known(d) if d < 0)
}

/// Wakes kept for the next pass while one runs: the first `PENDING_WAKES` (the earliest is
/// what the decision answers), the rest only counted by cause. A wake storm during a long
/// stop (reclaim and OOM wakes grow with the CPU count) must not grow evictd's locked memory.
#[derive(Default)]
struct PendingWakes {
    kept: Vec<Wake>,
    counted_only: [u64; WakeCause::ALL.len()],
}

/// Wakes a pass keeps one by one; beyond, counts.
const PENDING_WAKES: usize = WAKE_BATCH;

impl PendingWakes {
    /// Whether any wake of the batch is a housekeeping one (the timer's, the disk poll's):
    /// the storage-limit check runs in such a pass, never in one only memory (or evictd's
    /// own recheck) woke, whose decision must not wait behind its evictions.
    fn asks_housekeeping(&self) -> bool {
        let housekeeping = |c: WakeCause| matches!(c, WakeCause::Timer | WakeCause::Disk);
        self.kept.iter().any(|w| housekeeping(w.cause))
            || WakeCause::ALL.into_iter().any(|c| housekeeping(c) && self.counted_only[c.index()] > 0)
    }

    fn add(&mut self, batch: &mut Vec<Wake>) {
        let room = PENDING_WAKES.saturating_sub(self.kept.len());
        if batch.len() > room {
            for w in batch.drain(room..) {
                self.counted_only[w.cause.index()] += 1;
            }
        }
        self.kept.append(batch);
    }
}

/// The pieces the loop drives. The pass (observe → decide → act) runs in a task of its own,
/// with the pressure state moved into it, so that while a pod's grace period runs the loop
/// still drains wakes, answers signals, reports, and can cut that grace period short when a
/// hard threshold is met.
struct Daemon {
    /// `None` while a pass runs.
    pressure: Option<Pressure>,
    pass: Option<JoinHandle<PassDone>>,
    /// Wakes that came while a pass ran: they get a pass of their own after it.
    pending: PendingWakes,
    /// Copies of what the loop needs while the pressure state is in a pass.
    thresholds: Vec<Threshold>,
    signals: NodeSignalSources,
    /// Raised while a stop runs; read by the act step (`runtime::evict`).
    escalate: watch::Sender<Escalation>,
    emergency: EmergencyLevel,
    scope: NodeScope,
    inventory_dirty: bool,
    sources: Vec<Box<dyn WakeSource>>,
    stats: Arc<WakeStats>,
    report: Report,
    pods: watch::Receiver<PodList>,
    /// Refreshes the inventory at once (after an eviction).
    kick: Arc<Notify>,
    /// The Kubernetes API reporter, and the node conditions it was last given.
    api: Option<ApiWriters>,
    /// What /healthz and /readyz answer from.
    health: Arc<Health>,
    /// SIGHUP: where the policy comes from, a re-read policy waiting for the running pass to
    /// end, and the inventory's cue to read the pods file again.
    policy_args: PolicyArgs,
    /// The policy being read after a SIGHUP, off the daemon's thread: finding the kubelet
    /// reads /proc, and a file may sit on a slow disk.
    policy_read: Option<PolicyRead>,
    /// A SIGHUP came while that read ran: read again once it ends.
    reread_policy: bool,
    /// A pod was evicted (when its pass ended): the next pass waits for a pod list newer
    /// than the one that pass ranked (`held_for_inventory`).
    decide_after_inventory: Option<Instant>,
    /// The pod list the last pass ranked.
    last_pass_pods: Option<PodList>,
    /// The pod list whose cgroups the wake sources last followed.
    sources_pods: Option<PodList>,
    pending_policy: Option<Policy>,
    reread_pods_file: Arc<AtomicBool>,
    /// When to look again at an evicted pod's memory (`Pressure::cleanup_recheck`).
    cleanup_recheck: Option<tokio::time::Instant>,
    /// Passes asked for by `recheck_if_read_behind`, rationed.
    read_behind: FineSteps,
    /// When the daemon thread's heap reserve was last made (`protect::refresh_heap_reserve`).
    heap_reserve_made: Instant,
}

/// How often a pass that met no threshold (with no wake waiting) makes the heap reserve again.
const HEAP_RESERVE_REFRESH: Duration = Duration::from_secs(10);

/// What writes to the Kubernetes API (none without one, or in a dry run).
struct ApiWriters {
    reporter: Reporter,
    reporter_task: ReporterTask,
    taints: NodeTaints,
    taint_task: TaintTask,
}

pub async fn run(opts: RunOptions) -> anyhow::Result<()> {
    // Before the start, which serves the metrics port and loads BPF for up to a second: a
    // SIGHUP meanwhile (an operator, a config reloader that saw the port up) would otherwise
    // kill the daemon, its default action. One that comes is handled once the start is done.
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let mut sighup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    let (tx, mut rx) = mpsc::channel::<Wake>(WAKE_CHANNEL);
    let duration = opts.duration;
    let background = background::Background::start();
    let mut daemon = Daemon::start(opts, tx, background.handle()).await?;
    let deadline = duration.map(|d| tokio::time::Instant::now() + d);
    let served = serve(&mut daemon, &mut rx, deadline, &mut sigterm, &mut sighup).await;
    // Also after an error: the record of what was decided, and evictd's taints taken off
    // the node (nobody else would).
    tracing::info!("stopping");
    if let Some(api) = daemon.api.take() {
        tokio::join!(api.reporter_task.flush(API_FLUSH), api.taint_task.remove_and_stop(API_FLUSH));
    }
    // After the taints are off: a stdout that takes nothing holds this up to a second.
    let flushed = daemon.report.finish();
    drop(background);
    served.and(flushed.map_err(Into::into))
}

/// The loop, until a signal, `--duration`, or an error.
async fn serve(
    daemon: &mut Daemon,
    rx: &mut mpsc::Receiver<Wake>,
    deadline: Option<tokio::time::Instant>,
    sigterm: &mut tokio::signal::unix::Signal,
    sighup: &mut tokio::signal::unix::Signal,
) -> anyhow::Result<()> {
    let mut summary_tick = tokio::time::interval(Duration::from_secs(1));
    summary_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first summary before any wake is served, whatever the sources sent while the
    // daemon started: `--trace`'s first line says evictd is loaded and armed.
    summary_tick.tick().await;
    daemon.each_second()?;
    let mut batch = Vec::with_capacity(1024);
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = sigterm.recv() => return Ok(()),
            _ = sighup.recv() => daemon.reload(),
            read = policy_read_end(&mut daemon.policy_read) => daemon.policy_read_done(read),
            _ = crate::runtime::evict::sleep_until(deadline) => return Ok(()),
            Ok(()) = daemon.pods.changed() => daemon.inventory_changed(),
            done = pass_end(&mut daemon.pass) => daemon.pass_done(done?)?,
            n = rx.recv_many(&mut batch, WAKE_BATCH) => {
                if n == 0 {
                    anyhow::bail!("every wake source has stopped");
                }
                daemon.on_wakes(&mut batch);
            }
            _ = summary_tick.tick() => daemon.each_second()?,
            _ = crate::runtime::evict::sleep_until(daemon.cleanup_recheck) => daemon.recheck_cleanup(),
        }
    }
}

/// The longest a decision after an eviction waits for the inventory read after it.
const INVENTORY_HOLD: Duration = Duration::from_secs(2);

/// A policy being read: the policy and its warnings, or why it does not read.
type PolicyRead = JoinHandle<Result<(Policy, Vec<String>), FlagsError>>;

/// The end of the policy read a SIGHUP started; never, when none runs.
async fn policy_read_end(read: &mut Option<PolicyRead>) -> anyhow::Result<(Policy, Vec<String>)> {
    match read.as_mut() {
        Some(handle) => {
            let done = handle.await;
            *read = None;
            Ok(done.context("reading the policy")??)
        }
        None => std::future::pending().await,
    }
}

/// The end of the running pass; never, when none runs.
async fn pass_end(pass: &mut Option<JoinHandle<PassDone>>) -> anyhow::Result<PassDone> {
    match pass.as_mut() {
        Some(handle) => {
            let done = handle.await.context("the pressure pass failed");
            *pass = None;
            done
        }
        None => std::future::pending().await,
    }
}

impl Daemon {
    /// A batch of wakes: a pass, or, while one runs, a note for the next one — and a look
    /// at how urgent the running stop has become.
    fn on_wakes(&mut self, batch: &mut Vec<Wake>) {
        if self.pressure.is_none() {
            self.raise_urgency(batch);
        }
        self.pending.add(batch);
        if self.pressure.is_some() && !self.held_for_inventory() {
            self.start_pass();
        }
    }

    /// After an eviction, the next pass waits for a pod list newer than the one the last
    /// pass ranked: a pod started meanwhile — maybe the one whose growth is the pressure —
    /// is not in that list, and deciding on it again takes one bystander after another. Not
    /// longer than `INVENTORY_HOLD` (a runtime that does not answer must not hold the node's
    /// next eviction), nor with memory below the emergency level.
    fn held_for_inventory(&mut self) -> bool {
        let Some(since) = self.decide_after_inventory else { return false };
        let newer = !self.last_pass_pods.as_ref().is_some_and(|last| Arc::ptr_eq(last, &self.pods.borrow()));
        let late = since.elapsed() >= INVENTORY_HOLD;
        let held = !newer && !late && !self.below_emergency_level_now();
        if !held {
            self.decide_after_inventory = None;
            if !newer && late {
                // The inventory runs on evictd-io, not real-time: on a node whose tenants
                // hold every CPU it waits the pod's CPU share.
                tracing::warn!(
                    "no pod list read since the last eviction after {INVENTORY_HOLD:?}: the next pass ranks the pods \
                     listed before it (the runtime or evictd-io is slow)"
                );
            }
        }
        held
    }

    fn below_emergency_level_now(&self) -> bool {
        let obs = self.signals.observe(engine_ns(), &mut Vec::new());
        urgency::below_emergency_level(&self.thresholds, &obs, self.emergency).is_some()
    }

    /// Reads the node now (not waiting for the running pass) and raises the urgency the act
    /// step sees, never lowers it: a hard threshold met cuts a soft grace period short, an
    /// emergency kills at once.
    fn raise_urgency(&self, wakes: &[Wake]) {
        let obs = self.signals.observe(engine_ns(), &mut Vec::new());
        let cgroup_events = urgency::cgroup_events_count(&self.thresholds, &obs);
        let kernel_acting = self.scope.kernel_acting(wakes, cgroup_events);
        let now = urgency::escalation_now(&self.thresholds, &obs, self.emergency, kernel_acting);
        self.escalate.send_if_modified(|e| e.raise(now));
    }

    fn start_pass(&mut self) {
        let Some(mut pressure) = self.pressure.take() else { return };
        if self.inventory_dirty {
            // A disk decision waiting for this list runs now anyway.
            let _ = pressure.inventory_updated(&self.pods.borrow());
            self.inventory_dirty = false;
        }
        self.escalate.send_replace(Escalation::default());
        let wakes = std::mem::take(&mut self.pending);
        let pods = self.pods.borrow().clone();
        self.last_pass_pods = Some(pods.clone());
        // The wake to account the decision to: the earliest in the batch.
        let first = wakes.kept.iter().min_by_key(|w| w.kernel_ts_ns.unwrap_or(w.received_ns)).copied();
        let housekeeping = wakes.asks_housekeeping();
        self.pass = Some(tokio::spawn(async move {
            let (evictions, obs) = pressure.pass(&pods, engine_ns, first, housekeeping).await;
            PassDone { pressure, wakes, evictions, obs }
        }));
    }

    /// A pass ended: re-arm every source, report it, and run the next one if wakes came
    /// meanwhile.
    fn pass_done(&mut self, done: PassDone) -> anyhow::Result<()> {
        // Re-armed before anything else: a source counts growth from its re-arm against the
        // distance this pass read, so whatever ran first would make its next wake late by the
        // growth meanwhile.
        let charged_since_read = done.pressure.charged_since_read().unwrap_or(0);
        self.rearm(&done.obs, charged_since_read);
        self.recheck_if_read_behind(&done.obs, charged_since_read);
        let observed_ns = done.obs.values().filter_map(|o| o.time_ns).max();
        self.report.conditions(&done.pressure.conditions, observed_ns)?;
        self.send_conditions_to_api(&done.pressure.conditions);
        self.cleanup_recheck = done.pressure.cleanup_recheck();
        // Off the pressure path only: with a threshold met, or a wake waiting, the next pass
        // must not wait for it.
        let calm = !evictd_policy::engine::any_met(&self.thresholds, &done.obs, false)
            && self.pending.kept.is_empty();
        if calm && self.heap_reserve_made.elapsed() >= HEAP_RESERVE_REFRESH {
            protect::refresh_heap_reserve();
            self.heap_reserve_made = Instant::now();
        }
        self.pressure = Some(done.pressure);
        // A pod list that came during the pass: a disk decision waiting for it decides again.
        if std::mem::take(&mut self.inventory_dirty)
            && let Some(p) = self.pressure.as_mut()
            && p.inventory_updated(&self.pods.borrow())
        {
            self.pending.add(&mut vec![Wake::now(WakeCause::Recheck)]);
        }
        if let Some(policy) = self.pending_policy.take() {
            self.apply_policy(policy);
        }
        if !done.evictions.is_empty() {
            self.kick.notify_one();
        }
        // Pressure may remain after a pod went: decide again, on the pods the inventory lists
        // after the eviction (the pass decides on one list only).
        if done.evictions.iter().any(|e| e.error.is_none() && !e.dry_run) {
            self.decide_after_inventory = Some(Instant::now());
        }
        let view = memory_view(&self.thresholds, &done.obs);
        self.report.pass(&done.wakes.kept, &done.wakes.counted_only, &done.evictions, &view)?;
        if self.decide_after_inventory.is_some() {
            // Held or not, the pass after an eviction answers for the pressure that remains.
            self.pending.add(&mut vec![Wake::now(WakeCause::Recheck)]);
        }
        if !self.pending.kept.is_empty() && !self.held_for_inventory() {
            self.start_pass();
        }
        Ok(())
    }

    /// SIGHUP: the pods file is read again at the inventory's next refresh (now), and the
    /// policy from its flags, files or the running kubelet, off the daemon's thread; a
    /// SIGHUP while that read runs is that read.
    fn reload(&mut self) {
        tracing::info!("SIGHUP: reading the policy and the pods file again");
        self.reread_pods_file.store(true, Ordering::Relaxed);
        self.kick.notify_one();
        if self.policy_read.is_some() {
            // That read may have read the files before this change: read again after it.
            tracing::warn!(
                "SIGHUP: the policy is still being read since the last SIGHUP; reading it again after"
            );
            self.reread_policy = true;
            return;
        }
        self.read_policy();
    }

    fn read_policy(&mut self) {
        let args = self.policy_args.clone();
        self.policy_read = Some(tokio::task::spawn_blocking(move || args.policy()));
    }

    /// The re-read policy in force (at once, or once the running pass ends); one that does
    /// not read leaves the policy in force, said why.
    fn policy_read_done(&mut self, read: anyhow::Result<(Policy, Vec<String>)>) {
        if std::mem::take(&mut self.reread_policy) {
            self.read_policy();
        }
        let policy = match read {
            Ok((policy, warnings)) => {
                for w in warnings {
                    tracing::warn!("{w}");
                }
                policy
            }
            Err(e) => {
                tracing::error!(
                    "SIGHUP: the policy does not read ({}); the policy in force stays",
                    crate::report::logs::causes(&e)
                );
                return;
            }
        };
        match self.pressure.is_some() {
            true => self.apply_policy(policy),
            false => self.pending_policy = Some(policy),
        }
    }

    /// The new policy's thresholds everywhere they are used: the pass (with the engine's
    /// state carried over), the urgency checks, the wake sources' levels, the metrics.
    fn apply_policy(&mut self, policy: Policy) {
        let Some(pressure) = self.pressure.as_mut() else { return };
        pressure.set_policy(policy);
        self.thresholds = pressure.thresholds.clone();
        self.report.configured(&self.thresholds);
        let obs = self.signals.observe(engine_ns(), &mut Vec::new());
        self.report.signals(&self.thresholds, &obs);
        self.rearm(&obs, 0);
        let list: Vec<String> = self.thresholds.iter().map(|t| t.to_string()).collect();
        tracing::info!(thresholds = %list.join(", "), "policy in force");
        self.warn_of_thresholds_within_the_emergency_level(&obs);
    }

    /// While an evicted pod's memory is awaited, a pass every second even without a wake:
    /// once the memory is back, a node still under pressure may be quiet.
    fn recheck_cleanup(&mut self) {
        self.cleanup_recheck = None;
        self.on_wakes(&mut vec![Wake::now(WakeCause::Recheck)]);
    }

    /// evictd's node conditions go to the API server (when they change, and every minute);
    /// evictd's taints follow them.
    fn send_conditions_to_api(&mut self, now: &[NodeCondition]) {
        let Some(api) = &self.api else { return };
        api.taints.want(now);
        api.reporter.node_conditions(now);
    }

    fn inventory_changed(&mut self) {
        let pods = self.pods.borrow_and_update().clone();
        self.report.inventory(&pods);
        self.health.set_ready();
        let waited_for = match self.pressure.as_mut() {
            Some(p) => p.inventory_updated(&pods),
            None => {
                self.inventory_dirty = true;
                false
            }
        };
        // A list that only changed specs, states or disk usage (most refreshes that change
        // anything, on a node whose pods write logs) has no cgroup for a source to follow.
        if !self.sources_pods.as_ref().is_some_and(|last| same_cgroups(last, &pods)) {
            self.cgroups_changed();
        }
        self.sources_pods = Some(pods);
        self.decide_again();
        if waited_for {
            self.on_wakes(&mut vec![Wake::now(WakeCause::Recheck)]);
        }
    }

    /// The wakes held after an eviction get their pass once the inventory has been read
    /// again (or the hold ends).
    fn decide_again(&mut self) {
        if self.pressure.is_some() && !self.pending.kept.is_empty() && !self.held_for_inventory() {
            self.start_pass();
        }
    }

    /// The summary shows memory.available as read now, not as the last wake saw it: on a
    /// node far from any threshold there may be no wake for a long time.
    fn each_second(&mut self) -> anyhow::Result<()> {
        self.health.beat();
        self.decide_again();
        self.sources.retain_mut(|s| {
            s.each_second().inspect_err(|e| tracing::warn!("{e}; disabling this wake source")).is_ok()
        });
        self.sources.retain_mut(|s| {
            s.supervise().inspect_err(|e| tracing::error!("{e}; disabling this wake source")).is_ok()
        });
        if self.sources.is_empty() {
            anyhow::bail!("every wake source has stopped");
        }
        self.report.wake_sources(&self.sources);
        let obs = self.signals.observe(engine_ns(), &mut Vec::new());
        self.report.signals(&self.thresholds, &obs);
        let available = obs.get(&Signal::MemoryAvailable).map(|o| o.available);
        self.report.summary(&self.sources, &self.stats, available)?;
        Ok(())
    }

    /// Every source re-arms on `obs`, read before `charged_since_read` bytes were charged;
    /// one that cannot is dropped, with a warning, and the others carry on.
    fn rearm(&mut self, obs: &Observations, charged_since_read: u64) {
        let node = NodeNow {
            thresholds: &self.thresholds,
            observations: obs,
            signals: &self.signals,
            charged_since_read,
        };
        self.sources.retain_mut(|s| {
            s.rearm(&node).inspect_err(|e| tracing::warn!("{e}; disabling this wake source")).is_ok()
        });
    }

    /// A pass again now when what was charged since the pass read the node took it past a
    /// memory threshold: a source counting from its re-arm would wake only on the next
    /// charge, and a victim that crossed and then paused (a paced allocator between bursts, a
    /// task descheduled) leaves the node past the threshold until then (~1 ms at 1 GiB/s in
    /// `bench scale`). Called after every source re-armed (`read_behind`).
    fn recheck_if_read_behind(&mut self, obs: &Observations, charged_since_read: u64) {
        let read = Distance::of(&self.thresholds, obs);
        let (thresholds, signals, budget) = (&self.thresholds, &self.signals, &mut self.read_behind);
        let read_now = || Distance::of(thresholds, &signals.observe(engine_ns(), &mut Vec::new()));
        if read_behind(read, charged_since_read, || budget.take(Instant::now()), read_now) {
            self.pending.add(&mut vec![Wake::now(WakeCause::Recheck)]);
        }
    }

    fn cgroups_changed(&mut self) {
        self.sources.retain_mut(|s| {
            s.cgroups_changed().inspect_err(|e| tracing::warn!("{e}; disabling this wake source")).is_ok()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        daemon::start::spawn_inventory,
        node::{cgroups::CgroupVersion, memory::MemoryCgroup},
    };

    /// Without the node's capacity, inferred requests would all be 0 and
    /// every burstable pod would look over its request; the start fails instead, naming it.
    #[tokio::test(flavor = "current_thread")]
    async fn an_unreadable_node_capacity_stops_the_start() {
        let d = tempfile::tempdir().unwrap();
        let opts = PressureOptions {
            signals: NodeSignalSources {
                node: MemoryCgroup::new(d.path().join("gone"), CgroupVersion::V1, false),
                kubepods: None,
                nodefs: "/".into(),
                imagefs: "/".into(),
                containerfs: None,
                pids: crate::node::signals::PidSources::default(),
            },
            fs_layout: FsLayout::SingleFs,
            cri_endpoint: None,
            cri_timeout: Duration::from_secs(1),
            runtime_request_timeout: Duration::from_secs(120),
            annotation_trust: Default::default(),
            dry_run: false,
            pods_file: None,
            inventory_interval: Duration::from_secs(1),
            release_timeout: Duration::from_secs(1),
            kill: KillOptions { fast_kill: true, hard_grace_seconds: 1, emergency: EmergencyLevel::HalfHard },
            own_pod_uid: None,
            evict_inferred_kube_system: false,
            storage_limit_period: Duration::from_secs(10),
            volume_stats_period: Duration::from_secs(60),
        };
        let client = CriClient::new("unix:///nonexistent/evictd-test.sock", Duration::from_secs(1)).unwrap();
        let err = spawn_inventory(Some(&client), &opts, None, Arc::new(Notify::new()), Default::default())
            .expect_err("an error");
        assert!(format!("{err:#}").contains("memory capacity"), "{err:#}");
    }

    /// A pass follows one whose reading may be behind only when what was charged since could
    /// have crossed a memory threshold the reading was short of, the budget allows a read, and
    /// the node read again is past it; the node is not read again otherwise.
    #[test]
    fn a_pass_follows_a_reading_behind_only_when_the_node_read_again_is_past_a_threshold() {
        const MI: i64 = 1 << 20;
        let read = Distance::Known(MI);
        let past = || Distance::Known(-1);
        let not_read = || -> Distance { panic!("the node read again without cause") };
        assert!(!read_behind(read, (MI / 2) as u64, || true, not_read), "short of the threshold");
        assert!(!read_behind(Distance::Known(-MI), 4 << 20, || true, not_read), "met already");
        assert!(!read_behind(Distance::Unknown, 4 << 20, || true, not_read), "nothing read to be behind");
        assert!(!read_behind(read, 2 << 20, || false, not_read), "the budget spent");
        assert!(read_behind(read, 2 << 20, || true, past));
        assert!(!read_behind(read, 2 << 20, || true, || Distance::Known(0)), "on it, not past it");
        assert!(!read_behind(read, 2 << 20, || true, || Distance::Unknown), "unreadable: no pass on it");
    }

    /// Grace and transition periods are timed on the engine's clock,
    /// which must be CLOCK_MONOTONIC: the wall clock steps (NTP, an operator's `date`) would
    /// stretch or cut them, and it is the clock the kernel stamps wake events with
    /// (`bpf_ktime_get_ns`), against which decisions are measured.
    #[test]
    fn the_engine_times_on_the_monotonic_clock() {
        let monotonic = || {
            let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
            t.tv_sec() * 1_000_000_000 + t.tv_nsec()
        };
        let before = monotonic();
        let now = engine_ns();
        let after = monotonic();
        assert!(before <= now && now <= after, "{before} <= {now} <= {after}");
    }

    /// A wake storm while a pass runs keeps at most `PENDING_WAKES` wakes one by one, the
    /// earliest; the rest are counted by cause, none lost from the counts.
    /// A batch asks for the storage-limit check when any of its wakes is a housekeeping one,
    /// kept or only counted; one of memory wakes alone does not.
    #[test]
    fn a_batch_asks_for_housekeeping_when_any_wake_does() {
        let mut pending = PendingWakes::default();
        pending.add(&mut vec![Wake::now(WakeCause::Charge), Wake::now(WakeCause::DirectReclaim)]);
        assert!(!pending.asks_housekeeping());
        pending.add(&mut vec![Wake::now(WakeCause::Timer)]);
        assert!(pending.asks_housekeeping());
        let mut full = PendingWakes::default();
        full.add(&mut (0..PENDING_WAKES).map(|_| Wake::now(WakeCause::Charge)).collect());
        full.add(&mut vec![Wake::now(WakeCause::Timer)]);
        assert!(full.kept.iter().all(|w| w.cause == WakeCause::Charge), "the timer's only counted");
        assert!(full.asks_housekeeping());
    }

    #[test]
    fn wakes_queued_during_a_pass_are_bounded_and_counted() {
        let mut pending = PendingWakes::default();
        let storm = PENDING_WAKES * 3;
        for chunk in 0..3 {
            let cause = if chunk == 2 { WakeCause::OomKill } else { WakeCause::DirectReclaim };
            let mut batch: Vec<Wake> = (0..PENDING_WAKES).map(|_| Wake::now(cause)).collect();
            pending.add(&mut batch);
            assert!(batch.is_empty());
        }
        assert_eq!(pending.kept.len(), PENDING_WAKES);
        assert!(pending.kept.iter().all(|w| w.cause == WakeCause::DirectReclaim), "the earliest are kept");
        assert_eq!(pending.counted_only[WakeCause::DirectReclaim.index()], PENDING_WAKES as u64);
        assert_eq!(pending.counted_only[WakeCause::OomKill.index()], PENDING_WAKES as u64);
        let total: u64 = pending.counted_only.iter().sum::<u64>() + pending.kept.len() as u64;
        assert_eq!(total, storm as u64);
    }
}
