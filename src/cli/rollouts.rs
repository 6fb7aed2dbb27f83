//! `shepherd rollouts`: rollouts listed, shown, canceled; a baseline's
//! started (`service`; an image's starts with `shepherd machines install`).

use clap::Subcommand;
use shepherd::bmdb::Bmdb;
use shepherd::config::Config;

#[derive(Subcommand)]
pub enum RolloutsCommand {
    /// The latest rollouts.
    List,
    /// A rollout and its machines.
    Show { id: uuid::Uuid },
    /// Skip the machines still waiting (those installing finish).
    Cancel { id: uuid::Uuid },
    /// Bring every machine a baseline selects that differs from it to it
    /// (a tenant's machine is skipped), N at a time, stopped after F
    /// failures.
    Service {
        /// The `[[baselines]]` name.
        #[arg(long)]
        baseline: String,
        /// Machines serviced at once.
        #[arg(long, default_value_t = 1)]
        max_parallel: i32,
        /// Failures tolerated; one more stops the rollout.
        #[arg(long, default_value_t = 0)]
        max_failures: i32,
    },
}

pub async fn run(mut cfg: Config, cmd: RolloutsCommand) -> anyhow::Result<()> {
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
                .snapshot(async |tx| {
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
        RolloutsCommand::Service {
            baseline,
            max_parallel,
            max_failures,
        } => {
            super::servicing::rollout(&bmdb, &cfg, &baseline, max_parallel, max_failures).await?;
        }
    }
    Ok(())
}
