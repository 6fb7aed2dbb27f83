use shepherd_sim::testing::TestDb;

use crate::count;

const TABLES: &str = "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public' AND table_name IN \
    ('machines', 'sessions', 'work', 'work_history', 'work_backoff', 'machine_provided', 'machine_agent_started', \
     'machine_agent_heartbeat', 'machine_hardware_report', 'machine_os_installation_request', \
     'machine_os_installation_report', 'machine_summary', 'machine_bmc_facts', 'fleet_duty', 'machine_hold', \
     'machine_reboot_request', 'operator_action', 'callback_ca', 'callback_endpoint', \
     'recovery_power_action', 'recovery_brake', 'machine_installation', \
     'machine_installation_progress', 'installation_history', 'rollout', 'rollout_machine', \
     'machine_boot_credential', 'machine_bmc_boot', 'machine_boot_request', 'machine_boot_mac', 'netboot_lease', 'machine_discovered', 'machine_accepted_bmc', \
     'machine_hardware_accepted', 'project', 'machine_project', 'api_token', 'project_ssh_key', \
     'device', 'project_event', 'tenant_audit', 'machine_firmware', 'machine_firmware_history', \
     'machine_firmware_read', 'machine_bios', 'machine_storage', 'firmware_grant', \
     'machine_service', 'service_history', 'machine_tally', 'machine_tally_delta', 'machine_console', 'console_session', 'machine_plan', 'plan_catalog', \
     'image_swarm_member', 'switch_port', 'switch_change', 'switch_state', 'virtual_network', 'device_port', \
     'device_port_vlan', 'port_vlan_batch')";

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
            "V3__machine_ssh_host_key",
            "V4__id_defaults",
            "V5__heartbeat_summary_per_statement",
            "V6__machine_bmc_facts",
            "V7__fleet_duties",
            "V8__operator_actions",
            "V9__fair_recovery",
            "V10__installations",
            "V11__agent_key_index",
            "V12__boot_credentials",
            "V13__bmc_boots",
            "V14__life_cycle",
            "V15__network_boot",
            "V16__discovery",
            "V17__interruptions",
            "V18__tenants",
            "V19__secure_boot",
            "V20__device_secure_boot",
            "V21__firmware",
            "V22__firmware_grants",
            "V23__servicing",
            "V24__fleet_tally",
            "V25__console",
            "V26__tally_agents",
            "V27__console_sessions",
            "V28__fleet_filters",
            "V29__console_keep_alive",
            "V30__image_swarms",
            "V31__switch_ports",
            "V32__switch_sessions",
            "V33__switch_uplinks"
        ]
    );
    assert_eq!(first.version, Some(33));
    assert_eq!(count(&bmdb, TABLES).await, 63);
    let again = bmdb.migrate().await.unwrap();
    assert!(again.applied.is_empty());
    assert_eq!(again.version, Some(33));
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
        [0, 33],
        "one run applies every migration, the other none"
    );
    assert_eq!(count(&a, TABLES).await, 63);
    assert_eq!(
        count(&a, "SELECT count(*) FROM refinery_schema_history").await,
        33
    );
}

