//! The daemon loop: every wake source feeds one channel; each batch of wakes leads to one
//! observation of the node's memory, and then the kernel is re-armed with a watermark
//! derived from the distance to the nearest threshold, so it wakes evictd again just in time
//! rather than on every page.
//!
//! Each batch of wakes runs one pressure pass (observe → decide → act, see `pressure`); the
//! pod inventory is kept current by a task of its own, so a wake never waits on the CRI.

use std::{
    path::PathBuf,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::sync::{Notify, mpsc, watch};

use crate::{
    cgroup_layout::CgroupLayout,
    cgroup_names::{self, CgroupNames},
    cri::CriClient,
    ebpf::{KernelProbes, LoadOptions},
    inventory::{Inventory, PodRecord},
    pressure::Pressure,
    trace::{MemoryView, Summary, TraceFormat, TraceSink},
    units,
    wake::{self, Wake, WakeCause, WakeStats},
};
use evictd_policy::{
    observations::Observations,
    policy::{Policy, Threshold},
};

/// How far ahead the kernel should wake evictd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watermark {
    /// Half the distance to the nearest memory threshold, at least `MIN_AUTO_WATERMARK`.
    Auto,
    /// A fixed number of bytes of growth (0: every page, for measuring).
    Fixed(u64),
}

/// Below this, wakes would come faster than observing is worth.
pub const MIN_AUTO_WATERMARK: u64 = 1 << 20;
/// With no memory threshold at all, still look after this much growth.
const NO_THRESHOLD_WATERMARK: u64 = 256 << 20;

