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
pub mod evict;
pub mod inventory;
pub mod memcg_threshold;
pub mod memory;
pub mod metrics;
pub mod node_signals;
pub mod pressure;
pub mod probe;
pub mod psi;
pub mod reclaim;
pub mod stat_items;
pub mod trace;
pub mod tracefs;
pub mod units;
pub mod wake;
