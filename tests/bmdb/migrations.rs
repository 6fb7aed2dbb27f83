use shepherd::testing::TestDb;

use crate::count;

const TABLES: &str = "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public' AND table_name IN \
    ('machines', 'sessions', 'work', 'work_history', 'work_backoff', 'machine_provided', 'machine_agent_started', \
     'machine_agent_heartbeat', 'machine_hardware_report', 'machine_os_installation_request', \
     'machine_os_installation_report', 'machine_summary')";

#[actix_rt::test]
async fn a_fresh_database_is_migrated_and_rerunning_is_a_no_op() {
    let db = TestDb::new_unmigrated().await;
    let bmdb = db.bmdb().await;
    let first = bmdb.migrate().await.unwrap();
    assert_eq!(
        first.applied,
        vec![
            "V1__bmdb",
            "V2__machine_summary",
            "V3__machine_ssh_host_key"
        ]
    );
    assert_eq!(first.version, Some(3));
    assert_eq!(count(&bmdb, TABLES).await, 12);
    let again = bmdb.migrate().await.unwrap();
    assert!(again.applied.is_empty());
    assert_eq!(again.version, Some(3));
}

#[actix_rt::test]
async fn two_processes_migrating_at_once_do_not_collide() {
    let db = TestDb::new_unmigrated().await;
    let (a, b) = (db.bmdb().await, db.bmdb().await);
    let (ra, rb) = futures::join!(a.migrate(), b.migrate());
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let mut applied = [ra.applied.len(), rb.applied.len()];
    applied.sort();
    assert_eq!(
        applied,
        [0, 3],
        "one run applies every migration, the other none"
    );
    assert_eq!(count(&a, TABLES).await, 12);
    assert_eq!(
        count(&a, "SELECT count(*) FROM refinery_schema_history").await,
        3
    );
}

#[actix_rt::test]
async fn the_summary_is_backfilled_for_machines_that_predate_it() {
    use shepherd::bmdb::Provider;
    use shepherd::bmdb::selectors::{self, RecoveryThresholds};
    let db = TestDb::new_unmigrated().await;
    let bmdb = db.bmdb().await;
    assert_eq!(
        bmdb.migrate_to(Some(1)).await.unwrap().applied,
        vec!["V1__bmdb"]
    );
    let ids = crate::provided_machines(&bmdb, Provider::Equinix, 3).await;
    let (fresh, stale, backed_off) = (ids[0], ids[1], ids[2]);
    bmdb.transact(async |tx| {
        tx.execute("INSERT INTO machine_agent_started VALUES ($1, now() - interval '1 hour', '\\x01')", &[&stale]).await?;
        tx.execute("INSERT INTO machine_agent_heartbeat VALUES ($1, now() - interval '1 hour')", &[&stale]).await?;
        tx.execute("INSERT INTO work_backoff VALUES ($1, 'ShepherdAgentStart', now() + interval '1 hour', 'x', 1)", &[&backed_off]).await
    })
    .await
    .unwrap();
    assert_eq!(
        bmdb.migrate().await.unwrap().applied,
        vec!["V2__machine_summary", "V3__machine_ssh_host_key"]
    );
    let (start, recovery) = bmdb
        .transact(async |tx| {
            Ok((
                selectors::needs_agent_start(tx, Provider::Equinix, 10).await?,
                selectors::needs_recovery(tx, Provider::Equinix, 10, RecoveryThresholds::default())
                    .await?,
            ))
        })
        .await
        .unwrap();
    assert_eq!(
        start.iter().map(|m| m.machine_id).collect::<Vec<_>>(),
        vec![fresh]
    );
    assert_eq!(
        recovery.iter().map(|m| m.machine_id).collect::<Vec<_>>(),
        vec![stale]
    );
}
