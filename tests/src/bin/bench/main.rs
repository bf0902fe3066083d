//! evictd's benchmarks, run through `cargo xtask bench reaction|earlyoom|overhead|disk|scale` (as root).

use std::process::ExitCode;

use clap::Parser;

mod disk;
mod earlyoom;
mod overhead;
mod plot;
mod reaction;
mod scale;
mod soak;

#[derive(Parser)]
#[command(name = "evictd-bench", about = "evictd's benchmarks (root); run through `cargo xtask bench`")]
enum Bench {
    /// Eviction reaction time per wake mode and allocation rate, under a private containerd.
    Reaction(reaction::Opts),
    /// evictd and earlyoom side by side against the whole machine, the same workload and columns.
    Earlyoom(earlyoom::Opts),
    /// The probes' cost on the allocation path, evictd's RSS and idle CPU.
    Overhead(overhead::Opts),
    /// Disk detection latency: the disk poll beside the housekeeping timer, a tmpfs filled
    /// at fixed rates.
    Disk(disk::Opts),
    /// evictd on a node of 10, 110 and 250 pods and a volume of a million files: detection,
    /// decision, stop and freed times with the disk walker idle and walking; RSS and idle CPU.
    Scale(scale::Opts),
    /// Repeated pressure episodes with runtime restarts: one eviction per crossing, no pod
    /// twice, evictd's RSS and open file descriptors flat.
    Soak(soak::Opts),
    /// Draws the CDFs of a CSV `reaction` or `earlyoom` wrote again (detection by wake mode,
    /// stop and freed by kill path), as `<out>/<stem>-{detection,stop,freed}.{svg,png}`.
    Plot {
        #[arg(long, value_name = "FILE")]
        csv: std::path::PathBuf,
        #[arg(long, value_name = "DIR", default_value = "target/bench")]
        out: std::path::PathBuf,
        /// The files' name before `-detection` (default: the CSV's name).
        #[arg(long)]
        stem: Option<String>,
    },
    /// The child `overhead` spawns to time a process's exit: holds MIB of touched memory.
    #[command(hide = true)]
    OverheadHold {
        #[arg(default_value_t = 1024)]
        mib: usize,
    },
}

fn main() -> ExitCode {
    let result = match Bench::parse() {
        Bench::Reaction(o) => o.validate().and_then(|()| {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            rt.block_on(reaction::reaction(&o))
        }),
        Bench::Earlyoom(o) => o.validate().and_then(|()| {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            rt.block_on(earlyoom::earlyoom(&o))
        }),
        Bench::Overhead(o) => o.validate().and_then(|()| overhead::overhead(&o)),
        Bench::Disk(o) => o.validate().and_then(|()| disk::disk(&o)),
        Bench::Scale(o) => o.validate().and_then(|()| {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            rt.block_on(scale::scale(&o))
        }),
        Bench::Soak(o) => o.validate().and_then(|()| {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            rt.block_on(soak::soak(&o))
        }),
        Bench::OverheadHold { mib } => overhead::hold(mib),
        Bench::Plot { csv, out, stem } => reaction::read_csv(&csv).and_then(|runs| {
            let stem = stem.unwrap_or_else(|| {
                csv.file_stem().map_or_else(|| "reaction".into(), |s| s.to_string_lossy().into_owned())
            });
            std::fs::create_dir_all(&out)?;
            reaction::plot_distributions(&out, &stem, &runs)
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("evictd-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
