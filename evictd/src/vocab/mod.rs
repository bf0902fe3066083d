//! The words every layer of the daemon uses: what woke a pass, which tier wakes evictd on
//! memory growth, where a pod's spec came from, and what an eviction is (its cause, its
//! phases, its record). The kubelet keeps the same kind of leaf in `eviction/api/types.go`.
//!
//! A leaf: nothing here imports any other module of the daemon, so every layer can import
//! it without an import ever running back up the data path (a test over the `use` lines,
//! `tests/tests/layers.rs`, keeps it so).

pub mod eviction;
pub mod metrics;
pub mod spec;
pub mod wake;

pub use eviction::{
    EmergencyCause, Escalation, EvictionCause, EvictionRecord, FastKill, KillMethod, KillReport, OnKilled,
    Phases, Urgency,
};
pub use spec::SpecSource;
pub use wake::{ChargeTier, WakeCause, monotonic_ns};
