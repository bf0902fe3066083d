//! The daemon: built from its options, then one loop. Every wake source feeds one channel;
//! each batch of wakes runs one pressure pass (observe → decide → act, see `pressure`), is
//! reported, and lets every source re-arm on the node as just observed — the eBPF watermark
//! at half the distance to the nearest threshold, the eventfd level where a threshold would
//! be met — so the kernel wakes evictd again just in time rather than on every page.
//!
//! The pod inventory is kept current by a task of its own (`runtime::inventory`), so a wake
//! never waits on the CRI.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use evictd_policy::{
    distance::nearest_memory_threshold,
    observations::Observations,
    policy::{Policy, Signal},
    rank::FsLayout,
};
use tokio::sync::{Notify, mpsc, watch};

use crate::{
    node::{cgroups::CgroupMounts, signals::NodeSignalSources},
    report::{
        Report,
        metrics::Metrics,
        trace::{MemoryView, TraceFormat},
    },
    runtime::{
        cri::CriClient,
        inventory::{self, Inventory, PodRecord},
    },
    wake::{self, NodeNow, Wake, WakeOptions, WakeSource, WakeStats},
};

pub mod pressure;

use pressure::Pressure;

/// Wakes buffered between passes; a full channel only means a look is already pending.
const WAKE_CHANNEL: usize = 64 * 1024;
/// Wakes taken into one pass at most.
const WAKE_BATCH: usize = 4096;

pub struct RunOptions {
    pub policy: Policy,
    pub pressure: PressureOptions,
    pub wake: WakeOptions,
    pub trace: Option<TraceFormat>,
    /// Stop after this long (scripts, tests); `None` runs until SIGINT/SIGTERM.
    pub duration: Option<Duration>,
    pub cgroups: CgroupMounts,
    /// Serve Prometheus metrics here.
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// Everything the pressure pass needs: how the node is read, the runtime, the pods' specs.
pub struct PressureOptions {
    pub signals: NodeSignalSources,
    pub fs_layout: FsLayout,
    pub cri_endpoint: Option<String>,
    pub cri_timeout: Duration,
    pub dry_run: bool,
    pub pods_file: Option<PathBuf>,
    pub inventory_interval: Duration,
    pub release_timeout: Duration,
}

/// Wall-clock ns: the engine's clock (grace periods, transition period).
fn wall_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

fn memory_view(pressure: &Pressure, obs: &Observations) -> MemoryView {
    MemoryView {
        available: obs.get(&Signal::MemoryAvailable).map(|o| o.available),
        nearest: nearest_memory_threshold(&pressure.thresholds, obs),
    }
}

/// The pieces the loop drives.
struct Daemon {
    pressure: Pressure,
    sources: Vec<Box<dyn WakeSource>>,
    stats: Arc<WakeStats>,
    report: Report,
    pods: watch::Receiver<Arc<Vec<PodRecord>>>,
    /// Refreshes the inventory at once (after an eviction).
    kick: Arc<Notify>,
}

pub async fn run(opts: RunOptions) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::channel::<Wake>(WAKE_CHANNEL);
    let duration = opts.duration;
    let mut daemon = Daemon::start(opts, tx).await?;
    let deadline = duration.map(|d| tokio::time::Instant::now() + d);
    let mut summary_tick = tokio::time::interval(Duration::from_secs(1));
    summary_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let mut batch = Vec::with_capacity(1024);
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
            _ = sleep_until(deadline) => break,
            Ok(()) = daemon.pods.changed() => daemon.inventory_changed(),
            n = rx.recv_many(&mut batch, WAKE_BATCH) => {
                if n == 0 {
                    anyhow::bail!("every wake source has stopped");
                }
                daemon.on_wakes(&batch).await?;
                batch.clear();
            }
            _ = summary_tick.tick() => daemon.each_second()?,
        }
    }
    daemon.report.flush()?;
    tracing::info!("stopping");
    Ok(())
}

