use clap::Parser as _;
use evictd::{
    cli::{Cli, Command},
    daemon, probe,
};
use tracing_subscriber::EnvFilter;

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
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
