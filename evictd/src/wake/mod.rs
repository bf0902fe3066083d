//! Wake sources: each only says "look now" (with a cause and timestamps for latency
//! accounting) into one channel. None of them decides anything, so every source drives the
//! same observe → decide path, the fallbacks just later.
//!
//! One file per source, holding both halves — registration and the task that waits on
//! it: `ebpf` (the kernel's ring buffer; the programs themselves are loaded by
//! `crate::kernel`), `eventfd` (cgroup v1 memory thresholds), `psi` (pressure stall
//! triggers), `poll` (the node's usage read at an interval set by the distance to the
//! nearest threshold), `disk` (the same for the filesystems of disk thresholds), `timer`. The daemon starts them from one list (`start`) and after every pass
//! lets each re-arm on the node as just observed (`WakeSource::rearm`).

use std::{
    sync::{Arc, atomic::AtomicU64},
    time::Duration,
};

use evictd_common::{CGROUP_KIND_DEFAULT, WakeEvent};
use evictd_policy::{observations::Observations, policy::Threshold};
use tokio::sync::mpsc;

use crate::{
    kernel::ebpf::{ChargeClock, Counters, LoadOptions},
    node::signals::NodeSignalSources,
    vocab::{ChargeTier, OnKilled, WakeCause, monotonic_ns},
};

pub mod disk;
pub mod ebpf;
pub mod eventfd;
pub mod metrics;
pub mod poll;
pub mod psi;
pub mod timer;

pub use ebpf::Watermark;

/// The wake sources, in the order they are started (and named in `--wake-sources`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    Ebpf,
    Eventfd,
    Psi,
    Poll,
    Disk,
    Timer,
}

