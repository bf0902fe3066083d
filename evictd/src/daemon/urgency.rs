//! How urgent a stop under way has become, judged on every batch of wakes that comes while it
//! runs. The kubelet's semantics hold while there is time: a soft eviction's grace period,
//! cut to the hard one when a hard threshold is met meanwhile (`Hard`). When waiting would
//! let the kernel act first, the pod is killed now (`Emergency`): memory.available (or
//! allocatableMemory.available, where a threshold watches it) below the emergency level, or
//! the kernel reclaiming or OOM-killing for the node. Only the node's pressure escalates: a
//! container reclaiming against its own limit or `memory.high`, or OOM-killed by its own
//! limit, is that container's business and never turns a soft eviction's grace period into a
//! SIGKILL.

use std::path::{Path, PathBuf};

use evictd_policy::{
    observations::Observations,
    policy::{Signal, Threshold, ThresholdValue},
};

use crate::{
    node::{
        cgroup_names::pid_in_cgroup,
        cgroups::{CgroupMounts, CgroupVersion},
    },
    vocab::{EmergencyCause, Escalation, Urgency, WakeCause},
    wake::Wake,
};

/// Below which a memory signal is an emergency (`--emergency-available`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmergencyLevel {
    /// Half of each hard memory threshold.
    HalfHard,
    /// This many bytes of memory.available, and of allocatableMemory.available where a
    /// threshold watches it: the pods' cgroup has its own limit, where the kernel's OOM
    /// killer acts as it does for the node.
    Bytes(i64),
}

/// What the kernel was seen doing in the node, from one batch of wakes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelActing {
    /// Direct reclaim: the machine's free memory is below its watermarks.
    pub direct_reclaim: bool,
    /// Reclaim against a memory cgroup's limit, or an OOM kill: the tracepoints do not say
    /// whose limit, so these count only while the node itself is past a hard memory
    /// threshold (else they are a container's own limit at work), or when the policy has no
    /// hard memory threshold to tell by (then, as before, any of them in the node counts).
    pub cgroup_reclaim_or_oom: bool,
}

/// Whether memcg reclaim and OOM kills in the node would count now (`KernelActing`): read
/// before the wakes, so that a storm of them costs no `/proc` reads when they would not.
pub fn cgroup_events_count(thresholds: &[Threshold], obs: &Observations) -> bool {
    let hard_memory = || thresholds.iter().any(|t| t.is_hard() && t.signal.is_memory());
    !hard_memory() || hard_memory_threshold_met(thresholds, obs)
}

/// What the node calls for now, from its observation and the wakes just taken: the urgency
/// and, at an emergency, its cause.
pub fn escalation_now(
    thresholds: &[Threshold],
    obs: &Observations,
    level: EmergencyLevel,
    kernel: KernelActing,
) -> Escalation {
    let emergency = emergency_now(thresholds, obs, level, kernel);
    let urgency = if emergency.is_some() {
        Urgency::Emergency
    } else if hard_threshold_met(thresholds, obs) {
        Urgency::Hard
    } else {
        Urgency::Normal
    };
    Escalation { urgency, emergency }
}

/// An emergency, and which: the kernel acting in the node, or memory below the emergency level.
fn emergency_now(
    thresholds: &[Threshold],
    obs: &Observations,
    level: EmergencyLevel,
    kernel: KernelActing,
) -> Option<EmergencyCause> {
    if kernel.direct_reclaim {
        Some(EmergencyCause::DirectReclaim)
    } else if kernel.cgroup_reclaim_or_oom && cgroup_events_count(thresholds, obs) {
        Some(EmergencyCause::CgroupReclaimOrOom)
    } else {
        below_emergency_level(thresholds, obs, level)
    }
}

/// Any hard threshold met: its grace period is the hard eviction's, whatever a soft eviction
/// under way was given.
fn hard_threshold_met(thresholds: &[Threshold], obs: &Observations) -> bool {
    thresholds
        .iter()
        .filter(|t| t.is_hard())
        .any(|t| obs.get(&t.signal).is_some_and(|o| t.is_met(o.available, o.capacity, false)))
}

