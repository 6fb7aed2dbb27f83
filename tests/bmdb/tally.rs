//! The fleet's kept states and tally (`migrations/V24__fleet_tally.sql`):
//! a backoff that runs out with no row written shows at once in the
//! listing and the counts, before and after a settle; two shepherds
//! settling at once fold each delta once; the agents per provider and per
//! callback endpoint (`V26__tally_agents.sql`) follow every change.

use std::time::Duration;

use shepherd::bmdb::machines::{self, FleetFilter, MachineState, Matching};
use shepherd::bmdb::{Bmdb, Provider};
use shepherd_sim::testing::TestDb;

async fn listed(bmdb: &Bmdb, state: MachineState) -> (Vec<uuid::Uuid>, Matching) {
    let filter = FleetFilter {
        state: Some(state),
        ..Default::default()
    };
    let (page, matching) = bmdb
        .transact(async |tx| machines::fleet_page(tx, &filter, 100, 0).await)
        .await
        .unwrap();
    (page.iter().map(|m| m.machine_id).collect(), matching)
}

#[actix_rt::test]
async fn a_backoff_that_runs_out_shows_before_and_after_it_is_settled() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let ids = crate::provided_machines(&bmdb, Provider::Equinix, 5).await;
    // Two in a backoff of a second, one of an hour.
    for (id, secs) in [(ids[0], 1.0f64), (ids[1], 1.0), (ids[2], 3600.0)] {
        bmdb.transact(async |tx| {
            tx.execute(
                "INSERT INTO work_backoff VALUES ($1, 'ShepherdAgentStart', \
                 now() + make_interval(secs => $2), 'test', 1)",
                &[&id, &secs],
            )
            .await
        })
        .await
        .unwrap();
    }
    let (backoff, n) = listed(&bmdb, MachineState::Backoff).await;
    assert_eq!(backoff.len(), 3);
    assert_eq!(n, Matching::exact(3));
    assert_eq!(
        listed(&bmdb, MachineState::Pending).await.1,
        Matching::exact(2)
    );

    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Not settled yet: the kept state is stale, what is read is not.
    let (pending, n) = listed(&bmdb, MachineState::Pending).await;
    assert_eq!(n, Matching::exact(4));
    for id in [ids[0], ids[1]] {
        assert!(pending.contains(&id), "{id} listed as pending");
    }
    assert_eq!(listed(&bmdb, MachineState::Backoff).await.0, vec![ids[2]]);
    let tally = bmdb
        .transact(async |tx| machines::tally(tx).await)
        .await
        .unwrap();
    assert_eq!(
        tally.states,
        vec![(MachineState::Pending, 4), (MachineState::Backoff, 1)]
    );

    // Settled: the same, now from the kept rows.
    let s = bmdb
        .transact(async |tx| machines::settle(tx).await)
        .await
        .unwrap();
    assert_eq!(s.states, 2, "{s:?}");
    let stale: i64 = crate::count(
        &bmdb,
        "SELECT count(*) FROM machine_summary WHERE state_until <= now()",
    )
    .await;
    assert_eq!(stale, 0);
    assert_eq!(
        listed(&bmdb, MachineState::Pending).await.1,
        Matching::exact(4)
    );
    let again = bmdb
        .transact(async |tx| machines::tally(tx).await)
        .await
        .unwrap();
    assert_eq!(again, tally);
}

#[actix_rt::test]
async fn two_settling_at_once_fold_each_delta_once() {
    let db = TestDb::new().await;
    let (a, b) = (db.bmdb().await, db.bmdb().await);
    crate::provided_machines(&a, Provider::Equinix, 40).await;
    let (ra, rb) = futures::join!(
        a.transact(async |tx| machines::settle(tx).await),
        b.transact(async |tx| machines::settle(tx).await),
    );
    let folded = ra.unwrap().folded + rb.unwrap().folded;
    assert!(folded > 0);
    let tally = a
        .transact(async |tx| machines::tally(tx).await)
        .await
        .unwrap();
    assert_eq!(tally.states, vec![(MachineState::Pending, 40)]);
    let delta: i64 = crate::count(&a, "SELECT count(*) FROM machine_tally_delta").await;
    // Whoever did not fold leaves its deltas for the next round; none is
    // counted twice either way.
    let kept: i64 = crate::count(
        &a,
        "SELECT coalesce(sum(n), 0)::bigint FROM machine_tally WHERE key = 'pending'",
    )
    .await;
    let pending: i64 = crate::count(
        &a,
        "SELECT coalesce(sum(n), 0)::bigint FROM machine_tally_delta WHERE key = 'pending'",
    )
    .await;
    assert_eq!(kept + pending, 40, "{delta} deltas left");
}

