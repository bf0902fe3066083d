//! KubeletConfiguration files (YAML or JSON), any text, then the policy they make.
#![no_main]

use evictd_policy::{kubelet_config, policy::build};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|s: &str| {
    if let Ok(input) = kubelet_config::parse(s, "fuzz.yaml") {
        let _ = build(&input, &mut Vec::new());
    }
});
