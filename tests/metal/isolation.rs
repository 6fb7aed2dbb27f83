//! One project's token never reaches another's devices, events, keys or
//! reservations (404, as if they did not exist); a read-only token only
//! reads; a revoked token is refused at once; no token value is ever in
//! the log, the pages or `/metrics`.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{Rig, device_body};

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICkDo8zEB8Smtgza5QrzwCKPkBUw4w7CiaFFlATBAM0z tenant-b";

#[actix_rt::test]
async fn a_projects_token_sees_only_its_project_over_https() {
    let rig = Rig::new(4, Ipv4Addr::new(127, 0, 71, 1)).await;
    let machines = rig.machines().await;
    let a = rig.project("tenant-a", &[]);
    let b = rig.project("tenant-b", &["--assigned-only"]);
    let (a_rw_id, a_rw) = rig.token(a, false);
    let (_, a_ro) = rig.token(a, true);
    let (_, b_rw) = rig.token(b, false);
    // B holds two machines of its own; A draws from the shared pool.
    let (b_machine, _) = machines[0];
    rig.cli(&[
        "projects",
        "assign",
        &b.to_string(),
        &machines[0].0.to_string(),
        &machines[1].0.to_string(),
    ]);

    // B's key, B's device on its reservation, B's events.
    let (s, key) = rig
        .call(
            "POST",
            &format!("/projects/{b}/ssh-keys"),
            Some(&b_rw),
            Some(json!({"label": "b", "key": KEY})),
        )
        .await;
    assert_eq!(s, 201, "{key}");
    let b_key = key["id"].as_str().unwrap().to_string();
    let mut body = device_body("b-one");
    body["hardware_reservation_id"] = json!(b_machine.to_string());
    let (s, dev) = rig.create(b, &b_rw, body).await;
    assert_eq!(s, 201, "{dev}");
    let b_dev = dev["id"].as_str().unwrap().to_string();
    assert_eq!(dev["hardware_reservation"]["id"], b_machine.to_string());
    let (s, events) = rig.get(&format!("/projects/{b}/events"), &b_rw).await;
    assert_eq!(s, 200, "{events}");
    let b_event = events["events"][0]["id"].as_str().unwrap().to_string();
    // The operator sees whose it is, in the machine's detail and the list.
    let (s, detail) = rig
        .operator_get(&format!("/api/v1/machines/{b_machine}"))
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        detail["tenancy"]["assigned_to"]["name"], "tenant-b",
        "{detail}"
    );
    assert_eq!(detail["tenancy"]["device"]["id"], json!(b_dev), "{detail}");
    assert_eq!(detail["tenancy"]["device"]["hostname"], "b-one");
    let (_, list) = rig.operator_get("/api/v1/machines").await;
    let row = list["machines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["machine_id"] == json!(b_machine.to_string()))
        .unwrap()
        .clone();
    assert_eq!(
        (row["project"].clone(), row["device"].clone()),
        (json!("tenant-b"), json!(b_dev)),
        "{row}"
    );
    let page = rig.operator_text(&format!("/machines/{b_machine}")).await;
    assert!(
        page.contains("tenant-b") && page.contains("b-one"),
        "{page}"
    );
    // The operator moves machines in the API: one running B's device
    // stays (409); B's other one goes to A and back to the shared pool.
    let post = |path: String, body: serde_json::Value| {
        let rig = &rig;
        async move {
            let mut r = rig
                .client
                .post(format!("{}{path}", rig.base))
                .send_json(&body)
                .await
                .unwrap();
            let b: serde_json::Value = serde_json::from_slice(&r.body().await.unwrap()).unwrap();
            (r.status().as_u16(), b)
        }
    };
    let (s, e) = post(
        format!("/api/v1/machines/{b_machine}/assign"),
        json!({"project": "tenant-a"}),
    )
    .await;
    assert_eq!(s, 409, "{e}");
    let other = machines[1].0;
    let (s, moved) = post(
        format!("/api/v1/machines/{other}/assign"),
        json!({"project": a.to_string()}),
    )
    .await;
    assert_eq!(s, 200, "{moved}");
    assert!(
        moved["detail"]
            .as_str()
            .unwrap()
            .contains("moved from project"),
        "{moved}"
    );
    let (_, r) = rig
        .get(&format!("/projects/{a}/hardware-reservations"), &a_rw)
        .await;
    assert_eq!(r["meta"]["total"], 1, "{r}");
    let (s, back) = post(format!("/api/v1/machines/{other}/unassign"), json!({})).await;
    assert_eq!(s, 200, "{back}");
    let (s, e) = post(
        format!("/api/v1/machines/{other}/assign"),
        json!({"project": "nobody"}),
    )
    .await;
    assert_eq!(s, 404, "{e}");
    // A's own device, from the shared pool (never B's assigned machines).
    let (s, a_dev) = rig.create(a, &a_rw, device_body("a-one")).await;
    assert_eq!(s, 201, "{a_dev}");
    let a_dev = a_dev["id"].as_str().unwrap().to_string();
    let (_, a_view) = rig.get(&format!("/devices/{a_dev}"), &a_rw).await;
    assert!(
        a_view["hardware_reservation"].is_null(),
        "A drew from the shared pool: {a_view}"
    );

    // Every path of B's, with A's token: 404, whatever the method.
    let b_paths = [
        ("GET", format!("/projects/{b}"), None),
        ("GET", format!("/projects/{b}/devices"), None),
        (
            "POST",
            format!("/projects/{b}/devices"),
            Some(device_body("intruder")),
        ),
        ("GET", format!("/projects/{b}/events"), None),
        ("GET", format!("/projects/{b}/hardware-reservations"), None),
        ("GET", format!("/projects/{b}/ssh-keys"), None),
        (
            "POST",
            format!("/projects/{b}/ssh-keys"),
            Some(json!({"label": "x", "key": KEY})),
        ),
        ("GET", format!("/projects/{b}/plans"), None),
        ("GET", format!("/devices/{b_dev}"), None),
        (
            "PUT",
            format!("/devices/{b_dev}"),
            Some(json!({"hostname": "taken"})),
        ),
        ("DELETE", format!("/devices/{b_dev}"), None),
        (
            "POST",
            format!("/devices/{b_dev}/actions"),
            Some(json!({"type": "reboot"})),
        ),
        ("GET", format!("/devices/{b_dev}/events"), None),
        ("GET", format!("/devices/{b_dev}/ssh-keys"), None),
        ("GET", format!("/hardware-reservations/{b_machine}"), None),
        ("GET", format!("/ssh-keys/{b_key}"), None),
        (
            "PUT",
            format!("/ssh-keys/{b_key}"),
            Some(json!({"label": "mine"})),
        ),
        ("DELETE", format!("/ssh-keys/{b_key}"), None),
        ("GET", format!("/events/{b_event}"), None),
    ];
    for token in [&a_rw, &a_ro] {
        for (method, path, body) in &b_paths {
            let (s, answer) = rig.call(method, path, Some(token), body.clone()).await;
            assert_eq!(s, 404, "{method} {path} with A's token: {answer}");
            assert!(answer["errors"].is_array(), "{method} {path}: {answer}");
        }
    }
    // Lists show A's own only.
    let (_, list) = rig.get("/projects", &a_rw).await;
    let ids: Vec<_> = list["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].clone())
        .collect();
    assert_eq!(ids, vec![json!(a.to_string())], "{list}");
    for path in ["/events", "/ssh-keys"] {
        let (_, l) = rig.get(path, &a_rw).await;
        assert!(
            !l.to_string().contains(&b_dev) && !l.to_string().contains(&b_key),
            "{path}: {l}"
        );
    }
    // B's device is untouched.
    let (s, still) = rig.get(&format!("/devices/{b_dev}"), &b_rw).await;
    assert_eq!(
        (s, still["hostname"].clone()),
        (200, json!("b-one")),
        "{still}"
    );

    // A read-only token reads, and cannot create, update, delete or act.
    let (s, _) = rig.get(&format!("/devices/{a_dev}"), &a_ro).await;
    assert_eq!(s, 200);
    for (method, path, body) in [
        (
            "POST",
            format!("/projects/{a}/devices"),
            Some(device_body("ro")),
        ),
        (
            "PUT",
            format!("/devices/{a_dev}"),
            Some(json!({"hostname": "ro"})),
        ),
        ("DELETE", format!("/devices/{a_dev}"), None),
        (
            "POST",
            format!("/devices/{a_dev}/actions"),
            Some(json!({"type": "reboot"})),
        ),
        (
            "POST",
            format!("/projects/{a}/ssh-keys"),
            Some(json!({"key": KEY})),
        ),
    ] {
        let (s, answer) = rig.call(method, &path, Some(&a_ro), body).await;
        assert_eq!(s, 403, "{method} {path} read-only: {answer}");
    }
    let (_, unchanged) = rig.get(&format!("/devices/{a_dev}"), &a_rw).await;
    assert_eq!(unchanged["hostname"], "a-one");

    // No token, a wrong one: 401.
    for token in [None, Some("shp_notatoken0000000000000000000000000000")] {
        let (s, answer) = rig.call("GET", "/projects", token, None).await;
        assert_eq!(s, 401, "{answer}");
    }

    // Revoked: refused from the moment the CLI returns.
    let (s, _) = rig.get("/projects", &a_rw).await;
    assert_eq!(s, 200);
    rig.cli(&["tokens", "revoke", &a_rw_id.to_string()]);
    let revoked = Instant::now();
    let (s, answer) = rig.get("/projects", &a_rw).await;
    assert_eq!(s, 401, "{answer}");
    assert!(revoked.elapsed() < Duration::from_secs(1));
    let listed = rig.cli(&["tokens", "list"]);
    assert!(listed.contains(&a_rw_id.to_string()), "{listed}");

    // The tenants' series.
    let metrics = rig.operator_text("/metrics").await;
    for series in [
        "shepherd_projects 2",
        "shepherd_api_tokens{status=\"revoked\"} 1",
        "shepherd_api_tokens{status=\"live\"} 2",
    ] {
        assert!(metrics.contains(series), "{series} not in {metrics}");
    }
    assert!(
        metrics.contains("shepherd_devices{state=\"active\"}"),
        "{metrics}"
    );
    // No value anywhere an operator or a scraper looks.
    let pages = [
        rig.operator_text("/").await,
        rig.operator_text("/metrics").await,
        rig.operator_text("/api/v1/machines").await,
        rig.operator_text(&format!("/machines/{b_machine}")).await,
        listed,
        rig.cli(&["projects", "list"]),
        rig.cli(&["devices", "list"]),
        std::fs::read_to_string(rig.dir.path().join("shepherd.log")).unwrap(),
    ];
    for token in [&a_rw, &a_ro, &b_rw] {
        for p in &pages {
            assert!(!p.contains(token.as_str()), "a token value shown");
        }
    }
}

#[actix_rt::test]
async fn tokens_are_not_taken_over_plain_http_beyond_loopback() {
    // Configuration: a listener beyond loopback must serve HTTPS.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("s.toml");
    std::fs::write(
        &config,
        "[admin]\nlisten = \"0.0.0.0:9999\"\ntoken = \"0123456789abcdef0123\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(super::SHEPHERD)
        .arg("--config")
        .arg(&config)
        .arg("check-config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("admin.tls.enabled"), "{err}");
    assert!(!err.contains("0123456789abcdef0123"), "{err}");
}
