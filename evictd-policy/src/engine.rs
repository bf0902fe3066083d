//! The decision engine: one pure function of (thresholds, observations, pods, now, previous
//! state) → (new state, decision). No I/O, no clock: the daemon, `simulate` and `replay` all
//! call this same code, so what the offline commands show is what the daemon does.
//!
//! `decide` follows the kubelet's `synchronize` (pkg/kubelet/eviction/eviction_manager.go,
//! with helpers.go) step by step, each step a function named for the kubelet's: thresholds
//! met, min-reclaim hysteresis, first-observed tracking and grace periods, node conditions
//! with the transition period, the stale-stats rule, signal priority, node-level reclaim,
//! ranking, critical pods, one eviction per decision, the victim's grace period and the
//! kubelet's eviction message.

use std::collections::BTreeMap;

use crate::{
    local_storage::{self, LimitEviction},
    observations::Observations,
    policy::{NodeCondition, Policy, Resource, Signal, Threshold},
    quantity::Quantity,
    rank::{self, FsLayout, NodeReclaim, PodEntry},
};

/// What the engine remembers between decisions. Thresholds are named by their index in
/// the threshold list, which stays the same for the life of a policy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineState {
    /// Thresholds that were actionable at the last decision (for min-reclaim hysteresis).
    pub thresholds_met: Vec<usize>,
    /// When each currently met threshold was first seen met.
    pub first_observed_ns: BTreeMap<usize, i64>,
    /// When each node condition was last observed.
    pub condition_last_observed_ns: BTreeMap<NodeCondition, i64>,
    pub last_observations: Observations,
}

/// The pod to evict and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Eviction {
    /// Index into the pods given to `decide`.
    pub pod: usize,
    /// Index of the threshold that drives it.
    pub threshold: usize,
    pub signal: Signal,
    pub grace_period_seconds: i64,
    pub message: String,
    /// The kubelet's annotations of the pod's `Evicted` event (`offending_containers`,
    /// `offending_containers_usage`, `starved_resource`); empty when the pod has no stats.
    pub annotations: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// Thresholds met now (with hysteresis), grace periods not considered.
    pub thresholds_met: Vec<usize>,
    pub node_conditions: Vec<NodeCondition>,
    /// Met past their grace period, on fresh stats, most urgent first.
    pub actionable: Vec<usize>,
    /// Node-level reclaim to run before evicting (disk signals). The engine assumes it frees
    /// nothing; the daemon runs it and re-checks with `any_met(.., true)`.
    pub node_reclaim: Vec<NodeReclaim>,
    /// Pod indices in eviction order for the driving signal (critical pods included).
    pub ranking: Vec<usize>,
    pub eviction: Option<Eviction>,
    /// Pods over their own ephemeral-storage limits (`local_storage`): all of them are
    /// evicted, before and instead of any threshold eviction.
    pub limit_evictions: Vec<LimitEviction>,
    /// Why there is no eviction, when there is none.
    pub no_eviction_reason: Option<String>,
}

/// What the engine decides on.
pub struct Input<'a> {
    pub thresholds: &'a [Threshold],
    pub policy: &'a Policy,
    pub layout: FsLayout,
    pub observations: &'a Observations,
    pub pods: &'a [PodEntry<'a>],
    pub now_ns: i64,
    /// Whether this decision also looks for pods over their own ephemeral-storage limits
    /// (with the policy's `local_storage_capacity_isolation`): `simulate` and `replay` do,
    /// on the Summary's stats; the daemon's pressure decisions do not, since their stats are
    /// read for one signal, and it checks the limits on its own cadence.
    pub check_storage_limits: bool,
}

/// The kubelet's `immediateEvictionGracePeriodSeconds` for hard thresholds.
pub const HARD_EVICTION_GRACE_SECONDS: i64 = 1;
/// What the API server defaults `terminationGracePeriodSeconds` to.
const DEFAULT_TERMINATION_GRACE_SECONDS: i64 = 30;

