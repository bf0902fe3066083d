//! The daemon's flags, and turning them into `RunOptions`: every flag validated, the node's
//! cgroups and filesystems resolved; errors name the flag at fault.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, bail};
use clap::Args;
use evictd_policy::{flags::PolicyArgs, rank::FsLayout};

mod wake_flags;

use wake_flags::{bytes_flag, charge_tier_flag_values, unwoken_thresholds};

use crate::{
    cluster::{
        connect::{self, ApiOptions, ApiSource},
        taints::TaintEffect,
    },
    daemon::{KillOptions, PressureOptions, RunOptions, protect::SelfProtection, urgency::EmergencyLevel},
    kernel::{stat_items, tracefs},
    node::{
        cgroups::CgroupMounts,
        memory::{self, MemoryCgroup},
        own_pod,
        signals::{NodeSignalSources, PidSources},
    },
    report::trace::TraceFormat,
    runtime::cri,
};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Print one line per wake event and a summary each second (to stdout).
    #[arg(long)]
    pub trace: bool,
    /// With --trace: JSON Lines, one object per event or summary.
    #[arg(long, requires = "trace")]
    pub json: bool,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// The memory cgroup that plays the node (absolute, or relative to the memory
    /// controller's mount). Default: the hierarchy root, i.e. the whole node.
    #[arg(long, value_name = "PATH")]
    pub node_cgroup: Option<PathBuf>,
    /// Take /proc/meminfo even when it is not procfs's: for a node that is itself a
    /// container (LXD, Incus, Proxmox), whose kubelet reads the same LXCFS file. Off, such a
    /// file is refused: in a container on a real node it shows the container's memory.
    #[arg(long)]
    pub accept_lxcfs_meminfo: bool,
    /// The container runtime's CRI socket; `none` runs without one (nothing can be evicted).
    #[arg(long, value_name = "unix:///PATH|none", default_value = cri::DEFAULT_ENDPOINT)]
    pub cri_endpoint: String,
    /// Deadline of one CRI call that reads (listing, status, stats) or cleans up.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_period)]
    pub cri_timeout: Duration,
    /// Deadline of a stop (StopContainer gets the pod's grace period on top), the kubelet's
    /// `--runtime-request-timeout`: a stop a slow runtime is still carrying out is waited for,
    /// not cancelled into a failed eviction (an emergency kills without waiting for it).
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_period)]
    pub runtime_request_timeout: Duration,
    /// Decide and report, but stop no pod ("would evict ...").
    #[arg(long)]
    pub dry_run: bool,
    /// A PodList (kubectl get pods -o json) with the pods' specs; re-read when it changes.
    /// Pods not in it get specs inferred from the node, and the log says so.
    #[arg(long, value_name = "FILE")]
    pub pods_file: Option<PathBuf>,
    /// Let evictd evict `kube-system` pods whose specs it could only infer (not in
    /// --pods-file): their priority cannot be seen on the node, and they are protected by
    /// default.
    #[arg(long)]
    pub evict_inferred_kube_system: bool,
    /// The pods' cgroup under the node cgroup, for allocatableMemory.available.
    /// Default: `kubepods` or `kubepods.slice`, whichever exists.
    #[arg(long, value_name = "NAME")]
    pub kubepods_cgroup: Option<String>,
    /// The kubelet's root directory (its `--root-dir`): its filesystem is nodefs, and pods'
    /// local volumes are measured under `<DIR>/pods/<uid>/volumes`.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet")]
    pub nodefs_path: PathBuf,
    /// The directory whose filesystem is imagefs (a different filesystem from nodefs makes
    /// it a dedicated imagefs).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/containerd")]
    pub imagefs_path: PathBuf,
    /// How often the pod inventory is refreshed from the runtime.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_period)]
    pub inventory_interval: Duration,
    /// How long to wait for an evicted pod's memory to be released.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub release_timeout: Duration,
    /// Whether evictd may kill a pod itself (pidfds, `cgroup.kill` or the freezer,
    /// `process_mrelease`) when waiting for the runtime would let the kernel act first:
    /// `auto` does so at an emergency and when the hard grace period is 0; `never` stops
    /// pods only through the CRI, as the kubelet does.
    #[arg(long, value_name = "auto|never", default_value = "auto", value_parser = ["auto", "never"])]
    pub fast_kill: String,
    /// The grace period of a hard eviction, in seconds: the kubelet's is 1 (SIGTERM, then
    /// SIGKILL a second later). 0 kills at once (the fast kill where the node allows it).
    #[arg(long, value_name = "SECONDS", default_value_t = 1, value_parser = clap::value_parser!(i64).range(0..=3600))]
    pub hard_eviction_grace_period: i64,
    /// memory.available (or allocatableMemory.available, where a threshold watches it) below
    /// which memory is an emergency: a stop under way turns into a kill at once, the waits for
    /// the last evicted pod's memory and for a newer pod list end, and a memory decision may
    /// evict a pod the API has not listed. `auto` is half of each hard memory threshold, or a
    /// quantity such as `50Mi`.
    #[arg(long, value_name = "auto|QUANTITY", default_value = "auto")]
    pub emergency_available: String,
    /// SCHED_FIFO priority (1–99) of the daemon's thread, which wakes, decides and kills;
    /// `0` leaves it an ordinary thread. Refused without CAP_SYS_NICE, with a message.
    #[arg(long, value_name = "PRIORITY", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=99))]
    pub realtime_priority: u8,
    /// evictd's own oom_score_adj, so that the kernel's OOM killer picks anything else
    /// first: −999, as the kubelet sets for itself. `keep` leaves it as inherited.
    #[arg(long, value_name = "N|keep", default_value = "-999", allow_hyphen_values = true)]
    pub oom_score_adj: String,
    /// Lock evictd's memory (mlockall, as pages are first touched), so that none of it is
    /// reclaimed when the node is short of memory: `on` or `off`.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    pub lock_memory: String,
    /// The fallback timer's period.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_period)]
    pub housekeeping_interval: Duration,
    /// How often the pods' logs and volumes are walked for their disk use (the kubelet's
    /// `volumeStatsAggPeriod`): a disk decision asks for a walk of its own whatever this is;
    /// the storage-limit check reads the last one.
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = parse_period)]
    pub volume_stats_agg_period: Duration,
    /// Which wake sources to use, comma-separated: ebpf, eventfd (cgroup v1 memory
    /// thresholds), psi (pressure stall triggers), poll (the node's usage, read more often
    /// the nearer a threshold), disk (the same for the filesystems of disk thresholds),
    /// timer. Each that this kernel does not allow is reported and skipped.
    #[arg(long, value_name = "LIST", default_value = "ebpf,eventfd,psi,poll,disk,timer")]
    pub wake_sources: String,
    /// The fastest fill the adaptive poll must see before it crosses a threshold, per
    /// second: it reads the node's usage every (distance to the next level) / this, between
    /// 1 ms and 1 s.
    #[arg(long, value_name = "QUANTITY", default_value = "6Gi")]
    pub poll_fill_rate: String,
    /// The fastest a filesystem may fill that the disk poll must see before it crosses a
    /// disk threshold, bytes per second: each filesystem is read every (distance to its
    /// nearest threshold) / this, between 1 ms and 1 s.
    #[arg(long, value_name = "QUANTITY", default_value = "2Gi")]
    pub disk_fill_rate: String,
    /// As `--disk-fill-rate`, for inodes: the fastest file creation to see in time, per
    /// second.
    #[arg(long, value_name = "QUANTITY", default_value = "200k")]
    pub inodes_fill_rate: String,
    /// When the eBPF charge programs are attached: `near` a memory threshold (within what
    /// the poll's fill rate covers in 120 ms; needs `poll` among the wake sources, else they
    /// stay attached), or `always` (every page fault pays for them).
    #[arg(long, value_name = "near|always", default_value = "near", value_parser = ["near", "always"])]
    pub charge_probes: String,
    /// The eBPF charge tier: `auto` (the batched charge hook where the kernel has BPF
    /// trampolines, else the memcg stat tracepoints: what `evictd probe` names), or one of
    /// them forced; evictd does not start when the kernel cannot attach the one named.
    #[arg(long, value_name = "TIER", default_value = "auto", value_parser = charge_tier_flag_values())]
    pub charge_tier: String,
    /// Charge growth after which the kernel wakes evictd: `auto` (half the distance to the
    /// nearest memory threshold, the whole distance within 2 MiB of it) or a quantity such as
    /// `64Mi` (`0`: every charge event).
    #[arg(long, value_name = "auto|QUANTITY", default_value = "auto")]
    pub bpf_watermark: String,
    /// eBPF ring buffer size (a power of two, at least 4Ki): ~1300 wake events at 64Ki, of
    /// which charge events take at most half.
    #[arg(long, value_name = "QUANTITY", default_value = "64Ki")]
    pub ring_buffer_size: String,
    /// Kernel stat items that count as memory charge (names from enum node_stat_item and
    /// memcg_stat_item), comma-separated.
    #[arg(long, value_name = "LIST")]
    pub charge_items: Option<String>,
    /// Minimum gap between two reclaim or OOM wake events on one CPU.
    #[arg(long, value_name = "DURATION", default_value = "10ms", value_parser = parse_duration)]
    pub reclaim_min_interval: Duration,
    /// Serve Prometheus metrics (wakes, evictions, latency histograms) at
    /// http://ADDR/metrics, e.g. `0.0.0.0:9808`.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Serve /healthz and /readyz also at ADDR (e.g. `0.0.0.0:9102`), on connections of
    /// their own: a client holding every connection of the metrics port cannot fail the
    /// kubelet's probes. Point the probes here.
    #[arg(long, value_name = "ADDR")]
    pub probe_addr: Option<std::net::SocketAddr>,
    /// A kubeconfig for the Kubernetes API, where evictions are recorded as the kubelet
    /// records them (the pod Failed/Evicted, events). Default: the pod's service account
    /// when evictd runs in a pod, else no API (the kubelet then restarts what evictd stops).
    #[arg(long, value_name = "FILE", conflicts_with = "no_kube_api")]
    pub kubeconfig: Option<PathBuf>,
    /// Write nothing to the Kubernetes API, even from inside a pod.
    #[arg(long)]
    pub no_kube_api: bool,
    /// This node's name in Kubernetes (events, node conditions). Default: the host name,
    /// lowercased, as the kubelet's default.
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// While evictd's MemoryPressure (DiskPressure, PIDPressure) condition is true, its Node
    /// carries the taint evictd.io/memory-pressure (disk-, pid-) with this effect, so the
    /// scheduler does not put evicted pods straight back: NoSchedule, PreferNoSchedule, or
    /// none (evictd then only removes the taints an earlier run left).
    #[arg(long, value_name = "EFFECT", default_value = "NoSchedule")]
    pub node_taint_effect: TaintEffect,
    /// Deadline of one Kubernetes API request; a failed one is retried with back-off.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_period)]
    pub kube_api_timeout: Duration,
    /// Exit after this long (for scripts and tests).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,
}

