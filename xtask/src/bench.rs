//! `cargo xtask bench reaction|earlyoom|overhead|disk|scale [--smoke] [ARGS]`: builds evictd and
//! evictd-bench (release; debug for `--smoke`) and runs the benchmark. ARGS go to
//! evictd-bench. `earlyoom` first unpacks Debian's earlyoom package under target/tools.

use std::process::Command;

use anyhow::{Context as _, Result};
use clap::{Args, ValueEnum};

use crate::{BuildEnv, cargo_status, run_status, step, workspace_root};

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// reaction: eviction reaction time per wake mode, kill path and allocation rate;
    /// earlyoom: evictd beside earlyoom on the whole machine; overhead: the probes' cost on
    /// the allocation path, evictd's RSS and CPU; disk: how long a disk threshold's crossing
    /// takes to be seen, the disk poll beside the housekeeping timer; scale: the same pressure
    /// on a node of 10, 110 and 250 pods and a million files, the disk walker idle and
    /// walking, with evictd's decision time, RSS and idle CPU against the pods.
    kind: Kind,
    /// One short debug-build run, as CI does; asserts nothing.
    #[arg(long)]
    smoke: bool,
    /// Arguments for evictd-bench (`--runs N`, `--rates 256,1024`, ...; see
    /// `evictd-bench reaction --help`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    rest: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kind {
    Reaction,
    Earlyoom,
    Overhead,
    Disk,
    Scale,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Reaction => "reaction",
            Kind::Earlyoom => "earlyoom",
            Kind::Overhead => "overhead",
            Kind::Disk => "disk",
            Kind::Scale => "scale",
        }
    }

    /// The smoke run's short settings.
    fn smoke_args(self) -> &'static [&'static str] {
        match self {
            Kind::Reaction => &[
                "--runs",
                "1",
                "--rates",
                "512",
                "--modes",
                "ebpf,eventfd,poll-100ms",
                "--kill-paths",
                "cri,fast",
            ],
            Kind::Earlyoom => &["--runs", "1", "--rates", "1024", "--kill-paths", "fast"],
            Kind::Overhead => &["--rounds", "1", "--seconds", "0.5", "--hover-runs", "1"],
            Kind::Disk => &["--runs", "1", "--rates", "256", "--modes", "disk,timer-1s"],
            Kind::Scale => &["--pods", "3,6", "--runs", "2", "--files", "20000"],
        }
    }
}

pub(crate) fn bench(env: &BuildEnv, args: &BenchArgs) -> Result<()> {
    let kind = args.kind.as_str();
    let rest: Vec<&str> = args.rest.iter().map(String::as_str).filter(|a| *a != "--smoke").collect();
    let smoke = args.smoke || args.rest.iter().any(|a| a == "--smoke");
    let bin = build_bench(env, smoke)?;
    let mut run = Command::new(&bin);
    run.arg(kind).env("PATH", &env.path).current_dir(workspace_root());
    choose_evictd(env, &mut run, smoke)?;
    if smoke {
        run.args(args.kind.smoke_args()).args(["--out", "target/bench-smoke"]);
    }
    if args.kind == Kind::Earlyoom {
        run.arg("--earlyoom").arg(earlyoom_binary()?);
    }
    run.args(&rest);
    step(&format!("running {} {kind} {}", bin.display(), rest.join(" ")));
    run_status(&mut run, &format!("evictd-bench {kind}"))
}

/// Builds evictd and evictd-bench: release for numbers, debug (what the tests built) for a
/// smoke run. Returns evictd-bench's path.
fn build_bench(env: &BuildEnv, smoke: bool) -> Result<std::path::PathBuf> {
    let profile = if smoke { "debug" } else { "release" };
    step(&format!(
        "building evictd-bench ({profile}{})",
        if smoke { ", with the workspace's other binaries" } else { "" }
    ));
    let mut cmd = env.cargo();
    if smoke {
        // The workspace's build, which the tests made: a package selection would unify other
        // features and build again.
        cmd.args(["build", "--workspace", "--bins"]);
    } else {
        // evictd itself is the static build (`evictd_under_test`); the memory hog is the
        // workload and the earlyoom comparison's ballast.
        cmd.args([
            "build",
            "--release",
            "-p",
            "evictd-tests",
            "--bin",
            "evictd-bench",
            "--bin",
            "evictd-memhog",
        ]);
    }
    cargo_status(&mut cmd, "building the benchmark")?;
    Ok(workspace_root().join("target").join(profile).join("evictd-bench"))
}

