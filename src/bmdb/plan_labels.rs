//! Each machine's plan as labeled in the BMDB (`machine_plan`,
//! `migrations/V28__fleet_filters.sql`): the rows whose report, BMC Secure
//! Boot or configured plans changed since they were labeled, and the
//! labels written back over the generation read.

use uuid::Uuid;

use super::{BmdbError, Tx};

/// A machine whose plan is to be labeled anew: what the plan is computed
/// from, and the generation it was read at.
#[derive(Debug, Clone)]
pub struct Unlabeled {
    pub machine_id: Uuid,
    pub generation: i64,
    pub hardware_report: Option<Vec<u8>>,
    pub bmc_secure_boot: Option<bool>,
}

/// Records the configured plans' fingerprint ($1) when it is not the one
/// the labels were computed with: one row then, none otherwise.
const CATALOG_CHANGED: &str = "WITH new AS (INSERT INTO plan_catalog (fingerprint) VALUES ($1) \
                  ON CONFLICT (one) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, changed_at = now() \
                  WHERE plan_catalog.fingerprint <> EXCLUDED.fingerprint RETURNING 1) \
     SELECT count(*) FROM new";
/// Every label stale (the plans changed).
const MARK_ALL: &str =
    "UPDATE machine_plan SET stale = true, generation = generation + 1 WHERE NOT stale";

/// The stale rows, a batch of them, skipping rows another shepherd reads.
const STALE: &str = "SELECT p.machine_id, p.generation, hr.hardware_report_raw, f.secure_boot_enable \
       FROM machine_plan p \
       LEFT JOIN machine_hardware_report hr ON hr.machine_id = p.machine_id \
       LEFT JOIN machine_bmc_facts f ON f.machine_id = p.machine_id \
      WHERE p.stale ORDER BY p.machine_id LIMIT $1 FOR UPDATE OF p SKIP LOCKED";

/// The labels, each over the generation it was computed from.
const LABEL: &str = "UPDATE machine_plan p SET plan = l.plan, stale = false, labeled_at = now() \
       FROM unnest($1::uuid[], $2::int8[], $3::text[]) AS l(machine_id, generation, plan) \
      WHERE p.machine_id = l.machine_id AND p.generation = l.generation";

/// Marks every label stale if `fingerprint` (of the configured plans) is
/// new to the BMDB. Returns the rows marked.
pub async fn catalog_is(tx: &mut Tx<'_>, fingerprint: &str) -> Result<u64, BmdbError> {
    let changed: i64 = tx.query_one(CATALOG_CHANGED, &[&fingerprint]).await?.get(0);
    if changed == 0 {
        return Ok(0);
    }
    tx.execute(MARK_ALL, &[]).await
}

/// Up to `limit` machines to label, locked until the transaction ends.
pub async fn stale(tx: &mut Tx<'_>, limit: i64) -> Result<Vec<Unlabeled>, BmdbError> {
    Ok(tx
        .query(STALE, &[&limit])
        .await?
        .iter()
        .map(|r| Unlabeled {
            machine_id: r.get(0),
            generation: r.get(1),
            hardware_report: r.get(2),
            bmc_secure_boot: r.get(3),
        })
        .collect())
}

/// Writes the labels (a plan's slug, or none); a row marked again since
/// it was read keeps its mark. Returns the rows labeled.
pub async fn label(
    tx: &mut Tx<'_>,
    labels: &[(Uuid, i64, Option<String>)],
) -> Result<u64, BmdbError> {
    let ids: Vec<Uuid> = labels.iter().map(|l| l.0).collect();
    let generations: Vec<i64> = labels.iter().map(|l| l.1).collect();
    let plans: Vec<Option<&str>> = labels.iter().map(|l| l.2.as_deref()).collect();
    tx.execute(LABEL, &[&ids, &generations, &plans]).await
}
