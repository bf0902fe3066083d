//! evictd's kernel side. Per event the work is a mask test, an add and a compare; a ring-buffer
//! record goes out only when userspace must look (charge past the watermark, reclaim started,
//! the OOM killer acted). The memcg programs are raw tracepoints whose prototypes userspace
//! checks in the kernel's BTF, which also gives the struct offsets they follow; the others
//! read fields at the offsets of the tracepoint formats in /sys/kernel/tracing/events/...,
//! checked against the running kernel's format files. A kernel with a different layout is
//! refused, never misread.
// Host builds (`cargo build --workspace`, clippy) type-check the programs as an ordinary
// binary; only the bpfel-unknown-none build is loaded into the kernel.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// The BPF target has no compare-and-swap, so core's atomic types give it no read-modify-write
// at all; the intrinsic becomes BPF's own atomic add (its result unused: the instruction that
// returns the old value needs a newer BPF CPU version than the programs are built for).
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

use aya_ebpf::{
    EbpfContext as _, Global,
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_RING_SIZE},
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        bpf_probe_read_kernel,
    },
    macros::{fexit, map, raw_tracepoint, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{FExitContext, RawTracePointContext, TracePointContext},
};
use evictd_common::{
    BATCH_MAX_DEPTH, CAUSE_CHARGE, CAUSE_DIRECT_RECLAIM, CAUSE_MEMCG_RECLAIM, CAUSE_OOM_KILL,
    CGROUP_KIND_DEFAULT, CGROUP_KIND_MEMCG, COUNTER_CHARGE_MATCHED, COUNTER_CHARGE_YIELDED,
    COUNTER_CHARGED_PAGES, COUNTER_COUNT, COUNTER_DROPS_BASE, COUNTER_EMITTED_BASE, COUNTER_ERRORS_BASE,
    COUNTER_RATE_LIMITED, ChargeItems, FLAG_BATCH, FLAG_CHARGE, FLAG_OOM, FLAG_RECLAIM, FLAG_SCOPE,
    KernelConfig, KernelError, NODE_SUM_SLOTS, STAT_ITEM_WORDS, WakeEvent,
    tracepoints::{
        Field, MEMCG_STAT_ARG_ITEM, MEMCG_STAT_ARG_MEMCG, MEMCG_STAT_ARG_VAL, OOM_ANON_RSS, OOM_FILE_RSS,
        OOM_PID, OOM_SHMEM_RSS,
    },
};

// Map and global names are `evictd_common::names`; userspace checks this object against them.

/// Wake events to userspace. Userspace sizes it at load time (`--ring-buffer-size`).
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

#[map]
static CONFIG: Array<KernelConfig> = Array::with_max_entries(1, 0);

#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);

/// Memory cgroup ids whose charge counts when `FLAG_SCOPE` is set.
#[map]
static SCOPE: HashMap<u64, u8> = HashMap::with_max_entries(16384, 0);

/// Per-CPU running state: no atomics on the hot path, no cache line shared between CPUs.
#[repr(C)]
struct CpuState {
    charge_pages: i64,
    generation: u64,
    last_reclaim_ns: u64,
    last_oom_ns: u64,
    last_memcg: u64,
    last_id: u64,
}

#[map]
static CPU_STATE: PerCpuArray<CpuState> = PerCpuArray::with_max_entries(1, 0);

/// The batched hook's baseline: the watched counter's usage before the first charge seen
/// after the last re-arm. Shared by all CPUs (the hook runs ~4 times per MiB, not per page);
/// two CPUs racing on it can only emit one extra wake.
#[repr(C)]
struct BatchState {
    generation: u64,
    baseline_pages: i64,
}

#[map]
static BATCH_STATE: Array<BatchState> = Array::with_max_entries(1, 0);

/// The node's counted growth since the last re-arm, in pages, as the CPUs add their own
/// sums to it (each once it moved by `flush_pages`). Memory charged on one CPU and freed on
/// another cancels here, which per-CPU sums alone cannot see: a page cache page activated by
/// a reader and deactivated by kswapd, a process that migrated before it unmapped. A slot per
/// generation in turn: userspace zeroes the next one before it re-arms, so no program ever
/// resets a sum that other CPUs add to.
#[map]
static NODE_SUM: Array<i64> = Array::with_max_entries(NODE_SUM_SLOTS, 0);

