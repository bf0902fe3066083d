//! One eviction decision as evictd reports it: in the log, on `--trace --json`, in metrics.

use std::fmt;

use evictd_policy::{local_storage::LimitKind, policy::Signal, signal::Resource};
use serde::Serialize;

use crate::{runtime::evict::Phases, wake::WakeCause};

/// What happened to one chosen pod, for the log, `--trace` and tests.
#[derive(Clone, Debug, Serialize)]
pub struct EvictionRecord {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The signal past its threshold, or the pod's own limit it exceeded (the kubelet's
    /// `eviction_signal` label either way: `memory.available`, `emptydirfs.limit`, …).
    pub signal: EvictionCause,
    pub available: i64,
    pub threshold: i64,
    pub grace_period_seconds: i64,
    pub message: String,
    /// The kubelet's annotations of the pod's `Evicted` event.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
    pub dry_run: bool,
    /// `None` when it worked (or was a dry run).
    pub error: Option<String>,
    pub decide_us: u64,
    pub phases: Option<Phases>,
    /// What woke evictd for this decision, and when (CLOCK_MONOTONIC ns throughout, the
    /// clock of `bpf_ktime_get_ns`, so latencies can be taken against any other process's).
    pub wake_cause: Option<WakeCause>,
    pub wake_kernel_ts_ns: Option<u64>,
    pub wake_received_ns: Option<u64>,
    pub observed_ns: u64,
    pub decided_ns: u64,
    pub released_ns: Option<u64>,
}

/// Why a pod was evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum EvictionCause {
    /// A node signal past one of its thresholds.
    Signal(Signal),
    /// The pod over one of its own ephemeral-storage limits (`local_storage`).
    Limit(LimitKind),
}

impl EvictionCause {
    pub fn as_str(self) -> &'static str {
        match self {
            EvictionCause::Signal(s) => s.as_str(),
            EvictionCause::Limit(l) => l.as_str(),
        }
    }

    /// The resource it starves: a limit eviction is always about ephemeral storage.
    pub fn resource(self) -> Resource {
        match self {
            EvictionCause::Signal(s) => s.resource(),
            EvictionCause::Limit(_) => Resource::EphemeralStorage,
        }
    }
}

impl fmt::Display for EvictionCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
