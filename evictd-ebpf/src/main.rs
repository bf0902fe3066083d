//! evictd's kernel side. Per event the work is two loads, a mask test, an add and a compare; a ring-buffer
//! record goes out only when userspace must look (charge past the watermark, reclaim started,
//! the OOM killer acted). Field offsets below are those of the tracepoint formats in
//! /sys/kernel/tracing/events/...; userspace checks them against the running kernel's format
//! files before attaching, so a kernel with a different layout is refused, never misread.
// Host builds (`cargo build --workspace`, clippy) type-check the programs as an ordinary
// binary; only the bpfel-unknown-none build is loaded into the kernel.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

use aya_ebpf::{
    EbpfContext as _,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
    },
    macros::{map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use evictd_common::{
    CAUSE_CHARGE, CAUSE_DIRECT_RECLAIM, CAUSE_MEMCG_RECLAIM, CAUSE_OOM_KILL, CGROUP_KIND_DEFAULT,
    CGROUP_KIND_MEMCG, COUNTER_CHARGE_MATCHED, COUNTER_COUNT, COUNTER_EMITTED_BASE, COUNTER_MEMCG_HITS,
    COUNTER_RATE_LIMITED, COUNTER_RING_DROPS, FLAG_CHARGE, FLAG_OOM, FLAG_RECLAIM, FLAG_SCOPE, KernelConfig,
    WakeEvent,
};

/// Wake events to userspace. Userspace may resize it at load time.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

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
}

#[map]
static CPU_STATE: PerCpuArray<CpuState> = PerCpuArray::with_max_entries(1, 0);

// memcg:mod_memcg_state and memcg:mod_memcg_lruvec_state share this layout.
const MEMCG_ID_OFF: usize = 8; // u64 id (cgroup id of the memcg)
const MEMCG_ITEM_OFF: usize = 16; // int item
const MEMCG_VAL_OFF: usize = 20; // int val (pages)
// vmscan:mm_vmscan_{direct,memcg}_reclaim_begin
const RECLAIM_ORDER_OFF: usize = 8; // int order
// oom:mark_victim
const OOM_PID_OFF: usize = 8; // int pid
const OOM_ANON_RSS_OFF: usize = 24; // unsigned long, kB
const OOM_FILE_RSS_OFF: usize = 32; // unsigned long, kB
const OOM_SHMEM_RSS_OFF: usize = 40; // unsigned long, kB

#[tracepoint]
pub fn mod_memcg_lruvec_state(ctx: TracePointContext) -> u32 {
    on_memcg_stat(&ctx);
    0
}

#[tracepoint]
pub fn mod_memcg_state(ctx: TracePointContext) -> u32 {
    on_memcg_stat(&ctx);
    0
}

#[tracepoint]
pub fn direct_reclaim_begin(ctx: TracePointContext) -> u32 {
    on_reclaim(&ctx, CAUSE_DIRECT_RECLAIM);
    0
}

#[tracepoint]
pub fn memcg_reclaim_begin(ctx: TracePointContext) -> u32 {
    on_reclaim(&ctx, CAUSE_MEMCG_RECLAIM);
    0
}

#[tracepoint]
pub fn mark_victim(ctx: TracePointContext) -> u32 {
    on_oom(&ctx);
    0
}

#[inline(always)]
fn bump(counter: u32) {
    if let Some(c) = COUNTERS.get_ptr_mut(counter) {
        // SAFETY: per-CPU slot, only this CPU writes it while this program runs.
        unsafe { *c += 1 };
    }
}

/// A field of the tracepoint record, loaded directly: tracepoint programs may read their
/// context, and a plain load is far cheaper than a `bpf_probe_read` helper call, which
/// matters on a path that runs for every page charged and freed.
#[inline(always)]
fn field<T: Copy>(ctx: &TracePointContext, offset: usize) -> T {
    // SAFETY: offset and size match the record layout userspace checked against this
    // kernel's format file before attaching; the verifier bounds-checks the access.
    unsafe { core::ptr::read_unaligned(ctx.as_ptr().cast::<u8>().add(offset).cast::<T>()) }
}

