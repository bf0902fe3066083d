//! The kubelet's ranking rules (pkg/kubelet/eviction/helpers.go: `rankMemoryPressure`,
//! `rankPIDPressure`, `rankDiskPressureFunc`), one case per comparator.

use super::*;
use crate::{summary::PodStats, test_pod::test_pod};

fn pod(name: &str, priority: Option<i32>, mem_req: Option<&str>, eph_req: Option<&str>) -> Pod {
    let mut requests = serde_json::Map::new();
    if let Some(r) = mem_req {
        requests.insert("memory".into(), r.into());
    }
    if let Some(r) = eph_req {
        requests.insert("ephemeral-storage".into(), r.into());
    }
    test_pod(name)
        .priority(priority)
        .container("c", requests.into())
        .spec(serde_json::json!({"volumes": [{"name": "scratch", "emptyDir": {}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "x"}}]}))
        .build()
}

fn stats(uid: &str, ws_mib: u64, procs: u64, rootfs: u64, logs: u64, scratch: u64) -> PodStats {
    serde_json::from_value(serde_json::json!({
        "podRef": {"name": uid, "namespace": "default", "uid": uid},
        "memory": {"workingSetBytes": ws_mib << 20},
        "process_stats": {"process_count": procs},
        "containers": [{"name": "c",
            "rootfs": {"usedBytes": rootfs, "inodesUsed": rootfs / 100},
            "logs": {"usedBytes": logs, "inodesUsed": logs / 100}}],
        "volume": [{"name": "scratch", "usedBytes": scratch, "inodesUsed": scratch / 100},
                   {"name": "data", "usedBytes": 1u64 << 40, "inodesUsed": 1u64 << 30}]
    }))
    .unwrap()
}

fn names(pods: &[Pod], stats: &[Option<PodStats>], signal: Signal, layout: FsLayout) -> Vec<String> {
    let entries: Vec<PodEntry> = pods
        .iter()
        .zip(stats)
        .map(|(p, s)| PodEntry { pod: p, stats: s.as_ref(), protected: false })
        .collect();
    rank(&entries, signal, layout).into_iter().map(|i| pods[i].metadata.name.clone()).collect()
}

#[test]
fn memory_exceeding_requests_then_priority_then_usage_above_request() {
    let pods = vec![
        pod("guaranteed-big", Some(0), Some("1Gi"), None), // 900Mi of 1Gi: within request
        pod("burstable-over", Some(0), Some("100Mi"), None), // 300Mi: 200Mi over
        pod("besteffort", Some(0), None, None),            // 150Mi: 150Mi over
        pod("high-prio-over", Some(1000), Some("10Mi"), None), // 500Mi: 490Mi over, but priority
    ];
    let s = vec![
        Some(stats("guaranteed-big", 900, 1, 0, 0, 0)),
        Some(stats("burstable-over", 300, 1, 0, 0, 0)),
        Some(stats("besteffort", 150, 1, 0, 0, 0)),
        Some(stats("high-prio-over", 500, 1, 0, 0, 0)),
    ];
    assert_eq!(
        names(&pods, &s, Signal::MemoryAvailable, FsLayout::SingleFs),
        ["burstable-over", "besteffort", "high-prio-over", "guaranteed-big"]
    );
}

#[test]
fn memory_usage_equal_to_request_does_not_exceed() {
    let pods =
        vec![pod("at-request", Some(0), Some("100Mi"), None), pod("over", Some(5), Some("99Mi"), None)];
    let s = vec![Some(stats("at-request", 100, 1, 0, 0, 0)), Some(stats("over", 100, 1, 0, 0, 0))];
    assert_eq!(names(&pods, &s, Signal::MemoryAvailable, FsLayout::SingleFs), ["over", "at-request"]);
}

#[test]
fn pods_without_stats_go_first() {
    let pods = vec![pod("measured", Some(0), None, None), pod("unmeasured", Some(100), Some("1Gi"), None)];
    let s = vec![Some(stats("measured", 500, 10, 10, 10, 10)), None];
    for signal in [Signal::MemoryAvailable, Signal::NodeFsAvailable, Signal::NodeFsInodesFree] {
        assert_eq!(names(&pods, &s, signal, FsLayout::SingleFs)[0], "unmeasured", "{signal}");
    }
    // For PIDs priority comes first, then stats.
    assert_eq!(names(&pods, &s, Signal::PidAvailable, FsLayout::SingleFs)[0], "measured");
}

