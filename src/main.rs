//! The `shepherd` command: the command line, parsed and dispatched (the
//! BMDB client's commands are in `cli/`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use shepherd::config::Config;

mod cli;

use cli::brake::BrakeCommand;
use cli::machines::MachinesCommand;
use cli::rollouts::RolloutsCommand;
use cli::tenants::{DevicesCommand, ProjectsCommand, TokensCommand};

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
    /// Print shepherd's SSH public key (made at `ssh.key_file` if there is
    /// none yet): the line machines need in root's authorized_keys.
    SshKey,
    /// Look at the fleet in the BMDB.
    #[command(subcommand)]
    Machines(MachinesCommand),
    /// Rollouts of operating system images (`shepherd machines install`
    /// starts them) and of baselines (`service`).
    #[command(subcommand)]
    Rollouts(RolloutsCommand),
    /// Each baseline (`[[baselines]]`): the machines it selects, how many
    /// conform, and each drifting machine's differences.
    Baselines,
    /// The recovery brake: `shepherd brake` shows it, `shepherd brake
    /// release` lets power actions for silence go ahead for a while.
    Brake {
        #[command(subcommand)]
        command: Option<BrakeCommand>,
    },
    /// Tenants' projects and the machines assigned to them (the Metal
    /// API's side for operators).
    #[command(subcommand)]
    Projects(ProjectsCommand),
    /// Projects' API tokens: made (shown once), listed, revoked.
    #[command(subcommand)]
    Tokens(TokensCommand),
    /// Tenants' devices, listed and reclaimed.
    #[command(subcommand)]
    Devices(DevicesCommand),
    /// The switches shepherd moves machines' ports on (`network.switches`):
    /// whether each answers, its ports not yet where wanted, its changes.
    Switches,
    /// Print a shell completion script (bash, zsh, fish, elvish,
    /// powershell) to standard output.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to standard output (`shepherd man |
    /// man -l -`), or write one page per command into a directory.
    Man {
        /// Write shepherd.1, shepherd-run.1, shepherd-machines-list.1, …
        /// here instead.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Made from the command line's own description, without configuration.
    match &cli.command {
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(
                *shell,
                &mut Cli::command(),
                "shepherd",
                &mut std::io::stdout(),
            );
            return ExitCode::SUCCESS;
        }
        Command::Man { out_dir } => {
            use clap::CommandFactory;
            let written = match out_dir {
                Some(dir) => clap_mangen::generate_to(Cli::command(), dir),
                None => clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()),
            };
            return match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("shepherd: writing the manual page: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        _ => {}
    }
    let cfg = match Config::load(cli.config.as_deref()) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("shepherd: invalid configuration: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Command::CheckConfig = cli.command {
        print!("{}", cfg.to_redacted_toml());
        // Bad inventory file entries are skipped at run time, not fatal:
        // show them here.
        if let Some(f) = &cfg.provider.inventory.file
            && let Ok(read) = shepherd::config::inventory::read_file(f)
        {
            for p in &read.problems {
                eprintln!("shepherd: warning: {p}");
            }
        }
        eprintln!("shepherd: configuration is valid");
        return ExitCode::SUCCESS;
    }
    if let Command::SshKey = cli.command {
        let path = &cfg.ssh.key_file;
        let existed = path.exists();
        return match shepherd::ssh::SshIdentity::load_or_generate(path) {
            Ok(identity) => {
                if !existed {
                    eprintln!("shepherd: generated a new SSH key at {}", path.display());
                }
                println!("{}", identity.public_key());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("shepherd: ssh.key_file: {e}");
                ExitCode::FAILURE
            }
        };
    }
    shepherd::telemetry::init(&cfg.log);
    let system = actix_rt::System::new();
    let result = system.block_on(async move {
        match cli.command {
            Command::Run => shepherd::supervisor::run(cfg).await,
            Command::Migrate => cli::migrate::run(cfg).await,
            Command::Machines(MachinesCommand::Install(a)) => cli::install::run(cfg, *a).await,
            Command::Machines(MachinesCommand::Deprovision(a)) => {
                cli::install::deprovision(cfg, *a).await
            }
            Command::Machines(MachinesCommand::Firmware { id }) => {
                cli::firmware::machine(cfg, id, cli::firmware::Shown::Firmware).await
            }
            Command::Machines(MachinesCommand::Bios { id }) => {
                cli::firmware::machine(cfg, id, cli::firmware::Shown::Bios).await
            }
            Command::Machines(MachinesCommand::Raid { id }) => {
                cli::firmware::machine(cfg, id, cli::firmware::Shown::Raid).await
            }
            Command::Machines(MachinesCommand::Service { id, force, reason }) => {
                cli::servicing::machine(cfg, id, force, reason).await
            }
            Command::Machines(m) => cli::machines::run(cfg, m).await,
            Command::Baselines => cli::firmware::baselines(cfg).await,
            Command::Rollouts(r) => cli::rollouts::run(cfg, r).await,
            Command::Projects(p) => cli::tenants::projects(cfg, p).await,
            Command::Tokens(t) => cli::tenants::tokens(cfg, t).await,
            Command::Devices(d) => cli::tenants::devices(cfg, d).await,
            Command::Switches => cli::switches::run(cfg).await,
            Command::Brake { command } => {
                cli::brake::run(cfg, command.unwrap_or(BrakeCommand::Show)).await
            }
            Command::CheckConfig
            | Command::SshKey
            | Command::Completions { .. }
            | Command::Man { .. } => {
                unreachable!()
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // Configuration found wrong only at start (an unreadable file it names).
        Err(e) if e.downcast_ref::<shepherd::ConfigError>().is_some() => {
            eprintln!("shepherd: invalid configuration: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("shepherd: {e:#}");
            ExitCode::FAILURE
        }
    }
}