/// A hard memory threshold met: the node itself is short of memory.
pub(crate) fn hard_memory_threshold_met(thresholds: &[Threshold], obs: &Observations) -> bool {
    thresholds
        .iter()
        .filter(|t| t.is_hard() && t.signal.is_memory())
        .any(|t| obs.get(&t.signal).is_some_and(|o| t.is_met(o.available, o.capacity, false)))
}

/// A memory signal below its emergency level (`EmergencyCause::Below`). Without a hard memory
/// threshold there is no level in `HalfHard` mode: the operator asked for soft evictions only.
/// A fixed level holds for memory.available always, and for allocatableMemory.available only
/// where a threshold watches it: the pods' cgroup is read wherever it has a limit, which the
/// kubelet may not enforce, and an emergency there would kill, and skip waits and holds, for
/// a signal nothing evicts on.
pub(crate) fn below_emergency_level(
    thresholds: &[Threshold],
    obs: &Observations,
    level: EmergencyLevel,
) -> Option<EmergencyCause> {
    let below = |signal: Signal, at: i64| {
        let available = obs.get(&signal)?.available;
        (available < at).then_some(EmergencyCause::Below { signal, available, level: at })
    };
    let watched = |s: Signal| s == Signal::MemoryAvailable || thresholds.iter().any(|t| t.signal == s);
    match level {
        EmergencyLevel::Bytes(b) => {
            obs.iter().map(|(&s, _)| s).filter(|&s| s.is_memory() && watched(s)).find_map(|s| below(s, b))
        }
        EmergencyLevel::HalfHard => thresholds
            .iter()
            .filter(|t| t.is_hard() && t.signal.is_memory())
            .find_map(|t| below(t.signal, t.value.resolve(obs.get(&t.signal)?.capacity) / 2)),
    }
}

/// The memory thresholds the emergency level reaches, each with that level in bytes: whenever
/// one of them is met, memory is an emergency too, and its evictions kill and skip the waits
/// (for the last evicted pod's memory, for a newer pod list) that keep one crossing to one
/// eviction. A fixed level, or in `auto` a soft threshold at or under half of a hard one on
/// its signal. A percentage of a signal not read is left out: its level is not known yet.
pub(crate) fn thresholds_within_the_emergency_level<'a>(
    thresholds: &'a [Threshold],
    obs: &'a Observations,
    level: EmergencyLevel,
) -> impl Iterator<Item = (&'a Threshold, i64)> {
    let bytes = move |t: &Threshold| match t.value {
        ThresholdValue::Quantity(_) => Some(t.value.resolve(0)),
        ThresholdValue::Percentage(_) => Some(t.value.resolve(obs.get(&t.signal)?.capacity)),
    };
    let emergency_at = move |signal: Signal| match level {
        EmergencyLevel::Bytes(b) => Some(b),
        EmergencyLevel::HalfHard => thresholds
            .iter()
            .filter(|h| h.is_hard() && h.signal == signal)
            .filter_map(bytes)
            .max()
            .map(|b| b / 2),
    };
    thresholds.iter().filter(|t| t.signal.is_memory()).filter_map(move |t| {
        match (bytes(t), emergency_at(t.signal)) {
            (Some(v), Some(e)) if v <= e => Some((t, e)),
            _ => None,
        }
    })
}

/// An emergency level at or above a memory threshold makes an eviction on it a kill that
/// waits for nothing: not one eviction per crossing any more. Warns of each such threshold
/// (`thresholds_within_the_emergency_level`), naming the level and where it comes from.
pub fn warn_of_thresholds_within_the_emergency_level(
    thresholds: &[Threshold],
    obs: &Observations,
    level: EmergencyLevel,
) {
    let source = match level {
        EmergencyLevel::Bytes(_) => "--emergency-available",
        EmergencyLevel::HalfHard => "auto, half of a hard threshold on its signal",
    };
    for (t, bytes) in thresholds_within_the_emergency_level(thresholds, obs, level) {
        tracing::warn!(
            "the emergency level, {} ({source}), is at or above the threshold {t}: an eviction on \
             it is an emergency (a kill that waits neither for the last evicted pod's memory nor \
             for a newer pod list, and may take a pod the API has not listed), so one crossing \
             may evict several pods",
            crate::report::units::bytes(bytes)
        );
    }
}

