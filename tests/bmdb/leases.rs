use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use shepherd::bmdb::machines;
use shepherd::bmdb::{Backoff, BmdbError, HistoryEvent, Process, Provider, Tx};
use shepherd::config::Isolation;
use shepherd_sim::testing::TestDb;
use uuid::Uuid;

use crate::{Fleet, count, eventually, fleet, lease, pick, provided_machines};

const SHEPHERD_PROCESSES: [Process; 3] = [
    Process::ShepherdAccess,
    Process::ShepherdAgentStart,
    Process::ShepherdRecovery,
];

/// A selector that picks a random machine of `ids`, leased or not, so that
/// leasers collide; counts its runs in `picks`.
fn random_machine(
    ids: Arc<Vec<Uuid>>,
    picks: Arc<AtomicU64>,
) -> impl AsyncFnMut(&mut Tx<'_>) -> Result<Option<(Uuid, ())>, BmdbError> {
    async move |_tx: &mut Tx<'_>| {
        picks.fetch_add(1, Ordering::Relaxed);
        let i = rand::rng().random_range(0..ids.len());
        Ok(Some((ids[i], ())))
    }
}

async fn hammer(isolation: Isolation) {
    let db = TestDb::new().await;
    let bmdb = db.bmdb_with(TestDb::options(isolation), 16).await;
    let ids = Arc::new(provided_machines(&bmdb, Provider::Equinix, 100).await);
    // Machines held right now, by anyone: checked at every lease.
    let held: Arc<Mutex<HashSet<Uuid>>> = Arc::default();
    let stats: Arc<Mutex<(u64, u64)>> = Arc::default(); // (leases, conflicts)
    let picks: Arc<AtomicU64> = Arc::default();

    let mut leasers = Vec::new();
    for n in 0..8 {
        let bmdb = bmdb.clone();
        let ids = ids.clone();
        let held = held.clone();
        let stats = stats.clone();
        let picks = picks.clone();
        leasers.push(actix_rt::spawn(async move {
            let session = bmdb
                .start_session(&format!("leaser-{n}"), None)
                .await
                .unwrap();
            for i in 0..150 {
                let process = SHEPHERD_PROCESSES[(n + i) % 3];
                match session
                    .lease(process, random_machine(ids.clone(), picks.clone()))
                    .await
                {
                    Ok(Some(mut work)) => {
                        let mid = work.machine_id();
                        assert!(
                            held.lock().unwrap().insert(mid),
                            "machine {mid} leased twice at once"
                        );
                        stats.lock().unwrap().0 += 1;
                        tokio::time::sleep(Duration::from_micros(rand::rng().random_range(0..500)))
                            .await;
                        held.lock().unwrap().remove(&mid);
                        match i % 3 {
                            0 => work.finish(async |_| Ok(())).await.unwrap(),
                            1 => {
                                work.fail(&Backoff::constant(Duration::from_secs(1)), "hammer")
                                    .await
                                    .unwrap();
                            }
                            _ => work.cancel().await.unwrap(),
                        }
                    }
                    Ok(None) => unreachable!("the selector always picks"),
                    Err(BmdbError::WorkConflict { .. }) => stats.lock().unwrap().1 += 1,
                    Err(e) => panic!("leaser {n}: {e}"),
                }
            }
            session.close().await.unwrap();
        }));
    }
    for l in leasers {
        l.await.unwrap();
    }
    let (leases, conflicts) = *stats.lock().unwrap();
    // Every pick beyond one per attempt was a collision with a held lease.
    let picks = picks.load(Ordering::Relaxed);
    assert!(
        picks > leases + conflicts,
        "the leasers never collided: the test proves nothing"
    );
    assert_eq!(leases + conflicts, 8 * 150);
    assert_eq!(
        count(&bmdb, "SELECT count(*) FROM work").await,
        0,
        "a lease was left behind"
    );
    assert_eq!(
        count(
            &bmdb,
            "SELECT count(*) FROM work_history WHERE event = 'Started'"
        )
        .await,
        leases as i64
    );
    assert_eq!(
        count(
            &bmdb,
            "SELECT count(*) FROM work_history WHERE event <> 'Started'"
        )
        .await,
        leases as i64
    );
}

#[actix_rt::test]
async fn concurrent_leasers_never_share_a_machine() {
    hammer(Isolation::ReadCommitted).await;
}

#[actix_rt::test]
async fn concurrent_leasers_never_share_a_machine_under_serializable_isolation() {
    hammer(Isolation::Serializable).await;
}

