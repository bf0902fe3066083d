//! Test workload: waits for "alloc <MiB>" (or "alloc-kib <KiB>") lines on stdin, allocates
//! and touches that much (kept until exit), answers "ok" on stdout; exits on EOF.
//! "no-huge-pages" keeps transparent huge pages away from it. "cache
//! <MiB> <path>" writes a file of that size and syncs it: clean page cache charged to
//! memhog's cgroup, which the kernel may reclaim. "churn <KiB> <times>" maps, touches and
//! unmaps that much, that many times: memory charged and freed again, the node's usage flat;
//! "churn-across <KiB> <times> <cpu> <cpu>" touches each mapping on the first CPU and unmaps
//! it on the second. Driven line by line so a test can move it into a cgroup first and then
//! decide exactly how much it charges and when.

use std::io::{BufRead as _, Write as _};

fn main() -> std::process::ExitCode {
    let mut kept: Vec<Vec<u8>> = Vec::new();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line == "no-huge-pages" {
            if let Err(e) = no_huge_pages() {
                eprintln!("memhog: {line:?}: {e}");
                return std::process::ExitCode::FAILURE;
            }
        } else if let Some(args) = line.strip_prefix("cache ") {
            if let Err(e) = cache(args) {
                eprintln!("memhog: {line:?}: {e}");
                return std::process::ExitCode::FAILURE;
            }
        } else if let Some(args) = line.strip_prefix("churn-across ") {
            if let Err(e) = churn_across(args) {
                eprintln!("memhog: {line:?}: {e}");
                return std::process::ExitCode::FAILURE;
            }
        } else if let Some(args) = line.strip_prefix("churn ") {
            if let Err(e) = churn(args) {
                eprintln!("memhog: {line:?}: {e}");
                return std::process::ExitCode::FAILURE;
            }
        } else if let Some(mib) = line.strip_prefix("alloc ").and_then(|n| n.trim().parse::<usize>().ok()) {
            // vec![1; n] touches every page, so the memory is really charged.
            kept.push(vec![1u8; mib << 20]);
        } else if let Some(kib) = line.strip_prefix("alloc-kib ").and_then(|n| n.trim().parse::<usize>().ok())
        {
            kept.push(vec![1u8; kib << 10]);
        } else {
            eprintln!("memhog: unknown command {line:?}");
            return std::process::ExitCode::FAILURE;
        }
        if writeln!(out, "ok").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
    std::hint::black_box(&kept);
    std::process::ExitCode::SUCCESS
}

/// No transparent huge page for this process, at a fault or from khugepaged: its usage then
/// moves by what it allocates and nothing else. A khugepaged collapse charges the new 2 MiB
/// page before it frees the 512 it replaces (a transient 2 MiB), and fills the range's
/// pages never touched (a lasting step): either lands in the middle of a test stepping
/// towards a threshold (seen under QEMU on Debian's kernels, whose THP is `always`).
fn no_huge_pages() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// `<MiB> <path>`: the file written and synced (its pages stay cached, clean).
fn cache(args: &str) -> std::io::Result<()> {
    let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "expected <MiB> <path>");
    let (mib, path) = args.split_once(' ').ok_or_else(invalid)?;
    let mib: usize = mib.parse().map_err(|_| invalid())?;
    let mut f = std::fs::File::create(path.trim())?;
    let chunk = vec![7u8; 1 << 20];
    for _ in 0..mib {
        f.write_all(&chunk)?;
    }
    f.sync_all()
}

/// `<KiB> <times>`: an anonymous mapping of that size touched page by page and unmapped, that
/// many times (`map_touch_unmap`).
fn churn(args: &str) -> std::io::Result<()> {
    let [kib, times] = numbers(args, "expected <KiB> <times>")?;
    let len = mapping_len(kib)?;
    for _ in 0..times {
        evictd_tests::map_touch_unmap(len)?;
    }
    Ok(())
}

/// `<KiB> <times> <cpu> <cpu>`: `churn`, touched on the first CPU and unmapped on the second.
fn churn_across(args: &str) -> std::io::Result<()> {
    let [kib, times, charge_on, free_on] = numbers(args, "expected <KiB> <times> <cpu> <cpu>")?;
    let len = mapping_len(kib)?;
    for _ in 0..times {
        evictd_tests::map_touch_unmap_across(len, charge_on, free_on)?;
    }
    Ok(())
}

/// Exactly `N` numbers separated by spaces.
fn numbers<const N: usize>(args: &str, expected: &str) -> std::io::Result<[usize; N]> {
    let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidInput, expected.to_string());
    let parsed: Vec<usize> =
        args.split_whitespace().map(str::parse).collect::<Result<_, _>>().map_err(|_| invalid())?;
    parsed.try_into().map_err(|_| invalid())
}

fn mapping_len(kib: usize) -> std::io::Result<std::num::NonZeroUsize> {
    std::num::NonZeroUsize::new(kib << 10)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a mapping of 0 KiB"))
}
