//! Operator actions against the BMDB: each one's effect and audit row, its
//! refusals, a request run twice acting once, and holds and reboot requests
//! as the selectors see them.

use std::time::Duration;

use shepherd::bmdb::actions::{self, Action, Outcome, Request};
use shepherd::bmdb::selectors;
use shepherd::bmdb::{Bmdb, Process, Provider};
use uuid::Uuid;

use crate::{count, fleet, lease};

async fn run(bmdb: &Bmdb, req: &Request) -> Outcome {
    bmdb.transact(async |tx| actions::act(tx, req).await)
        .await
        .unwrap()
}

async fn done(bmdb: &Bmdb, machine: Uuid, action: Action) -> actions::Audit {
    match run(bmdb, &Request::new(machine, action, "tester")).await {
        Outcome::Done(a) => a,
        other => panic!("{action} of {machine}: {other:?}"),
    }
}

async fn refused(bmdb: &Bmdb, req: Request) -> String {
    match run(bmdb, &req).await {
        Outcome::Refused(why) => why,
        other => panic!(
            "{} of {} was not refused: {other:?}",
            req.action, req.machine_id
        ),
    }
}

async fn agent_start_candidates(bmdb: &Bmdb) -> Vec<Uuid> {
    bmdb.transact(async |tx| selectors::needs_agent_start(tx, Provider::Equinix, 100).await)
        .await
        .unwrap()
        .iter()
        .map(|m| m.machine_id)
        .collect()
}

#[actix_rt::test]
async fn hold_keeps_the_selectors_away_and_release_gives_the_machine_back() {
    let f = fleet(2, None).await;
    let (held, free) = (f.ids[0], f.ids[1]);
    let mut req = Request::new(held, Action::Hold, "alice");
    req.reason = Some("maintenance".into());
    let Outcome::Done(a) = run(&f.bmdb, &req).await else {
        panic!("hold")
    };
    assert_eq!((a.actor.as_str(), a.action.as_str()), ("alice", "hold"));
    assert_eq!(a.reason.as_deref(), Some("maintenance"));
    assert_eq!(agent_start_candidates(&f.bmdb).await, vec![free]);
    let why = refused(&f.bmdb, Request::new(held, Action::Hold, "bob")).await;
    assert!(why.contains("already held (by alice since"), "{why}");
    let why = refused(&f.bmdb, Request::new(held, Action::Reboot, "bob")).await;
    assert!(why.contains("is held"), "{why}");

    // A started agent gone quiet: not recovered while held either.
    f.bmdb
        .transact(async |tx| {
            tx.execute(
                "INSERT INTO machine_agent_started VALUES ($1, now() - interval '2 hours', '\\x01')",
                &[&held],
            )
            .await
        })
        .await
        .unwrap();
    shepherd_sim::testing::serve_test_endpoint(&f.bmdb).await;
    let recovery = async || {
        f.bmdb
            .transact(async |tx| crate::due_for_recovery(tx, Provider::Equinix).await)
            .await
            .unwrap()
            .len()
    };
    assert_eq!(recovery().await, 0);
    done(&f.bmdb, held, Action::Release).await;
    assert_eq!(recovery().await, 1, "released: due for recovery again");
    let why = refused(&f.bmdb, Request::new(held, Action::Release, "bob")).await;
    assert!(why.contains("is not held"), "{why}");
    assert_eq!(
        count(&f.bmdb, "SELECT count(*) FROM operator_action").await,
        2
    );
}

