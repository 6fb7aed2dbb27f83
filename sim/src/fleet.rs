//! A simulated fleet in a process of its own (`fleet-sim`): the Equinix
//! Metal simulator with one hardware reservation per machine, whose devices
//! get the machines' addresses, and the SSH machine simulator answering
//! there, with the resident agents the takeovers leave behind. shepherd
//! runs beside it, alone or several processes on one BMDB, and is measured
//! without the fleet's own work in its numbers.
//!
//! With `--provider static` the machines are owned hardware instead: an
//! inventory of them, each with a simulated Redfish BMC on its own
//! address (`crate::bmc`), and no Equinix simulator.
//!
//! It writes a complete shepherd configuration for the fleet (API address,
//! project, token file, SSH port and key, or the inventory), and serves a
//! control API:
//! `GET /fleet` (what every machine ran, agents running) and
//! `POST /fleet/silence?count=N` (stops N agents).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, web};
use serde::Serialize;

use crate::bmc::BmcSim;
use crate::equinix::{Addressing, Faults, SimConfig, Simulator};
use crate::machine::{MachineSim, Runs};
use crate::pxe::ProvisioningLink;
use shepherd::secret::write_private;
use shepherd::ssh::SshIdentity;
use std::sync::Arc;

pub struct FleetOptions {
    pub machines: usize,
    /// The first machine's address (127.x); the rest follow.
    pub first_address: Ipv4Addr,
    /// Where the Equinix simulator listens.
    pub api_listen: SocketAddr,
    /// Where the control API listens.
    pub control_listen: SocketAddr,
    /// The machines' SSH port (0: a free one).
    pub ssh_port: u16,
    /// shepherd's SSH key, which the machines let in (generated if absent).
    pub ssh_key: PathBuf,
    /// The machines' files, the API token file and the configuration.
    pub dir: PathBuf,
    /// Time between an agent's heartbeats.
    pub agent_interval: Duration,
    /// Time from device creation to `active`.
    pub provisioning_delay: Duration,
    /// API token clients must send.
    pub token: String,
    pub faults: Faults,
    /// Host names the agents resolve themselves (`name` → addresses):
    /// several shepherds behind one callback name on loopback. The first
    /// name becomes the configuration's callback endpoint.
    pub names: Vec<(String, Vec<IpAddr>)>,
    /// The switch whose LLDP frames the machines hear: each machine's
    /// first NIC reports it as its neighbour, on port `p<N>` (the Nth
    /// machine, from 1), as a leaf cabled in order would say.
    pub lldp: Option<String>,
    /// Rented (the Equinix simulator) or owned (an inventory with BMCs).
    pub provider: FleetProvider,
    /// The inventory's `location` of every machine (static only).
    pub location: Option<String>,
    /// How the BMCs' firmware updates behave (static only).
    pub firmware: crate::bmc::FirmwareOptions,
    /// Blank machines booted through their BMCs and the network, not
    /// reached over SSH (static only; in a network namespace).
    pub network_boot: Option<crate::rack::NetworkBoot>,
    /// The machines this process serves, by index (`None`: all). A fleet
    /// larger than one process's open files (a listening socket per
    /// machine) is served by several processes, each its share, on one
    /// SSH port with one key (`fleet-sim --serve`).
    pub serve: Option<std::ops::Range<usize>>,
    /// Serve no Equinix simulator: the fleet's API is another process's
    /// (`fleet-sim --no-api`, for the shares after the first).
    pub no_api: bool,
}

