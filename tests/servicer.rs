//! The Servicer in a running shepherd (in process: `supervisor::start_with`,
//! every loop of a configuration, the admin API served) over owned
//! hardware whose BMCs are the simulated ones (`shepherd_sim::bmc`): a
//! firmware update pushed and followed through its task, BIOS settings
//! and volumes asked for the next reset, one restart, the check after it;
//! a tenant's machine refused unless forced; a BMC that fails its update
//! leaves the machine `service-failed` with its words and never handed
//! out; a rollout of the baseline over the machines that differ. The
//! machines are taken over already (their agents' rows written): the
//! servicing itself needs only their BMCs.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shepherd::bmdb::Bmdb;
use shepherd_sim::bmc::{BmcSim, FirmwareOptions, firmware_image};
use shepherd_sim::testing::{Sshd, TestDb, sim_bmcs};
use uuid::Uuid;

const HOSTS: [&str; 4] = ["127.0.63.1", "127.0.63.2", "127.0.63.3", "127.0.63.4"];
/// Its BMC fails every update ("the image did not verify").
const FAILING: &str = "127.0.63.4";
const TOKEN: &str = "servicer-test-token-5c0e2a";

struct Rig {
    _db: TestDb,
    bmdb: Bmdb,
    sim: BmcSim,
    _dir: tempfile::TempDir,
    config: std::path::PathBuf,
    _running: shepherd::supervisor::Running,
    admin: String,
    /// Machine IDs by address.
    ids: HashMap<&'static str, Uuid>,
}

impl Rig {
    async fn start() -> Rig {
        let db = TestDb::new().await;
        let bmdb = db.bmdb().await;
        let failing: IpAddr = FAILING.parse().unwrap();
        let sim = sim_bmcs(
            &HOSTS,
            FirmwareOptions {
                task_time: Duration::from_millis(800),
                fails: Arc::new(move |ip| ip == failing),
                push: true,
            },
        );
        let dir = tempfile::tempdir().unwrap();
        let images = dir.path().join("images");
        std::fs::create_dir(&images).unwrap();
        std::fs::write(images.join("bios-2.0.bin"), firmware_image("BIOS", "2.0")).unwrap();
        let mut config = format!(
            r#"
[bmdb]
url = "{url}"
session_interval = "2s"

[ssh]
key_file = "{dir}/id_ed25519"

[bmaas]
listen = "127.0.0.1:0"

[admin]
token = "{TOKEN}"

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
verify_timeout = "20s"

[provider]
kind = "static"

[[baselines]]
name = "sim"
components = [{{ component = "bios", version = "2.0", image = "bios-2.0.bin" }}]
bios = {{ ProcVirtualization = "Enabled", SriovGlobalEnable = "Enabled" }}
raid = [{{ raid_type = "RAID1", drives = 2 }}]
"#,
            url = db.url(),
            dir = dir.path().display(),
            images = images.display(),
            images_port = Sshd::free_port(),
        );
        for (i, h) in HOSTS.iter().enumerate() {
            config.push_str(&format!(
                "\n[[provider.inventory.machines]]\nid = \"node-{}\"\naddress = \"{h}\"\n\
                 bmc = {{ url = \"{}\", username = \"{}\", password = \"{}\" }}\n",
                i + 1,
                sim.url(h.parse().unwrap()),
                sim.user,
                sim.password
            ));
        }
        let path = dir.path().join("shepherd.toml");
        std::fs::write(&path, config).unwrap();
        let cfg = shepherd::Config::load_with_env(Some(&path), Vec::new()).unwrap();
        let running = shepherd::supervisor::start_with(cfg, Vec::new())
            .await
            .unwrap();
        let addr =
            shepherd::admin::serve(running.admin.clone(), "127.0.0.1:0".parse().unwrap()).unwrap();
        let mut rig = Rig {
            _db: db,
            bmdb,
            sim,
            _dir: dir,
            config: path,
            _running: running,
            admin: format!("http://{addr}"),
            ids: HashMap::new(),
        };
        // Listed by the Provisioner; taken over (their agents' rows, as a
        // takeover writes them); their BMCs read by the Updater.
        until("the hosts listed and their firmware read", async || {
            rig.count("SELECT count(*) FROM machine_firmware_read")
                .await
                == 4
        })
        .await;
        for (i, h) in HOSTS.iter().enumerate() {
            let id: Uuid = rig
                .one(&format!(
                    "SELECT machine_id FROM machine_provided WHERE provider_id = 'node-{}'",
                    i + 1
                ))
                .await;
            rig.sql(
                "INSERT INTO machine_agent_started VALUES ($1, now(), '\\x0101')",
                id,
            )
            .await;
            rig.ids.insert(h, id);
        }
        rig
    }

    async fn sql(&self, q: &str, id: Uuid) {
        // The transaction's closure outlives this call's borrows.
        let q: &'static str = Box::leak(q.to_string().into_boxed_str());
        self.bmdb
            .transact(async |tx| tx.execute(q, &[&id]).await)
            .await
            .unwrap();
    }

