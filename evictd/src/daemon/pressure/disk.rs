//! Disk pressure before any pod goes: the kubelet's `reclaimNodeLevelResources` (dead
//! containers and unused images), and what keeps one pressure to one eviction: the settle
//! that lets released space come back, and the wait for the evicted pod's teardown.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
};

use super::*;
use crate::vocab::EmergencyCause;

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

/// A pod evicted for a disk signal, awaited before the next disk eviction as the kubelet's
/// `waitForPodsCleanup` awaits it: its local volumes (an emptyDir's files are freed only when
/// the kubelet tears the volume down, seconds after the pod stopped) gone from the disk, or
/// its cgroup removed, for at most `cleanup_window` (the kubelet's 30 s). Its writable
/// layers and logs come back through node-level reclaim, which goes on meanwhile (at most
/// once a housekeeping period while it finds nothing).
#[derive(Clone, Debug)]
pub(super) struct DiskCleanup {
    /// `namespace/name`, for the log.
    pod: String,
    sandbox_id: String,
    /// `<kubelet root>/pods/<uid>/volumes`.
    volumes: PathBuf,
    /// Its memory cgroup's directory, which the kubelet removes once the pod is torn down.
    cgroup: Option<PathBuf>,
    evicted: Instant,
}

impl DiskCleanup {
    pub(super) fn after_eviction(pod: &PodRecord, kubelet_root: &Path, cgroup: Option<PathBuf>) -> Self {
        DiskCleanup {
            pod: format!("{}/{}", pod.namespace, pod.name),
            sandbox_id: pod.sandbox_id.clone(),
            volumes: kubelet_root.join("pods").join(&pod.uid).join("volumes"),
            cgroup,
            evicted: Instant::now(),
        }
    }

    pub(super) fn pod(&self) -> &str {
        &self.pod
    }

    pub(super) fn sandbox_id(&self) -> &str {
        &self.sandbox_id
    }

    pub(super) fn evicted(&self) -> Instant {
        self.evicted
    }

    /// Its cgroup removed, or no volume of it left on the disk. A directory that cannot be
    /// read (other than gone) is not known to be torn down.
    fn torn_down(&self) -> bool {
        let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        let has_entries = |dir: &Path| match std::fs::read_dir(dir) {
            Ok(mut entries) => entries.next().is_some(),
            Err(e) => !gone(&e),
        };
        if self.cgroup.as_ref().is_some_and(|c| !c.exists()) {
            return true;
        }
        match std::fs::read_dir(&self.volumes) {
            // One directory per volume plugin, one per volume in it.
            Ok(plugins) => !plugins.into_iter().any(|p| p.map_or(true, |p| has_entries(&p.path()))),
            Err(e) => gone(&e),
        }
    }
}

/// A read of the evicted pods' volume directories taking longer than this counts as "not torn
/// down".
const TEARDOWN_READ_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether each of `awaited` is torn down, read on the blocking pool: nodefs under pressure
/// may be a disk out of I/O, and the decision reader's queue (and its real-time thread) is
/// kept for cgroup reads. `None` when the reads took longer than `TEARDOWN_READ_TIMEOUT`, or
/// an earlier read is still stuck (`reading`): a hung filesystem holds one blocking thread,
/// not one a pass.
async fn read_teardowns(awaited: Vec<DiskCleanup>, reading: &Arc<AtomicBool>) -> Option<Vec<bool>> {
    if reading.swap(true, Ordering::Acquire) {
        return None;
    }
    let done = ClearOnDrop(reading.clone());
    let read = tokio::task::spawn_blocking(move || {
        let _done = done;
        awaited.iter().map(DiskCleanup::torn_down).collect()
    });
    tokio::time::timeout(TEARDOWN_READ_TIMEOUT, read).await.ok()?.ok()
}

