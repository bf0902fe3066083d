//! `cargo xtask bench reaction`: a test memory cgroup plays the node (its limit is the capacity) under a private
//! containerd; one BestEffort pod (optionally holding several GiB first) allocates at a fixed
//! rate until it is stopped; evictd runs with one wake mode and one kill path at a time and a
//! hard threshold below the limit. Every time is taken from the node crossing the threshold,
//! which comes from the workload's own stamp of every page it touches (CLOCK_MONOTONIC, in a
//! shared mapping: no system call, `tests/images/hog.c`), independent of what is under test:
//! - detection: evictd's decision (its eviction record, same clock);
//! - stop: the victim can no longer allocate — its last page stamped plus one page's period
//!   at its pace (the kill landed before the next page was done);
//! - freed: the node's usage back down by 90 % of what the victim had added, seen by a
//!   watcher polling the node cgroup every 0.5 ms;
//! - kernel OOM first: the kernel's OOM killer acted in the node before the eviction did.
//!
//! The kill paths: `cri` stops the pod through the runtime only (`--fast-kill never`, the
//! kubelet's 1 s hard grace period); `fast` kills at once (`--hard-eviction-grace-period 0`);
//! `default` is evictd's defaults (the runtime with the 1 s grace, escalated to the fast kill
//! at the emergency level), which differs from `cri` only for a victim that ignores SIGTERM
//! (`--victim-ignores-sigterm`).
//!
//! `earlyoom.rs` runs the same workload and columns against the whole machine, evictd beside
//! earlyoom; what both share is here.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use evictd::node::{cgroups::CgroupMounts, memory::MemoryCgroup};
use evictd_tests::{
    containerd::{Containerd, PodSpec, TestPod},
    evictd_proc::Evictd,
};
use hdrhistogram::Histogram;

use crate::plot;

const MI: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Mode {
    /// evictd's default wake sources, all at once.
    All,
    /// The defaults with the charge programs attached always (`--charge-probes always`):
    /// also while a killed pod exits, which `all` takes them off for.
    #[value(name = "all-attached")]
    AllAttached,
    Ebpf,
    Eventfd,
    Psi,
    /// The adaptive poll alone.
    Poll,
    #[value(name = "poll-100ms")]
    Poll100ms,
    #[value(name = "poll-10s")]
    Poll10s,
}

impl Mode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::All => "all",
            Mode::AllAttached => "all-attached",
            Mode::Ebpf => "ebpf",
            Mode::Eventfd => "eventfd",
            Mode::Psi => "psi",
            Mode::Poll => "poll",
            Mode::Poll100ms => "poll-100ms",
            Mode::Poll10s => "poll-10s",
        }
    }

    /// evictd's flags for this mode: one wake source, nothing else.
    fn args(self) -> Vec<&'static str> {
        match self {
            Mode::All => vec![],
            Mode::AllAttached => vec!["--charge-probes", "always"],
            Mode::Ebpf => vec!["--wake-sources", "ebpf"],
            Mode::Eventfd => vec!["--wake-sources", "eventfd"],
            Mode::Psi => vec!["--wake-sources", "psi"],
            Mode::Poll => vec!["--wake-sources", "poll"],
            Mode::Poll100ms => vec!["--wake-sources", "timer", "--housekeeping-interval", "100ms"],
            Mode::Poll10s => vec!["--wake-sources", "timer", "--housekeeping-interval", "10s"],
        }
    }
}

/// How the chosen pod is killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum KillPath {
    /// Through the runtime only, the kubelet's way (1 s hard grace period).
    Cri,
    /// evictd's defaults: the runtime with the 1 s grace, the fast kill at the emergency level.
    Default,
    /// evictd's fast kill at once (hard grace period 0).
    Fast,
}

impl KillPath {
    pub(crate) fn name(self) -> &'static str {
        match self {
            KillPath::Cri => "cri",
            KillPath::Default => "default",
            KillPath::Fast => "fast",
        }
    }

    pub(crate) fn args(self) -> &'static [&'static str] {
        match self {
            KillPath::Cri => &["--fast-kill", "never"],
            KillPath::Default => &[],
            KillPath::Fast => &["--hard-eviction-grace-period", "0"],
        }
    }
}

/// What reacts to the pressure: evictd in one wake mode with one kill path, or earlyoom.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Reactor {
    Evictd(Mode, KillPath),
    Earlyoom,
}

impl Reactor {
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Reactor::Evictd(mode, path) => (mode.name(), path.name()),
            // It polls MemAvailable; SIGTERM, then SIGKILL at half the level.
            Reactor::Earlyoom => ("earlyoom", "signals"),
        }
    }
}

/// The workload's pace: as fast as it can allocate and touch.
pub(crate) const MAX_RATE: u64 = 1 << 20;

/// A rate flag: MiB/s, or `max`.
pub(crate) fn parse_rate(s: &str) -> Result<u64, String> {
    match s {
        "max" => Ok(MAX_RATE),
        n => n.parse::<u64>().ok().filter(|r| *r > 0).ok_or_else(|| format!("{n:?}: MiB/s > 0, or max")),
    }
}

pub(crate) fn rate_name(rate: u64) -> String {
    if rate >= MAX_RATE { "max".into() } else { rate.to_string() }
}

