//! `cargo xtask bench scale`: evictd on a node of N pods under the real containerd (N = 10,
//! 110, 250 by default: the kubelet's default maximum and a raised one), one of them with a
//! volume of a million files. The pods are added between steps, so every N runs on the same
//! runtime and the same volume. At each N:
//! - idle: evictd with its defaults (inventory every 2 s, housekeeping every 10 s) and every
//!   pod's volumes walked every 10 s, for `IDLE` — its CPU without the disk walker, the
//!   walker's CPU (one walk of everything falls in the window), its RSS;
//! - reaction, twice: a pod allocating at 1 GiB/s past `memory.available<100Mi`, as in
//!   `bench reaction` (the same clocks and columns), once with the disk walker idle and once
//!   walking all the time (a nodefs threshold makes it walk every pod, every 200 ms), to show
//!   whether a running walk changes detection; evictd's own decision time (`decide_us`: the
//!   pods' usage read and ranked) is the pass column.
//!
//! The node cgroup's limit is set at each N to its working set + 1 GiB + the threshold, so
//! the victim meets the same room at every N.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use evictd::node::{cgroups::CgroupMounts, memory::MemoryCgroup};
use evictd_tests::{
    containerd::{Containerd, PodSpec, TestPod},
    evictd_proc::{Evictd, process_cpu_s, thread_cpu_s, thread_faults},
};

use crate::{
    plot,
    reaction::{
        self, Cell, KillPath, Mode, Percentiles, Reactor, Running, Sample, Workload, percentile_cell as f,
    },
};

const MI: u64 = 1 << 20;
/// What each ordinary pod holds.
const POD_MIB: u64 = 4;
/// Every this many pods, one keeps `FORK_PROCESSES` sleeping processes instead.
const FORK_EVERY: usize = 10;
const FORK_PROCESSES: u64 = 16;
/// The room the victim grows through before it crosses the threshold.
const ROOM: u64 = 1024 * MI;
/// The pod whose volume holds the files.
const FILES_POD: &str = "files";
/// How long evictd is watched idle.
const IDLE: Duration = Duration::from_secs(15);

#[derive(clap::Args, Debug)]
pub struct Opts {
    /// Pod counts, comma-separated, ascending (pods are added between steps).
    #[arg(long, value_delimiter = ',', default_values_t = [10, 110, 250])]
    pods: Vec<usize>,
    /// Evictions per pod count and walker state.
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Empty files in the one pod's volume (a walk's cost is per entry).
    #[arg(long, default_value_t = 1_000_000)]
    files: usize,
    /// The victim's allocation rate, MiB/s (or `max`).
    #[arg(long, value_parser = reaction::parse_rate, default_value = "1024")]
    rate: u64,
    /// The hard memory.available threshold, MiB (the kubelet's default is 100).
    #[arg(long = "threshold", value_name = "MiB", default_value_t = 100)]
    threshold_mib: u64,
    /// Where the CSVs and plots go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
}

impl Opts {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.runs > 0 && !self.pods.is_empty(), "nothing to run");
        anyhow::ensure!(self.pods.iter().all(|n| *n > 0), "--pods: every count must be at least 1");
        anyhow::ensure!(self.pods.windows(2).all(|w| w[0] < w[1]), "--pods: counts must ascend");
        Ok(())
    }
}

/// What one N measured beside its runs.
#[derive(Clone, Debug, Default)]
struct Step {
    pods: usize,
    /// evictd idle with its defaults: CPU % of one CPU without the walker thread, the part
    /// of it on the daemon's (real-time) thread, and the walker's CPU seconds over the same
    /// window (one walk of everything).
    idle_cpu_pct: f64,
    daemon_cpu_pct: f64,
    walk_cpu_s: f64,
    /// Resident memory (KiB): idle, and after the runs with the walker busy.
    idle_rss_kib: u64,
    /// Of the idle resident memory, the anonymous part (heaps, stacks): what grows with the
    /// pods; the rest is code, libraries and the BPF maps mapped in.
    idle_anon_kib: u64,
    busy_rss_kib: u64,
    /// Of it, the anonymous part.
    busy_anon_kib: u64,
    /// Resident memory (KiB) and its anonymous part after the runs with the walker off:
    /// beside `busy_rss_kib`, what the evictions hold apart from the walks.
    runs_rss_kib: u64,
    runs_anon_kib: u64,
    /// The walker's share of one CPU while the walking runs ran.
    walker_busy_pct: f64,
}

