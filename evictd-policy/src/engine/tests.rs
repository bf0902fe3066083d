//! The kubelet's `synchronize` rules (pkg/kubelet/eviction/eviction_manager.go and helpers.go:
//! thresholds, grace periods, conditions, eviction message), one test per rule.

use super::*;
use crate::{
    observations::Observation,
    podspec::Pod,
    policy::{MapSetting, PolicyInput, build},
    summary::PodStats,
    test_pod::test_pod,
};

const S: i64 = 1_000_000_000;
const MI: i64 = 1 << 20;

fn policy(
    hard: &str,
    soft: &str,
    grace: &str,
    min_reclaim: &str,
    extra: impl FnOnce(&mut PolicyInput),
) -> Policy {
    let mut i = PolicyInput {
        hard: Some(MapSetting::from_flag("--eviction-hard", hard, '<').unwrap()),
        soft: MapSetting::from_flag("--eviction-soft", soft, '<').unwrap(),
        soft_grace: MapSetting::from_flag("--eviction-soft-grace-period", grace, '=').unwrap(),
        min_reclaim: MapSetting::from_flag("--eviction-minimum-reclaim", min_reclaim, '=').unwrap(),
        ..Default::default()
    };
    extra(&mut i);
    build(&i, &mut Vec::new()).unwrap()
}

fn pod(name: &str, priority: i32, mem_req: &str, annotations: serde_json::Value) -> Pod {
    test_pod(name)
        .namespace("ns")
        .uid(&format!("uid-{name}"))
        .annotations(annotations)
        .priority(Some(priority))
        .spec(serde_json::json!({"terminationGracePeriodSeconds": 45}))
        .container("app", serde_json::json!({"memory": mem_req}))
        .build()
}

fn stats(name: &str, ws: i64) -> PodStats {
    serde_json::from_value(serde_json::json!({
        "podRef": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "memory": {"workingSetBytes": ws},
        "containers": [{"name": "app", "memory": {"workingSetBytes": ws}}]
    }))
    .unwrap()
}

fn mem_obs(available: i64, t: i64) -> Observations {
    let mut o = Observations::new();
    o.insert(Signal::MemoryAvailable, Observation { available, capacity: 1024 * MI, time_ns: Some(t) });
    o
}

struct World {
    policy: Policy,
    thresholds: Vec<Threshold>,
    pods: Vec<Pod>,
    stats: Vec<PodStats>,
    state: EngineState,
}

impl World {
    fn new(policy: Policy) -> Self {
        let pods = vec![
            pod("small", 0, "100Mi", serde_json::json!({})),
            pod("hog", 0, "100Mi", serde_json::json!({})),
            pod("static", 0, "10Mi", serde_json::json!({"kubernetes.io/config.source": "file"})),
        ];
        let stats = vec![stats("small", 150 * MI), stats("hog", 600 * MI), stats("static", 900 * MI)];
        let thresholds = thresholds_for_layout(&policy, FsLayout::SingleFs);
        World { policy, thresholds, pods, stats, state: EngineState::default() }
    }

    fn step(&mut self, obs: &Observations, now: i64) -> Decision {
        let entries: Vec<PodEntry> = self
            .pods
            .iter()
            .map(|p| PodEntry {
                pod: p,
                stats: self.stats.iter().find(|s| s.pod_ref.uid == p.metadata.uid),
                protected: false,
            })
            .collect();
        let (state, d) = decide(&self.input(obs, &entries, now), &self.state);
        self.state = state;
        d
    }

