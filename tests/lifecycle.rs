//! The life cycle's table, enforced: every operator action from every
//! machine state through the admin API, answered 200 where the table
//! allows it and 409 naming the state where it does not. Each machine is
//! built in its state from the BMDB's own rows (and its state read back
//! from the fleet's query before it is asked anything), with what the
//! action itself needs where the table allows it (a backoff to retry, a
//! hold to release, a BMC to boot through, a hardware difference to
//! accept, a baseline and a firmware read to service to), so that only the
//! table decides.

use std::time::Duration;

use prost::Message as _;
use serde_json::json;
use shepherd::admin::{self, Admin};
use shepherd::bmdb::lifecycle::{Event, Operation};
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
    let bmc = op == Operation::Inspect && op.allows(state);
    let id = machine_in(bmdb, session, state, bmc).await;
    needs_of(bmdb, session, state, op, id).await;
    let got = bmdb
        .transact(async |tx| shepherd::bmdb::lifecycle::state_of(tx, id).await)
        .await
        .unwrap();
    assert_eq!(got, Some(state), "the fixture for {state} / {op}");
    id
}

/// A machine in `state`, made from the BMDB's own rows (known to its BMC
/// too when `bmc`, as it is in the states of a boot through the BMC).
async fn machine_in(bmdb: &Bmdb, session: &Session, state: MachineState, bmc: bool) -> Uuid {
    use MachineState::*;
    if state == Discovered {
        return discovered(bmdb).await;
    }
    let bmc = bmc
        || matches!(
            state,
            Enrolling | Inspecting | EnrollFailed | Available | Servicing | ServiceFailed
        );
    let m = NewProvidedMachine {
        provider: Provider::Equinix,
        provider_id: format!("{state}-{}", Uuid::new_v4()),
        reservation_id: None,
        // A blank machine booted through its BMC has no address.
        ip_address: (!matches!(
            state,
            Enrolling | Inspecting | EnrollFailed | Available | Servicing | ServiceFailed
        ))
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
            let w = lease_takeover(session, id).await;
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
        Available | Servicing | ServiceFailed => {
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
            // Its servicing, asked or failed.
            let phase = match state {
                Servicing => "asked",
                ServiceFailed => "failed",
                _ => return id,
            };
            sql(
                bmdb,
                &format!(
                    "INSERT INTO machine_service (machine_id, service_id, baseline, asked_by, phase) \
                     VALUES ($1, gen_random_uuid(), 'every', 'test', '{phase}')"
                ),
                id,
            )
            .await;
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
        Discovered => unreachable!("made by discovered()"),
    }
    id
}

/// A machine that enlisted itself from a random MAC, as the network boot
/// service enlists one, whose live agent enrolled with the discovery
/// boot's credential.
async fn discovered(bmdb: &Bmdb) -> Uuid {
    let mac: shepherd::mac::MacAddr = format!(
        "02:00:{:02x}:{:02x}:{:02x}:{:02x}",
        rand_byte(),
        rand_byte(),
        rand_byte(),
        rand_byte()
    )
    .parse()
    .unwrap();
    bmdb.transact(async |tx| {
        let id = shepherd::bmdb::discovery::enlist(tx, mac, "uefi")
            .await?
            .expect("a new MAC");
        let boot = shepherd::bmdb::boot::issue(tx, id, Duration::from_secs(600)).await?;
        shepherd::bmdb::boot::enroll(tx, id, &boot.credential, &[9; 32], "127.0.0.1:1").await?;
        Ok(id)
    })
    .await
    .unwrap()
}

fn rand_byte() -> u8 {
    (Uuid::new_v4().as_u128() & 0xff) as u8
}

/// The BMC an acceptance gives (nothing listens there: accepting reaches
/// no BMC).
fn acceptance() -> shepherd::bmdb::discovery::Acceptance {
    shepherd::bmdb::discovery::Acceptance {
        host_id: None,
        url: "https://127.0.0.1:1".into(),
        username: "admin".into(),
        password: "bmc-password".into(),
        system: None,
        tls: "insecure".into(),
    }
}

/// What `op` needs to go ahead on machine `id` in `state`, where the
/// table allows it (a backoff to retry, a hold to release, …).
async fn needs_of(bmdb: &Bmdb, session: &Session, state: MachineState, op: Operation, id: Uuid) {
    use MachineState::*;
    let backoff = |p: &str| {
        format!(
            "INSERT INTO work_backoff (machine_id, process, until, cause) \
             VALUES ($1, '{p}', now() + interval '1 hour', 'test')"
        )
    };
    let allowed = op.allows(state);
    if allowed {
        match op {
            Operation::Retry => sql(bmdb, &backoff("ShepherdAccess"), id).await,
            Operation::Release if state != Held => {
                // A hold shows under work in hand only: the Enroller's,
                // the Servicer's.
                if matches!(state, Enrolling | Inspecting | Servicing) {
                    if state == Enrolling {
                        sql(
                            bmdb,
                            "INSERT INTO machine_boot_request VALUES ($1, now(), 'test', 'enroll', NULL)",
                            id,
                        )
                        .await;
                    }
                    let w = lease_takeover(session, id).await;
                    std::mem::forget(w);
                }
                sql(
                    bmdb,
                    "INSERT INTO machine_hold VALUES ($1, now(), 'alice', 'test')",
                    id,
                )
                .await
            }
            Operation::Service => firmware_read(bmdb, id).await,
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
}

/// Its BMC read, its firmware listed: what a servicing needs.
async fn firmware_read(bmdb: &Bmdb, id: Uuid) {
    sql(
        bmdb,
        "INSERT INTO machine_bmc_facts (machine_id, bmc_url) VALUES ($1, 'https://127.0.0.1:1') \
         ON CONFLICT (machine_id) DO NOTHING",
        id,
    )
    .await;
    sql(
        bmdb,
        "INSERT INTO machine_firmware_read (machine_id) VALUES ($1)",
        id,
    )
    .await;
}

/// A baseline that selects every machine.
fn every() -> shepherd::baselines::Baselines {
    shepherd::baselines::Baselines::new(
        &[shepherd::config::BaselineConfig {
            name: "every".into(),
            secure_boot: Some(true),
            ..Default::default()
        }],
        &[],
    )
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
        // A tenant's installed machine only when forced.
        Operation::Service => (
            "service".into(),
            json!({"force": true, "reason": "life cycle test"}),
        ),
        Operation::Accept => (
            "accept".into(),
            json!({"bmc_url": "https://127.0.0.1:1", "bmc_username": "admin",
                   "bmc_password": "bmc-password", "bmc_tls": "insecure",
                   "reason": "life cycle test"}),
        ),
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
            baselines: std::sync::Arc::new(every()),
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
fn the_guide_shows_the_table_the_code_enforces() {
    let guide = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/src/lifecycle.md"
    ))
    .unwrap();
    let table = shepherd::bmdb::lifecycle::markdown_table();
    assert!(
        guide.contains(&table),
        "docs/src/lifecycle.md's life-cycle table differs from the code's; it should read:\n{table}"
    );
}

/// A takeover's lease of `id`, as the Initializer takes it.
async fn lease_takeover(session: &Session, id: Uuid) -> shepherd::bmdb::Work<()> {
    session
        .lease(
            Process::ShepherdAgentStart,
            async move |_tx: &mut shepherd::bmdb::Tx<'_>| Ok(Some((id, ()))),
        )
        .await
        .unwrap()
        .expect("leased")
}

/// The state `id` shows; the state its summary row keeps for the fleet's
/// listing agrees (unless a backoff in it ran out, to be settled).
async fn state(bmdb: &Bmdb, id: Uuid) -> Option<MachineState> {
    let derived = bmdb
        .transact(async |tx| shepherd::bmdb::lifecycle::state_of(tx, id).await)
        .await
        .unwrap();
    let kept: Option<(String, bool)> = bmdb
        .transact(async |tx| {
            Ok(tx
                .query_opt(
                    "SELECT state, coalesce(state_until <= now(), false) \
                       FROM machine_summary WHERE machine_id = $1",
                    &[&id],
                )
                .await?
                .map(|r| (r.get(0), r.get(1))))
        })
        .await
        .unwrap();
    if let (Some(d), Some((kept, false))) = (derived, kept) {
        assert_eq!(kept, d.as_str(), "the state kept for {id}");
    }
    derived
}

/// The tally (what the fleet page and `/metrics` count) is every
/// machine's derived state, counted, before and after it is settled; its
/// agents' keys are what a count of the rows finds.
async fn tally_agrees(bmdb: &Bmdb) {
    use shepherd::bmdb::machines;
    let counted = async || -> Vec<(MachineState, i64)> {
        let rows = bmdb
            .transact(async |tx| {
                tx.query(
                    "SELECT machine_state(s), count(*) FROM machine_summary s GROUP BY 1",
                    &[],
                )
                .await
            })
            .await
            .unwrap();
        let mut v: Vec<(MachineState, i64)> = rows
            .iter()
            .map(|r| (MachineState::parse(r.get(0)).unwrap(), r.get(1)))
            .collect();
        v.sort_by_key(|(s, _)| MachineState::ALL.iter().position(|x| x == s));
        v
    };
    let before = bmdb
        .transact(async |tx| machines::tally(tx).await)
        .await
        .unwrap();
    assert_eq!(before.states, counted().await, "the tally before settling");
    let settled = bmdb
        .transact(async |tx| machines::settle(tx).await)
        .await
        .unwrap();
    assert!(settled.folded > 0, "{settled:?}");
    let after = bmdb
        .transact(async |tx| machines::tally(tx).await)
        .await
        .unwrap();
    assert_eq!(after.states, counted().await, "the tally after settling");
    let pending: i64 = bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one("SELECT count(*) FROM machine_tally_delta", &[])
                .await?
                .get(0))
        })
        .await
        .unwrap();
    assert_eq!(pending, 0, "every delta folded");

    // The agents per provider and per endpoint (V26), as kept and as
    // counted afresh from the rows.
    let keys = "SELECT key, n FROM machine_tally WHERE key LIKE '%/%' AND n <> 0 ORDER BY key";
    let read = async || -> Vec<(String, i64)> {
        let rows = bmdb
            .transact(async |tx| tx.query(keys, &[]).await)
            .await
            .unwrap();
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    };
    let kept = read().await;
    bmdb.transact(async |tx| tx.execute("SELECT machine_tally_rebuild()", &[]).await)
        .await
        .unwrap();
    assert_eq!(kept, read().await, "the agents' keys, kept and counted");
}

