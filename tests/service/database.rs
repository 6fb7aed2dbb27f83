//! The BMDB under faults: a PostgreSQL of the test's own, restarted.

use super::*;

#[actix_rt::test]
async fn a_sub_second_database_restart_keeps_the_session_and_the_takeovers() {
    let mut rig = Rig::with_own_postgres().await;
    let mut s = rig.run_inventory(6, "session_interval = \"5s\"", "slow:3");
    rig.wait_for(
        "6 takeovers under way",
        WORK,
        6,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    // Under way means on the machines: every agent started (a lease whose
    // worker had not yet read the machine's host key is given back
    // untouched when the database is away, and taken again).
    let t = Instant::now();
    while rig.agent_runs().len() < 6 {
        assert!(t.elapsed() < Duration::from_secs(30), "{}", s.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = rig.sessions_alive().await;
    assert_eq!(before.len(), 1);
    let t = Instant::now();
    rig.db.own().stop();
    rig.db.own().start_again().await;
    let restart = t.elapsed();
    assert!(
        restart < Duration::from_secs(1),
        "the restart took {restart:?}"
    );
    rig.wait_for(
        "6 agents started",
        AGENTS,
        6,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    assert_eq!(rig.count(WORK).await, 0, "{}", s.log_text());
    assert_eq!(
        rig.sessions_alive().await,
        before,
        "the session must survive a {restart:?} restart:\n{}",
        s.log_text()
    );
    let events = rig.history_events().await;
    assert_eq!(
        events,
        [("Finished".to_string(), 6), ("Started".to_string(), 6)].into(),
        "no takeover aborted, failed or redone"
    );
    assert_eq!(rig.agent_runs(), vec![1; 6], "each agent ran once");
    s.terminate().await;
}

#[actix_rt::test]
async fn an_outage_during_takeovers_leaves_no_lease_without_a_worker() {
    let mut rig = Rig::with_own_postgres().await;
    // The agents finish while the database is away: their results wait.
    let mut s = rig.run_inventory(
        6,
        "session_interval = \"30s\"\nacquire_timeout = \"1s\"\nconnect_timeout = \"1s\"",
        "slow:2",
    );
    rig.wait_for(
        "6 takeovers under way",
        WORK,
        6,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    let before = rig.sessions_alive().await;
    rig.db.own().stop();
    tokio::time::sleep(Duration::from_secs(8)).await;
    rig.db.own().start_again().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Every takeover ended during the outage: no lease may be left.
    assert_eq!(
        rig.count(WORK).await,
        0,
        "leases left 5 s after the database came back:\n{}",
        s.log_text()
    );
    assert_eq!(rig.count(AGENTS).await, 6, "{}", s.log_text());
    assert_eq!(rig.sessions_alive().await, before, "{}", s.log_text());
    // Each machine finished once; none failed (a takeover that only began
    // as the database went away is given back, not backed off).
    let events = rig.history_events().await;
    assert_eq!(events.get("Finished"), Some(&6), "{events:?}");
    assert!(
        events.keys().all(|e| !e.starts_with("Failed")),
        "{events:?}\n{}",
        s.log_text()
    );
    assert_eq!(rig.agent_runs(), vec![1; 6], "each agent ran once");
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(log.contains("retrying until it is recorded"), "{log}");
    assert!(!log.contains("takeover failed"), "{log}");
    s.terminate().await;
}

#[actix_rt::test]
async fn after_a_long_outage_a_new_session_comes_within_seconds() {
    let mut rig = Rig::with_own_postgres().await;
    let mut s = rig.run_inventory(2, "session_interval = \"5s\"", "ok");
    rig.wait_for(
        "2 agents started",
        AGENTS,
        2,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    let before = rig.sessions_alive().await;
    assert_eq!(before.len(), 1);
    rig.db.own().stop();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "shepherd must ride out the outage"
    );
    rig.db.own().start_again().await;
    let back = Instant::now();
    let deadline = back + Duration::from_secs(20);
    let after = loop {
        let alive = rig.sessions_alive().await;
        if !alive.is_empty() && alive != before {
            break alive;
        }
        assert!(
            Instant::now() < deadline,
            "no new session:\n{}",
            s.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = back.elapsed();
    println!("new session {took:?} after the database came back");
    assert!(
        took < Duration::from_secs(5),
        "the new session came {took:?} after the database:\n{}",
        s.log_text()
    );
    assert_eq!(after.len(), 1);
    // And it works under it: machines whose agent tag is dropped are taken
    // over again.
    rig.bmdb
        .transact(async |tx| {
            tx.execute("DELETE FROM machine_agent_started", &[]).await?;
            Ok(())
        })
        .await
        .unwrap();
    rig.wait_for(
        "2 agents started again",
        AGENTS,
        2,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    s.terminate().await;
}
