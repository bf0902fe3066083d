//! The one initramfs every VM of the matrix boots. The VMs have no disk, so everything the
//! init and the tests need (evictd, the test binaries, this machine's programs and their
//! shared libraries, systemd's units, the image users run) is packed into it; it does not
//! depend on the kernel, so it is built once for all of them, and a kernel's modules go in
//! a second archive appended to that kernel's copy (`with_modules`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, anyhow, bail, ensure};

use super::{MAIN_PLAN, SYSTEMD_PLAN};
use crate::{BuildEnv, cargo_status, output, run_status, step, workspace_root};

/// systemd starts the init as a service, its output on the serial console, once the
/// manager is up; nothing else (no default target, no getty).
const SYSTEMD_UNITS: [(&str, &str); 2] = [
    (
        "/etc/systemd/system/evictd-vm.target",
        "[Unit]\nDescription=evictd VM tests\nDefaultDependencies=no\nRequires=evictd-vm.service\n\
         After=evictd-vm.service\nAllowIsolate=yes\n",
    ),
    (
        "/etc/systemd/system/evictd-vm.service",
        "[Unit]\nDescription=evictd VM tests\nDefaultDependencies=no\n\n[Service]\nType=oneshot\n\
         ExecStart=/init\nStandardOutput=tty\nStandardError=tty\nTTYPath=/dev/ttyS0\n",
    ),
];

/// Programs of this machine the tests start (`sleep` as a process to kill; the container
/// runtime of the end-to-end tests), copied with their libraries.
const HOST_TOOLS: &[&str] = &[
    "/usr/bin/sleep",
    // A pod process holding memory of its own, for the fast kill's tests (`sh -c` with a
    // pipeline into a variable).
    "/usr/bin/sh",
    "/usr/bin/head",
    "/usr/bin/tr",
    "/usr/bin/containerd",
    "/usr/bin/containerd-shim-runc-v2",
    "/usr/bin/ctr",
    "/usr/sbin/runc",
    "/usr/lib/systemd/systemd",
    "/usr/bin/systemctl",
    // The pod network of the DaemonSet's test (`ip` deletes its bridge at the end).
    "/usr/sbin/ip",
    "/usr/lib/cni/bridge",
    "/usr/lib/cni/host-local",
    "/usr/lib/cni/loopback",
];

/// Where the init finds the image `cargo xtask image` wrote (it sets `EVICTD_IMAGE`), and the
/// kernel modules to load (`kernels::network_modules`), in the order of their names.
const IMAGE_ARCHIVE: &str = "/vm/evictd.oci.tar";
const MODULES_DIR: &str = "/vm/modules";

/// Where the init tells the end-to-end harness the prebuilt image binaries are (no gcc in
/// the VM): `pause` and `hog`, static, built here from `tests/images/*.c`.
const IMAGE_BIN: &str = "/vm/image-bin";

