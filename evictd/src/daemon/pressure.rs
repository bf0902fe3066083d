//! One pass of observe → decide → act, run on every wake. Cheap when nothing is near: the
//! engine first decides without pods, and only when a threshold is actionable are the pods'
//! cgroups read for ranking. One pod per decision; when a kill fails the next candidate is
//! taken, as the kubelet does (unless the runtime itself is down: then the next pass tries
//! again); after an eviction the pass repeats at once (the kubelet's loop does not sleep
//! after an eviction either). The daemon runs each pass in a task of its own.

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, Instant},
};

use evictd_policy::{
    engine::{self, EngineState},
    local_storage::{self, LimitEviction},
    observations::Observations,
    policy::{NodeCondition, Policy, Threshold},
    rank::{FsLayout, PodEntry},
    summary::PodStats,
};
use tokio::sync::watch;

use super::{KillOptions, PressureOptions};
use crate::{
    cluster::reporter::Reporter,
    node::{cgroups::CgroupMounts, signals::NodeSignalSources},
    runtime::{
        cri::CriClient,
        evict::{self, StopPlan},
        inventory::PodRecord,
        kill::KillTarget,
        reclaim, usage,
    },
    vocab::{EvictionCause, EvictionRecord, Urgency, WakeCause, monotonic_ns},
    wake::Wake,
};

/// Candidates tried in one decision when kills fail.
const MAX_CANDIDATES: usize = 5;
/// Evictions in one pass before yielding to the loop again.
const MAX_EVICTIONS_PER_PASS: usize = 16;

/// How long disk evictions wait after node-level reclaim removed something or a pod was
/// evicted for disk: the runtime releases the space asynchronously (containerd deletes
/// snapshots in its garbage collector, and an evicted pod's writable layers only go when
/// the next reclaim removes its dead containers), so statvfs right afterwards would make
/// evictd evict a second pod for space that is already on its way back.
const DISK_SETTLE: Duration = Duration::from_secs(2);
/// How often a repeated warning may be logged.
const WARN_EVERY: Duration = Duration::from_secs(10);

pub struct Pressure {
    pub policy: Policy,
    pub thresholds: Vec<Threshold>,
    pub layout: FsLayout,
    pub signals: NodeSignalSources,
    pub cgroups: CgroupMounts,
    pub client: Option<CriClient>,
    pub dry_run: bool,
    pub release_timeout: Duration,
    pub kill: KillOptions,
    pub own_pod_uid: Option<String>,
    pub evict_inferred_kube_system: bool,
    /// Where evictions are recorded in Kubernetes (`None`: no API, or a dry run).
    pub api: Option<Reporter>,
    /// The node conditions of the last decision (the kubelet's, reported as evictd's own).
    pub conditions: Vec<NodeCondition>,
    /// Raised by the daemon while a stop runs (see `urgency`).
    pub escalate: watch::Receiver<Urgency>,
    state: EngineState,
    /// Sandboxes evicted until the inventory stops listing them.
    gone: BTreeSet<String>,
    last_warning: Option<(String, Instant)>,
    /// Set by node-level reclaim that removed something, or a disk eviction: for
    /// `DISK_SETTLE` no pod is evicted for a disk signal.
    disk_settle: Option<DiskSettle>,
    /// How often pods are checked against their own ephemeral-storage limits, and when
    /// they last were.
    storage_limit_period: Duration,
    limits_checked: Option<Instant>,
}

/// Space on its way back to a filesystem, and since when.
#[derive(Clone, Copy, Debug)]
struct DiskSettle {
    since: Instant,
    /// What released it: node-level reclaim, or an eviction.
    after: &'static str,
}

impl DiskSettle {
    fn after(after: &'static str) -> Self {
        DiskSettle { since: Instant::now(), after }
    }
}

