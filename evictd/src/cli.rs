//! Command-line interface. Flag names follow the kubelet's where they mean the same thing.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand};

use crate::{
    cgroup_layout::CgroupLayout,
    daemon::{PressureOptions, RunOptions, Watermark},
    ebpf::LoadOptions,
    memory::MemoryCgroup,
    node_signals::NodeSignalSources,
    stat_items,
    trace::TraceFormat,
};
use evictd_policy::{flags::PolicyArgs, quantity::Quantity, rank::FsLayout};

#[derive(Parser, Debug)]
#[command(
    name = "evictd",
    version,
    about = "Kubernetes node-pressure eviction, woken by the kernel within milliseconds"
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print what this kernel offers (BPF, tracepoints, BTF, cgroups, PSI, eventfd
    /// thresholds) and what evictd will use.
    Probe {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Validate an eviction policy and print it as evictd (and the kubelet) understands it.
    CheckConfig {
        #[command(flatten)]
        policy: PolicyArgs,
        #[arg(long, value_enum, default_value = "table")]
        output: OutputFormat,
    },
    /// Decide on one kubelet Summary API document and a PodList, as the daemon would.
    Simulate {
        /// A kubelet Summary (/api/v1/nodes/<node>/proxy/stats/summary).
        #[arg(long, value_name = "FILE")]
        summary: PathBuf,
        #[command(flatten)]
        offline: OfflineArgs,
    },
    /// Decide on a sequence of Summary documents (JSON Lines, in time order), carrying the
    /// engine's state from step to step.
    Replay {
        #[arg(long, value_name = "FILE.jsonl")]
        summaries: PathBuf,
        #[command(flatten)]
        offline: OfflineArgs,
    },
}

/// What `simulate` and `replay` share.
#[derive(Args, Debug)]
pub struct OfflineArgs {
    /// A PodList (kubectl get pods -o json), joined to the summaries by pod UID.
    #[arg(long, value_name = "FILE")]
    pub pods: PathBuf,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// The node has a dedicated imagefs (changes disk ranking and reclaim).
    #[arg(long)]
    pub dedicated_imagefs: bool,
    #[arg(long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

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
    /// The container runtime's CRI socket; `none` runs without one (nothing can be evicted).
    #[arg(long, value_name = "unix:///PATH|none", default_value = crate::cri::DEFAULT_ENDPOINT)]
    pub cri_endpoint: String,
    /// Deadline of one CRI call (StopContainer gets the pod's grace period on top).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub cri_timeout: Duration,
    /// Decide and report, but stop no pod ("would evict ...").
    #[arg(long)]
    pub dry_run: bool,
    /// A PodList (kubectl get pods -o json) with the pods' specs; re-read when it changes.
    /// Pods not in it get specs inferred from the node, and the log says so.
    #[arg(long, value_name = "FILE")]
    pub pods_file: Option<PathBuf>,
    /// The pods' cgroup under the node cgroup, for allocatableMemory.available.
    /// Default: `kubepods` or `kubepods.slice`, whichever exists.
    #[arg(long, value_name = "NAME")]
    pub kubepods_cgroup: Option<String>,
    /// The directory whose filesystem is nodefs.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet")]
    pub nodefs_path: PathBuf,
    /// The directory whose filesystem is imagefs (a different filesystem from nodefs makes
    /// it a dedicated imagefs).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/containerd")]
    pub imagefs_path: PathBuf,
    /// How often the pod inventory is refreshed from the runtime.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub inventory_interval: Duration,
    /// How long to wait for an evicted pod's memory to be released.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub release_timeout: Duration,
    /// The fallback timer's period.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub housekeeping_interval: Duration,
    /// Which wake sources to use, comma-separated: ebpf, eventfd (cgroup v1 memory
    /// thresholds), psi (pressure stall triggers), timer. Each that this kernel does not
    /// allow is reported and skipped.
    #[arg(long, value_name = "LIST", default_value = "ebpf,eventfd,psi,timer")]
    pub wake_sources: String,
    /// Charge growth after which the kernel wakes evictd: `auto` (half the distance to the
    /// nearest memory threshold) or a quantity such as `64Mi` (`0`: every page).
    #[arg(long, value_name = "auto|QUANTITY", default_value = "auto")]
    pub bpf_watermark: String,
    /// eBPF ring buffer size (a power of two, at least 4Ki).
    #[arg(long, value_name = "QUANTITY", default_value = "256Ki")]
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
    /// Exit after this long (for scripts and tests).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (examples: 10s, 500ms, 5m)"))
}

impl RunArgs {
    /// Validates every flag and resolves the node; errors name the flag at fault.
    pub fn into_options(self) -> anyhow::Result<RunOptions> {
        let (policy, warnings) = self.policy.policy()?;
        for w in warnings {
            tracing::warn!("{w}");
        }

        let (mut ebpf, mut timer, mut eventfd, mut psi) = (false, false, false, false);
        for s in self.wake_sources.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match s {
                "ebpf" => ebpf = true,
                "timer" => timer = true,
                "eventfd" => eventfd = true,
                "psi" => psi = true,
                other => {
                    bail!("--wake-sources: unknown wake source {other:?} (known: ebpf, eventfd, psi, timer)")
                }
            }
        }
        if !(ebpf || timer || eventfd || psi) {
            bail!("--wake-sources: at least one wake source is needed");
        }

        let watermark = match self.bpf_watermark.as_str() {
            "auto" => Watermark::Auto,
            q => {
                let q = Quantity::parse(q).with_context(|| format!("--bpf-watermark: {q:?}"))?;
                if q.is_negative() {
                    bail!("--bpf-watermark: must not be negative");
                }
                Watermark::Fixed(q.value() as u64)
            }
        };
        let ring = Quantity::parse(&self.ring_buffer_size)
            .with_context(|| format!("--ring-buffer-size: {:?}", self.ring_buffer_size))?
            .value();
        if !(4096..=1 << 30).contains(&ring) || (ring as u64).count_ones() != 1 {
            bail!("--ring-buffer-size: {} is not a power of two between 4Ki and 1Gi", self.ring_buffer_size);
        }
        let charge_items = match &self.charge_items {
            Some(list) => list.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect(),
            None => stat_items::DEFAULT_CHARGE_ITEMS.iter().map(|s| s.to_string()).collect(),
        };

        let layout = CgroupLayout::detect()?;
        let node = match &self.node_cgroup {
            None => MemoryCgroup::new(&layout.memory_root, layout.memory_version, true),
            Some(p) => {
                let dir = if p.is_absolute() { p.clone() } else { layout.memory_root.join(p) };
                if !dir.is_dir() {
                    bail!("--node-cgroup: {} is not a memory cgroup directory", dir.display());
                }
                let is_root = dir.canonicalize().ok() == layout.memory_root.canonicalize().ok();
                MemoryCgroup::new(dir, layout.memory_version, is_root)
            }
        };
        node.read().with_context(|| format!("reading the node's memory from {}", node.dir.display()))?;
        let kubepods = match &self.kubepods_cgroup {
            Some(name) => Some(NodeSignalSources::kubepods_for(&node, name).with_context(|| {
                format!("--kubepods-cgroup: no cgroup {name} under {}", node.dir.display())
            })?),
            None => NodeSignalSources::kubepods_for(&node, "kubepods")
                .or_else(|| NodeSignalSources::kubepods_for(&node, "kubepods.slice")),
        };
        // Paths that do not exist on this machine (no kubelet here) fall back to /.
        let existing = |p: &PathBuf| if p.exists() { p.clone() } else { PathBuf::from("/") };
        let signals = NodeSignalSources {
            node,
            kubepods,
            nodefs: existing(&self.nodefs_path),
            imagefs: existing(&self.imagefs_path),
        };
        let fs_layout =
            if signals.dedicated_imagefs() { FsLayout::DedicatedImageFs } else { FsLayout::SingleFs };
        let cri_endpoint = match self.cri_endpoint.as_str() {
            "none" => None,
            ep => {
                crate::cri::socket_path(ep).map_err(|e| anyhow::anyhow!("--cri-endpoint: {e}"))?;
                Some(ep.to_owned())
            }
        };
        if let Some(p) = &self.pods_file {
            evictd_policy::offline::load_pods(p).context("--pods-file")?;
        }

        Ok(RunOptions {
            policy,
            pressure: PressureOptions {
                signals,
                fs_layout,
                cri_endpoint,
                cri_timeout: self.cri_timeout,
                dry_run: self.dry_run,
                pods_file: self.pods_file,
                inventory_interval: self.inventory_interval,
                release_timeout: self.release_timeout,
            },
            housekeeping: self.housekeeping_interval,
            ebpf,
            timer,
            eventfd,
            psi,
            load: LoadOptions {
                charge_items,
                ring_buffer_bytes: ring as u32,
                min_interval: self.reclaim_min_interval,
                ..Default::default()
            },
            watermark,
            trace: self.trace.then_some(if self.json { TraceFormat::Json } else { TraceFormat::Text }),
            duration: self.duration,
            layout,
            metrics_addr: self.metrics_addr,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> anyhow::Result<RunOptions> {
        let mut argv = vec!["evictd"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv)?.run.into_options()
    }

    #[test]
    fn defaults_are_the_kubelet_hard_thresholds_and_the_whole_node() {
        let o = args(&[]).unwrap();
        assert_eq!(o.policy.thresholds.len(), 5, "4 kubelet defaults + the allocatable copy");
        assert!(o.pressure.signals.node.is_root);
        assert!(!o.pressure.dry_run);
        assert_eq!(o.pressure.cri_endpoint.as_deref(), Some("unix:///run/containerd/containerd.sock"));
        assert!(o.ebpf && o.timer && o.eventfd && o.psi);
        assert_eq!(o.housekeeping, Duration::from_secs(10));
        assert_eq!(o.watermark, Watermark::Auto);
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
            (vec!["--node-cgroup", "/nonexistent/evictd"], "--node-cgroup"),
            (vec!["--cri-endpoint", "tcp://127.0.0.1:1"], "--cri-endpoint"),
            (vec!["--pods-file", "/nonexistent/pods.json"], "--pods-file"),
            (vec!["--kubepods-cgroup", "nope"], "--kubepods-cgroup"),
        ] {
            let err = args(&argv).err().unwrap_or_else(|| panic!("{argv:?} should fail"));
            assert!(format!("{err:#}").contains(needle), "{argv:?}: {err:#}");
        }
        assert!(args(&["--housekeeping-interval", "soon"]).is_err());
        assert!(args(&["--json"]).is_err(), "--json needs --trace");
    }
}
