//! `cargo xtask bench reaction`: a test memory cgroup plays the node (its limit is the capacity) under a private
//! containerd; one BestEffort pod allocates at a fixed rate until it is stopped; evictd runs
//! with one wake mode at a time and a hard threshold below the limit. The crossing time comes
//! from the workload's own allocation log (CLOCK_MONOTONIC), independent of the mode under
//! test; evictd's eviction record gives the decision and release times on the same clock.
//! Kernel OOM kills in the node cgroup are counted from its memory.oom_control.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use evictd_tests::{
    containerd::{Containerd, PodSpec},
    evictd_proc::Evictd,
};
use hdrhistogram::Histogram;

use crate::plot;

const MI: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Mode {
    Ebpf,
    Eventfd,
    Psi,
    #[value(name = "poll-100ms")]
    Poll100ms,
    #[value(name = "poll-10s")]
    Poll10s,
}

impl Mode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Ebpf => "ebpf",
            Mode::Eventfd => "eventfd",
            Mode::Psi => "psi",
            Mode::Poll100ms => "poll-100ms",
            Mode::Poll10s => "poll-10s",
        }
    }

    /// evictd's flags for this mode: one wake source, nothing else.
    fn args(self) -> Vec<&'static str> {
        match self {
            Mode::Ebpf => vec!["--wake-sources", "ebpf"],
            Mode::Eventfd => vec!["--wake-sources", "eventfd"],
            Mode::Psi => vec!["--wake-sources", "psi"],
            Mode::Poll100ms => vec!["--wake-sources", "timer", "--housekeeping-interval", "100ms"],
            Mode::Poll10s => vec!["--wake-sources", "timer", "--housekeeping-interval", "10s"],
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct Opts {
    /// Runs per mode and rate.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(usize))]
    runs: usize,
    /// Allocation rates of the workload, MiB/s, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [256, 1024, 4096])]
    rates: Vec<u64>,
    /// Wake modes to compare, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Mode::Ebpf, Mode::Eventfd, Mode::Psi, Mode::Poll100ms, Mode::Poll10s])]
    modes: Vec<Mode>,
    /// Memory limit of the cgroup that plays the node, MiB.
    #[arg(long = "capacity", value_name = "MiB", default_value_t = 2048)]
    capacity_mib: u64,
    /// The hard memory.available threshold, MiB.
    #[arg(long = "threshold", value_name = "MiB", default_value_t = 256)]
    threshold_mib: u64,
    /// Where the CSV and SVG go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
}

impl Opts {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.runs > 0 && !self.rates.is_empty() && !self.modes.is_empty(), "nothing to run");
        anyhow::ensure!(self.threshold_mib < self.capacity_mib, "--threshold must be below --capacity");
        Ok(())
    }
}

/// One cell of the matrix: a mode, a rate, and which run of it.
#[derive(Clone, Copy)]
struct Run {
    mode: Mode,
    rate: u64,
    run: usize,
}

#[derive(Clone, Debug)]
struct Sample {
    mode: Mode,
    rate: u64,
    run: usize,
    achieved_rate: f64,
    detection_ms: Option<f64>,
    kill_ms: Option<f64>,
    oom_first: bool,
    /// evictd's own phase timings: stop containers, stop sandbox, release (ms).
    phases: Option<(f64, f64, f64)>,
}

