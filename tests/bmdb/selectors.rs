use std::collections::BTreeSet;

use shepherd::bmdb::selectors::{self, ProvidedMachine, RecoveryThresholds};
use shepherd::bmdb::{Bmdb, BmdbError, Process, Provider, Tx};
use shepherd_sim::testing::TestDb;
use uuid::Uuid;

use crate::{count, provided_machines};

const AGENT_1H: &str =
    "INSERT INTO machine_agent_started VALUES ($1, now() - interval '1 hour', '\\x01')";
const AGENT_10M: &str =
    "INSERT INTO machine_agent_started VALUES ($1, now() - interval '10 minutes', '\\x01')";
const HB_FRESH: &str =
    "INSERT INTO machine_agent_heartbeat VALUES ($1, now() - interval '1 minute')";
const HB_STALE: &str =
    "INSERT INTO machine_agent_heartbeat VALUES ($1, now() - interval '20 minutes')";
const START_BACKOFF_LIVE: &str = "INSERT INTO work_backoff VALUES ($1, 'ShepherdAgentStart', now() + interval '1 hour', 'x', 60)";
const START_BACKOFF_EXPIRED: &str = "INSERT INTO work_backoff VALUES ($1, 'ShepherdAgentStart', now() - interval '1 minute', 'x', 60)";
const REC_BACKOFF_LIVE: &str =
    "INSERT INTO work_backoff VALUES ($1, 'ShepherdRecovery', now() + interval '1 hour', 'x', 60)";
const REC_BACKOFF_EXPIRED: &str = "INSERT INTO work_backoff VALUES ($1, 'ShepherdRecovery', now() - interval '1 minute', 'x', 60)";
const REQ_1: &str = "INSERT INTO machine_os_installation_request VALUES ($1, 1, '\\x')";
const REQ_2: &str = "INSERT INTO machine_os_installation_request VALUES ($1, 2, '\\x')";
const REP_1: &str = "INSERT INTO machine_os_installation_report VALUES ($1, 1, 'Success', '\\x')";
const WORK_RECOVERY: &str =
    "INSERT INTO work SELECT $1, session_id, 'ShepherdRecovery' FROM sessions";
const WORK_ACCESS: &str = "INSERT INTO work SELECT $1, session_id, 'ShepherdAccess' FROM sessions";
const WORK_AGENT_START: &str =
    "INSERT INTO work SELECT $1, session_id, 'ShepherdAgentStart' FROM sessions";
const WORK_UNIT_TEST: &str = "INSERT INTO work SELECT $1, session_id, 'UnitTest1' FROM sessions";

/// Whether the Equinix selectors pick a machine set up so.
struct Case {
    name: &'static str,
    provider: Provider,
    setup: &'static [&'static str],
    needs_start: bool,
    needs_recovery: bool,
}

const fn case(
    name: &'static str,
    provider: Provider,
    setup: &'static [&'static str],
    needs_start: bool,
    needs_recovery: bool,
) -> Case {
    Case {
        name,
        provider,
        setup,
        needs_start,
        needs_recovery,
    }
}

use Provider::{Equinix, Lumen};
const CASES: &[Case] = &[
    case("provided, nothing else", Equinix, &[], true, false),
    case("another provider's", Lumen, &[], false, false),
    case(
        "agent running, heartbeat fresh",
        Equinix,
        &[AGENT_1H, HB_FRESH],
        false,
        false,
    ),
    case(
        "heartbeat stale",
        Equinix,
        &[AGENT_1H, HB_STALE],
        false,
        true,
    ),
    case(
        "no heartbeat 1h after start",
        Equinix,
        &[AGENT_1H],
        false,
        true,
    ),
    case(
        "no heartbeat 10m after start",
        Equinix,
        &[AGENT_10M],
        false,
        false,
    ),
    case(
        "agent start backoff live",
        Equinix,
        &[START_BACKOFF_LIVE],
        false,
        false,
    ),
    case(
        "agent start backoff expired",
        Equinix,
        &[START_BACKOFF_EXPIRED],
        true,
        false,
    ),
    case(
        "recovery backoff only",
        Equinix,
        &[REC_BACKOFF_LIVE],
        true,
        false,
    ),
    case(
        "installation fulfilled",
        Equinix,
        &[REQ_1, REP_1],
        false,
        false,
    ),
    case(
        "installation pending",
        Equinix,
        &[REQ_2, REP_1],
        true,
        false,
    ),
    case(
        "installation requested, no report",
        Equinix,
        &[REQ_1],
        true,
        false,
    ),
    case(
        "leased for recovery",
        Equinix,
        &[WORK_RECOVERY],
        false,
        false,
    ),
    case("leased for access", Equinix, &[WORK_ACCESS], false, false),
    case(
        "leased for an unrelated process",
        Equinix,
        &[WORK_UNIT_TEST],
        true,
        false,
    ),
    case(
        "stale, recovery backoff live",
        Equinix,
        &[AGENT_1H, HB_STALE, REC_BACKOFF_LIVE],
        false,
        false,
    ),
    case(
        "stale, recovery backoff expired",
        Equinix,
        &[AGENT_1H, HB_STALE, REC_BACKOFF_EXPIRED],
        false,
        true,
    ),
    case(
        "stale, agent start backoff live",
        Equinix,
        &[AGENT_1H, HB_STALE, START_BACKOFF_LIVE],
        false,
        true,
    ),
    case(
        "stale, installation fulfilled",
        Equinix,
        &[AGENT_1H, HB_STALE, REQ_1, REP_1],
        false,
        false,
    ),
    case(
        "stale, leased for agent start",
        Equinix,
        &[AGENT_1H, HB_STALE, WORK_AGENT_START],
        false,
        false,
    ),
    case(
        "stale, another provider's",
        Lumen,
        &[AGENT_1H, HB_STALE],
        false,
        false,
    ),
    case(
        "silent, leased for access",
        Equinix,
        &[AGENT_1H, WORK_ACCESS],
        false,
        false,
    ),
];