impl Pressure {
    pub fn new(
        policy: Policy,
        opts: PressureOptions,
        cgroups: CgroupMounts,
        client: Option<CriClient>,
        escalate: watch::Receiver<Urgency>,
    ) -> Self {
        let thresholds = engine::thresholds_for_layout(&policy, opts.fs_layout);
        Pressure {
            policy,
            thresholds,
            layout: opts.fs_layout,
            signals: opts.signals,
            cgroups,
            client,
            dry_run: opts.dry_run,
            release_timeout: opts.release_timeout,
            kill: opts.kill,
            own_pod_uid: opts.own_pod_uid,
            evict_inferred_kube_system: opts.evict_inferred_kube_system,
            api: None,
            conditions: Vec::new(),
            escalate,
            state: EngineState::default(),
            gone: BTreeSet::new(),
            last_warning: None,
            disk_settle: None,
            storage_limit_period: opts.storage_limit_period,
            limits_checked: None,
        }
    }

    /// A re-read policy (SIGHUP): its thresholds for this node's disk layout, with the
    /// engine's state carried over (`engine::carry_over`).
    pub fn set_policy(&mut self, policy: Policy) {
        let thresholds = engine::thresholds_for_layout(&policy, self.layout);
        self.state = engine::carry_over(&self.state, &self.thresholds, &thresholds);
        self.thresholds = thresholds;
        self.policy = policy;
    }

    pub fn observe(&self, now_ns: i64) -> Observations {
        let mut missing = Vec::new();
        let obs = self.signals.observe(now_ns, &mut missing);
        for m in missing {
            // No number, no decision on it: the signal simply has no observation.
            tracing::debug!(signal = %m.signal, "signal unreadable: {}", m.reason);
        }
        obs
    }

    /// The inventory changed: forget evicted sandboxes it no longer lists.
    pub fn inventory_updated(&mut self, pods: &[PodRecord]) {
        self.gone.retain(|id| pods.iter().any(|p| &p.sandbox_id == id));
    }

    /// Observe, decide, act; repeated while evictions succeed. `pods` is the inventory's
    /// latest snapshot. Returns what was done and the node's latest observation.
    pub async fn pass(
        &mut self,
        pods: &Arc<Vec<PodRecord>>,
        now_ns: impl Fn() -> i64,
        wake: Option<Wake>,
    ) -> (Vec<EvictionRecord>, Observations) {
        let mut records = self.evict_pods_over_storage_limits(pods, wake).await;
        if !records.is_empty() {
            let observed_ns = monotonic_ns();
            for rec in &mut records {
                rec.observed_ns = observed_ns;
            }
            if let (Some(w), Some(first)) = (wake, records.first_mut()) {
                first.wake_cause = Some(w.cause);
                first.wake_kernel_ts_ns = w.kernel_ts_ns;
                first.wake_received_ns = Some(w.received_ns);
            }
            // The kubelet returns the pods it evicted over their limits and leaves thresholds
            // to its next tick; so does this pass. A dry run or failed stops evicted nobody.
            if records.iter().any(|r| r.error.is_none() && !r.dry_run) {
                return (records, self.observe(now_ns()));
            }
        }
        let mut obs = self.observe(now_ns());
        for _ in 0..MAX_EVICTIONS_PER_PASS {
            let observed_ns = monotonic_ns();
            let mut decided = self.decide_and_act(pods, &obs, now_ns()).await;
            let Some(last) = decided.last() else { break };
            let succeeded = last.error.is_none() && !last.dry_run;
            // A disk eviction frees nothing until the runtime removes the pod's layers: the
            // next pass, after the settle, sees what it freed.
            let disk = last.signal.resource().is_disk();
            for rec in &mut decided {
                rec.observed_ns = observed_ns;
            }
            // Only the first decision of a pass answers the wake; the rest follow evictions.
            if records.is_empty()
                && let (Some(w), Some(first)) = (wake, decided.first_mut())
            {
                first.wake_cause = Some(w.cause);
                first.wake_kernel_ts_ns = w.kernel_ts_ns;
                first.wake_received_ns = Some(w.received_ns);
            }
            records.extend(decided);
            if !succeeded || disk {
                break;
            }
            // The node after the eviction: what the next decision (and the caller) sees.
            obs = self.observe(now_ns());
        }
        (records, obs)
    }

