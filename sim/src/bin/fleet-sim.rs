//! `fleet-sim`: a simulated fleet as a process of its own, for shepherd to
//! take over (one shepherd or several on one BMDB).
//!
//!     fleet-sim --machines 1000 > fleet.toml
//!     shepherd --config fleet.toml run
//!
//! Starts the Equinix Metal simulator (one reservation per machine) and the
//! SSH machine simulator (machines on 127.0.1.1, 127.0.1.2, …), prints a
//! shepherd configuration for them on stdout (and writes it to
//! `--config-out`), then serves until SIGINT or SIGTERM. Loopback only.
//!
//! A process serves at most 15,000 machines (a listening socket each); a
//! larger rented fleet is served by several:
//!
//!     fleet-sim --machines 100000 --serve 0..12500 --config-out fleet.toml
//!     fleet-sim --machines 100000 --serve 12500..25000 --no-api \
//!       --ssh-port PORT --ssh-key KEY --dir …   # and so on

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use shepherd::secret::write_private;
use shepherd_sim::equinix::Faults;
use shepherd_sim::fleet::{FleetOptions, FleetSim};

#[derive(Parser)]
#[command(
    name = "fleet-sim",
    version,
    about = "Simulates a fleet of bare-metal machines behind the Equinix Metal API, for shepherd to take over."
)]
struct Args {
    /// Machines (hardware reservations) in the fleet.
    #[arg(long, default_value_t = 100)]
    machines: usize,
    /// The first machine's address; the others follow it.
    #[arg(long, default_value = "127.0.1.1")]
    first_address: Ipv4Addr,
    /// Where the Equinix Metal simulator listens.
    #[arg(long, default_value = "127.0.0.1:0")]
    api_listen: SocketAddr,
    /// Where the control API (/fleet) listens.
    #[arg(long, default_value = "127.0.0.1:0")]
    control_listen: SocketAddr,
    /// The machines' SSH port (0: a free one).
    #[arg(long, default_value_t = 0)]
    ssh_port: u16,
    /// State directory (machines' files, API token). Default: a directory
    /// under the system's temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// shepherd's SSH private key, let in by every machine; generated if
    /// absent. Default: <dir>/ssh/shepherd_ed25519.
    #[arg(long)]
    ssh_key: Option<PathBuf>,
    /// Time between an agent's heartbeats.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    agent_interval: Duration,
    /// Time from device creation to `active`.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    provisioning_delay: Duration,
    /// API token shepherd must send (written to <dir>/api-token).
    #[arg(
        long,
        env = "FLEET_SIM_TOKEN",
        default_value = "sim-token",
        hide_env_values = true,
        hide_default_value = true
    )]
    token: String,
    /// Latency added to every API request.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    latency: Duration,
    /// Share of API requests answered 503.
    #[arg(long, default_value_t = 0.0)]
    error_rate: f64,
    /// Share of API mutations whose response is lost after they happened.
    #[arg(long, default_value_t = 0.0)]
    lost_rate: f64,
    /// Also write the configuration here (atomically, once the fleet is up).
    #[arg(long)]
    config_out: Option<PathBuf>,
    /// NAME=ADDR[,ADDR…]: the agents resolve NAME to these (loopback)
    /// addresses, as DNS would a name with several records; the first
    /// becomes the callback endpoint (NAME:7830), one shepherd per address.
    #[arg(long, value_parser = parse_name)]
    resolve: Vec<(String, Vec<std::net::IpAddr>)>,
    /// SWITCH: the machines hear LLDP from this switch, each machine's
    /// first NIC on port p<N> (the Nth machine, from 1).
    #[arg(long)]
    lldp: Option<String>,
    /// `equinix`: rented machines behind the Equinix Metal simulator;
    /// `static`: owned machines, an inventory with a Redfish BMC each.
    #[arg(long, default_value = "equinix", value_parser = ["equinix", "static"])]
    provider: String,
    /// The inventory `location` (the Metal API's metro) of every machine
    /// (`--provider static`).
    #[arg(long)]
    location: Option<String>,
    /// How long a BMC's firmware update runs (`--provider static`).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    firmware_task_time: Duration,
    /// Share of the machines whose firmware updates fail (`--provider
    /// static`), the same machines every run.
    #[arg(long, default_value_t = 0.0)]
    firmware_failure_rate: f64,
    /// `ssh`: machines with a system answering SSH; `network` (`--provider
    /// static`, inside a network namespace): blank machines, powered off,
    /// booted through their BMCs (at --first-address on) and the
    /// provisioning link by shepherd's network boot service.
    #[arg(long, default_value = "ssh", value_parser = ["ssh", "network"])]
    boot: String,
    /// The rack's end of the provisioning link (`--boot network`).
    #[arg(long, default_value = "rack0")]
    link: String,
    /// shepherd's end of the link, its `netboot.interface`.
    #[arg(long, default_value = "prov0")]
    server_link: String,
    /// shepherd's address on the link.
    #[arg(long, default_value = "10.77.0.1")]
    server_address: Ipv4Addr,
    /// FIRST-LAST: the addresses shepherd's DHCP leases (routed to the
    /// rack's namespace).
    #[arg(long, default_value = "10.77.16.1-10.77.31.254", value_parser = parse_pool)]
    pool: (Ipv4Addr, Ipv4Addr),
    /// Latency added to every BMC request (`--boot network`).
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    bmc_latency: Duration,
    /// The boot image's kernel and initramfs sizes, bytes.
    #[arg(long, default_value_t = 8 << 20)]
    kernel_bytes: usize,
    #[arg(long, default_value_t = 24 << 20)]
    initrd_bytes: usize,
    /// Every N-th machine of the rack has an IPMI BMC (RMCP+ on UDP, the
    /// BMC's port), the others Redfish (`--boot network`); 0: none.
    #[arg(long, default_value_t = 0)]
    ipmi_every: usize,
    /// FROM..TO: serve only these machines (by index, TO excluded), for a
    /// fleet larger than one process may serve (a listening socket per
    /// machine): the other shares in other processes, started with the
    /// first's --ssh-port and --ssh-key and --no-api (rented fleets).
    #[arg(long, value_parser = parse_range)]
    serve: Option<std::ops::Range<usize>>,
    /// Serve no Equinix simulator: another fleet-sim process serves the
    /// fleet's API (and writes its configuration).
    #[arg(long)]
    no_api: bool,
}

