//! evictd: the kubelet's node-pressure eviction policy, woken by the kernel.
//!
//! Data flows one way: wake sources (`wake`, fed by `ebpf`) → observe (`memory`) →
//! decide → act. See the README's architecture section.

// Daemon paths return errors; only tests may take the shortcut.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod btf_layout;
pub mod cgroup_layout;
pub mod cgroup_names;
pub mod cli;
pub mod cri;
pub mod daemon;
pub mod ebpf;
pub mod engine;
pub mod evict;
pub mod godur;
pub mod inventory;
pub mod kubelet_config;
pub mod memcg_threshold;
pub mod memory;
pub mod metrics;
pub mod node_signals;
pub mod observations;
pub mod offline;
pub mod podspec;
pub mod policy;
pub mod pressure;
pub mod probe;
pub mod psi;
pub mod quantity;
pub mod rank;
pub mod reclaim;
pub mod stat_items;
pub mod summary;
pub mod trace;
pub mod tracefs;
pub mod units;
pub mod wake;