#[derive(clap::Args, Debug)]
pub struct Opts {
    /// Runs per cell (threshold, mode, kill path, rate).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(usize))]
    runs: usize,
    /// Allocation rates of the workload, MiB/s (or `max`), comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_rate, default_values = ["256", "1024", "4096"])]
    rates: Vec<u64>,
    /// Kill paths to compare, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [KillPath::Cri, KillPath::Fast])]
    kill_paths: Vec<KillPath>,
    /// MiB the victim holds before it starts allocating at its rate (so that freed time per
    /// GiB shows); the node's capacity must leave room for it above the threshold.
    #[arg(long = "hold", value_name = "MiB", default_value_t = 0)]
    hold_mib: u64,
    /// The victim ignores SIGTERM (only SIGKILL ends it), so a grace period is really waited.
    #[arg(long)]
    victim_ignores_sigterm: bool,
    /// Wake modes to compare, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Mode::Ebpf, Mode::Eventfd, Mode::Psi, Mode::Poll100ms, Mode::Poll10s])]
    modes: Vec<Mode>,
    /// Memory limit of the cgroup that plays the node, MiB.
    #[arg(long = "capacity", value_name = "MiB", default_value_t = 2048)]
    capacity_mib: u64,
    /// Hard memory.available thresholds, MiB, comma-separated (the kubelet's default is 100).
    #[arg(long = "threshold", value_name = "MiB", value_delimiter = ',', default_values_t = [256])]
    thresholds_mib: Vec<u64>,
    /// Where the CSV and SVG go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
}

impl Opts {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.runs > 0
                && !self.rates.is_empty()
                && !self.modes.is_empty()
                && !self.kill_paths.is_empty()
                && !self.thresholds_mib.is_empty(),
            "nothing to run"
        );
        anyhow::ensure!(
            self.capacity_mib <= self.hold_mib + STAMPED_MIB,
            "--capacity {} leaves the victim more room than its stamps cover ({STAMPED_MIB} MiB above --hold)",
            self.capacity_mib
        );
        for t in &self.thresholds_mib {
            anyhow::ensure!(
                t + self.hold_mib + 64 < self.capacity_mib,
                "--threshold {t} plus --hold {} needs a --capacity above {} MiB",
                self.hold_mib,
                t + self.hold_mib + 64
            );
        }
        Ok(())
    }
}

/// A cell of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Cell {
    pub threshold_mib: u64,
    pub rate: u64,
    pub reactor: Reactor,
}

#[derive(Clone, Debug)]
pub(crate) struct Sample {
    pub cell: Cell,
    pub run: usize,
    pub achieved_rate: f64,
    pub detection_ms: Option<f64>,
    pub stop_ms: Option<f64>,
    pub freed_ms: Option<f64>,
    /// GiB the victim held when it stopped allocating.
    pub victim_gib: f64,
    pub oom_first: bool,
    /// evictd's own phase timings: stop containers, stop sandbox, release (ms).
    phases: Option<(f64, f64, f64)>,
    /// evictd's decision, from the pass's first look at the thresholds to the record: the
    /// pods' usage read and ranked (its `decide_us`, ms).
    pub decide_ms: Option<f64>,
    /// Where detection went before the decision, from evictd's record (ms).
    pub before_pass: Option<BeforePass>,
}

/// The time from the crossing to the pass that decided, in three parts from the clocks of
/// evictd's record (all CLOCK_MONOTONIC): the wake's own timestamp (the kernel's, where the
/// wake came from an eBPF program), when evictd's daemon received it, and when the pass began
/// to read the node.
#[derive(Clone, Debug)]
pub(crate) struct BeforePass {
    /// The crossing to the wake the pass answered: how far past the crossing the wake was
    /// sent (negative: before it, as the crossing is placed from the victim's `Stamps`).
    pub wake_ms: f64,
    /// The wake's timestamp to the daemon receiving it (0 where the wake has no kernel
    /// timestamp: PSI, eventfd, the poll, the timer).
    pub delivery_ms: f64,
    /// Received to the node's read beginning: the batch's wait and the pass's start.
    pub observe_ms: f64,
    /// The node's read beginning to the decision, less the decision's own time: the read
    /// (builds before 2026-11-27 stamped the reading once read: ~0 there).
    pub read_ms: Option<f64>,
    /// What the wake was (evictd's name for its cause).
    pub cause: String,
    /// How long the workload took over the page that crossed (ms, from the stamp before it
    /// to its own): the crossing is placed within it at an even pace, so a page held up (the
    /// hog preempted, or waiting for memory) leaves the crossing, and `wake_ms` with it,
    /// uncertain by up to that much. `None` where the crossing was watched directly.
    pub page_ms: Option<f64>,
}

impl BeforePass {
    fn of(crossing: Crossing, r: &Reaction) -> Option<BeforePass> {
        let (crossing_ns, page_ms) = (crossing.at_ns, crossing.page_ns.map(|b| b as f64 / 1e6));
        let (kernel, received, observed) = r.wake?;
        let cause = r.wake_cause.clone().unwrap_or_default();
        let ms = |a: u64, b: u64| (b as f64 - a as f64) / 1e6;
        let sent = kernel.unwrap_or(received);
        Some(BeforePass {
            wake_ms: ms(crossing_ns, sent),
            delivery_ms: ms(sent, received),
            observe_ms: ms(received, observed),
            read_ms: r.decide_ms.map(|d| ms(observed, r.decided_ns) - d),
            cause,
            page_ms,
        })
    }
}

/// The kernel's OOM kills on the whole machine, global and memcg alike (`/proc/vmstat`):
/// cgroup v1 counts a memcg OOM kill only in the victim's own memcg, so the node's counter
/// cannot tell.
fn oom_kills() -> i64 {
    procfs::vmstat().ok().and_then(|v| v.get("oom_kill").copied()).unwrap_or(0)
}

/// A memory cgroup's working set, read by evictd's own reader (0 if unreadable).
pub(crate) fn working_set(node: &MemoryCgroup) -> u64 {
    node.read().map_or(0, |s| s.working_set())
}

