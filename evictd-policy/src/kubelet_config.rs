//! The eviction fields of a KubeletConfiguration as the node's kubelet assembles it: the
//! main file (`--config`, e.g. /var/lib/kubelet/config.yaml), then the drop-in directory
//! (`--config-dir`: EKS's nodeadm writes `config.json.d/`, RKE2 `kubelet.conf.d/`), then the
//! flags (in `flags`). Other fields are ignored; a file of another kind, or a field of the
//! wrong type, is an error that names the file.
//!
//! The kubelet's rules (`cmd/kubelet/app/server.go`): the main file's `evictionHard`, when
//! absent, is the default map, and when present replaces it — unless the file sets
//! `mergeDefaultEvictionSettings: true`, which adds each default signal it leaves out. Each
//! `*.conf` file under the drop-in directory (walked depth-first, in lexical order) is then
//! merged over the configuration so far: maps merge key by key (a drop-in's `evictionHard:
//! {memory.available: 500Mi}` keeps the other signals), anything else replaces, and `null`
//! changes nothing (see `merge_patch`).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::Deserialize;
use serde_json::Value;

use crate::policy::{DEFAULT_EVICTION_HARD, MapSetting, PolicyInput};

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KubeletConfiguration {
    eviction_hard: Option<BTreeMap<String, String>>,
    eviction_soft: Option<BTreeMap<String, String>>,
    eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    eviction_pressure_transition_period: Option<String>,
    eviction_max_pod_grace_period: Option<i64>,
    enforce_node_allocatable: Option<Vec<String>>,
    local_storage_capacity_isolation: Option<bool>,
    #[serde(rename = "imageMinimumGCAge")]
    image_minimum_gc_age: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{path}: {reason}")]
    Parse { path: String, reason: String },
}

/// The policy inputs the file sets; fields it does not set keep the kubelet's defaults.
pub fn read(path: &Path) -> Result<PolicyInput, ConfigError> {
    let p = path.display().to_string();
    parse(&read_text(path)?, &p)
}

fn read_text(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path)
        .map_err(|error| ConfigError::Read { path: path.display().to_string(), error })
}

/// `read` without the file: the text of a KubeletConfiguration, named `p` in errors.
pub fn parse(text: &str, p: &str) -> Result<PolicyInput, ConfigError> {
    let mut doc = document(text, p)?;
    // An absent map stays absent: the policy's own default, said as such.
    main_file_eviction_defaults(&mut doc, false);
    input_of(doc, p)
}

/// The policy inputs of the configuration the kubelet assembles from its main file (`None`:
/// the kubelet's defaults) and the `*.conf` files of its drop-in directory.
pub fn read_with_dropins(main: Option<&Path>, dropin_dir: &Path) -> Result<PolicyInput, ConfigError> {
    let mut doc = match main {
        Some(path) => document(&read_text(path)?, &path.display().to_string())?,
        None => Value::Object(Default::default()),
    };
    // The defaults are in the map before the drop-ins merge into it, key by key.
    main_file_eviction_defaults(&mut doc, true);
    let mut sources =
        vec![main.map_or_else(|| "the kubelet's defaults".to_owned(), |m| m.display().to_string())];
    for file in dropin_files(dropin_dir)? {
        let name = file.display().to_string();
        merge_patch(&mut doc, &document(&read_text(&file)?, &name)?);
        sources.push(name);
    }
    input_of(doc, &sources.join(" + "))
}

/// The files the kubelet applies from its drop-in directory, in its order: every `*.conf`
/// at any depth, depth-first, each directory's entries in lexical order (Go's WalkDir).
fn dropin_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let read_error = |error| ConfigError::Read { path: dir.display().to_string(), error };
    let mut entries: Vec<std::fs::DirEntry> =
        std::fs::read_dir(dir).map_err(read_error)?.collect::<Result<_, _>>().map_err(read_error)?;
    entries.sort_by_key(|e| e.file_name());
    let mut files = Vec::new();
    for e in entries {
        let path = e.path();
        // Go's WalkDir does not follow a symlink to a directory.
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            files.extend(dropin_files(&path)?);
        } else if path.extension().is_some_and(|x| x == "conf") {
            files.push(path);
        }
    }
    Ok(files)
}

/// A KubeletConfiguration document (YAML or JSON) as JSON; another kind is an error.
fn document(text: &str, p: &str) -> Result<Value, ConfigError> {
    let parse_error = |reason: String| ConfigError::Parse { path: p.to_owned(), reason };
    let doc: Value = serde_yaml_ng::from_str(text).map_err(|e| parse_error(e.to_string()))?;
    let doc = match doc {
        Value::Null => Value::Object(Default::default()),
        Value::Object(_) => doc,
        _ => return Err(parse_error("not a KubeletConfiguration object".into())),
    };
    match doc.get("kind").and_then(Value::as_str) {
        Some(kind) if kind != "KubeletConfiguration" => {
            Err(parse_error(format!("kind is {kind:?}, not KubeletConfiguration")))
        }
        _ => Ok(doc),
    }
}