/// Where the node's processes are, to tell the kernel's reclaim and OOM kills in the node
/// from those elsewhere on the machine (a cgroup that plays the node in tests, say).
#[derive(Clone, Debug)]
pub struct NodeScope {
    /// The node cgroup relative to the memory hierarchy's root; `None`: the whole machine.
    rel: Option<PathBuf>,
    version: CgroupVersion,
}

impl NodeScope {
    pub fn new(node_dir: &Path, cgroups: &CgroupMounts) -> Self {
        let rel = node_dir
            .strip_prefix(&cgroups.memory_root)
            .ok()
            .filter(|r| !r.as_os_str().is_empty())
            .map(|r| Path::new("/").join(r));
        NodeScope { rel, version: cgroups.memory_version }
    }

    /// What the wakes say the kernel is doing in the node: the pid is the allocating task
    /// (reclaim) or the victim (OOM kill), and must be in the node. Memcg reclaim and OOM
    /// kills are looked at only when `cgroup_events` says they would count.
    pub fn kernel_acting(&self, wakes: &[Wake], cgroup_events: bool) -> KernelActing {
        let seen = |causes: &[WakeCause]| wakes.iter().any(|w| causes.contains(&w.cause) && self.holds(w));
        KernelActing {
            direct_reclaim: seen(&[WakeCause::DirectReclaim]),
            cgroup_reclaim_or_oom: cgroup_events && seen(&[WakeCause::MemcgReclaim, WakeCause::OomKill]),
        }
    }

    /// Events lost to a full ring buffer (`Wake::lost`) name no pid: they are the node's
    /// where the node is the whole machine, and not known to be where a cgroup plays it (the
    /// tracepoints see the whole machine).
    fn holds(&self, w: &Wake) -> bool {
        match &self.rel {
            None => true,
            Some(_) if w.lost => false,
            Some(rel) => pid_in_cgroup(w.pid, rel, self.version),
        }
    }
}

#[cfg(test)]
mod tests {
    use evictd_policy::{observations::Observation, quantity::Quantity};

    use super::*;

    const MI: i64 = 1 << 20;

    fn urgency_now(
        t: &[Threshold],
        obs: &Observations,
        level: EmergencyLevel,
        kernel: KernelActing,
    ) -> Urgency {
        escalation_now(t, obs, level, kernel).urgency
    }

    fn obs(available: i64) -> Observations {
        let mut o = Observations::new();
        o.insert(Signal::MemoryAvailable, Observation { available, capacity: 4096 * MI, time_ns: None });
        o
    }

    /// 900 MiB of memory.available, and the pods' cgroup 40 MiB from its 2 GiB limit.
    fn pods_cgroup_near_its_limit() -> Observations {
        let mut o = obs(900 * MI);
        o.insert(
            Signal::AllocatableMemoryAvailable,
            Observation { available: 40 * MI, capacity: 2048 * MI, time_ns: None },
        );
        o
    }

    fn hard(mib: i64) -> Threshold {
        Threshold {
            signal: Signal::MemoryAvailable,
            value: ThresholdValue::Quantity(Quantity::from_units(mib * MI)),
            grace_period_ns: 0,
            min_reclaim: None,
        }
    }

    fn soft(mib: i64) -> Threshold {
        Threshold { grace_period_ns: 1_000_000_000, ..hard(mib) }
    }

    #[test]
    fn half_the_hard_threshold_is_an_emergency() {
        let t = [hard(100), soft(600)];
        let at = |mib| urgency_now(&t, &obs(mib * MI), EmergencyLevel::HalfHard, KernelActing::default());
        assert_eq!(at(700), Urgency::Normal);
        assert_eq!(at(500), Urgency::Normal, "a soft threshold alone changes nothing");
        assert_eq!(at(99), Urgency::Hard);
        assert_eq!(at(51), Urgency::Hard);
        assert_eq!(at(49), Urgency::Emergency);
    }

