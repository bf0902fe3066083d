//! `/init` of the VM test matrix (`cargo xtask vm`): PID 1 of a distribution kernel booted in
//! QEMU from an initramfs that holds evictd, the test binaries and their libraries — or,
//! where the matrix boots systemd as PID 1 (the systemd cgroup driver's tests), a service
//! systemd starts once it is up.
//!
//! As PID 1 it mounts what a node has (proc, sysfs, devtmpfs, cgroup2 with the memory
//! controller delegated to children; under systemd, systemd did), checks that `evictd
//! probe` picks the wake tier the matrix expects for this kernel, runs the privileged test
//! binaries listed in its plan, and powers the VM off. Every result is one `evictd-vm:`
//! line on the console, which the host parses; everything else on the console is the
//! tests' own output, kept in the host's log.
//!
//! The kernel command line carries this kernel's part of the matrix:
//! `evictd_vm.tier=<memcg-tracepoints|adaptive-poll>`, `evictd_vm.skip=<test>,<test>`
//! (tests that need a tier this kernel does not offer; the host says which and why) and
//! `evictd_vm.plan=<file>` (which plan, `/vm/plan` when not given).

use std::{
    fs,
    path::Path,
    process::{Command, ExitStatus},
    time::Instant,
};

use nix::{
    mount::{MsFlags, mount},
    sys::{
        reboot::{RebootMode, reboot},
        wait::{WaitPidFlag, waitpid},
    },
    unistd::Pid,
};

const DEFAULT_PLAN: &str = "/vm/plan";
/// The factor every test wait is scaled by here. The harness's own calibration times CPU work,
/// which TCG runs 1–2.5 times slower than the reference host; starting processes, containerd's
/// and runc's work and the syscalls run 10 times slower and more. Measured per test binary, the
/// factor came out below 1.5 for the end-to-end tests, whose eviction through the runtime then
/// outran a 20 s wait.
const TCG_PATIENCE: &str = "4";

fn main() {
    let started = Instant::now();
    let mut failures = 0;
    match prepare() {
        Ok(()) => failures += run_plan(),
        Err(e) => {
            say(&format!("FAIL setup: {e}"));
            failures += 1;
        }
    }
    say(&format!("done failures={failures} seconds={:.0}", started.elapsed().as_secs_f64()));
    power_off();
}

/// One line for the host's parser.
fn say(line: &str) {
    println!("evictd-vm: {line}");
}

fn prepare() -> Result<(), String> {
    if std::process::id() == 1 {
        mount_what_a_node_has()?;
    }
    fs::create_dir_all("/tmp").map_err(|e| format!("mkdir /tmp: {e}"))?;
    // The tests make cgroups under the root and set memory.max: the root must hand the
    // memory (and pids) controllers down, as systemd does on a node.
    fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+memory +pids")
        .map_err(|e| format!("enabling memory and pids in /sys/fs/cgroup/cgroup.subtree_control: {e}"))?;
    // Tests start helpers by name (`sleep`, `containerd`), and the metrics tests listen on
    // 127.0.0.1; the end-to-end tests take their image binaries prebuilt (no gcc here).
    // SAFETY: set_var before any thread exists (single-threaded here).
    unsafe {
        std::env::set_var("PATH", "/vm/bin:/usr/bin:/usr/sbin:/bin");
        std::env::set_var("EVICTD_TEST_IMAGE_BIN", "/vm/image-bin");
    }
    // containerd copies these into a host-network pod's sandbox.
    fs::create_dir_all("/etc").map_err(|e| format!("mkdir /etc: {e}"))?;
    for (file, text) in [("/etc/hosts", "127.0.0.1 localhost\n"), ("/etc/resolv.conf", "")] {
        fs::write(file, text).map_err(|e| format!("writing {file}: {e}"))?;
    }
    loopback_up().map_err(|e| format!("bringing lo up: {e}"))?;
    load_modules(Path::new("/vm/modules"))?;
    if Path::new("/vm/evictd.oci.tar").is_file() {
        // SAFETY: as above, no thread exists yet.
        unsafe { std::env::set_var("EVICTD_IMAGE", "/vm/evictd.oci.tar") };
    }
    let uname = nix::sys::utsname::uname().map_err(|e| format!("uname: {e}"))?;
    say(&format!("kernel {}", uname.release().to_string_lossy()));
    Ok(())
}

/// What systemd would have mounted, for a PID 1 that is not systemd.
fn mount_what_a_node_has() -> Result<(), String> {
    for dir in ["/proc", "/sys", "/dev", "/tmp", "/run"] {
        fs::create_dir_all(dir).map_err(|e| format!("mkdir {dir}: {e}"))?;
    }
    let none: Option<&str> = None;
    let mounts = [
        ("proc", "/proc", "proc"),
        ("sysfs", "/sys", "sysfs"),
        ("devtmpfs", "/dev", "devtmpfs"),
        ("tmpfs", "/tmp", "tmpfs"),
        ("tmpfs", "/run", "tmpfs"),
        ("cgroup2", "/sys/fs/cgroup", "cgroup2"),
    ];
    for (source, target, fstype) in mounts {
        mount(Some(source), target, Some(fstype), MsFlags::empty(), none)
            .map_err(|e| format!("mount {fstype} on {target}: {e}"))?;
    }
    Ok(())
}

