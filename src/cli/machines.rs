//! `shepherd machines`: the fleet listed and shown, and operators' actions
//! (retry, take over again, reboot, hold, release…).

use clap::Subcommand;
use shepherd::bmdb::machines;
use shepherd::bmdb::{Bmdb, actions};
use shepherd::config::Config;

use super::install::{DeprovisionArgs, InstallArgs};
use super::parse::{FilterArgs, parse_process};

#[derive(Subcommand)]
pub enum MachinesCommand {
    /// One line per machine: ID, provider, provider ID, address, state.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// At most this many.
        #[arg(long, default_value_t = 1000)]
        limit: i64,
    },
    /// A machine's tags, lease, backoffs, history and operator actions.
    Show {
        /// The BMDB machine ID.
        id: uuid::Uuid,
    },
    /// Its firmware components as its BMC lists them, the versions they
    /// ran, and how they differ from its baseline.
    Firmware { id: uuid::Uuid },
    /// Its BIOS settings as its BMC lists them, and how they differ from
    /// its baseline.
    Bios { id: uuid::Uuid },
    /// Its storage (controllers, drives, volumes) as its BMC lists it, and
    /// how its RAID layout differs from its baseline.
    Raid { id: uuid::Uuid },
    /// Bring the machine to its baseline through its BMC (firmware, BIOS
    /// settings, RAID, Secure Boot), with one restart: a running
    /// shepherd's Servicer does it while the machine is free.
    Service {
        id: uuid::Uuid,
        /// A tenant's machine (installed, or a device's): the restart
        /// interrupts the tenant. Audited.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Clear a machine's backoff so its work is tried again now.
    Retry {
        id: uuid::Uuid,
        /// Only this process's backoff (ShepherdAgentStart,
        /// ShepherdRecovery…); every one of the machine's by default.
        #[arg(long, value_parser = parse_process)]
        process: Option<shepherd::bmdb::Process>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Drop the machine's agent so the Initializer takes it over again.
    Retakeover {
        id: uuid::Uuid,
        /// Also forget its recorded SSH host key (after a reinstall).
        #[arg(long)]
        forget_host_key: bool,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Reboot the machine now, through its provider, on the Recoverer's
    /// lease (a running shepherd does it).
    Reboot {
        id: uuid::Uuid,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Keep every control loop away from the machine until it is released.
    Hold {
        id: uuid::Uuid,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Let the control loops take a held machine again.
    Release {
        id: uuid::Uuid,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Boot the machine into the live agent through its BMC (its hardware
    /// reported again), whatever is installed on it.
    Inspect {
        id: uuid::Uuid,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Accept the differences between what the machine's BMC says and what
    /// its agent reported (installations wait until then).
    AcceptHardware {
        id: uuid::Uuid,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Accept a machine that enlisted itself (state `discovered`) with its
    /// BMC: it becomes an inventory machine like any other.
    Accept(Box<AcceptArgs>),
    /// Install an operating system image: on one machine (one ID), or as a
    /// rollout over several (IDs, or the filters of `list`), at most
    /// --max-parallel at once, stopped once more than --max-failures fail.
    Install(Box<InstallArgs>),
    /// Erase the machine's disks through its agent and leave it available
    /// (an installed machine is booted into the agent first, through its
    /// BMC, or taken over again over SSH).
    Deprovision(Box<DeprovisionArgs>),
}

#[derive(clap::Args)]
pub struct AcceptArgs {
    /// The discovered machine's ID.
    pub id: uuid::Uuid,
    /// `https://host[:port]` (Redfish) or `ipmi://host[:port]`.
    #[arg(long)]
    pub bmc_url: String,
    #[arg(long)]
    pub bmc_username: String,
    /// A file holding the BMC's password (never on the command line).
    #[arg(long)]
    pub bmc_password_file: std::path::PathBuf,
    /// Redfish: the ComputerSystem's Id (unset: the BMC's only one).
    #[arg(long)]
    pub bmc_system: Option<String>,
    /// `verify`, `insecure`, or a CA file's path.
    #[arg(long, default_value = "verify")]
    pub bmc_tls: String,
    /// Its inventory host ID (default: `discovered-` and its MAC's hex).
    #[arg(long)]
    pub host_id: Option<String>,
    #[arg(long)]
    pub reason: Option<String>,
}

impl AcceptArgs {
    /// The acceptance, checked as an inventory host's BMC; Err names the
    /// flag.
    fn acceptance(&self) -> anyhow::Result<shepherd::bmdb::discovery::Acceptance> {
        let mut secret = shepherd::secret::Secret::from_file(&self.bmc_password_file);
        secret
            .resolve()
            .map_err(|e| anyhow::anyhow!("--bmc-password-file: {e}"))?;
        let password = secret.expose().to_string();
        let bmc = shepherd::config::BmcConfig::accepted(
            &self.bmc_url,
            &self.bmc_username,
            &password,
            self.bmc_system.as_deref(),
            &self.bmc_tls,
        )
        .map_err(|(k, m)| {
            let flag = match k {
                "password" => "bmc-password-file".to_string(),
                k => format!("bmc-{}", k.replace('_', "-")),
            };
            anyhow::anyhow!("--{flag}: {m}")
        })?;
        let host_id = match self.host_id.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(h) => {
                shepherd::config::inventory::check_id(h)
                    .map_err(|e| anyhow::anyhow!("--host-id: {e}"))?;
                Some(h.to_string())
            }
        };
        Ok(shepherd::bmdb::discovery::Acceptance {
            host_id,
            url: bmc.url.clone(),
            username: bmc.username.clone(),
            password,
            system: bmc.system.clone(),
            tls: bmc.tls.to_stored(),
        })
    }
}

impl MachinesCommand {
    /// The operator action this command is, if it is one.
    fn action(&self) -> Option<actions::Request> {
        use actions::{Action, Request};
        let (id, action, reason) = match self {
            MachinesCommand::List { .. }
            | MachinesCommand::Show { .. }
            | MachinesCommand::Firmware { .. }
            | MachinesCommand::Bios { .. }
            | MachinesCommand::Raid { .. }
            | MachinesCommand::Service { .. }
            | MachinesCommand::Install(_)
            | MachinesCommand::Accept(_)
            | MachinesCommand::Deprovision(_) => return None,
            MachinesCommand::Retry { id, reason, .. } => (id, Action::Retry, reason),
            MachinesCommand::Retakeover { id, reason, .. } => (id, Action::Retakeover, reason),
            MachinesCommand::Reboot { id, reason } => (id, Action::Reboot, reason),
            MachinesCommand::Hold { id, reason } => (id, Action::Hold, reason),
            MachinesCommand::Release { id, reason } => (id, Action::Release, reason),
            MachinesCommand::Inspect { id, reason } => (id, Action::Inspect, reason),
            MachinesCommand::AcceptHardware { id, reason } => (id, Action::AcceptHardware, reason),
        };
        let mut req = Request::new(*id, action, "cli");
        req.reason = reason
            .as_deref()
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(String::from);
        if let MachinesCommand::Retry { process, .. } = self {
            req.process = *process;
        }
        if let MachinesCommand::Retakeover {
            forget_host_key, ..
        } = self
        {
            req.forget_host_key = *forget_host_key;
        }
        Some(req)
    }
}

pub async fn run(mut cfg: Config, cmd: MachinesCommand) -> anyhow::Result<()> {
    cfg.bmdb.pool_size = 2;
    let accept = match &cmd {
        MachinesCommand::Accept(a) => {
            if cfg.provider.kind != shepherd::config::ProviderKind::Static {
                anyhow::bail!(
                    "an accepted machine joins the static inventory: provider.kind must be \"static\""
                );
            }
            let mut req = actions::Request::new(a.id, actions::Action::Accept, "cli");
            req.accept = Some(a.acceptance()?);
            req.reason = a
                .reason
                .as_deref()
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .map(String::from);
            Some(req)
        }
        _ => None,
    };
    let bmdb = Bmdb::open(&cfg.bmdb).await?;
    if let Some(req) = accept.or_else(|| cmd.action()) {
        return match bmdb
            .transact(async |tx| actions::act(tx, &req).await)
            .await?
        {
            actions::Outcome::Done(a) => {
                println!("{} {}: {}", a.action, req.machine_id, a.detail);
                Ok(())
            }
            actions::Outcome::Refused(why) => anyhow::bail!("{} refused: {why}", req.action),
            actions::Outcome::NotFound => {
                anyhow::bail!("machine {} is not in the BMDB", req.machine_id)
            }
        };
    }
    match cmd {
        MachinesCommand::List { filter, limit } => {
            let filter = filter.fleet(cfg.recoverer.heartbeat_stale_after);
            let (list, matching) = bmdb
                .transact(async |tx| machines::fleet_page(tx, &filter, limit, 0).await)
                .await?;
            println!(
                "{:<36}  {:<8} {:<38} {:<16} {:<14}",
                "MACHINE", "PROVIDER", "PROVIDER ID", "ADDRESS", "STATE"
            );
            for m in &list {
                println!(
                    "{:<36}  {:<8} {:<38} {:<16} {:<14}",
                    m.machine_id,
                    m.provider.map(|p| p.to_string()).unwrap_or_default(),
                    m.provider_id.as_deref().unwrap_or("-"),
                    m.address.as_deref().unwrap_or("-"),
                    m.state
                );
            }
            let counts = bmdb
                .transact(async |tx| machines::fleet_counts(tx).await)
                .await?;
            let counts: Vec<String> = counts.iter().map(|(s, n)| format!("{s} {n}")).collect();
            println!(
                "{} shown of {matching} matching; fleet: {}",
                list.len(),
                if counts.is_empty() {
                    "empty".into()
                } else {
                    counts.join(", ")
                }
            );
        }
        MachinesCommand::Show { id } => {
            let Some(d) = bmdb
                .snapshot(async |tx| machines::detail(tx, id).await)
                .await?
            else {
                anyhow::bail!("machine {id} is not in the BMDB");
            };
            let t = |t: std::time::SystemTime| humantime::format_rfc3339_seconds(t).to_string();
            println!("machine   {}", d.summary.machine_id);
            println!("state     {}", d.summary.state);
            println!("created   {}", t(d.created_at));
            println!("tags:");
            match &d.provided {
                Some(p) => println!(
                    "  provided         {} {} address {} location {} reservation {} status {}",
                    p.provider,
                    p.provider_id,
                    p.ip_address.as_deref().unwrap_or("-"),
                    p.location.as_deref().unwrap_or("-"),
                    p.reservation_id.as_deref().unwrap_or("-"),
                    p.status
                        .map(|s| s.to_string())
                        .unwrap_or_else(|| "-".into())
                ),
                None => println!("  provided         -"),
            }
            match &d.agent_started {
                Some((at, key)) => println!(
                    "  agent started    {} key {}",
                    t(*at),
                    key.iter().map(|b| format!("{b:02x}")).collect::<String>()
                ),
                None => println!("  agent started    -"),
            }
            println!(
                "  agent heartbeat  {}",
                d.agent_heartbeat.map(t).unwrap_or_else(|| "-".into())
            );
            match d
                .hardware_report
                .as_deref()
                .map(shepherd_proto::summary::summarize)
            {
                None => println!("  hardware report  -"),
                Some(Err(e)) => println!("  hardware report  {e}"),
                Some(Ok(h)) => {
                    let text = h.to_string();
                    let mut lines = text.lines();
                    println!("  hardware report  {}", lines.next().unwrap_or(""));
                    for l in lines {
                        println!("                   {l}");
                    }
                }
            }
            println!("  boots            {}", d.boots());
            if let Some(x) = &d.discovery {
                let at =
                    |t: std::time::SystemTime| humantime::format_rfc3339_seconds(t).to_string();
                println!(
                    "  enlisted         from {} ({}) at {}, {} discovery boot(s), the last at {}",
                    x.mac,
                    x.firmware,
                    at(x.discovered_at),
                    x.boots,
                    at(x.last_boot_at)
                );
                match (x.accepted_at, &x.accepted_by) {
                    (Some(t), by) => println!(
                        "  accepted         by {} at {}{}",
                        by.as_deref().unwrap_or("?"),
                        at(t),
                        match (x.erase_pending, &x.erase_refused) {
                            (true, Some(why)) => format!("; its erasure waits: {why}"),
                            (true, None) => "; its erasure waits for its BMC to be read".into(),
                            (false, _) => String::new(),
                        }
                    ),
                    (None, _) => println!(
                        "  accepted         not yet: `shepherd machines accept {} --bmc-url … --bmc-username … --bmc-password-file …`",
                        d.summary.machine_id
                    ),
                }
            }
            if let Some(f) = &d.bmc {
                for (i, (k, v)) in f.lines().iter().enumerate() {
                    let label = if i == 0 { "bmc" } else { "" };
                    println!("  {label:<16} {k:<11}{v}");
                }
            }
            println!(
                "  installation     request {} report {}",
                d.installation_request
                    .map(|g| g.to_string())
                    .unwrap_or_else(|| "-".into()),
                d.installation_report
                    .map(|(g, r)| format!("{g} {r}"))
                    .unwrap_or_else(|| "-".into())
            );
            println!(
                "  ssh host key     {}",
                d.ssh_host_key.as_deref().unwrap_or("-")
            );
            if let Some(i) = &d.installation {
                println!(
                    "installation: generation {} {} ({}), asked by {} at {}",
                    i.generation,
                    i.state,
                    i.image_url,
                    i.requested_by,
                    t(i.requested_at)
                );
                if let Some((p, at)) = &i.progress {
                    use shepherd_proto::summary::bytes;
                    let how = if i.kind == shepherd::bmdb::installations::Kind::Erase {
                        format!(
                            "{} of {} erased (written or discarded), {}/s",
                            bytes(p.bytes_written),
                            bytes(p.bytes_total),
                            bytes(p.rate_bytes_per_second)
                        )
                    } else {
                        format!(
                            "{} of {} fetched, {} written, {}/s",
                            bytes(p.bytes_fetched),
                            bytes(p.bytes_total),
                            bytes(p.bytes_written),
                            bytes(p.rate_bytes_per_second)
                        )
                    };
                    println!(
                        "  progress         {} {how}, disk {} (at {})",
                        shepherd_proto::names::phase_name(p.phase),
                        p.disk,
                        t(*at)
                    );
                }
                if let Some((r, e)) = &i.result {
                    println!(
                        "  result           {r}{}",
                        e.as_deref().map(|e| format!(": {e}")).unwrap_or_default()
                    );
                }
                for h in &i.history {
                    println!(
                        "  {} generation {} {}{}",
                        t(h.timestamp),
                        h.generation,
                        h.event,
                        h.detail
                            .as_deref()
                            .map(|d| format!(": {d}"))
                            .unwrap_or_default()
                    );
                }
            }
            if let Some(s) = &d.service {
                println!(
                    "servicing: {} to baseline {} {} (asked by {} at {}{}), restarts {}",
                    s.service_id,
                    s.baseline,
                    s.phase,
                    s.asked_by,
                    t(s.asked_at),
                    if s.forced { ", forced" } else { "" },
                    s.restarts
                );
                for (k, v) in [("applied", &s.applied), ("error", &s.error)] {
                    if let Some(v) = v {
                        println!("  {k:<16} {v}");
                    }
                }
            }
            if !d.ports.is_empty() {
                println!("ports:");
                for p in &d.ports {
                    let b = shepherd::admin::network::PortBody::from(p);
                    println!("  {}", shepherd::admin::network::port_line(&b));
                }
            }
            println!("leases:");
            for l in &d.leases {
                println!(
                    "  {} by {} (session {})",
                    l.process, l.component, l.session_id
                );
            }
            println!("backoffs:");
            for (p, b) in &d.backoffs {
                println!(
                    "  {p} until {} (interval {}s): {}",
                    t(b.until),
                    b.last_interval_seconds.unwrap_or(0),
                    b.cause
                );
            }
            if let Some(h) = &d.hold {
                println!(
                    "held by {} since {}{}",
                    h.by,
                    t(h.since),
                    h.reason
                        .as_deref()
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                );
            }
            if let Some((by, at)) = &d.reboot_request {
                println!("reboot requested by {by} at {}", t(*at));
            }
            println!("history:");
            let mut lines: Vec<(std::time::SystemTime, String)> = d
                .history
                .iter()
                .map(|h| {
                    let line = match h.failed_cause.as_ref().or(h.detail.as_ref()) {
                        Some(c) => format!("  {} {} {}: {c}", t(h.timestamp), h.process, h.event),
                        None => format!("  {} {} {}", t(h.timestamp), h.process, h.event),
                    };
                    (h.timestamp, line)
                })
                .collect();
            for a in &d.actions {
                let why = a
                    .reason
                    .as_deref()
                    .map(|r| format!(" (reason: {r})"))
                    .unwrap_or_default();
                lines.push((
                    a.timestamp,
                    format!(
                        "  {} operator {} {}: {}{why}",
                        t(a.timestamp),
                        a.actor,
                        a.action,
                        a.detail
                    ),
                ));
            }
            lines.sort_by_key(|(at, _)| *at);
            for (_, l) in lines {
                println!("{l}");
            }
        }
        _ => unreachable!("actions are handled above"),
    }
    Ok(())
}
