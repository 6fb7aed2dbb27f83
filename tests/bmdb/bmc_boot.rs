//! Machines booted through their BMC (`machine_bmc_boot`): which the
//! Enroller takes, which the SSH takeover and the Recoverer leave to it,
//! the states an operator sees, and the boots asked by an installation of
//! an installed machine.

use std::collections::BTreeSet;

use shepherd::bmdb::bmc_boot::{self, BootCause};
use shepherd::bmdb::boot;
use shepherd::bmdb::machines::{self, FleetFilter, MachineState};
use shepherd::bmdb::selectors;
use shepherd::bmdb::{Bmdb, Provider};
use shepherd_sim::testing::TestDb;
use uuid::Uuid;

const TAG: &str = "INSERT INTO machine_bmc_boot VALUES ($1, now())";
const NO_ADDRESS: &str =
    "UPDATE machine_provided SET provider_ip_address = NULL WHERE machine_id = $1";
const AGENT: &str =
    "INSERT INTO machine_agent_started VALUES ($1, now() - interval '1 hour', '\\x01')";
const HB_FRESH: &str =
    "INSERT INTO machine_agent_heartbeat VALUES ($1, now() - interval '1 minute')";
const HB_STALE: &str =
    "INSERT INTO machine_agent_heartbeat VALUES ($1, now() - interval '20 minutes')";
const START_BACKOFF: &str = "INSERT INTO work_backoff VALUES ($1, 'ShepherdAgentStart', now() + interval '1 hour', 'x', 60)";
const INSTALLED: &str = "WITH r AS (INSERT INTO machine_os_installation_request VALUES ($1, 1, '\\x')) \
     INSERT INTO machine_os_installation_report VALUES ($1, 1, 'Success', '\\x')";
const INSPECT: &str = "INSERT INTO machine_boot_request VALUES ($1, now(), 'op', 'inspect', NULL)";
const HOLD: &str = "INSERT INTO machine_hold VALUES ($1, now(), 'op', NULL)";
const WORK_RECOVERY: &str =
    "INSERT INTO work SELECT $1, session_id, 'ShepherdRecovery' FROM sessions";

