//! The kubelet's `waitForPodsCleanup` in the daemon: after an eviction, no next decision
//! evicts until the evicted pod's memory has come back, for at most `CLEANUP_WINDOW`.
//!
//! A pod's processes exiting is not its memory coming back: a memory-medium emptyDir, the
//! sandbox's `/dev/shm`, any tmpfs page stays charged to the pod until the pod is torn down.
//! Deciding again on a node whose signal has not moved yet would evict a second pod for the
//! same pressure. Released here means the pod's memory cgroup is gone (the kubelet removed
//! it) or its working set is down to half of what it was when it was chosen. Only an
//! emergency (memory.available below the emergency level, the kernel reclaiming or
//! OOM-killing for the node) evicts inside the window: then waiting would let the kernel act.

use super::*;
use crate::{daemon::urgency, node::memory::MemoryCgroup};

/// How long the next eviction waits for the last one's memory (the kubelet's
/// `podCleanupTimeout`).
pub(super) const CLEANUP_WINDOW: Duration = Duration::from_secs(30);

/// While a pod's memory is awaited, how often a pass looks again without a wake (the
/// kubelet's `podCleanupPollFreq`): the node may be quiet once the memory is back.
pub(super) const CLEANUP_POLL: Duration = Duration::from_secs(1);

/// An evicted pod whose memory is awaited.
#[derive(Clone, Debug)]
pub(super) struct Cleanup {
    /// `namespace/name`, for the log.
    pod: String,
    cgroup: Option<MemoryCgroup>,
    /// Its working set when it was chosen.
    chosen_with: u64,
    killed: Instant,
}

/// Where an awaited pod's memory stands.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Charge {
    /// The cgroup is gone, or it holds at most half of what it did.
    Released,
    /// Still this much charged (`None`: it could not be read, so it is not known to be back).
    Held(Option<u64>),
}

impl Cleanup {
    pub(super) fn after_kill(pod: &PodRecord, cgroup: Option<MemoryCgroup>, stats: &PodStats) -> Self {
        Cleanup {
            pod: format!("{}/{}", pod.namespace, pod.name),
            cgroup,
            chosen_with: stats.memory.as_ref().and_then(|m| m.working_set_bytes).unwrap_or(0),
            killed: Instant::now(),
        }
    }

    /// Reads the pod's memory cgroup (two small files) and tells whether its memory is back.
    pub(super) fn charge(&self) -> Charge {
        let Some(cg) = &self.cgroup else { return Charge::Released };
        match cg.read() {
            Ok(m) if m.working_set() <= self.chosen_with / 2 => Charge::Released,
            Ok(m) => Charge::Held(Some(m.working_set())),
            Err(_) if !cg.dir.exists() => Charge::Released,
            Err(_) => Charge::Held(None),
        }
    }
}

impl Pressure {
    /// True while the last evictions' memory is awaited and the node is not in an
    /// emergency: this decision evicts nobody. Logs when the wait ends, and why.
    pub(super) fn awaits_cleanup(&mut self, obs: &Observations) -> bool {
        let mut held = Vec::new();
        for c in std::mem::take(&mut self.cleanups) {
            match c.charge() {
                Charge::Released => tracing::info!(
                    pod = %c.pod, after_ms = c.killed.elapsed().as_millis() as u64,
                    "the evicted pod's memory is back; the next eviction may go ahead"
                ),
                Charge::Held(bytes) if c.killed.elapsed() >= CLEANUP_WINDOW => tracing::warn!(
                    pod = %c.pod, charged_mib = bytes.map(|b| b >> 20),
                    "the evicted pod's memory is still charged {CLEANUP_WINDOW:?} after its kill \
                     (tmpfs, a memory-medium emptyDir, /dev/shm?); the next eviction may go ahead"
                ),
                Charge::Held(bytes) => held.push((c, bytes)),
            }
        }
        if held.is_empty() {
            return false;
        }
        if self.emergency(obs) {
            tracing::warn!("emergency: evicting again without waiting for the last evicted pod's memory");
            return false;
        }
        let (first, bytes) = &held[0];
        let charged = bytes.map_or_else(|| "an unreadable amount".to_owned(), |b| format!("{} MiB", b >> 20));
        self.warn_limited(format!(
            "pressure persists, but pod {} evicted {:.1} s ago still holds {charged}: the next \
             eviction waits for that memory, at most {CLEANUP_WINDOW:?}, unless an emergency",
            first.pod,
            first.killed.elapsed().as_secs_f64()
        ));
        self.cleanups = held.into_iter().map(|(c, _)| c).collect();
        true
    }

    /// When a pass should look again without a wake, while evicted pods' memory is awaited.
    pub fn cleanup_recheck(&self) -> Option<tokio::time::Instant> {
        let end = self.cleanups.iter().map(|c| c.killed + CLEANUP_WINDOW).max()?;
        Some(tokio::time::Instant::from_std((Instant::now() + CLEANUP_POLL).min(end)))
    }

    /// Whether evicted pods' memory is awaited: the pass then judges the urgency of its own
    /// wakes (a direct reclaim among them is an emergency).
    pub fn awaiting_cleanup(&self) -> bool {
        !self.cleanups.is_empty()
    }

    /// An emergency: memory below the emergency level now, or the kernel seen acting for the
    /// node by the wakes of this pass.
    fn emergency(&self, obs: &Observations) -> bool {
        let now = urgency::urgency_now(&self.thresholds, obs, self.kill.emergency, Default::default());
        now == Urgency::Emergency || *self.escalate.borrow() == Urgency::Emergency
    }
}
