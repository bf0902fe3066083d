//! Loads evictd's eBPF programs, attaches each to its tracepoint, and keeps the kernel-side
//! configuration (charge items, watermark, scope) current. A program that cannot attach is
//! reported and skipped; only when none attaches is the eBPF wake source unavailable. The
//! charge programs (the memcg stat raw tracepoints, hit twice per page) can be detached and
//! attached again while loaded: far from every threshold, the wake source detaches them,
//! because even a program that returns at once costs page faults ~8 %.

use std::{
    collections::HashSet,
    path::PathBuf,
    sync::{
        Arc, Mutex, MutexGuard, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
};
pub use evictd_common::tracepoints::{TRACEPOINTS, TracepointSpec};
use evictd_common::{
    CAUSE_COUNT, CAUSE_DIRECT_RECLAIM, CAUSE_MEMCG_RECLAIM, CAUSE_OOM_KILL, COUNTER_CHARGE_MATCHED,
    COUNTER_CHARGE_YIELDED, COUNTER_DROPS_BASE, COUNTER_EMITTED_BASE, COUNTER_ERRORS_BASE,
    COUNTER_RATE_LIMITED, ChargeItems, FLAG_BATCH, FLAG_CHARGE, FLAG_OOM, FLAG_RECLAIM, FLAG_SCOPE,
    KERNEL_ERROR_COUNT, KernelConfig, NODE_SUM_SLOTS,
    names::{
        GLOBAL_BOUND_ITEMS, GLOBAL_CHARGE_ITEMS, MAP_CONFIG, MAP_COUNTERS, MAP_EVENTS, MAP_NODE_SUM,
        MAP_SCOPE,
    },
    tracepoints::BATCH_PROGRAMS,
};

mod attach;
mod clock;
pub mod mover;

use attach::{Attached, ChargeLink, charge_err, charge_program};
pub use clock::{ChargeClock, ChargeMark};

use crate::{
    kernel::{
        btf::{BtfError, KernelBtf},
        stat_items::{self, StatItem, StatItemError},
        tracefs::{self, TracefsError},
    },
    vocab::ChargeTier,
};

/// The object built from `evictd-ebpf` by build.rs.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/evictd-ebpf"));

#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    #[error(transparent)]
    StatItems(#[from] StatItemError),
    #[error(transparent)]
    Btf(#[from] BtfError),
    #[error("loading evictd's eBPF object failed: {0} (evictd needs root, or CAP_BPF with CAP_PERFMON)")]
    Load(#[source] aya::EbpfError),
    #[error("BPF map {name}: {source}")]
    Map { name: &'static str, source: aya::maps::MapError },
    #[error("BPF map {0} is missing from the eBPF object (build mismatch)")]
    MissingMap(&'static str),
    #[error("eBPF program {0} is missing from the eBPF object (build mismatch)")]
    MissingProgram(&'static str),
    #[error("counting CPUs: {0}")]
    Cpus(String),
    #[error("no eBPF program could be attached: {0}")]
    NothingAttached(String),
    #[error("{what} the charge program {program}: {source}")]
    Charge { what: &'static str, program: &'static str, source: aya::programs::ProgramError },
    #[error("--charge-tier {tier}: this kernel cannot attach it: {why}")]
    TierUnavailable { tier: ChargeTier, why: String },
}

/// Whether the batched charge hook is tried: always, unless `--charge-tier` insists on the
/// memcg tracepoints (which the hook would replace).
pub fn tries_batch_hook(forced: Option<ChargeTier>) -> bool {
    forced != Some(ChargeTier::MemcgTracepoints)
}

/// The charge tier that wakes evictd, given what attached: the fastest, or the one
/// `--charge-tier` insists on (`Err` names it when it did not attach: falling back would
/// hide what was asked for). Pure, so that the choice is tested without a kernel.
pub fn charge_tier_of(
    forced: Option<ChargeTier>,
    batch_hook: bool,
    memcg_tracepoints: bool,
) -> Result<ChargeTier, ChargeTier> {
    let attached = |t| match t {
        ChargeTier::BatchedChargeHook => batch_hook,
        ChargeTier::MemcgTracepoints => memcg_tracepoints,
        ChargeTier::AdaptivePoll => true,
    };
    match forced {
        Some(t) if attached(t) => Ok(t),
        Some(t) => Err(t),
        None => Ok(ChargeTier::ALL.into_iter().find(|t| attached(*t)).unwrap_or(ChargeTier::AdaptivePoll)),
    }
}

/// Where one program stands after loading.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProgramStatus {
    /// `group:name` (with ` (raw)` for a raw tracepoint), or `fexit <function>`.
    pub tracepoint: String,
    /// `None` when attached; otherwise why not.
    pub error: Option<String>,
}

impl ProgramStatus {
    fn of_tracepoint(tp: &TracepointSpec, error: Option<String>) -> Self {
        let kind = if tp.raw { " (raw)" } else { "" };
        ProgramStatus { tracepoint: format!("{}:{}{kind}", tp.group, tp.name), error }
    }

    fn of_fexit(function: &str, error: Option<String>) -> Self {
        ProgramStatus { tracepoint: format!("fexit {function}"), error }
    }

    /// A program of the batched charge hook.
    pub fn is_batch_hook(&self) -> bool {
        self.tracepoint.starts_with("fexit ")
    }

    /// A program on a memcg stat tracepoint (the per-page charge tier).
    pub fn is_memcg_stat(&self) -> bool {
        self.tracepoint.starts_with("memcg:")
    }

    /// `<program>: <why not attached>`, for the reports that name every reason.
    pub fn reason(&self) -> String {
        format!("{}: {}", self.tracepoint, self.error.as_deref().unwrap_or("attached"))
    }
}

pub struct LoadOptions {
    pub btf_path: PathBuf,
    /// Stat item names that count as charge.
    pub charge_items: Vec<String>,
    /// Ring buffer size: a power of two, a multiple of the page size.
    pub ring_buffer_bytes: u32,
    /// Minimum gap between two reclaim or OOM events on one CPU.
    pub min_interval: Duration,
    /// The eBPF charge tier `--charge-tier` insists on; `None`: the fastest this kernel
    /// allows. Insisting lets the other tier be used (and tested) where both exist.
    pub charge_tier: Option<ChargeTier>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            btf_path: stat_items::VMLINUX_BTF.into(),
            charge_items: stat_items::DEFAULT_CHARGE_ITEMS.iter().map(|s| s.to_string()).collect(),
            ring_buffer_bytes: DEFAULT_RING_BUFFER_BYTES,
            min_interval: Duration::from_millis(10),
            charge_tier: None,
        }
    }
}

/// The wake ring buffer's size unless `--ring-buffer-size` says otherwise: ~1300 events.
/// A charge event is only a reason to look, and the kernel side holds them back while the
/// ring is more than half full (the unread half says "look" already); the other half is
/// for reclaim and OOM-kill events, at most one per CPU and `--reclaim-min-interval` each,
/// and one lost anyway is taken as the kernel acting in the node (`RingLosses`). Its pages
/// are mapped into evictd twice (the ring wraps through a second mapping), so they count
/// twice in evictd's resident memory: 256 KiB cost ~0.5 MiB of it.
pub const DEFAULT_RING_BUFFER_BYTES: u32 = 64 * 1024;

/// Per-CPU counters summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    /// Charge-path events that counted toward the watermark (memory stat changes of the
    /// counted items in the node, frees included; the batched hook's charges of the node).
    pub charge_matched: u64,
    /// Charge events held back while the ring buffer was more than half full.
    pub charge_yielded: u64,
    /// Events lost to a full ring buffer, all causes (`dropped` by cause).
    pub ring_drops: u64,
    pub rate_limited: u64,
    /// By `CAUSE_*` index.
    pub emitted: [u64; CAUSE_COUNT],
    /// Events lost to a full ring buffer, by `CAUSE_*` index.
    pub dropped: [u64; CAUSE_COUNT],
    /// Kernel-side failures, by `KernelError` index (no-config, no-cpu-state, memcg-id-read, no-node-sum).
    pub errors: [u64; KERNEL_ERROR_COUNT],
}

/// The per-CPU counters map, shared by the probes (`counters`) and the ring's reader
/// (`RingLosses`).
type CounterMap = Arc<PerCpuArray<MapData, u64>>;

/// A counter summed over CPUs.
fn sum_counter(map: &PerCpuArray<MapData, u64>, i: u32) -> Result<u64, EbpfError> {
    Ok(map.get(&i, 0).map_err(map_err(MAP_COUNTERS))?.iter().sum())
}

/// The wake stream: the ring buffer, and the kernel's counts of the events a full ring lost.
pub struct WakeRing {
    pub ring: RingBuf<MapData>,
    pub losses: RingLosses,
}

/// The kernel's counts of events lost to a full ring buffer, as the reader last looked. A
/// lost reclaim or OOM-kill event is the loss that matters: nothing else tells userspace
/// that the kernel is acting. A loss needs nearly a whole ring unread, all of which the
/// reader then drains: so it looks once it has drained half a ring's bytes since it last
/// looked (`drained`), which no loss can slip past, and an ordinary wake reads no map (the
/// look reads three per-CPU counters, aya allocating for each, on the daemon's thread).
pub struct RingLosses {
    counters: CounterMap,
    ring_bytes: usize,
    drained: usize,
    seen: [u64; CAUSE_COUNT],
    /// Causes with losses not yet reported to the daemon (`CAUSE_*` index).
    unreported: [bool; CAUSE_COUNT],
}

impl RingLosses {
    /// The causes whose losses the reader reports: the kernel acting. A lost charge event
    /// needs half a ring of unread events, which said "look" already.
    pub const REPORTED: [u32; 3] = [CAUSE_DIRECT_RECLAIM, CAUSE_MEMCG_RECLAIM, CAUSE_OOM_KILL];

    /// Notes `bytes` more drained; past half a ring since the last look, looks at the
    /// counts again. `Err` when they cannot be read (looked at again after the next drain).
    pub fn after_drain(&mut self, bytes: usize) -> Result<(), EbpfError> {
        self.drained += bytes;
        if self.drained < self.ring_bytes / 2 {
            return Ok(());
        }
        for cause in Self::REPORTED {
            let now = sum_counter(&self.counters, COUNTER_DROPS_BASE + cause)?;
            let slot = cause as usize;
            self.unreported[slot] |= now > self.seen[slot];
            self.seen[slot] = now;
        }
        self.drained = 0;
        Ok(())
    }

    /// Whether `cause` (`CAUSE_*`) has losses not reported yet.
    pub fn unreported(&self, cause: u32) -> bool {
        self.unreported.get(cause as usize).copied().unwrap_or(false)
    }

    /// The daemon has been told of `cause`'s losses.
    pub fn reported(&mut self, cause: u32) {
        if let Some(slot) = self.unreported.get_mut(cause as usize) {
            *slot = false;
        }
    }
}

pub struct KernelProbes {
    /// The maps a pass writes, taken out of the object: a pass never waits on `charge`.
    config_map: Array<MapData, KernelConfig>,
    node_sum: Array<MapData, i64>,
    scope_map: HashMap<MapData, u64, u8>,
    counters: CounterMap,
    config: KernelConfig,
    page_size: u64,
    ncpus: u64,
    scope: HashSet<u64>,
    /// The programs, with the charge programs' links; shared, weakly, with the tasks that
    /// attach and detach them (`charge_switch`).
    charge: Arc<ChargePrograms>,
    /// Some charge program attached at load.
    has_charge: bool,
    /// The batched charge hook is attached (it then replaces the memcg stat tracepoints).
    batch: bool,
    pub programs: Vec<ProgramStatus>,
    pub items: Vec<StatItem>,
    /// The charge count's state (`charge_clock`).
    clock: Arc<clock::ClockState>,
}

/// The programs that count charge, by a descriptor of their own (their skipped runs are
/// read while the mover may hold the object): the stat tracepoints' or the batched hook's.
/// `None` when one of the tier did not attach (a charge through it would go uncounted) or
/// has no descriptor: the count is then never trusted for bounds.
fn counting_program_fds(
    ebpf: &mut Ebpf,
    charge: &[ChargeLink],
    programs: &[ProgramStatus],
    batch: bool,
) -> Option<Vec<aya::programs::ProgramFd>> {
    let names: Vec<&'static str> = if batch {
        let attached = |name: &str| programs.contains(&ProgramStatus::of_fexit(name, None));
        if !BATCH_PROGRAMS.iter().all(|name| attached(name)) {
            return None;
        }
        BATCH_PROGRAMS.to_vec()
    } else {
        // The charge links are those that attached at load.
        if charge.len() != TRACEPOINTS.iter().filter(|tp| tp.raw).count() {
            return None;
        }
        charge.iter().map(|c| c.spec.program).collect()
    };
    if names.is_empty() {
        return None;
    }
    let fds = names.iter().map(|name| {
        let fd = ebpf.program(name)?.fd().ok()?.try_clone();
        fd.inspect_err(|e| tracing::debug!(program = name, "no descriptor of its own: {e}")).ok()
    });
    fds.collect()
}

fn map_err(name: &'static str) -> impl FnOnce(aya::maps::MapError) -> EbpfError {
    move |source| EbpfError::Map { name, source }
}

impl KernelProbes {
    /// Loads and attaches everything that this kernel allows. The returned ring buffer is
    /// the wake stream; events flow once `rearm` has been called.
    pub fn load(opts: &LoadOptions) -> Result<(Self, WakeRing), EbpfError> {
        let tracefs = tracefs::ensure_mounted()?;
        // One BTF read serves the stat items, the raw tracepoint checks and the offsets.
        let btf = KernelBtf::open(&opts.btf_path)?;
        let all_items = stat_items::kernel_items(&btf)?;
        let items = stat_items::select(&all_items, &opts.charge_items)?;
        let mut mask = ChargeItems::default();
        for item in &items {
            mask.select_item(item.value);
        }
        let mut bound_mask = mask;
        for item in stat_items::present(&all_items, stat_items::BOUND_ITEMS) {
            bound_mask.select_item(item.value);
        }
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(MAP_EVENTS, opts.ring_buffer_bytes)
            .override_global(GLOBAL_CHARGE_ITEMS, &mask, true)
            .override_global(GLOBAL_BOUND_ITEMS, &bound_mask, true)
            .load(EBPF_OBJECT)
            .map_err(EbpfError::Load)?;

        let id_path = btf.memcg_id_path()?;
        let Attached { programs, charge, batch, reclaim_order_off } =
            attach::attach_all(&mut ebpf, &tracefs, &btf, opts.charge_tier)?;

        let ring = RingBuf::try_from(take_map(&mut ebpf, MAP_EVENTS)?).map_err(map_err(MAP_EVENTS))?;
        let counters = Arc::new(
            PerCpuArray::try_from(take_map(&mut ebpf, MAP_COUNTERS)?).map_err(map_err(MAP_COUNTERS))?,
        );
        let config_map = Array::try_from(take_map(&mut ebpf, MAP_CONFIG)?).map_err(map_err(MAP_CONFIG))?;
        let node_sum = Array::try_from(take_map(&mut ebpf, MAP_NODE_SUM)?).map_err(map_err(MAP_NODE_SUM))?;
        let scope_map = HashMap::try_from(take_map(&mut ebpf, MAP_SCOPE)?).map_err(map_err(MAP_SCOPE))?;
        let losses = RingLosses {
            counters: counters.clone(),
            ring_bytes: opts.ring_buffer_bytes as usize,
            drained: 0,
            seen: [0; CAUSE_COUNT],
            unreported: [false; CAUSE_COUNT],
        };
        let page_size = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .filter(|p| *p > 0)
            .unwrap_or(4096) as u64;
        let ncpus = aya::util::nr_cpus().map_err(|(what, e)| EbpfError::Cpus(format!("{what}: {e}")))? as u64;

        let mut config = KernelConfig {
            min_interval_ns: opts.min_interval.as_nanos() as u64,
            page_shift: page_size.trailing_zeros(),
            memcg_cgroup_off: id_path.memcg_cgroup_off,
            cgroup_kn_off: id_path.cgroup_kn_off,
            kn_id_off: id_path.kn_id_off,
            reclaim_order_off: reclaim_order_off.unwrap_or_default(),
            ..Default::default()
        };
        if let Some(b) = batch {
            config.memcg_css_off = b.memcg_css_off;
            config.memcg_memory_off = b.memcg_memory_off;
            config.counter_usage_off = b.counter_usage_off;
            config.counter_parent_off = b.counter_parent_off;
            config.cgroup_memory_css_off = b.cgroup_memory_css_off;
        }
        let has_charge = !charge.is_empty();
        let counting_programs = counting_program_fds(&mut ebpf, &charge, &programs, batch.is_some());
        let clock = Arc::new(clock::ClockState::new(counters.clone(), counting_programs));
        let charge = Arc::new(ChargePrograms {
            attached: AtomicBool::new(has_charge),
            complete: AtomicBool::new(true),
            clock: clock.clone(),
            loaded: Mutex::new(Loaded { ebpf, links: charge }),
        });
        let probes = KernelProbes {
            config_map,
            node_sum,
            scope_map,
            counters,
            config,
            page_size,
            ncpus: ncpus.max(1),
            scope: HashSet::new(),
            charge,
            has_charge,
            batch: batch.is_some(),
            programs,
            items,
            clock,
        };
        Ok((probes, WakeRing { ring, losses }))
    }

    /// Starts a new measurement of charge growth from "now" and asks for a wake once the
    /// node may have grown by `watermark_bytes` (0: on every charge event, a page or a huge
    /// page). Also turns events on.
    pub fn rearm(&mut self, watermark_bytes: u64) -> Result<(), EbpfError> {
        let pages = watermark_bytes / self.page_size;
        let split = ChargeSplit::of(pages, self.ncpus, self.page_size);
        self.config.flush_pages = split.flush_pages;
        self.config.wake_pages = split.wake_pages;
        // The hook compares one counter's usage, the whole node's: no division by CPUs.
        self.config.batch_watermark_pages = pages as i64;
        let generation = self.config.generation.wrapping_add(1);
        self.zero_node_sum(generation)?;
        self.config.generation = generation;
        self.config.flags |= FLAG_CHARGE | FLAG_RECLAIM | FLAG_OOM;
        if self.batch {
            self.config.flags |= FLAG_BATCH;
        }
        self.write_config()?;
        // The batched hook counts from the config just written.
        self.clock.armed();
        Ok(())
    }

    /// The charge tier these programs give (the adaptive poll when neither attached).
    pub fn charge_tier(&self) -> ChargeTier {
        charge_tier_of(None, self.batch, self.has_charge_programs()).unwrap_or(ChargeTier::AdaptivePoll)
    }

    /// Whether the batched charge hook is attached (kernels with BPF trampolines).
    pub fn has_batch_hook(&self) -> bool {
        self.batch
    }

    /// The cgroup (by id, its directory's inode) whose memory the batched hook watches: the
    /// node's root, or the cgroup playing the node.
    pub fn watch(&mut self, cgroup_id: u64) -> Result<(), EbpfError> {
        self.config.batch_watch_id = cgroup_id;
        self.write_config()
    }

    /// The node's charge count, for bounding pods' growth between two reads
    /// (`ChargeClock::now`, `ChargeClock::grown_since`).
    pub fn charge_clock(&self) -> ChargeClock {
        ChargeClock::new(&self.clock, self.page_size, self.ncpus)
    }

    /// Whether any charge program attached at load (kernels without the memcg stat
    /// tracepoints have none).
    pub fn has_charge_programs(&self) -> bool {
        self.has_charge
    }

    /// Whether any charge program is attached now. Never waits for an attach under way.
    pub fn charge_attached(&self) -> bool {
        self.charge.attached.load(Ordering::Acquire)
    }

    /// Whether every charge program is attached now (an attach may have failed for some).
    pub fn charge_complete(&self) -> bool {
        self.charge.complete.load(Ordering::Acquire)
    }

    /// A handle that attaches and detaches the charge programs from another thread (the
    /// mover's, the act step's), for as long as these probes live.
    pub fn charge_switch(&self) -> ChargeSwitch {
        ChargeSwitch(Arc::downgrade(&self.charge))
    }

    /// Counts charge only in these memory cgroups (`None`: everywhere, i.e. the whole node).
    pub fn set_scope(&mut self, ids: Option<&[u64]>) -> Result<(), EbpfError> {
        let map = &mut self.scope_map;
        let wanted: HashSet<u64> = ids.unwrap_or_default().iter().copied().collect();
        for stale in self.scope.difference(&wanted) {
            // A cgroup that vanished may already be gone from the map: not an error.
            let _ = map.remove(stale);
        }
        for new in wanted.difference(&self.scope) {
            map.insert(new, 1, 0).map_err(map_err(MAP_SCOPE))?;
        }
        self.scope = wanted;
        if ids.is_some() {
            self.config.flags |= FLAG_SCOPE;
        } else {
            self.config.flags &= !FLAG_SCOPE;
        }
        self.write_config()
    }

    pub fn counters(&self) -> Result<Counters, EbpfError> {
        let sum = |i: u32| sum_counter(&self.counters, i);
        let mut c = Counters {
            charge_matched: sum(COUNTER_CHARGE_MATCHED)?,
            charge_yielded: sum(COUNTER_CHARGE_YIELDED)?,
            rate_limited: sum(COUNTER_RATE_LIMITED)?,
            ..Default::default()
        };
        for (cause, slot) in c.emitted.iter_mut().enumerate() {
            *slot = sum(COUNTER_EMITTED_BASE + cause as u32)?;
        }
        for (cause, slot) in c.dropped.iter_mut().enumerate() {
            *slot = sum(COUNTER_DROPS_BASE + cause as u32)?;
        }
        c.ring_drops = c.dropped.iter().sum();
        for (error, slot) in c.errors.iter_mut().enumerate() {
            *slot = sum(COUNTER_ERRORS_BASE + error as u32)?;
        }
        Ok(c)
    }

    /// Zeroes the node's sum that `generation` will add to. The programs add to the slots of
    /// older generations until the config names this one.
    fn zero_node_sum(&mut self, generation: u64) -> Result<(), EbpfError> {
        self.node_sum
            .set((generation % u64::from(NODE_SUM_SLOTS)) as u32, 0, 0)
            .map_err(map_err(MAP_NODE_SUM))
    }

    fn write_config(&mut self) -> Result<(), EbpfError> {
        self.config_map.set(0, self.config, 0).map_err(map_err(MAP_CONFIG))
    }
}

/// The loaded object and the charge programs' links. Dropping it takes every program off
/// the kernel.
struct Loaded {
    ebpf: Ebpf,
    links: Vec<ChargeLink>,
}

/// The charge programs, attached and detached by whichever task holds `loaded` (the
/// mover's thread, `mover`); `attached` and `complete` say where they are without waiting
/// for it.
struct ChargePrograms {
    loaded: Mutex<Loaded>,
    /// Some charge program is attached.
    attached: AtomicBool,
    /// Every charge program is attached.
    complete: AtomicBool,
    /// The charge count's state: a detach begins a new epoch of it.
    clock: Arc<clock::ClockState>,
}

impl ChargePrograms {
    /// Attaches every detached program, each tried whatever the others did; returns how
    /// many it attached, or the first failure.
    fn attach(&self) -> Result<usize, EbpfError> {
        let mut loaded = lock(&self.loaded);
        let Loaded { ebpf, links } = &mut *loaded;
        let (mut attached, mut failed) = (0, None);
        for c in links.iter_mut().filter(|c| c.link.is_none()) {
            match attach_one(ebpf, c) {
                Ok(()) => attached += 1,
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        self.attached.store(links.iter().any(|c| c.link.is_some()), Ordering::Release);
        let complete = links.iter().all(|c| c.link.is_some());
        self.complete.store(complete, Ordering::Release);
        if !links.is_empty() {
            self.clock.attached(complete);
        }
        failed.map_or(Ok(attached), Err)
    }

    /// Detaches every attached program; returns how many were attached.
    fn detach(&self) -> usize {
        let mut loaded = lock(&self.loaded);
        // Before the first program comes off: a charge uncounted from here on is in no
        // interval between two marks that compare.
        if !loaded.links.is_empty() {
            self.clock.detaching();
        }
        let n = loaded.links.iter_mut().filter_map(|c| c.link.take()).count();
        self.attached.store(false, Ordering::Release);
        self.complete.store(loaded.links.is_empty(), Ordering::Release);
        n
    }
}

fn attach_one(ebpf: &mut Ebpf, c: &mut ChargeLink) -> Result<(), EbpfError> {
    let prog = charge_program(ebpf, c.spec.program)?;
    let id = prog.attach(c.spec.name).map_err(charge_err("attaching", c.spec.program))?;
    c.link = Some(prog.take_link(id).map_err(charge_err("taking the link of", c.spec.program))?);
    Ok(())
}

/// The charge programs as the threads beside the daemon's hold them: the mover attaches
/// and detaches them (`mover`), and without a mover the act step detaches them while a
/// killed pod exits. Weak, so that a wake source that is dropped takes its programs off the
/// kernel with it (once a move under way ends).
#[derive(Clone)]
pub struct ChargeSwitch(Weak<ChargePrograms>);

impl ChargeSwitch {
    /// Detaches every attached charge program: how many were attached; `None` once the
    /// probes are gone.
    pub fn detach(&self) -> Option<usize> {
        self.0.upgrade().map(|c| c.detach())
    }

    /// Attaches every charge program that is detached: how many it attached; `None` once
    /// the probes are gone. Can take tens of milliseconds: right after a tracepoint lost its
    /// last program the kernel waits for an RCU grace period before it takes a new one.
    pub fn attach(&self) -> Option<Result<usize, EbpfError>> {
        self.0.upgrade().map(|c| c.attach())
    }

    /// The probes are gone.
    pub fn gone(&self) -> bool {
        self.0.strong_count() == 0
    }
}

/// The programs stay consistent whatever a panicking holder did: each is attached or not.
fn lock(loaded: &Mutex<Loaded>) -> MutexGuard<'_, Loaded> {
    loaded.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, EbpfError> {
    ebpf.take_map(name).ok_or(EbpfError::MissingMap(name))
}

/// The smallest flush of the stat tracepoints' tier, in bytes, unless the watermark is 0
/// (every charge event): 64 KiB, whatever the page size.
const MIN_FLUSH_BYTES: u64 = 64 << 10;

/// How finely the CPUs' sums are flushed into the node's: an eighth of a CPU's share of the
/// watermark. Finer costs more atomic adds on one shared cache line; coarser leaves less of
/// the watermark to absorb churn (what the CPUs hold back is not counted in the node's sum).
const FLUSHES_PER_SHARE: u64 = 8;

/// How the stat tracepoints' tier splits a watermark of `pages` between what each CPU keeps
/// to itself and what the node's sum must reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ChargeSplit {
    flush_pages: i64,
    wake_pages: i64,
}

impl ChargeSplit {
    /// The mark is the watermark less what the CPUs can hold back (a flush less a page each),
    /// so a wake comes once the node's counted growth reaches the watermark. Memory charged
    /// and freed again cancels in the node's sum whichever CPUs did it, so a churn of mappings
    /// up to about the mark less a flush wakes nothing. On a host with hundreds of CPUs a
    /// small watermark would divide to no pages and every page charged would be a flush: the
    /// flush has a floor (`MIN_FLUSH_BYTES`), and the mark keeps half the watermark at least,
    /// so that churn still cancels. Where the CPUs could hold back more than half (a watermark
    /// under twice the floor a CPU: near a threshold on any node, everywhere under 32 MiB on
    /// 256 CPUs), a wake may then come up to what they hold back past half the watermark; the
    /// per-CPU shares before the node's sum were late by as much.
    fn of(pages: u64, ncpus: u64, page_size: u64) -> Self {
        if pages == 0 {
            return ChargeSplit { flush_pages: 0, wake_pages: 0 };
        }
        let ncpus = ncpus.max(1);
        let floor = (MIN_FLUSH_BYTES / page_size.max(1)).max(1);
        let flush = (pages / (ncpus * FLUSHES_PER_SHARE)).max(floor).min(pages);
        let held_back = (flush - 1).saturating_mul(ncpus);
        let wake = pages.saturating_sub(held_back).max(pages / 2).max(1);
        let pages = |p: u64| i64::try_from(p).unwrap_or(i64::MAX);
        ChargeSplit { flush_pages: pages(flush), wake_pages: pages(wake) }
    }

    /// The most the node's counted growth can reach without a wake: the mark, less a page,
    /// and what every CPU holds back.
    #[cfg(test)]
    fn latest_wake(&self, ncpus: u64) -> i64 {
        self.wake_pages - 1 + (self.flush_pages - 1) * ncpus as i64
    }
}

#[cfg(test)]
mod tests {
    use evictd_common::{names::MAPS, tracepoints::BATCH_PROGRAMS};

    use super::*;

    #[test]
    fn the_fastest_tier_that_attached_wakes_evictd_unless_one_is_insisted_on() {
        use ChargeTier::*;
        assert_eq!(charge_tier_of(None, true, true), Ok(BatchedChargeHook));
        assert_eq!(charge_tier_of(None, false, true), Ok(MemcgTracepoints));
        assert_eq!(charge_tier_of(None, false, false), Ok(AdaptivePoll));
        assert_eq!(charge_tier_of(Some(MemcgTracepoints), false, true), Ok(MemcgTracepoints));
        assert_eq!(charge_tier_of(Some(MemcgTracepoints), true, false), Err(MemcgTracepoints));
        assert_eq!(charge_tier_of(Some(BatchedChargeHook), false, true), Err(BatchedChargeHook));
        assert!(!tries_batch_hook(Some(MemcgTracepoints)));
        assert!(tries_batch_hook(None) && tries_batch_hook(Some(BatchedChargeHook)));
    }

    #[test]
    fn a_wake_comes_by_the_watermark_and_a_many_cpu_host_keeps_a_floor() {
        const PAGE: u64 = 4096;
        let split = |pages, cpus, page| {
            let s = ChargeSplit::of(pages, cpus, page);
            (s.flush_pages, s.wake_pages)
        };
        // 8 MiB over 4 CPUs: flushes of 64 pages, and the mark is what 4 CPUs cannot hold
        // back (63 each).
        assert_eq!(split(2048, 4, PAGE), (64, 2048 - 4 * 63));
        // 1.5 MiB, 3 MiB from a threshold, on 2 CPUs: 96 KiB flushes, a 1 352 KiB mark.
        assert_eq!(split(384, 2, PAGE), (24, 338));
        // Over 512 CPUs the flush would be half a page: 64 KiB, and the mark keeps half.
        assert_eq!(split(2048, 512, PAGE), (16, 1024));
        assert_eq!(split(2048, 4096, PAGE), (16, 1024));
        assert_eq!(split(0, 4096, PAGE), (0, 0), "--bpf-watermark 0: every charge event");
        // A watermark below the flush floor is one flush.
        assert_eq!(split(8, 1, PAGE), (8, 4));
        // 64 KiB pages: the floor is one page, not 16 (1 MiB), and a CPU holds nothing back.
        assert_eq!(split(2048, 4096, 64 << 10), (1, 2048));
        assert_eq!(split(2048, 0, PAGE), (256, 1793));
        // Wherever the CPUs can hold back half the watermark or less, no wake comes later
        // than the node's growth by the watermark.
        for pages in [1, 2, 8, 16, 100, 256, 384, 2048, 1 << 20] {
            for cpus in [1, 2, 3, 4, 16, 64, 256, 4096] {
                let s = ChargeSplit::of(pages, cpus, PAGE);
                assert!(s.wake_pages >= 1 && s.flush_pages >= 1, "{pages} pages, {cpus} CPUs: {s:?}");
                if (s.flush_pages - 1) * cpus as i64 <= pages as i64 / 2 {
                    assert!(s.latest_wake(cpus) < pages as i64, "{pages} pages, {cpus} CPUs: {s:?}");
                }
            }
        }
    }

    /// The names both sides agree on (`evictd_common::names`, `tracepoints`) are the ones in
    /// the object that was built: no root needed to find a renamed map or program. (The
    /// `CHARGE_ITEMS` global is checked when loading: `override_global` must find it.)
    #[test]
    fn the_object_has_every_map_and_program_named_in_common() {
        let obj = aya_obj::Object::parse(EBPF_OBJECT).expect("the embedded eBPF object parses");
        for map in MAPS {
            assert!(obj.maps.contains_key(map), "map {map} missing; the object has {:?}", obj.maps.keys());
        }
        for tp in &TRACEPOINTS {
            assert!(obj.programs.contains_key(tp.program), "program {} missing", tp.program);
        }
        for p in BATCH_PROGRAMS {
            assert!(obj.programs.contains_key(p), "program {p} missing");
        }
    }
}
