use anyhow::Context as _;
use clap::Parser as _;
use evictd::{
    cli::{Cli, Command, OfflineArgs, OutputFormat},
    daemon, probe,
};
use evictd_policy::{flags::PolicyArgs, offline, podspec::Pod, policy::Policy, rank::FsLayout};
use tracing_subscriber::EnvFilter;

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Probe { json }) => {
            let report = probe::run();
            if json {
                serde_json::to_writer_pretty(std::io::stdout(), &report)
                    .map_err(anyhow::Error::from)
                    .map(|()| println!())
            } else {
                probe::print_text(&report);
                Ok(())
            }
        }
        Some(Command::CheckConfig { policy, output }) => check_config(&policy, output),
        Some(Command::Simulate { summary, offline: o }) => {
            offline_session(&o).and_then(|(policy, pods, layout)| {
                let mut session = offline::Session::new(&policy, layout, &pods);
                offline::simulate(
                    &mut session,
                    &summary,
                    o.output == OutputFormat::Json,
                    &mut std::io::stdout().lock(),
                )
                .map_err(anyhow::Error::from)
            })
        }
        Some(Command::Replay { summaries, offline: o }) => {
            offline_session(&o).and_then(|(policy, pods, layout)| {
                let file = std::fs::File::open(&summaries)
                    .with_context(|| format!("reading summaries file {}", summaries.display()))?;
                let mut session = offline::Session::new(&policy, layout, &pods);
                offline::replay(
                    &mut session,
                    std::io::BufReader::new(file),
                    &summaries.display().to_string(),
                    o.output == OutputFormat::Json,
                    &mut std::io::stdout().lock(),
                )
                .map_err(anyhow::Error::from)
            })
        }
        None => run_daemon(cli.run),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("evictd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run_daemon(args: evictd::cli::RunArgs) -> anyhow::Result<()> {
    let opts = args.into_options()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(daemon::run(opts))
}

/// Warnings go to stderr only once the policy is valid: an invalid one prints one line.
fn valid_policy(args: &PolicyArgs) -> anyhow::Result<Policy> {
    let (policy, warnings) = args.policy()?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    Ok(policy)
}

fn check_config(args: &PolicyArgs, output: OutputFormat) -> anyhow::Result<()> {
    let policy = valid_policy(args)?;
    let mut out = std::io::stdout().lock();
    match output {
        OutputFormat::Json => {
            serde_json::to_writer(&mut out, &policy.to_json())?;
            use std::io::Write as _;
            writeln!(out)?;
        }
        OutputFormat::Table => offline::check_config_table(&policy, &mut out)?,
    }
    Ok(())
}

fn offline_session(o: &OfflineArgs) -> anyhow::Result<(Policy, Vec<Pod>, FsLayout)> {
    let policy = valid_policy(&o.policy)?;
    let pods = offline::load_pods(&o.pods)?;
    let layout = if o.dedicated_imagefs { FsLayout::DedicatedImageFs } else { FsLayout::SingleFs };
    Ok((policy, pods, layout))
}