/// One run, tagged with its N and the walker's state.
struct Run {
    pods: usize,
    walking: bool,
    sample: Sample,
    /// Page faults of evictd's real-time threads (the daemon's and the reader's) over the
    /// run: the heap reserve and the locked pages are meant to leave none after the first.
    rt_faults: u64,
}

/// The page faults of evictd's real-time threads so far.
fn rt_faults(pid: u32) -> u64 {
    thread_faults(pid, "evictd") + thread_faults(pid, "evictd-reads")
}

pub async fn scale(o: &Opts) -> anyhow::Result<()> {
    let most = *o.pods.last().unwrap_or(&0);
    eprintln!(
        "[bench] scale: {:?} pods ({} MiB each, one in {FORK_EVERY} with {FORK_PROCESSES} processes), one volume of {} files, \
         memory.available<{}Mi crossed at {} MiB/s, {} runs per step and walker state",
        o.pods,
        POD_MIB,
        o.files,
        o.threshold_mib,
        reaction::rate_name(o.rate),
        o.runs
    );
    eprintln!("[bench] evictd under test: {}", evictd_tests::evictd_binary().display());
    let mut ctd = Containerd::start(ROOM * 2 + most as u64 * 16 * MI);
    let layout = CgroupMounts::detect()?;
    let memory = MemoryCgroup::new(ctd.node_dir(), layout.memory_version, false);
    let kubelet = ctd.tmp.join("kubelet");
    let mut pods = vec![files_pod(&mut ctd, &kubelet, o.files).await?];
    let (mut steps, mut runs) = (Vec::new(), Vec::new());
    let cell = Cell {
        threshold_mib: o.threshold_mib,
        rate: o.rate,
        reactor: Reactor::Evictd(Mode::All, KillPath::Default),
    };
    let work = Workload { hold_mib: 0, ignore_sigterm: false };
    for &n in &o.pods {
        add_pods(&mut ctd, &mut pods, n).await;
        let capacity = reaction::working_set(&memory) + ROOM + o.threshold_mib * MI;
        ctd.set_node_limit(capacity);
        let node = reaction::Node { memory: memory.clone(), capacity };
        let pods_file = ctd.tmp.join("pods.json");
        write_pods_file(&pods_file, &pods)?;
        let mut step = idle(&ctd, &pods_file, &kubelet, o.threshold_mib, n).await;
        for walking in [false, true] {
            let walker = if walking { Walker::Busy } else { Walker::Off };
            let evictd = start_evictd(&ctd, &pods_file, &kubelet, o.threshold_mib, walker);
            let pid = evictd.pid();
            let walker0 = (thread_cpu_s(pid, "evictd-disk"), Instant::now());
            let running = Running::Evictd(evictd);
            for run in 0..o.runs {
                let victim = reaction::start_victim(&mut ctd, work, cell, run).await;
                // evictd's inventory (every 2 s by default) must list the victim first.
                tokio::time::sleep(Duration::from_millis(2200)).await;
                let faults0 = rt_faults(pid);
                let sample = reaction::one_run(&mut ctd, &running, &node, work, cell, run, victim).await?;
                // A stuck reader that ends mid-run takes its count with it: never below zero.
                let faults = rt_faults(pid).saturating_sub(faults0);
                eprintln!(
                    "[bench] {n} pods, walker {}: {} decide {}, {faults} page faults on the real-time threads",
                    walker_state(walking),
                    reaction::describe(&sample),
                    sample.decide_ms.map_or("-".into(), |d| format!("{d:.2} ms"))
                );
                runs.push(Run { pods: n, walking, sample, rt_faults: faults });
            }
            // evictd's own log and its `--trace --json` lines beside the CSV: what it says of a
            // run whose numbers stand out (how long an attach took, a read given up on, each
            // wake before the decision with the node's reading) is there to explain it.
            if let Running::Evictd(evictd) = &running {
                let stem = format!("scale-evictd-{n}-{}", walker_state(walking));
                std::fs::create_dir_all(&o.out)?;
                let log = o.out.join(format!("{stem}.log"));
                std::fs::write(&log, evictd.log()).map_err(|e| anyhow::anyhow!("{}: {e}", log.display()))?;
                let trace = o.out.join(format!("{stem}.trace.jsonl"));
                let lines: String = evictd.trace().iter().map(|v| format!("{v}\n")).collect();
                std::fs::write(&trace, lines).map_err(|e| anyhow::anyhow!("{}: {e}", trace.display()))?;
                // Where its resident memory is, mapping by mapping (heap, each thread's arena
                // and stack, code): what a reading over the target is made of.
                let smaps = o.out.join(format!("{stem}.smaps"));
                match std::fs::read_to_string(format!("/proc/{pid}/smaps")) {
                    Ok(text) => std::fs::write(&smaps, text)
                        .map_err(|e| anyhow::anyhow!("{}: {e}", smaps.display()))?,
                    Err(e) => eprintln!("[bench] evictd's smaps not kept: /proc/{pid}/smaps: {e}"),
                }
            }
            let after = (rss_kib(pid), anon_kib(pid));
            if walking {
                let (cpu0, t0) = walker0;
                step.walker_busy_pct =
                    100.0 * (thread_cpu_s(pid, "evictd-disk") - cpu0) / t0.elapsed().as_secs_f64();
                (step.busy_rss_kib, step.busy_anon_kib) = after;
            } else {
                (step.runs_rss_kib, step.runs_anon_kib) = after;
            }
            eprintln!(
                "[bench] {n} pods, walker {}: after the runs RSS {} KiB ({} KiB anonymous)",
                walker_state(walking),
                after.0,
                after.1
            );
        }
        steps.push(step);
    }
    report(o, &steps, &runs)?;
    // A run evictd did not answer, or the kernel's OOM killer answered first, is a failure,
    // the smoke run's included.
    let failed: Vec<String> = runs
        .iter()
        .filter(|r| r.sample.oom_first || r.sample.detection_ms.is_none())
        .map(|r| format!("{} pods, walker {}, run {}", r.pods, walker_state(r.walking), r.sample.run + 1))
        .collect();
    anyhow::ensure!(
        failed.is_empty(),
        "evictd did not evict before the kernel's OOM killer, or not at all, in {} of {} runs: {}",
        failed.len(),
        runs.len(),
        failed.join("; ")
    );
    Ok(())
}

