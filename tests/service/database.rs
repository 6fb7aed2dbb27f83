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

/// Two inventory hosts taken over by `shepherd run` (5 s sessions), on a
/// PostgreSQL of the test's own, to stop and start.
async fn two_hosts_taken_over_on_a_postgres_of_our_own() -> (Rig, Shepherd) {
    let rig = Rig::with_own_postgres().await;
    let mut s = rig.run_inventory(2, "session_interval = \"5s\"", "ok");
    rig.wait_for(
        "2 agents started",
        AGENTS,
        2,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    (rig, s)
}

#[actix_rt::test]
async fn after_a_long_outage_a_new_session_comes_within_seconds() {
    let (mut rig, mut s) = two_hosts_taken_over_on_a_postgres_of_our_own().await;
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

/// GET `path` of `s`'s admin server as a probe does (`curl -m`): one
/// connection, HTTP/1.0, failing the test if the whole answer takes
/// longer than `within`. Status and body.
async fn probe(s: &Shepherd, path: &str, within: Duration) -> (u16, String) {
    use std::io::{Read, Write};
    let url = s.admin_url();
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        c.set_read_timeout(Some(within)).unwrap();
        write!(
            c,
            "GET /{path} HTTP/1.0\r\nHost: {addr}\r\nAccept: text/html,application/json\r\n\r\n"
        )
        .unwrap();
        let mut answer = Vec::new();
        if let Err(e) = c.read_to_end(&mut answer) {
            panic!("/{path}: no whole answer within {within:?}: {e}");
        }
        assert!(
            started.elapsed() <= within,
            "/{path} answered after {:?}",
            started.elapsed()
        );
        let text = String::from_utf8_lossy(&answer).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_string();
        (status, body)
    })
    .await
    .unwrap()
}

#[actix_rt::test]
async fn with_the_database_away_readiness_the_api_and_the_pages_answer_503_at_once() {
    let (mut rig, mut s) = two_hosts_taken_over_on_a_postgres_of_our_own().await;
    const ROUTES: [&str; 3] = ["readyz", "api/v1/machines", ""];
    for path in ROUTES {
        let (status, body) = probe(&s, path, Duration::from_secs(10)).await;
        assert_eq!(status, 200, "/{path}: {body}\n{}", s.log_text());
    }
    rig.db.own().stop();
    // admin.database_timeout is 1 s: each answers 503 naming the database
    // well before a probe's patience runs out, again and again.
    for round in 0..3 {
        for path in ROUTES {
            let (status, body) = probe(&s, path, Duration::from_secs(3)).await;
            assert_eq!(status, 503, "/{path} (round {round}): {body}");
            assert!(
                body.contains("BMDB") || body.contains("database"),
                "/{path} names the database: {body}"
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "shepherd rides out the outage"
    );
    rig.db.own().start_again().await;
    for path in ROUTES {
        let t = Instant::now();
        loop {
            let (status, body) = probe(&s, path, Duration::from_secs(3)).await;
            if status == 200 {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "/{path} still {status} after the database came back: {body}\n{}",
                s.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    s.terminate().await;
}
