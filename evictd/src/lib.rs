//! evictd: the kubelet's node-pressure eviction policy, woken by the kernel.
//!
//! The folders follow the data path, wake → observe → decide → act → report:
//!
//! - `wake`: the sources that say "look now" (eBPF ring buffer, cgroup v1 eventfd
//!   thresholds, PSI triggers, the polls, the timer), each file holding a source's
//!   registration, its waiting task, and `metrics` the sources' own families;
//! - `kernel`: what the eBPF source stands on: loading and attaching the programs, BTF,
//!   tracefs;
//! - `node`: observe: cgroup mounts and names, memory.available, the node's signals, the
//!   daemon's own pod;
//! - decide: the `evictd_policy` crate (pure), driven by `daemon::pressure`;
//! - `runtime`: act: the CRI client, the pod inventory and inferred specs, pod usage, the
//!   eviction itself and node-level reclaim;
//! - `cluster`: the Kubernetes API: the pod watch that feeds the inventory, and each
//!   eviction recorded as the kubelet records it (the pod's status, events), evictd's node
//!   conditions, sent off the pressure path;
//! - `report`: `--trace`, and the Prometheus metrics the components register, composed;
//! - `daemon`: building the daemon from its options and the loop that ties the rest
//!   together; `cli`: flags → options, and the commands (`probe`, the offline ones);
//! - `vocab`: the words all of them share (a wake's cause, the charge tier, a spec's
//!   source, an eviction's record and phases), importing none of them.
//!
//! Imports run one way, down `LAYERS`: a module imports only the modules listed after it
//! (`tests/tests/layers.rs` checks every `use` line).

pub mod cli;
pub mod cluster;
pub mod daemon;
pub mod kernel;
pub mod node;
pub mod report;
pub mod runtime;
pub mod vocab;
pub mod wake;

/// The modules from the top down: each may import only those after it. `kernel` and `node`
/// sit below `wake` because the sources stand on them; `cluster` below `report` because the
/// report composes the API link's metrics; `vocab` at the bottom, importing none of them.
pub const LAYERS: [&str; 9] =
    ["cli", "daemon", "report", "cluster", "runtime", "wake", "kernel", "node", "vocab"];

/// For unit tests that need something of this machine (BTF, a v1 memory hierarchy): say why
/// they cannot run, loudly (libtest swallows `eprintln!`), or, where privileged tests are
/// required (`EVICTD_REQUIRE_PRIVILEGED=1`, set by CI), fail.
#[cfg(test)]
pub(crate) fn skip(test: &str, reason: &str) {
    use std::io::Write as _;
    if std::env::var("EVICTD_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1") {
        panic!("{test}: cannot run ({reason}) and EVICTD_REQUIRE_PRIVILEGED=1");
    }
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {reason}");
}