/// Longer than any interval or timeout makes sense for, and short enough that adding it to
/// a clock cannot overflow.
const MAX_FLAG_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);
/// The shortest period a timer, an inventory refresh or a CRI deadline may have: below it the
/// daemon would spin (or every call would time out).
const MIN_PERIOD: Duration = Duration::from_millis(10);

/// A duration flag that does not parse, or is out of range.
#[derive(Debug, thiserror::Error)]
enum DurationFlagError {
    #[error("{text:?}: {error} (examples: 10s, 500ms, 5m)")]
    Parse { text: String, error: humantime::DurationError },
    #[error("{text:?} is longer than a year")]
    TooLong { text: String },
    #[error("{text:?} is shorter than {MIN_PERIOD:?}: the daemon would spin")]
    TooShort { text: String },
}

fn parse_duration(s: &str) -> Result<Duration, DurationFlagError> {
    let d =
        humantime::parse_duration(s).map_err(|error| DurationFlagError::Parse { text: s.into(), error })?;
    if d > MAX_FLAG_DURATION {
        return Err(DurationFlagError::TooLong { text: s.into() });
    }
    Ok(d)
}

/// A period: a timer's, a refresh's, a deadline's.
fn parse_period(s: &str) -> Result<Duration, DurationFlagError> {
    let d = parse_duration(s)?;
    if d < MIN_PERIOD {
        return Err(DurationFlagError::TooShort { text: s.into() });
    }
    Ok(d)
}

