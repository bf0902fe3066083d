//! `cargo xtask vm`: the privileged tests inside Debian's own kernels, booted with cgroup v2
//! in QEMU.
//!
//! Production nodes run cgroup v2 on kernels this machine does not have. For each kernel of
//! the matrix this fetches Debian's kernel package (apt, through a private sources list and
//! state directory: the machine's own apt sources are never touched; apt checks the
//! archive's signatures and the package's hash), builds one initramfs with evictd, the
//! privileged test binaries, their shared libraries and `evictd-vm-init` as `/init`, and
//! boots it under QEMU's TCG (`/dev/kvm` here cannot run a stock kernel). Inside, the init
//! checks that `evictd probe` picks the wake tier the matrix expects and runs the tests;
//! its `evictd-vm:` lines on the serial console are the results. One VM boots systemd as
//! PID 1 (this machine's own systemd, which starts the init as a service) for the systemd
//! cgroup driver's end-to-end tests. TCG is 10–50× slower than the host: the VMs test
//! behaviour, the benchmarks stay on the host.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use clap::Args;

use crate::{BuildEnv, output, run_status, setup, step, workspace_root};

/// One kernel of the matrix: a Debian suite's cloud kernel, how it boots, and what evictd
/// must make of it.
struct Kernel {
    /// The VM's name (`--suites`, its log): the suite, or the suite and its init.
    name: &'static str,
    suite: &'static str,
    /// What runs as PID 1.
    init: Init,
    /// The tests it runs.
    plan: &'static Plan,
    /// The charge wake tier `evictd probe` must choose there.
    tier: &'static str,
    /// Tests that need what this kernel does not offer, and why (`--skip`, printed).
    skip: &'static [(&'static str, &'static str)],
}

const NO_MEMCG_TRACEPOINTS: &str = "needs the memcg stat tracepoints, which this kernel lacks";
const V1_ONLY: &str = "cgroup v1 only; these VMs run cgroup v2";

/// PID 1 of a VM.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Init {
    /// `evictd-vm-init` itself: quickest, and all the kernel-facing tests need.
    TestInit,
    /// systemd, which starts `evictd-vm-init` as a service: for the systemd cgroup driver,
    /// whose cgroups runc makes by asking systemd (D-Bus, on systemd's private socket).
    Systemd,
}

const E2E_ON_ONE_KERNEL: &str = "the containerd end-to-end tests run on one kernel of the matrix (trixie's 6.12): under TCG they take minutes";

/// Debian's 6.1: the batched hook, no memcg stat tracepoints, cgroup v2.
const BOOKWORM: &[(&str, &str)] = &[
    ("this_kernel_has_the_memcg_tracepoints_and_the_id_path", NO_MEMCG_TRACEPOINTS),
    ("charge_probes_are_attached_only_near_a_threshold", NO_MEMCG_TRACEPOINTS),
    ("an_eventfd_threshold_follows_a_cgroup_made_again_at_the_same_path", V1_ONLY),
    ("an_eventfd_threshold_armed_below_the_usage_wakes_at_once", V1_ONLY),
    ("the_v1_freezer_holds_the_pod_while_it_is_killed", V1_ONLY),
    (E2E_TESTS[0], E2E_ON_ONE_KERNEL),
    (E2E_TESTS[1], E2E_ON_ONE_KERNEL),
];

/// Debian's 6.12: as 6.1, and the containerd end-to-end tests.
const TRIXIE: &[(&str, &str)] = &[
    ("this_kernel_has_the_memcg_tracepoints_and_the_id_path", NO_MEMCG_TRACEPOINTS),
    ("charge_probes_are_attached_only_near_a_threshold", NO_MEMCG_TRACEPOINTS),
    ("an_eventfd_threshold_follows_a_cgroup_made_again_at_the_same_path", V1_ONLY),
    ("an_eventfd_threshold_armed_below_the_usage_wakes_at_once", V1_ONLY),
    ("the_v1_freezer_holds_the_pod_while_it_is_killed", V1_ONLY),
];

/// Debian's 7.3: the batched hook, cgroup v2; the memcg stat tracepoints too, tested with
/// `--charge-tier memcg-tracepoints`.
const TRIXIE_BACKPORTS: &[(&str, &str)] = &[
    ("an_eventfd_threshold_follows_a_cgroup_made_again_at_the_same_path", V1_ONLY),
    ("an_eventfd_threshold_armed_below_the_usage_wakes_at_once", V1_ONLY),
    ("the_v1_freezer_holds_the_pod_while_it_is_killed", V1_ONLY),
    (E2E_TESTS[0], E2E_ON_ONE_KERNEL),
    (E2E_TESTS[1], E2E_ON_ONE_KERNEL),
];

