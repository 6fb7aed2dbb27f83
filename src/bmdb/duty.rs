//! Fleet duties: work that one shepherd of many sharing a BMDB does at a
//! time, held by its session (`fleet_duty`). The Provisioner's and the
//! Updater's rounds are duties: every shepherd runs the actors, one holds
//! each duty and the others stand by, so that N shepherds spend the
//! provider's API budget (the project's) as one would.
//!
//! A holder keeps its duty by claiming it every round; the duty passes to
//! the next claimant once the holder's session ends (its row cascades) or
//! its deadline passes (a killed process, before its session is collected).

use uuid::Uuid;

use super::{BmdbError, Session};

/// A duty by name, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duty {
    Provisioning,
    ProviderUpdates,
    /// Labeling machines with their plans (`crate::plan_labels`).
    PlanLabels,
}

impl Duty {
    pub fn as_str(self) -> &'static str {
        match self {
            Duty::Provisioning => "provisioning",
            Duty::ProviderUpdates => "provider-updates",
            Duty::PlanLabels => "plan-labels",
        }
    }
}

impl std::fmt::Display for Duty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Takes the duty for `$2` if it is free, held by `$2` already, or held by
/// a session past its deadline; returns the holder either way.
const CLAIM: &str = "WITH claim AS ( \
         INSERT INTO fleet_duty AS d (duty, session_id) VALUES ($1, $2) \
         ON CONFLICT (duty) DO UPDATE \
         SET session_id = EXCLUDED.session_id, \
             held_since = CASE WHEN d.session_id = EXCLUDED.session_id THEN d.held_since ELSE now() END \
         WHERE d.session_id = EXCLUDED.session_id \
            OR NOT EXISTS (SELECT 1 FROM sessions s \
                           WHERE s.session_id = d.session_id AND s.session_deadline > now()) \
         RETURNING session_id) \
     SELECT session_id FROM claim \
     UNION ALL \
     SELECT session_id FROM fleet_duty WHERE duty = $1 AND NOT EXISTS (SELECT 1 FROM claim)";

/// Who holds a duty after a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// This session: do the round.
    Us,
    /// Another live session: stand by.
    Other(Uuid),
}

/// Claims `duty` for `session` (one statement). A holder claims before
/// each round; the answer says whether to do it.
pub async fn claim(session: &Session, duty: Duty) -> Result<Holder, BmdbError> {
    let sid = session.id();
    let holder: Uuid = session
        .transact(async |tx| Ok(tx.query_one(CLAIM, &[&duty.as_str(), &sid]).await?.get(0)))
        .await?;
    Ok(if holder == sid {
        Holder::Us
    } else {
        Holder::Other(holder)
    })
}

/// A round of a duty: done by this process, or left to the holder.
#[derive(Debug)]
pub enum Turn<T> {
    Done(T),
    StandBy(Uuid),
}

/// Why a round of a duty did not run or failed.
#[derive(Debug, thiserror::Error)]
pub enum DutyRoundError<E: std::error::Error + 'static> {
    #[error("claiming the fleet's {duty} duty: {source}")]
    Claim {
        duty: Duty,
        #[source]
        source: BmdbError,
    },
    #[error(transparent)]
    Round(E),
}

impl<E: crate::fault::Blame + 'static> crate::fault::Blame for DutyRoundError<E> {
    fn whose(&self) -> crate::fault::Whose {
        match self {
            DutyRoundError::Claim { source, .. } => crate::fault::Blame::whose(source),
            DutyRoundError::Round(e) => e.whose(),
        }
    }
}

/// Runs `round` if `session` holds (or can take) `duty`.
pub async fn on_duty<T, E: std::error::Error + 'static>(
    session: &Session,
    duty: Duty,
    round: impl Future<Output = Result<T, E>>,
) -> Result<Turn<T>, DutyRoundError<E>> {
    match claim(session, duty).await {
        Ok(Holder::Us) => round.await.map(Turn::Done).map_err(DutyRoundError::Round),
        Ok(Holder::Other(holder)) => Ok(Turn::StandBy(holder)),
        Err(source) => Err(DutyRoundError::Claim { duty, source }),
    }
}

/// Records who holds `duty` as of this round in `known` (None before the
/// first claim), logging it once each time it changes hands.
pub fn note_holder(duty: Duty, known: &mut Option<Holder>, now: Holder) {
    if *known != Some(now) {
        match now {
            Holder::Us => tracing::info!(%duty, "this process holds the fleet's {duty} duty"),
            Holder::Other(holder) => tracing::info!(%duty, holder_session = %holder,
                "another shepherd holds the fleet's {duty} duty; standing by"),
        }
    }
    *known = Some(now);
}
