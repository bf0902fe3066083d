//! Where logs go: stderr, written by a thread of its own (`evictd-log`). A log line is
//! formatted where it is made and handed over; the daemon's thread never waits on stderr. In a
//! pod, stderr is a pipe the runtime's shim copies to a file: a slow or full disk — disk
//! pressure, which evictd is there for — fills that pipe, and a write to it would hold the
//! next decision until the disk catches up. Lines that find the hand-over queue full are
//! dropped and counted (`dropped_lines`, the metric `evictd_output_lines_dropped_total`).

use std::sync::OnceLock;

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

/// Lines waiting for stderr, at most. Each is allocated where it is logged, often on the
/// daemon's thread, and held until written: 512 lines of ~200–500 B stay well inside the
/// 1 MiB heap reserve the real-time thread keeps (`protect`) when stderr stops.
const QUEUED_LINES: usize = 512;

static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Installs the global subscriber, `RUST_LOG` filtered (`info` by default). Keep the guard
/// until the end: dropping it writes what is queued (waiting at most ~1 s).
/// A panic is logged through it as well: the default hook writes to stderr where it
/// panicked, and a panic while stderr takes nothing would neither decide nor exit.
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
    std::panic::set_hook(Box::new(|panic| {
        let thread = std::thread::current();
        tracing::error!("thread '{}' {panic}", thread.name().unwrap_or("unnamed"));
    }));
    guard
}

/// Log lines dropped since the start because stderr was not keeping up.
pub fn dropped_lines() -> u64 {
    DROPPED.get().map_or(0, |c| c.dropped_lines() as u64)
}

/// An error and its causes on one line, each cause said once: many of evictd's errors
/// name their cause in their own text as well (`reading /proc/meminfo: <the I/O error>`),
/// which anyhow's `{:#}` would then print twice.
pub fn causes(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain().map(ToString::to_string) {
        if line == cause || line.ends_with(&format!(": {cause}")) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&cause);
    }
    line
}

#[cfg(test)]
mod tests {
    use anyhow::Context as _;

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::from_raw_os_error(103);
        let e = crate::node::memory::MemoryError::Read { path: "/proc/meminfo".into(), source: io };
        let e = Err::<(), _>(e).context("reading the node's memory").unwrap_err();
        let said = super::causes(&e);
        assert_eq!(said.matches("os error 103").count(), 1, "{said}");
        assert!(said.starts_with("reading the node's memory: reading /proc/meminfo: "), "{said}");
        let plain = Err::<(), _>(std::io::Error::other("gone")).context("a").context("b").unwrap_err();
        assert_eq!(super::causes(&plain), "b: a: gone");
    }
}
