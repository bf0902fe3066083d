//! The kubelet's `localStorageEviction` in the daemon: when the check runs is decided here
//! (on the housekeeping cadence, in a pass any housekeeping wake of its batch asked for;
//! it reads the disk walker's last walk, never the disk); what it decides is
//! `evictd_policy::engine::local_storage_eviction`'s.

use super::*;

impl Pressure {
    /// The kubelet's `localStorageEviction`, at most once per `storage_limit_period`, in a
    /// pass a housekeeping wake asked for, among however many kernel wakes (a steady stream
    /// of them must not starve it; a pass only memory woke must not wait behind it): every pod over one of its own ephemeral-storage limits (emptyDir
    /// `sizeLimit`, a container's or the pod's limit) is evicted with a 1 s grace period,
    /// whatever the thresholds say. Nothing is read when no pod sets such a limit, and no
    /// directory is walked: logs and volumes are the walker's. After one such eviction a hard
    /// memory threshold met ends the check, and the pass: the memory decision does not wait
    /// behind the stops of every pod over its limits (each a grace period and the wait for
    /// its memory, and a tenant can start many). The next pass decides on memory whatever its
    /// wakes (a housekeeping one, queued during the stop, skips the check while memory is
    /// still short), and the check goes on in the housekeeping pass after it: one pod over
    /// its limits, one memory decision, in turn.
    pub(super) async fn evict_pods_over_storage_limits(
        &mut self,
        pods: &PodList,
        now: i64,
    ) -> Vec<EvictionRecord> {
        // Half a period of slack: the timer that asks ticks at this period, and a tick that
        // comes a little early (the last one was late) must not skip a whole period.
        let period = self.storage_limit_period;
        let due = self.limits_checked.is_none_or(|t| t.elapsed() + period / 2 >= period);
        if !self.policy.local_storage_capacity_isolation || !due {
            return Vec::new();
        }
        if self.limits_cut && self.hard_memory_threshold_met_now(now) {
            return Vec::new();
        }
        self.limits_checked = Some(Instant::now());
        if !pods.iter().any(|p| p.spec.sets_storage_limits()) {
            return Vec::new();
        }
        let t0 = Instant::now();
        let candidates = self.candidates(pods, true, usage::Reads::NONE).await;
        let entries: Vec<PodEntry> = candidates
            .iter()
            .map(|(p, s)| PodEntry { pod: &p.spec, stats: Some(s), protected: self.protects(p) })
            .collect();
        let over = engine::local_storage_eviction(&self.policy, &entries, self.layout);
        tracing::debug!(
            pods = entries.len(),
            over = over.len(),
            "pods checked against their own storage limits"
        );
        drop(entries);
        let mut records: Vec<EvictionRecord> = Vec::with_capacity(over.len());
        let left = over.len();
        for (n, e) in over.into_iter().enumerate() {
            // Only after a pod was evicted: one whose stop keeps failing must not keep the
            // rest from ever being reached while memory stays short.
            let evicted = records.iter().any(|r| r.error.is_none() && !r.dry_run);
            if evicted && self.hard_memory_threshold_met_now(now) {
                tracing::info!(
                    left = left - n,
                    "a hard memory threshold is met: its decision goes before the rest of the pods over their storage limits"
                );
                (self.limits_checked, self.limits_cut) = (None, true);
                break;
            }
            let (pod, stats) = &candidates[e.pod];
            let mut rec = self.limit_record(pod, &e, t0);
            self.act(pod, stats, &mut rec).await;
            records.push(rec);
        }
        records
    }

    pub(super) fn limit_record(&self, pod: &PodRecord, e: &LimitEviction, t0: Instant) -> EvictionRecord {
        self.new_record(pod, EvictionCause::Limit(e.kind), e.grace_period_seconds, &e.message, t0)
    }
}
