//! What an eviction is, as every layer reports it: the chosen pod's record (the log,
//! `--trace --json`, metrics, the Kubernetes record), why it was evicted, and how long each
//! phase of stopping it took.

use std::{fmt, sync::Arc};

use evictd_policy::{local_storage::LimitKind, policy::Signal, signal::Resource};
use serde::Serialize;

use super::wake::WakeCause;

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
    /// How many pods' usage a memory decision read (`None`: not a memory decision, or its
    /// reads were given up on); the others were ranked by a bound from an earlier read and the
    /// node's charge count.
    pub pods_read: Option<usize>,
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

/// How urgent the running stop has become, raised by the daemon while it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Urgency {
    /// The grace period the engine chose.
    #[default]
    Normal,
    /// A hard threshold is met: at most the hard eviction's grace period.
    Hard,
    /// The kernel is about to act (memory.available, or allocatableMemory.available where a
    /// threshold watches it, below the emergency level; reclaim or an OOM kill in the node):
    /// kill now.
    Emergency,
}

/// What the daemon raises while a stop runs: how urgent it has become and, at an emergency,
/// what made it one (which the stop's log line names, so that an operator can tell a level
/// set too high from the kernel at work).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Escalation {
    pub urgency: Urgency,
    /// With `Urgency::Emergency` only.
    pub emergency: Option<EmergencyCause>,
}

impl Escalation {
    /// Takes `now` if it is more urgent, cause and all: never lowers the urgency, and keeps
    /// the cause of the first emergency (the one that killed). True when it rose.
    pub fn raise(&mut self, now: Escalation) -> bool {
        let rose = now.urgency > self.urgency;
        if rose {
            *self = now;
        }
        rose
    }
}

/// What made memory an emergency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmergencyCause {
    /// Direct reclaim in the node.
    DirectReclaim,
    /// Reclaim against a memory cgroup's limit, or an OOM kill, in the node.
    CgroupReclaimOrOom,
    /// A memory signal below its emergency level, in bytes.
    Below { signal: Signal, available: i64, level: i64 },
}

impl fmt::Display for EmergencyCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Tenths of a MiB, the reading rounded down and the level up: a reading a byte under
        // the level never prints as the level itself.
        let tenths = |b: i64, round: fn(f64) -> f64| round(b as f64 * 10.0 / f64::from(1 << 20)) / 10.0;
        match self {
            EmergencyCause::DirectReclaim => f.write_str("the kernel reclaims directly in the node"),
            EmergencyCause::CgroupReclaimOrOom => {
                f.write_str("the kernel reclaims against a memory cgroup's limit, or OOM-kills, in the node")
            }
            EmergencyCause::Below { signal, available, level } => write!(
                f,
                "{signal} read {:.1} MiB, below the emergency level of {:.1} MiB",
                tenths(*available, f64::floor),
                tenths(*level, f64::ceil)
            ),
        }
    }
}

/// What the act step calls once evictd's fast kill has signalled the pod (SIGKILL to every
/// process: nothing can escalate the stop any more). From then on the victim frees every
/// page it held, and whatever the kernel runs on each free (evictd's memcg stat programs)
/// slows the release the next decision waits for. Called once per kill, on the daemon's
/// thread before the reaps: it must not block (it hands its work off). A stop through the
/// runtime never calls it: the pod may still
/// allocate during its grace period, and a charge wake is what makes that an emergency.
#[derive(Clone)]
pub struct OnKilled(Arc<dyn Fn() + Send + Sync>);

impl OnKilled {
    pub fn new(f: impl Fn() + Send + Sync + 'static) -> Self {
        OnKilled(Arc::new(f))
    }

    pub fn call(&self) {
        (self.0)()
    }
}

impl fmt::Debug for OnKilled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OnKilled")
    }
}

/// How long each phase of an eviction took, in milliseconds.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Phases {
    pub stop_containers_ms: f64,
    pub stop_sandbox_ms: f64,
    /// `None`: the pod's cgroup still held a process when `--release-timeout` ran out.
    pub memory_released_ms: Option<f64>,
    /// The fast kill, when there was one.
    pub fast_kill: Option<FastKill>,
    /// What went wrong after the containers died (the sandbox the runtime could not
    /// stop): the eviction stands, with these said beside it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Containers the runtime could not stop in a pod otherwise stopped (their sandbox's stop
    /// failed too): still running, so the pod is not taken for gone while they run.
    #[serde(skip)]
    pub still_running: Vec<String>,
}

impl Phases {
    /// A failure after the kill took effect: logged, and kept with the eviction's record.
    pub fn warn(&mut self, pod: &str, warning: String) {
        tracing::warn!(pod, "evicted, but {warning}");
        self.warnings.push(warning);
    }
}

/// A fast kill in an eviction: why, when, and what it did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FastKill {
    /// `hard` when the hard eviction's grace period is 0, `emergency` when raised mid-stop.
    pub urgency: Urgency,
    /// CLOCK_MONOTONIC ns when SIGKILL had been sent to the whole pod.
    pub signalled_ns: u64,
    #[serde(flatten)]
    pub report: KillReport,
}

/// How the pod was killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KillMethod {
    CgroupKill,
    Freezer,
    Signals,
}

/// What the fast kill did, for the eviction record.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KillReport {
    pub method: KillMethod,
    /// Processes pinned and signalled: with `cgroup.kill`, those still dying once it was
    /// written and pinned after it for reaping (on cgroup v2 the largest alone, at most 16);
    /// else every process of the pod.
    pub processes: usize,
    /// From the start of the kill to SIGKILL sent to the whole pod.
    pub signalled_ms: f64,
    /// Victims whose memory `process_mrelease` freed on evictd's side.
    pub reaped: usize,
    /// From the start of the kill to the end of the last reap.
    pub reaped_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: i64 = 1 << 20;

    fn below(available: i64, level: i64) -> EmergencyCause {
        EmergencyCause::Below { signal: Signal::MemoryAvailable, available, level }
    }

    /// The stop cut short names the emergency that raised it, through a later hard
    /// threshold or another emergency alike.
    #[test]
    fn a_raise_keeps_the_first_emergencys_cause() {
        let hard = Escalation { urgency: Urgency::Hard, emergency: None };
        let first = Escalation { urgency: Urgency::Emergency, emergency: Some(below(40 * MI, 50 * MI)) };
        let later =
            Escalation { urgency: Urgency::Emergency, emergency: Some(EmergencyCause::DirectReclaim) };
        let mut e = Escalation::default();
        assert!(e.raise(hard));
        assert!(!e.raise(hard), "not raised again");
        assert!(e.raise(first));
        assert!(!e.raise(hard), "never lowered");
        assert!(!e.raise(later));
        assert_eq!(e, first);
        let mut e = Escalation::default();
        assert!(e.raise(first), "straight to an emergency");
        assert_eq!(e.emergency, first.emergency);
    }

    /// A reading a byte under the level never prints as the level: half of 10 % of 4 GiB is
    /// 214 748 364 bytes, 204.79999 MiB.
    #[test]
    fn a_reading_under_the_level_prints_under_it() {
        let level = 214_748_364;
        assert_eq!(
            below(level - 1, level).to_string(),
            "memory.available read 204.7 MiB, below the emergency level of 204.8 MiB"
        );
        assert_eq!(
            below(40 * MI, 50 * MI).to_string(),
            "memory.available read 40.0 MiB, below the emergency level of 50.0 MiB"
        );
        assert_eq!(
            below(-MI / 4, 50 * MI).to_string().split(',').next(),
            Some("memory.available read -0.3 MiB")
        );
    }
}
