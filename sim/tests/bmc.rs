//! The simulated BMC below its system, driven as a Redfish client drives
//! a real one: an update asked with `SimpleUpdate` (the BMC fetches the
//! image, with the credentials given) or pushed as multipart, followed
//! through its task to its end, busy (503) while it runs, failing on cue,
//! its version running only after a reset; BIOS settings pending until a
//! reset, a wrong attribute named; volumes made and deleted at once or at
//! the next reset. shepherd's own Redfish reader reads all of it.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Value, json};
use shepherd_sim::bmc::{BmcSim, FirmwareOptions, firmware_image};
use shepherd_sim::testing::{inventory_host, inventory_of, sim_bmc, sim_bmcs};

const GOOD: &str = "127.0.61.1";
const FAILING: &str = "127.0.61.2";

struct Bmc {
    sim: BmcSim,
    client: awc::Client,
}

impl Bmc {
    fn start() -> Bmc {
        let failing: IpAddr = FAILING.parse().unwrap();
        let sim = sim_bmcs(
            &[GOOD, FAILING],
            FirmwareOptions {
                task_time: Duration::from_millis(1500),
                fails: Arc::new(move |ip| ip == failing),
                push: true,
            },
        );
        Bmc {
            sim,
            client: awc::Client::builder()
                .timeout(Duration::from_secs(30))
                .finish(),
        }
    }

    fn url(&self, machine: &str, path: &str) -> String {
        format!("{}{path}", self.sim.url(machine.parse().unwrap()))
    }