fn parse_range(s: &str) -> Result<std::ops::Range<usize>, String> {
    let (a, b) = s.split_once("..").ok_or("expected FROM..TO")?;
    let n = |v: &str| v.trim().parse::<usize>().map_err(|e| format!("{v}: {e}"));
    let (from, to) = (n(a)?, n(b)?);
    if from >= to {
        return Err(format!("{from}..{to} holds no machine"));
    }
    Ok(from..to)
}

fn parse_pool(s: &str) -> Result<(Ipv4Addr, Ipv4Addr), String> {
    let (a, b) = s.split_once('-').ok_or("expected FIRST-LAST")?;
    let ip = |v: &str| {
        v.trim()
            .parse::<Ipv4Addr>()
            .map_err(|e| format!("{v}: {e}"))
    };
    Ok((ip(a)?, ip(b)?))
}

fn parse_name(s: &str) -> Result<(String, Vec<std::net::IpAddr>), String> {
    let (name, addrs) = s.split_once('=').ok_or("expected NAME=ADDR[,ADDR…]")?;
    if name.is_empty() || name.contains(':') {
        return Err(format!("{name:?} is not a host name"));
    }
    let ips = addrs
        .split(',')
        .map(|a| a.trim().parse().map_err(|e| format!("{a}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name.to_string(), ips))
}

fn main() {
    let a = Args::parse();
    // Its log on stderr, filtered by FLEET_SIM_LOG (`warn` unless set):
    // `FLEET_SIM_LOG=shepherd_sim::machine=debug` shows what each
    // simulated agent says.
    let filter = std::env::var("FLEET_SIM_LOG").unwrap_or_else(|_| "warn".into());
    match tracing_subscriber::EnvFilter::try_new(&filter) {
        Ok(f) => tracing_subscriber::fmt()
            .with_env_filter(f)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        Err(e) => {
            eprintln!("fleet-sim: FLEET_SIM_LOG={filter:?} is not a log filter: {e}");
            std::process::exit(2);
        }
    }
    for (name, v) in [
        ("error-rate", a.error_rate),
        ("lost-rate", a.lost_rate),
        ("firmware-failure-rate", a.firmware_failure_rate),
    ] {
        if !(0.0..=1.0).contains(&v) {
            eprintln!("fleet-sim: --{name} must be within 0 and 1");
            std::process::exit(2);
        }
    }
    if a.ipmi_every == 1 {
        eprintln!(
            "fleet-sim: --ipmi-every 1 leaves no Redfish BMC: the rack mixes both (2 or more, or 0 for none)"
        );
        std::process::exit(2);
    }
    let max = shepherd_sim::fleet::MAX_MACHINES;
    if !(1..=max).contains(&a.machines) {
        eprintln!("fleet-sim: --machines must be within 1 and {max}");
        std::process::exit(2);
    }
    let served = a.serve.clone().unwrap_or(0..a.machines);
    if served.end > a.machines {
        eprintln!(
            "fleet-sim: --serve {}..{} runs past --machines {}",
            served.start, served.end, a.machines
        );
        std::process::exit(2);
    }
    if served.len() > shepherd_sim::fleet::MAX_SERVED {
        eprintln!(
            "fleet-sim: {} machines are more than one process serves (a listening socket each): \
             at most {} (--serve FROM..TO, the rest from further processes with --no-api)",
            served.len(),
            shepherd_sim::fleet::MAX_SERVED
        );
        std::process::exit(2);
    }
    let dir = a
        .dir
        .unwrap_or_else(|| std::env::temp_dir().join(format!("shepherd-fleet-sim-{}", whoami())));
    let opts = FleetOptions {
        machines: a.machines,
        first_address: a.first_address,
        api_listen: a.api_listen,
        control_listen: a.control_listen,
        ssh_port: a.ssh_port,
        ssh_key: a
            .ssh_key
            .unwrap_or_else(|| dir.join("ssh/shepherd_ed25519")),
        dir,
        agent_interval: a.agent_interval,
        provisioning_delay: a.provisioning_delay,
        token: a.token,
        faults: Faults {
            latency: a.latency,
            error_rate: a.error_rate,
            lost_rate: a.lost_rate,
            ..Faults::default()
        },
        names: a.resolve,
        lldp: a.lldp,
        provider: if a.provider == "static" {
            shepherd_sim::fleet::FleetProvider::Static
        } else {
            shepherd_sim::fleet::FleetProvider::Equinix
        },
        location: a.location,
        network_boot: (a.boot == "network").then_some(shepherd_sim::rack::NetworkBoot {
            interface: a.link,
            server_interface: a.server_link,
            server: a.server_address,
            pool: a.pool,
            bmc_latency: a.bmc_latency,
            kernel_bytes: a.kernel_bytes,
            initrd_bytes: a.initrd_bytes,
            ipmi_every: a.ipmi_every,
        }),
        firmware: shepherd_sim::bmc::FirmwareOptions::failing_share(
            a.firmware_task_time,
            a.firmware_failure_rate,
        ),
        serve: a.serve,
        no_api: a.no_api,
    };
    let config_out = a.config_out;
    let result = actix_rt::System::new().block_on(async move {
        let fleet = FleetSim::start(opts).await?;
        let config = fleet.config();
        if let Some(path) = &config_out {
            write_private(path, config.as_bytes())?;
        }
        print!("{config}");
        eprintln!(
            "fleet-sim: {} machines up; control at {}; stop with SIGINT or SIGTERM",
            fleet.machines().addresses.len(),
            fleet.control_url()
        );
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        fleet.stop().await;
        std::io::Result::Ok(())
    });
    if let Err(e) = result {
        eprintln!("fleet-sim: {e}");
        std::process::exit(1);
    }
}

/// The user's name or ID, so that users of one machine get directories of
/// their own.
fn whoami() -> String {
    nix::unistd::Uid::current().to_string()
}
