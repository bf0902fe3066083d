//! evictd's benchmarks, run through `cargo xtask bench reaction|overhead` (as root).

use std::process::ExitCode;

mod overhead;
mod reaction;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("reaction") => reaction::parse_opts(&args[1..]).and_then(|o| {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            rt.block_on(reaction::reaction(&o))
        }),
        Some("overhead") => overhead::parse_opts(&args[1..]).and_then(|o| overhead::overhead(&o)),
        // The child `overhead` spawns to time a process's exit.
        Some("overhead-hold") => overhead::hold(args.get(1).and_then(|m| m.parse().ok()).unwrap_or(1024)),
        _ => Err(anyhow::anyhow!(
            "usage: evictd-bench reaction [--runs N] [--rates MiB/s,...] [--modes ebpf,eventfd,psi,poll-100ms,poll-10s] \
             [--capacity MiB] [--threshold MiB] [--out DIR]\n       evictd-bench overhead [--rounds N] [--seconds S] [--out DIR]"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("evictd-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
