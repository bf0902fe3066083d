//! Developer entry points: `cargo xtask setup | build | run | test | bench`, one module per
//! command.
//!
//! `setup` installs what building evictd needs and is quick when everything is there; every
//! other command runs it first, so the README's two commands work on a fresh machine.

use std::{
    env,
    ffi::OsString,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

mod bench;
mod build;
mod fuzz;
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
    let result = match Xtask::parse().command {
        Cmd::Setup => setup::setup().map(|_| ()),
        Cmd::Build { release } => setup::setup().and_then(|env| build::build(&env, release)),
        Cmd::Run { args } => setup::setup().and_then(|env| build::run(&env, &args)),
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

fn step(msg: &str) {
    eprintln!("[xtask] {msg}");
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

fn output(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
