//! evictd's node conditions on the API server (`EvictdMemoryPressure` & co.), written by a
//! task that keeps them as the daemon last decided: at once when they change, again every
//! minute (a node status somebody rewrote, a patch lost with an API server that was down
//! longer than any retry), and `Unknown` at shutdown, since nobody else would ever say that
//! evictd stopped judging this node. A set counts as sent only once the API server
//! accepted it: a transition time is written for a condition whose accepted status flips.

use std::{sync::Arc, time::Duration};

use evictd_policy::signal::NodeCondition;
use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use tokio::sync::watch;

use super::{
    metrics::{ApiCall, ApiMetrics, ApiOutcome},
    records,
    reporter::{Backoff, Retry, retriable, wait_turn},
};

/// The handle: the conditions the daemon decided last (`None`: none yet).
pub(super) type Wanted = watch::Sender<Option<Vec<NodeCondition>>>;

pub(super) struct Conditions {
    pub nodes: Api<Node>,
    pub node: Arc<str>,
    pub retry: Retry,
    pub metrics: ApiMetrics,
}

impl Conditions {
    pub(super) fn new(client: Client, node: Arc<str>, retry: Retry, metrics: ApiMetrics) -> Self {
        Conditions { nodes: Api::all(client), node, retry, metrics }
    }

    pub(super) async fn run(
        self,
        mut wanted: watch::Receiver<Option<Vec<NodeCondition>>>,
        mut closing: watch::Receiver<bool>,
    ) {
        let mut accepted: Option<Vec<NodeCondition>> = None;
        let mut backoff = Backoff::new(self.retry);
        loop {
            let want = wanted.borrow_and_update().clone();
            let next = match want {
                None => None,
                Some(want) => match self.write(&want, accepted.as_deref()).await {
                    Ok(()) => {
                        accepted = Some(want);
                        backoff.reset();
                        Some(self.retry.resend)
                    }
                    Err(e) => {
                        let again = backoff.next();
                        self.failed(&e, again);
                        Some(again)
                    }
                },
            };
            if wait_turn(&mut wanted, &mut closing, next).await {
                // Only over conditions this run wrote: without them there is no judgement
                // of evictd's on the node to take back.
                if accepted.is_some() {
                    self.stopped().await;
                }
                return;
            }
        }
    }

    /// Writes `want`; a transition time for each condition whose status differs from the
    /// last accepted (all of them, before the first).
    async fn write(
        &self,
        want: &[NodeCondition],
        accepted: Option<&[NodeCondition]>,
    ) -> Result<(), kube::Error> {
        let changed: Vec<NodeCondition> = NodeCondition::ALL
            .into_iter()
            .filter(|c| accepted.is_none_or(|a| a.contains(c) != want.contains(c)))
            .collect();
        let patch = records::node_conditions_patch(want, &changed, Timestamp::now());
        self.nodes.patch_status(&self.node, &PatchParams::default(), &Patch::Strategic(&patch)).await?;
        self.metrics.call(ApiCall::NodeStatus, ApiOutcome::Ok);
        Ok(())
    }

    fn failed(&self, e: &kube::Error, again: Duration) {
        let node = &self.node;
        let outcome = if retriable(e) { ApiOutcome::Retried } else { ApiOutcome::Refused };
        self.metrics.call(ApiCall::NodeStatus, outcome);
        tracing::warn!("Kubernetes API: the conditions of node {node} failed ({e}); again in {again:?}");
    }

    /// At shutdown: evictd's conditions `Unknown`, one try.
    async fn stopped(&self) {
        let patch = records::node_conditions_unknown_patch(Timestamp::now());
        match self.nodes.patch_status(&self.node, &PatchParams::default(), &Patch::Strategic(&patch)).await {
            Ok(_) => self.metrics.call(ApiCall::NodeStatus, ApiOutcome::Ok),
            Err(e) => {
                self.metrics.call(ApiCall::NodeStatus, ApiOutcome::GivenUp);
                tracing::warn!(
                    "Kubernetes API: evictd's conditions of node {} left as they were at exit: {e}",
                    self.node
                );
            }
        }
    }
}
