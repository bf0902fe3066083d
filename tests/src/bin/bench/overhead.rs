//! `cargo xtask bench overhead`: what evictd's probes cost the allocation path.
//!
//! - A page-fault-heavy workload (map, touch every page, unmap, again) runs for a fixed time
//!   without evictd, with evictd as it runs by default on a node far from every threshold
//!   (whole node, `memory.available<100Mi`: the charge programs detached, the poll reading
//!   once a second), and with the charge programs attached as they are within the band near
//!   a threshold (`--charge-probes always`). Each round runs the three arms once, in an
//!   order that cycles through all six so that no arm always follows another (a killed
//!   daemon's programs are freed after an RCU grace period; a started one has just loaded
//!   its binary), each after the same settling time. The cost is the median of the per-round
//!   ratios (arm / without, same round), with a 95 % confidence interval of that median from
//!   order statistics: slow drift of the machine cancels within a round, and the interval
//!   says how far the noise lets the number be trusted.
//! - The BPF programs' own run time per event, from the kernel's BPF statistics
//!   (`BPF_ENABLE_STATS`, on only while this benchmark holds its fd).
//! - The time for a process holding 1 GiB to die after SIGKILL (one probe hit per page
//!   freed), without and with evictd.
//! - evictd's resident memory and its CPU use while the node is idle.
//! - What a churning workload costs evictd near a threshold: a node cgroup kept a few MiB
//!   above one while a tenant maps, touches and unmaps memory (its usage flat); evictd's
//!   charge wakes a second and its CPU.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use evictd::node::memory::MemoryCgroup;
use evictd_tests::{
    MemHog, TestCgroup, api_double::free_port, dies_with_harness, evictd_binary, map_touch_unmap,
    try_http_get,
};

#[derive(clap::Args, Debug)]
pub struct Opts {
    /// Rounds, each measuring without evictd, far from a threshold and near one.
    #[arg(long, default_value_t = 36)]
    rounds: usize,
    /// Length of one arm's fault loop, seconds.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// The wake sources of the "far" daemon (`--wake-sources`), to tell which one costs
    /// what; evictd's defaults when not given.
    #[arg(long, value_name = "LIST")]
    far_wake_sources: Option<String>,
    /// Runs of the hovering measurement (a churning tenant near a threshold).
    #[arg(long, default_value_t = 3)]
    hover_runs: usize,
    /// Where the results go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
}

impl Opts {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.rounds > 0 && self.seconds > 0.0 && self.hover_runs > 0, "nothing to run");
        Ok(())
    }
}

/// Pages faulted in per second: map 64 MiB, touch each page, unmap, repeat. On the last
/// CPU: a loop that migrates between CPUs reads ±5 % between runs here, and evictd, started
/// unpinned, still shares the CPU with it whenever it runs there.
fn fault_rate(seconds: f64) -> f64 {
    let _pin = PinnedToLastCpu::new();
    fault_loop(seconds)
}

/// This thread on the last CPU until dropped (then back on all it had); unpinned when the
/// affinity cannot be set, which only adds noise.
struct PinnedToLastCpu(Option<nix::sched::CpuSet>);

impl PinnedToLastCpu {
    fn new() -> Self {
        use nix::{sched, unistd::Pid};
        let Ok(all) = sched::sched_getaffinity(Pid::from_raw(0)) else { return PinnedToLastCpu(None) };
        let Some(last) = (0..sched::CpuSet::count()).rev().find(|&c| all.is_set(c).unwrap_or(false)) else {
            return PinnedToLastCpu(None);
        };
        let mut one = sched::CpuSet::new();
        let pinned = one.set(last).is_ok() && sched::sched_setaffinity(Pid::from_raw(0), &one).is_ok();
        PinnedToLastCpu(pinned.then_some(all))
    }
}

impl Drop for PinnedToLastCpu {
    fn drop(&mut self) {
        if let Some(all) = &self.0 {
            // Daemons started next inherit this thread's affinity: they must not be pinned.
            let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), all);
        }
    }
}

