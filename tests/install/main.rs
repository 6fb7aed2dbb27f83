//! Installations end to end: `fleet-sim` machines (their agents run the
//! real installer onto a file standing for each machine's disk), one
//! `shepherd run` serving the image from a directory over TLS, operators
//! asking through the JSON API. What is checked is what an operator would
//! look at: the API's progress and states, the report and history in the
//! BMDB, the bytes on the machines' disks, a rollout's stop rule.

mod rig;
mod swarm;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use rig::{Rig, SHEPHERD};
use serde_json::{Value, json};
use shepherd::bmdb::Bmdb;
use shepherd_sim::testing::TestDb;

#[actix_rt::test]
async fn an_operator_installs_an_image_shepherd_serves_and_follows_it_in_the_api() {
    let mut rig = Rig::new(3, Ipv4Addr::new(127, 0, 62, 1)).await;
    let machines = rig.machines().await;
    let (id, ip) = machines[1].clone();
    // Bad requests name what is wrong and ask nothing.
    let install = format!("/api/v1/machines/{id}/install");
    for (image, named) in [
        (
            json!({"url": "https://images.example/x.img"}),
            "image.digest",
        ),
        (json!({"served": "nothing-here.img"}), "image.served"),
        (
            json!({"served": "../images/debian.img.zst"}),
            "image.served",
        ),
        (
            json!({"url": "ftp://images.example/x.img", "digest": format!("sha256:{}", "0".repeat(64))}),
            "image.url",
        ),
    ] {
        let (status, body) = rig.post(&install, json!({ "image": image })).await;
        assert_eq!(status, 400, "{body}");
        assert!(body.to_string().contains(named), "{body}");
    }
    // An image put in the directory while shepherd runs is hashed when
    // first asked for: the API answers 503 meanwhile rather than wait
    // (512 MiB, sparse: longer than the quarter of a second it waits),
    // and asks nothing.
    let late = rig.dir.path().join("images/late.img");
    std::fs::File::create(&late)
        .unwrap()
        .set_len(512 << 20)
        .unwrap();
    for _ in 0..2 {
        let (status, body) = rig
            .post(&install, json!({"image": {"served": "late.img"}}))
            .await;
        assert_eq!(status, 503, "{body}");
        let error = body["error"].as_str().unwrap();
        assert!(
            error.contains("\"late.img\"") && error.contains("being computed"),
            "{error}"
        );
    }
    std::fs::remove_file(&late).unwrap();
    let (status, body) = rig
        .post_install(
            &format!("/api/v1/machines/{id}/install"),
            json!({"image": {"served": "debian.img.zst", "reboot": true}, "reason": "first OS"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["generation"], 1);
    assert_eq!(body["action"]["action"], "install");
    // Follow it.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut states = Vec::new();
    let detail = loop {
        let d = rig.get(&format!("/api/v1/machines/{id}")).await;
        let state = d["machine"]["state"].as_str().unwrap().to_string();
        if states.last() != Some(&state) {
            states.push(state.clone());
        }
        if state == "installed" || state == "install-failed" {
            break d;
        }
        rig.shepherd.assert_running();
        assert!(
            Instant::now() < deadline,
            "still {state}: {d:#}\n{}",
            rig.shepherd.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let inst = &detail["installation"];
    assert_eq!(detail["machine"]["state"], "installed", "{inst:#}");
    assert_eq!(
        states.first().map(String::as_str),
        Some("installing"),
        "{states:?}"
    );
    assert_eq!(inst["result"], "Success");
    assert_eq!(inst["generation"], 1);
    assert!(
        inst["image_url"]
            .as_str()
            .unwrap()
            .starts_with("https://127.0.0.1:")
    );
    assert!(
        inst["image_url"]
            .as_str()
            .unwrap()
            .ends_with("/images/debian.img.zst")
    );
    assert_eq!(inst["requested_by"], "anonymous");
    // The agent fetched the image's manifest before the image, from the
    // image server, under the same grant.
    let log = std::fs::read_to_string(&rig.shepherd.log).unwrap();
    let asked: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("image download") && l.contains("debian.img.zst"))
        .collect();
    assert!(
        asked
            .first()
            .is_some_and(|l| l.contains("what=\"manifest\""))
            && asked.iter().any(|l| l.contains("what=\"image\"")),
        "{asked:#?}"
    );
    let p = &inst["progress"];
    assert_eq!(p["bytes_written"], rig.image.len() as u64, "{p:#}");
    assert_eq!(p["bytes_fetched"], p["bytes_total"], "{p:#}");
    assert!(
        p["bytes_fetched"].as_u64().unwrap() < rig.image.len() as u64,
        "compressed"
    );
    assert!(
        ["done", "rebooting"].contains(&p["phase"].as_str().unwrap()),
        "{p:#}"
    );
    assert!(p["disk"].as_str().unwrap().ends_with("disk0"), "{p:#}");
    let events: Vec<&str> = inst["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["event"].as_str().unwrap())
        .collect();
    assert_eq!(events, ["requested", "installed"]);
    assert!(rig.disk_holds_image(&ip), "the disk holds the image");
    // The other machines were not touched.
    for (_, other) in machines.iter().filter(|(m, _)| *m != id) {
        assert!(!rig.disk(other).exists(), "{other} has a disk written");
    }
    // The report is stored as the contract says, and the agent rebooted
    // into the installed system (it calls no more).
    let (generation, result): (i32, String) = rig
        .bmdb
        .transact(async |tx| {
            let r = tx
                .query_one(
                    "SELECT generation, os_installation_result::text \
                     FROM machine_os_installation_report WHERE machine_id = $1",
                    &[&id],
                )
                .await?;
            Ok((r.get(0), r.get(1)))
        })
        .await
        .unwrap();
    assert_eq!((generation, result.as_str()), (1, "Success"));
    let before = last_heartbeat(&rig.bmdb, id).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        last_heartbeat(&rig.bmdb, id).await,
        before,
        "the agent is gone"
    );
    // Installed machines are left alone: no recovery, no takeover.
    let work = shepherd_sim::testing::count(&rig.bmdb, "SELECT count(*) FROM work").await;
    assert_eq!(work, 0);
    // A second installation is the next generation: the installed system
    // runs no agent, so the machine is taken over again first.
    let (status, body) = rig
        .post(
            &format!("/api/v1/machines/{id}/install"),
            json!({"image": {"served": "debian.img.zst"}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["generation"], 2);
    assert!(retaken(&body), "{body}");
    let (status, body) = rig
        .post(
            &format!("/api/v1/machines/{id}/install"),
            json!({"image": {"served": "debian.img.zst"}}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(body.to_string().contains("installing"), "{body}");
    let d = rig.wait_state(id, &["installed", "install-failed"]).await;
    assert_eq!(d["installation"]["generation"], 2, "{d:#}");
    assert_eq!(d["installation"]["result"], "Success", "{d:#}");
}

/// The machine's stored installation request (the contract's bytes).
async fn stored_request(bmdb: &Bmdb, id: uuid::Uuid) -> shepherd_agent::api::OsInstallationRequest {
    use prost::Message as _;
    let raw: Vec<u8> = bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT os_installation_request_raw FROM machine_os_installation_request WHERE machine_id = $1",
                    &[&id],
                )
                .await?
                .get(0))
        })
        .await
        .unwrap();
    shepherd_agent::api::OsInstallationRequest::decode(raw.as_slice()).unwrap()
}

async fn last_heartbeat(bmdb: &Bmdb, id: uuid::Uuid) -> Option<std::time::SystemTime> {
    bmdb.transact(async |tx| {
        Ok(tx
            .query_opt(
                "SELECT agent_heartbeat_at FROM machine_agent_heartbeat WHERE machine_id = $1",
                &[&id],
            )
            .await?
            .map(|r| r.get(0)))
    })
    .await
    .unwrap()
}

#[actix_rt::test]
async fn a_rollout_over_twenty_machines_stops_once_more_failed_than_allowed() {
    let mut rig = Rig::new(20, Ipv4Addr::new(127, 0, 63, 1)).await;
    let machines = rig.machines().await;
    assert_eq!(machines.len(), 20);
    // Two machines whose disk cannot be opened: their agents fail.
    let failing = [4usize, 7];
    for i in failing {
        std::fs::create_dir_all(rig.disk(&machines[i].1)).unwrap();
    }
    let ids: Vec<String> = machines.iter().map(|(m, _)| m.to_string()).collect();
    let (status, body) = rig
        .post(
            "/api/v1/rollouts",
            json!({
                "image": {"served": "debian.img.zst"},
                "machines": ids,
                "max_parallel": 3,
                "max_failures": 1,
            }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let rollout = body["rollout"]["rollout_id"].as_str().unwrap().to_string();
    assert_eq!(body["rollout"]["counts"]["waiting"], 20);
    // Watch it: never more than 3 running.
    let deadline = Instant::now() + Duration::from_secs(180);
    let done = loop {
        let r = rig.get(&format!("/api/v1/rollouts/{rollout}")).await;
        let running = r["rollout"]["counts"]["running"].as_i64().unwrap();
        assert!(running <= 3, "{running} running: {r:#}");
        if r["rollout"]["state"] != "running" {
            break r;
        }
        rig.shepherd.assert_running();
        assert!(
            Instant::now() < deadline,
            "rollout still running: {r:#}\n{}",
            rig.shepherd.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let r = &done["rollout"];
    assert_eq!(r["state"], "stopped", "{done:#}");
    assert_eq!(r["counts"]["failed"], 2, "{done:#}");
    assert!(
        r["end_reason"]
            .as_str()
            .unwrap()
            .contains("more than the 1 allowed")
    );
    let members = done["machines"].as_array().unwrap();
    let failed: Vec<usize> = members
        .iter()
        .filter(|m| m["state"] == "failed")
        .map(|m| m["position"].as_u64().unwrap() as usize)
        .collect();
    assert_eq!(failed, failing);
    for m in members.iter().filter(|m| m["state"] == "failed") {
        assert!(m["error"].as_str().unwrap().contains("no disk"), "{m:#}");
    }
    // The stop rule: the round that saw the second failure stopped the
    // rollout, and none started a machine after it; machines wait that
    // were never asked, and stay so.
    let ended = r["ended_at"].as_str().unwrap();
    for m in members.iter().filter(|m| !m["started_at"].is_null()) {
        assert!(
            m["started_at"].as_str().unwrap() <= ended,
            "{m:#} after {ended}"
        );
    }
    let waiting: Vec<&Value> = members.iter().filter(|m| m["state"] == "waiting").collect();
    assert!(!waiting.is_empty(), "{done:#}");
    for m in &waiting {
        assert!(m["generation"].is_null());
    }
    let asked = shepherd_sim::testing::count(
        &rig.bmdb,
        "SELECT count(*) FROM machine_os_installation_request",
    )
    .await;
    assert_eq!(asked as usize, 20 - waiting.len());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = shepherd_sim::testing::count(
        &rig.bmdb,
        "SELECT count(*) FROM machine_os_installation_request",
    )
    .await;
    assert_eq!(later, asked, "nothing asked after the stop");
    // The ones that were asked and did not fail hold the image (those still
    // running finish after the stop).
    let deadline = Instant::now() + Duration::from_secs(60);
    for m in members
        .iter()
        .filter(|m| m["state"] == "done" || m["state"] == "running")
    {
        let pos = m["position"].as_u64().unwrap() as usize;
        while !rig.disk_holds_image(&machines[pos].1) {
            assert!(
                Instant::now() < deadline,
                "machine {pos} never got the image"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    for m in &waiting {
        let pos = m["position"].as_u64().unwrap() as usize;
        assert!(
            !rig.disk(&machines[pos].1).exists(),
            "waiting machine {pos} was written"
        );
    }
    // Listed, and a stopped rollout cannot be canceled into anything else.
    let list = rig.get("/api/v1/rollouts").await;
    assert_eq!(list["rollouts"][0]["rollout_id"], rollout.as_str());
    let (status, body) = rig
        .post(&format!("/api/v1/rollouts/{rollout}/cancel"), json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rollout"]["state"], "stopped");
}

#[actix_rt::test]
async fn an_operator_installs_from_the_machine_page_in_a_browser_and_watches_it_end() {
    let rig = Rig::new(2, Ipv4Addr::new(127, 0, 64, 1)).await;
    let machines = rig.machines().await;
    let (id, ip) = machines[0].clone();
    let png = rig.dir.path().join("install.png");
    let seen = shepherd_sim::testing::browse(vec![
        "install".into(),
        rig.admin.clone(),
        id.to_string(),
        "debian.img.zst".into(),
        png.display().to_string(),
    ])
    .await;
    assert_eq!(seen["before"], "No installation asked yet.", "{seen:#}");
    assert!(
        seen["done_notice"]
            .as_str()
            .unwrap()
            .starts_with("install by anonymous: generation 1:"),
        "{seen:#}"
    );
    assert_eq!(seen["states"][0], "installing", "{seen:#}");
    assert_eq!(seen["machine_state"], "installed", "{seen:#}");
    assert_eq!(seen["result"], "Success", "{seen:#}");
    assert!(
        seen["by"].as_str().unwrap().starts_with("anonymous at "),
        "{seen:#}"
    );
    assert_eq!(
        seen["events"],
        json!(["requested", "installed"]),
        "{seen:#}"
    );
    // The last progress bar is full, and says what was written.
    let last = seen["progress"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last[0], last[1], "{seen:#}");
    assert!(
        seen["bytes"]
            .as_str()
            .unwrap()
            .ends_with("fetched, 12 MiB written"),
        "{seen:#}"
    );
    assert!(rig.disk_holds_image(&ip));
    assert!(std::fs::metadata(&png).unwrap().len() > 10_000);
}

/// `shepherd machines install` and `shepherd rollouts` against a BMDB of
/// three machines (no shepherd running: the CLI writes the requests and
/// the rollout; running shepherds would carry them out).
#[actix_rt::test]
async fn the_command_line_asks_installs_and_starts_follows_and_cancels_rollouts() {
    use shepherd::bmdb::machines::{self, NewProvidedMachine};
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let m = NewProvidedMachine {
            provider: shepherd::bmdb::Provider::Equinix,
            provider_id: format!("cli-{i}"),
            reservation_id: None,
            ip_address: Some(format!("127.0.9.{}", i + 1)),
            location: None,
            status: None,
        };
        ids.push(
            bmdb.transact(async |tx| machines::create_provided(tx, &m).await)
                .await
                .unwrap(),
        );
    }
    let run = |args: &[&str]| {
        let out = std::process::Command::new(SHEPHERD)
            .args(args)
            .env("SHEPHERD__BMDB__URL", db.url())
            .env("SHEPHERD__LOG__LEVEL", "warn")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let digest = format!("sha256:{}", "0f".repeat(32));
    let id = ids[0].to_string();
    // Wrong input is named, and asks nothing.
    let (code, _, err) = run(&[
        "machines",
        "install",
        &id,
        "--url",
        "https://images.example/a.img",
        "--digest",
        "md5:abc",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("image.digest"), "{err}");
    let (code, _, err) = run(&["machines", "install", &id, "--served", "a.img"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("installations.images_dir"), "{err}");
    let (code, _, err) = run(&[
        "machines",
        "install",
        "--url",
        "https://images.example/a.img",
        "--digest",
        &digest,
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("name the machines"), "{err}");
    // One machine.
    let (code, out, err) = run(&[
        "machines",
        "install",
        &id,
        "--url",
        "https://images.example/a.img",
        "--digest",
        &digest,
        "--disk-serial",
        "S1",
        "--reboot",
        "--reason",
        "first OS",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out.trim(),
        format!("install {id}: generation 1: https://images.example/a.img")
    );
    let (code, _, err) = run(&[
        "machines",
        "install",
        &id,
        "--url",
        "https://images.example/a.img",
        "--digest",
        &digest,
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("installing generation 1"), "{err}");
    // What was stored is the contract's request, with shepherd's image.
    let req = stored_request(&bmdb, ids[0]).await;
    assert_eq!(req.generation, 1);
    let Some(shepherd_agent::api::os_installation_request::Type::Image(image)) = req.r#type else {
        panic!("{req:?}");
    };
    assert_eq!(image.digest, digest);
    assert!(image.reboot);
    assert_eq!(image.disk.unwrap().serial, "S1");
    let (_, out, _) = run(&["machines", "show", &id]);
    assert!(
        out.contains("installation: generation 1 installing"),
        "{out}"
    );
    assert!(out.contains("generation 1 requested"), "{out}");
    // A rollout over the others, by search.
    let (code, out, err) = run(&[
        "machines",
        "install",
        "--search",
        "cli-",
        "--url",
        "https://images.example/b.img",
        "--digest",
        &digest,
        "--max-parallel",
        "2",
        "--max-failures",
        "1",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("3 machines (q=cli-), 2 at once, stops after 2 failures"),
        "{out}"
    );
    let rollout = out
        .split_whitespace()
        .nth(1)
        .unwrap()
        .trim_end_matches(':')
        .to_string();
    let (code, out, _) = run(&["rollouts", "list"]);
    assert_eq!(code, Some(0));
    assert!(out.contains(&rollout) && out.contains("waiting 3"), "{out}");
    let (code, out, _) = run(&["rollouts", "cancel", &rollout]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("canceled") && out.contains("skipped 3"),
        "{out}"
    );
    let (_, out, _) = run(&["rollouts", "show", &rollout]);
    assert!(out.contains("ended: canceled by cli"), "{out}");
    // First-boot data from files: the request carries a NoCloud seed whose
    // meta-data names this machine's generation; only digests are shown.
    let id1 = ids[1].to_string();
    let files = tempfile::tempdir().unwrap();
    let keys = files.path().join("keys.pub");
    std::fs::write(
        &keys,
        "# ops\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey ops@example\n",
    )
    .unwrap();
    let user_data = files.path().join("user-data.yaml");
    std::fs::write(&user_data, "#cloud-config\npassword: hunter2-do-not-log\n").unwrap();
    let (code, out, err) = run(&[
        "machines",
        "install",
        &id1,
        "--url",
        "https://images.example/a.img",
        "--digest",
        &digest,
        "--hostname",
        "web-{{provider_id}}",
        "--ssh-authorized-keys",
        keys.to_str().unwrap(),
        "--user-data",
        user_data.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains("hunter2"), "{out}");
    let req = stored_request(&bmdb, ids[1]).await;
    let Some(shepherd_agent::api::os_installation_request::Type::Image(image)) = req.r#type else {
        panic!("{req:?}");
    };
    let Some(shepherd_agent::api::image_installation::FirstBoot::Nocloud(seed)) = image.first_boot
    else {
        panic!("no seed: {image:?}");
    };
    let meta = String::from_utf8(seed.files["meta-data"].clone()).unwrap();
    assert!(
        meta.starts_with(&format!("instance-id: {id1}-g1\n")),
        "{meta}"
    );
    assert!(meta.contains("local-hostname: \"web-cli-1\""), "{meta}");
    assert!(
        meta.contains("  - \"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey ops@example\""),
        "{meta}"
    );
    assert!(String::from_utf8_lossy(&seed.files["user-data"]).contains("hunter2"));
    let (_, out, _) = run(&["machines", "show", &id1]);
    assert!(!out.contains("hunter2"), "{out}");
    // Deprovisioning a machine with no agent yet: refused, naming its state.
    let (code, _, err) = run(&["machines", "deprovision", &ids[2].to_string()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("is pending: deprovision is not allowed"),
        "{err}"
    );
    let (code, _, err) = run(&["machines", "deprovision", &id, "--mode", "shred"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--mode"), "{err}");
    // A deprovisioning rollout over a search.
    let (code, out, err) = run(&[
        "machines",
        "deprovision",
        "--search",
        "cli-",
        "--mode",
        "discard",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("deprovision: erase (discard)"), "{out}");
}

/// A raw disk image with a GPT (one 8 MiB Linux partition) made by
/// sfdisk, as images are.

#[actix_rt::test]
async fn an_installed_machine_with_first_boot_data_is_deprovisioned_and_available_again() {
    let mut rig = Rig::new(2, Ipv4Addr::new(127, 0, 63, 1)).await;
    let (id, ip) = rig.machines().await[0].clone();
    let secret = "password-in-user-data-7f3e";
    let (status, body) = rig
        .post_install(
            &format!("/api/v1/machines/{id}/install"),
            json!({"image": {"served": "gpt.img", "reboot": true, "first_boot": {"nocloud": {
                "user-data": format!("#cloud-config\nchpasswd:\n  users:\n    - {{name: root, password: {secret}}}\n"),
                "meta-data": "local-hostname: {{provider_id}}\n"}}}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.to_string().contains(secret), "{body}");
    let d = rig.wait_state(id, &["installed", "install-failed"]).await;
    assert_eq!(d["machine"]["state"], "installed", "{d:#}");
    let fb = d["installation"]["first_boot"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(fb.starts_with("nocloud: meta-data "), "{fb}");
    assert!(fb.contains("user-data ") && fb.contains("sha256:"), "{fb}");
    // The seed is on the machine's disk, behind the image, its meta-data
    // filled for this machine and generation.
    let disk = rig.disk(&ip);
    let out = std::process::Command::new("sfdisk")
        .arg("--json")
        .arg(&disk)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t: Value = serde_json::from_slice(&out.stdout).unwrap();
    let parts = t["partitiontable"]["partitions"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(parts.len(), 2, "{t:#}");
    assert_eq!(parts[1]["name"], "cidata");
    let offset = parts[1]["start"].as_u64().unwrap() * 512;
    let meta = std::process::Command::new("mcopy")
        .arg("-i")
        .arg(format!("{}@@{offset}", disk.display()))
        .args(["::meta-data", "-"])
        .env("MTOOLS_SKIP_CHECK", "1")
        .output()
        .unwrap();
    let meta = String::from_utf8_lossy(&meta.stdout).into_owned();
    let provider_id: String = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT provider_id FROM machine_provided WHERE machine_id = $1",
                    &[&id],
                )
                .await?
                .get(0))
        })
        .await
        .unwrap();
    assert!(meta.contains(&format!("instance-id: {id}-g1")), "{meta}");
    assert!(
        meta.contains(&format!("local-hostname: {provider_id}")),
        "{meta}"
    );
    // Nor is it in the service's log.
    assert!(!rig.shepherd.log_tail().contains(secret));
    // Deprovisioned: taken over again (the installed system runs no
    // agent), erased, available.
    let (status, body) = rig
        .post(
            &format!("/api/v1/machines/{id}/deprovision"),
            json!({"mode": "metadata", "reason": "tenant left"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["generation"], 2);
    assert_eq!(body["action"]["action"], "deprovision");
    assert!(retaken(&body), "{body}");
    let d = rig.wait_state(id, &["available", "clean-failed"]).await;
    assert_eq!(d["machine"]["state"], "available", "{d:#}");
    let inst = &d["installation"];
    assert_eq!(inst["kind"], "erase");
    assert_eq!(inst["erase_mode"], "metadata");
    // Its progress says what an erasure did: bytes erased and their rate,
    // never a fetch (in the API and on its page).
    let p = &inst["progress"];
    assert_eq!(p["bytes_fetched"], 0, "{p}");
    assert!(p["bytes_written"].as_i64().unwrap() > 0, "{p}");
    assert!(p["rate_bytes_per_second"].as_i64().unwrap() > 0, "{p}");
    let page = shepherd_sim::testing::page(&format!("{}/machines/{id}", rig.admin)).await;
    let shown = page
        .split("id=\"install-bytes\"")
        .nth(1)
        .and_then(|s| s.split("</tr>").next())
        .unwrap_or_else(|| panic!("the erasure's progress on its page: {page}"));
    assert!(shown.contains("erased (written or discarded)"), "{shown}");
    assert!(!shown.contains("fetched"), "{shown}");
    let rate = page.split("id=\"install-rate\">").nth(1).unwrap();
    assert!(
        rate.starts_with(|c: char| c.is_ascii_digit()) && !rate.starts_with("0 B/s"),
        "{rate}"
    );
    let events: Vec<&str> = inst["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        ["requested", "installed", "erase-requested", "erased"]
    );
    // No partition table is left, nor the seed's filesystem.
    let out = std::process::Command::new("sfdisk")
        .arg("--json")
        .arg(&disk)
        .output()
        .unwrap();
    assert!(
        !out.status.success() || out.stdout.is_empty(),
        "a partition table is left: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let probed = std::process::Command::new("blkid")
        .args(["-p", "-o", "export", "-O"])
        .arg(offset.to_string())
        .arg(&disk)
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&probed.stdout).contains("CIDATA"),
        "the seed is gone"
    );
    // Available: its agent heartbeats and takes the next installation,
    // without being taken over again (an erasure leaves the agent).
    let (status, body) = rig
        .post(
            &format!("/api/v1/machines/{id}/install"),
            json!({"image": {"served": "gpt.img"}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(!retaken(&body), "{body}");
    let d = rig.wait_state(id, &["installed", "install-failed"]).await;
    assert_eq!(d["machine"]["state"], "installed", "{d:#}");
    // A deprovisioning rollout over the other machine (heartbeating,
    // never installed): erased in place, available.
    let other = rig.machines().await[1].0;
    let (status, body) = rig
        .post(
            "/api/v1/rollouts",
            json!({"machines": [other], "deprovision": {"mode": "overwrite",
                   "disk": {"max_size_bytes": 1}}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let rollout = body["rollout"]["rollout_id"].as_str().unwrap().to_string();
    let d = rig.wait_state(other, &["available", "clean-failed"]).await;
    // No disk of at most one byte: the erasure fails, naming the disks.
    assert_eq!(d["machine"]["state"], "clean-failed", "{d:#}");
    let error = d["installation"]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(error.contains("no disk matches"), "{error}");
    // Held from installations until an erasure succeeds.
    let (status, body) = rig
        .post(
            &format!("/api/v1/machines/{other}/install"),
            json!({"image": {"served": "gpt.img"}}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(body.to_string().contains("is clean-failed"), "{body}");
    let (status, body) = rig
        .post(
            &format!("/api/v1/machines/{other}/deprovision"),
            json!({"mode": "metadata"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // A failed erasure left its agent too.
    assert!(!retaken(&body), "{body}");
    let d = rig.wait_state(other, &["available"]).await;
    assert_eq!(d["installation"]["generation"], 2);
    let r = rig.get(&format!("/api/v1/rollouts/{rollout}")).await;
    assert_eq!(r["rollout"]["state"], "stopped", "one failure: {r:#}");
    // Deprovisioning a machine that is not there, or twice at once: 404, 409.
    let (status, _) = rig
        .post(
            &format!("/api/v1/machines/{}/deprovision", uuid::Uuid::new_v4()),
            json!({}),
        )
        .await;
    assert_eq!(status, 404);
    let (status, body) = rig
        .post(
            &format!("/api/v1/machines/{id}/deprovision"),
            json!({"mode": "shred"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("mode"), "{body}");
}

/// Whether an install or deprovision answer says the machine is taken over
/// again first.
fn retaken(answer: &Value) -> bool {
    answer["action"]["detail"]
        .as_str()
        .unwrap()
        .contains("takes it over again")
}
