//! The act step: stop the chosen pod through the CRI, as the kubelet does — StopContainer
//! with the engine's grace period for every container (in parallel), then StopPodSandbox —
//! and wait, bounded, until the pod's cgroup holds no process, i.e. its memory is released.
//! Each phase is timed for the eviction log.
//!
//! Where waiting would let the kernel's OOM killer act first, the pod is killed by evictd
//! itself (`kill`) and the CRI stop only does the runtime's bookkeeping: at once when the
//! hard eviction's grace period is 0, or in the middle of a stop when the daemon raises the
//! urgency to `Emergency`. A stop under way when a hard threshold is met (`Hard`) has its
//! grace period cut to the hard eviction's.
//!
//! A completed stop is the eviction. A pod whose cgroup still holds a process afterwards (one
//! stuck in D state, or not the runtime's) is reported as slow to release, never as a failed
//! eviction: that would send the next candidate to its death too.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use tokio::sync::watch;

use crate::{
    runtime::{
        cri::{CriClient, CriError},
        inventory::{ContainerRecord, PodRecord},
        kill::{self, KillTarget},
        usage::cgroup_tree_empty,
    },
    vocab::{Escalation, FastKill, KillMethod, OnKilled, Phases, Urgency, monotonic_ns},
};

/// How one pod is stopped.
pub struct StopPlan {
    /// The engine's grace period, or the hard eviction's as configured.
    pub grace_seconds: i64,
    /// What a stop is cut to when a hard threshold is met meanwhile.
    pub hard_grace_seconds: i64,
    /// The pod's cgroups, where known: looked at for evictd's own process before any stop,
    /// where the pod is killed without the runtime when `fast_kill` says so, and whose memory
    /// directory is watched until empty (`None`: the runtime's word is taken).
    pub target: Option<KillTarget>,
    /// Whether the pod may be killed without the runtime (else the CRI only).
    pub fast_kill: bool,
    pub release_timeout: Duration,
    /// Called once evictd's fast kill has signalled the pod (see `OnKilled`).
    pub on_killed: Option<OnKilled>,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

#[derive(Debug, thiserror::Error)]
pub enum EvictError {
    #[error("stopping {pod}: {source}")]
    Cri { pod: String, source: CriError },
    #[error("not stopping {pod}: its cgroup {} holds evictd itself, or cannot be listed", dir.display())]
    HoldsEvictd { pod: String, dir: PathBuf },
}

impl EvictError {
    /// The runtime, not this pod, is at fault: another pod would fail the same way.
    pub fn runtime_unavailable(&self) -> bool {
        match self {
            EvictError::Cri { source, .. } => source.is_unavailable(),
            EvictError::HoldsEvictd { .. } => false,
        }
    }
}

/// Stops `pod` as `plan` says: its containers, then its sandbox. `urgency` is raised by the
/// daemon while the stop runs. The memory is not waited for here (`wait_released`), so that
/// the caller can record the eviction the moment the pod is stopped.
pub async fn stop(
    client: &CriClient,
    pod: &PodRecord,
    plan: &StopPlan,
    urgency: Option<watch::Receiver<Escalation>>,
) -> Result<Phases, EvictError> {
    let name = format!("{}/{}", pod.namespace, pod.name);
    let cri_err = |source| EvictError::Cri { pod: name.clone(), source };
    let mut phases = Phases::default();

    // The engine never picks evictd's own pod when it recognises it; this holds when it
    // does not (a pod UID it could not read).
    if let Some(target) = &plan.target
        && kill::holds_evictd(target)
    {
        return Err(EvictError::HoldsEvictd { pod: name, dir: target.memory_dir().to_path_buf() });
    }
    let t = Instant::now();
    let mut stop = Stop { client, pod, name: &name, plan, urgency, fast_kill: None };
    if plan.grace_seconds <= 0 {
        stop.kill_now(Urgency::Hard).await;
    }
    let stopped = stop.stop_containers().await;
    phases.fast_kill = stop.fast_kill.take();
    phases.stop_containers_ms = ms(t);
    if let Some(e) = judge_container_stops(stopped, &name, pod, plan, &mut phases) {
        return Err(cri_err(e));
    }

    // The containers are dead, or some of them: the eviction is done. A sandbox the runtime
    // is too slow or too broken to stop now is its bookkeeping, not a reason to evict another
    // pod (a container left running is named in `still_running`); after a
    // fast kill it gets the CRI timeout, not the runtime request timeout, so a struggling
    // runtime does not hold the next decision for minutes.
    let t = Instant::now();
    let sandbox_client = match phases.fast_kill {
        Some(_) => client.clone().with_stop_timeout(client.timeout()),
        None => client.clone(),
    };
    match sandbox_client.stop_pod_sandbox_confirmed(&pod.sandbox_id).await {
        // The sandbox's stop ends every container in it.
        Ok(()) => phases.still_running.clear(),
        Err(e) => phases.warn(&name, format!("StopPodSandbox after the containers died: {e}")),
    }
    phases.stop_sandbox_ms = ms(t);
    Ok(phases)
}

/// Whether the containers' stops make the eviction: `None` when they do (their failures
/// become warnings in `phases`), or the runtime's error that makes it a failed one.
fn judge_container_stops(
    stopped: Stopped,
    name: &str,
    pod: &PodRecord,
    plan: &StopPlan,
    phases: &mut Phases,
) -> Option<CriError> {
    match stopped {
        Stopped { failed: None, .. } => None,
        // The fast kill ran and the pod's cgroup holds no process: the containers are dead
        // whatever the runtime answered, and the eviction stands.
        Stopped { failed: Some(e), .. } if phases.fast_kill.is_some() && killed_to_the_last_process(plan) => {
            phases.warn(name, format!("StopContainer after the fast kill: {e}"));
            None
        }
        // The fast kill signalled the pod, and processes are left (a pod still forking past
        // the rounds of signals, a process in uninterruptible sleep): the pod was hit all the
        // same, and is this decision's eviction; taking the next candidate would leave two
        // pods hit. Its containers stay rankable once the runtime lists them running.
        Stopped { failed: Some(e), not_stopped } if phases.fast_kill.as_ref().is_some_and(hit_the_pod) => {
            phases.warn(name, format!("the fast kill left processes and StopContainer failed: {e}"));
            phases.still_running = not_stopped;
            None
        }
        // Some of its containers are stopped: the pod is this decision's eviction, whatever
        // the others did (the sandbox's stop ends them). Taking the next candidate would
        // leave two pods hit for one decision.
        Stopped { failed: Some(e), not_stopped } if not_stopped.len() < running(pod).count() => {
            phases
                .warn(name, format!("StopContainer failed for a container whose pod's others stopped: {e}"));
            phases.still_running = not_stopped;
            None
        }
        Stopped { failed: Some(e), .. } => Some(e),
    }
}

/// Whether a fast kill hit the pod: `cgroup.kill` written (the kernel killed its whole tree),
/// or processes signalled (a kill that found none to pin hit nothing).
fn hit_the_pod(kill: &FastKill) -> bool {
    kill.report.method == KillMethod::CgroupKill || kill.report.processes > 0
}

/// Whether the pod's cgroup is known and holds no process any more.
fn killed_to_the_last_process(plan: &StopPlan) -> bool {
    plan.memory_dir().is_some_and(cgroup_tree_empty)
}

impl StopPlan {
    /// The pod's memory cgroup directory, where known.
    fn memory_dir(&self) -> Option<&Path> {
        self.target.as_ref().map(KillTarget::memory_dir)
    }
}

/// Waits, bounded by `--release-timeout`, until the stopped pod's cgroup holds no process,
/// i.e. its memory is released, and notes how long that took in `phases`.
pub async fn wait_released(pod: &PodRecord, plan: &StopPlan, phases: &mut Phases) {
    let t = Instant::now();
    let released = match plan.memory_dir() {
        Some(dir) => released_within(dir, plan.release_timeout).await,
        None => true,
    };
    phases.memory_released_ms = released.then(|| ms(t));
    if !released && let Some(dir) = plan.memory_dir() {
        tracing::warn!(
            pod = %format!("{}/{}", pod.namespace, pod.name),
            "stopped, but its cgroup {} still holds a process after {:?} (stuck in D state, \
             or not the runtime's); the eviction stands",
            dir.display(),
            plan.release_timeout
        );
    }
}

/// How the containers' stops ended: the first error, and the containers not stopped.
struct Stopped {
    failed: Option<CriError>,
    not_stopped: Vec<String>,
}

/// The pod's running containers, which its stop stops.
fn running(pod: &PodRecord) -> impl Iterator<Item = &ContainerRecord> {
    pod.containers.iter().filter(|c| c.running)
}

/// The containers' stops under way, each answering with its container's id.
type ContainerStops = tokio::task::JoinSet<(String, Result<(), CriError>)>;

/// One stop under way.
struct Stop<'a> {
    client: &'a CriClient,
    pod: &'a PodRecord,
    /// `namespace/name`, for the log.
    name: &'a str,
    plan: &'a StopPlan,
    urgency: Option<watch::Receiver<Escalation>>,
    fast_kill: Option<FastKill>,
}