/// A path on the host evictd opens, and what for.
#[derive(Clone, Debug)]
pub struct HostPath {
    pub path: PathBuf,
    pub why: &'static str,
}

/// Where the kubelet writes pods' logs (the CRI's `log_directory` is under it): disk ranking
/// reads their usage.
pub const KUBELET_POD_LOGS: &str = "/var/log/pods";

impl RunArgs {
    /// The host paths evictd opens with these flags: what a container running it must see
    /// at the same paths (`deploy/daemonset.yaml` mounts them; `tests/tests/deploy.rs`
    /// checks that it does).
    pub fn host_paths(&self) -> Vec<HostPath> {
        let hp = |path: &str, why| HostPath { path: PathBuf::from(path), why };
        let mut paths = vec![
            hp("/sys/fs/cgroup", "the cgroup hierarchies: node and pod memory, PIDs, thresholds, kills"),
            hp(stat_items::VMLINUX_BTF, "the kernel's BTF: stat item numbers, the batched charge hook"),
            hp(tracefs::CANDIDATES[0], "tracefs: the tracepoints' record layouts"),
            hp(KUBELET_POD_LOGS, "pods' logs: disk usage for ranking"),
            HostPath {
                path: self.nodefs_path.clone(),
                why: "nodefs: the kubelet's root directory (--nodefs-path)",
            },
            HostPath {
                path: self.imagefs_path.clone(),
                why: "imagefs: the runtime's root directory (--imagefs-path)",
            },
        ];
        if let Ok(socket) = cri::socket_path(&self.cri_endpoint) {
            paths.push(HostPath { path: socket, why: "the container runtime's CRI socket (--cri-endpoint)" });
        }
        if let Some(f) = &self.pods_file {
            paths.push(HostPath { path: f.clone(), why: "--pods-file" });
        }
        if let Some(f) = &self.kubeconfig {
            paths.push(HostPath { path: f.clone(), why: "--kubeconfig" });
        }
        if let Some(f) = &self.policy.config {
            paths.push(HostPath { path: f.clone(), why: "--config: the kubelet's configuration file" });
        }
        if let Some(d) = &self.policy.config_dir {
            paths.push(HostPath { path: d.clone(), why: "--config-dir: the kubelet's drop-in directory" });
        }
        paths
    }

