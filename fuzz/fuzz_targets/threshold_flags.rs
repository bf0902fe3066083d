//! The kubelet's eviction flags: four lines (hard, soft, soft grace, minimum reclaim), any
//! text, through the kubelet's ParseThresholdConfig rules. Errors are fine; panics are not.
#![no_main]

use evictd_policy::policy::{MapSetting, PolicyInput, build};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|s: &str| {
    let mut lines = s.splitn(4, '\n');
    let mut next = |source: &str, sep: char| MapSetting::from_flag(source, lines.next().unwrap_or(""), sep);
    let (Ok(hard), Ok(soft), Ok(soft_grace), Ok(min_reclaim)) = (
        next("--eviction-hard", '<'),
        next("--eviction-soft", '<'),
        next("--eviction-soft-grace-period", '='),
        next("--eviction-minimum-reclaim", '='),
    ) else {
        return;
    };
    let input = PolicyInput { hard: Some(hard), soft, soft_grace, min_reclaim, ..Default::default() };
    if let Ok(policy) = build(&input, &mut Vec::new()) {
        let _ = policy.to_json().to_string();
    }
});
