//! The reporter: the queued API calls of evictions — each sent by a task of its own, in
//! order per object (a pod's status before its event), up to `PARALLEL` objects at once, so
//! that a call the server keeps failing (a webhook refusing one pod's patch with 500s) holds
//! up only that object's later calls — each retried with exponential back-off while the API
//! server is down or answers 5xx/429, and dropped (with the reason logged) when it says the
//! call can never succeed (the pod is gone or was replaced, evictd lacks the right, the body
//! is refused). The pressure path only ever `try_send`s: a full queue drops the call and
//! counts it, it never waits. evictd's node conditions are kept by a task of their own
//! (`conditions`).
//!
//! An eviction for a threshold queues the pod's `DisruptionTarget` condition before the
//! stop; once the containers are dead, the pod's status patch (what makes it stick), then the
//! pod's `Evicted` event, and the node's `EvictionThresholdMet` event. A while after the
//! status landed the pod is read back: a record the node reverted (the pod Running again) is
//! written again, and counted.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use evictd_policy::signal::NodeCondition;
use k8s_openapi::{
    api::core::v1::{Event, Pod},
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
    conditions::{self, Conditions},
    metrics::{ApiCall, ApiMetrics, ApiOutcome},
    records::{self, Involved},
};
use crate::vocab::{EvictionCause, EvictionRecord, monotonic_ns};

/// Calls waiting at most; an eviction takes four.
const QUEUE: usize = 1024;

/// Objects whose calls are sent at once, at most.
const PARALLEL: usize = 32;

/// How a failing call is retried, and when a landed one is looked at again.
#[derive(Clone, Copy, Debug)]
pub struct Retry {
    /// The first wait; each next one doubles, up to `max`.
    pub first: Duration,
    pub max: Duration,
    /// A call still failing this long after it was queued is dropped, logged.
    pub give_up: Duration,
    /// How long after an evicted pod's status landed it is read back.
    pub check_after: Duration,
    /// How often evictd's accepted node conditions are written again while unchanged.
    pub resend: Duration,
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
            // The kubelet heartbeats its node status every 10 s; evictd's conditions are
            // judged continuously, so a minute only repairs a write that was lost.
            resend: Duration::from_secs(60),
        }
    }
}

/// Exponential back-off from `Retry::first` to `Retry::max`, reset by a success.
pub(super) struct Backoff {
    retry: Retry,
    wait: Duration,
}

impl Backoff {
    pub(super) fn new(retry: Retry) -> Self {
        Backoff { retry, wait: retry.first }
    }

    /// The wait before the next try; the one after doubles.
    pub(super) fn next(&mut self) -> Duration {
        let wait = self.wait;
        self.wait = (wait * 2).min(self.retry.max);
        wait
    }

    pub(super) fn reset(&mut self) {
        self.wait = self.retry.first;
    }
}

/// Hands a level-triggered writer the conditions true now; it wakes only when they changed
/// (the daemon calls this after every pass).
pub(super) fn want_conditions(wanted: &watch::Sender<Option<Vec<NodeCondition>>>, now: &[NodeCondition]) {
    wanted.send_if_modified(|w| {
        let changed = w.as_deref() != Some(now);
        if changed {
            *w = Some(now.to_vec());
        }
        changed
    });
}

