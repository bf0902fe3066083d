//! The Kubernetes API, off the pressure path. An eviction by evictd is a kill through the
//! runtime; what makes it stick is the record the kubelet would write — the pod's status
//! Failed/Evicted with the `DisruptionTarget` condition, the events — which the reporter
//! sends after the kill, from a queue of its own, retried with back-off. A slow or absent
//! API server never delays a kill.
//!
//! - `conditions`: evictd's node conditions, kept as last decided;
//! - `connect`: the client, from `--kubeconfig` or the pod's service account;
//! - `metrics`: the API calls by outcome, the time to record an eviction;
//! - `pods`: the specs of the pods bound to this node, watched (read-only, also in a dry run);
//! - `records`: the bodies the kubelet writes (pure);
//! - `reporter`: the queue and the task that sends it;
//! - `taints`: evictd's taints on its Node while its conditions are true.

pub mod conditions;
pub mod connect;
pub mod metrics;
pub mod pods;
pub mod records;
pub mod reporter;
pub mod taints;