/// The thresholds the engine works with on a given disk layout: user containerfs thresholds
/// are replaced by copies of the nodefs thresholds (single filesystem, or a split containerfs,
/// which lives on nodefs) or of the imagefs ones (dedicated imagefs holding the writable
/// layers), as the kubelet's `UpdateContainerFsThresholds` does.
pub fn thresholds_for_layout(policy: &Policy, layout: FsLayout) -> Vec<Threshold> {
    let is_containerfs =
        |s: Signal| matches!(s, Signal::ContainerFsAvailable | Signal::ContainerFsInodesFree);
    let mut out: Vec<Threshold> =
        policy.thresholds.iter().filter(|t| !is_containerfs(t.signal)).copied().collect();
    let (bytes, inodes) = match layout {
        FsLayout::SingleFs | FsLayout::SplitContainerFs => {
            (Signal::NodeFsAvailable, Signal::NodeFsInodesFree)
        }
        FsLayout::DedicatedImageFs => (Signal::ImageFsAvailable, Signal::ImageFsInodesFree),
    };
    let copies: Vec<Threshold> = policy
        .thresholds
        .iter()
        .filter_map(|t| match t.signal {
            s if s == bytes => Some(Threshold { signal: Signal::ContainerFsAvailable, ..*t }),
            s if s == inodes => Some(Threshold { signal: Signal::ContainerFsInodesFree, ..*t }),
            _ => None,
        })
        .collect();
    out.extend(copies);
    out
}

/// The engine's state for `new` thresholds, from the state kept for `old` ones (a policy
/// re-read on SIGHUP; the kubelet has no equivalent, it restarts). A threshold of the same
/// signal and kind (hard or soft) is the same threshold, whatever its new value: a soft
/// grace period that was running keeps running, and a met threshold keeps its min-reclaim
/// hysteresis. One that is gone takes its state with it; a new one starts afresh. The node
/// conditions' times and the last observations stay.
pub fn carry_over(state: &EngineState, old: &[Threshold], new: &[Threshold]) -> EngineState {
    let same = |o: &Threshold, n: &Threshold| o.signal == n.signal && o.is_hard() == n.is_hard();
    let new_index = |i: usize| old.get(i).and_then(|o| new.iter().position(|n| same(o, n)));
    let mut thresholds_met: Vec<usize> = state.thresholds_met.iter().filter_map(|&i| new_index(i)).collect();
    thresholds_met.sort_unstable();
    thresholds_met.dedup();
    EngineState {
        thresholds_met,
        first_observed_ns: state
            .first_observed_ns
            .iter()
            .filter_map(|(&i, &t)| Some((new_index(i)?, t)))
            .collect(),
        condition_last_observed_ns: state.condition_last_observed_ns.clone(),
        last_observations: state.last_observations.clone(),
    }
}

/// Whether any threshold is met: after node-level reclaim the kubelet checks this with
/// min-reclaim enforced, and evicts only if something still is.
pub fn any_met(thresholds: &[Threshold], obs: &Observations, enforce_min_reclaim: bool) -> bool {
    thresholds.iter().any(|t| is_met(t, obs, enforce_min_reclaim))
}

fn is_met(t: &Threshold, obs: &Observations, enforce_min_reclaim: bool) -> bool {
    obs.get(&t.signal).is_some_and(|o| t.is_met(o.available, o.capacity, enforce_min_reclaim))
}

/// The kubelet's grace period for the victim, after the pod workers' adjustment: hard
/// thresholds give 1 s; soft ones min(max-pod-grace, the pod's own), where 0 falls back to the
/// pod's own and anything below 1 becomes 1.
pub fn victim_grace_seconds(hard: bool, max_pod_grace_period_seconds: i64, pod_grace: Option<i64>) -> i64 {
    if hard {
        return HARD_EVICTION_GRACE_SECONDS;
    }
    let pod_grace_or_default = pod_grace.unwrap_or(DEFAULT_TERMINATION_GRACE_SECONDS);
    let mut g = max_pod_grace_period_seconds;
    if let Some(p) = pod_grace {
        g = g.min(p);
    }
    if g == 0 {
        g = pod_grace_or_default;
    }
    g.max(1)
}

