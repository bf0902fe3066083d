//! evictd: the kubelet's node-pressure eviction policy, woken by the kernel.
//!
//! The folders follow the data path, one direction:
//!
//! - `wake`: the sources that say "look now" (eBPF ring buffer, cgroup v1 eventfd
//!   thresholds, PSI triggers, the timer), each file holding a source's registration and its
//!   waiting task;
//! - `kernel`: what the eBPF source stands on: loading and attaching the programs, BTF,
//!   tracefs, and `evictd probe`;
//! - `node`: observe: cgroup mounts and names, memory.available, the node's signals, the
//!   daemon's own pod;
//! - decide: the `evictd_policy` crate (pure), driven by `daemon::pressure`;
//! - `runtime`: act: the CRI client, the pod inventory and inferred specs, pod usage, the
//!   eviction itself and node-level reclaim;
//! - `report`: eviction records, `--trace`, Prometheus metrics;
//! - `cluster`: the Kubernetes API: each eviction recorded as the kubelet records it (the
//!   pod's status, events), evictd's node conditions, sent off the pressure path;
//! - `daemon`: building the daemon from its options and the loop that ties the rest
//!   together; `cli`: flags → options.

pub mod cli;
pub mod cluster;
pub mod daemon;
pub mod kernel;
pub mod node;
pub mod report;
pub mod runtime;
pub mod wake;

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