#[test]
fn pids_rank_by_priority_then_process_count() {
    let pods = vec![
        pod("few", Some(0), None, None),
        pod("many", Some(0), None, None),
        pod("vip", Some(9), None, None),
    ];
    let s = vec![
        Some(stats("few", 1, 5, 0, 0, 0)),
        Some(stats("many", 1, 500, 0, 0, 0)),
        Some(stats("vip", 1, 5000, 0, 0, 0)),
    ];
    assert_eq!(names(&pods, &s, Signal::PidAvailable, FsLayout::SingleFs), ["many", "few", "vip"]);
}

#[test]
fn disk_counts_root_logs_and_local_volumes_on_a_single_fs() {
    let pods = vec![
        pod("logs-heavy", Some(0), None, Some("1Gi")),
        pod("scratch-heavy", Some(0), None, None),
        pod("root-heavy", Some(0), None, None),
    ];
    let s = vec![
        Some(stats("logs-heavy", 1, 1, 0, 3 << 30, 0)), // 3Gi of logs, 1Gi request: 2Gi above
        Some(stats("scratch-heavy", 1, 1, 0, 0, 1 << 30)), // 1Gi emptyDir (the PVC does not count)
        Some(stats("root-heavy", 1, 1, 2500 << 20, 0, 0)), // 2.5Gi writable layer
    ];
    assert_eq!(
        names(&pods, &s, Signal::NodeFsAvailable, FsLayout::SingleFs),
        ["root-heavy", "logs-heavy", "scratch-heavy"]
    );
}

#[test]
fn dedicated_imagefs_splits_what_each_signal_measures() {
    let pods = vec![pod("logger", Some(0), None, None), pod("writer", Some(0), None, None)];
    let s = vec![Some(stats("logger", 1, 1, 10, 5 << 30, 0)), Some(stats("writer", 1, 1, 5 << 30, 10, 0))];
    assert_eq!(names(&pods, &s, Signal::NodeFsAvailable, FsLayout::DedicatedImageFs), ["logger", "writer"]);
    assert_eq!(names(&pods, &s, Signal::ImageFsAvailable, FsLayout::DedicatedImageFs), ["writer", "logger"]);
    assert_eq!(
        names(&pods, &s, Signal::ContainerFsAvailable, FsLayout::DedicatedImageFs),
        ["writer", "logger"]
    );
}

/// KEP-4191's split: nodefs (and containerfs, which is on it) counts the writable layers
/// with the logs and volumes; imagefs holds images only, so no pod uses any of it and the
/// order falls back to the input's.
#[test]
fn a_split_containerfs_puts_the_writable_layers_on_nodefs() {
    let pods = vec![
        pod("logger", Some(0), None, None),
        pod("writer", Some(0), None, None),
        pod("idle", Some(0), None, None),
    ];
    let s = vec![
        Some(stats("logger", 1, 1, 10, 3 << 30, 0)),
        Some(stats("writer", 1, 1, 5 << 30, 10, 0)),
        Some(stats("idle", 1, 1, 0, 0, 0)),
    ];
    let split = FsLayout::SplitContainerFs;
    assert_eq!(names(&pods, &s, Signal::NodeFsAvailable, split), ["writer", "logger", "idle"]);
    assert_eq!(names(&pods, &s, Signal::ContainerFsAvailable, split), ["writer", "logger", "idle"]);
    assert_eq!(names(&pods, &s, Signal::ImageFsAvailable, split), ["logger", "writer", "idle"]);
}

#[test]
fn inode_ranking_subtracts_the_byte_request_like_the_kubelet() {
    // Both use inodes (so both "exceed" a request of 0); the one with a large ephemeral-storage
    // byte request ranks lower although it uses more inodes: the kubelet's quirk.
    let pods = vec![pod("big-request", Some(0), None, Some("1Gi")), pod("no-request", Some(0), None, None)];
    let s =
        vec![Some(stats("big-request", 1, 1, 100_000, 0, 0)), Some(stats("no-request", 1, 1, 50_000, 0, 0))];
    assert_eq!(names(&pods, &s, Signal::NodeFsInodesFree, FsLayout::SingleFs), ["no-request", "big-request"]);
}