/// The kubelet's `synchronize`, one decision: each step below is named for the kubelet
/// helper it reproduces.
pub fn decide(input: &Input, prev: &EngineState) -> (EngineState, Decision) {
    let Input { thresholds, policy, observations: obs, now_ns: now, .. } = *input;
    if thresholds.is_empty() && !policy.local_storage_capacity_isolation {
        return (prev.clone(), Decision::none("no thresholds are configured"));
    }
    let met = merge_thresholds(
        thresholds_met(thresholds, obs, false),
        thresholds_not_yet_resolved(&prev.thresholds_met, thresholds, obs),
    );
    let first_observed_ns = thresholds_first_observed_at(&met, &prev.first_observed_ns, now);
    let condition_last_observed_ns =
        node_conditions_last_observed_at(&met, thresholds, &prev.condition_last_observed_ns, now);
    let grace_satisfied = thresholds_met_grace_period(&met, thresholds, &first_observed_ns, now);
    let mut actionable = thresholds_updated_stats(&grace_satisfied, thresholds, obs, &prev.last_observations);
    sort_by_eviction_priority(&mut actionable, thresholds);

    let decision = Decision {
        thresholds_met: met.clone(),
        node_conditions: node_conditions_observed_since(
            &condition_last_observed_ns,
            policy.pressure_transition_period_ns,
            now,
        ),
        actionable,
        ..Decision::default()
    };
    let state = EngineState {
        thresholds_met: grace_satisfied,
        first_observed_ns,
        condition_last_observed_ns,
        last_observations: obs.clone(),
    };
    if input.check_storage_limits {
        let limit_evictions = local_storage_eviction(policy, input.pods, input.layout);
        if !limit_evictions.is_empty() {
            let reason = Some("pods over their own ephemeral-storage limits are evicted first".into());
            return (state, Decision { limit_evictions, no_eviction_reason: reason, ..decision });
        }
    }
    let decision = evict_for_reclaimable_threshold(input, decision, &state);
    (state, decision)
}

/// The kubelet's `localStorageEviction`: with `LocalStorageCapacityIsolation` on, every pod
/// over one of its own ephemeral-storage limits, evicted before and instead of any threshold
/// eviction. The one place this step is decided: `decide` takes it for `simulate` and
/// `replay`; the daemon calls it on its own cadence, with stats read for it.
pub fn local_storage_eviction(policy: &Policy, pods: &[PodEntry], layout: FsLayout) -> Vec<LimitEviction> {
    if !policy.local_storage_capacity_isolation {
        return Vec::new();
    }
    local_storage::limit_evictions(pods, layout)
}

impl Decision {
    fn none(reason: &str) -> Self {
        Decision { no_eviction_reason: Some(reason.into()), ..Decision::default() }
    }
}

/// `thresholdsMet`: the thresholds whose signal is observed below them (with their minimum
/// reclaim added when `enforce_min_reclaim`), by index.
fn thresholds_met(thresholds: &[Threshold], obs: &Observations, enforce_min_reclaim: bool) -> Vec<usize> {
    (0..thresholds.len()).filter(|&i| is_met(&thresholds[i], obs, enforce_min_reclaim)).collect()
}

/// Min-reclaim hysteresis: of the thresholds acted on last time, those not yet back above
/// threshold + minimum reclaim.
fn thresholds_not_yet_resolved(
    previous: &[usize],
    thresholds: &[Threshold],
    obs: &Observations,
) -> Vec<usize> {
    previous.iter().copied().filter(|&i| i < thresholds.len() && is_met(&thresholds[i], obs, true)).collect()
}

/// `mergeThresholds`: the union, in threshold order.
fn merge_thresholds(mut a: Vec<usize>, b: Vec<usize>) -> Vec<usize> {
    a.extend(b);
    a.sort_unstable();
    a.dedup();
    a
}