// Raw tracepoints: the kernel calls them with the tracepoint's arguments, without building
// a trace record first, which is most of a classic tracepoint's cost on a path that runs for
// every page charged and freed. Arguments: (struct mem_cgroup *memcg, int item, int val).
// Each program is a thin wrapper: the work is in a `try_` function whose failures are
// counted (`COUNTER_ERRORS_BASE + KernelError`) for `--trace`, never silently dropped.

#[raw_tracepoint(tracepoint = "mod_memcg_lruvec_state")]
pub fn mod_memcg_lruvec_state(ctx: RawTracePointContext) -> i32 {
    count_failure(try_memcg_stat(&ctx, 0));
    0
}

#[raw_tracepoint(tracepoint = "mod_memcg_state")]
pub fn mod_memcg_state(ctx: RawTracePointContext) -> i32 {
    count_failure(try_memcg_stat(&ctx, 1));
    0
}

// The batched charge hook (kernels with BPF trampolines): memcg charges a cgroup's page
// counter, and each ancestor's, once per per-CPU batch of 64 pages, through these two
// functions. Arguments: (struct page_counter *counter, unsigned long nr_pages, ...).

#[fexit(function = "page_counter_try_charge")]
pub fn page_counter_try_charge(ctx: FExitContext) -> i32 {
    count_failure(counter_and_pages(&ctx).and_then(|(c, n)| try_batch_charge(c, n, 0)));
    0
}

#[fexit(function = "page_counter_charge")]
pub fn page_counter_charge(ctx: FExitContext) -> i32 {
    count_failure(counter_and_pages(&ctx).and_then(|(c, n)| try_batch_charge(c, n, 1)));
    0
}

/// The counter and the pages charged, as plain numbers: the verifier types a tracing
/// program's arguments as BTF pointers and allows them no arithmetic by offsets known only at
/// run time (ours come from BTF through the config), so they are read through the helper
/// instead of `ctx.arg(n)`.
#[inline(always)]
fn counter_and_pages(ctx: &FExitContext) -> Result<(u64, u64), KernelError> {
    let args = ctx.as_ptr() as u64;
    Ok((read_u64(args)?, read_u64(args + 8)?))
}

#[tracepoint]
pub fn direct_reclaim_begin(ctx: TracePointContext) -> u32 {
    count_failure(try_reclaim(&ctx, CAUSE_DIRECT_RECLAIM));
    0
}

#[tracepoint]
pub fn memcg_reclaim_begin(ctx: TracePointContext) -> u32 {
    count_failure(try_reclaim(&ctx, CAUSE_MEMCG_RECLAIM));
    0
}

#[tracepoint]
pub fn mark_victim(ctx: TracePointContext) -> u32 {
    count_failure(try_oom(&ctx));
    0
}

#[inline(always)]
fn count_failure(r: Result<(), KernelError>) {
    if let Err(e) = r {
        bump(COUNTER_ERRORS_BASE + e as u32);
    }
}

#[inline(always)]
fn bump(counter: u32) {
    if let Some(c) = COUNTERS.get_ptr_mut(counter) {
        // SAFETY: per-CPU slot, only this CPU writes it while this program runs.
        unsafe { *c += 1 };
    }
}

/// Adds `pages` to this program's slot of the charged-pages count (slot `slot` from
/// `COUNTER_CHARGED_PAGES`, one per program): the two programs of a tier can run one inside the other on a
/// CPU (a charge from an interrupt), but the kernel never runs a program inside itself on a
/// CPU (it skips the run and counts a recursion miss, which userspace reads), so a plain add
/// to a slot of one's own loses nothing.
#[inline(always)]
fn count_charged(slot: u32, pages: u64) {
    if let Some(c) = COUNTERS.get_ptr_mut(COUNTER_CHARGED_PAGES + slot) {
        // SAFETY: per-CPU slot, only this program writes it, and never twice at once on a CPU.
        unsafe { *c += pages };
    }
}

/// A field of the tracepoint record, loaded directly: tracepoint programs may read their
/// context, and a plain load is far cheaper than a `bpf_probe_read` helper call, which
/// matters on a path that runs for every page charged and freed.
#[inline(always)]
fn field<T: Copy>(ctx: &TracePointContext, f: Field) -> T {
    // SAFETY: offset and size match the record layout userspace checked against this
    // kernel's format file before attaching; the verifier bounds-checks the access.
    unsafe { core::ptr::read_unaligned(ctx.as_ptr().cast::<u8>().add(f.offset).cast::<T>()) }
}