    async fn one<T: for<'a> tokio_postgres::types::FromSql<'a> + Send + 'static>(
        &self,
        q: &str,
    ) -> T {
        let q: &'static str = Box::leak(q.to_string().into_boxed_str());
        self.bmdb
            .transact(async |tx| Ok(tx.query_one(q, &[]).await?.get(0)))
            .await
            .unwrap()
    }

    async fn count(&self, q: &str) -> i64 {
        self.one(q).await
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let mut r = awc::Client::default()
            .post(format!("{}/{path}", self.admin))
            .insert_header(("Authorization", format!("Bearer {TOKEN}")))
            .send_json(&body)
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> Value {
        let mut r = awc::Client::default()
            .get(format!("{}/{path}", self.admin))
            .insert_header(("Authorization", format!("Bearer {TOKEN}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "GET {path}");
        r.json().limit(8 << 20).await.unwrap()
    }

    /// The machine's page, as an operator's browser gets it.
    async fn page(&self, host: &str) -> String {
        let mut r = awc::Client::default()
            .get(format!("{}/machines/{}", self.admin, self.ids[host]))
            .insert_header(("Authorization", format!("Bearer {TOKEN}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        String::from_utf8(r.body().limit(8 << 20).await.unwrap().to_vec()).unwrap()
    }

    async fn machine(&self, host: &str) -> Value {
        self.get(&format!("api/v1/machines/{}", self.ids[host]))
            .await
    }

    /// The machine once its servicing has ended.
    async fn serviced(&self, host: &str) -> Value {
        let mut last = Value::Null;
        let deadline = Instant::now() + Duration::from_secs(90);
        while Instant::now() < deadline {
            last = self.machine(host).await;
            if matches!(last["servicing"]["phase"].as_str(), Some("done" | "failed")) {
                return last;
            }
            actix_rt::time::sleep(Duration::from_millis(300)).await;
        }
        panic!("{host}'s servicing did not end: {last}");
    }
}

async fn until(what: &str, mut ok: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ok().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
}

#[actix_rt::test]
async fn machines_are_brought_to_their_baseline_through_their_bmcs_with_one_restart() {
    let rig = Rig::start().await;
    let [one, tenant, third, failing] = HOSTS;

    // A free machine: drifting on all three parts; its page offers the
    // servicing, then it is serviced.
    let page = rig.page(one).await;
    assert!(
        page.contains("id=\"form-service\"") && page.contains("Service to baseline sim"),
        "{page}"
    );
    let m = rig.machine(one).await;
    assert_eq!(m["baseline"]["conformance"], "drifting", "{m}");
    assert_eq!(m["machine"]["state"], "agent-started", "{m}");
    let (status, v) = rig
        .post(
            &format!("api/v1/machines/{}/service", rig.ids[one]),
            json!({"reason": "baseline sim"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["baseline"], "sim", "{v}");
    assert_eq!(v["action"]["action"], "service", "{v}");
    let m = rig.serviced(one).await;
    let page = rig.page(one).await;
    assert!(
        page.contains("id=\"servicing\" class=\"done\""),
        "its page shows it done: {page}"
    );
    let s = &m["servicing"];
    assert_eq!(s["phase"], "done", "{m}");
    assert_eq!(s["restarts"], 1, "{m}");
    let applied = s["applied"].as_str().unwrap();
    for part in [
        "firmware bios 1.4.1 → 2.0 (pushed to the BMC",
        "BIOS ProcVirtualization, SriovGlobalEnable (applied OnReset)",
        "RAID1 of 2 drives made (applied OnReset)",
        "restart",
        "after the restart its BMC shows baseline sim",
    ] {
        assert!(applied.contains(part), "{part:?} in {applied}");
    }
    assert_eq!(m["machine"]["state"], "agent-started", "{m}");
    assert_eq!(m["baseline"]["conformance"], "conforming", "{m}");
    let bios = m["firmware"]["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["component"] == "bios")
        .cloned()
        .unwrap();
    assert_eq!(bios["version"], "2.0", "{m}");
    let counts = rig.sim.counts()[&one.parse::<IpAddr>().unwrap()];
    assert_eq!(
        (counts.restarts, counts.updates, counts.busy),
        (1, 1, 0),
        "one restart, one update, never two at once"
    );

    // A tenant's (installed): refused, then forced, audited as such.
    rig.sql(
        "WITH i AS (INSERT INTO machine_installation \
             (machine_id, generation, image_url, image_digest, requested_at, requested_by, kind) \
             VALUES ($1, 1, '', '', now(), 'test', 'install')), \
         r AS (INSERT INTO machine_os_installation_request VALUES ($1, 1, '\\x08011234')) \
         INSERT INTO machine_os_installation_report \
             (machine_id, generation, os_installation_result, os_installation_report_raw) \
         VALUES ($1, 1, 'Success', '\\x0801')",
        rig.ids[tenant],
    )
    .await;
    let path = format!("api/v1/machines/{}/service", rig.ids[tenant]);
    let (status, v) = rig.post(&path, json!({})).await;
    assert_eq!(status, 409, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("is a tenant's"),
        "{v}"
    );
    assert_eq!(
        rig.sim.counts().get(&tenant.parse::<IpAddr>().unwrap()),
        None,
        "a tenant's BMC is not touched"
    );
    let (status, v) = rig
        .post(&path, json!({"force": true, "reason": "firmware fix"}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(
        v["action"]["detail"]
            .as_str()
            .unwrap()
            .contains("forced on a tenant's machine (its installed system)"),
        "{v}"
    );
    let m = rig.serviced(tenant).await;
    assert_eq!(m["servicing"]["phase"], "done", "{m}");
    assert_eq!(m["machine"]["state"], "installed", "{m}");

    // A BMC that fails its update: service-failed with its words, and no
    // installation.
    let (status, v) = rig
        .post(
            &format!("api/v1/machines/{}/service", rig.ids[failing]),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let m = rig.serviced(failing).await;
    assert_eq!(m["servicing"]["phase"], "failed", "{m}");
    assert_eq!(m["machine"]["state"], "service-failed", "{m}");
    let error = m["servicing"]["error"].as_str().unwrap();
    assert!(
        error.contains("its BMC's update task ended Exception")
            && error.contains("the image did not verify"),
        "{error}"
    );
    assert_eq!(m["servicing"]["restarts"], 0, "{m}");
    let (status, v) = rig
        .post(
            &format!("api/v1/machines/{}/install", rig.ids[failing]),
            json!({"image": {"served": "bios-2.0.bin"}}),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("is service-failed"),
        "{v}"
    );

    // A rollout of the baseline: the machines that differ (the third; the
    // failing one skipped: a rollout does not retry a failed servicing).
    let (status, v) = rig
        .post(
            "api/v1/rollouts",
            json!({"baseline": "sim", "max_parallel": 2, "max_failures": 1}),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let rollout = v["rollout"]["rollout_id"].as_str().unwrap().to_string();
    let mut r = Value::Null;
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        r = rig.get(&format!("api/v1/rollouts/{rollout}")).await;
        if r["rollout"]["state"] != "running" {
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(r["rollout"]["state"], "done", "{r}");
    let members: HashMap<String, String> = r["machines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["machine_id"].as_str().unwrap().to_string(),
                m["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let of = |h: &str| members.get(&rig.ids[h].to_string()).cloned();
    assert_eq!(of(third).as_deref(), Some("done"), "{r}");
    assert_eq!(of(failing).as_deref(), Some("skipped"), "{r}");
    assert!(
        r.to_string().contains("a rollout does not try it again"),
        "{r}"
    );
    assert_eq!(of(one), None, "conforming already: not in it");
    assert_eq!(of(tenant), None, "conforming already: not in it");
    // No BMC was asked for an update while one ran; each machine restarted
    // once per servicing that applied something.
    for (ip, c) in rig.sim.counts() {
        assert_eq!(c.busy, 0, "{ip}: {c:?}");
        assert!(c.restarts <= 1, "{ip}: {c:?}");
    }
    // An operator tries the failed one again from the command line: the
    // BMC fails it again, with its words in `machines show`.
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .arg("--config")
            .arg(&rig.config)
            .args(args)
            .output()
            .unwrap()
    };
    let id = rig.ids[failing].to_string();
    let out = cli(&["machines", "service", &id, "--reason", "try again"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("to baseline sim"), "{said}");
    let m = rig.serviced(failing).await;
    assert_eq!(m["servicing"]["phase"], "failed", "{m}");
    let out = cli(&["machines", "show", &id]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("to baseline sim failed") && shown.contains("the image did not verify"),
        "{shown}"
    );
    // A tenant's, by the command line, without --force: refused, exit 1.
    let out = cli(&["machines", "service", &rig.ids[tenant].to_string()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is a tenant's"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let history: i64 = rig.count("SELECT count(*) FROM service_history").await;
    assert_eq!(history, 5, "every servicing's end is kept");
    // Counted: three restarted and done, the failing one twice failed.
    let mut r = awc::Client::default()
        .get(format!("{}/metrics", rig.admin))
        .insert_header(("Authorization", format!("Bearer {TOKEN}")))
        .send()
        .await
        .unwrap();
    let metrics = String::from_utf8(r.body().limit(8 << 20).await.unwrap().to_vec()).unwrap();
    for line in [
        "shepherd_servicing_steps_total{step=\"restarted\"} 3",
        "shepherd_servicing_steps_total{step=\"done\"} 3",
        "shepherd_servicing_steps_total{step=\"failed\"} 2",
        "shepherd_machines{state=\"service-failed\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }
}
