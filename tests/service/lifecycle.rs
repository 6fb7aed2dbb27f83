//! The whole life cycle: resident agents call back; a killed agent is restarted without a reboot.

use super::*;

#[actix_rt::test]
async fn heartbeating_machines_are_kept_and_a_killed_agent_is_restarted_over_ssh_without_a_reboot()
{
    let rig = Rig::new().await;
    let sim = Sim::start(2, &["--reboot-delay", "1s"]);
    let text = rig.calling(rig.equinix_config(&sim))
        + "\n[recoverer]\nsilent_after_start = \"3s\"\nheartbeat_stale_after = \"3s\"\npoll_interval = \"200ms\"\n\
           reboot_poll = \"100ms\"\nreboot_settle = \"2s\"\ncallback_grace = \"1s\"\n";
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("2 agents", AGENTS, 2, Duration::from_secs(60), &mut s)
        .await;
    const FRESH: &str = "SELECT count(*) FROM machine_agent_heartbeat \
                         WHERE agent_heartbeat_at > now() - interval '2 seconds'";
    rig.wait_for("2 heartbeating", FRESH, 2, Duration::from_secs(30), &mut s)
        .await;
    // Well past the thresholds: heartbeating machines are left alone.
    tokio::time::sleep(Duration::from_secs(12)).await;
    const RECOVERIES: &str = "SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery'";
    assert_eq!(rig.count(RECOVERIES).await, 0, "{}", s.log_text());
    assert_eq!(rig.count(FRESH).await, 2, "{}", s.log_text());
    assert_eq!(
        rig.count("SELECT count(*) FROM machine_hardware_report")
            .await,
        2,
        "each agent sent its hardware report"
    );
    // Operators see it: /metrics, the JSON API, `machines show`.
    let (_, metrics) = s.admin_get("metrics").await;
    let heartbeats = |result: &str| {
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "shepherd_heartbeats_total{{result=\"{result}\"}} "
                ))
            })
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(-1.0)
    };
    assert!(heartbeats("accepted") >= 20.0, "{metrics}");
    // An agent calls as soon as it has answered, which may be before its
    // key is recorded: at most its first call is refused.
    assert!(heartbeats("unauthenticated") <= 2.0, "{metrics}");
    for refused in ["no_certificate", "invalid", "unavailable"] {
        assert_eq!(heartbeats(refused), 0.0, "{refused}: {metrics}");
    }
    assert!(
        metrics.contains("shepherd_heartbeat_batch_size_count"),
        "{metrics}"
    );
    let some: uuid::Uuid = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT machine_id FROM machine_hardware_report LIMIT 1",
                    &[],
                )
                .await?
                .get(0))
        })
        .await
        .unwrap();
    let (status, body) = s.admin_get(&format!("api/v1/machines/{some}")).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let hw = &v["tags"]["hardware_report"];
    assert!(hw["memory_bytes"].as_i64().unwrap_or(0) > 0, "{v}");
    assert!(!hw["cpus"].as_array().unwrap().is_empty(), "{v}");
    let show = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("--config")
        .arg(&config)
        .args(["machines", "show", &some.to_string()])
        .env("SIM_TOKEN", TOKEN)
        .output()
        .unwrap();
    let (show, err) = (
        String::from_utf8_lossy(&show.stdout),
        String::from_utf8_lossy(&show.stderr),
    );
    assert!(
        show.contains("hardware report") && show.contains("memory"),
        "{show}{err}"
    );
    assert!(show.contains("cpu   "), "{show}");

    // One agent dies.
    let (quiet, device): (uuid::Uuid, String) = rig
        .bmdb
        .transact(async |tx| {
            let r = tx
                .query_one(
                    "SELECT machine_id, provider_id FROM machine_provided ORDER BY machine_id LIMIT 1",
                    &[],
                )
                .await?;
            Ok((r.get(0), r.get(1)))
        })
        .await
        .unwrap();
    let pid_file = rig.sshd.dir().join(format!("agent-{quiet}.pid"));
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();

    // Recovered in one step, with no new takeover.
    rig.wait_for_history(
        quiet,
        &[
            "ShepherdAgentStart Started",
            "ShepherdAgentStart Finished",
            "ShepherdRecovery Started",
            "ShepherdRecovery Finished",
        ],
        &s,
    )
    .await;
    // Heartbeating again, from its new agent.
    rig.wait_for(
        "2 heartbeating again",
        FRESH,
        2,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    let new_pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(new_pid, pid);
    // Its SSH answered: the agent was restarted in place, no power action.
    let stats = sim.stats().await;
    assert_eq!(
        stats["reboots"].as_object().map(|m| m.len()).unwrap_or(0),
        0,
        "no machine is rebooted ({device}): {}",
        stats["reboots"]
    );
    assert_eq!(
        rig.count(RECOVERIES).await,
        2,
        "one recovery: Started, Finished"
    );
    assert_eq!(
        rig.count(
            "SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery' \
                   AND event = 'Finished' AND detail LIKE 'agent restarted over SSH%'"
        )
        .await,
        1,
        "the history says how"
    );
    s.terminate().await;
}
