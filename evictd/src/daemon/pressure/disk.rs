//! Disk pressure before any pod goes: the kubelet's `reclaimNodeLevelResources` (dead
//! containers and unused images), and the settle that lets released space come back before
//! a second pod is evicted for it.

use super::*;

/// How long disk evictions wait after node-level reclaim removed something or a pod was
/// evicted for disk: the runtime releases the space asynchronously (containerd deletes
/// snapshots in its garbage collector, and an evicted pod's writable layers only go when
/// the next reclaim removes its dead containers), so statvfs right afterwards would make
/// evictd evict a second pod for space that is already on its way back.
const DISK_SETTLE: Duration = Duration::from_secs(2);

/// How long a disk decision waits, at most once per pressure episode, for the runtime's stats
/// call that follows a pod list: the inventory publishes the list before it asks the runtime
/// for the writable layers (a memory decision must not wait for that call), and a layer not
/// reported yet would rank as empty. The wait normally ends with the call (the next list);
/// this bounds a call that hangs. Past it, unknown layers rank as empty, as the kubelet
/// ranks a container its stats leave out.
const LAYERS_WAIT: Duration = Duration::from_secs(10);

/// Space on its way back to a filesystem, and since when.
#[derive(Clone, Copy, Debug)]
pub(super) struct DiskSettle {
    since: Instant,
    /// What released it: node-level reclaim, or an eviction.
    after: &'static str,
}

impl DiskSettle {
    pub(super) fn after(after: &'static str) -> Self {
        DiskSettle { since: Instant::now(), after }
    }
}

impl Pressure {
    /// Whether the decision's most urgent signal is a disk signal.
    pub(super) fn drives_on_disk(&self, d: &engine::Decision) -> bool {
        d.actionable.first().is_some_and(|&i| self.thresholds[i].signal.resource().is_disk())
    }

    /// Notes when a disk threshold began to be met (`None` while none is).
    pub(super) fn note_disk_pressure(&mut self, d: &engine::Decision) {
        let disk_met = d.thresholds_met.iter().any(|&i| self.thresholds[i].signal.resource().is_disk());
        match (disk_met, self.disk_met_since) {
            (true, None) => {
                self.disk_met_since = Some(Instant::now());
                self.layers_wait_since = None;
            }
            (false, Some(_)) => self.disk_met_since = None,
            _ => {}
        }
    }

    /// True when the pods' last disk walk began before this disk pressure did, so cannot
    /// rank for it: a new one is asked for, and its end wakes the pass that evicts. One walk
    /// per pressure episode, however long walks take (the periodic ones keep it current
    /// after); the pass never walks itself (a memory crossing meanwhile would wait).
    pub(super) fn disk_walk_is_stale(&mut self) -> bool {
        let Some(walker) = &self.disk_walker else { return false };
        let since = self.disk_met_since;
        let fresh = walker.last_began().is_some_and(|at| since.is_none_or(|s| at >= s));
        // One walk asked for per episode: passes while it runs do not queue another.
        let asked = self.disk_walk_asked.is_some_and(|a| since.is_none_or(|s| a >= s));
        if !fresh && !asked {
            self.disk_walk_asked = Some(Instant::now());
            walker.kick();
            tracing::debug!("disk pressure: measuring the pods' logs and volumes before ranking them");
        }
        !fresh
    }

    /// True while a disk decision waits for the writable layers of pods that could be
    /// ranked, because the runtime's stats call after their listing has not ended: ranked as
    /// empty, such a pod would have another pod evicted in its place, on data evictd has not
    /// read. The next pod list ends the wait (`inventory_updated`); `LAYERS_WAIT` bounds it.
    pub(super) fn layers_unmeasured(&mut self, pods: &[Arc<PodRecord>]) -> bool {
        let unmeasured: Vec<String> = pods
            .iter()
            .filter(|p| !self.protects(p) && !self.gone.contains_key(&p.sandbox_id) && p.spec.is_active())
            .filter(|p| p.containers.iter().any(|c| c.running && c.layer_pending))
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
        if unmeasured.is_empty() {
            return false;
        }
        let since = *self.layers_wait_since.get_or_insert_with(Instant::now);
        if since.elapsed() < LAYERS_WAIT {
            self.awaiting_layers = true;
            tracing::debug!(pods = ?unmeasured, "disk pressure: waiting for the runtime's writable-layer stats before ranking");
            return true;
        }
        self.warn_limited(format!(
            "disk pressure: the runtime's stats call has not ended in {LAYERS_WAIT:?}: {} pod(s) ranked \
             with their new containers' writable layers as empty: {}",
            unmeasured.len(),
            unmeasured.join(", ")
        ));
        false
    }

    /// True while space released by reclaim or a disk eviction may still be on its way: a
    /// decision driven by disk waits (memory and PIDs never do).
    pub(super) fn disk_settling(&mut self, d: &engine::Decision) -> bool {
        let Some(settle) = &self.disk_settle else { return false };
        if !self.drives_on_disk(d) {
            return false;
        }
        if settle.since.elapsed() < DISK_SETTLE {
            return true;
        }
        tracing::info!(
            after = settle.after,
            "disk pressure remains {DISK_SETTLE:?} after reclaim or an eviction"
        );
        self.disk_settle = None;
        false
    }

    /// No threshold met any more: if space was on its way back, say that it came.
    pub(super) fn disk_settled(&mut self) {
        if let Some(settle) = self.disk_settle.take() {
            tracing::info!(
                after = settle.after,
                released_ms = settle.since.elapsed().as_millis() as u64,
                "disk pressure resolved: the runtime released the space (no further pod evicted)"
            );
        }
    }

    /// The kubelet's `reclaimNodeLevelResources`: for disk pressure, dead containers and
    /// unused images go first; true when no threshold is met any more afterwards.
    pub(super) async fn node_level_reclaim_resolves(
        &mut self,
        d: &engine::Decision,
        pods: &[Arc<PodRecord>],
        now: i64,
    ) -> bool {
        let Some(client) = self.client.as_ref().filter(|_| !d.node_reclaim.is_empty() && !self.dry_run)
        else {
            return false;
        };
        let sandbox_images = pods.iter().filter_map(|p| p.sandbox_image.clone()).collect();
        let images = reclaim::ImagePolicy {
            sandbox_images: &sandbox_images,
            ages: &self.image_ages,
            min_age: Duration::from_nanos(self.policy.image_minimum_gc_age_ns.max(0) as u64),
        };
        let report = reclaim::reclaim(client, &d.node_reclaim, images).await;
        tracing::info!(
            containers_removed = report.containers_removed,
            images_removed = report.images_removed,
            images_too_young = report.images_too_young,
            errors = ?report.errors,
            "node-level reclaim for {:?}",
            d.actionable.first().map(|&i| self.thresholds[i].signal)
        );
        if !engine::any_met(&self.thresholds, &self.observe(now), true) {
            tracing::info!("node-level reclaim resolved the pressure: no pod evicted");
            return true;
        }
        if report.containers_removed + report.images_removed > 0 {
            // Removed, but not yet released (see DISK_SETTLE): no eviction until it had time.
            self.disk_settle = Some(DiskSettle::after("node-level reclaim"));
            return true;
        }
        false
    }
}
