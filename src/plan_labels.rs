//! Each machine's plan kept in the BMDB (`bmdb::plan_labels`): a round
//! that labels the machines whose hardware report or BMC Secure Boot
//! changed, and every machine when the configured plans changed, so that
//! the fleet page and the API filter by plan with an index instead of
//! decoding each machine's report. One shepherd labels at a time (the
//! plan-labels duty): shepherds configured with different plans would
//! otherwise relabel the fleet in turn.

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::bmdb::Session;
use crate::bmdb::duty::Duty;
use crate::bmdb::plan_labels;
use crate::config::PlanConfig;
use crate::control::Round;

/// Machines labeled in one transaction…
const BATCH: i64 = 1000;
/// …and at most this many in one round (the rest in the next).
const PER_ROUND: u64 = 20_000;

pub struct PlanLabels {
    plans: Vec<PlanConfig>,
    fingerprint: String,
    every: Duration,
}

impl PlanLabels {
    pub fn new(plans: Vec<PlanConfig>, every: Duration) -> Self {
        PlanLabels {
            fingerprint: fingerprint(&plans),
            plans,
            every,
        }
    }
}

/// What the configured plans are, as a short stable digest.
pub fn fingerprint(plans: &[PlanConfig]) -> String {
    let text = serde_json::to_string(plans).unwrap_or_default();
    hex::encode(&Sha256::digest(text.as_bytes())[..16])
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Labeled {
    /// Labels marked stale because the configured plans changed.
    pub marked: u64,
    pub labeled: u64,
}

impl Round for PlanLabels {
    type Outcome = Labeled;
    type Counters = Labeled;
    type Error = crate::bmdb::BmdbError;
    const NAME: &'static str = "plan-labels";
    const DUTY: Option<Duty> = Some(Duty::PlanLabels);

    fn interval(&self) -> Duration {
        self.every
    }

    async fn round(
        &self,
        session: &Session,
        _: &Labeled,
    ) -> Result<Labeled, crate::bmdb::BmdbError> {
        let mut done = Labeled {
            marked: session
                .transact(async |tx| plan_labels::catalog_is(tx, &self.fingerprint).await)
                .await?,
            labeled: 0,
        };
        while done.labeled < PER_ROUND {
            let n = session
                .transact(async |tx| {
                    let stale = plan_labels::stale(tx, BATCH).await?;
                    let labels: Vec<_> = stale
                        .iter()
                        .map(|m| {
                            let plan = crate::config::metal::plan_of_raw(
                                &self.plans,
                                m.hardware_report.as_deref(),
                                m.bmc_secure_boot,
                            );
                            (m.machine_id, m.generation, plan.map(|p| p.slug.clone()))
                        })
                        .collect();
                    plan_labels::label(tx, &labels).await?;
                    Ok(stale.len() as u64)
                })
                .await?;
            done.labeled += n;
            if n < BATCH as u64 {
                break;
            }
        }
        Ok(done)
    }

    fn tally(&self, kept: &mut Labeled, out: Labeled) {
        kept.marked += out.marked;
        kept.labeled += out.labeled;
    }
}