#[test]
fn ties_keep_input_order() {
    let pods = vec![pod("a", None, None, None), pod("b", None, None, None), pod("c", None, None, None)];
    let s = vec![
        Some(stats("a", 10, 1, 0, 0, 0)),
        Some(stats("b", 10, 1, 0, 0, 0)),
        Some(stats("c", 10, 1, 0, 0, 0)),
    ];
    assert_eq!(names(&pods, &s, Signal::MemoryAvailable, FsLayout::SingleFs), ["a", "b", "c"]);
}

#[test]
fn node_reclaim_per_layout() {
    assert!(node_reclaim_for(Signal::MemoryAvailable, FsLayout::SingleFs).is_empty());
    assert!(node_reclaim_for(Signal::PidAvailable, FsLayout::SingleFs).is_empty());
    assert_eq!(node_reclaim_for(Signal::NodeFsAvailable, FsLayout::SingleFs).len(), 2);
    assert!(node_reclaim_for(Signal::NodeFsInodesFree, FsLayout::DedicatedImageFs).is_empty());
    assert_eq!(node_reclaim_for(Signal::ImageFsAvailable, FsLayout::DedicatedImageFs).len(), 2);
    assert_eq!(node_reclaim_for(Signal::ContainerFsAvailable, FsLayout::DedicatedImageFs).len(), 2);
    // The split layout: dead containers for nodefs and containerfs, images for imagefs.
    let split = FsLayout::SplitContainerFs;
    assert_eq!(node_reclaim_for(Signal::NodeFsAvailable, split), [NodeReclaim::UnusedContainers]);
    assert_eq!(node_reclaim_for(Signal::ContainerFsInodesFree, split), [NodeReclaim::UnusedContainers]);
    assert_eq!(node_reclaim_for(Signal::ImageFsAvailable, split), [NodeReclaim::UnusedImages]);
    assert!(node_reclaim_for(Signal::PidAvailable, split).is_empty());
}

/// evictd beyond the kubelet: `pod` with a controller owner of `kind` and annotations.
fn owned(name: &str, mem_req: &str, kind: &str, annotations: serde_json::Value) -> Pod {
    let mut p = pod(name, Some(0), Some(mem_req), None);
    p.metadata.owner_references = serde_json::from_value(serde_json::json!([
        {"apiVersion": "apps/v1", "kind": kind, "name": "owner", "uid": "o", "controller": true}
    ]))
    .unwrap();
    p.metadata.annotations = serde_json::from_value(annotations).unwrap();
    p
}

#[test]
fn daemonset_pods_go_last_in_their_class_but_not_across_classes() {
    let pods = vec![
        owned("ds-most-over", "10Mi", "DaemonSet", serde_json::json!({})), // 490Mi over
        owned("rs-less-over", "10Mi", "ReplicaSet", serde_json::json!({})), // 90Mi over
        owned("ds-within", "1Gi", "DaemonSet", serde_json::json!({})),     // within its request
        owned("rs-within", "1Gi", "ReplicaSet", serde_json::json!({})),    // within its request
    ];
    let s = vec![
        Some(stats("ds-most-over", 500, 1, 0, 0, 0)),
        Some(stats("rs-less-over", 100, 1, 0, 0, 0)),
        Some(stats("ds-within", 900, 1, 0, 0, 0)),
        Some(stats("rs-within", 100, 1, 0, 0, 0)),
    ];
    // Exceeding the request is the kubelet's class: the DaemonSet pod over its request still
    // goes before any pod within, and last only among those over.
    assert_eq!(
        names(&pods, &s, Signal::MemoryAvailable, FsLayout::SingleFs),
        ["rs-less-over", "ds-most-over", "rs-within", "ds-within"]
    );
    // A pod owned by a DaemonSet but not controlled by it is an ordinary pod.
    let mut not_controller = pods[0].clone();
    not_controller.metadata.owner_references[0].controller = None;
    assert!(!not_controller.is_daemonset_pod());
    assert!(pods[0].is_daemonset_pod());
}

