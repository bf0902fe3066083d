//! `evictd probe`: what this kernel offers and what evictd will use, checked for real
//! (programs are loaded and attached, triggers registered, then released).

use std::path::Path;

use serde::Serialize;

use crate::{
    kernel::{
        btf::KernelBtf,
        ebpf::{KernelProbes, LoadOptions, ProgramStatus, TRACEPOINTS},
        stat_items, tracefs,
    },
    node::{
        cgroups::{CgroupMounts, CgroupVersion},
        memory::{self, MemoryCgroup},
    },
    vocab::ChargeTier,
    wake::{eventfd, poll, psi},
};

#[derive(Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Serialize)]
pub struct ProbeReport {
    pub kernel: String,
    pub checks: Vec<Check>,
    pub wake_sources: Vec<String>,
    /// What wakes evictd when memory is charged, the fastest tier this kernel allows.
    pub charge_wake: ChargeWake,
}

/// The wake tier for memory growth, and why it is the one: the tiers are tried fastest
/// first, and the first one this kernel allows is used.
#[derive(Serialize)]
pub struct ChargeWake {
    pub tier: ChargeTier,
    pub why: String,
}

/// A check's outcome: what was found, or why it is not there.
fn check<E: std::fmt::Display>(name: impl Into<String>, r: Result<String, E>) -> Check {
    match r {
        Ok(detail) => Check { name: name.into(), ok: true, detail },
        Err(e) => failed(name, e),
    }
}

fn passed(name: impl Into<String>, detail: impl Into<String>) -> Check {
    Check { name: name.into(), ok: true, detail: detail.into() }
}

fn failed(name: impl Into<String>, why: impl std::fmt::Display) -> Check {
    Check { name: name.into(), ok: false, detail: why.to_string() }
}

pub fn run() -> ProbeReport {
    let kernel = nix::sys::utsname::uname()
        .map(|u| format!("{} {}", u.release().to_string_lossy(), u.machine().to_string_lossy()))
        .unwrap_or_else(|e| format!("unknown ({e})"));
    let mut r = ProbeReport {
        kernel,
        checks: vec![check_btf(), check_tracefs()],
        wake_sources: Vec::new(),
        charge_wake: ChargeWake { tier: ChargeTier::AdaptivePoll, why: String::new() },
    };
    r.charge_wake = probe_bpf(&mut r);
    r.checks.push(check(
        "the node's /proc/meminfo",
        memory::check_meminfo_is_the_kernels(Path::new(memory::MEMINFO)).map(|()| "procfs's".to_string()),
    ));
    match CgroupMounts::detect() {
        Ok(layout) => {
            r.checks.push(passed("cgroups", describe_cgroups(&layout)));
            r.checks.push(check(
                "the node's cgroup root",
                layout
                    .check_sees_the_node()
                    .map(|()| format!("{} is the hierarchy's root", layout.memory_root.display())),
            ));
            probe_eventfd(&layout, &mut r);
            probe_psi(&layout, &mut r);
            probe_poll(&layout, &mut r);
        }
        Err(e) => r.checks.push(failed("cgroups", e)),
    }
    r.wake_sources.push("timer (always)".into());
    r
}

/// BTF readable, and the default charge items resolved from it.
fn check_btf() -> Check {
    let btf = Path::new(stat_items::VMLINUX_BTF);
    let items = KernelBtf::open(btf)
        .map_err(stat_items::StatItemError::from)
        .and_then(|b| stat_items::kernel_items(&b))
        .and_then(|all| stat_items::select(&all, stat_items::DEFAULT_CHARGE_ITEMS));
    check(
        "btf",
        items.map(|items| {
            let list: Vec<String> = items.iter().map(|i| format!("{}={}", i.name, i.value)).collect();
            format!("{} ({})", btf.display(), list.join(" "))
        }),
    )
}

fn check_tracefs() -> Check {
    check(
        "tracefs",
        tracefs::find()
            .map(|p| p.display().to_string())
            .ok_or("not mounted (evictd mounts it at /sys/kernel/tracing when run as root)"),
    )
}

