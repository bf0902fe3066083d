//! The eviction policy as the kubelet configures it: thresholds (`signal<value`), soft grace
//! periods, minimum reclaim, max pod grace period, pressure transition period and
//! enforceNodeAllocatable, parsed with the kubelet's rules (`ParseThresholdConfig`) and its
//! surprises (`0%`/`100%` dropped, `0` rejected, grace periods for unknown soft thresholds
//! ignored), each surprise also reported as a warning.

use std::{collections::BTreeMap, fmt};

pub use crate::signal::{NodeCondition, Resource, Signal};
use crate::{godur, quantity::Quantity};

/// A literal quantity or a fraction of capacity (kept as the kubelet's float32).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ThresholdValue {
    Quantity(Quantity),
    Percentage(f32),
}

impl ThresholdValue {
    /// The kubelet's `GetThresholdQuantity`: float64 arithmetic on the float32 fraction,
    /// truncated (20% of 1000Mi is 209715203, not 209715200); a literal keeps its exact
    /// value and its own printing format.
    pub fn quantity(&self, capacity: i64) -> Quantity {
        match self {
            ThresholdValue::Quantity(q) => *q,
            ThresholdValue::Percentage(p) => Quantity::from_units((capacity as f64 * f64::from(*p)) as i64),
        }
    }

    /// `quantity(capacity)` as a whole number of units.
    pub fn resolve(&self, capacity: i64) -> i64 {
        self.quantity(capacity).value()
    }

    pub fn to_json(&self) -> serde_json::Value {
        match self {
            ThresholdValue::Quantity(q) => serde_json::json!({"quantity": q.value(), "percentage": null}),
            ThresholdValue::Percentage(p) => {
                serde_json::json!({"quantity": null, "percentage": shortest_f64(*p)})
            }
        }
    }
}

/// The float32 as the shortest decimal that reads back as it (0.1, not 0.10000000149011612).
fn shortest_f64(p: f32) -> f64 {
    format!("{p}").parse().unwrap_or(f64::from(p))
}

impl fmt::Display for ThresholdValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThresholdValue::Quantity(q) => write!(f, "{q}"),
            ThresholdValue::Percentage(p) => write!(f, "{}%", (shortest_f64(*p) * 1e6).round() / 1e4),
        }
    }
}

/// `signal < value`, hard when its grace period is zero.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: ThresholdValue,
    pub grace_period_ns: i64,
    pub min_reclaim: Option<ThresholdValue>,
}

impl Threshold {
    pub fn is_hard(&self) -> bool {
        self.grace_period_ns == 0
    }

    /// Met means `threshold (+ min-reclaim) > available`, strictly, compared exactly.
    pub fn is_met(&self, available: i64, capacity: i64, enforce_min_reclaim: bool) -> bool {
        let mut q = self.value.quantity(capacity).nanos();
        if enforce_min_reclaim && let Some(m) = &self.min_reclaim {
            q += m.quantity(capacity).nanos();
        }
        q > i128::from(available) * 1_000_000_000
    }

    /// The `check-config` / `simulate` JSON form.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "signal": self.signal.as_str(),
            "hard": self.is_hard(),
            "value": self.value.to_json(),
            "grace_period_seconds": seconds_json(self.grace_period_ns),
            "min_reclaim": self.min_reclaim.map(|m| m.to_json()),
        })
    }
}

