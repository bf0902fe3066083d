//! Debian's kernels for the matrix, fetched with apt without touching the machine's own apt
//! configuration, and cached so that later runs boot without the network.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, anyhow, bail, ensure};

use crate::{output, run_status, step};

const DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";

/// A distribution kernel image, fetched and unpacked.
pub(super) struct KernelImage {
    pub(super) vmlinuz: PathBuf,
    pub(super) release: String,
}

/// The suite's `linux-image-cloud-amd64` kernel: the metapackage's dependency, followed
/// (7.x splits the image into a `linux-binary-*` package) until a package holds a vmlinuz.
/// Cached under target/vm/kernels/<suite>; apt verifies what it downloads.
pub(super) fn fetch_kernel(dir: &Path, suite: &str) -> Result<KernelImage> {
    let kdir = dir.join("kernels").join(suite);
    let (vmlinuz, release_file) = (kdir.join("vmlinuz"), kdir.join("release"));
    if let (true, Ok(release)) = (vmlinuz.is_file(), fs::read_to_string(&release_file)) {
        return Ok(KernelImage { vmlinuz, release: release.trim().to_owned() });
    }
    step(&format!("fetching Debian {suite}'s cloud kernel (private apt sources in {})", kdir.display()));
    let apt = PrivateApt::new(&kdir.join("apt"), suite)?;
    apt.update()?;
    let debs = kdir.join("debs");
    fs::create_dir_all(&debs)?;
    let mut next = kernel_deps(&apt.show("linux-image-cloud-amd64")?);
    let mut seen = BTreeSet::new();
    while let Some(pkg) = next.pop() {
        if !seen.insert(pkg.clone()) {
            continue;
        }
        let deb = apt.download(&pkg, &debs)?;
        if let Some((path, release)) = vmlinuz_in(&deb)? {
            extract(&deb, &path, &vmlinuz)?;
            check_bzimage(&vmlinuz)?;
            fs::write(&release_file, &release)?;
            step(&format!("{suite}: kernel {release} from {pkg}"));
            return Ok(KernelImage { vmlinuz, release });
        }
        next.extend(kernel_deps(&apt.show(&pkg)?));
    }
    bail!("{suite}: no vmlinuz in linux-image-cloud-amd64 or its kernel packages ({seen:?})")
}

/// apt with its own sources list, lists, cache and no locks of the machine's: the machine's
/// apt configuration and state stay as they are.
struct PrivateApt {
    opts: Vec<String>,
}

impl PrivateApt {
    fn new(dir: &Path, suite: &str) -> Result<Self> {
        for sub in ["lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        let list = dir.join("sources.list");
        fs::write(&list, format!("deb {DEBIAN_MIRROR} {suite} main\n"))?;
        let opts = [
            format!("Dir::Etc::SourceList={}", list.display()),
            "Dir::Etc::SourceParts=/dev/null".to_owned(),
            format!("Dir::State::Lists={}", dir.join("lists").display()),
            format!("Dir::Cache={}", dir.join("cache").display()),
            // The machine's own dpkg lock is not ours to take; nothing here installs.
            "Debug::NoLocking=1".to_owned(),
            // Root downloads into a directory _apt cannot write.
            "APT::Sandbox::User=root".to_owned(),
        ];
        Ok(PrivateApt { opts: opts.into_iter().flat_map(|o| ["-o".to_owned(), o]).collect() })
    }

    fn update(&self) -> Result<()> {
        run_status(
            Command::new("apt-get").args(&self.opts).args(["update", "-q"]),
            "apt-get update (private)",
        )
    }

    fn show(&self, pkg: &str) -> Result<String> {
        output(
            Command::new("apt-cache").args(&self.opts).args(["show", "--no-all-versions", pkg]),
            &format!("apt-cache show {pkg}"),
        )
    }

    fn download(&self, pkg: &str, into: &Path) -> Result<PathBuf> {
        run_status(
            Command::new("apt-get").args(&self.opts).args(["download", "-q", pkg]).current_dir(into),
            &format!("apt-get download {pkg}"),
        )?;
        fs::read_dir(into)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{pkg}_")) && n.ends_with(".deb"))
            })
            .ok_or_else(|| anyhow!("apt-get download {pkg} left no {pkg}_*.deb in {}", into.display()))
    }
}

/// The modules a pod network needs (the CNI `bridge` plugin's bridge and veth pairs), in the
/// order they load (each after what it needs), from the cached package of `image`'s kernel
/// that holds them; none when no cached package does (7.x ships modules apart). The VM's
/// init loads them before the tests.
const NETWORK_MODULES: [&str; 4] = [
    "kernel/net/llc/llc.ko",
    "kernel/net/802/stp.ko",
    "kernel/net/bridge/bridge.ko",
    "kernel/drivers/net/veth.ko",
];