/// Which stat items count as charge: a bit per `enum node_stat_item`/`memcg_stat_item`
/// value. Set once by userspace at load time (from BTF names), so it lives in read-only data
/// and the test below needs no map lookup: most calls end there.
#[unsafe(no_mangle)]
static CHARGE_ITEMS: Global<ChargeItems> = Global::new(ChargeItems([0; STAT_ITEM_WORDS]));

/// The items that follow every charge of a memory cgroup's page counter (the LRU lists,
/// inactive file included, kernel memory, socket memory, hugetlb): what
/// `COUNTER_CHARGED_PAGES` counts. A superset of `CHARGE_ITEMS`; set once by userspace.
#[unsafe(no_mangle)]
static BOUND_ITEMS: Global<ChargeItems> = Global::new(ChargeItems([0; STAT_ITEM_WORDS]));

#[inline(always)]
fn try_memcg_stat(ctx: &RawTracePointContext, slot: u32) -> Result<(), KernelError> {
    // Register arguments: no memory access at all until an event is known to count.
    let item = ctx.arg::<u64>(MEMCG_STAT_ARG_ITEM) as i32;
    // Most stat updates are for items that follow no charge (dirty, writeback, mapped...).
    if !BOUND_ITEMS.load().counts_item(item) {
        return Ok(());
    }
    let val = ctx.arg::<u64>(MEMCG_STAT_ARG_VAL) as i32;
    // Every charge, armed or not, in scope or not: a container made after the scope was last
    // walked still charges its pod, whose bound must grow with it.
    if val > 0 {
        count_charged(slot, val as u64);
    }
    // Page cache on the inactive list, say, is charged but leaves memory.available as it was.
    if !CHARGE_ITEMS.load().counts_item(item) {
        return Ok(());
    }
    // Frees count as negative charges: the sums follow net growth, not gross charge, which
    // also counts memory mapped and unmapped again and pages moved between LRU lists (beside a
    // churning tenant near a threshold that woke evictd thousands of times a second for no
    // growth at all).
    if val == 0 {
        return Ok(());
    }
    let cfg = CONFIG.get(0).ok_or(KernelError::NoConfig)?;
    if cfg.flags & FLAG_CHARGE == 0 {
        return Ok(());
    }
    let memcg = ctx.arg::<u64>(MEMCG_STAT_ARG_MEMCG);
    let st = CPU_STATE.get_ptr_mut(0).ok_or(KernelError::NoCpuState)?;
    // SAFETY: per-CPU slot; a program is not re-entered on the same CPU.
    let st = unsafe { &mut *st };
    if st.generation != cfg.generation {
        st.generation = cfg.generation;
        st.charge_pages = 0;
        // A re-arm also forgets the memcg → id memo (a freed memcg's address can be reused).
        st.last_memcg = 0;
    }
    // The cgroup's id only where it is needed: to keep to the scope, and to name the cgroup
    // in a wake. A whole node (no scope) reads it for no free and no charge under the mark.
    // SAFETY: map value read only, u8 is Copy.
    if cfg.flags & FLAG_SCOPE != 0 && unsafe { SCOPE.get(memo_cgroup_id(st, cfg, memcg)?) }.is_none() {
        return Ok(());
    }
    bump(COUNTER_CHARGE_MATCHED);
    if cfg.wake_pages == 0 {
        // `--bpf-watermark 0`: every charge event wakes evictd, and no free does; nothing
        // shared is touched.
        if val > 0 {
            emit_charge(memo_cgroup_id(st, cfg, memcg)?, (val as i64) << cfg.page_shift);
        }
        return Ok(());
    }
    // Within a flush either way this CPU keeps its sum to itself: most counting events end
    // here, with no shared cache line touched.
    st.charge_pages += val as i64;
    if st.charge_pages.abs() < cfg.flush_pages {
        return Ok(());
    }
    // The slot of the generation this CPU's sum belongs to (the config may change meanwhile).
    let sum =
        NODE_SUM.get_ptr_mut((st.generation % NODE_SUM_SLOTS as u64) as u32).ok_or(KernelError::NoNodeSum)?;
    let total = add_to_node_sum(sum, cfg, core::mem::take(&mut st.charge_pages));
    // Only a charge wakes evictd.
    if val < 0 || total < cfg.wake_pages {
        return Ok(());
    }
    // A failed read leaves the node's sum past the mark, for the next flush to retry.
    let id = memo_cgroup_id(st, cfg, memcg)?;
    // What this wake reports comes off the sum; what other CPUs add meanwhile stays. Not if
    // userspace re-armed meanwhile: the slot may be a newer generation's by now.
    // SAFETY: `cfg` points into the config map, which userspace rewrites whole; a volatile
    // read sees the generation it holds now.
    if unsafe { (&raw const cfg.generation).read_volatile() } == st.generation {
        // SAFETY: the node's sum, in its map (add_to_node_sum).
        unsafe { atomic_add(sum, -total) };
    }
    emit_charge(id, total << cfg.page_shift);
    Ok(())
}

