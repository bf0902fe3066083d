//! The kubelet's eviction flags, spelled as the kubelet spells them, and `--config` for a
//! KubeletConfiguration file whose eviction fields they override one by one. Shared by the
//! daemon and the offline commands, so both read a policy the same way.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use clap::Args;

use crate::{
    kubelet_config::{self, ConfigError},
    kubelet_process::{self, Kubelet, KubeletProcessError},
    podspec::AnnotationTrust,
    policy::{self, MapSetting, Policy, PolicyError, PolicyInput},
};

#[derive(Args, Debug, Default, Clone)]
pub struct PolicyArgs {
    /// Read the configuration of the kubelet running on this node, as it reads it: its
    /// command line's --config, --config-dir and eviction flags (found in /proc; needs the
    /// host's PID namespace). evictd's own eviction flags still override them.
    #[arg(long, value_enum, value_name = "auto", conflicts_with_all = ["config", "config_dir"])]
    pub kubelet_config: Option<KubeletConfig>,
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

/// Where the kubelet's configuration is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KubeletConfig {
    /// The kubelet process running on this node.
    Auto,
}

/// A policy that cannot be read or is not valid.
#[derive(Debug, thiserror::Error)]
pub enum FlagsError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Kubelet(#[from] KubeletProcessError),
}

impl PolicyArgs {
    /// The namespaces whose pods' evictd annotations count.
    pub fn annotation_trust(&self) -> AnnotationTrust {
        AnnotationTrust::from_list(&self.annotation_namespaces)
    }

    /// The policy inputs: the config file's fields, each replaced by its flag when given;
    /// with `--kubelet-config auto`, the running kubelet's files and flags first.
    pub fn input(&self) -> Result<PolicyInput, FlagsError> {
        let mut input = match self.kubelet_config {
            Some(KubeletConfig::Auto) => {
                let kubelet = Kubelet::find(Path::new(kubelet_process::PROC))?;
                let theirs = Self::of_kubelet(&kubelet)?;
                let mut input = theirs.files()?;
                theirs.flags_over(&mut input, Some(kubelet.pid))?;
                input.notes.extend(kubelet.notes);
                input
            }
            None => self.files()?,
        };
        self.flags_over(&mut input, None)?;
        Ok(input)
    }

    fn files(&self) -> Result<PolicyInput, FlagsError> {
        Ok(match (&self.config, &self.config_dir) {
            (main, Some(dir)) => kubelet_config::read_with_dropins(main.as_deref(), dir)?,
            (Some(path), None) => kubelet_config::read(path)?,
            (None, None) => PolicyInput::default(),
        })
    }

    /// The policy arguments a running kubelet was given.
    fn of_kubelet(k: &Kubelet) -> Result<PolicyArgs, FlagsError> {
        let flag = |name: &str| k.flags.get(name).cloned();
        Ok(PolicyArgs {
            config: k.config.clone(),
            config_dir: k.config_dir.clone(),
            eviction_hard: flag("eviction-hard"),
            eviction_soft: flag("eviction-soft"),
            eviction_soft_grace_period: flag("eviction-soft-grace-period"),
            eviction_minimum_reclaim: flag("eviction-minimum-reclaim"),
            eviction_max_pod_grace_period: k
                .flags
                .get("eviction-max-pod-grace-period")
                .and_then(|v| v.parse().ok()),
            eviction_pressure_transition_period: flag("eviction-pressure-transition-period"),
            enforce_node_allocatable: flag("enforce-node-allocatable"),
            image_minimum_gc_age: flag("image-minimum-gc-age"),
            ..PolicyArgs::default()
        })
    }

    /// The kubelet's flag precedence: each flag given replaces its field, whatever the files
    /// said (a map flag the whole map), and is where its values came from.
    fn flags_over(&self, input: &mut PolicyInput, kubelet: Option<i32>) -> Result<(), FlagsError> {
        let o = &mut Origins { map: &mut input.origins, kubelet };
        if let Some(v) = &self.eviction_hard {
            input.hard = Some(o.map("evictionHard", "--eviction-hard", v, '<')?);
        }
        if let Some(v) = &self.eviction_soft {
            input.soft = o.map("evictionSoft", "--eviction-soft", v, '<')?;
        }
        if let Some(v) = &self.eviction_soft_grace_period {
            input.soft_grace = o.map("evictionSoftGracePeriod", "--eviction-soft-grace-period", v, '=')?;
        }
        if let Some(v) = &self.eviction_minimum_reclaim {
            input.min_reclaim = o.map("evictionMinimumReclaim", "--eviction-minimum-reclaim", v, '=')?;
        }
        if let Some(v) = self.eviction_max_pod_grace_period {
            input.max_pod_grace_period_seconds = v;
            o.scalar("evictionMaxPodGracePeriod", "--eviction-max-pod-grace-period");
        }
        if let Some(v) = &self.image_minimum_gc_age {
            let name = o.scalar("imageMinimumGCAge", "--image-minimum-gc-age");
            input.image_minimum_gc_age = Some((name, v.clone()));
        }
        if let Some(v) = &self.eviction_pressure_transition_period {
            let name = o.scalar("evictionPressureTransitionPeriod", "--eviction-pressure-transition-period");
            input.pressure_transition_period = Some((name, v.clone()));
        }
        if let Some(v) = &self.enforce_node_allocatable {
            let list = v.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect();
            let name = o.scalar("enforceNodeAllocatable", "--enforce-node-allocatable");
            input.enforce_node_allocatable = Some((name, list));
        }
        if let Some(v) = self.local_storage_capacity_isolation {
            input.local_storage_capacity_isolation = v;
            o.scalar("localStorageCapacityIsolation", "--local-storage-capacity-isolation");
        }
        Ok(())
    }

    /// The validated policy and the kubelet surprises worth a warning.
    pub fn policy(&self) -> Result<(Policy, Vec<String>), FlagsError> {
        let mut warnings = Vec::new();
        let policy = policy::build(&self.input()?, &mut warnings)?;
        Ok((policy, warnings))
    }
}

/// Where flags' values come from: evictd's own flags, or the running kubelet's.
struct Origins<'a> {
    map: &'a mut BTreeMap<String, String>,
    kubelet: Option<i32>,
}

impl Origins<'_> {
    fn name(&self, flag: &str) -> String {
        match self.kubelet {
            Some(pid) => format!("{flag} of the kubelet (PID {pid})"),
            None => flag.to_owned(),
        }
    }

    /// A map flag's value, which replaces the field's map and is where each of its entries
    /// came from.
    fn map(&mut self, field: &str, flag: &str, text: &str, sep: char) -> Result<MapSetting, FlagsError> {
        let name = self.name(flag);
        let m = MapSetting::from_flag(&name, text, sep)?;
        self.map.retain(|k, _| !k.strip_prefix(field).is_some_and(|rest| rest.starts_with('[')));
        self.map.extend(m.entries.iter().map(|(k, _)| (format!("{field}[{k}]"), format!("flag {name}"))));
        Ok(m)
    }

    /// A scalar flag, which replaces its field: its name, to name it in errors.
    fn scalar(&mut self, field: &str, flag: &str) -> String {
        let name = self.name(flag);
        self.map.insert(field.to_owned(), format!("flag {name}"));
        name
    }
}