pub(super) fn network_modules(dir: &Path, suite: &str, image: &KernelImage) -> Result<Vec<PathBuf>> {
    let kdir = dir.join("kernels").join(suite);
    let out_dir = kdir.join("net-modules");
    let done = out_dir.join("complete");
    let list = |d: &Path| -> Result<Vec<PathBuf>> {
        let mut v: Vec<PathBuf> = fs::read_dir(d)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name() != Some("complete".as_ref()))
            .collect();
        v.sort();
        Ok(v)
    };
    if done.is_file() {
        return list(&out_dir);
    }
    let Ok(debs) = fs::read_dir(kdir.join("debs")) else { return Ok(Vec::new()) };
    for deb in debs.filter_map(|e| e.ok().map(|e| e.path())) {
        let listing =
            output(Command::new("dpkg-deb").arg("-c").arg(&deb), &format!("dpkg-deb -c {}", deb.display()))?;
        let members: Vec<&str> = listing.lines().filter_map(|l| l.split_whitespace().last()).collect();
        let found: Vec<&str> = NETWORK_MODULES
            .iter()
            .filter_map(|m| {
                let want = format!("/modules/{}/{m}", image.release);
                members.iter().copied().find(|p| p.contains(&want))
            })
            .collect();
        if found.len() != NETWORK_MODULES.len() {
            continue;
        }
        fs::create_dir_all(&out_dir)?;
        for (i, member) in found.iter().enumerate() {
            let name = member.rsplit('/').next().unwrap_or(member);
            extract(&deb, member, &out_dir.join(format!("{i}-{name}")))?;
        }
        fs::write(&done, "")?;
        return list(&out_dir);
    }
    Ok(Vec::new())
}

/// The kernel packages a package depends on (`linux-image-*`, `linux-binary-*`).
fn kernel_deps(show: &str) -> Vec<String> {
    show.lines()
        .find_map(|l| l.strip_prefix("Depends:"))
        .into_iter()
        .flat_map(|d| d.split([',', '|']))
        .filter_map(|d| d.split_whitespace().next())
        .filter(|n| n.starts_with("linux-image-") || n.starts_with("linux-binary-"))
        .map(str::to_owned)
        .collect()
}

/// The vmlinuz in a package (its path in the archive, and the kernel release it names).
fn vmlinuz_in(deb: &Path) -> Result<Option<(String, String)>> {
    let list =
        output(Command::new("dpkg-deb").arg("-c").arg(deb), &format!("dpkg-deb -c {}", deb.display()))?;
    Ok(list.lines().filter_map(|l| l.split_whitespace().last()).find_map(|path| {
        // ./boot/vmlinuz-<release> (6.1, 6.12) or ./usr/lib/modules/<release>/vmlinuz (7.x)
        let name = path.rsplit('/').next()?;
        if let Some(release) = name.strip_prefix("vmlinuz-") {
            return Some((path.to_owned(), release.to_owned()));
        }
        let release = path.strip_suffix("/vmlinuz")?.rsplit('/').next()?;
        (name == "vmlinuz").then(|| (path.to_owned(), release.to_owned()))
    }))
}

/// `member` of the package's file tree, written to `to`: `dpkg-deb --fsys-tarfile | tar -xO`,
/// piped without a shell.
fn extract(deb: &Path, member: &str, to: &Path) -> Result<()> {
    let mut dpkg = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(deb)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting dpkg-deb")?;
    let tar_in = dpkg.stdout.take().ok_or_else(|| anyhow!("dpkg-deb stdout"))?;
    run_status(
        Command::new("tar").args(["-xO", member]).stdin(tar_in).stdout(fs::File::create(to)?),
        &format!("extracting {member} from {}", deb.display()),
    )?;
    let status = dpkg.wait()?;
    ensure!(status.success(), "dpkg-deb --fsys-tarfile {} failed ({status})", deb.display());
    Ok(())
}

/// A bzImage carries "HdrS" at 0x202: a truncated or wrong file fails here, not as a VM
/// that never boots.
fn check_bzimage(path: &Path) -> Result<()> {
    let bytes = fs::read(path)?;
    ensure!(
        bytes.len() > 1 << 20 && bytes.get(0x202..0x206) == Some(b"HdrS".as_slice()),
        "{} is not a bzImage kernel",
        path.display()
    );
    Ok(())
}
