//! A device's life: created with userdata and a key, installed and
//! `active`, rebooted, powered off and on through its BMC, reinstalled,
//! deleted; then its machine is erased and available to the next tenant.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Rig;

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICfsPiOD+ZsHgx4BT9aQS60rgpppknEo+hr/1F2lB0mX tenant";

/// The machine's power as its (simulated) BMC says.
async fn bmc_power(rig: &Rig, node: &str) -> String {
    let text = std::fs::read_to_string(rig.dir.path().join("fleet.toml")).unwrap();
    let cfg: toml::Value = toml::from_str(&text).unwrap();
    let m = cfg["provider"]["inventory"]["machines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"].as_str() == Some(node))
        .unwrap();
    let bmc = &m["bmc"];
    let url = format!("{}/redfish/v1/Systems/1", bmc["url"].as_str().unwrap());
    let mut r = awc::Client::default()
        .get(&url)
        .basic_auth(
            bmc["username"].as_str().unwrap(),
            bmc["password"].as_str().unwrap(),
        )
        .send()
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&r.body().await.unwrap()).unwrap();
    v["PowerState"].as_str().unwrap_or("").to_string()
}

/// The NoCloud seed's meta-data on the machine's disk.
fn seed_meta(disk: &std::path::Path) -> String {
    let out = std::process::Command::new("sfdisk")
        .arg("--json")
        .arg(disk)
        .output()
        .unwrap();
    let t: Value = serde_json::from_slice(&out.stdout).unwrap();
    let parts = t["partitiontable"]["partitions"]
        .as_array()
        .unwrap()
        .clone();
    let seed = parts
        .iter()
        .find(|p| p["name"] == "cidata")
        .expect("a cidata volume");
    let offset = seed["start"].as_u64().unwrap() * 512;
    let meta = std::process::Command::new("mcopy")
        .arg("-i")
        .arg(format!("{}@@{offset}", disk.display()))
        .args(["::meta-data", "-"])
        .env("MTOOLS_SKIP_CHECK", "1")
        .output()
        .unwrap();
    String::from_utf8_lossy(&meta.stdout).into_owned()
}

pub fn holds_image(rig: &Rig, disk: &std::path::Path) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok(f) = std::fs::File::open(disk) else {
        return false;
    };
    // The image's recognizable partition.
    let want = &rig.image[1 << 20..(1 << 20) + (4 << 20)];
    let mut b = vec![0u8; want.len()];
    f.read_exact_at(&mut b, 1 << 20).is_ok() && b == want
}

async fn act(rig: &Rig, id: &str, token: &str, kind: &str) {
    let (s, body) = rig
        .call(
            "POST",
            &format!("/devices/{id}/actions"),
            Some(token),
            Some(json!({"type": kind})),
        )
        .await;
    assert_eq!(s, 202, "{kind}: {body}");
}

