//! The decision engine: one pure function of (thresholds, observations, pods, now, previous
//! state) → (new state, decision). No I/O, no clock: the daemon, `simulate` and `replay` all
//! call this same code, so what the offline commands show is what the daemon does.
//!
//! It follows the kubelet's `synchronize` step by step (semantic reference §4): thresholds
//! met, min-reclaim hysteresis, first-observed tracking and grace periods, node conditions
//! with the transition period, the stale-stats rule, signal priority, node-level reclaim,
//! ranking, critical pods, one eviction per decision, the victim's grace period and the
//! kubelet's eviction message.

use std::collections::BTreeMap;

use crate::{
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
}

/// The kubelet's `immediateEvictionGracePeriodSeconds` for hard thresholds.
const HARD_EVICTION_GRACE_SECONDS: i64 = 1;
/// What the API server defaults `terminationGracePeriodSeconds` to.
const DEFAULT_TERMINATION_GRACE_SECONDS: i64 = 30;

/// The thresholds the engine works with on a given disk layout: user containerfs thresholds
/// are replaced by copies of the nodefs thresholds (single filesystem) or of the imagefs ones
/// (dedicated imagefs), as the kubelet's `UpdateContainerFsThresholds` does.
pub fn thresholds_for_layout(policy: &Policy, layout: FsLayout) -> Vec<Threshold> {
    let is_containerfs =
        |s: Signal| matches!(s, Signal::ContainerFsAvailable | Signal::ContainerFsInodesFree);
    let mut out: Vec<Threshold> =
        policy.thresholds.iter().filter(|t| !is_containerfs(t.signal)).copied().collect();
    let (bytes, inodes) = match layout {
        FsLayout::SingleFs => (Signal::NodeFsAvailable, Signal::NodeFsInodesFree),
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

pub fn decide(input: &Input, prev: &EngineState) -> (EngineState, Decision) {
    let Input { thresholds, policy, layout, observations: obs, pods, now_ns: now } = *input;
    let mut decision = Decision::default();
    if thresholds.is_empty() {
        decision.no_eviction_reason = Some("no thresholds are configured".into());
        return (prev.clone(), decision);
    }

    // Met now, plus those still within their min-reclaim band since the last decision.
    let mut met: Vec<usize> = (0..thresholds.len()).filter(|&i| is_met(&thresholds[i], obs, false)).collect();
    for &i in &prev.thresholds_met {
        if i < thresholds.len() && !met.contains(&i) && is_met(&thresholds[i], obs, true) {
            met.push(i);
        }
    }
    met.sort_unstable();

    let first_observed_ns: BTreeMap<usize, i64> =
        met.iter().map(|&i| (i, prev.first_observed_ns.get(&i).copied().unwrap_or(now))).collect();

    // A soft threshold raises its condition at once, before its grace period.
    let mut condition_last_observed_ns = prev.condition_last_observed_ns.clone();
    for &i in &met {
        condition_last_observed_ns.insert(thresholds[i].signal.condition(), now);
    }
    decision.node_conditions = condition_last_observed_ns
        .iter()
        .filter(|&(_, &t)| now - t < policy.pressure_transition_period_ns)
        .map(|(&c, _)| c)
        .collect();

    let grace_satisfied: Vec<usize> = met
        .iter()
        .copied()
        .filter(|i| now - first_observed_ns[i] >= thresholds[*i].grace_period_ns)
        .collect();

    // Stale stats: act only on an observation newer than the one the last decision saw.
    let mut actionable: Vec<usize> = grace_satisfied
        .iter()
        .copied()
        .filter(|&i| {
            let signal = thresholds[i].signal;
            let Some(o) = obs.get(&signal) else { return false };
            match (prev.last_observations.get(&signal), o.time_ns) {
                (None, _) | (_, None) => true,
                (Some(last), Some(t)) => last.time_ns.is_none_or(|lt| t > lt),
            }
        })
        .collect();
    // Deterministic where the kubelet is not: memory.available, then allocatable memory, then
    // the rest in configuration order; for one signal the hard threshold before the soft.
    actionable.sort_by_key(|&i| {
        let t = &thresholds[i];
        let class = match t.signal {
            Signal::MemoryAvailable => 0,
            Signal::AllocatableMemoryAvailable => 1,
            _ => 2,
        };
        (class, !t.is_hard(), i)
    });

    let state = EngineState {
        thresholds_met: grace_satisfied,
        first_observed_ns,
        condition_last_observed_ns,
        last_observations: obs.clone(),
    };
    decision.thresholds_met = met.clone();
    decision.actionable = actionable.clone();

    // Ranking is shown for the driving signal, or for the most urgent met one.
    let driving = actionable.first().or_else(|| met.first()).copied();
    if let Some(i) = driving {
        decision.ranking = rank::rank(pods, thresholds[i].signal, layout);
    }
    let Some(&chosen) = actionable.first() else {
        decision.no_eviction_reason = Some(if met.is_empty() {
            "no threshold is met".into()
        } else if state.thresholds_met.is_empty() {
            "thresholds are met but still within their grace period".into()
        } else {
            "the stats are not newer than at the last decision".into()
        });
        return (state, decision);
    };
    let threshold = &thresholds[chosen];
    decision.node_reclaim = rank::node_reclaim_for(threshold.signal, layout).to_vec();
    if !decision.node_reclaim.is_empty() && !any_met(thresholds, obs, true) {
        decision.no_eviction_reason = Some("node-level reclaim resolves the pressure".into());
        return (state, decision);
    }
    if pods.is_empty() {
        decision.no_eviction_reason = Some("there are no pods to evict".into());
        return (state, decision);
    }
    let victim = decision.ranking.iter().copied().find(|&p| !pods[p].pod.is_critical() && !pods[p].protected);
    let Some(victim) = victim else {
        decision.no_eviction_reason = Some("every candidate pod is critical or protected".into());
        return (state, decision);
    };
    let pod = pods[victim].pod;
    decision.eviction = Some(Eviction {
        pod: victim,
        threshold: chosen,
        signal: threshold.signal,
        grace_period_seconds: victim_grace_seconds(
            threshold.is_hard(),
            policy.max_pod_grace_period_seconds,
            pod.spec.termination_grace_period_seconds,
        ),
        message: eviction_message(threshold.signal.resource(), &pods[victim], thresholds, &actionable, obs),
    });
    (state, decision)
}

/// The kubelet's `evictionMessage`, to the letter.
pub fn eviction_message(
    resource: Resource,
    entry: &PodEntry,
    thresholds: &[Threshold],
    actionable: &[usize],
    obs: &Observations,
) -> String {
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
    let Some(stats) = entry.stats else { return msg };
    let resource_name = resource.as_str();
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
        }
    }
    msg
}

#[cfg(test)]
mod tests;
