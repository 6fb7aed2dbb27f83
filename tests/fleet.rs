//! Several shepherds on one BMDB and one simulated fleet: `fleet-sim` (the
//! Equinix simulator, SSH machines and their resident agents) as a process
//! of its own, `shepherd run` processes on its printed configuration, and
//! PostgreSQL. What each machine ran is the fleet's own count.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use shepherd::bmdb::Bmdb;
use shepherd_sim::testing::{FleetShares, FleetSimProcess, ShepherdProcess, Sshd, TestDb};

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
        let fleet = FleetSimProcess::start(
            &shepherd_sim::bin("fleet-sim"),
            dir.path(),
            machines,
            first,
            extra,
        );
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
        let all = vec![
            ("SHEPHERD__BMDB__URL", self.db.url()),
            ("SHEPHERD__BMDB__SESSION_INTERVAL", "2s".into()),
            ("SHEPHERD__BMDB__SESSION_GC_GRACE", "1s".into()),
            ("SHEPHERD__ADMIN__LISTEN", "127.0.0.1:0".into()),
            ("SHEPHERD__BMAAS__LISTEN", callback.clone()),
            ("SHEPHERD__BMAAS__ENDPOINT", callback),
        ];
        self.run(name, all, env)
    }

    /// `shepherd run` on the fleet's configuration and this test's
    /// database, with `vars` and then `env` as overrides.
    fn run<'a>(
        &self,
        name: &str,
        mut vars: Vec<(&'a str, String)>,
        env: &[(&'a str, &str)],
    ) -> ShepherdProcess {
        vars.push(("SHEPHERD__LOG__LEVEL", "info,tokio_postgres=warn".into()));
        vars.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
        ShepherdProcess::start(
            Path::new(SHEPHERD),
            &self.fleet.config,
            self.dir.path().join(format!("{name}.log")),
            &vars,
        )
    }

    /// A fleet of `machines` on 127.0.`subnet`.1… whose agents call every
    /// `interval` and resolve `callback.fleet.test` to one address per
    /// shepherd to come (127.0.`subnet`.201…, returned as listen
    /// addresses, port 7830).
    async fn behind_one_name(
        machines: usize,
        subnet: u8,
        interval: &str,
        shepherds: usize,
    ) -> (Rig, Vec<String>) {
        let addrs: Vec<String> = (1..=shepherds)
            .map(|i| format!("127.0.{subnet}.{}", 200 + i))
            .collect();
        let resolve = format!("callback.fleet.test={}", addrs.join(","));
        let rig = Rig::new(
            machines,
            Ipv4Addr::new(127, 0, subnet, 1),
            &["--agent-interval", interval, "--resolve", &resolve],
        )
        .await;
        (rig, addrs.iter().map(|a| format!("{a}:7830")).collect())
    }

    /// A shepherd serving the fleet's callback name (`--resolve`) at
    /// `listen`, with its admin server on `admin`.
    fn shepherd_at(
        &self,
        name: &str,
        listen: &str,
        admin: &str,
        env: &[(&str, &str)],
    ) -> ShepherdProcess {
        let all = vec![
            ("SHEPHERD__BMDB__URL", self.db.url()),
            ("SHEPHERD__BMDB__SESSION_INTERVAL", "2s".into()),
            ("SHEPHERD__BMDB__SESSION_GC_GRACE", "1s".into()),
            ("SHEPHERD__ADMIN__LISTEN", admin.into()),
            ("SHEPHERD__BMAAS__LISTEN", listen.into()),
            ("SHEPHERD__RECOVERER__BACKOFF_INITIAL", "2s".into()),
        ];
        self.run(name, all, env)
    }

    /// Machines whose agent called within `secs` seconds.
    async fn fresh(&self, secs: f64) -> i64 {
        self.bmdb
            .transact(async |tx| {
                Ok(tx
                    .query_one(
                        "SELECT count(*) FROM machine_agent_heartbeat h JOIN machine_agent_started USING (machine_id) \
                         WHERE h.agent_heartbeat_at > now() - make_interval(secs => $1)",
                        &[&secs],
                    )
                    .await?
                    .get(0))
            })
            .await
            .unwrap()
    }

    /// Waits until `want` machines called within `secs` seconds.
    async fn wait_fresh(
        &self,
        want: i64,
        secs: f64,
        timeout: Duration,
        running: &mut [&mut ShepherdProcess],
    ) -> Duration {
        let started = Instant::now();
        loop {
            let n = self.fresh(secs).await;
            if n >= want {
                return started.elapsed();
            }
            keep_waiting(
                running,
                started.elapsed() < timeout,
                format_args!("{want} machines heartbeating ({n})"),
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the Equinix simulator saw more than `than` power cycles.
    async fn wait_for_reboots(&self, than: u64, timeout: Duration, s: &mut ShepherdProcess) {
        let deadline = Instant::now() + timeout;
        while self.reboots().await <= than {
            s.assert_running();
            assert!(
                Instant::now() < deadline,
                "no more than {than} power cycles: {}",
                s.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Power cycles the Equinix simulator saw.
    async fn reboots(&self) -> u64 {
        let stats = self.fleet.api_stats().await;
        stats["reboots"]
            .as_object()
            .map(|m| m.values().filter_map(|v| v.as_u64()).sum())
            .unwrap_or(0)
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
        running: &mut [&mut ShepherdProcess],
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.count(sql).await;
            if n >= want {
                return;
            }
            keep_waiting(
                running,
                Instant::now() < deadline,
                format_args!("{what} ({n}, want {want})"),
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

/// Every shepherd still runs and there is `time` left, or the test fails
/// naming what it waited for, with the shepherds' logs.
fn keep_waiting(running: &mut [&mut ShepherdProcess], time: bool, what: std::fmt::Arguments<'_>) {
    for s in running.iter_mut() {
        s.assert_running();
    }
    assert!(
        time,
        "timed out waiting for {what}:\n{}",
        running
            .iter()
            .map(|s| s.log_tail())
            .collect::<Vec<_>>()
            .join("\n----\n")
    );
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
async fn a_fleet_served_by_three_processes_is_taken_over_whole_each_machine_once() {
    // A fleet larger than one process serves (a listening socket per
    // machine) is served in shares: 30 machines, 10 a process, the first
    // with the Equinix API. One shepherd on the first's configuration.
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let dir = tempfile::tempdir().unwrap();
    let fleet = FleetShares::start(
        dir.path(),
        30,
        Ipv4Addr::new(127, 0, 88, 1),
        10,
        &["--agent-interval", "1s"],
    );
    assert_eq!(fleet.shares().len(), 3);
    let callback = format!("127.0.0.1:{}", Sshd::free_port());
    let mut s = ShepherdProcess::start(
        Path::new(SHEPHERD),
        &fleet.api().config,
        dir.path().join("shepherd.log"),
        &[
            ("SHEPHERD__BMDB__URL", db.url()),
            ("SHEPHERD__ADMIN__LISTEN", "127.0.0.1:0".into()),
            ("SHEPHERD__BMAAS__LISTEN", callback.clone()),
            ("SHEPHERD__BMAAS__ENDPOINT", callback),
            ("SHEPHERD__LOG__LEVEL", "info,tokio_postgres=warn".into()),
        ],
    );
    let started = Instant::now();
    loop {
        let n: i64 = bmdb
            .transact(async |tx| Ok(tx.query_one(HEARTBEATING, &[]).await?.get(0)))
            .await
            .unwrap();
        if n == 30 {
            break;
        }
        s.assert_running();
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{n} of 30 heartbeating; shepherd's log: {}",
            s.log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Each process ran its own ten machines' agents, once each.
    for (k, share) in fleet.shares().iter().enumerate() {
        let report = share.report().await;
        assert_eq!(report["machines"], 10, "share {k}: {report}");
        assert_eq!(report["taken_over"], 10, "share {k}: {report}");
        assert_eq!(report["agents_started"], 10, "share {k}: {report}");
        assert_eq!(report["taken_over_again"], serde_json::json!({}));
        let first = Ipv4Addr::new(127, 0, 88, 1 + 10 * k as u8);
        let ran = report["runs"].as_object().unwrap();
        assert!(
            ran.contains_key(&first.to_string()),
            "share {k} ran {:?}",
            ran.keys()
        );
    }
    // One create per device, all through the first process's API.
    let stats = fleet.api().api_stats().await;
    assert_eq!(create_requests(&stats), (30, 0), "{}", stats["statuses"]);
    assert_eq!(s.terminate(Duration::from_secs(20)), Some(0));
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
    // Each shepherd logs a takeover just after recording it: a's last lines
    // may trail the count, and b may have recorded up to its parallelism
    // (2) that it had no time to log before the kill.
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.log_count("agent started") + by_b < 100 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let by_a = a.log_count("agent started");
    assert!(
        by_a + by_b + 2 >= 100,
        "a logged {by_a} takeovers, b {by_b}"
    );
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

/// Recoveries begun, by any shepherd.
const RECOVERIES: &str =
    "SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery' AND event = 'Started'";

/// `n` shepherds behind one callback name (its addresses 127.0.`subnet`.201…),
/// all of a fleet's agents heartbeating; one is SIGKILLed and stays down:
/// its agents move to the others, and no machine is recovered.
async fn one_of_several_shepherds_dies(n: usize, subnet: u8) {
    // Agents call every 2 s: silence is 10 s (fleet-sim's configuration).
    let (rig, addrs) = Rig::behind_one_name(30, subnet, "2s", n).await;
    let admins: Vec<String> = addrs
        .iter()
        .map(|_| format!("127.0.0.1:{}", Sshd::free_port()))
        .collect();
    let mut shepherds: Vec<ShepherdProcess> = addrs
        .iter()
        .zip(&admins)
        .enumerate()
        .map(|(i, (a, admin))| rig.shepherd_at(&format!("s{i}"), a, admin, &[]))
        .collect();
    {
        let mut running: Vec<&mut ShepherdProcess> = shepherds.iter_mut().collect();
        rig.wait_fresh(30, 4.0, Duration::from_secs(180), &mut running)
            .await;
    }
    let mut dead = shepherds.pop().unwrap();
    dead.kill();
    let killed_at = Instant::now();
    // Every agent calls a survivor again: all 30 heard from since the kill.
    let moved = {
        let mut running: Vec<&mut ShepherdProcess> = shepherds.iter_mut().collect();
        loop {
            let since = killed_at.elapsed().as_secs_f64();
            // Heard from since the kill (the last heartbeat is newer).
            if rig.fresh(since).await >= 30 {
                break killed_at.elapsed();
            }
            for s in running.iter_mut() {
                s.assert_running();
            }
            assert!(
                killed_at.elapsed() < Duration::from_secs(30),
                "agents did not move"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    eprintln!("{n} shepherds, one killed: every agent heard from again within {moved:?}");
    // Past the threshold (10 s) and its grace (4 s) since the kill, and
    // the survivors' Recoverers have looked since: nothing recovered.
    {
        let mut running: Vec<&mut ShepherdProcess> = shepherds.iter_mut().collect();
        let survivors = &admins[..n - 1];
        until_recoverers_looked(survivors, killed_at, Duration::from_secs(15), &mut running).await;
    }
    assert_eq!(
        rig.fresh(4.0).await,
        30,
        "every machine heartbeating through a survivor"
    );
    assert_eq!(rig.count(RECOVERIES).await, 0, "no machine recovered");
    assert_eq!(rig.reboots().await, 0, "no machine rebooted");
    let report = rig.fleet.report().await;
    assert_eq!(report["agents_started"], 30, "no agent restarted: {report}");
    for s in shepherds.iter_mut() {
        assert_eq!(s.terminate(Duration::from_secs(20)), Some(0));
    }
}

#[actix_rt::test]
async fn when_one_of_two_shepherds_dies_its_agents_call_the_other_and_nothing_is_rebooted() {
    one_of_several_shepherds_dies(2, 24).await;
}

#[actix_rt::test]
async fn when_one_of_three_shepherds_dies_its_agents_call_the_others_and_nothing_is_rebooted() {
    one_of_several_shepherds_dies(3, 25).await;
}

#[actix_rt::test]
async fn a_shepherd_stopped_for_three_thresholds_reboots_nothing_on_its_return() {
    let (rig, listen) = Rig::behind_one_name(30, 26, "2s", 1).await;
    let listen = listen[0].as_str();
    let admin = format!("127.0.0.1:{}", Sshd::free_port());
    let mut a = rig.shepherd_at("a", listen, &admin, &[]);
    rig.wait_fresh(30, 4.0, Duration::from_secs(180), &mut [&mut a])
        .await;
    assert_eq!(a.terminate(Duration::from_secs(20)), Some(0));
    // Down until no agent was heard from for three times the 10 s
    // threshold.
    let deadline = Instant::now() + Duration::from_secs(60);
    while rig.fresh(30.0).await > 0 {
        assert!(
            Instant::now() < deadline,
            "agents heard from while it was down"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut a = rig.shepherd_at("a-again", listen, &admin, &[]);
    let returned = Instant::now();
    let back = rig
        .wait_fresh(30, 4.0, Duration::from_secs(60), &mut [&mut a])
        .await;
    eprintln!("every agent heard from again {back:?} after the restart");
    // Past the threshold and its grace after the return, and its
    // Recoverer has looked since: nothing recovered.
    until_recoverers_looked(
        std::slice::from_ref(&admin),
        returned,
        Duration::from_secs(15),
        &mut [&mut a],
    )
    .await;
    assert_eq!(rig.fresh(4.0).await, 30);
    assert_eq!(rig.count(RECOVERIES).await, 0, "no machine recovered");
    assert_eq!(rig.reboots().await, 0, "no machine rebooted");
    assert_eq!(rig.fleet.report().await["agents_started"], 30);
    assert_eq!(a.terminate(Duration::from_secs(20)), Some(0));
}

async fn post(url: String, body: Option<serde_json::Value>) -> (u16, serde_json::Value) {
    let req = awc::Client::default().post(&url);
    let mut r = match body {
        Some(b) => req.send_json(&b).await.unwrap(),
        None => req.send().await.unwrap(),
    };
    let status = r.status().as_u16();
    let body = r.body().limit(16 << 20).await.unwrap();
    (
        status,
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    )
}

async fn get_text(url: String) -> String {
    let mut r = awc::Client::default().get(&url).send().await.unwrap();
    assert!(r.status().is_success(), "{url}: {}", r.status());
    String::from_utf8_lossy(&r.body().limit(16 << 20).await.unwrap()).into_owned()
}

/// How many times the Recoverer of the shepherd whose admin server is
/// `admin` has looked for silent machines (its lease selections: leased,
/// nothing, lost), from its `/metrics`.
async fn recoverer_looks(admin: &str) -> u64 {
    let text = get_text(format!("http://{admin}/metrics")).await;
    text.lines()
        .filter(|l| {
            l.starts_with("shepherd_lease_selections_total{")
                && l.contains("process=\"ShepherdRecovery\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Waits until `window` has passed since `from` (silence past the
/// threshold and its grace: a machine silent by then is one a Recoverer
/// would take), then until the Recoverer of every shepherd at `admins`
/// has looked for silent machines twice more. "Nothing recovered" then
/// says the Recoverers looked and found nothing, not that a time went by.
async fn until_recoverers_looked(
    admins: &[String],
    from: Instant,
    window: Duration,
    running: &mut [&mut ShepherdProcess],
) {
    while from.elapsed() < window {
        keep_waiting(running, true, format_args!("the threshold"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut before = Vec::new();
    for a in admins {
        before.push(recoverer_looks(a).await);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    'wait: loop {
        keep_waiting(
            running,
            Instant::now() < deadline,
            format_args!("the Recoverers to look twice (at {admins:?})"),
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        for (a, b) in admins.iter().zip(&before) {
            if recoverer_looks(a).await < b + 2 {
                continue 'wait;
            }
        }
        return;
    }
}

#[actix_rt::test]
async fn a_partition_engages_the_brake_and_releasing_it_resumes_power_actions() {
    // Agents call every second: silence is 5 s.
    let (rig, listen) = Rig::behind_one_name(20, 27, "1s", 1).await;
    let listen = listen[0].as_str();
    let admin = format!("127.0.0.1:{}", Sshd::free_port());
    let mut a = rig.shepherd_at("a", listen, &admin, &[]);
    rig.wait_fresh(20, 3.0, Duration::from_secs(180), &mut [&mut a])
        .await;
    // Every machine cut off: agents stopped, SSH refused.
    let control = format!("http://{}/fleet", rig.fleet.control);
    let (st, cut) = post(format!("{control}/partition?count=20"), None).await;
    assert_eq!((st, cut.as_object().unwrap().len()), (200, 20));
    // The brake holds: at most its count (3) power-cycled.
    let deadline = Instant::now() + Duration::from_secs(60);
    let brake = loop {
        let b: serde_json::Value =
            serde_json::from_str(&get_text(format!("http://{admin}/api/v1/brake")).await).unwrap();
        if b["brake"]["engaged"] == true && b["brake"]["silent"].as_i64() > Some(3) {
            break b;
        }
        a.assert_running();
        assert!(Instant::now() < deadline, "the brake did not engage: {b}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(brake["brake"]["limit"], 3, "{brake}");
    // Every machine cut off judged silent, but those power-cycled before
    // the brake held (they are taken over again).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let b: serde_json::Value =
            serde_json::from_str(&get_text(format!("http://{admin}/api/v1/brake")).await).unwrap();
        let braked = rig.reboots().await as i64;
        if b["brake"]["silent"].as_i64() >= Some(20 - braked) {
            break;
        }
        a.assert_running();
        assert!(
            Instant::now() < deadline,
            "the cut-off machines were not all judged silent ({braked} power-cycled): {b}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The Recoverer has looked at them all silent again, braked.
    until_recoverers_looked(
        std::slice::from_ref(&admin),
        Instant::now(),
        Duration::ZERO,
        &mut [&mut a],
    )
    .await;
    let braked = rig.reboots().await;
    assert!(braked <= 3, "{braked} power cycles with the brake on");
    let metrics = get_text(format!("http://{admin}/metrics")).await;
    assert!(
        metrics.contains("shepherd_recovery_brake_engaged 1"),
        "{metrics}"
    );
    // The machines power-cycled before the brake held are taken over
    // again: no longer silent.
    let silent: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("shepherd_silent_machines "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!((20 - braked..=20).contains(&silent), "{metrics}");
    let page = get_text(format!("http://{admin}/")).await;
    assert!(
        page.contains("id=\"brake\"") && page.contains("Recovery brake engaged"),
        "{page}"
    );
    let ready = get_text(format!("http://{admin}/readyz")).await;
    assert!(ready.contains("\"engaged\":true"), "{ready}");
    assert!(
        a.log_count("RECOVERY BRAKE ENGAGED") >= 1,
        "{}",
        a.log_tail()
    );
    // An operator releases it (audited): power actions resume.
    let (st, v) = post(
        format!("http://{admin}/api/v1/brake/release"),
        Some(serde_json::json!({"reason": "the partition is real", "for": "5m"})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["action"]["actor"], "anonymous");
    rig.wait_for_reboots(braked.max(3), Duration::from_secs(90), &mut a)
        .await;
    // The partition heals: every machine comes back (taken over again).
    post(format!("{control}/reconnect"), None).await;
    rig.wait_fresh(20, 3.0, Duration::from_secs(180), &mut [&mut a])
        .await;
    assert_eq!(a.terminate(Duration::from_secs(20)), Some(0));
    assert_eq!(rig.count(WORK).await, 0, "no lease left without a worker");
}

#[actix_rt::test]
async fn a_killed_agent_is_restarted_over_ssh_and_a_machine_cut_off_is_power_cycled() {
    let (rig, listen) = Rig::behind_one_name(10, 28, "1s", 1).await;
    let listen = listen[0].as_str();
    let mut a = rig.shepherd_at("a", listen, "127.0.0.1:0", &[]);
    rig.wait_fresh(10, 3.0, Duration::from_secs(120), &mut [&mut a])
        .await;
    let control = format!("http://{}/fleet", rig.fleet.control);
    // Two agents killed; their machines' SSH answers.
    let (_, killed) = post(format!("{control}/silence?count=2"), None).await;
    assert_eq!(killed.as_object().unwrap().len(), 2);
    let restarted: &'static str = "SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery' \
         AND event = 'Finished' AND detail LIKE 'agent restarted%'";
    rig.wait_for(
        "two agents restarted",
        restarted,
        2,
        Duration::from_secs(60),
        &mut [&mut a],
    )
    .await;
    rig.wait_fresh(10, 3.0, Duration::from_secs(30), &mut [&mut a])
        .await;
    assert_eq!(
        rig.reboots().await,
        0,
        "no power action for an agent restarted in place"
    );
    // A machine cut off (agent and SSH gone): power-cycled.
    let (_, cut) = post(format!("{control}/partition?count=1"), None).await;
    assert_eq!(cut.as_object().unwrap().len(), 1);
    rig.wait_for_reboots(0, Duration::from_secs(60), &mut a)
        .await;
    post(format!("{control}/reconnect"), None).await;
    rig.wait_fresh(10, 3.0, Duration::from_secs(120), &mut [&mut a])
        .await;
    assert_eq!(rig.reboots().await, 1);
    let again: &'static str = "SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery' \
         AND event = 'Finished' AND detail LIKE 'rebooted%'";
    assert_eq!(rig.count(again).await, 1, "the history says how");
    assert_eq!(a.terminate(Duration::from_secs(20)), Some(0));
}

/// `(endpoint, agents told it)`, most agents first.
async fn agents_by_endpoint(bmdb: &Bmdb) -> Vec<(String, i64)> {
    shepherd_sim::testing::pairs(
        bmdb,
        "SELECT agent_endpoint, count(*) FROM machine_agent_started \
         GROUP BY 1 ORDER BY 2 DESC, 1",
    )
    .await
}

#[actix_rt::test]
async fn a_shepherd_gone_with_its_own_endpoint_has_its_agents_rehomed_without_a_power_action() {
    // Agents call every 2 s: silence is 10 s (fleet-sim's configuration).
    let rig = Rig::new(
        40,
        Ipv4Addr::new(127, 0, 28, 1),
        &["--agent-interval", "2s"],
    )
    .await;
    let endpoints: Vec<String> = (0..2)
        .map(|_| format!("127.0.0.1:{}", Sshd::free_port()))
        .collect();
    let start = |name: &str, endpoint: &str| {
        rig.shepherd(
            name,
            &[
                ("SHEPHERD__BMAAS__LISTEN", endpoint),
                ("SHEPHERD__BMAAS__ENDPOINT", endpoint),
                ("SHEPHERD__RECOVERER__REHOME_AFTER", "10s"),
                ("SHEPHERD__RECOVERER__BACKOFF_INITIAL", "2s"),
            ],
        )
    };
    let mut shepherds = vec![start("a", &endpoints[0]), start("b", &endpoints[1])];
    {
        let mut running: Vec<&mut ShepherdProcess> = shepherds.iter_mut().collect();
        rig.wait_fresh(40, 4.0, Duration::from_secs(180), &mut running)
            .await;
    }
    // The shepherd whose endpoint most agents were told is killed, and
    // stays down.
    let told = agents_by_endpoint(&rig.bmdb).await;
    let (dead_endpoint, orphans) = told[0].clone();
    let dead = endpoints.iter().position(|e| *e == dead_endpoint).unwrap();
    let mut survivor = shepherds.remove(1 - dead);
    let mut killed = shepherds.remove(0);
    killed.kill();
    let killed_at = Instant::now();
    eprintln!("killed the shepherd at {dead_endpoint}, told to {orphans} agents");
    // Within the grace (10 s) plus a minute every agent calls the survivor.
    loop {
        if rig.fresh(killed_at.elapsed().as_secs_f64()).await >= 40 {
            break;
        }
        keep_waiting(
            &mut [&mut survivor],
            killed_at.elapsed() < Duration::from_secs(70),
            format_args!("40 agents calling the survivor"),
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "every agent heard from {:?} after the kill",
        killed_at.elapsed()
    );
    let survivor_endpoint = &endpoints[1 - dead];
    assert_eq!(
        agents_by_endpoint(&rig.bmdb).await,
        [(survivor_endpoint.clone(), 40)],
        "every agent now told the survivor's endpoint"
    );
    assert_eq!(rig.reboots().await, 0, "no power action");
    const REHOMED: &str = "SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery' \
         AND event = 'Finished' AND detail LIKE 'agent re-homed over SSH%'";
    // Each re-homing ends once its agent called: the history names the
    // step for each orphan, and for no other machine.
    rig.wait_for(
        "every orphan's re-homing recorded",
        REHOMED,
        orphans,
        Duration::from_secs(30),
        &mut [&mut survivor],
    )
    .await;
    assert_eq!(rig.count(REHOMED).await, orphans);
    survivor.assert_running();
    assert_eq!(survivor.terminate(Duration::from_secs(20)), Some(0));
}
