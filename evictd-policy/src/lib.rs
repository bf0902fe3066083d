//! The kubelet's node-pressure eviction policy, and nothing else: no kernel, no runtime, no
//! clock. Everything here is a function of its inputs, so the daemon, `evictd simulate` and
//! `evictd replay` decide with the very same code, and all of it builds and tests with the
//! stable toolchain alone.
//!
//! Reading order follows the kubelet's eviction manager: `flags` and `kubelet_config` (what
//! the operator configures) → `policy` (`ParseThresholdConfig`: signals and thresholds) →
//! `summary`, `podspec`, `observations` (what the node and its pods look like) → `engine`
//! (`synchronize`: one decision) → `rank` (which pod, and node-level reclaim first) →
//! `offline` (the engine on recorded documents).

#![forbid(unsafe_code)]

pub mod distance;
pub mod engine;
pub mod flags;
pub mod godur;
pub mod kubelet_config;
pub mod kubelet_process;
pub mod local_storage;
pub mod observations;
pub mod offline;
pub mod podspec;
pub mod policy;
pub mod quantity;
pub mod rank;
pub mod signal;
pub mod summary;
#[cfg(test)]
mod test_pod;
