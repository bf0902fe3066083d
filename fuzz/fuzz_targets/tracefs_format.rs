//! Tracepoint format files (/sys/kernel/tracing/events/*/*/format), any text.
#![no_main]

use evictd::kernel::tracefs::parse_format;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|s: &str| {
    for f in parse_format(s) {
        // A field's name is one identifier, checked by name against evictd's expectations.
        assert!(!f.name.contains(char::is_whitespace), "{f:?}");
    }
});
