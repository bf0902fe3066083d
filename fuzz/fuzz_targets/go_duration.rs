//! Go durations (grace and transition periods): any text parses or is an error, and what
//! parses prints back to the same number of nanoseconds.
#![no_main]

use evictd_policy::godur;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|s: &str| {
    if let Ok(ns) = godur::parse(s) {
        let printed = godur::format(ns);
        assert_eq!(godur::parse(&printed).ok(), Some(ns), "{s:?} printed as {printed:?}");
    }
});