fn read_u64(p: &Path) -> u64 {
    std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

fn oom_kills(node: &Path) -> u64 {
    std::fs::read_to_string(node.join("memory.oom_control"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill ").and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

/// The node cgroup's working set (usage − total_inactive_file), as evictd computes it.
fn working_set(node: &Path) -> u64 {
    let usage = read_u64(&node.join("memory.usage_in_bytes"));
    let inactive = std::fs::read_to_string(node.join("memory.stat"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file ").and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0);
    usage.saturating_sub(inactive)
}

/// (ns, MiB) lines of the workload's allocation log.
fn alloc_log(path: &Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut p = l.split_whitespace();
            Some((p.next()?.parse().ok()?, p.next()?.parse().ok()?))
        })
        .collect()
}

pub async fn reaction(o: &Opts) -> anyhow::Result<()> {
    let cap = o.capacity_mib * MI;
    let threshold = format!("memory.available<{}Mi", o.threshold_mib);
    eprintln!(
        "[bench] reaction: node cgroup of {} MiB, hard threshold {threshold}, modes {:?}, rates {:?} MiB/s, {} runs each",
        o.capacity_mib,
        o.modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
        o.rates,
        o.runs
    );
    let mut ctd = Containerd::start(cap);
    let node = ctd.node_dir();
    let mut samples = Vec::new();
    for &mode in &o.modes {
        let mut extra = mode.args();
        extra.extend(["--eviction-hard", threshold.as_str()]);
        let evictd = Evictd::start(&ctd, None, &extra);
        for &rate in &o.rates {
            for run in 0..o.runs {
                let s = one_run(&mut ctd, &evictd, &node, o, Run { mode, rate, run }).await?;
                eprintln!(
                    "[bench] {:<10} {:>5} MiB/s run {}: detection {} ms, kill {} ms{} (achieved {:.0} MiB/s){}",
                    mode.name(),
                    rate,
                    run + 1,
                    s.detection_ms.map_or("-".into(), |v| format!("{v:.2}")),
                    s.kill_ms.map_or("-".into(), |v| format!("{v:.1}")),
                    if s.oom_first { ", kernel OOM first" } else { "" },
                    s.achieved_rate,
                    s.phases.map_or(String::new(), |(c, b, r)| format!(
                        " [stop containers {c:.1} ms, stop sandbox {b:.1} ms, release {r:.1} ms]"
                    ))
                );
                samples.push(s);
            }
        }
        drop(evictd);
    }
    report(o, &samples)
}

async fn one_run(
    ctd: &mut Containerd,
    evictd: &Evictd,
    node: &Path,
    o: &Opts,
    Run { mode, rate, run }: Run,
) -> anyhow::Result<Sample> {
    let (cap, threshold) = (o.capacity_mib * MI, o.threshold_mib * MI);
    let name = format!("w{}r{rate}n{run}", mode.name().replace('-', ""));
    let pod = ctd
        .run_pod(PodSpec {
            hog_args: Some(vec!["rate".into(), rate.to_string(), "/ctl/go".into(), "/ctl/alloc.log".into()]),
            ..PodSpec::besteffort(&name)
        })
        .await;
    // Let evictd's inventory see the pod before the pressure starts.
    let seen = evictd.evictions().len();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let ooms = oom_kills(node);
    let baseline = working_set(node);
    std::fs::write(pod.ctl_dir.join("go"), "")?;
    // Wait for an eviction of this pod, a kernel OOM kill, or the timeout.
    let _ = baseline;
    let deadline =
        Instant::now() + Duration::from_secs(30) + Duration::from_millis(cap / MI * 1000 / rate.max(1));
    let eviction = loop {
        if let Some(e) = evictd.evictions().into_iter().skip(seen).find(|e| e["uid"] == pod.uid.as_str()) {
            break Some(e);
        }
        // The kernel got there first. (cgroup v1 counts an OOM kill only in the victim's own
        // memcg, the container's, so the node's counter cannot tell; the runtime can.)
        if oom_kills(node) > ooms || oom_killed(ctd, &pod.container_id).await {
            break None;
        }
        if Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // An OOM kill at any point means the kernel acted before evictd's stop took effect.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let oom_first = oom_kills(node) > ooms || oom_killed(ctd, &pod.container_id).await;
    let log = alloc_log(&pod.ctl_dir.join("alloc.log"));
    let limit = cap - threshold;
    // The node's working set is the workload's allocation plus a little it does not log
    // (page tables, the log's page cache). The offset is calibrated with the working set
    // evictd read when it decided: only that amount is taken from evictd, the crossing
    // *time* comes from the workload's own log.
    let offset = eviction
        .as_ref()
        .and_then(|e| {
            let observed = e["observed_ns"].as_u64()?;
            let ws = cap as i64 - e["available"].as_i64()?;
            let mib = log.iter().take_while(|(t, _)| *t <= observed).last()?.1;
            Some(ws - (mib * MI) as i64)
        })
        .unwrap_or(baseline as i64);
    let crossing = log.iter().find(|(_, mib)| (mib * MI) as i64 + offset > limit as i64).map(|(t, _)| *t);
    let achieved_rate = match (log.first(), log.last()) {
        (Some(a), Some(b)) if b.0 > a.0 => (b.1 - a.1) as f64 / ((b.0 - a.0) as f64 / 1e9),
        _ => 0.0,
    };
    let ms = |field: &str| -> Option<f64> {
        let t = eviction.as_ref()?[field].as_u64()?;
        Some((t as f64 - crossing? as f64) / 1e6)
    };
    if !oom_first && (eviction.is_none() || crossing.is_none()) {
        eprintln!(
            "[bench] {} {rate} MiB/s run {}: no sample: eviction {}, crossing {} (baseline {} MiB, {} log lines)",
            mode.name(),
            run + 1,
            if eviction.is_some() { "seen" } else { "not seen" },
            if crossing.is_some() { "found" } else { "not found" },
            baseline / MI,
            log.len()
        );
    }
    let sample = Sample {
        mode,
        rate,
        run,
        achieved_rate,
        detection_ms: if oom_first { None } else { ms("decided_ns") },
        kill_ms: if oom_first { None } else { ms("released_ns") },
        oom_first,
        phases: eviction.as_ref().and_then(|e| {
            let p = &e["phases"];
            Some((
                p["stop_containers_ms"].as_f64()?,
                p["stop_sandbox_ms"].as_f64()?,
                p["memory_released_ms"].as_f64()?,
            ))
        }),
    };
    let client = ctd.client();
    let _ = client.stop_pod_sandbox(&pod.sandbox_id).await;
    let _ = client.remove_pod_sandbox(&pod.sandbox_id).await;
    let _ = std::fs::remove_dir(&pod.cgroup);
    Ok(sample)
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
    pub max: f64,
}

fn percentiles(ms: impl Iterator<Item = f64>) -> Option<Percentiles> {
    let mut h = Histogram::<u64>::new(3).ok()?;
    for v in ms {
        // record, not saturating_record: a new histogram grows to fit, but would clamp.
        h.record((v * 1000.0).round().max(0.0) as u64).ok()?;
    }
    let at = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    (!h.is_empty()).then(|| Percentiles { p50: at(0.5), p99: at(0.99), max: h.max() as f64 / 1000.0 })
}

/// One table row, and one group of bars in the plot.
pub(crate) struct Row {
    pub rate: u64,
    pub mode: Mode,
    pub detection: Option<Percentiles>,
}

fn write_csv(path: &Path, samples: &[Sample]) -> anyhow::Result<()> {
    let mut csv = String::from("mode,rate_mib_s,run,achieved_mib_s,detection_ms,kill_ms,oom_first\n");
    for s in samples {
        let f = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
        let _ = writeln!(
            csv,
            "{},{},{},{:.0},{},{},{}",
            s.mode.name(),
            s.rate,
            s.run,
            s.achieved_rate,
            f(s.detection_ms),
            f(s.kill_ms),
            s.oom_first
        );
    }
    Ok(std::fs::write(path, csv)?)
}

fn report(o: &Opts, samples: &[Sample]) -> anyhow::Result<()> {
    std::fs::create_dir_all(&o.out)?;
    write_csv(&o.out.join("reaction.csv"), samples)?;
    let mut groups: BTreeMap<(u64, Mode), Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        groups.entry((s.rate, s.mode)).or_default().push(s);
    }
    println!(
        "{:<10} {:>8} {:>9} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>9}",
        "mode",
        "MiB/s",
        "achieved",
        "det p50",
        "det p99",
        "det max",
        "kill p50",
        "kill p99",
        "kill max",
        "OOM first"
    );
    let mut rows = Vec::new();
    for ((rate, mode), ss) in &groups {
        let det = percentiles(ss.iter().filter_map(|s| s.detection_ms));
        let kill = percentiles(ss.iter().filter_map(|s| s.kill_ms));
        let achieved = ss.iter().map(|s| s.achieved_rate).sum::<f64>() / ss.len() as f64;
        let ooms = ss.iter().filter(|s| s.oom_first).count();
        let f = |p: Option<Percentiles>, pick: fn(Percentiles) -> f64| {
            p.map_or("-".into(), |p| format!("{:.2}", pick(p)))
        };
        println!(
            "{:<10} {:>8} {:>9.0} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>5}/{:<3}",
            mode.name(),
            rate,
            achieved,
            f(det, |p| p.p50),
            f(det, |p| p.p99),
            f(det, |p| p.max),
            f(kill, |p| p.p50),
            f(kill, |p| p.p99),
            f(kill, |p| p.max),
            ooms,
            ss.len()
        );
        rows.push(Row { rate: *rate, mode: *mode, detection: det });
    }
    println!(
        "(milliseconds from the node crossing the threshold; detection = evictd's decision, kill = the pod's processes gone)"
    );
    let svg = o.out.join("reaction.svg");
    plot::plot(&rows, &o.rates, &o.modes, &svg)?;
    eprintln!("[bench] wrote {} and {}", o.out.join("reaction.csv").display(), svg.display());
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
        assert!((p.max - 4.0).abs() < 0.005, "{}", p.max);
        assert!(percentiles(std::iter::empty()).is_none());
    }
}
