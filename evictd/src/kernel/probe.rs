//! `evictd probe`: what this kernel offers and what evictd will use, checked for real
//! (programs are loaded and attached, triggers registered, then released).

use std::path::Path;

use serde::Serialize;

use crate::{
    kernel::btf::KernelBtf,
    kernel::ebpf::{KernelProbes, LoadOptions, TRACEPOINTS},
    kernel::stat_items,
    kernel::tracefs,
    node::cgroups::{CgroupLayout, CgroupVersion},
    wake::eventfd,
    wake::psi,
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
}

fn check(name: impl Into<String>, r: Result<String, String>) -> Check {
    match r {
        Ok(detail) => Check { name: name.into(), ok: true, detail },
        Err(detail) => Check { name: name.into(), ok: false, detail },
    }
}

pub fn run() -> ProbeReport {
    let kernel = nix::sys::utsname::uname()
        .map(|u| format!("{} {}", u.release().to_string_lossy(), u.machine().to_string_lossy()))
        .unwrap_or_else(|e| format!("unknown ({e})"));
    let mut checks = Vec::new();
    let mut wake_sources = Vec::new();

    let btf = Path::new(stat_items::VMLINUX_BTF);
    checks.push(check(
        "btf",
        KernelBtf::open(btf)
            .map_err(stat_items::StatItemError::from)
            .and_then(|b| stat_items::kernel_items(&b))
            .and_then(|all| stat_items::select(&all, stat_items::DEFAULT_CHARGE_ITEMS))
            .map(|items| {
                let list: Vec<String> = items.iter().map(|i| format!("{}={}", i.name, i.value)).collect();
                format!("{} ({})", btf.display(), list.join(" "))
            })
            .map_err(|e| e.to_string()),
    ));

    let tfs = tracefs::find();
    checks.push(check(
        "tracefs",
        tfs.as_ref()
            .map(|p| p.display().to_string())
            .ok_or_else(|| "not mounted (evictd mounts it at /sys/kernel/tracing when run as root)".into()),
    ));

    match KernelProbes::load(&LoadOptions::default()) {
        Ok((probes, _ring)) => {
            checks.push(check("bpf", Ok("programs load (ring buffer, array, per-CPU and hash maps)".into())));
            for p in &probes.programs {
                checks.push(check(
                    format!("tracepoint {}", p.tracepoint),
                    p.error.clone().map_or(Ok("attached".into()), Err),
                ));
            }
            wake_sources.push(format!(
                "ebpf ({} of {} tracepoints)",
                probes.programs.iter().filter(|p| p.error.is_none()).count(),
                probes.programs.len()
            ));
        }
        Err(e) => {
            checks.push(check("bpf", Err(e.to_string())));
            if let Some(root) = tracefs::find() {
                for tp in TRACEPOINTS.iter().filter(|tp| !tp.raw) {
                    checks.push(check(
                        format!("tracepoint {}:{}", tp.group, tp.name),
                        tracefs::check_layout(&root, tp.group, tp.name, tp.fields)
                            .map(|()| "present, layout matches (not attached)".into())
                            .map_err(|e| e.to_string()),
                    ));
                }
            }
        }
    }

    match CgroupLayout::detect() {
        Ok(layout) => {
            let v = match layout.memory_version {
                CgroupVersion::V1 => "v1",
                CgroupVersion::V2 => "v2",
            };
            checks.push(check(
                "cgroups",
                Ok(format!(
                    "memory controller on {v} at {}; cgroup2 {}",
                    layout.memory_root.display(),
                    layout
                        .unified_root
                        .as_ref()
                        .map_or("not mounted".into(), |p| format!("at {}", p.display()))
                )),
            ));
            if layout.memory_version == CgroupVersion::V1 {
                let r = eventfd::register(&layout.memory_root, 1 << 40)
                    .map(|_| format!("cgroup.event_control on {}", layout.memory_root.display()))
                    .map_err(|e| e.to_string());
                if r.is_ok() {
                    wake_sources.push("eventfd (memory.usage_in_bytes threshold)".into());
                }
                checks.push(check("eventfd thresholds", r));
            } else {
                checks.push(check(
                    "eventfd thresholds",
                    Err("cgroup v1 only; this node's memory is on v2".into()),
                ));
            }
            let mut psi_paths = vec![std::path::PathBuf::from("/proc/pressure/memory")];
            if let Some(u) = &layout.unified_root {
                psi_paths.push(u.join("memory.pressure"));
            }
            let mut any_psi = false;
            for p in psi_paths {
                let r = psi::open_best(&p)
                    .map(|t| format!("trigger accepted, {:?} window", t.window))
                    .map_err(|e| e.to_string());
                any_psi |= r.is_ok();
                checks.push(check(format!("psi {}", p.display()), r));
            }
            if any_psi {
                wake_sources.push("psi".into());
            }
        }
        Err(e) => checks.push(check("cgroups", Err(e.to_string()))),
    }
    wake_sources.push("timer (always)".into());
    ProbeReport { kernel, checks, wake_sources }
}

pub fn print_text(r: &ProbeReport) {
    println!("kernel: {}", r.kernel);
    for c in &r.checks {
        println!("  {:<4} {:<50} {}", if c.ok { "ok" } else { "NO" }, c.name, c.detail);
    }
    println!("evictd will use: {}", r.wake_sources.join(", "));
}