/// Adds `pages` to the node's sum (`sum`, this generation's slot of `NODE_SUM`) and returns
/// it, kept at minus `wake_pages` or above. A floor only raises the sum, so it never makes a
/// wake late; it bounds what frees whose charge was not counted (a cgroup charged before it
/// joined the scope, an anonymous page zswap keeps compressed) can hold a wake back, and with
/// it what the sum can bank from frees for a churn to spend.
#[inline(always)]
fn add_to_node_sum(sum: *mut i64, cfg: &KernelConfig, pages: i64) -> i64 {
    // The sum read after this CPU's own add holds it and whatever other CPUs added before:
    // of CPUs that add at once, the last to read sees them all, so none misses the mark; two
    // may both see it passed, and each then emits and takes its total off (the sum is left
    // low until the re-arm their wakes bring, which moves to the next slot).
    // SAFETY: a map value, aligned and as long-lived as the program, that programs change
    // only by atomic adds (userspace zeroes it while generations of other slots run).
    let mut total = unsafe {
        atomic_add(sum, pages);
        sum.read_volatile()
    };
    if total < -cfg.wake_pages {
        // SAFETY: as above.
        unsafe { atomic_add(sum, -cfg.wake_pages - total) };
        total = -cfg.wake_pages;
    }
    total
}

/// `*p += v` as one atomic instruction.
///
/// # Safety
/// `p` is valid and aligned for an i64, and only changed atomically meanwhile.
#[inline(always)]
unsafe fn atomic_add(p: *mut i64, v: i64) {
    #[cfg(target_arch = "bpf")]
    // SAFETY: the caller's.
    unsafe {
        core::intrinsics::atomic_xadd::<i64, i64, { core::intrinsics::AtomicOrdering::Relaxed }>(p, v);
    }
    #[cfg(not(target_arch = "bpf"))]
    // SAFETY: the caller's.
    unsafe {
        core::sync::atomic::AtomicI64::from_ptr(p).fetch_add(v, core::sync::atomic::Ordering::Relaxed);
    }
}

/// `memcg`'s cgroup id through this CPU's memo: charges come in runs from one memcg, and the
/// memo saves chasing three pointers for each.
#[inline(always)]
fn memo_cgroup_id(st: &mut CpuState, cfg: &KernelConfig, memcg: u64) -> Result<u64, KernelError> {
    if memcg != st.last_memcg {
        // The two stat programs share this CPU's state: should one run inside the other (an
        // uncharge from an interrupt), it finds no memo rather than an id of another memcg.
        st.last_memcg = 0;
        st.last_id = memcg_cgroup_id(cfg, memcg)?;
        st.last_memcg = memcg;
    }
    Ok(st.last_id)
}

/// memcg->css.cgroup->kn->id, with the offsets userspace resolved from this kernel's BTF.
#[inline(always)]
fn memcg_cgroup_id(cfg: &KernelConfig, memcg: u64) -> Result<u64, KernelError> {
    cgroup_id(cfg, read_u64(memcg + cfg.memcg_cgroup_off as u64)?)
}

