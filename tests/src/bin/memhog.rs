//! Test workload: waits for "alloc <MiB>" lines on stdin, allocates and touches that much
//! (kept until exit), answers "ok" on stdout; exits on EOF. Driven line by line so a test can
//! move it into a cgroup first and then decide exactly how much it charges and when.

use std::io::{BufRead as _, Write as _};

fn main() -> std::process::ExitCode {
    let mut kept: Vec<Vec<u8>> = Vec::new();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let Some(mib) = line.strip_prefix("alloc ").and_then(|n| n.trim().parse::<usize>().ok()) else {
            eprintln!("memhog: unknown command {line:?}");
            return std::process::ExitCode::FAILURE;
        };
        // vec![1; n] touches every page, so the memory is really charged.
        kept.push(vec![1u8; mib << 20]);
        if writeln!(out, "ok").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
    std::hint::black_box(&kept);
    std::process::ExitCode::SUCCESS
}