/// Debian's kernels have BPF trampolines, so the batched hook on all three; the memcg stat
/// tracepoints (7.x only) are then not used. This host's own kernel (no trampolines, the
/// tracepoints, cgroup v1) is `cargo xtask test`'s.
///
/// trixie-systemd boots the 6.12 kernel again with systemd as PID 1 for the systemd driver's
/// end-to-end tests alone (`SYSTEMD_PLAN`): the rest ran in trixie.
const MATRIX: &[Kernel] = &[
    Kernel {
        name: "bookworm",
        suite: "bookworm",
        init: Init::TestInit,
        plan: &MAIN_PLAN,
        tier: "batched-charge-hook",
        skip: BOOKWORM,
    },
    Kernel {
        name: "trixie",
        suite: "trixie",
        init: Init::TestInit,
        plan: &MAIN_PLAN,
        tier: "batched-charge-hook",
        skip: TRIXIE,
    },
    Kernel {
        name: "trixie-systemd",
        suite: "trixie",
        init: Init::Systemd,
        plan: &SYSTEMD_PLAN,
        tier: "batched-charge-hook",
        skip: &[],
    },
    Kernel {
        name: "trixie-backports",
        suite: "trixie-backports",
        init: Init::TestInit,
        plan: &MAIN_PLAN,
        tier: "batched-charge-hook",
        skip: TRIXIE_BACKPORTS,
    },
];

/// What one VM runs: a list of test binaries (cargo's selections), each with the flags it
/// is given and which of its tests run (all when none is named).
struct Plan {
    /// Where the init finds it (`evictd_vm.plan=`).
    file: &'static str,
    lines: &'static [PlanLine],
}

struct PlanLine {
    selection: &'static [&'static str],
    flags: &'static [&'static str],
    only: &'static [&'static str],
}

/// The kernel-facing library tests, the privileged integration tests that need no container
/// runtime, and of the end-to-end tests on a real containerd those in `E2E_TESTS`.
const MAIN_PLAN: Plan = Plan {
    file: "/vm/plan",
    lines: &[
        PlanLine { selection: &["-p", "evictd", "--lib"], flags: &[], only: &[] },
        PlanLine {
            selection: &["-p", "evictd-tests", "--test", "kernel_wake", "--test", "trace_cli"],
            flags: &[],
            only: &[],
        },
        PlanLine { selection: &["-p", "evictd-tests", "--test", "e2e_evict"], flags: &[], only: &E2E_TESTS },
    ],
};

/// Under systemd: the end-to-end tests of the systemd cgroup driver, `#[ignore]`d where
/// systemd is not PID 1 (every host run), so run here with `--ignored`.
const SYSTEMD_PLAN: Plan = Plan {
    file: "/vm/plan-systemd",
    lines: &[PlanLine {
        selection: &["-p", "evictd-tests", "--test", "e2e_evict"],
        flags: &["--ignored"],
        only: &[
            "evicts_exactly_the_top_ranked_pod_of_the_systemd_slice_layout",
            "a_zero_hard_grace_period_kills_a_pod_of_the_systemd_slice_layout",
        ],
    }],
};

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

/// The end-to-end tests run in the VM: an eviction through the CRI (decided on cgroup v2,
/// the pod stopped by containerd and runc, its memory freed), and the fast kill
/// (`cgroup.kill`) of a real pod's cgroup.
const E2E_TESTS: [&str; 2] = [
    "evicts_exactly_the_top_ranked_pod_and_frees_its_memory",
    "a_zero_hard_grace_period_kills_at_once_without_the_runtime",
];

/// Programs of this machine the tests start (`sleep` as a process to kill; the container
/// runtime of the end-to-end tests), copied with their libraries.
const HOST_TOOLS: &[&str] = &[
    "/usr/bin/sleep",
    "/usr/bin/containerd",
    "/usr/bin/containerd-shim-runc-v2",
    "/usr/bin/ctr",
    "/usr/sbin/runc",
    "/usr/lib/systemd/systemd",
    "/usr/bin/systemctl",
];

/// Where the init tells the end-to-end harness the prebuilt image binaries are (no gcc in
/// the VM): `pause` and `hog`, static, built here from `tests/images/*.c`.
const IMAGE_BIN: &str = "/vm/image-bin";

const DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";

const DEFAULT_JOBS: usize = 2;
const DEFAULT_TIMEOUT_MINUTES: u64 = 25;