    /// Validates every flag and resolves the node; errors name the flag at fault.
    pub fn into_options(self) -> anyhow::Result<RunOptions> {
        let (policy, warnings) = self.policy.policy()?;
        for w in warnings {
            tracing::warn!("{w}");
        }
        let wake = self.wake_options()?;
        if let Some(w) = unwoken_thresholds(&policy, &wake.sources) {
            tracing::warn!("{w}");
        }
        let cgroups = CgroupMounts::detect()?;
        let signals = self.node_signals(&cgroups)?;
        let fs_layout =
            if signals.dedicated_imagefs() { FsLayout::DedicatedImageFs } else { FsLayout::SingleFs };
        let cri_endpoint = match self.cri_endpoint.as_str() {
            "none" => None,
            ep => {
                cri::socket_path(ep).map_err(|e| anyhow::anyhow!("--cri-endpoint: {e}"))?;
                Some(ep.to_owned())
            }
        };
        if let Some(p) = &self.pods_file {
            evictd_policy::podspec::read_pod_list(p).context("--pods-file")?;
        }
        let kill = self.kill_options()?;
        let api = self.api_options()?;
        let protection = self.self_protection()?;
        Ok(RunOptions {
            policy,
            policy_args: self.policy.clone(),
            pressure: PressureOptions {
                signals,
                fs_layout,
                cri_endpoint,
                cri_timeout: self.cri_timeout,
                runtime_request_timeout: self.runtime_request_timeout,
                annotation_trust: self.policy.annotation_trust(),
                dry_run: self.dry_run,
                pods_file: self.pods_file,
                inventory_interval: self.inventory_interval,
                release_timeout: self.release_timeout,
                kill,
                own_pod_uid: own_pod::identify()?,
                evict_inferred_kube_system: self.evict_inferred_kube_system,
                storage_limit_period: self.housekeeping_interval,
                volume_stats_period: self.volume_stats_agg_period,
            },
            wake,
            trace: self.trace.then_some(if self.json { TraceFormat::Json } else { TraceFormat::Text }),
            duration: self.duration,
            cgroups,
            metrics_addr: self.metrics_addr,
            probe_addr: self.probe_addr,
            realtime_priority: self.realtime_priority,
            api,
            protection,
        })
    }

