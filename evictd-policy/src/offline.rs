//! `evictd check-config`, `simulate` and `replay`: the decision engine on recorded data, in
//! the formats users already have (a kubelet Summary API document per step, a PodList from
//! `kubectl get pods -o json`). The JSON shapes are a stable contract (docs/operating.md).

use std::{
    collections::BTreeMap,
    io::{BufRead, Write},
    path::Path,
};

use serde_json::{Value, json};

use crate::{
    engine::{self, Decision, EngineState},
    observations::{self, ObservationError, Observations},
    podspec::{self, AnnotationTrust, Pod, PodListError},
    policy::{Policy, Threshold},
    rank::{FsLayout, PodEntry},
    summary::{self, Summary},
};

/// Recorded input that cannot be used, named by file (and line, for replay).
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    #[error(transparent)]
    Pods(#[from] PodListError),
    #[error("reading {what}: {error}")]
    Read { what: String, error: std::io::Error },
    #[error("{what}: not JSON: {error}")]
    NotJson { what: String, error: serde_json::Error },
    #[error("{what}: not a kubelet Summary API document: {error}")]
    NotSummary { what: String, error: serde_json::Error },
    #[error("{what}: {error}")]
    Observation { what: String, error: ObservationError },
    #[error("{what}: no `time` field anywhere in the document; replay needs timestamps to order the steps")]
    NoTime { what: String },
    #[error("{what}: time {time} is before the previous step's")]
    TimeBackwards { what: String, time: String },
    #[error("writing the output: {0}")]
    Write(#[from] std::io::Error),
    #[error("writing the output: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Reads a PodList and keeps the active pods (not terminal, not terminating), each with its
/// evictd annotations only where `trust` lets them count, as the daemon does.
pub fn load_pods(path: &Path, trust: &AnnotationTrust) -> Result<Vec<Pod>, OfflineError> {
    let mut pods: Vec<Pod> = podspec::read_pod_list(path)?.into_iter().filter(Pod::is_active).collect();
    for pod in &mut pods {
        trust.apply(pod);
    }
    Ok(pods)
}

fn parse_summary(text: &str, what: &str) -> Result<(Summary, Value), OfflineError> {
    let raw: Value =
        serde_json::from_str(text).map_err(|error| OfflineError::NotJson { what: what.into(), error })?;
    let s: Summary = serde_json::from_value(raw.clone())
        .map_err(|error| OfflineError::NotSummary { what: what.into(), error })?;
    Ok((s, raw))
}

/// One engine step on one Summary document.
pub struct Step {
    pub time_ns: Option<i64>,
    pub observations: Observations,
    pub decision: Decision,
}

/// Runs the engine over Summary documents in order, carrying its state between them.
pub struct Session<'a> {
    pub policy: &'a Policy,
    pub thresholds: Vec<Threshold>,
    pub layout: FsLayout,
    pub pods: &'a [Pod],
    state: EngineState,
}

impl<'a> Session<'a> {
    pub fn new(policy: &'a Policy, layout: FsLayout, pods: &'a [Pod]) -> Self {
        let thresholds = engine::thresholds_for_layout(policy, layout);
        Session { policy, thresholds, layout, pods, state: EngineState::default() }
    }

    pub fn step(&mut self, text: &str, what: &str, need_time: bool) -> Result<Step, OfflineError> {
        let (s, raw) = parse_summary(text, what)?;
        let observations = observations::from_summary(&s)
            .map_err(|error| OfflineError::Observation { what: what.into(), error })?;
        let time_ns = summary::newest_time(&raw);
        if need_time && time_ns.is_none() {
            return Err(OfflineError::NoTime { what: what.into() });
        }
        let by_uid = s.pods_by_uid();
        let entries: Vec<PodEntry> = self
            .pods
            .iter()
            .map(|p| PodEntry { pod: p, stats: by_uid.get(p.uid()).copied(), protected: false })
            .collect();
        let input = engine::Input {
            thresholds: &self.thresholds,
            policy: self.policy,
            layout: self.layout,
            observations: &observations,
            pods: &entries,
            now_ns: time_ns.unwrap_or(0),
            check_storage_limits: true,
        };
        let (state, decision) = engine::decide(&input, &self.state);
        self.state = state;
        Ok(Step { time_ns, observations, decision })
    }

    fn pod_ref(&self, i: usize) -> Value {
        let m = &self.pods[i].metadata;
        json!({"namespace": m.namespace, "name": m.name, "uid": m.uid})
    }

    /// The `simulate` object for a step (`replay` adds "time").
    pub fn step_json(&self, step: &Step) -> Value {
        let d = &step.decision;
        let signals: serde_json::Map<String, Value> = step
            .observations
            .iter()
            .map(|(s, o)| (s.as_str().to_owned(), json!({"available": o.available, "capacity": o.capacity})))
            .collect();
        json!({
            "signals": signals,
            "thresholds_met": d.thresholds_met.iter().map(|&i| self.thresholds[i].to_json()).collect::<Vec<_>>(),
            "node_conditions": d.node_conditions,
            "ranking": d.ranking.iter().map(|&i| self.pod_ref(i)).collect::<Vec<_>>(),
            "node_reclaim": d.node_reclaim,
            "eviction": d.eviction.as_ref().map(|e| json!({
                "signal": e.signal.as_str(),
                "pod": self.pod_ref(e.pod),
                "grace_period_seconds": e.grace_period_seconds,
                "message": e.message,
            })),
            "limit_evictions": d.limit_evictions.iter().map(|e| json!({
                "limit": e.kind,
                "pod": self.pod_ref(e.pod),
                "grace_period_seconds": e.grace_period_seconds,
                "message": e.message,
            })).collect::<Vec<_>>(),
        })
    }

    pub fn write_table(&self, step: &Step, out: &mut impl Write) -> std::io::Result<()> {
        if let Some(t) = step.time_ns {
            writeln!(out, "== {}", summary::format_time(t))?;
        }
        writeln!(out, "{:<30} {:>16} {:>16}  thresholds", "signal", "available", "capacity")?;
        for (s, o) in &step.observations {
            let ts: Vec<String> = (0..self.thresholds.len())
                .filter(|&i| self.thresholds[i].signal == *s)
                .map(|i| {
                    let t = &self.thresholds[i];
                    let kind = if t.is_hard() { "hard" } else { "soft" };
                    let met = if step.decision.thresholds_met.contains(&i) { " MET" } else { "" };
                    format!("<{} ({kind}){met}", t.value)
                })
                .collect();
            writeln!(out, "{:<30} {:>16} {:>16}  {}", s.as_str(), o.available, o.capacity, ts.join(", "))?;
        }
        let d = &step.decision;
        let conds: Vec<&str> = d.node_conditions.iter().map(|c| c.as_str()).collect();
        writeln!(
            out,
            "node conditions: {}",
            if conds.is_empty() { "none".into() } else { conds.join(", ") }
        )?;
        if !d.node_reclaim.is_empty() {
            let r: Vec<String> = d.node_reclaim.iter().map(|r| format!("{r:?}")).collect();
            writeln!(out, "node-level reclaim first: {}", r.join(", "))?;
        }
        if !d.ranking.is_empty() {
            writeln!(out, "ranking:")?;
            for (n, &i) in d.ranking.iter().enumerate() {
                let p = &self.pods[i];
                let note = if p.is_critical() {
                    "  (critical: never evicted)"
                } else if p.opts_out() {
                    "  (opted out: evictd.io/eviction=never)"
                } else {
                    ""
                };
                writeln!(out, "  {:>2}. {}/{}{note}", n + 1, p.metadata.namespace, p.metadata.name)?;
            }
        }
        for e in &d.limit_evictions {
            let p = &self.pods[e.pod].metadata;
            writeln!(
                out,
                "limit eviction: {}/{} for {} (grace period {}s)\n  {}",
                p.namespace,
                p.name,
                e.kind.as_str(),
                e.grace_period_seconds,
                e.message
            )?;
        }
        match &d.eviction {
            Some(e) => {
                let p = &self.pods[e.pod].metadata;
                writeln!(
                    out,
                    "eviction: {}/{} for {} (grace period {}s)\n  {}",
                    p.namespace, p.name, e.signal, e.grace_period_seconds, e.message
                )
            }
            None => writeln!(out, "eviction: none ({})", d.no_eviction_reason.as_deref().unwrap_or("-")),
        }
    }
}

/// Each value of the policy as the kubelet's configuration names it, with the value and where
/// it came from (a file, a drop-in, a flag, or `default`).
pub fn value_origins(policy: &Policy, origins: &BTreeMap<String, String>) -> Vec<(String, String, String)> {
    let from = |key: &str| origins.get(key).cloned().unwrap_or_else(|| "default".to_owned());
    let mut rows = Vec::new();
    let mut row = |key: String, value: String| {
        // A minimum reclaim is one per signal, shared by its hard and soft thresholds.
        if !rows.iter().any(|(k, _, _)| *k == key) {
            let f = from(&key);
            rows.push((key, value, f));
        }
    };
    for t in policy.thresholds.iter().filter(|t| !t.signal.as_str().starts_with("allocatable")) {
        let s = t.signal.as_str();
        let field = if t.is_hard() { "evictionHard" } else { "evictionSoft" };
        row(format!("{field}[{s}]"), t.value.to_string());
        if !t.is_hard() {
            row(format!("evictionSoftGracePeriod[{s}]"), crate::godur::format(t.grace_period_ns));
        }
        if let Some(m) = t.min_reclaim {
            row(format!("evictionMinimumReclaim[{s}]"), m.to_string());
        }
    }
    let ns = crate::godur::format;
    row("evictionPressureTransitionPeriod".into(), ns(policy.pressure_transition_period_ns));
    row("evictionMaxPodGracePeriod".into(), policy.max_pod_grace_period_seconds.to_string());
    row("enforceNodeAllocatable".into(), policy.enforce_node_allocatable.join(","));
    row("localStorageCapacityIsolation".into(), policy.local_storage_capacity_isolation.to_string());
    row("imageMinimumGCAge".into(), ns(policy.image_minimum_gc_age_ns));
    rows
}

/// `check-config`'s JSON: the policy, and each value with where it came from.
pub fn check_config_json(policy: &Policy, origins: &BTreeMap<String, String>) -> Value {
    let mut v = policy.to_json();
    let values: serde_json::Map<String, Value> = value_origins(policy, origins)
        .into_iter()
        .map(|(k, value, from)| (k, json!({ "value": value, "from": from })))
        .collect();
    v["values"] = Value::Object(values);
    v
}

/// `check-config`'s table, then each value with where it came from.
pub fn check_config_table(
    policy: &Policy,
    origins: &BTreeMap<String, String>,
    out: &mut impl Write,
) -> std::io::Result<()> {
    thresholds_table(policy, out)?;
    writeln!(out, "\n{:<48} {:>10}  from", "setting", "value")?;
    for (key, value, from) in value_origins(policy, origins) {
        writeln!(out, "{key:<48} {value:>10}  {from}")?;
    }
    Ok(())
}

fn thresholds_table(policy: &Policy, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(out, "{:<30} {:<5} {:>10} {:>10} {:>12}", "signal", "kind", "value", "grace", "min-reclaim")?;
    for t in &policy.thresholds {
        writeln!(
            out,
            "{:<30} {:<5} {:>10} {:>10} {:>12}",
            t.signal.as_str(),
            if t.is_hard() { "hard" } else { "soft" },
            t.value.to_string(),
            crate::godur::format(t.grace_period_ns),
            t.min_reclaim.map_or("-".into(), |m| m.to_string()),
        )?;
    }
    Ok(())
}

pub fn simulate(
    session: &mut Session,
    summary_path: &Path,
    json_out: bool,
    out: &mut impl Write,
) -> Result<(), OfflineError> {
    let text = std::fs::read_to_string(summary_path).map_err(|error| OfflineError::Read {
        what: format!("summary file {}", summary_path.display()),
        error,
    })?;
    let step = session.step(&text, &summary_path.display().to_string(), false)?;
    if json_out {
        serde_json::to_writer(&mut *out, &session.step_json(&step))?;
        writeln!(out)?;
    } else {
        session.write_table(&step, out)?;
    }
    Ok(())
}

/// One Summary per line, in time order; a step whose clock goes backwards is an error.
pub fn replay(
    session: &mut Session,
    input: impl BufRead,
    name: &str,
    json_out: bool,
    out: &mut impl Write,
) -> Result<(), OfflineError> {
    let mut last = None;
    for (n, line) in input.lines().enumerate() {
        let line = line.map_err(|error| OfflineError::Read { what: name.into(), error })?;
        if line.trim().is_empty() {
            continue;
        }
        let what = format!("{name}:{}", n + 1);
        let step = session.step(&line, &what, true)?;
        if let (Some(prev), Some(t)) = (last, step.time_ns)
            && t < prev
        {
            return Err(OfflineError::TimeBackwards { what, time: summary::format_time(t) });
        }
        last = step.time_ns;
        if json_out {
            let mut v = session.step_json(&step);
            if let (Some(o), Some(t)) = (v.as_object_mut(), step.time_ns) {
                o.insert("time".into(), summary::format_time(t).into());
            }
            serde_json::to_writer(&mut *out, &v)?;
            writeln!(out)?;
        } else {
            session.write_table(&step, out)?;
            writeln!(out)?;
        }
    }
    Ok(())
}
