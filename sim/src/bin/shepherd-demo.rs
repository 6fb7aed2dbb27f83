//! `shepherd-demo`: the whole system locally, with no configuration (the
//! quick start of README.md and docs/src/install.md, `scripts/demo`): an
//! embedded PostgreSQL, the Equinix Metal simulator (or an inventory with
//! simulated BMCs), simulated machines on 127.0.1.x, and shepherd taking
//! them all over. A binary of the simulated floor's crate, so that
//! `shepherd` itself ships without any of it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use shepherd::config::{Config, ProviderKind};
use shepherd_sim::demo::DemoOptions;

/// Exit status for invalid configuration (as for a usage error).
const EXIT_CONFIG: u8 = 2;

#[derive(Parser)]
#[command(
    name = "shepherd-demo",
    version,
    about = "Runs shepherd against a simulated fleet on this machine: an embedded PostgreSQL, \
             the Equinix Metal simulator or simulated BMCs, simulated machines on 127.0.1.x."
)]
struct Args {
    /// Configuration file (TOML), as for `shepherd`. Without one, every key
    /// takes its default; SHEPHERD__SECTION__KEY environment variables
    /// override either.
    #[arg(long, short, env = "SHEPHERD_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    /// How many machines.
    #[arg(long, default_value_t = 20)]
    machines: usize,
    /// Where the admin pages are served (an ephemeral port if taken).
    #[arg(long, default_value = "127.0.0.1:9090")]
    admin_listen: std::net::SocketAddr,
    /// Stay up after every machine is taken over, until Ctrl-C.
    #[arg(long)]
    keep_running: bool,
    /// Give up (exit 1) if not every machine is taken over and
    /// heartbeating by then (or silenced machines not back).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    timeout: std::time::Duration,
    /// Once every agent heartbeats, watch this long that no machine is
    /// recovered (exit 1 if one is).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    hold: std::time::Duration,
    /// Then silence this many agents and wait until exactly those
    /// machines are recovered and heartbeating again.
    #[arg(long, default_value_t = 0)]
    silence: usize,
    /// Then take this many machines through their whole life cycle:
    /// installed (an image shepherd serves, with cloud-init first-boot
    /// data), deprovisioned (their disks erased) and available again.
    #[arg(long, default_value_t = 0)]
    cycle: usize,
    /// `equinix`: rented machines from the Equinix Metal simulator;
    /// `static`: owned hardware, an inventory with simulated BMCs
    /// (Redfish) that reboot them.
    #[arg(long, default_value = "equinix", value_parser = parse_provider)]
    provider: ProviderKind,
}

fn parse_provider(s: &str) -> Result<ProviderKind, String> {
    match s {
        "equinix" => Ok(ProviderKind::Equinix),
        "static" => Ok(ProviderKind::Static),
        other => Err(format!("{other:?} is not a provider: equinix or static")),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let cfg = match Config::load(args.config.as_deref()) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("shepherd-demo: invalid configuration: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let mut log = cfg.log.clone();
    if std::env::var_os("RUST_LOG").is_none() {
        // The demo's own progress lines are the output; logs only for trouble.
        log.level = "warn".into();
    }
    shepherd::telemetry::init(&log);
    let opts = DemoOptions {
        machines: args.machines,
        admin_listen: args.admin_listen,
        keep_running: args.keep_running,
        timeout: args.timeout,
        hold: args.hold,
        silence: args.silence,
        cycle: args.cycle,
        heartbeat_stale_after: std::time::Duration::ZERO,
        provider: args.provider,
    };
    let system = actix_rt::System::new();
    match system.block_on(shepherd_sim::demo::run(cfg, opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<shepherd::ConfigError>().is_some() => {
            eprintln!("shepherd-demo: invalid configuration: {e:#}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(e) => {
            eprintln!("shepherd-demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}
