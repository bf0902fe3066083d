//! Prometheus metrics, composed: the components register their own families (the wake
//! sources' in `wake::metrics`, the CRI client's in `runtime::cri`, the API link's in
//! `cluster::metrics`), and this module adds the report's: the node's signals, capacities
//! and thresholds, evictd's node conditions, evictions by signal (the kubelet's
//! `kubelet_evictions`) and by namespace, latency histograms for every decision (wake →
//! decision by wake source, each eviction phase), and the pods by spec source. Served by
//! `endpoint` at /metrics.

use evictd_policy::{
    observations::Observations,
    policy::{NodeCondition, Resource, Signal, Threshold, ThresholdValue},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::recent::RecentEvictions;
use crate::{
    cluster::metrics::ApiMetrics,
    runtime::cri::CriMetrics,
    vocab::{EvictionRecord, SpecSource, WakeCause, metrics::latency_buckets},
    wake::metrics::WakeMetrics,
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
    SpecSourceLabel { spec_source }
    PhaseLabel { phase }
    ConditionLabel { condition }
    OutputLabel { output }
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

type Gauges<L> = [Family<L, Gauge>; 3];

/// Namespaces with a series of their own in `evictd_evictions_by_namespace_total`.
const NAMESPACE_SERIES: usize = 100;
/// The label the evictions of every further namespace count under.
const OTHER_NAMESPACES: &str = "_other";

/// Every family is registered, and every label value known in advance created, at start: a
/// dashboard or alert sees 0 rather than no series. (Only `evictd_evictions_by_namespace_total`
/// waits for its first eviction: its label values are not known in advance.)
pub struct Metrics {
    registry: Registry,
    /// The wake sources' families, which the report updates from what the sources tell it.
    pub wake: WakeMetrics,
    /// Handed to the CRI client, which counts its own failures.
    pub cri: CriMetrics,
    /// Handed to the pod watch and the reporter.
    pub api: ApiMetrics,
    evictions: Family<SignalLabel, Counter>,
    evictions_by_namespace: Family<NamespaceLabel, Counter>,
    /// The namespaces with a series of their own, at most `NAMESPACE_SERIES`.
    namespaces: std::sync::Mutex<std::collections::BTreeSet<String>>,
    failed_evictions: Counter,
    detection: Family<CauseLabel, Histogram>,
    phases: Family<PhaseLabel, Histogram>,
    pods: Family<SpecSourceLabel, Gauge>,
    ignored_annotations: Gauge,
    /// Thresholds in force: 0 is a policy that evicts nothing for node pressure.
    policy_thresholds: Gauge,
    available: Gauges<SignalLabel>,
    capacity: Gauges<SignalLabel>,
    thresholds: Gauges<ThresholdLabel>,
    conditions: Family<ConditionLabel, Gauge>,
    /// Lines dropped rather than wait for stderr (`log`) or stdout (`trace`).
    output_dropped: Family<OutputLabel, Counter>,
    recent: RecentEvictions,
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
        let wake = WakeMetrics::register(&mut r);
        let cri = CriMetrics::register(&mut r);
        let api = ApiMetrics::register(&mut r);
        let m = Metrics {
            wake,
            cri,
            api,
            evictions: Family::default(),
            evictions_by_namespace: Family::default(),
            namespaces: Default::default(),
            failed_evictions: Counter::default(),
            detection: histograms(),
            phases: histograms(),
            pods: Family::default(),
            ignored_annotations: Gauge::default(),
            policy_thresholds: Gauge::default(),
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
            output_dropped: Family::default(),
            recent: RecentEvictions::default(),
            registry: Registry::default(),
        };
        m.register_own(&mut r);
        Metrics { registry: r, ..m }
    }
}

impl Metrics {
    /// The report's own families, registered, with the label values known in advance at 0.
    fn register_own(&self, r: &mut Registry) {
        r.register("evictions", "Pods evicted, by the signal that drove it", self.evictions.clone());
        r.register(
            "evictions_by_namespace",
            "Pods evicted, by the pod's namespace",
            self.evictions_by_namespace.clone(),
        );
        r.register("failed_evictions", "Evictions whose stop failed", self.failed_evictions.clone());
        r.register(
            "detection_seconds",
            "From the wake's origin (kernel event time, or receipt) to the eviction decision, by wake source",
            self.detection.clone(),
        );
        r.register("eviction_phase_seconds", "Time spent in each phase of an eviction", self.phases.clone());
        r.register(
            "pods",
            "Pods on the node, by where their spec comes from (api, pods_file, inferred: priority unknown)",
            self.pods.clone(),
        );
        r.register(
            "policy_thresholds",
            "Eviction thresholds in force (hard, soft and allocatable copies); 0: no pod is evicted for node pressure",
            self.policy_thresholds.clone(),
        );
        r.register(
            "pods_ignored_annotations",
            "Pods whose evictd.io annotations are ignored: their namespace is not in --annotation-namespaces",
            self.ignored_annotations.clone(),
        );
        r.register(
            "node_condition",
            "1 while evictd's rule holds the node condition (MemoryPressure, DiskPressure, PIDPressure)",
            self.conditions.clone(),
        );
        r.register(
            "output_lines_dropped",
            "Log lines (output=\"log\", stderr) and --trace lines (output=\"trace\", stdout) dropped rather than \
             wait for a reader that is not keeping up",
            self.output_dropped.clone(),
        );
        self.recent.register(r);
        self.output_dropped(0, 0);
        for source in SpecSource::ALL {
            self.pods.get_or_create(&SpecSourceLabel { spec_source: source.as_str().into() }).set(0);
        }
        for c in NodeCondition::ALL {
            self.conditions.get_or_create(&ConditionLabel { condition: c.as_str().into() }).set(0);
        }
        for cause in WakeCause::ALL {
            let _ = self.detection.get_or_create(&CauseLabel { cause: cause.as_str().into() });
        }
        for phase in PHASES {
            let _ = self.phases.get_or_create(&PhaseLabel { phase: phase.into() });
        }
    }

    /// The namespace's own label while fewer than `NAMESPACE_SERIES` have one, then
    /// `OTHER_NAMESPACES`: a cluster that makes a namespace per CI run must not grow the
    /// metrics (and evictd's locked memory) without end.
    fn namespace_label(&self, namespace: &str) -> String {
        // The set stays whole whatever a panic elsewhere did: keep using it.
        let mut seen = self.namespaces.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.contains(namespace) || (seen.len() < NAMESPACE_SERIES && seen.insert(namespace.into())) {
            return namespace.into();
        }
        OTHER_NAMESPACES.into()
    }

    /// The thresholds in force (at start, and after a SIGHUP): the signals evictd acts on are
    /// created at 0 so that evictions read 0 before the first, and the threshold gauges of a
    /// previous policy go (`observed` sets the current ones).
    pub fn configured(&self, thresholds: &[Threshold]) {
        self.policy_thresholds.set(thresholds.len() as i64);
        for family in &self.thresholds {
            family.clear();
        }
        for t in thresholds {
            self.evictions
                .get_or_create(&SignalLabel { eviction_signal: t.signal.as_str().into() })
                .inc_by(0);
        }
    }

    /// Output lines dropped since the last call.
    pub fn output_dropped(&self, log: u64, trace: u64) {
        for (output, n) in [("log", log), ("trace", trace)] {
            self.output_dropped.get_or_create(&OutputLabel { output: output.into() }).inc_by(n);
        }
    }

    pub fn eviction(&self, e: &EvictionRecord) {
        self.recent.record(e);
        if e.error.is_some() {
            self.failed_evictions.inc();
        } else if !e.dry_run {
            self.evictions.get_or_create(&SignalLabel { eviction_signal: e.signal.as_str().into() }).inc();
            let namespace = self.namespace_label(&e.namespace);
            self.evictions_by_namespace.get_or_create(&NamespaceLabel { namespace }).inc();
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

    /// The inventory's pods, counted by spec source.
    pub fn pods_by_spec_source(&self, counts: impl IntoIterator<Item = (SpecSource, i64)>) {
        for (source, n) in counts {
            self.pods.get_or_create(&SpecSourceLabel { spec_source: source.as_str().into() }).set(n);
        }
    }

    /// How many of the inventory's pods carry evictd annotations that do not count.
    pub fn pods_with_ignored_annotations(&self, n: i64) {
        self.ignored_annotations.set(n);
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
    use crate::{
        vocab::ChargeTier,
        wake::{SourceKind, Wake},
    };

    fn record() -> EvictionRecord {
        EvictionRecord {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u".into(),
            signal: crate::vocab::EvictionCause::Signal(Signal::MemoryAvailable),
            available: 1,
            threshold: 2,
            grace_period_seconds: 1,
            message: String::new(),
            annotations: Default::default(),
            dry_run: false,
            error: None,
            decide_us: 500,
            pods_read: None,
            phases: Some(crate::vocab::Phases {
                stop_containers_ms: 120.0,
                stop_sandbox_ms: 30.0,
                memory_released_ms: Some(0.1),
                fast_kill: None,
                ..Default::default()
            }),
            wake_cause: Some(WakeCause::Charge),
            wake_kernel_ts_ns: Some(1_000_000),
            wake_received_ns: Some(1_100_000),
            observed_ns: 1_200_000,
            decided_ns: 1_700_000,
            released_ns: Some(200_000_000),
        }
    }

    /// The last evictions are the last five, with their phases, whatever came before: a pod's
    /// name is a series only while its eviction is among them.
    #[test]
    fn the_recent_evictions_are_the_last_five() {
        let m = Metrics::default();
        for i in 0..7 {
            m.eviction(&EvictionRecord { name: format!("p{i}"), ..record() });
        }
        let text = m.encode();
        let series: Vec<&str> =
            text.lines().filter(|l| l.starts_with("evictd_recent_eviction_timestamp_seconds{")).collect();
        assert_eq!(series.len(), 5, "{text}");
        for i in 2..7 {
            assert!(series.iter().any(|l| l.contains(&format!("pod=\"p{i}\""))), "p{i}: {text}");
        }
        assert!(!text.contains("pod=\"p0\"") && !text.contains("pod=\"p1\""), "{text}");
        assert!(
            text.contains("evictd_recent_eviction_phase_seconds{namespace=\"ns\",pod=\"p6\",phase=\"stop_containers\"} 0.12"),
            "{text}"
        );
    }

    #[test]
    fn wakes_and_evictions_are_counted_and_timed() {
        let m = Metrics::default();
        m.wake.wake(&Wake::now(WakeCause::Timer));
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

    /// Every family is there before anything happens, with the label values
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
            "evictd_pods_ignored_annotations gauge",
            "evictd_policy_thresholds gauge",
            "evictd_node_taint gauge",
            "evictd_eviction_records_reverted counter",
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
            "evictd_output_lines_dropped counter",
        ] {
            assert!(text.contains(&format!("# TYPE {family}\n")), "{family} missing:\n{text}");
        }
        for series in [
            "evictd_policy_thresholds 1",
            "evictd_eviction_records_reverted_total 0",
            "evictd_node_taint{taint=\"evictd.io/memory-pressure\"} 0",
            "evictd_pods{spec_source=\"inferred\"} 0",
            "evictd_node_condition{condition=\"MemoryPressure\"} 0",
            "evictd_wake_source_active{source=\"ebpf\"} 0",
            "evictd_charge_wake_tier{tier=\"batched-charge-hook\"} 0",
            "evictd_ring_buffer_drops_total 0",
            "evictd_kernel_errors_total{error=\"no-config\"} 0",
            "evictd_output_lines_dropped_total{output=\"trace\"} 0",
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
        m.wake.running(&[SourceKind::Poll, SourceKind::Timer], Some(ChargeTier::AdaptivePoll));
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
        // A node with a reading and a threshold in every unit, so that every family that
        // can exist does: the dashboard may query exactly those.
        let o = evictd_policy::observations::Observation { available: 1, capacity: 2, time_ns: None };
        let signals = [Signal::MemoryAvailable, Signal::NodeFsInodesFree, Signal::PidAvailable];
        let thresholds = signals.map(|signal| Threshold {
            signal,
            value: ThresholdValue::Percentage(0.1),
            grace_period_ns: 0,
            min_reclaim: None,
        });
        m.configured(&thresholds);
        m.observed(&thresholds, &signals.into_iter().map(|s| (s, o)).collect());
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
                assert!(
                    exported.contains(&family),
                    "the dashboard queries {name}, which evictd does not export"
                );
                queried += 1;
            }
        }
        assert!(queried > 20, "{queried}");
    }

    /// Evictions by namespace keep at most `NAMESPACE_SERIES` series: namespaces beyond
    /// that (short-lived ones, made per CI run) count under `_other`.
    #[test]
    fn evictions_by_namespace_keep_a_bounded_label_set() {
        let m = Metrics::default();
        for i in 0..(NAMESPACE_SERIES + 50) {
            m.eviction(&EvictionRecord { namespace: format!("ns-{i}"), ..record() });
        }
        m.eviction(&EvictionRecord { namespace: "ns-0".into(), ..record() });
        let text = m.encode();
        let series = text.lines().filter(|l| l.starts_with("evictd_evictions_by_namespace_total{")).count();
        assert_eq!(series, NAMESPACE_SERIES + 1, "{text}");
        assert!(text.contains("evictd_evictions_by_namespace_total{namespace=\"_other\"} 50"), "{text}");
        assert!(text.contains("evictd_evictions_by_namespace_total{namespace=\"ns-0\"} 2"), "{text}");
    }
}
