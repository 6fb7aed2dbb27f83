//! Provisioning and takeover: rented machines taken over, kills and restarts, drains, bad configuration, the Updater, the demo.

use super::*;

#[actix_rt::test]
async fn thirty_reservations_become_thirty_taken_over_devices_and_sigterm_drains() {
    let rig = Rig::new().await;
    let sim = Sim::start(30, &[]);
    let config = rig.write_config("shepherd.toml", &rig.equinix_config(&sim));
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("30 agents", AGENTS, 30, Duration::from_secs(120), &mut s)
        .await;
    assert_eq!(sim.devices().await, (30, 30), "one device per reservation");
    assert_eq!(rig.count(MACHINES).await, 30);
    // shepherd's key was ensured in the project, once.
    let stats = sim.stats().await;
    assert_eq!(stats["requests"]["create_ssh_key"], 1);
    let url = s.admin_url();
    let mut r = awc::Client::default()
        .get(format!("{url}readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.body().await);
    let mut r = awc::Client::default()
        .get(format!("{url}metrics"))
        .send()
        .await
        .unwrap();
    let metrics = String::from_utf8_lossy(&r.body().await.unwrap()).into_owned();
    assert!(
        metrics.contains("shepherd_machines{state=\"agent-started\"} 30"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "shepherd_leases_total{process=\"ShepherdAgentStart\",event=\"finished\"} 30"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "shepherd_equinix_requests_total{operation=\"create_device\",status=\"201\"}"
        ),
        "{metrics}"
    );

    s.signal(Signal::SIGTERM);
    let (code, took) = s.exit(Duration::from_secs(20)).await;
    assert_eq!(code, Some(0), "{}", s.log_text());
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert_eq!(rig.count(WORK).await, 0);
    assert_eq!(rig.count(SESSIONS).await, 0);
}

#[actix_rt::test]
async fn sigkill_mid_run_then_restart_leaves_no_orphan_or_double() {
    let rig = Rig::new().await;
    let sim = Sim::start(30, &[]);
    let mut text = rig.equinix_config(&sim);
    text = text.replace(
        "creation_interval = \"0s\"",
        "creation_interval = \"150ms\"",
    );
    let config = rig.write_config("shepherd.toml", &text);
    let mut first = rig.shepherd(&config, "first.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    while sim.devices().await.0 < 8 {
        assert!(
            Instant::now() < deadline,
            "no devices created:\n{}",
            first.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.signal(Signal::SIGKILL);
    first.exit(Duration::from_secs(10)).await;
    let mut second = rig.shepherd(&config, "second.log");
    rig.wait_for(
        "30 agents",
        AGENTS,
        30,
        Duration::from_secs(120),
        &mut second,
    )
    .await;
    assert_eq!(sim.devices().await, (30, 30), "orphaned or doubled devices");
    assert_eq!(rig.count(MACHINES).await, 30);
    second.signal(Signal::SIGTERM);
    assert_eq!(second.exit(Duration::from_secs(20)).await.0, Some(0));
}

#[actix_rt::test]
async fn api_faults_do_not_change_the_end_state() {
    let rig = Rig::new().await;
    let sim = Sim::start(
        30,
        &[
            "--error-rate",
            "0.1",
            "--lost-rate",
            "0.2",
            "--rate-limit-rate",
            "0.05",
            "--retry-after",
            "1",
        ],
    );
    let config = rig.write_config("shepherd.toml", &rig.equinix_config(&sim));
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("30 agents", AGENTS, 30, Duration::from_secs(180), &mut s)
        .await;
    assert_eq!(sim.devices().await, (30, 30));
    let stats = sim.stats().await;
    let statuses = &stats["statuses"];
    for code in ["500", "503", "429"] {
        assert!(
            statuses[code].as_u64().unwrap_or(0) > 0,
            "no {code} was injected: {statuses}"
        );
    }
    s.signal(Signal::SIGTERM);
    assert_eq!(s.exit(Duration::from_secs(20)).await.0, Some(0));
}

#[actix_rt::test]
async fn a_static_inventory_is_taken_over_survives_a_lost_session_and_reports_a_removed_host() {
    let rig = Rig::new().await;
    let inventory_file = rig.dir.path().join("inventory.toml");
    std::fs::write(&inventory_file, inventory(1..=20)).unwrap();
    let text = format!(
        "{}\n[provider]\nkind = \"static\"\n\n[provider.inventory]\nfile = \"{}\"\n",
        rig.base_config(),
        inventory_file.display()
    );
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("20 agents", AGENTS, 20, Duration::from_secs(90), &mut s)
        .await;

    // The fleet through the CLI.
    let cli = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .arg("--config")
            .arg(&config)
            .args(args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let list = cli(&["machines", "list", "--state", "agent-started"]);
    for i in 1..=20 {
        assert!(
            list.contains(&format!("host-{i:02}")),
            "host-{i:02} missing:\n{list}"
        );
    }
    assert!(
        list.contains("20 shown of 20 matching; fleet: agent-started 20"),
        "{list}"
    );
    assert!(cli(&["machines", "list", "--state", "pending"]).contains("0 shown"));
    let id = list
        .lines()
        .find(|l| l.contains("host-01"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let show = cli(&["machines", "show", &id]);
    for want in [
        "state     agent-started",
        "provided         None host-01 address 127.0.0.1 location rack-1",
        "agent started    ",
        "ShepherdAgentStart Started",
        "ShepherdAgentStart Finished",
        "ssh host key     ssh-ed25519",
    ] {
        assert!(show.contains(want), "{want:?} missing:\n{show}");
    }

    // The session dies under shepherd: a new one is opened, work goes on.
    let old: uuid::Uuid = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one("SELECT session_id FROM sessions", &[])
                .await?
                .get(0))
        })
        .await
        .unwrap();
    rig.bmdb
        .transact(async |tx| {
            tx.execute(
                "UPDATE sessions SET session_deadline = now() - interval '1 second'",
                &[],
            )
            .await
        })
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let live: Vec<uuid::Uuid> = rig
            .bmdb
            .transact(async |tx| {
                let rows = tx
                    .query(
                        "SELECT session_id FROM sessions WHERE session_deadline > now()",
                        &[],
                    )
                    .await?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            })
            .await
            .unwrap();
        if live.len() == 1 && live[0] != old {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no new session:\n{}",
            s.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::fs::write(&inventory_file, inventory(1..=21)).unwrap();
    rig.wait_for(
        "host-21 under the new session",
        AGENTS,
        21,
        Duration::from_secs(30),
        &mut s,
    )
    .await;

    std::fs::write(&inventory_file, inventory((1..=21).filter(|i| *i != 7))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = std::fs::read_to_string(&s.log).unwrap();
        if log
            .lines()
            .any(|l| l.contains("host-07") && l.contains("no longer lists it"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the removed host was not reported:\n{}",
            s.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        rig.count(MACHINES).await,
        21,
        "a removed host must not be deleted"
    );
    assert_eq!(rig.count(AGENTS).await, 21);
    s.signal(Signal::SIGTERM);
    assert_eq!(s.exit(Duration::from_secs(20)).await.0, Some(0));
}

#[actix_rt::test]
async fn sigterm_lets_running_takeovers_finish_within_the_drain_timeout() {
    let rig = Rig::new().await;
    std::fs::write(rig.sshd.dir().join("takeover-agent.mode"), "slow:3").unwrap();
    let text = format!(
        "{}\n[provider]\nkind = \"static\"\n\n[provider.inventory]\nmachines = [{}]\n",
        rig.base_config(),
        (1..=4)
            .map(|i| format!("{{ id = \"slow-{i}\", address = \"127.0.0.1\" }}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for(
        "4 takeovers under way",
        WORK,
        4,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    s.signal(Signal::SIGTERM);
    let (code, took) = s.exit(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "{}", s.log_text());
    assert!(took < Duration::from_secs(15), "drain took {took:?}");
    // They finished rather than being cut off.
    assert_eq!(rig.count(AGENTS).await, 4, "{}", s.log_text());
    assert_eq!(rig.count(WORK).await, 0);
    assert_eq!(rig.count(SESSIONS).await, 0);
}

#[actix_rt::test]
async fn bad_configuration_exits_2_naming_the_key() {
    let rig = Rig::new().await;
    let missing_project = rig.write_config(
        "bad1.toml",
        &format!(
            "{}\n[provider]\nkind = \"equinix\"\n[provider.equinix]\nmetro = \"sv\"\n",
            rig.base_config()
        ),
    );
    let o = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("--config")
        .arg(&missing_project)
        .arg("run")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("equinix.project_id"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    let missing_agent = rig.write_config(
        "bad2.toml",
        &rig.base_config().replace(
            &*shepherd_sim::bin("takeover-agent").to_string_lossy(),
            "/nonexistent/agent",
        ),
    );
    let o = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("--config")
        .arg(&missing_agent)
        .arg("run")
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("initializer.agent_binary"));

    // The provider refuses the key at start: a configuration error too.
    let sim = Sim::start(1, &[]);
    let wrong_key = rig.write_config("bad3.toml", &rig.equinix_config(&sim));
    let o = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("--config")
        .arg(&wrong_key)
        .arg("run")
        .env("SIM_TOKEN", "not-the-token-4f9e")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("equinix.api_key"), "{stderr}");
    assert!(stderr.contains("401"), "{stderr}");
    assert!(!stderr.contains("not-the-token-4f9e"), "{stderr}");

    // A project ID that is not one.
    let bad_project = rig.write_config(
        "bad4.toml",
        &rig.equinix_config(&sim).replace(PROJECT, "my-project"),
    );
    let o = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("--config")
        .arg(&bad_project)
        .arg("check-config")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("equinix.project_id"), "{stderr}");
}

#[actix_rt::test]
async fn a_machine_gone_quiet_is_rebooted_and_taken_over_again() {
    let rig = Rig::new().await;
    let sim = Sim::start(3, &["--reboot-delay", "1s"]);
    let text = rig.equinix_config(&sim)
        + "\n[recoverer]\nsilent_after_start = \"1h\"\nheartbeat_stale_after = \"30s\"\npoll_interval = \"200ms\"\n\
           reboot_poll = \"100ms\"\nreboot_settle = \"3s\"\ncallback_grace = \"1s\"\n\
           agent_restart_wait = \"2s\"\nagent_return_wait = \"1s\"\n";
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("3 agents", AGENTS, 3, Duration::from_secs(60), &mut s)
        .await;
    // The agents report in (the BMDB server's part), then one goes quiet.
    let quiet: uuid::Uuid = rig
        .bmdb
        .transact(async |tx| {
            tx.execute("INSERT INTO machine_agent_heartbeat SELECT machine_id, now() FROM machine_agent_started", &[])
                .await?;
            let r = tx
                .query_one(
                    "UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() - interval '1 minute' \
                     WHERE machine_id = (SELECT machine_id FROM machine_agent_heartbeat ORDER BY machine_id LIMIT 1) RETURNING machine_id",
                    &[],
                )
                .await?;
            Ok(r.get(0))
        })
        .await
        .unwrap();
    let device: String = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT provider_id FROM machine_provided WHERE machine_id = $1",
                    &[&quiet],
                )
                .await?
                .get(0))
        })
        .await
        .unwrap();
    // The others keep reporting in while the quiet one is recovered.
    let keep = {
        let bmdb = rig.bmdb.clone();
        actix_rt::spawn(async move {
            loop {
                let _ = bmdb
                    .transact(async |tx| {
                        tx.execute(
                            "UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() WHERE machine_id <> $1",
                            &[&quiet],
                        )
                        .await
                    })
                    .await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    rig.wait_for_recovery(quiet, &s).await;
    keep.abort();
    let stats = sim.stats().await;
    assert_eq!(stats["reboots"][device.as_str()], 1, "{}", stats["reboots"]);
    assert_eq!(
        stats["reboots"].as_object().unwrap().len(),
        1,
        "only the quiet machine is rebooted"
    );
    // Taken over anew: agent started again, the stale heartbeat gone.
    assert_eq!(rig.count(AGENTS).await, 3);
    assert_eq!(
        rig.count("SELECT count(*) FROM machine_agent_heartbeat")
            .await,
        2
    );
    s.signal(Signal::SIGTERM);
    assert_eq!(s.exit(Duration::from_secs(20)).await.0, Some(0));
}

#[actix_rt::test]
async fn the_updater_brings_provider_changes_in_and_leaves_the_rest_alone() {
    let rig = Rig::new().await;
    let sim = Sim::start(3, &[]);
    let text = rig.equinix_config(&sim) + "\n[updater]\ninterval = \"500ms\"\n";
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("3 agents", AGENTS, 3, Duration::from_secs(60), &mut s)
        .await;
    rig.wait_for(
        "3 devices running in the BMDB",
        "SELECT count(*) FROM machine_provided WHERE provider_status = 'Running'",
        3,
        Duration::from_secs(20),
        &mut s,
    )
    .await;
    let versions = async || -> Vec<(String, String)> {
        rig.bmdb
            .transact(async |tx| {
                let rows = tx
                    .query(
                        "SELECT provider_id, xmin::text FROM machine_provided ORDER BY provider_id",
                        &[],
                    )
                    .await?;
                Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
            })
            .await
            .unwrap()
    };
    let before = versions().await;
    let changed = before[0].0.clone();
    let mut r = awc::Client::default()
        .patch(format!("http://{}/_sim/devices/{changed}", sim.addr))
        .send_json(&serde_json::json!({"state": "inactive", "address": "127.0.0.9"}))
        .await
        .unwrap();
    assert!(r.status().is_success(), "{:?}", r.body().await);
    let t = Instant::now();
    loop {
        let (status, address) = rig.provider_record(&changed).await;
        if status == "Stopped" && address == "127.0.0.9" {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "not updated within a period: {status} {address}\n{}",
            s.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1600)).await; // three more rounds
    let after = versions().await;
    assert_ne!(after[0], before[0]);
    assert_eq!(after[1..], before[1..], "unchanged machines were written");
    s.signal(Signal::SIGTERM);
    assert_eq!(s.exit(Duration::from_secs(20)).await.0, Some(0));
}

#[actix_rt::test]
async fn the_demo_takes_twenty_machines_over_from_a_0700_directory_and_recovers_those_it_silences()
{
    use std::os::unix::fs::PermissionsExt;
    // Where a newcomer clones: a directory only its owner may enter (as
    // root, the embedded PostgreSQL runs as `postgres`, which may not).
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let stdout = run_demo(
        dir.path(),
        &[
            "--machines",
            "20",
            "--timeout",
            "2m",
            "--hold",
            "5s",
            "--silence",
            "2",
        ],
    )
    .await;
    assert!(
        stdout.contains("all 20 machines taken over in") && stdout.contains("and heartbeating"),
        "{stdout}"
    );
    assert!(stdout.contains("held 5s: no machine recovered"), "{stdout}");
    // The two silenced are the two recovered, and no other.
    let silenced: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("silenced the agent of machine "))
        .collect();
    assert_eq!(silenced.len(), 2, "{stdout}");
    for s in &silenced {
        let id = s.split_whitespace().next().unwrap();
        assert!(
            stdout
                .lines()
                .any(|l| l.contains(&format!("machine {id} ("))
                    && l.contains(" recovered: agent restarted over SSH")),
            "{id} not shown recovered:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("all 2 silenced machines recovered and heartbeating again in")
            && stdout.contains("; 0 other machines recovered"),
        "{stdout}"
    );
    assert!(
        stdout.contains("admin page               http://127.0.0.1:"),
        "{stdout}"
    );
    // Every simulated machine ran the agent it was given.
    for i in 1..=20 {
        let runs = dir
            .path()
            .join(format!("var/demo/machines/127.0.1.{i}/root/agent.runs"));
        assert!(runs.is_file(), "{}", runs.display());
    }
    let bmdb = dir.path().join("var/demo/bmdb");
    if nix::unistd::Uid::effective().is_root() {
        // Its data went where `postgres` can reach it, linked from var/demo.
        let target = std::fs::read_link(&bmdb).expect("var/demo/bmdb is a link");
        assert!(
            target.starts_with(shepherd::bmdb::embedded::RELOCATED_BASE),
            "{}",
            target.display()
        );
        assert!(target.join("PG_VERSION").is_file());
    }
    shepherd::bmdb::embedded::remove_data_dir(&bmdb).unwrap();
}