#[actix_rt::test]
async fn a_filter_beyond_the_state_counts_up_to_its_cap() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    crate::provided_machines(&bmdb, Provider::Equinix, 3).await;
    let filter = FleetFilter {
        search: Some("127.0.0.".into()),
        ..Default::default()
    };
    let (page, matching) = bmdb
        .transact(async |tx| machines::fleet_page(tx, &filter, 2, 0).await)
        .await
        .unwrap();
    assert_eq!(page.len(), 2);
    assert_eq!(matching, Matching::exact(3));
    assert_eq!(
        Matching {
            count: 10_000,
            more: true
        }
        .to_string(),
        "more than 10000"
    );
}

/// What the brake and the callback endpoints read from the tally
/// (migration V26) against a count of the rows themselves.
async fn agents_as_counted(bmdb: &Bmdb) -> (i64, Vec<(String, i64)>) {
    let fleet = crate::count(
        bmdb,
        "SELECT count(*) FROM machine_summary \
         WHERE provider = 'Equinix' AND agent_started_at IS NOT NULL AND NOT held",
    )
    .await;
    let rows = bmdb
        .transact(async |tx| {
            tx.query(
                "SELECT c.endpoint, count(a.machine_id) FROM callback_endpoint c \
                 LEFT JOIN machine_agent_started a ON a.agent_endpoint = c.endpoint \
                 GROUP BY c.endpoint ORDER BY c.endpoint",
                &[],
            )
            .await
        })
        .await
        .unwrap();
    (fleet, rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

async fn agents_as_tallied(bmdb: &Bmdb) -> (i64, Vec<(String, i64)>) {
    bmdb.transact(async |tx| {
        let judge = shepherd::bmdb::brake::Judge {
            provider: Provider::Equinix,
            thresholds: Default::default(),
            own_endpoint: None,
            brake: Default::default(),
        };
        let brake = shepherd::bmdb::brake::state(tx, &judge).await?;
        let endpoints = shepherd::bmdb::callback::endpoints(tx).await?;
        Ok((
            brake.fleet,
            endpoints
                .into_iter()
                .map(|e| (e.endpoint, e.agents))
                .collect(),
        ))
    })
    .await
    .unwrap()
}

#[actix_rt::test]
async fn agents_per_provider_and_endpoint_are_tallied_through_every_change() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let ids = crate::provided_machines(&bmdb, Provider::Equinix, 6).await;
    let exec = async |sql: &'static str, id: uuid::Uuid| {
        bmdb.transact(async |tx| tx.execute(sql, &[&id]).await)
            .await
            .unwrap();
    };
    bmdb.transact(async |tx| {
        for e in ["a.test:7830", "b.test:7830"] {
            shepherd::bmdb::callback::serve(tx, e, Duration::from_secs(60)).await?;
        }
        for (i, id) in ids.iter().enumerate() {
            let endpoint = ["a.test:7830", "b.test:7830"][i % 2];
            machines::set_agent_started(tx, *id, b"key", Some(endpoint)).await?;
        }
        Ok(())
    })
    .await
    .unwrap();
    let want = |fleet, a, b| {
        (
            fleet,
            vec![
                ("a.test:7830".to_string(), a),
                ("b.test:7830".to_string(), b),
            ],
        )
    };
    assert_eq!(agents_as_counted(&bmdb).await, want(6, 3, 3));
    assert_eq!(agents_as_tallied(&bmdb).await, want(6, 3, 3));

    // Held: out of the brake's fleet, still its endpoint's agent.
    exec(
        "INSERT INTO machine_hold (machine_id, held_at, held_by) VALUES ($1, now(), 'test')",
        ids[0],
    )
    .await;
    // Moved to the other endpoint; an agent gone; a machine gone.
    exec(
        "UPDATE machine_agent_started SET agent_endpoint = 'b.test:7830' WHERE machine_id = $1",
        ids[2],
    )
    .await;
    exec(
        "DELETE FROM machine_agent_started WHERE machine_id = $1",
        ids[3],
    )
    .await;
    exec("DELETE FROM machines WHERE machine_id = $1", ids[5]).await;
    assert_eq!(agents_as_counted(&bmdb).await, want(3, 2, 2));
    assert_eq!(agents_as_tallied(&bmdb).await, want(3, 2, 2));

    // Folded, then released: the same through the kept tally.
    bmdb.transact(async |tx| machines::settle(tx).await)
        .await
        .unwrap();
    exec("DELETE FROM machine_hold WHERE machine_id = $1", ids[0]).await;
    assert_eq!(agents_as_counted(&bmdb).await, want(4, 2, 2));
    assert_eq!(agents_as_tallied(&bmdb).await, want(4, 2, 2));
}
