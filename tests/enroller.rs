//! Machines from their BMC, end to end (CONTRACTS.md §5): `shepherd run`
//! with an inventory whose hosts are listed by their BMC only (`boot =
//! "virtual-media"`, no address), in front of OpenStack's Redfish emulator
//! (sushy-tools, its fake driver) as their BMCs. The test plays each
//! machine's firmware: it reads the image URL its BMC was given, fetches
//! that boot's copy from shepherd's image server as a BMC does (TLS, no
//! client certificate), takes the boot data from the copy's slot with GNU
//! cpio and starts the real live agent (`takeover-agent --live`) with it.
//! What is checked is what an operator sees: states, the BMC's media and
//! override, history, audit, metrics.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prost::Message;
use shepherd::bmdb::Bmdb;
use shepherd_proto::boot::BootData;
use shepherd_sim::testing::{ShepherdProcess, Sshd, Sushy, TestDb};
use uuid::Uuid;

const SHEPHERD: &str = env!("CARGO_BIN_EXE_shepherd");
const PASSWORD: &str = "bmc-pw-7f3e21";
/// How long shepherd waits for a booted machine's agent.
const CALLBACK_TIMEOUT: &str = "20s";

struct Rig {
    _db: TestDb,
    bmdb: Bmdb,
    dir: tempfile::TempDir,
    sushy: Sushy,
    shepherd: ShepherdProcess,
    config: PathBuf,
    env: Vec<(&'static str, String)>,
    admin: String,
    ca: Vec<u8>,
}

impl Rig {
    async fn new(hosts: &[&str]) -> Rig {
        Self::with(hosts, &[]).await
    }