/// The node the workload presses on, as the benchmark measures it.
pub(crate) struct Node {
    /// Its memory cgroup: the test node's, or the root for the whole machine.
    pub memory: MemoryCgroup,
    /// Its capacity as evictd sees it: the test node's limit, or MemTotal.
    pub capacity: u64,
}

/// The victim of every run.
#[derive(Clone, Copy)]
pub(crate) struct Workload {
    pub hold_mib: u64,
    pub ignore_sigterm: bool,
}

impl Workload {
    fn hog_args(self, rate: u64) -> Vec<String> {
        let mut args = vec![
            "rate".into(),
            rate.to_string(),
            "/ctl/go".into(),
            format!("/ctl/{STAMPS_FILE}"),
            self.hold_mib.to_string(),
        ];
        if self.ignore_sigterm {
            args.push("ignore-term".into());
        }
        args
    }
}

/// A reactor while it runs, with what it reported.
pub(crate) enum Running {
    Evictd(Evictd),
    Earlyoom(crate::earlyoom::Earlyoom),
}

/// A reactor's reaction to one pod.
struct Reaction {
    /// When it decided to kill (CLOCK_MONOTONIC ns).
    decided_ns: u64,
    /// The reading it decided on (when, memory.available), which calibrates the crossing.
    reading: Option<(u64, i64)>,
    /// evictd's own phase timings: stop containers, stop sandbox, release (ms).
    phases: Option<(f64, f64, f64)>,
    /// evictd's decision time (ms).
    decide_ms: Option<f64>,
    /// The wake the deciding pass answered (its kernel timestamp, when received) and when
    /// the pass read the node.
    wake: Option<(Option<u64>, u64, u64)>,
    wake_cause: Option<String>,
}

impl Running {
    /// How many reports it has made so far: a reaction to a new pod comes after it.
    fn mark(&self) -> usize {
        match self {
            Running::Evictd(e) => e.evictions().len(),
            Running::Earlyoom(e) => e.kills().len(),
        }
    }

    /// Its first reaction to `pod` after `mark`.
    fn reaction(&self, mark: usize, pod: &TestPod) -> Option<Reaction> {
        match self {
            Running::Evictd(e) => {
                let ev = e.evictions().into_iter().skip(mark).find(|e| e["uid"] == pod.uid.as_str())?;
                let p = &ev["phases"];
                Some(Reaction {
                    decided_ns: ev["decided_ns"].as_u64()?,
                    reading: ev["observed_ns"].as_u64().zip(ev["available"].as_i64()),
                    phases: p["stop_containers_ms"].as_f64().and_then(|c| {
                        Some((c, p["stop_sandbox_ms"].as_f64()?, p["memory_released_ms"].as_f64()?))
                    }),
                    decide_ms: ev["decide_us"].as_f64().map(|us| us / 1e3),
                    wake: ev["wake_received_ns"]
                        .as_u64()
                        .zip(ev["observed_ns"].as_u64())
                        .map(|(received, observed)| (ev["wake_kernel_ts_ns"].as_u64(), received, observed)),
                    wake_cause: ev["wake_cause"].as_str().map(str::to_owned),
                })
            }
            // The hog is the only process called that; earlyoom's line comes just before its
            // kill(2), and is stamped when this process reads it (an upper bound).
            Running::Earlyoom(e) => {
                e.kills().into_iter().skip(mark).find(|k| k.comm == "hog").map(|k| Reaction {
                    decided_ns: k.read_ns,
                    reading: None,
                    phases: None,
                    decide_ms: None,
                    wake: None,
                    wake_cause: None,
                })
            }
        }
    }

    /// memory.available at this moment in the reactor's own terms: the node's capacity less
    /// its working set for evictd, MemAvailable for earlyoom.
    fn available(&self, node: &Node) -> u64 {
        match self {
            Running::Evictd(_) => node.capacity.saturating_sub(working_set(&node.memory)),
            Running::Earlyoom(_) => crate::earlyoom::mem_available(),
        }
    }

    /// For earlyoom, the crossing is watched directly: MemAvailable does not fall in step
    /// with the workload's allocation when the kernel is still giving back an earlier
    /// victim's pages, so the workload's log cannot be calibrated by one reading.
    fn watched_mem_available_level(&self, threshold: u64) -> Option<u64> {
        matches!(self, Running::Earlyoom(_)).then_some(threshold)
    }
}

