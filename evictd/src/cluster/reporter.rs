//! The reporter: two bounded queues of API calls — the pods' records, and the node's — each
//! with one task that sends its calls in order (so a node status patch the server is slow
//! with never holds up a pod's), each call retried with exponential back-off while the API server is down or answers 5xx/429, and
//! dropped (with the reason logged) when it says the call can never succeed (the pod is
//! gone or was replaced, evictd lacks the right, the body is refused). The pressure path
//! only ever `try_send`s: a full queue drops the call and counts it, it never waits.
//!
//! An eviction for a threshold queues the pod's `DisruptionTarget` condition before the
//! stop; once the containers are dead, the pod's status patch (what makes it stick), then the
//! pod's `Evicted` event; and, on the node's queue, the node's `EvictionThresholdMet` event.
//! A while after the status landed the pod is read back: a record the node reverted (the
//! pod Running again) is written again, and counted.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use evictd_policy::signal::NodeCondition;
use k8s_openapi::{
    api::core::v1::{Event, Node, Pod},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::Value;
use tokio::{
    sync::{mpsc, watch},
    task::JoinSet,
};

use super::{
    metrics::{ApiCall, ApiMetrics, ApiOutcome},
    records::{self, Involved},
};
use crate::vocab::{EvictionCause, EvictionRecord, monotonic_ns};

/// Calls waiting at most; an eviction takes three.
const QUEUE: usize = 1024;

/// How a failing call is retried.
#[derive(Clone, Copy, Debug)]
pub struct Retry {
    /// The first wait; each next one doubles, up to `max`.
    pub first: Duration,
    pub max: Duration,
    /// A call still failing this long after it was queued is dropped, logged.
    pub give_up: Duration,
    /// How long after an evicted pod's status landed it is read back.
    pub check_after: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        // The kubelet restarts a killed pod on its next sync unless the status lands: keep
        // trying for as long as an operator could still care, at most every 30 s.
        Retry {
            first: Duration::from_millis(200),
            max: Duration::from_secs(30),
            give_up: Duration::from_secs(600),
            // Past the kubelet's next syncs of the pod (PLEG relists every 1 s, a pod worker
            // syncs within seconds): a status it was going to overwrite is overwritten then.
            check_after: Duration::from_secs(15),
        }
    }
}

/// A record written again at most this often when the node keeps reverting it.
const REWRITES: u8 = 3;

/// One API call evictd makes.
#[derive(Clone, Debug)]
enum Call {
    /// `PATCH pods/<name>/status`: an evicted pod's record (`evicted`), or its
    /// `DisruptionTarget` condition alone.
    PodStatus { namespace: String, name: String, patch: Value, evicted: Option<Evicted> },
    /// `POST events` in the event's namespace.
    Event(Box<Event>),
    /// `PATCH nodes/<node>/status`.
    NodeStatus(Value),
}

/// What an evicted pod's status patch carries beyond its body.
#[derive(Clone, Debug)]
struct Evicted {
    uid: String,
    /// When the kill completed: the window the kubelet might restart the pod in ends when
    /// the patch lands.
    stopped_ns: u64,
    /// How often it was written again after the pod was read back without it.
    rewrites: u8,
}

impl Call {
    fn kind(&self) -> ApiCall {
        match self {
            Call::PodStatus { .. } => ApiCall::PodStatus,
            Call::Event(_) => ApiCall::Event,
            Call::NodeStatus(_) => ApiCall::NodeStatus,
        }
    }

    fn describe(&self, node: &str) -> String {
        match self {
            Call::PodStatus { namespace, name, .. } => format!("the status of pod {namespace}/{name}"),
            Call::Event(e) => format!(
                "event {} on {}",
                e.reason.as_deref().unwrap_or(""),
                e.involved_object.name.as_deref().unwrap_or("")
            ),
            Call::NodeStatus(_) => format!("the conditions of node {node}"),
        }
    }
}

struct Queued {
    call: Call,
    queued: Instant,
}

/// The handle the daemon and its passes hold; cheap to clone.
#[derive(Clone)]
pub struct Reporter {
    /// The pods' records.
    pods: mpsc::Sender<Queued>,
    /// The node's events and conditions.
    node_calls: mpsc::Sender<Queued>,
    node: Arc<str>,
    metrics: ApiMetrics,
}