    /// One decision: first without pods (cheap, and all a wake far from any threshold
    /// costs), then node-level reclaim for disk signals, then the pods' usage and the
    /// eviction of one pod. Returns its records: those of candidates whose kill failed, then
    /// the eviction (empty: nothing to do).
    async fn decide_and_act(
        &mut self,
        pods: &Arc<Vec<PodRecord>>,
        obs: &Observations,
        now: i64,
    ) -> Vec<EvictionRecord> {
        let t0 = Instant::now();
        let (state, first) = engine::decide(&self.input(obs, &[], now), &self.state);
        self.conditions.clone_from(&first.node_conditions);
        if first.actionable.is_empty() {
            self.disk_settled();
            self.state = state;
            return Vec::new();
        }
        if self.disk_settling(&first) || self.node_level_reclaim_resolves(&first, pods, now).await {
            self.state = state;
            return Vec::new();
        }
        // Something is actionable: now, and only now, read the pods' cgroups.
        let disk = self.drives_on_disk(&first);
        let candidates = self.candidates(pods, disk).await;
        let records = self.evict_one(&candidates, obs, now, t0).await;
        if disk && records.iter().any(|r| r.error.is_none() && !r.dry_run) {
            self.disk_settle = Some(DiskSettle::after("the eviction"));
        }
        records
    }

    /// The kubelet's `localStorageEviction`, at most once per `storage_limit_period` and only
    /// in a pass the housekeeping timer woke (the disk walk never delays a pass a memory
    /// wake asked for): every pod over one of its own ephemeral-storage limits (emptyDir
    /// `sizeLimit`, a container's or the pod's limit) is evicted with a 1 s grace period,
    /// whatever the thresholds say. Nothing is read when no pod sets such a limit.
    async fn evict_pods_over_storage_limits(
        &mut self,
        pods: &Arc<Vec<PodRecord>>,
        wake: Option<Wake>,
    ) -> Vec<EvictionRecord> {
        let housekeeping = wake.is_none_or(|w| w.cause == WakeCause::Timer);
        let due = self.limits_checked.is_none_or(|t| t.elapsed() >= self.storage_limit_period);
        if !self.policy.local_storage_capacity_isolation || !housekeeping || !due {
            return Vec::new();
        }
        self.limits_checked = Some(Instant::now());
        if !pods.iter().any(|p| p.spec.sets_storage_limits()) {
            return Vec::new();
        }
        let t0 = Instant::now();
        let candidates = self.candidates(pods, true).await;
        let entries: Vec<PodEntry> = candidates
            .iter()
            .map(|(p, s)| PodEntry { pod: &p.spec, stats: Some(s), protected: self.protects(p) })
            .collect();
        let over = local_storage::limit_evictions(&entries, self.layout);
        tracing::debug!(
            pods = entries.len(),
            over = over.len(),
            "pods checked against their own storage limits"
        );
        drop(entries);
        let mut records = Vec::with_capacity(over.len());
        for e in over {
            let pod = candidates[e.pod].0;
            let mut rec = self.limit_record(pod, &e, t0);
            self.act(pod, &mut rec).await;
            records.push(rec);
        }
        records
    }

    fn limit_record(&self, pod: &PodRecord, e: &LimitEviction, t0: Instant) -> EvictionRecord {
        self.new_record(pod, EvictionCause::Limit(e.kind), e.grace_period_seconds, &e.message, t0)
    }

    /// A record of a decision just taken, before the act step fills in what happened.
    fn new_record(
        &self,
        pod: &PodRecord,
        signal: EvictionCause,
        grace_period_seconds: i64,
        message: &str,
        t0: Instant,
    ) -> EvictionRecord {
        EvictionRecord {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            signal,
            available: 0,
            threshold: 0,
            grace_period_seconds,
            message: message.to_owned(),
            annotations: Default::default(),
            dry_run: self.dry_run,
            error: None,
            decide_us: t0.elapsed().as_micros() as u64,
            phases: None,
            wake_cause: None,
            wake_kernel_ts_ns: None,
            wake_received_ns: None,
            observed_ns: 0,
            decided_ns: monotonic_ns(),
            released_ns: None,
        }
    }

    /// Whether the decision's most urgent signal is a disk signal.
    fn drives_on_disk(&self, d: &engine::Decision) -> bool {
        d.actionable.first().is_some_and(|&i| self.thresholds[i].signal.resource().is_disk())
    }