    /// The engine's input on this world's policy, as the kubelet decides (storage limits
    /// checked), single filesystem.
    fn input<'a>(&'a self, obs: &'a Observations, pods: &'a [PodEntry<'a>], now: i64) -> Input<'a> {
        Input {
            thresholds: &self.thresholds,
            policy: &self.policy,
            layout: FsLayout::SingleFs,
            observations: obs,
            pods,
            now_ns: now,
            check_storage_limits: true,
        }
    }

    fn victim(&self, d: &Decision) -> Option<String> {
        d.eviction.as_ref().map(|e| self.pods[e.pod].metadata.name.clone())
    }
}

#[test]
fn hard_threshold_evicts_the_top_ranked_non_critical_pod_at_once() {
    let mut w = World::new(policy("memory.available<100Mi", "", "", "", |_| {}));
    let d = w.step(&mem_obs(50 * MI, 10 * S), 10 * S);
    assert_eq!(w.victim(&d).as_deref(), Some("hog"), "static is larger but critical");
    let e = d.eviction.unwrap();
    assert_eq!(e.grace_period_seconds, 1);
    assert_eq!(e.signal, Signal::MemoryAvailable);
    assert_eq!(
        e.message,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. \
         Container app was using 600Mi, request is 100Mi, has larger consumption of memory. "
    );
    let annotations: Vec<(&str, &str)> =
        e.annotations.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(
        annotations,
        [
            ("offending_containers", "app"),
            ("offending_containers_usage", "600Mi"),
            ("starved_resource", "memory")
        ]
    );
    assert_eq!(d.node_conditions, [NodeCondition::MemoryPressure]);
    assert!(d.node_reclaim.is_empty(), "memory has no node-level reclaim");
}

#[test]
fn not_met_is_strict() {
    let mut w = World::new(policy("memory.available<100Mi", "", "", "", |_| {}));
    let d = w.step(&mem_obs(100 * MI, S), S);
    assert!(d.thresholds_met.is_empty() && d.eviction.is_none() && d.node_conditions.is_empty());
}

#[test]
fn soft_threshold_waits_out_its_grace_period_but_raises_the_condition_at_once() {
    let mut w = World::new(policy("", "memory.available<300Mi", "memory.available=30s", "", |i| {
        i.max_pod_grace_period_seconds = 20;
    }));
    let d = w.step(&mem_obs(200 * MI, 100 * S), 100 * S);
    assert!(d.eviction.is_none());
    assert_eq!(d.node_conditions, [NodeCondition::MemoryPressure]);
    assert!(d.no_eviction_reason.unwrap().contains("grace period"));
    assert!(w.step(&mem_obs(200 * MI, 129 * S), 129 * S).eviction.is_none());
    let d = w.step(&mem_obs(200 * MI, 130 * S), 130 * S);
    let e = d.eviction.expect("grace period over");
    assert_eq!(e.grace_period_seconds, 20, "min(max-pod-grace 20, pod's 45)");
}

#[test]
fn a_soft_threshold_that_clears_restarts_its_grace_period() {
    let mut w = World::new(policy("", "memory.available<300Mi", "memory.available=30s", "", |_| {}));
    w.step(&mem_obs(200 * MI, 100 * S), 100 * S);
    w.step(&mem_obs(400 * MI, 120 * S), 120 * S);
    assert!(w.step(&mem_obs(200 * MI, 131 * S), 131 * S).eviction.is_none(), "timer restarted at 131 s");
    assert!(w.step(&mem_obs(200 * MI, 161 * S), 161 * S).eviction.is_some());
}

#[test]
fn min_reclaim_keeps_evicting_until_threshold_plus_min_reclaim() {
    let mut w = World::new(policy("memory.available<100Mi", "", "", "memory.available=200Mi", |_| {}));
    assert!(w.step(&mem_obs(50 * MI, S), S).eviction.is_some());
    // Above the threshold but within its min-reclaim band: still actionable.
    let d = w.step(&mem_obs(250 * MI, 2 * S), 2 * S);
    assert!(d.eviction.is_some(), "{:?}", d.no_eviction_reason);
    // Past threshold + min-reclaim: resolved.
    assert!(w.step(&mem_obs(301 * MI, 3 * S), 3 * S).eviction.is_none());
    // The band applies only to thresholds that were actionable: from a clean state, 250Mi is fine.
    assert!(w.step(&mem_obs(250 * MI, 4 * S), 4 * S).eviction.is_none());
}

#[test]
fn pressure_condition_persists_for_the_transition_period() {
    let mut w = World::new(policy("memory.available<100Mi", "", "", "", |i| {
        i.pressure_transition_period = Some(("--eviction-pressure-transition-period".into(), "60s".into()));
    }));
    w.step(&mem_obs(50 * MI, 10 * S), 10 * S);
    assert_eq!(w.step(&mem_obs(500 * MI, 69 * S), 69 * S).node_conditions, [NodeCondition::MemoryPressure]);
    assert!(w.step(&mem_obs(500 * MI, 70 * S), 70 * S).node_conditions.is_empty(), "strictly less than");
}

#[test]
fn stale_stats_never_evict_twice() {
    let mut w = World::new(policy("memory.available<100Mi", "", "", "", |_| {}));
    assert!(w.step(&mem_obs(50 * MI, 10 * S), 10 * S).eviction.is_some());
    let d = w.step(&mem_obs(50 * MI, 10 * S), 11 * S);
    assert!(d.eviction.is_none(), "same stats timestamp");
    assert!(d.no_eviction_reason.unwrap().contains("not newer"));
    assert!(w.step(&mem_obs(50 * MI, 12 * S), 12 * S).eviction.is_some());
    // Observations without a time always count as fresh.
    let mut o = mem_obs(50 * MI, 0);
    o.get_mut(&Signal::MemoryAvailable).unwrap().time_ns = None;
    assert!(w.step(&o, 13 * S).eviction.is_some());
    assert!(w.step(&o, 14 * S).eviction.is_some());
}

#[test]
fn critical_pods_are_never_evicted() {
    let mut w = World::new(policy("memory.available<100Mi", "", "", "", |_| {}));
    w.pods.retain(|p| p.metadata.name == "static");
    let d = w.step(&mem_obs(50 * MI, S), S);
    assert!(d.eviction.is_none());
    assert_eq!(d.ranking.len(), 1, "ranked, but skipped");
    assert!(d.no_eviction_reason.unwrap().contains("critical"));
    // Priority-critical and mirror pods too.
    w.pods = vec![
        pod("mirror", 0, "1Mi", serde_json::json!({"kubernetes.io/config.mirror": "abc"})),
        pod("system", 2_000_000_000, "1Mi", serde_json::json!({})),
    ];
    w.stats = vec![stats("mirror", 900 * MI), stats("system", 900 * MI)];
    assert!(w.step(&mem_obs(50 * MI, 2 * S), 2 * S).eviction.is_none());
}

#[test]
fn a_pod_that_opts_out_is_skipped_but_a_critical_pod_cannot_opt_in() {
    let mut w = World::new(policy("memory.available<100Mi", "", "", "", |_| {}));
    w.pods[1] = pod("hog", 0, "100Mi", serde_json::json!({"evictd.io/eviction": "never"}));
    let d = w.step(&mem_obs(50 * MI, S), S);
    assert_eq!(w.victim(&d).as_deref(), Some("small"), "hog opted out, small is next");
    // Only `never` opts out; and no annotation makes a static pod evictable.
    w.pods[0] = pod("small", 0, "100Mi", serde_json::json!({"evictd.io/eviction": "always"}));
    w.pods[2] = pod(
        "static",
        0,
        "10Mi",
        serde_json::json!({"kubernetes.io/config.source": "file", "evictd.io/eviction-order": "-1000"}),
    );
    let d = w.step(&mem_obs(50 * MI, 2 * S), 2 * S);
    assert_eq!(w.victim(&d).as_deref(), Some("small"));
    w.pods.remove(0);
    w.stats.remove(0);
    let d = w.step(&mem_obs(50 * MI, 3 * S), 3 * S);
    assert_eq!(d.eviction.map(|e| e.pod), None);
    assert_eq!(
        d.no_eviction_reason.as_deref(),
        Some("every candidate pod is critical, protected, or opted out")
    );
}

#[test]
fn protected_pods_are_skipped_like_critical_ones() {
    let w = World::new(policy("memory.available<100Mi", "", "", "", |_| {}));
    let entries: Vec<PodEntry> = w
        .pods
        .iter()
        .zip(&w.stats)
        .map(|(p, s)| PodEntry { pod: p, stats: Some(s), protected: p.metadata.name == "hog" })
        .collect();
    let obs = mem_obs(50 * MI, S);
    let (_, d) = decide(&w.input(&obs, &entries, S), &EngineState::default());
    assert_eq!(d.eviction.map(|e| e.pod), Some(0), "hog is protected, small is next");
}

/// The kubelet's `localStorageEviction` runs before threshold handling: a pod over its own
/// emptyDir limit is evicted instead of the memory victim; the daemon's pressure decisions
/// (`check_storage_limits: false`) leave the limits to their own check.
#[test]
fn pods_over_their_own_limits_go_before_any_threshold_eviction() {
    let mut w = World::new(policy("memory.available<100Mi", "", "", "", |_| {}));
    w.pods[0].spec.volumes =
        serde_json::from_value(serde_json::json!([{"name": "v", "emptyDir": {"sizeLimit": "1Mi"}}])).unwrap();
    w.stats[0].volume =
        serde_json::from_value(serde_json::json!([{"name": "v", "usedBytes": 2 * MI}])).unwrap();
    let entries: Vec<PodEntry> = w
        .pods
        .iter()
        .zip(&w.stats)
        .map(|(p, s)| PodEntry { pod: p, stats: Some(s), protected: false })
        .collect();
    let obs = mem_obs(50 * MI, S);
    let mut input = w.input(&obs, &entries, S);
    let (_, d) = decide(&input, &EngineState::default());
    assert_eq!(d.eviction, None);
    assert_eq!(d.limit_evictions.iter().map(|e| e.pod).collect::<Vec<_>>(), [0]);
    assert_eq!(d.thresholds_met.len(), 1, "thresholds and conditions are still computed");
    input.check_storage_limits = false;
    let (_, d) = decide(&input, &EngineState::default());
    assert!(d.limit_evictions.is_empty() && d.eviction.is_some());
}

#[test]
fn hard_wins_over_soft_for_the_same_signal() {
    let mut w = World::new(policy(
        "memory.available<100Mi",
        "memory.available<300Mi",
        "memory.available=10s",
        "",
        |_| {},
    ));
    w.step(&mem_obs(50 * MI, 0), 0);
    let d = w.step(&mem_obs(50 * MI, 20 * S), 20 * S);
    assert_eq!(d.actionable.len(), 2, "both hard and soft are actionable");
    let e = d.eviction.unwrap();
    assert!(w.thresholds[e.threshold].is_hard());
    assert_eq!(e.grace_period_seconds, 1);
}

#[test]
fn memory_comes_before_disk_and_disk_reports_node_reclaim() {
    let mut w = World::new(policy("memory.available<100Mi,nodefs.available<10%", "", "", "", |_| {}));
    let mut obs = mem_obs(50 * MI, S);
    obs.insert(Signal::NodeFsAvailable, Observation { available: 1, capacity: 100, time_ns: Some(S) });
    let d = w.step(&obs, S);
    assert_eq!(d.eviction.as_ref().unwrap().signal, Signal::MemoryAvailable);
    assert_eq!(d.node_conditions, [NodeCondition::MemoryPressure, NodeCondition::DiskPressure]);
    let mut w = World::new(policy("nodefs.available<10%", "", "", "", |_| {}));
    let d = w.step(&obs, S);
    assert_eq!(d.node_reclaim, [NodeReclaim::UnusedContainers, NodeReclaim::UnusedImages]);
    let e = d.eviction.expect("reclaim is assumed to free nothing");
    assert_eq!(e.signal, Signal::NodeFsAvailable);
    assert!(e.message.starts_with(
        "The node was low on resource: ephemeral-storage. Threshold quantity: 10, available: 1. "
    ));
}

#[test]
fn unobserved_signals_never_evict() {
    let mut w = World::new(policy("memory.available<100Mi,pid.available<10", "", "", "", |_| {}));
    let d = w.step(&Observations::new(), S);
    assert!(d.thresholds_met.is_empty() && d.eviction.is_none());
}

#[test]
fn allocatable_threshold_evicts_for_memory() {
    let mut w = World::new(policy("memory.available<100Mi", "", "", "", |_| {}));
    let mut obs = mem_obs(500 * MI, S);
    obs.insert(
        Signal::AllocatableMemoryAvailable,
        Observation { available: 10 * MI, capacity: 800 * MI, time_ns: Some(S) },
    );
    let d = w.step(&obs, S);
    let e = d.eviction.unwrap();
    assert_eq!(e.signal, Signal::AllocatableMemoryAvailable);
    assert!(e.message.contains("Threshold quantity: 100Mi, available: 10Mi. "), "{}", e.message);
}

#[test]
fn pid_message_uses_decimal_quantities() {
    let mut w = World::new(policy("pid.available<2k", "", "", "", |_| {}));
    let mut obs = Observations::new();
    obs.insert(Signal::PidAvailable, Observation { available: 1000, capacity: 32768, time_ns: Some(S) });
    let e = w.step(&obs, S).eviction.unwrap();
    assert_eq!(e.message, "The node was low on resource: pids. Threshold quantity: 2k, available: 1k. ");
    assert_eq!(e.grace_period_seconds, 1);
}

#[test]
fn victim_grace_period_rules() {
    assert_eq!(victim_grace_seconds(true, 600, Some(30)), 1);
    assert_eq!(victim_grace_seconds(false, 0, Some(45)), 45, "0 means the pod's own");
    assert_eq!(victim_grace_seconds(false, 0, None), 30, "the API default");
    assert_eq!(victim_grace_seconds(false, 10, Some(45)), 10);
    assert_eq!(victim_grace_seconds(false, 60, Some(45)), 45);
    assert_eq!(victim_grace_seconds(false, -1, Some(45)), 1, "negative clamps to 1");
    assert_eq!(victim_grace_seconds(false, 10, Some(0)), 1, "0 from the pod clamps to 1");
}

#[test]
fn containerfs_thresholds_follow_the_layout() {
    let p = policy(
        "nodefs.available<10%,imagefs.available<15%,containerfs.available<1%",
        "nodefs.inodesFree<5%",
        "nodefs.inodesFree=1m",
        "",
        |_| {},
    );
    let single = thresholds_for_layout(&p, FsLayout::SingleFs);
    let cfs: Vec<String> = single
        .iter()
        .filter(|t| matches!(t.signal, Signal::ContainerFsAvailable | Signal::ContainerFsInodesFree))
        .map(|t| format!("{t} hard={}", t.is_hard()))
        .collect();
    assert_eq!(cfs, ["containerfs.available<10% hard=true", "containerfs.inodesFree<5% hard=false"]);
    let dedicated = thresholds_for_layout(&p, FsLayout::DedicatedImageFs);
    let cfs: Vec<String> = dedicated
        .iter()
        .filter(|t| t.signal == Signal::ContainerFsAvailable)
        .map(|t| t.to_string())
        .collect();
    assert_eq!(cfs, ["containerfs.available<15%"]);
    // Split: containerfs is on nodefs, and copies its thresholds.
    let split = thresholds_for_layout(&p, FsLayout::SplitContainerFs);
    let cfs: Vec<String> = split
        .iter()
        .filter(|t| matches!(t.signal, Signal::ContainerFsAvailable | Signal::ContainerFsInodesFree))
        .map(|t| t.to_string())
        .collect();
    assert_eq!(cfs, ["containerfs.available<10%", "containerfs.inodesFree<5%"]);
}

/// The kubelet returns at once only when there are no thresholds *and* local-storage
/// isolation is off; with it on (its default) the loop goes on for the pods' own limits.
#[test]
fn no_thresholds_no_state_change() {
    let mut w = World::new(policy("", "", "", "", |i| {
        i.enforce_node_allocatable = Some(("x".into(), vec![]));
        i.local_storage_capacity_isolation = false;
    }));
    let d = w.step(&mem_obs(0, S), S);
    assert!(d.eviction.is_none());
    assert_eq!(w.state, EngineState::default());
    let mut w = World::new(policy("", "", "", "", |i| {
        i.enforce_node_allocatable = Some(("x".into(), vec![]));
    }));
    let d = w.step(&mem_obs(0, S), S);
    assert!(d.eviction.is_none() && d.thresholds_met.is_empty());
    assert_ne!(w.state, EngineState::default(), "observations recorded");
}

/// A policy re-read (SIGHUP): a soft threshold whose value changed keeps its running grace
/// period, a removed one's state goes, a new one starts afresh.
#[test]
fn a_reloaded_policy_keeps_the_grace_periods_of_the_thresholds_it_keeps() {
    let mut w = World::new(policy(
        "",
        "memory.available<300Mi,nodefs.available<10%",
        "memory.available=10s,nodefs.available=10s",
        "",
        |_| {},
    ));
    let mut obs = mem_obs(50 * MI, S);
    obs.insert(Signal::NodeFsAvailable, Observation { available: 1, capacity: 100, time_ns: Some(S) });
    assert!(w.step(&obs, S).eviction.is_none(), "soft: the grace periods start");
    let old = w.thresholds.clone();
    // The memory threshold moves (and comes first now); the disk one is dropped; a hard one is new.
    let reloaded =
        policy("memory.available<50Mi", "memory.available<400Mi", "memory.available=10s", "", |_| {});
    w.thresholds = thresholds_for_layout(&reloaded, FsLayout::SingleFs);
    w.state = carry_over(&w.state, &old, &w.thresholds);
    let soft_mem =
        w.thresholds.iter().position(|t| t.signal == Signal::MemoryAvailable && !t.is_hard()).unwrap();
    assert_eq!(w.state.first_observed_ns.keys().copied().collect::<Vec<_>>(), [soft_mem], "{:?}", w.state);
    assert_eq!(w.state.first_observed_ns[&soft_mem], S, "the grace period keeps running");
    // 9 s after it started: not yet; at 11 s it is over, and the soft threshold evicts.
    let obs = mem_obs(60 * MI, 10 * S);
    assert!(w.step(&obs, 10 * S).eviction.is_none());
    let d = w.step(&mem_obs(60 * MI, 12 * S), 12 * S);
    assert_eq!(d.eviction.map(|e| e.threshold), Some(soft_mem));
}
