//! A machine's firmware through its BMC, against sushy-tools' libvirt
//! driver in front of a libvirt domain (defined, never started): the
//! BIOS version the domain holds read as `bios`, the emulator's manager's
//! firmware as `bmc`, the BIOS settings the domain keeps; a `SimpleUpdate`
//! through the BMC (shepherd's own, as the Servicer sends it, through the
//! provider's `redfish_bmc`) raises the domain's BIOS version, a BIOS
//! setting is changed through its settings object (`SetBios`), and
//! the next read records both, the old version in its history; a
//! baseline wanting the setting sees the machine drift until it is made.
//!
//! Needs root and libvirtd (scripts/test starts it); skipped, saying so,
//! without them.

use std::process::Command;

use shepherd::baselines::{Baselines, Conformance};
use shepherd::bmdb::Provider;
use shepherd::bmdb::firmware;
use shepherd::bmdb::machines::{self, NewProvidedMachine};
use shepherd::config::BaselineConfig;
use shepherd::provider::Provider as _;
use shepherd::provider::inventory::Inventory;
use shepherd::redfish::servicing::{GetTask, SetBios, StartUpdate, Started, UpdateImage};
use shepherd_sim::testing::{Sushy, TestDb, inventory_host, inventory_of, succeed};

const PASSWORD: &str = "bmc-fw-3a91d0";

fn usable() -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: the firmware tests need root (libvirt)");
        return false;
    }
    let ok = Command::new("virsh")
        .args(["-q", "list"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("SKIPPED: the firmware tests need libvirtd (scripts/test starts it)");
    }
    ok
}

/// A libvirt domain, defined and never started; undefined on drop.
struct Domain {
    name: String,
    _dir: tempfile::TempDir,
}

impl Domain {
    fn define(uuid: &str) -> Domain {
        let dir = tempfile::tempdir().unwrap();
        let name = format!("shepherd-fw-{}", &uuid[..8]);
        let xml = format!(
            "<domain type='qemu'><name>{name}</name><uuid>{uuid}</uuid><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
             <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os><devices/></domain>"
        );
        let path = dir.path().join("domain.xml");
        std::fs::write(&path, xml).unwrap();
        succeed(Command::new("virsh").args(["-q", "define"]).arg(&path));
        Domain { name, _dir: dir }
    }

    fn xml(&self) -> String {
        let out = succeed(Command::new("virsh").args(["-q", "dumpxml", &self.name]));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        let _ = Command::new("virsh")
            .args(["-q", "undefine", &self.name])
            .output();
    }
}

/// What `inv` reads of node-1's firmware.
async fn read(inv: &Inventory) -> firmware::Reading {
    let mut reads = inv.bmc_firmware(&["node-1".to_string()]).await.unwrap();
    assert_eq!(reads.len(), 1);
    reads.remove(0).firmware.unwrap()
}

fn versions(c: &[firmware::Component]) -> Vec<(&str, &str)> {
    c.iter()
        .map(|c| (c.component.as_str(), c.version.as_str()))
        .collect()
}