/// Loads and attaches the programs for real; when loading fails, at least says which
/// tracepoints exist with the record layout the programs expect. Returns the charge tier
/// the programs allow.
fn probe_bpf(r: &mut ProbeReport) -> ChargeWake {
    match KernelProbes::load(&LoadOptions::default()) {
        Ok((probes, _ring)) => {
            r.checks.push(passed("bpf", "programs load (ring buffer, array, per-CPU and hash maps)"));
            for p in &probes.programs {
                let kind = if p.is_batch_hook() { "" } else { "tracepoint " };
                r.checks.push(check(
                    format!("{kind}{}", p.tracepoint),
                    p.error.clone().map_or(Ok("attached".into()), Err),
                ));
            }
            let attached = probes.programs.iter().filter(|p| p.error.is_none()).count();
            r.wake_sources.push(format!("ebpf ({attached} of {} programs)", probes.programs.len()));
            charge_tier(&probes)
        }
        Err(e) => {
            let poll = ChargeWake { tier: ChargeTier::AdaptivePoll, why: format!("no eBPF: {e}") };
            r.checks.push(failed("bpf", e));
            let Some(root) = tracefs::find() else { return poll };
            for tp in TRACEPOINTS.iter().filter(|tp| !tp.raw) {
                r.checks.push(check(
                    format!("tracepoint {}:{}", tp.group, tp.name),
                    tracefs::check_record_format(&root, tp.group, tp.name, tp.fields)
                        .map(|()| "present, layout matches (not attached)".into()),
                ));
            }
            poll
        }
    }
}

/// The fastest charge tier whose programs attached, with every other tier's reasons.
fn charge_tier(probes: &KernelProbes) -> ChargeWake {
    let reasons = |tier: fn(&ProgramStatus) -> bool| {
        let r: Vec<String> = probes.programs.iter().filter(|p| tier(p)).map(ProgramStatus::reason).collect();
        r.join("; ")
    };
    let tier = probes.charge_tier();
    let why = match tier {
        ChargeTier::BatchedChargeHook => {
            "fexit on page_counter_try_charge attaches: the node's page counter is \
                                          compared with the watermark once per 64-page charge batch"
                .into()
        }
        ChargeTier::MemcgTracepoints => format!(
            "the memcg stat tracepoints attach (evictd attaches them only within the band near a memory \
             threshold); no batched charge hook: {}",
            reasons(ProgramStatus::is_batch_hook)
        ),
        ChargeTier::AdaptivePoll => format!(
            "no batched charge hook: {}; no memcg stat tracepoint attaches: {}",
            reasons(ProgramStatus::is_batch_hook),
            reasons(ProgramStatus::is_memcg_stat)
        ),
    };
    ChargeWake { tier, why }
}

fn describe_cgroups(layout: &CgroupMounts) -> String {
    let v = match layout.memory_version {
        CgroupVersion::V1 => "v1",
        CgroupVersion::V2 => "v2",
    };
    let unified =
        layout.unified_root.as_ref().map_or("not mounted".into(), |p| format!("at {}", p.display()));
    format!("memory controller on {v} at {}; cgroup2 {unified}", layout.memory_root.display())
}

/// Registers (and drops) a threshold far above any usage on the memory root.
fn probe_eventfd(layout: &CgroupMounts, r: &mut ProbeReport) {
    if layout.memory_version != CgroupVersion::V1 {
        r.checks.push(failed("eventfd thresholds", "cgroup v1 only; this node's memory is on v2"));
        return;
    }
    let res = eventfd::register(&layout.memory_root, 1 << 40)
        .map(|_| format!("cgroup.event_control on {}", layout.memory_root.display()))
        .map_err(|e| e.to_string());
    if res.is_ok() {
        r.wake_sources.push("eventfd (memory.usage_in_bytes threshold)".into());
    }
    r.checks.push(check("eventfd thresholds", res));
}

/// Registers (and drops) a trigger on the system-wide and the cgroup2 root pressure files.
fn probe_psi(layout: &CgroupMounts, r: &mut ProbeReport) {
    let mut paths = vec![std::path::PathBuf::from("/proc/pressure/memory")];
    if let Some(u) = &layout.unified_root {
        paths.push(u.join("memory.pressure"));
    }
    let mut any = false;
    for p in paths {
        let res = psi::open_best(&p).map(|t| format!("trigger accepted, {:?} window", t.window));
        any |= res.is_ok();
        r.checks.push(check(format!("psi {}", p.display()), res));
    }
    if any {
        r.wake_sources.push("psi".into());
    }
}

/// One read of the root's usage, the adaptive poll's only syscall.
fn probe_poll(layout: &CgroupMounts, r: &mut ProbeReport) {
    let root = MemoryCgroup::new(&layout.memory_root, layout.memory_version, true);
    let res = root.usage().map(|u| format!("root usage {} MiB", u >> 20)).map_err(|e| e.to_string());
    if res.is_ok() {
        r.wake_sources.push(format!(
            "poll (node usage every {:?} to {:?})",
            poll::MIN_INTERVAL,
            poll::MAX_INTERVAL
        ));
    }
    r.checks.push(check("adaptive poll", res));
}

pub fn print_text(r: &ProbeReport) {
    println!("kernel: {}", r.kernel);
    for c in &r.checks {
        println!("  {:<4} {:<50} {}", if c.ok { "ok" } else { "NO" }, c.name, c.detail);
    }
    println!("evictd will use: {}", r.wake_sources.join(", "));
    println!("memory growth wakes evictd through: {} ({})", r.charge_wake.tier, r.charge_wake.why);
}