impl Pressure {
    /// True while a pod evicted for disk is not torn down (`DiskCleanup`): this disk decision
    /// evicts nobody. Logs when a wait ends.
    pub(super) async fn awaits_disk_cleanup(&mut self) -> bool {
        if self.disk_cleanups.is_empty() {
            return false;
        }
        let torn_down = read_teardowns(self.disk_cleanups.clone(), &self.teardown_reading).await;
        let window = self.cleanup_window;
        let mut waiting = Vec::new();
        for (i, c) in std::mem::take(&mut self.disk_cleanups).into_iter().enumerate() {
            if torn_down.as_ref().is_some_and(|t| t[i]) {
                tracing::info!(
                    pod = %c.pod, after_ms = c.evicted.elapsed().as_millis() as u64,
                    "the pod evicted for disk is torn down; the next disk eviction may go ahead"
                );
            } else if c.evicted.elapsed() >= window {
                tracing::warn!(
                    pod = %c.pod,
                    "the pod evicted for disk still has its volumes on disk {window:?} after its \
                     eviction; the next disk eviction may go ahead"
                );
            } else {
                waiting.push(c);
            }
        }
        self.disk_cleanups = waiting;
        let Some(first) = self.disk_cleanups.first() else { return false };
        let (pod, evicted_s_ago) = (first.pod.clone(), first.evicted.elapsed().as_secs_f64());
        if !self.repeated(&format!("awaiting the teardown of {pod}")) {
            tracing::warn!(
                pod,
                evicted_s_ago,
                "disk pressure persists, but the pod evicted last still has its volumes on disk: the \
                 next disk eviction waits for their teardown, at most {window:?}"
            );
        }
        true
    }

    /// No disk threshold is met (not even one in its grace period, or held by its minimum
    /// reclaim): the disk pressure episode is over, and the pods evicted for it are no longer
    /// waited for. (Node-level reclaim keeps its own period: a signal that hovers about its
    /// threshold, or a filesystem that could not be read, would otherwise bring its runtime
    /// calls back with every crossing.)
    pub(super) fn disk_pressure_over(&mut self) {
        self.disk_cleanups.clear();
    }

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
    /// after); the pass never walks itself (a memory crossing meanwhile would wait). A new
    /// walk that has not ended within one walk period (a walk stuck on a disk that stopped
    /// answering) gives way to the last one, as the kubelet ranks on volume stats up to that
    /// old — only where that walk is as recent (it began at most a period before the
    /// pressure) and measured every pod the decision may rank: on an older one, or one that
    /// left a newer pod out, the pod filling the disk may be missing, and a bystander taken
    /// in its place.
    pub(super) fn disk_walk_is_stale(&mut self, pods: &[Arc<PodRecord>]) -> bool {
        let Some(walker) = &self.disk_walker else { return false };
        let since = self.disk_met_since;
        let last = walker.last_began();
        let fresh = last.is_some_and(|at| since.is_none_or(|s| at >= s));
        // One walk asked for per episode: passes while it runs do not queue another.
        let asked = self.disk_walk_asked.filter(|&a| since.is_none_or(|s| a >= s));
        if fresh {
            return false;
        }
        let Some(asked) = asked else {
            self.disk_walk_asked = Some(Instant::now());
            walker.kick();
            tracing::debug!("disk pressure: measuring the pods' logs and volumes before ranking them");
            return true;
        };
        let period = walker.period();
        let recent =
            |at: Instant| since.is_none_or(|s| s.checked_sub(period).is_none_or(|floor| at >= floor));
        let stuck = asked.elapsed() >= period && last.is_some_and(recent) && {
            let measured = walker.last().measured;
            pods.iter().filter(|p| self.rankable(p)).all(|p| measured.contains_key(&p.uid))
        };
        if stuck {
            // The same message every pass: said once while it lasts (`warn_limited`).
            self.warn_limited(format!(
                "disk pressure: the walk of the pods' logs and volumes asked for when the pressure \
                 began has not ended within {period:?} (a disk short of I/O?): ranking on the last \
                 walk, which measured every pod a period before, as the kubelet ranks on volume \
                 stats up to its --volume-stats-agg-period old"
            ));
        }
        !stuck
    }

