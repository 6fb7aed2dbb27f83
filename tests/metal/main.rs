//! The Metal API served to tenants, end to end: `fleet-sim` machines
//! (owned: an inventory with a simulated Redfish BMC each; their agents
//! run the real installer onto a file standing for each machine's disk),
//! one `shepherd run` serving the Metal API over HTTPS with a certificate
//! issued by the fleet's CA, projects and tokens made with the CLI as an
//! operator would (CONTRACTS.md §7).

mod concurrency;
mod isolation;
mod lifecycle;
mod sdk;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shepherd::bmdb::Bmdb;
use shepherd_sim::testing::{FleetSimProcess, ShepherdProcess, TestDb};

const SHEPHERD: &str = env!("CARGO_BIN_EXE_shepherd");

pub struct Rig {
    _db: TestDb,
    pub bmdb: Bmdb,
    pub dir: tempfile::TempDir,
    _fleet: FleetSimProcess,
    pub shepherd: ShepherdProcess,
    /// `https://127.0.0.1:PORT`.
    pub base: String,
    pub client: awc::Client,
    config: PathBuf,
    env: Vec<(&'static str, String)>,
    /// The OS image as it is written.
    pub image: Vec<u8>,
}

/// A GPT image (the first-boot volume goes into its free space) with
/// recognizable bytes in its first partition.
fn os_image(path: &Path) -> Vec<u8> {
    shepherd_sim::testing::gpt_image(path, 16 << 20);
    let mut bytes = std::fs::read(path).unwrap();
    for (i, b) in bytes[1 << 20..(1 << 20) + (4 << 20)].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31) ^ 0x5a;
    }
    std::fs::write(path, &bytes).unwrap();
    bytes
}