/// Whole seconds as an integer, otherwise a float.
pub fn seconds_json(ns: i64) -> serde_json::Value {
    if ns % 1_000_000_000 == 0 { (ns / 1_000_000_000).into() } else { (ns as f64 / 1e9).into() }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}<{}", self.signal, self.value)
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PolicyError {
    #[error("{setting}: unsupported eviction signal {signal:?}")]
    UnknownSignal { setting: String, signal: String },
    #[error("{setting}: malformed pair {pair:?}, expected signal{sep}value")]
    Malformed { setting: String, pair: String, sep: char },
    #[error("{setting}: {signal}: invalid percentage {value:?}")]
    Percentage { setting: String, signal: Signal, value: String },
    #[error("{setting}: {signal}: eviction percentage threshold must be >= 0%: {value:?}")]
    PercentageNegative { setting: String, signal: Signal, value: String },
    #[error("{setting}: {signal}: eviction percentage threshold must be <= 100%: {value:?}")]
    PercentageTooLarge { setting: String, signal: Signal, value: String },
    #[error("{setting}: {signal}: invalid quantity {value:?}: {reason}")]
    Quantity { setting: String, signal: Signal, value: String, reason: String },
    #[error("{setting}: {signal}: eviction threshold must be positive: {value:?}")]
    NotPositive { setting: String, signal: Signal, value: String },
    #[error("{setting}: {signal}: {reason}")]
    Grace { setting: String, signal: Signal, reason: String },
    #[error("{setting}: {signal}: eviction percentage minimum reclaim must be positive: {value:?}")]
    MinReclaimNotPositive { setting: String, signal: Signal, value: String },
    #[error("{setting}: {signal}: negative eviction minimum reclaim: {value:?}")]
    MinReclaimNegative { setting: String, signal: Signal, value: String },
    #[error("{setting}: grace period must be specified for the soft eviction threshold {signal}")]
    SoftWithoutGrace { setting: String, signal: Signal },
    #[error("{setting}: {reason}")]
    Invalid { setting: String, reason: String },
}

/// The kubelet's Linux `evictionHard` default (`DefaultEvictionHard`; `imagefs.inodesFree`
/// since 1.33), used when no hard thresholds are given at all.
pub const DEFAULT_EVICTION_HARD: &str = "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%,imagefs.inodesFree<5%";
pub const DEFAULT_PRESSURE_TRANSITION_NS: i64 = 300 * 1_000_000_000;

/// One map-valued setting and where it came from (a flag or a config-file field), so that
/// errors can name it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MapSetting {
    pub source: String,
    pub entries: Vec<(String, String)>,
}

impl MapSetting {
    /// A `k<v,k<v` (or `k=v`) flag value. A repeated key keeps the last value, as the
    /// kubelet's map flags do.
    pub fn from_flag(source: &str, text: &str, sep: char) -> Result<Self, PolicyError> {
        let mut entries: Vec<(String, String)> = Vec::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once(sep).ok_or_else(|| PolicyError::Malformed {
                setting: source.into(),
                pair: pair.into(),
                sep,
            })?;
            let (k, v) = (k.trim().to_owned(), v.trim().to_owned());
            entries.retain(|(ek, _)| *ek != k);
            entries.push((k, v));
        }
        Ok(MapSetting { source: source.into(), entries })
    }
}

/// Everything the kubelet reads for eviction, before validation.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyInput {
    /// `None`: the kubelet's defaults.
    pub hard: Option<MapSetting>,
    pub soft: MapSetting,
    pub soft_grace: MapSetting,
    pub min_reclaim: MapSetting,
    pub max_pod_grace_period_seconds: i64,
    pub pressure_transition_period: Option<(String, String)>,
    pub enforce_node_allocatable: Option<(String, Vec<String>)>,
    /// `localStorageCapacityIsolation` (default true): pods over their own ephemeral-storage
    /// limits are evicted.
    pub local_storage_capacity_isolation: bool,
    /// `imageMinimumGCAge` (where it was set, and the text): 2m by default.
    pub image_minimum_gc_age: Option<(String, String)>,
    /// Where each value set came from (`evictionHard[memory.available]` → a file, a drop-in,
    /// a flag, `default`), for `check-config`; a value not listed is the kubelet's default.
    pub origins: BTreeMap<String, String>,
    /// What reading the configuration found worth a warning (a field the kubelet ignores, a
    /// skipped drop-in), said with the policy's own warnings.
    pub notes: Vec<String>,
}

impl Default for PolicyInput {
    fn default() -> Self {
        PolicyInput {
            hard: None,
            soft: MapSetting { source: "--eviction-soft".into(), ..Default::default() },
            soft_grace: MapSetting { source: "--eviction-soft-grace-period".into(), ..Default::default() },
            min_reclaim: MapSetting { source: "--eviction-minimum-reclaim".into(), ..Default::default() },
            max_pod_grace_period_seconds: 0,
            pressure_transition_period: None,
            enforce_node_allocatable: None,
            local_storage_capacity_isolation: true,
            image_minimum_gc_age: None,
            origins: BTreeMap::new(),
            notes: Vec::new(),
        }
    }
}