#[derive(Args)]
pub(crate) struct VmArgs {
    /// The matrix's VMs to boot, by name (default: all of them: bookworm, trixie,
    /// trixie-systemd, trixie-backports).
    #[arg(long, value_delimiter = ',')]
    suites: Vec<String>,
    /// VMs at a time (each takes one host CPU under TCG).
    #[arg(long, default_value_t = DEFAULT_JOBS)]
    jobs: usize,
    /// Give up on a VM after this many minutes.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_MINUTES)]
    timeout_minutes: u64,
}

/// The whole matrix, as `cargo xtask test` runs it.
impl Default for VmArgs {
    fn default() -> Self {
        VmArgs { suites: Vec::new(), jobs: DEFAULT_JOBS, timeout_minutes: DEFAULT_TIMEOUT_MINUTES }
    }
}

pub(crate) fn vm(env: &BuildEnv, args: &VmArgs) -> Result<()> {
    let started = Instant::now();
    ensure!(crate::is_root(), "cargo xtask vm needs root (apt-get, and the kernels' packages)");
    let kernels: Vec<&Kernel> = if args.suites.is_empty() {
        MATRIX.iter().collect()
    } else {
        args.suites
            .iter()
            .map(|s| {
                MATRIX.iter().find(|k| k.name == s).ok_or_else(|| {
                    let known: Vec<&str> = MATRIX.iter().map(|k| k.name).collect();
                    anyhow!("--suites: {s} is not in the matrix ({})", known.join(", "))
                })
            })
            .collect::<Result<_>>()?
    };
    setup::ensure_debian_packages(&["qemu-system-x86", "systemd"])?;
    let dir = workspace_root().join("target/vm");
    let initramfs = build_initramfs(env, &dir)?;
    let mut images = Vec::new();
    for k in &kernels {
        images.push((*k, fetch_kernel(&dir, k.suite)?));
    }
    let logs = dir.join("logs");
    fs::create_dir_all(&logs)?;
    let timeout = Duration::from_secs(args.timeout_minutes * 60);
    let outcomes = run_all(&images, &initramfs, &logs, args.jobs.max(1), timeout);
    let mut failed = Vec::new();
    for (k, r) in kernels.iter().zip(&outcomes) {
        match r {
            Ok(o) => step(&format!("vm {}: {} ({:.0}s)", k.name, o.summary, o.seconds)),
            Err(e) => {
                step(&format!("vm {}: FAILED: {e:#}", k.name));
                failed.push(k.name);
            }
        }
    }
    // CI keeps only the end of what it printed, and a clean clone's logs are gone with it:
    // what failed, in the failing tests' own words, goes last.
    for name in &failed {
        for line in failure_excerpt(&logs.join(format!("{name}.log"))) {
            step(&format!("vm {name}: | {line}"));
        }
    }
    step(&format!("VM matrix: {} kernels in {:.0}s", kernels.len(), started.elapsed().as_secs_f64()));
    if !failed.is_empty() {
        bail!("the VM tests failed on {} (logs in {})", failed.join(", "), logs.display());
    }
    Ok(())
}

/// A failing VM's log, cut to what says why: each panic's message, and the warnings and
/// errors in the ends of evictd's and containerd's logs that the test harness prints when a
/// test fails.
fn failure_excerpt(log: &Path) -> Vec<String> {
    let Ok(text) = fs::read_to_string(log) else { return vec![format!("no log at {}", log.display())] };
    excerpt_of(&text)
}

fn excerpt_of(text: &str) -> Vec<String> {
    const PANIC_LINES: usize = 12;
    const LOG_LINES: usize = 6;
    let mut out = Vec::new();
    let mut lines = text.lines().map(|l| l.trim_end_matches('\r'));
    while let Some(line) = lines.next() {
        if line.contains("panicked at") {
            out.push(line.to_owned());
            let message = lines.by_ref().take_while(|l| !l.is_empty() && !l.starts_with("note: "));
            out.extend(message.take(PANIC_LINES).map(str::to_owned));
        } else if let Some(whose) = line.strip_prefix("--- the last ").and_then(log_block_owner) {
            let block: Vec<String> = lines.by_ref().take_while(|l| *l != "---").map(without_ansi).collect();
            let notable: Vec<&String> = block.iter().filter(|l| is_warning_or_error(l)).collect();
            let last = &notable[notable.len().saturating_sub(LOG_LINES)..];
            out.extend(last.iter().map(|l| format!("{whose}: {l}")));
        }
    }
    out
}

