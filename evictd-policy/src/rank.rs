//! Which pod goes first: the kubelet's comparators, applied in order, for memory, PID and
//! disk signals. A pod without stats is evicted first in every stats-based comparator.
//! Ties keep the input order (the kubelet's sort is unstable; evictd's is deterministic).

use std::cmp::Ordering;

use crate::{
    podspec::Pod,
    policy::{Resource, Signal},
    summary::PodStats,
};

/// One active pod: its spec, its stats if the node reported any, and whether evictd must
/// never touch it for reasons of its own (e.g. evictd's own pod).
#[derive(Clone, Copy, Debug)]
pub struct PodEntry<'a> {
    pub pod: &'a Pod,
    pub stats: Option<&'a PodStats>,
    pub protected: bool,
}

/// The disk layout, which decides what each disk signal measures, what node-level reclaim
/// can free and which thresholds containerfs copies (the kubelet's `dedicatedImageFs` and
/// `splitContainerImageFs`, detected once at its first tick).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsLayout {
    /// Images and containers on the nodefs filesystem.
    SingleFs,
    /// A separate imagefs holding images and writable layers.
    DedicatedImageFs,
    /// A separate imagefs holding images only; the writable layers (containerfs) on nodefs
    /// (KEP-4191, the runtime's `ImageFsInfo` naming a container filesystem apart).
    SplitContainerFs,
}

impl FsLayout {
    /// The kubelet's `dedicatedImageFs`: images on a filesystem of their own.
    pub fn has_image_fs(self) -> bool {
        self != FsLayout::SingleFs
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FsLayout::SingleFs => "single",
            FsLayout::DedicatedImageFs => "dedicated-imagefs",
            FsLayout::SplitContainerFs => "split-containerfs",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FsStat {
    Root,
    Logs,
    LocalVolumes,
}

/// What the kubelet's `buildSignalToRankFunc` measures per pod for a disk signal.
fn stats_to_measure(signal: Signal, layout: FsLayout) -> &'static [FsStat] {
    use FsStat::*;
    let on_nodefs = matches!(signal, Signal::NodeFsAvailable | Signal::NodeFsInodesFree);
    let on_imagefs = matches!(signal, Signal::ImageFsAvailable | Signal::ImageFsInodesFree);
    match layout {
        FsLayout::SingleFs => &[Root, Logs, LocalVolumes],
        FsLayout::DedicatedImageFs if on_nodefs => &[Logs, LocalVolumes],
        // containerfs is imagefs.
        FsLayout::DedicatedImageFs => &[Root],
        // Images only: nothing any pod owns.
        FsLayout::SplitContainerFs if on_imagefs => &[],
        // containerfs is nodefs, writable layers included.
        FsLayout::SplitContainerFs => &[Root, Logs, LocalVolumes],
    }
}

/// Node-level reclaim the kubelet runs before evicting for a signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeReclaim {
    /// Remove dead containers (containerGC.DeleteAllUnusedContainers).
    UnusedContainers,
    /// Remove images no container uses (imageGC.DeleteUnusedImages).
    UnusedImages,
}

/// The kubelet's `buildSignalToNodeReclaimFuncs`.
pub fn node_reclaim_for(signal: Signal, layout: FsLayout) -> &'static [NodeReclaim] {
    use NodeReclaim::*;
    if !signal.resource().is_disk() {
        return &[];
    }
    let on_imagefs = matches!(signal, Signal::ImageFsAvailable | Signal::ImageFsInodesFree);
    match layout {
        FsLayout::SingleFs => &[UnusedContainers, UnusedImages],
        // nodefs holds nothing the runtime can free; containerfs is imagefs.
        FsLayout::DedicatedImageFs
            if matches!(signal, Signal::NodeFsAvailable | Signal::NodeFsInodesFree) =>
        {
            &[]
        }
        FsLayout::DedicatedImageFs => &[UnusedContainers, UnusedImages],
        FsLayout::SplitContainerFs if on_imagefs => &[UnusedImages],
        // Dead containers' writable layers are on nodefs (= containerfs).
        FsLayout::SplitContainerFs => &[UnusedContainers],
    }
}

/// `cmpBool`: true first.
fn true_first(a: bool, b: bool) -> Ordering {
    b.cmp(&a)
}

fn without_stats_first(a: &PodEntry, b: &PodEntry) -> Option<Ordering> {
    match (a.stats.is_some(), b.stats.is_some()) {
        (true, true) => None,
        (x, y) => Some(true_first(!x, !y)),
    }
}

fn memory_nanos(e: &PodEntry) -> i128 {
    let ws = e.stats.and_then(|s| s.memory.as_ref()).and_then(|m| m.working_set_bytes).unwrap_or(0);
    i128::from(ws) * 1_000_000_000
}

fn processes(e: &PodEntry) -> u64 {
    e.stats.and_then(|s| s.process_stats.as_ref()).and_then(|p| p.process_count).unwrap_or(0)
}

