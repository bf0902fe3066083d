//! The eviction fields of a KubeletConfiguration file (the YAML or JSON a node already has,
//! e.g. /var/lib/kubelet/config.yaml). Other fields are ignored; a file of another kind, or
//! a field of the wrong type, is an error that names the file.

use std::{collections::BTreeMap, path::Path};

use serde::Deserialize;

use crate::policy::{MapSetting, PolicyInput};

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KubeletConfiguration {
    kind: Option<String>,
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
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read { path: p.clone(), error })?;
    parse(&text, &p)
}

/// `read` without the file: the text of a KubeletConfiguration, named `p` in errors.
pub fn parse(text: &str, p: &str) -> Result<PolicyInput, ConfigError> {
    let p = p.to_owned();
    let cfg: KubeletConfiguration = serde_yaml_ng::from_str(text)
        .map_err(|e| ConfigError::Parse { path: p.clone(), reason: e.to_string() })?;
    if let Some(kind) = &cfg.kind
        && kind != "KubeletConfiguration"
    {
        return Err(ConfigError::Parse {
            path: p,
            reason: format!("kind is {kind:?}, not KubeletConfiguration"),
        });
    }
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
        assert_eq!(p.thresholds.len(), 5);
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
