//! `cargo xtask setup`: the nightly toolchain with rust-src and rustfmt, the Debian
//! packages, and bpf-linker built against the nightly toolchain's own libLLVM. Quick when
//! everything is there.

use std::{env, path::Path, process::Command, time::Instant};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::{BuildEnv, cargo_bin_dir, output, run_status, step};

const BPF_LINKER_VERSION: &str = "0.13.0";

/// Debian packages: protoc builds the CRI bindings (k8s-cri); containerd and runc run the
/// end-to-end tests' private container runtime; gcc builds their static test binaries; g++
/// builds libFuzzer for `cargo xtask fuzz`; the benchmarks' PNG plots lay text out in
/// DejaVu Sans; the CNI plugins give the DaemonSet's pod its pod network; libfuse3 runs the
/// lxcfs the tests unpack (`debian_unpacked`).
const APT_PACKAGES: &[&str] = &[
    "libfuse3-3",
    "protobuf-compiler",
    "containerd",
    "runc",
    "gcc",
    "g++",
    "libc6-dev",
    "fonts-dejavu-core",
    "containernetworking-plugins",
];

pub(crate) fn setup() -> Result<BuildEnv> {
    let started = Instant::now();
    let bin = cargo_bin_dir();
    let mut paths = vec![bin.clone()];
    paths.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
    let env = BuildEnv { path: env::join_paths(paths).context("PATH")? };
    ensure_nightly()?;
    ensure_debian_packages(APT_PACKAGES)?;
    // bpf-linker, built against the nightly toolchain's own libLLVM: no LLVM package of that
    // version exists here, and the linker must match the LLVM rustc emits bitcode for.
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

/// The nightly toolchain compiles the eBPF crate (`-Z build-std=core` needs rust-src), and
/// its rustfmt checks formatting (import grouping, see rustfmt.toml).
fn ensure_nightly() -> Result<()> {
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
    for component in ["rust-src", "rustfmt"] {
        if !components.lines().any(|l| l.starts_with(component)) {
            step(&format!("adding {component} to the nightly toolchain"));
            run_status(
                Command::new("rustup").args(["component", "add", component, "--toolchain", "nightly"]),
                &format!("step 2 (rustup component add {component} --toolchain nightly)"),
            )?;
        }
    }
    Ok(())
}

/// Debian's `package`, unpacked under target/tools/<package>, not installed (its
/// maintainer scripts would start a service on this machine); its directory, which must
/// hold `file`. `apt-get download` uses the machine's sources as they are. Quick when it is
/// there.
pub(crate) fn debian_unpacked(package: &str, file: &str) -> Result<std::path::PathBuf> {
    let tools = crate::workspace_root().join("target/tools");
    let dir = tools.join(package);
    if dir.join(file).is_file() {
        return Ok(dir);
    }
    step(&format!("fetching Debian's {package} package (apt-get download, unpacked, not installed)"));
    // Fetched and unpacked beside, then moved in place whole: a half-done fetch or unpack is
    // never taken for a whole one.
    let partial = tools.join(format!("{package}.partial"));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial)?;
    run_status(
        Command::new("apt-get").args(["download", package]).current_dir(&partial),
        &format!("apt-get download {package}"),
    )?;
    let deb = std::fs::read_dir(&partial)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| anyhow!("apt-get download {package} left no .deb in {}", partial.display()))?;
    run_status(Command::new("dpkg").arg("-x").arg(&deb).arg(&partial), &format!("unpacking {package}"))?;
    anyhow::ensure!(partial.join(file).is_file(), "{file} is not in Debian's {package} package");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&partial, &dir)?;
    Ok(dir)
}

/// Installs those of `packages` that are missing (as root; otherwise says what to install).
pub(crate) fn ensure_debian_packages(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
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
    )
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
