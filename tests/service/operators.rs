//! Operators' actions through the API and the CLI; held machines.

use super::*;

#[actix_rt::test]
async fn operators_act_through_the_api_and_the_cli_and_held_machines_are_left_alone() {
    let rig = Rig::new().await;
    let sim = Sim::start(4, &["--reboot-delay", "1s"]);
    let text = rig.equinix_config(&sim).replace(
        "[admin]\nlisten = \"127.0.0.1:0\"\n",
        &format!("[admin]\nlisten = \"127.0.0.1:0\"\ntokens = {{ alice = \"{ALICE}\" }}\n"),
    ) + "\n[updater]\ninterval = \"300ms\"\n\
           \n[recoverer]\nsilent_after_start = \"1h\"\nheartbeat_stale_after = \"5m\"\npoll_interval = \"200ms\"\n\
           reboot_poll = \"100ms\"\nreboot_settle = \"3s\"\nagent_return_wait = \"1s\"\n";
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("4 agents", AGENTS, 4, Duration::from_secs(60), &mut s)
        .await;
    let machines: Vec<(uuid::Uuid, String)> = rig.provided().await;
    let [m1, m2, m3, m4] = [0, 1, 2, 3].map(|i| machines[i].0);
    // Every agent heartbeats (as the callback would record).
    rig.bmdb
        .transact(async |tx| {
            tx.execute(
                "INSERT INTO machine_agent_heartbeat SELECT machine_id, now() FROM machine_agent_started",
                &[],
            )
            .await
        })
        .await
        .unwrap();

    // Refused: no token, a wrong one, a form without the JSON type.
    assert_eq!(act(&s, m1, "hold", None, json!({})).await.0, 401);
    assert_eq!(
        act(&s, m1, "hold", Some("wrong-token-0123456789"), json!({}))
            .await
            .0,
        401
    );
    let mut r = awc::Client::default()
        .post(format!(
            "{}/api/v1/machines/{m1}/hold",
            s.admin_url().trim_end_matches('/')
        ))
        .insert_header(("Authorization", format!("Bearer {ALICE}")))
        .send_form(&[("reason", "a form")])
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415, "{:?}", r.body().await);
    assert_eq!(
        rig.count("SELECT count(*) FROM operator_action").await,
        0,
        "refused requests act on nothing"
    );

    // Hold m1 (API, alice), then take it over again (API): its agent is
    // dropped and the Initializer leaves it alone while it is held.
    let (st, v) = act(
        &s,
        m1,
        "hold",
        Some(ALICE),
        json!({"reason": "disk swap, ticket 42"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["action"]["actor"], "alice");
    assert_eq!(v["action"]["reason"], "disk swap, ticket 42");
    let (st, v) = act(&s, m1, "hold", Some(ALICE), json!({})).await;
    assert_eq!(st, 409, "a second hold is refused: {v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("already held (by alice since"),
        "{v}"
    );
    let (st, v) = act(
        &s,
        m1,
        "retakeover",
        Some(ALICE),
        json!({"forget_host_key": true}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert!(
        v["action"]["detail"]
            .as_str()
            .unwrap()
            .contains("forgot its SSH host key"),
        "{v}"
    );
    assert_eq!(rig.count_for(AGENT_OF, m1).await, 0);
    assert_eq!(
        rig.count_for(
            "SELECT count(*) FROM machine_ssh_host_key WHERE machine_id = $1",
            m1
        )
        .await,
        0
    );
    // Reboot a held machine: refused.
    let (st, v) = act(&s, m1, "reboot", Some(ALICE), json!({})).await;
    assert_eq!(st, 409, "{v}");

    // m2 taken over again from the CLI: the Initializer does it.
    let (code, out, err) = machines_cli(
        &config,
        &["retakeover", &m2.to_string(), "--reason", "agent upgrade"],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("dropped its agent"), "{out}");
    rig.wait_for_machine("m2 taken over again", TAKEOVERS_OF, m2, 2, &s)
        .await;
    // By then m1 (held, no agent) has long been due: still left alone.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        rig.count_for(TAKEOVERS_OF, m1).await,
        1,
        "held m1 was taken over"
    );
    assert_eq!(rig.count_for(AGENT_OF, m1).await, 0);

    // m4 held with a stale heartbeat: the Recoverer leaves it alone, while
    // the reboot asked for m3 (API) goes through on the Recoverer's lease.
    let (code, out, err) = machines_cli(&config, &["hold", &m4.to_string()]);
    assert_eq!(code, Some(0), "{out}{err}");
    rig.bmdb
        .transact(async |tx| {
            tx.execute(
                "UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() - interval '1 hour' WHERE machine_id = $1",
                &[&m4],
            )
            .await
        })
        .await
        .unwrap();
    let (st, v) = act(
        &s,
        m3,
        "reboot",
        Some(ALICE),
        json!({"reason": "kernel update"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = act(&s, m3, "reboot", Some(ALICE), json!({})).await;
    assert_eq!(st, 409, "a second request while one waits: {v}");
    rig.wait_for_machine("m3 rebooted", RECOVERIES_OF, m3, 1, &s)
        .await;
    rig.wait_for_machine("m3 taken over after its reboot", TAKEOVERS_OF, m3, 2, &s)
        .await;
    assert_eq!(
        rig.count_for(
            "SELECT count(*) FROM machine_reboot_request WHERE machine_id = $1",
            m3
        )
        .await,
        0,
        "the request is done"
    );
    // The provider stops m3 and m4 (and moves m4): the Updater brings m3's
    // change in and leaves the held m4's record as it was.
    for (device, change) in [
        (&machines[2].1, json!({"state": "inactive"})),
        (
            &machines[3].1,
            json!({"state": "inactive", "address": "127.0.0.8"}),
        ),
    ] {
        let r = awc::Client::default()
            .patch(format!("http://{}/_sim/devices/{device}", sim.addr))
            .send_json(&change)
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
    rig.wait_for_machine(
        "m3 stopped in the BMDB",
        "SELECT count(*) FROM machine_provided WHERE machine_id = $1 AND provider_status = 'Stopped'",
        m3,
        1,
        &s,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await; // two more rounds
    assert_eq!(
        rig.provider_record(&machines[3].1).await,
        ("Running".to_string(), "127.0.0.1".to_string()),
        "the Updater leaves the held m4 alone"
    );
    let stats = sim.stats().await;
    assert_eq!(stats["reboots"][machines[2].1.as_str()], 1, "{stats}");
    assert!(
        stats["reboots"].get(machines[3].1.as_str()).is_none(),
        "held m4 (heartbeat an hour old) was rebooted: {stats}"
    );
    assert_eq!(rig.count_for(RECOVERIES_OF, m4).await, 0);

    // Release m1 from the CLI while it is backed off: nothing yet; retry
    // (API) clears the backoff and the Initializer takes it over.
    rig.back_off(m1, "ShepherdAgentStart", "test: a failure before")
        .await;
    let (code, out, err) = machines_cli(
        &config,
        &["release", &m1.to_string(), "--reason", "disk swapped"],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(rig.count_for(AGENT_OF, m1).await, 0, "backed off");
    let (code, out, err) = machines_cli(&config, &["retry", &m2.to_string()]);
    assert_eq!(code, Some(1), "m2 is not backed off: {out}");
    assert!(err.contains("not backed off"), "{err}");
    let (st, v) = act(
        &s,
        m1,
        "retry",
        Some(ALICE),
        json!({"process": "ShepherdAgentStart"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    rig.wait_for_machine("m1 taken over after the retry", TAKEOVERS_OF, m1, 2, &s)
        .await;
    let (code, out, err) = machines_cli(&config, &["release", &m1.to_string()]);
    assert_eq!(code, Some(1), "{out}");
    assert!(err.contains("is not held"), "{err}");

    // The audit: who, what, why, in order; shown in the machine's history.
    let audit: Vec<(String, String, String)> = rig
        .bmdb
        .transact(async |tx| shepherd::bmdb::actions::audit(tx, m1).await)
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.actor, a.action, a.reason.unwrap_or_default()))
        .collect();
    let want = [
        ("alice", "hold", "disk swap, ticket 42"),
        ("alice", "retakeover", ""),
        ("cli", "release", "disk swapped"),
        ("alice", "retry", ""),
    ];
    assert_eq!(
        audit,
        want.map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    );
    assert_eq!(rig.count("SELECT count(*) FROM operator_action").await, 7);
    // The held machine, listed by state and found by its provider ID.
    let (code, out, err) = machines_cli(&config, &["list", "--state", "held"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(&m4.to_string()), "{out}");
    assert!(out.contains("1 shown of 1 matching"), "{out}");
    let (_, out, _) = machines_cli(&config, &["list", "--search", &machines[3].1[..13]]);
    assert!(
        out.contains(&m4.to_string()) && out.contains("1 shown of 1 matching"),
        "{out}"
    );
    let (code, _, err) = machines_cli(&config, &["list", "--heartbeat", "sometimes"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("heartbeating, silent, no-agent"), "{err}");
    let (code, out, _) = machines_cli(&config, &["show", &m1.to_string()]);
    assert_eq!(code, Some(0));
    assert!(out.contains("operator alice hold: held;"), "{out}");
    assert!(out.contains("(reason: disk swapped)"), "{out}");
    let mut r = awc::Client::default()
        .get(format!(
            "{}/api/v1/machines/{m1}",
            s.admin_url().trim_end_matches('/')
        ))
        .insert_header(("Authorization", format!("Bearer {ALICE}")))
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["operator_actions"].as_array().unwrap().len(), 4, "{v}");
    assert_eq!(v["hold"], serde_json::Value::Null);

    // The provider loses m3 and the held m4: the Provisioner reports m3
    // and leaves m4 be.
    for device in [&machines[2].1, &machines[3].1] {
        let r = awc::Client::default()
            .delete(format!("http://{}/metal/v1/devices/{device}", sim.addr))
            .insert_header(("X-Auth-Token", TOKEN))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{r:?}");
    }
    let missing = |id: &str| {
        std::fs::read_to_string(&s.log)
            .unwrap()
            .lines()
            .filter(|l| l.contains("no longer lists it") && l.contains(id))
            .count()
    };
    let t = Instant::now();
    while missing(&machines[2].1) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "m3 not reported\n{}",
            s.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1100)).await; // two more rounds
    assert_eq!(missing(&machines[3].1), 0, "the held m4 was reported");
    let (_, metrics) = {
        let mut r = awc::Client::default()
            .get(format!("{}/metrics", s.admin_url().trim_end_matches('/')))
            .insert_header(("Authorization", format!("Bearer {ALICE}")))
            .send()
            .await
            .unwrap();
        (
            r.status(),
            String::from_utf8_lossy(&r.body().await.unwrap()).into_owned(),
        )
    };
    assert!(
        metrics.contains("shepherd_provisioner_discrepancies 1\n"),
        "{metrics}"
    );

    // The rest of the actions the other way round: reboot and retry from
    // the CLI, release through the API.
    let (code, out, err) = machines_cli(
        &config,
        &["reboot", &m2.to_string(), "--reason", "firmware"],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("requested"), "{out}");
    rig.wait_for_machine("m2 rebooted", RECOVERIES_OF, m2, 1, &s)
        .await;
    assert_eq!(sim.stats().await["reboots"][machines[1].1.as_str()], 1);
    rig.back_off(m1, "ShepherdRecovery", "test: a reboot failed")
        .await;
    let (code, out, err) = machines_cli(
        &config,
        &["retry", &m1.to_string(), "--process", "ShepherdRecovery"],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("cleared the backoff of ShepherdRecovery"),
        "{out}"
    );
    assert_eq!(
        rig.count_for(
            "SELECT count(*) FROM work_backoff WHERE machine_id = $1",
            m1
        )
        .await,
        0
    );
    let (st, v) = act(&s, m4, "release", Some(ALICE), json!({"reason": "done"})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(rig.count("SELECT count(*) FROM machine_hold").await, 0);
    let by_actor: Vec<(String, i64)> = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query(
                    "SELECT actor || ' ' || action, count(*) FROM operator_action GROUP BY 1 ORDER BY 1",
                    &[],
                )
                .await?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect())
        })
        .await
        .unwrap();
    let want: Vec<(String, i64)> = [
        ("alice hold", 1),
        ("alice reboot", 1),
        ("alice release", 1),
        ("alice retakeover", 1),
        ("alice retry", 1),
        ("cli hold", 1),
        ("cli reboot", 1),
        ("cli release", 1),
        ("cli retakeover", 1),
        ("cli retry", 1),
    ]
    .map(|(a, n)| (a.to_string(), n))
    .into();
    assert_eq!(by_actor, want, "every action by each way in, once");
    s.terminate().await;
}

/// A host of the static inventory without a BMC whose agent is gone (it
/// rebooted by itself, and the agent had no unit there): its SSH answers,
/// so its agent is started again; never a loop on "cannot be rebooted".
#[actix_rt::test]
async fn an_inventory_host_without_a_bmc_whose_agent_is_gone_comes_back_heartbeating() {
    let rig = Rig::new().await;
    let text = rig.calling(rig.inventory_config(1, "session_interval = \"2s\""))
        + "\n[recoverer]\nsilent_after_start = \"3s\"\nheartbeat_stale_after = \"3s\"\npoll_interval = \"200ms\"\n\
           callback_grace = \"1s\"\nbackoff_initial = \"30s\"\n";
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    const FRESH: &str = "SELECT count(*) FROM machine_agent_heartbeat \
                         WHERE agent_heartbeat_at > now() - interval '2 seconds'";
    rig.wait_for("1 heartbeating", FRESH, 1, Duration::from_secs(60), &mut s)
        .await;
    let (host, _) = rig.provided().await.remove(0);
    // The machine restarts on its own: its agent process is gone.
    let pid_file = rig.sshd.dir().join(format!("agent-{host}.pid"));
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    rig.wait_for_history(
        host,
        &[
            "ShepherdAgentStart Started",
            "ShepherdAgentStart Finished",
            "ShepherdRecovery Started",
            "ShepherdRecovery Finished",
        ],
        &s,
    )
    .await;
    rig.wait_for(
        "heartbeating again",
        FRESH,
        1,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    // Well past the thresholds again: no further recovery, no failure.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        rig.count("SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery'")
            .await,
        2,
        "{}",
        s.log_text()
    );
    assert_eq!(
        rig.count(
            "SELECT count(*) FROM work_history WHERE failed_cause LIKE '%cannot be rebooted%'"
        )
        .await,
        0
    );
    let (_, list) = s.admin_get("api/v1/machines").await;
    let v: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(v["machines"][0]["state"], "agent-started", "{v}");
    s.terminate().await;
}
