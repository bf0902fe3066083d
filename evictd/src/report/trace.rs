//! `evictd --trace`: one line per wake event and a summary each second, as text for people
//! tuning thresholds or as JSON Lines (`--json`) for scripts. Writes to stdout; logs stay on
//! stderr so the two never interleave in a pipe.

use std::{
    io::{self, Write},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
        mpsc::{self, Receiver, SyncSender, TrySendError},
    },
    time::{Duration, SystemTime},
};

use evictd_policy::policy::{NodeCondition, Threshold};
use serde::Serialize;

use crate::{
    kernel::ebpf::Counters,
    node::{
        cgroup_names::CgroupNames,
        growth::{Growth, GrowthTracker},
    },
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
    /// Trace lines dropped since the start because stdout was not keeping up.
    pub trace_lines_dropped_total: u64,
}

pub struct TraceSink<W: Write> {
    format: TraceFormat,
    out: W,
}

fn time_text(at: SystemTime) -> String {
    humantime::format_rfc3339_micros(at).to_string()
}

impl<W: Write> TraceSink<W> {
    pub fn new(format: TraceFormat, out: W) -> Self {
        TraceSink { format, out }
    }

    pub fn event(
        &mut self,
        wake: &Wake,
        names: &mut CgroupNames,
        mem: &MemoryView,
        at: SystemTime,
    ) -> io::Result<()> {
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
                    time: time_text(at),
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
                let time = time_text(at);
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
    pub fn condition(
        &mut self,
        c: NodeCondition,
        on: bool,
        observed_ns: Option<i64>,
        at: SystemTime,
    ) -> io::Result<()> {
        match self.format {
            TraceFormat::Json => {
                let line = ConditionLine {
                    r#type: "condition",
                    time: time_text(at),
                    condition: c.as_str(),
                    status: on,
                    observed_ns,
                };
                serde_json::to_writer(&mut self.out, &line)?;
                writeln!(self.out)
            }
            TraceFormat::Text => {
                let time = time_text(at);
                let clock = time.get(11..26).unwrap_or(&time);
                writeln!(self.out, "{clock}  condition      {} {}", c.as_str(), if on { "on" } else { "off" })
            }
        }
    }

    /// One line per eviction (or dry-run decision), with its timings.
    pub fn eviction(&mut self, e: &EvictionRecord, at: SystemTime) -> io::Result<()> {
        match self.format {
            TraceFormat::Json => {
                let mut v = serde_json::to_value(e)?;
                if let Some(o) = v.as_object_mut() {
                    o.insert("type".into(), "eviction".into());
                    o.insert("time".into(), time_text(at).into());
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
                    time_text(at),
                    e.namespace,
                    e.name,
                    e.signal,
                    e.grace_period_seconds
                )
            }
        }
    }

    pub fn summary(&mut self, s: &TraceSummary, at: SystemTime) -> io::Result<()> {
        match self.format {
            TraceFormat::Json => {
                let mut v = serde_json::to_value(s)?;
                if let Some(o) = v.as_object_mut() {
                    o.insert("type".into(), "summary".into());
                    o.insert("time".into(), time_text(at).into());
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
                let dropped = match s.trace_lines_dropped_total {
                    0 => String::new(),
                    n => format!(" | trace lines dropped {n} (stdout slow)"),
                };
                let probes = match s.charge_probes_attached {
                    Some(true) => " | charge probes attached",
                    Some(false) => " | charge probes detached",
                    None => "",
                };
                writeln!(
                    self.out,
                    "-- events/s: {} | ring-buffer drops {} (total {}) | memory.available {} | watermark {}{probes}{errors}{dropped}{grew}",
                    rates.join(", "),
                    s.ring_drops,
                    s.ring_drops_total,
                    s.memory_available_bytes.map_or("unreadable".into(), units::bytes),
                    s.watermark_bytes.map_or("-".into(), |w| units::bytes(w as i64)),
                )?;
            }
        }
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A line for the trace's thread, as the daemon made it. Boxed where large: the queue's
/// slots are made (and locked, under `mlockall`) at its start.
enum Line {
    Event(Box<(Wake, MemoryView)>),
    Condition { condition: NodeCondition, on: bool, observed_ns: Option<i64> },
    Eviction(Box<EvictionRecord>),
    Summary(Box<TraceSummary>),
}

/// Lines waiting for the trace's thread, at most: a storm's lines beyond it are dropped, not
/// held in evictd's locked memory.
const QUEUED_LINES: usize = 1024;
/// Of those, the places only conditions, evictions and summaries take: a pass keeps up to
/// thousands of wakes, and their event lines, sent first, must not leave the pass's
/// eviction no room while the thread walks the hierarchies.
const RESERVED_LINES: usize = 64;

/// `--trace`'s output, written by a thread of its own (`evictd-trace`) that also does the
/// trace's slow parts: naming an event's cgroup walks the cgroup hierarchies (~30 ms at 250
/// pods), the summary's growth view reads the usage of every cgroup below the node, and
/// stdout may be a pipe nobody reads for a while (a paused pager, a full disk behind a
/// redirect). None of it may hold a wake: the daemon hands each line over with the time it
/// was made, and a line that finds the queue full is dropped and counted.
pub struct TraceWriter {
    lines: SyncSender<(SystemTime, Line)>,
    /// Lines sent and not yet taken by the thread.
    queued: Arc<AtomicUsize>,
    dropped: u64,
    /// The thread's end, and its write error if it had one.
    ended: Receiver<io::Result<()>>,
}

impl TraceWriter {
    /// The thread, writing to `out`; the thread's spawn error when it cannot start.
    pub fn spawn<W: Write + Send + 'static>(
        format: TraceFormat,
        out: W,
        names: CgroupNames,
        growth: GrowthTracker,
    ) -> io::Result<Self> {
        let (lines, to_write) = mpsc::sync_channel(QUEUED_LINES);
        let (end, ended) = mpsc::sync_channel(1);
        let queued = Arc::new(AtomicUsize::new(0));
        let taken = queued.clone();
        std::thread::Builder::new().name("evictd-trace".into()).spawn(move || {
            // Its walks of the hierarchies yield to evictd's other ordinary work; refused, it
            // runs at the ordinary priority, which holds no wake either.
            let _ = crate::kernel::sched::set_nice(crate::kernel::sched::BACKGROUND_NICE);
            let _ = end.send(write_lines(&to_write, &taken, TraceSink::new(format, out), names, growth));
        })?;
        Ok(TraceWriter { lines, queued, dropped: 0, ended })
    }

    pub fn event(&mut self, wake: &Wake, view: &MemoryView) -> io::Result<()> {
        if self.queued.load(Ordering::Relaxed) >= QUEUED_LINES - RESERVED_LINES {
            self.dropped += 1;
            return Ok(());
        }
        self.send(Line::Event(Box::new((*wake, view.clone()))))
    }

    pub fn condition(
        &mut self,
        condition: NodeCondition,
        on: bool,
        observed_ns: Option<i64>,
    ) -> io::Result<()> {
        self.send(Line::Condition { condition, on, observed_ns })
    }

    pub fn eviction(&mut self, e: &EvictionRecord) -> io::Result<()> {
        self.send(Line::Eviction(Box::new(e.clone())))
    }

    /// The summary; its growth view is read on the trace's thread.
    pub fn summary(&mut self, mut s: TraceSummary) -> io::Result<()> {
        s.trace_lines_dropped_total = self.dropped;
        self.send(Line::Summary(Box::new(s)))
    }

    /// Lines dropped since the start: the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Ends the queue and waits at most `within` for the thread to write what is in it (stdout
    /// may never take it); its write error, if it had one.
    pub fn finish(self, within: Duration) -> io::Result<()> {
        drop(self.lines);
        match self.ended.recv_timeout(within) {
            Ok(written) => written,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                tracing::warn!("stdout took no trace line for {within:?}: the trace's last lines are lost");
                Ok(())
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Ok(()),
        }
    }

    fn send(&mut self, line: Line) -> io::Result<()> {
        // Counted before it is sent, so the thread never takes it first.
        self.queued.fetch_add(1, Ordering::Relaxed);
        let sent = self.lines.try_send((SystemTime::now(), line));
        if sent.is_err() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
        match sent {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.dropped += 1;
                Ok(())
            }
            // The thread ended on a write error (stdout closed: `evictd --trace | head`).
            Err(TrySendError::Disconnected(_)) => Err(match self.ended.try_recv() {
                Ok(Err(e)) => e,
                _ => io::Error::other("the trace's thread has ended"),
            }),
        }
    }
}

/// The trace thread's loop: every line queued, then one flush once the queue is empty (a
/// line reaches a reader within one batch, and a storm's lines go out in few writes).
fn write_lines<W: Write>(
    queued: &Receiver<(SystemTime, Line)>,
    taken: &AtomicUsize,
    mut sink: TraceSink<W>,
    mut names: CgroupNames,
    mut growth: GrowthTracker,
) -> io::Result<()> {
    while let Ok(first) = queued.recv() {
        for (at, line) in std::iter::once(first).chain(queued.try_iter()) {
            taken.fetch_sub(1, Ordering::Relaxed);
            match line {
                Line::Event(e) => sink.event(&e.0, &mut names, &e.1, at)?,
                Line::Condition { condition, on, observed_ns } => {
                    sink.condition(condition, on, observed_ns, at)?
                }
                Line::Eviction(e) => sink.eviction(&e, at)?,
                Line::Summary(mut s) => {
                    s.top_growth = growth.sample();
                    sink.summary(&s, at)?;
                }
            }
        }
        sink.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Condvar, Mutex};

    use super::*;
    use crate::node::cgroups::{CgroupMounts, CgroupVersion};

    /// Whether it is open, and what was written.
    type Written = Mutex<(bool, Vec<u8>)>;

    /// A stdout nobody reads until `open`: every write waits.
    #[derive(Clone, Default)]
    struct Gate(Arc<(Written, Condvar)>);

    impl Gate {
        fn open(&self) {
            self.0.0.lock().unwrap().0 = true;
            self.0.1.notify_all();
        }

        /// The whole lines written so far.
        fn lines(&self) -> Vec<serde_json::Value> {
            let text = String::from_utf8(self.0.0.lock().unwrap().1.clone()).unwrap();
            let whole = text.rsplit_once('\n').map_or("", |(whole, _)| whole);
            whole.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
        }
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let (lock, opened) = &*self.0;
            let mut g = opened.wait_while(lock.lock().unwrap(), |(open, _)| !*open).unwrap();
            g.1.extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn writer_to(out: Gate) -> TraceWriter {
        let d = std::env::temp_dir();
        let layout =
            CgroupMounts { memory_root: d.clone(), memory_version: CgroupVersion::V1, unified_root: None };
        let growth = GrowthTracker::new(d.join("evictd-no-such-node"), CgroupVersion::V1);
        TraceWriter::spawn(TraceFormat::Json, out, CgroupNames::new(layout), growth).unwrap()
    }

    /// A stdout that takes nothing holds no wake: every line is handed over at once (the
    /// daemon's thread would otherwise wait in write(2) for a reader, every wake behind it),
    /// what does not fit in the queue is dropped and counted — events first: the places kept
    /// for the rest take the summary after them — and what was queued is written once stdout
    /// takes it, stamped with the time it was handed over.
    #[test]
    fn a_stdout_that_takes_nothing_holds_no_wake() {
        let out = Gate::default();
        let mut w = writer_to(out.clone());
        let sent = 2 * QUEUED_LINES;
        let (done, handed_over) = mpsc::channel();
        let sender = std::thread::spawn(move || {
            for _ in 0..sent {
                w.event(&Wake::now(WakeCause::Timer), &MemoryView::default()).unwrap();
            }
            w.summary(TraceSummary::default()).unwrap();
            let _ = done.send(());
            w
        });
        let waited = handed_over.recv_timeout(Duration::from_secs(60));
        let before_open = SystemTime::now();
        out.open();
        assert!(waited.is_ok(), "the lines were not handed over while stdout took nothing");
        let w = sender.join().unwrap();
        let dropped = w.dropped();
        // The events fill the queue but its reserve; the thread may have taken one of them
        // into its write by then.
        let events_kept = QUEUED_LINES - RESERVED_LINES;
        assert!((sent - events_kept - 1..=sent - events_kept).contains(&(dropped as usize)), "{dropped}");
        w.finish(Duration::from_secs(60)).unwrap();
        let lines = out.lines();
        assert_eq!(lines.len() as u64, sent as u64 + 1 - dropped, "every line not dropped is written");
        assert_eq!(
            lines.last().map(|l| &l["type"]),
            Some(&serde_json::json!("summary")),
            "the summary has room"
        );
        for l in &lines {
            let at = humantime::parse_rfc3339(l["time"].as_str().unwrap()).unwrap();
            assert!(at < before_open, "a line is stamped when it is handed over, not written: {l}");
        }
    }

    /// The summary says how many lines were dropped before it.
    #[test]
    #[allow(clippy::disallowed_methods, reason = "a test's thread, no tokio runtime")]
    fn the_summary_counts_the_lines_dropped() {
        let out = Gate::default();
        let mut w = writer_to(out.clone());
        for _ in 0..QUEUED_LINES {
            w.event(&Wake::now(WakeCause::Timer), &MemoryView::default()).unwrap();
        }
        out.open();
        // The queue empties; the next summary finds room.
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while out.lines().len() < QUEUED_LINES - RESERVED_LINES && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        let dropped = w.dropped();
        assert!(dropped >= RESERVED_LINES as u64 - 1, "{dropped}");
        w.summary(TraceSummary::default()).unwrap();
        w.finish(Duration::from_secs(60)).unwrap();
        let summary = out.lines().into_iter().find(|l| l["type"] == "summary").expect("a summary line");
        assert_eq!(summary["trace_lines_dropped_total"], dropped);
    }
}
