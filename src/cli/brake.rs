//! `shepherd brake`: the recovery brake shown, or released for a while.

use clap::Subcommand;
use shepherd::bmdb::Bmdb;
use shepherd::config::Config;

#[derive(Subcommand)]
pub enum BrakeCommand {
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

pub async fn run(mut cfg: Config, cmd: BrakeCommand) -> anyhow::Result<()> {
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
    let judge = shepherd::bmdb::brake::Judge::new(&cfg.recoverer, provider, endpoint);
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
                    "callback endpoint {} ({} agents): {} since {}",
                    e.endpoint,
                    e.agents,
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