/// (bytes, inodes) the pod uses on the filesystem of `signal`, in nanos.
fn disk_nanos(e: &PodEntry, signal: Signal, layout: FsLayout) -> (i128, i128) {
    let Some(stats) = e.stats else { return (0, 0) };
    let measure = stats_to_measure(signal, layout);
    let (mut bytes, mut inodes) = (0u64, 0u64);
    for c in &stats.containers {
        for (kind, fs) in [(FsStat::Root, &c.rootfs), (FsStat::Logs, &c.logs)] {
            if measure.contains(&kind)
                && let Some(fs) = fs
            {
                bytes += fs.used_bytes.unwrap_or(0);
                inodes += fs.inodes_used.unwrap_or(0);
            }
        }
    }
    if measure.contains(&FsStat::LocalVolumes) {
        for name in e.pod.local_volume_names() {
            if let Some(v) = stats.volume.iter().find(|v| v.name == name) {
                bytes += v.used_bytes.unwrap_or(0);
                inodes += v.inodes_used.unwrap_or(0);
            }
        }
    }
    (i128::from(bytes) * 1_000_000_000, i128::from(inodes) * 1_000_000_000)
}

/// What ranking reads of a pod's spec, worked out once: a sort compares each pod ~log₂ n
/// times, and each comparison would sum the containers' requests and parse an annotation
/// again. Kept with a pod list between decisions (`read_memory_contenders`), a decision
/// reads these few bytes a pod in one array, not each pod's spec scattered over the heap:
/// on a node of 250 pods, with caches cold, the specs cost a memory decision ~40 µs more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodKeys {
    priority: i32,
    daemonset: bool,
    order: i64,
    memory_request: i128,
    storage_request: i128,
    /// `Pod::is_critical`, `Pod::opts_out`: never evicted (`evictable`).
    critical: bool,
    opts_out: bool,
    /// `Pod::is_active`: the kubelet ranks only active pods.
    pub active: bool,
}

impl PodKeys {
    pub fn of(pod: &Pod) -> Self {
        PodKeys {
            priority: pod.priority(),
            daemonset: pod.is_daemonset_pod(),
            order: pod.eviction_order(),
            memory_request: pod.request_nanos("memory"),
            storage_request: pod.request_nanos("ephemeral-storage"),
            critical: pod.is_critical(),
            opts_out: pod.opts_out(),
            active: pod.is_active(),
        }
    }
}

/// A pod as the comparator sees it.
#[derive(Clone, Copy)]
struct Keyed<'e, 'a> {
    e: &'e PodEntry<'a>,
    k: &'e PodKeys,
}

fn by_priority(a: Keyed, b: Keyed) -> Ordering {
    a.k.priority.cmp(&b.k.priority)
}

/// evictd's keys after the kubelet's class keys (exceeding requests, priority) and before
/// usage: DaemonSet pods last in their class (their controller brings them back on this node,
/// so evicting one frees nothing for long), then the pods' own `evictd.io/eviction-order`.
fn by_evictd_order(a: Keyed, b: Keyed) -> Ordering {
    a.k.daemonset.cmp(&b.k.daemonset).then_with(|| a.k.order.cmp(&b.k.order))
}

/// The kubelet's `orderedBy(exceedRequests, priority, usage)`, the chain memory and disk
/// ranking share: pods without stats first, then pods using more than `exceeds` says they
/// may, then lower priority, then (evictd) `by_evictd_order`, then the most `above` their
/// request.
fn exceeds_then_priority_then_usage(
    a: Keyed,
    b: Keyed,
    exceeds: impl Fn(Keyed) -> bool,
    above: impl Fn(Keyed) -> i128,
) -> Ordering {
    without_stats_first(a.e, b.e)
        .unwrap_or_else(|| true_first(exceeds(a), exceeds(b)))
        .then_with(|| by_priority(a, b))
        .then_with(|| by_evictd_order(a, b))
        .then_with(|| without_stats_first(a.e, b.e).unwrap_or_else(|| above(b).cmp(&above(a))))
}

fn compare(a: Keyed, b: Keyed, signal: Signal, layout: FsLayout) -> Ordering {
    match signal.resource() {
        Resource::Memory => {
            let above = |p: Keyed| memory_nanos(p.e) - p.k.memory_request;
            exceeds_then_priority_then_usage(a, b, |p| above(p) > 0, above)
        }
        Resource::Pids => by_priority(a, b).then_with(|| by_evictd_order(a, b)).then_with(|| {
            without_stats_first(a.e, b.e).unwrap_or_else(|| processes(b.e).cmp(&processes(a.e)))
        }),
        Resource::EphemeralStorage | Resource::Inodes => {
            let inodes = signal.resource() == Resource::Inodes;
            let usage = |p: Keyed| {
                let (bytes, ino) = disk_nanos(p.e, signal, layout);
                if inodes { ino } else { bytes }
            };
            // No pod requests inodes, so any inode use "exceeds".
            let request = |p: Keyed| if inodes { 0 } else { p.k.storage_request };
            // The kubelet subtracts the ephemeral-storage byte request even when ranking inodes.
            let above = |p: Keyed| usage(p) - p.k.storage_request;
            exceeds_then_priority_then_usage(a, b, |p| usage(p) > request(p), above)
        }
    }
}