/// `thresholdsFirstObservedAt`: when each met threshold was first seen met (now, if new).
fn thresholds_first_observed_at(
    met: &[usize],
    prev: &BTreeMap<usize, i64>,
    now: i64,
) -> BTreeMap<usize, i64> {
    met.iter().map(|&i| (i, prev.get(&i).copied().unwrap_or(now))).collect()
}

/// `nodeConditionsLastObservedAt`: a met threshold (soft ones too, before their grace
/// period) marks its condition as observed now; the others keep their last time.
fn node_conditions_last_observed_at(
    met: &[usize],
    thresholds: &[Threshold],
    prev: &BTreeMap<NodeCondition, i64>,
    now: i64,
) -> BTreeMap<NodeCondition, i64> {
    let mut out = prev.clone();
    for &i in met {
        out.insert(thresholds[i].signal.condition(), now);
    }
    out
}

/// `nodeConditionsObservedSince`: conditions observed within the transition period.
fn node_conditions_observed_since(
    last_observed: &BTreeMap<NodeCondition, i64>,
    transition_period_ns: i64,
    now: i64,
) -> Vec<NodeCondition> {
    last_observed.iter().filter(|&(_, &t)| now - t < transition_period_ns).map(|(&c, _)| c).collect()
}

/// `thresholdsMetGracePeriod`: met for at least their grace period (hard ones at once).
fn thresholds_met_grace_period(
    met: &[usize],
    thresholds: &[Threshold],
    first_observed_ns: &BTreeMap<usize, i64>,
    now: i64,
) -> Vec<usize> {
    met.iter()
        .copied()
        .filter(|i| first_observed_ns.get(i).is_some_and(|&t| now - t >= thresholds[*i].grace_period_ns))
        .collect()
}

/// `thresholdsUpdatedStats`: act only on an observation newer than the one the last
/// decision saw (a missing time counts as always new).
fn thresholds_updated_stats(
    candidates: &[usize],
    thresholds: &[Threshold],
    obs: &Observations,
    last: &Observations,
) -> Vec<usize> {
    candidates
        .iter()
        .copied()
        .filter(|&i| {
            let signal = thresholds[i].signal;
            let Some(o) = obs.get(&signal) else { return false };
            match (last.get(&signal), o.time_ns) {
                (None, _) | (_, None) => true,
                (Some(last), Some(t)) => last.time_ns.is_none_or(|lt| t > lt),
            }
        })
        .collect()
}

/// `byEvictionPriority`, made deterministic where the kubelet is not: memory.available,
/// then allocatable memory, then the rest in configuration order; for one signal the hard
/// threshold before the soft.
fn sort_by_eviction_priority(actionable: &mut [usize], thresholds: &[Threshold]) {
    actionable.sort_by_key(|&i| {
        let t = &thresholds[i];
        let class = match t.signal {
            Signal::MemoryAvailable => 0,
            Signal::AllocatableMemoryAvailable => 1,
            _ => 2,
        };
        (class, !t.is_hard(), i)
    });
}

