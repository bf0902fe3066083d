//! The act step: stop the chosen pod through the CRI, as the kubelet does — StopContainer
//! with the engine's grace period for every container (in parallel), then StopPodSandbox —
//! and wait, bounded, until the pod's cgroup holds no process, i.e. its memory is released.
//! Each phase is timed for the eviction log.
//!
//! A completed stop is the eviction. A pod whose cgroup still holds a process afterwards (one
//! stuck in D state, or not the runtime's) is reported as slow to release, never as a failed
//! eviction: that would send the next candidate to its death too.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use evictd_policy::engine::HARD_EVICTION_GRACE_SECONDS as HARD_GRACE_SECONDS;
use tokio::sync::watch;

use crate::runtime::{
    cri::{CriClient, CriError},
    inventory::PodRecord,
    usage::cgroup_tree_empty,
};

/// How long each phase of an eviction took, in milliseconds.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Phases {
    pub stop_containers_ms: f64,
    pub stop_sandbox_ms: f64,
    /// `None`: the pod's cgroup still held a process when `--release-timeout` ran out.
    pub memory_released_ms: Option<f64>,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

#[derive(Debug, thiserror::Error)]
pub enum EvictError {
    #[error("stopping {pod}: {source}")]
    Cri { pod: String, source: CriError },
}

impl EvictError {
    /// The runtime, not this pod, is at fault: another pod would fail the same way.
    pub fn runtime_unavailable(&self) -> bool {
        match self {
            EvictError::Cri { source, .. } => source.is_unavailable(),
        }
    }
}

/// Stops `pod` with `grace_seconds` for each container. `cgroup` is the pod's memory cgroup
/// directory, watched until empty (`None`: the runtime's word is taken). When `escalate`
/// turns true while a longer grace period runs (a hard threshold is met meanwhile), the
/// containers are stopped again with the hard eviction's 1 s: a hard threshold never waits
/// behind a soft eviction's grace.
pub async fn evict(
    client: &CriClient,
    pod: &PodRecord,
    grace_seconds: i64,
    cgroup: Option<PathBuf>,
    release_timeout: Duration,
    escalate: Option<watch::Receiver<bool>>,
) -> Result<Phases, EvictError> {
    let name = format!("{}/{}", pod.namespace, pod.name);
    let cri_err = |source| EvictError::Cri { pod: name.clone(), source };
    let mut phases = Phases::default();

    let t = Instant::now();
    stop_containers(client, pod, grace_seconds, escalate).await.map_err(cri_err)?;
    phases.stop_containers_ms = ms(t);

    let t = Instant::now();
    client.stop_pod_sandbox(&pod.sandbox_id).await.map_err(cri_err)?;
    phases.stop_sandbox_ms = ms(t);

    let t = Instant::now();
    let released = match &cgroup {
        Some(dir) => released_within(dir, release_timeout).await,
        None => true,
    };
    phases.memory_released_ms = released.then(|| ms(t));
    if !released && let Some(dir) = cgroup {
        tracing::warn!(
            pod = %name,
            "stopped, but its cgroup {} still holds a process after {release_timeout:?} (stuck in D state, \
             or not the runtime's); the eviction stands",
            dir.display()
        );
    }
    Ok(phases)
}

/// StopContainer for every running container, in parallel. Every stop is waited for, also
/// when one fails, so that no stop is still under way in the runtime when the caller moves
/// on (to the next candidate, say); the first error is returned.
async fn stop_containers(
    client: &CriClient,
    pod: &PodRecord,
    grace_seconds: i64,
    mut escalate: Option<watch::Receiver<bool>>,
) -> Result<(), CriError> {
    let mut stops = tokio::task::JoinSet::new();
    let spawn_stops = |stops: &mut tokio::task::JoinSet<_>, grace: i64| {
        for c in pod.containers.iter().filter(|c| c.running) {
            let client = client.clone();
            let id = c.id.clone();
            stops.spawn(async move { client.stop_container(&id, grace).await });
        }
    };
    spawn_stops(&mut stops, grace_seconds);
    let mut escalated = grace_seconds <= HARD_GRACE_SECONDS;
    let mut first_error = None;
    loop {
        tokio::select! {
            r = stops.join_next() => {
                let Some(r) = r else { break };
                if let Err(e) = r.unwrap_or_else(|join| Err(join_error(client, join))) {
                    first_error.get_or_insert(e);
                }
            }
            () = hard_threshold_met(&mut escalate), if !escalated => {
                escalated = true;
                tracing::warn!(
                    pod = %format!("{}/{}", pod.namespace, pod.name),
                    "a hard threshold is met during the {grace_seconds} s grace period: stopping with {HARD_GRACE_SECONDS} s"
                );
                spawn_stops(&mut stops, HARD_GRACE_SECONDS);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Resolves when the escalation flag turns true; never without one.
async fn hard_threshold_met(escalate: &mut Option<watch::Receiver<bool>>) {
    if let Some(rx) = escalate
        && rx.wait_for(|v| *v).await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

fn join_error(client: &CriClient, join: tokio::task::JoinError) -> CriError {
    CriError::Call {
        endpoint: client.endpoint().into(),
        call: "StopContainer",
        status: Box::new(tonic::Status::internal(join.to_string())),
    }
}

/// Whether the cgroup tree at `dir` holds no process within `timeout`.
async fn released_within(dir: &std::path::Path, timeout: Duration) -> bool {
    let t = Instant::now();
    while !cgroup_tree_empty(dir) {
        if t.elapsed() > timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    true
}
