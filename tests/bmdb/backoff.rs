use std::time::{Duration, SystemTime};

use shepherd::bmdb::machines::{self, BackoffState};
use shepherd::bmdb::{Backoff, Bmdb, Process, Provider, Session};
use shepherd_sim::testing::TestDb;
use uuid::Uuid;

use crate::{Fleet, fleet, lease, provided_machines};

async fn fail_once(s: &Session, mid: Uuid, b: &Backoff) -> BackoffState {
    let mut w = lease(s, Process::ShepherdAgentStart, mid).await;
    w.fail(b, "it broke").await.unwrap();
    state(s.bmdb(), mid).await.expect("a backoff row")
}

async fn state(bmdb: &Bmdb, mid: Uuid) -> Option<BackoffState> {
    bmdb.transact(async |tx| machines::backoff(tx, mid, Process::ShepherdAgentStart).await)
        .await
        .unwrap()
}

async fn intervals(s: &Session, mid: Uuid, b: &Backoff, n: usize) -> Vec<i64> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(fail_once(s, mid, b).await.last_interval_seconds.unwrap());
    }
    out
}

#[actix_rt::test]
async fn the_contract_sequence_is_persisted() {
    let Fleet {
        db: _db,
        bmdb,
        ids,
        session: s,
    } = fleet(1, None).await;
    let b = Backoff {
        initial: Duration::from_secs(1),
        maximum: None,
        exponent: 1.1,
        jitter: 0.0,
    };
    assert_eq!(
        intervals(&s, ids[0], &b, 14).await,
        vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17]
    );
    // `until` is now + the interval, by the database's clock.
    let st = state(&bmdb, ids[0]).await.unwrap();
    let ahead = st
        .until
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    assert!(
        ahead > Duration::from_secs(14) && ahead <= Duration::from_secs(18),
        "{ahead:?}"
    );
    assert_eq!(st.cause, "it broke");
}

#[actix_rt::test]
async fn maximum_caps_and_constant_stays_constant() {
    let Fleet {
        db: _db,
        bmdb: _,
        ids,
        session: s,
    } = fleet(2, None).await;
    let capped = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(10), 2.0);
    assert_eq!(
        intervals(&s, ids[0], &capped, 7).await,
        vec![1, 2, 4, 8, 10, 10, 10]
    );
    let constant = Backoff::constant(Duration::from_secs(5));
    assert_eq!(intervals(&s, ids[1], &constant, 3).await, vec![5, 5, 5]);
}

#[actix_rt::test]
async fn huge_exponents_do_not_overflow() {
    let Fleet {
        db: _db,
        bmdb,
        ids,
        session: s,
    } = fleet(1, None).await;
    let b = Backoff {
        initial: Duration::from_secs(1),
        maximum: None,
        exponent: f64::MAX,
        jitter: 0.0,
    };
    let seq = intervals(&s, ids[0], &b, 4).await;
    assert_eq!(seq[0], 1);
    assert!(
        seq[1..]
            .iter()
            .all(|&i| i == shepherd::bmdb::BACKOFF_CEILING_SECONDS),
        "{seq:?}"
    );
    let st = state(&bmdb, ids[0]).await.unwrap();
    assert!(st.until > SystemTime::now() + Duration::from_secs(365 * 24 * 3600));
}

#[actix_rt::test]
async fn the_interval_survives_a_restart_and_finish_clears_it() {
    let db = TestDb::new().await;
    let b = Backoff {
        initial: Duration::from_secs(1),
        maximum: None,
        exponent: 2.0,
        jitter: 0.0,
    };
    let mid = {
        let bmdb = db.bmdb().await;
        let ids = provided_machines(&bmdb, Provider::Equinix, 1).await;
        let s = bmdb.start_session("before", None).await.unwrap();
        assert_eq!(intervals(&s, ids[0], &b, 3).await, vec![1, 2, 4]);
        s.close().await.unwrap();
        ids[0]
    }; // pool and session gone: a process restart, as far as the BMDB knows.
    let bmdb = db.bmdb().await;
    let s = bmdb.start_session("after", None).await.unwrap();
    assert_eq!(intervals(&s, mid, &b, 2).await, vec![8, 16]);
    let mut w = lease(&s, Process::ShepherdAgentStart, mid).await;
    w.finish(async |_| Ok(())).await.unwrap();
    assert!(state(&bmdb, mid).await.is_none());
    assert_eq!(intervals(&s, mid, &b, 1).await, vec![1]);
}

#[actix_rt::test]
async fn jitter_lengthens_the_wait_not_the_interval() {
    let Fleet {
        db: _db,
        bmdb: _,
        ids,
        session: s,
    } = fleet(1, None).await;
    let b = Backoff::constant(Duration::from_secs(100)).with_jitter(0.5);
    let st = fail_once(&s, ids[0], &b).await;
    assert_eq!(st.last_interval_seconds, Some(100));
    let ahead = st.until.duration_since(SystemTime::now()).unwrap();
    assert!(
        ahead > Duration::from_secs(98) && ahead < Duration::from_secs(151),
        "{ahead:?}"
    );
}
