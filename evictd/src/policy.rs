//! Eviction thresholds as the kubelet spells them (`memory.available<100Mi,nodefs.available<10%`)
//! and parses them: same signals, same value rules, same surprises (`0%` and `100%` are
//! dropped, `0` is an error), with a warning where the kubelet is silent.

use std::fmt;

use crate::quantity::Quantity;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Signal {
    #[serde(rename = "memory.available")]
    MemoryAvailable,
    #[serde(rename = "allocatableMemory.available")]
    AllocatableMemoryAvailable,
    #[serde(rename = "nodefs.available")]
    NodeFsAvailable,
    #[serde(rename = "nodefs.inodesFree")]
    NodeFsInodesFree,
    #[serde(rename = "imagefs.available")]
    ImageFsAvailable,
    #[serde(rename = "imagefs.inodesFree")]
    ImageFsInodesFree,
    #[serde(rename = "containerfs.available")]
    ContainerFsAvailable,
    #[serde(rename = "containerfs.inodesFree")]
    ContainerFsInodesFree,
    #[serde(rename = "pid.available")]
    PidAvailable,
}

impl Signal {
    pub const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    pub fn parse(s: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|sig| sig.as_str() == s)
    }

    pub fn is_memory(self) -> bool {
        matches!(self, Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable)
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A literal quantity or a fraction of capacity (stored as the kubelet's float32).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ThresholdValue {
    Quantity(Quantity),
    Percentage(f32),
}

impl ThresholdValue {
    /// The kubelet's `GetThresholdQuantity`: float64 arithmetic on the float32 fraction,
    /// truncated (20% of 1000Mi is 209715203, not 209715200).
    pub fn resolve(&self, capacity: i64) -> i64 {
        match self {
            ThresholdValue::Quantity(q) => q.value(),
            ThresholdValue::Percentage(p) => (capacity as f64 * f64::from(*p)) as i64,
        }
    }
}

impl fmt::Display for ThresholdValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThresholdValue::Quantity(q) => write!(f, "{q}"),
            ThresholdValue::Percentage(p) => write!(f, "{}%", f64::from(*p) * 100.0),
        }
    }
}