#[test]
fn the_eviction_order_annotation_places_a_pod_within_its_class() {
    let pods = vec![
        owned("most-over", "10Mi", "ReplicaSet", serde_json::json!({"evictd.io/eviction-order": "10"})),
        owned("volunteer", "10Mi", "ReplicaSet", serde_json::json!({"evictd.io/eviction-order": "-5"})),
        owned("plain", "10Mi", "ReplicaSet", serde_json::json!({"evictd.io/eviction-order": "soon"})),
        owned("within", "1Gi", "ReplicaSet", serde_json::json!({"evictd.io/eviction-order": "-100"})),
    ];
    let s = vec![
        Some(stats("most-over", 500, 1, 0, 0, 0)),
        Some(stats("volunteer", 20, 1, 0, 0, 0)),
        Some(stats("plain", 100, 1, 0, 0, 0)),
        Some(stats("within", 100, 1, 0, 0, 0)),
    ];
    // An order that is not an integer counts as 0; no order moves a pod out of its class.
    assert_eq!(
        names(&pods, &s, Signal::MemoryAvailable, FsLayout::SingleFs),
        ["volunteer", "plain", "most-over", "within"]
    );
    assert_eq!(
        names(&pods, &s, Signal::PidAvailable, FsLayout::SingleFs),
        ["within", "volunteer", "plain", "most-over"]
    );
}

/// Pods for `read_memory_contenders`: (priority, memory request MiB, working set MiB,
/// page cache MiB on top of it, protected), some critical, some tied.
fn contenders(
    pods: &[(i32, Option<u32>, u64, u64, bool)],
) -> (Vec<Pod>, Vec<PodStats>, Vec<PodStats>, Vec<bool>) {
    let specs = pods
        .iter()
        .enumerate()
        .map(|(i, &(prio, req, ..))| {
            let req = req.map(|r| format!("{r}Mi"));
            pod(&format!("p{i}"), Some(prio), req.as_deref(), None)
        })
        .collect();
    let exact = pods.iter().enumerate().map(|(i, &(_, _, ws, ..))| stats(&format!("p{i}"), ws, 1, 0, 0, 0));
    let bound = pods
        .iter()
        .enumerate()
        .map(|(i, &(_, _, ws, cache, _))| stats(&format!("p{i}"), ws + cache, 1, 0, 0, 0));
    (specs, exact.collect(), bound.collect(), pods.iter().map(|p| p.4).collect())
}

/// The first `k` evictable pods of a ranking over `entries`, by pod name.
fn first_k(entries: &[PodEntry], k: usize) -> Vec<String> {
    let order = rank(entries, Signal::MemoryAvailable, FsLayout::SingleFs);
    order
        .into_iter()
        .filter(|&i| evictable(&entries[i]))
        .take(k)
        .map(|i| entries[i].pod.metadata.name.clone())
        .collect()
}

/// Reading only the pods whose bound can rank them among the first `k` finds the same
/// first `k` as reading every pod, and reads no pod that is not evictable.
fn contenders_rank_as_all(pods: &[(i32, Option<u32>, u64, u64, bool)], k: usize) -> usize {
    contenders_rank_as_all_readable(pods, k, &[])
}

