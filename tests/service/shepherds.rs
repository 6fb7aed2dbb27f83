//! Several shepherds on one BMDB.

use super::*;

#[actix_rt::test]
async fn two_shepherds_take_a_hundred_hosts_over_once_each_and_one_finishes_when_the_other_is_killed()
 {
    let rig = Rig::new().await;
    // Slow enough agents that both processes are mid-fleet when one dies.
    let config = rig.write_config(
        "shepherd.toml",
        &rig.inventory_config(100, "session_interval = \"2s\"")
            .replace("parallelism = 8", "parallelism = 4"),
    );
    std::fs::write(rig.sshd.dir().join("takeover-agent.mode"), "slow:0.2").unwrap();
    let mut a = rig.shepherd(&config, "a.log");
    let b = rig.shepherd(&config, "b.log");
    // Both work; then one is killed mid-fleet.
    rig.wait_for(
        "20 taken over",
        "SELECT least(count(*), 20) FROM machine_agent_started",
        20,
        Duration::from_secs(60),
        &mut a,
    )
    .await;
    let started = |s: &Shepherd| {
        std::fs::read_to_string(&s.log)
            .unwrap()
            .matches("agent started")
            .count()
    };
    assert!(started(&b) > 0, "b took nothing over before being killed");
    kill(Pid::from_raw(b.child.id() as i32), Signal::SIGKILL).unwrap();
    let by_b = started(&b);
    // The survivor finishes the fleet, the dead one's leases included.
    rig.wait_for(
        "100 taken over",
        AGENTS,
        100,
        Duration::from_secs(120),
        &mut a,
    )
    .await;
    // Between them, every takeover is logged, but for those b recorded in
    // the BMDB and was killed before logging (at most its parallelism).
    let (by_a, by_b_after) = (started(&a), started(&b));
    assert!(
        by_a > 0 && by_a + by_b_after >= 100 - 4 && by_a + by_b_after <= 100,
        "a logged {by_a}, b {by_b_after} (at the kill {by_b})"
    );
    // Each agent ran once; at most the ones the killed process was taking
    // over when it died ran twice (their takeovers never recorded).
    let runs = rig.agent_runs();
    assert_eq!(runs.len(), 100, "{runs:?}");
    let twice = runs.iter().filter(|n| **n == 2).count();
    assert!(runs.iter().all(|n| *n <= 2), "{runs:?}");
    assert!(twice <= 4, "{twice} agents ran twice: {runs:?}");
    assert_eq!(rig.count(WORK).await, 0, "no lease left without a worker");
    a.terminate().await;
}
