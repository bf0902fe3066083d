//! The record the kernel side pushes through the ring buffer: "look now, and here is why".

/// Charge growth in a memory cgroup passed the watermark userspace asked for.
pub const CAUSE_CHARGE: u32 = 1;
/// A task entered direct reclaim (the node as a whole is short of free pages).
pub const CAUSE_DIRECT_RECLAIM: u32 = 2;
/// A task entered reclaim on behalf of a memory cgroup that hit its limit.
pub const CAUSE_MEMCG_RECLAIM: u32 = 3;
/// The kernel OOM killer chose a victim: evictd was too late.
pub const CAUSE_OOM_KILL: u32 = 4;
/// One past the largest cause, for per-cause arrays.
pub const CAUSE_COUNT: usize = 5;

/// `cgroup_id` is the id of a cgroup in the memory controller's hierarchy
/// (on cgroup v1 that is the v1 memory hierarchy; on v2 the unified one).
pub const CGROUP_KIND_MEMCG: u32 = 0;
/// `cgroup_id` is the current task's cgroup in the default (cgroup2) hierarchy,
/// as returned by `bpf_get_current_cgroup_id`; on a v1 node it is not the memcg.
pub const CGROUP_KIND_DEFAULT: u32 = 1;

/// One wake event. 40 bytes, no implicit padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct WakeEvent {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC in nanoseconds.
    pub ts_ns: u64,
    /// A cgroup id (the cgroup directory's inode number); see `cgroup_kind`.
    pub cgroup_id: u64,
    /// Bytes: charge growth since the last event on this CPU, the size of the reclaim
    /// request, or the OOM victim's resident set.
    pub amount_bytes: i64,
    /// Thread-group id of the task that triggered it (the victim for `CAUSE_OOM_KILL`).
    pub pid: u32,
    /// One of the `CAUSE_*` constants.
    pub cause: u32,
    /// The CPU the event was emitted on.
    pub cpu: u32,
    /// One of the `CGROUP_KIND_*` constants.
    pub cgroup_kind: u32,
}

const _: () = assert!(size_of::<WakeEvent>() == 40);

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, no padding (asserted above): every bit pattern is valid.
unsafe impl aya::Pod for WakeEvent {}
