//! Shared harness for evictd's privileged tests: loud skips, test cgroups that clean up
//! after themselves, and a workload process whose charge the test controls; `containerd`
//! runs a private containerd for the end-to-end tests.

pub mod api_double;
mod cleanup;
pub mod containerd;
pub mod evictd_proc;
pub mod kubelet_pod;
pub mod kubelet_stand_in;
pub mod patience;
pub mod scenario;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::{fs::MetadataExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use evictd::node::cgroups::{CgroupMounts, CgroupVersion};

/// Makes a child of the harness (evictd, containerd, a workload) get SIGKILL when the thread
/// that started it ends: a test that panics before its guard drops, or a test or benchmark
/// process that is killed, takes its children with it instead of leaving them running.
/// Start children from a thread that lives as long as they should (a test's own thread, a
/// benchmark's main thread), never from a pool thread that may retire.
pub fn dies_with_harness(cmd: &mut Command) -> &mut Command {
    let harness = std::process::id();
    // SAFETY: between fork and exec only async-signal-safe calls: prctl, getppid, _exit.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The harness may have died before the prctl took effect.
            if libc::getppid() as u32 != harness {
                libc::_exit(1);
            }
            Ok(())
        })
    }
}

/// Returns false (after saying so on stderr) when the test cannot run here. With
/// `EVICTD_REQUIRE_PRIVILEGED=1` (set by CI) a skip is a failure instead, so a CI machine
/// that lost its privileges cannot pass silently.
pub fn privileged(test: &str) -> bool {
    let reason = if !nix::unistd::geteuid().is_root() {
        Some("not running as root")
    } else if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        Some("the kernel has no BTF (/sys/kernel/btf/vmlinux)")
    } else {
        None
    };
    match reason {
        None => true,
        Some(r) => {
            skip(test, r);
            false
        }
    }
}

