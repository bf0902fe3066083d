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

const MI: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    Ebpf,
    Eventfd,
    Psi,
    Poll100ms,
    Poll10s,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Ebpf => "ebpf",
            Mode::Eventfd => "eventfd",
            Mode::Psi => "psi",
            Mode::Poll100ms => "poll-100ms",
            Mode::Poll10s => "poll-10s",
        }
    }

    fn parse(s: &str) -> Option<Mode> {
        [Mode::Ebpf, Mode::Eventfd, Mode::Psi, Mode::Poll100ms, Mode::Poll10s]
            .into_iter()
            .find(|m| m.name() == s)
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

pub struct Opts {
    runs: usize,
    rates: Vec<u64>,
    modes: Vec<Mode>,
    capacity_mib: u64,
    threshold_mib: u64,
    out: PathBuf,
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

pub fn parse_opts(args: &[String]) -> anyhow::Result<Opts> {
    let mut o = Opts {
        runs: 5,
        rates: vec![256, 1024, 4096],
        modes: vec![Mode::Ebpf, Mode::Eventfd, Mode::Psi, Mode::Poll100ms, Mode::Poll10s],
        capacity_mib: 2048,
        threshold_mib: 256,
        out: PathBuf::from("target/bench"),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| anyhow::anyhow!("{flag} needs a value"));
        match flag.as_str() {
            "--runs" => o.runs = value()?.parse()?,
            "--rates" => o.rates = value()?.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "--modes" => {
                o.modes = value()?
                    .split(',')
                    .map(|m| Mode::parse(m).ok_or_else(|| anyhow::anyhow!("--modes: unknown mode {m:?}")))
                    .collect::<Result<_, _>>()?
            }
            "--capacity" => o.capacity_mib = value()?.parse()?,
            "--threshold" => o.threshold_mib = value()?.parse()?,
            "--out" => o.out = value()?.into(),
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    anyhow::ensure!(o.runs > 0 && !o.rates.is_empty() && !o.modes.is_empty(), "nothing to run");
    anyhow::ensure!(o.threshold_mib < o.capacity_mib, "--threshold must be below --capacity");
    Ok(o)
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
                let s = one_run(&mut ctd, &evictd, &node, mode, rate, run, cap, o.threshold_mib * MI).await?;
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

#[allow(clippy::too_many_arguments)]
async fn one_run(
    ctd: &mut Containerd,
    evictd: &Evictd,
    node: &Path,
    mode: Mode,
    rate: u64,
    run: usize,
    cap: u64,
    threshold: u64,
) -> anyhow::Result<Sample> {
    let name = format!("w{}r{rate}n{run}", mode.name().replace('-', ""));
    let pod = ctd
        .run_pod(PodSpec {
            name: &name,
            qos: "besteffort",
            memory_limit: None,
            oom_score_adj: 1000,
            annotations: Default::default(),
            ignore_sigterm: false,
            termination_grace_seconds: 30,
            hog_args: Some(vec!["rate".into(), rate.to_string(), "/ctl/go".into(), "/ctl/alloc.log".into()]),
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

/// One table row: rate, mode, detection p50 and p99, OOM-first count, runs.
type Row = (u64, Mode, Option<f64>, Option<f64>, usize, usize);

/// Whether the runtime reports the container as killed by the kernel OOM killer.
async fn oom_killed(ctd: &Containerd, container: &str) -> bool {
    let Ok(st) = ctd.client().container_status(container).await else { return false };
    st.status.is_some_and(|s| s.reason == "OOMKilled")
}

fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied()
}

fn report(o: &Opts, samples: &[Sample]) -> anyhow::Result<()> {
    std::fs::create_dir_all(&o.out)?;
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
    std::fs::write(o.out.join("reaction.csv"), &csv)?;
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
        let mut det: Vec<f64> = ss.iter().filter_map(|s| s.detection_ms).collect();
        let mut kill: Vec<f64> = ss.iter().filter_map(|s| s.kill_ms).collect();
        det.sort_by(f64::total_cmp);
        kill.sort_by(f64::total_cmp);
        let achieved = ss.iter().map(|s| s.achieved_rate).sum::<f64>() / ss.len() as f64;
        let ooms = ss.iter().filter(|s| s.oom_first).count();
        let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
        println!(
            "{:<10} {:>8} {:>9.0} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>5}/{:<3}",
            mode.name(),
            rate,
            achieved,
            f(percentile(&det, 0.5)),
            f(percentile(&det, 0.99)),
            f(det.last().copied()),
            f(percentile(&kill, 0.5)),
            f(percentile(&kill, 0.99)),
            f(kill.last().copied()),
            ooms,
            ss.len()
        );
        rows.push((*rate, *mode, percentile(&det, 0.5), percentile(&det, 0.99), ooms, ss.len()));
    }
    println!(
        "(milliseconds from the node crossing the threshold; detection = evictd's decision, kill = the pod's processes gone)"
    );
    std::fs::write(o.out.join("reaction.svg"), svg(&rows, &o.rates, &o.modes))?;
    eprintln!(
        "[bench] wrote {} and {}",
        o.out.join("reaction.csv").display(),
        o.out.join("reaction.svg").display()
    );
    Ok(())
}

/// Bars of p50 detection latency (log scale) per rate and mode, with a tick at p99;
/// modes where the kernel OOM killer always came first are drawn as a cross.
fn svg(rows: &[Row], rates: &[u64], modes: &[Mode]) -> String {
    const COLORS: [&str; 5] = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e"];
    let (w, h, left, top, bottom) = (960.0, 420.0, 70.0, 40.0, 60.0);
    let (lo, hi) = (-2.0f64, 5.0f64); // 0.01 ms .. 100 s
    let y = |ms: f64| top + (h - top - bottom) * (1.0 - (ms.max(0.01).log10() - lo) / (hi - lo));
    let group_w = (w - left - 20.0) / rates.len() as f64;
    let bar_w = group_w / (modes.len() as f64 + 1.0);
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\
         <text x='{left}' y='20' font-size='14'>evictd detection latency, p50 bar and p99 tick (ms, log scale)</text>"
    );
    for e in -2..=5 {
        let yy = y(10f64.powi(e));
        let _ = write!(
            s,
            "<line x1='{left}' x2='{}' y1='{yy}' y2='{yy}' stroke='#ddd'/><text x='{}' y='{}' text-anchor='end'>{}</text>",
            w - 20.0,
            left - 6.0,
            yy + 4.0,
            10f64.powi(e)
        );
    }
    for (gi, rate) in rates.iter().enumerate() {
        let gx = left + gi as f64 * group_w;
        let _ = write!(
            s,
            "<text x='{}' y='{}' text-anchor='middle'>{rate} MiB/s</text>",
            gx + group_w / 2.0,
            h - 30.0
        );
        for (mi, mode) in modes.iter().enumerate() {
            let x = gx + bar_w * (mi as f64 + 0.5);
            let color = COLORS[mi % COLORS.len()];
            let row = rows.iter().find(|r| r.0 == *rate && r.1 == *mode);
            match row {
                Some((_, _, Some(p50), p99, _, _)) => {
                    let yy = y(*p50);
                    let _ = write!(
                        s,
                        "<rect x='{x}' y='{yy}' width='{}' height='{}' fill='{color}'/>",
                        bar_w * 0.9,
                        (h - bottom - yy).max(0.0)
                    );
                    if let Some(p99) = p99 {
                        let y99 = y(*p99);
                        let _ = write!(
                            s,
                            "<line x1='{x}' x2='{}' y1='{y99}' y2='{y99}' stroke='black' stroke-width='2'/>",
                            x + bar_w * 0.9
                        );
                    }
                }
                _ => {
                    let yy = h - bottom - 10.0;
                    let _ = write!(
                        s,
                        "<text x='{}' y='{yy}' fill='{color}' text-anchor='middle'>×</text>",
                        x + bar_w * 0.45
                    );
                }
            }
        }
    }
    for (mi, mode) in modes.iter().enumerate() {
        let x = left + mi as f64 * 150.0;
        let _ = write!(
            s,
            "<rect x='{x}' y='{}' width='12' height='12' fill='{}'/><text x='{}' y='{}'>{}</text>",
            h - 18.0,
            COLORS[mi % COLORS.len()],
            x + 16.0,
            h - 8.0,
            mode.name()
        );
    }
    s.push_str("</svg>\n");
    s
}