/// Builds the binaries and test binaries (the debug build `cargo xtask test` made) and packs
/// them, stripped of debug info, with their shared libraries into one uncompressed newc
/// initramfs: the same for every kernel.
pub(super) fn build_initramfs(env: &BuildEnv, dir: &Path, image: &Path) -> Result<PathBuf> {
    step("building evictd, the VM init and the test binaries (debug)");
    // The workspace's, as `cargo xtask test` built it: a package selection would build again.
    cargo_status(env.cargo().args(["build", "--workspace", "--bins"]), "cargo build --workspace --bins")?;
    let bin_dir = workspace_root().join("target/debug");
    let stage = dir.join("stage");
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    fs::create_dir_all(&stage)?;
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    let mut add_stripped = |archive: String, src: &Path| -> Result<()> {
        let out = stage.join(archive.trim_start_matches('/').replace('/', "_"));
        run_status(
            Command::new("strip").arg("--strip-debug").arg("-o").arg(&out).arg(src),
            &format!("strip {}", src.display()),
        )?;
        files.push((archive, out));
        Ok(())
    };
    add_stripped("/init".into(), &bin_dir.join("evictd-vm-init"))?;
    for bin in ["evictd", "evictd-memhog", "evictd-kubelet-stand-in"] {
        add_stripped(format!("/vm/bin/{bin}"), &bin_dir.join(bin))?;
    }
    // One line per test binary: its path, its flags, then the tests to run (`--exact`
    // names), if not all. Each binary goes in once, whichever plans name it.
    let mut packed = BTreeSet::new();
    let all_tests = workspace_test_executables(env)?;
    let mut built: BTreeMap<&[&str], Vec<PathBuf>> = BTreeMap::new();
    let mut texts = Vec::new();
    for plan in [&MAIN_PLAN, &SYSTEMD_PLAN] {
        let mut text = String::new();
        for line in plan.lines {
            if !built.contains_key(line.selection) {
                built.insert(line.selection, select_executables(&all_tests, line.selection)?);
            }
            for t in &built[line.selection] {
                let name = t
                    .file_name()
                    .and_then(|n| n.to_str())
                    .ok_or_else(|| anyhow!("{}: no name", t.display()))?;
                // Test binaries live in deps/ next to the binaries they start, as in target/.
                let archive = format!("/vm/bin/deps/{name}");
                text.push_str(&archive);
                for f in line.flags {
                    text.push(' ');
                    text.push_str(f);
                }
                if !line.only.is_empty() {
                    text.push_str(" --exact ");
                    text.push_str(&line.only.join(" "));
                }
                text.push('\n');
                if packed.insert(archive.clone()) {
                    add_stripped(archive, t)?;
                }
            }
        }
        texts.push((plan.file, text));
    }
    texts.extend(SYSTEMD_UNITS.iter().map(|(path, text)| (*path, text.to_string())));
    // Programs the tests start by name.
    for tool in HOST_TOOLS {
        files.push((tool.to_string(), PathBuf::from(tool)));
    }
    let mut libs = BTreeSet::new();
    for (_, f) in &files {
        libs.extend(shared_libraries(f)?);
    }
    files.extend(libs.into_iter().map(|l| (l.display().to_string(), l)));
    // Static: no libraries to look for.
    for (name, bin) in image_binaries(&stage)? {
        files.push((format!("{IMAGE_BIN}/{name}"), bin));
    }
    files.push((IMAGE_ARCHIVE.into(), image.to_path_buf()));
    // Text, after `ldd` has looked at every program.
    for (path, text) in texts {
        let staged = stage.join(path.trim_start_matches('/').replace('/', "_"));
        fs::write(&staged, text)?;
        files.push((path.into(), staged));
    }
    let out = dir.join("initramfs.cpio");
    write_cpio(&files, &out)?;
    let mib = fs::metadata(&out)?.len() >> 20;
    step(&format!("initramfs: {} files, {mib} MiB ({})", files.len(), out.display()));
    Ok(out)
}

/// `initramfs` with a second archive appended holding one kernel's `modules` (the kernel
/// unpacks concatenated archives in turn), written to `out`.
pub(super) fn with_modules(initramfs: &Path, modules: &[PathBuf], out: &Path) -> Result<PathBuf> {
    let extra = out.with_extension("modules.cpio");
    let files: Vec<(String, PathBuf)> = modules
        .iter()
        .map(|m| {
            let name =
                m.file_name().and_then(|n| n.to_str()).ok_or_else(|| anyhow!("{}: no name", m.display()))?;
            Ok((format!("{MODULES_DIR}/{name}"), m.clone()))
        })
        .collect::<Result<_>>()?;
    write_cpio(&files, &extra)?;
    let mut whole = fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let base = std::io::copy(&mut fs::File::open(initramfs)?, &mut whole)?;
    // The next archive's header must start 4-byte aligned; the kernel skips the zeros.
    let pad = base.next_multiple_of(512) - base;
    std::io::Write::write_all(&mut whole, &vec![0; pad as usize])?;
    std::io::copy(&mut fs::File::open(&extra)?, &mut whole)?;
    Ok(out.to_path_buf())
}

/// The end-to-end tests' image binaries, static (the VM has no gcc to build them as the
/// harness does on a host): `pause` and `hog` from `tests/images/*.c`, built into `stage`.
fn image_binaries(stage: &Path) -> Result<Vec<(&'static str, PathBuf)>> {
    let src = workspace_root().join("tests/images");
    let mut out = Vec::new();
    for name in ["pause", "hog"] {
        let bin = stage.join(format!("image-{name}"));
        run_status(
            Command::new("gcc").args(["-static", "-O2", "-o"]).arg(&bin).arg(src.join(format!("{name}.c"))),
            &format!("gcc {name}.c"),
        )?;
        out.push((name, bin));
    }
    Ok(out)
}

/// One test executable of the workspace's test build.
struct TestExe {
    package: String,
    /// `lib`, `test`, `bin`, ...
    kind: String,
    /// The target's name (an integration test's file stem).
    name: String,
    path: PathBuf,
}

