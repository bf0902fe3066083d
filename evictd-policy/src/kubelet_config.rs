//! The eviction fields of a KubeletConfiguration as the node's kubelet assembles it: the
//! main file (`--config`, e.g. /var/lib/kubelet/config.yaml), then the drop-in directory
//! (`--config-dir`: EKS's nodeadm writes `config.json.d/`, RKE2 `kubelet.conf.d/`), then the
//! flags (in `flags`). Each step answers as the kubelet does (`cmd/kubelet/app/server.go`):
//!
//! - The main file (`loadConfigFile`) must not be empty and must say `apiVersion:
//!   kubelet.config.k8s.io/v1beta1` and `kind: KubeletConfiguration`. A field the kubelet does
//!   not know, or spells in another case, fails its strict decoding and is dropped by the
//!   lenient one it falls back to: a warning here. A value of the wrong type is an error.
//!   `evictionHard` absent is the default map; present, it replaces it, unless
//!   `mergeDefaultEvictionSettings: true` adds each default signal it leaves out.
//! - The drop-ins (`mergeKubeletConfigurations`): every `*.conf` under the directory, walked
//!   depth-first in lexical order (other files are skipped, and said), each the same
//!   apiVersion and kind, is JSON-merge-patched (RFC 7386) over the main file as the kubelet
//!   writes it out: maps merge key by key and `null` deletes. The result is decoded by Go's
//!   `encoding/json`, which matches field names in any case and ignores unknown ones, and
//!   defaulted again: an `evictionHard` left empty or deleted is the default map again.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde_json::{Map, Value};

use crate::policy::{DEFAULT_EVICTION_HARD, MapSetting, PolicyInput};

mod fields;
#[cfg(test)]
mod tests;

/// At most this many files and directories are looked at below a drop-in directory: a
/// `--config-dir` that names `/` by mistake is an error, not a walk of the node.
const MAX_DROPIN_ENTRIES: usize = 1000;
/// The boolean fields evictd reads, which YAML 1.1 (the kubelet's parser) also spells
/// `yes`/`no`/`on`/`off`.
const BOOLS: [&str; 2] = ["mergeDefaultEvictionSettings", "localStorageCapacityIsolation"];

const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
const KIND: &str = "KubeletConfiguration";

/// The fields evictd reads, in their v1beta1 spelling.
const MAPS: [&str; 4] = ["evictionHard", "evictionSoft", "evictionSoftGracePeriod", "evictionMinimumReclaim"];
const SCALARS: [&str; 5] = [
    "evictionPressureTransitionPeriod",
    "evictionMaxPodGracePeriod",
    "enforceNodeAllocatable",
    "localStorageCapacityIsolation",
    "imageMinimumGCAge",
];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{path}: {reason}")]
    Parse { path: String, reason: String },
}

/// One layer of the configuration (the defaults, the main file, a drop-in, a flag) and its
/// eviction fields as it set them, to say where each value of the result came from.
struct Layer {
    origin: String,
    doc: Map<String, Value>,
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
    let mut notes = Vec::new();
    let (doc, layers) = main_file(text, p, &mut notes)?;
    input_of(doc, p, layers, notes)
}

/// The policy inputs of the configuration the kubelet assembles from its main file (`None`:
/// the kubelet's defaults) and the `*.conf` files of its drop-in directory.
pub fn read_with_dropins(main: Option<&Path>, dropin_dir: &Path) -> Result<PolicyInput, ConfigError> {
    let mut notes = Vec::new();
    let (base, mut layers) = match main {
        Some(path) => main_file(&read_text(path)?, &path.display().to_string(), &mut notes)?,
        None => (defaulted(Map::new()), vec![defaults_layer()]),
    };
    let mut merged = written_out(base);
    let mut sources =
        vec![main.map_or_else(|| "the kubelet's defaults".to_owned(), |m| m.display().to_string())];
    let mut budget = MAX_DROPIN_ENTRIES;
    for file in dropin_files(dropin_dir, &mut notes, &mut budget)? {
        let name = file.display().to_string();
        let doc = dropin(&read_text(&file)?, &name)?;
        // Said per drop-in here; the merged document adds only fields already said.
        layers.push(Layer { origin: name.clone(), doc: decoded(&doc, &name, &mut notes) });
        merge_patch(&mut merged, &doc);
        sources.push(name);
    }
    let mut doc = decoded(&merged, "", &mut Vec::new());
    // An `evictionHard` the merge left out (empty, or deleted by a drop-in) is no hard
    // threshold: the kubelet's defaulting after the merge has no eviction default.
    doc.entry("evictionHard").or_insert_with(|| Value::Object(Map::new()));
    input_of(doc, &sources.join(" + "), layers, notes)
}