#[actix_rt::test]
async fn conflicting_processes_exclude_each_other_but_others_do_not() {
    let Fleet {
        db: _db,
        bmdb,
        ids,
        session: a,
    } = fleet(1, None).await;
    let b = bmdb.start_session("b", None).await.unwrap();
    let mut held = lease(&a, Process::ShepherdAgentStart, ids[0]).await;
    for p in SHEPHERD_PROCESSES {
        let r = b.lease(p, pick(ids[0])).await;
        assert!(
            matches!(r, Err(BmdbError::WorkConflict { machine_id, process }) if machine_id == ids[0] && process == p),
            "{p}: {r:?}"
        );
    }
    let mut other = lease(&b, Process::UnitTest1, ids[0]).await;
    let leases = bmdb
        .transact(async |tx| machines::leases(tx, ids[0]).await)
        .await
        .unwrap();
    assert_eq!(leases.len(), 2);
    other.cancel().await.unwrap();
    held.cancel().await.unwrap();
    // Released: b may take it now.
    let mut now_b = lease(&b, Process::ShepherdRecovery, ids[0]).await;
    now_b.finish(async |_| Ok(())).await.unwrap();
    assert_eq!(count(&bmdb, "SELECT count(*) FROM work").await, 0);
}

#[actix_rt::test]
async fn an_empty_selection_leases_nothing() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let s = bmdb.start_session("a", None).await.unwrap();
    let r = s
        .lease(Process::UnitTest1, async |_tx: &mut Tx<'_>| {
            Ok(None::<(Uuid, ())>)
        })
        .await
        .unwrap();
    assert!(r.is_none());
    assert_eq!(count(&bmdb, "SELECT count(*) FROM work_history").await, 0);
}

#[actix_rt::test]
async fn finish_writes_in_the_releasing_transaction_or_not_at_all() {
    let Fleet {
        db: _db,
        bmdb,
        ids,
        session: s,
    } = fleet(1, None).await;
    let mut work = lease(&s, Process::ShepherdAgentStart, ids[0]).await;
    let mid = work.machine_id();

    // f fails: nothing is written, the lease is still held.
    let r = work
        .finish(async |tx| {
            machines::set_agent_started(tx, mid, &[7u8; 32], None).await?;
            Err(BmdbError::Invalid("agent reply rejected".into()))
        })
        .await;
    assert!(matches!(r, Err(BmdbError::Invalid(_))));
    assert!(!work.is_ended());
    assert_eq!(
        count(&bmdb, "SELECT count(*) FROM machine_agent_started").await,
        0
    );
    assert_eq!(count(&bmdb, "SELECT count(*) FROM work").await, 1);

    // f succeeds: tag, release, backoff cleared and history in one go.
    work.fail(&Backoff::constant(Duration::from_secs(1)), "first try")
        .await
        .unwrap();
    let mut work = lease(&s, Process::ShepherdAgentStart, ids[0]).await;
    assert_eq!(count(&bmdb, "SELECT count(*) FROM work_backoff").await, 1);
    work.finish(async |tx| machines::set_agent_started(tx, mid, &[7u8; 32], None).await)
        .await
        .unwrap();
    assert_eq!(
        count(&bmdb, "SELECT count(*) FROM machine_agent_started").await,
        1
    );
    assert_eq!(count(&bmdb, "SELECT count(*) FROM work").await, 0);
    assert_eq!(count(&bmdb, "SELECT count(*) FROM work_backoff").await, 0);

    // Ending twice: the lease is gone.
    assert!(matches!(
        work.cancel().await,
        Err(BmdbError::LeaseLost { .. })
    ));
}

#[actix_rt::test]
async fn dropped_work_is_cancelled() {
    let Fleet {
        db: _db,
        bmdb,
        ids,
        session: s,
    } = fleet(1, None).await;
    let work = lease(&s, Process::ShepherdAgentStart, ids[0]).await;
    drop(work);
    eventually(
        "the dropped work to be cancelled",
        Duration::from_secs(5),
        async || (count(&bmdb, "SELECT count(*) FROM work").await == 0).then_some(()),
    )
    .await;
    let h = bmdb
        .transact(async |tx| machines::history(tx, ids[0]).await)
        .await
        .unwrap();
    assert_eq!(h.last().unwrap().event, HistoryEvent::Canceled);
    assert_eq!(
        h.last().unwrap().failed_cause.as_deref(),
        Some("work dropped")
    );
}
