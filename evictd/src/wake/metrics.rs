//! The wake sources' own metric families: wakes by cause, the kernel → userspace delivery
//! time, which sources run and which charge tier wakes evictd on memory growth, and what
//! the kernel side counted (ring-buffer drops, failures by kind). Every label value known
//! in advance is created at 0 at start.

use evictd_common::KernelError;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::{SourceKind, Wake};
use crate::vocab::{ChargeTier, WakeCause, metrics::latency_buckets};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabel {
    tier: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabel {
    error: &'static str,
}

/// Cheap to clone: every clone counts into the same families.
#[derive(Clone)]
pub struct WakeMetrics {
    wakes: Family<CauseLabel, Counter>,
    delivery: Histogram,
    sources: Family<SourceLabel, Gauge>,
    tier: Family<TierLabel, Gauge>,
    ring_drops: Counter,
    kernel_errors: Family<ErrorLabel, Counter>,
}

impl WakeMetrics {
    pub fn register(r: &mut Registry) -> Self {
        let m = WakeMetrics {
            wakes: Family::default(),
            delivery: Histogram::new(latency_buckets()),
            sources: Family::default(),
            tier: Family::default(),
            ring_drops: Counter::default(),
            kernel_errors: Family::default(),
        };
        r.register("wakes", "Wake events, by source", m.wakes.clone());
        r.register(
            "wake_delivery_seconds",
            "From a kernel event to its receipt by evictd",
            m.delivery.clone(),
        );
        r.register("wake_source_active", "1 for each wake source running", m.sources.clone());
        r.register(
            "charge_wake_tier",
            "1 for the tier that wakes evictd on memory growth (batched-charge-hook, memcg-tracepoints, adaptive-poll)",
            m.tier.clone(),
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
        for cause in WakeCause::ALL {
            m.wakes.get_or_create(&CauseLabel { cause: cause.as_str() }).inc_by(0);
        }
        m.running(&[], None);
        for e in KernelError::ALL {
            m.kernel_errors.get_or_create(&ErrorLabel { error: e.as_str() }).inc_by(0);
        }
        m
    }

    pub fn wake(&self, w: &Wake) {
        self.wakes.get_or_create(&CauseLabel { cause: w.cause.as_str() }).inc();
        if let Some(ns) = w.delivery_ns() {
            self.delivery.observe(ns as f64 / 1e9);
        }
    }

    /// `n` wakes of `cause` that were only counted, not kept one by one.
    pub fn count(&self, cause: WakeCause, n: u64) {
        self.wakes.get_or_create(&CauseLabel { cause: cause.as_str() }).inc_by(n);
    }

    /// The wake sources running, and the charge tier among them (`None`: none wakes on growth).
    pub fn running(&self, sources: &[SourceKind], tier: Option<ChargeTier>) {
        for kind in SourceKind::ALL {
            self.sources
                .get_or_create(&SourceLabel { source: kind.as_str() })
                .set(sources.contains(&kind).into());
        }
        for t in ChargeTier::ALL {
            self.tier.get_or_create(&TierLabel { tier: t.as_str() }).set((tier == Some(t)).into());
        }
    }

    /// What the kernel side counted since the last call.
    pub fn kernel(&self, ring_drops: u64, errors: &[(KernelError, u64)]) {
        self.ring_drops.inc_by(ring_drops);
        for (e, n) in errors {
            self.kernel_errors.get_or_create(&ErrorLabel { error: e.as_str() }).inc_by(*n);
        }
    }
}
