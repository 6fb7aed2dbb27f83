use std::time::Duration;

use actix::prelude::*;
use shepherd::bmdb::machines;
use shepherd::bmdb::{
    BmdbError, BmdbSession, CloseSession, GetSession, HistoryEvent, Process, Provider,
    SessionEndReason, SessionEnded, Subscribe,
};
use shepherd_sim::testing::TestDb;
use tokio::sync::mpsc;

use crate::{Fleet, count, eventually, fleet, lease, pick, provided_machines};

/// Forwards SessionEnded to a channel.
struct Listener(mpsc::UnboundedSender<SessionEnded>);
impl Actor for Listener {
    type Context = Context<Self>;
}
impl Handler<SessionEnded> for Listener {
    type Result = ();
    fn handle(&mut self, msg: SessionEnded, _: &mut Context<Self>) {
        let _ = self.0.send(msg);
    }
}

/// A session with a 1 s interval, its actor, and what the actor reports.
async fn watched_session(
    bmdb: &shepherd::bmdb::Bmdb,
) -> (
    shepherd::bmdb::Session,
    Addr<BmdbSession>,
    mpsc::UnboundedReceiver<SessionEnded>,
) {
    let session = bmdb
        .start_session("test", Some(Duration::from_secs(1)))
        .await
        .unwrap();
    let addr = BmdbSession::new(session.clone()).start();
    let (tx, rx) = mpsc::unbounded_channel();
    addr.send(Subscribe(Listener(tx).start().recipient()))
        .await
        .unwrap();
    (session, addr, rx)
}

#[actix_rt::test]
async fn an_expired_session_can_do_nothing_and_its_work_is_released() {
    let Fleet {
        db: _db,
        bmdb,
        ids,
        session,
    } = fleet(2, Some(Duration::from_secs(1))).await;
    let mut work = session
        .lease(Process::ShepherdAgentStart, pick(ids[0]))
        .await
        .unwrap()
        .expect("leased");
    assert_eq!(count(&bmdb, "SELECT count(*) FROM work").await, 1);

    // Nobody pokes it: wait for the deadline to pass, by the database's clock.
    let sid = session.id();
    eventually(
        "the session deadline to pass",
        Duration::from_secs(10),
        async || {
            let past: bool = bmdb
                .transact(async |tx| {
                    Ok(tx
                        .query_one(
                            "SELECT session_deadline < now() FROM sessions WHERE session_id = $1",
                            &[&sid],
                        )
                        .await?
                        .get(0))
                })
                .await
                .unwrap();
            past.then_some(())
        },
    )
    .await;

    let r = session
        .transact(async |tx| tx.execute("SELECT 1", &[]).await)
        .await;
    assert!(
        matches!(r, Err(BmdbError::SessionExpired(id)) if id == sid),
        "{r:?}"
    );
    assert!(session.is_expired());
    assert!(matches!(
        session
            .lease(Process::ShepherdAgentStart, pick(ids[1]))
            .await,
        Err(BmdbError::SessionExpired(_))
    ));
    assert!(matches!(
        work.finish(async |_| Ok(())).await,
        Err(BmdbError::SessionExpired(_))
    ));
    assert!(matches!(
        work.cancel().await,
        Err(BmdbError::SessionExpired(_))
    ));

    // A fresh session bypasses the expired check at the database level too
    // (not only the local flag): poke says expired.
    assert!(matches!(
        session.poke().await,
        Err(BmdbError::SessionExpired(_))
    ));

    // Garbage collection (grace 0 here) releases the work and says so.
    let released = bmdb.collect_expired_sessions(Duration::ZERO).await.unwrap();
    assert_eq!(released, 1);
    assert_eq!(count(&bmdb, "SELECT count(*) FROM work").await, 0);
    assert_eq!(count(&bmdb, "SELECT count(*) FROM sessions").await, 0);
    let history = bmdb
        .transact(async |tx| machines::history(tx, ids[0]).await)
        .await
        .unwrap();
    let events: Vec<_> = history
        .iter()
        .map(|h| (h.event, h.failed_cause.as_deref()))
        .collect();
    assert_eq!(
        events,
        vec![
            (HistoryEvent::Started, None),
            (HistoryEvent::Canceled, Some("session expired"))
        ]
    );

    // The machine is free for a new session.
    let fresh = bmdb.start_session("test", None).await.unwrap();
    let mut again = lease(&fresh, Process::ShepherdAgentStart, ids[0]).await;
    again.cancel().await.unwrap();
    drop(work);
}