#[actix_rt::test]
async fn a_bios_update_through_the_bmc_is_read_and_recorded_as_a_new_version() {
    if !usable() {
        return;
    }
    // A UUID of its own: a domain left by a killed run cannot collide.
    let uuid = uuid::Uuid::new_v4().to_string();
    let domain = Domain::define(&uuid);
    let sushy = Sushy::start_libvirt(&[&domain.name], "admin", PASSWORD);
    let mut bmc = sushy.bmc(0);
    bmc.system = Some(uuid.clone());
    let inv = inventory_of(vec![inventory_host("node-1", Some(bmc))]);
    let system = sushy.get(&format!("/redfish/v1/Systems/{uuid}")).await;
    let manager = sushy
        .get(
            system["Links"]["ManagedBy"][0]["@odata.id"]
                .as_str()
                .unwrap(),
        )
        .await;
    let before = read(&inv).await;
    let bios = system["BiosVersion"].as_str().unwrap().to_string();
    let bmc = manager["FirmwareVersion"].as_str().unwrap().to_string();
    assert_eq!(
        versions(&before.components),
        [("bios", bios.as_str()), ("bmc", bmc.as_str())]
    );
    // The BIOS settings, as the emulator keeps them in the domain.
    let settings = sushy
        .get(system["Bios"]["@odata.id"].as_str().unwrap())
        .await;
    let got = before.bios.clone().expect("the BIOS settings");
    assert_eq!(
        serde_json::Value::Object(got.attributes.clone()),
        settings["Attributes"]
    );
    assert_eq!(
        got.registry.as_deref(),
        settings["AttributeRegistry"].as_str()
    );

    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let new = NewProvidedMachine {
        provider: Provider::None,
        provider_id: "node-1".into(),
        reservation_id: None,
        ip_address: Some("127.0.0.1".into()),
        location: None,
        status: None,
    };
    let machine = bmdb
        .transact(async |tx| machines::create_provided(tx, &new).await)
        .await
        .unwrap();
    let record = |read: firmware::Reading| {
        let bmdb = bmdb.clone();
        async move {
            let read = Ok(read);
            bmdb.transact(async |tx| firmware::record(tx, machine, &read).await)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        record(before).await.len(),
        2,
        "both seen for the first time"
    );

    // The update, as the Servicer asks for it: this BMC takes no pushed
    // image, so `SimpleUpdate` with the image's address and the user name
    // and password of a grant.
    let rb = inv
        .redfish_bmc("node-1")
        .await
        .unwrap()
        .expect("node-1's Redfish BMC");
    let image = tempfile::NamedTempFile::new().unwrap();
    let update = |component: &str| StartUpdate {
        image: UpdateImage {
            path: image.path().to_path_buf(),
            name: "bios-1.1.bin".into(),
            fetch: Some((
                "http://127.0.0.1:9/bios-1.1.bin".into(),
                "grant-id".into(),
                shepherd::secret::Secret::inline("grant-secret"),
            )),
        },
        system: Some(uuid.clone()),
        component: component.into(),
    };
    // A target the emulator refuses: its words, naming the target.
    let refused = rb.ask(update("bmc")).await.unwrap_err().to_string();
    assert!(
        refused.contains("UpdateService.SimpleUpdate of /redfish/v1/Managers/")
            && refused.contains("Manager is not currently a supported Target"),
        "{refused}"
    );
    let started = rb.ask(update("bios")).await.unwrap();
    match started {
        Started::Done { pushed } => assert!(!pushed, "fetched, not pushed"),
        Started::Task { monitor, pushed } => {
            assert!(!pushed, "fetched, not pushed");
            let mut t = rb
                .ask(GetTask {
                    monitor: monitor.clone(),
                })
                .await
                .unwrap();
            while t.running() {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                t = rb
                    .ask(GetTask {
                        monitor: monitor.clone(),
                    })
                    .await
                    .unwrap();
            }
            assert!(t.succeeded(), "{t:?}");
        }
    }
    // A BIOS setting changed through the BMC (the settings object, as a
    // vendor's tool PATCHes it; the emulator applies it at once).
    let turbo = match got.attributes.get("ProcTurboMode").and_then(|v| v.as_str()) {
        Some("Enabled") => "Disabled",
        _ => "Enabled",
    };
    // A baseline for the emulator's machines wants that setting: until it
    // is changed, the machine drifts on it, and on nothing else.
    let manufacturer = system["Manufacturer"].as_str().unwrap().to_string();
    let facts = shepherd::bmdb::hardware::BmcFacts {
        bmc_url: sushy.url.clone(),
        system: shepherd::bmdb::hardware::SystemFacts {
            manufacturer: Some(manufacturer.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    bmdb.transact(async |tx| machines::write_bmc_facts(tx, &[(machine, facts.clone())]).await)
        .await
        .unwrap();
    let baselines = Baselines::new(
        &[BaselineConfig {
            name: "emulated".into(),
            manufacturer: Some(manufacturer),
            bios: [("ProcTurboMode".to_string(), serde_json::json!(turbo))]
                .into_iter()
                .collect(),
            ..BaselineConfig::default()
        }],
        &[],
    );
    let standing = || async {
        let below = bmdb
            .snapshot(async |tx| firmware::below(tx, Some(&[machine]), true).await)
            .await
            .unwrap();
        baselines.conformance(&below[0])
    };
    let drift = standing().await;
    assert_eq!(drift.as_str(), "drifting", "{drift:?}");
    assert_eq!(
        drift
            .differences()
            .iter()
            .map(|d| (d.item.as_str(), d.desired.as_str()))
            .collect::<Vec<_>>(),
        [("ProcTurboMode", turbo)]
    );
    // As the Servicer changes it: PATCHed to the settings object.
    rb.ask(SetBios {
        system: rb.system(),
        attributes: [("ProcTurboMode".to_string(), serde_json::json!(turbo))]
            .into_iter()
            .collect(),
    })
    .await
    .unwrap();
    let after = read(&inv).await;
    assert_eq!(
        after.bios.as_ref().unwrap().attributes["ProcTurboMode"],
        turbo,
        "the changed setting read back"
    );
    let new_bios = after.components[0].version.clone();
    assert_ne!(new_bios, bios, "the BIOS version did not change");
    assert!(
        domain.xml().contains(&format!("value=\"{new_bios}\"")),
        "the domain holds the new BIOS version: {}",
        domain.xml()
    );
    let seen = record(after).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        (
            seen[0].component.as_str(),
            seen[0].previous.as_deref(),
            seen[0].version.as_str()
        ),
        ("bios", Some(bios.as_str()), new_bios.as_str())
    );
    let f = bmdb
        .transact(async |tx| firmware::of_machine(tx, machine).await)
        .await
        .unwrap();
    assert_eq!(
        standing().await,
        Conformance::Conforming {
            baseline: "emulated".into()
        },
        "the setting changed, the drift is gone"
    );
    assert_eq!(f.history.len(), 3, "{:?}", f.history);
    assert_eq!(f.components[0].component.version, new_bios);
    assert_eq!(f.bios.unwrap().0.attributes["ProcTurboMode"], turbo);
}

/// The Servicer, as an operator asks for it (`shepherd machines service
/// ID`), brings a libvirt domain behind sushy-tools to a baseline wanting
/// a newer BIOS (an image in `images_dir`) and one BIOS setting: the
/// update names its target (sushy-tools refuses one that names none),
/// one restart, `conforming`, and the domain holds the new version and
/// the setting afterwards.
#[actix_rt::test]
async fn the_servicer_brings_a_domain_behind_sushy_tools_to_its_baseline() {
    if !usable() {
        return;
    }
    let uuid = uuid::Uuid::new_v4().to_string();
    let domain = Domain::define(&uuid);
    let sushy = Sushy::start_libvirt(&[&domain.name], "admin", PASSWORD);
    let system = sushy.get(&format!("/redfish/v1/Systems/{uuid}")).await;
    let before = system["BiosVersion"].as_str().unwrap().to_string();
    // sushy-tools raises the minor version with every update.
    let mut parts: Vec<String> = before.split('.').map(String::from).collect();
    parts[1] = (parts[1].parse::<u32>().unwrap() + 1).to_string();
    let wanted = parts.join(".");
    let settings = sushy
        .get(system["Bios"]["@odata.id"].as_str().unwrap())
        .await;
    let turbo = match settings["Attributes"]["ProcTurboMode"].as_str() {
        Some("Enabled") => "Disabled",
        _ => "Enabled",
    };
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    std::fs::create_dir(&images).unwrap();
    std::fs::write(images.join("bios.bin"), b"a BIOS image").unwrap();
    let config = format!(
        r#"
[bmdb]
url = "{url}"
session_interval = "2s"

[ssh]
key_file = "{dir}/id_ed25519"

[bmaas]
listen = "127.0.0.1:0"

[installations]
images_dir = "{images}"
images_listen = "127.0.0.1:{images_port}"

[recoverer]
enabled = false

[updater]
interval = "500ms"
firmware_interval = "1s"

[servicing]
poll_interval = "200ms"
poll = "200ms"
verify_timeout = "30s"

[provider]
kind = "static"

[[provider.inventory.machines]]
id = "node-1"
address = "127.0.64.1"
bmc = {{ url = "{bmc}", username = "admin", password = "{PASSWORD}", system = "{uuid}" }}

[[baselines]]
name = "libvirt"
manufacturer = "{manufacturer}"
components = [{{ component = "bios", version = "{wanted}", image = "bios.bin" }}]
bios = {{ ProcTurboMode = "{turbo}" }}
"#,
        url = db.url(),
        dir = dir.path().display(),
        images = images.display(),
        images_port = shepherd_sim::testing::Sshd::free_port(),
        bmc = sushy.url,
        manufacturer = system["Manufacturer"].as_str().unwrap(),
    );
    let path = dir.path().join("shepherd.toml");
    std::fs::write(&path, config).unwrap();
    let cfg = shepherd::Config::load_with_env(Some(&path), Vec::new()).unwrap();
    let _running = shepherd::supervisor::start_with(cfg, Vec::new())
        .await
        .unwrap();
    let one = async |q: &'static str| -> Option<String> {
        bmdb.transact(async |tx| Ok(tx.query_opt(q, &[]).await?.map(|r| r.get(0))))
            .await
            .unwrap()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let machine = loop {
        let read = one("SELECT r.machine_id::text FROM machine_firmware_read r \
               JOIN machine_provided p USING (machine_id) WHERE p.provider_id = 'node-1'")
        .await;
        if let Some(id) = read {
            break id;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node-1's firmware read"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    // Taken over (its agent's row, as a takeover writes it): the
    // servicing needs only its BMC.
    let id: uuid::Uuid = machine.parse().unwrap();
    bmdb.transact(async |tx| {
        tx.execute(
            "INSERT INTO machine_agent_started VALUES ($1, now(), '\\x0101')",
            &[&id],
        )
        .await
    })
    .await
    .unwrap();

    // As the operator asks: the command line.
    let asked = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("--config")
        .arg(&path)
        .args(["machines", "service", &machine, "--reason", "newer BIOS"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = asked + std::time::Duration::from_secs(120);
    let (phase, applied, error, restarts) = loop {
        let row = bmdb
            .transact(async |tx| {
                Ok(tx
                    .query_opt(
                        "SELECT phase, applied, error, restarts FROM machine_service \
                          WHERE machine_id = $1 AND phase IN ('done', 'failed')",
                        &[&id],
                    )
                    .await?
                    .map(|r| {
                        (
                            r.get::<_, String>(0),
                            r.get::<_, Option<String>>(1),
                            r.get::<_, Option<String>>(2),
                            r.get::<_, i32>(3),
                        )
                    }))
            })
            .await
            .unwrap();
        if let Some(r) = row {
            break r;
        }
        assert!(std::time::Instant::now() < deadline, "the servicing ended");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let took = asked.elapsed();
    assert_eq!(phase, "done", "{error:?} {applied:?}");
    let applied = applied.unwrap_or_default();
    assert!(
        applied.contains(&format!("firmware bios {before} → {wanted}")),
        "{applied}"
    );
    assert!(applied.contains("BIOS ProcTurboMode"), "{applied}");
    assert!(
        applied.contains("after the restart its BMC shows baseline libvirt"),
        "conforming after the restart: {applied}"
    );
    assert_eq!(restarts, 1, "{applied}");
    let xml = domain.xml();
    assert!(
        xml.contains(&format!("value=\"{wanted}\"")),
        "the domain holds the new BIOS version: {xml}"
    );
    let after = sushy
        .get(system["Bios"]["@odata.id"].as_str().unwrap())
        .await;
    assert_eq!(after["Attributes"]["ProcTurboMode"], turbo, "{after}");
    assert!(xml.contains(turbo), "the domain holds the setting: {xml}");
    println!(
        "serviced through sushy-tools: {:.1} s from the ask to conforming, {restarts} restart, \
         the domain's BIOS {before} before and {wanted} after; {applied}",
        took.as_secs_f64()
    );
}
