//! Each rule of the kubelet's `loadConfigFile` and `mergeKubeletConfigurations`
//! (cmd/kubelet/app/server.go), with the examples of the kubelet's documentation
//! ("Kubelet Configuration Directory Merging") written with eviction fields.

use super::*;
use crate::policy::build;

/// The header every KubeletConfiguration file needs.
const CONF: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn write(text: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), text).unwrap();
    f
}

fn conf(body: &str) -> String {
    format!("{CONF}{body}")
}

fn hard(input: &PolicyInput) -> Vec<String> {
    let p = build(input, &mut Vec::new()).unwrap();
    p.thresholds
        .iter()
        .filter(|t| t.is_hard() && !t.signal.to_string().starts_with("allocatable"))
        .map(|t| t.to_string())
        .collect()
}

const DEFAULT_HARD: [&str; 5] = [
    "memory.available<100Mi",
    "nodefs.available<10%",
    "nodefs.inodesFree<5%",
    "imagefs.available<15%",
    "imagefs.inodesFree<5%",
];

#[test]
fn reads_the_eviction_fields_of_a_real_looking_file() {
    let f = write(&conf(
        "cgroupDriver: systemd\n\
         evictionHard:\n  memory.available: 200Mi\n  nodefs.available: \"5%\"\n\
         evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 1m30s\n\
         evictionMinimumReclaim:\n  memory.available: 100Mi\nevictionPressureTransitionPeriod: 30s\n\
         evictionMaxPodGracePeriod: 60\nenforceNodeAllocatable: [pods]\n",
    ));
    let input = read(f.path()).unwrap();
    assert!(input.notes.is_empty(), "every field is the kubelet's: {:?}", input.notes);
    let p = build(&input, &mut Vec::new()).unwrap();
    let names: Vec<String> = p.thresholds.iter().map(|t| t.to_string()).collect();
    assert_eq!(
        names,
        [
            "memory.available<200Mi",
            "nodefs.available<5%",
            "memory.available<1Gi",
            "allocatableMemory.available<200Mi"
        ]
    );
    assert_eq!(p.thresholds[2].grace_period_ns, 90_000_000_000);
    assert!(p.thresholds.iter().filter(|t| t.signal.is_memory()).all(|t| t.min_reclaim.is_some()));
    assert_eq!(p.pressure_transition_period_ns, 30_000_000_000);
    assert_eq!(p.max_pod_grace_period_seconds, 60);
}

/// `imageMinimumGCAge`: the kubelet's field and default (2m); a negative age names the
/// field and the file.
#[test]
fn the_image_minimum_gc_age_is_read() {
    let age = |text: &str| {
        parse(&conf(text), "k.yaml").map(|i| build(&i, &mut Vec::new()).map(|p| p.image_minimum_gc_age_ns))
    };
    assert_eq!(age("").unwrap().unwrap(), 120_000_000_000);
    assert_eq!(age("imageMinimumGCAge: 5m\n").unwrap().unwrap(), 300_000_000_000);
    let e = age("imageMinimumGCAge: -1s\n").unwrap().unwrap_err().to_string();
    assert!(e.contains("imageMinimumGCAge in k.yaml"), "{e}");
}

#[test]
fn a_file_without_eviction_fields_means_kubelet_defaults() {
    let f = write(CONF);
    let p = build(&read(f.path()).unwrap(), &mut Vec::new()).unwrap();
    assert_eq!(p.thresholds.len(), 6, "the 5 defaults and the allocatable copy");
}

/// A main file's `evictionHard` replaces the defaults (a node that lists only memory
/// loses its disk thresholds), unless `mergeDefaultEvictionSettings: true`: then each
/// signal it leaves out keeps its default, and the ones it sets win.
#[test]
fn merge_default_eviction_settings_keeps_the_defaults_a_file_leaves_out() {
    let replaced = parse(&conf("evictionHard:\n  memory.available: 500Mi\n"), "k.yaml").unwrap();
    assert_eq!(hard(&replaced), ["memory.available<500Mi"]);
    let merged = parse(
        &conf("mergeDefaultEvictionSettings: true\nevictionHard:\n  memory.available: 500Mi\n"),
        "k.yaml",
    )
    .unwrap();
    let mut want = DEFAULT_HARD.to_vec();
    want[0] = "memory.available<500Mi";
    assert_eq!(hard(&merged), want);
    assert_eq!(merged.origins["evictionHard[memory.available]"], "k.yaml");
    assert_eq!(merged.origins["evictionHard[nodefs.available]"], "default");
}

