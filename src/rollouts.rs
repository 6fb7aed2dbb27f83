//! The `RolloutDriver`: on a timer, moves every running rollout on
//! (`bmdb::rollouts::advance`), each in a transaction of its own under the
//! session. Any number of shepherds may run one: a rollout held by
//! another's transaction is skipped this round.

use uuid::Uuid;

use crate::bmdb::rollouts;
use crate::bmdb::{BmdbError, Session};
use crate::control::Round;
use crate::fault::{Blame, Whose};

/// Why a round of the rollouts stopped.
#[derive(Debug, thiserror::Error)]
pub enum RolloutRoundError {
    #[error("listing running rollouts: {0}")]
    Listing(#[source] BmdbError),
    #[error("rollout {rollout}: {source}")]
    Advancing {
        rollout: Uuid,
        #[source]
        source: BmdbError,
    },
}

impl Blame for RolloutRoundError {
    fn whose(&self) -> Whose {
        match self {
            RolloutRoundError::Listing(e) | RolloutRoundError::Advancing { source: e, .. } => {
                e.whose()
            }
        }
    }
}

/// What the driver's rounds added up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolloutCounters {
    /// Machines asked (to install, be erased or be serviced), over all
    /// rounds.
    pub started: u64,
}

/// Moves every running rollout on, on the round runner; a round runs as
/// soon as a session starts, and on demand (`RunRound`: an operator just
/// created or canceled a rollout).
pub struct RolloutDriver {
    interval: std::time::Duration,
}

impl RolloutDriver {
    pub fn new(interval: std::time::Duration) -> Self {
        RolloutDriver { interval }
    }
}

impl Round for RolloutDriver {
    type Outcome = u64;
    type Counters = RolloutCounters;
    type Error = RolloutRoundError;
    const NAME: &'static str = "rollouts";
    const AT_SESSION: bool = true;

    fn interval(&self) -> std::time::Duration {
        self.interval
    }

    async fn round(
        &self,
        session: &Session,
        _: &RolloutCounters,
    ) -> Result<u64, RolloutRoundError> {
        drive(session.clone()).await
    }

    fn tally(&self, c: &mut RolloutCounters, started: u64) {
        c.started += started;
    }
}

async fn drive(session: Session) -> Result<u64, RolloutRoundError> {
    let ids = session
        .transact(async |tx| rollouts::running(tx).await)
        .await
        .map_err(RolloutRoundError::Listing)?;
    let mut started = 0;
    for id in ids {
        let a = session
            .transact(async |tx| rollouts::advance(tx, id).await)
            .await
            .map_err(|source| RolloutRoundError::Advancing {
                rollout: id,
                source,
            })?;
        for (machine_id, ok) in &a.ended {
            if *ok {
                tracing::info!(rollout = %id, %machine_id, "rollout: machine done");
            } else {
                tracing::warn!(rollout = %id, %machine_id, "rollout: machine failed");
            }
        }
        for machine_id in &a.started {
            tracing::info!(rollout = %id, %machine_id, "rollout: machine asked");
        }
        if let Some(state) = &a.finished {
            tracing::info!(rollout = %id, %state, "rollout ended");
        }
        started += a.started.len() as u64;
    }
    Ok(started)
}
