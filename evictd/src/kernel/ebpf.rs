//! Loads evictd's eBPF programs, attaches each to its tracepoint, and keeps the kernel-side
//! configuration (charge items, watermark, scope) current. A program that cannot attach is
//! reported and skipped; only when none attaches is the eBPF wake source unavailable.

use std::{collections::HashSet, path::PathBuf, time::Duration};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{RawTracePoint, TracePoint},
};
use evictd_common::{
    CAUSE_COUNT, COUNTER_CHARGE_MATCHED, COUNTER_EMITTED_BASE, COUNTER_RATE_LIMITED, COUNTER_RING_DROPS,
    ChargeItems, FLAG_CHARGE, FLAG_OOM, FLAG_RECLAIM, FLAG_SCOPE, KernelConfig,
};

use crate::kernel::{
    btf::{BtfError, KernelBtf},
    stat_items::{self, StatItem, StatItemError},
    tracefs::{self, TracefsError},
};

/// The object built from `evictd-ebpf` by build.rs.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/evictd-ebpf"));

/// A program, its tracepoint, and the record layout it was compiled for.
pub struct TracepointSpec {
    pub program: &'static str,
    pub group: &'static str,
    pub name: &'static str,
    /// Raw tracepoint (prototype checked in BTF) rather than a classic one (record layout
    /// checked in the format file).
    pub raw: bool,
    pub fields: &'static [(&'static str, usize, usize)],
}

const RECLAIM_FIELDS: &[(&str, usize, usize)] = &[("order", 8, 4)];

pub const TRACEPOINTS: [TracepointSpec; 5] = [
    TracepointSpec {
        program: "mod_memcg_lruvec_state",
        group: "memcg",
        name: "mod_memcg_lruvec_state",
        raw: true,
        fields: &[],
    },
    TracepointSpec {
        program: "mod_memcg_state",
        group: "memcg",
        name: "mod_memcg_state",
        raw: true,
        fields: &[],
    },
    TracepointSpec {
        program: "direct_reclaim_begin",
        group: "vmscan",
        name: "mm_vmscan_direct_reclaim_begin",
        raw: false,
        fields: RECLAIM_FIELDS,
    },
    TracepointSpec {
        program: "memcg_reclaim_begin",
        group: "vmscan",
        name: "mm_vmscan_memcg_reclaim_begin",
        raw: false,
        fields: RECLAIM_FIELDS,
    },
    TracepointSpec {
        program: "mark_victim",
        group: "oom",
        name: "mark_victim",
        raw: false,
        fields: &[("pid", 8, 4), ("anon_rss", 24, 8), ("file_rss", 32, 8), ("shmem_rss", 40, 8)],
    },
];

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
    #[error("counting CPUs: {0}")]
    Cpus(String),
    #[error("no eBPF program could be attached: {0}")]
    NothingAttached(String),
}

/// Where one program stands after loading.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProgramStatus {
    pub tracepoint: String,
    /// `None` when attached; otherwise why not.
    pub error: Option<String>,
}

pub struct LoadOptions {
    pub btf_path: PathBuf,
    /// Stat item names that count as charge.
    pub charge_items: Vec<String>,
    /// Ring buffer size: a power of two, a multiple of the page size.
    pub ring_buffer_bytes: u32,
    /// Minimum gap between two reclaim or OOM events on one CPU.
    pub min_interval: Duration,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            btf_path: stat_items::VMLINUX_BTF.into(),
            charge_items: stat_items::DEFAULT_CHARGE_ITEMS.iter().map(|s| s.to_string()).collect(),
            ring_buffer_bytes: 256 * 1024,
            min_interval: Duration::from_millis(10),
        }
    }
}

/// Per-CPU counters summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    pub charge_matched: u64,
    pub ring_drops: u64,
    pub rate_limited: u64,
    /// By `CAUSE_*` index.
    pub emitted: [u64; CAUSE_COUNT],
}

pub struct KernelProbes {
    ebpf: Ebpf,
    config: KernelConfig,
    page_size: u64,
    ncpus: u64,
    scope: HashSet<u64>,
    pub programs: Vec<ProgramStatus>,
    pub items: Vec<StatItem>,
}

fn map_err(name: &'static str) -> impl FnOnce(aya::maps::MapError) -> EbpfError {
    move |source| EbpfError::Map { name, source }
}

