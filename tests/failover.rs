//! The BMDB on a highly available PostgreSQL cluster (`scripts/pg-cluster`:
//! etcd and three servers under Patroni, synchronous replication), under
//! two shepherds taking a `fleet-sim` fleet over while its agents
//! heartbeat: a planned switchover fails no takeover, and the primary
//! killed mid-run (SIGKILL of its postmaster) loses nothing that was
//! committed, takes nothing over twice and leaves no lease behind.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use shepherd::bmdb::Bmdb;
use shepherd_sim::testing::{FleetSimProcess, ShepherdProcess, Sshd, TestDb};

const SHEPHERD: &str = env!("CARGO_BIN_EXE_shepherd");
const PG_CLUSTER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-cluster");

const MACHINES: usize = 120;
/// The cluster's first PostgreSQL port (the documented default is 15432;
/// another here, so that a cluster an operator tries does not collide).
const CLUSTER_PORT: u16 = 14432;

/// A Patroni cluster started by the project's script, stopped on drop.
struct PgCluster {
    dir: tempfile::TempDir,
    url: String,
}

#[derive(Debug, Clone, serde::Deserialize)]
struct Member {
    name: String,
    role: String,
    state: String,
}

impl PgCluster {
    fn script(dir: &Path, cmd: &str) -> std::process::Output {
        std::process::Command::new(PG_CLUSTER)
            .arg(cmd)
            .arg(dir)
            .env("SHEPHERD_PG_CLUSTER_PORT", CLUSTER_PORT.to_string())
            .output()
            .expect("run scripts/pg-cluster")
    }

