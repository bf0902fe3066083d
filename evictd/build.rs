//! Builds the eBPF object (nightly, bpfel-unknown-none, bpf-linker) and leaves it in OUT_DIR,
//! where `ebpf.rs` embeds it. The tools come from `cargo xtask setup`; when they are missing
//! this fails with that advice instead of a wall of linker errors.
use std::{path::Path, process::Command};

use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=PATH");
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
