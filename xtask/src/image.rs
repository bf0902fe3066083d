//! `cargo xtask image`: evictd's container image, written by the build itself — no daemon, no
//! registry, no base image to pull. The release binary (the dev profile's for the tests) is
//! linked statically (glibc's static libraries; the eBPF object is embedded in it), checked
//! to have no program interpreter, and put alone at `/usr/local/bin/evictd` in one layer
//! `FROM scratch`, as an OCI image layout in a tar archive (`ctr images import`, `podman
//! load`, `skopeo copy oci-archive:…` take it). `deploy/Dockerfile` builds an equivalent image from the same binary (its
//! timestamps and history differ, so its digest does).

use std::{
    io::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use oci_spec::image::{
    ConfigBuilder, Descriptor, DescriptorBuilder, ImageConfigurationBuilder, ImageIndexBuilder,
    ImageManifestBuilder, MediaType, RootFsBuilder, SCHEMA_VERSION,
};
use sha2::{Digest as _, Sha256};

use crate::{BuildEnv, cargo_status, step, workspace_root};

/// The host triple, named so that cargo applies the static flags to evictd alone (not to
/// build scripts and proc-macros, which cannot be static).
const TARGET: &str = "x86_64-unknown-linux-gnu";
/// The image's name in the archive (`org.opencontainers.image.ref.name` and containerd's
/// own annotation, which `ctr images import` names the image by).
pub(crate) const NAME: &str = "localhost/evictd";

/// Where the binary is in the image, and the PATH the image sets (a runtime's default when an
/// image sets none, which names it too).
pub(crate) const BINARY: &str = "/usr/local/bin/evictd";
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(clap::Args, Default)]
pub(crate) struct ImageArgs {
    /// Where to write the archive (default: target/image/evictd-<version>.oci.tar).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// The dev profile instead of release (its static build took 2.5 minutes here where the
    /// release profile's at opt-level 1 without LTO took 6.8 in CI, on two cores; the eBPF
    /// object inside is the same): the image the test suite checks and runs, not one to ship.
    #[arg(skip)]
    pub for_tests: bool,
}

/// The static binary's path, built (or up to date): release, or dev `for_tests`.
pub(crate) fn build_static(env: &BuildEnv, for_tests: bool) -> Result<PathBuf> {
    // Cargo's directory for the dev profile is `debug`.
    let (profile, dir) = if for_tests { ("dev", "debug") } else { ("release", "release") };
    step(&format!("building evictd, {profile} profile, statically linked"));
    let mut cmd = env.cargo();
    cmd.args(["build", "-p", "evictd", "--profile", profile, "--target", TARGET])
        .env(
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
            // Debug info stays out of the image; symbols stay, for readable panics.
            "-C target-feature=+crt-static -C strip=debuginfo",
        )
        // Either would replace the flags above, and the binary would come out dynamic.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    cargo_status(&mut cmd, &format!("cargo build -p evictd --profile {profile} (static)"))?;
    let target_dir =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace_root().join("target"), PathBuf::from);
    let bin = target_dir.join(TARGET).join(dir).join("evictd");
    assert_static(&bin)?;
    Ok(bin)
}

/// A static executable has no program interpreter (`PT_INTERP`): it runs in an image with
/// nothing else in it.
fn assert_static(bin: &Path) -> Result<()> {
    use object::{
        Endianness,
        read::elf::{ElfFile64, ProgramHeader as _},
    };
    let data = std::fs::read(bin).with_context(|| format!("reading {}", bin.display()))?;
    let elf = ElfFile64::<Endianness>::parse(data.as_slice())
        .with_context(|| format!("{}: not ELF", bin.display()))?;
    let endian = elf.endian();
    if elf.elf_program_headers().iter().any(|ph| ph.p_type(endian) == object::elf::PT_INTERP) {
        bail!(
            "{} is dynamically linked (it has a program interpreter): the image has no loader",
            bin.display()
        );
    }
    Ok(())
}

pub(crate) fn image(env: &BuildEnv, args: &ImageArgs) -> Result<PathBuf> {
    let bin = build_static(env, args.for_tests)?;
    let version = env!("CARGO_PKG_VERSION");
    let out = args.out.clone().unwrap_or_else(|| {
        // Never in the place of the image to ship, which `cargo xtask image` writes.
        let suffix = if args.for_tests { "-tests" } else { "" };
        workspace_root().join(format!("target/image/evictd-{version}{suffix}.oci.tar"))
    });
    step(&format!("writing the image {NAME}:{version} to {}", out.display()));
    let binary = std::fs::read(&bin).with_context(|| format!("reading {}", bin.display()))?;
    let archive = oci_archive(&binary, version)?;
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&out, &archive).with_context(|| format!("writing {}", out.display()))?;
    step(&format!(
        "image {NAME}:{version}: binary {:.1} MiB, archive {:.1} MiB ({})",
        binary.len() as f64 / 1048576.0,
        archive.len() as f64 / 1048576.0,
        out.display()
    ));
    Ok(out)
}