/// The tasks behind the reporters, for a bounded flush at shutdown.
pub struct ReporterTask {
    closing: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl Reporter {
    pub fn spawn(
        client: Client,
        node: String,
        retry: Retry,
        metrics: ApiMetrics,
    ) -> (Reporter, ReporterTask) {
        let (closing, closed) = watch::channel(false);
        let node: Arc<str> = node.into();
        let mut tasks = JoinSet::new();
        let mut lane = || {
            let (tx, rx) = mpsc::channel(QUEUE);
            let worker = Worker {
                client: client.clone(),
                node: node.clone(),
                retry,
                metrics: metrics.clone(),
                closing: closed.clone(),
                requeue: tx.downgrade(),
            };
            tasks.spawn(worker.run(rx));
            tx
        };
        let (pods, node_calls) = (lane(), lane());
        (Reporter { pods, node_calls, node, metrics }, ReporterTask { closing, tasks })
    }

    /// Before a pod's stop: its `DisruptionTarget` condition, for a threshold's eviction (the
    /// kubelet sets none for a pod over its own storage limit).
    pub fn pod_disruption(&self, rec: &EvictionRecord) {
        if matches!(rec.signal, EvictionCause::Signal(_)) {
            let patch = records::disruption_target_patch(&rec.uid, true, &rec.message, Timestamp::now());
            self.queue(
                &self.pods,
                Call::PodStatus {
                    namespace: rec.namespace.clone(),
                    name: rec.name.clone(),
                    patch,
                    evicted: None,
                },
            );
        }
    }

    /// The stop failed and the pod runs on: its `DisruptionTarget` condition is taken back.
    pub fn pod_disruption_failed(&self, rec: &EvictionRecord, why: &str) {
        if matches!(rec.signal, EvictionCause::Signal(_)) {
            let message = format!("evictd's eviction failed: {why}");
            let patch = records::disruption_target_patch(&rec.uid, false, &message, Timestamp::now());
            self.queue(
                &self.pods,
                Call::PodStatus {
                    namespace: rec.namespace.clone(),
                    name: rec.name.clone(),
                    patch,
                    evicted: None,
                },
            );
        }
    }

    /// Records an eviction whose kill completed at `stopped_ns` as the kubelet does.
    pub fn pod_evicted(&self, rec: &EvictionRecord, stopped_ns: u64) {
        let now = Timestamp::now();
        self.queue(
            &self.pods,
            Call::PodStatus {
                namespace: rec.namespace.clone(),
                name: rec.name.clone(),
                patch: records::pod_evicted_patch(
                    &rec.uid,
                    &rec.message,
                    matches!(rec.signal, EvictionCause::Signal(_)),
                    now,
                ),
                evicted: Some(Evicted { uid: rec.uid.clone(), stopped_ns, rewrites: 0 }),
            },
        );
        let pod = Involved { kind: "Pod", namespace: Some(&rec.namespace), name: &rec.name, uid: &rec.uid };
        let event = records::pod_evicted_event(&pod, &rec.message, rec.annotations.clone(), &self.node, now);
        self.queue(&self.pods, Call::Event(Box::new(event)));
        // The kubelet posts the node's EvictionThresholdMet for thresholds only, not for a
        // pod over its own limit.
        if let EvictionCause::Signal(signal) = rec.signal {
            let resource = signal.resource().as_str();
            self.queue(
                &self.node_calls,
                Call::Event(Box::new(records::threshold_met_event(&self.node, resource, now))),
            );
        }
    }

    /// evictd's node conditions: `pressure` are true, the others false; `changed` flipped.
    pub fn node_conditions(&self, pressure: &[NodeCondition], changed: &[NodeCondition]) {
        let patch = records::node_conditions_patch(pressure, changed, Timestamp::now());
        self.queue(&self.node_calls, Call::NodeStatus(patch));
    }

    fn queue(&self, lane: &mpsc::Sender<Queued>, call: Call) {
        let kind = call.kind();
        tracing::debug!("Kubernetes API: queued {}", call.describe(&self.node));
        if let Err(e) = lane.try_send(Queued { call, queued: Instant::now() }) {
            let call = match e {
                mpsc::error::TrySendError::Full(q) | mpsc::error::TrySendError::Closed(q) => q.call,
            };
            self.metrics.call(kind, ApiOutcome::Dropped);
            tracing::warn!(
                "Kubernetes API: {} not sent: the report queue is full or closed",
                call.describe(&self.node)
            );
        }
    }
}

impl ReporterTask {
    /// At shutdown: whatever is queued is tried once more, without back-off, for at most
    /// `within`; what is left then is logged.
    pub async fn flush(mut self, within: Duration) {
        self.closing.send_replace(true);
        let all = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(within, all).await.is_err() {
            tracing::warn!("Kubernetes API: reports still queued after {within:?} at shutdown are lost");
        }
    }
}

struct Worker {
    client: Client,
    node: Arc<str>,
    retry: Retry,
    metrics: ApiMetrics,
    closing: watch::Receiver<bool>,
    /// Its own queue, for a record written again (weak: the queue still closes with the
    /// reporter).
    requeue: mpsc::WeakSender<Queued>,
}

/// Whether a failed call may succeed later: the server or the way to it failed, or asked
/// to be called back (408, 429). Any other 4xx is final: the pod is gone (404) or is not
/// the one evicted (409: the uid precondition), evictd lacks the right (403), or the body
/// is refused (422).
pub(super) fn retriable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => !(400..500).contains(&s.code) || matches!(s.code, 408 | 429),
        _ => true,
    }
}

