//! Owned hardware's BMCs, against OpenStack's Redfish emulator (sushy-tools,
//! its fake driver) run as a process: reboots seen in the emulator's power
//! state, facts as the emulator shows them, and the failures an operator
//! meets (a wrong password, a BMC that is down, an ambiguous BMC), each
//! naming the host and the BMC and never the password.

use std::time::{Duration, Instant};

use shepherd::bmdb::ProviderStatus;
use shepherd::config::{BmcConfig, RedfishConfig};
use shepherd::provider::Provider;
use shepherd::redfish::{self, Bmcs};
use shepherd_sim::testing::{Sshd, Sushy, inventory_host as host, inventory_of as inventory};

const PASSWORD: &str = "bmc-pw-7c41e2";

#[actix_rt::test]
async fn a_reboot_through_the_bmc_is_seen_going_off_and_on_in_the_emulator() {
    let sushy = Sushy::start(&["node-1", "node-2"], "admin", PASSWORD);
    let inv = inventory(vec![
        host("node-1", Some(sushy.bmc(0))),
        host("node-2", Some(sushy.bmc(1))),
    ]);
    let status = |m: Option<shepherd::provider::ProviderMachine>| m.unwrap().status;
    assert_eq!(
        status(inv.get_machine("node-1").await.unwrap()),
        ProviderStatus::Running
    );
    inv.reboot("node-1").await.unwrap();
    // The emulator's fake driver turns the system off at once and on again
    // 1 to 11 seconds later.
    assert_eq!(sushy.system(0).await["PowerState"], "Off");
    assert_eq!(
        status(inv.get_machine("node-1").await.unwrap()),
        ProviderStatus::Stopped
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while sushy.system(0).await["PowerState"] != "On" {
        assert!(Instant::now() < deadline, "node-1 never came back on");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        status(inv.get_machine("node-1").await.unwrap()),
        ProviderStatus::Running
    );
    // Exactly that system was reset.
    assert_eq!(sushy.system(1).await["PowerState"], "On");
    let log = sushy.log();
    let resets: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ComputerSystem.Reset"))
        .collect();
    assert_eq!(resets.len(), 1, "{log}");
    assert!(resets[0].contains(&Sushy::uuid(0)), "{log}");
}

#[actix_rt::test]
async fn the_facts_read_are_the_emulators() {
    let sushy = Sushy::start(&["node-1"], "admin", PASSWORD);
    let bmcs = Bmcs::new(&RedfishConfig::default());
    let mut bmc = sushy.bmc(0);
    // Its only system, found without being named.
    bmc.system = None;
    let got = redfish::system(&bmcs, "node-1", &bmc).await.unwrap();
    let want = sushy.system(0).await;
    assert_eq!(got.id, want["Id"]);
    assert_eq!(got.path, want["@odata.id"]);
    assert_eq!(got.power(), want["PowerState"]);
    assert_eq!(
        got.facts.manufacturer.as_deref(),
        want["Manufacturer"].as_str()
    );
    assert_eq!(
        got.facts.health.as_deref(),
        want["Status"]["Health"].as_str()
    );
    assert_eq!(
        got.reset_types,
        want["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    );
}

#[actix_rt::test]
async fn a_wrong_password_names_the_host_the_bmc_and_its_401_and_never_the_password() {
    let sushy = Sushy::start(&["node-1"], "admin", PASSWORD);
    let mut bmc = sushy.bmc(0);
    bmc.password = shepherd::secret::Secret::inline("not-the-password-93f1");
    let inv = inventory(vec![host("node-1", Some(bmc))]);
    let e = inv.reboot("node-1").await.unwrap_err().to_string();
    assert!(e.contains("host node-1"), "{e}");
    assert!(e.contains(&format!("BMC {}", sushy.url)), "{e}");
    assert!(e.contains("401"), "{e}");
    assert!(
        e.contains("Incorrect username or password"),
        "Redfish's own message: {e}"
    );
    assert!(
        !e.contains("not-the-password-93f1") && !e.contains(PASSWORD),
        "{e}"
    );
    // Nothing was reset.
    assert_eq!(sushy.system(0).await["PowerState"], "On");
    assert!(
        !sushy
            .log()
            .contains("ComputerSystem.Reset\" HTTP/1.1\" 204")
    );
}

/// A BMC at `url` with the tests' credentials, its only system.
fn bmc_at(url: &str) -> BmcConfig {
    BmcConfig {
        url: url.to_string(),
        username: "admin".into(),
        password: shepherd::secret::Secret::inline(PASSWORD),
        system: None,
        tls: Default::default(),
        secure_boot: None,
        console: None,
    }
}

#[actix_rt::test]
async fn a_bmc_that_is_down_is_named_unreachable() {
    let url = format!("http://127.0.0.1:{}", Sshd::free_port());
    let bmc = bmc_at(&url);
    let inv = inventory(vec![host("node-9", Some(bmc))]);
    let started = Instant::now();
    let e = inv.reboot("node-9").await.unwrap_err().to_string();
    assert!(
        e.contains("host node-9") && e.contains(&url) && e.contains("unreachable"),
        "{e}"
    );
    assert!(started.elapsed() < Duration::from_secs(15), "bounded");
    let e = inv.get_machine("node-9").await.unwrap_err().to_string();
    assert!(e.contains("unreachable"), "{e}");
}

#[actix_rt::test]
async fn a_bmc_with_several_systems_wants_one_named() {
    let sushy = Sushy::start(&["node-1", "node-2"], "admin", PASSWORD);
    let mut bmc = sushy.bmc(0);
    bmc.system = None;
    let inv = inventory(vec![host("node-1", Some(bmc.clone()))]);
    let e = inv.reboot("node-1").await.unwrap_err().to_string();
    assert!(
        e.contains("host node-1") && e.contains("2 systems") && e.contains("bmc.system"),
        "{e}"
    );
    bmc.system = Some("no-such-system".into());
    let inv = inventory(vec![host("node-1", Some(bmc))]);
    let e = inv.reboot("node-1").await.unwrap_err().to_string();
    assert!(e.contains("no system \"no-such-system\""), "{e}");
    // Named by its @odata.id works as well as by its Id.
    let mut bmc = sushy.bmc(1);
    bmc.system = Some(format!("/redfish/v1/Systems/{}", Sushy::uuid(1)));
    let bmcs = Bmcs::new(&RedfishConfig::default());
    let s = redfish::system(&bmcs, "node-2", &bmc).await.unwrap();
    assert_eq!(s.id, Sushy::uuid(1));
}

#[actix_rt::test]
async fn a_host_without_a_bmc_cannot_be_rebooted_and_says_so() {
    let inv = inventory(vec![host("plain", None)]);
    let e = inv.reboot("plain").await.unwrap_err().to_string();
    assert!(e.contains("host plain has no BMC"), "{e}");
}

/// The emulator's static storage for system 0: one controller, two drives
/// and an empty volume list (its fake driver shows no volumes: they need
/// its libvirt driver). System 1 has the same storage without a volume
/// list: the emulator answers its volumes with a 500.
fn storage_conf() -> String {
    let (uuid, other) = (Sushy::uuid(0), Sushy::uuid(1));
    format!(
        "STORAGE = [{{'Id': '1', 'Name': 'Local Storage Controller', \
         'StorageControllers': [{{'MemberId': '0', 'Name': 'Contoso Integrated RAID', 'SpeedGbps': 12}}], \
         'Drives': ['32ADF365C6C1B7BD', '58CFF987G8J2V9KL']}}]\n\
         SUSHY_EMULATOR_STORAGE = {{'{uuid}': STORAGE, '{other}': STORAGE}}\n\
         SUSHY_EMULATOR_VOLUMES = {{('{uuid}', '1'): []}}\n\
         DRIVES = [\
         {{'Id': '32ADF365C6C1B7BD', 'Name': 'Drive Sample', 'CapacityBytes': 899527000000, 'Protocol': 'SAS'}}, \
         {{'Id': '58CFF987G8J2V9KL', 'Name': 'Drive2', 'CapacityBytes': 12345670000, 'Protocol': 'SATA'}}]\n\
         SUSHY_EMULATOR_DRIVES = {{('{uuid}', '1'): DRIVES, ('{other}', '1'): DRIVES}}\n"
    )
}

#[actix_rt::test]
async fn the_storage_read_is_the_emulators_and_a_part_it_fails_is_left_out_and_named() {
    let sushy = Sushy::start_with(&["node-1", "node-2"], "admin", PASSWORD, &storage_conf());
    let bmcs = Bmcs::new(&RedfishConfig::default());
    let got = redfish::firmware(&bmcs, "node-1", &sushy.bmc(0))
        .await
        .unwrap();
    let s = got.storage.expect("the system's storage");
    assert_eq!(s.len(), 1, "{s:?}");
    let want = sushy
        .get(&format!("/redfish/v1/Systems/{}/Storage/1", Sushy::uuid(0)))
        .await;
    assert_eq!(s[0].id, "1");
    assert_eq!(s[0].name.as_deref(), want["Name"].as_str());
    assert!(s[0].volumes_offered, "it links a Volumes collection");
    let drives: Vec<(&str, Option<i64>, Option<&str>)> = s[0]
        .drives
        .iter()
        .map(|d| (d.id.as_str(), d.capacity_bytes, d.protocol.as_deref()))
        .collect();
    assert_eq!(
        drives,
        [
            ("32ADF365C6C1B7BD", Some(899_527_000_000), Some("SAS")),
            ("58CFF987G8J2V9KL", Some(12_345_670_000), Some("SATA"))
        ]
    );
    let drive = sushy
        .get(want["Drives"][0]["@odata.id"].as_str().unwrap())
        .await;
    assert_eq!(
        s[0].drives[0].media_type.as_deref(),
        drive["MediaType"].as_str()
    );
    assert_eq!(
        s[0].drives[0].serial_number.as_deref(),
        drive["SerialNumber"].as_str()
    );
    assert!(got.partial.is_empty(), "{:?}", got.partial);
    assert!(s[0].volumes.is_empty());
    // node-2: its volume list answers 500. The storage is left out and
    // named, the rest read.
    let other = redfish::firmware(&bmcs, "node-2", &sushy.bmc(1))
        .await
        .unwrap();
    assert_eq!(other.storage, None);
    assert_eq!(other.partial.len(), 1, "{:?}", other.partial);
    assert!(
        other.partial[0].starts_with("the storage: HTTP 500 for /redfish/v1/Systems/")
            && other.partial[0].contains("/Volumes"),
        "{:?}",
        other.partial
    );
    assert_eq!(
        other
            .components
            .iter()
            .map(|c| c.component.as_str())
            .collect::<Vec<_>>(),
        got.components
            .iter()
            .map(|c| c.component.as_str())
            .collect::<Vec<_>>()
    );
}

/// A BMC whose web server closes every connection soon after its first
/// answer (a short idle timeout, as many BMCs have): each connection
/// answers one request, then waits 50 ms and closes, counting a request
/// that came meanwhile on the kept connection and got no answer.
fn impatient_bmc() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let unanswered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = unanswered.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut s = stream;
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let path = String::from_utf8_lossy(&req)
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or("")
                    .to_string();
                let body = match path.trim_end_matches('/') {
                    "/redfish/v1" => serde_json::json!({"Systems": {"@odata.id": "/redfish/v1/Systems"}}),
                    "/redfish/v1/Systems" => serde_json::json!({"Members": [{"@odata.id": "/redfish/v1/Systems/1"}]}),
                    "/redfish/v1/Systems/1" => serde_json::json!({"@odata.id": "/redfish/v1/Systems/1",
                        "Id": "1", "PowerState": "On", "Manufacturer": "Impatient", "Status": {"Health": "OK"}}),
                    _ => serde_json::json!({"error": {"message": "no such resource"}}),
                }
                .to_string();
                let status = if body.contains("no such resource") {
                    "404 Not Found"
                } else {
                    "200 OK"
                };
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                std::thread::sleep(Duration::from_millis(50));
                s.set_nonblocking(true).unwrap();
                if matches!(s.read(&mut buf), Ok(n) if n > 0) {
                    seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
    });
    (url, unanswered)
}

#[actix_rt::test]
async fn a_kept_connection_the_bmc_closed_meanwhile_is_asked_again_on_a_new_one() {
    let (url, unanswered) = impatient_bmc();
    let bmc = bmc_at(&url);
    let bmcs = Bmcs::new(&RedfishConfig::default());
    for _ in 0..3 {
        let got = redfish::system(&bmcs, "node-1", &bmc).await.unwrap();
        assert_eq!(got.power(), "On");
        // Longer than the BMC keeps a connection, shorter than shepherd.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        unanswered.load(std::sync::atomic::Ordering::SeqCst) > 0,
        "no request met a connection the BMC had closed: the case was not tried"
    );
}