/// "12 lines of containerd's log (/tmp/…) ---" → "containerd".
fn log_block_owner(header: &str) -> Option<&str> {
    let (_, rest) = header.split_once(" lines of ")?;
    rest.split_once("'s log").map(|(whose, _)| whose)
}

/// containerd's logrus levels, evictd's tracing levels.
fn is_warning_or_error(line: &str) -> bool {
    ["level=error", "level=warning", " WARN ", " ERROR "].iter().any(|m| line.contains(m))
}

/// tracing colours its levels even into a pipe.
fn without_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC '[' parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Kernels

/// A distribution kernel image, fetched and unpacked.
struct KernelImage {
    vmlinuz: PathBuf,
    release: String,
}

/// The suite's `linux-image-cloud-amd64` kernel: the metapackage's dependency, followed
/// (7.x splits the image into a `linux-binary-*` package) until a package holds a vmlinuz.
/// Cached under target/vm/kernels/<suite>; apt verifies what it downloads.
fn fetch_kernel(dir: &Path, suite: &str) -> Result<KernelImage> {
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

// ---------------------------------------------------------------------------------------
// The initramfs

/// Builds the binaries and test binaries (the debug build `cargo xtask test` made) and packs
/// them, stripped of debug info, with their shared libraries into one uncompressed newc
/// initramfs: the same for every kernel.
fn build_initramfs(env: &BuildEnv, dir: &Path) -> Result<PathBuf> {
    step("building evictd, the VM init and the test binaries (debug)");
    run_status(env.cargo().args(["build", "-p", "evictd", "-p", "evictd-tests", "--bins"]), "cargo build")?;
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
    for bin in ["evictd", "evictd-memhog"] {
        add_stripped(format!("/vm/bin/{bin}"), &bin_dir.join(bin))?;
    }
    // One line per test binary: its path, its flags, then the tests to run (`--exact`
    // names), if not all. Each binary goes in once, whichever plans name it.
    let mut packed = BTreeSet::new();
    let mut built: BTreeMap<&[&str], Vec<PathBuf>> = BTreeMap::new();
    let mut texts = Vec::new();
    for plan in [&MAIN_PLAN, &SYSTEMD_PLAN] {
        let mut text = String::new();
        for line in plan.lines {
            if !built.contains_key(line.selection) {
                built.insert(line.selection, test_executables(env, line.selection)?);
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

/// The test executables cargo builds for `selection`, from its JSON messages.
fn test_executables(env: &BuildEnv, selection: &[&str]) -> Result<Vec<PathBuf>> {
    let out = output(
        env.cargo().arg("test").args(selection).args(["--no-run", "--message-format=json"]),
        "cargo test --no-run",
    )?;
    let mut exes = Vec::new();
    for line in out.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if msg["reason"] == "compiler-artifact"
            && msg["profile"]["test"] == true
            && let Some(exe) = msg["executable"].as_str()
        {
            exes.push(PathBuf::from(exe));
        }
    }
    ensure!(!exes.is_empty(), "cargo test {} --no-run named no test executable", selection.join(" "));
    Ok(exes)
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

// ---------------------------------------------------------------------------------------
// Booting

struct VmOutcome {
    summary: String,
    seconds: f64,
}

/// Every VM, `jobs` at a time; results in the order of `images`.
fn run_all(
    images: &[(&Kernel, KernelImage)],
    initramfs: &Path,
    logs: &Path,
    jobs: usize,
    timeout: Duration,
) -> Vec<Result<VmOutcome>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done: Vec<(usize, Result<VmOutcome>)> = thread::scope(|s| {
        let workers: Vec<_> = (0..jobs.min(images.len()))
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((k, image)) = images.get(i) else { return mine };
                        let log = logs.join(format!("{}.log", k.name));
                        mine.push((i, boot(k, image, initramfs, &log, timeout)));
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap_or_default()).collect()
    });
    let mut results: Vec<Option<Result<VmOutcome>>> = images.iter().map(|_| None).collect();
    for (i, r) in done {
        results[i] = Some(r);
    }
    results.into_iter().map(|r| r.unwrap_or_else(|| Err(anyhow!("the VM's thread panicked")))).collect()
}

/// Boots one kernel with the initramfs and follows its console until the init powers off.
fn boot(
    k: &Kernel,
    image: &KernelImage,
    initramfs: &Path,
    log: &Path,
    timeout: Duration,
) -> Result<VmOutcome> {
    let started = Instant::now();
    let skip: Vec<&str> = k.skip.iter().map(|(t, _)| *t).collect();
    for (t, why) in k.skip {
        step(&format!("vm {} ({}): not run: {t}: {why}", k.name, image.release));
    }
    let mut append = format!(
        "console=ttyS0 panic=-1 evictd_vm.tier={} evictd_vm.skip={} evictd_vm.plan={}",
        k.tier,
        skip.join(","),
        k.plan.file
    );
    if k.init == Init::Systemd {
        append.push_str(
            " rdinit=/usr/lib/systemd/systemd systemd.unit=evictd-vm.target systemd.show_status=false",
        );
    }
    step(&format!("vm {}: booting {} under QEMU TCG", k.name, image.release));
    // thread=single: with multi-threaded TCG the guest oopsed when BPF patched a memcg
    // tracepoint (toolchain notes). -cx16: Debian's 6.12 double-faulted in SLUB's
    // cmpxchg16b fast path during boot in 2 of 8 TCG boots with it, in none of 8 without
    // (SLUB then takes its locked path; nothing evictd does needs the instruction).
    let mut child = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg,thread=single", "-cpu", "max,-cx16", "-smp", "2", "-m", "3072"])
        .args(["-display", "none", "-monitor", "none", "-serial", "stdio", "-no-reboot"])
        .arg("-kernel")
        .arg(&image.vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", &append])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting qemu-system-x86_64")?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("qemu stdout"))?;
    let (tx, rx) = mpsc::channel();
    let reader = thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log_file = fs::File::create(log)?;
    let deadline = started + timeout;
    let mut results = Vec::new();
    let mut done = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                writeln!(log_file, "{line}")?;
                let line = line.trim_end_matches('\r');
                if let Some(r) = line.strip_prefix("evictd-vm: ") {
                    step(&format!("vm {}: {r}", k.name));
                    if let Some(rest) = r.strip_prefix("done ") {
                        done = Some(rest.to_owned());
                    }
                    results.push(r.to_owned());
                } else if line.contains("panicked at")
                    || (line.starts_with("test ") && line.ends_with("FAILED"))
                {
                    step(&format!("vm {}: {line}", k.name));
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Ours, by PID.
                let _ = child.kill();
                let _ = child.wait();
                let _ = reader.join();
                bail!("no power-off within {} minutes (log {})", timeout.as_secs() / 60, log.display());
            }
        }
    }
    let status = child.wait()?;
    let _ = reader.join();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    let seconds = started.elapsed().as_secs_f64();
    let Some(done) = done else {
        bail!(
            "the VM ended ({status}) before the init reported (qemu: {}; log {})",
            stderr.trim(),
            log.display()
        );
    };
    let failures: Vec<&String> = results.iter().filter(|r| r.starts_with("FAIL")).collect();
    if !done.starts_with("failures=0") || !failures.is_empty() {
        bail!(
            "{} (log {})",
            failures.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("; "),
            log.display()
        );
    }
    let passed = results.iter().filter(|r| r.starts_with("ok")).count();
    Ok(VmOutcome { summary: format!("kernel {}: {passed} checks passed", image.release), seconds })
}