/// The walker's state as the table, the CSV and the log name it.
fn walker_state(walking: bool) -> &'static str {
    if walking { "walking" } else { "idle" }
}

/// The pod whose volume (an emptyDir where the kubelet makes one) holds `files` empty files,
/// a thousand per directory, made by this process on the machine's disk.
async fn files_pod(ctd: &mut Containerd, kubelet: &Path, files: usize) -> anyhow::Result<TestPod> {
    let pod = ctd
        .run_pod(PodSpec { empty_dir_under: Some(kubelet.into()), ..PodSpec::besteffort(FILES_POD) })
        .await;
    pod.set_mib(POD_MIB);
    let volume = kubelet.join("pods").join(&pod.uid).join("volumes/kubernetes.io~empty-dir/scratch");
    let t = Instant::now();
    for i in 0..files {
        let dir = volume.join(format!("d{}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir(&dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
        }
        let f = dir.join(format!("f{}", i % 1000));
        std::fs::File::create(&f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
        if (i + 1) % 100_000 == 0 {
            eprintln!(
                "[bench] {} of {files} files in the volume ({:.0} s)",
                i + 1,
                t.elapsed().as_secs_f64()
            );
        }
    }
    Ok(pod)
}

/// Starts pods until there are `n`: most hold `POD_MIB`, one in `FORK_EVERY` keeps
/// `FORK_PROCESSES` sleeping processes.
async fn add_pods(ctd: &mut Containerd, pods: &mut Vec<TestPod>, n: usize) {
    let from = pods.len();
    let t = Instant::now();
    while pods.len() < n {
        let i = pods.len();
        let name = format!("pod{i}");
        let pod = if i % FORK_EVERY == FORK_EVERY - 1 {
            let fork = Some(["fork", "/ctl/mib"].map(String::from).to_vec());
            let pod = ctd.run_pod(PodSpec { hog_args: fork, ..PodSpec::besteffort(&name) }).await;
            pod.set_mib(FORK_PROCESSES);
            pod
        } else {
            let pod = ctd.run_pod(PodSpec::besteffort(&name)).await;
            pod.set_mib(POD_MIB);
            pod
        };
        pods.push(pod);
        if (i + 1).is_multiple_of(50) {
            eprintln!("[bench] {} of {n} pods running ({:.0} s)", i + 1, t.elapsed().as_secs_f64());
        }
    }
    for (i, pod) in pods.iter().enumerate().skip(from) {
        if i % FORK_EVERY != FORK_EVERY - 1 {
            pod.wait_usage_at_least(POD_MIB * MI, Duration::from_secs(30));
        }
    }
    eprintln!("[bench] {n} pods running");
}

/// How the disk walker runs beside a reaction.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walker {
    /// No disk threshold and no storage limits: nothing to walk.
    Off,
    /// A nodefs threshold that is never met: every pod walked every 10 s (the default is a
    /// minute; the walk at start sees no pods yet), so one walk falls in the idle window.
    Periodic,
    /// The same walked every 200 ms: a walk of the million files is always running.
    Busy,
}

/// evictd on the node with the memory threshold; otherwise its defaults but for the walker's.
fn start_evictd(ctd: &Containerd, pods: &Path, kubelet: &Path, threshold_mib: u64, walker: Walker) -> Evictd {
    let mut thresholds = format!("memory.available<{threshold_mib}Mi");
    if walker != Walker::Off {
        thresholds.push_str(",nodefs.available<1Mi");
    }
    let period = if walker == Walker::Busy { "200ms" } else { "10s" };
    let (kubelet, root) = (kubelet.display().to_string(), ctd.root.display().to_string());
    let args = [
        "--eviction-hard",
        &thresholds,
        "--nodefs-path",
        &kubelet,
        "--imagefs-path",
        &root,
        "--inventory-interval",
        "2s",
        "--housekeeping-interval",
        "10s",
        "--volume-stats-agg-period",
        period,
    ];
    Evictd::start(ctd, Some(pods), &args)
}

/// The node's pods as the API would list them (`--pods-file`): the kubelet measures only
/// the volumes a pod's spec declares, so the files pod declares its emptyDir. The victims
/// are not listed: evictd infers their specs from the runtime.
fn write_pods_file(path: &Path, pods: &[TestPod]) -> anyhow::Result<()> {
    let items: Vec<serde_json::Value> = pods
        .iter()
        .map(|p| {
            let mut spec = serde_json::json!({"containers": [{"name": "hog"}]});
            if p.name == FILES_POD {
                spec["volumes"] = serde_json::json!([{"name": "scratch", "emptyDir": {}}]);
            }
            serde_json::json!({
                "metadata": {"name": p.name, "namespace": "e2e", "uid": p.uid},
                "spec": spec,
                "status": {"phase": "Running"},
            })
        })
        .collect();
    let list = serde_json::json!({"kind": "PodList", "items": items});
    std::fs::write(path, list.to_string()).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// evictd idle with its defaults (but for the walker's period, `Walker::Periodic`),
/// watched for `IDLE`.
async fn idle(ctd: &Containerd, pods: &Path, kubelet: &Path, threshold_mib: u64, n: usize) -> Step {
    let mut evictd = start_evictd(ctd, pods, kubelet, threshold_mib, Walker::Periodic);
    let pid = evictd.pid();
    let cpu = || (process_cpu_s(pid), thread_cpu_s(pid, "evictd-disk"), thread_cpu_s(pid, "evictd"));
    let ((all0, walk0, daemon0), t0) = (cpu(), Instant::now());
    tokio::time::sleep(IDLE).await;
    let wall = t0.elapsed().as_secs_f64();
    let (all, walk, daemon) = cpu();
    let walk = walk - walk0;
    let step = Step {
        pods: n,
        idle_cpu_pct: 100.0 * (all - all0 - walk) / wall,
        daemon_cpu_pct: 100.0 * (daemon - daemon0) / wall,
        walk_cpu_s: walk,
        idle_rss_kib: rss_kib(pid),
        idle_anon_kib: anon_kib(pid),
        ..Step::default()
    };
    evictd.terminate(Duration::from_secs(5));
    eprintln!(
        "[bench] {n} pods idle: {:.2} % CPU without the walker ({:.2} % on the daemon's thread), walker {:.2} CPU \
         s, RSS {} KiB ({} KiB anonymous)",
        step.idle_cpu_pct, step.daemon_cpu_pct, step.walk_cpu_s, step.idle_rss_kib, step.idle_anon_kib
    );
    step
}

fn rss_kib(pid: u32) -> u64 {
    status(pid).and_then(|s| s.vmrss).unwrap_or(0)
}

fn anon_kib(pid: u32) -> u64 {
    status(pid).and_then(|s| s.rssanon).unwrap_or(0)
}

fn status(pid: u32) -> Option<procfs::process::Status> {
    procfs::process::Process::new(pid as i32).and_then(|p| p.status()).ok()
}

/// The table, `scale.csv` (one line per run), `scale-steps.csv` (one per N) and the cost
/// curve (`scale.{svg,png}`).
fn report(o: &Opts, steps: &[Step], runs: &[Run]) -> anyhow::Result<()> {
    std::fs::create_dir_all(&o.out)?;
    let f = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    let mut csv = String::from(
        "pods,walker,run,detection_ms,stop_ms,freed_ms,decide_ms,victim_gib,oom_first,rt_faults,\
         wake_ms,delivery_ms,observe_ms,wake_cause,read_ms,crossing_page_ms\n",
    );
    for r in runs {
        let s = &r.sample;
        let b = s.before_pass.as_ref();
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{:.2},{},{},{},{},{},{},{},{}",
            r.pods,
            walker_state(r.walking),
            s.run,
            f(s.detection_ms),
            f(s.stop_ms),
            f(s.freed_ms),
            f(s.decide_ms),
            s.victim_gib,
            s.oom_first,
            r.rt_faults,
            f(b.map(|b| b.wake_ms)),
            f(b.map(|b| b.delivery_ms)),
            f(b.map(|b| b.observe_ms)),
            b.map_or("", |b| b.cause.as_str()),
            f(b.and_then(|b| b.read_ms)),
            f(b.and_then(|b| b.page_ms))
        );
    }
    std::fs::write(o.out.join("scale.csv"), csv)?;
    let mut csv = String::from(
        "pods,idle_cpu_pct,daemon_thread_cpu_pct,walk_cpu_s,idle_rss_kib,busy_rss_kib,walker_busy_pct,idle_rss_anon_kib,\
         busy_rss_anon_kib,runs_rss_kib,runs_rss_anon_kib\n",
    );
    for s in steps {
        let _ = writeln!(
            csv,
            "{},{:.3},{:.3},{:.3},{},{},{:.1},{},{},{},{}",
            s.pods,
            s.idle_cpu_pct,
            s.daemon_cpu_pct,
            s.walk_cpu_s,
            s.idle_rss_kib,
            s.busy_rss_kib,
            s.walker_busy_pct,
            s.idle_anon_kib,
            s.busy_anon_kib,
            s.runs_rss_kib,
            s.runs_anon_kib
        );
    }
    std::fs::write(o.out.join("scale-steps.csv"), csv)?;
    let cells = table(steps, runs);
    if let (Some(a), Some(b)) = (steps.first(), steps.last())
        && b.pods > a.pods
    {
        let span = (b.pods - a.pods) as f64;
        let per_pod = |from: u64, to: u64| (to as f64 - from as f64) / span;
        println!(
            "evictd's resident memory per pod: {:.1} KiB ({} → {} KiB from {} to {} pods, walker busy); idle {:.1} KiB, \
             of it anonymous {:.1} KiB ({} → {} KiB)",
            per_pod(a.busy_rss_kib, b.busy_rss_kib),
            a.busy_rss_kib,
            b.busy_rss_kib,
            a.pods,
            b.pods,
            per_pod(a.idle_rss_kib, b.idle_rss_kib),
            per_pod(a.idle_anon_kib, b.idle_anon_kib),
            a.idle_anon_kib,
            b.idle_anon_kib
        );
    }
    before_pass_table(runs);
    plot_cost_curve(&o.out, &cells)?;
    for name in ["scale.csv", "scale-steps.csv"] {
        eprintln!("[bench] wrote {}", o.out.join(name).display());
    }
    Ok(())
}

/// The percentiles of one N and walker state.
struct CellStats {
    pods: usize,
    walking: bool,
    detection: Option<Percentiles>,
    decide: Option<Percentiles>,
}

/// Prints one row per N and walker state; returns their percentiles for the plot.
fn table(steps: &[Step], runs: &[Run]) -> Vec<CellStats> {
    let mut groups: BTreeMap<(usize, bool), Vec<&Run>> = BTreeMap::new();
    for r in runs {
        groups.entry((r.pods, r.walking)).or_default().push(r);
    }
    println!(
        "{:>5} {:<7} | {:>7} {:>7} | {:>7} {:>7} | {:>7} {:>7} | {:>7} | {:>5} | {:>8} {:>8} {:>6} {:>6} {:>7} | {:>9} | {:>9}",
        "pods",
        "walker",
        "det p50",
        "det p99",
        "dec p50",
        "dec p99",
        "stop50",
        "p99",
        "freed50",
        "busy%",
        "RSS idle",
        "RSS busy",
        "CPU%",
        "thr%",
        "walk s",
        "OOM first",
        "rt faults"
    );
    let mut cells = Vec::new();
    for ((pods, walking), rs) in &groups {
        let ss: Vec<&Sample> = rs.iter().map(|r| &r.sample).collect();
        let p = |pick: fn(&Sample) -> Option<f64>| reaction::percentiles(ss.iter().filter_map(|s| pick(s)));
        // The first run of an evictd faults its kill path's code in; the later ones should not.
        let first_faults = rs.first().map_or(0, |r| r.rt_faults);
        let later_faults = rs.iter().skip(1).map(|r| r.rt_faults).max().unwrap_or(0);
        let (det, dec, stop, freed) =
            (p(|s| s.detection_ms), p(|s| s.decide_ms), p(|s| s.stop_ms), p(|s| s.freed_ms));
        let step = steps.iter().find(|s| s.pods == *pods).cloned().unwrap_or_default();
        println!(
            "{pods:>5} {:<7} | {:>7} {:>7} | {:>7} {:>7} | {:>7} {:>7} | {:>7} | {:>5} | {:>8} {:>8} {:>6.2} {:>6.2} {:>7.2} | {:>5}/{:<3} | {:>4}/{:<4}",
            walker_state(*walking),
            f(det, |p| p.p50, 2),
            f(det, |p| p.p99, 2),
            f(dec, |p| p.p50, 2),
            f(dec, |p| p.p99, 2),
            f(stop, |p| p.p50, 1),
            f(stop, |p| p.p99, 1),
            f(freed, |p| p.p50, 1),
            if *walking { format!("{:.0}", step.walker_busy_pct) } else { "-".into() },
            format!("{}K", step.idle_rss_kib),
            if *walking { format!("{}K", step.busy_rss_kib) } else { "-".into() },
            step.idle_cpu_pct,
            step.daemon_cpu_pct,
            step.walk_cpu_s,
            ss.iter().filter(|s| s.oom_first).count(),
            ss.len(),
            first_faults,
            later_faults
        );
        cells.push(CellStats { pods: *pods, walking: *walking, detection: det, decide: dec });
    }
    println!(
        "(ms from the node crossing the threshold: det = evictd's decision, stop = the victim's last page touched + \
         one page's period, freed = the node back down by 90 % of the victim's memory; dec = evictd's decision time \
         (the pods' usage read and ranked); busy% = the disk walker's share of a CPU during the walking runs; RSS \
         idle / CPU% / walk s = evictd with its defaults for {} s: resident set, CPU without the walker (thr%: on the \
         daemon's real-time thread), the walker's CPU seconds (one walk of every pod); RSS busy = after the walking runs; \
         rt faults = page faults of evictd's real-time threads, the daemon's and the reader's, in the first run / the \
         most in any later run)",
        IDLE.as_secs()
    );
    cells
}

/// Detection taken apart, one row per N and walker state: the crossing to the wake, the wake
/// to evictd receiving it, received to the node read, and the decision (p50 and max, ms), and
/// which wakes the deciding passes answered.
fn before_pass_table(runs: &[Run]) {
    let mut groups: BTreeMap<(usize, bool), Vec<&Sample>> = BTreeMap::new();
    for r in runs {
        groups.entry((r.pods, r.walking)).or_default().push(&r.sample);
    }
    println!(
        "{:>5} {:<7} | {:>13} | {:>13} | {:>13} | {:>13} | {:>13} | wakes",
        "pods", "walker", "wake p50/max", "deliv p50/max", "obs p50/max", "read p50/max", "dec p50/max"
    );
    for ((pods, walking), ss) in &groups {
        let b: Vec<&reaction::BeforePass> = ss.iter().filter_map(|s| s.before_pass.as_ref()).collect();
        let cell = |v: Vec<f64>| -> String {
            let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if v.is_empty() { "-".into() } else { format!("{:.2} / {max:.2}", crate::overhead::median(v)) }
        };
        let mut causes: BTreeMap<&str, usize> = BTreeMap::new();
        for x in &b {
            *causes.entry(x.cause.as_str()).or_default() += 1;
        }
        let causes: Vec<String> = causes.iter().map(|(c, n)| format!("{c} {n}")).collect();
        println!(
            "{pods:>5} {:<7} | {:>13} | {:>13} | {:>13} | {:>13} | {:>13} | {}",
            walker_state(*walking),
            cell(b.iter().map(|x| x.wake_ms).collect()),
            cell(b.iter().map(|x| x.delivery_ms).collect()),
            cell(b.iter().map(|x| x.observe_ms).collect()),
            cell(b.iter().filter_map(|x| x.read_ms).collect()),
            cell(ss.iter().filter_map(|s| s.decide_ms).collect()),
            causes.join(", ")
        );
    }
    println!(
        "(detection taken apart, ms: wake = the crossing to the wake the deciding pass answered (its kernel \
         timestamp where it has one; negative: before the crossing as placed within the page the victim crossed on); \
         deliv = the wake's timestamp to evictd's daemon receiving it; obs = received to the node's read \
         beginning; read = the node's read, up to the decision; dec = evictd's decision time)"
    );
}

/// The cost curve: detection and decision p50/p99 against N, the walker idle and walking.
fn plot_cost_curve(out: &Path, cells: &[CellStats]) -> anyhow::Result<()> {
    let mut curves = Vec::new();
    for (what, pick) in [
        ("detection", (|c: &CellStats| c.detection) as fn(&CellStats) -> Option<Percentiles>),
        ("decision", |c: &CellStats| c.decide),
    ] {
        for walking in [false, true] {
            for (q, quantile) in
                [("p50", (|p: Percentiles| p.p50) as fn(Percentiles) -> f64), ("p99", |p| p.p99)]
            {
                let points: Vec<(f64, f64)> = cells
                    .iter()
                    .filter(|c| c.walking == walking)
                    .filter_map(|c| Some((c.pods as f64, quantile(pick(c)?))))
                    .collect();
                let walker = if walking { "walker walking" } else { "walker idle" };
                curves.push(plot::Curve {
                    label: format!("{what} {q}, {walker}"),
                    points,
                    dashed: q == "p99",
                });
            }
        }
    }
    for written in plot::curves(
        &curves,
        "evictd's cost against the node's pods",
        "pods on the node",
        &out.join("scale"),
    )? {
        eprintln!("[bench] wrote {}", written.display());
    }
    Ok(())
}