#[actix_rt::test]
async fn a_reboot_request_is_selected_for_recovery_whatever_the_agent_does() {
    let f = fleet(2, None).await;
    let m = f.ids[0];
    let requested = async || {
        f.bmdb
            .transact(async |tx| selectors::reboot_requested(tx, Provider::Equinix, 10).await)
            .await
            .unwrap()
            .iter()
            .map(|m| m.machine_id)
            .collect::<Vec<_>>()
    };
    assert!(requested().await.is_empty());
    done(&f.bmdb, m, Action::Reboot).await;
    assert_eq!(requested().await, vec![m]);
    let why = refused(&f.bmdb, Request::new(m, Action::Reboot, "bob")).await;
    assert!(why.contains("already requested"), "{why}");
    // Not while other work runs on it, nor while its recovery backs off.
    let mut w = lease(&f.session, Process::ShepherdAgentStart, m).await;
    assert!(requested().await.is_empty(), "leased");
    w.fail(
        &shepherd::bmdb::Backoff::constant(Duration::from_secs(600)),
        "x",
    )
    .await
    .unwrap();
    assert_eq!(
        requested().await,
        vec![m],
        "the agent-start backoff is not the recovery's"
    );
    let mut w = lease(&f.session, Process::ShepherdRecovery, m).await;
    w.fail(
        &shepherd::bmdb::Backoff::constant(Duration::from_secs(600)),
        "reboot: no answer",
    )
    .await
    .unwrap();
    assert!(requested().await.is_empty(), "recovery backed off");
    // Retry clears exactly the named process's backoff.
    let mut req = Request::new(m, Action::Retry, "cli");
    req.process = Some(Process::ShepherdRecovery);
    let Outcome::Done(a) = run(&f.bmdb, &req).await else {
        panic!("retry")
    };
    assert_eq!(a.detail, "cleared the backoff of ShepherdRecovery");
    assert_eq!(requested().await, vec![m]);
    assert_eq!(
        count(&f.bmdb, "SELECT count(*) FROM work_backoff").await,
        1,
        "the ShepherdAgentStart backoff stays"
    );
    let a = done(&f.bmdb, m, Action::Retry).await;
    assert_eq!(a.detail, "cleared the backoff of ShepherdAgentStart");
    let why = refused(&f.bmdb, Request::new(m, Action::Retry, "cli")).await;
    assert!(why.contains("is not backed off"), "{why}");
}

#[actix_rt::test]
async fn retakeover_is_refused_while_the_machine_is_leased_and_a_request_acts_once() {
    let f = fleet(1, None).await;
    let m = f.ids[0];
    f.bmdb
        .transact(async |tx| {
            tx.execute(
                "INSERT INTO machine_agent_started VALUES ($1, now(), '\\x01')",
                &[&m],
            )
            .await?;
            tx.execute(
                "INSERT INTO machine_agent_heartbeat VALUES ($1, now())",
                &[&m],
            )
            .await?;
            tx.execute(
                "INSERT INTO machine_ssh_host_key VALUES ($1, 'ssh-ed25519 AAAA', now())",
                &[&m],
            )
            .await
        })
        .await
        .unwrap();
    let mut w = lease(&f.session, Process::ShepherdRecovery, m).await;
    let why = refused(&f.bmdb, Request::new(m, Action::Retakeover, "cli")).await;
    assert!(why.contains("is leased for ShepherdRecovery"), "{why}");
    w.cancel().await.unwrap();
    let mut req = Request::new(m, Action::Retakeover, "cli");
    req.forget_host_key = true;
    let first = run(&f.bmdb, &req).await;
    let Outcome::Done(a) = &first else {
        panic!("{first:?}")
    };
    assert_eq!(
        a.detail,
        "dropped its agent; the Initializer takes it over again; forgot its SSH host key"
    );
    // The same request again (a lost answer, retried): its row, no second act.
    assert_eq!(run(&f.bmdb, &req).await, first);
    assert_eq!(
        count(&f.bmdb, "SELECT count(*) FROM operator_action").await,
        1
    );
    for table in [
        "SELECT count(*) FROM machine_agent_started",
        "SELECT count(*) FROM machine_agent_heartbeat",
        "SELECT count(*) FROM machine_ssh_host_key",
    ] {
        assert_eq!(count(&f.bmdb, table).await, 0, "{table}");
    }
    assert_eq!(agent_start_candidates(&f.bmdb).await, vec![m]);
    // An unknown machine, and a reason too long.
    assert_eq!(
        run(&f.bmdb, &Request::new(Uuid::new_v4(), Action::Hold, "cli")).await,
        Outcome::NotFound
    );
    let mut req = Request::new(m, Action::Hold, "cli");
    req.reason = Some("x".repeat(actions::MAX_REASON + 1));
    assert!(refused(&f.bmdb, req).await.contains("at most 1000"));
}
