use clap::Parser as _;
use evictd::cli::{self, Cli};

fn main() -> std::process::ExitCode {
    let logs = evictd::report::logs::install();
    let ran = cli::run(Cli::parse());
    // What is still queued is written first, then the reason for a failure, last.
    drop(logs);
    match ran {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("evictd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