/// The wait of a task that keeps something on the API server as wanted: until `wanted`
/// changes, `after` passes, or the end (closing, or the task's owner gone). True at the end.
pub(super) async fn wait_turn<T>(
    wanted: &mut watch::Receiver<T>,
    closing: &mut watch::Receiver<bool>,
    after: Option<Duration>,
) -> bool {
    tokio::select! {
        changed = wanted.changed() => changed.is_err(),
        _ = crate::runtime::evict::sleep_until(after.map(|d| tokio::time::Instant::now() + d)) => false,
        _ = closing.wait_for(|c| *c) => true,
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
        }
    }

    /// The object the call is about: calls about one object are sent in order.
    fn object(&self) -> String {
        match self {
            Call::PodStatus { namespace, name, .. } => format!("Pod {namespace}/{name}"),
            Call::Event(e) => {
                let o = &e.involved_object;
                let part = |s: &Option<String>| s.clone().unwrap_or_default();
                format!("{} {}/{}", part(&o.kind), part(&o.namespace), part(&o.name))
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Call::PodStatus { namespace, name, .. } => format!("the status of pod {namespace}/{name}"),
            Call::Event(e) => format!(
                "event {} on {}",
                e.reason.as_deref().unwrap_or(""),
                e.involved_object.name.as_deref().unwrap_or("")
            ),
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
    calls: mpsc::Sender<Queued>,
    /// evictd's node conditions, as last decided.
    conditions: conditions::Wanted,
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
        let (calls, rx) = mpsc::channel(QUEUE);
        let worker = Worker {
            client: client.clone(),
            retry,
            metrics: metrics.clone(),
            closing: closed.clone(),
            requeue: calls.downgrade(),
        };
        tasks.spawn(worker.run(rx));
        let (conditions, wanted) = watch::channel(None);
        tasks.spawn(Conditions::new(client, node.clone(), retry, metrics.clone()).run(wanted, closed));
        (Reporter { calls, conditions, node, metrics }, ReporterTask { closing, tasks })
    }

    /// Before a pod's stop: its `DisruptionTarget` condition, for a threshold's eviction (the
    /// kubelet sets none for a pod over its own storage limit).
    pub fn pod_disruption(&self, rec: &EvictionRecord) {
        self.disruption_target(rec, true, &rec.message);
    }

    /// The stop failed and the pod runs on: its `DisruptionTarget` condition is taken back.
    pub fn pod_disruption_failed(&self, rec: &EvictionRecord, why: &str) {
        self.disruption_target(rec, false, &format!("evictd's eviction failed: {why}"));
    }

    fn disruption_target(&self, rec: &EvictionRecord, on: bool, message: &str) {
        if matches!(rec.signal, EvictionCause::Signal(_)) {
            let patch = records::disruption_target_patch(&rec.uid, on, message, Timestamp::now());
            let (namespace, name) = (rec.namespace.clone(), rec.name.clone());
            self.queue(Call::PodStatus { namespace, name, patch, evicted: None });
        }
    }

    /// Records an eviction whose kill completed at `stopped_ns` as the kubelet does.
    pub fn pod_evicted(&self, rec: &EvictionRecord, stopped_ns: u64) {
        let now = Timestamp::now();
        let signal = matches!(rec.signal, EvictionCause::Signal(_));
        self.queue(Call::PodStatus {
            namespace: rec.namespace.clone(),
            name: rec.name.clone(),
            patch: records::pod_evicted_patch(&rec.uid, &rec.message, signal, now),
            evicted: Some(Evicted { uid: rec.uid.clone(), stopped_ns, rewrites: 0 }),
        });
        let pod = Involved { kind: "Pod", namespace: Some(&rec.namespace), name: &rec.name, uid: &rec.uid };
        let event = records::pod_evicted_event(&pod, &rec.message, rec.annotations.clone(), &self.node, now);
        self.queue(Call::Event(Box::new(event)));
        // The kubelet posts the node's EvictionThresholdMet for thresholds only, not for a
        // pod over its own limit.
        if let EvictionCause::Signal(signal) = rec.signal {
            let resource = signal.resource().as_str();
            self.queue(Call::Event(Box::new(records::threshold_met_event(&self.node, resource, now))));
        }
    }

    /// evictd's node conditions as decided now: `pressure` are true, the others false.
    /// Written when they change, and every minute.
    pub fn node_conditions(&self, pressure: &[NodeCondition]) {
        want_conditions(&self.conditions, pressure);
    }

    fn queue(&self, call: Call) {
        let kind = call.kind();
        tracing::debug!("Kubernetes API: queued {}", call.describe());
        if let Err(e) = self.calls.try_send(Queued { call, queued: Instant::now() }) {
            let call = match e {
                mpsc::error::TrySendError::Full(q) | mpsc::error::TrySendError::Closed(q) => q.call,
            };
            self.metrics.call(kind, ApiOutcome::Dropped);
            tracing::warn!(
                "Kubernetes API: {} not sent: the report queue is full or closed",
                call.describe()
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

/// The calls being sent, one object each, and those queued behind them.
#[derive(Default)]
struct InFlight {
    sending: JoinSet<()>,
    /// The object each task sends for.
    objects: HashMap<tokio::task::Id, String>,
    /// By object: the calls waiting for the one being sent.
    behind: HashMap<String, VecDeque<Queued>>,
    waiting: usize,
}

impl InFlight {
    /// Whether another call may be taken from the queue: room to send it, and room to hold
    /// it if its object is busy.
    fn room(&self) -> bool {
        self.sending.len() < PARALLEL && self.waiting < QUEUE
    }

    fn take(&mut self, worker: &Arc<Worker>, q: Queued) {
        let object = q.call.object();
        if let Some(queue) = self.behind.get_mut(&object) {
            queue.push_back(q);
            self.waiting += 1;
            return;
        }
        self.behind.insert(object.clone(), VecDeque::new());
        self.send(worker, object, q);
    }

    fn send(&mut self, worker: &Arc<Worker>, object: String, q: Queued) {
        let w = worker.clone();
        let task = self.sending.spawn(async move { w.deliver(q).await });
        self.objects.insert(task.id(), object);
    }

    /// A call ended: the next one for its object, if any, goes.
    fn ended(&mut self, worker: &Arc<Worker>, id: tokio::task::Id) {
        let Some(object) = self.objects.remove(&id) else { return };
        match self.behind.get_mut(&object).and_then(VecDeque::pop_front) {
            Some(next) => {
                self.waiting -= 1;
                self.send(worker, object, next);
            }
            None => drop(self.behind.remove(&object)),
        }
    }
}

impl Worker {
    async fn run(self, mut rx: mpsc::Receiver<Queued>) {
        let me = Arc::new(self);
        let mut closing = me.closing.clone();
        let mut inflight = InFlight::default();
        let mut open = true;
        while open || !inflight.sending.is_empty() {
            tokio::select! {
                q = rx.recv(), if open && inflight.room() => match q {
                    Some(q) => inflight.take(&me, q),
                    None => open = false,
                },
                Some(done) = inflight.sending.join_next_with_id() => {
                    let id = match done {
                        Ok((id, ())) => id,
                        Err(e) => e.id(),
                    };
                    inflight.ended(&me, id);
                }
                // Closing, or the task's owner gone: what is queued gets its last try now,
                // each object's calls in order.
                _ = closing.wait_for(|c| *c), if open => {
                    // Closed first: a call queued from here on (an eviction finishing during
                    // the flush) is refused at once, counted and logged as dropped, not kept
                    // where nobody would send it.
                    rx.close();
                    while let Ok(q) = rx.try_recv() {
                        inflight.take(&me, q);
                    }
                    open = false;
                },
            }
        }
    }

    /// Sends one call until it succeeds, fails for good, or is given up.
    async fn deliver(&self, q: Queued) {
        let what = q.call.describe();
        tracing::debug!("Kubernetes API: sending {what}");
        let kind = q.call.kind();
        let mut wait = self.retry.first;
        let mut closing_rx = self.closing.clone();
        loop {
            let err = match self.send(&q.call).await {
                Ok(()) => {
                    self.metrics.call(kind, ApiOutcome::Ok);
                    self.delivered(&q.call, &what);
                    return;
                }
                Err(e) => e,
            };
            let closing = *self.closing.borrow() || self.closing.has_changed().is_err();
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
                _ = closing_rx.wait_for(|c| *c) => {}
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
        }
    }
}