    /// With more settings (environment overrides).
    async fn with(hosts: &[&str], more: &[(&'static str, &str)]) -> Rig {
        let db = TestDb::new().await;
        let bmdb = db.bmdb().await;
        let dir = tempfile::tempdir().unwrap();
        let sushy = Sushy::start(hosts, "admin", PASSWORD);
        let images = dir.path().join("images");
        std::fs::create_dir(&images).unwrap();
        let (boot_image, _) = shepherd_sim::testing::boot_image_stand_in(dir.path());
        let mut config = String::from("[provider]\nkind = \"static\"\n");
        for (i, host) in hosts.iter().enumerate() {
            config.push_str(&format!(
                "\n[[provider.inventory.machines]]\nid = \"{host}\"\nboot = \"virtual-media\"\n\
                 bmc = {{ url = \"{}\", username = \"admin\", password = \"{PASSWORD}\", system = \"{}\" }}\n",
                sushy.url,
                Sushy::uuid(i)
            ));
        }
        let path = dir.path().join("shepherd.toml");
        std::fs::write(&path, config).unwrap();
        let callback = format!("127.0.0.1:{}", Sshd::free_port());
        let admin = format!("127.0.0.1:{}", Sshd::free_port());
        let env: Vec<(&str, String)> = vec![
            ("SHEPHERD__BMDB__URL", db.url()),
            ("SHEPHERD__BMDB__SESSION_INTERVAL", "2s".into()),
            // A killed shepherd's leases are released soon after.
            ("SHEPHERD__BMDB__SESSION_GC_GRACE", "2s".into()),
            ("SHEPHERD__ADMIN__LISTEN", admin.clone()),
            ("SHEPHERD__BMAAS__LISTEN", callback.clone()),
            ("SHEPHERD__BMAAS__ENDPOINT", callback),
            ("SHEPHERD__PROVISIONER__INTERVAL", "1s".into()),
            (
                "SHEPHERD__INSTALLATIONS__IMAGES_DIR",
                images.display().to_string(),
            ),
            (
                "SHEPHERD__INSTALLATIONS__IMAGES_LISTEN",
                format!("127.0.0.1:{}", Sshd::free_port()),
            ),
            (
                "SHEPHERD__INSTALLATIONS__BOOT_IMAGE",
                boot_image.display().to_string(),
            ),
            (
                "SHEPHERD__ENROLLER__CALLBACK_TIMEOUT",
                CALLBACK_TIMEOUT.into(),
            ),
            ("SHEPHERD__ENROLLER__BACKOFF_INITIAL", "1h".into()),
            ("SHEPHERD__ENROLLER__BACKOFF_MAX", "2h".into()),
            (
                "SHEPHERD__SSH__KEY_FILE",
                dir.path().join("id_ed25519").display().to_string(),
            ),
            ("SHEPHERD__LOG__LEVEL", "info,tokio_postgres=warn".into()),
        ];
        let mut env = env;
        env.extend(more.iter().map(|(k, v)| (*k, v.to_string())));
        let shepherd = ShepherdProcess::start(
            Path::new(SHEPHERD),
            &path,
            dir.path().join("shepherd.log"),
            &env,
        );
        let mut rig = Rig {
            _db: db,
            bmdb,
            dir,
            sushy,
            shepherd,
            config: path,
            env,
            admin: format!("http://{admin}"),
            ca: Vec::new(),
        };
        rig.ca = rig.wait_for_ca().await;
        rig
    }

    async fn wait_for_ca(&mut self) -> Vec<u8> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ca = self
                .bmdb
                .transact(async |tx| {
                    Ok(tx
                        .query_opt("SELECT certificate FROM callback_ca", &[])
                        .await?
                        .map(|r| r.get::<_, Vec<u8>>(0)))
                })
                .await
                .unwrap();
            if let Some(ca) = ca {
                return ca;
            }
            self.shepherd.assert_running();
            assert!(Instant::now() < deadline, "{}", self.shepherd.log_tail());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn machine_id(&mut self, host: &str) -> Uuid {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let host_id = host.to_string();
            let id = self
                .bmdb
                .transact(async |tx| {
                    Ok(tx
                        .query_opt(
                            "SELECT machine_id FROM machine_provided WHERE provider_id = $1",
                            &[&host_id],
                        )
                        .await?
                        .map(|r| r.get::<_, Uuid>(0)))
                })
                .await
                .unwrap();
            if let Some(id) = id {
                return id;
            }
            self.shepherd.assert_running();
            assert!(Instant::now() < deadline, "{}", self.shepherd.log_tail());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn get(&self, path: &str) -> serde_json::Value {
        let mut r = awc::Client::default()
            .get(format!("{}{path}", self.sushy.url))
            .basic_auth(&self.sushy.user, &self.sushy.password)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}: {:?}", r.status());
        r.json().limit(1 << 20).await.unwrap()
    }

    /// What system `i`'s virtual CD holds (`Image`, `Inserted`).
    async fn cd(&self, i: usize) -> (String, bool) {
        let cd = self
            .get(&format!(
                "/redfish/v1/Systems/{}/VirtualMedia/Cd",
                Sushy::uuid(i)
            ))
            .await;
        (
            cd["Image"].as_str().unwrap_or("").to_string(),
            cd["Inserted"].as_bool().unwrap_or(false),
        )
    }

    /// Waits for system `i`'s BMC to be given an image other than `not`.
    async fn inserted_image(&mut self, i: usize, not: Option<&str>) -> String {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let (image, inserted) = self.cd(i).await;
            if inserted && !image.is_empty() && Some(image.as_str()) != not {
                return image;
            }
            self.shepherd.assert_running();
            assert!(
                Instant::now() < deadline,
                "no boot image inserted in system {i}: {}",
                self.shepherd.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// GETs `url` as a BMC does: trusting the fleet's CA, no certificate,
    /// with the boot's user name and password InsertMedia gave it.
    async fn fetch(&self, url: &str) -> (u16, Vec<u8>) {
        let boot: Uuid = url
            .rsplit('/')
            .next()
            .and_then(|n| n.strip_suffix(".iso"))
            .and_then(|id| id.parse().ok())
            .unwrap_or_default();
        let credential: Vec<u8> = self
            .bmdb
            .transact(async |tx| {
                Ok(tx
                    .query_opt(
                        "SELECT credential FROM machine_boot_credential WHERE boot_id = $1",
                        &[&boot],
                    )
                    .await?
                    .map(|r| r.get(0))
                    .unwrap_or_default())
            })
            .await
            .unwrap();
        let (user, password) = shepherd::bmdb::boot::media_credentials(&credential);
        let (status, body, _) = shepherd_sim::testing::fetch_as_bmc_with(
            &self.ca,
            url,
            None,
            false,
            Some((&user, &password)),
        )
        .await;
        (status, body)
    }

    /// Plays the firmware of a machine whose BMC was given `url`: fetches
    /// the copy, reads its boot data and starts the live agent with it.
    async fn boot(&self, name: &str, url: &str) -> (BootData, std::process::Child) {
        let (status, iso) = self.fetch(url).await;
        assert_eq!(status, 200, "{url}");
        let at = shepherd_sim::testing::BOOT_SLOT_AT as usize;
        let slot = &iso[at..at + shepherd_sim::testing::BOOT_SLOT_LEN as usize];
        let data =
            BootData::decode(shepherd_sim::testing::boot_data_file(slot).as_slice()).unwrap();
        let child =
            shepherd_sim::testing::live_agent(&self.dir.path().join(name), &data.encode_to_vec());
        (data, child)
    }

    async fn api(&self, path: &str) -> serde_json::Value {
        let mut r = awc::Client::default()
            .get(format!("{}{path}", self.admin))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}: {:?}", r.status());
        r.json().limit(4 << 20).await.unwrap()
    }

    async fn state(&self, machine: Uuid) -> String {
        self.api(&format!("/api/v1/machines/{machine}")).await["machine"]["state"]
            .as_str()
            .unwrap()
            .to_string()
    }

    async fn wait_state(&mut self, machine: Uuid, want: &str) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let d = self.api(&format!("/api/v1/machines/{machine}")).await;
            if d["machine"]["state"] == want {
                return d;
            }
            self.shepherd.assert_running();
            assert!(
                Instant::now() < deadline,
                "machine {machine} is {}, not {want}: {}",
                d["machine"]["state"],
                self.shepherd.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn metrics(&self) -> String {
        let mut r = awc::Client::default()
            .get(format!("{}/metrics", self.admin))
            .send()
            .await
            .unwrap();
        String::from_utf8(r.body().await.unwrap().to_vec()).unwrap()
    }

    /// `shepherd machines ARGS…` against the rig's BMDB.
    fn cli(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(SHEPHERD)
            .arg("--config")
            .arg(&self.config)
            .arg("machines")
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap()
    }
}

fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{metrics}"))
}

fn stop(mut child: std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[actix_rt::test]
async fn a_blank_machine_listed_by_its_bmc_is_booted_into_the_agent_enrolled_and_inspected_again() {
    let mut rig = Rig::new(&["rack1-u12", "rack1-u13"]).await;
    let u12 = rig.machine_id("rack1-u12").await;
    let u13 = rig.machine_id("rack1-u13").await;

    // As soon as it is listed, its BMC is given this boot's copy of the
    // image, with a one-time override to the CD.
    let url = rig.inserted_image(0, None).await;
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    assert!(url.contains("/boot/") && url.ends_with(".iso"), "{url}");
    // The override follows the insert (one sequence, not one request):
    // read once it is set, or after 10 s.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut system = rig.sushy.system(0).await;
    while system["Boot"]["BootSourceOverrideTarget"] != "Cd" && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        system = rig.sushy.system(0).await;
    }
    // (The fake driver keeps the target, and shows every override as
    // `Continuous`: `Once` is checked in tests/redfish_media.rs.)
    assert_eq!(system["Boot"]["BootSourceOverrideTarget"], "Cd");
    assert_eq!(rig.state(u12).await, "enrolling");

    // Its copy is served only with the boot's user name and password,
    // which the BMC was given with the insert.
    let (status, _, _) = shepherd_sim::testing::fetch_as_bmc(&rig.ca, &url, None, false).await;
    assert_eq!(status, 401, "served without the boot's credentials");
    let cd = rig
        .get(&format!(
            "/redfish/v1/Systems/{}/VirtualMedia/Cd",
            Sushy::uuid(0)
        ))
        .await;
    assert_eq!(cd["UserName"], "shepherd-boot");

    // The machine boots it: its agent enrolls and heartbeats.
    let (data, agent) = rig.boot("u12-first", &url).await;
    assert_eq!(data.machine_id, u12.to_string());
    assert_eq!(data.credential.len(), 32);
    let d = rig.wait_state(u12, "available").await;
    assert!(!d["tags"]["agent_started"].is_null(), "{d}");
    assert!(d["tags"]["bmc_boot"].as_bool().unwrap(), "{d}");
    assert!(d["boot_requested"].is_null(), "the request is done: {d}");
    // The media is out and the override gone: the next boot is the disk's.
    assert_eq!(rig.cd(0).await, (String::new(), false));
    assert_ne!(
        rig.sushy.system(0).await["Boot"]["BootSourceOverrideTarget"],
        "Cd"
    );
    // The copy's URL answers no more.
    assert_eq!(rig.fetch(&url).await.0, 404);
    let history = d["history"].as_array().unwrap();
    let done = history
        .iter()
        .find(|h| h["process"] == "ShepherdAgentStart" && h["event"] == "Finished")
        .unwrap_or_else(|| panic!("{history:?}"));
    let detail = done["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("enroll: booted into the agent through the BMC")
            && detail.contains("media ejected"),
        "{detail}"
    );
    // Its hardware report arrives with the heartbeats.
    let deadline = Instant::now() + Duration::from_secs(30);
    while rig.api(&format!("/api/v1/machines/{u12}")).await["tags"]["hardware_report"].is_null() {
        assert!(Instant::now() < deadline, "no hardware report");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The other machine's BMC booted it too, but no agent ever calls: the
    // boot fails naming why, its media is ejected, it backs off.
    let url13 = rig.inserted_image(1, None).await;
    assert_ne!(url13, url);
    let d = rig.wait_state(u13, "enroll-failed").await;
    let cause = d["backoffs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|b| b["process"] == "ShepherdAgentStart")
        .and_then(|b| b["cause"].as_str())
        .unwrap_or_else(|| panic!("no ShepherdAgentStart backoff: {d}"));
    assert!(
        cause.contains(&format!("did not call back within {CALLBACK_TIMEOUT}")),
        "{cause}"
    );
    assert_eq!(rig.cd(1).await, (String::new(), false));
    assert_eq!(rig.fetch(&url13).await.0, 404, "its credential is void");

    let m = rig.metrics().await;
    assert_eq!(
        sample(&m, "shepherd_bmc_boots_total{outcome=\"enrolled\"}"),
        1.0
    );
    assert_eq!(
        sample(&m, "shepherd_bmc_boots_total{outcome=\"no_callback\"}"),
        1.0
    );

    // An operator inspects it again, whatever runs on it: a new boot.
    let out = rig.cli(&["inspect", &u12.to_string(), "--reason", "new NIC in slot 2"]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let again = rig.inserted_image(0, None).await;
    assert_ne!(again, url, "a new boot, with a new copy");
    assert_eq!(rig.state(u12).await, "inspecting");
    // The machine was reset: the old agent is gone with it.
    stop(agent);
    let (data2, agent2) = rig.boot("u12-again", &again).await;
    assert_ne!(data2.credential, data.credential);
    let d = rig.wait_state(u12, "available").await;
    let key: String = d["tags"]["agent_started"]["public_key"]
        .as_str()
        .unwrap()
        .into();
    assert_eq!(rig.cd(0).await, (String::new(), false));
    let details: Vec<&str> = d["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["detail"].as_str())
        .collect();
    assert!(
        details
            .iter()
            .any(|d| d.starts_with("inspect: booted into the agent through the BMC")),
        "{details:?}"
    );
    let audit = &d["operator_actions"];
    assert!(
        audit
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["action"] == "inspect" && a["reason"] == "new NIC in slot 2"),
        "{audit}"
    );
    // The first agent's key was replaced by the second's.
    assert!(!key.is_empty());
    assert_eq!(
        sample(
            &rig.metrics().await,
            "shepherd_bmc_boots_total{outcome=\"enrolled\"}"
        ),
        2.0
    );

    // A machine asked to be inspected twice is told so.
    let out = rig.cli(&["inspect", &u13.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = rig.cli(&["inspect", &u13.to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is inspecting: inspect is not allowed"),
        "{err}"
    );
    stop(agent2);
}

#[actix_rt::test]
async fn a_shepherd_killed_mid_boot_is_resumed_by_the_next_without_a_second_reset() {
    let mut rig = Rig::new(&["rack2-u01"]).await;
    let id = rig.machine_id("rack2-u01").await;
    let url = rig.inserted_image(0, None).await;
    let resets = |rig: &Rig| rig.sushy.log().matches("ComputerSystem.Reset").count();
    // The BMC has booted the machine (recorded as such); shepherd waits
    // for its agent, and is killed. Another starts.
    let deadline = Instant::now() + Duration::from_secs(60);
    while shepherd_sim::testing::count(
        &rig.bmdb,
        "SELECT count(*) FROM machine_boot_credential WHERE media_inserted_at IS NOT NULL",
    )
    .await
        == 0
    {
        assert!(Instant::now() < deadline, "{}", rig.shepherd.log_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The boot is recorded as handed to the BMC before the BMC is asked
    // (insert, Secure Boot, override, reset): the reset follows.
    while resets(&rig) == 0 {
        assert!(Instant::now() < deadline, "{}", rig.sushy.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(resets(&rig), 1, "{}", rig.sushy.log());
    rig.shepherd.kill();
    rig.shepherd = ShepherdProcess::start(
        Path::new(SHEPHERD),
        &rig.config,
        rig.dir.path().join("shepherd-2.log"),
        &rig.env,
    );
    // Its Enroller takes the boot over: same boot, no second reset.
    let deadline = Instant::now() + Duration::from_secs(90);
    while !std::fs::read_to_string(rig.dir.path().join("shepherd-2.log"))
        .unwrap_or_default()
        .contains("resuming a boot under way")
    {
        rig.shepherd.assert_running();
        assert!(Instant::now() < deadline, "{}", rig.shepherd.log_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The machine comes up with what the first shepherd's BMC call put in.
    let (_, agent) = rig.boot("u01", &url).await;
    rig.wait_state(id, "available").await;
    assert_eq!(resets(&rig), 1, "one reset in all: {}", rig.sushy.log());
    assert_eq!(rig.cd(0).await, (String::new(), false));
    let d = rig.api(&format!("/api/v1/machines/{id}")).await;
    let history = d["history"].as_array().unwrap();
    // The killed shepherd's lease ended with its session; the second
    // finished the boot.
    let finished: Vec<&str> = history
        .iter()
        .filter(|h| h["process"] == "ShepherdAgentStart" && h["event"] == "Finished")
        .filter_map(|h| h["detail"].as_str())
        .collect();
    assert_eq!(finished.len(), 1, "{history:?}");
    assert!(finished[0].contains("resumed"), "{}", finished[0]);
    stop(agent);
}

#[actix_rt::test]
async fn a_machine_whose_live_agent_went_quiet_is_taken_back_through_its_bmc() {
    let mut rig = Rig::with(
        &["rack3-u01"],
        &[
            ("SHEPHERD__RECOVERER__HEARTBEAT_STALE_AFTER", "3s"),
            ("SHEPHERD__RECOVERER__SILENT_AFTER_START", "3s"),
            ("SHEPHERD__RECOVERER__CALLBACK_GRACE", "1s"),
            ("SHEPHERD__RECOVERER__POLL_INTERVAL", "200ms"),
            ("SHEPHERD__RECOVERER__REBOOT_POLL", "200ms"),
            ("SHEPHERD__RECOVERER__REBOOT_SETTLE", "2s"),
            ("SHEPHERD__RECOVERER__AGENT_RETURN_WAIT", "2s"),
            ("SHEPHERD__UPDATER__INTERVAL", "500ms"),
        ],
    )
    .await;
    let id = rig.machine_id("rack3-u01").await;
    let url = rig.inserted_image(0, None).await;
    let (_, agent) = rig.boot("first", &url).await;
    rig.wait_state(id, "available").await;
    // The machine hangs: its agent falls silent.
    stop(agent);
    // The Recoverer power-cycles it through its BMC; the agent does not
    // come back by itself (the machine boots its empty disk), so it is
    // taken back through the BMC: a new boot of the agent.
    let again = rig.inserted_image(0, Some(&url)).await;
    let (_, agent) = rig.boot("again", &again).await;
    let d = rig.wait_state(id, "available").await;
    let history = d["history"].as_array().unwrap();
    let details: Vec<&str> = history
        .iter()
        .filter_map(|h| h["detail"].as_str())
        .collect();
    assert!(
        details
            .iter()
            .any(|d| d
                .starts_with("rebooted; the agent did not come back, so it is taken over again")),
        "{details:?}"
    );
    assert!(
        details
            .iter()
            .any(|d| d.starts_with("recovery: booted into the agent through the BMC")),
        "{details:?}"
    );
    assert_eq!(rig.cd(0).await, (String::new(), false));
    stop(agent);
}
