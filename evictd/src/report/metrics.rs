//! Prometheus metrics: the node's signals, capacities and thresholds, evictd's node
//! conditions, the wake sources and charge tier in use, wakes by source, evictions by signal
//! (the kubelet's `kubelet_evictions`) and by namespace, latency histograms for every
//! decision (wake → decision by wake source, kernel → userspace delivery, each eviction
//! phase, kill → status recorded), ring-buffer drops, kernel-side, CRI and API errors, and
//! the pods by spec source. Served by `endpoint` at /metrics.

use std::time::Duration;

use evictd_common::KernelError;
use evictd_policy::{
    observations::Observations,
    policy::{NodeCondition, Resource, Signal, Threshold, ThresholdValue},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::{
    report::record::EvictionRecord,
    runtime::inventory::SpecSource,
    wake::{SourceKind, Wake, WakeCause},
};

/// One label set per family shape; prometheus-client wants named fields.
macro_rules! labels {
    ($($name:ident { $($field:ident),+ })+) => {$(
        #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
        struct $name { $($field: String),+ }
    )+};
}

labels! {
    CauseLabel { cause }
    SignalLabel { eviction_signal }
    ThresholdLabel { eviction_signal, threshold }
    NamespaceLabel { namespace }
    ApiCallLabel { call, outcome }
    CriErrorLabel { call }
    SpecSourceLabel { spec_source }
    PhaseLabel { phase }
    ConditionLabel { condition }
    SourceLabel { source }
    TierLabel { tier }
    ErrorLabel { error }
}

/// 10 µs .. ~80 s, doubling: wide enough for eBPF wakes and 10 s polling alike.
fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(1e-5, 2.0, 24)
}

/// The unit of a signal's values, which names its gauge families (Prometheus: one unit per
/// metric, in its name).
const UNITS: [&str; 3] = ["bytes", "inodes", "pids"];

fn unit_index(signal: Signal) -> usize {
    match signal.resource() {
        Resource::Memory | Resource::EphemeralStorage => 0,
        Resource::Inodes => 1,
        Resource::Pids => 2,
    }
}

/// The phases of an eviction `evictd_eviction_phase_seconds` times.
const PHASES: [&str; 6] = [
    "decide",
    "stop_containers",
    "stop_sandbox",
    "memory_released",
    "fast_kill_signalled",
    "fast_kill_reaped",
];

/// The API calls and their outcomes (`cluster::reporter`, `cluster::pods`).
const API_CALLS: [(&str, &str); 16] = [
    ("pod_status", "ok"),
    ("pod_status", "retried"),
    ("pod_status", "refused"),
    ("pod_status", "given_up"),
    ("pod_status", "dropped"),
    ("event", "ok"),
    ("event", "retried"),
    ("event", "refused"),
    ("event", "given_up"),
    ("event", "dropped"),
    ("node_status", "ok"),
    ("node_status", "retried"),
    ("node_status", "refused"),
    ("node_status", "given_up"),
    ("node_status", "dropped"),
    ("watch_pods", "error"),
];

/// The charge tiers `evictd probe` names, fastest first.
pub const CHARGE_TIERS: [&str; 3] = ["batched-charge-hook", "memcg-tracepoints", "adaptive-poll"];

type Gauges<L> = [Family<L, Gauge>; 3];

/// Every family is registered, and every label value known in advance created, at start: a
/// dashboard or alert sees 0 rather than no series. (Only `evictd_evictions_by_namespace_total`
/// waits for its first eviction: its label values are not known in advance.)
pub struct Metrics {
    registry: Registry,
    wakes: Family<CauseLabel, Counter>,
    evictions: Family<SignalLabel, Counter>,
    evictions_by_namespace: Family<NamespaceLabel, Counter>,
    failed_evictions: Counter,
    detection: Family<CauseLabel, Histogram>,
    delivery: Histogram,
    phases: Family<PhaseLabel, Histogram>,
    api_calls: Family<ApiCallLabel, Counter>,
    cri_errors: Family<CriErrorLabel, Counter>,
    status_window: Histogram,
    pods: Family<SpecSourceLabel, Gauge>,
    available: Gauges<SignalLabel>,
    capacity: Gauges<SignalLabel>,
    thresholds: Gauges<ThresholdLabel>,
    conditions: Family<ConditionLabel, Gauge>,
    wake_sources: Family<SourceLabel, Gauge>,
    charge_tier: Family<TierLabel, Gauge>,
    ring_drops: Counter,
    kernel_errors: Family<ErrorLabel, Counter>,
}