    /// `--oom-score-adj`, `--lock-memory`.
    fn self_protection(&self) -> anyhow::Result<SelfProtection> {
        let oom_score_adj = match self.oom_score_adj.as_str() {
            "keep" => None,
            n => Some(n.parse::<i16>().ok().filter(|n| (-1000..=1000).contains(n)).with_context(|| {
                format!("--oom-score-adj {n:?}: not `keep` or a number from -1000 to 1000")
            })?),
        };
        Ok(SelfProtection { oom_score_adj, lock_memory: self.lock_memory == "on" })
    }

    /// `--kubeconfig`, `--no-kube-api`, `--node-name`, `--kube-api-timeout`,
    /// `--node-taint-effect`.
    fn api_options(&self) -> anyhow::Result<Option<ApiOptions>> {
        let source = match &self.kubeconfig {
            _ if self.no_kube_api => return Ok(None),
            Some(path) => ApiSource::kubeconfig(path)?,
            None if connect::in_cluster() => ApiSource::InCluster,
            None => return Ok(None),
        };
        let node_name = match &self.node_name {
            Some(n) if n.trim().is_empty() => bail!("--node-name (or NODE_NAME) is empty"),
            Some(n) => n.trim().to_owned(),
            None => nix::unistd::gethostname()
                .context("--node-name: not given, and the host name cannot be read")?
                .to_string_lossy()
                .to_lowercase(),
        };
        Ok(Some(ApiOptions {
            source,
            node_name,
            timeout: self.kube_api_timeout,
            taint_effect: self.node_taint_effect,
        }))
    }

    /// `--fast-kill`, `--hard-eviction-grace-period`, `--emergency-available`.
    fn kill_options(&self) -> anyhow::Result<KillOptions> {
        Ok(KillOptions {
            fast_kill: self.fast_kill == "auto",
            hard_grace_seconds: self.hard_eviction_grace_period,
            emergency: emergency_level(&self.emergency_available)?,
        })
    }

    /// The cgroup playing the node (`--node-cgroup`), its pods' cgroup, and the filesystems
    /// of nodefs and imagefs.
    fn node_signals(&self, cgroups: &CgroupMounts) -> anyhow::Result<NodeSignalSources> {
        // The node's capacity is read from it, whichever cgroup plays the node.
        match memory::check_meminfo_is_the_kernels(Path::new(memory::MEMINFO)) {
            Err(e) if self.accept_lxcfs_meminfo => {
                tracing::warn!("{e} — taken all the same (--accept-lxcfs-meminfo)")
            }
            checked => checked?,
        }
        let node = match &self.node_cgroup {
            None => {
                cgroups.check_sees_the_node()?;
                MemoryCgroup::new(&cgroups.memory_root, cgroups.memory_version, true)
            }
            Some(p) => {
                let dir = if p.is_absolute() { p.clone() } else { cgroups.memory_root.join(p) };
                if !dir.is_dir() {
                    bail!("--node-cgroup: {} is not a memory cgroup directory", dir.display());
                }
                let is_root = dir.canonicalize().ok() == cgroups.memory_root.canonicalize().ok();
                MemoryCgroup::new(dir, cgroups.memory_version, is_root)
            }
        }
        .kept_open();
        node.read().with_context(|| format!("reading the node's memory from {}", node.dir.display()))?;
        let kubepods = match &self.kubepods_cgroup {
            Some(name) => Some(NodeSignalSources::kubepods_for(&node, name).with_context(|| {
                format!("--kubepods-cgroup: no cgroup {name} under {}", node.dir.display())
            })?),
            None => NodeSignalSources::kubepods_for(&node, "kubepods")
                .or_else(|| NodeSignalSources::kubepods_for(&node, "kubepods.slice")),
        };
        // Paths that do not exist on this machine (no kubelet here) fall back to /, and say so.
        let existing = |flag: &str, p: &PathBuf| {
            if p.exists() {
                return p.clone();
            }
            tracing::warn!("{flag} {} does not exist: measuring / instead", p.display());
            PathBuf::from("/")
        };
        Ok(NodeSignalSources {
            node,
            kubepods,
            nodefs: existing("--nodefs-path", &self.nodefs_path),
            imagefs: existing("--imagefs-path", &self.imagefs_path),
            containerfs: None,
            pids: PidSources::default(),
        })
    }
}

