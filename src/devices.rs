//! The devices round (`bmdb::devices::advance`): asks the erasure of
//! deleted devices whose machine could not be asked at once, ends those
//! whose erasure succeeded (their machine is available again), and writes
//! each change of a device's Metal state as an event. Any shepherd may
//! run it: the devices are locked as they are moved.

use std::time::Duration;

use crate::bmdb::Session;
use crate::bmdb::devices::{self, Advanced};
use crate::control::Round;

pub struct DeviceRound {
    every: Duration,
}

impl DeviceRound {
    pub fn new(every: Duration) -> Self {
        DeviceRound { every }
    }
}

/// What this shepherd's rounds did so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DevicesSeen {
    pub changes: u64,
    pub erasures_asked: u64,
    pub ended: u64,
}

impl Round for DeviceRound {
    type Outcome = Advanced;
    type Counters = DevicesSeen;
    type Error = crate::bmdb::BmdbError;
    const NAME: &'static str = "devices";

    fn interval(&self) -> Duration {
        self.every
    }

    async fn round(
        &self,
        session: &Session,
        _: &DevicesSeen,
    ) -> Result<Advanced, crate::bmdb::BmdbError> {
        session
            .transact(async |tx| devices::advance(tx).await)
            .await
    }

    fn tally(&self, seen: &mut DevicesSeen, out: Advanced) {
        for (device, from, to) in &out.changed {
            tracing::info!(%device, from = from.as_deref().unwrap_or("new"), %to, "device state");
        }
        for device in &out.erasures_asked {
            tracing::info!(%device, "deleted device: its machine's erasure asked");
        }
        for device in &out.ended {
            tracing::info!(%device, "deleted device ended: its machine is erased");
        }
        seen.changes += out.changed.len() as u64;
        seen.erasures_asked += out.erasures_asked.len() as u64;
        seen.ended += out.ended.len() as u64;
    }
}
