//! Kubernetes quantities: any text parses or is an error, and what parses prints back to the
//! same value.
#![no_main]

use evictd_policy::quantity::Quantity;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|s: &str| {
    if let Ok(q) = s.parse::<Quantity>() {
        let printed = q.to_string();
        let again: Quantity = printed.parse().unwrap_or_else(|e| panic!("{s:?} printed as {printed:?}: {e}"));
        assert_eq!(again.nanos(), q.nanos(), "{s:?} printed as {printed:?}");
    }
});
