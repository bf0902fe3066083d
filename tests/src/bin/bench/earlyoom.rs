//! `cargo xtask bench earlyoom`: evictd and earlyoom side by side against the whole machine.
//!
//! earlyoom watches the machine's MemAvailable, so this benchmark cannot use a test cgroup as
//! the node: evictd watches the root memory cgroup (`memory.available<T`, T = `--threshold`)
//! and earlyoom runs with `-M T` (the same headroom, each in its own signal's terms), one at a
//! time. The workload is the reaction benchmark's, a BestEffort pod under a private
//! containerd whose hog holds `--hold` MiB and then allocates at a fixed rate; its
//! `oom_score_adj` is 1000, so if both lose, the kernel's OOM killer takes it and nothing
//! else. A ballast process (oom_score_adj 0, outside any pod) takes up the rest of the
//! machine's memory so that every run starts 1–2 GiB above the threshold (in the lower of the
//! two signals) instead of filling 20 GiB first. The columns are the reaction benchmark's. Reactors take turns run by
//! run, each started with the victim already holding its memory.

use std::{
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use evictd::node::memory::MemoryCgroup;
use evictd_tests::{MemHog, TestCgroup, containerd::Containerd, dies_with_harness, evictd_proc::Evictd};
use procfs::{Current as _, Meminfo};

use crate::reaction::{self, Cell, KillPath, Node, Reactor, Running, Workload};

const MI: u64 = 1 << 20;
/// How far above the threshold every run is set to start: two seconds of allocation at
/// 1 GiB/s. Up to half of it may still be on its way back from the run before (see
/// `settle_mem_available`), so a run starts 1–2 GiB above the threshold.
const LEAD_MIB: u64 = 2048;
/// Runs start at least this far above the threshold, or the benchmark stops.
const MIN_LEAD_MIB: u64 = 256;
/// Time from the machine settling to the run, the same for every reactor: evictd starts in
/// about a second (loading its programs), earlyoom at once.
const REACTOR_START: Duration = Duration::from_secs(3);
/// The issue's bar: below this the comparison is skipped, with the reason.
const MIN_AVAILABLE_MIB: u64 = 8 * 1024;

#[derive(clap::Args, Debug)]
pub struct Opts {
    /// Runs per cell (reactor, rate).
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Allocation rates of the workload, MiB/s (or `max`), comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = reaction::parse_rate, default_values = ["1024", "max"])]
    rates: Vec<u64>,
    /// evictd's kill paths to run beside earlyoom, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [KillPath::Default, KillPath::Fast])]
    kill_paths: Vec<KillPath>,
    /// The headroom both keep, MiB: evictd `memory.available<T`, earlyoom `-M T`.
    #[arg(long = "threshold", value_name = "MiB", default_value_t = 2048)]
    threshold_mib: u64,
    /// MiB the victim holds before it starts allocating at its rate.
    #[arg(long = "hold", value_name = "MiB", default_value_t = 2048)]
    hold_mib: u64,
    /// The earlyoom binary (`cargo xtask bench earlyoom` unpacks Debian's package).
    #[arg(long)]
    earlyoom: PathBuf,
    /// Where the CSV goes.
    #[arg(long, default_value = "target/bench/earlyoom")]
    out: PathBuf,
}

impl Opts {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.runs > 0 && !self.rates.is_empty(), "nothing to run");
        anyhow::ensure!(self.threshold_mib > 0, "--threshold must be above 0 MiB");
        anyhow::ensure!(
            self.earlyoom.is_file(),
            "--earlyoom {}: no such file (cargo xtask bench earlyoom fetches it)",
            self.earlyoom.display()
        );
        Ok(())
    }
}

/// MemAvailable, bytes (0 if unreadable).
pub(crate) fn mem_available() -> u64 {
    Meminfo::current().ok().and_then(|m| m.mem_available).unwrap_or(0)
}

/// One kill earlyoom reported.
#[derive(Clone, Debug)]
pub(crate) struct Kill {
    /// When this process read the line (CLOCK_MONOTONIC ns): earlyoom prints it just before
    /// its kill(2), so this is an upper bound of its decision.
    pub read_ns: u64,
    pub comm: String,
}

/// earlyoom as a child process (ours, ended by PID), its kill lines collected as they come.
pub(crate) struct Earlyoom {
    child: Child,
    kills: Arc<Mutex<Vec<Kill>>>,
    started: Arc<Mutex<bool>>,
}

