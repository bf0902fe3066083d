//! The Kubernetes API link's own metric families: every call by its outcome, and how long
//! an evicted pod's record took to land. Registered once at start with every call and
//! outcome at 0, so that an alert on `given_up` or `error` has a series before the first.

use std::{fmt, time::Duration};

use evictd_policy::signal::NodeCondition;
use k8s_openapi::api::core::v1::Taint;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::taints::taint_key;
use crate::vocab::metrics::latency_buckets;

/// The calls evictd makes to the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApiCall {
    /// `PATCH pods/<name>/status`: the eviction's record.
    PodStatus,
    /// `POST events`.
    Event,
    /// `PATCH nodes/<node>/status`: evictd's node conditions.
    NodeStatus,
    /// The list and watch of this node's pods.
    WatchPods,
    /// `GET` and `PATCH nodes/<node>`: evictd's taints.
    NodeTaints,
    /// `GET pods/<name>`: an evicted pod read back.
    PodCheck,
}

/// How a call ended. The reporter's calls end `Ok`, `Refused` (never retried), `GivenUp`
/// (retried until too late), or are `Dropped` (a full queue); each failed try before the
/// last is one `Retried`. A watch that fails counts one `Error` and starts again. The taint
/// writes are tried until the Node is as wanted: `Retried` (a failure or a conflicting
/// write), `Refused` (a 4xx other than 408/409/429: tried again only after a back-off).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApiOutcome {
    Ok,
    Retried,
    Refused,
    GivenUp,
    Dropped,
    Error,
}

impl ApiCall {
    pub const ALL: [ApiCall; 6] = [
        ApiCall::PodStatus,
        ApiCall::Event,
        ApiCall::NodeStatus,
        ApiCall::WatchPods,
        ApiCall::NodeTaints,
        ApiCall::PodCheck,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ApiCall::PodStatus => "pod_status",
            ApiCall::Event => "event",
            ApiCall::NodeStatus => "node_status",
            ApiCall::WatchPods => "watch_pods",
            ApiCall::NodeTaints => "node_taints",
            ApiCall::PodCheck => "pod_check",
        }
    }

    /// The outcomes this call can have.
    pub fn outcomes(self) -> &'static [ApiOutcome] {
        use ApiOutcome::*;
        match self {
            ApiCall::WatchPods => &[Error],
            ApiCall::NodeTaints => &[Ok, Retried, Refused],
            ApiCall::PodCheck => &[Ok, Error],
            _ => &[Ok, Retried, Refused, GivenUp, Dropped],
        }
    }
}

impl ApiOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ApiOutcome::Ok => "ok",
            ApiOutcome::Retried => "retried",
            ApiOutcome::Refused => "refused",
            ApiOutcome::GivenUp => "given_up",
            ApiOutcome::Dropped => "dropped",
            ApiOutcome::Error => "error",
        }
    }
}

impl fmt::Display for ApiCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for ApiOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabel {
    call: &'static str,
    outcome: &'static str,
}

/// Cheap to clone: every clone counts into the same families.
#[derive(Clone)]
pub struct ApiMetrics {
    calls: Family<CallLabel, Counter>,
    recorded: Histogram,
    taints: Family<TaintLabel, Gauge>,
    reverted: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaintLabel {
    taint: &'static str,
}

impl ApiMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = ApiMetrics {
            calls: Family::default(),
            recorded: Histogram::new(latency_buckets()),
            taints: Family::default(),
            reverted: Counter::default(),
        };
        registry.register(
            "kube_api_calls",
            "Kubernetes API calls (pod_status, event, node_status, watch_pods, node_taints, pod_check) by outcome: ok, retried, refused, given_up, dropped, error",
            m.calls.clone(),
        );
        registry.register(
            "eviction_recorded_seconds",
            "From an evicted pod's kill to its Failed/Evicted status accepted by the API server",
            m.recorded.clone(),
        );
        registry.register(
            "eviction_records_reverted",
            "Evicted pods read back running again (the node reverted the record); each is written again",
            m.reverted.clone(),
        );
        registry.register(
            "node_taint",
            "1 while this node carries evictd's taint (as last read or written by evictd)",
            m.taints.clone(),
        );
        for c in NodeCondition::ALL {
            m.taints.get_or_create(&TaintLabel { taint: taint_key(c) }).set(0);
        }
        for call in ApiCall::ALL {
            for outcome in call.outcomes() {
                m.calls
                    .get_or_create(&CallLabel { call: call.as_str(), outcome: outcome.as_str() })
                    .inc_by(0);
            }
        }
        m
    }

    pub fn call(&self, call: ApiCall, outcome: ApiOutcome) {
        self.calls.get_or_create(&CallLabel { call: call.as_str(), outcome: outcome.as_str() }).inc();
    }

    /// An evicted pod read back running again.
    pub fn record_reverted(&self) {
        self.reverted.inc();
    }

    /// The taints the Node carries, as last read or written.
    pub fn node_taints(&self, taints: &[Taint]) {
        for c in NodeCondition::ALL {
            let on = taints.iter().any(|t| t.key == taint_key(c));
            self.taints.get_or_create(&TaintLabel { taint: taint_key(c) }).set(i64::from(on));
        }
    }

    /// An evicted pod's status accepted, `after_kill` after its containers died.
    pub fn status_recorded(&self, after_kill: Duration) {
        self.recorded.observe(after_kill.as_secs_f64());
    }
}
