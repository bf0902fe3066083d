//! Builds the eBPF object (nightly, bpfel-unknown-none, bpf-linker) and leaves it in OUT_DIR,
//! where `ebpf.rs` embeds it. The tools come from `cargo xtask setup`; when they are missing
//! this fails with that advice instead of a wall of linker errors.
use std::{path::Path, process::Command};

use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=PATH");
    pack_relative_relocations();
    let has_linker = Command::new("bpf-linker").arg("--version").output().is_ok_and(|o| o.status.success());
    if !has_linker {
        return Err(anyhow!(
            "bpf-linker is not on PATH: run `cargo xtask setup` (it builds bpf-linker against the \
             nightly toolchain's LLVM), then build again"
        ));
    }
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let root = Path::new(&manifest_dir)
        .parent()
        .context("evictd crate has no parent directory")?
        .join("evictd-ebpf");
    let root = root.to_str().context("non-UTF-8 path to evictd-ebpf")?;
    keep_profile_overrides_from_the_ebpf_build();
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "evictd-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .context("building the eBPF programs (evictd-ebpf) failed; `cargo xtask setup` installs the nightly rust-src and bpf-linker they need")
}

/// The eBPF object is built by a cargo of its own, which inherits this script's environment.
/// A profile override a daemon build sets there (`CARGO_PROFILE_RELEASE_*`: a lower opt-level
/// or no LTO, for a quicker build) is for the daemon: the object the verifier checks stays the
/// one the workspace's profile gives, whatever binary embeds it. (No rerun is asked for when
/// they change: the object does not depend on them.)
fn keep_profile_overrides_from_the_ebpf_build() {
    let overrides: Vec<_> = std::env::vars_os()
        .map(|(key, _)| key)
        .filter(|key| key.to_str().is_some_and(|k| k.starts_with("CARGO_PROFILE_")))
        .collect();
    for key in overrides {
        // SAFETY: a build script is one thread; nothing reads the environment concurrently.
        unsafe { std::env::remove_var(key) };
    }
}

/// Relative relocations packed (DT_RELR): ~20 000 of them took 0.5 MiB of the binary as RELA
/// entries, which the loader reads at start and which then stay in evictd's locked memory.
/// Only where the C library this build links against can apply them: glibc ≥ 2.36, whose
/// loader applies them in a dynamic binary and whose static start-up code in a static one.
/// Built against an older glibc, the static image would crash at start, so the flag is left
/// out (said as a warning) and the binary is as before.
fn pack_relative_relocations() {
    let gnu_linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").is_ok_and(|env| env == "gnu");
    let cross = std::env::var("TARGET").ok() != std::env::var("HOST").ok();
    if !gnu_linux || cross {
        return;
    }
    match host_glibc() {
        Some((major, minor)) if (major, minor) >= (2, 36) => {
            println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
        }
        found => println!(
            "cargo:warning=glibc {} here: relative relocations are not packed (DT_RELR needs glibc ≥ \
             2.36); evictd's locked memory is ~0.5 MiB larger",
            found.map_or("of unknown version".into(), |(a, b)| format!("{a}.{b}"))
        ),
    }
}

/// The version of the glibc this build script runs on (a native build links against it).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn host_glibc() -> Option<(u32, u32)> {
    // SAFETY: gnu_get_libc_version returns a pointer to a static, NUL-terminated string.
    let version = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
    let mut parts = version.to_str().ok()?.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn host_glibc() -> Option<(u32, u32)> {
    None
}