impl Worker {
    async fn run(mut self, mut rx: mpsc::Receiver<Queued>) {
        loop {
            let q = tokio::select! {
                q = rx.recv() => q,
                _ = self.closing.wait_for(|c| *c) => rx.try_recv().ok(),
            };
            let Some(q) = q else { return };
            self.deliver(q).await;
        }
    }

    /// Sends one call until it succeeds, fails for good, or is given up.
    async fn deliver(&mut self, q: Queued) {
        let what = q.call.describe(&self.node);
        tracing::debug!("Kubernetes API: sending {what}");
        let kind = q.call.kind();
        let mut wait = self.retry.first;
        loop {
            let err = match self.send(&q.call).await {
                Ok(()) => {
                    self.metrics.call(kind, ApiOutcome::Ok);
                    self.delivered(&q.call, &what);
                    return;
                }
                Err(e) => e,
            };
            let closing = *self.closing.borrow();
            if !retriable(&err) {
                self.metrics.call(kind, ApiOutcome::Refused);
                tracing::warn!("Kubernetes API refused {what}: {err}");
                return;
            }
            if closing || q.queued.elapsed() + wait > self.retry.give_up {
                self.metrics.call(kind, ApiOutcome::GivenUp);
                tracing::error!("Kubernetes API: giving up on {what} after {:?}: {err}", q.queued.elapsed());
                return;
            }
            self.metrics.call(kind, ApiOutcome::Retried);
            tracing::warn!("Kubernetes API: {what} failed, retrying in {wait:?}: {err}");
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                // At shutdown, one last try at once.
                _ = self.closing.wait_for(|c| *c) => {}
            }
            wait = (wait * 2).min(self.retry.max);
        }
    }

    fn delivered(&self, call: &Call, what: &str) {
        let Call::PodStatus { evicted: Some(e), .. } = call else { return };
        if e.rewrites == 0 {
            let window = Duration::from_nanos(monotonic_ns().saturating_sub(e.stopped_ns));
            self.metrics.status_recorded(window);
            tracing::info!(
                window_ms = window.as_secs_f64() * 1e3,
                "Kubernetes API: recorded {what} as Failed/Evicted, {:.1} ms after the kill",
                window.as_secs_f64() * 1e3
            );
        }
        self.check_later(call.clone());
    }

    /// Reads an evicted pod back `check_after` after its record landed; a record the node
    /// reverted is written again (at most `REWRITES` times), and counted.
    fn check_later(&self, call: Call) {
        let Call::PodStatus { namespace, name, patch, evicted: Some(e) } = call else { return };
        let (pods, metrics, requeue) = (
            Api::<Pod>::namespaced(self.client.clone(), &namespace),
            self.metrics.clone(),
            self.requeue.clone(),
        );
        let after = self.retry.check_after;
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let pod = match pods.get_opt(&name).await {
                Ok(pod) => pod,
                Err(err) => {
                    metrics.call(ApiCall::PodCheck, ApiOutcome::Error);
                    tracing::warn!(
                        "Kubernetes API: reading pod {namespace}/{name} back after its eviction: {err}"
                    );
                    return;
                }
            };
            metrics.call(ApiCall::PodCheck, ApiOutcome::Ok);
            if !pod.is_some_and(|p| records::record_reverted(&p, &e.uid)) {
                return;
            }
            metrics.record_reverted();
            if e.rewrites >= REWRITES {
                tracing::error!(
                    "Kubernetes API: pod {namespace}/{name} runs again after its eviction was written \
                     {} times; evictd gives up on its record",
                    REWRITES + 1
                );
                return;
            }
            tracing::warn!(
                "Kubernetes API: pod {namespace}/{name} runs again: the node reverted its eviction; writing it again"
            );
            let evicted = Some(Evicted { rewrites: e.rewrites + 1, ..e });
            let again =
                Queued { call: Call::PodStatus { namespace, name, patch, evicted }, queued: Instant::now() };
            if requeue.upgrade().is_none_or(|q| q.try_send(again).is_err()) {
                metrics.call(ApiCall::PodStatus, ApiOutcome::Dropped);
            }
        });
    }

    async fn send(&self, call: &Call) -> Result<(), kube::Error> {
        let client = self.client.clone();
        match call {
            Call::PodStatus { namespace, name, patch, .. } => {
                let pods: Api<Pod> = Api::namespaced(client, namespace);
                pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(patch)).await.map(drop)
            }
            Call::Event(event) => {
                let ns = event.metadata.namespace.as_deref().unwrap_or("default");
                let events: Api<Event> = Api::namespaced(client, ns);
                events.create(&PostParams::default(), event).await.map(drop)
            }
            Call::NodeStatus(patch) => {
                let nodes: Api<Node> = Api::all(client);
                nodes
                    .patch_status(&self.node, &PatchParams::default(), &Patch::Strategic(patch))
                    .await
                    .map(drop)
            }
        }
    }
}
