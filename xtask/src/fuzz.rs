//! `cargo xtask fuzz [--seconds N] [TARGET...]`: every parser evictd points at user or kernel
//! text, under libFuzzer (cargo-fuzz, nightly), each for a bounded time, from the seeds in
//! `fuzz/seeds` plus what earlier runs found (`fuzz/corpus`, not committed). A crash fails the
//! run and leaves its input in `fuzz/artifacts/<target>/`; make it a regression test.

use std::{process::Command, time::Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{BuildEnv, cargo_bin_dir, run_status, step, workspace_root};

const CARGO_FUZZ_VERSION: &str = "0.13.2";

pub(crate) const TARGETS: [&str; 8] = [
    "quantity",
    "go_duration",
    "threshold_flags",
    "kubelet_config",
    "summary",
    "pod_list",
    "tracefs_format",
    "cgroup_files",
];

#[derive(Args)]
pub(crate) struct FuzzArgs {
    /// How long each target runs.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Targets to run (default: all).
    targets: Vec<String>,
}

pub(crate) fn fuzz(env: &BuildEnv, args: &FuzzArgs) -> Result<()> {
    let targets: Vec<&str> = if args.targets.is_empty() {
        TARGETS.to_vec()
    } else {
        for t in &args.targets {
            if !TARGETS.contains(&t.as_str()) {
                bail!("unknown fuzz target {t:?} (known: {})", TARGETS.join(", "));
            }
        }
        args.targets.iter().map(String::as_str).collect()
    };
    ensure_cargo_fuzz(env)?;
    step("building the fuzz targets (nightly, sanitizers; a few minutes from scratch)");
    run_status(fuzz_cmd(env).args(["build", "-O"]), "cargo fuzz build")?;
    let rows = run_targets(env, &targets, args.seconds)?;
    // A crash ends the run above, with its input: reaching here means none was found.
    println!("{:<16} {:>12}", "target", "executions");
    for (t, execs) in &rows {
        println!("{t:<16} {execs:>12}");
    }
    println!("no crashes");
    Ok(())
}

fn fuzz_cmd(env: &BuildEnv) -> Command {
    let mut c = env.nightly_cargo();
    c.arg("fuzz").current_dir(workspace_root().join("fuzz"));
    c
}

fn ensure_cargo_fuzz(env: &BuildEnv) -> Result<()> {
    let ok = Command::new(cargo_bin_dir().join("cargo-fuzz"))
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(CARGO_FUZZ_VERSION));
    if ok {
        return Ok(());
    }
    step(&format!("installing cargo-fuzz {CARGO_FUZZ_VERSION} (about a minute)"));
    run_status(
        env.cargo().args(["install", "--locked", &format!("cargo-fuzz@{CARGO_FUZZ_VERSION}")]),
        "installing cargo-fuzz",
    )
}

/// Runs the targets, one per CPU at a time (each is one single-threaded libFuzzer process,
/// and each still runs its full `seconds`); returns their rows in the order given, or the
/// first failure.
fn run_targets(env: &BuildEnv, targets: &[&str], seconds: u64) -> Result<Vec<Row>> {
    let jobs = std::thread::available_parallelism().map_or(1, usize::from);
    crate::in_parallel(targets, jobs, |t| run_target(env, t, seconds))
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("a fuzzing thread panicked"))))
        .collect()
}

/// A target's name and the executions libFuzzer reports.
type Row = (String, u64);

/// Runs one target for `seconds`.
fn run_target(env: &BuildEnv, target: &str, seconds: u64) -> Result<Row> {
    let root = workspace_root().join("fuzz");
    let corpus = root.join("corpus").join(target);
    std::fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    step(&format!("fuzzing {target} for {seconds} s"));
    let t = Instant::now();
    let out = fuzz_cmd(env)
        .args(["run", "-O", target])
        .arg(&corpus)
        .arg(root.join("seeds").join(target))
        .args(["--", &format!("-max_total_time={seconds}"), "-rss_limit_mb=2048", "-print_final_stats=1"])
        .output()
        .with_context(|| format!("running cargo fuzz run {target}"))?;
    let log = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let tail: Vec<&str> = log.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect();
        bail!(
            "fuzz target {target} failed after {:.0} s; its input is in fuzz/artifacts/{target}/:\n{}",
            t.elapsed().as_secs_f64(),
            tail.join("\n")
        );
    }
    let execs = log
        .lines()
        .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Ok((target.to_owned(), execs))
}