/// `getReclaimableThreshold`, `reclaimNodeLevelResources` and the eviction loop: the most
/// urgent actionable threshold; node-level reclaim first for disk signals; then the first
/// ranked pod that is neither critical nor protected, with its grace period and message.
fn evict_for_reclaimable_threshold(input: &Input, mut decision: Decision, state: &EngineState) -> Decision {
    let Input { thresholds, policy, layout, observations: obs, pods, .. } = *input;
    // Ranking is shown for the driving signal, or for the most urgent met one.
    let driving = decision.actionable.first().or_else(|| decision.thresholds_met.first()).copied();
    if let Some(i) = driving {
        decision.ranking = rank::rank(pods, thresholds[i].signal, layout);
    }
    let Some(&chosen) = decision.actionable.first() else {
        decision.no_eviction_reason = Some(
            if decision.thresholds_met.is_empty() {
                "no threshold is met"
            } else if state.thresholds_met.is_empty() {
                "thresholds are met but still within their grace period"
            } else {
                "the stats are not newer than at the last decision"
            }
            .into(),
        );
        return decision;
    };
    let threshold = &thresholds[chosen];
    decision.node_reclaim = rank::node_reclaim_for(threshold.signal, layout).to_vec();
    let reason = if !decision.node_reclaim.is_empty() && !any_met(thresholds, obs, true) {
        "node-level reclaim resolves the pressure"
    } else if pods.is_empty() {
        "there are no pods to evict"
    } else {
        match first_evictable(&decision.ranking, pods) {
            Some(victim) => {
                let (message, annotations) = eviction_message(
                    threshold.signal.resource(),
                    &pods[victim],
                    thresholds,
                    &decision.actionable,
                    obs,
                );
                decision.eviction = Some(Eviction {
                    pod: victim,
                    threshold: chosen,
                    signal: threshold.signal,
                    grace_period_seconds: victim_grace_seconds(
                        threshold.is_hard(),
                        policy.max_pod_grace_period_seconds,
                        pods[victim].pod.spec.termination_grace_period_seconds,
                    ),
                    message,
                    annotations,
                });
                return decision;
            }
            None => "every candidate pod is critical, protected, or opted out",
        }
    };
    decision.no_eviction_reason = Some(reason.into());
    decision
}

/// The ranking's first pod that may be evicted (`rank::evictable`).
fn first_evictable(ranking: &[usize], pods: &[PodEntry]) -> Option<usize> {
    ranking.iter().copied().find(|&p| rank::evictable(&pods[p]))
}

/// The kubelet's `evictionMessage`, to the letter: the message, and the annotations of the
/// pod's event (the containers using more than their request, their usage, the resource).
pub fn eviction_message(
    resource: Resource,
    entry: &PodEntry,
    thresholds: &[Threshold],
    actionable: &[usize],
    obs: &Observations,
) -> (String, BTreeMap<String, String>) {
    let mut msg = format!("The node was low on resource: {}. ", resource.as_str());
    let met_info =
        actionable.iter().map(|&i| &thresholds[i]).find(|t| t.signal.resource() == resource).and_then(|t| {
            let o = obs.get(&t.signal)?;
            let available = match resource {
                Resource::Inodes | Resource::Pids => Quantity::from_units_decimal(o.available),
                _ => Quantity::from_units(o.available),
            };
            Some((t.value.quantity(o.capacity), available))
        });
    if let Some((q, a)) = met_info {
        msg += &format!("Threshold quantity: {q}, available: {a}. ");
    }
    let Some(stats) = entry.stats else { return (msg, BTreeMap::new()) };
    let resource_name = resource.as_str();
    let (mut offending, mut offending_usage) = (Vec::new(), Vec::new());
    for c in &stats.containers {
        let usage = match resource {
            Resource::Memory => {
                c.memory.as_ref().and_then(|m| m.working_set_bytes).map(|b| Quantity::from_units(b as i64))
            }
            Resource::EphemeralStorage => match (
                c.rootfs.as_ref().and_then(|f| f.used_bytes),
                c.logs.as_ref().and_then(|f| f.used_bytes),
            ) {
                (Some(r), Some(l)) => Some(Quantity::from_units((r + l) as i64)),
                _ => None,
            },
            Resource::Inodes | Resource::Pids => None,
        };
        let (Some(usage), Some(request)) = (usage, entry.pod.container_request(&c.name, resource_name))
        else {
            continue;
        };
        if usage > request {
            msg += &format!(
                "Container {} was using {usage}, request is {request}, has larger consumption of {resource_name}. ",
                c.name
            );
            offending.push(c.name.as_str());
            offending_usage.push(usage.to_string());
        }
    }
    let annotations = BTreeMap::from([
        ("offending_containers".to_string(), offending.join(",")),
        ("offending_containers_usage".to_string(), offending_usage.join(",")),
        ("starved_resource".to_string(), resource_name.to_string()),
    ]);
    (msg, annotations)
}

#[cfg(test)]
mod tests;