#[actix_rt::test]
async fn the_summary_is_backfilled_for_machines_that_predate_it() {
    use shepherd::bmdb::Provider;
    use shepherd::bmdb::selectors;
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
        vec![
            "V2__machine_summary",
            "V3__machine_ssh_host_key",
            "V4__id_defaults",
            "V5__heartbeat_summary_per_statement",
            "V6__machine_bmc_facts",
            "V7__fleet_duties",
            "V8__operator_actions",
            "V9__fair_recovery",
            "V10__installations",
            "V11__agent_key_index",
            "V12__boot_credentials",
            "V13__bmc_boots",
            "V14__life_cycle",
            "V15__network_boot",
            "V16__discovery",
            "V17__interruptions",
            "V18__tenants",
            "V19__secure_boot",
            "V20__device_secure_boot",
            "V21__firmware",
            "V22__firmware_grants",
            "V23__servicing",
            "V24__fleet_tally",
            "V25__console",
            "V26__tally_agents",
            "V27__console_sessions",
            "V28__fleet_filters",
            "V29__console_keep_alive",
            "V30__image_swarms",
            "V31__switch_ports",
            "V32__switch_sessions",
            "V33__switch_uplinks"
        ]
    );
    shepherd_sim::testing::serve_test_endpoint(&bmdb).await;
    let (start, recovery) = bmdb
        .transact(async |tx| {
            Ok((
                selectors::needs_agent_start(tx, Provider::Equinix, 10).await?,
                crate::due_for_recovery(tx, Provider::Equinix).await?,
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
    // The kept states and the tally were backfilled too.
    use shepherd::bmdb::machines::{self, MachineState};
    let tally = bmdb
        .transact(async |tx| machines::tally(tx).await)
        .await
        .unwrap();
    assert_eq!(
        tally.states,
        vec![
            (MachineState::Pending, 1),
            (MachineState::Backoff, 1),
            (MachineState::AgentStarted, 1)
        ]
    );
    assert_eq!(tally.agents, 1);
}

/// The reference created rows without naming the key; those statements,
/// verbatim, work against the schema, on a fresh database and on one
/// migrated before the defaults existed.
#[actix_rt::test]
async fn the_reference_inserts_without_ids_succeed() {
    const MACHINE: &str = "INSERT INTO machines (machine_created_at) VALUES (now()) RETURNING *";
    const SESSION: &str = "INSERT INTO sessions (session_component_name, session_runtime_info, \
        session_created_at, session_interval_seconds, session_deadline) \
        VALUES ($1, $2, now(), $3, now() + $3::int * interval '1 second') RETURNING *";
    let db = TestDb::new_unmigrated().await;
    let bmdb = db.bmdb().await;
    bmdb.migrate_to(Some(3)).await.unwrap();
    let before = bmdb
        .transact(async |tx| tx.query_one(MACHINE, &[]).await.map(|_| ()))
        .await;
    assert!(
        before.is_err(),
        "without the defaults the reference's insert fails"
    );
    assert_eq!(
        bmdb.migrate().await.unwrap().applied,
        vec![
            "V4__id_defaults",
            "V5__heartbeat_summary_per_statement",
            "V6__machine_bmc_facts",
            "V7__fleet_duties",
            "V8__operator_actions",
            "V9__fair_recovery",
            "V10__installations",
            "V11__agent_key_index",
            "V12__boot_credentials",
            "V13__bmc_boots",
            "V14__life_cycle",
            "V15__network_boot",
            "V16__discovery",
            "V17__interruptions",
            "V18__tenants",
            "V19__secure_boot",
            "V20__device_secure_boot",
            "V21__firmware",
            "V22__firmware_grants",
            "V23__servicing",
            "V24__fleet_tally",
            "V25__console",
            "V26__tally_agents",
            "V27__console_sessions",
            "V28__fleet_filters",
            "V29__console_keep_alive",
            "V30__image_swarms",
            "V31__switch_ports",
            "V32__switch_sessions",
            "V33__switch_uplinks"
        ]
    );
    shepherd_sim::testing::serve_test_endpoint(&bmdb).await;
    let (machine, session) = bmdb
        .transact(async |tx| {
            let m = tx.query_one(MACHINE, &[]).await?;
            let s = tx
                .query_one(SESSION, &[&"reference-tool", &"pid 1", &30i32])
                .await?;
            Ok((
                m.get::<_, uuid::Uuid>("machine_id"),
                s.get::<_, uuid::Uuid>("session_id"),
            ))
        })
        .await
        .unwrap();
    assert_eq!(machine.get_version_num(), 4);
    assert_eq!(session.get_version_num(), 4);
    // The machine has its summary row, like every other.
    assert_eq!(
        count(&bmdb, "SELECT count(*) FROM machine_summary").await,
        1
    );
    // And a session made that way is a session like ours: alive.
    assert_eq!(
        count(
            &bmdb,
            "SELECT count(*) FROM sessions WHERE session_deadline > now()"
        )
        .await,
        1
    );
}

/// machine_summary.agent_heartbeat_at is kept per statement (V5): after
/// every kind of write to machine_agent_heartbeat it equals the table.
#[actix_rt::test]
async fn the_heartbeat_summary_follows_every_kind_of_write() {
    use shepherd::bmdb::Provider;
    const DIFFERENCES: &str = "SELECT count(*) FROM machine_summary s \
        LEFT JOIN machine_agent_heartbeat h USING (machine_id) \
        WHERE s.agent_heartbeat_at IS DISTINCT FROM h.agent_heartbeat_at";
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let ids = crate::provided_machines(&bmdb, Provider::Equinix, 4).await;
    let steps: [(&str, &str); 6] = [
        (
            "a batch inserted",
            "INSERT INTO machine_agent_heartbeat SELECT unnest($1::uuid[]), now() - interval '1 minute'",
        ),
        (
            "a batch upserted (the writer's statement)",
            "INSERT INTO machine_agent_heartbeat SELECT unnest($1::uuid[]), now() \
             ON CONFLICT (machine_id) DO UPDATE SET agent_heartbeat_at = EXCLUDED.agent_heartbeat_at",
        ),
        (
            "one deleted",
            "DELETE FROM machine_agent_heartbeat WHERE machine_id = ($1::uuid[])[1]",
        ),
        (
            "one moved to the machine without a row",
            "UPDATE machine_agent_heartbeat SET machine_id = ($1::uuid[])[1] WHERE machine_id = ($1::uuid[])[2]",
        ),
        (
            "one updated in place",
            "UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() + interval '1 second' \
             WHERE machine_id = ($1::uuid[])[3]",
        ),
        (
            "all deleted",
            "DELETE FROM machine_agent_heartbeat WHERE machine_id = ANY($1)",
        ),
    ];
    for (what, sql) in steps {
        bmdb.transact(async |tx| tx.execute(sql, &[&ids]).await)
            .await
            .unwrap();
        assert_eq!(count(&bmdb, DIFFERENCES).await, 0, "after {what}");
    }
    assert_eq!(
        count(
            &bmdb,
            "SELECT count(*) FROM machine_summary WHERE agent_heartbeat_at IS NOT NULL"
        )
        .await,
        0
    );
}

/// The SQL's names of the installation phases (`installation_phase_name`,
/// which the history's and the deadline's words use) are the agent
/// protocol's (`shepherd_proto::names::phase_name`), for every phase and
/// for numbers that are none.
#[actix_rt::test]
async fn the_sql_names_the_phases_as_the_protocol_does() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let numbers: Vec<i32> = (-1..=12).collect();
    let sql: Vec<String> = bmdb
        .transact(async |tx| {
            let mut out = Vec::new();
            for p in &numbers {
                out.push(
                    tx.query_one("SELECT installation_phase_name($1)", &[p])
                        .await?
                        .get(0),
                );
            }
            Ok(out)
        })
        .await
        .unwrap();
    let proto: Vec<&str> = numbers
        .iter()
        .map(|p| shepherd_proto::names::phase_name(*p))
        .collect();
    // (`phase_name` matches every phase of the protocol's enum: a new
    // phase gets its name there, and this test then asks it of the SQL.)
    assert_eq!(sql, proto);
}
