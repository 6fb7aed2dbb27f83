//! The installation deadline: a round that fails every installation or
//! erasure on which nothing moved for `installations.deadline`, with the
//! cause (`bmdb::installations::fail_stalled`). Any shepherd may run it:
//! the generations are locked as they are failed, so each fails once.

use std::time::Duration;

use crate::bmdb::Session;
use crate::bmdb::installations::{self, TimedOut};
use crate::control::Round;

pub struct InstallationDeadline {
    deadline: Duration,
    /// The agents' allowance: the callback must have been served for the
    /// deadline plus this (`recoverer.callback_grace`).
    allowance: Duration,
    every: Duration,
}

impl InstallationDeadline {
    pub fn new(deadline: Duration, allowance: Duration) -> Self {
        // A tenth of the deadline between looks, at most a minute.
        let every = (deadline / 10).clamp(Duration::from_secs(5), Duration::from_secs(60));
        InstallationDeadline {
            deadline,
            allowance,
            every,
        }
    }
}

/// Generations failed so far by this shepherd.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadlinesSeen {
    pub timed_out: u64,
}

impl Round for InstallationDeadline {
    type Outcome = Vec<TimedOut>;
    type Counters = DeadlinesSeen;
    type Error = crate::bmdb::BmdbError;
    const NAME: &'static str = "deadlines";

    fn interval(&self) -> Duration {
        self.every
    }

    async fn round(
        &self,
        session: &Session,
        _: &DeadlinesSeen,
    ) -> Result<Vec<TimedOut>, crate::bmdb::BmdbError> {
        session
            .transact(async |tx| {
                installations::fail_stalled(tx, self.deadline, self.allowance).await
            })
            .await
    }

    fn tally(&self, seen: &mut DeadlinesSeen, out: Vec<TimedOut>) {
        for t in &out {
            tracing::warn!(
                machine_id = %t.machine_id,
                generation = t.generation,
                kind = %t.kind,
                cause = %t.cause,
                "generation failed: past its deadline"
            );
        }
        seen.timed_out += out.len() as u64;
    }
}