    /// Whether a disk decision may rank `p`: running, and neither protected nor evicted.
    fn rankable(&self, p: &PodRecord) -> bool {
        p.spec.is_active() && !self.protects(p) && !self.gone.contains_key(&p.sandbox_id)
    }

    /// True while a disk decision waits for the writable layers of pods that could be
    /// ranked, because the runtime's stats call after their listing has not ended: ranked as
    /// empty, such a pod would have another pod evicted in its place, on data evictd has not
    /// read. The next pod list ends the wait (`inventory_updated`); `LAYERS_WAIT` bounds it.
    pub(super) fn layers_unmeasured(&mut self, pods: &[Arc<PodRecord>]) -> bool {
        let unmeasured: Vec<String> = pods
            .iter()
            .filter(|p| self.rankable(p))
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
    /// unused images go first; true when no threshold is met any more afterwards, or when
    /// memory cut it short (the next pass takes memory first).
    ///
    /// Its runtime calls (lists of every container and image, removals) hold the pass, and so
    /// a memory crossing meanwhile: it runs once per the kubelet's synchronize period (the
    /// housekeeping period) while it finds nothing to remove, not on every pass a wake
    /// brings, and again as soon as a pod has been evicted (its dead containers are the next
    /// thing to remove); and an emergency while a hard memory threshold is met ends it at once.
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
        if !reclaim_due(self.reclaimed_in_vain, self.storage_limit_period) {
            return false;
        }
        let sandbox_images = pods.iter().filter_map(|p| p.sandbox_image.clone()).collect();
        let images = reclaim::ImagePolicy {
            sandbox_images: &sandbox_images,
            ages: &self.image_ages,
            min_age: Duration::from_nanos(self.policy.image_minimum_gc_age_ns.max(0) as u64),
        };
        let reclaimed = tokio::select! {
            report = reclaim::reclaim(client, &d.node_reclaim, images) => Ok(report),
            cause = self.memory_goes_first(now) => Err(cause),
        };
        let report = match reclaimed {
            Ok(report) => report,
            Err(cause) => {
                if !self.repeated("node-level reclaim cut short") {
                    tracing::warn!(
                        "node-level reclaim cut short: {cause}, with a hard memory threshold met; memory goes first"
                    );
                }
                // What it removed before the cut may still be on its way back.
                self.disk_settle = Some(DiskSettle::after("node-level reclaim cut short"));
                return true;
            }
        };
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
            self.reclaimed_in_vain = None;
            return true;
        }
        self.reclaimed_in_vain = Some(Instant::now());
        false
    }

    /// Resolves, with its cause, once the daemon has seen an emergency (`escalate`) and a hard
    /// memory threshold is met, read then: the next decision is memory's eviction. An
    /// emergency without one (the kernel's direct reclaim on a node whose disk fills by
    /// writing, a soft memory threshold still in its grace period) makes no memory eviction,
    /// and cutting reclaim for it would hold disk evictions off; the node is read again every
    /// `RECHECK_MEMORY` while it lasts. Never resolves once the daemon's end of the channel
    /// is gone.
    async fn memory_goes_first(&self, now: i64) -> EmergencyCause {
        const RECHECK_MEMORY: Duration = Duration::from_millis(100);
        let memory_met = || self.hard_memory_threshold_met_now(now);
        let mut escalation = self.escalate.clone();
        loop {
            let emergency = escalation.borrow_and_update().emergency;
            if let Some(cause) = emergency {
                if memory_met() {
                    return cause;
                }
                tokio::time::sleep(RECHECK_MEMORY).await;
                continue;
            }
            if escalation.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

/// Whether node-level reclaim runs in this pass: not when it last removed nothing less than
/// `period` ago (and no pod was evicted since, which clears `in_vain`).
fn reclaim_due(in_vain: Option<Instant>, period: Duration) -> bool {
    in_vain.is_none_or(|at| at.elapsed() >= period)
}