    #[test]
    fn a_fixed_level_and_the_kernel_acting() {
        let t = [hard(100)];
        assert_eq!(
            urgency_now(&t, &obs(90 * MI), EmergencyLevel::Bytes(95 * MI), KernelActing::default()),
            Urgency::Emergency
        );
        let direct = KernelActing { direct_reclaim: true, ..KernelActing::default() };
        assert_eq!(urgency_now(&t, &obs(900 * MI), EmergencyLevel::HalfHard, direct), Urgency::Emergency);
        // Soft thresholds only: no half-hard level, and no kernel event here either.
        let t = [soft(600)];
        assert_eq!(
            urgency_now(&t, &obs(MI), EmergencyLevel::HalfHard, KernelActing::default()),
            Urgency::Normal
        );
    }

    #[test]
    fn a_fixed_level_holds_for_the_pods_allocatable_memory_too() {
        let t = [hard(100), Threshold { signal: Signal::AllocatableMemoryAvailable, ..hard(100) }];
        let o = pods_cgroup_near_its_limit();
        assert_eq!(
            urgency_now(&t, &o, EmergencyLevel::Bytes(50 * MI), KernelActing::default()),
            Urgency::Emergency,
            "the pods' cgroup 40 MiB from its limit, under a 50 MiB level"
        );
        assert_eq!(
            urgency_now(&t, &o, EmergencyLevel::Bytes(30 * MI), KernelActing::default()),
            Urgency::Hard
        );
    }

    #[test]
    fn a_fixed_level_holds_for_memory_available_always_and_for_a_soft_allocatable_threshold() {
        let allocatable = Threshold { signal: Signal::AllocatableMemoryAvailable, ..hard(100) };
        let soft_allocatable = Threshold { signal: Signal::AllocatableMemoryAvailable, ..soft(100) };
        let level = EmergencyLevel::Bytes(50 * MI);
        // No threshold on memory.available: it counts all the same.
        assert_eq!(
            urgency_now(&[allocatable], &obs(40 * MI), level, KernelActing::default()),
            Urgency::Emergency
        );
        let o = pods_cgroup_near_its_limit();
        assert_eq!(urgency_now(&[soft_allocatable], &o, level, KernelActing::default()), Urgency::Emergency);
        // Nothing read: no emergency.
        assert_eq!(
            urgency_now(&[allocatable], &Observations::new(), level, KernelActing::default()),
            Urgency::Normal
        );
    }

    #[test]
    fn a_fixed_level_ignores_the_pods_allocatable_memory_when_no_threshold_watches_it() {
        // The pods' cgroup is read wherever it has a limit, enforced or not.
        let o = pods_cgroup_near_its_limit();
        for t in [vec![soft(600)], vec![hard(100)]] {
            assert_eq!(
                urgency_now(&t, &o, EmergencyLevel::Bytes(50 * MI), KernelActing::default()),
                Urgency::Normal,
                "{t:?}"
            );
        }
    }

    /// What the log says an emergency is: the signal and its level, or the kernel at work.
    #[test]
    fn an_emergency_names_the_signal_below_its_level() {
        let allocatable = Threshold { signal: Signal::AllocatableMemoryAvailable, ..hard(100) };
        let t = [hard(100), allocatable];
        let none = KernelActing::default();
        let o = pods_cgroup_near_its_limit();
        let e = emergency_now(&t, &o, EmergencyLevel::Bytes(50 * MI), none);
        assert_eq!(
            e,
            Some(EmergencyCause::Below {
                signal: Signal::AllocatableMemoryAvailable,
                available: 40 * MI,
                level: 50 * MI
            })
        );
        assert_eq!(
            e.map(|e| e.to_string()).as_deref(),
            Some("allocatableMemory.available read 40.0 MiB, below the emergency level of 50.0 MiB")
        );
        let e = emergency_now(&t, &obs(40 * MI), EmergencyLevel::HalfHard, none);
        assert_eq!(
            e,
            Some(EmergencyCause::Below {
                signal: Signal::MemoryAvailable,
                available: 40 * MI,
                level: 50 * MI
            })
        );
        let direct = KernelActing { direct_reclaim: true, ..none };
        assert_eq!(
            emergency_now(&t, &o, EmergencyLevel::Bytes(50 * MI), direct),
            Some(EmergencyCause::DirectReclaim)
        );
        assert_eq!(emergency_now(&t, &obs(900 * MI), EmergencyLevel::Bytes(50 * MI), none), None);
    }

