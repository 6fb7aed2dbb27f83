//! The `shepherd` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use shepherd::bmdb::machines::{self, MachineState};
use shepherd::bmdb::{Bmdb, actions};
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
    /// Print shepherd's SSH public key (made at `ssh.key_file` if there is
    /// none yet): the line machines need in root's authorized_keys.
    SshKey,
    /// Look at the fleet in the BMDB.
    #[command(subcommand)]
    Machines(MachinesCommand),
    /// Rollouts of operating system images (`shepherd machines install`
    /// starts them).
    #[command(subcommand)]
    Rollouts(RolloutsCommand),
    /// The recovery brake: `shepherd brake` shows it, `shepherd brake
    /// release` lets power actions for silence go ahead for a while.
    Brake {
        #[command(subcommand)]
        command: Option<BrakeCommand>,
    },
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

#[derive(Subcommand)]
enum BrakeCommand {
    /// Whether it holds, why, and the callback endpoints silence is judged on.
    Show,
    /// Let power actions for silence go ahead whatever the brake says, for
    /// a while (audited, as actor `cli`).
    Release {
        /// Why (kept in the audit).
        #[arg(long)]
        reason: Option<String>,
        /// For how long (default `recoverer.brake_release`).
        #[arg(long = "for", value_parser = humantime::parse_duration)]
        for_: Option<std::time::Duration>,
    },
}

#[derive(Subcommand)]
enum MachinesCommand {
    /// One line per machine: ID, provider, provider ID, address, state.
    List {
        /// Only machines in this state.
        #[arg(long, value_parser = parse_state)]
        state: Option<MachineState>,
        /// Only machines whose provider reports this status (Running,
        /// Provisioning, Stopped…).
        #[arg(long, value_parser = parse_provider_status)]
        provider_status: Option<shepherd::bmdb::ProviderStatus>,
        /// Only machines whose agent is heartbeating, silent (started, no
        /// heartbeat within recoverer.heartbeat_stale_after) or no-agent.
        #[arg(long, value_parser = parse_heartbeat)]
        heartbeat: Option<machines::Heartbeat>,
        /// A machine ID's prefix, part of a provider ID, or an address's
        /// prefix.
        #[arg(long)]
        search: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 1000)]
        limit: i64,
    },
    /// A machine's tags, lease, backoffs, history and operator actions.
    Show {
        /// The BMDB machine ID.
        id: uuid::Uuid,
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
    /// Install an operating system image: on one machine (one ID), or as a
    /// rollout over several (IDs, or the filters of `list`), at most
    /// --max-parallel at once, stopped once more than --max-failures fail.
    Install(Box<InstallArgs>),
}

#[derive(clap::Args)]
struct InstallArgs {
    /// Machine IDs (one: a single installation; several: a rollout in this
    /// order).
    ids: Vec<uuid::Uuid>,
    /// A rollout over the machines in this state…
    #[arg(long, value_parser = parse_state)]
    state: Option<MachineState>,
    /// …whose provider reports this status…
    #[arg(long, value_parser = parse_provider_status)]
    provider_status: Option<shepherd::bmdb::ProviderStatus>,
    /// …whose agent is heartbeating, silent or no-agent…
    #[arg(long, value_parser = parse_heartbeat)]
    heartbeat: Option<machines::Heartbeat>,
    /// …matching this (ID prefix, part of a provider ID, address prefix).
    #[arg(long)]
    search: Option<String>,
    /// The image's http:// or https:// URL (with --digest)…
    #[arg(long)]
    url: Option<String>,
    /// sha256:HEX or sha512:HEX of the bytes at --url.
    #[arg(long)]
    digest: Option<String>,
    /// …or the name of an image in installations.images_dir, served by
    /// the running shepherds.
    #[arg(long)]
    served: Option<String>,
    /// The image's length in bytes (as served), when known.
    #[arg(long)]
    size: Option<i64>,
    /// Disk hints: the one disk matching all of them is written.
    #[arg(long)]
    disk_serial: Option<String>,
    #[arg(long)]
    disk_wwn: Option<String>,
    #[arg(long)]
    disk_model: Option<String>,
    #[arg(long)]
    disk_by_path: Option<String>,
    /// Disk at least / at most this many bytes.
    #[arg(long)]
    disk_min_bytes: Option<i64>,
    #[arg(long)]
    disk_max_bytes: Option<i64>,
    /// Only a rotational (true) or a solid-state (false) disk.
    #[arg(long)]
    disk_rotational: Option<bool>,
    /// The disk the running system boots from may be written.
    #[arg(long)]
    allow_boot_disk: bool,
    /// Reboot into the installed system once the report is in.
    #[arg(long)]
    reboot: bool,
    /// Make the installed disk the first EFI boot entry (its EFI system
    /// partition's \EFI\BOOT\BOOTX64.EFI).
    #[arg(long)]
    set_efi_boot_entry: bool,
    /// How long each agent may take (default 2h).
    #[arg(long, value_parser = humantime::parse_duration)]
    deadline: Option<std::time::Duration>,
    #[arg(long, default_value_t = 1)]
    max_parallel: i32,
    #[arg(long, default_value_t = 0)]
    max_failures: i32,
    #[arg(long)]
    reason: Option<String>,
}

