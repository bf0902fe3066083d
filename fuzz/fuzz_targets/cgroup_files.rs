//! memory.stat and /proc/meminfo text, any text: a value or an error naming what is wrong.
#![no_main]

// The daemon's own parser file, compiled here alone: the fuzz build stays off the daemon's
// dependencies (kube, tonic, aya and the eBPF build).
#[allow(dead_code, reason = "the daemon reads what the parser returns; the target only runs it")]
#[path = "../../evictd/src/node/memory/parse.rs"]
mod parse;

use libfuzzer_sys::fuzz_target;
use parse::{meminfo_bytes, stat_value};

fuzz_target!(|s: &str| {
    for key in ["total_inactive_file", "inactive_file", "file"] {
        let _ = stat_value(s, key);
    }
    for key in ["MemTotal", "Inactive(file)"] {
        let _ = meminfo_bytes(s, key);
    }
});