/// The kernel modules the initramfs carries for this kernel (a pod network's bridge and veth
/// pairs), in the order of their names: each after the ones it needs.
fn load_modules(dir: &Path) -> Result<(), String> {
    let Ok(entries) = fs::read_dir(dir) else { return Ok(()) };
    let mut modules: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    modules.sort();
    for m in modules {
        let file = fs::File::open(&m).map_err(|e| format!("{}: {e}", m.display()))?;
        // The kernel decompresses `.ko.xz` itself (CONFIG_MODULE_DECOMPRESS).
        let flags = if m.extension().is_some_and(|e| e == "xz") { MODULE_INIT_COMPRESSED_FILE } else { 0 };
        // SAFETY: finit_module reads the open file and the empty parameter string.
        let r = unsafe {
            libc::syscall(libc::SYS_finit_module, std::os::fd::AsRawFd::as_raw_fd(&file), c"".as_ptr(), flags)
        };
        let err = std::io::Error::last_os_error();
        if r != 0 && err.raw_os_error() != Some(libc::EEXIST) {
            return Err(format!("loading {}: {err}", m.display()));
        }
    }
    Ok(())
}

/// finit_module's flag for a compressed module file (linux/module.h).
const MODULE_INIT_COMPRESSED_FILE: libc::c_int = 4;

/// `ip link set lo up`, by ioctl: nothing else configures the network in this VM.
fn loopback_up() -> std::io::Result<()> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    // SAFETY: plain socket(2); the fd is owned right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq we own.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// This kernel's part of the matrix, from the kernel command line.
struct Expect {
    tier: Option<String>,
    skip: Vec<String>,
    plan: String,
}

fn expectations() -> Expect {
    let cmdline = fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let param = |key: &str| cmdline.split_whitespace().find_map(|w| w.strip_prefix(key).map(str::to_owned));
    Expect {
        tier: param("evictd_vm.tier="),
        skip: param("evictd_vm.skip=")
            .map(|s| s.split(',').filter(|t| !t.is_empty()).map(str::to_owned).collect())
            .unwrap_or_default(),
        plan: param("evictd_vm.plan=").unwrap_or_else(|| DEFAULT_PLAN.to_owned()),
    }
}

/// The tier check, then every test binary of the plan; returns the number of failures.
fn run_plan() -> usize {
    let expect = expectations();
    let mut failures = usize::from(!check_tier(expect.tier.as_deref()));
    let plan = match fs::read_to_string(&expect.plan) {
        Ok(p) => p,
        Err(e) => {
            say(&format!("FAIL reading {}: {e}", expect.plan));
            return failures + 1;
        }
    };
    // A line: a test binary, then the tests to run when not all (`--exact` names).
    for line in plan.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let mut words = line.split_whitespace();
        let Some(exe) = words.next() else { continue };
        let name = Path::new(exe).file_name().map_or(exe.into(), |n| n.to_string_lossy());
        let started = Instant::now();
        let mut cmd = Command::new(exe);
        cmd.args(words)
            .args(["--test-threads=1", "--nocapture"])
            .env("EVICTD_REQUIRE_PRIVILEGED", "1")
            .env("EVICTD_TEST_PATIENCE", TCG_PATIENCE);
        for t in &expect.skip {
            cmd.args(["--skip", t]);
        }
        let outcome = cmd.status().map_err(|e| e.to_string()).and_then(exited_ok);
        reap_orphans();
        let secs = started.elapsed().as_secs_f64();
        match outcome {
            Ok(()) => say(&format!("ok {name} seconds={secs:.0}")),
            Err(e) => {
                say(&format!("FAIL {name}: {e} seconds={secs:.0}"));
                failures += 1;
            }
        }
    }
    failures
}

fn exited_ok(status: ExitStatus) -> Result<(), String> {
    if status.success() { Ok(()) } else { Err(status.to_string()) }
}

/// `evictd probe --json` must name the tier the matrix expects for this kernel.
fn check_tier(expected: Option<&str>) -> bool {
    let Some(expected) = expected else {
        say("FAIL tier: no evictd_vm.tier= on the kernel command line");
        return false;
    };
    // The readable report first, for the log.
    let _ = Command::new("/vm/bin/evictd").arg("probe").status();
    let out = match Command::new("/vm/bin/evictd").args(["probe", "--json"]).output() {
        Ok(o) => o,
        Err(e) => {
            say(&format!("FAIL tier: running evictd probe: {e}"));
            return false;
        }
    };
    let report: serde_json::Value = match serde_json::from_slice(&out.stdout) {
        Ok(v) => v,
        Err(e) => {
            say(&format!("FAIL tier: evictd probe --json printed no JSON ({e}); status {}", out.status));
            return false;
        }
    };
    let tier = report["charge_wake"]["tier"].as_str().unwrap_or("none");
    let why = report["charge_wake"]["why"].as_str().unwrap_or("");
    if tier == expected {
        say(&format!("ok tier {tier} ({why})"));
        true
    } else {
        say(&format!("FAIL tier: expected {expected}, evictd probe chose {tier} ({why})"));
        false
    }
}

/// PID 1 inherits the children of every process that dies before them (a test's evictd
/// whose harness ended): reap them, so none stays a zombie.
fn reap_orphans() {
    while let Ok(status) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if status == nix::sys::wait::WaitStatus::StillAlive {
            break;
        }
    }
}

#[expect(
    clippy::disallowed_methods,
    reason = "PID 1 of a throwaway VM: nothing is left to clean up, and its exit ends the VM"
)]
fn power_off() -> ! {
    nix::unistd::sync();
    let e = reboot(RebootMode::RB_POWER_OFF);
    // PID 1 must not return; with panic=-1 on the command line the kernel then reboots, and
    // QEMU (-no-reboot) exits.
    say(&format!("power off failed: {e:?}"));
    std::process::exit(1)
}
