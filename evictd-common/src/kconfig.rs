//! What userspace tells the kernel side: which stat items count as charge, the watermark,
//! and rate limits. Lives in a one-entry array map; a zeroed entry (before userspace writes
//! it) disables every event, so a half-started daemon never floods the ring buffer.

/// Emit charge events (memcg stat tracepoints).
pub const FLAG_CHARGE: u32 = 1 << 0;
/// Count charge only for cgroup ids present in the `SCOPE` map (a test cgroup playing the
/// node); without it every memory cgroup counts, which is the whole node.
pub const FLAG_SCOPE: u32 = 1 << 1;
/// Emit reclaim events (direct and memcg reclaim begin).
pub const FLAG_RECLAIM: u32 = 1 << 2;
/// Emit OOM-kill events.
pub const FLAG_OOM: u32 = 1 << 3;
/// Emit charge events from the batched charge hook (fexit on the page counter's charge).
pub const FLAG_BATCH: u32 = 1 << 4;

/// How many page counters, from the one charged upwards, the batched hook compares with the
/// watched cgroup's: the charged cgroup and 16 levels above it. A container is four below
/// the root (pod, QoS class, kubepods); a pod of a nested runtime (kind, Docker-in-Docker,
/// sysbox) adds its own node's levels to that.
pub const BATCH_MAX_DEPTH: usize = 17;

/// Slots of the node's charge sum, one per generation in turn: a CPU stalled inside a program
/// while userspace re-armed would otherwise add to a slot zeroed for a newer generation.
pub const NODE_SUM_SLOTS: u32 = 8;

/// Stat items are indices of `enum node_stat_item` followed by `enum memcg_stat_item`
/// (the kernel numbers them in one space); 128 bits cover both with room to spare.
pub const STAT_ITEM_WORDS: usize = 2;
pub const STAT_ITEM_LIMIT: usize = STAT_ITEM_WORDS * 64;

/// Per-CPU counters, indices into the `COUNTERS` map.
pub const COUNTER_CHARGE_MATCHED: u32 = 0;
/// Charge events not emitted because the ring buffer was more than half full.
pub const COUNTER_CHARGE_YIELDED: u32 = 1;
pub const COUNTER_RATE_LIMITED: u32 = 2;
/// Pages charged to any memory cgroup of the machine since the programs were armed, never
/// reset, frees not taken off, in `CHARGED_PAGES_SLOTS` slots (one per charge program of a
/// tier): no pod's usage can have grown by more since userspace last read it (plus the
/// kernel's slack, `ChargeClock`), so a pod read then need not be read again to be ranked
/// behind one that is larger by more.
pub const COUNTER_CHARGED_PAGES: u32 = 3;
pub const CHARGED_PAGES_SLOTS: u32 = 2;
/// Events emitted, by cause: `COUNTER_EMITTED_BASE + cause`.
pub const COUNTER_EMITTED_BASE: u32 = COUNTER_CHARGED_PAGES + CHARGED_PAGES_SLOTS;
/// Events lost to a full ring buffer, by cause: `COUNTER_DROPS_BASE + cause`.
pub const COUNTER_DROPS_BASE: u32 = COUNTER_EMITTED_BASE + crate::CAUSE_COUNT as u32;
/// Kernel-side failures, by kind: `COUNTER_ERRORS_BASE + KernelError as u32`.
pub const COUNTER_ERRORS_BASE: u32 = COUNTER_DROPS_BASE + crate::CAUSE_COUNT as u32;
pub const COUNTER_COUNT: u32 = COUNTER_ERRORS_BASE + KERNEL_ERROR_COUNT as u32;

/// What can go wrong in a program. None should ever happen; each is counted rather than
/// silently skipped, and `--trace` reports the counts.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelError {
    /// The `CONFIG` map had no entry.
    NoConfig = 0,
    /// The `CPU_STATE` map had no entry for this CPU.
    NoCpuState = 1,
    /// Following memcg → cgroup → kernfs node → id failed (`bpf_probe_read_kernel`).
    MemcgIdRead = 2,
    /// The `NODE_SUM` map had no entry.
    NoNodeSum = 3,
}

pub const KERNEL_ERROR_COUNT: usize = 4;

impl KernelError {
    pub const ALL: [KernelError; KERNEL_ERROR_COUNT] =
        [KernelError::NoConfig, KernelError::NoCpuState, KernelError::MemcgIdRead, KernelError::NoNodeSum];

    pub fn as_str(self) -> &'static str {
        match self {
            KernelError::NoConfig => "no-config",
            KernelError::NoCpuState => "no-cpu-state",
            KernelError::MemcgIdRead => "memcg-id-read",
            KernelError::NoNodeSum => "no-node-sum",
        }
    }
}