/// `--emergency-available`: `auto` (half of each hard memory threshold) or a quantity, which
/// a level past what an i64 holds saturates rather than wrapping below zero (never an
/// emergency).
pub(crate) fn emergency_level(text: &str) -> anyhow::Result<EmergencyLevel> {
    Ok(match text {
        "auto" => EmergencyLevel::HalfHard,
        q => {
            EmergencyLevel::Bytes(i64::try_from(bytes_flag("--emergency-available", q)?).unwrap_or(i64::MAX))
        }
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::{
        cli::Cli,
        wake::{SourceKind, Watermark},
    };

    fn args(extra: &[&str]) -> anyhow::Result<RunOptions> {
        let mut argv = vec!["evictd"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv)?.run.into_options()
    }

    #[test]
    fn defaults_are_the_kubelet_hard_thresholds_and_the_whole_node() {
        let o = args(&[]).unwrap();
        assert_eq!(o.policy.thresholds.len(), 6, "5 kubelet defaults + the allocatable copy");
        assert!(o.pressure.signals.node.is_root);
        assert!(!o.pressure.dry_run);
        assert_eq!(o.pressure.cri_endpoint.as_deref(), Some("unix:///run/containerd/containerd.sock"));
        assert_eq!(o.wake.sources, SourceKind::ALL);
        assert_eq!(o.wake.housekeeping, Duration::from_secs(10));
        assert_eq!(o.wake.watermark, Watermark::Auto);
        assert_eq!(o.wake.load.ring_buffer_bytes, crate::kernel::ebpf::DEFAULT_RING_BUFFER_BYTES);
        assert!(args(&["--eviction-hard="]).unwrap().policy.thresholds.is_empty());
        assert!(args(&["--cri-endpoint", "none"]).unwrap().pressure.cri_endpoint.is_none());
    }

    #[test]
    fn bad_flags_name_themselves() {
        for (argv, needle) in [
            (vec!["--eviction-hard", "memory.available<0"], "--eviction-hard"),
            (vec!["--eviction-soft", "bogus<1"], "--eviction-soft"),
            (vec!["--wake-sources", "ebpf,carrier-pigeon"], "--wake-sources"),
            (vec!["--wake-sources", ""], "--wake-sources"),
            (vec!["--bpf-watermark", "lots"], "--bpf-watermark"),
            (vec!["--ring-buffer-size", "3000"], "--ring-buffer-size"),
            (vec!["--poll-fill-rate", "fast"], "--poll-fill-rate"),
            (vec!["--poll-fill-rate", "1Ki"], "--poll-fill-rate"),
            (vec!["--disk-fill-rate", "fast"], "--disk-fill-rate"),
            (vec!["--disk-fill-rate", "1Ki"], "--disk-fill-rate"),
            (vec!["--inodes-fill-rate=-5"], "--inodes-fill-rate"),
            (vec!["--inodes-fill-rate", "10"], "--inodes-fill-rate"),
            (vec!["--node-cgroup", "/nonexistent/evictd"], "--node-cgroup"),
            (vec!["--cri-endpoint", "tcp://127.0.0.1:1"], "--cri-endpoint"),
            (vec!["--pods-file", "/nonexistent/pods.json"], "--pods-file"),
            (vec!["--kubepods-cgroup", "nope"], "--kubepods-cgroup"),
            // Values that would break the daemon quietly (a zero interval or timeout).
            (vec!["--housekeeping-interval", "0s"], "--housekeeping-interval"),
            (vec!["--inventory-interval", "0s"], "--inventory-interval"),
            (vec!["--cri-timeout", "0s"], "--cri-timeout"),
            (vec!["--duration", "1000000d"], "--duration"),
            (vec!["--charge-items", "NR_ACTIVE_ANON,NR_ACTIV_FILE"], "--charge-items"),
            (vec!["--kubeconfig", "/nonexistent/kubeconfig"], "--kubeconfig"),
            (vec!["--oom-score-adj", "-1001"], "--oom-score-adj"),
            (vec!["--oom-score-adj", "low"], "--oom-score-adj"),
            (vec!["--kubeconfig", "/etc/passwd"], "--kubeconfig"),
            (vec!["--kubeconfig", "/nonexistent/kubeconfig", "--no-kube-api"], "--no-kube-api"),
            (vec!["--charge-tier", "memcg-tracepoints", "--wake-sources", "poll,timer"], "--charge-tier"),
        ] {
            let err = args(&argv).err().unwrap_or_else(|| panic!("{argv:?} should fail"));
            assert!(format!("{err:#}").contains(needle), "{argv:?}: {err:#}");
        }
        assert!(args(&["--housekeeping-interval", "soon"]).is_err());
        assert!(args(&["--charge-items", "NR_ACTIVE_ANON,NR_ACTIVE_FILE"]).is_ok());
        assert!(args(&["--json"]).is_err(), "--json needs --trace");
    }

    #[test]
    fn the_api_is_used_only_when_configured_and_names_the_node() {
        let d = tempfile::tempdir().unwrap();
        let kubeconfig = d.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n\
             contexts:\n- name: c\n  context:\n    cluster: c\ncurrent-context: c\n",
        )
        .unwrap();
        let k = kubeconfig.to_str().unwrap();
        let api = |argv: &[&str]| {
            let mut full = vec!["evictd"];
            full.extend_from_slice(argv);
            Cli::try_parse_from(full).map_err(anyhow::Error::from).and_then(|c| c.run.api_options())
        };
        let o = api(&["--kubeconfig", k, "--node-name", "Node-A "]).unwrap().expect("an API");
        assert!(
            matches!(&o.source, ApiSource::Kubeconfig { path, .. } if *path == kubeconfig),
            "{:?}",
            o.source
        );
        assert_eq!(o.node_name, "Node-A", "as given, trimmed");
        let err = api(&["--kubeconfig", k, "--node-name", " "]).unwrap_err();
        assert!(format!("{err:#}").contains("--node-name"), "{err:#}");
        assert!(api(&["--no-kube-api"]).unwrap().is_none());
        if !connect::in_cluster() {
            assert!(api(&[]).unwrap().is_none(), "no kubeconfig, not in a pod: no API");
        }
    }

    #[test]
    fn no_timer_is_a_warning_when_some_threshold_needs_it() {
        let (all, _) = PolicyArgs::default().policy().unwrap();
        let w =
            unwoken_thresholds(&all, &[SourceKind::Ebpf]).expect("the default policy has disk thresholds");
        assert!(w.contains("--wake-sources") && w.contains("nodefs.available<10%"), "{w}");
        assert!(!w.contains("memory.available<100Mi"), "hard memory thresholds are woken by the kernel: {w}");
        assert!(unwoken_thresholds(&all, &[SourceKind::Ebpf, SourceKind::Timer]).is_none());
        let memory_only =
            PolicyArgs { eviction_hard: Some("memory.available<1Gi".into()), ..Default::default() };
        let (memory_only, _) = memory_only.policy().unwrap();
        assert!(unwoken_thresholds(&memory_only, &[SourceKind::Ebpf]).is_none());
        // The disk poll wakes disk thresholds, hard and soft.
        let disk = PolicyArgs {
            eviction_hard: Some("memory.available<1Gi,nodefs.available<10%".into()),
            eviction_soft: Some("imagefs.available<20%".into()),
            eviction_soft_grace_period: Some("imagefs.available=1m".into()),
            ..Default::default()
        };
        let (disk, _) = disk.policy().unwrap();
        assert!(unwoken_thresholds(&disk, &[SourceKind::Ebpf, SourceKind::Disk]).is_none());
        let pid = PolicyArgs { eviction_hard: Some("pid.available<1k".into()), ..Default::default() };
        let (pid, _) = pid.policy().unwrap();
        assert!(unwoken_thresholds(&pid, &[SourceKind::Disk]).is_some_and(|w| w.contains("pid.available")));
    }
}