impl KernelProbes {
    /// Loads and attaches everything that this kernel allows. The returned ring buffer is
    /// the wake stream; events flow once `rearm` has been called.
    pub fn load(opts: &LoadOptions) -> Result<(Self, RingBuf<MapData>), EbpfError> {
        let tracefs = tracefs::ensure_mounted()?;
        // One BTF read serves the stat items, the raw tracepoint checks and the offsets.
        let btf = KernelBtf::open(&opts.btf_path)?;
        let all_items = stat_items::kernel_items(&btf)?;
        let items = stat_items::select(&all_items, &opts.charge_items)?;
        let mut mask = ChargeItems::default();
        for item in &items {
            mask.select_item(item.value);
        }
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("EVENTS", opts.ring_buffer_bytes)
            .override_global("CHARGE_ITEMS", &mask, true)
            .load(EBPF_OBJECT)
            .map_err(EbpfError::Load)?;

        let id_path = btf.memcg_id_path()?;
        let mut programs = Vec::new();
        for tp in &TRACEPOINTS {
            let error = attach(&mut ebpf, &tracefs, &btf, tp).err();
            if let Some(e) = &error {
                tracing::warn!(tracepoint = %format!("{}:{}", tp.group, tp.name), "not attached: {e}");
            }
            let kind = if tp.raw { " (raw)" } else { "" };
            programs.push(ProgramStatus { tracepoint: format!("{}:{}{kind}", tp.group, tp.name), error });
        }
        if programs.iter().all(|p| p.error.is_some()) {
            let why: Vec<String> = programs
                .iter()
                .map(|p| format!("{}: {}", p.tracepoint, p.error.as_deref().unwrap_or("")))
                .collect();
            return Err(EbpfError::NothingAttached(why.join("; ")));
        }

        let ring = RingBuf::try_from(ebpf.take_map("EVENTS").ok_or(EbpfError::MissingMap("EVENTS"))?)
            .map_err(map_err("EVENTS"))?;
        let page_size = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .filter(|p| *p > 0)
            .unwrap_or(4096) as u64;
        let ncpus = aya::util::nr_cpus().map_err(|(what, e)| EbpfError::Cpus(format!("{what}: {e}")))? as u64;

        let config = KernelConfig {
            min_interval_ns: opts.min_interval.as_nanos() as u64,
            page_shift: page_size.trailing_zeros(),
            memcg_cgroup_off: id_path.memcg_cgroup_off,
            cgroup_kn_off: id_path.cgroup_kn_off,
            kn_id_off: id_path.kn_id_off,
            ..Default::default()
        };
        let probes = KernelProbes {
            ebpf,
            config,
            page_size,
            ncpus: ncpus.max(1),
            scope: HashSet::new(),
            programs,
            items,
        };
        Ok((probes, ring))
    }

    /// Starts a new measurement of charge growth from "now" and asks for a wake once the
    /// node may have grown by `watermark_bytes` (0: on every page). Also turns events on.
    pub fn rearm(&mut self, watermark_bytes: u64) -> Result<(), EbpfError> {
        let pages = watermark_bytes / self.page_size;
        self.config.watermark_pages_per_cpu = (pages / self.ncpus) as i64;
        self.config.generation = self.config.generation.wrapping_add(1);
        self.config.flags |= FLAG_CHARGE | FLAG_RECLAIM | FLAG_OOM;
        self.write_config()
    }

    /// Counts charge only in these memory cgroups (`None`: everywhere, i.e. the whole node).
    pub fn set_scope(&mut self, ids: Option<&[u64]>) -> Result<(), EbpfError> {
        let mut map: HashMap<_, u64, u8> =
            HashMap::try_from(self.ebpf.map_mut("SCOPE").ok_or(EbpfError::MissingMap("SCOPE"))?)
                .map_err(map_err("SCOPE"))?;
        let wanted: HashSet<u64> = ids.unwrap_or_default().iter().copied().collect();
        for stale in self.scope.difference(&wanted) {
            // A cgroup that vanished may already be gone from the map: not an error.
            let _ = map.remove(stale);
        }
        for new in wanted.difference(&self.scope) {
            map.insert(new, 1, 0).map_err(map_err("SCOPE"))?;
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
        let map: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map("COUNTERS").ok_or(EbpfError::MissingMap("COUNTERS"))?)
                .map_err(map_err("COUNTERS"))?;
        let sum = |i: u32| -> Result<u64, EbpfError> {
            Ok(map.get(&i, 0).map_err(map_err("COUNTERS"))?.iter().sum())
        };
        let mut c = Counters {
            charge_matched: sum(COUNTER_CHARGE_MATCHED)?,
            ring_drops: sum(COUNTER_RING_DROPS)?,
            rate_limited: sum(COUNTER_RATE_LIMITED)?,
            ..Default::default()
        };
        for (cause, slot) in c.emitted.iter_mut().enumerate() {
            *slot = sum(COUNTER_EMITTED_BASE + cause as u32)?;
        }
        Ok(c)
    }

    fn write_config(&mut self) -> Result<(), EbpfError> {
        let mut map: Array<_, KernelConfig> =
            Array::try_from(self.ebpf.map_mut("CONFIG").ok_or(EbpfError::MissingMap("CONFIG"))?)
                .map_err(map_err("CONFIG"))?;
        map.set(0, self.config, 0).map_err(map_err("CONFIG"))
    }
}

fn attach(
    ebpf: &mut Ebpf,
    tracefs: &std::path::Path,
    btf: &KernelBtf,
    tp: &TracepointSpec,
) -> Result<(), String> {
    let load_err = |e: aya::programs::ProgramError| match &e {
        aya::programs::ProgramError::LoadError { verifier_log, .. } => {
            format!("the verifier rejected {}: {e}\n{verifier_log}", tp.program)
        }
        _ => format!("loading {}: {e}", tp.program),
    };
    let program = ebpf
        .program_mut(tp.program)
        .ok_or_else(|| format!("program {} missing from the eBPF object", tp.program))?;
    if tp.raw {
        btf.check_memcg_tracepoint(tp.name).map_err(|e| e.to_string())?;
        let program: &mut RawTracePoint =
            program.try_into().map_err(|e| format!("program {}: {e}", tp.program))?;
        program.load().map_err(load_err)?;
        program.attach(tp.name).map_err(|e| format!("attaching {}: {e}", tp.program))?;
    } else {
        tracefs::check_record_format(tracefs, tp.group, tp.name, tp.fields).map_err(|e| e.to_string())?;
        let program: &mut TracePoint =
            program.try_into().map_err(|e| format!("program {}: {e}", tp.program))?;
        program.load().map_err(load_err)?;
        program.attach(tp.group, tp.name).map_err(|e| format!("attaching {}: {e}", tp.program))?;
    }
    Ok(())
}
