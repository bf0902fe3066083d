//! One eviction decision as evictd reports it: in the log, on `--trace --json`, in metrics.

use evictd_policy::policy::Signal;
use serde::Serialize;

use crate::{runtime::evict::Phases, wake::WakeCause};

/// What happened to one chosen pod, for the log, `--trace` and tests.
#[derive(Clone, Debug, Serialize)]
pub struct EvictionRecord {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub signal: Signal,
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