#[derive(Subcommand)]
enum RolloutsCommand {
    /// The latest rollouts.
    List,
    /// A rollout and its machines.
    Show { id: uuid::Uuid },
    /// Skip the machines still waiting (those installing finish).
    Cancel { id: uuid::Uuid },
}

fn parse_provider_status(s: &str) -> Result<shepherd::bmdb::ProviderStatus, String> {
    use shepherd::bmdb::ProviderStatus;
    ProviderStatus::ALL
        .into_iter()
        .find(|p| p.to_string() == s)
        .ok_or_else(|| {
            let all: Vec<String> = ProviderStatus::ALL.iter().map(|p| p.to_string()).collect();
            format!("not a provider status; one of: {}", all.join(", "))
        })
}

fn parse_heartbeat(s: &str) -> Result<machines::Heartbeat, String> {
    machines::Heartbeat::parse(s).ok_or_else(|| {
        let all: Vec<&str> = machines::Heartbeat::ALL
            .iter()
            .map(|h| h.as_str())
            .collect();
        format!("one of: {}", all.join(", "))
    })
}

fn parse_process(s: &str) -> Result<shepherd::bmdb::Process, String> {
    shepherd::bmdb::Process::parse(s).ok_or_else(|| {
        let all: Vec<String> = shepherd::bmdb::Process::ALL
            .iter()
            .map(|p| p.to_string())
            .collect();
        format!("not a process; one of: {}", all.join(", "))
    })
}

