//! evictd's taints on its Node: `evictd.io/memory-pressure` (and `disk-`, `pid-`) while
//! evictd's own condition of that name is true.
//!
//! The kubelet's pressure conditions become the `node.kubernetes.io/*-pressure` taints the
//! scheduler reads, but evictd relieves pressure before the kubelet sees it, so without a
//! taint of its own the scheduler puts an evicted pod's replacement straight back. The
//! conditions already hold for the pressure transition period, so the taints do too.
//!
//! The task is level-triggered: it reads the Node, computes the taint list it should carry
//! (every other taint kept, in its place), and writes it back with the resource version it
//! read as precondition, so a taint another controller added meanwhile is never lost: the
//! API answers 409 and the task reads again. It does this at start (a run that died under
//! pressure left its taints behind), on every change of the conditions, every minute while a
//! taint is wanted (someone may have removed it), and at shutdown, when it takes its taints
//! off: an uninstalled evictd must not leave a node unschedulable.

use std::{fmt, str::FromStr, sync::Arc, time::Duration};

use evictd_policy::signal::NodeCondition;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::{
    Api, Client,
    api::{GetParams, Patch, PatchParams},
};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::{
    metrics::{ApiCall, ApiMetrics, ApiOutcome},
    reporter::{Backoff, Retry, retriable, wait_turn, want_conditions},
};

/// How evictd's taints keep pods off (`--node-taint-effect`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TaintEffect {
    /// The scheduler places no new pod without a toleration (the kubelet's own pressure taints).
    #[default]
    NoSchedule,
    /// The scheduler avoids the node when another fits.
    PreferNoSchedule,
    /// No taint: evictd only removes the ones an earlier run left.
    None,
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::None => "none",
        }
    }
}

impl fmt::Display for TaintEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaintEffect {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        [TaintEffect::NoSchedule, TaintEffect::PreferNoSchedule, TaintEffect::None]
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| format!("{s:?}: one of NoSchedule, PreferNoSchedule, none"))
    }
}

/// evictd's taint key for one of its conditions.
pub fn taint_key(c: NodeCondition) -> &'static str {
    match c {
        NodeCondition::MemoryPressure => "evictd.io/memory-pressure",
        NodeCondition::DiskPressure => "evictd.io/disk-pressure",
        NodeCondition::PidPressure => "evictd.io/pid-pressure",
    }
}

fn is_evictds(key: &str) -> bool {
    NodeCondition::ALL.into_iter().any(|c| taint_key(c) == key)
}

/// The taints the Node should carry, or `None` when it carries them already: every taint
/// not evictd's kept as it is and where it is, evictd's own exactly those of `wanted` with
/// `effect` (one of another effect, left by an earlier configuration, is replaced).
pub fn retainted(current: &[Taint], wanted: &[NodeCondition], effect: TaintEffect) -> Option<Vec<Taint>> {
    let wanted: Vec<&str> = match effect {
        TaintEffect::None => Vec::new(),
        _ => wanted.iter().map(|&c| taint_key(c)).collect(),
    };
    let mut next: Vec<Taint> = current
        .iter()
        .filter(|t| !is_evictds(&t.key) || (wanted.contains(&t.key.as_str()) && t.effect == effect.as_str()))
        .cloned()
        .collect();
    for key in wanted {
        if !next.iter().any(|t| t.key == key) {
            next.push(Taint { key: key.to_owned(), effect: effect.as_str().to_owned(), ..Taint::default() });
        }
    }
    (next != current).then_some(next)
}

/// While a taint is on, how often the Node is read again.
const RECHECK: Duration = Duration::from_secs(60);

/// Conflicts in a row answered by reading again at once; more back off as failures do.
const EAGER_CONFLICTS: u32 = 3;

/// The handle the daemon holds.
#[derive(Clone)]
pub struct NodeTaints {
    wanted: watch::Sender<Option<Vec<NodeCondition>>>,
}

