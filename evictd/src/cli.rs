//! Command-line interface. Flag names follow the kubelet's where they mean the same thing.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand};

use crate::{
    cgroup_layout::CgroupLayout,
    daemon::{RunOptions, Watermark},
    ebpf::LoadOptions,
    memory::MemoryCgroup,
    policy::{self, MapSetting, PolicyInput},
    quantity::Quantity,
    stat_items,
    trace::TraceFormat,
};

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
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Print one line per wake event and a summary each second (to stdout).
    #[arg(long)]
    pub trace: bool,
    /// With --trace: JSON Lines, one object per event or summary.
    #[arg(long, requires = "trace")]
    pub json: bool,
    /// Hard eviction thresholds, e.g. `memory.available<100Mi,nodefs.available<10%`.
    /// Omitted: the kubelet's Linux defaults. Empty (`--eviction-hard=`): none.
    #[arg(long, value_name = "LIST")]
    pub eviction_hard: Option<String>,
    /// Soft eviction thresholds, same syntax.
    #[arg(long, value_name = "LIST", default_value = "")]
    pub eviction_soft: String,
    /// Grace periods of the soft thresholds, e.g. `memory.available=1m30s`.
    #[arg(long, value_name = "LIST", default_value = "")]
    pub eviction_soft_grace_period: String,
    /// The memory cgroup that plays the node (absolute, or relative to the memory
    /// controller's mount). Default: the hierarchy root, i.e. the whole node.
    #[arg(long, value_name = "PATH")]
    pub node_cgroup: Option<PathBuf>,
    /// The fallback timer's period.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub housekeeping_interval: Duration,
    /// Which wake sources to use, comma-separated: ebpf, timer.
    #[arg(long, value_name = "LIST", default_value = "ebpf,timer")]
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
        let mut warnings = Vec::new();
        let hard = match &self.eviction_hard {
            Some(h) => Some(MapSetting::from_flag("--eviction-hard", h, '<')?),
            None => None,
        };
        let input = PolicyInput {
            hard,
            soft: MapSetting::from_flag("--eviction-soft", &self.eviction_soft, '<')?,
            soft_grace: MapSetting::from_flag(
                "--eviction-soft-grace-period",
                &self.eviction_soft_grace_period,
                '=',
            )?,
            ..Default::default()
        };
        let policy = policy::build(&input, &mut warnings)?;
        for w in warnings {
            tracing::warn!("{w}");
        }
        let thresholds = policy.thresholds;

        let mut ebpf = false;
        let mut timer = false;
        for s in self.wake_sources.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match s {
                "ebpf" => ebpf = true,
                "timer" => timer = true,
                other => bail!("--wake-sources: unknown wake source {other:?} (known: ebpf, timer)"),
            }
        }
        if !ebpf && !timer {
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

        Ok(RunOptions {
            thresholds,
            node,
            housekeeping: self.housekeeping_interval,
            ebpf,
            timer,
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
        assert_eq!(o.thresholds.len(), 5, "4 kubelet defaults + the allocatable copy");
        assert!(o.node.is_root);
        assert!(o.ebpf && o.timer);
        assert_eq!(o.housekeeping, Duration::from_secs(10));
        assert_eq!(o.watermark, Watermark::Auto);
        assert!(args(&["--eviction-hard="]).unwrap().thresholds.is_empty());
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
        ] {
            let err = args(&argv).err().unwrap_or_else(|| panic!("{argv:?} should fail"));
            assert!(format!("{err:#}").contains(needle), "{argv:?}: {err:#}");
        }
        assert!(args(&["--housekeeping-interval", "soon"]).is_err());
        assert!(args(&["--json"]).is_err(), "--json needs --trace");
    }
}