fn fault_loop(seconds: f64) -> f64 {
    const LEN: std::num::NonZeroUsize = std::num::NonZeroUsize::new(64 << 20).expect("not zero");
    let start = Instant::now();
    let mut pages = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        if map_touch_unmap(LEN).is_err() {
            return 0.0;
        }
        pages += (LEN.get() / 4096) as u64;
    }
    pages as f64 / start.elapsed().as_secs_f64()
}

struct Daemon {
    child: Child,
    /// Its metrics endpoint.
    addr: String,
    /// The arguments it was started with beyond the runtime and the metrics (for errors).
    args: Vec<String>,
}

/// The charge programs attached, as within the band near a threshold.
const NEAR: &[&str] = &["--charge-probes", "always"];

/// Before every arm's fault loop, with or without a daemon (after it is ready): a detached
/// program is freed after an RCU grace period, and the arm without one waits as long so
/// that none starts fresher.
const SETTLE: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arm {
    Without,
    Far,
    Near,
}

/// All six orders of the three arms; round r runs order r mod 6.
const ORDERS: [[Arm; 3]; 6] = {
    use Arm::*;
    [
        [Without, Far, Near],
        [Far, Near, Without],
        [Near, Without, Far],
        [Without, Near, Far],
        [Near, Far, Without],
        [Far, Without, Near],
    ]
};

impl Daemon {
    fn start(args: &[&str]) -> anyhow::Result<Self> {
        let addr = format!("127.0.0.1:{}", free_port());
        let child = dies_with_harness(&mut Command::new(evictd_binary()))
            .args(["--cri-endpoint", "none", "--metrics-addr", &addr])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let mut d = Daemon { child, addr, args: args.iter().map(|a| a.to_string()).collect() };
        d.wait_ready()?;
        std::thread::sleep(SETTLE);
        Ok(d)
    }

    /// Until /readyz answers 200: the first pass is done, and with it the charge programs
    /// detached when every threshold is far (a debug build takes a second or more).
    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = self.addr.clone();
        loop {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!("evictd ended before it was ready ({status}); its arguments: {:?}", self.args);
            }
            if try_http_get(&addr, "/readyz").is_ok_and(|r| r.starts_with("HTTP/1.1 200")) {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "evictd not ready on {addr}/readyz within 60 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its charge wakes so far, from its metrics.
    fn charge_wakes(&self) -> anyhow::Result<u64> {
        let text = try_http_get(&self.addr, "/metrics")?;
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("evictd_wakes_total{cause=\"charge\"} "))
            .ok_or_else(|| anyhow::anyhow!("no charge wake count in evictd's metrics"))?;
        Ok(line.trim().parse::<f64>()? as u64)
    }

    /// The charge tier it runs, from its metrics (the series at 1).
    fn charge_tier(&self) -> anyhow::Result<String> {
        let text = try_http_get(&self.addr, "/metrics")?;
        text.lines()
            .filter_map(|l| l.strip_prefix("evictd_charge_wake_tier{tier=\""))
            .find_map(|l| l.strip_suffix("\"} 1"))
            .map(str::to_owned)
            .ok_or_else(|| anyhow::anyhow!("no charge tier in evictd's metrics"))
    }

    /// Its CPU time so far, seconds.
    fn cpu_seconds(&self) -> anyhow::Result<f64> {
        cpu_seconds(self.pid())
            .ok_or_else(|| anyhow::anyhow!("evictd (pid {}) has no CPU time to read", self.pid()))
    }