pub struct RunOptions {
    pub policy: Policy,
    pub pressure: PressureOptions,
    pub housekeeping: Duration,
    pub ebpf: bool,
    pub timer: bool,
    pub eventfd: bool,
    pub psi: bool,
    pub load: LoadOptions,
    pub watermark: Watermark,
    pub trace: Option<TraceFormat>,
    /// Stop after this long (scripts, tests); `None` runs until SIGINT/SIGTERM.
    pub duration: Option<Duration>,
    pub layout: CgroupLayout,
    /// Serve Prometheus metrics here.
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// Everything the act side needs: the runtime, the pods' specs, and how the node is read.
pub struct PressureOptions {
    pub signals: crate::node_signals::NodeSignalSources,
    pub fs_layout: evictd_policy::rank::FsLayout,
    pub cri_endpoint: Option<String>,
    pub cri_timeout: Duration,
    pub dry_run: bool,
    pub pods_file: Option<PathBuf>,
    pub inventory_interval: Duration,
    pub release_timeout: Duration,
}

/// The watermark for a given distance to the nearest threshold.
pub fn watermark_for(mode: Watermark, distance: Option<i64>) -> u64 {
    match (mode, distance) {
        (Watermark::Fixed(b), _) => b,
        (Watermark::Auto, None) => NO_THRESHOLD_WATERMARK,
        (Watermark::Auto, Some(d)) => (d.max(0) as u64 / 2).max(MIN_AUTO_WATERMARK),
    }
}

/// The memory threshold closest to being crossed: (its text, available − its quantity).
pub fn nearest_memory_threshold(thresholds: &[Threshold], obs: &Observations) -> Option<(String, i64)> {
    thresholds
        .iter()
        .filter(|t| t.signal.is_memory())
        .filter_map(|t| {
            let o = obs.get(&t.signal)?;
            Some((t.to_string(), o.available - t.value.resolve(o.capacity)))
        })
        .min_by_key(|(_, d)| *d)
}

fn memory_view(thresholds: &[Threshold], obs: &Observations) -> MemoryView {
    MemoryView {
        available: obs.get(&evictd_policy::policy::Signal::MemoryAvailable).map(|o| o.available),
        nearest: nearest_memory_threshold(thresholds, obs),
    }
}

/// Wall-clock ns: the engine's clock (grace periods, transition period).
fn wall_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// Keeps the pod inventory current off the pressure path and publishes snapshots.
fn spawn_inventory(
    client: CriClient,
    mut inventory: Inventory,
    every: Duration,
    kick: Arc<Notify>,
) -> watch::Receiver<Arc<Vec<PodRecord>>> {
    let (tx, rx) = watch::channel(Arc::new(Vec::new()));
    tokio::spawn(async move {
        let mut up: Option<bool> = None;
        loop {
            match inventory.refresh(&client).await {
                Ok(spec_warning) => {
                    if up != Some(true) {
                        tracing::info!(endpoint = client.endpoint(), "container runtime reachable");
                    }
                    up = Some(true);
                    if let Some(w) = spec_warning {
                        tracing::warn!("pods file: {w}; keeping the specs read before");
                    }
                    if tx.send(Arc::new(inventory.pods().cloned().collect())).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    if up != Some(false) {
                        tracing::warn!(
                            "container runtime unavailable: {e}; pods stay as last seen, retrying"
                        );
                    }
                    up = Some(false);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = kick.notified() => {}
            }
        }
    });
    rx
}

pub async fn run(opts: RunOptions) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::channel::<Wake>(64 * 1024);
    let stats = Arc::new(WakeStats::default());
    let mut probes = None;
    if opts.ebpf {
        match KernelProbes::load(&opts.load) {
            Ok((p, ring)) => {
                for prog in &p.programs {
                    if prog.error.is_none() {
                        tracing::info!(tracepoint = %prog.tracepoint, "eBPF wake source attached");
                    }
                }
                wake::spawn_ring_buffer(ring, tx.clone(), stats.clone())
                    .context("polling the eBPF ring buffer")?;
                probes = Some(p);
            }
            Err(e) if opts.timer => tracing::warn!(
                "eBPF wake source unavailable: {e}; carrying on with the housekeeping timer every {:?}",
                opts.housekeeping
            ),
            Err(e) => anyhow::bail!("eBPF wake source unavailable and the timer is not enabled: {e}"),
        }
    } else {
        tracing::info!("eBPF wake source disabled by --wake-sources");
    }
    if opts.timer {
        wake::spawn_timer(opts.housekeeping, tx.clone());
    }
    let node_cg = opts.pressure.signals.node.clone();
    if opts.psi {
        // A v2 node cgroup has its own pressure file; on v1 only the system-wide one exists.
        let path = match node_cg.version {
            crate::cgroup_layout::CgroupVersion::V2 => node_cg.dir.join("memory.pressure"),
            crate::cgroup_layout::CgroupVersion::V1 => PathBuf::from("/proc/pressure/memory"),
        };
        if let Err(e) = wake::psi::spawn(&path, tx.clone()) {
            tracing::warn!(path = %path.display(), "PSI wake source unavailable: {e}");
        }
    }
    let mut eventfd = match (opts.eventfd, node_cg.version) {
        (true, crate::cgroup_layout::CgroupVersion::V1) => Some(wake::eventfd::EventfdWake::new(tx.clone())),
        (true, _) => {
            tracing::info!("eventfd wake source: cgroup v1 only, this node's memory is on v2");
            None
        }
        (false, _) => None,
    };
    drop(tx);

    let metrics = Arc::new(crate::metrics::Metrics::default());
    if let Some(addr) = opts.metrics_addr {
        let bound = crate::metrics::serve(addr, metrics.clone())
            .await
            .with_context(|| format!("--metrics-addr: cannot listen on {addr}"))?;
        tracing::info!("metrics on http://{bound}/metrics");
    }
    let po = opts.pressure;
    let client = match &po.cri_endpoint {
        Some(ep) => Some(CriClient::new(ep, po.cri_timeout)?),
        None => None,
    };
    let capacity = po.signals.node.read().map(|m| m.capacity as i64).unwrap_or(0);
    let kick = Arc::new(Notify::new());
    let mut pods_rx = match &client {
        Some(c) => spawn_inventory(
            c.clone(),
            Inventory::new(po.pods_file.clone(), capacity),
            po.inventory_interval,
            kick.clone(),
        ),
        None => watch::channel(Arc::new(Vec::new())).1,
    };
    if po.dry_run {
        tracing::info!("dry run: evictd decides and reports, and stops no pod");
    }
    let scope_dir: Option<PathBuf> = (!po.signals.node.is_root).then(|| po.signals.node.dir.clone());
    let mut pressure = Pressure::new(
        opts.policy,
        po.fs_layout,
        po.signals,
        opts.layout.clone(),
        client,
        po.dry_run,
        po.release_timeout,
        crate::pressure::own_pod_uid(),
    );
    let thresholds = pressure.thresholds.clone();
    let mut names = CgroupNames::new(opts.layout.clone());
    let mut sink = opts.trace.map(|f| TraceSink::new(f, std::io::BufWriter::new(std::io::stdout())));
    let mut loop_state = LoopState::default();

    let obs = pressure.observe(wall_ns());
    let view = memory_view(&thresholds, &obs);
    loop_state.available = view.available;
    if let Some(ev) = eventfd.as_mut()
        && let Err(e) = ev.update(&eventfd_levels(&thresholds, &pressure, &obs))
    {
        tracing::warn!("eventfd wake source: {e}; disabling it");
        eventfd = None;
    }
    if let Some(p) = probes.as_mut() {
        refresh_scope(p, scope_dir.as_deref())?;
        let w = watermark_for(opts.watermark, view.nearest.as_ref().map(|(_, d)| *d));
        p.rearm(w)?;
        loop_state.watermark = Some(w);
    }

    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
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
            Ok(()) = pods_rx.changed() => {
                let pods = pods_rx.borrow_and_update().clone();
                pressure.inventory_updated(&pods);
                // New pods mean new cgroups whose charge must count at once.
                if let Some(p) = probes.as_mut() {
                    refresh_scope(p, scope_dir.as_deref())?;
                }
            }
            n = rx.recv_many(&mut batch, 4096) => {
                if n == 0 {
                    anyhow::bail!("every wake source has stopped");
                }
                let pods = pods_rx.borrow().clone();
                // The wake to account the decision to: the earliest in the batch.
                let first = batch.iter().min_by_key(|w| w.kernel_ts_ns.unwrap_or(w.received_ns)).copied();
                let (evictions, obs) = pressure.pass(&pods, wall_ns, first).await;
                let view = memory_view(&thresholds, &obs);
                if let Some(ev) = eventfd.as_mut()
                    && let Err(e) = ev.update(&eventfd_levels(&thresholds, &pressure, &obs))
                {
                    tracing::warn!("eventfd wake source: {e}; disabling it");
                    eventfd = None;
                }
                for w in &batch {
                    loop_state.counts[w.cause.index()] += 1;
                    metrics.wake(w);
                    if let Some(s) = sink.as_mut() {
                        s.event(w, &mut names, &view)?;
                    }
                }
                batch.clear();
                if !evictions.is_empty() {
                    kick.notify_one();
                }
                for e in &evictions {
                    metrics.eviction(e);
                    if let Some(s) = sink.as_mut() {
                        s.eviction(e)?;
                    }
                }
                loop_state.available = view.available;
                if let Some(p) = probes.as_mut() {
                    let w = watermark_for(opts.watermark, view.nearest.as_ref().map(|(_, d)| *d));
                    p.rearm(w)?;
                    loop_state.watermark = Some(w);
                }
                if let Some(s) = sink.as_mut() {
                    s.flush()?;
                }
            }
            _ = summary_tick.tick() => {
                if let Some(p) = probes.as_mut() {
                    refresh_scope(p, scope_dir.as_deref())?;
                }
                let summary = loop_state.summary(probes.as_ref(), &stats);
                if let Some(s) = sink.as_mut() {
                    s.summary(&summary)?;
                }
            }
        }
    }
    if let Some(s) = sink.as_mut() {
        s.flush()?;
    }
    tracing::info!("stopping");
    Ok(())
}