/// One blob of the layout: its bytes, and the descriptor that names them.
struct Blob {
    bytes: Vec<u8>,
    descriptor: Descriptor,
}

fn blob(media_type: MediaType, bytes: Vec<u8>) -> Result<Blob> {
    let digest = format!("sha256:{:x}", Sha256::digest(&bytes));
    let descriptor = DescriptorBuilder::default()
        .media_type(media_type)
        .digest(digest.parse::<oci_spec::image::Digest>()?)
        .size(bytes.len() as u64)
        .build()?;
    Ok(Blob { bytes, descriptor })
}

/// The image as an OCI layout archive: `oci-layout`, `index.json` naming the manifest, and
/// the blobs (config, manifest, the one gzip layer holding the binary). Timestamps are zero,
/// so the same binary makes the same archive, byte for byte.
fn oci_archive(binary: &[u8], version: &str) -> Result<Vec<u8>> {
    // Where a shell's default PATH finds it: `kubectl exec … -- evictd status` works.
    let layer_tar = tar_of(&[(BINARY.trim_start_matches('/'), binary, 0o755)])?;
    let diff_id = format!("sha256:{:x}", Sha256::digest(&layer_tar));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&layer_tar)?;
    let layer = blob(MediaType::ImageLayerGzip, gz.finish()?)?;
    let config = ImageConfigurationBuilder::default()
        .architecture(oci_spec::image::Arch::Amd64)
        .os(oci_spec::image::Os::Linux)
        .config(
            ConfigBuilder::default()
                .entrypoint(vec![BINARY.to_owned()])
                .env(vec![format!("PATH={PATH}")])
                .labels([("org.opencontainers.image.version".to_owned(), version.to_owned())])
                .build()?,
        )
        .rootfs(RootFsBuilder::default().typ("layers").diff_ids(vec![diff_id]).build()?)
        .build()?;
    let config = blob(MediaType::ImageConfig, config.to_string()?.into_bytes())?;
    let manifest = ImageManifestBuilder::default()
        .schema_version(SCHEMA_VERSION)
        .media_type(MediaType::ImageManifest)
        .config(config.descriptor.clone())
        .layers(vec![layer.descriptor.clone()])
        .build()?;
    let mut named = blob(MediaType::ImageManifest, manifest.to_string()?.into_bytes())?;
    let reference = format!("{NAME}:{version}");
    named.descriptor.set_annotations(Some(
        [
            ("org.opencontainers.image.ref.name".to_owned(), version.to_owned()),
            ("io.containerd.image.name".to_owned(), reference),
        ]
        .into(),
    ));
    let index = ImageIndexBuilder::default()
        .schema_version(SCHEMA_VERSION)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![named.descriptor.clone()])
        .build()?;
    let path = |b: &Blob| format!("blobs/sha256/{}", b.descriptor.digest().digest());
    let (index, layout) = (index.to_string()?.into_bytes(), br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec());
    let (layer_path, config_path, manifest_path) = (path(&layer), path(&config), path(&named));
    tar_of(&[
        ("oci-layout", &layout, 0o644),
        ("index.json", &index, 0o644),
        (&manifest_path, &named.bytes, 0o644),
        (&config_path, &config.bytes, 0o644),
        (&layer_path, &layer.bytes, 0o644),
    ])
}

/// A tar of regular files, each preceded by its parent directories (0755), owned by root,
/// dated 0.
fn tar_of(files: &[(&str, &[u8], u32)]) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut dirs = std::collections::BTreeSet::new();
    let header = |kind: tar::EntryType, size: u64, mode: u32| {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h
    };
    for (path, data, mode) in files {
        for dir in Path::new(path)
            .ancestors()
            .skip(1)
            .filter(|d| !d.as_os_str().is_empty())
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            if dirs.insert(dir.to_path_buf()) {
                tar.append_data(
                    &mut header(tar::EntryType::Directory, 0, 0o755),
                    format!("{}/", dir.display()),
                    std::io::empty(),
                )?;
            }
        }
        tar.append_data(&mut header(tar::EntryType::Regular, data.len() as u64, *mode), path, *data)?;
    }
    Ok(tar.into_inner()?)
}
