//! `evictd --trace`: one line per wake event and a summary each second, as text for people
//! tuning thresholds or as JSON Lines (`--json`) for scripts. Writes to stdout; logs stay on
//! stderr so the two never interleave in a pipe.

use std::{
    io::{self, Write},
    time::SystemTime,
};

use evictd_policy::policy::{NodeCondition, Threshold};
use serde::Serialize;

use crate::{
    kernel::ebpf::Counters,
    node::{cgroup_names::CgroupNames, growth::Growth},
    report::units,
    vocab::{EvictionCause, EvictionRecord, WakeCause},
    wake::Wake,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    Text,
    Json,
}

/// The node's memory as seen right after a wake, and the nearest threshold to it.
#[derive(Clone, Debug, Default)]
pub struct MemoryView {
    pub available: Option<i64>,
    /// e.g. `memory.available<100Mi` and available − threshold quantity.
    pub nearest: Option<(Threshold, i64)>,
}

/// A node condition that turned on or off.
#[derive(Serialize)]
struct ConditionLine {
    r#type: &'static str,
    time: String,
    condition: &'static str,
    status: bool,
    /// CLOCK_MONOTONIC ns of the node reading that decided it.
    observed_ns: Option<i64>,
}

#[derive(Serialize)]
struct EventLine<'a> {
    r#type: &'static str,
    time: String,
    cause: WakeCause,
    cgroup: &'a str,
    cgroup_id: u64,
    amount_bytes: i64,
    pid: u32,
    cpu: u32,
    kernel_ts_ns: Option<u64>,
    delivery_us: Option<f64>,
    memory_available_bytes: Option<i64>,
    threshold: Option<String>,
    threshold_distance_bytes: Option<i64>,
    /// Stands for kernel events lost to a full ring buffer (`Wake::lost`).
    lost: bool,
}

/// Per-second totals, fed by the daemon.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TraceSummary {
    pub interval_seconds: f64,
    pub events_per_second: std::collections::BTreeMap<&'static str, f64>,
    pub ring_drops: u64,
    pub ring_drops_total: u64,
    pub channel_full_total: u64,
    pub memory_available_bytes: Option<i64>,
    pub watermark_bytes: Option<u64>,
    /// Whether the eBPF charge programs are attached (only near a threshold, by default).
    pub charge_probes_attached: Option<bool>,
    pub kernel: Option<Counters>,
    /// The cgroups under the node that grew most in the interval (the tuning view).
    pub top_growth: Vec<Growth>,
}

pub struct TraceSink<W: Write> {
    format: TraceFormat,
    out: W,
}

fn now_text() -> String {
    humantime::format_rfc3339_micros(SystemTime::now()).to_string()
}

impl<W: Write> TraceSink<W> {
    pub fn new(format: TraceFormat, out: W) -> Self {
        TraceSink { format, out }
    }

    pub fn event(&mut self, wake: &Wake, names: &mut CgroupNames, mem: &MemoryView) -> io::Result<()> {
        // Only kernel events name a cgroup, a pid and an amount.
        let from_kernel = wake.kernel_ts_ns.is_some();
        let cgroup = if wake.lost {
            String::from("(events lost: ring buffer full)")
        } else if from_kernel {
            names.describe(wake.cgroup_kind, wake.cgroup_id, wake.pid)
        } else {
            String::from("-")
        };
        let delivery_us = wake.delivery_ns().map(|ns| ns as f64 / 1000.0);
        match self.format {
            TraceFormat::Json => {
                let line = EventLine {
                    r#type: "event",
                    time: now_text(),
                    cause: wake.cause,
                    cgroup: &cgroup,
                    cgroup_id: wake.cgroup_id,
                    amount_bytes: wake.amount_bytes,
                    pid: wake.pid,
                    cpu: wake.cpu,
                    kernel_ts_ns: wake.kernel_ts_ns,
                    delivery_us,
                    memory_available_bytes: mem.available,
                    threshold: mem.nearest.as_ref().map(|(t, _)| t.to_string()),
                    threshold_distance_bytes: mem.nearest.as_ref().map(|(_, d)| *d),
                    lost: wake.lost,
                };
                serde_json::to_writer(&mut self.out, &line)?;
                writeln!(self.out)
            }
            TraceFormat::Text => {
                let time = now_text();
                let clock = time.get(11..26).unwrap_or(&time);
                let lat = delivery_us.map_or("-".into(), |us| format!("{us:.0}µs"));
                let avail = mem.available.map_or("unreadable".into(), units::bytes);
                let near = mem
                    .nearest
                    .as_ref()
                    .map_or(String::new(), |(t, d)| format!("  {t} {} away", units::bytes(*d)));
                writeln!(
                    self.out,
                    "{clock}  {:<14} {:>9}  {:<40} pid {:<7} cpu {:<3} lat {:>7}  memory.available {avail}{near}",
                    wake.cause.as_str(),
                    if from_kernel { units::bytes(wake.amount_bytes) } else { "-".into() },
                    cgroup,
                    wake.pid,
                    wake.cpu,
                    lat,
                )
            }
        }
    }