/// Where the fleet's machines come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FleetProvider {
    #[default]
    Equinix,
    Static,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            machines: 100,
            first_address: Ipv4Addr::new(127, 0, 1, 1),
            api_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            control_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            ssh_port: 0,
            ssh_key: std::env::temp_dir().join("shepherd-fleet-sim/ssh/shepherd_ed25519"),
            dir: std::env::temp_dir().join("shepherd-fleet-sim"),
            agent_interval: Duration::from_secs(30),
            provisioning_delay: Duration::from_secs(1),
            token: "sim-token".into(),
            faults: Faults::default(),
            names: Vec::new(),
            lldp: None,
            provider: FleetProvider::Equinix,
            location: None,
            firmware: crate::bmc::FirmwareOptions::default(),
            network_boot: None,
            serve: None,
            no_api: false,
        }
    }
}

/// A running simulated fleet.
pub struct FleetSim {
    /// The Equinix simulator (rented machines only).
    pub api: Option<Simulator>,
    /// The machines' BMCs (owned machines reached over SSH).
    pub bmcs: Option<BmcSim>,
    /// The rack booted through its BMCs and the network.
    pub rack: Option<crate::rack::Rack>,
    location: Option<String>,
    pub machines: MachineSim,
    control: actix_web::dev::ServerHandle,
    control_addr: SocketAddr,
    token_file: PathBuf,
    ssh_key: PathBuf,
    agent_interval: Duration,
    names: Vec<(String, Vec<IpAddr>)>,
}

/// What `GET /fleet` answers.
#[derive(Debug, Serialize)]
pub struct FleetReport {
    pub machines: usize,
    /// Agents running now.
    pub agents_running: usize,
    /// Machines whose agent started at least once.
    pub taken_over: usize,
    /// Programs run over SSH, all machines.
    pub execs: u64,
    /// Agents started, all machines.
    pub agents_started: u64,
    /// Machines whose agent started more than once, with the count.
    pub taken_over_again: BTreeMap<IpAddr, u32>,
    /// Per machine (those that ran anything).
    pub runs: BTreeMap<IpAddr, Runs>,
    /// What the machines booting the network did (`--boot network`):
    /// `pxe::BootCounts`.
    pub network_boots: Option<serde_json::Value>,
}

/// The largest fleet one simulated Equinix project holds.
pub const MAX_MACHINES: usize = 200_000;
/// The most machines one process serves: a listening socket each, below
/// the open files a process may have here (20,000), with room for the
/// takeovers' connections and the agents' processes.
pub const MAX_SERVED: usize = 15_000;

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn loopback_only(what: &str, ip: IpAddr) -> std::io::Result<()> {
    if ip.is_loopback() || crate::rack::in_own_namespace() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "{what} must be a loopback address, not {ip}"
        )))
    }
}

