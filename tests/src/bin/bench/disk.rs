//! `cargo xtask bench disk`: how long evictd takes to see a disk threshold crossed. A tmpfs
//! of its own plays nodefs; the benchmark fills it at a fixed rate from a ballast just above
//! the threshold, and takes the crossing from its own writes (CLOCK_MONOTONIC: the start of
//! the first write after which statvfs shows less than the threshold available, so that a
//! detection is never under-counted; resolution: one 256 KiB write). Detection is evictd's node reading that turned DiskPressure on (the
//! `--trace` condition line's `observed_ns`, same clock). evictd runs without a runtime and
//! is started afresh for every run, which begins at a random point of the mode's period, so
//! that a timer's phase is not the same in every run.
//!
//! Modes: `disk` (the disk poll alone), `timer-1s`, `timer-10s` (the housekeeping timer
//! alone; 10 s is the kubelet's loop).

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{BufRead as _, BufReader, Write as _},
    path::PathBuf,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use evictd::vocab::monotonic_ns;
use evictd_tests::{TestTmpfs, dies_with_harness, evictd_binary};

use crate::reaction::{parse_rate, rate_name};

const MI: u64 = 1 << 20;
/// The fill's write size: the resolution of the crossing time.
const CHUNK: usize = 256 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Mode {
    /// The disk poll alone.
    Disk,
    #[value(name = "timer-1s")]
    Timer1s,
    /// The kubelet's cadence.
    #[value(name = "timer-10s")]
    Timer10s,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Disk => "disk",
            Mode::Timer1s => "timer-1s",
            Mode::Timer10s => "timer-10s",
        }
    }

    fn args(self) -> &'static [&'static str] {
        match self {
            Mode::Disk => &["--wake-sources", "disk", "--housekeeping-interval", "1h"],
            Mode::Timer1s => &["--wake-sources", "timer", "--housekeeping-interval", "1s"],
            Mode::Timer10s => &["--wake-sources", "timer", "--housekeeping-interval", "10s"],
        }
    }

    /// The span a run's start is spread over: the timer's period, or the disk poll's longest
    /// interval.
    fn period(self) -> Duration {
        match self {
            Mode::Disk | Mode::Timer1s => Duration::from_secs(1),
            Mode::Timer10s => Duration::from_secs(10),
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct Opts {
    /// Runs per cell (mode, rate).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Fill rates, MiB/s (or `max`), comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_rate, default_values = ["64", "256", "1024"])]
    rates: Vec<u64>,
    /// Wake modes to compare, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Mode::Disk, Mode::Timer10s])]
    modes: Vec<Mode>,
    /// Size of the tmpfs playing nodefs, MiB.
    #[arg(long = "capacity", value_name = "MiB", default_value_t = 1024)]
    capacity_mib: u64,
    /// The hard nodefs.available threshold, MiB.
    #[arg(long = "threshold", value_name = "MiB", default_value_t = 256)]
    threshold_mib: u64,
    /// How far above the threshold the paced fill starts, MiB.
    #[arg(long = "approach", value_name = "MiB", default_value_t = 256)]
    approach_mib: u64,
    /// Where the CSV goes.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
}

impl Opts {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.runs > 0 && !self.rates.is_empty() && !self.modes.is_empty(), "nothing to run");
        anyhow::ensure!(
            self.threshold_mib + self.approach_mib + 16 < self.capacity_mib,
            "--threshold plus --approach needs a --capacity above {} MiB",
            self.threshold_mib + self.approach_mib + 16
        );
        Ok(())
    }
}

struct Sample {
    mode: Mode,
    rate: u64,
    run: usize,
    achieved: f64,
    detection_ms: Option<f64>,
}

pub fn disk(o: &Opts) -> anyhow::Result<()> {
    eprintln!(
        "[bench] disk: a {} MiB tmpfs as nodefs, nodefs.available<{}Mi, fill from {} MiB above it, modes {:?}, rates {:?} MiB/s, {} runs each",
        o.capacity_mib,
        o.threshold_mib,
        o.approach_mib,
        o.modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
        o.rates.iter().map(|r| rate_name(*r)).collect::<Vec<_>>(),
        o.runs
    );
    let fs = TestTmpfs::new(o.capacity_mib * MI);
    let mut samples = Vec::new();
    for run in 0..o.runs {
        for &mode in &o.modes {
            for &rate in &o.rates {
                let s = one_run(o, &fs, mode, rate, run)?;
                eprintln!(
                    "[bench] {:<9} {:>5} MiB/s run {}: detection {} ms (achieved {:.0} MiB/s)",
                    mode.name(),
                    rate_name(rate),
                    run + 1,
                    s.detection_ms.map_or("-".into(), |d| format!("{d:.2}")),
                    s.achieved
                );
                samples.push(s);
            }
        }
    }
    report(o, &samples)
}

/// evictd on the tmpfs in `mode`: its trace lines arrive on the receiver.
fn start_evictd(
    o: &Opts,
    fs: &TestTmpfs,
    mode: Mode,
) -> anyhow::Result<(std::process::Child, mpsc::Receiver<serde_json::Value>)> {
    let threshold = format!("nodefs.available<{}Mi", o.threshold_mib);
    let mut child = dies_with_harness(Command::new(evictd_binary()).args([
        "--trace",
        "--json",
        "--cri-endpoint",
        "none",
        "--no-kube-api",
        "--duration",
        "120s",
        "--eviction-pressure-transition-period",
        "1s",
        "--eviction-hard",
        &threshold,
    ]))
    .args(mode.args())
    .arg("--nodefs-path")
    .arg(&fs.dir)
    .arg("--imagefs-path")
    .arg(&fs.dir)
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("evictd's stdout"))?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
            if tx.send(v).is_err() {
                return;
            }
        }
    });
    Ok((child, rx))
}