pub async fn reaction(o: &Opts) -> anyhow::Result<()> {
    let cap = o.capacity_mib * MI;
    eprintln!(
        "[bench] reaction: node cgroup of {} MiB, victim holding {} MiB{}, hard thresholds {:?} MiB, modes {:?}, kill paths {:?}, rates {:?} MiB/s, {} runs each",
        o.capacity_mib,
        o.hold_mib,
        if o.victim_ignores_sigterm { " and ignoring SIGTERM" } else { "" },
        o.thresholds_mib,
        o.modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
        o.kill_paths.iter().map(|p| p.name()).collect::<Vec<_>>(),
        o.rates.iter().map(|r| rate_name(*r)).collect::<Vec<_>>(),
        o.runs
    );
    eprintln!("[bench] evictd under test: {}", evictd_tests::evictd_binary().display());
    let mut ctd = Containerd::start(cap);
    let layout = CgroupMounts::detect()?;
    let node =
        Node { memory: MemoryCgroup::new(ctd.node_dir(), layout.memory_version, false), capacity: cap };
    let work = Workload { hold_mib: o.hold_mib, ignore_sigterm: o.victim_ignores_sigterm };
    let mut samples = Vec::new();
    for &threshold_mib in &o.thresholds_mib {
        let threshold = format!("memory.available<{threshold_mib}Mi");
        for &mode in &o.modes {
            for &path in &o.kill_paths {
                let mut extra = mode.args();
                extra.extend(path.args());
                extra.extend(["--eviction-hard", threshold.as_str()]);
                let evictd = Running::Evictd(Evictd::start(&ctd, None, &extra));
                let reactor = Reactor::Evictd(mode, path);
                // Runs of one cell's rates interleave, so that drift of the machine over the
                // run hits every rate alike.
                for run in 0..o.runs {
                    for &rate in &o.rates {
                        let cell = Cell { threshold_mib, rate, reactor };
                        let pod = start_victim(&mut ctd, work, cell, run).await;
                        let s = one_run(&mut ctd, &evictd, &node, work, cell, run, pod).await?;
                        eprintln!("[bench] {}", describe(&s));
                        samples.push(s);
                    }
                }
            }
        }
    }
    report(&o.out, &samples)?;
    // The bars are of detection, which the kill path does not change: one per rate and mode.
    plot_detection(&o.out, &samples, &o.rates, &o.modes)?;
    plot_distributions(&o.out, "reaction", &timed(&samples))
}

/// One run's times as the plots group them.
pub(crate) struct Timed {
    mode: String,
    kill_path: String,
    detection: Option<f64>,
    stop: Option<f64>,
    freed: Option<f64>,
}

/// CDFs of detection by wake mode, and of stop and freed by kill path — by mode and kill path
/// when several modes ran, which may differ there too (every rate pooled):
/// `<stem>-{detection,stop,freed}.{svg,png}` under `out`.
pub(crate) fn plot_distributions(out: &Path, stem: &str, runs: &[Timed]) -> anyhow::Result<()> {
    let by = |key: &dyn Fn(&Timed) -> String, value: fn(&Timed) -> Option<f64>| {
        let mut groups: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for r in runs {
            groups.entry(key(r)).or_default().extend(value(r));
        }
        groups.into_iter().map(|(label, ms)| plot::Series { label, ms }).collect::<Vec<_>>()
    };
    let modes: std::collections::BTreeSet<&str> = runs.iter().map(|r| r.mode.as_str()).collect();
    let mode = |r: &Timed| r.mode.clone();
    let (path, by_path): (&dyn Fn(&Timed) -> String, &str) = if modes.len() > 1 {
        (&|r: &Timed| format!("{} {}", r.mode, r.kill_path), "by wake mode and kill path")
    } else {
        (&|r: &Timed| r.kill_path.clone(), "by kill path")
    };
    for (name, title, series) in [
        (
            "detection",
            "detection: the crossing to the decision, by wake mode".to_owned(),
            by(&mode, |r| r.detection),
        ),
        (
            "stop",
            format!("stop: the crossing to the victim's last allocation, {by_path}"),
            by(path, |r| r.stop),
        ),
        (
            "freed",
            format!("freed: the crossing to 90 % of the victim's memory back, {by_path}"),
            by(path, |r| r.freed),
        ),
    ] {
        for written in plot::cdf(&series, &title, &out.join(format!("{stem}-{name}")))? {
            eprintln!("[bench] wrote {}", written.display());
        }
    }
    Ok(())
}

fn timed(samples: &[Sample]) -> Vec<Timed> {
    samples
        .iter()
        .map(|s| {
            let (mode, kill_path) = s.cell.reactor.names();
            Timed {
                mode: mode.into(),
                kill_path: kill_path.into(),
                detection: s.detection_ms,
                stop: s.stop_ms,
                freed: s.freed_ms,
            }
        })
        .collect()
}

/// The runs of a CSV `reaction` or `earlyoom` wrote (its `mode`, `kill_path`,
/// `detection_ms`, `stop_ms` and `freed_ms` columns; an empty cell is no sample).
pub(crate) fn read_csv(path: &Path) -> anyhow::Result<Vec<Timed>> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| anyhow::anyhow!("{}: no {name} column", path.display()))
    };
    let (mode, kill, det, stop, freed) =
        (col("mode")?, col("kill_path")?, col("detection_ms")?, col("stop_ms")?, col("freed_ms")?);
    let mut runs = Vec::new();
    for (n, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split(',').collect();
        let at = |i: usize| {
            f.get(i).copied().ok_or_else(|| anyhow::anyhow!("{}:{}: too few columns", path.display(), n + 2))
        };
        let ms = |i: usize| -> anyhow::Result<Option<f64>> {
            let v = at(i)?;
            if v.is_empty() {
                return Ok(None);
            }
            v.parse().map(Some).map_err(|e| anyhow::anyhow!("{}:{}: {v:?}: {e}", path.display(), n + 2))
        };
        runs.push(Timed {
            mode: at(mode)?.into(),
            kill_path: at(kill)?.into(),
            detection: ms(det)?,
            stop: ms(stop)?,
            freed: ms(freed)?,
        });
    }
    Ok(runs)
}

pub(crate) fn describe(s: &Sample) -> String {
    let c = s.cell;
    let (who, how) = c.reactor.names();
    let f = |v: Option<f64>, prec: usize| v.map_or("-".into(), |v| format!("{v:.prec$}"));
    format!(
        "<{}Mi {who:<10} {how:<7} {:>5} MiB/s run {}: detection {} ms, stop {} ms, freed {} ms ({:.1} GiB){} (achieved {:.0} MiB/s){}",
        c.threshold_mib,
        rate_name(c.rate),
        s.run + 1,
        f(s.detection_ms, 2),
        f(s.stop_ms, 1),
        f(s.freed_ms, 1),
        s.victim_gib,
        if s.oom_first { ", kernel OOM first" } else { "" },
        s.achieved_rate,
        s.phases.map_or(String::new(), |(c, b, r)| format!(
            " [stop containers {c:.1} ms, stop sandbox {b:.1} ms, release {r:.1} ms]"
        ))
    )
}

