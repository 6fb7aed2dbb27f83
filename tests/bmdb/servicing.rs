//! Servicings as the BMDB keeps them: a machine booted through its BMC
//! restarts through the Enroller's `service` boot, the Servicer waits for
//! it and takes the check up after it; a machine whose agent went quiet is
//! not judged silent while serviced; a rollout does not try again what
//! failed; every end is kept.

use shepherd::bmdb::lifecycle::{MachineState, state_of};
use shepherd::bmdb::servicing::{self, Ask, Asked, Restart};
use shepherd::bmdb::{Bmdb, Provider, bmc_boot, selectors};
use shepherd_sim::testing::TestDb;
use uuid::Uuid;

async fn sql(bmdb: &Bmdb, q: &'static str, id: Uuid) {
    bmdb.transact(async |tx| tx.execute(q, &[&id]).await)
        .await
        .unwrap();
}

/// A machine enrolled through its BMC (`available`), its BMC's firmware
/// read.
async fn available(bmdb: &Bmdb) -> Uuid {
    let id = crate::provided_machines(bmdb, Provider::None, 1).await[0];
    for q in [
        "INSERT INTO machine_bmc_boot VALUES ($1, now())",
        "INSERT INTO machine_bmc_facts (machine_id, bmc_url) VALUES ($1, 'https://127.0.0.1:1')",
        "INSERT INTO machine_firmware_read (machine_id) VALUES ($1)",
        "INSERT INTO machine_boot_credential \
         (machine_id, credential, issued_at, expires_at, used_at, agent_public_key) \
         VALUES ($1, '\\x00', now(), now() + interval '1 hour', now(), '\\x0101')",
        "INSERT INTO machine_agent_started VALUES ($1, now(), '\\x0101')",
    ] {
        sql(bmdb, q, id).await;
    }
    id
}

fn ask(rollout: Option<Uuid>) -> Ask<'static> {
    Ask {
        action_id: Uuid::new_v4(),
        actor: "test",
        reason: None,
        baseline: "b1",
        forced: false,
        rollout_id: rollout,
    }
}

async fn state(bmdb: &Bmdb, id: Uuid) -> MachineState {
    bmdb.transact(async |tx| state_of(tx, id).await)
        .await
        .unwrap()
        .unwrap()
}

async fn needs_service(bmdb: &Bmdb) -> Vec<Uuid> {
    bmdb.transact(async |tx| selectors::needs_service(tx, Provider::None, 10).await)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.machine_id)
        .collect()
}

#[actix_rt::test]
async fn a_machine_booted_through_its_bmc_restarts_through_the_enrollers_boot_then_is_checked() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let id = available(&bmdb).await;
    assert_eq!(state(&bmdb, id).await, MachineState::Available);
    let a = ask(None);
    let service_id = match bmdb
        .transact(async |tx| servicing::ask(tx, id, &a).await)
        .await
        .unwrap()
    {
        Asked::Done {
            service_id, audit, ..
        } => {
            assert_eq!(audit.action, "service");
            service_id
        }
        other => panic!("{other:?}"),
    };
    // Asked again under the same request ID: the same answer, no second.
    match bmdb
        .transact(async |tx| servicing::ask(tx, id, &a).await)
        .await
        .unwrap()
    {
        Asked::Done { service_id: s, .. } => assert_eq!(s, service_id),
        other => panic!("{other:?}"),
    }
    assert_eq!(state(&bmdb, id).await, MachineState::Servicing);
    assert_eq!(needs_service(&bmdb).await, vec![id]);

    // Applied: its restart is the Enroller's `service` boot.
    let restart = bmdb
        .transact(async |tx| servicing::restart_of(tx, id).await)
        .await
        .unwrap();
    assert_eq!(restart, Restart::Boot);
    let recorded = bmdb
        .transact(async |tx| {
            servicing::restarting(tx, id, service_id, "BIOS X (applied OnReset)", restart).await
        })
        .await
        .unwrap();
    assert!(recorded);
    let boot = bmdb
        .transact(async |tx| bmc_boot::requested(tx, id).await)
        .await
        .unwrap()
        .expect("a boot asked");
    assert_eq!(boot.cause, bmc_boot::BootCause::Service);
    assert_eq!(state(&bmdb, id).await, MachineState::Servicing);
    assert!(
        needs_service(&bmdb).await.is_empty(),
        "the Servicer waits for the boot"
    );
    let enroller: Vec<Uuid> = bmdb
        .transact(async |tx| selectors::needs_bmc_boot(tx, Provider::None, 10).await)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.machine_id)
        .collect();
    assert_eq!(enroller, vec![id], "the Enroller boots it");
    // A second restart is not recorded twice.
    let again = bmdb
        .transact(async |tx| servicing::restarting(tx, id, service_id, "again", restart).await)
        .await
        .unwrap();
    assert!(!again);

    // Booted: the Servicer takes up the check.
    bmdb.transact(async |tx| bmc_boot::request_done(tx, id).await)
        .await
        .unwrap();
    assert_eq!(needs_service(&bmdb).await, vec![id]);
    let s = bmdb
        .transact(async |tx| servicing::of_machine(tx, id).await)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((s.phase.as_str(), s.restarts), ("restarting", 1));
    let ended = bmdb
        .transact(async |tx| servicing::end(tx, id, service_id, &Ok("at baseline b1".into())).await)
        .await
        .unwrap();
    assert!(ended);
    assert_eq!(state(&bmdb, id).await, MachineState::Available);
    assert!(needs_service(&bmdb).await.is_empty());
    let history = bmdb
        .transact(async |tx| servicing::history(tx, id).await)
        .await
        .unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].phase, "done");
    assert_eq!(history[0].applied.as_deref(), Some("at baseline b1"));
}