/// The agent's report of the machine's current generation, as the
/// callback's writer stores it.
async fn report(bmdb: &Bmdb, id: Uuid, result: &str) {
    let q = format!(
        "INSERT INTO machine_os_installation_report \
         (machine_id, generation, os_installation_result, os_installation_report_raw) \
         SELECT machine_id, generation, '{result}', '\\x0801' FROM machine_os_installation_request \
         WHERE machine_id = $1 \
         ON CONFLICT (machine_id) DO UPDATE SET generation = EXCLUDED.generation, \
             os_installation_result = EXCLUDED.os_installation_result"
    );
    sql(bmdb, &q, id).await;
}

/// `event` on machine `id`, written as shepherd, its operators and its
/// agents write it: through the library's own functions where there is
/// one (leases, actions, installations, enrollment), else the rows an
/// agent's report or the provider's listing writes.
async fn apply(
    bmdb: &Bmdb,
    session: &Session,
    event: Event,
    id: Uuid,
    lease: Option<shepherd::bmdb::Work<()>>,
) -> Result<(), String> {
    use shepherd::bmdb::actions::{self, Action, Request};
    use shepherd::bmdb::installations::{self, Asked, Asker};
    let backoff = shepherd::bmdb::Backoff {
        initial: Duration::from_secs(3600),
        maximum: None,
        exponent: 1.0,
        jitter: 0.0,
    };
    let leased = async |process: Process| -> shepherd::bmdb::Work<()> {
        session
            .lease(process, async move |_tx: &mut shepherd::bmdb::Tx<'_>| {
                Ok(Some((id, ())))
            })
            .await
            .unwrap()
            .expect("leased")
    };
    let act = async |action: Action| -> Result<(), String> {
        let req = Request::new(id, action, "transition-test");
        match bmdb.transact(async |tx| actions::act(tx, &req).await).await {
            Ok(actions::Outcome::Done(_)) => Ok(()),
            Ok(other) => Err(format!("{action}: {other:?}")),
            Err(e) => Err(format!("{action}: {e}")),
        }
    };
    let asker = Asker {
        actor: "transition-test",
        action_id: Uuid::new_v4(),
        rollout_id: None,
        reason: None,
    };
    let asked = |r: Result<Asked, shepherd::bmdb::BmdbError>| match r {
        Ok(Asked::Done { .. }) => Ok(()),
        Ok(Asked::Refused(why)) => Err(format!("refused: {why}")),
        Ok(Asked::NotFound) => Err("not found".into()),
        Err(e) => Err(e.to_string()),
    };
    match event {
        Event::TakeoverLeased => std::mem::forget(leased(Process::ShepherdAgentStart).await),
        Event::TakeoverFailed => {
            let mut w = lease.expect("the takeover's lease");
            w.fail_with(&backoff, "transition test", async |_| Ok(()))
                .await
                .map_err(|e| e.to_string())?;
        }
        Event::TakeoverDone => {
            let mut w = lease.expect("the takeover's lease");
            w.finish(async |tx| {
                tx.execute(
                    "INSERT INTO machine_agent_started VALUES ($1, now(), '\\x0202')",
                    &[&id],
                )
                .await
                .map(|_| ())
            })
            .await
            .map_err(|e| e.to_string())?;
        }
        Event::RecoveryFailed => {
            let mut w = leased(Process::ShepherdRecovery).await;
            w.fail_with(&backoff, "transition test", async |_| Ok(()))
                .await
                .map_err(|e| e.to_string())?;
        }
        Event::BootFailed => {
            let mut w = leased(Process::ShepherdAgentStart).await;
            w.fail_with(&backoff, "transition test", async |_| Ok(()))
                .await
                .map_err(|e| e.to_string())?;
        }
        Event::LiveAgentEnrolled => {
            bmdb.transact(async |tx| {
                let boot = shepherd::bmdb::boot::issue(tx, id, Duration::from_secs(600)).await?;
                shepherd::bmdb::boot::enroll(tx, id, &boot.credential, &[7; 32], "127.0.0.1:1")
                    .await?;
                shepherd::bmdb::bmc_boot::request_done(tx, id).await
            })
            .await
            .map_err(|e| e.to_string())?;
        }
        Event::BackoffCleared => act(Action::Retry).await?,
        Event::Accepted => {
            let mut req = Request::new(id, Action::Accept, "transition-test");
            req.accept = Some(acceptance());
            match bmdb.transact(async |tx| actions::act(tx, &req).await).await {
                Ok(actions::Outcome::Done(_)) => {}
                Ok(other) => return Err(format!("accept: {other:?}")),
                Err(e) => return Err(format!("accept: {e}")),
            }
            // Still discovered until its BMC is read; then the Updater asks
            // its disks erased.
            if state(bmdb, id).await != Some(MachineState::Discovered) {
                return Err("accepted, it is no longer discovered before its BMC is read".into());
            }
            sql(
                bmdb,
                "INSERT INTO machine_bmc_facts (machine_id, bmc_url) VALUES ($1, 'https://127.0.0.1:1')",
                id,
            )
            .await;
            let erased = bmdb
                .transact(async |tx| installations::erase_accepted(tx).await)
                .await
                .map_err(|e| e.to_string())?;
            if !erased.iter().any(|e| e.machine_id == id && e.asked.is_ok()) {
                return Err(format!("its erasure was not asked: {erased:?}"));
            }
        }
        Event::InspectAsked => act(Action::Inspect).await?,
        Event::Held => act(Action::Hold).await?,
        Event::Released => act(Action::Release).await?,
        Event::InstallAsked => {
            let image = shepherd_proto::api::ImageInstallation {
                url: "https://images.example/os.img".into(),
                digest: format!("sha256:{}", "ab".repeat(32)),
                ..Default::default()
            };
            asked(
                bmdb.transact(async |tx| installations::ask(tx, id, &image, &asker).await)
                    .await,
            )?
        }
        Event::DeprovisionAsked => {
            let erasure = shepherd_proto::api::DiskErasure::default();
            asked(
                bmdb.transact(async |tx| {
                    installations::deprovision(tx, id, &erasure, &asker).await
                })
                .await,
            )?
        }
        Event::Installed | Event::Erased => report(bmdb, id, "Success").await,
        Event::InstallFailed | Event::EraseFailed => report(bmdb, id, "Error").await,
        Event::ServiceAsked => {
            firmware_read(bmdb, id).await;
            let ask = shepherd::bmdb::servicing::Ask {
                action_id: Uuid::new_v4(),
                actor: "transition-test",
                reason: None,
                baseline: "every",
                forced: true,
                rollout_id: None,
            };
            match bmdb
                .transact(async |tx| shepherd::bmdb::servicing::ask(tx, id, &ask).await)
                .await
            {
                Ok(shepherd::bmdb::servicing::Asked::Done { .. }) => {}
                other => return Err(format!("service: {other:?}")),
            }
        }
        Event::ServiceDone | Event::ServiceFailed => {
            let result = if event == Event::ServiceDone {
                Ok("at its baseline".to_string())
            } else {
                Err("the BMC refused".to_string())
            };
            let mut w = leased(Process::ShepherdAgentStart).await;
            w.finish(async |tx| {
                let s = shepherd::bmdb::servicing::of_machine(tx, id)
                    .await?
                    .expect("a servicing");
                shepherd::bmdb::servicing::end(tx, id, s.service_id, &result)
                    .await
                    .map(|_| ())
            })
            .await
            .map_err(|e| e.to_string())?;
        }
        Event::ProviderForgot => {
            sql(bmdb, "DELETE FROM machine_provided WHERE machine_id = $1", id).await
        }
        Event::ProviderListed => {
            sql(
                bmdb,
                "INSERT INTO machine_provided (machine_id, provider, provider_id, provider_ip_address, provider_status) \
                 VALUES ($1::uuid, 'Equinix', 'listed-again-' || $1::uuid::text, '127.0.0.1', 'Running')",
                id,
            )
            .await
        }
    }
    Ok(())
}

