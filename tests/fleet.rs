//! Several shepherds on one BMDB and one simulated fleet: `fleet-sim` (the
//! Equinix simulator, SSH machines and their resident agents) as a process
//! of its own, `shepherd run` processes on its printed configuration, and
//! PostgreSQL. What each machine ran is the fleet's own count.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use shepherd::bmdb::Bmdb;
use shepherd::testing::{FleetSimProcess, ShepherdProcess, Sshd, TestDb};

const FLEET_SIM: &str = env!("CARGO_BIN_EXE_fleet-sim");
const SHEPHERD: &str = env!("CARGO_BIN_EXE_shepherd");

const TAKEN_OVER: &str = "SELECT count(*) FROM machine_agent_started";
const HEARTBEATING: &str = "SELECT count(*) FROM machine_agent_heartbeat \
                            JOIN machine_agent_started USING (machine_id)";
const PROVIDED: &str = "SELECT count(*) FROM machine_provided";
const WORK: &str = "SELECT count(*) FROM work";

struct Rig {
    db: TestDb,
    bmdb: Bmdb,
    dir: tempfile::TempDir,
    fleet: FleetSimProcess,
}

impl Rig {
    async fn new(machines: usize, first: Ipv4Addr, extra: &[&str]) -> Rig {
        let db = TestDb::new().await;
        let bmdb = db.bmdb().await;
        let dir = tempfile::tempdir().unwrap();
        let fleet =
            FleetSimProcess::start(Path::new(FLEET_SIM), dir.path(), machines, first, extra);
        Rig {
            db,
            bmdb,
            dir,
            fleet,
        }
    }

    /// A shepherd on the fleet's configuration and this test's database,
    /// with its own admin and callback addresses.
    fn shepherd(&self, name: &str, env: &[(&str, &str)]) -> ShepherdProcess {
        let callback = format!("127.0.0.1:{}", Sshd::free_port());
        let mut all = vec![
            ("SHEPHERD__BMDB__URL", self.db.url()),
            ("SHEPHERD__BMDB__SESSION_INTERVAL", "2s".into()),
            ("SHEPHERD__BMDB__SESSION_GC_GRACE", "1s".into()),
            ("SHEPHERD__ADMIN__LISTEN", "127.0.0.1:0".into()),
            ("SHEPHERD__BMAAS__LISTEN", callback.clone()),
            ("SHEPHERD__BMAAS__ENDPOINT", callback),
            ("SHEPHERD__LOG__LEVEL", "info,tokio_postgres=warn".into()),
        ];
        all.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
        ShepherdProcess::start(
            Path::new(SHEPHERD),
            &self.fleet.config,
            self.dir.path().join(format!("{name}.log")),
            &all,
        )
    }

    async fn count(&self, sql: &'static str) -> i64 {
        shepherd::testing::count(&self.bmdb, sql).await
    }