/// A validated policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// Hard (in signal order), then soft, then the allocatable copies.
    pub thresholds: Vec<Threshold>,
    pub pressure_transition_period_ns: i64,
    pub max_pod_grace_period_seconds: i64,
    pub enforce_node_allocatable: Vec<String>,
    /// Whether pods over their own ephemeral-storage limits are evicted (`local_storage`).
    pub local_storage_capacity_isolation: bool,
    /// Node-level reclaim removes no image the node has had for less than this
    /// (`imageMinimumGCAge`): an image just pulled is about to be used.
    pub image_minimum_gc_age_ns: i64,
}

impl Policy {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "thresholds": self.thresholds.iter().map(Threshold::to_json).collect::<Vec<_>>(),
            "pressure_transition_period_seconds": seconds_json(self.pressure_transition_period_ns),
            "max_pod_grace_period_seconds": self.max_pod_grace_period_seconds,
            "local_storage_capacity_isolation": self.local_storage_capacity_isolation,
            "image_minimum_gc_age_seconds": seconds_json(self.image_minimum_gc_age_ns),
        })
    }
}

const ALLOCATABLE_KEYS: [&str; 4] = ["pods", "system-reserved", "kube-reserved", "none"];

/// The kubelet's `ParseThresholdConfig`: validates `input` as the kubelet does; `warnings`
/// collects what the kubelet would do silently (dropped `0%`/`100%`, grace periods or
/// min-reclaims for absent thresholds, replaced containerfs thresholds). Checks run in the
/// kubelet's order, so the first error reported is the one the kubelet would report.
pub fn build(input: &PolicyInput, warnings: &mut Vec<String>) -> Result<Policy, PolicyError> {
    warnings.extend(input.notes.iter().cloned());
    let default_hard;
    let hard_setting = match &input.hard {
        Some(h) => h,
        None => {
            default_hard = MapSetting::from_flag("--eviction-hard (default)", DEFAULT_EVICTION_HARD, '<')?;
            &default_hard
        }
    };
    let mut thresholds = parse_threshold_statements(hard_setting, warnings)?;
    let mut soft = parse_threshold_statements(&input.soft, warnings)?;
    parse_grace_periods(input, &mut soft)?;
    thresholds.extend(soft);
    warn_unused_grace_periods(input, &thresholds, warnings)?;
    parse_minimum_reclaims(&input.min_reclaim, &mut thresholds, warnings)?;
    warn_replaced_containerfs(&thresholds, warnings);
    let enforce = parse_enforce_node_allocatable(input)?;
    if enforce.iter().any(|k| k == "pods") {
        let copies = allocatable_thresholds(&thresholds);
        thresholds.extend(copies);
    }
    warn_empty_policy(input, &thresholds, warnings);
    Ok(Policy {
        thresholds,
        pressure_transition_period_ns: parse_pressure_transition_period(input)?,
        max_pod_grace_period_seconds: input.max_pod_grace_period_seconds,
        enforce_node_allocatable: enforce,
        local_storage_capacity_isolation: input.local_storage_capacity_isolation,
        image_minimum_gc_age_ns: parse_non_negative_duration(
            input.image_minimum_gc_age.as_ref(),
            DEFAULT_IMAGE_MINIMUM_GC_AGE_NS,
        )?,
    })
}

/// A policy without a threshold evicts nothing for node pressure — the kubelet accepts it
/// (`evictionHard: {}`) without a word; evictd says so, naming where the hard map came from.
fn warn_empty_policy(input: &PolicyInput, thresholds: &[Threshold], warnings: &mut Vec<String>) {
    if thresholds.is_empty() {
        let hard = input.hard.as_ref().map_or("--eviction-hard (default)", |h| h.source.as_str());
        warnings.push(format!(
            "no eviction threshold (from {hard}): no pod is evicted for node pressure, only pods over \
             their own storage limits; the kernel's OOM killer is the node's only defence"
        ));
    }
}

/// `parseThresholdStatements`: one threshold per `signal<value`, in signal order; the exact
/// values `0%` and `100%` are dropped (with a warning here).
fn parse_threshold_statements(
    setting: &MapSetting,
    warnings: &mut Vec<String>,
) -> Result<Vec<Threshold>, PolicyError> {
    let mut parsed = Vec::new();
    for (k, v) in &setting.entries {
        let signal = parse_signal(&setting.source, k)?;
        match parse_value(&setting.source, signal, v)? {
            Some(value) => parsed.push(Threshold { signal, value, grace_period_ns: 0, min_reclaim: None }),
            None => warnings.push(format!(
                "{}: {k}<{v} is ignored: the kubelet silently drops 0% and 100% thresholds",
                setting.source
            )),
        }
    }
    parsed.sort_by_key(|t| t.signal);
    Ok(parsed)
}

