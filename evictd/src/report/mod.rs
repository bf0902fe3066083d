//! Report: what evictd saw and did — eviction records, the `--trace` view (one line per
//! wake and a summary each second) and Prometheus metrics. `Report` is what the daemon
//! hands every pass to; it never decides anything.

use std::{
    io::{self, BufWriter},
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use evictd_common::{CAUSE_COUNT, KernelError};
use evictd_policy::{
    observations::Observations,
    policy::{NodeCondition, Threshold},
};

use crate::{
    kernel::ebpf::Counters,
    node::{cgroup_names::CgroupNames, cgroups::CgroupMounts, growth::GrowthTracker},
    runtime::inventory::PodRecord,
    vocab::{EvictionRecord, SpecSource, WakeCause},
    wake::{SourceKind, Wake, WakeSource, WakeStats},
};

pub mod endpoint;
pub mod logs;
pub mod metrics;
mod recent;
pub mod trace;
pub mod units;

use metrics::Metrics;
use trace::{MemoryView, TraceFormat, TraceSummary, TraceWriter};

/// How long the end of the daemon waits for the trace's last lines to be written.
const TRACE_DRAIN: Duration = Duration::from_secs(1);

pub struct Report {
    metrics: Arc<Metrics>,
    sink: Option<TraceWriter>,
    counts: WakeCounts,
    /// The node conditions last reported, for the trace's lines on a change.
    conditions: Vec<NodeCondition>,
}

impl Report {
    /// With `trace`, the trace's thread, naming cgroups of `cgroups` and the growth below the
    /// node `growth` follows; without that thread (it cannot start), no trace, said why.
    pub fn new(
        trace: Option<TraceFormat>,
        metrics: Arc<Metrics>,
        cgroups: CgroupMounts,
        growth: GrowthTracker,
    ) -> Self {
        let sink = trace.and_then(|format| {
            let out = BufWriter::new(io::stdout());
            TraceWriter::spawn(format, out, CgroupNames::new(cgroups), growth)
                .inspect_err(|e| {
                    tracing::error!("cannot start the trace's thread ({e}): --trace prints nothing")
                })
                .ok()
        });
        Report { metrics, sink, counts: WakeCounts::default(), conditions: Vec::new() }
    }

    /// One pass: the wakes that led to it, the evictions it made, and the node after it.
    /// `counted_only`: wakes by cause that were only counted (a storm while a pass ran).
    pub fn pass(
        &mut self,
        wakes: &[Wake],
        counted_only: &[u64; WakeCause::ALL.len()],
        evictions: &[EvictionRecord],
        view: &MemoryView,
    ) -> io::Result<()> {
        self.counts.available = view.available;
        for (cause, n) in WakeCause::ALL.into_iter().zip(counted_only).filter(|(_, n)| **n > 0) {
            self.counts.by_cause[cause.index()] += n;
            self.metrics.wake.count(cause, *n);
        }
        for w in wakes {
            self.counts.by_cause[w.cause.index()] += 1;
            self.metrics.wake.wake(w);
            if let Some(s) = self.sink.as_mut() {
                s.event(w, view)?;
            }
        }
        for e in evictions {
            self.metrics.eviction(e);
            if let Some(s) = self.sink.as_mut() {
                s.eviction(e)?;
            }
        }
        Ok(())
    }

    /// A new inventory: its pods counted by where their specs come from.
    pub fn inventory(&self, pods: &[Arc<PodRecord>]) {
        let count = |source: SpecSource| pods.iter().filter(|p| p.spec_source == source).count() as i64;
        self.metrics.pods_by_spec_source(SpecSource::ALL.map(|s| (s, count(s))));
        let ignored = pods.iter().filter(|p| !p.ignored_annotations.is_empty()).count();
        self.metrics.pods_with_ignored_annotations(ignored as i64);
    }

    /// The thresholds evictd acts on, for the metrics' series present from the start.
    pub fn configured(&self, thresholds: &[Threshold]) {
        self.metrics.configured(thresholds);
    }

    /// The node's signals and thresholds as just read, for the metrics.
    pub fn signals(&self, thresholds: &[Threshold], obs: &Observations) {
        self.metrics.observed(thresholds, obs);
    }

    /// evictd's node conditions after a pass whose node reading was taken at `observed_ns`
    /// (CLOCK_MONOTONIC): the metrics, and with `--trace` a line for each that turned on or
    /// off (what an SRE tuning disk thresholds, or the disk benchmark, times).
    pub fn conditions(&mut self, now: &[NodeCondition], observed_ns: Option<i64>) -> io::Result<()> {
        self.metrics.conditions(now);
        if let Some(s) = self.sink.as_mut() {
            for c in NodeCondition::ALL {
                let on = now.contains(&c);
                if on != self.conditions.contains(&c) {
                    s.condition(c, on, observed_ns)?;
                }
            }
        }
        self.conditions.clear();
        self.conditions.extend_from_slice(now);
        Ok(())
    }

    /// The wake sources still running, and the fastest charge tier among them.
    pub fn wake_sources(&self, sources: &[Box<dyn WakeSource>]) {
        let running: Vec<SourceKind> = sources.iter().map(|s| s.kind()).collect();
        let tier = sources.iter().filter_map(|s| s.charge_tier()).min();
        self.metrics.wake.running(&running, tier);
    }

    /// The node as first observed, before any wake.
    pub fn observed(&mut self, view: &MemoryView) {
        self.counts.available = view.available;
    }

    /// The once-a-second `--trace` summary (and its warnings, with or without `--trace`);
    /// `available` is memory.available as read for it (`None`: unreadable).
    pub fn summary(
        &mut self,
        sources: &[Box<dyn WakeSource>],
        stats: &WakeStats,
        available: Option<i64>,
    ) -> io::Result<()> {
        self.counts.available = available;
        let summary = self.counts.summary(sources, stats, &self.metrics);
        let trace_dropped = self.sink.as_ref().map_or(0, TraceWriter::dropped);
        self.counts.dropped_output(logs::dropped_lines(), trace_dropped, &self.metrics);
        match self.sink.as_mut() {
            Some(s) => s.summary(summary),
            None => Ok(()),
        }
    }

    /// The end of the daemon: the trace's last lines written, waiting at most `TRACE_DRAIN`.
    pub fn finish(&mut self) -> io::Result<()> {
        self.sink.take().map_or(Ok(()), |s| s.finish(TRACE_DRAIN))
    }
}

/// Wakes counted by cause, and what the last summary saw, for per-second rates.
#[derive(Default)]
struct WakeCounts {
    by_cause: [u64; WakeCause::ALL.len()],
    at_last_summary: [u64; WakeCause::ALL.len()],
    last_summary: Option<Instant>,
    last_drops: u64,
    /// By `CAUSE_*` index, as `Counters::dropped`.
    last_dropped: [u64; CAUSE_COUNT],
    last_errors: [u64; KernelError::ALL.len()],
    last_kernel_errors: u64,
    available: Option<i64>,
    /// Log and trace lines dropped, as the last summary saw them.
    last_dropped_output: [u64; 2],
}

impl WakeCounts {
    fn summary(
        &mut self,
        sources: &[Box<dyn WakeSource>],
        stats: &WakeStats,
        metrics: &Metrics,
    ) -> TraceSummary {
        let now = Instant::now();
        let secs = self.last_summary.map_or(1.0, |t| now.duration_since(t).as_secs_f64()).max(1e-3);
        self.last_summary = Some(now);
        let mut s = TraceSummary { interval_seconds: secs, ..Default::default() };
        for c in WakeCause::ALL {
            let i = c.index();
            s.events_per_second
                .insert(c.as_str(), (self.by_cause[i] - self.at_last_summary[i]) as f64 / secs);
        }
        self.at_last_summary = self.by_cause;
        let kernel = sources.iter().find_map(|s| s.kernel_counters());
        if let Some(k) = &kernel {
            s.ring_drops = k.ring_drops.saturating_sub(self.last_drops);
            s.ring_drops_total = k.ring_drops;
            self.last_drops = k.ring_drops;
            if s.ring_drops > 0 {
                self.warn_lost(k);
            }
            self.last_dropped = k.dropped;
            let errors = KernelError::ALL
                .map(|e| (e, k.errors[e as usize].saturating_sub(self.last_errors[e as usize])));
            metrics.wake.kernel(s.ring_drops, &errors);
            self.warn_kernel_errors(k);
            self.last_errors = k.errors;
        }
        s.kernel = kernel;
        s.channel_full_total = stats.channel_full.load(Ordering::Relaxed);
        s.memory_available_bytes = self.available;
        s.watermark_bytes = sources.iter().find_map(|s| s.watermark());
        s.charge_probes_attached = sources.iter().find_map(|s| s.charge_probes_attached());
        tracing::debug!(available = ?self.available.map(units::bytes), "summary");
        s
    }

    /// Lines of output dropped since the last summary because stderr (logs) or stdout (the
    /// trace) did not keep up: counted, and said once a second while it lasts (a line that
    /// may itself be dropped; the count is in the metrics).
    fn dropped_output(&mut self, log: u64, trace: u64, metrics: &Metrics) {
        let [log_before, trace_before] = self.last_dropped_output;
        let (log_new, trace_new) = (log.saturating_sub(log_before), trace.saturating_sub(trace_before));
        self.last_dropped_output = [log, trace];
        metrics.output_dropped(log_new, trace_new);
        if log_new + trace_new > 0 {
            tracing::warn!(
                log_lines = log_new,
                trace_lines = trace_new,
                "output dropped in the last second: stderr or stdout is not being read fast enough"
            );
        }
    }

    /// Wake events lost to a full ring since the last summary, by cause. Charge events stop
    /// at half the ring, so most losses are reclaim and OOM-kill events, which the daemon is
    /// told of (`RingLosses`).
    fn warn_lost(&self, k: &Counters) {
        let lost: Vec<String> = (0..CAUSE_COUNT)
            .filter_map(|i| {
                let n = k.dropped[i].saturating_sub(self.last_dropped[i]);
                let cause = WakeCause::from_kernel(i as u32)?;
                (n > 0).then(|| format!("{cause} {n}"))
            })
            .collect();
        tracing::warn!(
            lost = %lost.join(", "),
            "ring buffer full: kernel wake events lost (a lost reclaim or OOM kill counts as the kernel acting \
             where the node is the whole machine): raise --ring-buffer-size"
        );
    }

    /// The kernel side counts its failures instead of hiding them; any new one is worth a
    /// warning, with or without `--trace`.
    fn warn_kernel_errors(&mut self, k: &Counters) {
        let total: u64 = k.errors.iter().sum();
        if total > self.last_kernel_errors {
            let by_kind: Vec<String> = KernelError::ALL
                .iter()
                .map(|e| format!("{} {}", e.as_str(), k.errors[*e as usize]))
                .collect();
            tracing::warn!(
                "eBPF programs failed {} more times ({})",
                total - self.last_kernel_errors,
                by_kind.join(", ")
            );
        }
        self.last_kernel_errors = total;
    }
}