/// The kubelet's answers to a main file it cannot take: an empty file, no apiVersion or kind,
/// another type, a value of the wrong type — each an error naming the file.
#[test]
fn a_main_file_the_kubelet_refuses_is_an_error() {
    let refused = |text: &str| parse(text, "k.yaml").unwrap_err().to_string();
    assert!(refused("").contains("empty"), "{}", refused(""));
    for text in [
        "evictionHard:\n  memory.available: 1Gi\n",
        "kind: KubeletConfiguration\n",
        "apiVersion: kubelet.config.k8s.io/v1beta1\n",
    ] {
        let e = refused(text);
        assert!(e.starts_with("k.yaml: ") && e.contains("no apiVersion or kind"), "{text:?}: {e}");
    }
    let e = refused("apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n");
    assert!(e.contains("\"kubelet.config.k8s.io/v1\"") && e.contains("reads only"), "{e}");
    let e = refused("apiVersion: v1\nkind: Pod\n");
    assert!(e.contains("\"Pod\""), "{e}");
    assert!(refused(&conf("evictionMaxPodGracePeriod: soon\n")).starts_with("k.yaml"));
    assert!(refused(&conf("evictionHard:\n  memory.available: 100\n")).starts_with("k.yaml"));
    assert!(refused(&conf("evictionHard: [1, 2\n")).starts_with("k.yaml"));
}

/// A field the kubelet does not know, or spells in another case, fails its strict decoding;
/// the lenient decoding it falls back to drops it and the kubelet runs on: a warning that
/// names the field the file may have meant, and the value not applied.
#[test]
fn a_misspelled_field_of_the_main_file_is_said_and_ignored_as_the_kubelet_does() {
    let input = parse(
        &conf(
            "evictionhard:\n  memory.available: 1Gi\nevictonSoft:\n  memory.available: 2Gi\nnotAField: 1\n",
        ),
        "k.yaml",
    )
    .unwrap();
    assert_eq!(hard(&input), DEFAULT_HARD, "the misspelled map is not applied");
    assert!(input.soft.entries.is_empty());
    let notes = input.notes.join("\n");
    assert!(notes.contains("\"evictionhard\"") && notes.contains("did you mean evictionHard?"), "{notes}");
    assert!(notes.contains("\"evictonSoft\"") && notes.contains("did you mean evictionSoft?"), "{notes}");
    let not_a_field = input.notes.iter().find(|n| n.contains("\"notAField\"")).unwrap();
    assert!(!not_a_field.contains("did you mean"), "{not_a_field}");
    let mut warnings = Vec::new();
    build(&input, &mut warnings).unwrap();
    assert_eq!(warnings.len(), 3, "the notes are the policy's warnings: {warnings:?}");
    // An unknown signal is refused, as the kubelet's `ParseThresholdConfig` refuses it.
    let typo = parse(&conf("evictionHard:\n  memory.availabe: 1Gi\n"), "k.yaml").unwrap();
    let e = build(&typo, &mut Vec::new()).unwrap_err().to_string();
    assert!(e.contains("memory.availabe") && e.contains("evictionHard in k.yaml"), "{e}");
}

