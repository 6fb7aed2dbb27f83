//! The `shepherd` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use shepherd::bmdb::{Bmdb, BmdbSession, CloseSession, GetSession};
use shepherd::config::Config;

/// Exit status for invalid configuration (as for a usage error).
const EXIT_CONFIG: u8 = 2;

#[derive(Parser)]
#[command(
    name = "shepherd",
    version,
    about = "Takes fleets of bare-metal machines under management."
)]
struct Cli {
    /// Configuration file (TOML). Without one, every key takes its default;
    /// SHEPHERD__SECTION__KEY environment variables override either.
    #[arg(
        long,
        short,
        global = true,
        env = "SHEPHERD_CONFIG",
        value_name = "PATH"
    )]
    config: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service until SIGINT or SIGTERM.
    Run,
    /// Apply pending BMDB schema migrations, then exit.
    Migrate,
    /// Validate the configuration and print it, secrets redacted.
    CheckConfig,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cfg = match Config::load(cli.config.as_deref()) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("shepherd: invalid configuration: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Command::CheckConfig = cli.command {
        print!("{}", cfg.to_redacted_toml());
        eprintln!("shepherd: configuration is valid");
        return ExitCode::SUCCESS;
    }
    shepherd::telemetry::init(&cfg.log);
    let system = actix_rt::System::new();
    let result = system.block_on(async move {
        match cli.command {
            Command::Run => run(cfg).await,
            Command::Migrate => migrate(cfg).await,
            Command::CheckConfig => unreachable!(),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("shepherd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn migrate(mut cfg: Config) -> anyhow::Result<()> {
    cfg.bmdb.migrate_on_start = false;
    let bmdb = Bmdb::open(&cfg.bmdb).await?;
    let report = bmdb.migrate().await?;
    if report.applied.is_empty() {
        println!(
            "BMDB schema is up to date (version {})",
            report.version.unwrap_or(0)
        );
    } else {
        for m in &report.applied {
            println!("applied {m}");
        }
        println!("BMDB schema at version {}", report.version.unwrap_or(0));
    }
    Ok(())
}

async fn run(cfg: Config) -> anyhow::Result<()> {
    let bmdb = Bmdb::open(&cfg.bmdb).await?;
    let session = BmdbSession::open(&bmdb, "shepherd").await?;
    let id = session.send(GetSession).await?.id();
    tracing::info!(session_id = %id, "shepherd running; stop with SIGINT or SIGTERM");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let handle = session.send(GetSession).await?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
        _ = handle.expired() => anyhow::bail!("BMDB session {id} ended"),
    }
    if let Err(e) = session.send(CloseSession).await? {
        tracing::warn!(error = %e, "could not close the BMDB session; it will expire");
    }
    Ok(())
}
