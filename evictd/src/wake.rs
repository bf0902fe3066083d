//! Wake sources: each only says "look now" (with a cause and timestamps for latency
//! accounting) into one channel. None of them decides anything, so every source drives the
//! same observe → decide path, the fallbacks just later.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use aya::maps::{MapData, RingBuf};
use evictd_common::{
    CAUSE_CHARGE, CAUSE_DIRECT_RECLAIM, CAUSE_MEMCG_RECLAIM, CAUSE_OOM_KILL, CGROUP_KIND_DEFAULT, WakeEvent,
};
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::mpsc,
    task::JoinHandle,
};

pub mod eventfd;
pub mod psi;

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
}

// Per-cause arrays are indexed by `index()`: ALL must end with the last variant.
const _: () = assert!(WakeCause::Psi as usize + 1 == WakeCause::ALL.len());

impl WakeCause {
    pub const ALL: [WakeCause; 7] = [
        WakeCause::Charge,
        WakeCause::DirectReclaim,
        WakeCause::MemcgReclaim,
        WakeCause::OomKill,
        WakeCause::Timer,
        WakeCause::Eventfd,
        WakeCause::Psi,
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
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    fn from_kernel(cause: u32) -> Option<Self> {
        match cause {
            CAUSE_CHARGE => Some(WakeCause::Charge),
            CAUSE_DIRECT_RECLAIM => Some(WakeCause::DirectReclaim),
            CAUSE_MEMCG_RECLAIM => Some(WakeCause::MemcgReclaim),
            CAUSE_OOM_KILL => Some(WakeCause::OomKill),
            _ => None,
        }
    }
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
}

impl Wake {
    fn from_kernel(ev: &WakeEvent, received_ns: u64) -> Option<Self> {
        Some(Wake {
            cause: WakeCause::from_kernel(ev.cause)?,
            kernel_ts_ns: Some(ev.ts_ns),
            received_ns,
            cgroup_id: ev.cgroup_id,
            cgroup_kind: ev.cgroup_kind,
            amount_bytes: ev.amount_bytes,
            pid: ev.pid,
            cpu: ev.cpu,
        })
    }

    fn timer() -> Self {
        Wake::now(WakeCause::Timer)
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
        }
    }

    /// Kernel emit → userspace receipt, where both are known.
    pub fn delivery_ns(&self) -> Option<u64> {
        self.kernel_ts_ns.map(|k| self.received_ns.saturating_sub(k))
    }
}

/// CLOCK_MONOTONIC in ns: the clock `bpf_ktime_get_ns` uses.
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// Counts kept by userspace about the wake stream.
#[derive(Debug, Default)]
pub struct WakeStats {
    /// Wakes that found the channel full (the consumer is behind; a look is pending anyway).
    pub channel_full: AtomicU64,
    /// Ring-buffer records that were not a valid event.
    pub malformed: AtomicU64,
}

/// Drains the eBPF ring buffer on every readiness and forwards each event.
pub fn spawn_ring_buffer(
    ring: RingBuf<MapData>,
    tx: mpsc::Sender<Wake>,
    stats: Arc<WakeStats>,
) -> std::io::Result<JoinHandle<std::io::Result<()>>> {
    // SAFETY: the RingBuf owns its map fd and keeps it open, unchanged, for as long as it
    // lives, and the AsyncFd owns the RingBuf.
    let mut fd =
        unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }.map_err(std::io::Error::from)?;
    Ok(tokio::spawn(async move {
        loop {
            let mut guard = fd.readable_mut().await?;
            let ring = guard.get_inner_mut();
            let now = monotonic_ns();
            while let Some(item) = ring.next() {
                let wake = (item.len() >= size_of::<WakeEvent>())
                    // SAFETY: the record holds at least a WakeEvent, which is plain integers
                    // (any bit pattern valid); read_unaligned because the ring gives no alignment promise.
                    .then(|| unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<WakeEvent>()) })
                    .and_then(|ev| Wake::from_kernel(&ev, now));
                let Some(wake) = wake else {
                    stats.malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                match tx.try_send(wake) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        stats.channel_full.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return Ok(()),
                }
            }
            guard.clear_ready();
        }
    }))
}

/// The last-resort wake: every `interval`, whatever the kernel says.
pub fn spawn_timer(interval: Duration, tx: mpsc::Sender<Wake>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // A full channel means a look is already pending: nothing lost.
            if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(Wake::timer()) {
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_causes_map_and_unknown_is_rejected() {
        let ev = WakeEvent { cause: CAUSE_OOM_KILL, ts_ns: 5, ..Default::default() };
        let w = Wake::from_kernel(&ev, 7).unwrap();
        assert_eq!(w.cause, WakeCause::OomKill);
        assert_eq!(w.delivery_ns(), Some(2));
        assert!(Wake::from_kernel(&WakeEvent { cause: 99, ..Default::default() }, 0).is_none());
        assert_eq!(Wake::timer().delivery_ns(), None);
    }

    #[test]
    fn cause_indices_are_dense() {
        for (i, c) in WakeCause::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
        }
    }
}