/// Where memory.usage_in_bytes must not go for each memory threshold, per cgroup: the
/// kubelet's notifier level, usage + (available − threshold), i.e.
/// capacity − threshold + inactive_file. With the distance, for drift tolerance.
fn eventfd_levels(
    thresholds: &[Threshold],
    pressure: &Pressure,
    obs: &Observations,
) -> Vec<(PathBuf, u64, u64)> {
    use evictd_policy::policy::Signal;
    let mut out = Vec::new();
    for (signal, cg) in [
        (Signal::MemoryAvailable, Some(&pressure.signals.node)),
        (Signal::AllocatableMemoryAvailable, pressure.signals.kubepods.as_ref()),
    ] {
        let (Some(cg), Some(o)) = (cg, obs.get(&signal)) else { continue };
        let Ok(sample) = cg.read() else { continue };
        for t in thresholds.iter().filter(|t| t.signal == signal) {
            let distance = o.available - t.value.resolve(o.capacity);
            let level = (sample.usage as i64 + distance).max(0) as u64;
            out.push((cg.dir.clone(), level, distance.max(0) as u64));
        }
    }
    out
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// When a cgroup plays the node, only its subtree's charge counts; cgroups appear over time.
fn refresh_scope(p: &mut KernelProbes, dir: Option<&std::path::Path>) -> anyhow::Result<()> {
    match dir {
        Some(d) => p.set_scope(Some(&cgroup_names::subtree_ids(d)))?,
        None => p.set_scope(None)?,
    }
    Ok(())
}

#[derive(Default)]
struct LoopState {
    counts: [u64; WakeCause::ALL.len()],
    last_counts: [u64; WakeCause::ALL.len()],
    last_summary: Option<Instant>,
    last_drops: u64,
    available: Option<i64>,
    watermark: Option<u64>,
}

impl LoopState {
    fn summary(&mut self, probes: Option<&KernelProbes>, stats: &WakeStats) -> Summary {
        let now = Instant::now();
        let secs = self.last_summary.map_or(1.0, |t| now.duration_since(t).as_secs_f64()).max(1e-3);
        self.last_summary = Some(now);
        let mut s = Summary { interval_seconds: secs, ..Default::default() };
        for c in WakeCause::ALL {
            let i = c.index();
            s.events_per_second.insert(c.as_str(), (self.counts[i] - self.last_counts[i]) as f64 / secs);
        }
        self.last_counts = self.counts;
        let kernel = probes.and_then(|p| match p.counters() {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!("reading eBPF counters: {e}");
                None
            }
        });
        if let Some(k) = &kernel {
            s.ring_drops = k.ring_drops - self.last_drops;
            s.ring_drops_total = k.ring_drops;
            self.last_drops = k.ring_drops;
        }
        s.kernel = kernel;
        s.channel_full_total = stats.channel_full.load(Ordering::Relaxed);
        s.memory_available_bytes = self.available;
        s.watermark_bytes = self.watermark;
        if s.ring_drops > 0 {
            tracing::warn!(
                drops = s.ring_drops,
                "ring buffer full: raise --ring-buffer-size or the watermark"
            );
        }
        tracing::debug!(available = ?self.available.map(units::bytes), "summary");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evictd_policy::policy::{MapSetting, PolicyInput};

    #[test]
    fn watermark_is_half_the_distance_with_a_floor() {
        assert_eq!(watermark_for(Watermark::Auto, Some(1 << 30)), 1 << 29);
        assert_eq!(watermark_for(Watermark::Auto, Some(1000)), MIN_AUTO_WATERMARK);
        assert_eq!(watermark_for(Watermark::Auto, Some(-5)), MIN_AUTO_WATERMARK);
        assert_eq!(watermark_for(Watermark::Auto, None), NO_THRESHOLD_WATERMARK);
        assert_eq!(watermark_for(Watermark::Fixed(0), Some(1 << 30)), 0);
    }

    #[test]
    fn nearest_threshold_picks_the_smallest_distance() {
        let input = PolicyInput {
            hard: Some(
                MapSetting::from_flag("h", "memory.available<100Mi,nodefs.available<10%", '<').unwrap(),
            ),
            soft: MapSetting::from_flag("s", "memory.available<50%", '<').unwrap(),
            soft_grace: MapSetting::from_flag("g", "memory.available=1m", '=').unwrap(),
            ..Default::default()
        };
        let all = evictd_policy::policy::build(&input, &mut Vec::new()).unwrap().thresholds;
        let mut obs = Observations::new();
        obs.insert(
            evictd_policy::policy::Signal::MemoryAvailable,
            evictd_policy::observations::Observation {
                available: 824 << 20,
                capacity: 1 << 30,
                time_ns: None,
            },
        );
        let (name, d) = nearest_memory_threshold(&all, &obs).unwrap();
        assert_eq!(name, "memory.available<50%");
        assert_eq!(d, (824 << 20) - (512 << 20));
        // Thresholds without an observation (allocatable here) are not "near".
        assert!(all.iter().any(|t| t.signal == evictd_policy::policy::Signal::AllocatableMemoryAvailable));
    }
}