    async fn get(&self, machine: &str, path: &str) -> Value {
        let mut r = self
            .client
            .get(self.url(machine, path))
            .basic_auth(&self.sim.user, &self.sim.password)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "GET {path}: {}", r.status());
        r.json().limit(1 << 20).await.unwrap()
    }

    async fn send(
        &self,
        method: &str,
        machine: &str,
        path: &str,
        body: Value,
    ) -> (u16, Value, Option<String>) {
        let req = match method {
            "POST" => self.client.post(self.url(machine, path)),
            "PATCH" => self.client.patch(self.url(machine, path)),
            _ => self.client.delete(self.url(machine, path)),
        };
        let mut r = req
            .basic_auth(&self.sim.user, &self.sim.password)
            .send_json(&body)
            .await
            .unwrap();
        let location = r
            .headers()
            .get("Location")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let retry = r
            .headers()
            .get("Retry-After")
            .map(|v| v.to_str().unwrap().to_string());
        let body = r.body().await.unwrap();
        let v = serde_json::from_slice(&body).unwrap_or(Value::Null);
        (r.status().as_u16(), v, location.or(retry))
    }

    async fn reset(&self, machine: &str) {
        let (status, body, _) = self
            .send(
                "POST",
                machine,
                "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
                json!({"ResetType": "ForceRestart"}),
            )
            .await;
        assert_eq!(status, 204, "{body}");
    }

    async fn version(&self, machine: &str, component: &str) -> String {
        self.get(
            machine,
            &format!("/redfish/v1/UpdateService/FirmwareInventory/{component}"),
        )
        .await["Version"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Follows a task to its end, as a client polls it: the percents seen,
    /// and the task at its end.
    async fn follow(&self, machine: &str, task: &str) -> (Vec<u64>, Value) {
        let mut percents = Vec::new();
        for _ in 0..200 {
            let t = self.get(machine, task).await;
            percents.push(t["PercentComplete"].as_u64().unwrap());
            if t["TaskState"] != "Running" {
                return (percents, t);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the task at {task} never ended");
    }
}

/// Serves firmware images at /fw/{name}, only with the task's
/// credentials (as shepherd's image server serves them).
fn image_server() -> (String, actix_web::dev::ServerHandle) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = actix_web::HttpServer::new(|| {
        actix_web::App::new().route(
            "/fw/{name}",
            web::get().to(|req: HttpRequest, name: web::Path<String>| async move {
                use base64::Engine as _;
                let want = format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode("task-7:t0k3n")
                );
                if req
                    .headers()
                    .get("Authorization")
                    .and_then(|v| v.to_str().ok())
                    != Some(&want)
                {
                    return HttpResponse::Unauthorized().finish();
                }
                match name.as_str() {
                    "bios-2.0.0.bin" => HttpResponse::Ok().body(firmware_image("BIOS", "2.0.0")),
                    _ => HttpResponse::NotFound().finish(),
                }
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .listen(listener)
    .unwrap()
    .run();
    let handle = server.handle();
    actix_rt::spawn(server);
    (format!("http://{addr}"), handle)
}

#[actix_rt::test]
async fn an_update_runs_as_a_task_one_at_a_time_and_takes_effect_at_the_reset() {
    let bmc = Bmc::start();
    let (images, server) = image_server();
    let before = bmc.version(GOOD, "BIOS").await;
    let ask = json!({
        "ImageURI": format!("{images}/fw/bios-2.0.0.bin"),
        "TransferProtocol": "HTTP",
        "Username": "task-7",
        "Password": "t0k3n",
        "Targets": ["/redfish/v1/UpdateService/FirmwareInventory/BIOS"],
    });
    let simple = "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate";
    // An update must name its target, as sushy-tools requires.
    let mut untargeted = ask.clone();
    untargeted.as_object_mut().unwrap().remove("Targets");
    let (status, body, _) = bmc.send("POST", GOOD, simple, untargeted).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("Missing Targets"), "{body}");
    let (status, body, task) = bmc.send("POST", GOOD, simple, ask.clone()).await;
    assert_eq!(status, 202, "{body}");
    let task = task.expect("a task monitor in Location");
    // One update at a time: a second, while the first runs, is refused
    // with a time to ask again.
    let (status, body, retry) = bmc.send("POST", GOOD, simple, ask.clone()).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(retry.as_deref(), Some("1"));
    let (percents, end) = bmc.follow(GOOD, &task).await;
    assert_eq!(end["TaskState"], "Completed", "{end}");
    assert_eq!(end["PercentComplete"], 100);
    assert_eq!(
        end["Messages"][0]["MessageId"],
        "Update.1.0.AwaitToActivate"
    );
    assert!(
        percents.windows(2).all(|w| w[0] <= w[1]) && percents.iter().any(|p| *p > 0 && *p < 100),
        "percent reported as it runs: {percents:?}"
    );
    // Done, but not running until a reset.
    assert_eq!(bmc.version(GOOD, "BIOS").await, before);
    bmc.reset(GOOD).await;
    assert_eq!(bmc.version(GOOD, "BIOS").await, "2.0.0");
    let system = bmc.get(GOOD, "/redfish/v1/Systems/1").await;
    assert_eq!(system["BiosVersion"], "2.0.0");
    // A reset more changes nothing.
    bmc.reset(GOOD).await;
    assert_eq!(bmc.version(GOOD, "BIOS").await, "2.0.0");

    // Without the task's credentials, the BMC cannot fetch the image: its
    // task fails with its words.
    let (status, _, task) = bmc
        .send(
            "POST",
            GOOD,
            simple,
            json!({"ImageURI": format!("{images}/fw/bios-2.0.0.bin"), "Targets": ["/redfish/v1/Systems/1"]}),
        )
        .await;
    assert_eq!(status, 202);
    let (_, end) = bmc.follow(GOOD, &task.unwrap()).await;
    assert_eq!(end["TaskState"], "Exception", "{end}");
    assert!(
        end["Messages"][0]["Message"]
            .as_str()
            .unwrap()
            .contains("HTTP 401"),
        "{end}"
    );

    // The failing machine's update fails when its time is up, on cue:
    // the version it runs is unchanged after the reset.
    let failing_before = bmc.version(FAILING, "BIOS").await;
    let (status, _, task) = bmc.send("POST", FAILING, simple, ask).await;
    assert_eq!(status, 202);
    let (_, end) = bmc.follow(FAILING, &task.unwrap()).await;
    assert_eq!(end["TaskState"], "Exception", "{end}");
    assert_eq!(end["TaskStatus"], "Critical");
    assert!(
        end["Messages"][0]["Message"]
            .as_str()
            .unwrap()
            .contains("did not verify"),
        "{end}"
    );
    bmc.reset(FAILING).await;
    assert_eq!(bmc.version(FAILING, "BIOS").await, failing_before);
    server.stop(true).await;
}

#[actix_rt::test]
async fn an_image_pushed_as_multipart_updates_the_nic_at_the_reset() {
    let bmc = Bmc::start();
    let service = bmc.get(GOOD, "/redfish/v1/UpdateService").await;
    let push = service["MultipartHttpPushUri"].as_str().unwrap();
    let boundary = "shepherd-sim-boundary-0c7d";
    let mut body = Vec::new();
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"UpdateParameters\"\r\n\
             Content-Type: application/json\r\n\r\n{{\"Targets\": [\"/redfish/v1/UpdateService/FirmwareInventory/NIC.1\"], \
             \"@Redfish.OperationApplyTime\": \"OnReset\"}}\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"UpdateFile\"; filename=\"nic.bin\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(&firmware_image("NIC.1", "23.0.1"));
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let mut r = bmc
        .client
        .post(bmc.url(GOOD, push))
        .basic_auth(&bmc.sim.user, &bmc.sim.password)
        .insert_header((
            "Content-Type",
            format!("multipart/form-data; boundary={boundary}"),
        ))
        .send_body(body)
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "{:?}", r.body().await);
    let task = r
        .headers()
        .get("Location")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let (_, end) = bmc.follow(GOOD, &task).await;
    assert_eq!(end["TaskState"], "Completed", "{end}");
    assert_eq!(bmc.version(GOOD, "NIC.1").await, "22.31.6");
    bmc.reset(GOOD).await;
    assert_eq!(bmc.version(GOOD, "NIC.1").await, "23.0.1");
}

#[actix_rt::test]
async fn bios_settings_and_volumes_wait_for_the_reset_and_a_wrong_one_is_named() {
    let bmc = Bmc::start();
    let settings = "/redfish/v1/Systems/1/Bios/Settings";
    let bios = bmc.get(GOOD, "/redfish/v1/Systems/1/Bios").await;
    assert_eq!(
        bios["@Redfish.Settings"]["SettingsObject"]["@odata.id"],
        settings
    );
    assert_eq!(bios["Attributes"]["ProcVirtualization"], "Disabled");
    let (status, body, _) = bmc
        .send(
            "PATCH",
            GOOD,
            settings,
            json!({"Attributes": {"ProcVirtualization": "Enabled"},
                   "@Redfish.SettingsApplyTime": {"ApplyTime": "OnReset"}}),
        )
        .await;
    assert_eq!(status, 204, "{body}");
    // An unknown attribute, a value not in its list: refused, named.
    for (attribute, value) in [("HyperDrive", "Enabled"), ("BootMode", "Legacy")] {
        let (status, body, _) = bmc
            .send(
                "PATCH",
                GOOD,
                settings,
                json!({"Attributes": {attribute: value}}),
            )
            .await;
        assert_eq!(status, 400);
        let said = body["error"]["message"].as_str().unwrap();
        assert!(said.contains(attribute), "{body}");
    }
    assert_eq!(
        bmc.get(GOOD, settings).await["Attributes"],
        json!({"ProcVirtualization": "Enabled"}),
        "pending"
    );
    let current =
        || async { bmc.get(GOOD, "/redfish/v1/Systems/1/Bios").await["Attributes"].clone() };
    assert_eq!(
        current().await["ProcVirtualization"],
        "Disabled",
        "not before the reset"
    );

    // Volumes: one at the reset, one at once; a drive used twice refused.
    let volumes = "/redfish/v1/Systems/1/Storage/RAID.1/Volumes";
    let listed = bmc.get(GOOD, volumes).await;
    assert_eq!(
        listed["@Redfish.OperationApplyTimeSupport"]["SupportedValues"],
        json!(["Immediate", "OnReset"])
    );
    let drives = |ids: &[u32]| {
        ids.iter()
            .map(|i| json!({"@odata.id": format!("/redfish/v1/Systems/1/Storage/RAID.1/Drives/{i}")}))
            .collect::<Vec<_>>()
    };
    let (status, body, _) = bmc
        .send(
            "POST",
            GOOD,
            volumes,
            json!({"RAIDType": "RAID1", "Links": {"Drives": drives(&[0, 1])},
                   "@Redfish.OperationApplyTime": "OnReset"}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let (status, body, _) = bmc
        .send(
            "POST",
            GOOD,
            volumes,
            json!({"RAIDType": "RAID0", "Links": {"Drives": drives(&[1])}}),
        )
        .await;
    assert_eq!(status, 400, "drive 1 is pending in the RAID1: {body}");
    let (status, body, location) = bmc
        .send(
            "POST",
            GOOD,
            volumes,
            json!({"RAIDType": "RAID1", "Links": {"Drives": drives(&[2, 3])}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let immediate = location.unwrap();
    assert_eq!(bmc.get(GOOD, volumes).await["Members@odata.count"], 1);
    let (status, _, _) = bmc
        .send(
            "DELETE",
            GOOD,
            &immediate,
            json!({"@Redfish.OperationApplyTime": "OnReset"}),
        )
        .await;
    assert_eq!(status, 202);
    assert_eq!(
        bmc.get(GOOD, volumes).await["Members@odata.count"],
        1,
        "deleted at the reset"
    );

    // shepherd reads what is in effect: before the reset…
    let read = |bmc: &Bmc| {
        let inv = inventory_of(vec![inventory_host(
            "node-1",
            Some(sim_bmc(&bmc.sim, GOOD)),
        )]);
        async move {
            use shepherd::provider::Provider as _;
            inv.bmc_firmware(&["node-1".to_string()])
                .await
                .unwrap()
                .remove(0)
                .firmware
                .unwrap()
        }
    };
    let r = read(&bmc).await;
    assert!(r.partial.is_empty(), "{:?}", r.partial);
    let components: Vec<(&str, &str)> = r
        .components
        .iter()
        .map(|c| (c.component.as_str(), c.version.as_str()))
        .collect();
    assert!(components.contains(&("bmc", "5.10.0")), "{components:?}");
    assert!(
        components.contains(&("inventory:NIC.1", "22.31.6")),
        "{components:?}"
    );
    assert_eq!(
        r.bios.as_ref().unwrap().attributes["ProcVirtualization"],
        "Disabled"
    );
    let storage = &r.storage.as_ref().unwrap()[0];
    assert!(storage.volumes_offered);
    assert_eq!(storage.drives.len(), 4);
    assert_eq!(storage.volumes.len(), 1);

    // …and after it: the setting in effect, the RAID1 of drives 0 and 1
    // made, the other deleted.
    bmc.reset(GOOD).await;
    assert_eq!(current().await["ProcVirtualization"], "Enabled");
    assert_eq!(bmc.get(GOOD, settings).await["Attributes"], json!({}));
    let r = read(&bmc).await;
    assert_eq!(
        r.bios.as_ref().unwrap().attributes["ProcVirtualization"],
        "Enabled"
    );
    let v = &r.storage.as_ref().unwrap()[0].volumes;
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].raid_type.as_deref(), Some("RAID1"));
    assert_eq!(v[0].drives, ["0", "1"]);
}
