//! The fleet's tally kept flat: a round that settles the summary rows
//! whose backoff ran out and folds the tally's deltas
//! (`bmdb::machines::settle`), so that the fleet page, the API's list and
//! `/metrics` read a few dozen rows whatever the fleet's size. Any
//! shepherd may run it: it waits on no one, and one folds at a time.

use std::time::Duration;

use crate::bmdb::Session;
use crate::bmdb::machines::{self, Settled};
use crate::control::Round;

/// Every two seconds: a backoff's end shows within that on its own, and
/// the deltas between two rounds stay a few thousand rows at most.
const EVERY: Duration = Duration::from_secs(2);

#[derive(Debug, Default)]
pub struct FleetTally;

/// What the rounds settled and folded, in this process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TallyKept {
    pub states_settled: u64,
    pub deltas_folded: u64,
}

impl Round for FleetTally {
    type Outcome = Settled;
    type Counters = TallyKept;
    type Error = crate::bmdb::BmdbError;
    const NAME: &'static str = "fleet-tally";
    const AT_SESSION: bool = true;

    fn interval(&self) -> Duration {
        EVERY
    }

    async fn round(
        &self,
        session: &Session,
        _: &TallyKept,
    ) -> Result<Settled, crate::bmdb::BmdbError> {
        session
            .transact(async |tx| machines::settle(tx).await)
            .await
    }

    fn tally(&self, kept: &mut TallyKept, out: Settled) {
        kept.states_settled += out.states;
        kept.deltas_folded += out.folded;
    }
}
