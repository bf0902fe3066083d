//! The tracepoints evictd attaches to, and the record layout each program was compiled
//! for: one table, read by the kernel side (field offsets) and by userspace (which program
//! goes where, and what to check in the running kernel's format files or BTF before
//! attaching). A kernel whose layout differs is refused, never misread.

/// One field of a classic tracepoint's record (`/sys/kernel/tracing/events/<group>/<name>/format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub offset: usize,
    pub size: usize,
}

/// A program and the tracepoint it is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracepointSpec {
    /// The program's name in the eBPF object (its function name).
    pub program: &'static str,
    pub group: &'static str,
    pub name: &'static str,
    /// A raw tracepoint (its prototype is checked in BTF) rather than a classic one (its
    /// record layout, `fields`, is checked in the format file).
    pub raw: bool,
    pub fields: &'static [Field],
    /// A field read wherever this kernel's record puts it: its offset is looked up in the
    /// format file at load time and handed to the program through `KernelConfig`.
    pub located: Option<LocatedField>,
}

/// A classic tracepoint field whose offset moves between kernels (7.x added fields in front
/// of vmscan's `order`); its name and size are still checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocatedField {
    pub name: &'static str,
    pub size: usize,
}

/// `vmscan:mm_vmscan_{direct,memcg}_reclaim_begin`: `int order`, at offset 8 up to 6.x and
/// 24 on 7.x, so located at load time (`KernelConfig::reclaim_order_off`).
pub const RECLAIM_ORDER: LocatedField = LocatedField { name: "order", size: 4 };
/// `oom:mark_victim`: the victim's pid and its RSS in kB by kind.
pub const OOM_PID: Field = Field { name: "pid", offset: 8, size: 4 };
pub const OOM_ANON_RSS: Field = Field { name: "anon_rss", offset: 24, size: 8 };
pub const OOM_FILE_RSS: Field = Field { name: "file_rss", offset: 32, size: 8 };
pub const OOM_SHMEM_RSS: Field = Field { name: "shmem_rss", offset: 40, size: 8 };

/// Arguments of the memcg stat raw tracepoints, `(struct mem_cgroup *memcg, int item, int
/// val)` (include/trace/events/memcg.h, Linux 6.13+), by position.
pub const MEMCG_STAT_ARG_MEMCG: usize = 0;
pub const MEMCG_STAT_ARG_ITEM: usize = 1;
pub const MEMCG_STAT_ARG_VAL: usize = 2;

pub const PROG_MOD_MEMCG_LRUVEC_STATE: &str = "mod_memcg_lruvec_state";
pub const PROG_MOD_MEMCG_STATE: &str = "mod_memcg_state";
pub const PROG_DIRECT_RECLAIM_BEGIN: &str = "direct_reclaim_begin";
pub const PROG_MEMCG_RECLAIM_BEGIN: &str = "memcg_reclaim_begin";
pub const PROG_MARK_VICTIM: &str = "mark_victim";

/// The batched charge hook: fexit programs on the page counter's charge functions, which
/// memcg calls once per per-CPU batch (64 pages), not per page. `try_charge` is the hook;
/// `charge` (the forced path) is taken where it can be traced.
pub const PROG_PAGE_COUNTER_TRY_CHARGE: &str = "page_counter_try_charge";
pub const PROG_PAGE_COUNTER_CHARGE: &str = "page_counter_charge";
pub const BATCH_PROGRAMS: [&str; 2] = [PROG_PAGE_COUNTER_TRY_CHARGE, PROG_PAGE_COUNTER_CHARGE];

pub const TRACEPOINTS: [TracepointSpec; 5] = [
    TracepointSpec {
        program: PROG_MOD_MEMCG_LRUVEC_STATE,
        group: "memcg",
        name: "mod_memcg_lruvec_state",
        raw: true,
        fields: &[],
        located: None,
    },
    TracepointSpec {
        program: PROG_MOD_MEMCG_STATE,
        group: "memcg",
        name: "mod_memcg_state",
        raw: true,
        fields: &[],
        located: None,
    },
    TracepointSpec {
        program: PROG_DIRECT_RECLAIM_BEGIN,
        group: "vmscan",
        name: "mm_vmscan_direct_reclaim_begin",
        raw: false,
        fields: &[],
        located: Some(RECLAIM_ORDER),
    },
    TracepointSpec {
        program: PROG_MEMCG_RECLAIM_BEGIN,
        group: "vmscan",
        name: "mm_vmscan_memcg_reclaim_begin",
        raw: false,
        fields: &[],
        located: Some(RECLAIM_ORDER),
    },
    TracepointSpec {
        program: PROG_MARK_VICTIM,
        group: "oom",
        name: "mark_victim",
        raw: false,
        fields: &[OOM_PID, OOM_ANON_RSS, OOM_FILE_RSS, OOM_SHMEM_RSS],
        located: None,
    },
];