async fn run(bmdb: &Bmdb, sql: &'static str, mid: Uuid) {
    bmdb.transact(async |tx| tx.execute(sql, &[&mid]).await)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn selected(bmdb: &Bmdb, provider: Provider) -> (BTreeSet<Uuid>, BTreeSet<Uuid>) {
    let ids =
        |v: Vec<ProvidedMachine>| v.into_iter().map(|m| m.machine_id).collect::<BTreeSet<_>>();
    shepherd_sim::testing::serve_test_endpoint(bmdb).await;
    bmdb.transact(async |tx| {
        let start = selectors::needs_agent_start(tx, provider, 1000).await?;
        let recovery = crate::due_for_recovery(tx, provider).await?;
        Ok((ids(start), ids(recovery)))
    })
    .await
    .unwrap()
}

fn names(set: &BTreeSet<Uuid>, ids: &[Uuid]) -> Vec<&'static str> {
    ids.iter()
        .zip(CASES)
        .filter(|(id, _)| set.contains(id))
        .map(|(_, c)| c.name)
        .collect()
}

#[actix_rt::test]
async fn selectors_return_exactly_the_machines_the_semantics_say() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let _holder = bmdb.start_session("holder", None).await.unwrap();
    let mut ids = Vec::new();
    for c in CASES {
        let mid = provided_machines(&bmdb, c.provider, 1).await[0];
        for sql in c.setup {
            run(&bmdb, sql, mid).await;
        }
        ids.push(mid);
    }
    // A machine nobody provides is never selected.
    let bare = Uuid::new_v4();
    run(&bmdb, "INSERT INTO machines (machine_id) VALUES ($1)", bare).await;

    let expect = |f: fn(&Case) -> bool, p: Provider| -> BTreeSet<Uuid> {
        ids.iter()
            .zip(CASES)
            .filter(|(_, c)| c.provider == p && f(c))
            .map(|(id, _)| *id)
            .collect()
    };
    let (start, recovery) = selected(&bmdb, Equinix).await;
    let want_start = expect(|c| c.needs_start, Equinix);
    let want_recovery = expect(|c| c.needs_recovery, Equinix);
    assert_eq!(
        names(&start, &ids),
        names(&want_start, &ids),
        "needs agent start"
    );
    assert_eq!(
        names(&recovery, &ids),
        names(&want_recovery, &ids),
        "needs recovery"
    );
    assert_eq!(start, want_start);
    assert_eq!(recovery, want_recovery);

    // The Lumen machines are Lumen's.
    let (start, recovery) = selected(&bmdb, Lumen).await;
    assert_eq!(names(&start, &ids), vec!["another provider's"]);
    assert_eq!(names(&recovery, &ids), vec!["stale, another provider's"]);

    // Tags change; the summary follows (triggers), and so do the selectors.
    let id = |name: &str| ids[CASES.iter().position(|c| c.name == name).unwrap()];
    run(
        &bmdb,
        "UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() WHERE machine_id = $1",
        id("heartbeat stale"),
    )
    .await;
    run(
        &bmdb,
        "DELETE FROM machine_agent_started WHERE machine_id = $1",
        id("agent running, heartbeat fresh"),
    )
    .await;
    run(
        &bmdb,
        "UPDATE machine_os_installation_request SET generation = 2 WHERE machine_id = $1",
        id("installation fulfilled"),
    )
    .await;
    run(
        &bmdb,
        "DELETE FROM work_backoff WHERE machine_id = $1",
        id("agent start backoff live"),
    )
    .await;
    run(
        &bmdb,
        "DELETE FROM work WHERE machine_id = $1",
        id("leased for recovery"),
    )
    .await;
    run(
        &bmdb,
        "DELETE FROM machine_provided WHERE machine_id = $1",
        id("provided, nothing else"),
    )
    .await;
    run(
        &bmdb,
        "DELETE FROM machine_agent_heartbeat WHERE machine_id = $1",
        id("stale, recovery backoff expired"),
    )
    .await;
    run(
        &bmdb,
        "UPDATE machine_agent_started SET agent_started_at = now() WHERE machine_id = $1",
        id("no heartbeat 1h after start"),
    )
    .await;

    let (start, recovery) = selected(&bmdb, Equinix).await;
    let mut want_start = expect(|c| c.needs_start, Equinix);
    want_start.remove(&id("provided, nothing else"));
    for n in [
        "agent running, heartbeat fresh",
        "installation fulfilled",
        "agent start backoff live",
        "leased for recovery",
    ] {
        want_start.insert(id(n));
    }
    let mut want_recovery = expect(|c| c.needs_recovery, Equinix);
    want_recovery.remove(&id("heartbeat stale"));
    want_recovery.remove(&id("no heartbeat 1h after start"));
    // Its heartbeat row is gone, but it started an hour ago: silent, still due.
    assert!(want_recovery.contains(&id("stale, recovery backoff expired")));
    assert_eq!(names(&start, &ids), names(&want_start, &ids));
    assert_eq!(names(&recovery, &ids), names(&want_recovery, &ids));
}