/// The main file as the kubelet's `loadConfigFile` reads it: its eviction fields (the
/// default `evictionHard` in), and the layers they came from.
fn main_file(
    text: &str,
    p: &str,
    notes: &mut Vec<String>,
) -> Result<(Map<String, Value>, Vec<Layer>), ConfigError> {
    if text.is_empty() {
        return Err(parse_error(p, "the file is empty (the kubelet refuses an empty config file)"));
    }
    let mut doc = object(text, p)?;
    require_type(&doc, p, "")?;
    doc.retain(|k, _| {
        let known = fields::FIELDS.contains(&k.as_str());
        if !known {
            notes.push(unknown_field(p, k, "its strict decoding fails and the lenient one drops it"));
        }
        known
    });
    let set = doc.clone();
    main_file_eviction_defaults(&mut doc);
    Ok((doc, vec![defaults_layer(), Layer { origin: p.to_owned(), doc: set }]))
}

fn defaults_layer() -> Layer {
    Layer { origin: "default".into(), doc: defaulted(Map::new()) }
}

/// The kubelet's `DefaultEvictionHard` as a JSON map.
fn default_eviction_hard() -> Map<String, Value> {
    DEFAULT_EVICTION_HARD
        .split(',')
        .filter_map(|kv| kv.split_once('<'))
        .map(|(k, v)| (k.to_owned(), Value::String(v.to_owned())))
        .collect()
}

/// `SetDefaults_KubeletConfiguration` for `evictionHard`: absent (or null) is the default map.
fn defaulted(mut doc: Map<String, Value>) -> Map<String, Value> {
    if doc.get("evictionHard").is_none_or(Value::is_null) {
        doc.insert("evictionHard".into(), Value::Object(default_eviction_hard()));
    }
    doc
}

/// The kubelet's `loadConfigFile`: the main file's `evictionHard` absent is the default map;
/// present, it replaces it, unless `mergeDefaultEvictionSettings: true` adds each default
/// signal it leaves out.
fn main_file_eviction_defaults(doc: &mut Map<String, Value>) {
    let merge = doc.get("mergeDefaultEvictionSettings").and_then(Value::as_bool) == Some(true);
    match doc.get_mut("evictionHard") {
        None | Some(Value::Null) => *doc = defaulted(std::mem::take(doc)),
        Some(Value::Object(hard)) if merge => {
            for (k, v) in default_eviction_hard() {
                hard.entry(k).or_insert(v);
            }
        }
        Some(_) => {}
    }
}

/// The configuration as the kubelet writes it out before merging drop-ins (`json.Marshal` of
/// v1beta1, whose fields are `omitempty`): nulls, empty maps and empty lists are left out —
/// so an `evictionHard: {}` of the main file is the default map again once drop-ins apply.
fn written_out(mut doc: Map<String, Value>) -> Map<String, Value> {
    doc.retain(|_, v| match v {
        Value::Null => false,
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => true,
    });
    doc
}

/// A drop-in as `loadDropinConfigFileIntoJSON` reads it: not empty, the same apiVersion and
/// kind as the main file (no other check: its fields are checked only when decoded).
fn dropin(text: &str, p: &str) -> Result<Map<String, Value>, ConfigError> {
    if text.is_empty() {
        return Err(parse_error(p, "the file is empty (the kubelet refuses an empty drop-in)"));
    }
    let doc = object(text, p)?;
    require_type(&doc, p, "drop-in ")?;
    Ok(doc)
}

/// The files the kubelet applies from its drop-in directory, in its order: every `*.conf`
/// at any depth, depth-first, each directory's entries in lexical order (Go's WalkDir, which
/// does not follow a symlink to a directory). The files it skips are said.
fn dropin_files(
    dir: &Path,
    notes: &mut Vec<String>,
    budget: &mut usize,
) -> Result<Vec<PathBuf>, ConfigError> {
    let read_error = |error| ConfigError::Read { path: dir.display().to_string(), error };
    if std::fs::symlink_metadata(dir).map_err(read_error)?.file_type().is_symlink() {
        notes.push(format!(
            "{}: a symlink, which the kubelet's walk does not follow: no drop-in applies",
            dir.display()
        ));
        return Ok(Vec::new());
    }
    let mut entries: Vec<std::fs::DirEntry> =
        std::fs::read_dir(dir).map_err(read_error)?.collect::<Result<_, _>>().map_err(read_error)?;
    *budget = budget.checked_sub(entries.len()).ok_or_else(|| {
        parse_error(
            &dir.display().to_string(),
            format!("more than {MAX_DROPIN_ENTRIES} entries below the drop-in directory: is it the kubelet's --config-dir?"),
        )
    })?;
    entries.sort_by_key(|e| e.file_name());
    let mut files = Vec::new();
    for e in entries {
        let path = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            files.extend(dropin_files(&path, notes, budget)?);
        } else if path.extension().is_some_and(|x| x == "conf") {
            files.push(path);
        } else {
            notes
                .push(format!("{}: skipped, as the kubelet skips it: drop-ins end in .conf", path.display()));
        }
    }
    Ok(files)
}