impl Stop<'_> {
    /// Kills the pod without the runtime, where the node allows it. A failure is logged and
    /// the CRI stop goes on: it is the eviction either way.
    async fn kill_now(&mut self, urgency: Urgency) {
        let Some(target) = self.plan.target.as_ref().filter(|_| self.plan.fast_kill) else { return };
        if self.fast_kill.is_some() {
            return;
        }
        let started_ns = monotonic_ns();
        match kill::fast_kill(target, self.plan.on_killed.as_ref()).await {
            Ok(report) => {
                tracing::info!(
                    pod = %self.name, ?urgency, method = ?report.method, processes = report.processes,
                    signalled_ms = report.signalled_ms, reaped = report.reaped, "fast kill"
                );
                // The reaps ran after the signal: take its own time, not now.
                let signalled_ns = started_ns + (report.signalled_ms * 1e6) as u64;
                self.fast_kill = Some(FastKill { urgency, signalled_ns, report });
            }
            Err(e) => tracing::warn!(pod = %self.name, "fast kill failed, the CRI stop goes on: {e}"),
        }
    }

    /// StopContainer for every running container, in parallel. Every stop is waited for,
    /// also when one fails, so that no stop is still under way in the runtime when the caller
    /// moves on (to the next candidate, say); the first error is returned, with the
    /// containers not stopped. Meanwhile a raised urgency cuts the grace period (`Hard`) or
    /// kills the pod at once (`Emergency`).
    async fn stop_containers(&mut self) -> Stopped {
        let mut stops = tokio::task::JoinSet::new();
        let grace = if self.fast_kill.is_some() { 0 } else { self.plan.grace_seconds };
        self.spawn_stops(&mut stops, grace);
        let mut reached = if grace <= self.plan.hard_grace_seconds { Urgency::Hard } else { Urgency::Normal };
        if self.fast_kill.is_some() {
            // Killed already: nothing more an emergency could do.
            reached = Urgency::Emergency;
        }
        let mut urgency = self.urgency.take();
        let mut first_error = None;
        let mut not_stopped: BTreeSet<String> = running(self.pod).map(|c| c.id.clone()).collect();
        let mut bookkeeping = self.bookkeeping_deadline();
        loop {
            tokio::select! {
                r = stops.join_next() => {
                    let Some(r) = r else { break };
                    match r.map_err(|join| join_error(self.client, join)) {
                        Ok((id, Ok(()))) => { not_stopped.remove(&id); }
                        Ok((_, Err(e))) | Err(e) => { first_error.get_or_insert(e); }
                    }
                }
                raised = raised_above(&mut urgency, reached), if reached < Urgency::Emergency => {
                    let was = std::mem::replace(&mut reached, raised.urgency);
                    self.escalate(raised, was, &mut stops).await;
                    bookkeeping = self.bookkeeping_deadline();
                }
                () = sleep_until(bookkeeping), if bookkeeping.is_some() => {
                    tracing::warn!(
                        pod = %self.name,
                        "killed; the runtime's stops still run after {:?}: not waited for",
                        self.client.timeout()
                    );
                    // Not cancelled: the runtime finishes its bookkeeping on its own.
                    stops.detach_all();
                    break;
                }
            }
        }
        Stopped { failed: first_error, not_stopped: not_stopped.into_iter().collect() }
    }

    /// Once the pod is killed without the runtime, the runtime's stops are bookkeeping:
    /// waited for at most the CRI timeout, not the runtime request timeout, so that a
    /// struggling runtime never holds the next decision for minutes.
    fn bookkeeping_deadline(&self) -> Option<tokio::time::Instant> {
        self.fast_kill.as_ref().map(|_| tokio::time::Instant::now() + self.client.timeout())
    }

    fn spawn_stops(&self, stops: &mut ContainerStops, grace: i64) {
        for c in running(self.pod) {
            let client = self.client.clone();
            let id = c.id.clone();
            stops.spawn(async move {
                let stopped = client.stop_container_confirmed(&id, grace).await;
                (id, stopped)
            });
        }
    }

    /// The urgency rose from `was` to `raised` while the stops run.
    async fn escalate(&mut self, raised: Escalation, was: Urgency, stops: &mut ContainerStops) {
        let (grace, hard) = (self.plan.grace_seconds, self.plan.hard_grace_seconds);
        // The grace period the stops run with now: a hard threshold met cut it to the hard one.
        let in_force = if was >= Urgency::Hard { grace.min(hard) } else { grace };
        match raised.urgency {
            Urgency::Normal => {}
            Urgency::Hard => {
                tracing::warn!(
                    pod = %self.name,
                    "a hard threshold is met during the {grace} s grace period: stopping with {hard} s"
                );
                self.spawn_stops(stops, hard);
            }
            Urgency::Emergency => {
                let why = raised.emergency.map_or_else(|| "an emergency".to_string(), |e| e.to_string());
                tracing::warn!(pod = %self.name, "{why} during the {in_force} s grace period: killing now");
                self.kill_now(Urgency::Emergency).await;
                // The runtime's stops learn of the exit on their own; one with grace 0 makes
                // sure none is left waiting out a grace period, and is the fastest kill there
                // is without the fast path.
                self.spawn_stops(stops, 0);
            }
        }
    }
}