    /// True while space released by reclaim or a disk eviction may still be on its way: a
    /// decision driven by disk waits (memory and PIDs never do).
    fn disk_settling(&mut self, d: &engine::Decision) -> bool {
        let Some(settle) = &self.disk_settle else { return false };
        if !self.drives_on_disk(d) {
            return false;
        }
        if settle.since.elapsed() < DISK_SETTLE {
            return true;
        }
        tracing::info!(
            after = settle.after,
            "disk pressure remains {DISK_SETTLE:?} after reclaim or an eviction"
        );
        self.disk_settle = None;
        false
    }

    /// No threshold met any more: if space was on its way back, say that it came.
    fn disk_settled(&mut self) {
        if let Some(settle) = self.disk_settle.take() {
            tracing::info!(
                after = settle.after,
                released_ms = settle.since.elapsed().as_millis() as u64,
                "disk pressure resolved: the runtime released the space (no further pod evicted)"
            );
        }
    }

    fn input<'a>(&'a self, obs: &'a Observations, pods: &'a [PodEntry<'a>], now: i64) -> engine::Input<'a> {
        engine::Input {
            thresholds: &self.thresholds,
            policy: &self.policy,
            layout: self.layout,
            observations: obs,
            pods,
            now_ns: now,
            check_storage_limits: false,
        }
    }

    /// The kubelet's `reclaimNodeLevelResources`: for disk pressure, dead containers and
    /// unused images go first; true when no threshold is met any more afterwards.
    async fn node_level_reclaim_resolves(
        &mut self,
        d: &engine::Decision,
        pods: &[PodRecord],
        now: i64,
    ) -> bool {
        let Some(client) = self.client.as_ref().filter(|_| !d.node_reclaim.is_empty() && !self.dry_run)
        else {
            return false;
        };
        let sandbox_images = pods.iter().filter_map(|p| p.sandbox_image.clone()).collect();
        let report = reclaim::reclaim(client, &d.node_reclaim, &sandbox_images).await;
        tracing::info!(
            containers_removed = report.containers_removed,
            images_removed = report.images_removed,
            errors = ?report.errors,
            "node-level reclaim for {:?}",
            d.actionable.first().map(|&i| self.thresholds[i].signal)
        );
        if !engine::any_met(&self.thresholds, &self.observe(now), true) {
            tracing::info!("node-level reclaim resolved the pressure: no pod evicted");
            return true;
        }
        if report.containers_removed + report.images_removed > 0 {
            // Removed, but not yet released (see DISK_SETTLE): no eviction until it had time.
            self.disk_settle = Some(DiskSettle::after("node-level reclaim"));
            return true;
        }
        false
    }

    /// The pods that can be ranked, with their usage read from their cgroups. A pod whose
    /// cgroup is gone is terminating, not a candidate; one evicted already is skipped until
    /// the inventory stops listing it; one whose usage cannot be read is left out and
    /// logged: ranked "without stats" it would go first, on data evictd could not read.
    /// The reads (cgroup files, and for a disk signal log and volume directories walked)
    /// run on the blocking pool: the daemon's one thread keeps serving wakes meanwhile.
    async fn candidates<'a>(
        &mut self,
        pods: &'a Arc<Vec<PodRecord>>,
        disk: bool,
    ) -> Vec<(&'a PodRecord, PodStats)> {
        let (all, gone, cgroups) = (pods.clone(), self.gone.clone(), self.cgroups.clone());
        let disk = disk.then(|| usage::DiskSources { kubelet_root: self.signals.nodefs.clone() });
        let read =
            tokio::task::spawn_blocking(move || read_usage(&all, &gone, &cgroups, disk.as_ref())).await;
        let usage = match read {
            Ok(usage) => usage,
            Err(e) => {
                self.warn_limited(format!("reading the pods' usage failed: {e}; no pod is ranked"));
                return Vec::new();
            }
        };
        let mut out = Vec::with_capacity(usage.len());
        for (i, stats) in usage {
            let p = &pods[i];
            match stats {
                Ok(stats) => out.push((p, stats)),
                Err(e) => self.warn_limited(format!(
                    "pod {}/{} left out of ranking: its usage cannot be read: {e}",
                    p.namespace, p.name
                )),
            }
        }
        out
    }

