//! `cargo xtask test`: formatting, lints, the build, and every test. In CI (`CI=true`) a
//! privileged test that would be skipped fails instead.

use std::{env, time::Instant};

use anyhow::Result;

use crate::{BuildEnv, cargo_status, run_status, step};

pub(crate) fn test(env: &BuildEnv, with_vms: bool) -> Result<()> {
    let started = Instant::now();
    step("checking formatting");
    // rustfmt.toml groups imports, which only nightly rustfmt does; the eBPF build needs
    // the nightly toolchain anyway.
    run_status(
        env.nightly_cargo().args(["fmt", "--all", "--check"]),
        "cargo +nightly fmt --check (run `cargo +nightly fmt --all`)",
    )?;
    step("linting");
    cargo_status(
        env.cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]),
        "cargo clippy",
    )?;
    step("building the workspace");
    cargo_status(env.cargo().args(["build", "--workspace"]), "cargo build --workspace")?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        step("NOTE: not root: the privileged tests (BPF, cgroups) will report SKIPPED");
    }
    // The image, for the tests that run it (tests/tests/image.rs): built as users build it
    // but with the dev profile, whose static build takes a CI run ~4 minutes less than the
    // release profile's at opt-level 1 without LTO (and more than that with it).
    let image = crate::image::image(env, &crate::image::ImageArgs { for_tests: true, ..Default::default() })?;
    step("running the tests");
    let mut cmd = env.cargo();
    cmd.args(["test", "--workspace"]).env("EVICTD_IMAGE", &image);
    // LXCFS, for the test of a node that is itself a container (tests/tests/lxcfs.rs, root
    // only). One that cannot be had leaves that test to skip, loudly (to fail, in CI).
    if crate::is_root() {
        match crate::setup::debian_unpacked("lxcfs", "usr/bin/lxcfs") {
            Ok(lxcfs) => {
                cmd.env("EVICTD_LXCFS", lxcfs);
            }
            Err(e) => step(&format!("NOTE: no lxcfs for its test ({e:#})")),
        }
    }
    // In CI a skipped privileged test is a failure: CI runs as root on a BPF-capable kernel.
    if env::var("CI").is_ok_and(|v| v == "true") {
        cmd.env("EVICTD_REQUIRE_PRIVILEGED", "1");
    }
    cargo_status(&mut cmd, "cargo test --workspace")?;
    if with_vms {
        if crate::is_root() {
            step("the VM matrix: the privileged tests in Debian's kernels with cgroup v2");
            crate::vm::vm(env, &crate::vm::VmArgs::default())?;
        } else if env::var("CI").is_ok_and(|v| v == "true") {
            anyhow::bail!("the VM matrix needs root, and CI must run it");
        } else {
            step("NOTE: not root: the VM matrix (cargo xtask vm) is not run");
        }
    }
    step(&format!("all checks passed in {:.0}s", started.elapsed().as_secs_f64()));
    Ok(())
}