/// Indices of `pods`, first to evict first.
pub fn rank(pods: &[PodEntry], signal: Signal, layout: FsLayout) -> Vec<usize> {
    let keys: Vec<PodKeys> = pods.iter().map(|e| PodKeys::of(e.pod)).collect();
    let keyed = |i: usize| Keyed { e: &pods[i], k: &keys[i] };
    let mut order: Vec<usize> = (0..pods.len()).collect();
    order.sort_by(|&i, &j| compare(keyed(i), keyed(j), signal, layout));
    order
}

/// Whether the pod may be evicted at all: the kubelet skips critical pods
/// (`kubelettypes.IsCriticalPod`); evictd also skips the pods the caller protects (itself,
/// and candidates whose kill already failed) and the pods that opted out
/// (`evictd.io/eviction: never`).
pub fn evictable(e: &PodEntry) -> bool {
    !e.pod.is_critical() && !e.protected && !e.pod.opts_out()
}

/// `evictable`, from the pod's keys.
pub fn evictable_by_keys(k: &PodKeys, protected: bool) -> bool {
    !k.critical && !protected && !k.opts_out
}

/// The pods among which memory ranking's first `k` evictable pods are, each with its stats
/// read by `exact` (`None`: unreadable, left out), found while reading as few as possible:
/// `bounds` gives each pod's stats with an upper bound of its working set (its usage, one
/// small file, where the working set costs a memory.stat read, tens of microseconds each on
/// a node of hundreds of pods). Pods are read in the order their bounds rank, until the
/// next bound ranks after the `k`-th pod read. That stop is exact, not a heuristic: the
/// memory comparator never ranks a pod later for a larger working set (it is then over its
/// request at least as much), so a pod whose bound ranks after the `k`-th pod read cannot
/// rank before it with its real working set. Pods that are not `evictable` are not read.
/// `keys` are the pods' `PodKeys`, in the order of `bounds` (`None`: worked out here).
/// Returns the pods read, in input order.
pub fn read_memory_contenders(
    bounds: &[PodEntry],
    keys: Option<&[PodKeys]>,
    k: usize,
    signal: Signal,
    mut exact: impl FnMut(usize) -> Option<PodStats>,
) -> Vec<(usize, PodStats)> {
    debug_assert_eq!(signal.resource(), Resource::Memory, "the stop holds for memory ranking only");
    let layout = FsLayout::SingleFs;
    debug_assert!(keys.is_none_or(|k| k.len() == bounds.len()), "one key a pod");
    let worked_out: Vec<PodKeys>;
    let keys = match keys {
        Some(keys) if keys.len() == bounds.len() => keys,
        // Keys of other pods would rank by another pod's spec: never used.
        _ => {
            worked_out = bounds.iter().map(|e| PodKeys::of(e.pod)).collect();
            &worked_out
        }
    };
    let bound = |i: usize| Keyed { e: &bounds[i], k: &keys[i] };
    let mut by_bound: Vec<usize> =
        (0..bounds.len()).filter(|&i| evictable_by_keys(&keys[i], bounds[i].protected)).collect();
    by_bound.sort_by(|&i, &j| compare(bound(i), bound(j), signal, layout));
    let mut read: Vec<(usize, PodStats)> = Vec::new();
    // The `k` first of those read, by their real working set, in rank order.
    let mut first: Vec<usize> = Vec::with_capacity(k.min(bounds.len()) + 1);
    fn entry<'s>(bounds: &[PodEntry<'s>], read: &'s [(usize, PodStats)], r: usize) -> PodEntry<'s> {
        PodEntry { stats: Some(&read[r].1), ..bounds[read[r].0] }
    }
    for i in by_bound {
        if first.len() >= k
            && let Some(&last) = first.last()
        {
            // Ties keep the input order: a tie with an earlier pod still ranks before it.
            let last_read = Keyed { e: &entry(bounds, &read, last), k: &keys[read[last].0] };
            let after = compare(bound(i), last_read, signal, layout).then(i.cmp(&read[last].0));
            if after == Ordering::Greater {
                break;
            }
        }
        let Some(stats) = exact(i) else { continue };
        read.push((i, stats));
        let new = read.len() - 1;
        let at = first.partition_point(|&r| {
            let (a, b) = (entry(bounds, &read, r), entry(bounds, &read, new));
            let ord =
                compare(Keyed { e: &a, k: &keys[read[r].0] }, Keyed { e: &b, k: &keys[i] }, signal, layout);
            ord.then(read[r].0.cmp(&i)) == Ordering::Less
        });
        first.insert(at, new);
        first.truncate(k);
    }
    read.sort_by_key(|(i, _)| *i);
    read
}

#[cfg(test)]
mod tests;
