//! The life cycle's table, enforced: every operator action from every
//! machine state through the admin API, answered 200 where the table
//! allows it and 409 naming the state where it does not. Each machine is
//! built in its state from the BMDB's own rows (and its state read back
//! from the fleet's query before it is asked anything), with what the
//! action itself needs where the table allows it (a backoff to retry, a
//! hold to release, a BMC to boot through, a hardware difference to
//! accept), so that only the table decides.

use std::time::Duration;

use prost::Message as _;
use serde_json::json;
use shepherd::admin::{self, Admin};
use shepherd::bmdb::lifecycle::Operation;
use shepherd::bmdb::machines::{self, MachineState, NewProvidedMachine};
use shepherd::bmdb::{Bmdb, Process, Provider, Session};
use shepherd::secret::Secret;
use shepherd_sim::testing::TestDb;
use uuid::Uuid;

const TOKEN: &str = "life-cycle-token-0123456789";

async fn sql(bmdb: &Bmdb, q: &str, m: Uuid) {
    // The transaction's closure outlives this call's borrows.
    let q: &'static str = Box::leak(q.to_string().into_boxed_str());
    let r = bmdb.transact(async |tx| tx.execute(q, &[&m]).await).await;
    if let Err(e) = r {
        panic!("{q}: {e}");
    }
}

/// A machine in `state`, with what `op` needs to go ahead where the table
/// allows it.
async fn machine(bmdb: &Bmdb, session: &Session, state: MachineState, op: Operation) -> Uuid {
    use MachineState::*;
    let bmc = matches!(state, Enrolling | Inspecting | EnrollFailed | Available)
        || (op == Operation::Inspect && op.allows(state));
    let m = NewProvidedMachine {
        provider: Provider::Equinix,
        provider_id: format!("{state}-{op}"),
        reservation_id: None,
        // A blank machine booted through its BMC has no address.
        ip_address: (!matches!(state, Enrolling | Inspecting | EnrollFailed | Available))
            .then(|| "127.0.0.1".into()),
        location: None,
        status: Some(shepherd::bmdb::ProviderStatus::Running),
    };
    let id = bmdb
        .transact(async |tx| machines::create_provided(tx, &m).await)
        .await
        .unwrap();
    if bmc {
        sql(bmdb, "INSERT INTO machine_bmc_boot VALUES ($1, now())", id).await;
        // Read once by the Updater: nothing to disagree about.
        sql(
            bmdb,
            "INSERT INTO machine_bmc_facts (machine_id, bmc_url) VALUES ($1, 'https://127.0.0.1:1')",
            id,
        )
        .await;
    }
    let agent = "INSERT INTO machine_agent_started VALUES ($1, now(), '\\x0101')";
    let backoff = |p: &str| {
        format!(
            "INSERT INTO work_backoff (machine_id, process, until, cause) \
             VALUES ($1, '{p}', now() + interval '1 hour', 'test')"
        )
    };
    let asked = |kind: &str| {
        format!(
            "WITH i AS (INSERT INTO machine_installation \
                 (machine_id, generation, image_url, image_digest, requested_at, requested_by, kind) \
                 VALUES ($1, 1, '', '', now(), 'test', '{kind}')) \
             INSERT INTO machine_os_installation_request VALUES ($1, 1, '\\x08011234')"
        )
    };
    let report = |result: &str| {
        format!(
            "INSERT INTO machine_os_installation_report \
             (machine_id, generation, os_installation_result, os_installation_report_raw) \
             VALUES ($1, 1, '{result}', '\\x0801')"
        )
    };
    match state {
        Pending | Enrolling => {}
        Backoff | EnrollFailed => sql(bmdb, &backoff("ShepherdAgentStart"), id).await,
        Leased => {
            let w = session
                .lease(
                    Process::ShepherdAgentStart,
                    async move |_tx: &mut shepherd::bmdb::Tx<'_>| Ok(Some((id, ()))),
                )
                .await
                .unwrap()
                .unwrap();
            std::mem::forget(w);
        }
        Held => {
            sql(
                bmdb,
                "INSERT INTO machine_hold VALUES ($1, now(), 'alice', 'test')",
                id,
            )
            .await
        }
        AgentStarted => sql(bmdb, agent, id).await,
        Inspecting => {
            sql(
                bmdb,
                "INSERT INTO machine_boot_request VALUES ($1, now(), 'test', 'inspect', NULL)",
                id,
            )
            .await
        }
        Available => {
            // The live agent: enrolled by a boot of its BMC.
            sql(
                bmdb,
                "INSERT INTO machine_boot_credential \
                 (machine_id, credential, issued_at, expires_at, used_at, agent_public_key) \
                 VALUES ($1, '\\x00', now(), now() + interval '1 hour', now(), '\\x0101')",
                id,
            )
            .await;
            sql(bmdb, agent, id).await;
        }
        RecoveryBackoff => {
            sql(bmdb, agent, id).await;
            sql(bmdb, &backoff("ShepherdRecovery"), id).await;
        }
        Installing | Installed | InstallFailed | Cleaning | CleanFailed => {
            sql(bmdb, agent, id).await;
            let kind = if matches!(state, Cleaning | CleanFailed) {
                "erase"
            } else {
                "install"
            };
            sql(bmdb, &asked(kind), id).await;
            match state {
                Installed => sql(bmdb, &report("Success"), id).await,
                InstallFailed | CleanFailed => sql(bmdb, &report("Error"), id).await,
                _ => {}
            }
        }
        Unprovided => {
            sql(
                bmdb,
                "DELETE FROM machine_provided WHERE machine_id = $1",
                id,
            )
            .await
        }
    }
    let allowed = op.allows(state);
    if allowed {
        match op {
            Operation::Retry => sql(bmdb, &backoff("ShepherdAccess"), id).await,
            Operation::Release if state != Held => {
                // A hold shows under work in hand only: the Enroller's.
                if matches!(state, Enrolling | Inspecting) {
                    if state == Enrolling {
                        sql(
                            bmdb,
                            "INSERT INTO machine_boot_request VALUES ($1, now(), 'test', 'enroll', NULL)",
                            id,
                        )
                        .await;
                    }
                    let w = session
                        .lease(
                            Process::ShepherdAgentStart,
                            async move |_tx: &mut shepherd::bmdb::Tx<'_>| Ok(Some((id, ()))),
                        )
                        .await
                        .unwrap()
                        .unwrap();
                    std::mem::forget(w);
                }
                sql(
                    bmdb,
                    "INSERT INTO machine_hold VALUES ($1, now(), 'alice', 'test')",
                    id,
                )
                .await
            }
            Operation::AcceptHardware => {
                sql(
                    bmdb,
                    "INSERT INTO machine_bmc_facts (machine_id, bmc_url, serial_number) \
                     VALUES ($1, 'https://127.0.0.1:1', 'BMC-SAYS-1') \
                     ON CONFLICT (machine_id) DO UPDATE SET serial_number = 'BMC-SAYS-1'",
                    id,
                )
                .await;
                let report = shepherd_proto::api::AgentHardwareReport {
                    report: Some(shepherd_proto::api::Node {
                        serial_number: "AGENT-SAYS-2".into(),
                        ..Default::default()
                    }),
                    warning: Vec::new(),
                }
                .encode_to_vec();
                bmdb.transact(async |tx| {
                    tx.execute(
                        "INSERT INTO machine_hardware_report VALUES ($1, $2)",
                        &[&id, &report],
                    )
                    .await
                })
                .await
                .unwrap();
            }
            _ => {}
        }
    }
    let got = bmdb
        .transact(async |tx| shepherd::bmdb::lifecycle::state_of(tx, id).await)
        .await
        .unwrap();
    assert_eq!(got, Some(state), "the fixture for {state} / {op}");
    id
}

