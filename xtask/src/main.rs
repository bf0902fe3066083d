//! Developer entry points: `cargo xtask setup | build | run | test | bench | fuzz | vm | soak`,
//! one module per command, except that commands built on the same steps share one: `setup`;
//! `build` (`build`, and `run`, which builds first); `test` (lints and every test, ending
//! with the VM matrix); `bench` (`bench`, and `soak`, which runs the same evictd-bench);
//! `fuzz`; `vm` (the VM matrix, a folder: kernels, initramfs, boot).
//!
//! `setup` installs what building evictd needs and is quick when everything is there; every
//! other command runs it first, so the README's two commands work on a fresh machine.

use std::{
    env,
    ffi::OsString,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
    sync::OnceLock,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

mod bench;
mod build;
mod fuzz;
mod image;
mod setup;
mod test;
mod vm;

#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", about = "evictd's developer commands")]
struct Xtask {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the build and tests need (nightly rust-src and rustfmt, Debian packages,
    /// bpf-linker); idempotent.
    Setup,
    /// Set up, then build evictd (the eBPF object is embedded in the binary).
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Set up, then write evictd's container image (the static release binary alone, FROM
    /// scratch) as an OCI archive: no daemon, no registry, no base image.
    Image(image::ImageArgs),
    /// Set up, build (release) and run evictd on this machine; default arguments:
    /// --trace --dry-run.
    Run {
        /// Arguments for evictd (after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, then lint and run the whole test suite (privileged tests need root), ending
    /// with the VM matrix (`cargo xtask vm`).
    Test {
        /// Leave out the VM matrix (a quicker loop while developing; CI runs it).
        #[arg(long)]
        no_vm: bool,
    },
    /// Benchmarks (root): eviction reaction time per wake mode and allocation rate, or the
    /// probes' cost on the allocation path.
    Bench(bench::BenchArgs),
    /// Fuzz every parser evictd points at user or kernel text (cargo-fuzz, nightly), each
    /// target for a bounded time; a crash fails the run.
    Fuzz(fuzz::FuzzArgs),
    /// The privileged tests inside Debian's kernels (6.1, 6.12, 7.x) booted with cgroup v2 in
    /// QEMU (root): the wake tier each kernel gets, wakes and kills on cgroup v2.
    Vm(vm::VmArgs),
    /// Repeated pressure episodes on a private containerd, the runtime restarted now and
    /// then (root): one eviction per crossing, no pod twice, evictd's RSS and fds flat.
    Soak(bench::SoakArgs),
}

fn main() -> ExitCode {
    started();
    let result = match Xtask::parse().command {
        Cmd::Setup => setup::setup().map(|_| ()),
        Cmd::Build { release } => setup::setup().and_then(|env| build::build(&env, release)),
        Cmd::Run { args } => setup::setup().and_then(|env| build::run(&env, &args)),
        Cmd::Image(args) => setup::setup().and_then(|env| image::image(&env, &args)).map(|_| ()),
        Cmd::Test { no_vm } => setup::setup().and_then(|env| test::test(&env, !no_vm)),
        Cmd::Bench(args) => setup::setup().and_then(|env| bench::bench(&env, &args)),
        Cmd::Fuzz(args) => setup::setup().and_then(|env| fuzz::fuzz(&env, &args)),
        Cmd::Vm(args) => setup::setup().and_then(|env| vm::vm(&env, &args)),
        Cmd::Soak(args) => setup::setup().and_then(|env| bench::soak(&env, &args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// When this xtask started: each step's line carries the time since.
fn started() -> Instant {
    static STARTED: OnceLock<Instant> = OnceLock::new();
    *STARTED.get_or_init(Instant::now)
}

/// One line per step, with the time it started at: a step's length is the gap to the next.
fn step(msg: &str) {
    let t = started().elapsed().as_secs();
    eprintln!("[xtask {:>2}m{:02}s] {msg}", t / 60, t % 60);
}

/// The environment child commands run with: PATH extended with cargo's bin directory,
/// where bpf-linker is installed.
struct BuildEnv {
    path: OsString,
}

impl BuildEnv {
    /// The cargo that runs the xtask (the toolchain's own, not rustup's proxy).
    fn cargo(&self) -> Command {
        let mut c = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        c.env("PATH", &self.path).current_dir(workspace_root());
        c
    }

    /// Cargo on the nightly toolchain, through rustup's proxy (the toolchain's own cargo
    /// cannot switch toolchains).
    fn nightly_cargo(&self) -> Command {
        let mut c = Command::new(cargo_bin_dir().join("cargo"));
        c.arg("+nightly")
            .env("PATH", &self.path)
            .env_remove("RUSTUP_TOOLCHAIN")
            .current_dir(workspace_root());
        c
    }
}

/// `f` on every item, `jobs` items at a time (each on a thread of its own, taking the next
/// item when one ends); the results in the order of `items`, `None` where `f` panicked.
fn in_parallel<T: Sync, R: Send>(items: &[T], jobs: usize, f: impl Fn(&T) -> R + Sync) -> Vec<Option<R>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done: Vec<(usize, R)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..jobs.clamp(1, items.len().max(1)))
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else { return mine };
                        mine.push((i, f(item)));
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap_or_default()).collect()
    });
    let mut results: Vec<Option<R>> = items.iter().map(|_| None).collect();
    for (i, r) in done {
        results[i] = Some(r);
    }
    results
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| ".".into())
}

fn cargo_bin_dir() -> PathBuf {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
        .join("bin")
}

fn run_status(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// Whether a line of cargo's stderr is the eBPF build relayed by evictd's build script:
/// aya-build passes on every line of its nested cargo as a `warning: evictd@<version>:` line.
fn is_ebpf_build_line(line: &str) -> bool {
    line.strip_prefix("warning: evictd@").and_then(|rest| rest.split_once(": ")).is_some()
}

/// `run_status` for a cargo command that may build evictd: the nested eBPF build's lines
/// (~150 on a fresh machine, none of them a real warning) become one progress line, and are
/// shown in full only when the command fails, where they may hold the reason.
fn cargo_status(cmd: &mut Command, what: &str) -> Result<()> {
    let mut child =
        cmd.stderr(Stdio::piped()).spawn().with_context(|| format!("{what}: could not start {cmd:?}"))?;
    let mut held = Vec::new();
    if let Some(stderr) = child.stderr.take() {
        let mut reader = BufReader::new(stderr);
        let mut raw = Vec::new();
        // Read to the end whatever the bytes: the command is always waited for below.
        while reader.read_until(b'\n', &mut raw).is_ok_and(|n| n > 0) {
            let line = String::from_utf8_lossy(&raw).trim_end_matches('\n').to_owned();
            raw.clear();
            if !is_ebpf_build_line(&line) {
                eprintln!("{line}");
            } else if held.is_empty() {
                step(
                    "the eBPF programs (evictd-ebpf, nightly): built or up to date; their build output is shown if this fails",
                );
                held.push(line);
            } else {
                held.push(line);
            }
        }
    }
    let status = child.wait().with_context(|| format!("{what}: waiting for {cmd:?}"))?;
    if !status.success() {
        for line in &held {
            eprintln!("{line}");
        }
        bail!("{what} failed ({status})");
    }
    Ok(())
}

fn output(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_relayed_ebpf_build_is_held_back() {
        assert!(is_ebpf_build_line("warning: evictd@0.1.0:    Compiling core v0.0.0"));
        assert!(is_ebpf_build_line("warning: evictd@0.1.0: error[E0425]: cannot find value"));
        assert!(!is_ebpf_build_line("warning: unused import: `Foo`"));
        assert!(!is_ebpf_build_line("   Compiling evictd v0.1.0 (/work/evictd)"));
        assert!(!is_ebpf_build_line("warning: `evictd` (lib) generated 1 warning"));
    }
}