fn parse_error(p: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Parse { path: p.to_owned(), reason: reason.into() }
}

/// A YAML or JSON document that is an object.
fn object(text: &str, p: &str) -> Result<Map<String, Value>, ConfigError> {
    let Value::Object(mut doc) = serde_yaml_ng::from_str(text).map_err(|e| parse_error(p, e.to_string()))?
    else {
        return Err(parse_error(p, "not a KubeletConfiguration object"));
    };
    for field in BOOLS {
        if let Some(v) = doc.get_mut(field) {
            match yaml11_bool(v) {
                Some(b) => *v = Value::Bool(b),
                None if v.is_null() => {}
                None => return Err(parse_error(p, format!("{field}: {v} is not a boolean"))),
            }
        }
    }
    Ok(doc)
}

/// A YAML 1.1 boolean, as the kubelet's YAML parser reads one (`serde_yaml_ng` is YAML 1.2:
/// an unquoted `yes` reaches here as a string).
fn yaml11_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) => match s.as_str() {
            "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => Some(true),
            "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
                Some(false)
            }
            _ => None,
        },
        _ => None,
    }
}

/// `apiVersion: kubelet.config.k8s.io/v1beta1` and `kind: KubeletConfiguration`, the only
/// type the kubelet decodes a config file (or drop-in) into.
fn require_type(doc: &Map<String, Value>, p: &str, what: &str) -> Result<(), ConfigError> {
    let field = |k: &str| doc.get(k).and_then(Value::as_str).unwrap_or("");
    match (field("apiVersion"), field("kind")) {
        (API_VERSION, KIND) => Ok(()),
        ("", _) | (_, "") => Err(parse_error(
            p,
            format!(
                "no apiVersion or kind: the kubelet refuses a {what}config file without `apiVersion: {API_VERSION}` and `kind: {KIND}`"
            ),
        )),
        (v, k) => Err(parse_error(
            p,
            format!(
                "apiVersion {v:?}, kind {k:?}: the kubelet reads only apiVersion {API_VERSION}, kind {KIND}"
            ),
        )),
    }
}

/// A field the kubelet does not know, with the one it may have meant.
fn unknown_field(p: &str, k: &str, what_the_kubelet_does: &str) -> String {
    let meant = fields::FIELDS.iter().find(|f| f.eq_ignore_ascii_case(k) || one_edit_apart(f, k));
    let hint = meant.map(|f| format!(" (did you mean {f}?)")).unwrap_or_default();
    format!(
        "{p}: {k:?} is not a KubeletConfiguration field; the kubelet ignores it: {what_the_kubelet_does}{hint}"
    )
}

/// Within one insertion, deletion, substitution or swap of neighbours.
fn one_edit_apart(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..].iter().rev().zip(b[prefix..].iter().rev()).take_while(|(x, y)| x == y).count();
    let (ra, rb) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
    match (ra.len(), rb.len()) {
        (0, 1) | (1, 0) | (1, 1) => true,
        (2, 2) => ra[0] == rb[1] && ra[1] == rb[0],
        _ => false,
    }
}