/// A charge of `counter`: if it is a memcg's memory counter (not swap, memsw or hugetlb,
/// which use the same functions) and the watched cgroup is it or an ancestor, compares the
/// watched counter's usage with the baseline and emits once it grew by the watermark. The
/// event names the cgroup charged, for `--trace`.
#[inline(always)]
fn try_batch_charge(counter: u64, nr_pages: u64, slot: u32) -> Result<(), KernelError> {
    let cfg = CONFIG.get(0).ok_or(KernelError::NoConfig)?;
    // Set with the offsets below when userspace arms the programs, and never cleared.
    if cfg.flags & FLAG_BATCH == 0 {
        return Ok(());
    }
    // The counter lives inside a mem_cgroup only if that memcg's cgroup points back at it
    // as its memory css; a hugetlb or swap counter fails this (one pointer compare).
    let memcg = counter.wrapping_sub(cfg.memcg_memory_off as u64);
    let cgroup = read_u64(memcg + cfg.memcg_cgroup_off as u64);
    let memory = cgroup.and_then(|cg| {
        Ok(read_u64(cg + cfg.cgroup_memory_css_off as u64)? == memcg + cfg.memcg_css_off as u64)
    });
    // Every memory charge, at whatever depth and whether or not it reaches the watched
    // cgroup: a pod's bound grows with all of them. A counter not told apart counts too.
    if !matches!(memory, Ok(false)) {
        count_charged(slot, nr_pages);
    }
    let cgroup = cgroup?;
    if !memory? {
        return Ok(());
    }
    let charged_id = cgroup_id(cfg, cgroup)?;
    let mut c = counter;
    let mut id = charged_id;
    for _ in 0..BATCH_MAX_DEPTH {
        if id == cfg.batch_watch_id {
            return watched_counter_charged(cfg, c, charged_id, nr_pages);
        }
        c = read_u64(c + cfg.counter_parent_off as u64)?;
        if c == 0 {
            return Ok(());
        }
        id = memcg_cgroup_id(cfg, c.wrapping_sub(cfg.memcg_memory_off as u64))?;
    }
    Ok(())
}

#[inline(always)]
fn watched_counter_charged(
    cfg: &KernelConfig,
    counter: u64,
    charged_id: u64,
    nr_pages: u64,
) -> Result<(), KernelError> {
    let usage = read_u64(counter + cfg.counter_usage_off as u64)? as i64;
    let st = BATCH_STATE.get_ptr_mut(0).ok_or(KernelError::NoCpuState)?;
    // SAFETY: a map value; concurrent CPUs can only cause an extra or a late-by-one-batch
    // wake (see BatchState).
    let st = unsafe { &mut *st };
    if st.generation != cfg.generation {
        // The usage before this charge: the batch that starts a generation counts too, so
        // the wake comes with the batch that reaches the watermark, not the one after it.
        // (A failed try_charge gave its pages back: an early wake at worst.)
        st.generation = cfg.generation;
        st.baseline_pages = usage - nr_pages as i64;
    }
    bump(COUNTER_CHARGE_MATCHED);
    let grown = usage - st.baseline_pages;
    if grown < cfg.batch_watermark_pages {
        return Ok(());
    }
    st.baseline_pages = usage;
    emit_charge(charged_id, grown << cfg.page_shift);
    Ok(())
}

/// cgroup->kn->id.
#[inline(always)]
fn cgroup_id(cfg: &KernelConfig, cgroup: u64) -> Result<u64, KernelError> {
    let kn = read_u64(cgroup + cfg.cgroup_kn_off as u64)?;
    read_u64(kn + cfg.kn_id_off as u64)
}

/// One kernel word; every pointer evictd follows is read this way (a failed read is counted
/// as a `memcg-id-read` error).
#[inline(always)]
fn read_u64(addr: u64) -> Result<u64, KernelError> {
    // SAFETY: bpf_probe_read_kernel checks the address; a bad one is an error.
    unsafe { bpf_probe_read_kernel(addr as *const u64) }.map_err(|_| KernelError::MemcgIdRead)
}

