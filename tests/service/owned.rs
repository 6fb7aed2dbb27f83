//! Owned hardware: BMCs on OpenStack's Redfish emulator, the owned-hardware demo, recoveries that fail.

use super::*;

/// What node-1's serial console prints.
const SERIAL: &str = "reset seen, booting";

#[actix_rt::test]
async fn owned_hardware_a_silent_machine_is_rebooted_through_its_bmc_and_a_wrong_password_backs_off()
 {
    use shepherd_sim::testing::Sushy;
    let rig = Rig::new().await;
    let password = "bmc-secret-51d2a9";
    // Two BMCs: node-1's credentials are right, node-2's configured
    // password is not the emulator's.
    // node-1's storage: none (without it the emulator answers its Storage
    // with a 500, which the firmware read reports as a part left out).
    let no_storage = format!("SUSHY_EMULATOR_STORAGE = {{'{}': []}}\n", Sushy::uuid(0));
    let good = Sushy::start_with(&["node-1"], "admin", password, &no_storage);
    let other = Sushy::start(&["node-2"], "admin", password);
    let secret = rig.dir.path().join("bmc-password");
    std::fs::write(&secret, format!("{password}\n")).unwrap();
    let wrong = rig.dir.path().join("wrong-password");
    std::fs::write(&wrong, "wrong-password-e07c\n").unwrap();
    // node-1's serial console: a command on its BMC's SSH (an OpenSSH
    // server whose forced command prints what a rebooting machine would).
    let console_key = rig.dir.path().join("console_ed25519");
    let key = SshIdentity::load_or_generate(&console_key).unwrap();
    let console = Sshd::start(
        format!("127.0.0.1:{}", Sshd::free_port()).parse().unwrap(),
        &[&format!(
            "command=\"echo node-1 serial: {SERIAL}; sleep 600\",no-pty {}",
            key.public_key()
        )],
    );
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .unwrap()
        .unwrap()
        .name;
    let text = format!(
        "{}\n[provider]\nkind = \"static\"\n\n[provider.inventory]\nmachines = [\n\
         {{ id = \"node-1\", address = \"127.0.0.1\", bmc = {{ url = \"{}\", username = \"admin\", password = {{ file = \"{}\" }}, system = \"{}\", \
         console = {{ via = \"ssh\", address = \"{}\", username = \"{}\", command = \"console com2\", key_file = \"{}\", host_key = \"{}\" }} }} }},\n\
         {{ id = \"node-2\", address = \"127.0.0.1\", bmc = {{ url = \"{}\", username = \"admin\", password = {{ file = \"{}\" }} }} }},\n]\n\
         \n[recoverer]\nsilent_after_start = \"3s\"\nheartbeat_stale_after = \"3s\"\npoll_interval = \"200ms\"\n\
         reboot_poll = \"200ms\"\nreboot_settle = \"20s\"\nbackoff_initial = \"30s\"\ncallback_grace = \"1s\"\n\
         agent_return_wait = \"1s\"\n\
         \n[updater]\ninterval = \"500ms\"\n\
         \n[[baselines]]\nname = \"emulated\"\nraid = [{{ raid_type = \"RAID1\", drives = 2 }}]\n",
        rig.calling(rig.base_config())
            // Everything shepherd does with a BMC, at trace level.
            .replace(
                "level = \"info,tokio_postgres=warn,refinery_core=warn\"",
                "level = \"info,shepherd=trace,awc=trace,actix_http=trace,tokio_postgres=warn,refinery_core=warn\""
            ),
        good.url,
        secret.display(),
        Sushy::uuid(0),
        console.addr,
        user,
        console_key.display(),
        console.host_key.trim(),
        other.url,
        wrong.display(),
    );
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("2 agents", AGENTS, 2, Duration::from_secs(60), &mut s)
        .await;
    const FRESH: &str = "SELECT count(*) FROM machine_agent_heartbeat \
                         WHERE agent_heartbeat_at > now() - interval '2 seconds'";
    rig.wait_for("2 heartbeating", FRESH, 2, Duration::from_secs(30), &mut s)
        .await;
    // Past the thresholds, heartbeating machines are left alone.
    tokio::time::sleep(Duration::from_secs(6)).await;
    const RECOVERIES: &str = "SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery'";
    assert_eq!(rig.count(RECOVERIES).await, 0, "{}", s.log_text());

    // The Updater read both BMCs: node-1's facts are the emulator's,
    // node-2's read failed with the BMC's 401; written once, not every round.
    let facts = || async {
        rig.bmdb
            .transact(async |tx| {
                Ok(tx
                    .query(
                        "SELECT p.provider_id, f.power_state, f.manufacturer, f.health, f.system_path, \
                         f.read_error, f.changed_at, p.provider_status::text \
                         FROM machine_bmc_facts f JOIN machine_provided p USING (machine_id) \
                         ORDER BY p.provider_id",
                        &[],
                    )
                    .await?
                    .iter()
                    .map(|r| {
                        (
                            r.get::<_, String>(0),
                            r.get::<_, Option<String>>(1),
                            r.get::<_, Option<String>>(2),
                            r.get::<_, Option<String>>(3),
                            r.get::<_, Option<String>>(4),
                            r.get::<_, Option<String>>(5),
                            r.get::<_, std::time::SystemTime>(6),
                            r.get::<_, Option<String>>(7),
                        )
                    })
                    .collect::<Vec<_>>())
            })
            .await
            .unwrap()
    };
    let before = facts().await;
    assert_eq!(before.len(), 2, "{before:?}");
    let emulator = good.system(0).await;
    let n1 = &before[0];
    assert_eq!(n1.0, "node-1");
    assert_eq!(n1.1.as_deref(), emulator["PowerState"].as_str());
    assert_eq!(n1.2.as_deref(), emulator["Manufacturer"].as_str());
    assert_eq!(n1.3.as_deref(), emulator["Status"]["Health"].as_str());
    assert_eq!(n1.4.as_deref(), emulator["@odata.id"].as_str());
    assert_eq!(n1.5, None);
    assert_eq!(n1.7.as_deref(), Some("Running"));
    let n2 = &before[1];
    assert!(
        n2.5.as_deref().unwrap_or("").contains("401"),
        "node-2's read error: {n2:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await; // four more rounds
    let again = facts().await;
    assert_eq!(again[0].6, before[0].6, "unchanged facts were rewritten");
    assert_eq!(again[1].6, before[1].6, "an unchanged error was rewritten");
    // Operators see them: the JSON API and `machines show`.
    let node1 = machine_of(&rig, "node-1").await;
    let (status, body) = s.admin_get(&format!("api/v1/machines/{node1}")).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["tags"]["bmc"]["manufacturer"], emulator["Manufacturer"]);
    assert_eq!(v["tags"]["bmc"]["power_state"], "On");
    // Its firmware, read once (within updater.firmware_interval): the
    // emulator's manager's own, as `bmc`, and its BIOS where it says one.
    let manager = good
        .get(
            emulator["Links"]["ManagedBy"][0]["@odata.id"]
                .as_str()
                .unwrap(),
        )
        .await;
    let components: Vec<(String, String)> = v["firmware"]["components"]
        .as_array()
        .unwrap_or_else(|| panic!("no firmware: {v}"))
        .iter()
        .map(|c| {
            (
                c["component"].as_str().unwrap().to_string(),
                c["version"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut want = vec![(
        "bmc".to_string(),
        manager["FirmwareVersion"].as_str().unwrap().to_string(),
    )];
    if let Some(bios) = emulator["BiosVersion"].as_str() {
        want.insert(0, ("bios".to_string(), bios.to_string()));
    }
    assert_eq!(components, want, "{v}");
    assert!(v["firmware"]["read_error"].is_null(), "{v}");
    assert_eq!(
        v["firmware"]["storage"]["controllers"],
        serde_json::json!([]),
        "{v}"
    );
    let reads = rig
        .count("SELECT count(*) FROM machine_firmware_read WHERE read_at > now() - interval '1 minute'")
        .await;
    assert_eq!(
        reads, 1,
        "node-1's firmware read (node-2's BMC refused its facts)"
    );
    let history = rig
        .count("SELECT count(*) FROM machine_firmware_history")
        .await;
    assert_eq!(
        history,
        want.len() as i64,
        "each version seen once over the rounds"
    );
    let page = s.admin_get(&format!("machines/{node1}")).await.1;
    assert!(
        page.contains("id=\"firmware\"") && page.contains(&want.last().unwrap().1),
        "{page}"
    );
    let metrics = s.admin_get("metrics").await.1;
    assert!(
        metrics.contains(&format!(
            "shepherd_machines_by_firmware{{component=\"bmc\",version=\"{}\"}} 1",
            want.last().unwrap().1
        )),
        "{metrics}"
    );
    // Against its baseline: a RAID layout its emulated BMC cannot make
    // (no storage offers volumes), said on each view.
    assert_eq!(v["baseline"]["name"], "emulated", "{v}");
    assert_eq!(v["baseline"]["conformance"], "drifting", "{v}");
    assert_eq!(
        v["baseline"]["differences"],
        serde_json::json!([{"part": "raid", "item": "volumes", "desired": "RAID1 of 2 drives",
                            "actual": "not offered by its BMC"}]),
        "{v}"
    );
    let (status, body) = s.admin_get("api/v1/baselines").await;
    assert_eq!(status, 200, "{body}");
    let b: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        b["baselines"][0]["standing"],
        serde_json::json!({"baseline": "emulated", "machines": 2, "conforming": 0,
                           "drifting": 1, "unread": 1}),
        "node-2's firmware is never read (its BMC refuses shepherd): {b}"
    );
    assert!(
        page.contains("id=\"drift\"") && page.contains("not offered by its BMC"),
        "{page}"
    );
    assert!(
        metrics.contains(
            "shepherd_baseline_machines{baseline=\"emulated\",conformance=\"drifting\"} 1"
        ),
        "{metrics}"
    );
    let raid = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("--config")
        .arg(&config)
        .args(["machines", "raid", &node1.to_string()])
        .output()
        .unwrap();
    let raid = String::from_utf8_lossy(&raid.stdout);
    assert!(
        raid.contains("baseline  emulated: drifting")
            && raid.contains("RAID volumes: not offered by its BMC"),
        "{raid}"
    );
    let show = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("--config")
        .arg(&config)
        .args(["machines", "show", &node1.to_string()])
        .output()
        .unwrap();
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(
        show.contains("bmc") && show.contains(&good.url) && show.contains("Sushy Emulator"),
        "{show}"
    );

    // Both agents die, and no agent can be started on the machines (their
    // SSH answers, the agent crashes): the gentle step fails, the BMC
    // power-cycles.
    let mode = rig.sshd.dir().join("takeover-agent.mode");
    std::fs::write(&mode, "crash").unwrap();
    let ids: Vec<(uuid::Uuid, String)> = rig.provided().await;
    for (id, _) in &ids {
        let pid_file = rig.sshd.dir().join(format!("agent-{id}.pid"));
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    }
    // Once both power actions are under way, agents start again.
    rig.wait_for(
        "two power actions",
        "SELECT count(*) FROM recovery_power_action",
        2,
        Duration::from_secs(60),
        &mut s,
    )
    .await;
    std::fs::remove_file(&mode).unwrap();
    // node-1: rebooted through its BMC (the emulator saw the reset and the
    // power go off and on), taken over again, heartbeating again.
    rig.wait_for_recovery(ids[0].0, &s).await;
    let resets = |sushy: &Sushy| {
        sushy
            .log()
            .lines()
            .filter(|l| l.contains("ComputerSystem.Reset") && l.contains(" 204 "))
            .count()
    };
    assert_eq!(resets(&good), 1, "{}", good.log());
    // Its console was read from the power cycle on, under the recovery's
    // cause, and kept.
    let kept = rig
        .bmdb
        .transact(async |tx| shepherd::bmdb::console::latest(tx, ids[0].0, 10).await)
        .await
        .unwrap();
    let recovery = kept
        .iter()
        .find(|c| c.cause == "recovery")
        .unwrap_or_else(|| panic!("no capture of the power cycle: {kept:?}"));
    let printed = shepherd::console::text(&recovery.tail);
    assert!(printed.contains(SERIAL), "{printed}");
    assert!(recovery.ended_at.is_some());
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(
        log.contains("reboot accepted by the BMC"),
        "{}",
        log.lines()
            .filter(|l| !l.contains("TRACE") && !l.contains("DEBUG"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // node-2: the recovery failed with the BMC's 401, named, and backed off.
    rig.wait_for_failed_recovery("node-2", "401", &mut s).await;
    assert_eq!(resets(&other), 0, "{}", other.log());
    let cause: String = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT failed_cause FROM work_history WHERE event = 'Failed' LIMIT 1",
                    &[],
                )
                .await?
                .get(0))
        })
        .await
        .unwrap();
    assert!(
        cause.contains(&other.url) && cause.contains("Incorrect username or password"),
        "{cause}"
    );
    s.terminate().await;
    // At trace level, neither password reached the log.
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(log.contains("TRACE"), "the log was at trace level");
    assert!(!log.contains(password), "the BMC password is in the log");
    assert!(
        !log.contains("wrong-password-e07c"),
        "a BMC password is in the log"
    );
    // Nor as a basic-authentication header.
    assert_eq!(base64_encode(b"admin:x"), "YWRtaW46eA==");
    for secret in [password, "wrong-password-e07c"] {
        let header = base64_encode(format!("admin:{secret}").as_bytes());
        assert!(
            !log.contains(&header),
            "a BMC credential header is in the log"
        );
    }
}

#[actix_rt::test]
async fn the_owned_hardware_demo_recovers_a_silenced_machine_through_its_bmc() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = run_demo(
        dir.path(),
        &[
            "--provider",
            "static",
            "--machines",
            "6",
            "--timeout",
            "2m",
            "--silence",
            "1",
        ],
    )
    .await;
    assert!(
        stdout.contains("simulated BMCs (Redfish) http://127.0.1.1:"),
        "{stdout}"
    );
    assert!(stdout.contains("all 6 machines taken over in"), "{stdout}");
    assert!(
        stdout.contains("all 1 silenced machines recovered and heartbeating again in")
            && stdout.contains("; 0 other machines recovered"),
        "{stdout}"
    );
    shepherd::bmdb::embedded::remove_data_dir(&dir.path().join("var/demo/bmdb")).unwrap();
}

/// One inventory host, node-9, whose BMC is down (nothing listens at its
/// URL) and whose agent never calls (the endpoint it is told does not
/// resolve): it goes silent right after its takeover. The configuration's
/// path.
fn silent_host_with_a_bmc_that_is_down(rig: &Rig) -> PathBuf {
    let bmc = format!("http://127.0.0.1:{}", Sshd::free_port());
    let text = format!(
        "{}\n[provider]\nkind = \"static\"\n\n[provider.inventory]\nmachines = [\n\
         {{ id = \"node-9\", address = \"127.0.0.1\", bmc = {{ url = \"{bmc}\", username = \"admin\", password = \"pw-0b7e\" }} }},\n]\n\
         \n[recoverer]\nsilent_after_start = \"2s\"\npoll_interval = \"200ms\"\nbackoff_initial = \"30s\"\n\
         callback_grace = \"1s\"\nagent_restart_wait = \"1s\"\n\
         \n[redfish]\ntimeout = \"3s\"\n",
        rig.base_config()
    );
    rig.write_config("shepherd.toml", &text)
}

#[actix_rt::test]
async fn a_silent_machine_whose_bmc_is_down_fails_its_recovery_with_the_cause_and_backs_off() {
    let rig = Rig::new().await;
    let config = silent_host_with_a_bmc_that_is_down(&rig);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for_failed_recovery("node-9", "unreachable", &mut s)
        .await;
    // The process is fine: its admin server answers, it holds its session.
    let (status, _) = s.admin_get("readyz").await;
    assert_eq!(status, 200);
    s.terminate().await;
}

#[actix_rt::test]
async fn a_recovery_failure_the_bmdb_refuses_to_record_cancels_the_lease_naming_its_cause() {
    let rig = Rig::new().await;
    // The database refuses every recovery backoff: a failure cannot be
    // recorded (not an outage, which is retried until it is).
    rig.bmdb
        .transact(async |tx| {
            tx.execute(
                "CREATE FUNCTION refuse_recovery_backoff() RETURNS trigger AS $$ \
                 BEGIN IF NEW.process = 'ShepherdRecovery' THEN \
                 RAISE EXCEPTION 'recovery backoffs refused by the test'; END IF; \
                 RETURN NEW; END $$ LANGUAGE plpgsql",
                &[],
            )
            .await?;
            tx.execute(
                "CREATE TRIGGER refuse_recovery_backoff BEFORE INSERT OR UPDATE ON work_backoff \
                 FOR EACH ROW EXECUTE FUNCTION refuse_recovery_backoff()",
                &[],
            )
            .await?;
            Ok(())
        })
        .await
        .unwrap();
    let config = silent_host_with_a_bmc_that_is_down(&rig);
    let mut s = rig.shepherd(&config, "shepherd.log");
    // The lease ends cancelled, its history naming the failure and why it
    // could not be recorded (not "work dropped").
    rig.wait_for(
        "a cancelled recovery naming its cause",
        "SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery' \
         AND event = 'Canceled' AND failed_cause LIKE '%host node-9%unreachable%\
         (the failure could not be recorded:%refused by the test%'",
        1,
        Duration::from_secs(60),
        &mut s,
    )
    .await;
    assert_eq!(
        rig.count(
            "SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery' \
             AND failed_cause = 'work dropped'"
        )
        .await,
        0,
        "{}",
        s.log_text()
    );
    assert!(
        s.log_text().contains(
            "recovery failed and the failure could not be recorded; cancelling the lease"
        ),
        "{}",
        s.log_text()
    );
    // Still no backoff was written, and the process is fine.
    assert_eq!(
        rig.count("SELECT count(*) FROM work_backoff WHERE process = 'ShepherdRecovery'")
            .await,
        0
    );
    let (status, _) = s.admin_get("readyz").await;
    assert_eq!(status, 200);
    s.terminate().await;
    // No lease is left behind by the terminated process.
    assert_eq!(rig.count(WORK).await, 0, "{}", s.log_text());
}
