//! evictd as a child process against a test containerd, its `--trace --json` lines and its
//! log collected as they come, for the end-to-end tests and the benchmark.

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{containerd::Containerd, dies_with_harness, evictd_binary};

/// evictd running against the test's containerd; its JSON lines and log are collected.
pub struct Evictd {
    child: Child,
    pub lines: Arc<Mutex<Vec<Value>>>,
    log: Arc<Mutex<String>>,
}

impl Evictd {
    /// Starts evictd on `ctd`'s node cgroup (unless `extra` names another) and socket;
    /// returns once it is armed.
    pub fn start(ctd: &Containerd, pods_file: Option<&Path>, extra: &[&str]) -> Self {
        // Tests want a quick fallback timer and inventory; a caller that sets its own keeps it.
        let or_default = |flag: &'static str, value: &'static str| -> Vec<&'static str> {
            if extra.contains(&flag) { vec![] } else { vec![flag, value] }
        };
        let node = if extra.contains(&"--node-cgroup") {
            vec![]
        } else {
            vec!["--node-cgroup".into(), ctd.node_dir().into_os_string()]
        };
        let mut child = dies_with_harness(&mut Command::new(evictd_binary()))
            .args(["--trace", "--json"])
            .args(or_default("--inventory-interval", "100ms"))
            .args(or_default("--housekeeping-interval", "200ms"))
            .args(or_default("--volume-stats-agg-period", "200ms"))
            .args(node)
            .arg("--cri-endpoint")
            .arg(ctd.endpoint())
            .args(
                pods_file
                    .map(|f| vec![std::ffi::OsStr::new("--pods-file"), f.as_os_str()])
                    .unwrap_or_default(),
            )
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting evictd");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::new(Mutex::new(String::new()));
        let stdout = child.stdout.take().expect("stdout");
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v: Value =
                    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                l.lock().expect("lines").push(v);
            }
        });
        let stderr = child.stderr.take().expect("stderr");
        let g = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut g = g.lock().expect("log");
                g.push_str(&line);
                g.push('\n');
            }
        });
        let e = Evictd { child, lines, log };
        // The first summary means it is up and armed. Its start log goes to the other pipe,
        // read by the other thread: wait for that too, so that a test sees it on return.
        // Under a second here; up to 18 s in the VM matrix's TCG (loading the programs).
        e.wait_for("the first summary", Duration::from_secs(30), |l| {
            l.iter().any(|v| v["type"] == "summary")
        });
        e.wait_for_log("the start log", Duration::from_secs(5), |log| log.contains(" observing "));
        e
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every line of `--trace --json` so far.
    pub fn trace(&self) -> Vec<Value> {
        self.lines.lock().expect("lines").clone()
    }

    pub fn evictions(&self) -> Vec<Value> {
        self.lines.lock().expect("lines").iter().filter(|v| v["type"] == "eviction").cloned().collect()
    }

    pub fn log(&self) -> String {
        self.log.lock().expect("log").clone()
    }

    /// Waits until evictd's `--trace --json` lines satisfy `pred`, for `within` scaled to
    /// this machine.
    pub fn wait_for(&self, what: &str, within: Duration, pred: impl Fn(&[Value]) -> bool) {
        let deadline = Instant::now() + crate::patience::patience(within);
        loop {
            if pred(&self.lines.lock().expect("lines")) {
                return;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; evictd log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until evictd's log (stderr) satisfies `pred`.
    pub fn wait_for_log(&self, what: &str, within: Duration, pred: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + crate::patience::patience(within);
        while !pred(&self.log()) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}; evictd log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM (by PID, ours) and the time evictd took to exit; `None` if it did not within
    /// `within` (it is killed then).
    pub fn terminate(&mut self, within: Duration) -> Option<Duration> {
        let t = Instant::now();
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::SIGTERM).expect("SIGTERM to evictd");
        while t.elapsed() < within {
            if self.child.try_wait().ok().flatten().is_some() {
                return Some(t.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    pub fn wait_eviction(&self, within: Duration) -> Value {
        self.wait_for("an eviction", within, |l| l.iter().any(|v| v["type"] == "eviction"));
        self.evictions().remove(0)
    }
}

impl Drop for Evictd {
    fn drop(&mut self) {
        // A failing test's daemon side (why a stop failed, say) is in this log, which only
        // the test holds: show its end. The VM matrix echoes its warnings and errors.
        if std::thread::panicking() {
            crate::print_log_tail("evictd", None, &self.log(), 40);
        }
        // Ours, by PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The CPU seconds process `pid` has used, all threads.
pub fn process_cpu_s(pid: u32) -> f64 {
    stat_cpu_s(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default())
}

/// `pid`'s live threads named `comm`, as their /proc/<pid>/task directories. `evictd` is the
/// daemon's own thread, the main one (tid = pid): its name is its executable's, which a
/// binary copied under another name (`evictd-static`) does not keep.
fn threads_named(pid: u32, comm: &str) -> Vec<std::path::PathBuf> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .filter_map(Result::ok)
        .filter(|t| {
            let main = comm == "evictd" && t.file_name().to_str() == Some(pid.to_string().as_str());
            main || std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == comm)
        })
        .map(|t| t.path())
        .collect()
}

/// The CPU seconds of `pid`'s live threads named `comm` (evictd's own is `evictd`), to the
/// nanosecond where the kernel keeps schedstat (a thread's time in clock ticks rounds a
/// few milliseconds of work to nothing), else in ticks.
pub fn thread_cpu_s(pid: u32, comm: &str) -> f64 {
    let on_cpu_s = |task: &Path| -> f64 {
        let schedstat = std::fs::read_to_string(task.join("schedstat")).ok();
        let ns = schedstat.as_deref().and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        match ns {
            Some(ns) => ns as f64 / 1e9,
            None => stat_cpu_s(&std::fs::read_to_string(task.join("stat")).unwrap_or_default()),
        }
    };
    threads_named(pid, comm).iter().map(|t| on_cpu_s(t)).sum()
}

/// The page faults (minor and major) of `pid`'s live threads named `comm`: a thread whose
/// memory is all resident and locked faults for none.
pub fn thread_faults(pid: u32, comm: &str) -> u64 {
    threads_named(pid, comm)
        .iter()
        .map(|t| stat_faults(&std::fs::read_to_string(t.join("stat")).unwrap_or_default()))
        .sum()
}

/// A /proc stat line's minflt + majflt (fields 10 and 12).
fn stat_faults(stat: &str) -> u64 {
    let Some((_, rest)) = stat.rsplit_once(')') else { return 0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    [7, 9].iter().filter_map(|&i| fields.get(i)?.parse::<u64>().ok()).sum()
}

/// A /proc stat line's utime + stime, seconds (fields 14 and 15; the command, field 2, may
/// hold spaces and ends at the last ')').
pub fn stat_cpu_s(stat: &str) -> f64 {
    let ticks = |s: &str| -> u64 {
        s.rsplit_once(')')
            .map(|(_, rest)| {
                rest.split_whitespace().skip(11).take(2).filter_map(|v| v.parse::<u64>().ok()).sum()
            })
            .unwrap_or(0)
    };
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks(stat) as f64 / hz
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_of_a_stat_line_with_spaces_in_its_command() {
        // SAFETY: sysconf has no memory effects.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let line = "42 (evictd disk) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 100 0 0";
        assert!((stat_cpu_s(line) - 300.0 / hz).abs() < 1e-9, "{}", stat_cpu_s(line));
        assert_eq!(stat_cpu_s("garbage"), 0.0);
    }

    #[test]
    fn faults_of_a_stat_line_are_minor_and_major() {
        let line = "42 (evictd (x) reads) S 1 42 42 0 -1 4194560 100 7 3 1 250 50 0 0 20 0 3 0 100 0 0";
        assert_eq!(stat_faults(line), 103);
        assert_eq!(stat_faults("garbage"), 0);
    }
}