#[actix_rt::test]
async fn every_declared_transition_is_what_the_bmdb_derives() {
    use shepherd::bmdb::lifecycle::TRANSITIONS;
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let session = bmdb
        .start_session("transition-test", Some(Duration::from_secs(300)))
        .await
        .unwrap();
    // Every state is in the table, as a place to come from or go to.
    for s in MachineState::ALL {
        assert!(
            TRANSITIONS
                .iter()
                .any(|(from, _, to)| *from == s || *to == s),
            "{s} is in no declared transition"
        );
    }
    let mut wrong = Vec::new();
    for (from, event, to) in TRANSITIONS.iter().copied() {
        let (id, lease) = if from == MachineState::Leased {
            let id = machine_in(&bmdb, &session, MachineState::Pending, false).await;
            let w = lease_takeover(&session, id).await;
            (id, Some(w))
        } else {
            (machine_in(&bmdb, &session, from, false).await, None)
        };
        assert_eq!(state(&bmdb, id).await, Some(from), "the fixture for {from}");
        if let Err(e) = apply(&bmdb, &session, event, id, lease).await {
            wrong.push(format!(
                "{from} --{event}--> {to}: the event was refused: {e}"
            ));
            continue;
        }
        let got = state(&bmdb, id).await;
        if got != Some(to) {
            wrong.push(format!(
                "{from} --{event}--> {to}: the BMDB derives {}",
                got.map(|s| s.to_string()).unwrap_or("nothing".into())
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    tally_agrees(&bmdb).await;
    println!(
        "{} transitions, each as the BMDB derives it",
        TRANSITIONS.len()
    );
}
