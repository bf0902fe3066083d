//! One test per rule of the kubelet's `ParseThresholdConfig` (pkg/kubelet/eviction/helpers.go).

use super::*;

fn flag(source: &str, text: &str, sep: char) -> MapSetting {
    MapSetting::from_flag(source, text, sep).unwrap()
}

fn input(hard: Option<&str>, soft: &str, grace: &str, min_reclaim: &str) -> PolicyInput {
    PolicyInput {
        hard: hard.map(|h| flag("--eviction-hard", h, '<')),
        soft: flag("--eviction-soft", soft, '<'),
        soft_grace: flag("--eviction-soft-grace-period", grace, '='),
        min_reclaim: flag("--eviction-minimum-reclaim", min_reclaim, '='),
        ..Default::default()
    }
}

fn build_ok(i: &PolicyInput) -> (Policy, Vec<String>) {
    let mut w = Vec::new();
    let p = build(i, &mut w).unwrap_or_else(|e| panic!("{e}"));
    (p, w)
}

fn build_err(i: &PolicyInput) -> PolicyError {
    build(i, &mut Vec::new()).expect_err("should be rejected")
}

#[test]
fn omitted_hard_gives_linux_defaults_plus_allocatable_copy() {
    let (p, _) = build_ok(&input(None, "", "", ""));
    let names: Vec<String> = p.thresholds.iter().map(|t| t.to_string()).collect();
    assert_eq!(
        names,
        [
            "memory.available<100Mi",
            "nodefs.available<10%",
            "nodefs.inodesFree<5%",
            "imagefs.available<15%",
            "imagefs.inodesFree<5%",
            "allocatableMemory.available<100Mi"
        ]
    );
    assert!(p.thresholds.iter().all(Threshold::is_hard));
    assert_eq!(p.pressure_transition_period_ns, 300_000_000_000);
    assert_eq!(p.max_pod_grace_period_seconds, 0);
}

#[test]
fn empty_hard_means_none_and_partial_hard_drops_other_defaults() {
    assert!(build_ok(&input(Some(""), "", "", "")).0.thresholds.is_empty());
    let (p, _) = build_ok(&input(Some("nodefs.available<5%"), "", "", ""));
    assert_eq!(p.thresholds.len(), 1);
}

#[test]
fn zero_and_hundred_percent_are_dropped_with_a_warning() {
    let (p, w) = build_ok(&input(Some("memory.available<0%,nodefs.available<100%"), "", "", ""));
    assert!(p.thresholds.is_empty());
    assert_eq!(w.len(), 3, "two dropped, and the policy left empty: {w:?}");
    // ... but 0.0% and 100.0% are real thresholds.
    let (p, _) = build_ok(&input(Some("memory.available<0.0%,nodefs.available<100.0%"), "", "", ""));
    assert_eq!(p.thresholds[0].value, ThresholdValue::Percentage(0.0));
    assert_eq!(p.thresholds[1].value, ThresholdValue::Percentage(1.0));
}

#[test]
fn value_rules() {
    type Check = fn(&PolicyError) -> bool;
    let cases: &[(&str, Check)] = &[
        ("memory.available<0", |e| matches!(e, PolicyError::NotPositive { .. })),
        ("memory.available<-1Mi", |e| matches!(e, PolicyError::NotPositive { .. })),
        ("memory.available<101%", |e| matches!(e, PolicyError::PercentageTooLarge { .. })),
        ("memory.available<-5%", |e| matches!(e, PolicyError::PercentageNegative { .. })),
        ("memory.available<abc%", |e| matches!(e, PolicyError::Percentage { .. })),
        ("memory.available<1MB", |e| matches!(e, PolicyError::Quantity { .. })),
        ("swap.available<1Mi", |e| matches!(e, PolicyError::UnknownSignal { .. })),
        ("memory.available=1Mi", |e| matches!(e, PolicyError::Malformed { .. })),
    ];
    for (text, check) in cases {
        let r = MapSetting::from_flag("--eviction-hard", text, '<')
            .and_then(|h| build(&PolicyInput { hard: Some(h), ..Default::default() }, &mut Vec::new()));
        let e = r.expect_err(text);
        assert!(check(&e), "{text}: {e}");
        assert!(e.to_string().contains("--eviction-hard"), "{text}: {e}");
    }
    // `10%%` parses: every trailing % is trimmed.
    let (p, _) = build_ok(&input(Some("memory.available<10%%"), "", "", ""));
    assert_eq!(p.thresholds[0].value, ThresholdValue::Percentage(0.1));
    // Inodes may use binary suffixes.
    let (p, _) = build_ok(&input(Some("nodefs.inodesFree<1Mi"), "", "", ""));
    assert_eq!(p.thresholds[0].value.resolve(0), 1 << 20);
}

