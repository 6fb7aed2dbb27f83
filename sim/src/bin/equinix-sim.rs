//! `equinix-sim`: the Equinix Metal API simulator as a process.
//!
//!     equinix-sim --listen 127.0.0.1:8090 --reservations 30
//!
//! Prints the API URL, project ID and token to use, then serves until
//! SIGINT or SIGTERM. Loopback addresses only.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use clap::Parser;
use shepherd_sim::equinix::{Addressing, Faults, SimConfig, Simulator};

#[derive(Parser)]
#[command(
    name = "equinix-sim",
    version,
    about = "Simulates the Equinix Metal API subset shepherd uses."
)]
struct Args {
    /// Address to listen on (loopback only).
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// API token clients must send as X-Auth-Token.
    #[arg(
        long,
        env = "EQUINIX_SIM_TOKEN",
        default_value = "sim-token",
        hide_env_values = true
    )]
    token: String,
    #[arg(long, default_value = "6b4d2a9e-6f1a-4c1e-9b9a-3d1f5e7c0a01")]
    project_id: String,
    /// Hardware reservations in the project.
    #[arg(long, default_value_t = 10)]
    reservations: usize,
    /// Seed of the reservation IDs (same seed, same IDs).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Time from creation to `active`.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    provisioning_delay: Duration,
    /// Time from reboot to `active`.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    reboot_delay: Duration,
    /// Every device gets this public address...
    #[arg(long, conflicts_with = "address_base")]
    address: Option<IpAddr>,
    /// ...or consecutive addresses from this one.
    #[arg(long)]
    address_base: Option<Ipv4Addr>,
    /// Latency added to every request.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    latency: Duration,
    /// Share of requests answered 503.
    #[arg(long, default_value_t = 0.0)]
    error_rate: f64,
    /// Share of requests answered 429.
    #[arg(long, default_value_t = 0.0)]
    rate_limit_rate: f64,
    /// Retry-After of those, seconds.
    #[arg(long, default_value_t = 1)]
    retry_after: u64,
    /// Share of mutations whose response is lost after they happened.
    #[arg(long, default_value_t = 0.0)]
    lost_rate: f64,
}

fn main() -> std::io::Result<()> {
    let a = Args::parse();
    for (name, v) in [
        ("error-rate", a.error_rate),
        ("rate-limit-rate", a.rate_limit_rate),
        ("lost-rate", a.lost_rate),
    ] {
        if !(0.0..=1.0).contains(&v) {
            eprintln!("equinix-sim: --{name} must be within 0 and 1");
            std::process::exit(2);
        }
    }
    let cfg = SimConfig {
        project_id: a.project_id,
        token: a.token,
        reservations: a.reservations,
        seed: a.seed,
        provisioning_delay: a.provisioning_delay,
        reboot_delay: a.reboot_delay,
        addressing: match (a.address, a.address_base) {
            (_, Some(base)) => Addressing::Sequential(base),
            (Some(addr), None) => Addressing::Fixed(addr),
            (None, None) => Addressing::Fixed(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        },
        faults: Faults {
            latency: a.latency,
            error_rate: a.error_rate,
            rate_limit_rate: a.rate_limit_rate,
            retry_after_secs: a.retry_after,
            lost_rate: a.lost_rate,
        },
        ..SimConfig::default()
    };
    actix_rt::System::new().block_on(async move {
        let sim = Simulator::start(cfg, a.listen).await?;
        println!("api_url = \"{}\"", sim.api_url());
        println!("project_id = \"{}\"", sim.project_id());
        println!("stats: http://{}/_sim/stats", sim.addr());
        eprintln!("equinix-sim: serving; stop with SIGINT or SIGTERM");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        sim.stop().await;
        Ok(())
    })
}