/// Drop-ins as the kubelet applies them: every `*.conf` under `--config-dir`, depth-first in
/// lexical order, each JSON-merge-patched over what came before (maps key by key; `null`
/// deletes); other files skipped and said; without a main file they merge into the defaults.
#[test]
fn drop_ins_merge_in_the_kubelets_order() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("config.d");
    std::fs::create_dir_all(dir.join("20-sub")).unwrap();
    let main = d.path().join("config.yaml");
    std::fs::write(
        &main,
        conf("evictionHard:\n  memory.available: 500Mi\n  nodefs.available: 10%\n  nodefs.inodesFree: 5%\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("10-memory.conf"),
        conf("evictionHard:\n  memory.available: 1Gi\n  imagefs.available: 20%\n"),
    )
    .unwrap();
    // In 20-sub/, after 10-memory.conf and before 30-last.conf.
    std::fs::write(
        dir.join("20-sub/00-soft.conf"),
        conf("evictionSoft:\n  memory.available: 2Gi\nevictionSoftGracePeriod:\n  memory.available: 1m\nevictionHard:\n  memory.available: 3Gi\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("30-last.conf"),
        conf("evictionHard:\n  nodefs.available: null\n  imagefs.available: null\n  memory.available: 4Gi\n"),
    )
    .unwrap();
    std::fs::write(dir.join("99-ignored.yaml"), conf("evictionHard:\n  memory.available: 9Gi\n")).unwrap();
    let input = read_with_dropins(Some(&main), &dir).unwrap();
    assert_eq!(
        hard(&input),
        ["memory.available<4Gi", "nodefs.inodesFree<5%"],
        "the last drop-in wins per key; null deletes the main file's key and an earlier drop-in's"
    );
    let p = build(&input, &mut Vec::new()).unwrap();
    assert!(p.thresholds.iter().any(|t| !t.is_hard() && t.to_string() == "memory.available<2Gi"));
    assert!(input.soft.source.contains("00-soft.conf"), "{}", input.soft.source);
    assert!(
        input.notes.iter().any(|n| n.contains("99-ignored.yaml") && n.contains("skipped")),
        "{:?}",
        input.notes
    );
    assert!(input.origins["evictionHard[memory.available]"].ends_with("30-last.conf"));
    assert_eq!(input.origins["evictionHard[nodefs.inodesFree]"], main.display().to_string());
    assert!(input.origins["evictionSoftGracePeriod[memory.available]"].ends_with("00-soft.conf"));
    // No main file: a drop-in's map merges into the kubelet's defaults.
    let only = tempfile::tempdir().unwrap();
    std::fs::write(only.path().join("50-memory.conf"), conf("evictionHard:\n  memory.available: 500Mi\n"))
        .unwrap();
    let input = read_with_dropins(None, only.path()).unwrap();
    let mut want = DEFAULT_HARD.to_vec();
    want[0] = "memory.available<500Mi";
    assert_eq!(hard(&input), want);
    assert_eq!(input.origins["evictionHard[nodefs.available]"], "default");
}

/// The kubelet decodes the merged drop-ins with Go's `encoding/json`: a drop-in's field
/// name in another case is applied (the main file's strict decoding would drop it), a
/// field it does not know is ignored; both are said.
#[test]
fn a_drop_in_field_in_another_case_applies_and_an_unknown_one_is_ignored() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("10.conf"),
        conf("evictionhard:\n  memory.available: 1Gi\nevictionSoftt:\n  memory.available: 2Gi\n"),
    )
    .unwrap();
    let input = read_with_dropins(None, d.path()).unwrap();
    assert!(hard(&input).contains(&"memory.available<1Gi".to_owned()), "{:?}", hard(&input));
    assert!(input.soft.entries.is_empty());
    let notes = input.notes.join("\n");
    assert!(notes.contains("\"evictionSoftt\"") && notes.contains("did you mean evictionSoft?"), "{notes}");
    assert!(!notes.contains("\"evictionhard\""), "a field in another case is the field: {notes}");
}

/// The kubelet writes the main file out (`omitempty`) before merging drop-ins, and its
/// defaulting after the merge has no eviction default: an `evictionHard: {}` stays empty with
/// any `--config-dir`, and an `evictionHard` a drop-in deletes is no hard threshold at all.
#[test]
fn an_eviction_hard_left_empty_or_deleted_by_the_merge_is_no_threshold() {
    let d = tempfile::tempdir().unwrap();
    let main = d.path().join("config.yaml");
    std::fs::write(&main, conf("evictionHard: {}\n")).unwrap();
    assert!(hard(&read(&main).unwrap()).is_empty(), "without drop-ins: no hard threshold");
    let dir = d.path().join("empty.d");
    std::fs::create_dir(&dir).unwrap();
    assert!(hard(&read_with_dropins(Some(&main), &dir).unwrap()).is_empty());
    std::fs::write(&main, conf("evictionHard:\n  memory.available: 1Gi\n")).unwrap();
    std::fs::write(dir.join("10-none.conf"), conf("evictionHard: null\n")).unwrap();
    let input = read_with_dropins(Some(&main), &dir).unwrap();
    assert!(hard(&input).is_empty(), "{:?}", hard(&input));
    let mut warnings = Vec::new();
    build(&input, &mut warnings).unwrap();
    assert!(warnings.iter().any(|w| w.contains("no eviction threshold")), "said: {warnings:?}");
}

