//! A node that is itself a container (LXD, Incus, Proxmox) may read `/proc/meminfo` from
//! LXCFS, which reports the container's limit and usage rather than the kernel's. Debian's
//! lxcfs (unpacked by `cargo xtask test`, not installed) serves it over FUSE here; evictd
//! runs in a private mount namespace where LXCFS's meminfo is bound over `/proc/meminfo`,
//! as in such a container. It must refuse to start, naming the file and the flag, and start
//! with `--accept-lxcfs-meminfo`, saying that it took it.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use evictd_tests::{MachineDir, dies_with_harness, evictd_binary, privileged, skip};

/// Debian's lxcfs, unpacked: where `cargo xtask test` put it (`EVICTD_LXCFS`), or where it
/// puts it.
fn lxcfs_package() -> Option<PathBuf> {
    let dir = std::env::var_os("EVICTD_LXCFS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tools/lxcfs"));
    dir.join("usr/bin/lxcfs").is_file().then_some(dir)
}

/// In a private mount namespace: LXCFS mounted on a directory of the test's own; then, in
/// a namespace of the command's own (lxcfs itself reads the kernel's /proc/meminfo, and
/// would wait on itself), its meminfo bound over /proc/meminfo, and the command, killed if
/// it outlives a minute. Everything is unmounted with the namespaces; lxcfs is ended by its
/// PID, and dies with the shell that started it if that is killed first. Every wait is
/// bounded: a FUSE server that hangs hangs whoever reads its files.
const IN_AN_LXCFS_CONTAINER: &str = r#"
set -eu
mkdir -p "$T/fs"
so=$(ls "$PKG"/usr/lib/*/lxcfs/liblxcfs.so)
LD_LIBRARY_PATH="${so%/*}" setpriv --pdeathsig KILL "$PKG/usr/bin/lxcfs" -f -p "$T/lxcfs.pid" "$T/fs" \
    >"$T/lxcfs.log" 2>&1 &
lxcfs=$!
end_lxcfs() { kill "$lxcfs" 2>/dev/null || true; sleep 0.2; kill -KILL "$lxcfs" 2>/dev/null || true; wait "$lxcfs" || true; }
n=0
until timeout -s KILL 2 test -s "$T/fs/proc/meminfo"; do
    n=$((n + 1))
    if [ "$n" -gt 50 ]; then
        echo "lxcfs served no meminfo within 5 s:" >&2; cat "$T/lxcfs.log" >&2
        end_lxcfs; exit 99
    fi
    sleep 0.1
done
set +e
unshare --mount --propagation private sh -c \
    'mount --bind "$T/fs/proc/meminfo" /proc/meminfo && exec timeout -s KILL 60 "$@"' sh "$@"
rc=$?
end_lxcfs
exit "$rc"
"#;

/// `evictd args` in a container whose /proc/meminfo is LXCFS's; the whole of it killed
/// after two minutes, and the shell (with lxcfs, which dies with it) when `timeout` dies
/// with the harness.
fn evictd_under_lxcfs(package: &Path, tmp: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.args(["-s", "KILL", "120", "setpriv", "--pdeathsig", "KILL"])
        .args(["unshare", "--mount", "--propagation", "private"])
        .args(["sh", "-c", IN_AN_LXCFS_CONTAINER, "sh"])
        .arg(evictd_binary())
        .args(args)
        .env("PKG", package)
        .env("T", tmp);
    dies_with_harness(&mut cmd).output().expect("running unshare")
}

#[test]
fn lxcfs_meminfo_is_refused_unless_the_operator_accepts_it() {
    const TEST: &str = "lxcfs_meminfo_is_refused_unless_the_operator_accepts_it";
    if !privileged(TEST) {
        return;
    }
    let Some(package) = lxcfs_package() else {
        return skip(
            TEST,
            "Debian's lxcfs is not unpacked under target/tools/lxcfs (`cargo xtask test` fetches it)",
        );
    };
    if !Path::new("/dev/fuse").exists() {
        return skip(TEST, "no /dev/fuse");
    }
    // lxcfs keeps its state under /run/lxcfs, a path built into it.
    let _run_dir = MachineDir::note("/run/lxcfs", &["controllers", "root"], false);
    let tmp = tempfile::tempdir().expect("a directory for LXCFS");
    let run = [
        "--dry-run",
        "--cri-endpoint",
        "none",
        "--duration",
        "1s",
        "--eviction-hard",
        "memory.available<1Mi",
    ];

    let refused = evictd_under_lxcfs(package.as_path(), tmp.path(), &run);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_ne!(refused.status.code(), Some(99), "{stderr}");
    assert!(!refused.status.success(), "evictd took LXCFS's meminfo: {stderr}");
    assert!(
        stderr.contains("/proc/meminfo") && stderr.contains("--accept-lxcfs-meminfo"),
        "the error names the file and the flag: {stderr}"
    );
    // The filesystem evictd measured: FUSE's magic, which LXCFS's is.
    assert!(stderr.contains("filesystem magic 0x65735546"), "{stderr}");

    let mut accepted = run.to_vec();
    accepted.push("--accept-lxcfs-meminfo");
    let taken = evictd_under_lxcfs(package.as_path(), tmp.path(), &accepted);
    let stderr = String::from_utf8_lossy(&taken.stderr);
    assert!(taken.status.success(), "with --accept-lxcfs-meminfo evictd runs: {stderr}");
    assert!(stderr.contains("taken all the same (--accept-lxcfs-meminfo)"), "and says so: {stderr}");
}
