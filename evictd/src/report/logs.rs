//! Where logs go: stderr, written by a thread of its own (`evictd-log`). A log line is
//! formatted where it is made and handed over; the daemon's thread never waits on stderr. In a
//! pod, stderr is a pipe the runtime's shim copies to a file: a slow or full disk — disk
//! pressure, which evictd is there for — fills that pipe, and a write to it would hold the
//! next decision until the disk catches up. Lines that find the hand-over queue full are
//! dropped and counted (`dropped_lines`, the metric `evictd_output_lines_dropped_total`).

use std::sync::OnceLock;

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

/// Lines waiting for stderr, at most: a pass's worth of debug lines, and a bounded queue
/// (~200 B a line) under `mlockall` when stderr stops.
const QUEUED_LINES: usize = 2048;

static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Installs the global subscriber, `RUST_LOG` filtered (`info` by default). Keep the guard
/// until the end: dropping it writes what is queued (waiting at most ~1 s).
pub fn install() -> WorkerGuard {
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(QUEUED_LINES)
        .thread_name("evictd-log")
        .finish(std::io::stderr());
    let _ = DROPPED.set(writer.error_counter());
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(writer)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    guard
}

/// Log lines dropped since the start because stderr was not keeping up.
pub fn dropped_lines() -> u64 {
    DROPPED.get().map_or(0, |c| c.dropped_lines() as u64)
}
