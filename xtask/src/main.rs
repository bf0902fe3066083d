//! Developer entry points: `cargo xtask setup | build | run | test`.
//!
//! `setup` installs what building evictd needs and is quick when everything is there; every
//! other command runs it first, so the README's two commands work on a fresh machine.

use std::{
    env,
    ffi::OsString,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::Instant,
};

use anyhow::{Context as _, Result, anyhow, bail};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  setup              install what the build and tests need (nightly rust-src, Debian packages,
                     bpf-linker); idempotent
  build [--release]  set up, then build evictd (the eBPF object is embedded in the binary)
  run [-- ARGS]      set up, build (release) and run evictd on this machine;
                     default ARGS: --trace --dry-run
  test               set up, then lint and run the whole test suite (privileged tests need root)
  bench reaction|overhead [--smoke] [ARGS]
                     reaction: eviction reaction time per wake mode and allocation rate;
                     overhead: the probes' cost on the allocation path, evictd's RSS and CPU
                     (root; --smoke: one short debug-build run, as CI does; ARGS go to
                     evictd-bench)";

const BPF_LINKER_VERSION: &str = "0.13.0";

/// Debian packages: protoc builds the CRI bindings (k8s-cri); containerd and runc run the
/// end-to-end tests' private container runtime; gcc builds their static test binaries.
const APT_PACKAGES: &[&str] = &["protobuf-compiler", "containerd", "runc", "gcc", "libc6-dev"];

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("setup") => setup().map(|_| ()),
        Some("build") => setup().and_then(|env| build(&env, args.iter().any(|a| a == "--release"))),
        Some("run") => setup().and_then(|env| run(&env, &args[1..])),
        Some("test") => setup().and_then(|env| test(&env)),
        Some("bench") => setup().and_then(|env| bench(&env, &args[1..])),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(anyhow!("{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
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
    fn cargo(&self) -> Command {
        let mut c = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        c.env("PATH", &self.path).current_dir(workspace_root());
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

fn setup() -> Result<BuildEnv> {
    let started = Instant::now();
    let bin = cargo_bin_dir();
    let mut paths = vec![bin.clone()];
    paths.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
    let env = BuildEnv { path: env::join_paths(paths).context("PATH")? };

    // 1. The nightly toolchain compiles the eBPF crate (-Z build-std=core needs rust-src).
    let toolchains =
        output(Command::new("rustup").args(["toolchain", "list"]), "step 1 (rustup toolchain list)")
            .context("rustup is needed: evictd builds its eBPF programs with the nightly toolchain")?;
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        step("installing the nightly toolchain (minimal profile)");
        run_status(
            Command::new("rustup").args(["toolchain", "install", "nightly", "--profile", "minimal"]),
            "step 1 (installing the nightly toolchain)",
        )?;
    }
    let components = output(
        Command::new("rustup").args(["component", "list", "--toolchain", "nightly", "--installed"]),
        "step 2 (listing nightly components)",
    )?;
    if !components.lines().any(|l| l.starts_with("rust-src")) {
        step("adding rust-src to the nightly toolchain");
        run_status(
            Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]),
            "step 2 (rustup component add rust-src --toolchain nightly)",
        )?;
    }

    // 2. Debian packages.
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect();
    if !missing.is_empty() {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            bail!(
                "step 3: Debian packages missing: {}; install them as root: apt-get install -y --no-install-recommends {}",
                missing.join(" "),
                missing.join(" ")
            );
        }
        step(&format!("installing Debian packages: {}", missing.join(" ")));
        run_status(Command::new("apt-get").arg("update").arg("-q"), "step 3 (apt-get update)")?;
        run_status(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
            "step 3 (apt-get install)",
        )?;
    }

    // 3. bpf-linker, built against the nightly toolchain's own libLLVM: no LLVM package of
    //    that version exists here, and the linker must match the LLVM rustc emits bitcode for.
    let linker_ok = Command::new(bin.join("bpf-linker"))
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION));
    if !linker_ok {
        install_bpf_linker(&env)?;
    }
    step(&format!("setup complete ({:.1}s)", started.elapsed().as_secs_f64()));
    Ok(env)
}

