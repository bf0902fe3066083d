//! The pods' logs and volumes, measured by a thread of its own (the kubelet's
//! `fsResourceAnalyzer` caches volume stats the same way): a directory walk can take
//! minutes on a volume of millions of files, and a pass that waited for it would hold every
//! memory decision behind it. The pass reads the last walk; a disk decision whose walk
//! began before the disk pressure did asks for a new one and leaves the eviction to the
//! pass the walker's `recheck` wake starts when it is done.
//!
//! The walker measures every pod while the policy has a disk threshold, else only the pods
//! that set their own storage limits (all the storage-limit check reads); pods the
//! inventory no longer lists are dropped with each walk. The walk itself is `du.rs`.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc as std_mpsc,
    },
    time::{Duration, Instant},
};

use evictd_policy::summary::VolumeStats;
use tokio::sync::{mpsc, watch};

use super::{
    du::du,
    inventory::{PodList, PodRecord},
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
    /// A walk every this often (the kubelet's `--volume-stats-agg-period`).
    period: Duration,
}

impl DiskWalker {
    /// Starts the walker thread: a walk every `period` and whenever asked; one asked for ends
    /// with a `Recheck` wake on `wakes`, so the decision waiting for it runs. `None` (said why) when the
    /// thread cannot be started: the daemon then runs without disk stats.
    pub fn spawn(
        pods: watch::Receiver<PodList>,
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
            Ok(_) => Some(DiskWalker { last, kick, walk_all, period }),
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

    /// How often a walk runs: how old the kubelet's volume stats may be.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// When the last walk began, without taking its results.
    pub fn last_began(&self) -> Option<Instant> {
        self.last.borrow().at
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
    pods: watch::Receiver<PodList>,
    kubelet_root: PathBuf,
    period: Duration,
    walk_all: Arc<AtomicBool>,
    kicked: std_mpsc::Receiver<()>,
    last: watch::Sender<Walk>,
    wakes: mpsc::WeakSender<Wake>,
) {
    background_priority();
    // Only a walk somebody asked for ends with a wake: a periodic one has nobody waiting.
    let mut asked = false;
    loop {
        let snapshot = pods.borrow().clone();
        let all = walk_all.load(Ordering::Relaxed);
        let t = Instant::now();
        let measured: DiskMeasured = snapshot
            .iter()
            .filter(|p| all || p.spec.sets_storage_limits())
            .map(|p| (p.uid.clone(), measure_disk(p, &kubelet_root)))
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

/// The walker's thread yields to the node's work: the lowest best-effort I/O priority (not
/// the idle class, which a busy disk can starve — and a disk decision waits for a walk) and
/// nice 10. Refused, the walk runs at the ordinary priority (said).
fn background_priority() {
    const IOPRIO_WHO_PROCESS: libc::c_int = 1;
    const IOPRIO_CLASS_BE: libc::c_int = 2;
    const IOPRIO_CLASS_SHIFT: libc::c_int = 13;
    let lowest_best_effort = (IOPRIO_CLASS_BE << IOPRIO_CLASS_SHIFT) | 7;
    // SAFETY: ioprio_set with `who` 0 is the calling thread; plain integers, no memory.
    let io = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, lowest_best_effort) };
    let io = if io == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) };
    if let Err(e) = io.and(crate::kernel::sched::set_nice(crate::kernel::sched::BACKGROUND_NICE)) {
        tracing::warn!("the disk walker runs at the ordinary priority: {e}");
    }
}

/// What the disk walker measured of one pod: what the kubelet's host stats provider and
/// volume stats count beside the writable layers (which come from the runtime).
#[derive(Clone, Debug, Default)]
pub struct PodDisk {
    /// Each container's name and the (bytes, inodes) of its log directory: a list, as short
    /// as the pod's containers (a map's node per pod was most of a walk's result).
    pub logs: Vec<(String, (u64, u64))>,
    pub volumes: Vec<VolumeStats>,
    /// The files directly in the pod's log directory, and its `etc-hosts`.
    pub pod_level: (u64, u64),
}

impl PodDisk {
    /// (bytes, inodes) of the log directory of the container named `name`.
    pub fn log_usage(&self, name: &str) -> Option<(u64, u64)> {
        self.logs.iter().find(|(n, _)| n == name).map(|&(_, usage)| usage)
    }
}

/// The pods' logs and volumes as last walked, by pod uid.
pub type DiskMeasured = HashMap<String, PodDisk>;

