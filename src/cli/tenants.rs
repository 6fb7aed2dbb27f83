//! `shepherd projects`, `shepherd tokens` and `shepherd devices`: the
//! operator's side of the Metal API (CONTRACTS.md §7). Projects and the
//! machines they hold, their tokens (a value is printed once, alone on the
//! last line), and the tenants' devices, which an operator can reclaim.
//! Every change is audited as actor `cli`.

use clap::Subcommand;
use shepherd::bmdb::tenants::{self, Assigned};
use shepherd::bmdb::{Bmdb, devices};
use shepherd::config::Config;
use uuid::Uuid;

#[derive(Subcommand)]
pub enum ProjectsCommand {
    /// Make a project; prints its ID alone on its line.
    Create {
        name: String,
        /// Devices it may hold at once (default `metal.max_devices_per_project`).
        #[arg(long)]
        max_devices: Option<u32>,
        /// Only the machines assigned to it, never the shared pool.
        #[arg(long)]
        assigned_only: bool,
    },
    /// ID, name, machines assigned, devices, device limit.
    List,
    /// Change a project's device limit, or whether it draws from the
    /// shared pool.
    Limit {
        /// The project's ID or name.
        project: String,
        /// Devices at once at most; 0 or less: no limit.
        #[arg(long, allow_negative_numbers = true)]
        max_devices: Option<i64>,
        /// Only the machines assigned to it (`--assigned-only false`: the
        /// shared pool too).
        #[arg(long)]
        assigned_only: Option<bool>,
    },
    /// Give machines to a project (its hardware reservations); a machine
    /// of another project moves (refused while a device runs on it).
    Assign {
        /// The project's ID or name.
        project: String,
        #[arg(required = true)]
        machines: Vec<Uuid>,
    },
    /// Give machines back to the shared pool.
    Unassign {
        #[arg(required = true)]
        machines: Vec<Uuid>,
    },
}

#[derive(Subcommand)]
pub enum TokensCommand {
    /// Make a token of a project; prints it alone on the last line, once
    /// (only its SHA-256 is kept).
    Create {
        /// The project's ID or name.
        #[arg(long)]
        project: String,
        /// It reads, and can neither create, update, delete nor act.
        #[arg(long)]
        read_only: bool,
        #[arg(long)]
        description: Option<String>,
    },
    /// ID, project, access, description, made, last used, revoked: never
    /// a value.
    List {
        /// Only this project's (ID or name).
        #[arg(long)]
        project: Option<String>,
    },
    /// Refuse every request with this token from now on.
    Revoke { token_id: Uuid },
}

#[derive(Subcommand)]
pub enum DevicesCommand {
    /// Tenants' devices: ID, project, machine, host name, Metal state.
    List {
        /// Only this project's (ID or name).
        #[arg(long)]
        project: Option<String>,
    },
    /// Reclaim a device: delete it as its tenant would (locked or not);
    /// its machine's disks are erased, then it is available again.
    Reclaim { device_id: Uuid },
}

fn t(s: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(s).to_string()
}

async fn open(mut cfg: Config) -> anyhow::Result<Bmdb> {
    cfg.bmdb.pool_size = 2;
    Ok(Bmdb::open(&cfg.bmdb).await?)
}

async fn find(bmdb: &Bmdb, project: &str) -> anyhow::Result<tenants::Project> {
    bmdb.snapshot(async |tx| tenants::find_project(tx, project).await)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no project {project:?} (by ID or name)"))
}

pub async fn projects(cfg: Config, cmd: ProjectsCommand) -> anyhow::Result<()> {
    let default_limit = cfg.metal.max_devices_per_project;
    let bmdb = open(cfg).await?;
    match cmd {
        ProjectsCommand::Create {
            name,
            max_devices,
            assigned_only,
        } => {
            tenants::check_project_name(&name).map_err(anyhow::Error::msg)?;
            let limit = max_devices
                .or(default_limit)
                .map(|m| i32::try_from(m).unwrap_or(i32::MAX));
            let made = bmdb
                .transact(async |tx| {
                    tenants::create_project(tx, name.trim(), "cli", limit, !assigned_only).await
                })
                .await?
                .map_err(anyhow::Error::msg)?;
            println!("{}", made.id);
        }
        ProjectsCommand::List => {
            let all = bmdb
                .snapshot(async |tx| tenants::projects(tx).await)
                .await?;
            println!("ID                                    MACHINES DEVICES LIMIT POOL     NAME");
            for p in all {
                println!(
                    "{} {:>8} {:>7} {:>5} {:<8} {}",
                    p.id,
                    p.machines,
                    p.devices,
                    p.max_devices.map_or("-".into(), |m| m.to_string()),
                    if p.shared_pool { "shared" } else { "assigned" },
                    p.name
                );
            }
        }
        ProjectsCommand::Limit {
            project,
            max_devices,
            assigned_only,
        } => {
            let p = find(&bmdb, &project).await?;
            let limit = match max_devices {
                None => p.max_devices,
                Some(m) if m <= 0 => None,
                Some(m) => Some(i32::try_from(m).unwrap_or(i32::MAX)),
            };
            let shared = assigned_only.map_or(p.shared_pool, |a| !a);
            bmdb.transact(async |tx| tenants::set_limits(tx, p.id, limit, shared, "cli").await)
                .await?;
            println!(
                "project {}: {}, {}",
                p.name,
                limit.map_or("no device limit".into(), |m| format!("at most {m} devices")),
                if shared {
                    "draws from the shared pool"
                } else {
                    "assigned machines only"
                }
            );
        }
        ProjectsCommand::Assign { project, machines } => {
            let p = find(&bmdb, &project).await?;
            let suffix = format!(" (project {})", p.name);
            each_machine(&bmdb, &machines, "assigned", &suffix, async |tx, m| {
                tenants::assign(tx, p.id, m, "cli").await
            })
            .await?;
        }
        ProjectsCommand::Unassign { machines } => {
            each_machine(&bmdb, &machines, "unassigned", "", async |tx, m| {
                tenants::unassign(tx, m, "cli").await
            })
            .await?;
        }
    }
    Ok(())
}

