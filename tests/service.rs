//! `shepherd run` as an operator runs it: the real binary as a process,
//! with PostgreSQL, equinix-sim (a process too), OpenSSH's sshd and the
//! takeover-agent.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use shepherd::bmdb::Bmdb;
use shepherd::ssh::SshIdentity;
use shepherd::testing::{Sshd, TestDb};

const PROJECT: &str = "6b4d2a9e-6f1a-4c1e-9b9a-3d1f5e7c0a01";
const TOKEN: &str = "sim-token-for-tests";

struct Rig {
    db: TestDb,
    bmdb: Bmdb,
    sshd: Sshd,
    dir: tempfile::TempDir,
}

impl Rig {
    async fn new() -> Rig {
        let db = TestDb::new().await;
        let bmdb = db.bmdb().await;
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

[log]
level = "info,tokio_postgres=warn,refinery_core=warn"
"#,
            url = self.db.url(),
            port = self.sshd.addr.port(),
            dir = self.dir.path().display(),
            agent = env!("CARGO_BIN_EXE_takeover-agent"),
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
        self.bmdb
            .transact(async |tx| Ok(tx.query_one(sql, &[]).await?.get::<_, i64>(0)))
            .await
            .unwrap()
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
        let child = Command::new(env!("CARGO_BIN_EXE_equinix-sim"))
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
    async fn devices(&self) -> (usize, usize) {
        let mut r = awc::Client::default()
            .get(format!(
                "http://{}/metal/v1/projects/{PROJECT}/devices?per_page=1000",
                self.addr
            ))
            .insert_header(("X-Auth-Token", TOKEN))
            .send()
            .await
            .unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&r.body().limit(64 << 20).await.unwrap()).unwrap();
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
    // The admin server, where the log says it is.
    let log = std::fs::read_to_string(&s.log).unwrap();
    let url = log
        .lines()
        .find_map(|l| l.split("admin server: ").nth(1))
        .expect("the admin URL is logged")
        .trim()
        .to_string();
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
    assert!(list.contains("20 shown; fleet: agent-started 20"), "{list}");
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
        &rig.base_config()
            .replace(env!("CARGO_BIN_EXE_takeover-agent"), "/nonexistent/agent"),
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
}

#[actix_rt::test]
async fn a_machine_gone_quiet_is_rebooted_and_taken_over_again() {
    let rig = Rig::new().await;
    let sim = Sim::start(3, &["--reboot-delay", "1s"]);
    let text = rig.equinix_config(&sim)
        + "\n[recoverer]\nsilent_after_start = \"1h\"\nheartbeat_stale_after = \"30s\"\npoll_interval = \"200ms\"\n\
           reboot_poll = \"100ms\"\nreboot_settle = \"3s\"\n";
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
    let history = async || {
        rig.bmdb
            .transact(async |tx| shepherd::bmdb::machines::history(tx, quiet).await)
            .await
            .unwrap()
            .into_iter()
            .map(|h| format!("{} {}", h.process, h.event))
            .collect::<Vec<_>>()
    };
    let want = [
        "ShepherdAgentStart Started",
        "ShepherdAgentStart Finished",
        "ShepherdRecovery Started",
        "ShepherdRecovery Finished",
        "ShepherdAgentStart Started",
        "ShepherdAgentStart Finished",
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let h = history().await;
        if h == want {
            break;
        }
        assert!(Instant::now() < deadline, "history {h:?}\n{}", s.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
        let (status, address): (String, String) = rig
            .bmdb
            .transact(async |tx| {
                let r = tx
                    .query_one(
                        "SELECT provider_status::text, provider_ip_address FROM machine_provided WHERE provider_id = $1",
                        &[&changed],
                    )
                    .await?;
                Ok((r.get(0), r.get(1)))
            })
            .await
            .unwrap();
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
async fn the_demo_takes_twenty_machines_over_and_exits_0() {
    use std::os::unix::fs::PermissionsExt;
    // The embedded PostgreSQL may run as another user: a traversable dir.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = tokio::task::spawn_blocking({
        let cwd = dir.path().to_path_buf();
        move || {
            Command::new(env!("CARGO_BIN_EXE_shepherd"))
                .args([
                    "demo",
                    "--machines",
                    "20",
                    "--admin-listen",
                    "127.0.0.1:0",
                    "--timeout",
                    "2m",
                ])
                .current_dir(cwd)
                .env_remove("RUST_LOG")
                .stdin(Stdio::null())
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("all 20 machines taken over in"), "{stdout}");
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
}
