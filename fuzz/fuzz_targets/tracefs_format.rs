//! Tracepoint format files (/sys/kernel/tracing/events/*/*/format), any text.
#![no_main]

// The daemon's own parser file, compiled here alone: the fuzz build stays off the daemon's
// dependencies (kube, tonic, aya and the eBPF build).
#[allow(dead_code, reason = "the daemon reads what the parser returns; the target only runs it")]
#[path = "../../evictd/src/kernel/tracefs/format.rs"]
mod format;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|s: &str| {
    let _ = format::parse_format(s);
});
