use std::{sync::mpsc, time::Duration};

use clap::Parser as _;
use evictd::cli::{self, Cli};

/// How long the exit waits for stderr to take what is left: the log lines queued, then the
/// reason for a failure.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

fn main() -> std::process::ExitCode {
    let logs = evictd::report::logs::install();
    let ran = cli::run(Cli::parse());
    let code = if ran.is_ok() { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::FAILURE };
    drain_output(logs, ran.err());
    code
}

/// Writes the queued log lines, then `failure`, on a thread of its own, waiting for it at most
/// `OUTPUT_DRAIN`: a stderr nobody reads (a log pipe behind a full disk) must not keep a
/// stopped evictd from exiting, and tracing-appender's guard, past its own waits, reports a
/// full queue on stdout, which may be stuck as well.
fn drain_output(logs: tracing_appender::non_blocking::WorkerGuard, failure: Option<anyhow::Error>) {
    let message = failure.map(|e| format!("evictd: {}", evictd::report::logs::causes(&e)));
    let on_thread = message.clone();
    // The guard is handed over once the thread runs: one that cannot start must not drop it
    // here, where its waits and its report could block.
    let (give, guard) = mpsc::channel();
    let (done, drained) = mpsc::channel();
    let spawned = std::thread::Builder::new().name("evictd-exit".into()).spawn(move || {
        drop(guard.recv());
        if let Some(m) = on_thread {
            eprintln!("{m}");
        }
        let _ = done.send(());
    });
    match spawned {
        Ok(_) => {
            let _ = give.send(logs);
            let _ = drained.recv_timeout(OUTPUT_DRAIN);
        }
        // No thread to be had: the queued lines are left unwritten; the reason is said here.
        Err(_) => {
            #[allow(clippy::disallowed_methods, reason = "the process exits next; its drop could block it")]
            std::mem::forget(logs);
            if let Some(m) = message {
                eprintln!("{m}");
            }
        }
    }
}