fn one_run(o: &Opts, fs: &TestTmpfs, mode: Mode, rate: u64, run: usize) -> anyhow::Result<Sample> {
    let threshold = o.threshold_mib * MI;
    let (mut evictd, rx) = start_evictd(o, fs, mode)?;
    let first = rx.recv_timeout(Duration::from_secs(10))?;
    anyhow::ensure!(first["type"] == "summary", "evictd's first line is not its summary: {first}");
    fs.append("ballast", fs.available().saturating_sub(threshold + o.approach_mib * MI));
    // A random point of the period (the clock's low bits), then the paced fill.
    let period = mode.period().as_nanos() as u64;
    std::thread::sleep(Duration::from_millis(300) + Duration::from_nanos(monotonic_ns() % period));
    let (crossed_ns, achieved) = fill_until_below(fs, threshold, rate)?;
    let until = Instant::now() + mode.period() + Duration::from_secs(5);
    let mut detection_ms = None;
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        let Ok(v) = rx.recv_timeout(left) else { break };
        if v["type"] == "condition" && v["condition"] == "DiskPressure" && v["status"] == true {
            let observed = v["observed_ns"].as_i64().unwrap_or(0) as u64;
            detection_ms = Some(observed.saturating_sub(crossed_ns) as f64 / 1e6);
            break;
        }
    }
    let _ = evictd.kill();
    let _ = evictd.wait();
    fs.remove("fill");
    fs.remove("ballast");
    Ok(Sample { mode, rate, run, achieved, detection_ms })
}

/// Writes to `fill` at `rate` MiB/s until the filesystem has less than `threshold` bytes
/// available. Returns when that write began (CLOCK_MONOTONIC) and the rate achieved.
fn fill_until_below(fs: &TestTmpfs, threshold: u64, rate: u64) -> anyhow::Result<(u64, f64)> {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(fs.dir.join("fill"))?;
    let chunk = vec![0xa5u8; CHUNK];
    let start = Instant::now();
    let mut written = 0u64;
    loop {
        let due = Duration::from_secs_f64(written as f64 / (rate * MI) as f64);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let began = monotonic_ns();
        f.write_all(&chunk)?;
        written += CHUNK as u64;
        if fs.available() < threshold {
            let secs = start.elapsed().as_secs_f64().max(1e-9);
            return Ok((began, written as f64 / MI as f64 / secs));
        }
        anyhow::ensure!(written < 1 << 40, "the tmpfs never went below the threshold");
    }
}

/// p50, p90 and the maximum of `v` (nearest rank).
fn spread(mut v: Vec<f64>) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    Some((at(0.5), at(0.9), v[v.len() - 1]))
}

fn report(o: &Opts, samples: &[Sample]) -> anyhow::Result<()> {
    std::fs::create_dir_all(&o.out)?;
    let mut csv = String::from("mode,rate_mib_s,run,achieved_mib_s,detection_ms\n");
    for s in samples {
        let d = s.detection_ms.map_or(String::new(), |d| format!("{d:.3}"));
        let _ = writeln!(csv, "{},{},{},{:.0},{d}", s.mode.name(), rate_name(s.rate), s.run, s.achieved);
    }
    let path = o.out.join("disk.csv");
    std::fs::write(&path, csv)?;
    let mut cells: BTreeMap<(u64, Mode), Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        cells.entry((s.rate, s.mode)).or_default().push(s);
    }
    let detection = |rate: u64, mode: Mode| {
        cells.get(&(rate, mode)).and_then(|ss| spread(ss.iter().filter_map(|s| s.detection_ms).collect()))
    };
    println!(
        "{:>6} {:<9} {:>8} | {:>9} {:>9} {:>9} | {:>6} | {:>12}",
        "MiB/s", "mode", "achieved", "det p50", "det p90", "det max", "missed", "p50 vs disk"
    );
    for (&(rate, mode), ss) in &cells {
        let d = spread(ss.iter().filter_map(|s| s.detection_ms).collect());
        let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
        let ratio = match (d, detection(rate, Mode::Disk)) {
            (Some(d), Some(disk)) if mode != Mode::Disk && disk.0 > 0.0 => format!("×{:.0}", d.0 / disk.0),
            _ => "-".into(),
        };
        println!(
            "{:>6} {:<9} {:>8.0} | {:>9} {:>9} {:>9} | {:>3}/{:<2} | {:>12}",
            rate_name(rate),
            mode.name(),
            ss.iter().map(|s| s.achieved).sum::<f64>() / ss.len() as f64,
            f(d.map(|d| d.0)),
            f(d.map(|d| d.1)),
            f(d.map(|d| d.2)),
            ss.iter().filter(|s| s.detection_ms.is_none()).count(),
            ss.len(),
            ratio
        );
    }
    println!(
        "(milliseconds from the write that took nodefs below the threshold to evictd's reading that turned \
         DiskPressure on; missed = no DiskPressure within the mode's period + 5 s)"
    );
    eprintln!("[bench] wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_nearest_rank() {
        assert_eq!(spread(vec![]), None);
        assert_eq!(spread(vec![3.0, 1.0, 2.0]), Some((2.0, 3.0, 3.0)));
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(spread(v), Some((5.0, 9.0, 10.0)));
    }
}
