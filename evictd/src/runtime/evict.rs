//! The act step: stop the chosen pod through the CRI, as the kubelet does — StopContainer
//! with the engine's grace period for every container (in parallel), then StopPodSandbox —
//! and wait, bounded, until the pod's cgroup holds no process, i.e. its memory is released.
//! Each phase is timed for the eviction log.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

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
    pub memory_released_ms: f64,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

#[derive(Debug, thiserror::Error)]
pub enum EvictError {
    #[error("stopping {pod}: {source}")]
    Cri { pod: String, source: CriError },
    #[error("{pod}: its cgroup {cgroup} still has processes {waited:?} after the stop")]
    NotReleased { pod: String, cgroup: String, waited: Duration },
}

/// Stops `pod` with `grace_seconds` for each container. `cgroup` is the pod's memory cgroup
/// directory, watched until empty (`None`: the runtime's word is taken).
pub async fn evict(
    client: &CriClient,
    pod: &PodRecord,
    grace_seconds: i64,
    cgroup: Option<PathBuf>,
    release_timeout: Duration,
) -> Result<Phases, EvictError> {
    let name = format!("{}/{}", pod.namespace, pod.name);
    let cri_err = |source| EvictError::Cri { pod: name.clone(), source };
    let mut phases = Phases::default();

    let t = Instant::now();
    let mut stops = tokio::task::JoinSet::new();
    for c in pod.containers.iter().filter(|c| c.running) {
        let client = client.clone();
        let id = c.id.clone();
        stops.spawn(async move { client.stop_container(&id, grace_seconds).await });
    }
    while let Some(r) = stops.join_next().await {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(cri_err(e)),
            Err(join) => {
                return Err(EvictError::Cri {
                    pod: name.clone(),
                    source: CriError::Call {
                        endpoint: client.endpoint().into(),
                        call: "StopContainer",
                        status: Box::new(tonic::Status::internal(join.to_string())),
                    },
                });
            }
        }
    }
    phases.stop_containers_ms = ms(t);

    let t = Instant::now();
    client.stop_pod_sandbox(&pod.sandbox_id).await.map_err(cri_err)?;
    phases.stop_sandbox_ms = ms(t);

    let t = Instant::now();
    if let Some(dir) = cgroup {
        while !cgroup_tree_empty(&dir) {
            if t.elapsed() > release_timeout {
                return Err(EvictError::NotReleased {
                    pod: name,
                    cgroup: dir.display().to_string(),
                    waited: t.elapsed(),
                });
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    phases.memory_released_ms = ms(t);
    Ok(phases)
}
