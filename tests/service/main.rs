//! `shepherd run` as an operator runs it: the real binary as a process,
//! with PostgreSQL, equinix-sim (a process too), OpenSSH's sshd and the
//! takeover-agent.

mod database;
mod demo;
mod input;
mod lifecycle;
mod operators;
mod owned;
mod shepherds;
mod takeover;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;
use shepherd::bmdb::Bmdb;
use shepherd::ssh::SshIdentity;
use shepherd_sim::testing::{OwnPostgres, Sshd, TestDb};

const PROJECT: &str = "6b4d2a9e-6f1a-4c1e-9b9a-3d1f5e7c0a01";
const TOKEN: &str = "sim-token-for-tests";

/// The BMDB of a test: a database on the shared server, or a PostgreSQL of
/// the test's own that it can stop and start.
enum Db {
    Shared(TestDb),
    Own(OwnPostgres),
}

impl Db {
    fn url(&self) -> String {
        match self {
            Db::Shared(d) => d.url(),
            Db::Own(o) => o.url(),
        }
    }

    fn own(&mut self) -> &mut OwnPostgres {
        match self {
            Db::Own(o) => o,
            Db::Shared(_) => panic!("not a PostgreSQL of the test's own"),
        }
    }
}

struct Rig {
    db: Db,
    bmdb: Bmdb,
    sshd: Sshd,
    dir: tempfile::TempDir,
}

impl Rig {
    async fn new() -> Rig {
        let db = TestDb::new().await;
        let bmdb = db.bmdb().await;
        Self::with(Db::Shared(db), bmdb)
    }

    /// With a PostgreSQL of the test's own (migrated by shepherd at start).
    async fn with_own_postgres() -> Rig {
        let own = OwnPostgres::start().await;
        let bmdb = own.bmdb().await;
        bmdb.migrate().await.unwrap();
        Self::with(Db::Own(own), bmdb)
    }

