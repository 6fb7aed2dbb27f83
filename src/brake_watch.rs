//! The brake watch: a round loop that evaluates the recovery brake under
//! the current session every interval and says loudly when it engages or
//! lets go (the pages, the API and `/metrics` read the brake from the
//! BMDB themselves).

use std::time::Duration;

use crate::bmdb::Session;
use crate::bmdb::brake::{self, Judge};
use crate::control::Round;

/// Watches the brake under the current session every interval and says
/// loudly when it engages or lets go (the pages, the API and `/metrics`
/// read it from the BMDB themselves). A round on the round runner.
pub struct BrakeWatch {
    judge: Judge,
    every: Duration,
}

impl BrakeWatch {
    pub fn new(judge: Judge, every: Duration) -> Self {
        BrakeWatch { judge, every }
    }
}

/// What the watch saw last.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrakeSeen {
    /// Whether it held at the last look (to say when that changes).
    pub engaged: bool,
}

impl Round for BrakeWatch {
    type Outcome = brake::BrakeState;
    type Counters = BrakeSeen;
    type Error = crate::bmdb::BmdbError;
    const NAME: &'static str = "brake-watch";
    const WARN_ON_FAILURE: bool = false;

    fn interval(&self) -> Duration {
        self.every
    }

    async fn round(
        &self,
        session: &Session,
        _: &BrakeSeen,
    ) -> Result<brake::BrakeState, crate::bmdb::BmdbError> {
        session
            .transact(async |tx| brake::watch(tx, &self.judge).await)
            .await
            .map(|(st, _)| st)
    }

    fn tally(&self, seen: &mut BrakeSeen, st: brake::BrakeState) {
        if st.engaged && !seen.engaged {
            tracing::error!(
                silent = st.silent,
                fleet = st.fleet,
                limit = st.limit,
                power_actions = st.power_actions_in_window,
                "RECOVERY BRAKE ENGAGED: no power action for silence until it lets go: {}; \
                     `shepherd brake release` to override",
                st.reason.as_deref().unwrap_or("")
            );
        } else if !st.engaged && seen.engaged {
            tracing::warn!(
                silent = st.silent,
                limit = st.limit,
                "recovery brake let go: power actions for silence resume"
            );
        }
        seen.engaged = st.engaged;
    }
}
