//! The last few evictions as gauges, for `evictd status` and for a dashboard's table: when
//! each was decided, which pod, for what, the outcome, and how long each phase took. At most
//! `RECENT` evictions, so a pod's name is a label value only while its eviction is among the
//! last few; each scrape encodes them from one snapshot (a collector, not families cleared
//! and refilled under a scrape), and the daemon's thread only pushes onto a short list.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::SystemTime,
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _},
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::vocab::EvictionRecord;

/// How many evictions are kept.
pub const RECENT: usize = 5;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabel {
    namespace: String,
    pod: String,
    eviction_signal: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    namespace: String,
    pod: String,
    phase: String,
}

type Seconds = Gauge<f64, std::sync::atomic::AtomicU64>;

/// One eviction as shown: its labels, when it was decided, and its phases in seconds.
#[derive(Clone, Debug)]
struct Shown {
    namespace: String,
    pod: String,
    signal: String,
    outcome: &'static str,
    decided_unix_s: f64,
    phases: Vec<(&'static str, f64)>,
}

#[derive(Default)]
pub struct RecentEvictions {
    last: Arc<Mutex<VecDeque<Shown>>>,
}

#[derive(Debug)]
struct Encoder(Arc<Mutex<VecDeque<Shown>>>);

impl RecentEvictions {
    pub fn register(&self, r: &mut Registry) {
        r.register_collector(Box::new(Encoder(self.last.clone())));
    }

    /// An eviction just made (or tried, or dry-run), now the newest.
    pub fn record(&self, e: &EvictionRecord) {
        let shown = shown(e);
        // The list stays whole whatever a panic elsewhere did: keep using it.
        let mut last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        last.push_front(shown);
        last.truncate(RECENT);
    }
}

impl Collector for Encoder {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let last = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let (evictions, phases) =
            (Family::<EvictionLabel, Seconds>::default(), Family::<PhaseLabel, Seconds>::default());
        // Oldest first: a pod evicted twice among them shows its newest eviction.
        for s in last.iter().rev() {
            let label = EvictionLabel {
                namespace: s.namespace.clone(),
                pod: s.pod.clone(),
                eviction_signal: s.signal.clone(),
                outcome: s.outcome.into(),
            };
            evictions.get_or_create(&label).set(s.decided_unix_s);
            for (phase, secs) in &s.phases {
                let label =
                    PhaseLabel { namespace: s.namespace.clone(), pod: s.pod.clone(), phase: (*phase).into() };
                phases.get_or_create(&label).set(*secs);
            }
        }
        let metric = encoder.encode_descriptor(
            "recent_eviction_timestamp_seconds",
            "The last evictions: when each was decided (Unix time), the pod, the signal and the outcome",
            None,
            evictions.metric_type(),
        )?;
        evictions.encode(metric)?;
        let metric = encoder.encode_descriptor(
            "recent_eviction_phase_seconds",
            "The phases of the last evictions: detection (wake origin to decision), decide, stop_containers, stop_sandbox, memory_released",
            None,
            phases.metric_type(),
        )?;
        phases.encode(metric)
    }
}

fn shown(e: &EvictionRecord) -> Shown {
    let outcome = match (&e.error, e.dry_run) {
        (Some(_), _) => "failed",
        (None, true) => "dry_run",
        (None, false) => "evicted",
    };
    let mut phases = Vec::new();
    if let Some(received) = e.wake_received_ns {
        let origin = e.wake_kernel_ts_ns.unwrap_or(received);
        phases.push(("detection", e.decided_ns.saturating_sub(origin) as f64 / 1e9));
    }
    phases.push(("decide", e.decide_us as f64 / 1e6));
    if let Some(p) = &e.phases {
        phases.push(("stop_containers", p.stop_containers_ms / 1e3));
        phases.push(("stop_sandbox", p.stop_sandbox_ms / 1e3));
        if let Some(ms) = p.memory_released_ms {
            phases.push(("memory_released", ms / 1e3));
        }
    }
    // The decision's time on the wall clock: the record comes once the stop is done.
    let since_decided = crate::vocab::monotonic_ns().saturating_sub(e.decided_ns) as f64 / 1e9;
    let decided_unix_s = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() - since_decided);
    Shown {
        namespace: e.namespace.clone(),
        pod: e.name.clone(),
        signal: e.signal.as_str().into(),
        outcome,
        decided_unix_s,
        phases,
    }
}