/// The kubelet parses YAML 1.1: an unquoted `yes` is true. A value that is no boolean is
/// refused, naming the field.
#[test]
fn booleans_are_yaml_1_1s() {
    let input = parse(
        &conf("mergeDefaultEvictionSettings: yes\nevictionHard:\n  memory.available: 500Mi\n"),
        "k.yaml",
    )
    .unwrap();
    assert_eq!(hard(&input).len(), 5, "merged with the defaults: {:?}", hard(&input));
    assert!(
        !parse(&conf("localStorageCapacityIsolation: off\n"), "k.yaml")
            .unwrap()
            .local_storage_capacity_isolation
    );
    let e = parse(&conf("mergeDefaultEvictionSettings: sometimes\n"), "k.yaml").unwrap_err().to_string();
    assert!(e.contains("k.yaml") && e.contains("mergeDefaultEvictionSettings"), "{e}");
}

/// A value of the wrong type names the field and the drop-in that set it; a drop-in
/// directory that is a symlink applies nothing (the kubelet's walk does not follow it); one
/// with too many entries is refused.
#[test]
fn drop_in_errors_name_the_drop_in_and_the_field() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("conf.d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("10-ok.conf"), conf("evictionMaxPodGracePeriod: 30\n")).unwrap();
    std::fs::write(dir.join("20-bad.conf"), conf("evictionSoft:\n  memory.available: [1]\n")).unwrap();
    let e = read_with_dropins(None, &dir).unwrap_err().to_string();
    assert!(e.contains("20-bad.conf") && e.contains("evictionSoft:"), "{e}");
    std::fs::remove_file(dir.join("20-bad.conf")).unwrap();
    let link = d.path().join("linked.d");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let input = read_with_dropins(None, &link).unwrap();
    assert_eq!(input.max_pod_grace_period_seconds, 0, "no drop-in applied through the symlink");
    assert!(input.notes.iter().any(|n| n.contains("symlink")), "{:?}", input.notes);
    assert_eq!(read_with_dropins(None, &dir).unwrap().max_pod_grace_period_seconds, 30);
    for n in 0..MAX_DROPIN_ENTRIES {
        std::fs::write(dir.join(format!("x{n}")), "").unwrap();
    }
    let e = read_with_dropins(None, &dir).unwrap_err().to_string();
    assert!(e.contains("more than 1000 entries"), "{e}");
}

/// A drop-in the kubelet refuses (empty, no or another apiVersion/kind, unreadable YAML)
/// is an error naming it.
#[test]
fn a_drop_in_the_kubelet_refuses_is_an_error() {
    for (text, says) in [
        ("", "empty"),
        ("evictionHard:\n  memory.available: 1Gi\n", "no apiVersion or kind"),
        ("apiVersion: v1\nkind: Pod\n", "\"Pod\""),
        ("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard: [1\n", ""),
    ] {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("60-bad.conf"), text).unwrap();
        let e = read_with_dropins(None, d.path()).unwrap_err().to_string();
        assert!(e.contains("60-bad.conf") && e.contains(says), "{text:?}: {e}");
    }
}

#[test]
fn errors_name_the_file_and_field() {
    let f = write(&conf("evictionHard:\n  memory.available: \"0\"\n"));
    let e = build(&read(f.path()).unwrap(), &mut Vec::new()).unwrap_err().to_string();
    assert!(e.contains("evictionHard in") && e.contains(&f.path().display().to_string()), "{e}");
    assert!(
        read(Path::new("/nonexistent/kubelet.yaml"))
            .unwrap_err()
            .to_string()
            .contains("/nonexistent/kubelet.yaml")
    );
}

#[test]
fn one_edit_apart_is_one_edit() {
    for (a, b) in [
        ("evictionHard", "evictonHard"),
        ("evictionHard", "evictionHards"),
        ("evictionHard", "evictoinHard"),
        ("evictionHard", "evictionHarb"),
    ] {
        assert!(one_edit_apart(a, b), "{a} {b}");
    }
    for (a, b) in
        [("evictionHard", "evictionSoft"), ("evictionHard", "evicHard"), ("address", "evictionHard")]
    {
        assert!(!one_edit_apart(a, b), "{a} {b}");
    }
}