/// The task behind it, for the last write at shutdown.
pub struct TaintTask {
    closing: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeTaints {
    pub fn spawn(
        client: Client,
        node: String,
        effect: TaintEffect,
        retry: Retry,
        metrics: ApiMetrics,
    ) -> (NodeTaints, TaintTask) {
        let (wanted, wanted_rx) = watch::channel(None);
        let (closing, closed) = watch::channel(false);
        let tainter = Tainter { nodes: Api::all(client), node: node.into(), effect, retry, metrics };
        let task = tokio::spawn(tainter.run(wanted_rx, closed));
        (NodeTaints { wanted }, TaintTask { closing, task })
    }

    /// The taints for evictd's conditions that are true now.
    pub fn want(&self, pressure: &[NodeCondition]) {
        want_conditions(&self.wanted, pressure);
    }
}

impl TaintTask {
    /// At shutdown: evictd's taints come off, trying for at most `within`.
    pub async fn remove_and_stop(self, within: Duration) {
        self.closing.send_replace(true);
        if tokio::time::timeout(within, self.task).await.is_err() {
            tracing::warn!("Kubernetes API: evictd's taints still on the node after {within:?} at shutdown");
        }
    }
}

struct Tainter {
    nodes: Api<Node>,
    node: Arc<str>,
    effect: TaintEffect,
    retry: Retry,
    metrics: ApiMetrics,
}

/// Why one reconcile did not end with the Node as wanted.
enum Failed {
    /// Another writer changed the Node between the read and the write.
    Conflict,
    Api(kube::Error),
    /// Shutdown came first.
    Closing,
}

impl Tainter {
    /// Until the daemon's first pass has decided its conditions nothing is written: a run
    /// that starts under pressure keeps the taint its predecessor left.
    async fn run(
        self,
        mut wanted: watch::Receiver<Option<Vec<NodeCondition>>>,
        mut closing: watch::Receiver<bool>,
    ) {
        let mut backoff = Backoff::new(self.retry);
        let mut conflicts = 0;
        loop {
            let want = wanted.borrow_and_update().clone();
            let outcome = match &want {
                None => None,
                Some(want) => tokio::select! {
                    r = self.reconcile(want, conflicts > 0) => Some(r),
                    // A write under way at shutdown is not waited for: the last one follows.
                    _ = closing.wait_for(|c| *c) => Some(Err(Failed::Closing)),
                },
            };
            let next = match outcome {
                None => None,
                Some(Err(Failed::Closing)) => return self.last_write().await,
                Some(Ok(())) => {
                    backoff.reset();
                    conflicts = 0;
                    self.recheck(want.as_deref().unwrap_or_default())
                }
                Some(Err(failed)) => {
                    let again = match failed {
                        Failed::Conflict if conflicts < EAGER_CONFLICTS => Duration::ZERO,
                        _ => backoff.next(),
                    };
                    conflicts += u32::from(matches!(failed, Failed::Conflict));
                    self.failed(failed, again);
                    Some(again)
                }
            };
            if wait_turn(&mut wanted, &mut closing, next).await {
                return self.last_write().await;
            }
        }
    }

    /// While a taint is on, the Node is read again every `RECHECK` to put back one somebody
    /// removed; otherwise never (a node costs the API server nothing then).
    fn recheck(&self, want: &[NodeCondition]) -> Option<Duration> {
        (self.effect != TaintEffect::None && !want.is_empty()).then_some(RECHECK)
    }

    /// At shutdown: the taints off, a conflict or two read again.
    async fn last_write(&self) {
        for fresh in [false, true, true, true] {
            match self.reconcile(&[], fresh).await {
                Err(Failed::Conflict) => self.metrics.call(ApiCall::NodeTaints, ApiOutcome::Retried),
                Err(failed) => return self.failed(failed, Duration::ZERO),
                Ok(()) => return,
            }
        }
        tracing::error!(
            "Kubernetes API: evictd's taints left on node {} at exit: every write conflicted",
            self.node
        );
    }

    fn failed(&self, failed: Failed, again: Duration) {
        let node = &self.node;
        match failed {
            Failed::Conflict => {
                self.metrics.call(ApiCall::NodeTaints, ApiOutcome::Retried);
                tracing::debug!(
                    "Kubernetes API: node {node} changed under evictd's taint write; again in {again:?}"
                );
            }
            Failed::Api(e) if retriable(&e) => {
                self.metrics.call(ApiCall::NodeTaints, ApiOutcome::Retried);
                tracing::warn!("Kubernetes API: the taints of node {node} failed, again in {again:?}: {e}");
            }
            Failed::Closing => {}
            Failed::Api(e) => {
                self.metrics.call(ApiCall::NodeTaints, ApiOutcome::Refused);
                let hint = match &e {
                    kube::Error::Api(s) if s.code == 403 => " (evictd needs get and patch on nodes)",
                    _ => "",
                };
                tracing::error!(
                    "Kubernetes API refused the taints of node {node}{hint}: {e}; again in {again:?}"
                );
            }
        }
    }

