//! One VM's run under QEMU, judged by its serial console: the guest has no disk to leave
//! anything on, so the console is both the results and, when a VM fails, all there is to
//! say why.

use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};

use super::{Init, Kernel, kernels::KernelImage};
use crate::step;

pub(super) struct VmOutcome {
    pub(super) summary: String,
    pub(super) seconds: f64,
}

/// Boots one kernel with the initramfs and follows its console until the init powers off.
pub(super) fn boot(
    k: &Kernel,
    image: &KernelImage,
    initramfs: &Path,
    log: &Path,
    timeout: Duration,
) -> Result<VmOutcome> {
    let started = Instant::now();
    let skip: Vec<&str> = k.skip.iter().map(|(t, _)| *t).collect();
    for (t, why) in k.skip {
        step(&format!("vm {} ({}): not run: {t}: {why}", k.name, image.release));
    }
    let mut append = format!(
        "console=ttyS0 panic=-1 evictd_vm.tier={} evictd_vm.skip={} evictd_vm.plan={}",
        k.tier,
        skip.join(","),
        k.plan.file
    );
    if k.init == Init::Systemd {
        append.push_str(
            " rdinit=/usr/lib/systemd/systemd systemd.unit=evictd-vm.target systemd.show_status=false",
        );
    }
    step(&format!("vm {}: booting {} under QEMU TCG", k.name, image.release));
    // thread=single: with multi-threaded TCG the guest oopsed when BPF patched a memcg
    // tracepoint (toolchain notes). -cx16: Debian's 6.12 double-faulted in SLUB's
    // cmpxchg16b fast path during boot in 2 of 8 TCG boots with it, in none of 8 without
    // (SLUB then takes its locked path; nothing evictd does needs the instruction).
    let child = dies_with_this_thread(&mut Command::new("qemu-system-x86_64"))
        .args(["-accel", "tcg,thread=single", "-cpu", "max,-cx16", "-smp", "2", "-m", "3072"])
        .args(["-display", "none", "-monitor", "none", "-serial", "stdio", "-no-reboot"])
        .arg("-kernel")
        .arg(&image.vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", &append])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting qemu-system-x86_64")?;
    let mut child = KilledOnDrop(child);
    let stdout = child.0.stdout.take().ok_or_else(|| anyhow!("qemu stdout"))?;
    let (tx, rx) = mpsc::channel();
    let reader = thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log_file = fs::File::create(log)?;
    let deadline = started + timeout;
    let mut results = Vec::new();
    let mut done = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                writeln!(log_file, "{line}")?;
                let line = line.trim_end_matches('\r');
                if let Some(r) = line.strip_prefix("evictd-vm: ") {
                    step(&format!("vm {}: {r}", k.name));
                    if let Some(rest) = r.strip_prefix("done ") {
                        done = Some(rest.to_owned());
                    }
                    results.push(r.to_owned());
                } else if line.contains("panicked at")
                    || (line.starts_with("test ") && line.ends_with("FAILED"))
                {
                    step(&format!("vm {}: {line}", k.name));
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                drop(child);
                let _ = reader.join();
                bail!("no power-off within {} minutes (log {})", timeout.as_secs() / 60, log.display());
            }
        }
    }
    let status = child.0.wait()?;
    let _ = reader.join();
    let mut stderr = String::new();
    if let Some(mut e) = child.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    let seconds = started.elapsed().as_secs_f64();
    let Some(done) = done else {
        bail!(
            "the VM ended ({status}) before the init reported (qemu: {}; log {})",
            stderr.trim(),
            log.display()
        );
    };
    let failures: Vec<&String> = results.iter().filter(|r| r.starts_with("FAIL")).collect();
    if !done.starts_with("failures=0") || !failures.is_empty() {
        bail!(
            "{} (log {})",
            failures.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("; "),
            log.display()
        );
    }
    let passed = results.iter().filter(|r| r.starts_with("ok")).count();
    Ok(VmOutcome { summary: format!("kernel {}: {passed} checks passed", image.release), seconds })
}