/// Tells evictd-bench which evictd to run: a debug run (smoke, CI's short soak) the one the
/// tests built beside it, whatever the caller's environment says; a release run
/// `evictd_under_test`.
fn choose_evictd(env: &BuildEnv, run: &mut Command, debug: bool) -> Result<()> {
    if debug {
        run.env_remove("EVICTD_BINARY");
    } else {
        run.env("EVICTD_BINARY", evictd_under_test(env)?);
    }
    Ok(())
}

/// The evictd a release benchmark runs: the static release binary, the one the image ships
/// (glibc linked in, no shared libraries: the dynamic build's RSS holds ~1.4 MiB more, the
/// pages of libc, libm, the loader and libgcc_s it maps). `EVICTD_BINARY`, where set, names
/// another (the dynamic `target/release/evictd`, say, to compare the two; built by hand: this
/// builds only the static one), resolved from the caller's directory.
fn evictd_under_test(env: &BuildEnv) -> Result<std::path::PathBuf> {
    if let Some(bin) = std::env::var_os("EVICTD_BINARY") {
        let bin = std::fs::canonicalize(&bin)
            .with_context(|| format!("EVICTD_BINARY={}", std::path::Path::new(&bin).display()))?;
        anyhow::ensure!(bin.is_file(), "EVICTD_BINARY={} is not a file", bin.display());
        step(&format!("evictd under test: {} (EVICTD_BINARY)", bin.display()));
        return Ok(bin);
    }
    let bin = crate::image::build_static(env, false)?;
    step(&format!("evictd under test: {} (static, as the image ships it)", bin.display()));
    Ok(bin)
}

/// Debian's earlyoom, unpacked (not installed: the package would start a service that
/// watches the whole machine).
fn earlyoom_binary() -> Result<std::path::PathBuf> {
    Ok(crate::setup::debian_unpacked("earlyoom", "usr/bin/earlyoom")?.join("usr/bin/earlyoom"))
}

#[derive(Args)]
pub(crate) struct SoakArgs {
    /// How long, minutes.
    #[arg(long, default_value_t = 20.0)]
    minutes: f64,
    /// Restart the runtime every this many episodes (0: never).
    #[arg(long, default_value_t = 10)]
    restart_every: usize,
    /// Pods running on the node throughout, a few MiB each (110: a full node).
    #[arg(long, default_value_t = 0)]
    pods: usize,
    /// Know the pods through a stand-in API server, down for one episode in this many
    /// (0: no API server).
    #[arg(long, default_value_t = 0)]
    api_down_every: usize,
    /// The debug build the tests made, instead of release (CI's short run).
    #[arg(long)]
    debug: bool,
}

/// `cargo xtask soak`: repeated pressure episodes with runtime restarts (root).
pub(crate) fn soak(env: &BuildEnv, args: &SoakArgs) -> Result<()> {
    let bin = build_bench(env, args.debug)?;
    let mut run = Command::new(&bin);
    choose_evictd(env, &mut run, args.debug)?;
    step(&format!("soaking for {} min beside {} pods", args.minutes, args.pods));
    run_status(
        run.args([
            "soak",
            "--minutes",
            &args.minutes.to_string(),
            "--restart-every",
            &args.restart_every.to_string(),
            "--pods",
            &args.pods.to_string(),
            "--api-down-every",
            &args.api_down_every.to_string(),
        ])
        .env("PATH", &env.path)
        .current_dir(workspace_root()),
        "evictd-bench soak",
    )
}