/// The POST an operator sends for `op`.
fn body(op: Operation) -> (String, serde_json::Value) {
    match op {
        Operation::Install => (
            "install".into(),
            json!({"image": {"url": "https://images.example/os.img",
                             "digest": format!("sha256:{}", "ab".repeat(32))}}),
        ),
        Operation::Deprovision => ("deprovision".into(), json!({"mode": "metadata"})),
        other => (other.as_str().into(), json!({"reason": "life cycle test"})),
    }
}

#[actix_rt::test]
async fn every_action_from_every_state_is_allowed_or_refused_as_the_table_says() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let session = bmdb
        .start_session("life-cycle-test", Some(Duration::from_secs(300)))
        .await
        .unwrap();
    let a = admin::serve(
        Admin {
            tokens: vec![("admin".to_string(), Secret::inline(TOKEN))],
            ..Admin::new(bmdb.clone())
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap();
    let client = awc::Client::default();
    let mut wrong = Vec::new();
    let (mut allowed, mut refused) = (0, 0);
    for state in MachineState::ALL {
        for op in Operation::ALL {
            let id = machine(&bmdb, &session, state, op).await;
            let (path, b) = body(op);
            let mut r = client
                .post(format!("http://{a}/api/v1/machines/{id}/{path}"))
                .insert_header(("Authorization", format!("Bearer {TOKEN}")))
                .send_json(&b)
                .await
                .unwrap();
            let status = r.status().as_u16();
            let v: serde_json::Value = r.json().await.unwrap_or(json!(null));
            let expected = if op.allows(state) { 200 } else { 409 };
            if status != expected {
                wrong.push(format!("{state} {op}: {status} (expected {expected}): {v}"));
                continue;
            }
            if expected == 200 {
                allowed += 1;
                assert_eq!(v["action"]["action"], op.as_str(), "{v}");
            } else {
                refused += 1;
                let e = v["error"].as_str().unwrap_or_default();
                let named = e.contains(&format!("is {state}"))
                    || (state == MachineState::Held && e.contains("is already held"))
                    || (op == Operation::Release && e.contains("is not held"));
                if !named {
                    wrong.push(format!("{state} {op}: the refusal names no state: {e}"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let total = MachineState::ALL.len() * Operation::ALL.len();
    assert_eq!(allowed + refused, total);
    println!("{allowed} allowed and {refused} refused of {total}");
}

#[test]
fn the_readme_shows_the_table_the_code_enforces() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let table = shepherd::bmdb::lifecycle::markdown_table();
    assert!(
        readme.contains(&table),
        "README.md's life-cycle table differs from the code's; it should read:\n{table}"
    );
}