/// `signal < value`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: ThresholdValue,
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}<{}", self.signal, self.value)
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PolicyError {
    #[error("{flag}: unsupported eviction signal {signal:?}")]
    UnknownSignal { flag: &'static str, signal: String },
    #[error("{flag}: {statement:?} is not of the form signal<value")]
    Statement { flag: &'static str, statement: String },
    #[error("{flag}: {signal}: invalid percentage {value:?}")]
    Percentage { flag: &'static str, signal: Signal, value: String },
    #[error("{flag}: {signal}: eviction percentage threshold must be >= 0%: {value:?}")]
    PercentageNegative { flag: &'static str, signal: Signal, value: String },
    #[error("{flag}: {signal}: eviction percentage threshold must be <= 100%: {value:?}")]
    PercentageTooLarge { flag: &'static str, signal: Signal, value: String },
    #[error("{flag}: {signal}: invalid quantity {value:?}: {reason}")]
    Quantity { flag: &'static str, signal: Signal, value: String, reason: String },
    #[error("{flag}: {signal}: eviction threshold must be positive: {value:?}")]
    NotPositive { flag: &'static str, signal: Signal, value: String },
}

/// The kubelet's Linux `evictionHard` default, used when the flag is not given at all.
pub const DEFAULT_EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%";

/// Parses a `signal<value,...` list. A repeated signal keeps its last value, as the
/// kubelet's map flags do. Dropped statements (`0%`, `100%`) are returned beside the result
/// so the caller can warn about them.
pub fn parse_thresholds(
    flag: &'static str,
    list: &str,
) -> Result<(Vec<Threshold>, Vec<String>), PolicyError> {
    let mut out: Vec<Threshold> = Vec::new();
    let mut dropped = Vec::new();
    for statement in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (sig, value) = statement
            .split_once('<')
            .ok_or_else(|| PolicyError::Statement { flag, statement: statement.to_owned() })?;
        let signal = Signal::parse(sig.trim())
            .ok_or_else(|| PolicyError::UnknownSignal { flag, signal: sig.trim().to_owned() })?;
        let value = value.trim();
        out.retain(|t| t.signal != signal);
        match parse_value(flag, signal, value)? {
            Some(v) => out.push(Threshold { signal, value: v }),
            None => dropped.push(statement.to_owned()),
        }
    }
    Ok((out, dropped))
}

/// `None` for the exact strings `0%` and `100%`, which the kubelet silently ignores.
fn parse_value(
    flag: &'static str,
    signal: Signal,
    value: &str,
) -> Result<Option<ThresholdValue>, PolicyError> {
    if value.ends_with('%') {
        if value == "0%" || value == "100%" {
            return Ok(None);
        }
        let number = value.trim_end_matches('%');
        let pct: f32 =
            number.parse().map_err(|_| PolicyError::Percentage { flag, signal, value: value.to_owned() })?;
        if !pct.is_finite() {
            return Err(PolicyError::Percentage { flag, signal, value: value.to_owned() });
        }
        let fraction = pct / 100.0;
        if fraction < 0.0 {
            return Err(PolicyError::PercentageNegative { flag, signal, value: value.to_owned() });
        }
        if fraction > 1.0 {
            return Err(PolicyError::PercentageTooLarge { flag, signal, value: value.to_owned() });
        }
        return Ok(Some(ThresholdValue::Percentage(fraction)));
    }
    let q: Quantity = value.parse().map_err(|e: crate::quantity::QuantityError| PolicyError::Quantity {
        flag,
        signal,
        value: value.to_owned(),
        reason: e.to_string(),
    })?;
    if q.is_negative() || q.is_zero() {
        return Err(PolicyError::NotPositive { flag, signal, value: value.to_owned() });
    }
    Ok(Some(ThresholdValue::Quantity(q)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(list: &str) -> Result<Vec<Threshold>, PolicyError> {
        parse_thresholds("--eviction-hard", list).map(|(t, _)| t)
    }

    #[test]
    fn defaults_parse() {
        let t = parse(DEFAULT_EVICTION_HARD).unwrap();
        assert_eq!(t.len(), 4);
        assert_eq!(t[0].to_string(), "memory.available<100Mi");
        assert_eq!(t[0].value.resolve(0), 100 << 20);
        assert_eq!(t[1].value, ThresholdValue::Percentage(0.1));
    }

    #[test]
    fn percentage_resolution_matches_kubelet_float32() {
        let (t, _) = parse_thresholds("--eviction-hard", "memory.available<20%").unwrap();
        assert_eq!(t[0].value.resolve(1000 << 20), 209_715_203);
    }

    #[test]
    fn kubelet_value_rules() {
        let (t, dropped) =
            parse_thresholds("--eviction-hard", "memory.available<0%,nodefs.available<100%").unwrap();
        assert!(t.is_empty());
        assert_eq!(dropped.len(), 2);
        assert_eq!(parse("memory.available<0.0%").unwrap()[0].value, ThresholdValue::Percentage(0.0));
        assert_eq!(parse("memory.available<10%%").unwrap()[0].value, ThresholdValue::Percentage(0.1));
        assert!(matches!(parse("memory.available<0"), Err(PolicyError::NotPositive { .. })));
        assert!(matches!(parse("memory.available<-1Mi"), Err(PolicyError::NotPositive { .. })));
        assert!(matches!(parse("memory.available<101%"), Err(PolicyError::PercentageTooLarge { .. })));
        assert!(matches!(parse("memory.available<-5%"), Err(PolicyError::PercentageNegative { .. })));
        assert!(matches!(parse("memory.available<1MB"), Err(PolicyError::Quantity { .. })));
        assert!(matches!(parse("swap.available<1Mi"), Err(PolicyError::UnknownSignal { .. })));
        assert!(matches!(parse("memory.available=1Mi"), Err(PolicyError::Statement { .. })));
        assert!(parse("").unwrap().is_empty());
        // A repeated key keeps the last value.
        let t = parse("memory.available<1Gi,memory.available<2Gi").unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].value.resolve(0), 2 << 30);
    }

    #[test]
    fn errors_name_flag_and_value() {
        let e = parse_thresholds("--eviction-soft", "memory.available<lots").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("--eviction-soft") && msg.contains("lots"), "{msg}");
    }
}