/// `contenders_rank_as_all`, where the pods in `unreadable` cannot be read (their exact read
/// answers nothing): they are left out of both rankings.
fn contenders_rank_as_all_readable(
    pods: &[(i32, Option<u32>, u64, u64, bool)],
    k: usize,
    unreadable: &[usize],
) -> usize {
    let (specs, exact, bound, protected) = contenders(pods);
    fn entry<'s>(specs: &'s [Pod], protected: &[bool], i: usize, s: &'s PodStats) -> PodEntry<'s> {
        PodEntry { pod: &specs[i], stats: Some(s), protected: protected[i] }
    }
    let all: Vec<PodEntry> = exact
        .iter()
        .enumerate()
        .filter(|(i, _)| !unreadable.contains(i))
        .map(|(i, s)| entry(&specs, &protected, i, s))
        .collect();
    let bounds: Vec<PodEntry> =
        bound.iter().enumerate().map(|(i, s)| entry(&specs, &protected, i, s)).collect();
    let mut reads = 0;
    // With the keys the caller keeps, as evictd does.
    let keys: Vec<PodKeys> = bounds.iter().map(|e| PodKeys::of(e.pod)).collect();
    let read = read_memory_contenders(&bounds, Some(&keys), k, Signal::MemoryAvailable, |i| {
        assert!(evictable(&bounds[i]), "p{i} is not evictable and was read");
        reads += 1;
        (!unreadable.contains(&i)).then(|| exact[i].clone())
    });
    let subset: Vec<PodEntry> = read.iter().map(|(i, s)| entry(&specs, &protected, *i, s)).collect();
    assert_eq!(first_k(&subset, k), first_k(&all, k), "{pods:?}, k = {k}");
    assert!(read.iter().all(|(i, _)| !unreadable.contains(i)) && read.len() <= reads);
    reads
}

#[test]
fn one_growing_pod_among_many_is_found_reading_one_pod() {
    let mut pods = vec![(0, Some(64), 10, 30, false); 249];
    pods.push((0, Some(64), 900, 0, false));
    // A critical pod with more memory than anyone is never read.
    pods.push((2_000_001_000, None, 2000, 0, false));
    assert_eq!(contenders_rank_as_all(&pods, 1), 1);
    // The first two: every small pod's bound (its page cache) could place it second.
    assert_eq!(contenders_rank_as_all(&pods, 2), 250);
    // Page cache puts a pod's bound above the grower: it is read, and ranks after it.
    pods[7].3 = 2000;
    assert_eq!(contenders_rank_as_all(&pods, 1), 2);
}

proptest::proptest! {
    #[test]
    fn contenders_find_the_first_k_of_the_whole_ranking(
        pods in proptest::collection::vec(
            (
                proptest::sample::select(vec![0, 1000, 2_000_001_000]),
                proptest::option::of(proptest::sample::select(vec![10u32, 100, 1024])),
                proptest::sample::select(vec![0u64, 5, 100, 101, 500, 1500]),
                proptest::sample::select(vec![0u64, 1, 400, 3000]),
                proptest::bool::weighted(0.2),
            ),
            0..40,
        ),
        k in 1usize..=5,
        unreadable in proptest::collection::vec(0usize..40, 0..4),
    ) {
        contenders_rank_as_all_readable(&pods, k, &unreadable);
    }
}

/// The keys a decision keeps say what the spec says: who may be evicted, who is active.
#[test]
fn a_pods_keys_say_what_its_spec_says() {
    let status = |phase: &str| serde_json::json!({"phase": phase});
    let pods: Vec<Pod> = vec![
        test_pod("plain").build(),
        test_pod("static").annotations(serde_json::json!({"kubernetes.io/config.source": "file"})).build(),
        test_pod("mirror").annotations(serde_json::json!({"kubernetes.io/config.mirror": "x"})).build(),
        test_pod("system").priority(Some(2_000_000_000)).build(),
        test_pod("opted-out").annotations(serde_json::json!({"evictd.io/eviction": " never "})).build(),
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "done"}, "status": status("Succeeded")}),
        )
        .unwrap(),
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "failed"}, "status": status("Failed")}),
        )
        .unwrap(),
    ];
    for p in &pods {
        let k = PodKeys::of(p);
        assert_eq!(k.active, p.is_active(), "{}", p.metadata.name);
        for protected in [false, true] {
            let e = PodEntry { pod: p, stats: None, protected };
            assert_eq!(
                evictable_by_keys(&k, protected),
                evictable(&e),
                "{} protected {protected}",
                p.metadata.name
            );
        }
    }
    let evictable: Vec<&str> = (pods.iter())
        .filter(|p| evictable_by_keys(&PodKeys::of(p), false))
        .map(|p| p.metadata.name.as_str())
        .collect();
    assert_eq!(evictable, ["plain", "done", "failed"]);
    assert_eq!(pods.iter().filter(|p| !PodKeys::of(p).active).count(), 2);
}