/// Which stat items count as charge: bit `i` set means item `i` does. Written once, at load
/// time, into the program's read-only data (the `CHARGE_ITEMS` global), so the kernel side
/// tests it without a map lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ChargeItems(pub [u64; STAT_ITEM_WORDS]);

impl ChargeItems {
    /// Whether stat item `item` is selected; out-of-range items never are.
    #[inline(always)]
    pub fn counts_item(&self, item: i32) -> bool {
        if item < 0 || item as usize >= STAT_ITEM_LIMIT {
            return false;
        }
        let item = item as usize;
        // The mask keeps the index provably in bounds for the BPF verifier (no panic path).
        self.0[(item / 64) & (STAT_ITEM_WORDS - 1)] & (1u64 << (item % 64)) != 0
    }

    /// Select stat item `item`; returns false when it does not fit the mask.
    pub fn select_item(&mut self, item: u32) -> bool {
        let item = item as usize;
        if item >= STAT_ITEM_LIMIT {
            return false;
        }
        self.0[item / 64] |= 1u64 << (item % 64);
        true
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct KernelConfig {
    /// The memcg stat programs keep a page sum per CPU (charges minus frees since the last
    /// re-arm) and add it to the node's sum, one shared counter, once it has moved this far
    /// either way: the allocation path touches no shared cache line below it.
    pub flush_pages: i64,
    /// A charge that takes the node's sum to this emits a charge event (and takes what it
    /// reports off the sum); the sum is kept at minus this or above. Userspace sets it so that
    /// this and what the CPUs can hold back (under `flush_pages` each) make the watermark, but
    /// never under half of it (where the CPUs could hold back more). 0: every charge event, no
    /// shared sum.
    pub wake_pages: i64,
    /// Changing it makes every CPU restart its sum from zero at its next event, and picks the
    /// node's sum the CPUs add to (`NODE_SUM_SLOTS`), which userspace zeroes before it writes
    /// the config that names it.
    pub generation: u64,
    /// Minimum gap between two reclaim (or OOM) events on one CPU.
    pub min_interval_ns: u64,
    /// log2(page size), to turn pages into bytes.
    pub page_shift: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Byte offsets, resolved from the running kernel's BTF, of the path from a
    /// `struct mem_cgroup *` to its cgroup id: mem_cgroup.css + cgroup_subsys_state.cgroup,
    /// then cgroup.kn, then kernfs_node.id.
    pub memcg_cgroup_off: u32,
    pub cgroup_kn_off: u32,
    pub kn_id_off: u32,
    /// Byte offset of `order` in the vmscan reclaim-begin records, from this kernel's format
    /// file (it moved in 7.x).
    pub reclaim_order_off: u32,
    /// The batched charge hook's path, from BTF: mem_cgroup.css, mem_cgroup.memory (its page
    /// counter), page_counter.usage and .parent, and cgroup.subsys[memory_cgrp_id].
    pub memcg_css_off: u32,
    pub memcg_memory_off: u32,
    pub counter_usage_off: u32,
    pub counter_parent_off: u32,
    pub cgroup_memory_css_off: u32,
    pub _pad: u32,
    /// The cgroup id whose page counter the batched hook watches: the node (1, the root) or
    /// the cgroup playing it.
    pub batch_watch_id: u64,
    /// The hook emits once the watched counter's usage has grown this many pages since the
    /// first charge it saw after the last re-arm (a new `generation`).
    pub batch_watermark_pages: i64,
}

const _: () = assert!(size_of::<KernelConfig>() == 96);

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, no padding (asserted above).
unsafe impl aya::Pod for KernelConfig {}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers.
unsafe impl aya::Pod for ChargeItems {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_errors_are_dense_and_counted_last() {
        for (i, e) in KernelError::ALL.iter().enumerate() {
            assert_eq!(*e as usize, i);
        }
        assert_eq!(COUNTER_COUNT, COUNTER_ERRORS_BASE + KernelError::ALL.len() as u32);
    }

    #[test]
    fn item_mask_round_trip_and_bounds() {
        let mut c = ChargeItems::default();
        for i in [0u32, 3, 63, 64, 127] {
            assert!(c.select_item(i));
            assert!(c.counts_item(i as i32));
        }
        assert!(!c.counts_item(1));
        assert!(!c.counts_item(65));
        assert!(!c.select_item(128));
        assert!(!c.counts_item(128));
        assert!(!c.counts_item(-1));
    }
}