    /// A node condition turned on or off; `observed_ns` is when the pass read the node.
    pub fn condition(&mut self, c: NodeCondition, on: bool, observed_ns: Option<i64>) -> io::Result<()> {
        match self.format {
            TraceFormat::Json => {
                let line = ConditionLine {
                    r#type: "condition",
                    time: now_text(),
                    condition: c.as_str(),
                    status: on,
                    observed_ns,
                };
                serde_json::to_writer(&mut self.out, &line)?;
                writeln!(self.out)
            }
            TraceFormat::Text => {
                let time = now_text();
                let clock = time.get(11..26).unwrap_or(&time);
                writeln!(self.out, "{clock}  condition      {} {}", c.as_str(), if on { "on" } else { "off" })
            }
        }
    }

    /// One line per eviction (or dry-run decision), with its timings.
    pub fn eviction(&mut self, e: &EvictionRecord) -> io::Result<()> {
        match self.format {
            TraceFormat::Json => {
                let mut v = serde_json::to_value(e)?;
                if let Some(o) = v.as_object_mut() {
                    o.insert("type".into(), "eviction".into());
                    o.insert("time".into(), now_text().into());
                }
                serde_json::to_writer(&mut self.out, &v)?;
                writeln!(self.out)
            }
            TraceFormat::Text => {
                let what = match (&e.error, e.dry_run) {
                    (Some(err), _) => format!("FAILED ({err})"),
                    (None, true) => "would evict (dry run)".into(),
                    (None, false) => "EVICTED".into(),
                };
                let phases = e.phases.as_ref().map_or(String::new(), |p| {
                    let released = p
                        .memory_released_ms
                        .map_or("memory NOT released".into(), |ms| format!("memory released {ms:.1}ms"));
                    let fast = p.fast_kill.as_ref().map_or(String::new(), |k| {
                        format!(
                            "fast kill ({:?}, {:?}) {:.1}ms, {} reaped, ",
                            k.urgency, k.report.method, k.report.signalled_ms, k.report.reaped
                        )
                    });
                    let read = e.pods_read.map_or(String::new(), |n| format!(" ({n} pods' usage read)"));
                    format!(
                        " | decide {}µs{read}, {fast}stop containers {:.1}ms, stop sandbox {:.1}ms, {released}",
                        e.decide_us, p.stop_containers_ms, p.stop_sandbox_ms
                    )
                });
                // A pod over its own limit has no node threshold: its message names the limit.
                let why = match e.signal {
                    EvictionCause::Signal(_) => format!(
                        "available {}, threshold {}",
                        units::bytes(e.available),
                        units::bytes(e.threshold)
                    ),
                    EvictionCause::Limit(_) => e.message.trim_end().to_owned(),
                };
                writeln!(
                    self.out,
                    "{} {what} {}/{} for {} ({why}, grace {}s){phases}",
                    now_text(),
                    e.namespace,
                    e.name,
                    e.signal,
                    e.grace_period_seconds
                )
            }
        }
    }

    pub fn summary(&mut self, s: &TraceSummary) -> io::Result<()> {
        match self.format {
            TraceFormat::Json => {
                let mut v = serde_json::to_value(s)?;
                if let Some(o) = v.as_object_mut() {
                    o.insert("type".into(), "summary".into());
                    o.insert("time".into(), now_text().into());
                }
                serde_json::to_writer(&mut self.out, &v)?;
                writeln!(self.out)?;
            }
            TraceFormat::Text => {
                let rates: Vec<String> =
                    s.events_per_second.iter().map(|(k, v)| format!("{k} {v:.0}")).collect();
                // Shown only when there are any: they should never happen.
                let errors: u64 = s.kernel.map_or(0, |k| k.errors.iter().sum());
                let errors = if errors > 0 { format!(" | kernel errors {errors}") } else { String::new() };
                let grew: Vec<String> =
                    s.top_growth.iter().map(|g| format!("{} +{}", g.cgroup, units::bytes(g.bytes))).collect();
                let grew = if grew.is_empty() {
                    String::new()
                } else {
                    format!(" | grew most: {}", grew.join(", "))
                };
                let probes = match s.charge_probes_attached {
                    Some(true) => " | charge probes attached",
                    Some(false) => " | charge probes detached",
                    None => "",
                };
                writeln!(
                    self.out,
                    "-- events/s: {} | ring-buffer drops {} (total {}) | memory.available {} | watermark {}{probes}{errors}{grew}",
                    rates.join(", "),
                    s.ring_drops,
                    s.ring_drops_total,
                    s.memory_available_bytes.map_or("unreadable".into(), units::bytes),
                    s.watermark_bytes.map_or("-".into(), |w| units::bytes(w as i64)),
                )?;
            }
        }
        self.out.flush()
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}
