//! What woke a pass, and how: the cause every wake carries, the tier that wakes evictd on
//! memory growth, and the clock all of their timestamps use.

use std::fmt;

use evictd_common::{CAUSE_CHARGE, CAUSE_DIRECT_RECLAIM, CAUSE_MEMCG_RECLAIM, CAUSE_OOM_KILL};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WakeCause {
    Charge,
    DirectReclaim,
    MemcgReclaim,
    OomKill,
    Timer,
    /// A cgroup v1 memory threshold (eventfd) was crossed.
    Eventfd,
    /// A PSI trigger fired.
    Psi,
    /// The adaptive poll saw usage past its level.
    Poll,
    /// The disk poll saw a disk threshold met.
    Disk,
    /// The daemon's own second look (not a housekeeping tick): at an evicted pod's memory,
    /// or at the pods' disk usage once a walk it asked for is done.
    Recheck,
}

// Per-cause arrays are indexed by `index()`: ALL must end with the last variant.
const _: () = assert!(WakeCause::Recheck as usize + 1 == WakeCause::ALL.len());

impl WakeCause {
    pub const ALL: [WakeCause; 10] = [
        WakeCause::Charge,
        WakeCause::DirectReclaim,
        WakeCause::MemcgReclaim,
        WakeCause::OomKill,
        WakeCause::Timer,
        WakeCause::Eventfd,
        WakeCause::Psi,
        WakeCause::Poll,
        WakeCause::Disk,
        WakeCause::Recheck,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WakeCause::Charge => "charge",
            WakeCause::DirectReclaim => "direct-reclaim",
            WakeCause::MemcgReclaim => "memcg-reclaim",
            WakeCause::OomKill => "oom-kill",
            WakeCause::Timer => "timer",
            WakeCause::Eventfd => "eventfd",
            WakeCause::Psi => "psi",
            WakeCause::Poll => "poll",
            WakeCause::Disk => "disk",
            WakeCause::Recheck => "recheck",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// The cause a kernel event carries (`CAUSE_*` of `evictd-common`); `None` for a number
    /// the programs never send.
    pub fn from_kernel(cause: u32) -> Option<Self> {
        match cause {
            CAUSE_CHARGE => Some(WakeCause::Charge),
            CAUSE_DIRECT_RECLAIM => Some(WakeCause::DirectReclaim),
            CAUSE_MEMCG_RECLAIM => Some(WakeCause::MemcgReclaim),
            CAUSE_OOM_KILL => Some(WakeCause::OomKill),
            _ => None,
        }
    }
}

impl fmt::Display for WakeCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What wakes evictd when memory is charged, fastest first. The one spelling of each is its
/// `Display`: the log, the metrics' `tier` label, `evictd probe` and `--charge-tier`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChargeTier {
    /// fexit programs on `page_counter_try_charge`: once per per-CPU charge batch.
    BatchedChargeHook,
    /// Raw tracepoints on the memcg stat updates: twice per page.
    MemcgTracepoints,
    /// No program on the charge path: the node's usage read at an interval set by the
    /// distance to the nearest threshold.
    AdaptivePoll,
}

impl ChargeTier {
    /// Fastest first.
    pub const ALL: [ChargeTier; 3] =
        [ChargeTier::BatchedChargeHook, ChargeTier::MemcgTracepoints, ChargeTier::AdaptivePoll];

    /// The tiers that are eBPF programs, which `--charge-tier` can insist on.
    pub const EBPF: [ChargeTier; 2] = [ChargeTier::BatchedChargeHook, ChargeTier::MemcgTracepoints];

    pub fn as_str(self) -> &'static str {
        match self {
            ChargeTier::BatchedChargeHook => "batched-charge-hook",
            ChargeTier::MemcgTracepoints => "memcg-tracepoints",
            ChargeTier::AdaptivePoll => "adaptive-poll",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        ChargeTier::ALL.into_iter().find(|t| t.as_str() == name)
    }
}

impl fmt::Display for ChargeTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// CLOCK_MONOTONIC in ns: the clock `bpf_ktime_get_ns` uses, so that every timestamp in a
/// wake and an eviction record can be taken against the kernel's and any other process's.
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cause_indices_are_dense() {
        for (i, c) in WakeCause::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
        }
    }

    #[test]
    fn each_tier_reads_back_from_its_one_spelling() {
        for t in ChargeTier::ALL {
            assert_eq!(ChargeTier::parse(&t.to_string()), Some(t));
            assert_eq!(serde_json::to_value(t).unwrap(), serde_json::json!(t.as_str()));
        }
        assert_eq!(ChargeTier::parse("auto"), None);
    }
}