/// A merged document as Go's `encoding/json` decodes it into the v1beta1 type: each key
/// matches the field it equals in any case (keys in byte order, as `json.Marshal` wrote
/// them: a map merges into the one before, anything else replaces), and a key matching no
/// field is ignored (said here).
fn decoded(merged: &Map<String, Value>, p: &str, notes: &mut Vec<String>) -> Map<String, Value> {
    let mut keys: Vec<&String> = merged.keys().collect();
    keys.sort();
    let mut doc = Map::new();
    for k in keys {
        let Some(field) = fields::FIELDS.iter().find(|f| f.eq_ignore_ascii_case(k)) else {
            notes.push(unknown_field(p, k, "its drop-ins are decoded without a check"));
            continue;
        };
        match (doc.get_mut(*field), &merged[k]) {
            (Some(Value::Object(into)), Value::Object(from)) => {
                into.extend(from.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            (_, v) => drop(doc.insert((*field).to_owned(), v.clone())),
        }
    }
    doc
}

/// RFC 7386 JSON merge patch, as the kubelet applies a drop-in (`jsonpatch.MergePatch`):
/// objects merge key by key, `null` deletes, anything else replaces.
fn merge_patch(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (k, v) in patch {
        match v {
            Value::Null => drop(target.remove(k)),
            Value::Object(p) => {
                let t = target.entry(k.clone()).or_insert_with(|| Value::Object(Map::new()));
                if !t.is_object() {
                    *t = Value::Object(Map::new());
                }
                if let Value::Object(t) = t {
                    merge_patch(t, p);
                }
            }
            v => drop(target.insert(k.clone(), v.clone())),
        }
    }
}

/// Where each eviction value of `doc` came from: the last layer that set it to that value.
fn origins_of(doc: &Map<String, Value>, layers: &[Layer]) -> BTreeMap<String, String> {
    let from = |get: &dyn Fn(&Map<String, Value>) -> Option<Value>, value: &Value| {
        let layer = layers.iter().rev().find(|l| get(&l.doc).as_ref() == Some(value));
        layer.map_or_else(|| "default".to_owned(), |l| l.origin.clone())
    };
    let mut origins = BTreeMap::new();
    for field in MAPS {
        for (k, v) in doc.get(field).and_then(Value::as_object).into_iter().flatten() {
            let get = |d: &Map<String, Value>| d.get(field).and_then(|m| m.get(k)).cloned();
            origins.insert(format!("{field}[{k}]"), from(&get, v));
        }
    }
    for field in SCALARS {
        if let Some(v) = doc.get(field) {
            origins.insert(field.to_owned(), from(&|d: &Map<String, Value>| d.get(field).cloned(), v));
        }
    }
    origins
}

/// One field of an assembled configuration, decoded; a value of the wrong type is an error
/// naming the field and the file (or drop-in) that set it last.
fn field<T: serde::de::DeserializeOwned>(
    doc: &Map<String, Value>,
    name: &str,
    p: &str,
    layers: &[Layer],
) -> Result<Option<T>, ConfigError> {
    match doc.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone()).map(Some).map_err(|e| {
            let set_by =
                layers.iter().rev().find(|l| l.doc.contains_key(name)).map_or(p, |l| l.origin.as_str());
            parse_error(set_by, format!("{name}: {e}"))
        }),
    }
}

/// The policy inputs of an assembled configuration; `p` names where it came from.
fn input_of(
    doc: Map<String, Value>,
    p: &str,
    layers: Vec<Layer>,
    notes: Vec<String>,
) -> Result<PolicyInput, ConfigError> {
    let origins = origins_of(&doc, &layers);
    let map = |name: &str| -> Result<Option<MapSetting>, ConfigError> {
        let m: Option<BTreeMap<String, String>> = field(&doc, name, p, &layers)?;
        Ok(m.map(|m| MapSetting { source: format!("{name} in {p}"), entries: m.into_iter().collect() }))
    };
    let named = |name: &str, v: Option<String>| v.map(|v| (format!("{name} in {p}"), v));
    let empty = |name: &str| MapSetting { source: format!("{name} in {p}"), entries: Vec::new() };
    Ok(PolicyInput {
        hard: map("evictionHard")?,
        soft: map("evictionSoft")?.unwrap_or_else(|| empty("evictionSoft")),
        soft_grace: map("evictionSoftGracePeriod")?.unwrap_or_else(|| empty("evictionSoftGracePeriod")),
        min_reclaim: map("evictionMinimumReclaim")?.unwrap_or_else(|| empty("evictionMinimumReclaim")),
        max_pod_grace_period_seconds: field(&doc, "evictionMaxPodGracePeriod", p, &layers)?.unwrap_or(0),
        pressure_transition_period: named(
            "evictionPressureTransitionPeriod",
            field(&doc, "evictionPressureTransitionPeriod", p, &layers)?,
        ),
        enforce_node_allocatable: field::<Vec<String>>(&doc, "enforceNodeAllocatable", p, &layers)?
            .map(|l| (format!("enforceNodeAllocatable in {p}"), l)),
        local_storage_capacity_isolation: field(&doc, "localStorageCapacityIsolation", p, &layers)?
            .unwrap_or(true),
        image_minimum_gc_age: named("imageMinimumGCAge", field(&doc, "imageMinimumGCAge", p, &layers)?),
        origins,
        notes,
    })
}