#[inline(always)]
fn on_memcg_stat(ctx: &TracePointContext) {
    bump(COUNTER_MEMCG_HITS);
    let Some(cfg) = CONFIG.get(0) else { return };
    if cfg.flags & FLAG_CHARGE == 0 {
        return;
    }
    let item: i32 = field(ctx, MEMCG_ITEM_OFF);
    // Most stat updates are for items that do not count (dirty, writeback, mapped...):
    // reject them before any other work.
    if !cfg.counts_item(item) {
        return;
    }
    // Frees are skipped, so the sum is the gross charge since userspace last re-armed: it can
    // only reach the watermark earlier than the net growth would, never later. Skipping them
    // keeps a process's exit (one event per page freed) nearly free of probe cost.
    let val: i32 = field(ctx, MEMCG_VAL_OFF);
    if val <= 0 {
        return;
    }
    let id: u64 = field(ctx, MEMCG_ID_OFF);
    // SAFETY: map value read only, u8 is Copy.
    if cfg.flags & FLAG_SCOPE != 0 && unsafe { SCOPE.get(id) }.is_none() {
        return;
    }
    bump(COUNTER_CHARGE_MATCHED);
    let Some(st) = CPU_STATE.get_ptr_mut(0) else { return };
    // SAFETY: per-CPU slot; a tracepoint program is not re-entered on the same CPU.
    let st = unsafe { &mut *st };
    if st.generation != cfg.generation {
        st.generation = cfg.generation;
        st.charge_pages = 0;
    }
    st.charge_pages += val as i64;
    if st.charge_pages < cfg.watermark_pages_per_cpu {
        return;
    }
    let pages = st.charge_pages;
    st.charge_pages = 0;
    emit(CAUSE_CHARGE, id, CGROUP_KIND_MEMCG, pages << cfg.page_shift, current_tgid());
}

#[inline(always)]
fn on_reclaim(ctx: &TracePointContext, cause: u32) {
    let Some(cfg) = CONFIG.get(0) else { return };
    if cfg.flags & FLAG_RECLAIM == 0 {
        return;
    }
    let Some(st) = CPU_STATE.get_ptr_mut(0) else { return };
    // SAFETY: per-CPU slot, see on_memcg_stat.
    let st = unsafe { &mut *st };
    // SAFETY: helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // Under pressure reclaim starts thousands of times a second; one wake per interval
    // per CPU is all userspace needs.
    if now.wrapping_sub(st.last_reclaim_ns) < cfg.min_interval_ns {
        bump(COUNTER_RATE_LIMITED);
        return;
    }
    st.last_reclaim_ns = now;
    let order: i32 = field(ctx, RECLAIM_ORDER_OFF);
    let pages = 1i64 << (order & 31);
    // SAFETY: helper with no preconditions.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    emit(cause, cgroup, CGROUP_KIND_DEFAULT, pages << cfg.page_shift, current_tgid());
}

#[inline(always)]
fn on_oom(ctx: &TracePointContext) {
    let Some(cfg) = CONFIG.get(0) else { return };
    if cfg.flags & FLAG_OOM == 0 {
        return;
    }
    let Some(st) = CPU_STATE.get_ptr_mut(0) else { return };
    // SAFETY: per-CPU slot, see on_memcg_stat.
    let st = unsafe { &mut *st };
    // SAFETY: helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if now.wrapping_sub(st.last_oom_ns) < cfg.min_interval_ns {
        bump(COUNTER_RATE_LIMITED);
        return;
    }
    st.last_oom_ns = now;
    let pid: i32 = field(ctx, OOM_PID_OFF);
    let anon: u64 = field(ctx, OOM_ANON_RSS_OFF);
    let file: u64 = field(ctx, OOM_FILE_RSS_OFF);
    let shmem: u64 = field(ctx, OOM_SHMEM_RSS_OFF);
    let rss_bytes = (anon + file + shmem) << 10;
    // The victim is marked from the allocating task's context, so the current cgroup is
    // the one that ran out; userspace resolves the victim's memcg from its pid.
    // SAFETY: helper with no preconditions.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    emit(CAUSE_OOM_KILL, cgroup, CGROUP_KIND_DEFAULT, rss_bytes as i64, pid as u32);
}

#[inline(always)]
fn current_tgid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

#[inline(always)]
fn emit(cause: u32, cgroup_id: u64, cgroup_kind: u32, amount_bytes: i64, pid: u32) {
    let Some(mut entry) = EVENTS.reserve::<WakeEvent>(0) else {
        bump(COUNTER_RING_DROPS);
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