fn histograms<L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static>()
-> Family<L, Histogram> {
    Family::new_with_constructor(|| Histogram::new(latency_buckets()))
}

/// Three gauge families, `<name>_bytes`, `<name>_inodes`, `<name>_pids`.
fn gauges_by_unit<L>(registry: &mut Registry, name: &str, help: &str) -> Gauges<L>
where
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
{
    let families: Gauges<L> = Default::default();
    for (family, unit) in families.iter().zip(UNITS) {
        registry.register(format!("{name}_{unit}"), format!("{help}, in {unit}"), family.clone());
    }
    families
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::with_prefix("evictd");
        let m = Metrics {
            wakes: Family::default(),
            evictions: Family::default(),
            evictions_by_namespace: Family::default(),
            failed_evictions: Counter::default(),
            detection: histograms(),
            delivery: Histogram::new(latency_buckets()),
            phases: histograms(),
            api_calls: Family::default(),
            cri_errors: Family::default(),
            status_window: Histogram::new(latency_buckets()),
            pods: Family::default(),
            available: gauges_by_unit(
                &mut r,
                "signal_available",
                "Each eviction signal's available amount as last read",
            ),
            capacity: gauges_by_unit(
                &mut r,
                "signal_capacity",
                "Each eviction signal's capacity as last read",
            ),
            thresholds: gauges_by_unit(
                &mut r,
                "eviction_threshold",
                "Each eviction threshold (hard or soft), resolved against the signal's capacity",
            ),
            conditions: Family::default(),
            wake_sources: Family::default(),
            charge_tier: Family::default(),
            ring_drops: Counter::default(),
            kernel_errors: Family::default(),
            registry: Registry::default(),
        };
        r.register("wakes", "Wake events, by source", m.wakes.clone());
        r.register("evictions", "Pods evicted, by the signal that drove it", m.evictions.clone());
        r.register(
            "evictions_by_namespace",
            "Pods evicted, by the pod's namespace",
            m.evictions_by_namespace.clone(),
        );
        r.register("failed_evictions", "Evictions whose stop failed", m.failed_evictions.clone());
        r.register(
            "detection_seconds",
            "From the wake's origin (kernel event time, or receipt) to the eviction decision, by wake source",
            m.detection.clone(),
        );
        r.register(
            "wake_delivery_seconds",
            "From a kernel event to its receipt by evictd",
            m.delivery.clone(),
        );
        r.register("eviction_phase_seconds", "Time spent in each phase of an eviction", m.phases.clone());
        r.register(
            "kube_api_calls",
            "Kubernetes API calls (pod_status, event, node_status, watch_pods) by outcome: ok, retried, refused, given_up, dropped, error",
            m.api_calls.clone(),
        );
        r.register(
            "cri_errors",
            "Failed CRI calls (an error, or past evictd's deadline), by call",
            m.cri_errors.clone(),
        );
        r.register(
            "eviction_recorded_seconds",
            "From an evicted pod's kill to its Failed/Evicted status accepted by the API server",
            m.status_window.clone(),
        );
        r.register(
            "pods",
            "Pods on the node, by where their spec comes from (api, pods_file, inferred: priority unknown)",
            m.pods.clone(),
        );
        r.register(
            "node_condition",
            "1 while evictd's rule holds the node condition (MemoryPressure, DiskPressure, PIDPressure)",
            m.conditions.clone(),
        );
        r.register("wake_source_active", "1 for each wake source running", m.wake_sources.clone());
        r.register(
            "charge_wake_tier",
            "1 for the tier that wakes evictd on memory growth (batched-charge-hook, memcg-tracepoints, adaptive-poll)",
            m.charge_tier.clone(),
        );
        r.register(
            "ring_buffer_drops",
            "Kernel wake events dropped on a full ring buffer",
            m.ring_drops.clone(),
        );
        r.register(
            "kernel_errors",
            "Failures counted by the eBPF programs, by kind",
            m.kernel_errors.clone(),
        );
        for source in SpecSource::ALL {
            m.pods.get_or_create(&SpecSourceLabel { spec_source: source.as_str().into() }).set(0);
        }
        for c in NodeCondition::ALL {
            m.conditions.get_or_create(&ConditionLabel { condition: c.as_str().into() }).set(0);
        }
        for kind in SourceKind::ALL {
            m.wake_sources.get_or_create(&SourceLabel { source: kind.as_str().into() }).set(0);
        }
        for tier in CHARGE_TIERS {
            m.charge_tier.get_or_create(&TierLabel { tier: tier.into() }).set(0);
        }
        for cause in WakeCause::ALL {
            let label = CauseLabel { cause: cause.as_str().into() };
            m.wakes.get_or_create(&label).inc_by(0);
            let _ = m.detection.get_or_create(&label);
        }
        for phase in PHASES {
            let _ = m.phases.get_or_create(&PhaseLabel { phase: phase.into() });
        }
        for (call, outcome) in API_CALLS {
            m.api_calls.get_or_create(&ApiCallLabel { call: call.into(), outcome: outcome.into() }).inc_by(0);
        }
        for call in crate::runtime::cri::CALLS {
            m.cri_errors.get_or_create(&CriErrorLabel { call: call.into() }).inc_by(0);
        }
        for e in KernelError::ALL {
            m.kernel_errors.get_or_create(&ErrorLabel { error: e.as_str().into() }).inc_by(0);
        }
        Metrics { registry: r, ..m }
    }
}