#[test]
fn repeated_signal_keeps_the_last_value() {
    let (p, _) = build_ok(&input(Some("memory.available<1Gi,memory.available<2Gi"), "", "", ""));
    assert_eq!(p.thresholds[0].value.resolve(0), 2 << 30);
}

#[test]
fn soft_thresholds_need_a_grace_period() {
    let e = build_err(&input(Some(""), "memory.available<1Gi", "", ""));
    assert!(matches!(e, PolicyError::SoftWithoutGrace { signal: Signal::MemoryAvailable, .. }), "{e}");
    assert!(
        e.to_string()
            .contains("grace period must be specified for the soft eviction threshold memory.available")
    );
    // A dropped soft entry needs none.
    build_ok(&input(Some(""), "memory.available<0%", "", ""));
    let (p, _) = build_ok(&input(Some(""), "memory.available<1Gi", "memory.available=1m30s", ""));
    assert_eq!(p.thresholds[0].grace_period_ns, 90_000_000_000);
    assert!(!p.thresholds[0].is_hard());
}

#[test]
fn soft_with_zero_grace_is_hard() {
    let (p, _) = build_ok(&input(Some(""), "memory.available<1Gi", "memory.available=0s", ""));
    assert!(p.thresholds[0].is_hard());
    // Being hard by the grace-0 rule, it also gets the allocatable copy hard thresholds get.
    assert_eq!(p.thresholds.len(), 2);
}

#[test]
fn grace_period_rules() {
    let e = build_err(&input(Some(""), "memory.available<1Gi", "memory.available=soon", ""));
    assert!(matches!(e, PolicyError::Grace { .. }), "{e}");
    let e = build_err(&input(Some(""), "memory.available<1Gi", "memory.available=-1s", ""));
    assert!(e.to_string().contains("negative"), "{e}");
    let e = build_err(&input(Some(""), "", "bogus.signal=1s", ""));
    assert!(matches!(e, PolicyError::UnknownSignal { .. }), "{e}");
    // A grace period without a soft threshold is ignored, with a warning.
    let (p, w) = build_ok(&input(Some(""), "", "memory.available=1m", ""));
    assert!(p.thresholds.is_empty());
    assert_eq!(w.len(), 2, "the unused grace period, and the policy left empty: {w:?}");
}

#[test]
fn min_reclaim_rules() {
    let (p, _) = build_ok(&input(
        Some("memory.available<1Gi"),
        "memory.available<2Gi",
        "memory.available=1m",
        "memory.available=500Mi",
    ));
    assert!(p.thresholds.iter().all(|t| t.min_reclaim.is_some_and(|m| m.resolve(0) == 500 << 20)));
    assert_eq!(p.thresholds.len(), 3, "hard, soft and the allocatable copy");
    assert!(p.thresholds[2].min_reclaim.is_some(), "the allocatable copy keeps min-reclaim");
    let e = build_err(&input(Some("memory.available<1Gi"), "", "", "memory.available=0%"));
    assert!(matches!(e, PolicyError::MinReclaimNotPositive { .. }), "{e}");
    let e = build_err(&input(Some("memory.available<1Gi"), "", "", "memory.available=-1Mi"));
    assert!(matches!(e, PolicyError::MinReclaimNegative { .. }), "{e}");
    // 0 is allowed as a quantity, and more than 100% as a percentage.
    build_ok(&input(Some("memory.available<1Gi"), "", "", "memory.available=0"));
    build_ok(&input(Some("memory.available<1Gi"), "", "", "memory.available=150%"));
    let e = build_err(&input(Some("memory.available<1Gi"), "", "", "nope=1"));
    assert!(matches!(e, PolicyError::UnknownSignal { .. }), "{e}");
    let (_, w) = build_ok(&input(Some("memory.available<1Gi"), "", "", "nodefs.available=1Gi"));
    assert_eq!(w.len(), 1, "min-reclaim for an unconfigured signal is ignored with a warning");
}

#[test]
fn allocatable_copies_follow_enforce_node_allocatable() {
    let mut i = input(Some("memory.available<1Gi"), "memory.available<2Gi", "memory.available=30s", "");
    let (p, _) = build_ok(&i);
    let alloc: Vec<_> =
        p.thresholds.iter().filter(|t| t.signal == Signal::AllocatableMemoryAvailable).collect();
    assert_eq!(alloc.len(), 1, "only hard thresholds are copied");
    assert!(alloc[0].is_hard());
    i.enforce_node_allocatable = Some(("--enforce-node-allocatable".into(), vec!["system-reserved".into()]));
    assert!(build_ok(&i).0.thresholds.iter().all(|t| t.signal != Signal::AllocatableMemoryAvailable));
    i.enforce_node_allocatable =
        Some(("--enforce-node-allocatable".into(), vec!["none".into(), "pods".into()]));
    assert!(build(&i, &mut Vec::new()).is_err());
    i.enforce_node_allocatable = Some(("--enforce-node-allocatable".into(), vec!["podz".into()]));
    assert!(build(&i, &mut Vec::new()).unwrap_err().to_string().contains("podz"));
}