/// Resolves at `deadline`; never without one (a `select!` arm that may have no deadline).
pub(crate) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Resolves with the urgency once it is above `reached`; never without a receiver, or once
/// the daemon has dropped its sender.
async fn raised_above(urgency: &mut Option<watch::Receiver<Escalation>>, reached: Urgency) -> Escalation {
    if let Some(rx) = urgency
        && let Ok(u) = rx.wait_for(|u| u.urgency > reached).await
    {
        return *u;
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
async fn released_within(dir: &Path, timeout: Duration) -> bool {
    let t = Instant::now();
    while !cgroup_tree_empty(dir) {
        if t.elapsed() > timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        node::cgroups::{CgroupMounts, CgroupVersion},
        runtime::{
            cri::scripted::{Script, scripted_runtime},
            inventory::tests::{container, record},
            kill::{self, KillTarget},
        },
        vocab::KillReport,
    };

    fn plan() -> StopPlan {
        StopPlan {
            grace_seconds: 1,
            hard_grace_seconds: 1,
            target: None,
            fast_kill: false,
            release_timeout: Duration::from_secs(1),
            on_killed: None,
        }
    }

    /// Once the pod's containers are dead, a sandbox the runtime fails to stop (a runtime
    /// struggling under the same memory pressure) is a warning on that eviction, not a
    /// failed eviction that would send the next candidate to its death too.
    #[tokio::test(flavor = "current_thread")]
    async fn a_sandbox_the_runtime_cannot_stop_after_the_containers_died_is_still_an_eviction() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("cri.sock");
        let script = Script { running_polls: Some(0), sandbox_stop_fails: true, ..Script::default() };
        scripted_runtime(&sock, script);
        let client = CriClient::new(sock.to_str().unwrap(), Duration::from_millis(300)).unwrap();
        let pod = record("/kubepods/podu", vec![container(None, None)]);
        let phases = stop(&client, &pod, &plan(), None).await.expect("the containers are dead: an eviction");
        assert_eq!(phases.warnings.len(), 1, "{:?}", phases.warnings);
        assert!(phases.warnings[0].contains("StopPodSandbox"), "{:?}", phases.warnings);
    }

    /// A stop through the runtime, even at the hard grace period, does not say the pod is
    /// killed: its processes may still allocate for that second, and the charge programs
    /// are what wakes evictd to make it an emergency kill.
    #[tokio::test(flavor = "current_thread")]
    async fn a_stop_through_the_runtime_is_not_a_kill() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("cri.sock");
        scripted_runtime(&sock, Script { running_polls: Some(0), ..Script::default() });
        let client = CriClient::new(sock.to_str().unwrap(), Duration::from_secs(5)).unwrap();
        let pod = record("/kubepods/podu", vec![container(None, None)]);
        let on_killed = OnKilled::new(|| panic!("a stop through the runtime was said to be a kill"));
        let at_hard = StopPlan { on_killed: Some(on_killed), ..plan() };
        stop(&client, &pod, &at_hard, None).await.expect("stopped");
    }

    /// Containers the runtime could not stop are a failed eviction.
    #[tokio::test(flavor = "current_thread")]
    async fn containers_the_runtime_cannot_stop_are_a_failed_eviction() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("cri.sock");
        scripted_runtime(
            &sock,
            Script { failing_stops: usize::MAX, running_polls: None, ..Script::default() },
        );
        let client = CriClient::new(sock.to_str().unwrap(), Duration::from_millis(300)).unwrap();
        let pod = record("/kubepods/podu", vec![container(None, None)]);
        let e = stop(&client, &pod, &plan(), None).await.expect_err("still running");
        assert!(e.to_string().contains("StopContainer"), "{e}");
    }

    /// A pod the fast kill signalled is the decision's eviction even when processes are left
    /// in its cgroup and the runtime's stops failed too (a pod still forking past the rounds
    /// of signals; a process in uninterruptible sleep): the pod was hit, and taking the next
    /// candidate would hit two. Its containers stay rankable.
    #[test]
    fn a_pod_the_fast_kill_hit_is_the_eviction_even_with_processes_left() {
        let dir = tempfile::tempdir().unwrap();
        // A fixture pod cgroup at `<dir>/pod` that keeps a process.
        std::fs::create_dir(dir.path().join("pod")).unwrap();
        std::fs::write(dir.path().join("pod/cgroup.procs"), "42\n").unwrap();
        let layout = CgroupMounts {
            memory_root: dir.path().into(),
            memory_version: CgroupVersion::V1,
            unified_root: None,
        };
        let pod = record("/kubepods/podu", vec![container(None, None)]);
        let ids: Vec<String> = running(&pod).map(|c| c.id.clone()).collect();
        let plan = StopPlan { target: Some(KillTarget::at(Path::new("pod"), &layout)), ..plan() };
        let failed = || Stopped {
            failed: Some(CriError::Timeout {
                endpoint: "unix:///cri.sock".into(),
                call: "StopContainer",
                timeout: Duration::from_secs(120),
            }),
            not_stopped: ids.clone(),
        };
        let after = |method, processes| Phases {
            fast_kill: Some(FastKill {
                urgency: Urgency::Hard,
                signalled_ns: 1,
                report: KillReport { method, processes, signalled_ms: 1.0, reaped: 0, reaped_ms: 1.0 },
            }),
            ..Phases::default()
        };
        let mut hit = after(KillMethod::Signals, 9);
        assert!(
            judge_container_stops(failed(), "ns/p", &pod, &plan, &mut hit).is_none(),
            "the eviction stands"
        );
        assert_eq!(hit.still_running, ids, "its containers stay rankable");
        assert_eq!(hit.warnings.len(), 1);
        let mut untouched = Phases::default();
        assert!(
            judge_container_stops(failed(), "ns/p", &pod, &plan, &mut untouched).is_some(),
            "without the fast kill, nothing of the pod stopped: a failed eviction"
        );
        assert!(
            judge_container_stops(failed(), "ns/p", &pod, &plan, &mut after(KillMethod::Signals, 0))
                .is_some(),
            "a fast kill that signalled no process hit nothing: a failed eviction"
        );
        // cgroup.kill written: the kernel killed the whole tree, whatever was pinned after.
        assert!(
            judge_container_stops(failed(), "ns/p", &pod, &plan, &mut after(KillMethod::CgroupKill, 0))
                .is_none(),
            "cgroup.kill hit it"
        );
    }

    /// A pod some of whose containers stopped is the decision's eviction, whatever the others
    /// did: the sandbox's stop ends them, and taking the next candidate would hit two pods
    /// for one decision. Here the runtime stops the first container it is asked to and fails
    /// every other stop, and reports every container running. Where the sandbox's stop fails
    /// too, the container left running is named, so that the pod is not taken for gone.
    #[tokio::test(flavor = "current_thread")]
    async fn a_pod_partly_stopped_is_still_the_eviction() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

        use k8s_cri::v1 as cri;
        for sandbox_fails in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let sock = dir.path().join("cri.sock");
            let stops = AtomicUsize::new(0);
            let failed = (tonic::Code::Unknown, "failed to kill container: ttrpc: closed");
            crate::runtime::cri::scripted::answering(&sock, move |path| {
                let answer = if path.ends_with("/StopContainer") {
                    if stops.fetch_add(1, SeqCst) == 0 { Ok(Vec::new()) } else { Err(failed) }
                } else if path.ends_with("/StopPodSandbox") && sandbox_fails {
                    Err(failed)
                } else if path.ends_with("/ContainerStatus") {
                    let running = cri::ContainerState::ContainerRunning as i32;
                    let status = cri::ContainerStatus { state: running, ..Default::default() };
                    Ok(prost::Message::encode_to_vec(&cri::ContainerStatusResponse {
                        status: Some(status),
                        ..Default::default()
                    }))
                } else if path.ends_with("/PodSandboxStatus") {
                    let state = if sandbox_fails {
                        cri::PodSandboxState::SandboxReady
                    } else {
                        cri::PodSandboxState::SandboxNotready
                    };
                    let status = cri::PodSandboxStatus { state: state as i32, ..Default::default() };
                    Ok(prost::Message::encode_to_vec(&cri::PodSandboxStatusResponse {
                        status: Some(status),
                        ..Default::default()
                    }))
                } else {
                    Ok(Vec::new())
                };
                (answer, Duration::ZERO)
            });
            let client = CriClient::new(sock.to_str().unwrap(), Duration::from_millis(300)).unwrap();
            let mut pod = record("/kubepods/podu", vec![container(None, None), container(None, None)]);
            pod.containers[1].id = "sidecar".into();
            let phases =
                stop(&client, &pod, &plan(), None).await.expect("one container stopped: the eviction");
            assert!(
                phases.warnings.iter().any(|w| w.contains("StopContainer failed") && w.contains("ttrpc")),
                "{:?}",
                phases.warnings
            );
            let left = if sandbox_fails { 1 } else { 0 };
            assert_eq!(phases.still_running.len(), left, "sandbox stop fails: {sandbox_fails}");
        }
        // Every container failing is still a failed eviction
        // (`containers_the_runtime_cannot_stop_are_a_failed_eviction`).
    }

    /// An emergency kills the pod at once; the stops a slow runtime is still carrying out
    /// are then its bookkeeping, waited for at most the CRI timeout, never the minutes of
    /// the runtime request timeout that would hold the next decision.
    #[tokio::test(flavor = "current_thread")]
    async fn an_emergency_kill_does_not_wait_for_a_slow_runtimes_stops() {
        let test = "an_emergency_kill_does_not_wait_for_a_slow_runtimes_stops";
        let Some(layout) = kill::tests::layout_or_skip(test) else { return };
        let cgroup = kill::tests::TestPod::new(&layout, 1);
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("cri.sock");
        let slow = Duration::from_secs(30);
        scripted_runtime(&sock, Script { running_polls: Some(0), stop_delay: slow, ..Script::default() });
        let client = CriClient::new(sock.to_str().unwrap(), Duration::from_millis(500)).unwrap();
        let pod = record("/kubepods/podu", vec![container(None, None)]);
        let killed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = killed.clone();
        let plan = StopPlan {
            grace_seconds: 30,
            target: Some(KillTarget::at(&cgroup.rel, &layout)),
            fast_kill: true,
            on_killed: Some(OnKilled::new(move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })),
            ..plan()
        };
        let (raise, urgency) = watch::channel(Escalation::default());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            raise.send_replace(Escalation { urgency: Urgency::Emergency, emergency: None });
        });
        let t = Instant::now();
        let phases = stop(&client, &pod, &plan, Some(urgency)).await.expect("killed: an eviction");
        assert!(phases.fast_kill.is_some(), "the emergency killed the pod");
        // The kill runs the hook on the blocking pool, beside the reaps.
        let deadline = Instant::now() + Duration::from_secs(5);
        while killed.load(std::sync::atomic::Ordering::SeqCst) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(killed.load(std::sync::atomic::Ordering::SeqCst), 1, "the kill was said once");
        // Waiting for the runtime would take the 30 s its stops take here.
        assert!(t.elapsed() < slow / 2, "the pass was held {:?}", t.elapsed());
    }
}