impl Metrics {
    pub fn wake(&self, w: &Wake) {
        self.wakes.get_or_create(&CauseLabel { cause: w.cause.as_str().into() }).inc();
        if let Some(ns) = w.delivery_ns() {
            self.delivery.observe(ns as f64 / 1e9);
        }
    }

    /// The thresholds in force (at start, and after a SIGHUP): the signals evictd acts on are
    /// created at 0 so that evictions read 0 before the first, and the threshold gauges of a
    /// previous policy go (`observed` sets the current ones).
    pub fn configured(&self, thresholds: &[Threshold]) {
        for family in &self.thresholds {
            family.clear();
        }
        for t in thresholds {
            self.evictions
                .get_or_create(&SignalLabel { eviction_signal: t.signal.as_str().into() })
                .inc_by(0);
        }
    }

    pub fn eviction(&self, e: &EvictionRecord) {
        if e.error.is_some() {
            self.failed_evictions.inc();
        } else if !e.dry_run {
            self.evictions.get_or_create(&SignalLabel { eviction_signal: e.signal.as_str().into() }).inc();
            self.evictions_by_namespace
                .get_or_create(&NamespaceLabel { namespace: e.namespace.clone() })
                .inc();
        }
        if let (Some(cause), Some(received)) = (e.wake_cause, e.wake_received_ns) {
            let origin = e.wake_kernel_ts_ns.unwrap_or(received);
            self.detection
                .get_or_create(&CauseLabel { cause: cause.as_str().into() })
                .observe(e.decided_ns.saturating_sub(origin) as f64 / 1e9);
        }
        let phase = |name: &str, ms: f64| {
            self.phases.get_or_create(&PhaseLabel { phase: name.into() }).observe(ms / 1e3);
        };
        phase("decide", e.decide_us as f64 / 1e3);
        if let Some(p) = &e.phases {
            phase("stop_containers", p.stop_containers_ms);
            phase("stop_sandbox", p.stop_sandbox_ms);
            if let Some(ms) = p.memory_released_ms {
                phase("memory_released", ms);
            }
            if let Some(k) = &p.fast_kill {
                phase("fast_kill_signalled", k.report.signalled_ms);
                phase("fast_kill_reaped", k.report.reaped_ms);
            }
        }
    }

