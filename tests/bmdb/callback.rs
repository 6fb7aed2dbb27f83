//! Silence is judged only while someone was listening: the callback
//! endpoints' service (`bmdb::callback`) as the recovery selector reads it.

use std::time::Duration;

use shepherd::bmdb::selectors::{self, RecoveryThresholds};
use shepherd::bmdb::{Bmdb, Provider, callback};
use shepherd_sim::testing::{TestDb, served_since};
use uuid::Uuid;

use crate::{count, provided_machines};

/// Agents started an hour ago, last heard from an hour ago, given
/// `endpoint` (None: not recorded).
async fn stale_agents(bmdb: &Bmdb, n: usize, endpoint: Option<&str>) -> Vec<Uuid> {
    let ids = provided_machines(bmdb, Provider::Equinix, n).await;
    for id in &ids {
        bmdb.transact(async |tx| {
            tx.execute(
                "INSERT INTO machine_agent_started VALUES ($1, now() - interval '1 hour', '\\x01', $2)",
                &[id, &endpoint],
            )
            .await?;
            tx.execute(
                "INSERT INTO machine_agent_heartbeat VALUES ($1, now() - interval '1 hour')",
                &[id],
            )
            .await
        })
        .await
        .unwrap();
    }
    ids
}

async fn due(bmdb: &Bmdb, own: Option<&str>) -> usize {
    bmdb.transact(async |tx| {
        selectors::needs_recovery(
            tx,
            Provider::Equinix,
            100,
            RecoveryThresholds::default(),
            own,
        )
        .await
    })
    .await
    .unwrap()
    .len()
}

#[actix_rt::test]
async fn an_agent_is_silent_only_if_its_endpoint_was_served_for_the_threshold() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    stale_agents(&bmdb, 2, Some("a.test:7830")).await;
    assert_eq!(due(&bmdb, None).await, 0, "nobody ever served a.test");
    // Served for 5 minutes: less than the 10 minutes' threshold plus grace.
    served_since(&bmdb, "a.test:7830", Duration::from_secs(300)).await;
    assert_eq!(
        due(&bmdb, None).await,
        0,
        "served for less than the threshold"
    );
    served_since(&bmdb, "a.test:7830", Duration::from_secs(10 * 60 + 30)).await;
    assert_eq!(due(&bmdb, None).await, 0, "threshold passed, grace not");
    served_since(&bmdb, "a.test:7830", Duration::from_secs(3600)).await;
    assert_eq!(due(&bmdb, None).await, 2, "served the whole time: silent");

    // Another endpoint served all along does not make these judgeable.
    served_since(&bmdb, "b.test:7830", Duration::from_secs(86400)).await;
    bmdb.transact(async |tx| {
        tx.execute(
            "UPDATE callback_endpoint SET served_until = now() - interval '1 second' WHERE endpoint = 'a.test:7830'",
            &[],
        )
        .await
    })
    .await
    .unwrap();
    assert_eq!(due(&bmdb, None).await, 0, "a.test lapsed");
    // Served again: its unbroken stretch starts now.
    bmdb.transact(async |tx| callback::serve(tx, "a.test:7830", Duration::from_secs(10)).await)
        .await
        .unwrap();
    assert_eq!(due(&bmdb, None).await, 0, "the clock restarted");
    assert_eq!(
        count(
            &bmdb,
            "SELECT count(*) FROM callback_endpoint WHERE endpoint = 'a.test:7830' AND serving_since > now() - interval '5 seconds'"
        )
        .await,
        1
    );
}

#[actix_rt::test]
async fn agents_with_no_recorded_endpoint_are_judged_by_the_judges_own() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    stale_agents(&bmdb, 3, None).await;
    served_since(&bmdb, "own.test:7830", Duration::from_secs(86400)).await;
    assert_eq!(due(&bmdb, None).await, 0, "no endpoint to judge by");
    assert_eq!(due(&bmdb, Some("other.test:7830")).await, 0);
    assert_eq!(due(&bmdb, Some("own.test:7830")).await, 3);
}

#[actix_rt::test]
async fn a_serving_session_keeps_its_endpoint_served_without_a_break() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let endpoint = "cb.test:7830".to_string();
    let a = bmdb
        .start_session_serving("a", Some(Duration::from_secs(1)), Some(endpoint.clone()))
        .await
        .unwrap();
    let since = async || -> f64 {
        bmdb.transact(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT extract(epoch FROM now() - serving_since)::float8 FROM callback_endpoint WHERE endpoint = $1",
                    &[&endpoint],
                )
                .await?
                .get::<_, f64>(0))
        })
        .await
        .unwrap()
    };
    // A second shepherd takes over serving, the first dies: no break.
    let b = bmdb
        .start_session_serving("b", Some(Duration::from_secs(1)), Some(endpoint.clone()))
        .await
        .unwrap();
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        b.poke().await.unwrap();
    }
    drop(a);
    assert!(since().await >= 2.0, "served since a's start");
    // Everyone gone for longer than the interval: the clock starts again.
    drop(b);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let c = bmdb
        .start_session_serving("c", Some(Duration::from_secs(1)), Some(endpoint.clone()))
        .await
        .unwrap();
    assert!(since().await < 1.0, "a break restarts the stretch");
    c.close().await.unwrap();
}