/// What the watcher saw (CLOCK_MONOTONIC ns, the clock of the workload's log and evictd's
/// records).
#[derive(Default)]
struct Watched {
    /// The node's working set first back down by 90 % of what the victim added over the
    /// baseline, after it had added at least 64 MiB.
    freed_ns: Option<u64>,
    /// MemAvailable first at or below the level it was asked to watch (earlyoom's crossing).
    mem_available_crossed_ns: Option<u64>,
}

/// Watches the node every 0.5 ms from `go` until `done`.
fn watch(
    node: MemoryCgroup,
    baseline: u64,
    mem_available_level: Option<u64>,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Watched> {
    std::thread::spawn(move || {
        let mut seen = Watched::default();
        let mut peak = baseline;
        while !done.load(Ordering::Relaxed) && seen.freed_ns.is_none() {
            let now = evictd::vocab::monotonic_ns();
            if let Some(level) = mem_available_level.filter(|_| seen.mem_available_crossed_ns.is_none())
                && crate::earlyoom::mem_available() <= level
            {
                seen.mem_available_crossed_ns = Some(now);
            }
            let ws = working_set(&node);
            peak = peak.max(ws);
            let added = peak - baseline;
            if added >= 64 * MI && ws < baseline + added / 10 {
                seen.freed_ns = Some(evictd::vocab::monotonic_ns());
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        seen
    })
}

/// A run's pod: its hog holds `work.hold_mib` and waits for `go`.
pub(crate) async fn start_victim(ctd: &mut Containerd, work: Workload, cell: Cell, run: usize) -> TestPod {
    let (who, how) = cell.reactor.names();
    let name =
        format!("w{}{how}t{}r{}n{run}", who.replace('-', ""), cell.threshold_mib, rate_name(cell.rate));
    let pod =
        ctd.run_pod(PodSpec { hog_args: Some(work.hog_args(cell.rate)), ..PodSpec::besteffort(&name) }).await;
    let settle = Instant::now() + Duration::from_secs(60);
    while work.hold_mib > 0 && pod.usage() < work.hold_mib * MI && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pod
}

/// One run: the victim allocates at the cell's rate from `go` until something stops it; the
/// sample's times are from its own log.
pub(crate) async fn one_run(
    ctd: &mut Containerd,
    reactor: &Running,
    node: &Node,
    work: Workload,
    cell: Cell,
    run: usize,
    pod: TestPod,
) -> anyhow::Result<Sample> {
    let threshold = cell.threshold_mib * MI;
    let mark = reactor.mark();
    // Let evictd's inventory (every 100 ms) see the pod before the pressure starts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ooms = oom_kills();
    let baseline = working_set(&node.memory);
    let available_at_go = reactor.available(node);
    let done = Arc::new(AtomicBool::new(false));
    let watcher = watch(
        node.memory.clone(),
        baseline.saturating_sub(work.hold_mib * MI),
        reactor.watched_mem_available_level(threshold),
        done.clone(),
    );
    std::fs::write(pod.ctl_dir.join("go"), "")?;
    // Wait for a reaction to this pod, a kernel OOM kill, or the timeout.
    let to_fill = Duration::from_millis(available_at_go / MI * 1000 / cell.rate.max(1));
    let deadline = Instant::now() + Duration::from_secs(30) + to_fill;
    let reaction = loop {
        if let Some(r) = reactor.reaction(mark, &pod) {
            break Some(r);
        }
        if oom_kills() > ooms || oom_killed(ctd, &pod.container_id).await || Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // An OOM kill at any point means the kernel acted before the reactor's stop took effect.
    // The victim's memory may still be on its way back (earlyoom reports before it kills).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let freed_by = Instant::now() + Duration::from_secs(10);
    while reaction.is_some() && !watcher.is_finished() && Instant::now() < freed_by {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let oom_first = oom_kills() > ooms || oom_killed(ctd, &pod.container_id).await;
    done.store(true, Ordering::Relaxed);
    let watched = watcher.join().unwrap_or_default();
    let stamps = Stamps::read(&pod.ctl_dir.join(STAMPS_FILE)).unwrap_or_else(|e| {
        eprintln!("[bench] {cell:?} run {}: the victim's stamps: {e:#}", run + 1);
        Stamps::default()
    });
    let watched_crossing = watched.mem_available_crossed_ns.map(|at_ns| Crossing { at_ns, page_ns: None });
    let crossing = watched_crossing.or_else(|| {
        crossing_ns(&stamps, reaction.as_ref(), node.capacity, threshold, available_at_go, work.hold_mib)
    });
    let achieved_rate = stamps.rate_mib_s();
    // One page's period at the achieved pace: the kill landed before the next page was done.
    let page_period_ns = stamps.page_period_ns();
    let since_crossing = |t: Option<u64>| -> Option<f64> {
        if oom_first {
            return None;
        }
        Some((t? as f64 - crossing?.at_ns as f64) / 1e6)
    };
    if !oom_first && (reaction.is_none() || crossing.is_none()) {
        eprintln!(
            "[bench] {cell:?} run {}: no sample: reaction {}, crossing {} (available at go {} MiB, {} pages stamped)",
            run + 1,
            if reaction.is_some() { "seen" } else { "not seen" },
            if crossing.is_some() { "found" } else { "not found" },
            available_at_go / MI,
            stamps.pages.len()
        );
    }
    let last = stamps.last().filter(|_| !stamps.full());
    let sample = Sample {
        cell,
        run,
        achieved_rate,
        detection_ms: since_crossing(reaction.as_ref().map(|r| r.decided_ns)),
        stop_ms: since_crossing(last.map(|(t, _)| t + page_period_ns)),
        freed_ms: since_crossing(watched.freed_ns),
        victim_gib: last.map_or(0.0, |(_, mib)| mib / 1024.0),
        oom_first,
        phases: reaction.as_ref().and_then(|r| r.phases),
        before_pass: crossing
            .zip(reaction.as_ref())
            .and_then(|(c, r)| BeforePass::of(c, r))
            .filter(|_| !oom_first),
        decide_ms: reaction.and_then(|r| r.decide_ms),
    };
    let client = ctd.client();
    let _ = client.stop_pod_sandbox(&pod.sandbox_id).await;
    let _ = client.remove_pod_sandbox(&pod.sandbox_id).await;
    let _ = std::fs::remove_dir(&pod.cgroup);
    Ok(sample)
}

/// When the node crossed the threshold, from the workload's stamps. The node's working set is
/// the workload's allocation plus a little it does not stamp (page tables, the stamps' own
/// pages, the rest of the machine); that offset is calibrated with the reading the reactor
/// decided on where it reports one (evictd: only that amount is taken from it, the *time*
/// comes from the stamps), else with memory.available read just before `go`.
fn crossing_ns(
    stamps: &Stamps,
    reaction: Option<&Reaction>,
    capacity: u64,
    threshold: u64,
    available_at_go: u64,
    hold_mib: u64,
) -> Option<Crossing> {
    let from_reading = reaction.and_then(|r| r.reading).and_then(|(observed, available)| {
        let mib = stamps.allocated_at(observed)?;
        Some(capacity as f64 - available as f64 - mib * MI as f64)
    });
    let offset = from_reading.unwrap_or(capacity as f64 - available_at_go as f64 - (hold_mib * MI) as f64);
    // The allocation, in MiB, at which the node's working set passes the threshold.
    let at_mib = ((capacity - threshold) as f64 - offset) / MI as f64;
    let (at_ns, page_ns) = stamps.time_of(at_mib)?;
    Some(Crossing { at_ns, page_ns: Some(page_ns) })
}

/// When the node crossed the threshold, and how long the page that crossed took.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Crossing {
    at_ns: u64,
    page_ns: Option<u64>,
}

/// The victim's stamps file, in its pod's control directory.
const STAMPS_FILE: &str = "alloc.stamps";
/// The growth the hog stamps (`STAMPED_BYTES` in `tests/images/hog.c`).
const STAMPED_MIB: u64 = 4096;

/// The workload's stamps (`hog rate`): when it saw the go, and when it had touched each page
/// since, in order; within a page it is taken to touch at an even pace.
#[derive(Debug, Default)]
struct Stamps {
    page_size: u64,
    hold_mib: u64,
    start_ns: u64,
    /// ns after each page touched; ends at the first page not reached.
    pages: Vec<u64>,
    /// How many pages the file has room for.
    room: usize,
}

impl Stamps {
    /// The file as the hog wrote it: native u64s, a header of three, then the stamps.
    fn read(path: &Path) -> anyhow::Result<Stamps> {
        use anyhow::Context as _;
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let mut words = bytes.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default()));
        let (Some(page_size), Some(hold_mib), Some(start_ns)) = (words.next(), words.next(), words.next())
        else {
            anyhow::bail!("{}: {} bytes, shorter than its header", path.display(), bytes.len());
        };
        anyhow::ensure!(
            page_size > 0 && MI.is_multiple_of(page_size),
            "{}: page size {page_size}",
            path.display()
        );
        let room = (bytes.len() / 8).saturating_sub(3);
        let pages: Vec<u64> =
            if start_ns == 0 { Vec::new() } else { words.take_while(|&t| t != 0).collect() };
        anyhow::ensure!(
            pages.windows(2).all(|w| w[0] <= w[1]) && pages.first().is_none_or(|&t| t >= start_ns),
            "{}: stamps out of order",
            path.display()
        );
        Ok(Stamps { page_size, hold_mib, start_ns, pages, room })
    }

    fn pages_per_mib(&self) -> f64 {
        (MI / self.page_size.max(1)) as f64
    }

    /// When the page before page `i` was done (the go for the first).
    fn before(&self, i: usize) -> u64 {
        i.checked_sub(1).and_then(|p| self.pages.get(p).copied()).unwrap_or(self.start_ns)
    }

    /// MiB allocated at time `t` (the held MiB included; fractional within a page); `None`
    /// before the go.
    fn allocated_at(&self, t: u64) -> Option<f64> {
        if self.start_ns == 0 || t < self.start_ns {
            return None;
        }
        let done = self.pages.partition_point(|&p| p <= t);
        let into = match self.pages.get(done) {
            Some(&end) if end > self.before(done) => {
                (t - self.before(done)) as f64 / (end - self.before(done)) as f64
            }
            _ => 0.0,
        };
        Some(self.hold_mib as f64 + (done as f64 + into) / self.pages_per_mib())
    }

    /// When `mib` MiB were allocated (within the page that reached it, at an even pace) and
    /// how long that page took; `None` when the stamps never got there.
    fn time_of(&self, mib: f64) -> Option<(u64, u64)> {
        let pages = ((mib - self.hold_mib as f64) * self.pages_per_mib()).max(0.0);
        if pages == 0.0 {
            return (self.start_ns != 0).then_some((self.start_ns, 0));
        }
        let i = (pages.ceil() as usize).checked_sub(1)?;
        let end = *self.pages.get(i)?;
        let begin = self.before(i);
        let into = pages - i as f64;
        Some((begin + (into * end.saturating_sub(begin) as f64) as u64, end.saturating_sub(begin)))
    }

    /// The last page done: when, and the MiB allocated by then.
    fn last(&self) -> Option<(u64, f64)> {
        let t = *self.pages.last()?;
        Some((t, self.hold_mib as f64 + self.pages.len() as f64 / self.pages_per_mib()))
    }

    /// Whether the victim grew past what the file has room for: its last allocation is then
    /// not known.
    fn full(&self) -> bool {
        self.room > 0 && self.pages.len() >= self.room
    }

    /// MiB/s from the go to the last page.
    fn rate_mib_s(&self) -> f64 {
        match self.last() {
            Some((t, mib)) if t > self.start_ns => {
                (mib - self.hold_mib as f64) / ((t - self.start_ns) as f64 / 1e9)
            }
            _ => 0.0,
        }
    }

    /// One page's period at the achieved pace.
    fn page_period_ns(&self) -> u64 {
        match self.rate_mib_s() {
            r if r > 0.0 => (1e9 / (r * self.pages_per_mib())) as u64,
            _ => 0,
        }
    }
}

/// Whether the runtime reports the container as killed by the kernel OOM killer.
async fn oom_killed(ctd: &Containerd, container: &str) -> bool {
    let Ok(st) = ctd.client().container_status(container).await else { return false };
    st.status.is_some_and(|s| s.reason == "OOMKilled")
}

/// Latency percentiles of one cell (ms), from an HDR histogram of microseconds with three
/// significant digits.
#[derive(Clone, Copy)]
pub(crate) struct Percentiles {
    pub p50: f64,
    pub p99: f64,
}

pub(crate) fn percentiles(ms: impl Iterator<Item = f64>) -> Option<Percentiles> {
    let mut h = Histogram::<u64>::new(3).ok()?;
    for v in ms {
        // record, not saturating_record: a new histogram grows to fit, but would clamp.
        h.record((v * 1000.0).round().max(0.0) as u64).ok()?;
    }
    let at = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    (!h.is_empty()).then(|| Percentiles { p50: at(0.5), p99: at(0.99) })
}

/// A table cell: one of a cell's percentiles (ms), or `-` without samples.
pub(crate) fn percentile_cell(p: Option<Percentiles>, pick: fn(Percentiles) -> f64, prec: usize) -> String {
    p.map_or("-".into(), |p| format!("{:.prec$}", pick(p)))
}

/// One table row, and one group of bars in the plot.
pub(crate) struct Row {
    pub rate: u64,
    pub mode: Mode,
    pub detection: Option<Percentiles>,
}

fn write_csv(path: &Path, samples: &[Sample]) -> anyhow::Result<()> {
    let mut csv = String::from(
        "threshold_mib,mode,kill_path,rate_mib_s,run,achieved_mib_s,detection_ms,stop_ms,freed_ms,victim_gib,oom_first\n",
    );
    for s in samples {
        let f = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
        let c = s.cell;
        let (who, how) = c.reactor.names();
        let _ = writeln!(
            csv,
            "{},{who},{how},{},{},{:.0},{},{},{},{:.2},{}",
            c.threshold_mib,
            rate_name(c.rate),
            s.run,
            s.achieved_rate,
            f(s.detection_ms),
            f(s.stop_ms),
            f(s.freed_ms),
            s.victim_gib,
            s.oom_first
        );
    }
    Ok(std::fs::write(path, csv)?)
}

/// Writes `reaction.csv` under `out` and prints the table: one row per cell.
pub(crate) fn report(out: &Path, samples: &[Sample]) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    write_csv(&out.join("reaction.csv"), samples)?;
    let mut groups: BTreeMap<Cell, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        groups.entry(s.cell).or_default().push(s);
    }
    println!(
        "{:>9} {:<10} {:<7} {:>6} {:>8} | {:>7} {:>7} | {:>7} {:>7} | {:>7} {:>7} {:>8} | {:>9}",
        "threshold",
        "mode",
        "kill",
        "MiB/s",
        "achieved",
        "det p50",
        "det p99",
        "stop p50",
        "p99",
        "freed50",
        "p99",
        "ms/GiB50",
        "OOM first"
    );
    for (cell, ss) in &groups {
        let det = percentiles(ss.iter().filter_map(|s| s.detection_ms));
        let stop = percentiles(ss.iter().filter_map(|s| s.stop_ms));
        let freed = percentiles(ss.iter().filter_map(|s| s.freed_ms));
        let per_gib = percentiles(
            ss.iter().filter(|s| s.victim_gib > 0.0).filter_map(|s| Some(s.freed_ms? / s.victim_gib)),
        );
        let achieved = ss.iter().map(|s| s.achieved_rate).sum::<f64>() / ss.len() as f64;
        let ooms = ss.iter().filter(|s| s.oom_first).count();
        let f = percentile_cell;
        let (who, how) = cell.reactor.names();
        println!(
            "{:>7}Mi {who:<10} {how:<7} {:>6} {:>8.0} | {:>7} {:>7} | {:>7} {:>7} | {:>7} {:>7} {:>8} | {:>5}/{:<3}",
            cell.threshold_mib,
            rate_name(cell.rate),
            achieved,
            f(det, |p| p.p50, 2),
            f(det, |p| p.p99, 2),
            f(stop, |p| p.p50, 1),
            f(stop, |p| p.p99, 1),
            f(freed, |p| p.p50, 1),
            f(freed, |p| p.p99, 1),
            f(per_gib, |p| p.p50, 1),
            ooms,
            ss.len()
        );
    }
    println!(
        "(milliseconds from the node crossing the threshold: det = the decision; stop = the victim's last \
         page touched + one page's period; freed = the node's usage back down by 90 % of the victim's; ms/GiB50 = \
         p50 of freed per GiB the victim held)"
    );
    eprintln!("[bench] wrote {}", out.join("reaction.csv").display());
    Ok(())
}