#[actix_rt::test]
async fn garbage_collection_respects_the_grace_period() {
    let Fleet {
        db: _db,
        bmdb,
        ids,
        session,
    } = fleet(1, Some(Duration::from_secs(1))).await;
    let mut work = lease(&session, Process::UnitTest1, ids[0]).await;
    let sid = session.id();
    bmdb.transact(async |tx| {
        tx.execute("UPDATE sessions SET session_deadline = now() - interval '30 seconds' WHERE session_id = $1", &[&sid])
            .await
    })
    .await
    .unwrap();
    assert_eq!(
        bmdb.collect_expired_sessions(Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    assert_eq!(count(&bmdb, "SELECT count(*) FROM work").await, 1);
    assert_eq!(
        bmdb.collect_expired_sessions(Duration::from_secs(10))
            .await
            .unwrap(),
        1
    );
    assert_eq!(count(&bmdb, "SELECT count(*) FROM work").await, 0);
    assert!(matches!(
        work.cancel().await,
        Err(BmdbError::SessionExpired(_))
    ));
}

#[actix_rt::test]
async fn the_session_actor_keeps_its_session_alive_and_reports_its_death() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let (session, addr, mut rx) = watched_session(&bmdb).await;

    // Several intervals pass: the heartbeat keeps it alive.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    session
        .transact(async |tx| tx.execute("SELECT 1", &[]).await)
        .await
        .unwrap();
    assert!(rx.try_recv().is_err());

    // Someone else declares it dead: the next poke notices, subscribers hear.
    let sid = session.id();
    bmdb.transact(async |tx| {
        tx.execute("UPDATE sessions SET session_deadline = now() - interval '1 second' WHERE session_id = $1", &[&sid])
            .await
    })
    .await
    .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ended.session_id, sid);
    assert_eq!(ended.reason, SessionEndReason::Expired);
    assert!(session.is_expired());
    eventually(
        "the session actor to stop",
        Duration::from_secs(5),
        async || (!addr.connected()).then_some(()),
    )
    .await;
}

#[actix_rt::test]
async fn an_orderly_close_deletes_the_session_and_releases_its_work() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let ids = provided_machines(&bmdb, Provider::Equinix, 1).await;
    let addr = BmdbSession::open(&bmdb, "test").await.unwrap();
    let session = addr.send(GetSession).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    addr.send(Subscribe(Listener(tx).start().recipient()))
        .await
        .unwrap();
    let _work = lease(&session, Process::ShepherdAccess, ids[0]).await;
    assert_eq!(count(&bmdb, "SELECT count(*) FROM sessions").await, 1);
    addr.send(CloseSession).await.unwrap().unwrap();
    assert_eq!(count(&bmdb, "SELECT count(*) FROM sessions").await, 0);
    assert_eq!(count(&bmdb, "SELECT count(*) FROM work").await, 0);
    let ended = rx.recv().await.unwrap();
    assert_eq!(ended.reason, SessionEndReason::Closed);
}

#[actix_rt::test]
async fn the_session_actor_reports_an_unreachable_database_after_the_deadline() {
    let db = TestDb::new().await;
    let bmdb = db
        .bmdb_with(
            TestDb::options(shepherd::config::Isolation::ReadCommitted),
            2,
        )
        .await;
    let (session, _addr, mut rx) = watched_session(&bmdb).await;
    // Cut this session's pool off from the database.
    let admin = db.bmdb().await;
    let name = db.name().to_string();
    admin
        .transact(async |tx| {
            tx.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = $1 AND application_name = 'shepherd' AND pid <> pg_backend_pid()",
                &[&name],
            )
            .await?;
            // New connections to this database are refused from now on.
            tx.execute(
                "UPDATE pg_database SET datallowconn = false WHERE datname = $1",
                &[&name],
            )
            .await
        })
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(ended.reason, SessionEndReason::Unreachable(_)),
        "{:?}",
        ended.reason
    );
    assert!(session.is_expired());
    let name = db.name().to_string();
    admin
        .transact(async |tx| {
            tx.execute(
                "UPDATE pg_database SET datallowconn = true WHERE datname = $1",
                &[&name],
            )
            .await
        })
        .await
        .ok();
}