#[actix_rt::test]
async fn a_device_is_installed_powered_reinstalled_deleted_and_its_machine_erased() {
    let mut rig = Rig::new(1, Ipv4Addr::new(127, 0, 73, 1)).await;
    let (machine, ip) = rig.machines().await[0].clone();
    let p = rig.project("lifecycle", &[]);
    let (_, token) = rig.token(p, false);
    // The catalog.
    let (_, plans) = rig.get("/plans", &token).await;
    let slugs: Vec<_> = plans["plans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["slug"].clone())
        .collect();
    assert_eq!(
        slugs,
        vec![
            json!("c3.small.sb"),
            json!("c3.small.x86"),
            json!("m3.large.x86")
        ]
    );
    let described = plans["plans"][0]["description"].as_str().unwrap();
    assert!(described.ends_with("; Secure Boot on"), "{described}");
    let (_, oses) = rig.get("/operating-systems", &token).await;
    assert_eq!(oses["operating_systems"][0]["slug"], "debian_12");
    // No machine of the big plan, none that can boot with Secure Boot:
    // no capacity, nothing made.
    for plan in ["m3.large.x86", "c3.small.sb"] {
        let (s, none) = rig
            .create(
                p,
                &token,
                json!({"metro": "sv", "plan": plan, "operating_system": "debian_12"}),
            )
            .await;
        assert_eq!(s, 422, "{plan}: {none}");
    }
    // Bad input names what is wrong.
    for (body, named) in [
        (
            json!({"metro": "sv", "operating_system": "debian_12"}),
            "plan",
        ),
        (
            json!({"metro": "sv", "plan": "c3.small.x86", "operating_system": "windows"}),
            "operating_system",
        ),
        (
            json!({"metro": "ny", "plan": "c3.small.x86", "operating_system": "debian_12"}),
            "metro",
        ),
        (
            json!({"metro": "sv", "plan": "c3.small.x86", "operating_system": "debian_12", "hostname": "no spaces"}),
            "hostname",
        ),
        (
            json!({"metro": "sv", "plan": "c3.small.x86", "operating_system": "debian_12", "ssh_keys": [{"key": "ssh-rsa nonsense"}]}),
            "ssh_keys[0].key",
        ),
    ] {
        let (s, e) = rig.create(p, &token, body).await;
        assert_eq!(s, 422, "{e}");
        assert!(
            e["errors"][0].as_str().unwrap().contains(named),
            "{named}: {e}"
        );
    }
    assert_eq!(
        shepherd_sim::testing::count(&rig.bmdb, "SELECT count(*) FROM device").await,
        0
    );

    // Created with userdata and a key: queued or provisioning, then active.
    let secret = "userdata-secret-5d1c";
    let (s, dev) = rig
        .create(
            p,
            &token,
            json!({
                "metro": "sv", "plan": "c3.small.x86", "operating_system": "debian_12",
                "hostname": "web-1", "userdata": format!("#cloud-config\n# {secret}\n"),
                "ssh_keys": [{"label": "me", "key": KEY}], "tags": ["web"],
            }),
        )
        .await;
    assert_eq!(s, 201, "{dev}");
    assert!(
        ["queued", "provisioning"].contains(&dev["state"].as_str().unwrap()),
        "{dev}"
    );
    let id = dev["id"].as_str().unwrap().to_string();
    let d = rig.wait_device(&id, &token, &["active", "failed"]).await;
    assert_eq!(d["state"], "active", "{d}");
    assert_eq!(d["ip_addresses"][0]["address"], ip, "{d}");
    assert_eq!(d["plan"]["slug"], "c3.small.x86");
    let disk = rig.disk(&ip);
    assert!(
        holds_image(&rig, &disk),
        "the image is not on the machine's disk"
    );
    let meta = seed_meta(&disk);
    assert!(meta.contains("web-1") && meta.contains(KEY), "{meta}");
    assert!(
        meta.contains(&format!("{machine}-g")),
        "instance-id: {meta}"
    );
    // Updated: its host name and tags.
    let (s, u) = rig
        .call(
            "PUT",
            &format!("/devices/{id}"),
            Some(&token),
            Some(json!({"hostname": "web-2", "tags": ["a", "b"]})),
        )
        .await;
    assert_eq!(
        (s, u["hostname"].clone(), u["tags"].clone()),
        (200, json!("web-2"), json!(["a", "b"])),
        "{u}"
    );

    // Rebooted through its BMC, and active again.
    act(&rig, &id, &token, "reboot").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while shepherd_sim::testing::count(&rig.bmdb, "SELECT count(*) FROM machine_reboot_request")
        .await
        > 0
    {
        assert!(
            Instant::now() < deadline,
            "reboot not done: {}",
            rig.shepherd.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    rig.wait_device(&id, &token, &["active"]).await;
    // Powered off: inactive, and off at its BMC; powered on: active.
    act(&rig, &id, &token, "power_off").await;
    let d = rig.wait_device(&id, &token, &["inactive"]).await;
    assert_eq!(bmc_power(&rig, "node-0001").await, "Off", "{d}");
    act(&rig, &id, &token, "power_on").await;
    rig.wait_device(&id, &token, &["active"]).await;
    assert_eq!(bmc_power(&rig, "node-0001").await, "On");

    // Reinstalled: the machine is taken over again and installed anew.
    act(&rig, &id, &token, "reinstall").await;
    let d = rig
        .wait_device(&id, &token, &["reinstalling", "active"])
        .await;
    assert_eq!(d["state"], "reinstalling", "{d}");
    let d = rig.wait_device(&id, &token, &["active", "failed"]).await;
    assert_eq!(d["state"], "active", "{d}");
    let generation: i32 = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one("SELECT generation FROM machine_installation", &[])
                .await?
                .get(0))
        })
        .await
        .unwrap();
    // 1: the operator's erasure before tenants, 2: the device, 3: again.
    assert_eq!(generation, 3);

    // The events tell the story.
    let ev = rig
        .get_all(&format!("/devices/{id}/events"), "events", &token)
        .await;
    let kinds: Vec<&str> = ev.iter().filter_map(|e| e["type"].as_str()).collect();
    for k in [
        "instance.created",
        "instance.active",
        "instance.power_off",
        "instance.reinstall",
    ] {
        assert!(kinds.contains(&k), "{k} not in {kinds:?}");
    }

    // Deleted: 204, deprovisioning, then gone; the machine erased and
    // available again.
    let (s, _) = rig
        .call("DELETE", &format!("/devices/{id}"), Some(&token), None)
        .await;
    assert_eq!(s, 204);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let (s, d) = rig.get(&format!("/devices/{id}"), &token).await;
        if s == 404 {
            break;
        }
        assert_eq!(d["state"], "deprovisioning", "{d}");
        assert!(
            Instant::now() < deadline,
            "not deleted: {}",
            rig.shepherd.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    rig.wait_available(1).await;
    assert!(
        !holds_image(&rig, &disk),
        "the last tenant's image is still on the disk"
    );
    let (_, list) = rig.get(&format!("/projects/{p}/devices"), &token).await;
    assert_eq!(list["meta"]["total"], 0, "{list}");
    // The next tenant gets the machine; an operator reclaims it by
    // deprovisioning the machine: the device ends once it is erased.
    let (s, again) = rig.create(p, &token, super::device_body("next")).await;
    assert_eq!(s, 201, "{again}");
    let next = again["id"].as_str().unwrap().to_string();
    rig.wait_device(&next, &token, &["active"]).await;
    let url = format!("{}/api/v1/machines/{machine}/deprovision", rig.base);
    let mut r = rig
        .client
        .post(&url)
        .send_json(&json!({"mode": "discard", "reason": "reclaimed"}))
        .await
        .unwrap();
    assert!(r.status().is_success(), "{:?}", r.body().await);
    let deadline = Instant::now() + Duration::from_secs(120);
    while rig.get(&format!("/devices/{next}"), &token).await.0 != 404 {
        assert!(
            Instant::now() < deadline,
            "not ended: {}",
            rig.shepherd.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    rig.wait_available(1).await;
    let (_, ev) = rig.get(&format!("/projects/{p}/events"), &token).await;
    assert!(ev.to_string().contains("instance.deprovisioned"), "{ev}");
    assert!(
        !std::fs::read_to_string(rig.dir.path().join("shepherd.log"))
            .unwrap()
            .contains(secret)
    );
}