/// Walks one pod's logs and local volumes (the costly part of its usage: a volume may hold
/// millions of files). `kubelet_root`: local volumes live in
/// `<root>/pods/<uid>/volumes/<plugin>/<name>`.
pub fn measure_disk(rec: &PodRecord, kubelet_root: &Path) -> PodDisk {
    let mut logs: Vec<_> = rec
        .containers
        .iter()
        .filter_map(|c| Some((c.name.clone(), du(&Path::new(rec.log_directory.as_deref()?).join(&c.name)))))
        .collect();
    // Kept until the next walk, beside the one before it: no spare room.
    logs.shrink_to_fit();
    PodDisk {
        logs,
        volumes: local_volume_stats(rec, kubelet_root),
        pod_level: pod_level_files(rec, kubelet_root),
    }
}

/// What the kubelet's host stats provider adds to a pod's total beside its containers and
/// volumes: the files directly in the pod's log directory (its containers' directories are
/// counted with them) and the `/etc/hosts` it writes for the pod (`<root>/pods/<uid>/etc-hosts`;
/// none for a pod that mounts its own).
fn pod_level_files(rec: &PodRecord, kubelet_root: &Path) -> (u64, u64) {
    let log_files: Vec<PathBuf> = rec
        .log_directory
        .as_deref()
        .and_then(|d| std::fs::read_dir(d).ok())
        .map(|d| d.flatten().filter(|e| e.file_type().is_ok_and(|t| !t.is_dir())).map(|e| e.path()).collect())
        .unwrap_or_default();
    let etc_hosts = kubelet_root.join("pods").join(&rec.uid).join("etc-hosts");
    log_files.iter().chain([&etc_hosts]).map(|f| du(f)).fold((0, 0), |(b, i), (fb, fi)| (b + fb, i + fi))
}

/// The pod's volumes whose usage the kubelet reads for eviction, measured where it mounts
/// them: `<root>/pods/<uid>/volumes/<plugin>/<name>` (e.g. `kubernetes.io~empty-dir/scratch`).
/// Those that count against the node's disk (its `localVolumeNames`), and every emptyDir
/// with a `sizeLimit`, memory-backed ones included (the local-storage limit applies to them).
/// A volume with no directory (hostPath, which the kubelet does not measure either) is left out.
fn local_volume_stats(rec: &PodRecord, kubelet_root: &Path) -> Vec<VolumeStats> {
    let volumes = kubelet_root.join("pods").join(&rec.uid).join("volumes");
    let plugins: Vec<PathBuf> = std::fs::read_dir(&volumes)
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect())
        .unwrap_or_default();
    let sized = rec.spec.sized_empty_dirs().map(|(name, _)| name);
    let mut names: Vec<&str> = Vec::new();
    for name in rec.spec.local_volume_names().chain(sized) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
        .into_iter()
        .filter_map(|name| {
            let dir = plugins.iter().map(|p| p.join(name)).find(|d| d.is_dir())?;
            let (bytes, inodes) = du(&dir);
            Some(VolumeStats { name: name.to_owned(), used_bytes: Some(bytes), inodes_used: Some(inodes) })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::inventory::tests::{container, list, record};

    fn pod_with_volume(root: &Path, uid: &str, bytes: usize) -> PodRecord {
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

    /// The walker's thread yields to the node: nice 10 and the lowest best-effort I/O
    /// priority (read back from the kernel for the thread named `evictd-disk`).
    #[tokio::test(flavor = "current_thread")]
    async fn the_walker_runs_at_background_priority() {
        let d = tempfile::tempdir().unwrap();
        let (_pods_tx, pods) = watch::channel(Arc::new(Vec::new()));
        let (wakes, _woken) = mpsc::channel(1);
        let walker =
            DiskWalker::spawn(pods, d.path().into(), Duration::from_secs(3600), false, wakes).unwrap();
        while walker.last().at.is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let tid = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(Result::ok)
            .find(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "evictd-disk"))
            .map(|t| t.file_name().to_string_lossy().parse::<libc::c_int>().unwrap())
            .expect("the walker's thread");
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        // Fields after the command's closing parenthesis: state is the 3rd, nice the 19th.
        let nice: i32 = stat.rsplit_once(')').unwrap().1.split_whitespace().nth(16).unwrap().parse().unwrap();
        assert_eq!(nice, 10, "{stat}");
        // SAFETY: ioprio_get on a thread of this process; plain integers.
        let io = unsafe { libc::syscall(libc::SYS_ioprio_get, 1, tid) };
        assert_eq!(io, (2 << 13) | 7, "best effort, level 7");
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
        let (pods_tx, pods) = watch::channel(list([limited.clone(), plain.clone()]));
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
        pods_tx.send_replace(list([plain]));
        walker.kick();
        let wake = tokio::time::timeout(Duration::from_secs(10), woken.recv()).await.unwrap().unwrap();
        assert_eq!(wake.cause, WakeCause::Recheck);
        assert_eq!(walked(&walker), ["plain"], "every pod now; the one no longer listed dropped");
        assert!(walker.last().measured["plain"].volumes[0].used_bytes.unwrap() >= 64 << 10);
    }
}