fn install_bpf_linker(env: &BuildEnv) -> Result<()> {
    let what = "step 4 (building bpf-linker)";
    let vv = output(Command::new("rustc").args(["+nightly", "-vV"]), what)?;
    let major = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .ok_or_else(|| anyhow!("{what}: `rustc +nightly -vV` printed no LLVM version"))?
        .to_owned();
    let sysroot = output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]), what)?;
    let libdir = Path::new(sysroot.trim()).join("lib");
    let lib = std::fs::read_dir(&libdir)
        .with_context(|| format!("{what}: reading {}", libdir.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find(|n| n.starts_with(&format!("libLLVM-{major}")) && n.ends_with(".so"))
        .ok_or_else(|| {
            anyhow!(
                "{what}: no libLLVM-{major}*.so in {} (the nightly toolchain ships one)",
                libdir.display()
            )
        })?;
    let lib = lib.trim_start_matches("lib").trim_end_matches(".so").to_owned();
    step(&format!(
        "building bpf-linker {BPF_LINKER_VERSION} against the nightly toolchain's {lib} (about a minute)"
    ));
    let rustflags = format!("-L {0} -l dylib={lib} -C link-arg=-Wl,-rpath,{0}", libdir.display());
    run_status(
        env.cargo()
            .env("RUSTFLAGS", rustflags)
            .args([
                "install",
                &format!("bpf-linker@{BPF_LINKER_VERSION}"),
                "--no-default-features",
                "--features",
            ])
            .arg(format!("llvm-{major},no-llvm-linking")),
        what,
    )
    .context(
        "bpf-linker could not be built; check that crates.io is reachable and see the cargo output above",
    )
}

fn build(env: &BuildEnv, release: bool) -> Result<()> {
    step("building evictd");
    let mut cmd = env.cargo();
    cmd.args(["build", "-p", "evictd"]);
    if release {
        cmd.arg("--release");
    }
    run_status(&mut cmd, "cargo build -p evictd")
}

fn run(env: &BuildEnv, args: &[String]) -> Result<()> {
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

fn test(env: &BuildEnv) -> Result<()> {
    let started = Instant::now();
    step("checking formatting");
    run_status(env.cargo().args(["fmt", "--all", "--check"]), "cargo fmt --check (run `cargo fmt --all`)")?;
    step("linting");
    run_status(
        env.cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]),
        "cargo clippy",
    )?;
    step("building the workspace");
    run_status(env.cargo().args(["build", "--workspace"]), "cargo build --workspace")?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        step("NOTE: not root: the privileged tests (BPF, cgroups) will report SKIPPED");
    }
    step("running the tests");
    let mut cmd = env.cargo();
    cmd.args(["test", "--workspace"]);
    // In CI a skipped privileged test is a failure: CI runs as root on a BPF-capable kernel.
    if env::var("CI").is_ok_and(|v| v == "true") {
        cmd.env("EVICTD_REQUIRE_PRIVILEGED", "1");
    }
    run_status(&mut cmd, "cargo test --workspace")?;
    step(&format!("all checks passed in {:.0}s", started.elapsed().as_secs_f64()));
    Ok(())
}

fn bench(env: &BuildEnv, args: &[String]) -> Result<()> {
    let Some(kind) = args.first() else { bail!("{USAGE}") };
    if kind != "reaction" && kind != "overhead" {
        bail!("unknown benchmark {kind:?}\n{USAGE}");
    }
    let smoke = args.iter().any(|a| a == "--smoke");
    let rest: Vec<&str> = args[1..].iter().map(String::as_str).filter(|a| *a != "--smoke").collect();
    // The smoke run uses the debug build the tests already made; numbers need release.
    let profile = if smoke { "debug" } else { "release" };
    step(&format!("building evictd and evictd-bench ({profile})"));
    let mut cmd = env.cargo();
    cmd.args(["build", "-p", "evictd", "-p", "evictd-tests", "--bin", "evictd", "--bin", "evictd-bench"]);
    if !smoke {
        cmd.arg("--release");
    }
    run_status(&mut cmd, "building the benchmark")?;
    let bin = workspace_root().join("target").join(profile).join("evictd-bench");
    let mut run = Command::new(&bin);
    run.arg(kind).env("PATH", &env.path).current_dir(workspace_root());
    if smoke {
        let short: &[&str] = match kind.as_str() {
            "reaction" => &["--runs", "1", "--rates", "512", "--modes", "ebpf,eventfd,poll-100ms"],
            _ => &["--rounds", "1", "--seconds", "0.5"],
        };
        run.args(short).args(["--out", "target/bench-smoke"]);
    }
    run.args(&rest);
    step(&format!("running {} {kind} {}", bin.display(), rest.join(" ")));
    run_status(&mut run, &format!("evictd-bench {kind}"))
}