#[cfg(test)]
mod tests {
    use super::excerpt_of;

    #[test]
    fn a_failure_excerpt_keeps_the_panic_message_and_the_runtime_errors() {
        let log = "running 1 test\n\
            thread 'evicts' (630) panicked at tests/tests/e2e_evict.rs:85:5:\n\
            {\"error\":\"StopContainer failed\"}\n\
            note: run with `RUST_BACKTRACE=1`\n\
            --- the last 3 lines of containerd's log (/tmp/x/containerd.log) ---\n\
            time=1 level=info msg=\"StopContainer\"\n\
            time=2 level=error msg=\"ttrpc: closed\"\r\n\
            ---\n\
            --- the last 2 lines of evictd's log ---\n\
            \x1b[2m2026-11-23T04:43:12Z\x1b[0m \x1b[33m WARN\x1b[0m evictd::daemon: stopping default/worker failed\n\
            \x1b[32m INFO\x1b[0m evictd: observing\n\
            ---\n\
            test evicts ... FAILED\n";
        assert_eq!(
            excerpt_of(log),
            [
                "thread 'evicts' (630) panicked at tests/tests/e2e_evict.rs:85:5:",
                "{\"error\":\"StopContainer failed\"}",
                "containerd: time=2 level=error msg=\"ttrpc: closed\"",
                "evictd: 2026-11-23T04:43:12Z  WARN evictd::daemon: stopping default/worker failed",
            ]
        );
    }
}
