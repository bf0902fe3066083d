//! The kubelet's eviction flags, spelled as the kubelet spells them, and `--config` for a
//! KubeletConfiguration file whose eviction fields they override one by one. Shared by the
//! daemon and the offline commands, so both read a policy the same way.

use std::path::PathBuf;

use clap::Args;

use crate::{
    kubelet_config::{self, ConfigError},
    podspec::AnnotationTrust,
    policy::{self, MapSetting, Policy, PolicyError, PolicyInput},
};

#[derive(Args, Debug, Default, Clone)]
pub struct PolicyArgs {
    /// A KubeletConfiguration file (YAML or JSON) to read the eviction fields from.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The kubelet's drop-in directory (its `--config-dir`): every `*.conf` in it is merged
    /// over `--config` in lexical order, as the kubelet merges them.
    #[arg(long, value_name = "DIR")]
    pub config_dir: Option<PathBuf>,
    /// Hard eviction thresholds, e.g. `memory.available<100Mi,nodefs.available<10%`.
    /// Omitted: the kubelet's Linux defaults. Empty (`--eviction-hard=`): none.
    #[arg(long, value_name = "LIST")]
    pub eviction_hard: Option<String>,
    /// Soft eviction thresholds, same syntax; each needs a grace period.
    #[arg(long, value_name = "LIST")]
    pub eviction_soft: Option<String>,
    /// Grace periods of the soft thresholds, e.g. `memory.available=1m30s`.
    #[arg(long, value_name = "LIST")]
    pub eviction_soft_grace_period: Option<String>,
    /// Minimum reclaim per signal, e.g. `memory.available=500Mi,nodefs.available=1%`.
    #[arg(long, value_name = "LIST")]
    pub eviction_minimum_reclaim: Option<String>,
    /// Upper bound on the grace period given to pods evicted for a soft threshold (0: the
    /// pod's own).
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub eviction_max_pod_grace_period: Option<i64>,
    /// How long a pressure condition stays after its threshold stops being met.
    #[arg(long, value_name = "DURATION")]
    pub eviction_pressure_transition_period: Option<String>,
    /// Which node-allocatable levels are enforced (`pods` makes allocatableMemory copies of
    /// the hard memory thresholds).
    #[arg(long, value_name = "LIST")]
    pub enforce_node_allocatable: Option<String>,
    /// Evict pods over their own ephemeral-storage limits (emptyDir `sizeLimit`, container
    /// and pod limits), as the kubelet's `localStorageCapacityIsolation`. Default: true.
    #[arg(long, value_name = "BOOL")]
    pub local_storage_capacity_isolation: Option<bool>,
    /// Node-level reclaim removes no image the node has had for less than this (the
    /// kubelet's `imageMinimumGCAge`, a Go duration). Default: 2m.
    #[arg(long, value_name = "DURATION")]
    pub image_minimum_gc_age: Option<String>,
    /// Namespaces whose pods' own `evictd.io/eviction` and `evictd.io/eviction-order`
    /// annotations count (comma-separated; default: none). Elsewhere they are ignored, as
    /// the kubelet ignores them: PriorityClass orders pods.
    #[arg(long, value_name = "NAMESPACES", default_value = "")]
    pub annotation_namespaces: String,
}

/// A policy that cannot be read or is not valid.
#[derive(Debug, thiserror::Error)]
pub enum FlagsError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

impl PolicyArgs {
    /// The namespaces whose pods' evictd annotations count.
    pub fn annotation_trust(&self) -> AnnotationTrust {
        AnnotationTrust::from_list(&self.annotation_namespaces)
    }

    /// The policy inputs: the config file's fields, each replaced by its flag when given.
    pub fn input(&self) -> Result<PolicyInput, FlagsError> {
        let mut input = match (&self.config, &self.config_dir) {
            (main, Some(dir)) => kubelet_config::read_with_dropins(main.as_deref(), dir)?,
            (Some(path), None) => kubelet_config::read(path)?,
            (None, None) => PolicyInput::default(),
        };
        if let Some(h) = &self.eviction_hard {
            input.hard = Some(MapSetting::from_flag("--eviction-hard", h, '<')?);
        }
        if let Some(v) = &self.eviction_soft {
            input.soft = MapSetting::from_flag("--eviction-soft", v, '<')?;
        }
        if let Some(v) = &self.eviction_soft_grace_period {
            input.soft_grace = MapSetting::from_flag("--eviction-soft-grace-period", v, '=')?;
        }
        if let Some(v) = &self.eviction_minimum_reclaim {
            input.min_reclaim = MapSetting::from_flag("--eviction-minimum-reclaim", v, '=')?;
        }
        if let Some(v) = self.eviction_max_pod_grace_period {
            input.max_pod_grace_period_seconds = v;
        }
        if let Some(v) = &self.image_minimum_gc_age {
            input.image_minimum_gc_age = Some(("--image-minimum-gc-age".into(), v.clone()));
        }
        if let Some(v) = &self.eviction_pressure_transition_period {
            input.pressure_transition_period =
                Some(("--eviction-pressure-transition-period".into(), v.clone()));
        }
        if let Some(v) = &self.enforce_node_allocatable {
            let list = v.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect();
            input.enforce_node_allocatable = Some(("--enforce-node-allocatable".into(), list));
        }
        if let Some(v) = self.local_storage_capacity_isolation {
            input.local_storage_capacity_isolation = v;
        }
        Ok(input)
    }

    /// The validated policy and the kubelet surprises worth a warning.
    pub fn policy(&self) -> Result<(Policy, Vec<String>), FlagsError> {
        let mut warnings = Vec::new();
        let policy = policy::build(&self.input()?, &mut warnings)?;
        Ok((policy, warnings))
    }
}