    /// The node's signals as just read, and the thresholds against them. A signal that could
    /// not be read has no series (a stale value would look like a reading); so has a
    /// percentage threshold whose capacity is unknown.
    pub fn observed(&self, thresholds: &[Threshold], obs: &Observations) {
        for signal in Signal::ALL {
            let label = SignalLabel { eviction_signal: signal.as_str().into() };
            let u = unit_index(signal);
            match obs.get(&signal) {
                Some(o) => {
                    self.available[u].get_or_create(&label).set(o.available);
                    self.capacity[u].get_or_create(&label).set(o.capacity);
                }
                None => {
                    self.available[u].remove(&label);
                    self.capacity[u].remove(&label);
                }
            }
        }
        for t in thresholds {
            let label = ThresholdLabel {
                eviction_signal: t.signal.as_str().into(),
                threshold: if t.is_hard() { "hard" } else { "soft" }.into(),
            };
            let family = &self.thresholds[unit_index(t.signal)];
            match (t.value, obs.get(&t.signal)) {
                (ThresholdValue::Quantity(q), _) => {
                    family.get_or_create(&label).set(q.value());
                }
                (v, Some(o)) => {
                    family.get_or_create(&label).set(v.resolve(o.capacity));
                }
                (_, None) => {
                    family.remove(&label);
                }
            }
        }
    }

    /// evictd's node conditions now.
    pub fn conditions(&self, now: &[NodeCondition]) {
        for c in NodeCondition::ALL {
            self.conditions
                .get_or_create(&ConditionLabel { condition: c.as_str().into() })
                .set(now.contains(&c).into());
        }
    }

    /// The wake sources running, and the charge tier among them (`None`: none wakes on growth).
    pub fn wake_sources(&self, running: &[SourceKind], tier: Option<&str>) {
        for kind in SourceKind::ALL {
            self.wake_sources
                .get_or_create(&SourceLabel { source: kind.as_str().into() })
                .set(running.contains(&kind).into());
        }
        for t in CHARGE_TIERS {
            self.charge_tier.get_or_create(&TierLabel { tier: t.into() }).set((tier == Some(t)).into());
        }
    }

    /// What the kernel side counted since the last call.
    pub fn kernel(&self, ring_drops: u64, errors: &[(KernelError, u64)]) {
        self.ring_drops.inc_by(ring_drops);
        for (e, n) in errors {
            self.kernel_errors.get_or_create(&ErrorLabel { error: e.as_str().into() }).inc_by(*n);
        }
    }

    pub fn cri_error(&self, call: &str) {
        self.cri_errors.get_or_create(&CriErrorLabel { call: call.into() }).inc();
    }

    pub fn api_call(&self, call: &str, outcome: &str) {
        self.api_calls.get_or_create(&ApiCallLabel { call: call.into(), outcome: outcome.into() }).inc();
    }

    /// The inventory's pods, counted by spec source.
    pub fn pods_by_spec_source(&self, counts: impl IntoIterator<Item = (SpecSource, i64)>) {
        for (source, n) in counts {
            self.pods.get_or_create(&SpecSourceLabel { spec_source: source.as_str().into() }).set(n);
        }
    }

