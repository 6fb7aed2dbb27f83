//! BMDB library tests, against a real PostgreSQL (each test in its own
//! database; see `shepherd_sim::testing`).

mod actions;
mod backoff;
mod bmc_boot;
mod brake;
mod callback;
mod deadlines;
mod filters;
mod firmware;
mod history;
mod leases;
mod migrations;
mod netboot;
mod pools;
mod selectors;
mod servicing;
mod sessions;
mod snapshot;
mod tally;

use std::time::Duration;

use shepherd::bmdb::machines::{self, NewProvidedMachine};
use shepherd::bmdb::{Bmdb, BmdbError, Process, Provider, Session, Tx, Work};
use shepherd_sim::testing::TestDb;
use uuid::Uuid;

/// Polls `f` until it returns Some, or panics after `timeout` naming `what`.
pub async fn eventually<T>(
    what: &str,
    timeout: Duration,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Creates `n` machines provided by `provider`, returning their IDs.
pub async fn provided_machines(bmdb: &Bmdb, provider: Provider, n: usize) -> Vec<Uuid> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let m = NewProvidedMachine {
            provider,
            provider_id: format!("{provider}-{}", Uuid::new_v4()),
            reservation_id: None,
            ip_address: Some(format!("127.0.0.{}", 1 + i % 200)),
            location: Some("test".into()),
            status: None,
        };
        ids.push(
            bmdb.transact(async |tx| machines::create_provided(tx, &m).await)
                .await
                .unwrap(),
        );
    }
    ids
}

/// A selector that picks one given machine, whatever its state.
pub fn pick(
    machine_id: Uuid,
) -> impl AsyncFnMut(&mut Tx<'_>) -> Result<Option<(Uuid, ())>, BmdbError> {
    async move |_tx: &mut Tx<'_>| Ok(Some((machine_id, ())))
}

pub use shepherd_sim::testing::count;

/// Machines of `provider` due for recovery by the default thresholds,
/// agents judged by the test endpoint (`testing::serve_test_endpoint`).
pub async fn due_for_recovery(
    tx: &mut Tx<'_>,
    provider: Provider,
) -> Result<Vec<shepherd::bmdb::selectors::ProvidedMachine>, BmdbError> {
    shepherd::bmdb::selectors::needs_recovery(
        tx,
        provider,
        1000,
        shepherd::bmdb::selectors::RecoveryThresholds::default(),
        Some(shepherd_sim::testing::TEST_ENDPOINT),
    )
    .await
}

/// A test database with provided machines and a session.
pub struct Fleet {
    /// Dropping it drops the database: keep it bound.
    pub db: TestDb,
    pub bmdb: Bmdb,
    pub ids: Vec<Uuid>,
    pub session: Session,
}

/// `machines` Equinix machines and a session with the given interval.
pub async fn fleet(machines: usize, interval: Option<Duration>) -> Fleet {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let ids = provided_machines(&bmdb, Provider::Equinix, machines).await;
    let session = bmdb.start_session("test", interval).await.unwrap();
    Fleet {
        db,
        bmdb,
        ids,
        session,
    }
}

/// Leases `machine` for `process`, whatever its state; panics if it cannot.
pub async fn lease(session: &Session, process: Process, machine: Uuid) -> Work<()> {
    session
        .lease(process, pick(machine))
        .await
        .unwrap_or_else(|e| panic!("leasing {machine} for {process}: {e}"))
        .expect("pick always selects")
}