/// (name, setup, takeover by SSH, boot through the BMC, recovery)
type Case = (&'static str, &'static [&'static str], bool, bool, bool);

const CASES: &[Case] = &[
    (
        "listed by its BMC only",
        &[TAG, NO_ADDRESS],
        false,
        true,
        false,
    ),
    (
        "booted by its BMC, with an address",
        &[TAG],
        true,
        false,
        false,
    ),
    (
        "no address, not booted by a BMC",
        &[NO_ADDRESS],
        true,
        false,
        false,
    ),
    (
        "by its BMC, agent running",
        &[TAG, NO_ADDRESS, AGENT, HB_FRESH],
        false,
        false,
        false,
    ),
    (
        "by its BMC, backed off",
        &[TAG, NO_ADDRESS, START_BACKOFF],
        false,
        false,
        false,
    ),
    (
        "by its BMC, installed",
        &[TAG, NO_ADDRESS, INSTALLED],
        false,
        false,
        false,
    ),
    (
        "inspect asked, agent running",
        &[TAG, AGENT, HB_FRESH, INSPECT],
        false,
        true,
        false,
    ),
    (
        "inspect asked, no agent, address",
        &[TAG, INSPECT],
        false,
        true,
        false,
    ),
    (
        "inspect asked, installed",
        &[TAG, AGENT, INSTALLED, INSPECT],
        false,
        true,
        false,
    ),
    (
        "inspect asked, held",
        &[TAG, NO_ADDRESS, INSPECT, HOLD],
        false,
        false,
        false,
    ),
    (
        "inspect asked, leased for recovery",
        &[TAG, INSPECT, WORK_RECOVERY],
        false,
        false,
        false,
    ),
    (
        "silent, a boot asked",
        &[TAG, AGENT, HB_STALE, INSPECT],
        false,
        true,
        false,
    ),
    (
        "silent, by its BMC",
        &[TAG, AGENT, HB_STALE],
        false,
        false,
        true,
    ),
];

/// An image installation request (rebooting once done, if `reboot`).
fn image(reboot: bool) -> shepherd_proto::api::ImageInstallation {
    shepherd_proto::api::ImageInstallation {
        url: "https://images.example/os.img".into(),
        digest: format!("sha256:{}", "ab".repeat(32)),
        reboot,
        ..Default::default()
    }
}

/// An operator asks `mid` to install `image`, as a request of its own.
async fn ask(
    bmdb: &Bmdb,
    mid: Uuid,
    image: &shepherd_proto::api::ImageInstallation,
) -> shepherd::bmdb::installations::Asked {
    let asker = shepherd::bmdb::installations::Asker {
        action_id: Uuid::new_v4(),
        actor: "op",
        reason: None,
        rollout_id: None,
    };
    bmdb.transact(async |tx| shepherd::bmdb::installations::ask(tx, mid, image, &asker).await)
        .await
        .unwrap()
}

async fn run(bmdb: &Bmdb, sql: &'static str, mid: Uuid) {
    bmdb.transact(async |tx| tx.execute(sql, &[&mid]).await)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

#[actix_rt::test]
async fn the_enroller_takes_machines_booted_by_their_bmc_and_the_others_leave_them() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let _holder = bmdb.start_session("holder", None).await.unwrap();
    let mut ids = Vec::new();
    for (_, setup, ..) in CASES {
        let mid = crate::provided_machines(&bmdb, Provider::None, 1).await[0];
        for sql in *setup {
            run(&bmdb, sql, mid).await;
        }
        ids.push(mid);
    }
    shepherd_sim::testing::serve_test_endpoint(&bmdb).await;
    let set = |v: Vec<selectors::ProvidedMachine>| {
        v.into_iter().map(|m| m.machine_id).collect::<BTreeSet<_>>()
    };
    let (ssh, bmc, recovery) = bmdb
        .transact(async |tx| {
            Ok((
                set(selectors::needs_agent_start(tx, Provider::None, 1000).await?),
                set(selectors::needs_bmc_boot(tx, Provider::None, 1000).await?),
                set(crate::due_for_recovery(tx, Provider::None).await?),
            ))
        })
        .await
        .unwrap();
    let names = |pick: fn(&Case) -> bool| -> Vec<&str> {
        CASES
            .iter()
            .zip(&ids)
            .filter(|(c, _)| pick(c))
            .map(|(c, _)| c.0)
            .collect()
    };
    let chosen = |s: &BTreeSet<Uuid>| -> Vec<&str> {
        CASES
            .iter()
            .zip(&ids)
            .filter(|(_, id)| s.contains(id))
            .map(|(c, _)| c.0)
            .collect()
    };
    assert_eq!(chosen(&ssh), names(|c| c.2), "taken over by SSH");
    assert_eq!(chosen(&bmc), names(|c| c.3), "booted through the BMC");
    assert_eq!(chosen(&recovery), names(|c| c.4), "recovered");

    // What an operator sees.
    let (page, _) = bmdb
        .transact(async |tx| machines::fleet_page(tx, &FleetFilter::default(), 100, 0).await)
        .await
        .unwrap();
    let state = |i: usize| page.iter().find(|m| m.machine_id == ids[i]).unwrap().state;
    assert_eq!(state(0), MachineState::Enrolling);
    assert_eq!(state(4), MachineState::EnrollFailed);
    assert_eq!(state(6), MachineState::Inspecting);
    assert_eq!(state(9), MachineState::Held);
    // Taken over by SSH, not by a boot: its agent is not the live one.
    assert_eq!(state(3), MachineState::AgentStarted);
}

#[actix_rt::test]
async fn an_agent_enrolled_by_a_boot_is_available_until_something_is_installed() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let mid = crate::provided_machines(&bmdb, Provider::None, 1).await[0];
    run(&bmdb, TAG, mid).await;
    run(&bmdb, NO_ADDRESS, mid).await;
    let state = async || {
        bmdb.transact(async |tx| {
            let (page, _) = machines::fleet_page(tx, &FleetFilter::default(), 10, 0).await?;
            Ok(page[0].state)
        })
        .await
        .unwrap()
    };
    assert_eq!(state().await, MachineState::Enrolling);
    // Its BMC read (by the Updater), in agreement with what the agent
    // reports (none of it yet).
    run(
        &bmdb,
        "INSERT INTO machine_bmc_facts (machine_id, bmc_url, serial_number) \
         VALUES ($1, 'https://10.0.0.5', 'CZJ-0001')",
        mid,
    )
    .await;
    let issued = bmdb
        .transact(async |tx| boot::issue(tx, mid, std::time::Duration::from_secs(60)).await)
        .await
        .unwrap();
    let key = [7u8; 32];
    let enrolled = bmdb
        .transact(async |tx| boot::enroll(tx, mid, &issued.credential, &key, "cb:1").await)
        .await
        .unwrap();
    assert!(
        matches!(enrolled, boot::Enrolled::Enrolled { .. }),
        "{enrolled:?}"
    );
    assert_eq!(state().await, MachineState::Available);

    // Installed: an installation asked of it now boots it into the agent
    // first (the installed system runs none).
    run(&bmdb, INSTALLED, mid).await;
    assert_eq!(state().await, MachineState::Installed);
    let asked = ask(&bmdb, mid, &image(false)).await;
    let shepherd::bmdb::installations::Asked::Done { audit, .. } = asked else {
        panic!("{asked:?}");
    };
    assert!(
        audit
            .detail
            .ends_with("; its BMC boots it into the agent first"),
        "{}",
        audit.detail
    );
    let request = bmdb
        .transact(async |tx| bmc_boot::requested(tx, mid).await)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(request.cause, BootCause::Install);
    assert_eq!(state().await, MachineState::Enrolling);

    // Its live agent enrolls (the boot done): it takes the installation.
    let enroll_again = async |seed: u8| {
        bmdb.transact(async |tx| {
            let b = boot::issue(tx, mid, std::time::Duration::from_secs(60)).await?;
            let e = boot::enroll(tx, mid, &b.credential, &[seed; 32], "cb:1").await?;
            bmc_boot::request_done(tx, mid).await?;
            Ok(e)
        })
        .await
        .unwrap()
    };
    assert!(matches!(
        enroll_again(8).await,
        boot::Enrolled::Enrolled { .. }
    ));
    assert_eq!(state().await, MachineState::Installing);
    run(
        &bmdb,
        "INSERT INTO machine_os_installation_report VALUES ($1, 2, 'Success', '\\x') \
         ON CONFLICT (machine_id) DO UPDATE SET generation = 2",
        mid,
    )
    .await;
    assert_eq!(state().await, MachineState::Installed);

    // Inspected: the live agent runs again on the installed machine.
    run(&bmdb, INSPECT, mid).await;
    assert_eq!(state().await, MachineState::Inspecting);
    assert!(matches!(
        enroll_again(9).await,
        boot::Enrolled::Enrolled { .. }
    ));
    // Its disk holds the installed system: installed, not available,
    // until an erasure succeeds (a live agent alone erases nothing).
    assert_eq!(state().await, MachineState::Installed);
    // An installation asked now goes to that agent: no boot first.
    let asked = ask(&bmdb, mid, &image(false)).await;
    let shepherd::bmdb::installations::Asked::Done { audit, .. } = asked else {
        panic!("{asked:?}");
    };
    assert!(!audit.detail.contains("boots it"), "{}", audit.detail);
    assert_eq!(state().await, MachineState::Installing);
}

#[actix_rt::test]
async fn a_bmc_that_disagrees_with_the_agent_blocks_installations_until_accepted() {
    use prost::Message;
    use shepherd::bmdb::actions::{self, Action, Outcome, Request};
    use shepherd::bmdb::installations::Asked;
    use shepherd_proto::api::{AgentHardwareReport, Node};
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let mid = crate::provided_machines(&bmdb, Provider::None, 1).await[0];
    run(&bmdb, AGENT, mid).await;
    run(&bmdb, TAG, mid).await;
    let image = image(false);
    let ask_now = async || ask(&bmdb, mid, &image).await;
    // Booted through its BMC, whose facts were not read yet: nothing can
    // be checked, nothing is installed.
    let Asked::Refused(why) = ask_now().await else {
        panic!("an installation went ahead before the BMC was read");
    };
    assert!(why.contains("has not been read yet"), "{why}");
    // The BMC of rack1-u12 is cabled to another box: its system is not
    // the machine whose agent reports.
    run(
        &bmdb,
        "INSERT INTO machine_bmc_facts (machine_id, bmc_url, serial_number, memory_gib) \
         VALUES ($1, 'https://10.0.0.5', 'CZJ-0001', 64)",
        mid,
    )
    .await;
    let report = AgentHardwareReport {
        report: Some(Node {
            serial_number: "CZJ-0002".into(),
            memory_installed_bytes: 16 << 30,
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    bmdb.transact(async |tx| {
        tx.execute(
            "INSERT INTO machine_hardware_report VALUES ($1, $2)",
            &[&mid, &report],
        )
        .await
    })
    .await
    .unwrap();
    let Asked::Refused(why) = ask_now().await else {
        panic!("an installation went ahead on a machine its BMC does not describe");
    };
    assert!(
        why.contains("\"CZJ-0001\"") && why.contains("\"CZJ-0002\"") && why.contains("64 GiB"),
        "{why}"
    );
    let check = bmdb
        .transact(async |tx| shepherd::bmdb::hardware::check(tx, mid).await)
        .await
        .unwrap()
        .unwrap();
    assert!(check.blocks() && check.differences.len() == 2, "{check:?}");

    // An operator looks, and accepts (audited).
    let done = bmdb
        .transact(async |tx| {
            actions::act(tx, &Request::new(mid, Action::AcceptHardware, "alice")).await
        })
        .await
        .unwrap();
    let Outcome::Done(audit) = done else {
        panic!("{done:?}");
    };
    assert!(
        audit.detail.starts_with("accepted: serial number"),
        "{}",
        audit.detail
    );
    assert!(matches!(ask_now().await, Asked::Done { .. }));

    // A new difference is not accepted by the old acceptance.
    run(
        &bmdb,
        "UPDATE machine_bmc_facts SET serial_number = 'CZJ-0003' WHERE machine_id = $1",
        mid,
    )
    .await;
    let check = bmdb
        .transact(async |tx| shepherd::bmdb::hardware::check(tx, mid).await)
        .await
        .unwrap()
        .unwrap();
    assert!(check.blocks(), "{check:?}");
    // Agreeing facts leave nothing to accept.
    run(
        &bmdb,
        "UPDATE machine_bmc_facts SET serial_number = 'CZJ-0002', memory_gib = 16 WHERE machine_id = $1",
        mid,
    )
    .await;
    let refused = bmdb
        .transact(async |tx| {
            actions::act(tx, &Request::new(mid, Action::AcceptHardware, "alice")).await
        })
        .await
        .unwrap();
    assert!(
        matches!(refused, Outcome::Refused(ref w) if w.contains("nothing to accept")),
        "{refused:?}"
    );
}

#[actix_rt::test]
async fn a_reboot_asked_of_a_machine_booted_through_its_bmc_is_its_bmcs() {
    use prost::Message;
    use shepherd::bmdb::installations::Asked;
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let mid = crate::provided_machines(&bmdb, Provider::None, 1).await[0];
    run(&bmdb, TAG, mid).await;
    run(&bmdb, NO_ADDRESS, mid).await;
    run(
        &bmdb,
        "INSERT INTO machine_bmc_facts (machine_id, bmc_url) VALUES ($1, 'https://10.0.0.5')",
        mid,
    )
    .await;
    bmdb.transact(async |tx| {
        let b = boot::issue(tx, mid, std::time::Duration::from_secs(60)).await?;
        boot::enroll(tx, mid, &b.credential, &[3; 32], "cb:1").await?;
        bmc_boot::request_done(tx, mid).await
    })
    .await
    .unwrap();
    let asked = ask(&bmdb, mid, &image(true)).await;
    let Asked::Done { audit, generation } = asked else {
        panic!("{asked:?}");
    };
    assert!(
        audit
            .detail
            .ends_with("; its BMC restarts it from its disk once installed"),
        "{}",
        audit.detail
    );
    // The agent is told not to reboot.
    let raw: Vec<u8> = bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT os_installation_request_raw FROM machine_os_installation_request \
                     WHERE machine_id = $1",
                    &[&mid],
                )
                .await?
                .get(0))
        })
        .await
        .unwrap();
    let req = shepherd_proto::api::OsInstallationRequest::decode(raw.as_slice()).unwrap();
    let Some(shepherd_proto::api::os_installation_request::Type::Image(sent)) = req.r#type else {
        panic!("{req:?}");
    };
    assert!(!sent.reboot);
    let requested = async || {
        bmdb.transact(async |tx| bmc_boot::requested(tx, mid).await)
            .await
            .unwrap()
    };
    assert!(requested().await.is_none());
    // Its agent reports success: the BMC is to restart it from its disk.
    bmdb.transact(async |tx| {
        tx.execute(
            "INSERT INTO machine_os_installation_report VALUES ($1, $2, 'Success', '\\x')",
            &[&mid, &generation],
        )
        .await
    })
    .await
    .unwrap();
    assert_eq!(requested().await.unwrap().cause, BootCause::Disk);
    // The Enroller's to do; the machine shows installed, not enrolling.
    let picked = bmdb
        .transact(async |tx| selectors::needs_bmc_boot(tx, Provider::None, 10).await)
        .await
        .unwrap();
    assert_eq!(picked.len(), 1);
    let (page, _) = bmdb
        .transact(async |tx| machines::fleet_page(tx, &FleetFilter::default(), 10, 0).await)
        .await
        .unwrap();
    assert_eq!(page[0].state, MachineState::Installed);
}
