//! Signal observations: `available` and `capacity` per signal, with the time the stats were
//! taken. Built from a Summary document (offline) or read from the node (`node_signals`);
//! the engine sees only this, so both paths decide identically.

use std::collections::BTreeMap;

use crate::{
    policy::Signal,
    summary::{FsStats, MemoryStats, Summary, TimeError, parse_time},
};

/// A Summary whose stats carry a time that cannot be read; names the field.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{field}.time: {error}")]
pub struct ObservationError {
    pub field: &'static str,
    pub error: TimeError,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    pub available: i64,
    pub capacity: i64,
    /// ns since the epoch; `None` counts as always fresh (as a zero time does for the kubelet).
    pub time_ns: Option<i64>,
}

pub type Observations = BTreeMap<Signal, Observation>;

fn time(t: &Option<String>, field: &'static str) -> Result<Option<i64>, ObservationError> {
    t.as_deref().map(|s| parse_time(s).map_err(|error| ObservationError { field, error })).transpose()
}

fn memory(m: &MemoryStats, what: &'static str) -> Result<Option<Observation>, ObservationError> {
    Ok(match (m.available_bytes, m.working_set_bytes) {
        (Some(a), Some(ws)) => Some(Observation {
            available: a as i64,
            capacity: (a + ws) as i64,
            time_ns: time(&m.time, what)?,
        }),
        _ => None,
    })
}

fn fs(
    f: &FsStats,
    what: &'static str,
    bytes: Signal,
    inodes: Signal,
    out: &mut Observations,
) -> Result<(), ObservationError> {
    let t = time(&f.time, what)?;
    if let (Some(a), Some(c)) = (f.available_bytes, f.capacity_bytes) {
        out.insert(bytes, Observation { available: a as i64, capacity: c as i64, time_ns: t });
    }
    if let (Some(a), Some(c)) = (f.inodes_free, f.inodes) {
        out.insert(inodes, Observation { available: a as i64, capacity: c as i64, time_ns: t });
    }
    Ok(())
}

/// The kubelet's `makeSignalObservations`: a signal is observed only when both of its
/// numbers are present.
pub fn from_summary(s: &Summary) -> Result<Observations, ObservationError> {
    let mut out = Observations::new();
    let n = &s.node;
    if let Some(m) = &n.memory
        && let Some(o) = memory(m, "node.memory")?
    {
        out.insert(Signal::MemoryAvailable, o);
    }
    if let Some(m) = n.system_containers.iter().find(|c| c.name == "pods").and_then(|c| c.memory.as_ref())
        && let Some(o) = memory(m, "node.systemContainers[pods].memory")?
    {
        out.insert(Signal::AllocatableMemoryAvailable, o);
    }
    if let Some(f) = &n.fs {
        fs(f, "node.fs", Signal::NodeFsAvailable, Signal::NodeFsInodesFree, &mut out)?;
    }
    if let Some(rt) = &n.runtime {
        if let Some(f) = &rt.image_fs {
            fs(f, "node.runtime.imageFs", Signal::ImageFsAvailable, Signal::ImageFsInodesFree, &mut out)?;
        }
        if let Some(f) = &rt.container_fs {
            fs(
                f,
                "node.runtime.containerFs",
                Signal::ContainerFsAvailable,
                Signal::ContainerFsInodesFree,
                &mut out,
            )?;
        }
    }
    if let Some(r) = &n.rlimit
        && let (Some(max), Some(cur)) = (r.maxpid, r.curproc)
    {
        out.insert(
            Signal::PidAvailable,
            Observation { available: max - cur, capacity: max, time_ns: time(&r.time, "node.rlimit")? },
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observed_only_when_both_numbers_exist() {
        let s: Summary = serde_json::from_value(serde_json::json!({
            "node": {
                "memory": {"time": "2024-01-01T00:00:00Z", "availableBytes": 1000, "workingSetBytes": 24},
                "systemContainers": [{"name": "pods", "memory": {"availableBytes": 10}}],
                "fs": {"availableBytes": 5, "capacityBytes": 50, "inodesFree": 7},
                "runtime": {"imageFs": {"availableBytes": 1, "capacityBytes": 2, "inodesFree": 3, "inodes": 4}},
                "rlimit": {"maxpid": 100, "curproc": 30}
            }
        }))
        .unwrap();
        let o = from_summary(&s).unwrap();
        let m = o[&Signal::MemoryAvailable];
        assert_eq!((m.available, m.capacity), (1000, 1024));
        assert!(m.time_ns.is_some());
        assert!(!o.contains_key(&Signal::AllocatableMemoryAvailable), "no workingSet, no observation");
        assert_eq!(o[&Signal::NodeFsAvailable].capacity, 50);
        assert!(!o.contains_key(&Signal::NodeFsInodesFree), "no inodes total, no observation");
        assert_eq!(o[&Signal::ImageFsInodesFree].available, 3);
        assert!(!o.contains_key(&Signal::ContainerFsAvailable));
        assert_eq!(o[&Signal::PidAvailable].available, 70);
    }

    #[test]
    fn bad_times_name_the_field() {
        let s: Summary = serde_json::from_value(serde_json::json!({
            "node": {"memory": {"time": "noon", "availableBytes": 1, "workingSetBytes": 1}}
        }))
        .unwrap();
        let e = from_summary(&s).unwrap_err();
        assert!(e.to_string().contains("node.memory.time"), "{e}");
    }
}