impl SourceKind {
    pub const ALL: [SourceKind; 6] = [
        SourceKind::Ebpf,
        SourceKind::Eventfd,
        SourceKind::Psi,
        SourceKind::Poll,
        SourceKind::Disk,
        SourceKind::Timer,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Ebpf => "ebpf",
            SourceKind::Eventfd => "eventfd",
            SourceKind::Psi => "psi",
            SourceKind::Poll => "poll",
            SourceKind::Disk => "disk",
            SourceKind::Timer => "timer",
        }
    }

    pub fn parse(s: &str) -> Option<SourceKind> {
        SourceKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// How the wake sources are set up (`--wake-sources` and the eBPF flags).
pub struct WakeOptions {
    pub sources: Vec<SourceKind>,
    pub housekeeping: Duration,
    /// The fastest fill the adaptive poll must see in time, bytes per second.
    pub poll_fill_rate: u64,
    /// The fastest fills the disk poll must see in time.
    pub disk_fill_rates: disk::FillRates,
    /// With the poll running, attach the charge programs only near a memory threshold.
    pub charge_probes_near: bool,
    pub load: LoadOptions,
    pub watermark: Watermark,
}

/// The node as the last pass saw it: what a source re-arms on.
pub struct NodeNow<'a> {
    pub thresholds: &'a [Threshold],
    pub observations: &'a Observations,
    pub signals: &'a NodeSignalSources,
    /// Bytes charged since the observations were read, as far as the charge count tells
    /// (0 without it): a source that counts growth from its re-arm takes them off the
    /// distance, or its next wake would come late by them.
    pub charged_since_read: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum WakeError {
    #[error("eBPF wake source: {0}")]
    Ebpf(#[from] crate::kernel::ebpf::EbpfError),
    #[error("eBPF wake source: polling the ring buffer: {0}")]
    RingBuffer(std::io::Error),
    #[error("eventfd wake source: {0}")]
    Eventfd(#[from] eventfd::ThresholdError),
    #[error("PSI wake source on {path}: {error}")]
    Psi { path: String, error: std::io::Error },
    #[error("{0} stopped")]
    Stopped(&'static str),
    #[error("eBPF wake source: the node cgroup {path}: {source}")]
    NodeCgroup { path: std::path::PathBuf, source: std::io::Error },
    /// Said once, without the "eBPF wake source" chain around it: the flag names it.
    #[error("{0}")]
    ForcedTier(crate::kernel::ebpf::EbpfError),
    #[error("no wake source could be started (see the warnings above; --wake-sources timer always works)")]
    NoSource,
}

/// A started wake source. Each overrides only the hooks it needs.
pub trait WakeSource {
    fn kind(&self) -> SourceKind;
    /// After every pass: move the level at which the kernel wakes evictd next.
    fn rearm(&mut self, _node: &NodeNow) -> Result<(), WakeError> {
        Ok(())
    }
    /// The pod list changed: pods (and so cgroups) came or went.
    fn cgroups_changed(&mut self) -> Result<(), WakeError> {
        Ok(())
    }
    /// Once a second: follow what changes without the pod list saying so (a node cgroup made
    /// again at the same path).
    fn each_second(&mut self) -> Result<(), WakeError> {
        Ok(())
    }
    /// Once a second: check that the source's tasks still run; an error drops the source.
    fn supervise(&mut self) -> Result<(), WakeError> {
        Ok(())
    }
    /// The kernel side's counters, for the `--trace` summary.
    fn kernel_counters(&self) -> Option<Counters> {
        None
    }
    /// The charge growth after which the kernel wakes evictd next.
    fn watermark(&self) -> Option<u64> {
        None
    }
    /// The charge tier this source wakes evictd through on memory growth, if any.
    fn charge_tier(&self) -> Option<ChargeTier> {
        None
    }
    /// Whether the charge programs are attached now (the eBPF source).
    fn charge_probes_attached(&self) -> Option<bool> {
        None
    }
    /// What the act step should call once a pod it stops is being killed (the eBPF source:
    /// take its charge programs off the victim's exit).
    fn on_killed(&self) -> Option<OnKilled> {
        None
    }
    /// The node's charge count, when this source's kernel programs keep one that bounds the
    /// pods' growth (the eBPF source).
    fn charge_clock(&self) -> Option<ChargeClock> {
        None
    }
}

/// The task a source waits in. Dropping the source ends it; a task that ended on its own
/// (its fd failed) wakes nobody any more, which `supervise` reports.
pub(crate) struct SourceTask<T> {
    /// What the task is, for the log: "the adaptive poll".
    name: &'static str,
    handle: tokio::task::JoinHandle<T>,
}

impl<T> SourceTask<T> {
    pub(crate) fn new(name: &'static str, handle: tokio::task::JoinHandle<T>) -> Self {
        SourceTask { name, handle }
    }

    pub(crate) fn has_ended(&self) -> bool {
        self.handle.is_finished()
    }

    /// `supervise` for a source that is one task: an ended task drops the source.
    pub(crate) fn check_running(&self) -> Result<(), WakeError> {
        if self.has_ended() {
            return Err(WakeError::Stopped(self.name));
        }
        Ok(())
    }
}

impl<T> Drop for SourceTask<T> {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// A source that is nothing but a task waiting on the kernel or the clock (PSI, timer):
/// nothing to re-arm.
struct TaskSource {
    kind: SourceKind,
    task: SourceTask<()>,
}

impl WakeSource for TaskSource {
    fn kind(&self) -> SourceKind {
        self.kind
    }

    fn supervise(&mut self) -> Result<(), WakeError> {
        self.task.check_running()
    }
}

/// Starts every source in `opts.sources` that this node allows; each one that cannot start
/// is reported and skipped. Fails when none starts, or when the charge tier named by
/// `--charge-tier` cannot attach (falling back would hide what was asked for).
pub fn start(
    opts: &WakeOptions,
    signals: &NodeSignalSources,
    tx: &mpsc::Sender<Wake>,
    stats: &Arc<WakeStats>,
) -> Result<Vec<Box<dyn WakeSource>>, WakeError> {
    let mut started: Vec<Box<dyn WakeSource>> = Vec::new();
    for kind in SourceKind::ALL {
        if !opts.sources.contains(&kind) {
            tracing::info!("{} wake source disabled by --wake-sources", kind.as_str());
            continue;
        }
        let source = match kind {
            SourceKind::Ebpf => ebpf::start(opts, signals, tx.clone(), stats.clone()).map(Some),
            SourceKind::Eventfd => Ok(eventfd::start(signals, tx.clone())),
            SourceKind::Psi => psi::start(signals, tx.clone()).map(Some),
            SourceKind::Poll => Ok(Some(poll::start(&signals.node, opts.poll_fill_rate, tx.clone()))),
            SourceKind::Disk => Ok(Some(disk::start(signals, opts.disk_fill_rates, tx.clone()))),
            SourceKind::Timer => Ok(Some(timer::start(opts.housekeeping, tx.clone()))),
        };
        match source {
            Ok(Some(s)) => started.push(s),
            Ok(None) => {}
            Err(WakeError::Ebpf(e @ crate::kernel::ebpf::EbpfError::TierUnavailable { .. })) => {
                return Err(WakeError::ForcedTier(e));
            }
            Err(e) => tracing::warn!("{e}; carrying on without it"),
        }
    }
    if started.is_empty() {
        return Err(WakeError::NoSource);
    }
    Ok(started)
}

/// One reason to look now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wake {
    pub cause: WakeCause,
    /// CLOCK_MONOTONIC ns when the kernel emitted the event (kernel sources only).
    pub kernel_ts_ns: Option<u64>,
    /// CLOCK_MONOTONIC ns when userspace picked it up.
    pub received_ns: u64,
    pub cgroup_id: u64,
    pub cgroup_kind: u32,
    pub amount_bytes: i64,
    pub pid: u32,
    pub cpu: u32,
    /// Stands for kernel events of this cause lost to a full ring buffer: whose and where
    /// they were is unknown (`NodeScope::kernel_acting` says when they count as the node's).
    pub lost: bool,
}

impl Wake {
    pub(crate) fn from_kernel(ev: &WakeEvent, received_ns: u64) -> Option<Self> {
        Some(Wake {
            cause: WakeCause::from_kernel(ev.cause)?,
            kernel_ts_ns: Some(ev.ts_ns),
            received_ns,
            cgroup_id: ev.cgroup_id,
            cgroup_kind: ev.cgroup_kind,
            amount_bytes: ev.amount_bytes,
            pid: ev.pid,
            cpu: ev.cpu,
            lost: false,
        })
    }

    /// Kernel events of `cause` lost to a full ring buffer, noticed now.
    pub(crate) fn lost(cause: WakeCause) -> Self {
        Wake { lost: true, ..Wake::now(cause) }
    }

    /// A userspace wake source's wake, stamped now.
    pub fn now(cause: WakeCause) -> Self {
        Wake {
            cause,
            kernel_ts_ns: None,
            received_ns: monotonic_ns(),
            cgroup_id: 0,
            cgroup_kind: CGROUP_KIND_DEFAULT,
            amount_bytes: 0,
            pid: 0,
            cpu: 0,
            lost: false,
        }
    }

    /// Kernel emit → userspace receipt, where both are known.
    pub fn delivery_ns(&self) -> Option<u64> {
        self.kernel_ts_ns.map(|k| self.received_ns.saturating_sub(k))
    }
}

/// Counts kept by userspace about the wake stream.
#[derive(Debug, Default)]
pub struct WakeStats {
    /// Wakes that found the channel full (the consumer is behind; a look is pending anyway).
    pub channel_full: AtomicU64,
    /// Ring-buffer records that were not a valid event.
    pub malformed: AtomicU64,
}

#[cfg(test)]
mod tests {
    use evictd_common::CAUSE_OOM_KILL;

    use super::*;

    #[test]
    fn kernel_causes_map_and_unknown_is_rejected() {
        let ev = WakeEvent { cause: CAUSE_OOM_KILL, ts_ns: 5, ..Default::default() };
        let w = Wake::from_kernel(&ev, 7).unwrap();
        assert_eq!(w.cause, WakeCause::OomKill);
        assert_eq!(w.delivery_ns(), Some(2));
        assert!(Wake::from_kernel(&WakeEvent { cause: 99, ..Default::default() }, 0).is_none());
        assert_eq!(Wake::now(WakeCause::Timer).delivery_ns(), None);
    }

    #[tokio::test]
    async fn a_source_whose_task_ended_says_so_and_dropping_one_ends_its_task() {
        let mut ended = TaskSource {
            kind: SourceKind::Timer,
            task: SourceTask::new("the test's task", tokio::spawn(async {})),
        };
        tokio::time::timeout(Duration::from_secs(5), async {
            while !ended.task.has_ended() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("a task that returns at once ends");
        assert!(matches!(ended.supervise(), Err(WakeError::Stopped("the test's task"))));

        let (tx, mut rx) = mpsc::channel::<()>(1);
        let running = SourceTask::new("waits", tokio::spawn(async move { tx.closed().await }));
        assert!(running.check_running().is_ok());
        drop(running);
        // The aborted task dropped its sender: the channel closes.
        assert_eq!(tokio::time::timeout(Duration::from_secs(5), rx.recv()).await, Ok(None));
    }
}
