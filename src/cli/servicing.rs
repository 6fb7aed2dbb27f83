//! Servicing from the command line: `shepherd machines service ID`
//! (one machine to its baseline; `--force` for a tenant's) and `shepherd
//! rollouts service --baseline NAME` (every machine of a baseline that
//! differs from it, N at a time). A running shepherd's Servicer does the
//! work; these ask for it, as the API does.

use shepherd::baselines::Baselines;
use shepherd::bmdb::servicing::{Ask, Asked};
use shepherd::bmdb::{Bmdb, rollouts};
use shepherd::config::Config;

/// `shepherd machines service ID`.
pub async fn machine(
    mut cfg: Config,
    id: uuid::Uuid,
    force: bool,
    reason: Option<String>,
) -> anyhow::Result<()> {
    cfg.bmdb.pool_size = 2;
    let bmdb = Bmdb::open(&cfg.bmdb).await?;
    let baselines = Baselines::new(&cfg.baselines, &cfg.metal.plans);
    let reason = reason
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty());
    let ask = Ask {
        action_id: uuid::Uuid::new_v4(),
        actor: "cli",
        reason: reason.as_deref(),
        baseline: "",
        forced: force,
        rollout_id: None,
    };
    match bmdb
        .transact(async |tx| baselines.ask_service(tx, id, &ask).await)
        .await?
    {
        Asked::Done { audit, .. } => {
            println!("service {id}: {}", audit.detail);
            println!(
                "a running shepherd's Servicer does it; `shepherd machines show {id}` follows it"
            );
            Ok(())
        }
        Asked::Refused(why) => anyhow::bail!("service refused: {why}"),
        Asked::NotFound => anyhow::bail!("machine {id} is not in the BMDB"),
    }
}

/// `shepherd rollouts service --baseline NAME`.
pub async fn rollout(
    bmdb: &Bmdb,
    cfg: &Config,
    baseline: &str,
    max_parallel: i32,
    max_failures: i32,
) -> anyhow::Result<()> {
    let baselines = Baselines::new(&cfg.baselines, &cfg.metal.plans);
    if baselines.named(baseline).is_none() {
        anyhow::bail!("--baseline: {baseline:?} is not a declared [[baselines]] name");
    }
    if !(1..=10_000).contains(&max_parallel) {
        anyhow::bail!("--max-parallel: {max_parallel} is outside 1 to 10000");
    }
    if max_failures < 0 {
        anyhow::bail!("--max-failures: {max_failures} is negative");
    }
    let selection = format!("the machines baseline {baseline} selects that differ from it");
    let image = shepherd_proto::api::ImageInstallation::default();
    let r = bmdb
        .transact(async |tx| {
            let ids = baselines.selected(tx, baseline, None, true).await?;
            rollouts::create(
                tx,
                &rollouts::NewRollout {
                    id: uuid::Uuid::new_v4(),
                    image: &image,
                    erasure: None,
                    baseline: Some(baseline),
                    max_parallel,
                    max_failures,
                    selection: &selection,
                    machines: &ids,
                    created_by: "cli",
                },
            )
            .await
        })
        .await?;
    println!(
        "rollout {}: {} machines ({selection}), {} at once, stops after {} failures",
        r.id,
        r.counts.waiting,
        r.max_parallel,
        r.max_failures + 1
    );
    println!(
        "running shepherds move it on; `shepherd rollouts show {}` follows it",
        r.id
    );
    Ok(())
}