impl FleetSim {
    pub async fn start(opts: FleetOptions) -> std::io::Result<FleetSim> {
        let n = opts.machines;
        if !(1..=MAX_MACHINES).contains(&n) {
            return Err(std::io::Error::other(format!(
                "machines must be within 1 and {MAX_MACHINES}"
            )));
        }
        let serve = opts.serve.clone().unwrap_or(0..n);
        if serve.is_empty() || serve.end > n {
            return Err(std::io::Error::other(format!(
                "the machines served ({}..{}) must be a non-empty part of 0..{n}",
                serve.start, serve.end
            )));
        }
        if serve.len() > MAX_SERVED {
            return Err(std::io::Error::other(format!(
                "{} machines in one process need a listening socket each, more than this \
                 process may open: serve at most {MAX_SERVED} (--serve), the rest from other processes",
                serve.len()
            )));
        }
        if (serve != (0..n) || opts.no_api) && opts.provider != FleetProvider::Equinix {
            return Err(std::io::Error::other(
                "owned machines (an inventory in one configuration) are served by one process whole",
            ));
        }
        loopback_only("the API's listen address", opts.api_listen.ip())?;
        loopback_only("the control listen address", opts.control_listen.ip())?;
        loopback_only("the first machine address", IpAddr::V4(opts.first_address))?;
        let last = u32::from(opts.first_address) as u64 + n as u64 - 1;
        if last > u32::from(Ipv4Addr::new(127, 255, 255, 254)) as u64 {
            return Err(std::io::Error::other(format!(
                "{n} machines from {} run past 127.255.255.254",
                opts.first_address
            )));
        }
        let machines_dir = opts.dir.join("machines");
        if machines_dir.exists() {
            std::fs::remove_dir_all(&machines_dir)?;
        }
        std::fs::create_dir_all(&machines_dir)?;
        let identity = SshIdentity::load_or_generate(&opts.ssh_key)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", opts.ssh_key.display())))?;
        let public = russh::keys::PublicKey::from_openssh(identity.public_key())
            .map_err(std::io::Error::other)?;
        let port = match opts.ssh_port {
            0 => free_port()?,
            p => p,
        };
        let first_served = Ipv4Addr::from(u32::from(opts.first_address) + serve.start as u32);
        let addresses = (0..n)
            .map(|i| IpAddr::V4(Ipv4Addr::from(u32::from(opts.first_address) + i as u32)))
            .collect();
        let rack = match (&opts.network_boot, opts.provider) {
            (Some(boot), FleetProvider::Static) => Some(crate::rack::Rack::start(
                addresses,
                free_port()?,
                &machines_dir,
                &opts.dir,
                boot.clone(),
            )?),
            (Some(_), FleetProvider::Equinix) => {
                return Err(std::io::Error::other(
                    "a network boot is of owned machines (--provider static)",
                ));
            }
            (None, _) => None,
        };
        let machines = match &rack {
            Some(_) => MachineSim::blank(Vec::new(), &machines_dir)?,
            None => {
                MachineSim::start(first_served, serve.len(), port, public, &machines_dir).await?
            }
        };
        for (name, ips) in &opts.names {
            for ip in ips {
                loopback_only(&format!("name {name}'s address"), *ip)?;
            }
        }
        let agents = &rack.as_ref().map_or(&machines, |r| &r.machines).agents;
        agents.set_interval(opts.agent_interval);
        agents.set_names(opts.names.iter().cloned().collect());
        if let Some(switch) = &opts.lldp {
            agents.set_lldp(switch, opts.first_address);
        }
        let (api, bmcs) = match opts.provider {
            FleetProvider::Equinix if opts.no_api => (None, None),
            FleetProvider::Equinix => {
                let api = Simulator::start(
                    SimConfig {
                        reservations: n,
                        provisioning_delay: opts.provisioning_delay,
                        addressing: Addressing::Sequential(opts.first_address),
                        token: opts.token.clone(),
                        faults: opts.faults,
                        ..SimConfig::default()
                    },
                    opts.api_listen,
                )
                .await?;
                (Some(api), None)
            }
            // Owned: a Redfish BMC per machine; a restart or a power-off
            // kills the machine's agent, as on real hardware.
            FleetProvider::Static if rack.is_some() => (None, None),
            FleetProvider::Static => {
                let bmcs = BmcSim::for_machines_with(&machines, opts.firmware.clone())?;
                (None, Some(bmcs))
            }
        };
        let token_file = opts.dir.join("api-token");
        write_private(&token_file, opts.token.as_bytes())?;

        let agents = rack
            .as_ref()
            .map_or(&machines, |r| &r.machines)
            .agents
            .clone();
        let link = rack.as_ref().map(|r| r.link.clone());
        let count = serve.len();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(web::Data::new((agents.clone(), count, link.clone())))
                .route("/fleet", web::get().to(report))
                .route("/fleet/silence", web::post().to(silence))
                .route("/fleet/partition", web::post().to(partition))
                .route("/fleet/reconnect", web::post().to(reconnect))
        })
        .workers(1)
        .disable_signals()
        .bind(opts.control_listen)?;
        let control_addr = server.addrs()[0];
        let server = server.run();
        let control = server.handle();
        actix_rt::spawn(server);
        Ok(FleetSim {
            api,
            bmcs,
            rack,
            location: opts.location,
            machines,
            control,
            control_addr,
            token_file,
            ssh_key: opts.ssh_key,
            agent_interval: opts.agent_interval,
            names: opts.names,
        })
    }

    pub fn control_url(&self) -> String {
        format!("http://{}/fleet", self.control_addr)
    }

    /// The fleet's machines: those reached over SSH, or the rack's.
    pub fn machines(&self) -> &MachineSim {
        self.rack.as_ref().map_or(&self.machines, |r| &r.machines)
    }

    pub fn report(&self) -> FleetReport {
        fleet_report(
            &self.machines().agents,
            self.machines().addresses.len(),
            self.rack.as_ref().map(|r| r.link.clone()),
        )
    }

    /// A complete shepherd configuration for this fleet. The database is
    /// left to the defaults (embedded) or to `SHEPHERD__BMDB__URL`.
    pub fn config(&self) -> String {
        let n = self.machines().addresses.len();
        let every = self.agent_interval;
        let stale = humantime::format_duration(every * 5);
        let (endpoint, listen, others) = match self.names.first() {
            Some((name, ips)) if !ips.is_empty() => (
                format!("{name}:7830"),
                format!("{}:7830", ips[0]),
                ips[1..]
                    .iter()
                    .map(|ip| format!("{ip}:7830"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            _ => match &self.rack {
                Some(r) => (
                    format!("{}:7830", r.boot.server),
                    format!("{}:7830", r.boot.server),
                    String::new(),
                ),
                None => (
                    "127.0.0.1:7830".into(),
                    "127.0.0.1:7830".into(),
                    String::new(),
                ),
            },
        };
        let others = if others.is_empty() {
            "give each its own callback address and endpoint".to_string()
        } else {
            format!(
                "the agents' endpoint resolves to the addresses {others} too: give each further shepherd one of them as SHEPHERD__BMAAS__LISTEN"
            )
        };
        let location = self
            .location
            .as_deref()
            .map(|l| format!("location = \"{}\"\n", toml_path(Path::new(l))))
            .unwrap_or_default();
        let provider = match (&self.api, &self.bmcs) {
            _ if self.rack.is_some() => self.rack.as_ref().unwrap().config(&location),
            (Some(api), _) => format!(
                r#"# Equinix simulator stats: http://{stats}/_sim/stats

[equinix]
api_url = "{api_url}"
project_id = "{project}"
api_key = {{ file = "{token}" }}
# The simulator has no rate limit; the real API allows one request per 2 s.
api_interval = "2ms"
retry_initial = "50ms"
retry_max = "1s"
per_page = 1000

[provider]
kind = "equinix"

[provider.equinix]
metro = "sv"
reservation_cache_ttl = "2s"

[provisioner]
interval = "1s"
max_machines = 0
chunk_size = 500
creation_interval = "0s"
"#,
                stats = api.addr(),
                api_url = api.api_url(),
                project = api.project_id(),
                token = toml_path(&self.token_file),
            ),
            (None, Some(bmcs)) => {
                let mut inventory = String::from(
                    "# Owned machines, each with a simulated Redfish BMC.\n[provider]\nkind = \"static\"\n\n\
                     # The Metal API's deleted devices: the simulated disks are files, a\n\
                     # discard punches them through.\n[metal]\nerase_mode = \"discard\"\n",
                );
                for (i, ip) in self.machines.addresses.iter().enumerate() {
                    inventory.push_str(&format!(
                        "\n[[provider.inventory.machines]]\nid = \"node-{:04}\"\naddress = \"{ip}\"\n{location}bmc = {{ url = \"{}\", username = \"{}\", password = \"{}\" }}\n",
                        i + 1,
                        bmcs.url(*ip),
                        bmcs.user,
                        bmcs.password,
                    ));
                }
                inventory
            }
            // `--no-api`: this process serves a share of the machines; the
            // configuration to use is the API's process's.
            (None, None) => "# Machines only (--no-api): the fleet's configuration is written by the process serving its API.\n".to_string(),
        };
        format!(
            r#"# shepherd configuration for a simulated fleet of {n} machines (fleet-sim).
# Fleet control: {control}
# Several shepherds may share it: give each its own admin address
# (SHEPHERD__ADMIN__LISTEN); {others}.
{provider}
[ssh]
port = {port}
key_file = "{key}"
host_keys = "accept-new"

[initializer]
agent_path = "/root/agent"
parallelism = 32
poll_interval = "200ms"
backoff_initial = "5s"

[updater]
interval = "10s"

[recoverer]
# The fleet's agents call every {every}.
heartbeat_stale_after = "{stale}"
silent_after_start = "{stale}"
poll_interval = "1s"
reboot_poll = "500ms"
reboot_settle = "3s"

# Gentle steps and the brake, at the fleet's pace.
callback_grace = "{grace}"
agent_restart_wait = "{restart}"
agent_return_wait = "{restart}"
brake_window = "1m"

[bmaas]
listen = "{listen}"
endpoint = "{endpoint}"
"#,
            control = self.control_url(),
            // A rack booted through the network answers no SSH: the default.
            port = match self.machines().port {
                0 => 22,
                p => p,
            },
            key = toml_path(&self.ssh_key),
            every = humantime::format_duration(every),
            grace = humantime::format_duration(every * 2),
            restart = humantime::format_duration(every * 4),
        )
    }

    pub async fn stop(self) {
        self.control.stop(true).await;
        if let Some(api) = self.api {
            api.stop().await;
        }
        if let Some(bmcs) = self.bmcs {
            bmcs.stop().await;
        }
        if let Some(rack) = self.rack {
            rack.bmcs.stop().await;
        }
        drop(self.machines);
    }
}

/// A path as a TOML basic string's contents.
pub(crate) fn toml_path(p: &Path) -> String {
    p.display()
        .to_string()
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
}

fn fleet_report(
    agents: &crate::machine::Agents,
    machines: usize,
    network_boots: Option<Arc<ProvisioningLink>>,
) -> FleetReport {
    let runs: BTreeMap<IpAddr, Runs> = agents.runs().into_iter().collect();
    FleetReport {
        machines,
        agents_running: agents.running(),
        taken_over: runs.values().filter(|r| r.agents > 0).count(),
        execs: runs.values().map(|r| r.execs as u64).sum(),
        agents_started: runs.values().map(|r| r.agents as u64).sum(),
        taken_over_again: runs
            .iter()
            .filter(|(_, r)| r.agents > 1)
            .map(|(ip, r)| (*ip, r.agents))
            .collect(),
        runs,
        network_boots: network_boots.and_then(|l| serde_json::to_value(&l.counts).ok()),
    }
}

type Control = web::Data<(crate::machine::Agents, usize, Option<Arc<ProvisioningLink>>)>;

async fn report(c: Control) -> HttpResponse {
    HttpResponse::Ok().json(fleet_report(&c.0, c.1, c.2.clone()))
}

#[derive(serde::Deserialize)]
struct SilenceQuery {
    count: usize,
}

async fn silence(c: Control, q: web::Query<SilenceQuery>) -> HttpResponse {
    let silenced: BTreeMap<IpAddr, String> = c.0.silence(q.count).into_iter().collect();
    HttpResponse::Ok().json(silenced)
}

/// Cuts machines off: agents stopped and SSH refused, as in a partition.
async fn partition(c: Control, q: web::Query<SilenceQuery>) -> HttpResponse {
    let cut: BTreeMap<IpAddr, String> = c.0.cut_off(q.count).into_iter().collect();
    HttpResponse::Ok().json(cut)
}

/// Ends the partition: SSH answers again.
async fn reconnect(c: Control) -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "reconnected": c.0.reconnect() }))
}