/// Says loudly that `test` cannot run here, and why — or, in CI
/// (`EVICTD_REQUIRE_PRIVILEGED=1`), fails it: a skip there would pass what was not tested.
pub fn skip(test: &str, why: &str) {
    if std::env::var("EVICTD_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1") {
        panic!("{test}: cannot run ({why}) and EVICTD_REQUIRE_PRIVILEGED=1");
    }
    // Straight to the stderr handle: libtest captures eprintln! of passing tests, and a skip
    // must be seen.
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A memory cgroup of the test's own, `evictd-test-<pid>-<n>` under the memory
/// controller's root (never under anything else). Removed on drop, also when the test
/// panics; processes inside must be ended first (`MemHog` does that on its own drop).
pub struct TestCgroup {
    pub dir: PathBuf,
    pub layout: CgroupMounts,
}

impl TestCgroup {
    pub fn new(limit_bytes: Option<u64>) -> Self {
        let layout = CgroupMounts::detect().expect("cgroup layout");
        let name = format!("evictd-test-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        let dir = layout.memory_root.join(name);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let cg = TestCgroup { dir, layout };
        if let Some(limit) = limit_bytes {
            let file = match cg.layout.memory_version {
                CgroupVersion::V1 => "memory.limit_in_bytes",
                CgroupVersion::V2 => "memory.max",
            };
            std::fs::write(cg.dir.join(file), limit.to_string()).expect("setting the memory limit");
        }
        cg
    }

    /// A child cgroup of this one, removed on drop (drop it before its parent). On cgroup v2
    /// the memory controller is handed down first, as systemd does for a node's slices:
    /// without it the child has no memory files.
    pub fn child(&self, name: &str) -> TestCgroup {
        if self.layout.memory_version == CgroupVersion::V2 {
            std::fs::write(self.dir.join("cgroup.subtree_control"), "+memory")
                .unwrap_or_else(|e| panic!("enabling memory below {}: {e}", self.dir.display()));
        }
        let dir = self.dir.join(name);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        TestCgroup { dir, layout: self.layout.clone() }
    }

    /// The cgroup id the kernel reports for it (its directory's inode number).
    pub fn id(&self) -> u64 {
        std::fs::metadata(&self.dir).expect("test cgroup metadata").ino()
    }

    /// Its path relative to the hierarchy root, as evictd prints it.
    pub fn rel_path(&self) -> String {
        format!("/{}", self.dir.strip_prefix(&self.layout.memory_root).expect("under root").display())
    }

    pub fn add_pid(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("moving pid {pid} into {}: {e}", self.dir.display()));
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // The kernel refuses rmdir while a dying task is still charged: retry briefly.
        for _ in 0..50 {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        eprintln!("warning: could not remove test cgroup {}", self.dir.display());
    }
}

/// The workload process (evictd-memhog), moved into a cgroup before it allocates anything.
pub struct MemHog {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl MemHog {
    pub fn spawn_in(cg: &TestCgroup) -> Self {
        let mut child = dies_with_harness(&mut Command::new(sibling_binary("evictd-memhog")))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning evictd-memhog");
        cg.add_pid(child.id());
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("memhog stdout"));
        MemHog { child, stdin, stdout }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Allocates and touches `mib` MiB more; returns once it is charged.
    pub fn alloc(&mut self, mib: usize) {
        assert!(self.try_alloc(mib), "memhog did not allocate {mib} MiB (killed by its limit?)");
    }

    /// No transparent huge pages for memhog from now on: neither a fault nor khugepaged
    /// charges it 2 MiB at once (a collapse does so before it frees the small pages).
    pub fn no_huge_pages(&mut self) {
        assert!(self.command("no-huge-pages"), "memhog could not turn transparent huge pages off");
    }

    /// Allocates and touches `kib` KiB more; returns once it is charged.
    pub fn alloc_kib(&mut self, kib: usize) {
        assert!(self.command(&format!("alloc-kib {kib}")), "memhog did not allocate {kib} KiB");
    }

    /// Like `alloc`, but returns false when memhog died trying (e.g. OOM-killed).
    pub fn try_alloc(&mut self, mib: usize) -> bool {
        self.command(&format!("alloc {mib}"))
    }

    /// Writes and syncs a `mib` MiB file at `path` (on a disk, not a tmpfs): page cache
    /// charged to memhog's cgroup, clean, which the kernel may reclaim. Returns once synced.
    pub fn cache(&mut self, mib: usize, path: &Path) {
        assert!(self.command(&format!("cache {mib} {}", path.display())), "memhog did not cache {mib} MiB");
    }

    /// Maps, touches and unmaps `kib` KiB, `times` times: charges of `kib` × `times` in all,
    /// the usage flat. Returns when done.
    pub fn churn(&mut self, kib: usize, times: usize) {
        assert!(self.try_churn(kib, times), "memhog did not churn {kib} KiB");
    }

    /// Like `churn`, but returns false when memhog died trying.
    pub fn try_churn(&mut self, kib: usize, times: usize) -> bool {
        self.command(&format!("churn {kib} {times}"))
    }

    /// `churn`, each mapping touched on CPU `charge_on` and unmapped on `free_on`; false when
    /// memhog died trying.
    pub fn try_churn_across(&mut self, kib: usize, times: usize, charge_on: usize, free_on: usize) -> bool {
        self.command(&format!("churn-across {kib} {times} {charge_on} {free_on}"))
    }

    fn command(&mut self, line: &str) -> bool {
        let Some(stdin) = self.stdin.as_mut() else { return false };
        if writeln!(stdin, "{line}").and_then(|()| stdin.flush()).is_err() {
            return false;
        }
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).is_ok() && answer.trim() == "ok"
    }
}

impl Drop for MemHog {
    fn drop(&mut self) {
        // Closing stdin ends it; kill by PID (ours) if it does not go.
        drop(self.stdin.take());
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A directory for files whose pages are page cache, on a disk (a tmpfs file would be
/// shared memory, never reclaimed, always working set); `None`, skipped loudly, where
/// /var/tmp lives in memory.
pub fn page_cache_dir(test: &str) -> Option<tempfile::TempDir> {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let dir = tempfile::tempdir_in("/var/tmp").expect("a directory on /var/tmp");
    let in_memory = nix::sys::statfs::statfs(dir.path())
        .is_ok_and(|s| [TMPFS_MAGIC, RAMFS_MAGIC].contains(&s.filesystem_type().0));
    if in_memory {
        skip(test, "/var/tmp is memory-backed (tmpfs or ramfs): no reclaimable page cache to fill");
        return None;
    }
    Some(dir)
}

/// Prints the last `lines` lines of `whose` log (`text`, kept at `path` when it has one) to
/// stderr, for a failing test: the teardown deletes the log, and a VM loses it. `cargo xtask
/// vm` reads this header back to echo the warnings and errors at the end of its output.
pub fn print_log_tail(whose: &str, path: Option<&std::path::Path>, text: &str, lines: usize) {
    let all: Vec<&str> = text.lines().collect();
    let tail = &all[all.len().saturating_sub(lines)..];
    let at = path.map(|p| format!(" ({})", p.display())).unwrap_or_default();
    eprintln!("--- the last {} lines of {whose}'s log{at} ---\n{}\n---", tail.len(), tail.join("\n"));
}

/// Maps `len` bytes of private anonymous memory, touches every page and unmaps it: `len` charged
/// and freed again, through a mapping of its own (memory an allocator kept would be charged
/// once and never again). The churn of memhog and of the overhead benchmark's fault loop.
pub fn map_touch_unmap(len: std::num::NonZeroUsize) -> std::io::Result<()> {
    map_touch_then_unmap(len, || Ok(()))
}

/// `map_touch_unmap` with the mapping touched on CPU `charge_on` and unmapped on `free_on`:
/// memory charged on one CPU and freed on another (this thread moves between them).
pub fn map_touch_unmap_across(
    len: std::num::NonZeroUsize,
    charge_on: usize,
    free_on: usize,
) -> std::io::Result<()> {
    run_on_cpu(charge_on)?;
    map_touch_then_unmap(len, || run_on_cpu(free_on))
}

fn map_touch_then_unmap(
    len: std::num::NonZeroUsize,
    before_unmap: impl FnOnce() -> std::io::Result<()>,
) -> std::io::Result<()> {
    use nix::sys::mman::{MapFlags, ProtFlags, mmap_anonymous, munmap};
    // SAFETY: a new private anonymous mapping, written only within its length, unmapped once
    // and never used after.
    unsafe {
        let p =
            mmap_anonymous(None, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_PRIVATE)?;
        let bytes = p.cast::<u8>().as_ptr();
        for off in (0..len.get()).step_by(4096) {
            bytes.add(off).write_volatile(1);
        }
        let moved = before_unmap();
        munmap(p, len.get())?;
        moved
    }
}

/// Moves the calling thread to CPU `cpu` (the scheduler moves it there before returning).
pub fn run_on_cpu(cpu: usize) -> std::io::Result<()> {
    pin_to_cpu(0, cpu)
}

/// Lets process `pid` (0: the calling thread) run on CPU `cpu` only.
pub fn pin_to_cpu(pid: u32, cpu: usize) -> std::io::Result<()> {
    use nix::sched::{CpuSet, sched_setaffinity};
    let mut one = CpuSet::new();
    one.set(cpu)?;
    sched_setaffinity(nix::unistd::Pid::from_raw(pid as i32), &one)?;
    Ok(())
}

/// The first `n` CPUs this process may run on, or fewer if it may run on fewer.
pub fn allowed_cpus(n: usize) -> Vec<usize> {
    use nix::sched::{CpuSet, sched_getaffinity};
    let Ok(allowed) = sched_getaffinity(nix::unistd::Pid::from_raw(0)) else { return Vec::new() };
    (0..CpuSet::count()).filter(|&c| allowed.is_set(c).unwrap_or(false)).take(n).collect()
}

/// A directory on the machine that a test's private mount namespace mounts on, or a
/// program creates at a fixed path (lxcfs's /run/lxcfs): when the machine had none, the
/// test made it (or let it be made), and it is removed again on drop, with what the program
/// left inside (`leaves`, empty directories), also when the test fails.
pub struct MachineDir {
    path: &'static str,
    leaves: &'static [&'static str],
    made: bool,
}

impl MachineDir {
    /// Notes whether `path` exists; with `create`, makes it when it does not.
    pub fn note(path: &'static str, leaves: &'static [&'static str], create: bool) -> Self {
        let made = !Path::new(path).exists() && (!create || std::fs::create_dir(path).is_ok());
        MachineDir { path, leaves, made }
    }
}

impl Drop for MachineDir {
    fn drop(&mut self) {
        if self.made {
            for leaf in self.leaves {
                let _ = std::fs::remove_dir(Path::new(self.path).join(leaf));
            }
            let _ = std::fs::remove_dir(self.path);
        }
    }
}

/// The evictd binary under test: `EVICTD_BINARY` where set (`cargo xtask bench` and `soak` set
/// it to the static release build, the binary the image ships), else the one built next to the
/// test binaries (target/<profile>/evictd).
pub fn evictd_binary() -> PathBuf {
    match std::env::var_os("EVICTD_BINARY") {
        Some(path) => {
            let bin = PathBuf::from(path);
            assert!(bin.is_file(), "EVICTD_BINARY={} is not a file", bin.display());
            bin
        }
        None => sibling_binary("evictd"),
    }
}

/// A binary of the workspace in the same target directory as the running executable.
pub fn sibling_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // Test executables live in target/<profile>/deps, binaries in target/<profile>.
    let mut dir = exe.parent().expect("executable directory");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("target dir");
    }
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --workspace` first (cargo xtask test does)",
        bin.display()
    );
    bin
}

/// A plain HTTP/1.1 GET of `path` from `addr` (evictd's metrics endpoint), the whole response
/// returned: status line, headers and body.
pub fn http_get(addr: &str, path: &str) -> String {
    try_http_get(addr, path).unwrap_or_else(|e| panic!("GET {path} from {addr}: {e}"))
}

/// `http_get` that gives the error back (a server that turns clients away is not yet a
/// failure), waiting at most 10 s for the answer.
pub fn try_http_get(addr: &str, path: &str) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// A tmpfs of the test's own at a fresh directory: a small filesystem a test or benchmark
/// fills on purpose. Unmounted and removed on drop, also when the test panics.
pub struct TestTmpfs {
    pub dir: PathBuf,
}

impl TestTmpfs {
    pub fn new(size: u64) -> Self {
        let name = format!("evictd-tmpfs-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        let fs = TestTmpfs { dir: std::env::temp_dir().join(name) };
        mount_tmpfs(&fs.dir, size);
        fs
    }

    /// Bytes available, as statvfs says.
    pub fn available(&self) -> u64 {
        fs_available(&self.dir)
    }

    /// Writes `bytes` more to the file `name` in it (at once).
    pub fn append(&self, name: &str, bytes: u64) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(name))
            .unwrap_or_else(|e| panic!("opening {name} in {}: {e}", self.dir.display()));
        let chunk = vec![0x5au8; 1 << 20];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            f.write_all(&chunk[..n]).unwrap_or_else(|e| panic!("writing {name}: {e}"));
            left -= n as u64;
        }
    }

    pub fn remove(&self, name: &str) {
        let _ = std::fs::remove_file(self.dir.join(name));
    }
}

impl Drop for TestTmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.dir, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A tmpfs of `size` bytes at `dir` (made if missing).
pub(crate) fn mount_tmpfs(dir: &Path, size: u64) {
    std::fs::create_dir_all(dir).expect("mount point");
    let opts = format!("size={size},mode=0755");
    nix::mount::mount(Some("tmpfs"), dir, Some("tmpfs"), nix::mount::MsFlags::empty(), Some(opts.as_str()))
        .unwrap_or_else(|e| panic!("mounting a {size}-byte tmpfs at {}: {e}", dir.display()));
}

/// Bytes available on the filesystem of `dir`, as statvfs says.
pub(crate) fn fs_available(dir: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(dir).unwrap_or_else(|e| panic!("statvfs {}: {e}", dir.display()));
    s.blocks_available() as u64 * s.fragment_size() as u64
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt as _;

    use super::*;

    /// A child started through `dies_with_harness` is killed when the thread that started it
    /// ends, without anyone calling kill on it.
    #[test]
    fn a_child_dies_with_the_thread_that_started_it() {
        let mut child = std::thread::spawn(|| {
            dies_with_harness(Command::new("sleep").arg("600")).spawn().expect("starting sleep")
        })
        .join()
        .expect("the starting thread");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for sleep") {
                break status;
            }
            if std::time::Instant::now() > deadline {
                // Ours, by PID, so that a failing test leaves nothing behind either.
                let _ = child.kill();
                let _ = child.wait();
                panic!("the child outlived the thread that started it by 5 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    }
}
