//! `cargo xtask bench overhead`: what evictd's probes cost the allocation path.
//!
//! - A page-fault-heavy workload (map, touch every page, unmap, again) runs for a fixed time
//!   without evictd, with evictd as it runs by default on a node far from every threshold
//!   (whole node, `memory.available<100Mi`: the charge programs detached, the poll reading
//!   once a second), and with the charge programs attached as they are within the band near
//!   a threshold (`--charge-probes always`), interleaved round by round in one run; the
//!   ratios of the medians are the throughput cost far and near.
//! - The BPF programs' own run time per event, from the kernel's BPF statistics
//!   (`BPF_ENABLE_STATS`, on only while this benchmark holds its fd).
//! - The time for a process holding 1 GiB to die after SIGKILL (one probe hit per page
//!   freed), without and with evictd.
//! - evictd's resident memory and its CPU use while the node is idle.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use evictd_tests::{dies_with_harness, evictd_binary};

#[derive(clap::Args, Debug)]
pub struct Opts {
    /// Interleaved rounds without and with evictd.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Length of one round of the fault loop, seconds.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// The wake sources of the "far" daemon (`--wake-sources`), to tell which one costs
    /// what; evictd's defaults when not given.
    #[arg(long, value_name = "LIST")]
    far_wake_sources: Option<String>,
    /// Where the results go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
}

impl Opts {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.rounds > 0 && self.seconds > 0.0, "nothing to run");
        Ok(())
    }
}

/// Pages faulted in per second: map 64 MiB, touch each page, unmap, repeat.
fn fault_rate(seconds: f64) -> f64 {
    const LEN: usize = 64 << 20;
    let page = 4096;
    let start = Instant::now();
    let mut pages = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        // SAFETY: a private anonymous mapping of LEN bytes, written within bounds, unmapped
        // before the next iteration.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                return 0.0;
            }
            let b = p.cast::<u8>();
            for off in (0..LEN).step_by(page) {
                b.add(off).write_volatile(1);
            }
            libc::munmap(p, LEN);
        }
        pages += (LEN / page) as u64;
    }
    pages as f64 / start.elapsed().as_secs_f64()
}

struct Daemon(Child);

/// The charge programs attached, as within the band near a threshold.
const NEAR: &[&str] = &["--charge-probes", "always"];

impl Daemon {
    fn start(args: &[&str]) -> anyhow::Result<Self> {
        let child = dies_with_harness(&mut Command::new(evictd_binary()))
            .args(["--cri-endpoint", "none"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        // Loading and attaching takes a moment; the probes are live once it is armed.
        std::thread::sleep(Duration::from_millis(1500));
        Ok(Daemon(child))
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Ours, by PID.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
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
    let ours = ["mod_memcg_lruve", "mod_memcg_state", "direct_reclaim_", "memcg_reclaim_b", "mark_victim"];
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
    eprintln!("[bench] overhead: {} interleaved rounds of {}s each of three ways", o.rounds, o.seconds);
    // Throughput with BPF statistics off: collecting them adds two clock reads to every run.
    let (mut without, mut far, mut with) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..o.rounds {
        without.push(fault_rate(o.seconds));
        let d = Daemon::start(far_args)?;
        far.push(fault_rate(o.seconds));
        drop(d);
        let d = Daemon::start(NEAR)?;
        with.push(fault_rate(o.seconds));
        drop(d);
        eprintln!(
            "[bench] round {}: {:.0} pages/s without, {:.0} far from a threshold, {:.0} near one",
            round + 1,
            without[round],
            far[round],
            with[round]
        );
    }
    // The programs' own cost, measured apart with statistics on.
    let (bpf_ns, bpf_runs) = {
        let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .map_err(|e| anyhow::anyhow!("enabling BPF run-time statistics: {e}"))?;
        let d = Daemon::start(NEAR)?;
        let (t0, c0) = bpf_totals();
        fault_rate(o.seconds);
        let (t1, c1) = bpf_totals();
        drop(d);
        (t1.saturating_sub(t0), c1.saturating_sub(c0))
    };
    let (mw, mf, mi) = (median(without.clone()), median(far.clone()), median(with.clone()));
    let (ratio_far, ratio) = (mf / mw, mi / mw);

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

    let per_event = if bpf_runs > 0 { bpf_ns as f64 / bpf_runs as f64 } else { f64::NAN };
    let report = format!(
        "page-fault throughput (median of {} interleaved rounds): {mw:.0} pages/s without evictd; \
         {mf:.0} with evictd far from every threshold ({far_label}), ratio {ratio_far:.4} ({:+.2}%); \
         {mi:.0} with the charge programs attached (near one), ratio {ratio:.4} ({:+.2}%)\n\
         BPF programs: {bpf_runs} runs, {per_event:.0} ns per run on average\n\
         process exit after SIGKILL holding 1 GiB: {:.1} ms without, {:.1} ms with the charge programs attached (median of 3)\n\
         evictd ({far_label}, far from every threshold): RSS {:.1} MiB, idle CPU {idle_cpu:.2}% of one core (5 s, no workload)\n",
        o.rounds,
        (ratio_far - 1.0) * 100.0,
        (ratio - 1.0) * 100.0,
        median(exit_without),
        median(exit_with),
        rss_kib as f64 / 1024.0,
    );
    print!("{report}");
    std::fs::create_dir_all(&o.out)?;
    std::fs::write(o.out.join("overhead.txt"), &report)?;
    let mut csv = String::from("round,without_pages_s,far_pages_s,near_pages_s\n");
    for (i, ((a, f), b)) in without.iter().zip(&far).zip(&with).enumerate() {
        csv += &format!("{},{a:.0},{f:.0},{b:.0}\n", i + 1);
    }
    std::fs::write(o.out.join("overhead.csv"), csv)?;
    Ok(())
}