    async fn wait_for(
        &self,
        what: &str,
        sql: &'static str,
        want: i64,
        timeout: Duration,
        running: &mut [&mut ShepherdProcess],
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.count(sql).await;
            if n >= want {
                return;
            }
            for s in running.iter_mut() {
                s.assert_running();
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} ({n}, want {want}):\n{}",
                running
                    .iter()
                    .map(|s| s.log_tail())
                    .collect::<Vec<_>>()
                    .join("\n----\n")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The pid (from the session's runtime info) of the shepherd holding
    /// `duty`, if any.
    async fn duty_holder_pid(&self, duty: &str) -> Option<u32> {
        let duty = duty.to_string();
        let info: Option<String> = self
            .bmdb
            .transact(async |tx| {
                Ok(tx
                    .query_opt(
                        "SELECT s.session_runtime_info FROM fleet_duty d \
                         JOIN sessions s USING (session_id) WHERE d.duty = $1",
                        &[&duty],
                    )
                    .await?
                    .map(|r| r.get(0)))
            })
            .await
            .unwrap();
        info?
            .split_whitespace()
            .skip_while(|w| *w != "pid")
            .nth(1)?
            .parse()
            .ok()
    }
}

fn create_requests(stats: &serde_json::Value) -> (u64, u64) {
    (
        stats["requests"]["create_device"].as_u64().unwrap_or(0),
        stats["requests"]["get_reservation"].as_u64().unwrap_or(0),
    )
}

#[actix_rt::test]
async fn two_shepherds_take_a_fleet_of_a_hundred_over_each_machine_exactly_once() {
    let rig = Rig::new(
        100,
        Ipv4Addr::new(127, 0, 21, 1),
        &["--agent-interval", "1s"],
    )
    .await;
    let parallelism = [("SHEPHERD__INITIALIZER__PARALLELISM", "6")];
    let mut a = rig.shepherd("a", &parallelism);
    let mut b = rig.shepherd("b", &parallelism);
    rig.wait_for(
        "100 machines heartbeating",
        HEARTBEATING,
        100,
        Duration::from_secs(180),
        &mut [&mut a, &mut b],
    )
    .await;

    // Every machine ran its agent once: no takeover was done twice.
    let report = rig.fleet.report().await;
    assert_eq!(report["taken_over"], 100, "{report}");
    assert_eq!(report["agents_started"], 100, "{report}");
    assert_eq!(report["execs"], 100, "{report}");
    assert_eq!(report["taken_over_again"], serde_json::json!({}));
    assert_eq!(report["agents_running"], 100);
    // Both did work, and between them all of it.
    let (by_a, by_b) = (a.log_count("agent started"), b.log_count("agent started"));
    assert!(by_a > 0 && by_b > 0, "a took {by_a} over, b {by_b}");
    assert_eq!(by_a + by_b, 100);
    // One of them provisioned: one create per device, no look-ups.
    let stats = rig.fleet.api_stats().await;
    assert_eq!(create_requests(&stats), (100, 0), "{}", stats["statuses"]);
    let holder = rig.duty_holder_pid("provisioning").await;
    assert!(
        holder == Some(a.pid()) || holder == Some(b.pid()),
        "{holder:?}"
    );
    let standing_by = if holder == Some(a.pid()) { &b } else { &a };
    assert_eq!(
        standing_by.log_count("holds the fleet's provisioning duty; standing by"),
        1,
        "the other logs standing by once"
    );
    assert_eq!(rig.count(WORK).await, 0);
    assert_eq!(a.terminate(Duration::from_secs(20)), Some(0));
    assert_eq!(b.terminate(Duration::from_secs(20)), Some(0));
}

#[actix_rt::test]
async fn when_one_of_two_shepherds_is_killed_midway_the_other_finishes_the_fleet() {
    // Agents call rarely: the killed shepherd's callback address is gone,
    // and no machine is to be recovered for it within this test.
    let rig = Rig::new(
        100,
        Ipv4Addr::new(127, 0, 22, 1),
        &["--agent-interval", "5m"],
    )
    .await;
    let parallelism = [("SHEPHERD__INITIALIZER__PARALLELISM", "2")];
    let mut a = rig.shepherd("a", &parallelism);
    let mut b = rig.shepherd("b", &parallelism);
    rig.wait_for(
        "25 taken over",
        TAKEN_OVER,
        25,
        Duration::from_secs(120),
        &mut [&mut a, &mut b],
    )
    .await;
    assert!(b.log_count("agent started") > 0, "b took nothing over");
    b.kill();
    let by_b = b.log_count("agent started");
    rig.wait_for(
        "100 taken over",
        TAKEN_OVER,
        100,
        Duration::from_secs(180),
        &mut [&mut a],
    )
    .await;
    assert!(a.log_count("agent started") + by_b >= 100);
    // Every machine's agent ran; only those b was taking over when it died
    // (at most its parallelism) ran twice.
    let report = rig.fleet.report().await;
    assert_eq!(report["taken_over"], 100, "{report}");
    let again = report["taken_over_again"].as_object().unwrap();
    assert!(again.len() <= 2, "{report}");
    assert!(again.values().all(|n| n == 2), "{report}");
    assert_eq!(rig.count(WORK).await, 0, "no lease left without a worker");
    assert_eq!(a.terminate(Duration::from_secs(20)), Some(0));
}

#[actix_rt::test]
async fn the_provisioning_duty_passes_on_when_its_holder_is_killed() {
    let rig = Rig::new(
        40,
        Ipv4Addr::new(127, 0, 23, 1),
        &["--agent-interval", "5m"],
    )
    .await;
    // Slow creation, so that the holder dies mid-fleet.
    let slow = [("SHEPHERD__PROVISIONER__CREATION_INTERVAL", "150ms")];
    let mut a = rig.shepherd("a", &slow);
    let mut b = rig.shepherd("b", &slow);
    rig.wait_for(
        "10 machines",
        PROVIDED,
        10,
        Duration::from_secs(60),
        &mut [&mut a, &mut b],
    )
    .await;
    let holder = rig.duty_holder_pid("provisioning").await.unwrap();
    let (killed, survivor) = if holder == a.pid() {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    assert_eq!(killed.pid(), holder);
    killed.kill();
    let at_kill = rig.count(PROVIDED).await;
    assert!(at_kill < 40, "provisioning was over before the kill");
    rig.wait_for(
        "40 machines",
        PROVIDED,
        40,
        Duration::from_secs(60),
        &mut [&mut *survivor],
    )
    .await;
    assert_eq!(
        rig.duty_holder_pid("provisioning").await,
        Some(survivor.pid())
    );
    assert_eq!(
        survivor.log_count("this process holds the fleet's provisioning duty"),
        1
    );
    // A little longer: nothing more is created.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = rig.fleet.api_stats().await;
    assert_eq!(stats["devices"], 40);
    // One create per device: the device whose create was in flight at the
    // kill, if any, is adopted from the listing, not created again.
    assert_eq!(create_requests(&stats), (40, 0), "{}", stats["statuses"]);
    assert_eq!(rig.count(PROVIDED).await, 40);
}