impl Earlyoom {
    fn start(bin: &std::path::Path, threshold_mib: u64) -> anyhow::Result<Self> {
        let mut child = dies_with_harness(&mut Command::new(bin))
            // -M: SIGTERM at or below this much MemAvailable (KiB), SIGKILL at half; -r 0: no
            // periodic report; -p: niceness -20, its own answer to CPU starvation.
            .args(["-M", &(threshold_mib * 1024).to_string(), "-r", "0", "-p"])
            // Every process but the hog is avoided (−300) and the hog preferred (+300): it is
            // the one to kill, and nothing else of this machine may be.
            .args(["--prefer", "^hog$", "--avoid", "^([^h]|h[^o]|ho[^g]|hog.)"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {}: {e}", bin.display()))?;
        let kills = Arc::new(Mutex::new(Vec::new()));
        let started = Arc::new(Mutex::new(false));
        for out in [
            child.stdout.take().map(|o| Box::new(o) as Box<dyn std::io::Read + Send>),
            child.stderr.take().map(|e| Box::new(e) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let (kills, started) = (kills.clone(), started.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let read_ns = evictd::vocab::monotonic_ns();
                    if line.starts_with("mem total:") {
                        *started.lock().expect("started") = true;
                    }
                    if let Some(comm) = killed_comm(&line) {
                        kills.lock().expect("kills").push(Kill { read_ns, comm });
                    }
                    eprintln!("[earlyoom] {line}");
                }
            });
        }
        let e = Earlyoom { child, kills, started };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !*e.started.lock().expect("started") {
            anyhow::ensure!(Instant::now() < deadline, "earlyoom did not start within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(e)
    }

    pub(crate) fn kills(&self) -> Vec<Kill> {
        self.kills.lock().expect("kills").clone()
    }
}

/// The process name in `sending SIGTERM to process 123 uid 0 "hog": badness 1300, VmRSS 3 MiB`.
fn killed_comm(line: &str) -> Option<String> {
    let rest = line.strip_prefix("sending SIG")?;
    let (_, quoted) = rest.split_once(" \"")?;
    Some(quoted.split_once('"')?.0.to_owned())
}

impl Drop for Earlyoom {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The rest of the machine's memory, held by a process of ours outside any pod, so that a run
/// starts `LEAD_MIB` above the threshold. Ended (by PID) and its cgroup removed on drop.
struct Ballast {
    hog: Option<MemHog>,
    _cgroup: TestCgroup,
    mib: u64,
}

impl Ballast {
    fn take(mib: u64) -> Self {
        let cgroup = TestCgroup::new(None);
        let mut hog = MemHog::spawn_in(&cgroup);
        let mut left = mib;
        while left > 0 {
            let step = left.min(1024);
            hog.alloc(step as usize);
            left -= step;
        }
        Ballast { hog: Some(hog), _cgroup: cgroup, mib }
    }
}

impl Drop for Ballast {
    fn drop(&mut self) {
        // The process ends before its cgroup is removed.
        drop(self.hog.take());
    }
}

/// Waits until MemAvailable is at least `at_least` and rises by less than 32 MiB/s (up to
/// 30 s). On this VM, of the memory a victim frees, about a GiB comes back to MemAvailable
/// only at ~8 MiB/s over minutes (measured: 3 GiB freed, 2 GiB back at once, the rest over
/// two minutes); earlyoom must not start on a reading still climbing fast.
async fn settle_mem_available(at_least: u64) -> u64 {
    let until = Instant::now() + Duration::from_secs(30);
    let mut last = mem_available();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = mem_available();
        if (now >= at_least && now <= last + 16 * MI) || Instant::now() > until {
            return now;
        }
        last = now;
    }
}

pub async fn earlyoom(o: &Opts) -> anyhow::Result<()> {
    let available = mem_available() / MI;
    if available < MIN_AVAILABLE_MIB {
        // A benchmark, not a test: say why and stop without numbers.
        eprintln!(
            "[bench] SKIPPED the earlyoom comparison: the machine has {available} MiB available, \
             it needs {MIN_AVAILABLE_MIB} MiB"
        );
        return Ok(());
    }
    let mem_total = Meminfo::current()?.mem_total;
    // The test node is unlimited: the whole machine is the node.
    let mut ctd = Containerd::start(i64::MAX as u64);
    let layout = evictd::node::cgroups::CgroupMounts::detect()?;
    let node = Node {
        memory: MemoryCgroup::new(&layout.memory_root, layout.memory_version, true),
        capacity: mem_total,
    };
    let need = o.threshold_mib + o.hold_mib + LEAD_MIB;
    // The two signals differ by the page cache the kernel counts as available and the
    // working set does not (gigabytes on a busy machine): the ballast leaves the lead above
    // the lower one, or evictd's runs start at its threshold and it takes the victim before
    // the run begins.
    let lower =
        (mem_available() / MI).min(mem_total.saturating_sub(reaction::working_set(&node.memory)) / MI);
    let spare = lower.checked_sub(need).ok_or_else(|| {
        anyhow::anyhow!("{} MiB available is less than threshold + hold + {LEAD_MIB} MiB = {need} MiB", lower)
    })?;
    eprintln!(
        "[bench] earlyoom: taking {spare} MiB of ballast so that runs start {LEAD_MIB} MiB above the threshold"
    );
    let ballast = Ballast::take(spare);
    let evictd_available = mem_total.saturating_sub(reaction::working_set(&node.memory)) / MI;
    eprintln!(
        "[bench] earlyoom: whole machine ({} MiB), headroom {} MiB, victim holding {} MiB, ballast {} MiB; \
         now MemAvailable {} MiB (earlyoom's signal), memory.available {evictd_available} MiB (evictd's); \
         evictd kill paths {:?}, rates {:?} MiB/s, {} runs each",
        mem_total / MI,
        o.threshold_mib,
        o.hold_mib,
        ballast.mib,
        mem_available() / MI,
        o.kill_paths.iter().map(|p| p.name()).collect::<Vec<_>>(),
        o.rates.iter().map(|r| reaction::rate_name(*r)).collect::<Vec<_>>(),
        o.runs
    );
    let work = Workload { hold_mib: o.hold_mib, ignore_sigterm: false };
    let threshold = format!("memory.available<{}Mi", o.threshold_mib);
    let root = node.memory.dir.display().to_string();
    let mut reactors: Vec<Reactor> =
        o.kill_paths.iter().map(|p| Reactor::Evictd(reaction::Mode::All, *p)).collect();
    reactors.push(Reactor::Earlyoom);
    let mut samples = Vec::new();
    // Reactors take turns run by run: how fast this machine hands out memory drifts (a VM
    // whose freed pages go back to the host is slow to fault them in again), and the drift
    // must hit every reactor alike.
    for run in 0..o.runs {
        for &rate in &o.rates {
            for &reactor in &reactors {
                let cell = Cell { threshold_mib: o.threshold_mib, rate, reactor };
                let pod = reaction::start_victim(&mut ctd, work, cell, run).await;
                let available = settle_mem_available((o.threshold_mib + MIN_LEAD_MIB) * MI).await / MI;
                let settled = Instant::now();
                anyhow::ensure!(
                    available > o.threshold_mib + MIN_LEAD_MIB,
                    "MemAvailable is {available} MiB before a run, too close to the threshold: something \
                     else on this machine took memory"
                );
                let running = match reactor {
                    Reactor::Evictd(_, path) => {
                        let mut extra =
                            vec!["--node-cgroup", root.as_str(), "--eviction-hard", threshold.as_str()];
                        extra.extend(path.args());
                        Running::Evictd(Evictd::start(&ctd, None, &extra))
                    }
                    Reactor::Earlyoom => Running::Earlyoom(Earlyoom::start(&o.earlyoom, o.threshold_mib)?),
                };
                // Every reactor's run starts the same time after the machine settled,
                // whatever its start-up took: the host takes freed pages back over seconds,
                // and how many it has taken sets how fast the victim can fault them in again.
                let start_at = settled + REACTOR_START;
                anyhow::ensure!(
                    Instant::now() < start_at,
                    "{reactor:?} took longer than {REACTOR_START:?} to start"
                );
                tokio::time::sleep_until(start_at.into()).await;
                let s = reaction::one_run(&mut ctd, &running, &node, work, cell, run, pod).await?;
                eprintln!("[bench] {}", reaction::describe(&s));
                samples.push(s);
            }
        }
    }
    drop(ballast);
    reaction::report(&o.out, &samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earlyoom_kill_lines() {
        let line = r#"sending SIGTERM to process 13482 uid 0 "hog": badness 1300, VmRSS 3 MiB"#;
        assert_eq!(killed_comm(line).as_deref(), Some("hog"));
        assert_eq!(killed_comm("low memory! at or below SIGTERM limits: mem 8.00%").as_deref(), None);
    }
}
