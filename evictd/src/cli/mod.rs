//! Command-line interface: the daemon's flags (`run`), and the subcommands. Flag names
//! follow the kubelet's where they mean the same thing; the eviction flags themselves are
//! `evictd_policy::flags`, shared with the offline commands.

use std::{io::Write as _, path::PathBuf};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use evictd_policy::{flags::PolicyArgs, offline, podspec::Pod, policy::Policy, rank::FsLayout};

use crate::daemon;

mod probe;
mod run;
mod status;

pub use run::{HostPath, KUBELET_POD_LOGS, RunArgs};

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
        /// The daemon's --emergency-available, to be warned of the memory thresholds it
        /// reaches (an eviction on one kills at once and waits for nothing). Offline, a
        /// percentage threshold's level is not known; the daemon warns of those at start.
        #[arg(long, value_name = "auto|QUANTITY", default_value = "auto")]
        emergency_available: String,
        #[arg(long, value_enum, default_value = "table")]
        output: OutputFormat,
    },
    /// One screen for the person on call, from a running evictd's metrics endpoint: the
    /// node's signals against their thresholds, the wake tier, evictd's conditions and
    /// taints, and the last evictions with their timings.
    Status {
        /// Where that evictd serves its metrics (its --metrics-addr).
        #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9101")]
        addr: String,
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
    /// The writable layers are on a filesystem apart from the images, on nodefs (the
    /// kubelet's split containerfs, KEP-4191; the runtime's ImageFsInfo says so): needs
    /// --dedicated-imagefs.
    #[arg(long, requires = "dedicated_imagefs")]
    pub split_containerfs: bool,
    #[arg(long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

/// Runs what the command line asks for.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Probe { json }) => probe_command(json),
        Some(Command::CheckConfig { policy, emergency_available, output }) => {
            check_config(&policy, &emergency_available, output)
        }
        Some(Command::Status { addr }) => status::run(&addr),
        Some(Command::Simulate { summary, offline: o }) => {
            let (policy, pods, layout) = offline_session(&o)?;
            let mut session = offline::Session::new(&policy, layout, &pods);
            let json = o.output == OutputFormat::Json;
            Ok(offline::simulate(&mut session, &summary, json, &mut std::io::stdout().lock())?)
        }
        Some(Command::Replay { summaries, offline: o }) => {
            let (policy, pods, layout) = offline_session(&o)?;
            let file = std::fs::File::open(&summaries)
                .with_context(|| format!("reading summaries file {}", summaries.display()))?;
            let mut session = offline::Session::new(&policy, layout, &pods);
            let json = o.output == OutputFormat::Json;
            let name = summaries.display().to_string();
            let input = std::io::BufReader::new(file);
            Ok(offline::replay(&mut session, input, &name, json, &mut std::io::stdout().lock())?)
        }
        None => run_daemon(cli.run),
    }
}

fn run_daemon(args: RunArgs) -> anyhow::Result<()> {
    let opts = args.into_options()?;
    // Before the runtime exists: the daemon's loop, its passes and its kills run on this
    // thread (and the threads it starts reset to an ordinary policy), and every page mapped
    // from here on is locked as it is touched.
    daemon::realtime::enter(opts.realtime_priority);
    daemon::protect::protect(opts.protection);
    let rt = daemon::realtime::daemon_runtime()?;
    let ran = rt.block_on(daemon::run(opts));
    // A blocking read still under way (a policy read stuck on a stalled process or disk)
    // must not hold the exit: the kubelet gives the pod only its grace period.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    ran
}

fn probe_command(json: bool) -> anyhow::Result<()> {
    let report = probe::run();
    if json {
        serde_json::to_writer_pretty(std::io::stdout(), &report)?;
        println!();
    } else {
        probe::print_text(&report);
    }
    Ok(())
}

/// Warnings go to stderr only once the policy is valid: an invalid one prints one line.
fn valid_policy(args: &PolicyArgs) -> anyhow::Result<Policy> {
    let (policy, warnings) = args.policy()?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    Ok(policy)
}

fn check_config(args: &PolicyArgs, emergency_available: &str, output: OutputFormat) -> anyhow::Result<()> {
    let emergency = run::emergency_level(emergency_available)?;
    let input = args.input()?;
    let mut warnings = Vec::new();
    let policy = evictd_policy::policy::build(&input, &mut warnings)?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    // No node is read offline: the quantity thresholds are checked, the percentages not.
    daemon::urgency::warn_of_thresholds_within_the_emergency_level(
        &policy.thresholds,
        &Default::default(),
        emergency,
    );
    let mut out = std::io::stdout().lock();
    match output {
        OutputFormat::Json => {
            serde_json::to_writer(&mut out, &offline::check_config_json(&policy, &input.origins))?;
            writeln!(out)?;
        }
        OutputFormat::Table => offline::check_config_table(&policy, &input.origins, &mut out)?,
    }
    Ok(())
}

fn offline_session(o: &OfflineArgs) -> anyhow::Result<(Policy, Vec<Pod>, FsLayout)> {
    let policy = valid_policy(&o.policy)?;
    let pods = offline::load_pods(&o.pods, &o.policy.annotation_trust())?;
    let layout = match (o.dedicated_imagefs, o.split_containerfs) {
        (true, true) => FsLayout::SplitContainerFs,
        (true, false) => FsLayout::DedicatedImageFs,
        (false, _) => FsLayout::SingleFs,
    };
    Ok((policy, pods, layout))
}
