//! The pods' logs and volumes, measured by a thread of its own (the kubelet's
//! `fsResourceAnalyzer` caches volume stats the same way): a directory walk can take
//! minutes on a volume of millions of files, and a pass that waited for it would hold every
//! memory decision behind it. The pass reads the last walk; a disk decision whose walk
//! began before the disk pressure did asks for a new one and leaves the eviction to the
//! pass the walker's `recheck` wake starts when it is done.
//!
//! The walker measures every pod while the policy has a disk threshold, else only the pods
//! that set their own storage limits (all the storage-limit check reads); pods the
//! inventory no longer lists are dropped with each walk.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc as std_mpsc,
    },
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, watch};

use super::{
    inventory::PodRecord,
    usage::{self, DiskMeasured},
};
use crate::{vocab::WakeCause, wake::Wake};

/// One walk's results.
#[derive(Clone, Debug)]
pub struct Walk {
    pub measured: Arc<DiskMeasured>,
    /// When it began (`None`: no walk yet): what it measured is at least that recent.
    pub at: Option<Instant>,
}

/// The handle the pass holds.
#[derive(Clone)]
pub struct DiskWalker {
    last: watch::Receiver<Walk>,
    kick: std_mpsc::SyncSender<()>,
    /// Whether every pod is walked (the policy has a disk threshold), or only those with
    /// storage limits.
    walk_all: Arc<AtomicBool>,
}

impl DiskWalker {
    /// Starts the walker thread: a walk every `period` and whenever asked; one asked for ends
    /// with a `Recheck` wake on `wakes`, so the decision waiting for it runs. `None` (said why) when the
    /// thread cannot be started: the daemon then runs without disk stats.
    pub fn spawn(
        pods: watch::Receiver<Arc<Vec<PodRecord>>>,
        kubelet_root: PathBuf,
        period: Duration,
        walk_all: bool,
        wakes: mpsc::Sender<Wake>,
    ) -> Option<DiskWalker> {
        let (tx, last) = watch::channel(Walk { measured: Arc::default(), at: None });
        let (kick, kicked) = std_mpsc::sync_channel(1);
        let walk_all = Arc::new(AtomicBool::new(walk_all));
        let all = walk_all.clone();
        // Weak: the walker is no wake source, and must not keep the channel open when
        // every source has stopped.
        let wakes = wakes.downgrade();
        let spawned = std::thread::Builder::new()
            .name("evictd-disk".into())
            .spawn(move || walk_until_dropped(pods, kubelet_root, period, all, kicked, tx, wakes));
        match spawned {
            Ok(_) => Some(DiskWalker { last, kick, walk_all }),
            Err(e) => {
                tracing::error!(
                    "cannot start the disk walker thread ({e}): no pod's logs or volumes are \
                     measured, so no pod is evicted for disk pressure or over its storage limits"
                );
                None
            }
        }
    }

    pub fn last(&self) -> Walk {
        self.last.borrow().clone()
    }

    /// Asks for a walk now (one already asked for stands).
    pub fn kick(&self) {
        let _ = self.kick.try_send(());
    }

    /// A re-read policy: a disk threshold makes every pod worth walking.
    pub fn walk_all(&self, all: bool) {
        self.walk_all.store(all, Ordering::Relaxed);
    }
}

fn walk_until_dropped(
    pods: watch::Receiver<Arc<Vec<PodRecord>>>,
    kubelet_root: PathBuf,
    period: Duration,
    walk_all: Arc<AtomicBool>,
    kicked: std_mpsc::Receiver<()>,
    last: watch::Sender<Walk>,
    wakes: mpsc::WeakSender<Wake>,
) {
    // Only a walk somebody asked for ends with a wake: a periodic one has nobody waiting.
    let mut asked = false;
    loop {
        let snapshot = pods.borrow().clone();
        let all = walk_all.load(Ordering::Relaxed);
        let t = Instant::now();
        let measured: DiskMeasured = snapshot
            .iter()
            .filter(|p| all || p.spec.sets_storage_limits())
            .map(|p| (p.uid.clone(), usage::measure_disk(p, &kubelet_root)))
            .collect();
        tracing::debug!(pods = measured.len(), took_ms = t.elapsed().as_millis() as u64, "disk walk");
        if last.send(Walk { measured: Arc::new(measured), at: Some(t) }).is_err() {
            return;
        }
        if asked && let Some(wakes) = wakes.upgrade() {
            let _ = wakes.try_send(Wake::now(WakeCause::Recheck));
        }
        asked = match kicked.recv_timeout(period) {
            Ok(()) => true,
            Err(std_mpsc::RecvTimeoutError::Timeout) => false,
            Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::inventory::tests::{container, record};

    fn pod_with_volume(root: &std::path::Path, uid: &str, bytes: usize) -> PodRecord {
        let mut rec = record("/kubepods/pod", vec![container(None, None)]);
        rec.uid = uid.into();
        rec.spec = serde_json::from_value(serde_json::json!({"spec": {"volumes": [
            {"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]}}))
        .unwrap();
        let vol = root.join(format!("pods/{uid}/volumes/kubernetes.io~empty-dir/scratch"));
        std::fs::create_dir_all(&vol).unwrap();
        std::fs::write(vol.join("f"), vec![1u8; bytes]).unwrap();
        rec
    }

    /// The walker measures on a thread of its own, on its period and when asked; a walk
    /// asked for ends with a disk wake (the pass waiting for it runs); pods the inventory
    /// stops listing are dropped; without a disk threshold only pods with storage limits
    /// are walked.
    #[tokio::test(flavor = "current_thread")]
    async fn the_walker_measures_apart_and_wakes_who_asked() {
        let d = tempfile::tempdir().unwrap();
        let limited = pod_with_volume(d.path(), "limited", 64 << 10);
        let mut plain = pod_with_volume(d.path(), "plain", 64 << 10);
        plain.spec.spec.volumes[0].empty_dir.as_mut().unwrap().size_limit = None;
        let (pods_tx, pods) = watch::channel(Arc::new(vec![limited.clone(), plain.clone()]));
        let (wakes, mut woken) = mpsc::channel(4);
        // The wake sources' sender: the walker's own is weak.
        let _sources = wakes.clone();
        let walker =
            DiskWalker::spawn(pods, d.path().into(), Duration::from_secs(3600), false, wakes).unwrap();
        let walked = |w: &DiskWalker| {
            let mut uids: Vec<String> = w.last().measured.keys().cloned().collect();
            uids.sort();
            uids
        };
        // The first walk, at start: no one asked, no wake.
        while walker.last().at.is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(walked(&walker), ["limited"], "without a disk threshold, only pods with limits");
        assert!(woken.try_recv().is_err(), "nobody asked for the first walk");
        walker.walk_all(true);
        pods_tx.send_replace(Arc::new(vec![plain]));
        walker.kick();
        let wake = tokio::time::timeout(Duration::from_secs(10), woken.recv()).await.unwrap().unwrap();
        assert_eq!(wake.cause, WakeCause::Recheck);
        assert_eq!(walked(&walker), ["plain"], "every pod now; the one no longer listed dropped");
        assert!(walker.last().measured["plain"].volumes[0].used_bytes.unwrap() >= 64 << 10);
    }
}
