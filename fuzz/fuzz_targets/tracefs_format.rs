//! Tracepoint format files (/sys/kernel/tracing/events/*/*/format), any text.
#![no_main]

use evictd::kernel::tracefs::parse_format;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|s: &str| {
    let _ = parse_format(s);
});