    /// Evicts the top-ranked pod; when its kill fails, the next candidate, as the kubelet
    /// does (at most `MAX_CANDIDATES`). Every failed kill is recorded, and the engine's state
    /// is kept whichever way the decision ends.
    async fn evict_one(
        &mut self,
        candidates: &[(&PodRecord, PodStats)],
        obs: &Observations,
        now: i64,
        t0: Instant,
    ) -> Vec<EvictionRecord> {
        let mut records = Vec::new();
        let mut failed: BTreeSet<usize> = BTreeSet::new();
        let mut final_state = None;
        for _ in 0..MAX_CANDIDATES {
            let entries: Vec<PodEntry> = candidates
                .iter()
                .enumerate()
                .map(|(i, (p, s))| PodEntry {
                    pod: &p.spec,
                    stats: Some(s),
                    protected: failed.contains(&i) || self.protects(p),
                })
                .collect();
            // Every try decides from the state before the decision: a state taken after a failed
            // try would find the same stats "not newer" and decide nothing.
            let (state, d) = engine::decide(&self.input(obs, &entries, now), &self.state);
            final_state = Some(state);
            let Some(e) = d.eviction else {
                self.warn_no_eviction(&d, failed.len());
                break;
            };
            let pod = candidates[e.pod].0;
            let mut rec = self.record(pod, &e, obs, t0);
            let done = self.act(pod, &mut rec).await;
            records.push(rec);
            if done {
                break;
            }
            // Only for this decision: the pod is still there, and the next pass may well
            // succeed where this one failed.
            failed.insert(e.pod);
        }
        if let Some(state) = final_state {
            self.state = state;
        }
        records
    }

    /// Pods evictd never evicts, beyond the kubelet's critical pods: itself, and — unless
    /// `--evict-inferred-kube-system` — a `kube-system` pod whose spec it could only infer
    /// (its priority is unknown: it may well be a node's DNS, proxy or network agent).
    fn protects(&self, p: &PodRecord) -> bool {
        let own = self.own_pod_uid.as_deref() == Some(p.uid.as_str());
        own || (p.spec_inferred() && p.namespace == "kube-system" && !self.evict_inferred_kube_system)
    }

    /// `failed` candidates were tried in this decision and are protected from here on, so
    /// the engine's reason alone ("critical, protected, or opted out") would hide that they failed.
    fn warn_no_eviction(&mut self, d: &engine::Decision, failed: usize) {
        if let Some(why) = &d.no_eviction_reason {
            let signal = d.actionable.first().map(|&i| self.thresholds[i].signal);
            let why = match failed {
                0 => why.to_string(),
                n => format!("the eviction of {n} candidate(s) failed and no other pod can be evicted"),
            };
            self.warn_limited(format!("pressure on {signal:?} but no eviction: {why}"));
        }
    }

    fn record(
        &self,
        pod: &PodRecord,
        e: &engine::Eviction,
        obs: &Observations,
        t0: Instant,
    ) -> EvictionRecord {
        let o = obs.get(&e.signal).copied();
        EvictionRecord {
            available: o.map_or(0, |o| o.available),
            threshold: o.map_or(0, |o| self.thresholds[e.threshold].value.resolve(o.capacity)),
            annotations: e.annotations.clone(),
            ..self.new_record(pod, EvictionCause::Signal(e.signal), self.grace_seconds(e), &e.message, t0)
        }
    }