/// Does `one` to each machine in a transaction of its own, printing what
/// it did; an error when any was refused or unknown (`what`: the verb).
async fn each_machine(
    bmdb: &Bmdb,
    machines: &[Uuid],
    what: &str,
    suffix: &str,
    mut one: impl AsyncFnMut(
        &mut shepherd::bmdb::Tx<'_>,
        Uuid,
    ) -> Result<Assigned, shepherd::bmdb::BmdbError>,
) -> anyhow::Result<()> {
    let mut failed = 0;
    for &m in machines {
        match bmdb.transact(async |tx| one(tx, m).await).await? {
            Assigned::Done(d) => println!("{d}{suffix}"),
            Assigned::Refused(why) => {
                failed += 1;
                eprintln!("shepherd: {why}");
            }
            Assigned::NotFound => {
                failed += 1;
                eprintln!("shepherd: machine {m} is not in the BMDB");
            }
        }
    }
    anyhow::ensure!(failed == 0, "{failed} machines not {what}");
    Ok(())
}

pub async fn tokens(cfg: Config, cmd: TokensCommand) -> anyhow::Result<()> {
    let bmdb = open(cfg).await?;
    match cmd {
        TokensCommand::Create {
            project,
            read_only,
            description,
        } => {
            let p = find(&bmdb, &project).await?;
            let description = description
                .map(|d| d.trim().to_string())
                .filter(|d| !d.is_empty());
            if let Some(d) = &description {
                anyhow::ensure!(
                    d.chars().count() <= 200 && !d.chars().any(char::is_control),
                    "--description: at most 200 printable characters"
                );
            }
            let (info, value) = bmdb
                .transact(async |tx| {
                    tenants::create_token(tx, p.id, read_only, description.as_deref(), "cli").await
                })
                .await?;
            eprintln!(
                "token {} of project {} ({}): shown once, keep it now",
                info.id,
                p.name,
                if read_only { "read-only" } else { "read-write" }
            );
            println!("{value}");
        }
        TokensCommand::List { project } => {
            let only = match project {
                Some(p) => Some(find(&bmdb, &p).await?.id),
                None => None,
            };
            let all = bmdb
                .snapshot(async |tx| tenants::tokens(tx, only).await)
                .await?;
            println!(
                "ID                                    ACCESS     MADE                 LAST USED            REVOKED              PROJECT / DESCRIPTION"
            );
            for tk in all {
                println!(
                    "{} {:<10} {:<20} {:<20} {:<20} {} / {}",
                    tk.id,
                    if tk.read_only {
                        "read-only"
                    } else {
                        "read-write"
                    },
                    t(tk.created_at),
                    tk.last_used_at.map_or("-".into(), t),
                    tk.revoked_at.map_or("-".into(), t),
                    tk.project,
                    tk.description.as_deref().unwrap_or("-")
                );
            }
        }
        TokensCommand::Revoke { token_id } => {
            let found = bmdb
                .transact(async |tx| tenants::revoke_token(tx, token_id, "cli").await)
                .await?;
            anyhow::ensure!(found, "no token {token_id}");
            println!("token {token_id} revoked");
        }
    }
    Ok(())
}

pub async fn devices(cfg: Config, cmd: DevicesCommand) -> anyhow::Result<()> {
    let erase_mode = cfg.metal.erase_mode.clone();
    let bmdb = open(cfg).await?;
    match cmd {
        DevicesCommand::List { project } => {
            let only = match project {
                Some(p) => Some(find(&bmdb, &p).await?.id),
                None => None,
            };
            let (all, _) = bmdb
                .snapshot(async |tx| devices::list(tx, only, 0, i64::MAX).await)
                .await?;
            println!(
                "ID                                    PROJECT                              MACHINE                              STATE          HOSTNAME"
            );
            for d in all {
                println!(
                    "{} {} {} {:<14} {}",
                    d.id,
                    d.project_id,
                    d.machine_id,
                    d.state(),
                    d.hostname
                );
            }
        }
        DevicesCommand::Reclaim { device_id } => {
            match bmdb
                .transact(async |tx| devices::delete(tx, device_id, "cli", true, &erase_mode).await)
                .await?
            {
                devices::Acted::Done => println!(
                    "device {device_id} reclaimed: its machine's disks are erased, then it is available"
                ),
                devices::Acted::Refused(why) => anyhow::bail!("{why}"),
                devices::Acted::NotFound => anyhow::bail!("no device {device_id}"),
            }
        }
    }
    Ok(())
}
