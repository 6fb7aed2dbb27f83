//! The brake on power actions for silence (`bmdb::brake`).

use std::time::Duration;

use shepherd::bmdb::brake::{self, BrakeSettings, Judge};
use shepherd::bmdb::selectors::RecoveryThresholds;
use shepherd::bmdb::{Bmdb, Provider};
use shepherd_sim::testing::{TEST_ENDPOINT, TestDb};
use uuid::Uuid;

use crate::{count, provided_machines};

fn judge() -> Judge {
    Judge {
        provider: Provider::Equinix,
        thresholds: RecoveryThresholds::default(),
        own_endpoint: Some(TEST_ENDPOINT.into()),
        brake: BrakeSettings {
            max_silent: 3,
            max_silent_share: 0.1,
            window: Duration::from_secs(600),
        },
    }
}

/// `n` machines with agents on the test endpoint, the first `silent` of
/// them last heard from an hour ago, the rest now.
async fn agents(bmdb: &Bmdb, n: usize, silent: usize) -> Vec<Uuid> {
    shepherd_sim::testing::serve_test_endpoint(bmdb).await;
    let ids = provided_machines(bmdb, Provider::Equinix, n).await;
    for (i, id) in ids.iter().enumerate() {
        let ago = if i < silent { 3600.0 } else { 0.0 };
        bmdb.transact(async |tx| {
            tx.execute(
                "INSERT INTO machine_agent_started VALUES ($1, now() - interval '2 hours', '\\x01', $2)",
                &[id, &TEST_ENDPOINT],
            )
            .await?;
            tx.execute(
                "INSERT INTO machine_agent_heartbeat VALUES ($1, now() - make_interval(secs => $2))",
                &[id, &ago],
            )
            .await
        })
        .await
        .unwrap();
    }
    ids
}

async fn power(bmdb: &Bmdb, id: Uuid, requested: bool) -> Result<(), brake::BrakeState> {
    bmdb.transact(async |tx| brake::take_power_action(tx, &judge(), id, requested).await)
        .await
        .unwrap()
}

#[actix_rt::test]
async fn a_few_silent_machines_are_power_cycled_up_to_the_windows_budget() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let ids = agents(&bmdb, 20, 2).await;
    let st = bmdb
        .transact(async |tx| brake::state(tx, &judge()).await)
        .await
        .unwrap();
    assert_eq!(
        (st.silent, st.fleet, st.limit, st.engaged),
        (2, 20, 3, false)
    );
    for id in &ids[..3] {
        power(&bmdb, *id, false).await.expect("within the budget");
    }
    let refused = power(&bmdb, ids[3], false).await.unwrap_err();
    assert!(refused.engaged);
    assert!(
        refused
            .reason
            .as_deref()
            .unwrap()
            .contains("3 power actions for silence"),
        "{refused:?}"
    );
    // An operator's reboot is never braked.
    power(&bmdb, ids[4], true)
        .await
        .expect("operators are not braked");
    // An operator's release lets power actions for silence go ahead.
    let a = bmdb
        .transact(async |tx| {
            brake::release(
                tx,
                Uuid::new_v4(),
                "alice",
                Some("storm over"),
                Duration::from_secs(60),
            )
            .await
        })
        .await
        .unwrap();
    assert_eq!(a.actor, "alice");
    power(&bmdb, ids[5], false).await.expect("released");
    assert_eq!(
        count(&bmdb, "SELECT count(*) FROM recovery_power_action").await,
        5
    );
    assert_eq!(
        count(&bmdb, "SELECT count(*) FROM operator_action WHERE action = 'release-brake' AND machine_id IS NULL").await,
        1
    );
}

#[actix_rt::test]
async fn mass_silence_engages_the_brake_at_once_and_it_lets_go_when_agents_return() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let ids = agents(&bmdb, 40, 30).await;
    let (st, changed) = bmdb
        .transact(async |tx| brake::watch(tx, &judge()).await)
        .await
        .unwrap();
    assert!(st.engaged && changed, "{st:?}");
    assert_eq!((st.silent, st.limit), (30, 4));
    assert!(
        st.reason
            .as_deref()
            .unwrap()
            .contains("30 of 40 machines are silent")
    );
    assert!(
        power(&bmdb, ids[0], false).await.is_err(),
        "no power action"
    );
    assert_eq!(
        count(&bmdb, "SELECT count(*) FROM recovery_power_action").await,
        0
    );
    // The agents come back (a partition healed): the brake lets go.
    bmdb.transact(async |tx| {
        tx.execute(
            "UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now()",
            &[],
        )
        .await
    })
    .await
    .unwrap();
    let (st, changed) = bmdb
        .transact(async |tx| brake::watch(tx, &judge()).await)
        .await
        .unwrap();
    assert!(!st.engaged && changed, "{st:?}");
    assert_eq!(
        count(
            &bmdb,
            "SELECT count(*) FROM recovery_brake WHERE engaged_since IS NULL"
        )
        .await,
        1
    );
}

#[actix_rt::test]
async fn a_machine_whose_recovery_keeps_failing_shows_as_such() {
    use shepherd::bmdb::machines::{self, FleetFilter, MachineState};
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let ids = agents(&bmdb, 2, 2).await;
    bmdb.transact(async |tx| {
        tx.execute(
            "INSERT INTO work_backoff VALUES ($1, 'ShepherdRecovery', now() + interval '1 hour', 'reboot: no BMC', 60)",
            &[&ids[0]],
        )
        .await
    })
    .await
    .unwrap();
    let (counts, page) = bmdb
        .transact(async |tx| {
            let filter = FleetFilter {
                state: Some(MachineState::RecoveryBackoff),
                ..Default::default()
            };
            Ok((
                machines::fleet_counts(tx).await?,
                machines::fleet_page(tx, &filter, 10, 0).await?,
            ))
        })
        .await
        .unwrap();
    let n = |s: MachineState| {
        counts
            .iter()
            .find(|(c, _)| *c == s)
            .map(|(_, n)| *n)
            .unwrap_or(0)
    };
    assert_eq!(n(MachineState::RecoveryBackoff), 1);
    assert_eq!(n(MachineState::AgentStarted), 1);
    assert_eq!(
        page.0.iter().map(|m| m.machine_id).collect::<Vec<_>>(),
        vec![ids[0]]
    );
    assert_eq!(
        MachineState::parse("recovery-backoff"),
        Some(MachineState::RecoveryBackoff)
    );
}