/// The VM's QEMU, killed (ours, by PID) and reaped when its run ends any other way than by
/// the guest powering off: a timeout, an error writing the log.
struct KilledOnDrop(Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Makes the child get SIGKILL when the thread that starts it ends, and so when xtask dies
/// (a cancelled CI job, a SIGTERM): a VM left running would hold 3 GiB and a CPU for up to
/// its whole timeout. Each VM is booted from a thread that waits for it. (The test crate's
/// `dies_with_harness` does the same for the tests' children; xtask builds that crate and
/// does not link it.)
fn dies_with_this_thread(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt as _;
    let parent = std::process::id();
    // SAFETY: between fork and exec only async-signal-safe calls: prctl, getppid, _exit.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // xtask may have died before the prctl took effect.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        })
    }
}

/// A failing VM's log, cut to what says why: each panic's message, and the warnings and
/// errors in the ends of evictd's and containerd's logs that the test harness prints when a
/// test fails.
pub(super) fn failure_excerpt(log: &Path) -> Vec<String> {
    let Ok(text) = fs::read_to_string(log) else { return vec![format!("no log at {}", log.display())] };
    excerpt_of(&text)
}

fn excerpt_of(text: &str) -> Vec<String> {
    const PANIC_LINES: usize = 12;
    const LOG_LINES: usize = 6;
    let mut out = Vec::new();
    let mut lines = text.lines().map(|l| l.trim_end_matches('\r'));
    while let Some(line) = lines.next() {
        if line.contains("panicked at") {
            out.push(line.to_owned());
            let message = lines.by_ref().take_while(|l| !l.is_empty() && !l.starts_with("note: "));
            out.extend(message.take(PANIC_LINES).map(str::to_owned));
        } else if let Some(whose) = line.strip_prefix("--- the last ").and_then(log_block_owner) {
            let block: Vec<String> = lines.by_ref().take_while(|l| *l != "---").map(without_ansi).collect();
            let notable: Vec<&String> = block.iter().filter(|l| is_warning_or_error(l)).collect();
            let last = &notable[notable.len().saturating_sub(LOG_LINES)..];
            out.extend(last.iter().map(|l| format!("{whose}: {l}")));
        }
    }
    out
}

/// "12 lines of containerd's log (/tmp/…) ---" → "containerd".
fn log_block_owner(header: &str) -> Option<&str> {
    let (_, rest) = header.split_once(" lines of ")?;
    rest.split_once("'s log").map(|(whose, _)| whose)
}

/// containerd's logrus levels, evictd's tracing levels.
fn is_warning_or_error(line: &str) -> bool {
    ["level=error", "level=warning", " WARN ", " ERROR "].iter().any(|m| line.contains(m))
}

/// tracing colours its levels even into a pipe.
fn without_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC '[' parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child started through `dies_with_this_thread` is killed when that thread ends.
    #[test]
    #[expect(clippy::disallowed_methods, reason = "a plain test thread waits for a process")]
    fn a_vm_process_dies_with_the_thread_that_booted_it() {
        let child = thread::spawn(|| {
            dies_with_this_thread(Command::new("sleep").arg("600")).spawn().expect("starting sleep")
        })
        .join()
        .expect("the starting thread");
        let mut child = KilledOnDrop(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while child.0.try_wait().expect("waiting for sleep").is_none() {
            assert!(Instant::now() < deadline, "the child outlived the thread that started it");
            thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_failure_excerpt_keeps_the_panic_message_and_the_runtime_errors() {
        let log = "running 1 test\n\
            thread 'evicts' (630) panicked at tests/tests/e2e_evict.rs:85:5:\n\
            {\"error\":\"StopContainer failed\"}\n\
            note: run with `RUST_BACKTRACE=1`\n\
            --- the last 3 lines of containerd's log (/tmp/x/containerd.log) ---\n\
            time=1 level=info msg=\"StopContainer\"\n\
            time=2 level=error msg=\"ttrpc: closed\"\r\n\
            ---\n\
            --- the last 2 lines of evictd's log ---\n\
            \x1b[2m2026-11-23T04:43:12Z\x1b[0m \x1b[33m WARN\x1b[0m evictd::daemon: stopping default/worker failed\n\
            \x1b[32m INFO\x1b[0m evictd: observing\n\
            ---\n\
            test evicts ... FAILED\n";
        assert_eq!(
            excerpt_of(log),
            [
                "thread 'evicts' (630) panicked at tests/tests/e2e_evict.rs:85:5:",
                "{\"error\":\"StopContainer failed\"}",
                "containerd: time=2 level=error msg=\"ttrpc: closed\"",
                "evictd: 2026-11-23T04:43:12Z  WARN evictd::daemon: stopping default/worker failed",
            ]
        );
    }
}