#[test]
fn transition_period() {
    let mut i = input(Some(""), "", "", "");
    i.pressure_transition_period = Some(("--eviction-pressure-transition-period".into(), "30s".into()));
    assert_eq!(build_ok(&i).0.pressure_transition_period_ns, 30_000_000_000);
    i.pressure_transition_period = Some(("--eviction-pressure-transition-period".into(), "-1s".into()));
    assert!(build(&i, &mut Vec::new()).is_err());
}

#[test]
fn percentage_resolution_matches_kubelet_float32() {
    let (p, _) = build_ok(&input(Some("memory.available<20%"), "", "", ""));
    assert_eq!(p.thresholds[0].value.resolve(1000 << 20), 209_715_203);
}

#[test]
fn met_is_strict_and_exact_and_min_reclaim_extends_it() {
    let t = Threshold {
        signal: Signal::MemoryAvailable,
        value: ThresholdValue::Quantity("100Mi".parse().unwrap()),
        grace_period_ns: 0,
        min_reclaim: Some(ThresholdValue::Quantity("50Mi".parse().unwrap())),
    };
    assert!(t.is_met((100 << 20) - 1, 1 << 30, false));
    assert!(!t.is_met(100 << 20, 1 << 30, false), "strictly less than");
    assert!(t.is_met(120 << 20, 1 << 30, true), "min-reclaim keeps it met up to 150Mi");
    assert!(!t.is_met(150 << 20, 1 << 30, true));
    let milli =
        Threshold { value: ThresholdValue::Quantity("1500m".parse().unwrap()), min_reclaim: None, ..t };
    assert!(milli.is_met(1, 10, false), "1.5 > 1 compared exactly, not rounded");
    assert!(!milli.is_met(2, 10, false));
}

#[test]
fn json_contract() {
    let (p, _) = build_ok(&input(
        Some("memory.available<100Mi"),
        "nodefs.available<10%",
        "nodefs.available=1m30s",
        "nodefs.available=5%",
    ));
    let j = p.to_json();
    assert_eq!(j["pressure_transition_period_seconds"], 300);
    assert_eq!(j["max_pod_grace_period_seconds"], 0);
    let t = &j["thresholds"];
    assert_eq!(t[0]["signal"], "memory.available");
    assert_eq!(t[0]["hard"], true);
    assert_eq!(t[0]["value"]["quantity"], 104857600);
    assert!(t[0]["value"]["percentage"].is_null());
    assert!(t[0]["min_reclaim"].is_null());
    assert_eq!(t[1]["signal"], "nodefs.available");
    assert_eq!(t[1]["hard"], false);
    assert_eq!(t[1]["grace_period_seconds"], 90);
    assert_eq!(t[1]["value"]["percentage"], 0.1);
    assert_eq!(t[1]["min_reclaim"]["percentage"], 0.05);
    assert_eq!(t[2]["signal"], "allocatableMemory.available");
}

proptest::proptest! {
    #[test]
    fn flag_parser_never_panics(s in "[a-zA-Z.<=,%0-9 -]{0,40}") {
        for sep in ['<', '='] {
            if let Ok(m) = MapSetting::from_flag("--x", &s, sep) {
                let i = PolicyInput { hard: Some(m.clone()), min_reclaim: m, ..Default::default() };
                let _ = build(&i, &mut Vec::new());
            }
        }
    }

    #[test]
    fn valid_quantities_round_trip_through_flags(v in 1i64..1_000_000_000) {
        let text = format!("memory.available<{v}");
        let (p, _) = build_ok(&input(Some(&text), "", "", ""));
        proptest::prop_assert_eq!(p.thresholds[0].value.resolve(0), v);
    }
}

/// A policy that evicts nothing is accepted, as the kubelet accepts it, and said loudly.
#[test]
fn an_empty_policy_is_said() {
    let (p, w) = build_ok(&input(Some(""), "", "", ""));
    assert!(p.thresholds.is_empty());
    assert!(w.iter().any(|w| w.contains("no eviction threshold")), "{w:?}");
    let (_, w) = build_ok(&input(None, "", "", ""));
    assert!(!w.iter().any(|w| w.contains("no eviction threshold")), "{w:?}");
}