    /// An error if it ended: its numbers would be of a daemon that was not there.
    fn still_running(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait()? {
            Some(status) => anyhow::bail!("evictd ended during the measurement ({status})"),
            None => Ok(()),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Ours, by PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The node cgroup that hovers near a threshold, and how far above it: the watermark there
/// is half of it, 1.5 MiB, near its 1 MiB floor.
const HOVER_NODE_MIB: u64 = 1024;
const HOVER_DISTANCE_MIB: i64 = 3;
/// 5 GiB charged in all by each hovering run's churning workload.
const HOVER_CHURN_KIB: usize = 5 << 20;

/// The watermark `HOVER_DISTANCE_MIB` above a threshold: half the distance.
const HOVER_WATERMARK_KIB: usize = ((HOVER_DISTANCE_MIB as usize) << 10) / 2;

/// A churning workload: mappings of `kib`, touched and unmapped on one CPU, or touched on one
/// and unmapped on another (`across`).
#[derive(Clone, Copy)]
struct Churn {
    kib: usize,
    across: Option<(usize, usize)>,
}

impl Churn {
    fn describe(&self) -> String {
        match self.across {
            None => format!("{} KiB mappings", self.kib),
            Some((a, b)) => format!("{} KiB mappings touched on CPU {a} and unmapped on CPU {b}", self.kib),
        }
    }

    fn run(&self, hog: &mut MemHog) -> bool {
        let times = HOVER_CHURN_KIB / self.kib;
        match self.across {
            None => hog.try_churn(self.kib, times),
            Some((a, b)) => hog.try_churn_across(self.kib, times, a, b),
        }
    }
}

/// The churning workloads, in parts of the watermark: a quarter and three quarters (memory
/// charged and freed again cancels in the node's sum: on up to 5 CPUs nothing wakes evictd
/// once running; from 6, what the CPUs hold back at the flush's floor puts the mark under
/// three quarters and a flush), a quarter charged on one CPU and freed on another (cancels there too), and one
/// and a quarter (each mapping takes the node past the watermark for a moment: evictd looks).
/// None takes the node past its threshold.
fn hover_churns() -> Vec<Churn> {
    let part = |num: usize, den: usize| (HOVER_WATERMARK_KIB * num / den / 4).max(1) * 4;
    let mut churns = vec![Churn { kib: part(1, 4), across: None }, Churn { kib: part(3, 4), across: None }];
    if let [a, b] = evictd_tests::allowed_cpus(2)[..] {
        churns.push(Churn { kib: part(1, 4), across: Some((a, b)) });
    }
    churns.push(Churn { kib: part(5, 4), across: None });
    churns
}

/// One hovering run: the churn's rate, evictd's charge wakes a second and its CPU (% of one
/// core) while it ran, and the charge tier that woke it.
struct Hover {
    churn_mib_s: f64,
    wakes_s: f64,
    cpu_pct: f64,
    tier: String,
}

/// evictd watching a node cgroup of `HOVER_NODE_MIB` whose threshold is `HOVER_DISTANCE_MIB`
/// below its free memory (measured with the workload in it), while the workload `churn`s:
/// memory charged and freed at GiB/s, the node's usage flat.
fn hovering(churn: Churn) -> anyhow::Result<Hover> {
    let cg = TestCgroup::new(Some(HOVER_NODE_MIB << 20));
    let mut hog = MemHog::spawn_in(&cg);
    let node = MemoryCgroup::new(&cg.dir, cg.layout.memory_version, false);
    let available_mib = node.read()?.available() >> 20;
    let threshold = format!("memory.available<{}Mi", available_mib - HOVER_DISTANCE_MIB);
    let dir = cg.dir.display().to_string();
    let mut d = Daemon::start(&["--node-cgroup", &dir, "--eviction-hard", &threshold])?;
    let (w0, c0) = (d.charge_wakes()?, d.cpu_seconds()?);
    let t = Instant::now();
    anyhow::ensure!(churn.run(&mut hog), "the churning workload died");
    let secs = t.elapsed().as_secs_f64();
    let (w1, c1) = (d.charge_wakes()?, d.cpu_seconds()?);
    let tier = d.charge_tier()?;
    d.still_running()?;
    Ok(Hover {
        churn_mib_s: HOVER_CHURN_KIB as f64 / 1024.0 / secs,
        wakes_s: w1.saturating_sub(w0) as f64 / secs,
        cpu_pct: (c1 - c0) / secs * 100.0,
        tier,
    })
}

/// The hovering runs' medians, a line for each churning workload (or why it could not run:
/// the rest of the report stands without it). Machines with one CPU have no line for a churn
/// across CPUs.
fn hovering_report(runs: usize) -> String {
    hover_churns().iter().map(|&churn| hovering_line(churn, runs)).collect::<Vec<_>>().join("\n")
}

fn hovering_line(churn: Churn, runs: usize) -> String {
    let what = churn.describe();
    let hover = match (0..runs).map(|_| hovering(churn)).collect::<anyhow::Result<Vec<Hover>>>() {
        Ok(h) => h,
        Err(e) => return format!("hovering near a threshold, {what}: not measured: {e:#}"),
    };
    let m = |f: fn(&Hover) -> f64| median(hover.iter().map(f).collect());
    let mut tiers: Vec<&str> = hover.iter().map(|h| h.tier.as_str()).collect();
    tiers.dedup();
    let (wakes, cpu) = (m(|h| h.wakes_s), m(|h| h.cpu_pct));
    let per_wake = if wakes >= 1.0 {
        format!(", {:.0} µs of it a wake", cpu / 100.0 / wakes * 1e6)
    } else {
        String::new()
    };
    format!(
        "hovering {HOVER_DISTANCE_MIB} MiB above a threshold (watermark {HOVER_WATERMARK_KIB} KiB) beside a workload \
         churning {what} ({:.0} MiB/s): {wakes:.0} charge wakes/s, evictd's CPU {cpu:.1}% of one core{per_wake} \
         (charge tier {}; median of {runs})",
        m(|h| h.churn_mib_s),
        tiers.join(", "),
    )
}

/// SIGKILL → reaped, for a child holding `mib` MiB.
fn exit_time(mib: usize) -> anyhow::Result<f64> {
    let mut child = dies_with_harness(&mut Command::new(std::env::current_exe()?))
        .args(["overhead-hold", &mib.to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    // The child prints a line once its memory is touched.
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
        &mut line,
    )?;
    let t = Instant::now();
    child.kill()?;
    child.wait()?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// The helper child of `exit_time`: holds `mib` MiB, touched, until killed.
pub fn hold(mib: usize) -> ! {
    let v = vec![1u8; mib << 20];
    println!("ready");
    std::hint::black_box(&v);
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// The middle value (the upper one of an even count); `v` must not be empty.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Per-round ratios of an arm to the arm without evictd: their median, and a 95 %
/// confidence interval of that median from order statistics (no assumption on the noise's
/// shape: the true median lies between the k-th smallest and k-th largest ratio with
/// probability ≥ 95 %, k from the binomial distribution).
struct Ratios {
    median: f64,
    /// `None` with fewer than 6 rounds: no interval reaches 95 % then.
    interval: Option<(f64, f64)>,
}

impl Ratios {
    fn of(arm: &[f64], without: &[f64]) -> Self {
        let mut r: Vec<f64> = arm.iter().zip(without).map(|(a, w)| a / w).collect();
        r.sort_by(f64::total_cmp);
        let interval = median_interval_rank(r.len()).map(|k| (r[k], r[r.len() - 1 - k]));
        Ratios { median: median(r), interval }
    }
}

/// The largest 0-based rank k with P(Binomial(n, ½) ≤ k) ≤ 2.5 %: [x_k, x_(n-1-k)] covers
/// the median with at least 95 %.
fn median_interval_rank(n: usize) -> Option<usize> {
    let total = 2f64.powi(i32::try_from(n).ok()?);
    let (mut below, mut choose) = (0.0, 1.0);
    let mut k = None;
    for i in 0..n {
        below += choose;
        if below / total > 0.025 {
            break;
        }
        k = Some(i);
        choose = choose * (n - i) as f64 / (i + 1) as f64;
    }
    k
}

impl std::fmt::Display for Ratios {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.4} ({:+.2}%)", self.median, (self.median - 1.0) * 100.0)?;
        match self.interval {
            Some((lo, hi)) => write!(f, ", 95% interval {lo:.4} to {hi:.4}"),
            None => write!(f, ", too few rounds for a 95% interval"),
        }
    }
}

fn proc_field(pid: u32, file: &str, key: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key)?.split_whitespace().next()?.parse().ok())
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Our programs' total run time and count, summed over the evictd programs loaded now.
fn bpf_totals() -> (u128, u64) {
    // The kernel keeps the first 15 characters of a program's name.
    let ours = [
        "mod_memcg_lruve",
        "mod_memcg_state",
        "page_counter_tr",
        "page_counter_ch",
        "direct_reclaim_",
        "memcg_reclaim_b",
        "mark_victim",
    ];
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str().is_some_and(|n| ours.iter().any(|o| n.starts_with(o))))
        .fold((0, 0), |(t, c), p| (t + p.run_time().as_nanos(), c + p.run_count()))
}

pub fn overhead(o: &Opts) -> anyhow::Result<()> {
    // evictd far from every threshold, as it runs by default (or with the sources asked for).
    let far_args: Vec<&str> = match &o.far_wake_sources {
        Some(list) => vec!["--wake-sources", list.as_str()],
        None => Vec::new(),
    };
    let far_args = far_args.as_slice();
    let far_label =
        o.far_wake_sources.as_deref().map_or("defaults".into(), |l| format!("--wake-sources {l}"));
    eprintln!(
        "[bench] overhead: {} rounds, each {}s without evictd, far from a threshold and near one, order rotating",
        o.rounds, o.seconds
    );
    // Throughput with BPF statistics off: collecting them adds two clock reads to every run.
    let (mut without, mut far, mut with) = (Vec::new(), Vec::new(), Vec::new());
    // What the far daemon itself ran while the loop did: CPU time it took from the machine.
    let mut far_daemon_cpu = 0.0;
    for round in 0..o.rounds {
        for arm in ORDERS[round % ORDERS.len()] {
            let (rates, rate) = match arm {
                Arm::Without => {
                    std::thread::sleep(SETTLE);
                    (&mut without, fault_rate(o.seconds))
                }
                Arm::Far => {
                    let d = Daemon::start(far_args)?;
                    let c0 = cpu_seconds(d.pid()).unwrap_or(0.0);
                    let rate = fault_rate(o.seconds);
                    far_daemon_cpu += cpu_seconds(d.pid()).unwrap_or(0.0) - c0;
                    (&mut far, rate)
                }
                Arm::Near => {
                    let _d = Daemon::start(NEAR)?;
                    (&mut with, fault_rate(o.seconds))
                }
            };
            rates.push(rate);
        }
        eprintln!(
            "[bench] round {}: {:.0} pages/s without, {:.0} far from a threshold ({:.3}), {:.0} near one ({:.3})",
            round + 1,
            without[round],
            far[round],
            far[round] / without[round],
            with[round],
            with[round] / without[round],
        );
    }
    // The programs' own cost, measured apart with statistics on: near a threshold, and far
    // from one (where none of them should run at all while pages are faulted).
    let programs_during_faults = |args: &[&str]| -> anyhow::Result<(u128, u64, u64)> {
        let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .map_err(|e| anyhow::anyhow!("enabling BPF run-time statistics: {e}"))?;
        let d = Daemon::start(args)?;
        let (t0, c0) = bpf_totals();
        let pages = (fault_rate(o.seconds) * o.seconds) as u64;
        let (t1, c1) = bpf_totals();
        drop(d);
        Ok((t1.saturating_sub(t0), c1.saturating_sub(c0), pages))
    };
    let (bpf_ns, bpf_runs, _) = programs_during_faults(NEAR)?;
    let (_, far_bpf_runs, far_pages) = programs_during_faults(far_args)?;
    let (mw, mf, mi) = (median(without.clone()), median(far.clone()), median(with.clone()));
    let far_ratios = Ratios::of(&far, &without);
    let near_ratios = Ratios::of(&with, &without);

    let mut exit_without = Vec::new();
    let mut exit_with = Vec::new();
    for _ in 0..3 {
        exit_without.push(exit_time(1024)?);
    }
    let d = Daemon::start(NEAR)?;
    for _ in 0..3 {
        exit_with.push(exit_time(1024)?);
    }
    drop(d);
    // Memory and idle CPU as it runs by default: the poll's read a second is all it does.
    let d = Daemon::start(far_args)?;
    let rss_kib = proc_field(d.pid(), "status", "VmRSS:").unwrap_or(0);
    let c0 = cpu_seconds(d.pid()).unwrap_or(0.0);
    std::thread::sleep(Duration::from_secs(5));
    let idle_cpu = (cpu_seconds(d.pid()).unwrap_or(0.0) - c0) / 5.0 * 100.0;
    drop(d);

    let hover = hovering_report(o.hover_runs);

    let per_event = if bpf_runs > 0 { bpf_ns as f64 / bpf_runs as f64 } else { f64::NAN };
    let report = format!(
        "page-fault throughput ({} rounds of {}s per arm; medians): {mw:.0} pages/s without evictd, \
         {mf:.0} with evictd far from every threshold ({far_label}), {mi:.0} with the charge programs attached (near one)\n\
         far from every threshold / without, median of per-round ratios: {far_ratios}\n\
         near one (charge programs attached) / without, median of per-round ratios: {near_ratios}\n\
         far from every threshold, what evictd ran: {far_bpf_runs} runs of its BPF programs while {far_pages} pages were faulted; \
         its own CPU {:.2}% of the fault loop's time ({:.0} ms in {:.1} s)\n\
         BPF programs: {bpf_runs} runs, {per_event:.0} ns per run on average\n\
         process exit after SIGKILL holding 1 GiB: {:.1} ms without, {:.1} ms with the charge programs attached (median of 3)\n\
         evictd ({far_label}, far from every threshold): RSS {:.1} MiB, idle CPU {idle_cpu:.2}% of one core (5 s, no workload)\n\
         {hover}\n",
        o.rounds,
        o.seconds,
        far_daemon_cpu / (o.rounds as f64 * o.seconds) * 100.0,
        far_daemon_cpu * 1e3,
        o.rounds as f64 * o.seconds,
        median(exit_without),
        median(exit_with),
        rss_kib as f64 / 1024.0,
    );
    print!("{report}");
    std::fs::create_dir_all(&o.out)?;
    std::fs::write(o.out.join("overhead.txt"), &report)?;
    let mut csv = String::from("round,order,without_pages_s,far_pages_s,near_pages_s\n");
    for (i, ((a, f), b)) in without.iter().zip(&far).zip(&with).enumerate() {
        let order: Vec<String> = ORDERS[i % ORDERS.len()].iter().map(|a| format!("{a:?}")).collect();
        csv += &format!("{},{},{a:.0},{f:.0},{b:.0}\n", i + 1, order.join("-"));
    }
    std::fs::write(o.out.join("overhead.csv"), csv)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the published table of the sign test's 95 % ranks (1-based: n = 6 → 1,
    /// n = 10 → 2, n = 18 → 5, n = 30 → 10).
    #[test]
    fn the_median_interval_matches_the_sign_test_table() {
        assert_eq!(median_interval_rank(5), None);
        assert_eq!(median_interval_rank(6), Some(0));
        assert_eq!(median_interval_rank(10), Some(1));
        assert_eq!(median_interval_rank(18), Some(4));
        assert_eq!(median_interval_rank(30), Some(9));
    }

    #[test]
    fn ratios_pair_each_round_with_its_own_baseline() {
        let without = [100.0, 200.0, 100.0, 200.0, 100.0, 200.0];
        let arm = [99.0, 198.0, 99.0, 198.0, 99.0, 198.0];
        let r = Ratios::of(&arm, &without);
        assert!((r.median - 0.99).abs() < 1e-12);
        assert_eq!(
            r.interval.map(|(lo, hi)| ((lo * 100.0).round(), (hi * 100.0).round())),
            Some((99.0, 99.0))
        );
    }
}