/// The kubelet's `loadConfigFile`: the main file's `evictionHard` absent is the default
/// map (written in when `absent_too`); present, it replaces it, unless
/// `mergeDefaultEvictionSettings: true` adds each default signal it leaves out.
fn main_file_eviction_defaults(doc: &mut Value, absent_too: bool) {
    let defaults: serde_json::Map<String, Value> = DEFAULT_EVICTION_HARD
        .split(',')
        .filter_map(|kv| kv.split_once('<'))
        .map(|(k, v)| (k.to_owned(), Value::String(v.to_owned())))
        .collect();
    let merge = doc.get("mergeDefaultEvictionSettings").and_then(Value::as_bool) == Some(true);
    let Some(obj) = doc.as_object_mut() else { return };
    match obj.get_mut("evictionHard") {
        None | Some(Value::Null) if absent_too => {
            drop(obj.insert("evictionHard".into(), Value::Object(defaults)))
        }
        None | Some(Value::Null) => {}
        Some(Value::Object(hard)) if merge => {
            for (k, v) in defaults {
                hard.entry(k).or_insert(v);
            }
        }
        Some(_) => {}
    }
}

/// A drop-in over the configuration so far, as the kubelet's merge ends: objects merge key
/// by key, anything else replaces, and `null` changes nothing. (The kubelet merge-patches the
/// JSON of its internal type, whose keys are Go field names — `EvictionHard` — with the
/// drop-in's `evictionHard`; the two never meet, and the drop-in's values are then decoded
/// into the filled map, which a `null` leaves as it was.)
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        if !patch.is_null() {
            *target = patch.clone();
        }
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    if let Value::Object(t) = target {
        for (k, v) in p.iter().filter(|(_, v)| !v.is_null()) {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// The policy inputs of an assembled configuration; `p` names where it came from.
fn input_of(doc: Value, p: &str) -> Result<PolicyInput, ConfigError> {
    let p = p.to_owned();
    let cfg: KubeletConfiguration = serde_json::from_value(doc)
        .map_err(|e| ConfigError::Parse { path: p.clone(), reason: e.to_string() })?;
    let map = |field: &str, m: Option<BTreeMap<String, String>>| MapSetting {
        source: format!("{field} in {p}"),
        entries: m.unwrap_or_default().into_iter().collect(),
    };
    Ok(PolicyInput {
        hard: cfg.eviction_hard.map(|m| map("evictionHard", Some(m))),
        soft: map("evictionSoft", cfg.eviction_soft),
        soft_grace: map("evictionSoftGracePeriod", cfg.eviction_soft_grace_period),
        min_reclaim: map("evictionMinimumReclaim", cfg.eviction_minimum_reclaim),
        max_pod_grace_period_seconds: cfg.eviction_max_pod_grace_period.unwrap_or(0),
        pressure_transition_period: cfg
            .eviction_pressure_transition_period
            .map(|d| (format!("evictionPressureTransitionPeriod in {p}"), d)),
        enforce_node_allocatable: cfg
            .enforce_node_allocatable
            .map(|l| (format!("enforceNodeAllocatable in {p}"), l)),
        local_storage_capacity_isolation: cfg.local_storage_capacity_isolation.unwrap_or(true),
        image_minimum_gc_age: cfg.image_minimum_gc_age.map(|d| (format!("imageMinimumGCAge in {p}"), d)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::build;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn reads_the_eviction_fields_of_a_real_looking_file() {
        let f = write(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\n\
             evictionHard:\n  memory.available: 200Mi\n  nodefs.available: \"5%\"\n\
             evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 1m30s\n\
             evictionMinimumReclaim:\n  memory.available: 100Mi\nevictionPressureTransitionPeriod: 30s\n\
             evictionMaxPodGracePeriod: 60\nenforceNodeAllocatable: [pods]\n",
        );
        let input = read(f.path()).unwrap();
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
            parse(text, "k.yaml").map(|i| build(&i, &mut Vec::new()).map(|p| p.image_minimum_gc_age_ns))
        };
        assert_eq!(age("kind: KubeletConfiguration\n").unwrap().unwrap(), 120_000_000_000);
        assert_eq!(age("imageMinimumGCAge: 5m\n").unwrap().unwrap(), 300_000_000_000);
        let e = age("imageMinimumGCAge: -1s\n").unwrap().unwrap_err().to_string();
        assert!(e.contains("imageMinimumGCAge in k.yaml"), "{e}");
    }

    #[test]
    fn an_empty_file_means_kubelet_defaults() {
        let f = write("kind: KubeletConfiguration\n");
        let p = build(&read(f.path()).unwrap(), &mut Vec::new()).unwrap();
        assert_eq!(p.thresholds.len(), 6, "the 5 defaults and the allocatable copy");
    }

    fn hard(input: &PolicyInput) -> Vec<String> {
        let p = build(input, &mut Vec::new()).unwrap();
        p.thresholds
            .iter()
            .filter(|t| t.is_hard() && !t.signal.to_string().starts_with("allocatable"))
            .map(|t| t.to_string())
            .collect()
    }

    /// A main file's `evictionHard` replaces the defaults (a node that lists only memory
    /// loses its disk thresholds), unless `mergeDefaultEvictionSettings: true`: then each
    /// signal it leaves out keeps its default, and the ones it sets win.
    #[test]
    fn merge_default_eviction_settings_keeps_the_defaults_a_file_leaves_out() {
        let replaced = parse("evictionHard:\n  memory.available: 500Mi\n", "k.yaml").unwrap();
        assert_eq!(hard(&replaced), ["memory.available<500Mi"]);
        let merged =
            parse("mergeDefaultEvictionSettings: true\nevictionHard:\n  memory.available: 500Mi\n", "k.yaml")
                .unwrap();
        assert_eq!(
            hard(&merged),
            [
                "memory.available<500Mi",
                "nodefs.available<10%",
                "nodefs.inodesFree<5%",
                "imagefs.available<15%",
                "imagefs.inodesFree<5%"
            ]
        );
    }

    /// Drop-ins as the kubelet applies them: every `*.conf` under `--config-dir`, depth-first
    /// in lexical order, each merged over what came before (maps key by key; `null` changes
    /// nothing); other files ignored; without a main file they merge into the defaults.
    #[test]
    fn drop_ins_merge_in_the_kubelets_order() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("config.d");
        std::fs::create_dir_all(dir.join("20-sub")).unwrap();
        let main = d.path().join("config.yaml");
        std::fs::write(
            &main,
            "kind: KubeletConfiguration\nevictionHard:\n  memory.available: 500Mi\n  nodefs.available: 10%\n",
        )
        .unwrap();
        let conf = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
        std::fs::write(dir.join("10-memory.conf"), format!("{conf}evictionHard:\n  memory.available: 1Gi\n"))
            .unwrap();
        // In 20-sub/, after 10-memory.conf and before 30-last.conf.
        std::fs::write(dir.join("20-sub/00-soft.conf"), format!("{conf}evictionSoft:\n  memory.available: 2Gi\nevictionSoftGracePeriod:\n  memory.available: 1m\nevictionHard:\n  memory.available: 3Gi\n")).unwrap();
        std::fs::write(
            dir.join("30-last.conf"),
            format!("{conf}evictionHard:\n  nodefs.available: null\n  memory.available: 4Gi\n"),
        )
        .unwrap();
        std::fs::write(
            dir.join("99-ignored.yaml"),
            format!("{conf}evictionHard:\n  memory.available: 9Gi\n"),
        )
        .unwrap();
        let input = read_with_dropins(Some(&main), &dir).unwrap();
        assert_eq!(
            hard(&input),
            ["memory.available<4Gi", "nodefs.available<10%"],
            "the last drop-in wins per key; null changes nothing, as in the kubelet"
        );
        let p = build(&input, &mut Vec::new()).unwrap();
        assert!(p.thresholds.iter().any(|t| !t.is_hard() && t.to_string() == "memory.available<2Gi"));
        assert!(input.soft.source.contains("00-soft.conf"), "{}", input.soft.source);
        // No main file: a drop-in's map merges into the kubelet's defaults.
        let only = tempfile::tempdir().unwrap();
        std::fs::write(
            only.path().join("50-memory.conf"),
            format!("{conf}evictionHard:\n  memory.available: 500Mi\n"),
        )
        .unwrap();
        let input = read_with_dropins(None, only.path()).unwrap();
        assert_eq!(hard(&input).len(), 5, "the defaults kept: {:?}", hard(&input));
        assert!(hard(&input).contains(&"memory.available<500Mi".to_owned()));
        // A drop-in of another kind names the file.
        std::fs::write(only.path().join("60-pod.conf"), "kind: Pod\n").unwrap();
        let e = read_with_dropins(None, only.path()).unwrap_err().to_string();
        assert!(e.contains("60-pod.conf") && e.contains("not KubeletConfiguration"), "{e}");
    }

    #[test]
    fn errors_name_the_file_and_field() {
        let f = write("kind: KubeletConfiguration\nevictionHard:\n  memory.available: \"0\"\n");
        let e = build(&read(f.path()).unwrap(), &mut Vec::new()).unwrap_err().to_string();
        assert!(e.contains("evictionHard in") && e.contains(&f.path().display().to_string()), "{e}");
        let f = write("kind: Pod\n");
        assert!(read(f.path()).unwrap_err().to_string().contains("not KubeletConfiguration"));
        let f = write("evictionHard: [1, 2\n");
        assert!(read(f.path()).unwrap_err().to_string().contains(&f.path().display().to_string()));
        assert!(
            read(Path::new("/nonexistent/kubelet.yaml"))
                .unwrap_err()
                .to_string()
                .contains("/nonexistent/kubelet.yaml")
        );
        let f = write("evictionMaxPodGracePeriod: soon\n");
        assert!(read(f.path()).is_err());
    }
}