impl MachinesCommand {
    /// The operator action this command is, if it is one.
    fn action(&self) -> Option<actions::Request> {
        use actions::{Action, Request};
        let (id, action, reason) = match self {
            MachinesCommand::List { .. }
            | MachinesCommand::Show { .. }
            | MachinesCommand::Install(_) => return None,
            MachinesCommand::Retry { id, reason, .. } => (id, Action::Retry, reason),
            MachinesCommand::Retakeover { id, reason, .. } => (id, Action::Retakeover, reason),
            MachinesCommand::Reboot { id, reason } => (id, Action::Reboot, reason),
            MachinesCommand::Hold { id, reason } => (id, Action::Hold, reason),
            MachinesCommand::Release { id, reason } => (id, Action::Release, reason),
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

fn parse_state(s: &str) -> Result<MachineState, String> {
    MachineState::parse(s).ok_or_else(|| {
        let all: Vec<&str> = MachineState::ALL.iter().map(|m| m.as_str()).collect();
        format!("not a state; one of: {}", all.join(", "))
    })
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
        if let Some(f) = &cfg.provider.inventory.file {
            if let Ok(read) = shepherd::config::inventory::read_file(f) {
                for p in &read.problems {
                    eprintln!("shepherd: warning: {p}");
                }
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
            Command::Migrate => migrate(cfg).await,
            Command::Machines(MachinesCommand::Install(a)) => install_command(cfg, *a).await,
            Command::Machines(m) => machines_command(cfg, m).await,
            Command::Rollouts(r) => rollouts_command(cfg, r).await,
            Command::Brake { command } => {
                brake_command(cfg, command.unwrap_or(BrakeCommand::Show)).await
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

async fn brake_command(mut cfg: Config, cmd: BrakeCommand) -> anyhow::Result<()> {
    cfg.bmdb.pool_size = 2;
    let bmdb = Bmdb::open(&cfg.bmdb).await?;
    let endpoint = cfg
        .bmaas
        .endpoint
        .clone()
        .or(cfg.initializer.agent_endpoint.clone());
    let provider = match cfg.provider.kind {
        shepherd::config::ProviderKind::Static => shepherd::bmdb::Provider::None,
        shepherd::config::ProviderKind::Equinix => shepherd::bmdb::Provider::Equinix,
    };
    let judge = shepherd::supervisor::judge(&cfg, provider, endpoint);
    let t = |s: std::time::SystemTime| humantime::format_rfc3339_seconds(s).to_string();
    match cmd {
        BrakeCommand::Release { reason, for_ } => {
            let for_ = for_.unwrap_or(cfg.recoverer.brake_release);
            let id = uuid::Uuid::new_v4();
            let a = bmdb
                .transact(async |tx| {
                    shepherd::bmdb::brake::release(tx, id, "cli", reason.as_deref(), for_).await
                })
                .await?;
            println!("{}: {}", a.action, a.detail);
            Ok(())
        }
        BrakeCommand::Show => {
            let (b, endpoints) = bmdb
                .transact(async |tx| {
                    Ok((
                        shepherd::bmdb::brake::state(tx, &judge).await?,
                        shepherd::bmdb::callback::endpoints(tx).await?,
                    ))
                })
                .await?;
            if b.engaged {
                println!(
                    "ENGAGED{}: {}",
                    b.engaged_since
                        .map(|s| format!(" since {}", t(s)))
                        .unwrap_or_default(),
                    b.reason.as_deref().unwrap_or("")
                );
            } else if let (Some(until), Some(by)) = (b.released_until, &b.released_by) {
                println!("released by {by} until {}", t(until));
            } else {
                println!("not engaged");
            }
            println!(
                "silent machines: {} of {} (limit {}); power actions for silence in the last {}: {}",
                b.silent,
                b.fleet,
                b.limit,
                humantime::format_duration(b.window),
                b.power_actions_in_window
            );
            for e in endpoints {
                println!(
                    "callback endpoint {}: {} since {}",
                    e.endpoint,
                    if e.served { "served" } else { "not served" },
                    t(if e.served {
                        e.serving_since
                    } else {
                        e.served_until
                    })
                );
            }
            Ok(())
        }
    }
}

async fn machines_command(mut cfg: Config, cmd: MachinesCommand) -> anyhow::Result<()> {
    cfg.bmdb.pool_size = 2;
    let bmdb = Bmdb::open(&cfg.bmdb).await?;
    if let Some(req) = cmd.action() {
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
        MachinesCommand::List {
            state,
            provider_status,
            heartbeat,
            search,
            limit,
        } => {
            let filter = machines::FleetFilter {
                state,
                provider_status,
                heartbeat,
                stale_after: cfg.recoverer.heartbeat_stale_after,
                search,
            };
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
                .transact(async |tx| machines::detail(tx, id).await)
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
                    println!(
                        "  progress         {} {} of {} fetched, {} written, {}/s, disk {} (at {})",
                        shepherd::admin::api::phase_name(p.phase),
                        shepherd_proto::summary::bytes(p.bytes_fetched),
                        shepherd_proto::summary::bytes(p.bytes_total),
                        shepherd_proto::summary::bytes(p.bytes_written),
                        shepherd_proto::summary::bytes(p.rate_bytes_per_second),
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

/// The image an `install` asks for, checked.
async fn image_of(
    cfg: &Config,
    bmdb: &Bmdb,
    a: &InstallArgs,
) -> anyhow::Result<shepherd_proto::api::ImageInstallation> {
    use shepherd_proto::api::{DiskHints, ImageInstallation};
    let mut image = ImageInstallation {
        size_bytes: a.size,
        allow_boot_disk: a.allow_boot_disk,
        reboot: a.reboot,
        set_efi_boot_entry: a.set_efi_boot_entry,
        deadline_seconds: a.deadline.map(|d| d.as_secs() as i64).unwrap_or(0),
        ..Default::default()
    };
    match (&a.url, &a.served) {
        (Some(_), Some(_)) => anyhow::bail!("give --url or --served, not both"),
        (None, None) => anyhow::bail!("give --url (with --digest) or --served"),
        (Some(url), None) => {
            image.url = url.clone();
            image.digest = a.digest.clone().unwrap_or_default();
        }
        (None, Some(name)) => {
            let Some(dir) = cfg.installations.images_dir.clone() else {
                anyhow::bail!(
                    "--served needs installations.images_dir (the image server's directory)"
                );
            };
            let ca = bmdb
                .transact(async |tx| {
                    shepherd::bmdb::callback::ca(tx, || {
                        Err("no callback CA yet: start shepherd once first".into())
                    })
                    .await
                })
                .await?;
            let endpoint = shepherd::supervisor::images_endpoint(
                cfg,
                cfg.bmaas
                    .endpoint
                    .as_deref()
                    .or(cfg.initializer.agent_endpoint.as_deref()),
            );
            let catalog = shepherd::images::ImageCatalog::new(dir, &endpoint, ca.certificate);
            let served = catalog
                .resolve(name)
                .map_err(|e| anyhow::anyhow!("--served: {e}"))?;
            image.url = served.url;
            image.digest = served.digest;
            image.size_bytes = Some(served.size_bytes as i64);
            image.ca_certificate = served.ca_certificate;
        }
    }
    let any_hint = a.disk_serial.is_some()
        || a.disk_wwn.is_some()
        || a.disk_model.is_some()
        || a.disk_by_path.is_some()
        || a.disk_min_bytes.is_some()
        || a.disk_max_bytes.is_some()
        || a.disk_rotational.is_some();
    if any_hint {
        image.disk = Some(DiskHints {
            serial: a.disk_serial.clone().unwrap_or_default(),
            wwn: a.disk_wwn.clone().unwrap_or_default(),
            model: a.disk_model.clone().unwrap_or_default(),
            by_path: a.disk_by_path.clone().unwrap_or_default(),
            min_size_bytes: a.disk_min_bytes,
            max_size_bytes: a.disk_max_bytes,
            rotational: a.disk_rotational,
        });
    }
    shepherd::bmdb::installations::check_image(&image).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(image)
}

async fn install_command(mut cfg: Config, a: InstallArgs) -> anyhow::Result<()> {
    use shepherd::bmdb::installations::{self, Asked, Asker};
    use shepherd::bmdb::rollouts;
    cfg.bmdb.pool_size = 2;
    let bmdb = Bmdb::open(&cfg.bmdb).await?;
    let image = image_of(&cfg, &bmdb, &a).await?;
    let by_filter = a.state.is_some()
        || a.provider_status.is_some()
        || a.heartbeat.is_some()
        || a.search.is_some();
    if by_filter && !a.ids.is_empty() {
        anyhow::bail!("give machine IDs or filters, not both");
    }
    if a.ids.len() == 1 {
        let id = a.ids[0];
        let reason = a.reason.as_deref().map(str::trim).filter(|r| !r.is_empty());
        let asker = Asker {
            actor: "cli",
            action_id: uuid::Uuid::new_v4(),
            rollout_id: None,
            reason,
        };
        return match bmdb
            .transact(async |tx| installations::ask(tx, id, &image, &asker).await)
            .await?
        {
            Asked::Done { generation, .. } => {
                println!("install {id}: generation {generation}: {}", image.url);
                Ok(())
            }
            Asked::Refused(why) => anyhow::bail!("install refused: {why}"),
            Asked::NotFound => anyhow::bail!("machine {id} is not in the BMDB"),
        };
    }
    if a.ids.is_empty() && !by_filter {
        anyhow::bail!(
            "name the machines: IDs, or filters (--state, --provider-status, --heartbeat, --search)"
        );
    }
    if !(1..=10_000).contains(&a.max_parallel) {
        anyhow::bail!("--max-parallel must be within 1 and 10000");
    }
    if a.max_failures < 0 {
        anyhow::bail!("--max-failures must not be negative");
    }
    let filter = machines::FleetFilter {
        state: a.state,
        provider_status: a.provider_status,
        heartbeat: a.heartbeat,
        stale_after: cfg.recoverer.heartbeat_stale_after,
        search: a.search.clone(),
    };
    let selection = if a.ids.is_empty() {
        let mut parts = Vec::new();
        if let Some(s) = a.state {
            parts.push(format!("state={s}"));
        }
        if let Some(s) = a.provider_status {
            parts.push(format!("provider_status={s}"));
        }
        if let Some(h) = a.heartbeat {
            parts.push(format!("heartbeat={}", h.as_str()));
        }
        if let Some(q) = &a.search {
            parts.push(format!("q={q}"));
        }
        parts.join(" ")
    } else {
        format!("{} machines by ID", a.ids.len())
    };
    let id = uuid::Uuid::new_v4();
    let r = bmdb
        .transact(async |tx| {
            let ids: Vec<uuid::Uuid> = if a.ids.is_empty() {
                machines::fleet_page(tx, &filter, 100_000, 0)
                    .await?
                    .0
                    .into_iter()
                    .map(|m| m.machine_id)
                    .collect()
            } else {
                let mut seen = std::collections::HashSet::new();
                a.ids.iter().copied().filter(|i| seen.insert(*i)).collect()
            };
            rollouts::create(
                tx,
                &rollouts::NewRollout {
                    id,
                    image: &image,
                    max_parallel: a.max_parallel,
                    max_failures: a.max_failures,
                    selection: &selection,
                    machines: &ids,
                    created_by: "cli",
                },
            )
            .await
        })
        .await?;
    println!(
        "rollout {}: {} machines ({selection}), {} at once, stops after {} failures: {}",
        r.id,
        r.counts.waiting,
        r.max_parallel,
        r.max_failures + 1,
        r.image_url
    );
    println!(
        "running shepherds move it on; `shepherd rollouts show {}` follows it",
        r.id
    );
    Ok(())
}

async fn rollouts_command(mut cfg: Config, cmd: RolloutsCommand) -> anyhow::Result<()> {
    use shepherd::bmdb::rollouts;
    cfg.bmdb.pool_size = 2;
    let bmdb = Bmdb::open(&cfg.bmdb).await?;
    let t = |s: std::time::SystemTime| humantime::format_rfc3339_seconds(s).to_string();
    let line = |r: &rollouts::Rollout| {
        format!(
            "{}  {:<8}  done {} running {} failed {} waiting {} skipped {}  {}  ({} by {} at {})",
            r.id,
            r.state,
            r.counts.done,
            r.counts.running,
            r.counts.failed,
            r.counts.waiting,
            r.counts.skipped,
            r.image_url,
            r.selection,
            r.created_by,
            t(r.created_at)
        )
    };
    match cmd {
        RolloutsCommand::List => {
            for r in bmdb
                .transact(async |tx| rollouts::list(tx, 100).await)
                .await?
            {
                println!("{}", line(&r));
            }
        }
        RolloutsCommand::Show { id } => {
            let Some((r, members)) = bmdb
                .transact(async |tx| {
                    Ok(match rollouts::get(tx, id).await? {
                        Some(r) => Some((r, rollouts::members(tx, id).await?)),
                        None => None,
                    })
                })
                .await?
            else {
                anyhow::bail!("rollout {id} does not exist");
            };
            println!("{}", line(&r));
            if let Some(why) = &r.end_reason {
                println!("ended: {why}");
            }
            for m in members {
                println!(
                    "  {:>4}  {}  {:<8} {}",
                    m.position,
                    m.machine_id,
                    m.state,
                    m.error.as_deref().unwrap_or("")
                );
            }
        }
        RolloutsCommand::Cancel { id } => {
            match bmdb
                .transact(async |tx| rollouts::cancel(tx, id, "cli").await)
                .await?
            {
                Some(r) => println!("{}", line(&r)),
                None => anyhow::bail!("rollout {id} does not exist"),
            }
        }
    }
    Ok(())
}