    /// Stops the pod (or, in a dry run, says it would). True when this decision is done:
    /// evicted, dry run, or nothing to evict with; false when the kill failed and the next
    /// candidate may be tried.
    async fn act(&mut self, pod: &PodRecord, rec: &mut EvictionRecord) -> bool {
        let who = format!("{}/{}", rec.namespace, rec.name);
        if self.dry_run {
            // Every wake repeats the same decision while the pressure lasts.
            if !self.repeated(&format!("would evict {who}")) {
                tracing::info!(
                    pod = %who, signal = %rec.signal, available = rec.available, threshold = rec.threshold,
                    grace = rec.grace_period_seconds, "dry run: would evict: {}", rec.message
                );
            }
            return true;
        }
        let Some(client) = &self.client else {
            rec.error = Some("no CRI endpoint".into());
            return true;
        };
        let plan = self.stop_plan(pod, rec.grace_period_seconds);
        match evict::stop(client, pod, &plan, Some(self.escalate.clone())).await {
            Ok(mut phases) => {
                // Recorded the moment the pod is stopped: until the API server has the
                // status, the kubelet may restart it.
                if let Some(api) = &self.api {
                    api.pod_evicted(rec, monotonic_ns());
                }
                evict::wait_released(pod, &plan, &mut phases).await;
                rec.released_ns = phases.memory_released_ms.map(|_| monotonic_ns());
                self.gone.insert(pod.sandbox_id.clone());
                tracing::info!(
                    pod = %who, signal = %rec.signal, available = rec.available, threshold = rec.threshold,
                    grace = rec.grace_period_seconds, decide_us = rec.decide_us,
                    stop_containers_ms = phases.stop_containers_ms,
                    stop_sandbox_ms = phases.stop_sandbox_ms,
                    memory_released_ms = ?phases.memory_released_ms,
                    "evicted: {}", rec.message
                );
                rec.phases = Some(phases);
                true
            }
            // The runtime is down or went away: the next candidate would fail the same way,
            // or worse, be stopped once it is back while this pod's stop is still under way.
            // The next pass tries again.
            Err(err) if err.runtime_unavailable() => {
                self.warn_limited(format!("eviction failed, the runtime is unavailable: {err}"));
                rec.error = Some(err.to_string());
                true
            }
            Err(err) => {
                tracing::warn!("eviction failed, trying the next candidate: {err}");
                rec.error = Some(err.to_string());
                false
            }
        }
    }

    /// The same warning at most every `WARN_EVERY`: wakes come many times a second.
    fn warn_limited(&mut self, msg: String) {
        if !self.repeated(&msg) {
            tracing::warn!("{msg}");
        }
    }

    /// Whether `msg` was the last message said, less than `WARN_EVERY` ago; records it if not.
    fn repeated(&mut self, msg: &str) -> bool {
        let repeat = self.last_warning.as_ref().is_some_and(|(m, t)| m == msg && t.elapsed() < WARN_EVERY);
        if !repeat {
            self.last_warning = Some((msg.to_owned(), Instant::now()));
        }
        repeat
    }

    /// The grace period a decision stops its pod with: the engine's, except that a hard
    /// eviction's is `--hard-eviction-grace-period` (the kubelet's 1 s by default).
    fn grace_seconds(&self, e: &engine::Eviction) -> i64 {
        if self.thresholds[e.threshold].is_hard() {
            self.kill.hard_grace_seconds
        } else {
            e.grace_period_seconds
        }
    }

    fn stop_plan(&self, pod: &PodRecord, grace_seconds: i64) -> StopPlan {
        let fast = self.kill.fast_kill.then(|| KillTarget::of(pod, &self.cgroups).ok()).flatten();
        StopPlan {
            grace_seconds,
            hard_grace_seconds: self.kill.hard_grace_seconds,
            fast,
            cgroup: self.cgroups_of(pod).map(|c| c.memory.dir),
            release_timeout: self.release_timeout,
        }
    }

    fn cgroups_of(&self, p: &PodRecord) -> Option<usage::PodCgroups> {
        usage::pod_cgroups(p, &self.cgroups)
    }
}

/// Each live pod's usage (by index into `pods`): pods evicted already (`gone`) and pods
/// whose cgroup is gone (terminating) are not listed.
fn read_usage(
    pods: &[PodRecord],
    gone: &BTreeSet<String>,
    cgroups: &CgroupMounts,
    disk: Option<&usage::DiskSources>,
) -> Vec<(usize, Result<PodStats, usage::UsageError>)> {
    pods.iter()
        .enumerate()
        .filter(|(_, p)| !gone.contains(&p.sandbox_id))
        .filter_map(|(i, p)| {
            let cg = usage::pod_cgroups(p, cgroups);
            if cg.as_ref().is_some_and(|c| !c.memory.dir.exists()) {
                return None;
            }
            Some((i, usage::pod_stats(p, cg.as_ref(), cgroups, disk)))
        })
        .collect()
}

#[cfg(test)]
mod tests;