/// `parseGracePeriods`, applied: every soft threshold needs one.
fn parse_grace_periods(input: &PolicyInput, soft: &mut [Threshold]) -> Result<(), PolicyError> {
    for t in soft {
        t.grace_period_ns = grace_for(input, t.signal)?.ok_or_else(|| PolicyError::SoftWithoutGrace {
            setting: input.soft.source.clone(),
            signal: t.signal,
        })?;
    }
    Ok(())
}

/// Grace periods for signals without a soft threshold: validated all the same, then ignored.
fn warn_unused_grace_periods(
    input: &PolicyInput,
    thresholds: &[Threshold],
    warnings: &mut Vec<String>,
) -> Result<(), PolicyError> {
    for (k, _) in &input.soft_grace.entries {
        let signal = parse_signal(&input.soft_grace.source, k)?;
        if !thresholds.iter().any(|t| t.signal == signal && !t.is_hard()) {
            grace_for(input, signal)?;
            warnings.push(format!(
                "{}: {k} has no soft threshold; the grace period is ignored",
                input.soft_grace.source
            ));
        }
    }
    Ok(())
}

/// `parseMinimumReclaims`, applied to every threshold of the signal (the last entry wins).
fn parse_minimum_reclaims(
    setting: &MapSetting,
    thresholds: &mut [Threshold],
    warnings: &mut Vec<String>,
) -> Result<(), PolicyError> {
    let mut min_reclaims = Vec::new();
    for (k, v) in &setting.entries {
        let signal = parse_signal(&setting.source, k)?;
        min_reclaims.push((signal, parse_min_reclaim(&setting.source, signal, v)?));
        if !thresholds.iter().any(|t| t.signal == signal) {
            warnings
                .push(format!("{}: {k} has no threshold; the minimum reclaim is ignored", setting.source));
        }
    }
    for t in thresholds {
        t.min_reclaim = min_reclaims.iter().rev().find(|(s, _)| *s == t.signal).map(|(_, m)| *m);
    }
    Ok(())
}

/// The kubelet replaces user containerfs thresholds by copies of the nodefs or imagefs ones
/// (`UpdateContainerFsThresholds`); evictd says so.
fn warn_replaced_containerfs(thresholds: &[Threshold], warnings: &mut Vec<String>) {
    for t in thresholds {
        if matches!(t.signal, Signal::ContainerFsAvailable | Signal::ContainerFsInodesFree) {
            warnings.push(format!(
                "{t}: containerfs thresholds are replaced by copies of the nodefs or imagefs ones, as the kubelet does"
            ));
        }
    }
}

/// `enforceNodeAllocatable`: `pods` by default; `none` stands alone.
fn parse_enforce_node_allocatable(input: &PolicyInput) -> Result<Vec<String>, PolicyError> {
    let Some((source, list)) = &input.enforce_node_allocatable else { return Ok(vec!["pods".to_owned()]) };
    let invalid = |reason: String| PolicyError::Invalid { setting: source.clone(), reason };
    if let Some(k) = list.iter().find(|k| !ALLOCATABLE_KEYS.contains(&k.as_str())) {
        return Err(invalid(format!(
            "invalid option {k:?} (valid: pods, system-reserved, kube-reserved, none)"
        )));
    }
    if list.iter().any(|k| k == "none") && list.len() > 1 {
        return Err(invalid("\"none\" cannot be combined with other options".into()));
    }
    Ok(list.clone())
}

/// `addAllocatableThresholds`: an `allocatableMemory.available` copy of every hard
/// `memory.available` threshold.
fn allocatable_thresholds(thresholds: &[Threshold]) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
        .map(|t| Threshold { signal: Signal::AllocatableMemoryAvailable, grace_period_ns: 0, ..*t })
        .collect()
}

/// `evictionPressureTransitionPeriod`: a Go duration, not negative; 5m by default.
fn parse_pressure_transition_period(input: &PolicyInput) -> Result<i64, PolicyError> {
    parse_non_negative_duration(input.pressure_transition_period.as_ref(), DEFAULT_PRESSURE_TRANSITION_NS)
}