    fn with(db: Db, bmdb: Bmdb) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let identity = SshIdentity::load_or_generate(&dir.path().join("id_ed25519")).unwrap();
        let sshd = Sshd::start(
            SocketAddr::new([127, 0, 0, 1].into(), Sshd::free_port()),
            &[identity.public_key()],
        );
        Rig {
            db,
            bmdb,
            sshd,
            dir,
        }
    }

    /// The configuration for a static inventory of `hosts` hosts on the
    /// rig's sshd, with these `[bmdb]` keys added.
    /// `config` with a callback the agents can reach (a free port on
    /// loopback, as listen address and endpoint), agents calling every
    /// 300 ms.
    fn calling(&self, config: String) -> String {
        let port = Sshd::free_port();
        std::fs::write(self.sshd.dir().join("takeover-agent.interval"), "300ms").unwrap();
        config.replace(
            "[bmaas]\nlisten = \"127.0.0.1:0\"\n",
            &format!("[bmaas]\nlisten = \"127.0.0.1:{port}\"\nendpoint = \"127.0.0.1:{port}\"\n"),
        )
    }

    fn inventory_config(&self, hosts: usize, bmdb: &str) -> String {
        format!(
            "{}\n[provider]\nkind = \"static\"\n\n[provider.inventory]\nmachines = [{}]\n",
            self.base_config()
                .replace("[bmdb]\n", &format!("[bmdb]\n{bmdb}\n"))
                .replace("session_interval = \"2s\"\n", ""),
            (1..=hosts)
                .map(|i| format!("{{ id = \"host-{i}\", address = \"127.0.0.1\" }}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// Starts shepherd on a static inventory of `hosts` hosts whose agents
    /// behave as `mode`, with these `[bmdb]` keys.
    fn run_inventory(&self, hosts: usize, bmdb: &str, mode: &str) -> Shepherd {
        std::fs::write(self.sshd.dir().join("takeover-agent.mode"), mode).unwrap();
        let config = self.write_config("shepherd.toml", &self.inventory_config(hosts, bmdb));
        self.shepherd(&config, "shepherd.log")
    }

    /// Waits until `machine`'s history is one takeover, one recovery and
    /// a takeover again.
    async fn wait_for_recovery(&self, machine: uuid::Uuid, s: &Shepherd) {
        self.wait_for_history(
            machine,
            &[
                "ShepherdAgentStart Started",
                "ShepherdAgentStart Finished",
                "ShepherdRecovery Started",
                "ShepherdRecovery Finished",
                "ShepherdAgentStart Started",
                "ShepherdAgentStart Finished",
            ],
            s,
        )
        .await
    }

    /// Waits until `machine`'s history is exactly `want` ("process event").
    async fn wait_for_history(&self, machine: uuid::Uuid, want: &[&str], s: &Shepherd) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let h: Vec<String> = self
                .bmdb
                .transact(async |tx| shepherd::bmdb::machines::history(tx, machine).await)
                .await
                .unwrap()
                .into_iter()
                .map(|h| format!("{} {}", h.process, h.event))
                .collect();
            if h == want {
                return;
            }
            assert!(Instant::now() < deadline, "history {h:?}\n{}", s.log_text());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `host`'s recovery failed with a cause naming it and
    /// containing `cause`, then checks it was backed off by at least
    /// backoff_initial (30 s) from the failure (measured from the failure,
    /// not from now: the test may look much later under load).
    async fn wait_for_failed_recovery(&self, host: &str, cause: &str, s: &mut Shepherd) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let pattern = format!("%host {host}%{cause}%");
        loop {
            let failed: i64 = self
                .bmdb
                .transact(async |tx| {
                    Ok(tx
                        .query_one(
                            "SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery' \
                             AND event = 'Failed' AND failed_cause LIKE $1",
                            &[&pattern],
                        )
                        .await?
                        .get(0))
                })
                .await
                .unwrap();
            if failed >= 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no failed recovery of {host} naming {cause}:\n{}",
                s.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        const BACKOFF: &str = "SELECT count(*) FROM work_backoff b \
             WHERE b.process = 'ShepherdRecovery' AND b.until >= (SELECT max(h.\"timestamp\") \
                 FROM work_history h WHERE h.machine_id = b.machine_id \
                  AND h.process = 'ShepherdRecovery' AND h.event = 'Failed') + interval '30 seconds'";
        assert_eq!(self.count(BACKOFF).await, 1, "{}", s.log_text());
    }

    /// How many times each machine's agent ran (the agent counts its runs).
    fn agent_runs(&self) -> Vec<usize> {
        let mut runs: Vec<usize> = std::fs::read_dir(self.sshd.dir())
            .unwrap()
            .flatten()
            .filter(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n.starts_with("agent-") && n.ends_with(".runs")
            })
            .map(|e| std::fs::read_to_string(e.path()).unwrap().lines().count())
            .collect();
        runs.sort();
        runs
    }

    async fn sessions_alive(&self) -> Vec<uuid::Uuid> {
        self.bmdb
            .transact(async |tx| {
                Ok(tx
                    .query(
                        "SELECT session_id FROM sessions WHERE session_deadline > now() ORDER BY 1",
                        &[],
                    )
                    .await?
                    .iter()
                    .map(|r| r.get(0))
                    .collect())
            })
            .await
            .unwrap()
    }

    /// Each event in the history, with how often it happened.
    async fn history_events(&self) -> std::collections::BTreeMap<String, i64> {
        shepherd_sim::testing::pairs(
            &self.bmdb,
            "SELECT event::text || coalesce(': ' || failed_cause, ''), count(*) \
             FROM work_history GROUP BY 1",
        )
        .await
        .into_iter()
        .collect()
    }

    /// The parts of the configuration every test shares.
    fn base_config(&self) -> String {
        format!(
            r#"
[bmdb]
url = "{url}"
session_interval = "2s"
session_gc_grace = "1s"

[ssh]
port = {port}
key_file = "{dir}/id_ed25519"
exchange_timeout = "30s"

[initializer]
parallelism = 8
poll_interval = "200ms"
agent_binary = "{agent}"
agent_path = "{sshd_dir}/agent-{{machine_id}}"
agent_endpoint = "bmaas.test:443"
backoff_initial = "1s"
backoff_max = "5s"

[provisioner]
interval = "500ms"
max_machines = 0
chunk_size = 10
creation_interval = "0s"

[supervisor]
drain_timeout = "15s"

[admin]
listen = "127.0.0.1:0"

[bmaas]
listen = "127.0.0.1:0"

[log]
level = "info,tokio_postgres=warn,refinery_core=warn"
"#,
            url = self.db.url(),
            port = self.sshd.addr.port(),
            dir = self.dir.path().display(),
            agent = shepherd_sim::bin("takeover-agent").display(),
            sshd_dir = self.sshd.dir().display(),
        )
    }

    fn equinix_config(&self, sim: &Sim) -> String {
        format!(
            r#"{}
[equinix]
api_url = "http://{}/metal/v1"
project_id = "{PROJECT}"
api_key = {{ env = "SIM_TOKEN" }}
api_interval = "2ms"
retry_initial = "20ms"
retry_max = "300ms"
per_page = 10

[provider]
kind = "equinix"

[provider.equinix]
metro = "sv"
reservation_cache_ttl = "1s"
failed_reservation_penalty = "2s"
"#,
            self.base_config(),
            sim.addr
        )
    }

    fn write_config(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn shepherd(&self, config: &Path, log: &str) -> Shepherd {
        let log_path = self.dir.path().join(log);
        let child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .arg("--config")
            .arg(config)
            .arg("run")
            .env_remove("RUST_LOG")
            .env("SIM_TOKEN", TOKEN)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap();
        Shepherd {
            child,
            log: log_path,
        }
    }

    async fn count(&self, sql: &'static str) -> i64 {
        shepherd_sim::testing::count(&self.bmdb, sql).await
    }

    async fn wait_for(
        &self,
        what: &str,
        sql: &'static str,
        want: i64,
        timeout: Duration,
        s: &mut Shepherd,
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.count(sql).await;
            if n == want {
                return;
            }
            if let Some(status) = s.child.try_wait().unwrap() {
                panic!(
                    "shepherd exited ({status}) while waiting for {what}:\n{}",
                    s.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} ({n}, want {want}):\n{}",
                s.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

struct Shepherd {
    child: Child,
    log: PathBuf,
}

impl Shepherd {
    fn log_text(&self) -> String {
        let t = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// The admin server's URL, where the log says it is.
    fn admin_url(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap();
        log.lines()
            .find_map(|l| l.split("admin server: ").nth(1))
            .expect("the admin URL is logged")
            .trim()
            .to_string()
    }

    /// GET a path of the admin server: status and body.
    async fn admin_get(&self, path: &str) -> (u16, String) {
        let mut r = awc::Client::default()
            .get(format!("{}{path}", self.admin_url()))
            .send()
            .await
            .unwrap();
        let body = r.body().limit(16 << 20).await.unwrap();
        (
            r.status().as_u16(),
            String::from_utf8_lossy(&body).into_owned(),
        )
    }

    /// SIGTERM, then an orderly exit 0.
    async fn terminate(&mut self) {
        self.signal(Signal::SIGTERM);
        let (code, _) = self.exit(Duration::from_secs(20)).await;
        assert_eq!(code, Some(0), "{}", self.log_text());
    }

    /// Waits for the process to exit; its exit code and how long it took.
    async fn exit(&mut self, timeout: Duration) -> (Option<i32>, Duration) {
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return (s.code(), t.elapsed());
            }
            assert!(
                t.elapsed() < timeout,
                "shepherd did not exit within {timeout:?}:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Shepherd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Sim {
    addr: SocketAddr,
    child: Child,
}

impl Sim {
    fn start(reservations: usize, extra: &[&str]) -> Sim {
        let addr = SocketAddr::new([127, 0, 0, 1].into(), Sshd::free_port());
        let child = Command::new(shepherd_sim::bin("equinix-sim"))
            .args([
                "--listen",
                &addr.to_string(),
                "--reservations",
                &reservations.to_string(),
            ])
            .args([
                "--project-id",
                PROJECT,
                "--token",
                TOKEN,
                "--provisioning-delay",
                "300ms",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
            assert!(Instant::now() < deadline, "equinix-sim did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        Sim { addr, child }
    }

    async fn stats(&self) -> serde_json::Value {
        let mut r = awc::Client::default()
            .get(format!("http://{}/_sim/stats", self.addr))
            .send()
            .await
            .unwrap();
        serde_json::from_slice(&r.body().limit(64 << 20).await.unwrap()).unwrap()
    }

    /// Devices of the project, and how many distinct reservations they use.
    /// Asked until answered: the simulator may be injecting faults.
    async fn devices(&self) -> (usize, usize) {
        let v: serde_json::Value = loop {
            let mut r = awc::Client::default()
                .get(format!(
                    "http://{}/metal/v1/projects/{PROJECT}/devices?per_page=1000",
                    self.addr
                ))
                .insert_header(("X-Auth-Token", TOKEN))
                .send()
                .await
                .unwrap();
            let Ok(body) = r.body().limit(64 << 20).await else {
                continue;
            };
            if r.status().is_success()
                && let Ok(v) = serde_json::from_slice(&body)
            {
                break v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let devices = v["devices"].as_array().unwrap();
        let reservations: std::collections::BTreeSet<&str> = devices
            .iter()
            .filter_map(|d| d["hardware_reservation"]["id"].as_str())
            .collect();
        (devices.len(), reservations.len())
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const AGENTS: &str = "SELECT count(*) FROM machine_agent_started";
const MACHINES: &str = "SELECT count(*) FROM machines";
const WORK: &str = "SELECT count(*) FROM work";
const SESSIONS: &str = "SELECT count(*) FROM sessions";

fn inventory(hosts: impl Iterator<Item = usize>) -> String {
    hosts.map(|i| format!("[[machines]]\nid = \"host-{i:02}\"\naddress = \"127.0.0.1\"\nlocation = \"rack-1\"\n\n")).collect()
}

/// Runs `shepherd-demo` with `args` in `dir` (admin page on a free port):
/// its stdout, once it exited 0.
async fn run_demo(dir: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(shepherd_sim::bin("shepherd-demo"));
    cmd.args(args)
        .args(["--admin-listen", "127.0.0.1:0"])
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

async fn machine_of(rig: &Rig, provider_id: &str) -> uuid::Uuid {
    let provider_id = provider_id.to_string();
    rig.bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT machine_id FROM machine_provided WHERE provider_id = $1",
                    &[&provider_id],
                )
                .await?
                .get(0))
        })
        .await
        .unwrap()
}

fn base64_encode(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

const ALICE: &str = "alice-token-0123456789";

/// POST an action to the admin API as `token`: status and JSON body.
async fn act(
    s: &Shepherd,
    machine: uuid::Uuid,
    action: &str,
    token: Option<&str>,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let mut req = awc::Client::default().post(format!(
        "{}/api/v1/machines/{machine}/{action}",
        s.admin_url().trim_end_matches('/')
    ));
    if let Some(t) = token {
        req = req.insert_header(("Authorization", format!("Bearer {t}")));
    }
    let mut r = req.send_json(&body).await.unwrap();
    let body = r.body().await.unwrap();
    (
        r.status().as_u16(),
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    )
}

/// `shepherd --config <config> machines <args>`: exit code, stdout, stderr.
fn machines_cli(config: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("--config")
        .arg(config)
        .arg("machines")
        .args(args)
        .env("SIM_TOKEN", TOKEN)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

impl Rig {
    /// Backs `machine` off for `process` for an hour, as a failure would.
    async fn back_off(&self, machine: uuid::Uuid, process: &str, cause: &str) {
        self.bmdb
            .transact(async |tx| {
                tx.execute(
                    "INSERT INTO work_backoff (machine_id, process, until, cause) \
                     VALUES ($1, $2::text::process, now() + interval '1 hour', $3)",
                    &[&machine, &process, &cause],
                )
                .await
            })
            .await
            .unwrap();
    }

    /// A device's recorded (provider status, address).
    async fn provider_record(&self, provider_id: &str) -> (String, String) {
        self.bmdb
            .transact(async |tx| {
                let r = tx
                    .query_one(
                        "SELECT provider_status::text, provider_ip_address FROM machine_provided WHERE provider_id = $1",
                        &[&provider_id],
                    )
                    .await?;
                Ok((r.get(0), r.get(1)))
            })
            .await
            .unwrap()
    }

    /// (machine ID, provider ID) of every provided machine, by provider ID.
    async fn provided(&self) -> Vec<(uuid::Uuid, String)> {
        self.bmdb
            .transact(async |tx| {
                Ok(tx
                    .query(
                        "SELECT machine_id, provider_id FROM machine_provided ORDER BY provider_id",
                        &[],
                    )
                    .await?
                    .iter()
                    .map(|r| (r.get(0), r.get(1)))
                    .collect())
            })
            .await
            .unwrap()
    }

    async fn count_for(&self, sql: &'static str, machine: uuid::Uuid) -> i64 {
        self.bmdb
            .transact(async |tx| Ok(tx.query_one(sql, &[&machine]).await?.get(0)))
            .await
            .unwrap()
    }

    /// Waits until `sql` (with the machine as $1) counts `want`.
    async fn wait_for_machine(
        &self,
        what: &str,
        sql: &'static str,
        machine: uuid::Uuid,
        want: i64,
        s: &Shepherd,
    ) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let n = self.count_for(sql, machine).await;
            if n == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {n}, not {want}\n{}",
                s.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

const TAKEOVERS_OF: &str = "SELECT count(*) FROM work_history WHERE machine_id = $1 \
     AND process = 'ShepherdAgentStart' AND event = 'Finished'";
const RECOVERIES_OF: &str = "SELECT count(*) FROM work_history WHERE machine_id = $1 \
     AND process = 'ShepherdRecovery' AND event = 'Finished'";
const AGENT_OF: &str = "SELECT count(*) FROM machine_agent_started WHERE machine_id = $1";
