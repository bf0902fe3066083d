//! `cargo xtask build` and `cargo xtask run`.

use std::process::Command;

use anyhow::Result;

use crate::{BuildEnv, cargo_status, run_status, step, workspace_root};

pub(crate) fn build(env: &BuildEnv, release: bool) -> Result<()> {
    step("building evictd");
    let mut cmd = env.cargo();
    cmd.args(["build", "-p", "evictd"]);
    if release {
        cmd.arg("--release");
    }
    cargo_status(&mut cmd, "cargo build -p evictd")
}

pub(crate) fn run(env: &BuildEnv, args: &[String]) -> Result<()> {
    build(env, true)?;
    let args: Vec<&str> = match args.first().map(String::as_str) {
        Some("--") => args[1..].iter().map(String::as_str).collect(),
        Some(_) => args.iter().map(String::as_str).collect(),
        // Watch this node and decide, but stop nothing: the safe default on any machine.
        None => vec!["--trace", "--dry-run"],
    };
    let bin = workspace_root().join("target/release/evictd");
    step(&format!("running {} {}", bin.display(), args.join(" ")));
    run_status(Command::new(&bin).args(&args).env("PATH", &env.path), "evictd")
}