/// Every test executable, from the JSON messages of `cargo test --workspace --no-run`: the
/// build `cargo xtask test` ran the host's tests with, so nothing is built again. (A package
/// selection such as `-p evictd` would unify other features, dev-dependencies' among them,
/// and build the crates above them again, once more per selection.)
fn workspace_test_executables(env: &BuildEnv) -> Result<Vec<TestExe>> {
    let out = output(
        env.cargo().args(["test", "--workspace", "--no-run", "--message-format=json"]),
        "cargo test --workspace --no-run",
    )?;
    let mut exes = Vec::new();
    for line in out.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if msg["reason"] == "compiler-artifact"
            && msg["profile"]["test"] == true
            && let (Some(exe), Some(id), Some(kind), Some(name)) = (
                msg["executable"].as_str(),
                msg["package_id"].as_str(),
                msg["target"]["kind"][0].as_str(),
                msg["target"]["name"].as_str(),
            )
        {
            exes.push(TestExe {
                package: package_name(id).to_string(),
                kind: kind.to_string(),
                name: name.to_string(),
                path: PathBuf::from(exe),
            });
        }
    }
    Ok(exes)
}

/// A package's name from cargo's package ID spec: `path+file:///w/tests#evictd-tests@0.1.0`,
/// or `path+file:///w/evictd#0.1.0` when the name is the directory's.
fn package_name(id: &str) -> &str {
    match id.rsplit_once('#') {
        Some((_, frag)) if frag.contains('@') => frag.split('@').next().unwrap_or(frag),
        Some((url, _)) => url.rsplit('/').next().unwrap_or(url),
        None => id,
    }
}

/// The executables a plan line's `selection` names (`-p PKG` with `--lib` or `--test NAME`s),
/// each of which must be there.
fn select_executables(all: &[TestExe], selection: &[&str]) -> Result<Vec<PathBuf>> {
    let mut package = None;
    let mut wanted: Vec<(&str, Option<&str>)> = Vec::new();
    let mut args = selection.iter();
    while let Some(arg) = args.next() {
        match *arg {
            "-p" => package = args.next().copied(),
            "--lib" => wanted.push(("lib", None)),
            "--test" => {
                let name = args.next().ok_or_else(|| anyhow!("a VM plan's --test names no test"))?;
                wanted.push(("test", Some(name)));
            }
            other => bail!("a VM plan's selection takes -p, --lib and --test, not {other}"),
        }
    }
    let package = package.ok_or_else(|| anyhow!("a VM plan's selection names no package (-p)"))?;
    ensure!(!wanted.is_empty(), "a VM plan's selection for {package} names no --lib or --test");
    wanted
        .iter()
        .map(|(kind, name)| {
            all.iter()
                .find(|e| e.package == package && e.kind == *kind && name.is_none_or(|n| e.name == n))
                .map(|e| e.path.clone())
                .ok_or_else(|| {
                    let what = name.map_or(format!("{kind} test"), |n| format!("{kind} test {n}"));
                    anyhow!("cargo test --workspace built no {what} of {package}")
                })
        })
        .collect()
}

/// What the dynamic loader needs for `elf`, by `ldd`: absolute paths, the loader included.
fn shared_libraries(elf: &Path) -> Result<Vec<PathBuf>> {
    let out = output(Command::new("ldd").arg(elf), &format!("ldd {}", elf.display()))?;
    Ok(out
        .lines()
        .filter_map(|l| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
            let path = l.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// A newc archive of `files` (archive path → file on the host), with every parent directory
/// before its entries.
fn write_cpio(files: &[(String, PathBuf)], out: &Path) -> Result<()> {
    let mut dirs = BTreeSet::new();
    for (archive, _) in files {
        let mut p = Path::new(archive.trim_start_matches('/'));
        while let Some(parent) = p.parent().filter(|p| !p.as_os_str().is_empty()) {
            dirs.insert(parent.to_path_buf());
            p = parent;
        }
    }
    let mut entries: Vec<(cpio::NewcBuilder, fs::File)> = Vec::new();
    let mut ino = 1;
    let mut builder = |name: &str, mode: u32| {
        ino += 1;
        cpio::NewcBuilder::new(name).ino(ino).mode(mode).nlink(1)
    };
    // Directories carry no data; /dev/null stands in as an empty reader.
    for d in &dirs {
        entries.push((builder(&d.display().to_string(), 0o040755), fs::File::open("/dev/null")?));
    }
    for (archive, src) in files {
        let file = fs::File::open(src).with_context(|| format!("opening {}", src.display()))?;
        entries.push((builder(archive.trim_start_matches('/'), 0o100755), file));
    }
    let w = std::io::BufWriter::new(fs::File::create(out)?);
    let mut w = cpio::write_cpio(entries.into_iter(), w).context("writing the initramfs")?;
    w.flush()?;
    Ok(())
}