/// A transaction cancelled midway (its actor stopped, a timeout) must not
/// leave its locks behind in an idle pooled connection: closing the session
/// (which waits for every KEY SHARE lock on its row) finishes at once.
#[actix_rt::test]
async fn a_cancelled_transaction_leaves_no_lock_behind() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let session = bmdb
        .start_session("cancel-test", Some(Duration::from_secs(30)))
        .await
        .unwrap();
    // Two idle connections in the pool, so that the one left behind is not
    // simply the next one handed out.
    let slow = async || {
        bmdb.transact(async |tx| tx.execute("SELECT pg_sleep(0.1)", &[]).await)
            .await
    };
    let (a, b) = futures::join!(slow(), slow());
    a.unwrap();
    b.unwrap();
    // Checks the session (KEY SHARE on its row), then never finishes.
    let stuck = session.transact(async |tx| {
        tx.query("SELECT 1", &[]).await?;
        futures::future::pending::<()>().await;
        Ok(())
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stuck)
            .await
            .is_err()
    );
    let closed = tokio::time::timeout(Duration::from_secs(10), session.close()).await;
    assert!(
        matches!(closed, Ok(Ok(()))),
        "closing the session waited on a cancelled transaction's lock: {closed:?}"
    );
    assert_eq!(count(&bmdb, "SELECT count(*) FROM sessions").await, 0);
}

/// Fleet work holding every connection of the pool (a thousand agents
/// reporting at once) costs the session nothing: it starts and is kept
/// alive over a connection of its own.
#[actix_rt::test]
async fn a_session_outlives_a_pool_held_whole_for_several_intervals() {
    let db = TestDb::new().await;
    // One connection, taken before the session starts and held for three
    // of its intervals.
    let bmdb = crate::pools::one_connection(&db).await;
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let bmdb = bmdb.clone();
        actix_rt::spawn(async move {
            let mut held = Some(held_tx);
            bmdb.transact(async |tx| {
                tx.query_one("SELECT 1", &[]).await?;
                if let Some(h) = held.take() {
                    let _ = h.send(());
                }
                tx.query_one("SELECT pg_sleep(3.5)", &[]).await?;
                Ok(())
            })
            .await
        })
    };
    held_rx.await.unwrap();
    let (session, _addr, mut rx) = watched_session(&bmdb).await;
    // The pool is still held: work waits for it, and fails naming it.
    let err = bmdb.ping().await.unwrap_err().to_string();
    assert!(err.contains("all 1 in use"), "{err}");
    holder.await.unwrap().unwrap();
    assert!(
        rx.try_recv().is_err(),
        "the session ended while the pool was held"
    );
    assert!(!session.is_expired());
    // Its deadline in the database is ahead: the pokes landed.
    let alive: bool = session
        .transact(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT session_deadline > now() FROM sessions WHERE session_id = $1",
                    &[&session.id()],
                )
                .await?
                .get(0))
        })
        .await
        .unwrap();
    assert!(alive);
}

/// The session is kept on a thread of its own: the process's main loop
/// (where the fleet's work runs) held up past the session's deadline does
/// not cost it; a main loop that stays stuck for an interval lets it go,
/// so a stuck process holds no lease.
#[actix_rt::test]
async fn a_busy_main_loop_keeps_its_session_and_a_stuck_one_lets_it_go() {
    let db = TestDb::new().await;
    let mut options = TestDb::options(shepherd::config::Isolation::ReadCommitted);
    options.session_interval = Duration::from_secs(3);
    let bmdb = db.bmdb_with(options, 4).await;
    let addr = BmdbSession::open(&bmdb, "test").await.unwrap();
    let session = addr.send(GetSession).await.unwrap();
    // Held up for 2.8 s, three times: nearly an interval each time, so a
    // heartbeat sent from this thread would land past its deadline.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(2800));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(!session.is_expired(), "a busy main loop cost the session");
    let alive = "SELECT count(*) FROM sessions WHERE session_deadline > now()";
    assert_eq!(count(&bmdb, alive).await, 1);
    // Stuck for two intervals: the session is let go.
    std::thread::sleep(Duration::from_secs(7));
    assert!(session.is_expired(), "a stuck main loop kept its session");
    assert_eq!(count(&bmdb, alive).await, 0);
}