impl Rig {
    /// `machines` owned machines from `first`, taken over and available.
    pub async fn new(machines: usize, first: Ipv4Addr) -> Rig {
        let db = TestDb::new().await;
        let bmdb = db.bmdb().await;
        let dir = tempfile::tempdir().unwrap();
        let fleet = FleetSimProcess::start(
            &shepherd_sim::bin("fleet-sim"),
            dir.path(),
            machines,
            first,
            &[
                "--agent-interval",
                "1s",
                "--provider",
                "static",
                "--location",
                "sv",
            ],
        );
        let images = dir.path().join("images");
        std::fs::create_dir(&images).unwrap();
        let image = os_image(&images.join("debian-12.img"));
        // The fleet's configuration, and the Metal API's catalog.
        let config = dir.path().join("shepherd.toml");
        // (fleet-sim's own [metal] erases the simulated disks, files, by
        // discarding them.)
        let text = std::fs::read_to_string(&fleet.config).unwrap();
        assert!(text.contains("erase_mode = \"discard\""), "{text}");
        let mut text = text.replace("[metal]\n", "[metal]\ninterval = \"500ms\"\n");
        text.push_str(
            r#"
[admin.tls]
enabled = true

# First: a machine meeting it belongs to it. None here can (no agent
# booted with Secure Boot, no BMC to set it): they fall to the next.
[[metal.plans]]
slug = "c3.small.sb"
cpus_min = 8
memory_gib_min = 16
secure_boot = true

[[metal.plans]]
slug = "c3.small.x86"
cpus_min = 8
memory_gib_min = 16

[[metal.plans]]
slug = "m3.large.x86"
cpus_min = 64
memory_gib_min = 256

[[metal.operating_systems]]
slug = "debian_12"
name = "Debian 12"
image = "debian-12.img"
"#,
        );
        std::fs::write(&config, text).unwrap();
        let (mut env, admin) = shepherd_sim::testing::loopback_env(db.url(), &images);
        env.extend([
            ("SHEPHERD__BMDB__SESSION_INTERVAL", "2s".into()),
            ("SHEPHERD__UPDATER__INTERVAL", "1s".into()),
            ("SHEPHERD__LOG__LEVEL", "info,tokio_postgres=warn".into()),
        ]);
        let shepherd = ShepherdProcess::start(
            Path::new(SHEPHERD),
            &config,
            dir.path().join("shepherd.log"),
            &env,
        );
        // The server's certificate is the fleet CA's, written beside the
        // callback's files once it serves.
        let ca = dir.path().join("fleet/ssh/fleet-ca.pem");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ca.exists() {
            assert!(
                Instant::now() < deadline,
                "no {}: {}",
                ca.display(),
                shepherd.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let client = https_client(&std::fs::read(&ca).unwrap());
        let mut rig = Rig {
            _db: db,
            bmdb,
            dir,
            _fleet: fleet,
            shepherd,
            base: format!("https://{admin}"),
            client,
            config,
            env,
            image,
        };
        rig.prepare(machines).await;
        rig
    }

    /// What an operator does before tenants get machines taken over by
    /// SSH: erases them (a machine is `available` only once nothing of
    /// what it held before can be read back).
    async fn prepare(&mut self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let (_, body) = self
                .operator_get("/api/v1/machines?state=agent-started")
                .await;
            if body["machines"].as_array().map_or(0, Vec::len) >= n {
                break;
            }
            self.shepherd.assert_running();
            assert!(
                Instant::now() < deadline,
                "machines not taken over ({}): {}",
                body["counts"],
                self.shepherd.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        for (id, _) in self.machines().await {
            let url = format!("{}/api/v1/machines/{id}/deprovision", self.base);
            let mut r = self
                .client
                .post(&url)
                .send_json(&json!({"mode": "discard", "reason": "ready for tenants"}))
                .await
                .unwrap();
            let body = r.body().await.unwrap();
            assert!(
                r.status().is_success(),
                "{url}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        self.wait_available(n).await;
    }

    /// Waits until `n` machines are available.
    pub async fn wait_available(&mut self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let (status, body) = self.operator_get("/api/v1/machines?state=available").await;
            let have = body["machines"].as_array().map_or(0, Vec::len);
            if status == 200 && have >= n {
                return;
            }
            self.shepherd.assert_running();
            assert!(
                Instant::now() < deadline,
                "{have} of {n} machines available ({status}, {}): {}",
                body["counts"],
                self.shepherd.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// The machines, in provider ID order (`node-0001`…): ID and address.
    pub async fn machines(&self) -> Vec<(uuid::Uuid, String)> {
        shepherd_sim::testing::pairs(
            &self.bmdb,
            "SELECT machine_id, provider_ip_address FROM machine_provided ORDER BY provider_id",
        )
        .await
    }

    /// The file standing for the machine's disk.
    pub fn disk(&self, ip: &str) -> PathBuf {
        self.dir
            .path()
            .join("fleet/machines")
            .join(ip)
            .join("disk0")
    }

    /// Runs the shepherd CLI on the rig's configuration; its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = std::process::Command::new(SHEPHERD)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .env_remove("RUST_LOG")
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "shepherd {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// A project, by the CLI: its ID.
    pub fn project(&self, name: &str, extra: &[&str]) -> uuid::Uuid {
        let mut args = vec!["projects", "create", name];
        args.extend(extra);
        let out = self.cli(&args);
        out.trim().parse().unwrap_or_else(|_| panic!("{out:?}"))
    }

    /// A token of a project, by the CLI: its ID (from the list) and value.
    pub fn token(&self, project: uuid::Uuid, read_only: bool) -> (uuid::Uuid, String) {
        let p = project.to_string();
        let mut args = vec!["tokens", "create", "--project", &p, "--description", "test"];
        if read_only {
            args.push("--read-only");
        }
        let out = self.cli(&args);
        let value = out.lines().last().unwrap().trim().to_string();
        assert!(value.starts_with("shp_"), "{out:?}");
        let list = self.cli(&["tokens", "list", "--project", &p]);
        let id = list
            .lines()
            .rev()
            .find_map(|l| l.split_whitespace().next()?.parse::<uuid::Uuid>().ok())
            .unwrap();
        (id, value)
    }

    /// Every item of a list, page after page until `meta.next` is absent,
    /// as the SDKs read a list: `key` names the items (`events`, ...).
    pub async fn get_all(&self, path: &str, key: &str, token: &str) -> Vec<Value> {
        let mut items = Vec::new();
        let mut next = Some(path.to_string());
        while let Some(at) = next.take() {
            let (s, page) = self.get(&at, token).await;
            assert_eq!(s, 200, "{at}: {page}");
            items.extend(page[key].as_array().cloned().unwrap_or_default());
            next = page["meta"]["next"]["href"]
                .as_str()
                .map(|h| h.trim_start_matches("/metal/v1").to_string());
        }
        items
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let url = format!("{}/metal/v1{path}", self.base);
        let method = awc::http::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.client.request(method, &url);
        if let Some(t) = token {
            req = req.insert_header(("X-Auth-Token", t));
        }
        let sent = match body {
            Some(b) => req.send_json(&b).await,
            None => req.send().await,
        };
        let mut r = sent.unwrap_or_else(|e| panic!("{url}: {e}"));
        let status = r.status().as_u16();
        let bytes = r.body().limit(16 << 20).await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    pub async fn get(&self, path: &str, token: &str) -> (u16, Value) {
        self.call("GET", path, Some(token), None).await
    }

    /// The operator's API (no tokens configured: loopback, anonymous).
    pub async fn operator_get(&self, path: &str) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        match self.client.get(&url).send().await {
            Ok(mut r) => {
                let status = r.status().as_u16();
                let bytes = r.body().limit(16 << 20).await.unwrap_or_default();
                (
                    status,
                    serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                )
            }
            Err(_) => (0, Value::Null),
        }
    }

    pub async fn operator_text(&self, path: &str) -> String {
        let url = format!("{}{path}", self.base);
        let mut r = self.client.get(&url).send().await.unwrap();
        String::from_utf8_lossy(&r.body().limit(16 << 20).await.unwrap()).into_owned()
    }

    /// Creates a device; the answer.
    pub async fn create(&self, project: uuid::Uuid, token: &str, body: Value) -> (u16, Value) {
        self.call(
            "POST",
            &format!("/projects/{project}/devices"),
            Some(token),
            Some(body),
        )
        .await
    }

    /// Waits until the device is in one of `states`; its last answer.
    pub async fn wait_device(&mut self, id: &str, token: &str, states: &[&str]) -> Value {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let (status, d) = self.get(&format!("/devices/{id}"), token).await;
            if status == 200 && states.iter().any(|s| d["state"] == *s) {
                return d;
            }
            self.shepherd.assert_running();
            assert!(
                Instant::now() < deadline,
                "device {id} not {states:?}: {status} {d}: {}",
                self.shepherd.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

pub fn device_body(hostname: &str) -> Value {
    json!({
        "metro": "sv",
        "plan": "c3.small.x86",
        "operating_system": "debian_12",
        "hostname": hostname,
    })
}

fn https_client(ca_pem: &[u8]) -> awc::Client {
    let der = pem::parse(ca_pem).unwrap().into_contents();
    shepherd_sim::testing::https_client(&der, Duration::from_secs(30))
}