    fn start() -> PgCluster {
        let dir = tempfile::Builder::new()
            .prefix("shepherd-pg-cluster-")
            .tempdir()
            .unwrap();
        let out = Self::script(dir.path(), "start");
        if !out.status.success() {
            // Nothing of a cluster that never came up is left running.
            let logs = Self::logs_in(dir.path());
            Self::script(dir.path(), "stop");
            panic!(
                "scripts/pg-cluster start: {}\n{logs}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let url = String::from_utf8(out.stdout).unwrap().trim().to_string();
        assert!(url.contains("target_session_attrs=read-write"), "{url}");
        PgCluster { dir, url }
    }

    /// The last lines of etcd's and each Patroni's log.
    fn logs_in(dir: &Path) -> String {
        ["etcd.log", "node1.log", "node2.log", "node3.log"]
            .iter()
            .map(|f| {
                let t = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
                let tail: Vec<&str> = t.lines().rev().take(20).collect();
                format!(
                    "== {f}\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn logs(&self) -> String {
        Self::logs_in(self.dir.path())
    }

    /// Waits until there is a primary, a synchronous standby and a
    /// replica, all running: a failover can then happen.
    async fn wait_healthy(&self, timeout: Duration) {
        let started = Instant::now();
        loop {
            let members = self.members().await;
            let running = |role: &str| {
                members
                    .iter()
                    .any(|m| m.role == role && (m.state == "running" || m.state == "streaming"))
            };
            if running("leader")
                && running("sync_standby")
                && members
                    .iter()
                    .all(|m| m.state == "running" || m.state == "streaming")
            {
                return;
            }
            assert!(
                started.elapsed() < timeout,
                "the cluster is not whole again: {members:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The connection string for database `db`.
    fn url_for(&self, db: &str) -> String {
        self.url.replace("dbname=postgres", &format!("dbname={db}"))
    }

    fn api(&self) -> String {
        format!("http://127.0.0.1:{}", CLUSTER_PORT + 2576)
    }

    /// The members as Patroni lists them (asked of whichever REST API
    /// answers: the one of a killed primary's node still does).
    async fn members(&self) -> Vec<Member> {
        loop {
            for i in 0..3u16 {
                let url = format!("http://127.0.0.1:{}/cluster", CLUSTER_PORT + 2576 + i);
                if let Ok(mut r) = awc::Client::default()
                    .get(&url)
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await
                    && let Ok(v) = r.json::<serde_json::Value>().await
                {
                    return serde_json::from_value(v["members"].clone()).unwrap();
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn leader(&self) -> Option<Member> {
        self.members()
            .await
            .into_iter()
            .find(|m| m.role == "leader" && m.state == "running")
    }

    /// The postmaster's pid of member `m`.
    fn postmaster(&self, m: &Member) -> i32 {
        let pid = std::fs::read_to_string(
            self.dir
                .path()
                .join(&m.name)
                .join("data")
                .join("postmaster.pid"),
        )
        .unwrap();
        pid.lines().next().unwrap().trim().parse().unwrap()
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = Self::script(self.dir.path(), "stop");
    }
}

/// Runs `sql` (a count) until the cluster answers.
async fn count(bmdb: &Bmdb, sql: &'static str) -> i64 {
    loop {
        match bmdb
            .transact(async |tx| Ok(tx.query_one(sql, &[]).await?.get::<_, i64>(0)))
            .await
        {
            Ok(n) => return n,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The machines with a started agent, as recorded.
async fn taken_over(bmdb: &Bmdb) -> Vec<uuid::Uuid> {
    loop {
        let r = bmdb
            .transact(async |tx| {
                Ok(tx
                    .query(
                        "SELECT machine_id FROM machine_agent_started ORDER BY machine_id",
                        &[],
                    )
                    .await?
                    .iter()
                    .map(|r| r.get(0))
                    .collect::<Vec<uuid::Uuid>>())
            })
            .await;
        match r {
            Ok(v) => return v,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// When a shepherd last wrote: the newest agent heartbeat it recorded
/// (agents call every second) or session poke (each sets the deadline one
/// interval past its own time).
async fn last_write(bmdb: &Bmdb) -> Option<SystemTime> {
    bmdb.transact(async |tx| {
        Ok(tx
            .query_one(
                "SELECT greatest( \
                   (SELECT max(agent_heartbeat_at) FROM machine_agent_heartbeat), \
                   (SELECT max(session_deadline - make_interval(secs => session_interval_seconds)) FROM sessions))",
                &[],
            )
            .await?
            .get::<_, Option<SystemTime>>(0))
    })
    .await
    .ok()
    .flatten()
}

fn assert_running(shepherds: &mut [&mut ShepherdProcess]) {
    for s in shepherds.iter_mut() {
        s.assert_running();
    }
}

async fn wait_for(
    bmdb: &Bmdb,
    what: &str,
    sql: &'static str,
    want: i64,
    timeout: Duration,
    shepherds: &mut [&mut ShepherdProcess],
) {
    let deadline = Instant::now() + timeout;
    loop {
        let n = count(bmdb, sql).await;
        if n >= want {
            return;
        }
        assert_running(shepherds);
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what} ({n}, want {want}):\n{}",
            shepherds
                .iter()
                .map(|s| s.log_tail())
                .collect::<Vec<_>>()
                .join("\n----\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A counter's value in a shepherd's /metrics (0 when absent).
async fn metric(admin: &str, series: &str) -> f64 {
    let mut r = awc::Client::default()
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap();
    let body = r.body().limit(16 << 20).await.unwrap();
    let text = String::from_utf8_lossy(&body);
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

const TAKEN_OVER: &str = "SELECT count(*) FROM machine_agent_started";
const HEARTBEATING: &str = "SELECT count(*) FROM machine_agent_heartbeat \
                            JOIN machine_agent_started USING (machine_id)";
const TAKEOVERS_FAILED: &str =
    "SELECT count(*) FROM work_history WHERE process = 'ShepherdAgentStart' AND event = 'Failed'";
const BACKOFFS: &str = "SELECT count(*) FROM work_backoff";
const WORK: &str = "SELECT count(*) FROM work";
/// Leases whose session is dead or gone: held by no worker.
const ORPHANED_WORK: &str = "SELECT count(*) FROM work w LEFT JOIN sessions s USING (session_id) \
                             WHERE s.session_id IS NULL OR s.session_deadline < now()";

#[actix_rt::test]
async fn the_bmdb_fails_over_under_two_shepherds_and_nothing_committed_is_lost() {
    let cluster = PgCluster::start();
    // The BMDB's own database on the cluster, made through the primary.
    TestDb::create_database(&cluster.url, "bmdb").await;
    let url = cluster.url_for("bmdb");
    let bmdb = TestDb::connect_url(&url).await;
    bmdb.migrate().await.unwrap();

    // A connection that lands on a standby (here: one made to it on
    // purpose) cannot write: that is a lost connection, retried and then
    // reported as the database being unreachable, never a bug.
    let standby = cluster
        .members()
        .await
        .into_iter()
        .find(|m| m.role != "leader")
        .expect("a standby");
    let standby_pid = cluster.postmaster(&standby);
    let port = std::fs::read_to_string(
        cluster
            .dir
            .path()
            .join(&standby.name)
            .join("data")
            .join("postmaster.pid"),
    )
    .unwrap()
    .lines()
    .nth(3)
    .unwrap()
    .trim()
    .to_string();
    assert!(standby_pid > 0);
    let on_standby = TestDb::connect_url(&format!(
        "host=127.0.0.1 port={port} user=postgres dbname=bmdb target_session_attrs=any"
    ))
    .await;
    let write = on_standby
        .query_idempotent(
            "DELETE FROM sessions WHERE session_deadline < now() - interval '1 day'",
            &[],
        )
        .await;
    match write {
        Err(shepherd::bmdb::BmdbError::Unreachable(m)) => {
            assert!(m.contains("read-only"), "{m}")
        }
        other => panic!("a write on a standby: {other:?}"),
    }

    let dir = tempfile::tempdir().unwrap();
    let fleet = FleetSimProcess::start(
        &shepherd_sim::bin("fleet-sim"),
        dir.path(),
        MACHINES,
        Ipv4Addr::new(127, 0, 40, 1),
        &["--agent-interval", "1s"],
    );
    let shepherd = |name: &str, admin: &str| {
        let callback = format!("127.0.0.1:{}", Sshd::free_port());
        ShepherdProcess::start(
            Path::new(SHEPHERD),
            &fleet.config,
            dir.path().join(format!("{name}.log")),
            &[
                ("SHEPHERD__BMDB__URL", url.clone()),
                ("SHEPHERD__BMDB__SESSION_INTERVAL", "10s".into()),
                ("SHEPHERD__BMDB__SESSION_GC_GRACE", "5s".into()),
                ("SHEPHERD__ADMIN__LISTEN", admin.into()),
                ("SHEPHERD__BMAAS__LISTEN", callback.clone()),
                ("SHEPHERD__BMAAS__ENDPOINT", callback),
                ("SHEPHERD__INITIALIZER__PARALLELISM", "1".into()),
                ("SHEPHERD__LOG__LEVEL", "info,tokio_postgres=warn".into()),
            ],
        )
    };
    let admin_a = format!("127.0.0.1:{}", Sshd::free_port());
    let admin_b = format!("127.0.0.1:{}", Sshd::free_port());
    let mut a = shepherd("a", &admin_a);
    let mut b = shepherd("b", &admin_b);

    // A planned switchover while the fleet is being taken over.
    wait_for(
        &bmdb,
        "10 taken over",
        TAKEN_OVER,
        10,
        Duration::from_secs(180),
        &mut [&mut a, &mut b],
    )
    .await;
    let before = cluster.members().await;
    let leader = before.iter().find(|m| m.role == "leader").unwrap().clone();
    let candidate = before
        .iter()
        .find(|m| m.role == "sync_standby")
        .expect("a synchronous standby")
        .clone();
    let mut r = awc::Client::default()
        .post(format!("{}/switchover", cluster.api()))
        .timeout(Duration::from_secs(60))
        .send_json(&serde_json::json!({ "leader": leader.name, "candidate": candidate.name }))
        .await
        .unwrap();
    let answer = r.body().await.unwrap();
    assert!(
        r.status().is_success(),
        "switchover: {} {}",
        r.status(),
        String::from_utf8_lossy(&answer)
    );
    let switched = Instant::now();
    loop {
        if let Some(l) = cluster.leader().await
            && l.name == candidate.name
        {
            break;
        }
        assert!(
            switched.elapsed() < Duration::from_secs(60),
            "no new leader after the switchover\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let at_switchover = count(&bmdb, TAKEN_OVER).await;
    wait_for(
        &bmdb,
        "10 more taken over after the switchover",
        TAKEN_OVER,
        at_switchover + 10,
        Duration::from_secs(180),
        &mut [&mut a, &mut b],
    )
    .await;
    assert_eq!(
        count(&bmdb, TAKEOVERS_FAILED).await,
        0,
        "a takeover failed in the switchover"
    );
    assert_eq!(
        count(&bmdb, BACKOFFS).await,
        0,
        "a machine was backed off in the switchover"
    );

    // The primary killed, with a synchronous standby to take over: what
    // was committed before is there after.
    cluster.wait_healthy(Duration::from_secs(60)).await;
    let primary = cluster.leader().await.expect("a primary");
    let committed = taken_over(&bmdb).await;
    assert!(
        committed.len() < MACHINES - 20,
        "the fleet was nearly done before the kill ({} taken over): the kill is to land mid-run",
        committed.len()
    );
    let retried_before = metric(
        &admin_a,
        "shepherd_bmdb_transactions_total{outcome=\"retried-connection\"}",
    )
    .await
        + metric(
            &admin_b,
            "shepherd_bmdb_transactions_total{outcome=\"retried-connection\"}",
        )
        .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(cluster.postmaster(&primary)),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let killed = Instant::now();
    let killed_at = SystemTime::now();
    let promoted = loop {
        if let Some(l) = cluster.leader().await
            && l.name != primary.name
        {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(90),
            "no other primary after the kill: {:?}\n{}",
            cluster.members().await,
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let wrote = loop {
        if last_write(&bmdb).await.is_some_and(|t| t > killed_at) {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(120),
            "no shepherd wrote after the failover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let after = taken_over(&bmdb).await;
    let lost: Vec<_> = committed.iter().filter(|m| !after.contains(m)).collect();
    assert!(
        lost.is_empty(),
        "takeovers committed before the kill are gone: {lost:?}"
    );

    // The fleet finishes, each machine taken over once, nothing harmed.
    wait_for(
        &bmdb,
        "every machine heartbeating",
        HEARTBEATING,
        MACHINES as i64,
        Duration::from_secs(300),
        &mut [&mut a, &mut b],
    )
    .await;
    let report = fleet.report().await;
    assert_eq!(report["taken_over"], MACHINES, "{report}");
    assert_eq!(report["agents_started"], MACHINES, "{report}");
    assert_eq!(
        report["taken_over_again"],
        serde_json::json!({}),
        "{report}"
    );
    let stats = fleet.api_stats().await;
    let reboots: u64 = stats["reboots"]
        .as_object()
        .map(|m| m.values().filter_map(|v| v.as_u64()).sum())
        .unwrap_or(0);
    assert_eq!(reboots, 0, "a machine was rebooted: {stats}");
    // No lease is left behind: none without a live session now, and none
    // at all once the work is done.
    assert_eq!(count(&bmdb, ORPHANED_WORK).await, 0);
    let settled = Instant::now();
    while count(&bmdb, WORK).await > 0 {
        assert!(
            settled.elapsed() < Duration::from_secs(30),
            "leases still held with the fleet done"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let mut figures = Vec::new();
    let mut sessions_lost = 0.0;
    let mut retried = -retried_before;
    let mut unknown = 0.0;
    for admin in [&admin_a, &admin_b] {
        sessions_lost += metric(admin, "shepherd_sessions_total{event=\"lost\"}").await;
        retried += metric(
            admin,
            "shepherd_bmdb_transactions_total{outcome=\"retried-connection\"}",
        )
        .await;
        unknown += metric(
            admin,
            "shepherd_bmdb_transactions_total{outcome=\"commit-unknown\"}",
        )
        .await;
    }
    figures.push((
        "primary killed → new primary",
        format!("{:.1} s", promoted.as_secs_f64()),
    ));
    figures.push((
        "primary killed → shepherd writes",
        format!("{:.1} s", wrote.as_secs_f64()),
    ));
    figures.push((
        "new primary → shepherd writes",
        format!("{:.1} s", wrote.saturating_sub(promoted).as_secs_f64()),
    ));
    figures.push((
        "transactions run again (lost connection)",
        format!("{retried}"),
    ));
    figures.push(("commits with unknown outcome", format!("{unknown}")));
    figures.push(("sessions lost (of 2)", format!("{sessions_lost}")));
    let mut failed = 0.0;
    for admin in [&admin_a, &admin_b] {
        failed += metric(
            admin,
            "shepherd_bmdb_transactions_total{outcome=\"failed\"}",
        )
        .await;
    }
    figures.push(("transactions that returned an error", format!("{failed}")));
    figures.push((
        "takeovers failed (and backed off)",
        format!("{}", count(&bmdb, TAKEOVERS_FAILED).await),
    ));
    figures.push((
        "takeovers committed before the kill, kept",
        format!(
            "{} of {} (fleet of {MACHINES})",
            after.iter().filter(|m| committed.contains(m)).count(),
            committed.len()
        ),
    ));
    if std::env::var_os("SHEPHERD_TEST_SHOW_LOGS").is_some() {
        for s in [&a, &b] {
            for l in std::fs::read_to_string(&s.log).unwrap().lines() {
                if l.contains("WARN") || l.contains("ERROR") {
                    println!("{l}");
                }
            }
        }
    }
    println!("\nfailover figures");
    for (k, v) in figures {
        println!("  {k:<44} {v}");
    }
    // Writing again is a matter of seconds once there is a primary.
    assert!(
        wrote.saturating_sub(promoted) < Duration::from_secs(20),
        "shepherd wrote {wrote:?} after the kill, the primary was there after {promoted:?}"
    );
    assert_eq!(a.terminate(Duration::from_secs(30)), Some(0));
    assert_eq!(b.terminate(Duration::from_secs(30)), Some(0));
}
