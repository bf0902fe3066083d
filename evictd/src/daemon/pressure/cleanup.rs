//! The kubelet's `waitForPodsCleanup` in the daemon: after a memory eviction, no next
//! decision on a memory signal evicts until the evicted pod's memory has come back, for at
//! most `cleanup_window` (the kubelet's 30 s).
//!
//! A pod's processes exiting is not its memory coming back: a memory-medium emptyDir, the
//! sandbox's `/dev/shm`, any tmpfs page stays charged to the pod until the pod is torn down.
//! Deciding again on a node whose signal has not moved yet would evict a second pod for the
//! same pressure. Released here means the pod's memory cgroup is gone (the kubelet removed
//! it) or its working set is down to half of what it was when it was chosen. Only memory
//! below the emergency level, read now, evicts inside the window: waiting then would let the
//! kernel's OOM killer act. Disk evictions have their own wait (`disk`), and PID pressure
//! is relieved once the processes are gone, so neither waits here.

use super::*;
use crate::{daemon::urgency, node::memory::MemoryCgroup};

/// How long the next eviction waits for the last one's memory (the kubelet's
/// `podCleanupTimeout`).
pub(super) const CLEANUP_WINDOW: Duration = Duration::from_secs(30);

/// While a pod's memory is awaited, how often a pass looks again without a wake (the
/// kubelet's `podCleanupPollFreq`): the node may be quiet once the memory is back.
const CLEANUP_POLL: Duration = Duration::from_secs(1);

/// A read of an evicted pod's memory taking longer than this counts as "still held".
const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// An evicted pod whose memory is awaited.
#[derive(Clone, Debug)]
pub(super) struct Cleanup {
    /// `namespace/name`, for the log.
    pod: String,
    sandbox_id: String,
    cgroup: Option<MemoryCgroup>,
    /// Its working set when it was chosen (0 when it could not be read: then only its
    /// cgroup's removal, or the window's end, ends the wait).
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
            sandbox_id: pod.sandbox_id.clone(),
            cgroup,
            chosen_with: stats.memory.as_ref().and_then(|m| m.working_set_bytes).unwrap_or(0),
            killed: Instant::now(),
        }
    }

    /// Reads the pod's memory cgroup (two small files) and tells whether its memory is back.
    fn charge(&self) -> Charge {
        let Some(cg) = &self.cgroup else { return Charge::Released };
        match cg.working_set() {
            Ok(ws) if ws <= self.chosen_with / 2 => Charge::Released,
            Ok(ws) => Charge::Held(Some(ws)),
            Err(_) if !cg.dir.exists() => Charge::Released,
            Err(_) => Charge::Held(None),
        }
    }
}

impl Pressure {
    /// True while the last memory evictions' memory is awaited and memory is not below the
    /// emergency level: this decision, on `signal`, evicts nobody. Logs when a wait ends.
    pub(super) async fn awaits_cleanup(&mut self, signal: Signal, obs: &Observations) -> bool {
        self.forget_expired_cleanups(true);
        if self.cleanups.is_empty() || !signal.is_memory() {
            return false;
        }
        if let Some(emergency) = urgency::below_emergency_level(&self.thresholds, obs, self.kill.emergency) {
            tracing::warn!("{emergency}: evicting without waiting for the last evicted pod's memory");
            self.cleanups.clear();
            return false;
        }
        // The cgroups are read off the daemon's thread, as the candidates' usage is.
        let awaited = self.cleanups.clone();
        let charges = self
            .read_for_decision(READ_TIMEOUT, move || {
                awaited.into_iter().map(|c| c.charge()).collect::<Vec<_>>()
            })
            .await;
        let mut held = Vec::new();
        for (i, c) in std::mem::take(&mut self.cleanups).into_iter().enumerate() {
            match charges.as_ref().map_or(&Charge::Held(None), |ch| &ch[i]) {
                Charge::Released => tracing::info!(
                    pod = %c.pod, after_ms = c.killed.elapsed().as_millis() as u64,
                    "the evicted pod's memory is back; the next eviction may go ahead"
                ),
                Charge::Held(bytes) => held.push((c, *bytes)),
            }
        }
        let Some((first, bytes)) = held.first() else { return false };
        // One line per pod and 10 s: the numbers change every pass.
        if !self.repeated(&format!("awaiting the memory of {}", first.pod)) {
            tracing::warn!(
                pod = %first.pod, charged_mib = bytes.map(|b| b >> 20),
                evicted_s_ago = first.killed.elapsed().as_secs_f64(),
                "pressure persists, but the pod evicted last still holds its memory: the next \
                 eviction waits for that memory, at most {:?}, unless memory falls below the \
                 emergency level", self.cleanup_window
            );
        }
        self.cleanups = held.into_iter().map(|(c, _)| c).collect();
        true
    }

    /// Waits past the window end: the next eviction goes ahead, as the kubelet's would. `said`:
    /// the end is logged; not for waits that ended while no threshold was met, which held
    /// nothing back and whose memory was not looked at (the warning would mislead).
    pub(super) fn forget_expired_cleanups(&mut self, said: bool) {
        let window = self.cleanup_window;
        self.cleanups.retain(|c| {
            let live = c.killed.elapsed() < window;
            if !live && said {
                tracing::warn!(
                    pod = %c.pod,
                    "the evicted pod's memory is still charged {window:?} after its kill (tmpfs, a \
                     memory-medium emptyDir, /dev/shm?); the next eviction may go ahead"
                );
            }
            live
        });
    }

    /// A pod the kubelet restarted (its record did not land in time) will not give its
    /// memory or its disk back: waiting for it would only delay the next eviction.
    pub(super) fn forget_restarted_cleanups(&mut self, pods: &[Arc<PodRecord>]) {
        let gone = &self.gone;
        let waits =
            |sandbox: &str| gone.contains_key(sandbox) || !pods.iter().any(|p| p.sandbox_id == sandbox);
        self.cleanups.retain(|c| {
            let waits = waits(&c.sandbox_id);
            if !waits {
                tracing::info!(pod = %c.pod, "the evicted pod runs again; the next eviction no longer waits for its memory");
            }
            waits
        });
        self.disk_cleanups.retain(|c| {
            let waits = waits(c.sandbox_id());
            if !waits {
                tracing::info!(pod = %c.pod(), "the evicted pod runs again; the next disk eviction no longer waits for its teardown");
            }
            waits
        });
    }

    /// When a pass should look again without a wake, while evicted pods' memory is awaited;
    /// never a time past (that would spin the loop).
    pub fn cleanup_recheck(&self) -> Option<tokio::time::Instant> {
        // With no threshold met there is no eviction to let go ahead: a crossing wakes.
        if !self.threshold_met {
            return None;
        }
        let memory = self.cleanups.iter().map(|c| c.killed);
        let end =
            memory.chain(self.disk_cleanups.iter().map(DiskCleanup::evicted)).max()? + self.cleanup_window;
        let now = Instant::now();
        (end > now).then(|| tokio::time::Instant::from_std((now + CLEANUP_POLL).min(end)))
    }
}
