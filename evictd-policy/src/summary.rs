//! The kubelet Summary API document (`/api/v1/nodes/<node>/proxy/stats/summary`), as far as
//! eviction reads it. Every number is optional, as in the API: a missing one means "not
//! observed", never zero.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub node: NodeStats,
    #[serde(default)]
    pub pods: Vec<PodStats>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    #[serde(default)]
    pub node_name: String,
    #[serde(default)]
    pub system_containers: Vec<ContainerStats>,
    pub memory: Option<MemoryStats>,
    pub fs: Option<FsStats>,
    pub runtime: Option<RuntimeStats>,
    pub rlimit: Option<RlimitStats>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    pub image_fs: Option<FsStats>,
    pub container_fs: Option<FsStats>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: Option<String>,
    pub available_bytes: Option<u64>,
    pub usage_bytes: Option<u64>,
    pub working_set_bytes: Option<u64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub time: Option<String>,
    pub available_bytes: Option<u64>,
    pub capacity_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub inodes_free: Option<u64>,
    pub inodes: Option<u64>,
    pub inodes_used: Option<u64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RlimitStats {
    pub time: Option<String>,
    pub maxpid: Option<i64>,
    pub curproc: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    pub memory: Option<MemoryStats>,
    pub rootfs: Option<FsStats>,
    pub logs: Option<FsStats>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodRef {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    pub name: String,
    pub used_bytes: Option<u64>,
    pub inodes_used: Option<u64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ProcessStats {
    pub process_count: Option<u64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodRef,
    #[serde(default)]
    pub containers: Vec<ContainerStats>,
    pub memory: Option<MemoryStats>,
    #[serde(default)]
    pub volume: Vec<VolumeStats>,
    #[serde(rename = "ephemeral-storage")]
    pub ephemeral_storage: Option<FsStats>,
    /// Spelled in snake case in the API, unlike its neighbours.
    #[serde(rename = "process_stats")]
    pub process_stats: Option<ProcessStats>,
}

impl Summary {
    /// Pod stats by pod UID.
    pub fn pods_by_uid(&self) -> BTreeMap<&str, &PodStats> {
        self.pods.iter().map(|p| (p.pod_ref.uid.as_str(), p)).collect()
    }
}

/// The newest `time` anywhere in a Summary document, in ns since the epoch: the clock of an
/// offline step. Works on the raw JSON so that no timestamp is missed.
pub fn newest_time(doc: &serde_json::Value) -> Option<i64> {
    match doc {
        serde_json::Value::Object(m) => m
            .iter()
            .filter_map(|(k, v)| match (k.as_str(), v) {
                ("time", serde_json::Value::String(s)) => parse_time(s).ok(),
                _ => newest_time(v),
            })
            .max(),
        serde_json::Value::Array(a) => a.iter().filter_map(newest_time).max(),
        _ => None,
    }
}

/// A Summary timestamp that is not the RFC 3339 UTC time the kubelet writes.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TimeError {
    #[error("invalid time {text:?}: {reason} (expected RFC 3339 in UTC, e.g. 2024-05-01T10:00:00Z)")]
    Invalid { text: String, reason: String },
    #[error("time {0:?} is before 1970")]
    BeforeEpoch(String),
    #[error("time {0:?} is out of range")]
    OutOfRange(String),
}

/// An RFC 3339 time (`2024-05-01T10:00:00Z`, fractions allowed) as ns since the epoch.
pub fn parse_time(s: &str) -> Result<i64, TimeError> {
    let t = humantime::parse_rfc3339_weak(s.trim_end_matches('Z'))
        .map_err(|e| TimeError::Invalid { text: s.into(), reason: e.to_string() })?;
    let d = t.duration_since(std::time::UNIX_EPOCH).map_err(|_| TimeError::BeforeEpoch(s.into()))?;
    i64::try_from(d.as_nanos()).map_err(|_| TimeError::OutOfRange(s.into()))
}

/// ns since the epoch as RFC 3339 UTC with seconds.
pub fn format_time(ns: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_time_walks_the_whole_document() {
        let doc = serde_json::json!({
            "node": {"memory": {"time": "2024-05-01T10:00:00Z"}, "fs": {"time": "2024-05-01T10:00:05Z"}},
            "pods": [{"memory": {"time": "2024-05-01T10:00:07Z"}}]
        });
        assert_eq!(newest_time(&doc), parse_time("2024-05-01T10:00:07Z").ok());
        assert_eq!(format_time(parse_time("2024-05-01T10:00:07Z").unwrap()), "2024-05-01T10:00:07Z");
        assert!(parse_time("yesterday").is_err());
        assert_eq!(parse_time("1970-01-01T00:00:01.5Z"), Ok(1_500_000_000));
    }
}