#[actix_rt::test]
async fn an_installed_machine_booted_through_its_bmc_restarts_from_its_disk() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let id = available(&bmdb).await;
    sql(
        &bmdb,
        "WITH i AS (INSERT INTO machine_installation \
             (machine_id, generation, image_url, image_digest, requested_at, requested_by, kind) \
             VALUES ($1, 1, '', '', now(), 'test', 'install')), \
         r AS (INSERT INTO machine_os_installation_request VALUES ($1, 1, '\\x08011234')) \
         INSERT INTO machine_os_installation_report \
             (machine_id, generation, os_installation_result, os_installation_report_raw) \
         VALUES ($1, 1, 'Success', '\\x0801')",
        id,
    )
    .await;
    assert_eq!(state(&bmdb, id).await, MachineState::Installed);
    let mut forced = ask(None);
    forced.forced = true;
    let service_id = match bmdb
        .transact(async |tx| servicing::ask(tx, id, &forced).await)
        .await
        .unwrap()
    {
        Asked::Done { service_id, .. } => service_id,
        other => panic!("{other:?}"),
    };
    let restart = bmdb
        .transact(async |tx| servicing::restart_of(tx, id).await)
        .await
        .unwrap();
    assert_eq!(
        restart,
        Restart::Disk,
        "its installed system, not the live agent"
    );
    bmdb.transact(async |tx| servicing::restarting(tx, id, service_id, "BIOS X", restart).await)
        .await
        .unwrap();
    let boot = bmdb
        .transact(async |tx| bmc_boot::requested(tx, id).await)
        .await
        .unwrap()
        .expect("a restart asked");
    assert_eq!(boot.cause, bmc_boot::BootCause::Disk);
    assert_eq!(state(&bmdb, id).await, MachineState::Servicing);
    bmdb.transact(async |tx| bmc_boot::request_done(tx, id).await)
        .await
        .unwrap();
    bmdb.transact(async |tx| servicing::end(tx, id, service_id, &Ok("done".into())).await)
        .await
        .unwrap();
    assert_eq!(state(&bmdb, id).await, MachineState::Installed);
}

#[actix_rt::test]
async fn a_failed_servicing_holds_the_machine_and_a_rollout_does_not_try_it_again() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let id = available(&bmdb).await;
    let service_id = match bmdb
        .transact(async |tx| servicing::ask(tx, id, &ask(None)).await)
        .await
        .unwrap()
    {
        Asked::Done { service_id, .. } => service_id,
        other => panic!("{other:?}"),
    };
    // Not judged silent meanwhile: its heartbeat is long gone.
    sql(
        &bmdb,
        "INSERT INTO machine_agent_heartbeat VALUES ($1, now() - interval '1 hour')",
        id,
    )
    .await;
    bmdb.transact(async |tx| {
        servicing::end(tx, id, service_id, &Err("the BMC refused".into())).await
    })
    .await
    .unwrap();
    assert_eq!(state(&bmdb, id).await, MachineState::ServiceFailed);
    let rollout = Uuid::new_v4();
    match bmdb
        .transact(async |tx| servicing::ask(tx, id, &ask(Some(rollout))).await)
        .await
        .unwrap()
    {
        Asked::Refused(why) => assert!(
            why.contains("a rollout does not try it again") && why.contains("the BMC refused"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    // An operator does.
    assert!(matches!(
        bmdb.transact(async |tx| servicing::ask(tx, id, &ask(None)).await)
            .await
            .unwrap(),
        Asked::Done { .. }
    ));
    assert_eq!(state(&bmdb, id).await, MachineState::Servicing);
}