    /// A level at or above a threshold makes every eviction on it an emergency: those
    /// thresholds are named at the start (and on SIGHUP).
    #[test]
    fn the_thresholds_the_emergency_level_reaches_are_named() {
        let tenth = Threshold { value: ThresholdValue::Percentage(0.1), ..hard(0) };
        let allocatable = Threshold { signal: Signal::AllocatableMemoryAvailable, ..hard(900) };
        let allocatable_tenth = Threshold { signal: Signal::AllocatableMemoryAvailable, ..tenth };
        let t = [hard(100), soft(600), tenth, allocatable, allocatable_tenth];
        let reached = |t: &[Threshold], level| {
            thresholds_within_the_emergency_level(t, &obs(900 * MI), level)
                .map(|(t, _)| t.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(reached(&t, EmergencyLevel::Bytes(99 * MI)), Vec::<String>::new());
        assert_eq!(reached(&t, EmergencyLevel::Bytes(100 * MI)), ["memory.available<100Mi"]);
        // 10 % of the 4 GiB read is 409.6 MiB.
        assert_eq!(
            reached(&t, EmergencyLevel::Bytes(500 * MI)),
            ["memory.available<100Mi", "memory.available<10%"]
        );
        // allocatableMemory.available is not read: its quantity is known, its percentage not.
        assert_eq!(
            reached(&t, EmergencyLevel::Bytes(900 * MI)),
            [
                "memory.available<100Mi",
                "memory.available<600Mi",
                "memory.available<10%",
                "allocatableMemory.available<900Mi"
            ]
        );
        // `auto`: half of a hard threshold never reaches it; a soft one on its signal at or
        // under that half is reached (half of 10 % of 4 GiB is 204.8 MiB).
        assert_eq!(reached(&[hard(100), soft(600)], EmergencyLevel::HalfHard), Vec::<String>::new());
        assert_eq!(reached(&[tenth, soft(200)], EmergencyLevel::HalfHard), ["memory.available<200Mi"]);
        assert_eq!(reached(&[hard(100), soft(50)], EmergencyLevel::HalfHard), ["memory.available<50Mi"]);
        assert_eq!(reached(&[hard(100), soft(51)], EmergencyLevel::HalfHard), Vec::<String>::new());
    }

    /// The start's warning and the emergency agree: a threshold is named exactly when memory
    /// a byte past it is below the emergency level, in either mode.
    #[test]
    fn a_threshold_is_named_exactly_when_meeting_it_is_an_emergency() {
        let tenth = Threshold { value: ThresholdValue::Percentage(0.1), ..hard(0) };
        let allocatable = Threshold { signal: Signal::AllocatableMemoryAvailable, ..hard(100) };
        let policies = [
            vec![hard(100), soft(600)],
            vec![tenth, soft(200)],
            vec![hard(100), soft(50)],
            vec![hard(100), soft(51)],
            vec![
                hard(100),
                allocatable,
                Threshold { signal: Signal::AllocatableMemoryAvailable, ..soft(300) },
            ],
        ];
        let levels = [
            EmergencyLevel::HalfHard,
            EmergencyLevel::Bytes(99 * MI),
            EmergencyLevel::Bytes(100 * MI),
            EmergencyLevel::Bytes(500 * MI),
        ];
        for p in &policies {
            for level in levels {
                let named: Vec<Threshold> = thresholds_within_the_emergency_level(p, &obs(900 * MI), level)
                    .map(|(t, _)| *t)
                    .collect();
                for t in p {
                    let capacity = 4096 * MI;
                    let mut o = Observations::new();
                    let available = t.value.resolve(capacity) - 1;
                    o.insert(t.signal, Observation { available, capacity, time_ns: None });
                    assert!(t.is_met(available, capacity, false));
                    let emergency = below_emergency_level(p, &o, level).is_some();
                    assert_eq!(named.contains(t), emergency, "{t} under {level:?} in {p:?}");
                }
            }
        }
    }

    #[test]
    fn an_unread_signal_is_no_emergency_and_no_hard_threshold() {
        let t = [hard(100)];
        assert_eq!(
            urgency_now(&t, &Observations::new(), EmergencyLevel::HalfHard, KernelActing::default()),
            Urgency::Normal
        );
    }

    #[test]
    fn reclaim_counts_only_in_the_node() {
        let layout = CgroupMounts {
            memory_root: "/sys/fs/cgroup/memory".into(),
            memory_version: CgroupVersion::V1,
            unified_root: None,
        };
        let mut w = Wake::now(WakeCause::DirectReclaim);
        w.pid = std::process::id();
        let machine = NodeScope::new(Path::new("/sys/fs/cgroup/memory"), &layout);
        assert!(machine.kernel_acting(&[w], true).direct_reclaim, "the whole machine holds every pid");
        let elsewhere = NodeScope::new(Path::new("/sys/fs/cgroup/memory/evictd-no-such-node"), &layout);
        assert_eq!(
            elsewhere.kernel_acting(&[w], true),
            KernelActing::default(),
            "this test is not in that cgroup"
        );
        let charge = machine.kernel_acting(&[Wake::now(WakeCause::Charge)], true);
        assert_eq!(charge, KernelActing::default(), "a charge is no reclaim");
        w.cause = WakeCause::MemcgReclaim;
        assert!(machine.kernel_acting(&[w], true).cgroup_reclaim_or_oom);
        assert!(
            !machine.kernel_acting(&[w], false).cgroup_reclaim_or_oom,
            "not looked at when they would not count"
        );
    }

    /// Reclaim the kernel could not report (the ring buffer was full) counts as a seen one
    /// where the node is the whole machine; where a cgroup plays the node, whose it was is
    /// not known, and it does not.
    #[test]
    fn reclaim_lost_to_a_full_ring_counts_on_a_whole_machine() {
        let layout = CgroupMounts {
            memory_root: "/sys/fs/cgroup/memory".into(),
            memory_version: CgroupVersion::V1,
            unified_root: None,
        };
        let machine = NodeScope::new(Path::new("/sys/fs/cgroup/memory"), &layout);
        let lost = Wake::lost(WakeCause::DirectReclaim);
        assert!(machine.kernel_acting(&[lost], true).direct_reclaim);
        let lost = Wake::lost(WakeCause::OomKill);
        assert!(machine.kernel_acting(&[lost], true).cgroup_reclaim_or_oom);
        assert!(!machine.kernel_acting(&[lost], false).cgroup_reclaim_or_oom, "counted as a seen one");
        assert_eq!(machine.kernel_acting(&[Wake::lost(WakeCause::Charge)], true), KernelActing::default());
        let cgroup = NodeScope::new(Path::new("/sys/fs/cgroup/memory/evictd-no-such-node"), &layout);
        let lost = Wake::lost(WakeCause::DirectReclaim);
        assert_eq!(cgroup.kernel_acting(&[lost], true), KernelActing::default());
    }

    /// A container reclaiming against its own limit, or OOM-killed by it, while the node is
    /// fine leaves a soft eviction's grace period alone; while the node is past a hard memory
    /// threshold the same events are the node's pressure, and kill at once.
    #[test]
    fn only_the_nodes_pressure_escalates() {
        let t = [hard(100), soft(600)];
        let memcg = KernelActing { cgroup_reclaim_or_oom: true, ..KernelActing::default() };
        // The node has 500 MiB available: past the soft threshold (an eviction with a grace
        // period is under way), not the hard one.
        assert_eq!(urgency_now(&t, &obs(500 * MI), EmergencyLevel::HalfHard, memcg), Urgency::Normal);
        assert_eq!(urgency_now(&t, &obs(90 * MI), EmergencyLevel::HalfHard, memcg), Urgency::Emergency);
        // A policy with soft memory thresholds only has no hard one to tell by: the kernel
        // reclaiming or OOM-killing in the node is an emergency, as it always was.
        let soft_only = [soft(600)];
        assert_eq!(
            urgency_now(&soft_only, &obs(500 * MI), EmergencyLevel::HalfHard, memcg),
            Urgency::Emergency
        );
    }
}