/// The plot of detection: one bar per rate and wake mode (the kill path does not change it).
fn plot_detection(out: &Path, samples: &[Sample], rates: &[u64], modes: &[Mode]) -> anyhow::Result<()> {
    let mut by_rate_mode: BTreeMap<(u64, Mode), Vec<f64>> = BTreeMap::new();
    for s in samples {
        if let Reactor::Evictd(mode, _) = s.cell.reactor {
            by_rate_mode.entry((s.cell.rate, mode)).or_default().extend(s.detection_ms);
        }
    }
    let rows: Vec<Row> = by_rate_mode
        .into_iter()
        .map(|((rate, mode), v)| Row { rate, mode, detection: percentiles(v.into_iter()) })
        .collect();
    let svg = out.join("reaction.svg");
    plot::plot(&rows, rates, modes, &svg)?;
    eprintln!("[bench] wrote {}", svg.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_cell() {
        let p = percentiles([0.5, 0.7, 0.6, 4.0, 0.55].into_iter()).expect("five samples");
        // Nearest rank: ⌈q·n⌉, so the p99 of five samples is their maximum.
        assert!((p.p50 - 0.6).abs() < 0.001, "{}", p.p50);
        assert!((p.p99 - 4.0).abs() < 0.005, "{}", p.p99);
        assert!(percentiles(std::iter::empty()).is_none());
    }

    /// A hog holding 10 MiB, with 4 KiB pages (256 a MiB): its first 256 pages 1 µs apart
    /// from the go at 1 ms, then a page held up for 0.5 ms, then the rest 1 µs apart.
    fn stamps() -> Stamps {
        let us = 1_000;
        let mut pages: Vec<u64> = (1..=256).map(|i| 1_000 * us + i * us).collect();
        pages.push(1_256 * us + 500 * us);
        pages.extend((1..=255).map(|i| 1_756 * us + i * us));
        Stamps { page_size: 4096, hold_mib: 10, start_ns: 1_000 * us, room: 4096, pages }
    }

    #[test]
    fn the_crossing_is_placed_within_the_page_that_passes_it() {
        let us = 1_000;
        let s = stamps();
        assert_eq!(s.allocated_at(999 * us), None, "before the go");
        assert_eq!(s.allocated_at(1_000 * us), Some(10.0));
        assert_eq!(s.allocated_at(1_256 * us), Some(11.0), "MiB 11 done with its 256th page");
        // Halfway through the held-up page: 11 MiB and half a page.
        assert_eq!(s.allocated_at(1_506 * us), Some(11.0 + 0.5 / 256.0));
        assert_eq!(s.time_of(10.0), Some((1_000 * us, 0)), "held before the go");
        assert_eq!(s.time_of(10.5), Some((1_128 * us, us)));
        // A crossing within the held-up page is placed within it, and says how long it took.
        assert_eq!(s.time_of(11.0 + 0.5 / 256.0), Some((1_506 * us, 500 * us)));
        assert_eq!(s.time_of(12.0), Some((2_011 * us, us)), "the last page");
        assert_eq!(s.time_of(12.01), None, "never got past 12 MiB");
        assert_eq!(s.last(), Some((2_011 * us, 12.0)));
        assert!((s.rate_mib_s() - 2.0 / 0.001_011).abs() < 1e-6, "{}", s.rate_mib_s());
        assert!(!s.full());
        // A node of 1000 MiB under a 100 MiB threshold, read 0.25 MiB past it three quarters
        // of the way through MiB 11: 889.5 MiB beside the workload, so the crossing was at
        // 10.5 MiB.
        let reaction = Reaction {
            decided_ns: 0,
            reading: Some((1_192 * us, (100 << 20) - (MI / 4) as i64)),
            phases: None,
            decide_ms: None,
            wake: None,
            wake_cause: None,
        };
        let crossing = crossing_ns(&s, Some(&reaction), 1000 * MI, 100 * MI, 0, 10);
        assert_eq!(crossing, Some(Crossing { at_ns: 1_128 * us, page_ns: Some(us) }));
    }

    #[test]
    fn stamps_are_read_as_the_hog_writes_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(STAMPS_FILE);
        let words: [u64; 8] = [4096, 3, 100, 101, 103, 0, 0, 0];
        std::fs::write(&path, words.iter().flat_map(|w| w.to_ne_bytes()).collect::<Vec<u8>>())
            .expect("write");
        let s = Stamps::read(&path).expect("stamps");
        assert_eq!((s.page_size, s.hold_mib, s.start_ns, s.room), (4096, 3, 100, 5));
        assert_eq!(s.pages, [101, 103]);
        // Out of order, or cut short: an error naming the file, never a crossing from it.
        let words: [u64; 5] = [4096, 3, 100, 105, 103];
        std::fs::write(&path, words.iter().flat_map(|w| w.to_ne_bytes()).collect::<Vec<u8>>())
            .expect("write");
        let e = Stamps::read(&path).expect_err("out of order");
        assert!(format!("{e:#}").contains(STAMPS_FILE), "{e:#}");
        std::fs::write(&path, [0u8; 12]).expect("write");
        assert!(Stamps::read(&path).is_err());
    }
}