#[actix_rt::test]
async fn thresholds_are_configurable() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let mid = provided_machines(&bmdb, Equinix, 1).await[0];
    run(&bmdb, AGENT_10M, mid).await;
    let with = async |silent_min: u64| {
        let t = RecoveryThresholds {
            silent_after_start: std::time::Duration::from_secs(silent_min * 60),
            heartbeat_stale_after: std::time::Duration::from_secs(600),
            callback_grace: std::time::Duration::from_secs(60),
        };
        shepherd_sim::testing::serve_test_endpoint(&bmdb).await;
        bmdb.transact(async |tx| {
            selectors::needs_recovery(
                tx,
                Equinix,
                10,
                t,
                Some(shepherd_sim::testing::TEST_ENDPOINT),
            )
            .await
        })
        .await
        .unwrap()
        .len()
    };
    assert_eq!(with(30).await, 0);
    assert_eq!(with(5).await, 1);
}

/// Leasing through the selector: concurrent leasers each get a different
/// machine (SKIP LOCKED), never a conflict, until none is left.
#[actix_rt::test]
async fn concurrent_leasers_through_the_selector_spread_over_machines() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let ids = provided_machines(&bmdb, Equinix, 200).await;
    let mut tasks = Vec::new();
    for n in 0..8 {
        let bmdb = bmdb.clone();
        tasks.push(actix_rt::spawn(async move {
            let s = bmdb.start_session(&format!("l{n}"), None).await.unwrap();
            let mut got = Vec::new();
            loop {
                let r = s
                    .lease(Process::ShepherdAgentStart, async |tx: &mut Tx<'_>| {
                        Ok(selectors::needs_agent_start(tx, Equinix, 1)
                            .await?
                            .pop()
                            .map(|m| (m.machine_id, m)))
                    })
                    .await;
                match r {
                    Ok(Some(mut w)) => {
                        let mid = w.machine_id();
                        assert_eq!(w.item().machine_id, mid);
                        w.finish(async |tx| {
                            shepherd::bmdb::machines::set_agent_started(tx, mid, &[1; 32], None)
                                .await
                        })
                        .await
                        .unwrap();
                        got.push(mid);
                    }
                    Ok(None) => break got,
                    Err(BmdbError::WorkConflict { .. }) => {
                        panic!("leaser {n} collided despite SKIP LOCKED")
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let distinct: BTreeSet<_> = all.iter().copied().collect();
    assert_eq!(all.len(), 200, "every machine taken over exactly once");
    assert_eq!(distinct, ids.iter().copied().collect::<BTreeSet<_>>());
    assert_eq!(
        count(&bmdb, "SELECT count(*) FROM machine_agent_started").await,
        200
    );
}