/// The kubelet's default `imageMinimumGCAge`.
pub const DEFAULT_IMAGE_MINIMUM_GC_AGE_NS: i64 = 2 * 60 * 1_000_000_000;

/// A Go duration setting, not negative; `default` when unset.
fn parse_non_negative_duration(setting: Option<&(String, String)>, default: i64) -> Result<i64, PolicyError> {
    let Some((source, text)) = setting else {
        return Ok(default);
    };
    let ns = godur::parse(text)
        .map_err(|e| PolicyError::Invalid { setting: source.clone(), reason: e.to_string() })?;
    if ns < 0 {
        return Err(PolicyError::Invalid {
            setting: source.clone(),
            reason: format!("{text:?} is negative"),
        });
    }
    Ok(ns)
}

fn parse_signal(source: &str, s: &str) -> Result<Signal, PolicyError> {
    Signal::parse(s).ok_or_else(|| PolicyError::UnknownSignal { setting: source.into(), signal: s.into() })
}

fn grace_for(input: &PolicyInput, signal: Signal) -> Result<Option<i64>, PolicyError> {
    let source = &input.soft_grace.source;
    let Some((_, v)) = input.soft_grace.entries.iter().rev().find(|(k, _)| k == signal.as_str()) else {
        return Ok(None);
    };
    let ns = godur::parse(v).map_err(|e| PolicyError::Grace {
        setting: source.clone(),
        signal,
        reason: e.to_string(),
    })?;
    if ns < 0 {
        return Err(PolicyError::Grace {
            setting: source.clone(),
            signal,
            reason: format!("{v:?} is negative"),
        });
    }
    Ok(Some(ns))
}

/// The kubelet's `parsePercentage`: every trailing `%` trimmed, parsed as float32, / 100.
fn parse_percentage(source: &str, signal: Signal, value: &str) -> Result<f32, PolicyError> {
    let pct: f32 = value
        .trim_end_matches('%')
        .parse()
        .ok()
        .filter(|p: &f32| p.is_finite())
        .ok_or_else(|| PolicyError::Percentage { setting: source.into(), signal, value: value.into() })?;
    Ok(pct / 100.0)
}

fn parse_quantity(source: &str, signal: Signal, value: &str) -> Result<Quantity, PolicyError> {
    value.parse().map_err(|e: crate::quantity::QuantityError| PolicyError::Quantity {
        setting: source.into(),
        signal,
        value: value.into(),
        reason: e.to_string(),
    })
}

/// `None` for the exact strings `0%` and `100%`, which the kubelet silently ignores.
fn parse_value(source: &str, signal: Signal, value: &str) -> Result<Option<ThresholdValue>, PolicyError> {
    if value.ends_with('%') {
        if value == "0%" || value == "100%" {
            return Ok(None);
        }
        let fraction = parse_percentage(source, signal, value)?;
        if fraction < 0.0 {
            return Err(PolicyError::PercentageNegative {
                setting: source.into(),
                signal,
                value: value.into(),
            });
        }
        if fraction > 1.0 {
            return Err(PolicyError::PercentageTooLarge {
                setting: source.into(),
                signal,
                value: value.into(),
            });
        }
        return Ok(Some(ThresholdValue::Percentage(fraction)));
    }
    let q = parse_quantity(source, signal, value)?;
    if q.is_negative() || q.is_zero() {
        return Err(PolicyError::NotPositive { setting: source.into(), signal, value: value.into() });
    }
    Ok(Some(ThresholdValue::Quantity(q)))
}

fn parse_min_reclaim(source: &str, signal: Signal, value: &str) -> Result<ThresholdValue, PolicyError> {
    if value.ends_with('%') {
        let fraction = parse_percentage(source, signal, value)?;
        if fraction <= 0.0 {
            return Err(PolicyError::MinReclaimNotPositive {
                setting: source.into(),
                signal,
                value: value.into(),
            });
        }
        return Ok(ThresholdValue::Percentage(fraction));
    }
    let q = parse_quantity(source, signal, value)?;
    if q.is_negative() {
        return Err(PolicyError::MinReclaimNegative { setting: source.into(), signal, value: value.into() });
    }
    Ok(ThresholdValue::Quantity(q))
}

#[cfg(test)]
mod tests;