impl Daemon {
    /// Starts the wake sources, metrics, the runtime client and the inventory, then
    /// observes the node once and arms every source on it.
    async fn start(opts: RunOptions, tx: mpsc::Sender<Wake>) -> anyhow::Result<Self> {
        let stats = Arc::new(WakeStats::default());
        let sources = wake::start(&opts.wake, &opts.pressure.signals, &tx, &stats)?;
        drop(tx);
        let metrics = Arc::new(Metrics::default());
        if let Some(addr) = opts.metrics_addr {
            let bound = crate::report::metrics::serve(addr, metrics.clone())
                .await
                .with_context(|| format!("--metrics-addr: cannot listen on {addr}"))?;
            tracing::info!("metrics on http://{bound}/metrics");
        }
        let client = match &opts.pressure.cri_endpoint {
            Some(ep) => Some(CriClient::new(ep, opts.pressure.cri_timeout)?),
            None => None,
        };
        let kick = Arc::new(Notify::new());
        let pods = spawn_inventory(client.as_ref(), &opts.pressure, kick.clone());
        if opts.pressure.dry_run {
            tracing::info!("dry run: evictd decides and reports, and stops no pod");
        }
        let report = Report::new(opts.trace, metrics, opts.cgroups.clone());
        let pressure = Pressure::new(opts.policy, opts.pressure, opts.cgroups, client);
        let mut daemon = Daemon { pressure, sources, stats, report, pods, kick };
        let obs = daemon.pressure.observe(wall_ns());
        daemon.report.observed(&memory_view(&daemon.pressure, &obs));
        daemon.rearm(&obs);
        Ok(daemon)
    }

    /// One batch of wakes: one pass, its report, and re-arming every source.
    async fn on_wakes(&mut self, batch: &[Wake]) -> anyhow::Result<()> {
        let pods = self.pods.borrow().clone();
        // The wake to account the decision to: the earliest in the batch.
        let first = batch.iter().min_by_key(|w| w.kernel_ts_ns.unwrap_or(w.received_ns)).copied();
        let (evictions, obs) = self.pressure.pass(&pods, wall_ns, first).await;
        if !evictions.is_empty() {
            self.kick.notify_one();
        }
        self.report.pass(batch, &evictions, &memory_view(&self.pressure, &obs))?;
        self.rearm(&obs);
        Ok(())
    }

    fn inventory_changed(&mut self) {
        let pods = self.pods.borrow_and_update().clone();
        self.pressure.inventory_updated(&pods);
        self.cgroups_changed();
    }

    fn each_second(&mut self) -> anyhow::Result<()> {
        self.cgroups_changed();
        self.report.summary(&self.sources, &self.stats)?;
        Ok(())
    }

    /// Every source re-arms on `obs`; one that cannot is dropped, with a warning, and the
    /// others carry on.
    fn rearm(&mut self, obs: &Observations) {
        let node = NodeNow {
            thresholds: &self.pressure.thresholds,
            observations: obs,
            signals: &self.pressure.signals,
        };
        self.sources.retain_mut(|s| {
            s.rearm(&node).inspect_err(|e| tracing::warn!("{e}; disabling this wake source")).is_ok()
        });
    }

    fn cgroups_changed(&mut self) {
        self.sources.retain_mut(|s| {
            s.cgroups_changed().inspect_err(|e| tracing::warn!("{e}; disabling this wake source")).is_ok()
        });
    }
}

/// The inventory task, or, without a runtime, a snapshot that stays empty.
fn spawn_inventory(
    client: Option<&CriClient>,
    opts: &PressureOptions,
    kick: Arc<Notify>,
) -> watch::Receiver<Arc<Vec<PodRecord>>> {
    let Some(client) = client else { return watch::channel(Arc::new(Vec::new())).1 };
    let capacity = opts.signals.node.read().map(|m| m.capacity as i64).unwrap_or(0);
    let inventory = Inventory::new(opts.pods_file.clone(), capacity);
    inventory::spawn_refresh(client.clone(), inventory, opts.inventory_interval, kick)
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