    pub fn status_recorded(&self, after_kill: Duration) {
        self.status_window.observe(after_kill.as_secs_f64());
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wake::WakeCause;

    fn record() -> EvictionRecord {
        EvictionRecord {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u".into(),
            signal: crate::report::record::EvictionCause::Signal(Signal::MemoryAvailable),
            available: 1,
            threshold: 2,
            grace_period_seconds: 1,
            message: String::new(),
            annotations: Default::default(),
            dry_run: false,
            error: None,
            decide_us: 500,
            phases: Some(crate::runtime::evict::Phases {
                stop_containers_ms: 120.0,
                stop_sandbox_ms: 30.0,
                memory_released_ms: Some(0.1),
                fast_kill: None,
            }),
            wake_cause: Some(WakeCause::Charge),
            wake_kernel_ts_ns: Some(1_000_000),
            wake_received_ns: Some(1_100_000),
            observed_ns: 1_200_000,
            decided_ns: 1_700_000,
            released_ns: Some(200_000_000),
        }
    }

    #[test]
    fn wakes_and_evictions_are_counted_and_timed() {
        let m = Metrics::default();
        m.wake(&Wake::now(WakeCause::Timer));
        let rec = record();
        m.eviction(&rec);
        let text = m.encode();
        assert!(text.contains("evictd_wakes_total{cause=\"timer\"} 1"), "{text}");
        assert!(text.contains("evictd_evictions_total{eviction_signal=\"memory.available\"} 1"), "{text}");
        // 0.7 ms from the kernel event to the decision.
        assert!(text.contains("evictd_detection_seconds_sum{cause=\"charge\"} 0.0007"), "{text}");
        assert!(text.contains("evictd_eviction_phase_seconds_count{phase=\"stop_containers\"} 1"), "{text}");
        assert!(text.contains("evictd_evictions_by_namespace_total{namespace=\"ns\"} 1"), "{text}");
        // A dry run is not an eviction.
        m.eviction(&EvictionRecord { dry_run: true, ..rec });
        assert!(m.encode().contains("evictd_evictions_total{eviction_signal=\"memory.available\"} 1"));
    }

    /// Issue 9, item 7: every family is there before anything happens, with the label values
    /// known in advance at 0, so that dashboards and alerts see series from the start.
    #[test]
    fn every_family_is_present_from_the_start() {
        let m = Metrics::default();
        // As the daemon does at start: its thresholds, and its first observation of the node.
        let thresholds = [Threshold {
            signal: Signal::MemoryAvailable,
            value: ThresholdValue::Quantity("100Mi".parse().unwrap()),
            grace_period_ns: 0,
            min_reclaim: None,
        }];
        m.configured(&thresholds);
        let o = evictd_policy::observations::Observation { available: 1, capacity: 2, time_ns: None };
        let obs = Observations::from([
            (Signal::MemoryAvailable, o),
            (Signal::NodeFsInodesFree, o),
            (Signal::PidAvailable, o),
        ]);
        m.observed(&thresholds, &obs);
        let text = m.encode();
        for family in [
            "evictd_wakes counter",
            "evictd_evictions counter",
            "evictd_failed_evictions counter",
            "evictd_detection_seconds histogram",
            "evictd_wake_delivery_seconds histogram",
            "evictd_eviction_phase_seconds histogram",
            "evictd_kube_api_calls counter",
            "evictd_cri_errors counter",
            "evictd_eviction_recorded_seconds histogram",
            "evictd_pods gauge",
            "evictd_signal_available_bytes gauge",
            "evictd_signal_available_inodes gauge",
            "evictd_signal_available_pids gauge",
            "evictd_signal_capacity_bytes gauge",
            "evictd_eviction_threshold_bytes gauge",
            "evictd_node_condition gauge",
            "evictd_wake_source_active gauge",
            "evictd_charge_wake_tier gauge",
            "evictd_ring_buffer_drops counter",
            "evictd_kernel_errors counter",
        ] {
            assert!(text.contains(&format!("# TYPE {family}\n")), "{family} missing:\n{text}");
        }
        for series in [
            "evictd_pods{spec_source=\"inferred\"} 0",
            "evictd_node_condition{condition=\"MemoryPressure\"} 0",
            "evictd_wake_source_active{source=\"ebpf\"} 0",
            "evictd_charge_wake_tier{tier=\"batched-charge-hook\"} 0",
            "evictd_ring_buffer_drops_total 0",
            "evictd_kernel_errors_total{error=\"no-config\"} 0",
            "evictd_wakes_total{cause=\"charge\"} 0",
            "evictd_detection_seconds_count{cause=\"oom-kill\"} 0",
            "evictd_eviction_phase_seconds_count{phase=\"stop_sandbox\"} 0",
            "evictd_kube_api_calls_total{call=\"pod_status\",outcome=\"ok\"} 0",
            "evictd_cri_errors_total{call=\"StopPodSandbox\"} 0",
        ] {
            assert!(text.contains(series), "{series} missing:\n{text}");
        }
    }

    #[test]
    fn signals_thresholds_conditions_and_sources() {
        use evictd_policy::observations::Observation;
        let m = Metrics::default();
        let hard = |signal, value| Threshold { signal, value, grace_period_ns: 0, min_reclaim: None };
        let thresholds = [
            hard(Signal::MemoryAvailable, ThresholdValue::Quantity("100Mi".parse().unwrap())),
            hard(Signal::NodeFsAvailable, ThresholdValue::Percentage(0.1)),
            hard(Signal::PidAvailable, ThresholdValue::Percentage(0.05)),
        ];
        m.configured(&thresholds);
        let mut obs = Observations::new();
        let o = |available, capacity| Observation { available, capacity, time_ns: None };
        obs.insert(Signal::MemoryAvailable, o(500 << 20, 1 << 30));
        obs.insert(Signal::NodeFsAvailable, o(50, 1000));
        m.observed(&thresholds, &obs);
        let text = m.encode();
        for series in [
            "evictd_signal_available_bytes{eviction_signal=\"memory.available\"} 524288000",
            "evictd_signal_capacity_bytes{eviction_signal=\"nodefs.available\"} 1000",
            "evictd_eviction_threshold_bytes{eviction_signal=\"memory.available\",threshold=\"hard\"} 104857600",
            // 10% of the capacity just read.
            "evictd_eviction_threshold_bytes{eviction_signal=\"nodefs.available\",threshold=\"hard\"} 100",
            "evictd_evictions_total{eviction_signal=\"pid.available\"} 0",
        ] {
            assert!(text.contains(series), "{series} missing:\n{text}");
        }
        // PIDs were not read: neither a value nor a percentage threshold without its capacity.
        assert!(!text.contains("evictd_signal_available_pids{"), "{text}");
        assert!(!text.contains("evictd_eviction_threshold_pids{"), "{text}");
        // A signal that can no longer be read loses its series rather than keep a stale value.
        obs.remove(&Signal::NodeFsAvailable);
        m.observed(&thresholds, &obs);
        let text = m.encode();
        assert!(
            !text.contains("evictd_signal_available_bytes{eviction_signal=\"nodefs.available\"}"),
            "{text}"
        );
        assert!(
            !text.contains("evictd_eviction_threshold_bytes{eviction_signal=\"nodefs.available\""),
            "{text}"
        );
        // A policy re-read without the memory threshold: its gauge goes with it.
        m.configured(&thresholds[1..]);
        m.observed(&thresholds[1..], &obs);
        let text = m.encode();
        assert!(
            !text.contains("evictd_eviction_threshold_bytes{eviction_signal=\"memory.available\""),
            "{text}"
        );
        m.conditions(&[NodeCondition::DiskPressure]);
        m.wake_sources(&[SourceKind::Poll, SourceKind::Timer], Some("adaptive-poll"));
        let text = m.encode();
        assert!(text.contains("evictd_node_condition{condition=\"DiskPressure\"} 1"), "{text}");
        assert!(text.contains("evictd_node_condition{condition=\"MemoryPressure\"} 0"), "{text}");
        assert!(text.contains("evictd_wake_source_active{source=\"poll\"} 1"), "{text}");
        assert!(text.contains("evictd_wake_source_active{source=\"ebpf\"} 0"), "{text}");
        assert!(text.contains("evictd_charge_wake_tier{tier=\"adaptive-poll\"} 1"), "{text}");
    }

    /// Every metric the Grafana dashboard in deploy/ queries is one evictd exports.
    #[test]
    fn the_dashboard_queries_only_exported_metrics() {
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../../deploy/grafana-dashboard.json")).unwrap();
        let m = Metrics::default();
        m.eviction(&EvictionRecord { namespace: "ns".into(), ..record() });
        let text = m.encode();
        let exported: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let mut queried = 0;
        for expr in
            dashboard["panels"].as_array().unwrap().iter().flat_map(|p| p["targets"].as_array().unwrap())
        {
            let expr = expr["expr"].as_str().unwrap();
            for name in expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("evictd_"))
            {
                let family = ["_bucket", "_sum", "_count", "_total"]
                    .iter()
                    .find_map(|suffix| name.strip_suffix(suffix))
                    .unwrap_or(name);
                // The per-unit gauges are registered when a signal is first read.
                let by_unit = UNITS.iter().any(|u| family.ends_with(&format!("_{u}")));
                assert!(
                    exported.contains(&family) || by_unit,
                    "the dashboard queries {name}, which evictd does not export"
                );
                queried += 1;
            }
        }
        assert!(queried > 20, "{queried}");
    }
}