    /// Reads the Node (from the API server's cache unless `fresh`: the write's precondition
    /// catches a stale read) and writes its taints if they are not as wanted.
    async fn reconcile(&self, want: &[NodeCondition], fresh: bool) -> Result<(), Failed> {
        let params = if fresh { GetParams::default() } else { GetParams::any() };
        let node = self.nodes.get_with(&self.node, &params).await.map_err(Failed::Api)?;
        let current = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        let Some(next) = retainted(&current, want, self.effect) else {
            self.metrics.node_taints(&current);
            return Ok(());
        };
        let patch = taints_patch(&current, &next, node.metadata.resource_version.as_deref())?;
        match self.nodes.patch(&self.node, &PatchParams::default(), &patch).await {
            Ok(_) => {
                self.metrics.call(ApiCall::NodeTaints, ApiOutcome::Ok);
                self.metrics.node_taints(&next);
                let keys: Vec<&str> = next.iter().map(|t| t.key.as_str()).filter(|k| is_evictds(k)).collect();
                tracing::info!(node = %self.node, "Kubernetes API: evictd's taints on the node now: {keys:?}");
                Ok(())
            }
            // 409: the resource version moved; 422: the JSON patch's test failed.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 422 => Err(Failed::Conflict),
            Err(e) => Err(Failed::Api(e)),
        }
    }
}

/// The write of the Node's taints that fails rather than drop one written since the read.
/// A JSON patch testing the list read and replacing it: only a concurrent change of the
/// taints fails it, not the kubelet's (or evictd's own) status writes, which move the
/// resource version every few seconds. A Node read without taints has no list to test, so
/// the write carries the resource version read instead.
fn taints_patch(
    current: &[Taint],
    next: &[Taint],
    resource_version: Option<&str>,
) -> Result<Patch<Value>, Failed> {
    if current.is_empty() {
        // Without it a merge patch would write unconditionally.
        let Some(rv) = resource_version else { return Err(Failed::Conflict) };
        return Ok(Patch::Merge(
            json!({ "metadata": { "resourceVersion": rv }, "spec": { "taints": next } }),
        ));
    }
    let ops = json!([
        { "op": "test", "path": "/spec/taints", "value": current },
        { "op": "replace", "path": "/spec/taints", "value": next },
    ]);
    let ops: json_patch::Patch = serde_json::from_value(ops).map_err(|_| Failed::Conflict)?;
    Ok(Patch::Json(ops))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, effect: &str) -> Taint {
        Taint { key: key.into(), effect: effect.into(), ..Taint::default() }
    }

    #[test]
    fn pressure_adds_evictds_taint_after_every_other() {
        let other = taint("dedicated", "NoSchedule");
        let next = retainted(
            std::slice::from_ref(&other),
            &[NodeCondition::MemoryPressure],
            TaintEffect::NoSchedule,
        );
        assert_eq!(next, Some(vec![other, taint("evictd.io/memory-pressure", "NoSchedule")]));
    }

    #[test]
    fn a_node_as_wanted_is_not_written() {
        let now = [taint("a", "NoExecute"), taint("evictd.io/disk-pressure", "PreferNoSchedule")];
        assert_eq!(retainted(&now, &[NodeCondition::DiskPressure], TaintEffect::PreferNoSchedule), None);
        assert_eq!(retainted(&[taint("a", "NoExecute")], &[], TaintEffect::NoSchedule), None);
    }

    #[test]
    fn evictds_taints_come_off_and_every_other_stays_in_place() {
        let now = [
            taint("node.kubernetes.io/memory-pressure", "NoSchedule"),
            taint("evictd.io/memory-pressure", "NoSchedule"),
            taint("evictd.io/pid-pressure", "NoSchedule"),
            taint("dedicated", "NoSchedule"),
        ];
        let next = retainted(&now, &[NodeCondition::PidPressure], TaintEffect::NoSchedule).unwrap();
        let keys: Vec<&str> = next.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["node.kubernetes.io/memory-pressure", "evictd.io/pid-pressure", "dedicated"]);
    }

    #[test]
    fn a_taint_of_another_effect_is_replaced() {
        let now = [taint("evictd.io/memory-pressure", "NoSchedule")];
        let next = retainted(&now, &[NodeCondition::MemoryPressure], TaintEffect::PreferNoSchedule);
        assert_eq!(next, Some(vec![taint("evictd.io/memory-pressure", "PreferNoSchedule")]));
    }

    #[test]
    fn effect_none_only_removes() {
        let now = [taint("evictd.io/memory-pressure", "NoSchedule")];
        assert_eq!(retainted(&now, &[NodeCondition::MemoryPressure], TaintEffect::None), Some(vec![]));
        assert_eq!(retainted(&[], &[NodeCondition::MemoryPressure], TaintEffect::None), None);
    }

    #[test]
    fn the_flag_reads_the_three_effects_and_names_a_wrong_one() {
        assert_eq!("PreferNoSchedule".parse(), Ok(TaintEffect::PreferNoSchedule));
        assert_eq!("none".parse(), Ok(TaintEffect::None));
        let e = "NoExecute".parse::<TaintEffect>().unwrap_err();
        assert!(e.contains("NoExecute") && e.contains("PreferNoSchedule"), "{e}");
    }
}