#[inline(always)]
fn try_reclaim(ctx: &TracePointContext, cause: u32) -> Result<(), KernelError> {
    let cfg = CONFIG.get(0).ok_or(KernelError::NoConfig)?;
    if cfg.flags & FLAG_RECLAIM == 0 {
        return Ok(());
    }
    let st = CPU_STATE.get_ptr_mut(0).ok_or(KernelError::NoCpuState)?;
    // SAFETY: per-CPU slot, see try_memcg_stat.
    let st = unsafe { &mut *st };
    // SAFETY: helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // Under pressure reclaim starts thousands of times a second; one wake per interval
    // per CPU is all userspace needs.
    if within_interval(now, st.last_reclaim_ns, cfg.min_interval_ns) {
        bump(COUNTER_RATE_LIMITED);
        return Ok(());
    }
    // Stamped whether or not the event finds room: while the ring is full every CPU would
    // otherwise take its lock on every reclaim, and userspace learns of the loss anyway.
    st.last_reclaim_ns = now;
    // The offset moves between kernels and a tracepoint program may only load from its
    // context at constant offsets, so the record is read through the helper; reclaim events
    // are rate-limited, the call is cheap here.
    // SAFETY: bpf_probe_read_kernel checks the address; userspace found `order` (4 bytes)
    // at this offset in this kernel's format file before attaching.
    let order: i32 = unsafe {
        bpf_probe_read_kernel(ctx.as_ptr().cast::<u8>().add(cfg.reclaim_order_off as usize).cast::<i32>())
    }
    .unwrap_or(0);
    let pages = 1i64 << (order & 31);
    // SAFETY: helper with no preconditions.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    emit(cause, cgroup, CGROUP_KIND_DEFAULT, pages << cfg.page_shift, current_tgid());
    Ok(())
}

#[inline(always)]
fn try_oom(ctx: &TracePointContext) -> Result<(), KernelError> {
    let cfg = CONFIG.get(0).ok_or(KernelError::NoConfig)?;
    if cfg.flags & FLAG_OOM == 0 {
        return Ok(());
    }
    let st = CPU_STATE.get_ptr_mut(0).ok_or(KernelError::NoCpuState)?;
    // SAFETY: per-CPU slot, see try_memcg_stat.
    let st = unsafe { &mut *st };
    // SAFETY: helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if within_interval(now, st.last_oom_ns, cfg.min_interval_ns) {
        bump(COUNTER_RATE_LIMITED);
        return Ok(());
    }
    st.last_oom_ns = now;
    let pid: i32 = field(ctx, OOM_PID);
    let anon: u64 = field(ctx, OOM_ANON_RSS);
    let file: u64 = field(ctx, OOM_FILE_RSS);
    let shmem: u64 = field(ctx, OOM_SHMEM_RSS);
    let rss_bytes = (anon + file + shmem) << 10;
    // The victim is marked from the allocating task's context, so the current cgroup is
    // the one that ran out; userspace resolves the victim's memcg from its pid.
    // SAFETY: helper with no preconditions.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    emit(CAUSE_OOM_KILL, cgroup, CGROUP_KIND_DEFAULT, rss_bytes as i64, pid as u32);
    Ok(())
}

/// Whether the last event (at `last` ns, 0: none yet) was less than `interval` ago. None yet
/// is never within it: a machine up for less than the interval still gets its first event.
#[inline(always)]
fn within_interval(now: u64, last: u64, interval: u64) -> bool {
    last != 0 && now.wrapping_sub(last) < interval
}

#[inline(always)]
fn current_tgid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

/// A charge event, unless the ring buffer is more than half full: then the unread events
/// already say "look", and the other half is kept for reclaim and OOM-kill events, which
/// tell userspace the kernel is acting (they raise the urgency of a stop under way) and
/// which nothing else reports.
#[inline(always)]
fn emit_charge(cgroup_id: u64, amount_bytes: i64) {
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) > EVENTS.query(BPF_RB_RING_SIZE as u64) / 2 {
        bump(COUNTER_CHARGE_YIELDED);
        return;
    }
    emit(CAUSE_CHARGE, cgroup_id, CGROUP_KIND_MEMCG, amount_bytes, current_tgid());
}

/// One event into the ring buffer. A full ring loses it, counted by cause: userspace learns
/// of lost reclaim and OOM-kill events from the count (`RingLosses`).
#[inline(always)]
fn emit(cause: u32, cgroup_id: u64, cgroup_kind: u32, amount_bytes: i64, pid: u32) {
    let Some(mut entry) = EVENTS.reserve::<WakeEvent>(0) else {
        bump(COUNTER_DROPS_BASE + cause);
        return;
    };
    entry.write(WakeEvent {
        // SAFETY: helpers with no preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        cgroup_id,
        amount_bytes,
        pid,
        cause,
        // SAFETY: as above.
        cpu: unsafe { bpf_get_smp_processor_id() },
        cgroup_kind,
    });
    entry.submit(0);
    bump(COUNTER_EMITTED_BASE + cause);
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects programs that can reach a panic; this is never called.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
