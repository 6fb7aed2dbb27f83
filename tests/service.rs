//! `shepherd run` as an operator runs it: the real binary as a process,
//! with PostgreSQL, equinix-sim (a process too), OpenSSH's sshd and the
//! takeover-agent.

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
        self.bmdb
            .transact(async |tx| {
                Ok(tx
                    .query(
                        "SELECT event::text || coalesce(': ' || failed_cause, ''), count(*) \
                         FROM work_history GROUP BY 1",
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
            if r.status().is_success() {
                if let Ok(v) = serde_json::from_slice(&body) {
                    break v;
                }
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

#[actix_rt::test]
async fn thirty_reservations_become_thirty_taken_over_devices_and_sigterm_drains() {
    let rig = Rig::new().await;
    let sim = Sim::start(30, &[]);
    let config = rig.write_config("shepherd.toml", &rig.equinix_config(&sim));
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("30 agents", AGENTS, 30, Duration::from_secs(120), &mut s)
        .await;
    assert_eq!(sim.devices().await, (30, 30), "one device per reservation");
    assert_eq!(rig.count(MACHINES).await, 30);
    // shepherd's key was ensured in the project, once.
    let stats = sim.stats().await;
    assert_eq!(stats["requests"]["create_ssh_key"], 1);
    let url = s.admin_url();
    let mut r = awc::Client::default()
        .get(format!("{url}readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.body().await);
    let mut r = awc::Client::default()
        .get(format!("{url}metrics"))
        .send()
        .await
        .unwrap();
    let metrics = String::from_utf8_lossy(&r.body().await.unwrap()).into_owned();
    assert!(
        metrics.contains("shepherd_machines{state=\"agent-started\"} 30"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "shepherd_leases_total{process=\"ShepherdAgentStart\",event=\"finished\"} 30"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "shepherd_equinix_requests_total{operation=\"create_device\",status=\"201\"}"
        ),
        "{metrics}"
    );

    s.signal(Signal::SIGTERM);
    let (code, took) = s.exit(Duration::from_secs(20)).await;
    assert_eq!(code, Some(0), "{}", s.log_text());
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert_eq!(rig.count(WORK).await, 0);
    assert_eq!(rig.count(SESSIONS).await, 0);
}

#[actix_rt::test]
async fn sigkill_mid_run_then_restart_leaves_no_orphan_or_double() {
    let rig = Rig::new().await;
    let sim = Sim::start(30, &[]);
    let mut text = rig.equinix_config(&sim);
    text = text.replace(
        "creation_interval = \"0s\"",
        "creation_interval = \"150ms\"",
    );
    let config = rig.write_config("shepherd.toml", &text);
    let mut first = rig.shepherd(&config, "first.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    while sim.devices().await.0 < 8 {
        assert!(
            Instant::now() < deadline,
            "no devices created:\n{}",
            first.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.signal(Signal::SIGKILL);
    first.exit(Duration::from_secs(10)).await;
    let mut second = rig.shepherd(&config, "second.log");
    rig.wait_for(
        "30 agents",
        AGENTS,
        30,
        Duration::from_secs(120),
        &mut second,
    )
    .await;
    assert_eq!(sim.devices().await, (30, 30), "orphaned or doubled devices");
    assert_eq!(rig.count(MACHINES).await, 30);
    second.signal(Signal::SIGTERM);
    assert_eq!(second.exit(Duration::from_secs(20)).await.0, Some(0));
}

#[actix_rt::test]
async fn api_faults_do_not_change_the_end_state() {
    let rig = Rig::new().await;
    let sim = Sim::start(
        30,
        &[
            "--error-rate",
            "0.1",
            "--lost-rate",
            "0.2",
            "--rate-limit-rate",
            "0.05",
            "--retry-after",
            "1",
        ],
    );
    let config = rig.write_config("shepherd.toml", &rig.equinix_config(&sim));
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("30 agents", AGENTS, 30, Duration::from_secs(180), &mut s)
        .await;
    assert_eq!(sim.devices().await, (30, 30));
    let stats = sim.stats().await;
    let statuses = &stats["statuses"];
    for code in ["500", "503", "429"] {
        assert!(
            statuses[code].as_u64().unwrap_or(0) > 0,
            "no {code} was injected: {statuses}"
        );
    }
    s.signal(Signal::SIGTERM);
    assert_eq!(s.exit(Duration::from_secs(20)).await.0, Some(0));
}

fn inventory(hosts: impl Iterator<Item = usize>) -> String {
    hosts.map(|i| format!("[[machines]]\nid = \"host-{i:02}\"\naddress = \"127.0.0.1\"\nlocation = \"rack-1\"\n\n")).collect()
}

#[actix_rt::test]
async fn a_static_inventory_is_taken_over_survives_a_lost_session_and_reports_a_removed_host() {
    let rig = Rig::new().await;
    let inventory_file = rig.dir.path().join("inventory.toml");
    std::fs::write(&inventory_file, inventory(1..=20)).unwrap();
    let text = format!(
        "{}\n[provider]\nkind = \"static\"\n\n[provider.inventory]\nfile = \"{}\"\n",
        rig.base_config(),
        inventory_file.display()
    );
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("20 agents", AGENTS, 20, Duration::from_secs(90), &mut s)
        .await;

    // The fleet through the CLI.
    let cli = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .arg("--config")
            .arg(&config)
            .args(args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let list = cli(&["machines", "list", "--state", "agent-started"]);
    for i in 1..=20 {
        assert!(
            list.contains(&format!("host-{i:02}")),
            "host-{i:02} missing:\n{list}"
        );
    }
    assert!(
        list.contains("20 shown of 20 matching; fleet: agent-started 20"),
        "{list}"
    );
    assert!(cli(&["machines", "list", "--state", "pending"]).contains("0 shown"));
    let id = list
        .lines()
        .find(|l| l.contains("host-01"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let show = cli(&["machines", "show", &id]);
    for want in [
        "state     agent-started",
        "provided         None host-01 address 127.0.0.1 location rack-1",
        "agent started    ",
        "ShepherdAgentStart Started",
        "ShepherdAgentStart Finished",
        "ssh host key     ssh-ed25519",
    ] {
        assert!(show.contains(want), "{want:?} missing:\n{show}");
    }

    // The session dies under shepherd: a new one is opened, work goes on.
    let old: uuid::Uuid = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one("SELECT session_id FROM sessions", &[])
                .await?
                .get(0))
        })
        .await
        .unwrap();
    rig.bmdb
        .transact(async |tx| {
            tx.execute(
                "UPDATE sessions SET session_deadline = now() - interval '1 second'",
                &[],
            )
            .await
        })
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let live: Vec<uuid::Uuid> = rig
            .bmdb
            .transact(async |tx| {
                let rows = tx
                    .query(
                        "SELECT session_id FROM sessions WHERE session_deadline > now()",
                        &[],
                    )
                    .await?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            })
            .await
            .unwrap();
        if live.len() == 1 && live[0] != old {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no new session:\n{}",
            s.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::fs::write(&inventory_file, inventory(1..=21)).unwrap();
    rig.wait_for(
        "host-21 under the new session",
        AGENTS,
        21,
        Duration::from_secs(30),
        &mut s,
    )
    .await;

    std::fs::write(&inventory_file, inventory((1..=21).filter(|i| *i != 7))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = std::fs::read_to_string(&s.log).unwrap();
        if log
            .lines()
            .any(|l| l.contains("host-07") && l.contains("no longer lists it"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the removed host was not reported:\n{}",
            s.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        rig.count(MACHINES).await,
        21,
        "a removed host must not be deleted"
    );
    assert_eq!(rig.count(AGENTS).await, 21);
    s.signal(Signal::SIGTERM);
    assert_eq!(s.exit(Duration::from_secs(20)).await.0, Some(0));
}

#[actix_rt::test]
async fn sigterm_lets_running_takeovers_finish_within_the_drain_timeout() {
    let rig = Rig::new().await;
    std::fs::write(rig.sshd.dir().join("takeover-agent.mode"), "slow:3").unwrap();
    let text = format!(
        "{}\n[provider]\nkind = \"static\"\n\n[provider.inventory]\nmachines = [{}]\n",
        rig.base_config(),
        (1..=4)
            .map(|i| format!("{{ id = \"slow-{i}\", address = \"127.0.0.1\" }}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for(
        "4 takeovers under way",
        WORK,
        4,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    s.signal(Signal::SIGTERM);
    let (code, took) = s.exit(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "{}", s.log_text());
    assert!(took < Duration::from_secs(15), "drain took {took:?}");
    // They finished rather than being cut off.
    assert_eq!(rig.count(AGENTS).await, 4, "{}", s.log_text());
    assert_eq!(rig.count(WORK).await, 0);
    assert_eq!(rig.count(SESSIONS).await, 0);
}

#[actix_rt::test]
async fn bad_configuration_exits_2_naming_the_key() {
    let rig = Rig::new().await;
    let missing_project = rig.write_config(
        "bad1.toml",
        &format!(
            "{}\n[provider]\nkind = \"equinix\"\n[provider.equinix]\nmetro = \"sv\"\n",
            rig.base_config()
        ),
    );
    let o = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("--config")
        .arg(&missing_project)
        .arg("run")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("equinix.project_id"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    let missing_agent = rig.write_config(
        "bad2.toml",
        &rig.base_config().replace(
            &*shepherd_sim::bin("takeover-agent").to_string_lossy(),
            "/nonexistent/agent",
        ),
    );
    let o = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("--config")
        .arg(&missing_agent)
        .arg("run")
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("initializer.agent_binary"));

    // The provider refuses the key at start: a configuration error too.
    let sim = Sim::start(1, &[]);
    let wrong_key = rig.write_config("bad3.toml", &rig.equinix_config(&sim));
    let o = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("--config")
        .arg(&wrong_key)
        .arg("run")
        .env("SIM_TOKEN", "not-the-token-4f9e")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("equinix.api_key"), "{stderr}");
    assert!(stderr.contains("401"), "{stderr}");
    assert!(!stderr.contains("not-the-token-4f9e"), "{stderr}");

    // A project ID that is not one.
    let bad_project = rig.write_config(
        "bad4.toml",
        &rig.equinix_config(&sim).replace(PROJECT, "my-project"),
    );
    let o = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("--config")
        .arg(&bad_project)
        .arg("check-config")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("equinix.project_id"), "{stderr}");
}

#[actix_rt::test]
async fn a_machine_gone_quiet_is_rebooted_and_taken_over_again() {
    let rig = Rig::new().await;
    let sim = Sim::start(3, &["--reboot-delay", "1s"]);
    let text = rig.equinix_config(&sim)
        + "\n[recoverer]\nsilent_after_start = \"1h\"\nheartbeat_stale_after = \"30s\"\npoll_interval = \"200ms\"\n\
           reboot_poll = \"100ms\"\nreboot_settle = \"3s\"\ncallback_grace = \"1s\"\n\
           agent_restart_wait = \"2s\"\nagent_return_wait = \"1s\"\n";
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("3 agents", AGENTS, 3, Duration::from_secs(60), &mut s)
        .await;
    // The agents report in (the BMDB server's part), then one goes quiet.
    let quiet: uuid::Uuid = rig
        .bmdb
        .transact(async |tx| {
            tx.execute("INSERT INTO machine_agent_heartbeat SELECT machine_id, now() FROM machine_agent_started", &[])
                .await?;
            let r = tx
                .query_one(
                    "UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() - interval '1 minute' \
                     WHERE machine_id = (SELECT machine_id FROM machine_agent_heartbeat ORDER BY machine_id LIMIT 1) RETURNING machine_id",
                    &[],
                )
                .await?;
            Ok(r.get(0))
        })
        .await
        .unwrap();
    let device: String = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT provider_id FROM machine_provided WHERE machine_id = $1",
                    &[&quiet],
                )
                .await?
                .get(0))
        })
        .await
        .unwrap();
    // The others keep reporting in while the quiet one is recovered.
    let keep = {
        let bmdb = rig.bmdb.clone();
        actix_rt::spawn(async move {
            loop {
                let _ = bmdb
                    .transact(async |tx| {
                        tx.execute(
                            "UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() WHERE machine_id <> $1",
                            &[&quiet],
                        )
                        .await
                    })
                    .await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    rig.wait_for_recovery(quiet, &s).await;
    keep.abort();
    let stats = sim.stats().await;
    assert_eq!(stats["reboots"][device.as_str()], 1, "{}", stats["reboots"]);
    assert_eq!(
        stats["reboots"].as_object().unwrap().len(),
        1,
        "only the quiet machine is rebooted"
    );
    // Taken over anew: agent started again, the stale heartbeat gone.
    assert_eq!(rig.count(AGENTS).await, 3);
    assert_eq!(
        rig.count("SELECT count(*) FROM machine_agent_heartbeat")
            .await,
        2
    );
    s.signal(Signal::SIGTERM);
    assert_eq!(s.exit(Duration::from_secs(20)).await.0, Some(0));
}

#[actix_rt::test]
async fn the_updater_brings_provider_changes_in_and_leaves_the_rest_alone() {
    let rig = Rig::new().await;
    let sim = Sim::start(3, &[]);
    let text = rig.equinix_config(&sim) + "\n[updater]\ninterval = \"500ms\"\n";
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("3 agents", AGENTS, 3, Duration::from_secs(60), &mut s)
        .await;
    rig.wait_for(
        "3 devices running in the BMDB",
        "SELECT count(*) FROM machine_provided WHERE provider_status = 'Running'",
        3,
        Duration::from_secs(20),
        &mut s,
    )
    .await;
    let versions = async || -> Vec<(String, String)> {
        rig.bmdb
            .transact(async |tx| {
                let rows = tx
                    .query(
                        "SELECT provider_id, xmin::text FROM machine_provided ORDER BY provider_id",
                        &[],
                    )
                    .await?;
                Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
            })
            .await
            .unwrap()
    };
    let before = versions().await;
    let changed = before[0].0.clone();
    let mut r = awc::Client::default()
        .patch(format!("http://{}/_sim/devices/{changed}", sim.addr))
        .send_json(&serde_json::json!({"state": "inactive", "address": "127.0.0.9"}))
        .await
        .unwrap();
    assert!(r.status().is_success(), "{:?}", r.body().await);
    let t = Instant::now();
    loop {
        let (status, address) = rig.provider_record(&changed).await;
        if status == "Stopped" && address == "127.0.0.9" {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "not updated within a period: {status} {address}\n{}",
            s.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1600)).await; // three more rounds
    let after = versions().await;
    assert_ne!(after[0], before[0]);
    assert_eq!(after[1..], before[1..], "unchanged machines were written");
    s.signal(Signal::SIGTERM);
    assert_eq!(s.exit(Duration::from_secs(20)).await.0, Some(0));
}

#[actix_rt::test]
async fn the_demo_takes_twenty_machines_over_from_a_0700_directory_and_recovers_those_it_silences()
{
    use std::os::unix::fs::PermissionsExt;
    // Where a newcomer clones: a directory only its owner may enter (as
    // root, the embedded PostgreSQL runs as `postgres`, which may not).
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let stdout = run_demo(
        dir.path(),
        &[
            "--machines",
            "20",
            "--timeout",
            "2m",
            "--hold",
            "5s",
            "--silence",
            "2",
        ],
    )
    .await;
    assert!(
        stdout.contains("all 20 machines taken over in") && stdout.contains("and heartbeating"),
        "{stdout}"
    );
    assert!(stdout.contains("held 5s: no machine recovered"), "{stdout}");
    // The two silenced are the two recovered, and no other.
    let silenced: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("silenced the agent of machine "))
        .collect();
    assert_eq!(silenced.len(), 2, "{stdout}");
    for s in &silenced {
        let id = s.split_whitespace().next().unwrap();
        assert!(
            stdout
                .lines()
                .any(|l| l.contains(&format!("machine {id} ("))
                    && l.contains(" recovered: agent restarted over SSH")),
            "{id} not shown recovered:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("all 2 silenced machines recovered and heartbeating again in")
            && stdout.contains("; 0 other machines recovered"),
        "{stdout}"
    );
    assert!(
        stdout.contains("admin page               http://127.0.0.1:"),
        "{stdout}"
    );
    // Every simulated machine ran the agent it was given.
    for i in 1..=20 {
        let runs = dir
            .path()
            .join(format!("var/demo/machines/127.0.1.{i}/root/agent.runs"));
        assert!(runs.is_file(), "{}", runs.display());
    }
    let bmdb = dir.path().join("var/demo/bmdb");
    if nix::unistd::Uid::effective().is_root() {
        // Its data went where `postgres` can reach it, linked from var/demo.
        let target = std::fs::read_link(&bmdb).expect("var/demo/bmdb is a link");
        assert!(
            target.starts_with(shepherd::bmdb::embedded::RELOCATED_BASE),
            "{}",
            target.display()
        );
        assert!(target.join("PG_VERSION").is_file());
    }
    shepherd::bmdb::embedded::remove_data_dir(&bmdb).unwrap();
}

// ---- the BMDB under faults: a PostgreSQL of the test's own, restarted ----

#[actix_rt::test]
async fn a_sub_second_database_restart_keeps_the_session_and_the_takeovers() {
    let mut rig = Rig::with_own_postgres().await;
    let mut s = rig.run_inventory(6, "session_interval = \"5s\"", "slow:3");
    rig.wait_for(
        "6 takeovers under way",
        WORK,
        6,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    // Under way means on the machines: every agent started (a lease whose
    // worker had not yet read the machine's host key is given back
    // untouched when the database is away, and taken again).
    let t = Instant::now();
    while rig.agent_runs().len() < 6 {
        assert!(t.elapsed() < Duration::from_secs(30), "{}", s.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = rig.sessions_alive().await;
    assert_eq!(before.len(), 1);
    let t = Instant::now();
    rig.db.own().stop();
    rig.db.own().start_again().await;
    let restart = t.elapsed();
    assert!(
        restart < Duration::from_secs(1),
        "the restart took {restart:?}"
    );
    rig.wait_for(
        "6 agents started",
        AGENTS,
        6,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    assert_eq!(rig.count(WORK).await, 0, "{}", s.log_text());
    assert_eq!(
        rig.sessions_alive().await,
        before,
        "the session must survive a {restart:?} restart:\n{}",
        s.log_text()
    );
    let events = rig.history_events().await;
    assert_eq!(
        events,
        [("Finished".to_string(), 6), ("Started".to_string(), 6)].into(),
        "no takeover aborted, failed or redone"
    );
    assert_eq!(rig.agent_runs(), vec![1; 6], "each agent ran once");
    s.terminate().await;
}

#[actix_rt::test]
async fn an_outage_during_takeovers_leaves_no_lease_without_a_worker() {
    let mut rig = Rig::with_own_postgres().await;
    // The agents finish while the database is away: their results wait.
    let mut s = rig.run_inventory(
        6,
        "session_interval = \"30s\"\nacquire_timeout = \"1s\"\nconnect_timeout = \"1s\"",
        "slow:2",
    );
    rig.wait_for(
        "6 takeovers under way",
        WORK,
        6,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    let before = rig.sessions_alive().await;
    rig.db.own().stop();
    tokio::time::sleep(Duration::from_secs(8)).await;
    rig.db.own().start_again().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Every takeover ended during the outage: no lease may be left.
    assert_eq!(
        rig.count(WORK).await,
        0,
        "leases left 5 s after the database came back:\n{}",
        s.log_text()
    );
    assert_eq!(rig.count(AGENTS).await, 6, "{}", s.log_text());
    assert_eq!(rig.sessions_alive().await, before, "{}", s.log_text());
    // Each machine finished once; none failed (a takeover that only began
    // as the database went away is given back, not backed off).
    let events = rig.history_events().await;
    assert_eq!(events.get("Finished"), Some(&6), "{events:?}");
    assert!(
        events.keys().all(|e| !e.starts_with("Failed")),
        "{events:?}\n{}",
        s.log_text()
    );
    assert_eq!(rig.agent_runs(), vec![1; 6], "each agent ran once");
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(log.contains("retrying until it is recorded"), "{log}");
    assert!(!log.contains("takeover failed"), "{log}");
    s.terminate().await;
}

#[actix_rt::test]
async fn after_a_long_outage_a_new_session_comes_within_seconds() {
    let mut rig = Rig::with_own_postgres().await;
    let mut s = rig.run_inventory(2, "session_interval = \"5s\"", "ok");
    rig.wait_for(
        "2 agents started",
        AGENTS,
        2,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    let before = rig.sessions_alive().await;
    assert_eq!(before.len(), 1);
    rig.db.own().stop();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "shepherd must ride out the outage"
    );
    rig.db.own().start_again().await;
    let back = Instant::now();
    let deadline = back + Duration::from_secs(20);
    let after = loop {
        let alive = rig.sessions_alive().await;
        if !alive.is_empty() && alive != before {
            break alive;
        }
        assert!(
            Instant::now() < deadline,
            "no new session:\n{}",
            s.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = back.elapsed();
    println!("new session {took:?} after the database came back");
    assert!(
        took < Duration::from_secs(5),
        "the new session came {took:?} after the database:\n{}",
        s.log_text()
    );
    assert_eq!(after.len(), 1);
    // And it works under it: machines whose agent tag is dropped are taken
    // over again.
    rig.bmdb
        .transact(async |tx| {
            tx.execute("DELETE FROM machine_agent_started", &[]).await?;
            Ok(())
        })
        .await
        .unwrap();
    rig.wait_for(
        "2 agents started again",
        AGENTS,
        2,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    s.terminate().await;
}

// ---- bad input and small faults ----

#[actix_rt::test]
async fn a_bad_inventory_file_adopts_the_good_hosts_and_reports_each_bad_one_once() {
    let rig = Rig::new().await;
    let file = rig.dir.path().join("inventory.toml");
    let long = "y".repeat(200);
    std::fs::write(
        &file,
        format!(
            "[[machines]]\nid = \"good-1\"\naddress = \"127.0.0.1\"\n\n\
             [[machines]]\nid = \"{long}\"\naddress = \"127.0.0.1\"\n\n\
             [[machines]]\nid = \"\"\naddress = \"127.0.0.1\"\n\n\
             [[machines]]\nid = \"bad-address\"\naddress = \"127.0.0.300\"\n\n\
             [[machines]]\nid = \"good-2\"\naddress = \"127.0.0.1\"\n"
        ),
    )
    .unwrap();
    let text = format!(
        "{}\n[provider]\nkind = \"static\"\n\n[provider.inventory]\nfile = \"{}\"\n",
        rig.base_config(),
        file.display()
    );
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for(
        "the 2 good hosts taken over",
        AGENTS,
        2,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    // Several more rounds (every 500 ms): still reported once each.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rig.count(MACHINES).await, 2);
    let log = std::fs::read_to_string(&s.log).unwrap();
    let f = file.display();
    for problem in [
        format!("{f}:5: machines[1]: id is 200 characters long"),
        format!("{f}:9: machines[2]: id is empty"),
        format!("{f}:13: host bad-address: address \"127.0.0.300\" is not an IP address"),
    ] {
        assert_eq!(
            log.matches(problem.as_str()).count(),
            1,
            "{problem} must be reported once:\n{log}"
        );
    }
    assert!(!log.contains("provisioning round failed"), "{log}");
    s.terminate().await;
}

#[actix_rt::test]
async fn two_shepherds_share_forty_reservations_and_one_of_them_provisions() {
    let rig = Rig::new().await;
    let sim = Sim::start(40, &[]);
    let config = rig.write_config("shepherd.toml", &rig.equinix_config(&sim));
    let mut a = rig.shepherd(&config, "a.log");
    let _b = rig.shepherd(&config, "b.log");
    rig.wait_for("40 machines", MACHINES, 40, Duration::from_secs(60), &mut a)
        .await;
    // A little longer: nothing more may be created.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sim.devices().await, (40, 40), "one device per reservation");
    // Provisioning is a fleet duty: one shepherd creates, the other stands
    // by, so no create races another and each device costs one request.
    let stats = sim.stats().await;
    let creates = stats["requests"]["create_device"].as_u64().unwrap();
    let lookups = stats["requests"]["get_reservation"].as_u64().unwrap_or(0);
    assert_eq!(
        (creates, lookups),
        (40, 0),
        "creates and look-ups for 40 devices: {}",
        stats["statuses"]
    );
}

// ---- the whole life cycle: resident agents call back ----

#[actix_rt::test]
async fn heartbeating_machines_are_kept_and_a_killed_agent_is_restarted_over_ssh_without_a_reboot()
{
    let rig = Rig::new().await;
    let sim = Sim::start(2, &["--reboot-delay", "1s"]);
    let text = rig.calling(rig.equinix_config(&sim))
        + "\n[recoverer]\nsilent_after_start = \"3s\"\nheartbeat_stale_after = \"3s\"\npoll_interval = \"200ms\"\n\
           reboot_poll = \"100ms\"\nreboot_settle = \"2s\"\ncallback_grace = \"1s\"\n";
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("2 agents", AGENTS, 2, Duration::from_secs(60), &mut s)
        .await;
    const FRESH: &str = "SELECT count(*) FROM machine_agent_heartbeat \
                         WHERE agent_heartbeat_at > now() - interval '2 seconds'";
    rig.wait_for("2 heartbeating", FRESH, 2, Duration::from_secs(30), &mut s)
        .await;
    // Well past the thresholds: heartbeating machines are left alone.
    tokio::time::sleep(Duration::from_secs(12)).await;
    const RECOVERIES: &str = "SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery'";
    assert_eq!(rig.count(RECOVERIES).await, 0, "{}", s.log_text());
    assert_eq!(rig.count(FRESH).await, 2, "{}", s.log_text());
    assert_eq!(
        rig.count("SELECT count(*) FROM machine_hardware_report")
            .await,
        2,
        "each agent sent its hardware report"
    );
    // Operators see it: /metrics, the JSON API, `machines show`.
    let (_, metrics) = s.admin_get("metrics").await;
    let heartbeats = |result: &str| {
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "shepherd_heartbeats_total{{result=\"{result}\"}} "
                ))
            })
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(-1.0)
    };
    assert!(heartbeats("accepted") >= 20.0, "{metrics}");
    // An agent calls as soon as it has answered, which may be before its
    // key is recorded: at most its first call is refused.
    assert!(heartbeats("unauthenticated") <= 2.0, "{metrics}");
    for refused in ["no_certificate", "invalid", "unavailable"] {
        assert_eq!(heartbeats(refused), 0.0, "{refused}: {metrics}");
    }
    assert!(
        metrics.contains("shepherd_heartbeat_batch_size_count"),
        "{metrics}"
    );
    let some: uuid::Uuid = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT machine_id FROM machine_hardware_report LIMIT 1",
                    &[],
                )
                .await?
                .get(0))
        })
        .await
        .unwrap();
    let (status, body) = s.admin_get(&format!("api/v1/machines/{some}")).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let hw = &v["tags"]["hardware_report"];
    assert!(hw["memory_bytes"].as_i64().unwrap_or(0) > 0, "{v}");
    assert!(!hw["cpus"].as_array().unwrap().is_empty(), "{v}");
    let show = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("--config")
        .arg(&config)
        .args(["machines", "show", &some.to_string()])
        .env("SIM_TOKEN", TOKEN)
        .output()
        .unwrap();
    let (show, err) = (
        String::from_utf8_lossy(&show.stdout),
        String::from_utf8_lossy(&show.stderr),
    );
    assert!(
        show.contains("hardware report") && show.contains("memory"),
        "{show}{err}"
    );
    assert!(show.contains("cpu   "), "{show}");

    // One agent dies.
    let (quiet, device): (uuid::Uuid, String) = rig
        .bmdb
        .transact(async |tx| {
            let r = tx
                .query_one(
                    "SELECT machine_id, provider_id FROM machine_provided ORDER BY machine_id LIMIT 1",
                    &[],
                )
                .await?;
            Ok((r.get(0), r.get(1)))
        })
        .await
        .unwrap();
    let pid_file = rig.sshd.dir().join(format!("agent-{quiet}.pid"));
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();

    // Recovered in one step, with no new takeover.
    rig.wait_for_history(
        quiet,
        &[
            "ShepherdAgentStart Started",
            "ShepherdAgentStart Finished",
            "ShepherdRecovery Started",
            "ShepherdRecovery Finished",
        ],
        &s,
    )
    .await;
    // Heartbeating again, from its new agent.
    rig.wait_for(
        "2 heartbeating again",
        FRESH,
        2,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    let new_pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(new_pid, pid);
    // Its SSH answered: the agent was restarted in place, no power action.
    let stats = sim.stats().await;
    assert_eq!(
        stats["reboots"].as_object().map(|m| m.len()).unwrap_or(0),
        0,
        "no machine is rebooted ({device}): {}",
        stats["reboots"]
    );
    assert_eq!(
        rig.count(RECOVERIES).await,
        2,
        "one recovery: Started, Finished"
    );
    assert_eq!(
        rig.count(
            "SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery' \
                   AND event = 'Finished' AND detail LIKE 'agent restarted over SSH%'"
        )
        .await,
        1,
        "the history says how"
    );
    s.terminate().await;
}

// ---- owned hardware: BMCs on OpenStack's Redfish emulator ----

#[actix_rt::test]
async fn owned_hardware_a_silent_machine_is_rebooted_through_its_bmc_and_a_wrong_password_backs_off()
 {
    use shepherd_sim::testing::Sushy;
    let rig = Rig::new().await;
    let password = "bmc-secret-51d2a9";
    // Two BMCs: node-1's credentials are right, node-2's configured
    // password is not the emulator's.
    let good = Sushy::start(&["node-1"], "admin", password);
    let other = Sushy::start(&["node-2"], "admin", password);
    let secret = rig.dir.path().join("bmc-password");
    std::fs::write(&secret, format!("{password}\n")).unwrap();
    let wrong = rig.dir.path().join("wrong-password");
    std::fs::write(&wrong, "wrong-password-e07c\n").unwrap();
    let text = format!(
        "{}\n[provider]\nkind = \"static\"\n\n[provider.inventory]\nmachines = [\n\
         {{ id = \"node-1\", address = \"127.0.0.1\", bmc = {{ url = \"{}\", username = \"admin\", password = {{ file = \"{}\" }}, system = \"{}\" }} }},\n\
         {{ id = \"node-2\", address = \"127.0.0.1\", bmc = {{ url = \"{}\", username = \"admin\", password = {{ file = \"{}\" }} }} }},\n]\n\
         \n[recoverer]\nsilent_after_start = \"3s\"\nheartbeat_stale_after = \"3s\"\npoll_interval = \"200ms\"\n\
         reboot_poll = \"200ms\"\nreboot_settle = \"20s\"\nbackoff_initial = \"30s\"\ncallback_grace = \"1s\"\n\
         agent_return_wait = \"1s\"\n\
         \n[updater]\ninterval = \"500ms\"\n",
        rig.calling(rig.base_config())
            // Everything shepherd does with a BMC, at trace level.
            .replace(
                "level = \"info,tokio_postgres=warn,refinery_core=warn\"",
                "level = \"info,shepherd=trace,awc=trace,actix_http=trace,tokio_postgres=warn,refinery_core=warn\""
            ),
        good.url,
        secret.display(),
        Sushy::uuid(0),
        other.url,
        wrong.display(),
    );
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("2 agents", AGENTS, 2, Duration::from_secs(60), &mut s)
        .await;
    const FRESH: &str = "SELECT count(*) FROM machine_agent_heartbeat \
                         WHERE agent_heartbeat_at > now() - interval '2 seconds'";
    rig.wait_for("2 heartbeating", FRESH, 2, Duration::from_secs(30), &mut s)
        .await;
    // Past the thresholds, heartbeating machines are left alone.
    tokio::time::sleep(Duration::from_secs(6)).await;
    const RECOVERIES: &str = "SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery'";
    assert_eq!(rig.count(RECOVERIES).await, 0, "{}", s.log_text());

    // The Updater read both BMCs: node-1's facts are the emulator's,
    // node-2's read failed with the BMC's 401; written once, not every round.
    let facts = || async {
        rig.bmdb
            .transact(async |tx| {
                Ok(tx
                    .query(
                        "SELECT p.provider_id, f.power_state, f.manufacturer, f.health, f.system_path, \
                         f.read_error, f.changed_at, p.provider_status::text \
                         FROM machine_bmc_facts f JOIN machine_provided p USING (machine_id) \
                         ORDER BY p.provider_id",
                        &[],
                    )
                    .await?
                    .iter()
                    .map(|r| {
                        (
                            r.get::<_, String>(0),
                            r.get::<_, Option<String>>(1),
                            r.get::<_, Option<String>>(2),
                            r.get::<_, Option<String>>(3),
                            r.get::<_, Option<String>>(4),
                            r.get::<_, Option<String>>(5),
                            r.get::<_, std::time::SystemTime>(6),
                            r.get::<_, Option<String>>(7),
                        )
                    })
                    .collect::<Vec<_>>())
            })
            .await
            .unwrap()
    };
    let before = facts().await;
    assert_eq!(before.len(), 2, "{before:?}");
    let emulator = good.system(0).await;
    let n1 = &before[0];
    assert_eq!(n1.0, "node-1");
    assert_eq!(n1.1.as_deref(), emulator["PowerState"].as_str());
    assert_eq!(n1.2.as_deref(), emulator["Manufacturer"].as_str());
    assert_eq!(n1.3.as_deref(), emulator["Status"]["Health"].as_str());
    assert_eq!(n1.4.as_deref(), emulator["@odata.id"].as_str());
    assert_eq!(n1.5, None);
    assert_eq!(n1.7.as_deref(), Some("Running"));
    let n2 = &before[1];
    assert!(
        n2.5.as_deref().unwrap_or("").contains("401"),
        "node-2's read error: {n2:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await; // four more rounds
    let again = facts().await;
    assert_eq!(again[0].6, before[0].6, "unchanged facts were rewritten");
    assert_eq!(again[1].6, before[1].6, "an unchanged error was rewritten");
    // Operators see them: the JSON API and `machines show`.
    let node1 = machine_of(&rig, "node-1").await;
    let (status, body) = s.admin_get(&format!("api/v1/machines/{node1}")).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["tags"]["bmc"]["manufacturer"], emulator["Manufacturer"]);
    assert_eq!(v["tags"]["bmc"]["power_state"], "On");
    let show = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("--config")
        .arg(&config)
        .args(["machines", "show", &node1.to_string()])
        .output()
        .unwrap();
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(
        show.contains("bmc") && show.contains(&good.url) && show.contains("Sushy Emulator"),
        "{show}"
    );

    // Both agents die, and no agent can be started on the machines (their
    // SSH answers, the agent crashes): the gentle step fails, the BMC
    // power-cycles.
    let mode = rig.sshd.dir().join("takeover-agent.mode");
    std::fs::write(&mode, "crash").unwrap();
    let ids: Vec<(uuid::Uuid, String)> = rig.provided().await;
    for (id, _) in &ids {
        let pid_file = rig.sshd.dir().join(format!("agent-{id}.pid"));
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    }
    // Once both power actions are under way, agents start again.
    rig.wait_for(
        "two power actions",
        "SELECT count(*) FROM recovery_power_action",
        2,
        Duration::from_secs(60),
        &mut s,
    )
    .await;
    std::fs::remove_file(&mode).unwrap();
    // node-1: rebooted through its BMC (the emulator saw the reset and the
    // power go off and on), taken over again, heartbeating again.
    rig.wait_for_recovery(ids[0].0, &s).await;
    let resets = |sushy: &Sushy| {
        sushy
            .log()
            .lines()
            .filter(|l| l.contains("ComputerSystem.Reset") && l.contains(" 204 "))
            .count()
    };
    assert_eq!(resets(&good), 1, "{}", good.log());
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(
        log.contains("reboot accepted by the BMC"),
        "{}",
        log.lines()
            .filter(|l| !l.contains("TRACE") && !l.contains("DEBUG"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // node-2: the recovery failed with the BMC's 401, named, and backed off.
    rig.wait_for_failed_recovery("node-2", "401", &mut s).await;
    assert_eq!(resets(&other), 0, "{}", other.log());
    let cause: String = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT failed_cause FROM work_history WHERE event = 'Failed' LIMIT 1",
                    &[],
                )
                .await?
                .get(0))
        })
        .await
        .unwrap();
    assert!(
        cause.contains(&other.url) && cause.contains("Incorrect username or password"),
        "{cause}"
    );
    s.terminate().await;
    // At trace level, neither password reached the log.
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(log.contains("TRACE"), "the log was at trace level");
    assert!(!log.contains(password), "the BMC password is in the log");
    assert!(
        !log.contains("wrong-password-e07c"),
        "a BMC password is in the log"
    );
    // Nor as a basic-authentication header.
    assert_eq!(base64_encode(b"admin:x"), "YWRtaW46eA==");
    for secret in [password, "wrong-password-e07c"] {
        let header = base64_encode(format!("admin:{secret}").as_bytes());
        assert!(
            !log.contains(&header),
            "a BMC credential header is in the log"
        );
    }
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

#[actix_rt::test]
async fn the_owned_hardware_demo_recovers_a_silenced_machine_through_its_bmc() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = run_demo(
        dir.path(),
        &[
            "--provider",
            "static",
            "--machines",
            "6",
            "--timeout",
            "2m",
            "--silence",
            "1",
        ],
    )
    .await;
    assert!(
        stdout.contains("simulated BMCs (Redfish) http://127.0.1.1:"),
        "{stdout}"
    );
    assert!(stdout.contains("all 6 machines taken over in"), "{stdout}");
    assert!(
        stdout.contains("all 1 silenced machines recovered and heartbeating again in")
            && stdout.contains("; 0 other machines recovered"),
        "{stdout}"
    );
    shepherd::bmdb::embedded::remove_data_dir(&dir.path().join("var/demo/bmdb")).unwrap();
}

#[actix_rt::test]
async fn a_silent_machine_whose_bmc_is_down_fails_its_recovery_with_the_cause_and_backs_off() {
    let rig = Rig::new().await;
    // Nothing listens there: the BMC is down.
    let bmc = format!("http://127.0.0.1:{}", Sshd::free_port());
    // Agents told to call an endpoint that does not resolve never
    // heartbeat: the machine goes silent right after its takeover.
    let text = format!(
        "{}\n[provider]\nkind = \"static\"\n\n[provider.inventory]\nmachines = [\n\
         {{ id = \"node-9\", address = \"127.0.0.1\", bmc = {{ url = \"{bmc}\", username = \"admin\", password = \"pw-0b7e\" }} }},\n]\n\
         \n[recoverer]\nsilent_after_start = \"2s\"\npoll_interval = \"200ms\"\nbackoff_initial = \"30s\"\n\
         callback_grace = \"1s\"\nagent_restart_wait = \"1s\"\n\
         \n[redfish]\ntimeout = \"3s\"\n",
        rig.base_config()
    );
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for_failed_recovery("node-9", "unreachable", &mut s)
        .await;
    // The process is fine: its admin server answers, it holds its session.
    let (status, _) = s.admin_get("readyz").await;
    assert_eq!(status, 200);
    s.terminate().await;
}

#[actix_rt::test]
async fn a_recovery_failure_the_bmdb_refuses_to_record_cancels_the_lease_naming_its_cause() {
    let rig = Rig::new().await;
    // The database refuses every recovery backoff: a failure cannot be
    // recorded (not an outage, which is retried until it is).
    rig.bmdb
        .transact(async |tx| {
            tx.execute(
                "CREATE FUNCTION refuse_recovery_backoff() RETURNS trigger AS $$ \
                 BEGIN IF NEW.process = 'ShepherdRecovery' THEN \
                 RAISE EXCEPTION 'recovery backoffs refused by the test'; END IF; \
                 RETURN NEW; END $$ LANGUAGE plpgsql",
                &[],
            )
            .await?;
            tx.execute(
                "CREATE TRIGGER refuse_recovery_backoff BEFORE INSERT OR UPDATE ON work_backoff \
                 FOR EACH ROW EXECUTE FUNCTION refuse_recovery_backoff()",
                &[],
            )
            .await?;
            Ok(())
        })
        .await
        .unwrap();
    let bmc = format!("http://127.0.0.1:{}", Sshd::free_port());
    let text = format!(
        "{}\n[provider]\nkind = \"static\"\n\n[provider.inventory]\nmachines = [\n\
         {{ id = \"node-9\", address = \"127.0.0.1\", bmc = {{ url = \"{bmc}\", username = \"admin\", password = \"pw-0b7e\" }} }},\n]\n\
         \n[recoverer]\nsilent_after_start = \"2s\"\npoll_interval = \"200ms\"\nbackoff_initial = \"30s\"\n\
         callback_grace = \"1s\"\nagent_restart_wait = \"1s\"\n\
         \n[redfish]\ntimeout = \"3s\"\n",
        rig.base_config()
    );
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    // The lease ends cancelled, its history naming the failure and why it
    // could not be recorded (not "work dropped").
    rig.wait_for(
        "a cancelled recovery naming its cause",
        "SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery' \
         AND event = 'Canceled' AND failed_cause LIKE '%host node-9%unreachable%\
         (the failure could not be recorded:%refused by the test%'",
        1,
        Duration::from_secs(60),
        &mut s,
    )
    .await;
    assert_eq!(
        rig.count(
            "SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery' \
             AND failed_cause = 'work dropped'"
        )
        .await,
        0,
        "{}",
        s.log_text()
    );
    assert!(
        s.log_text().contains(
            "recovery failed and the failure could not be recorded; cancelling the lease"
        ),
        "{}",
        s.log_text()
    );
    // Still no backoff was written, and the process is fine.
    assert_eq!(
        rig.count("SELECT count(*) FROM work_backoff WHERE process = 'ShepherdRecovery'")
            .await,
        0
    );
    let (status, _) = s.admin_get("readyz").await;
    assert_eq!(status, 200);
    s.terminate().await;
    // No lease is left behind by the terminated process.
    assert_eq!(rig.count(WORK).await, 0, "{}", s.log_text());
}

// ---- several shepherds on one BMDB ----

#[actix_rt::test]
async fn two_shepherds_take_a_hundred_hosts_over_once_each_and_one_finishes_when_the_other_is_killed()
 {
    let rig = Rig::new().await;
    // Slow enough agents that both processes are mid-fleet when one dies.
    let config = rig.write_config(
        "shepherd.toml",
        &rig.inventory_config(100, "session_interval = \"2s\"")
            .replace("parallelism = 8", "parallelism = 4"),
    );
    std::fs::write(rig.sshd.dir().join("takeover-agent.mode"), "slow:0.2").unwrap();
    let mut a = rig.shepherd(&config, "a.log");
    let b = rig.shepherd(&config, "b.log");
    // Both work; then one is killed mid-fleet.
    rig.wait_for(
        "20 taken over",
        "SELECT least(count(*), 20) FROM machine_agent_started",
        20,
        Duration::from_secs(60),
        &mut a,
    )
    .await;
    let started = |s: &Shepherd| {
        std::fs::read_to_string(&s.log)
            .unwrap()
            .matches("agent started")
            .count()
    };
    assert!(started(&b) > 0, "b took nothing over before being killed");
    kill(Pid::from_raw(b.child.id() as i32), Signal::SIGKILL).unwrap();
    let by_b = started(&b);
    // The survivor finishes the fleet, the dead one's leases included.
    rig.wait_for(
        "100 taken over",
        AGENTS,
        100,
        Duration::from_secs(120),
        &mut a,
    )
    .await;
    // Between them, every takeover is logged, but for those b recorded in
    // the BMDB and was killed before logging (at most its parallelism).
    let (by_a, by_b_after) = (started(&a), started(&b));
    assert!(
        by_a > 0 && by_a + by_b_after >= 100 - 4 && by_a + by_b_after <= 100,
        "a logged {by_a}, b {by_b_after} (at the kill {by_b})"
    );
    // Each agent ran once; at most the ones the killed process was taking
    // over when it died ran twice (their takeovers never recorded).
    let runs = rig.agent_runs();
    assert_eq!(runs.len(), 100, "{runs:?}");
    let twice = runs.iter().filter(|n| **n == 2).count();
    assert!(runs.iter().all(|n| *n <= 2), "{runs:?}");
    assert!(twice <= 4, "{twice} agents ran twice: {runs:?}");
    assert_eq!(rig.count(WORK).await, 0, "no lease left without a worker");
    a.terminate().await;
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

#[actix_rt::test]
async fn operators_act_through_the_api_and_the_cli_and_held_machines_are_left_alone() {
    let rig = Rig::new().await;
    let sim = Sim::start(4, &["--reboot-delay", "1s"]);
    let text = rig.equinix_config(&sim).replace(
        "[admin]\nlisten = \"127.0.0.1:0\"\n",
        &format!("[admin]\nlisten = \"127.0.0.1:0\"\ntokens = {{ alice = \"{ALICE}\" }}\n"),
    ) + "\n[updater]\ninterval = \"300ms\"\n\
           \n[recoverer]\nsilent_after_start = \"1h\"\nheartbeat_stale_after = \"5m\"\npoll_interval = \"200ms\"\n\
           reboot_poll = \"100ms\"\nreboot_settle = \"3s\"\nagent_return_wait = \"1s\"\n";
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for("4 agents", AGENTS, 4, Duration::from_secs(60), &mut s)
        .await;
    let machines: Vec<(uuid::Uuid, String)> = rig.provided().await;
    let [m1, m2, m3, m4] = [0, 1, 2, 3].map(|i| machines[i].0);
    // Every agent heartbeats (as the callback would record).
    rig.bmdb
        .transact(async |tx| {
            tx.execute(
                "INSERT INTO machine_agent_heartbeat SELECT machine_id, now() FROM machine_agent_started",
                &[],
            )
            .await
        })
        .await
        .unwrap();

    // Refused: no token, a wrong one, a form without the JSON type.
    assert_eq!(act(&s, m1, "hold", None, json!({})).await.0, 401);
    assert_eq!(
        act(&s, m1, "hold", Some("wrong-token-0123456789"), json!({}))
            .await
            .0,
        401
    );
    let mut r = awc::Client::default()
        .post(format!(
            "{}/api/v1/machines/{m1}/hold",
            s.admin_url().trim_end_matches('/')
        ))
        .insert_header(("Authorization", format!("Bearer {ALICE}")))
        .send_form(&[("reason", "a form")])
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415, "{:?}", r.body().await);
    assert_eq!(
        rig.count("SELECT count(*) FROM operator_action").await,
        0,
        "refused requests act on nothing"
    );

    // Hold m1 (API, alice), then take it over again (API): its agent is
    // dropped and the Initializer leaves it alone while it is held.
    let (st, v) = act(
        &s,
        m1,
        "hold",
        Some(ALICE),
        json!({"reason": "disk swap, ticket 42"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["action"]["actor"], "alice");
    assert_eq!(v["action"]["reason"], "disk swap, ticket 42");
    let (st, v) = act(&s, m1, "hold", Some(ALICE), json!({})).await;
    assert_eq!(st, 409, "a second hold is refused: {v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("already held (by alice since"),
        "{v}"
    );
    let (st, v) = act(
        &s,
        m1,
        "retakeover",
        Some(ALICE),
        json!({"forget_host_key": true}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert!(
        v["action"]["detail"]
            .as_str()
            .unwrap()
            .contains("forgot its SSH host key"),
        "{v}"
    );
    assert_eq!(rig.count_for(AGENT_OF, m1).await, 0);
    assert_eq!(
        rig.count_for(
            "SELECT count(*) FROM machine_ssh_host_key WHERE machine_id = $1",
            m1
        )
        .await,
        0
    );
    // Reboot a held machine: refused.
    let (st, v) = act(&s, m1, "reboot", Some(ALICE), json!({})).await;
    assert_eq!(st, 409, "{v}");

    // m2 taken over again from the CLI: the Initializer does it.
    let (code, out, err) = machines_cli(
        &config,
        &["retakeover", &m2.to_string(), "--reason", "agent upgrade"],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("dropped its agent"), "{out}");
    rig.wait_for_machine("m2 taken over again", TAKEOVERS_OF, m2, 2, &s)
        .await;
    // By then m1 (held, no agent) has long been due: still left alone.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        rig.count_for(TAKEOVERS_OF, m1).await,
        1,
        "held m1 was taken over"
    );
    assert_eq!(rig.count_for(AGENT_OF, m1).await, 0);

    // m4 held with a stale heartbeat: the Recoverer leaves it alone, while
    // the reboot asked for m3 (API) goes through on the Recoverer's lease.
    let (code, out, err) = machines_cli(&config, &["hold", &m4.to_string()]);
    assert_eq!(code, Some(0), "{out}{err}");
    rig.bmdb
        .transact(async |tx| {
            tx.execute(
                "UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() - interval '1 hour' WHERE machine_id = $1",
                &[&m4],
            )
            .await
        })
        .await
        .unwrap();
    let (st, v) = act(
        &s,
        m3,
        "reboot",
        Some(ALICE),
        json!({"reason": "kernel update"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = act(&s, m3, "reboot", Some(ALICE), json!({})).await;
    assert_eq!(st, 409, "a second request while one waits: {v}");
    rig.wait_for_machine("m3 rebooted", RECOVERIES_OF, m3, 1, &s)
        .await;
    rig.wait_for_machine("m3 taken over after its reboot", TAKEOVERS_OF, m3, 2, &s)
        .await;
    assert_eq!(
        rig.count_for(
            "SELECT count(*) FROM machine_reboot_request WHERE machine_id = $1",
            m3
        )
        .await,
        0,
        "the request is done"
    );
    // The provider stops m3 and m4 (and moves m4): the Updater brings m3's
    // change in and leaves the held m4's record as it was.
    for (device, change) in [
        (&machines[2].1, json!({"state": "inactive"})),
        (
            &machines[3].1,
            json!({"state": "inactive", "address": "127.0.0.8"}),
        ),
    ] {
        let r = awc::Client::default()
            .patch(format!("http://{}/_sim/devices/{device}", sim.addr))
            .send_json(&change)
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
    rig.wait_for_machine(
        "m3 stopped in the BMDB",
        "SELECT count(*) FROM machine_provided WHERE machine_id = $1 AND provider_status = 'Stopped'",
        m3,
        1,
        &s,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await; // two more rounds
    assert_eq!(
        rig.provider_record(&machines[3].1).await,
        ("Running".to_string(), "127.0.0.1".to_string()),
        "the Updater leaves the held m4 alone"
    );
    let stats = sim.stats().await;
    assert_eq!(stats["reboots"][machines[2].1.as_str()], 1, "{stats}");
    assert!(
        stats["reboots"].get(machines[3].1.as_str()).is_none(),
        "held m4 (heartbeat an hour old) was rebooted: {stats}"
    );
    assert_eq!(rig.count_for(RECOVERIES_OF, m4).await, 0);

    // Release m1 from the CLI while it is backed off: nothing yet; retry
    // (API) clears the backoff and the Initializer takes it over.
    rig.back_off(m1, "ShepherdAgentStart", "test: a failure before")
        .await;
    let (code, out, err) = machines_cli(
        &config,
        &["release", &m1.to_string(), "--reason", "disk swapped"],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(rig.count_for(AGENT_OF, m1).await, 0, "backed off");
    let (code, out, err) = machines_cli(&config, &["retry", &m2.to_string()]);
    assert_eq!(code, Some(1), "m2 is not backed off: {out}");
    assert!(err.contains("not backed off"), "{err}");
    let (st, v) = act(
        &s,
        m1,
        "retry",
        Some(ALICE),
        json!({"process": "ShepherdAgentStart"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    rig.wait_for_machine("m1 taken over after the retry", TAKEOVERS_OF, m1, 2, &s)
        .await;
    let (code, out, err) = machines_cli(&config, &["release", &m1.to_string()]);
    assert_eq!(code, Some(1), "{out}");
    assert!(err.contains("is not held"), "{err}");

    // The audit: who, what, why, in order; shown in the machine's history.
    let audit: Vec<(String, String, String)> = rig
        .bmdb
        .transact(async |tx| shepherd::bmdb::actions::audit(tx, m1).await)
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.actor, a.action, a.reason.unwrap_or_default()))
        .collect();
    let want = [
        ("alice", "hold", "disk swap, ticket 42"),
        ("alice", "retakeover", ""),
        ("cli", "release", "disk swapped"),
        ("alice", "retry", ""),
    ];
    assert_eq!(
        audit,
        want.map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    );
    assert_eq!(rig.count("SELECT count(*) FROM operator_action").await, 7);
    // The held machine, listed by state and found by its provider ID.
    let (code, out, err) = machines_cli(&config, &["list", "--state", "held"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(&m4.to_string()), "{out}");
    assert!(out.contains("1 shown of 1 matching"), "{out}");
    let (_, out, _) = machines_cli(&config, &["list", "--search", &machines[3].1[..13]]);
    assert!(
        out.contains(&m4.to_string()) && out.contains("1 shown of 1 matching"),
        "{out}"
    );
    let (code, _, err) = machines_cli(&config, &["list", "--heartbeat", "sometimes"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("heartbeating, silent, no-agent"), "{err}");
    let (code, out, _) = machines_cli(&config, &["show", &m1.to_string()]);
    assert_eq!(code, Some(0));
    assert!(out.contains("operator alice hold: held;"), "{out}");
    assert!(out.contains("(reason: disk swapped)"), "{out}");
    let mut r = awc::Client::default()
        .get(format!(
            "{}/api/v1/machines/{m1}",
            s.admin_url().trim_end_matches('/')
        ))
        .insert_header(("Authorization", format!("Bearer {ALICE}")))
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["operator_actions"].as_array().unwrap().len(), 4, "{v}");
    assert_eq!(v["hold"], serde_json::Value::Null);

    // The provider loses m3 and the held m4: the Provisioner reports m3
    // and leaves m4 be.
    for device in [&machines[2].1, &machines[3].1] {
        let r = awc::Client::default()
            .delete(format!("http://{}/metal/v1/devices/{device}", sim.addr))
            .insert_header(("X-Auth-Token", TOKEN))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{r:?}");
    }
    let missing = |id: &str| {
        std::fs::read_to_string(&s.log)
            .unwrap()
            .lines()
            .filter(|l| l.contains("no longer lists it") && l.contains(id))
            .count()
    };
    let t = Instant::now();
    while missing(&machines[2].1) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "m3 not reported\n{}",
            s.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1100)).await; // two more rounds
    assert_eq!(missing(&machines[3].1), 0, "the held m4 was reported");
    let (_, metrics) = {
        let mut r = awc::Client::default()
            .get(format!("{}/metrics", s.admin_url().trim_end_matches('/')))
            .insert_header(("Authorization", format!("Bearer {ALICE}")))
            .send()
            .await
            .unwrap();
        (
            r.status(),
            String::from_utf8_lossy(&r.body().await.unwrap()).into_owned(),
        )
    };
    assert!(
        metrics.contains("shepherd_provisioner_discrepancies 1\n"),
        "{metrics}"
    );

    // The rest of the actions the other way round: reboot and retry from
    // the CLI, release through the API.
    let (code, out, err) = machines_cli(
        &config,
        &["reboot", &m2.to_string(), "--reason", "firmware"],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("requested"), "{out}");
    rig.wait_for_machine("m2 rebooted", RECOVERIES_OF, m2, 1, &s)
        .await;
    assert_eq!(sim.stats().await["reboots"][machines[1].1.as_str()], 1);
    rig.back_off(m1, "ShepherdRecovery", "test: a reboot failed")
        .await;
    let (code, out, err) = machines_cli(
        &config,
        &["retry", &m1.to_string(), "--process", "ShepherdRecovery"],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("cleared the backoff of ShepherdRecovery"),
        "{out}"
    );
    assert_eq!(
        rig.count_for(
            "SELECT count(*) FROM work_backoff WHERE machine_id = $1",
            m1
        )
        .await,
        0
    );
    let (st, v) = act(&s, m4, "release", Some(ALICE), json!({"reason": "done"})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(rig.count("SELECT count(*) FROM machine_hold").await, 0);
    let by_actor: Vec<(String, i64)> = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query(
                    "SELECT actor || ' ' || action, count(*) FROM operator_action GROUP BY 1 ORDER BY 1",
                    &[],
                )
                .await?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect())
        })
        .await
        .unwrap();
    let want: Vec<(String, i64)> = [
        ("alice hold", 1),
        ("alice reboot", 1),
        ("alice release", 1),
        ("alice retakeover", 1),
        ("alice retry", 1),
        ("cli hold", 1),
        ("cli reboot", 1),
        ("cli release", 1),
        ("cli retakeover", 1),
        ("cli retry", 1),
    ]
    .map(|(a, n)| (a.to_string(), n))
    .into();
    assert_eq!(by_actor, want, "every action by each way in, once");
    s.terminate().await;
}

/// A host of the static inventory without a BMC whose agent is gone (it
/// rebooted by itself, and the agent had no unit there): its SSH answers,
/// so its agent is started again; never a loop on "cannot be rebooted".
#[actix_rt::test]
async fn an_inventory_host_without_a_bmc_whose_agent_is_gone_comes_back_heartbeating() {
    let rig = Rig::new().await;
    let text = rig.calling(rig.inventory_config(1, "session_interval = \"2s\""))
        + "\n[recoverer]\nsilent_after_start = \"3s\"\nheartbeat_stale_after = \"3s\"\npoll_interval = \"200ms\"\n\
           callback_grace = \"1s\"\nbackoff_initial = \"30s\"\n";
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    const FRESH: &str = "SELECT count(*) FROM machine_agent_heartbeat \
                         WHERE agent_heartbeat_at > now() - interval '2 seconds'";
    rig.wait_for("1 heartbeating", FRESH, 1, Duration::from_secs(60), &mut s)
        .await;
    let (host, _) = rig.provided().await.remove(0);
    // The machine restarts on its own: its agent process is gone.
    let pid_file = rig.sshd.dir().join(format!("agent-{host}.pid"));
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    rig.wait_for_history(
        host,
        &[
            "ShepherdAgentStart Started",
            "ShepherdAgentStart Finished",
            "ShepherdRecovery Started",
            "ShepherdRecovery Finished",
        ],
        &s,
    )
    .await;
    rig.wait_for(
        "heartbeating again",
        FRESH,
        1,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    // Well past the thresholds again: no further recovery, no failure.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        rig.count("SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery'")
            .await,
        2,
        "{}",
        s.log_text()
    );
    assert_eq!(
        rig.count(
            "SELECT count(*) FROM work_history WHERE failed_cause LIKE '%cannot be rebooted%'"
        )
        .await,
        0
    );
    let (_, list) = s.admin_get("api/v1/machines").await;
    let v: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(v["machines"][0]["state"], "agent-started", "{v}");
    s.terminate().await;
}
