//! BMDB benchmark: selector latency and lease+finish throughput, with
//! pgbench running the reference's write set on the same server for scale.
//!
//!     cargo bench --bench bmdb
//!
//! Environment: SHEPHERD_BENCH_SCALES (default "10000,100000"; add 1000000
//! for the sub-linear growth check), SHEPHERD_BENCH_SECONDS (per throughput
//! run, default 5), SHEPHERD_BENCH_READS_ONLY (no throughput runs), SHEPHERD_TEST_DATABASE_URL (else 127.0.0.1:5432, else an
//! embedded server).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use shepherd::bmdb::machines;
use shepherd::bmdb::selectors::{self, RecoveryThresholds};
use shepherd::bmdb::{Bmdb, Process, Provider, Tx};
use shepherd::config::Isolation;
use shepherd_sim::testing::TestDb;

const SELECTOR_SAMPLES: usize = 2000;
/// An operator's reads are slower (the fleet page counts every machine's
/// state): fewer samples.
const READ_SAMPLES: usize = 200;

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn exec(bmdb: &Bmdb, sql: &'static str) {
    bmdb.transact(async |tx| tx.execute(sql, &[]).await)
        .await
        .unwrap();
}

/// N provided machines with deterministic IDs (…-<hex n>), agent started two
/// hours ago, heartbeat fresh: nothing is due.
async fn seed(cfg: &tokio_postgres::Config, n: i64) {
    let n = n.to_string();
    let t = Instant::now();
    let client_sql = [
        "INSERT INTO machines (machine_id) SELECT ('00000000-0000-0000-0000-' || lpad(to_hex(i), 12, '0'))::uuid \
         FROM generate_series(1, $N) i",
        // A hundred racks, a machine in each in turn.
        "INSERT INTO machine_provided (machine_id, provider, provider_id, provider_ip_address, provider_location) \
         SELECT machine_id, 'Equinix', machine_id::text, '127.0.0.1', \
                'rack-' || (('x' || right(machine_id::text, 8))::bit(32)::int % 100) FROM machines",
        // Plans as the plan-labels round leaves them: 1 % big, the rest small.
        "INSERT INTO machine_plan (machine_id, plan, stale, labeled_at) \
         SELECT machine_id, CASE WHEN ('x' || right(machine_id::text, 8))::bit(32)::int % 100 = 7 \
                                 THEN 'big' ELSE 'small' END, false, now() FROM machines",
        "INSERT INTO machine_agent_started SELECT machine_id, now() - interval '2 hours', '\\x00', \
         'callback.test:7830' FROM machines",
        "INSERT INTO machine_agent_heartbeat SELECT machine_id, now() FROM machines",
        // The agents' endpoint, served for a day: silence is judgeable.
        "INSERT INTO callback_endpoint VALUES ('callback.test:7830', now() - interval '1 day', now() + interval '1 day') \
         ON CONFLICT DO NOTHING",
    ];
    let mut cfg_sql: Vec<String> = client_sql.iter().map(|s| s.replace("$N", &n)).collect();
    // The summary's state and tally kept as the migration backfills them,
    // once, instead of row by row through the seed's four statements.
    cfg_sql.insert(0, "ALTER TABLE machine_summary DISABLE TRIGGER USER".into());
    cfg_sql.extend(
        [
            "UPDATE machine_summary s SET state = machine_state(s), state_until = machine_state_until(s)",
            "SELECT machine_tally_rebuild()",
            "ALTER TABLE machine_summary ENABLE TRIGGER USER",
        ]
        .map(String::from),
    );
    raw(cfg, &cfg_sql).await;
    raw(cfg, &["VACUUM ANALYZE".to_string()]).await;
    eprintln!("seeded {n} machines in {:.1}s", t.elapsed().as_secs_f64());
}

/// What the fleet-tally round does between two rounds of writes: the
/// seed's deltas folded, so the reads measure the tally as it runs.
async fn settle(bmdb: &Bmdb, cfg: &tokio_postgres::Config) {
    let t = Instant::now();
    let s = bmdb
        .transact(async |tx| machines::settle(tx).await)
        .await
        .unwrap();
    raw(
        cfg,
        &["VACUUM ANALYZE machine_tally_delta, machine_summary".to_string()],
    )
    .await;
    eprintln!("settled: {s:?} in {:.1}s", t.elapsed().as_secs_f64());
}

/// Runs statements as simple queries outside a transaction (bulk loads with
/// N spliced in, VACUUM) on a dedicated connection.
async fn raw(cfg: &tokio_postgres::Config, sql: &[String]) {
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.unwrap();
    actix_rt::spawn(conn);
    for s in sql {
        client
            .batch_execute(s)
            .await
            .unwrap_or_else(|e| panic!("{s}: {e:?}"));
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// How a measured read runs: in a plain transaction, or in a snapshot
/// (`Bmdb::snapshot`, REPEATABLE READ).
#[derive(Clone, Copy, PartialEq)]
enum Read {
    Transaction,
    Snapshot,
}

/// p50 and p99 in ms of one read (a transaction running it), over
/// `samples` after a tenth as many to warm up.
async fn measure(
    bmdb: &Bmdb,
    read: Read,
    samples: usize,
    f: impl AsyncFn(&mut Tx<'_>) -> usize,
) -> (f64, f64, usize) {
    let once = async || match read {
        Read::Transaction => bmdb.transact(async |tx| Ok(f(tx).await)).await.unwrap(),
        Read::Snapshot => bmdb.snapshot(async |tx| Ok(f(tx).await)).await.unwrap(),
    };
    let mut found = 0;
    for _ in 0..samples / 10 {
        once().await;
    }
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        found = once().await;
        times.push(t.elapsed());
    }
    times.sort();
    (percentile(&times, 0.5), percentile(&times, 0.99), found)
}

/// One machine's detail, as the API and the page read it.
async fn detail(tx: &mut Tx<'_>) -> usize {
    let id = uuid::Uuid::from_u128(1);
    usize::from(machines::detail(tx, id).await.unwrap().is_some())
}

/// A heartbeat older than this is silent. The bench writes the fleet's
/// heartbeats once, where agents write theirs every few seconds: the
/// threshold is long enough for them to stay fresh through the
/// measurements (with the Recoverer's minute, the whole fleet went silent
/// a minute into them, and the silent count, a range of the heartbeat
/// index, grew to every machine: what made the reads at 1M look not flat
/// in earlier runs). The 1 % made stale are an hour old: still silent.
const STALE_AFTER: Duration = Duration::from_secs(30 * 60);

/// The API's fleet list (`GET /api/v1/machines`) with `filter`: the first
/// page of 100, what the filter matches, the tally and the agents.
async fn listed(tx: &mut Tx<'_>, filter: machines::FleetFilter) -> usize {
    let l = machines::Listing::read(tx, &filter, (100, 0), STALE_AFTER)
        .await
        .unwrap();
    l.machines.len()
}

/// The whole fleet.
async fn fleet_list(tx: &mut Tx<'_>) -> usize {
    listed(tx, Default::default()).await
}

/// One state (a click on the drawn life cycle).
async fn fleet_list_state(tx: &mut Tx<'_>) -> usize {
    let state = Some(machines::MachineState::Pending);
    listed(
        tx,
        machines::FleetFilter {
            state,
            ..Default::default()
        },
    )
    .await
}

/// One rack of a hundred (1 % of the fleet): a filter beyond the state,
/// read from its index and counted up to its cap.
async fn fleet_list_location(tx: &mut Tx<'_>) -> usize {
    let location = Some("rack-7".into());
    listed(
        tx,
        machines::FleetFilter {
            location,
            ..Default::default()
        },
    )
    .await
}

/// The plan 1 % of the fleet is labeled with.
async fn fleet_list_plan(tx: &mut Tx<'_>) -> usize {
    let plan = Some("big".into());
    listed(
        tx,
        machines::FleetFilter {
            plan,
            ..Default::default()
        },
    )
    .await
}

/// Everything the fleet page reads, in its snapshot: the list, the
/// activity chart, the sessions, the brake, the callback endpoints, the
/// installations under way and the projects (the filter's choices).
async fn fleet_page(tx: &mut Tx<'_>) -> usize {
    let n = fleet_list(tx).await;
    shepherd::bmdb::overview::activity(tx, Duration::from_secs(600), 36)
        .await
        .unwrap();
    shepherd::bmdb::overview::sessions(tx).await.unwrap();
    let judge = shepherd::bmdb::brake::Judge::new(
        &shepherd::config::RecovererConfig::default(),
        Provider::Equinix,
        None,
    );
    shepherd::bmdb::brake::state(tx, &judge).await.unwrap();
    shepherd::bmdb::callback::endpoints(tx).await.unwrap();
    shepherd::bmdb::installations::under_way(tx, 50)
        .await
        .unwrap();
    shepherd::bmdb::tenants::project_names(tx).await.unwrap();
    n
}

/// What `/metrics` reads of the fleet: the tally and the agents.
async fn metrics_counts(tx: &mut Tx<'_>) -> usize {
    let counts = machines::fleet_counts(tx).await.unwrap();
    machines::agent_counts(tx, STALE_AFTER).await.unwrap();
    counts.len()
}

async fn agent_start(tx: &mut Tx<'_>) -> usize {
    selectors::needs_agent_start(tx, Provider::Equinix, 1)
        .await
        .unwrap()
        .len()
}

async fn recovery(tx: &mut Tx<'_>) -> usize {
    selectors::needs_recovery(
        tx,
        Provider::Equinix,
        1,
        RecoveryThresholds::default(),
        Some(shepherd_sim::testing::TEST_ENDPOINT),
    )
    .await
    .unwrap()
    .len()
}

/// lease (needs agent start) + finish (AgentStarted) cycles per second, over
/// `seconds` or until 80 % of the `machines` are taken over.
async fn cycles(bmdb: &Bmdb, machines: i64, leasers: usize, seconds: u64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..leasers {
        let bmdb = bmdb.clone();
        let (done, stop) = (done.clone(), stop.clone());
        tasks.push(actix_rt::spawn(async move {
            let s = bmdb
                .start_session(&format!("bench-{i}"), Some(Duration::from_secs(60)))
                .await
                .unwrap();
            while !stop.load(Ordering::Relaxed) {
                let leased = s
                    .lease(Process::ShepherdAgentStart, async |tx: &mut Tx<'_>| {
                        Ok(selectors::needs_agent_start(tx, Provider::Equinix, 1)
                            .await?
                            .pop()
                            .map(|m| (m.machine_id, ())))
                    })
                    .await
                    .unwrap();
                let Some(mut w) = leased else {
                    panic!("ran out of machines needing agent start");
                };
                let mid = w.machine_id();
                w.finish(async |tx| machines::set_agent_started(tx, mid, &[1u8; 32], None).await)
                    .await
                    .unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
            s.close().await.unwrap();
        }));
    }
    // Measure a steady window, after the sessions have opened.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (c0, t0) = (done.load(Ordering::Relaxed), Instant::now());
    let budget = (machines as u64) * 8 / 10;
    while t0.elapsed() < Duration::from_secs(seconds) && done.load(Ordering::Relaxed) < budget {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (c1, t1) = (done.load(Ordering::Relaxed), Instant::now());
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    (c1 - c0) as f64 / (t1 - t0).as_secs_f64()
}

const PGBENCH_SCRIPT: &str = r#"\set n :client_id + 1
BEGIN;
SELECT session_id FROM sessions WHERE session_id = CAST(:sid AS uuid) AND session_deadline > now();
INSERT INTO work (machine_id, session_id, process) VALUES (CAST('00000000-0000-0000-0000-' || lpad(to_hex(CAST(:n AS int)), 12, '0') AS uuid), CAST(:sid AS uuid), 'ShepherdAgentStart');
INSERT INTO work_history (machine_id, process, event, "timestamp") VALUES (CAST('00000000-0000-0000-0000-' || lpad(to_hex(CAST(:n AS int)), 12, '0') AS uuid), 'ShepherdAgentStart', 'Started', now());
COMMIT;
BEGIN;
SELECT session_id FROM sessions WHERE session_id = CAST(:sid AS uuid) AND session_deadline > now();
DELETE FROM work WHERE machine_id = CAST('00000000-0000-0000-0000-' || lpad(to_hex(CAST(:n AS int)), 12, '0') AS uuid) AND session_id = CAST(:sid AS uuid) AND process = 'ShepherdAgentStart';
DELETE FROM work_backoff WHERE machine_id = CAST('00000000-0000-0000-0000-' || lpad(to_hex(CAST(:n AS int)), 12, '0') AS uuid) AND process = 'ShepherdAgentStart';
INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key) VALUES (CAST('00000000-0000-0000-0000-' || lpad(to_hex(CAST(:n AS int)), 12, '0') AS uuid), now(), '\x00') ON CONFLICT (machine_id) DO UPDATE SET agent_started_at = EXCLUDED.agent_started_at;
INSERT INTO work_history (machine_id, process, event, "timestamp") VALUES (CAST('00000000-0000-0000-0000-' || lpad(to_hex(CAST(:n AS int)), 12, '0') AS uuid), 'ShepherdAgentStart', 'Finished', now());
COMMIT;
"#;

/// The reference's lease+finish write set with `clients` clients (each on
/// its own machine): cycles per second.
fn pgbench(
    cfg: &tokio_postgres::Config,
    session_id: uuid::Uuid,
    clients: usize,
    seconds: u64,
) -> Option<f64> {
    shepherd_sim::testing::pgbench(
        cfg,
        PGBENCH_SCRIPT,
        clients,
        seconds,
        &[("sid", session_id.to_string())],
    )
}

struct SelectorRow {
    machines: i64,
    selector: &'static str,
    state: &'static str,
    p50: f64,
    p99: f64,
    found: usize,
}

struct CycleRow {
    machines: i64,
    leasers: usize,
    rate: f64,
    pgbench: Option<f64>,
}

fn main() {
    let scales: Vec<i64> = std::env::var("SHEPHERD_BENCH_SCALES")
        .unwrap_or_else(|_| "10000,100000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let seconds: u64 = env_or("SHEPHERD_BENCH_SECONDS", 5);
    actix_rt::System::new().block_on(async move {
        let mut selector_rows = Vec::new();
        let mut cycle_rows = Vec::new();
        let mut read_rows = Vec::new();
        let mut server = String::new();
        for &n in &scales {
            let db = TestDb::new().await;
            let bmdb = db.bmdb_with(TestDb::options(Isolation::ReadCommitted), 40).await;
            if server.is_empty() {
                server = bmdb
                    .transact(async |tx| {
                        let r = tx
                            .query_one(
                                "SELECT current_setting('server_version'), current_setting('synchronous_commit'), \
                                 current_setting('fsync')",
                                &[],
                            )
                            .await?;
                        Ok(format!(
                            "PostgreSQL {}, synchronous_commit={}, fsync={}",
                            r.get::<_, String>(0),
                            r.get::<_, String>(1),
                            r.get::<_, String>(2)
                        ))
                    })
                    .await
                    .unwrap();
            }
            seed(&db.config, n).await;
            settle(&bmdb, &db.config).await;

            for (selector, f) in [("needs agent start", 0), ("needs recovery", 1)] {
                let (p50, p99, found) = if f == 0 {
                    measure(&bmdb, Read::Transaction, SELECTOR_SAMPLES, agent_start).await
                } else {
                    measure(&bmdb, Read::Transaction, SELECTOR_SAMPLES, recovery).await
                };
                selector_rows.push(SelectorRow { machines: n, selector, state: "nothing due", p50, p99, found });
            }
            // 1 % due for each: agent gone, heartbeat stale.
            exec(&bmdb, "DELETE FROM machine_agent_started WHERE machine_id IN \
                         (SELECT machine_id FROM machines ORDER BY machine_id LIMIT (SELECT count(*) / 100 FROM machines))")
                .await;
            exec(&bmdb, "UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() - interval '1 hour' \
                         WHERE machine_id IN (SELECT machine_id FROM machines ORDER BY machine_id DESC \
                         LIMIT (SELECT count(*) / 100 FROM machines))")
                .await;
            for (selector, f) in [("needs agent start", 0), ("needs recovery", 1)] {
                let (p50, p99, found) = if f == 0 {
                    measure(&bmdb, Read::Transaction, SELECTOR_SAMPLES, agent_start).await
                } else {
                    measure(&bmdb, Read::Transaction, SELECTOR_SAMPLES, recovery).await
                };
                selector_rows.push(SelectorRow { machines: n, selector, state: "1% due", p50, p99, found });
            }
            settle(&bmdb, &db.config).await;

            // The agents heartbeat as they do, every few seconds: all but
            // the 1 % gone stale are fresh when the pages are read.
            exec(&bmdb, "UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() \
                         WHERE agent_heartbeat_at > now() - interval '30 minutes'")
                .await;
            settle(&bmdb, &db.config).await;
            // What an operator's page reads, in a plain transaction and in
            // the snapshot it runs in.
            for read in [Read::Transaction, Read::Snapshot] {
                let (p50, p99, _) = measure(&bmdb, read, READ_SAMPLES, detail).await;
                read_rows.push((n, "machine detail", read, p50, p99));
                let (p50, p99, _) = measure(&bmdb, read, READ_SAMPLES, fleet_list).await;
                read_rows.push((n, "fleet list (API)", read, p50, p99));
                let (p50, p99, _) = measure(&bmdb, read, READ_SAMPLES, fleet_list_state).await;
                read_rows.push((n, "fleet list, a state", read, p50, p99));
                let (p50, p99, _) = measure(&bmdb, read, READ_SAMPLES, fleet_list_location).await;
                read_rows.push((n, "fleet list, a rack", read, p50, p99));
                let (p50, p99, _) = measure(&bmdb, read, READ_SAMPLES, fleet_list_plan).await;
                read_rows.push((n, "fleet list, a plan", read, p50, p99));
                let (p50, p99, _) = measure(&bmdb, read, READ_SAMPLES, fleet_page).await;
                read_rows.push((n, "fleet page", read, p50, p99));
                let (p50, p99, _) = measure(&bmdb, read, READ_SAMPLES, metrics_counts).await;
                read_rows.push((n, "/metrics counts", read, p50, p99));
            }

            // Throughput: every machine needs its agent started.
            if std::env::var_os("SHEPHERD_BENCH_READS_ONLY").is_some() {
                continue;
            }
            let s = bmdb.start_session("pgbench", Some(Duration::from_secs(3600))).await.unwrap();
            for leasers in [1usize, 8, 32] {
                exec(&bmdb, "DELETE FROM machine_agent_started").await;
                let rate = cycles(&bmdb, n, leasers, seconds).await;
                let pgbench = pgbench(&db.config, s.id(), leasers, seconds);
                cycle_rows.push(CycleRow { machines: n, leasers, rate, pgbench });
            }
            s.close().await.unwrap();
        }

        println!();
        println!("BMDB benchmark on {server}");
        println!();
        println!("Selector polls (one transaction each, {SELECTOR_SAMPLES} samples, limit 1)");
        println!("{:>9}  {:<18} {:<12} {:>8} {:>8} {:>6}", "machines", "selector", "state", "p50 ms", "p99 ms", "found");
        for r in &selector_rows {
            println!(
                "{:>9}  {:<18} {:<12} {:>8.3} {:>8.3} {:>6}",
                r.machines, r.selector, r.state, r.p50, r.p99, r.found
            );
        }
        println!();
        println!("An operator's reads ({READ_SAMPLES} samples): READ COMMITTED, and the snapshot (REPEATABLE READ) they run in");
        println!("{:>9}  {:<20} {:<12} {:>8} {:>8}", "machines", "read", "as", "p50 ms", "p99 ms");
        for (n, what, read, p50, p99) in &read_rows {
            let read = match read {
                Read::Transaction => "transaction",
                Read::Snapshot => "snapshot",
            };
            println!("{n:>9}  {what:<20} {read:<12} {p50:>8.3} {p99:>8.3}");
        }
        println!();
        println!("lease (selector + work) + finish (AgentStarted) cycles per second, {seconds}s each");
        println!(
            "{:>9}  {:>8} {:>12} {:>12} {:>7}",
            "machines", "leasers", "shepherd/s", "pgbench/s", "ratio"
        );
        for r in &cycle_rows {
            match r.pgbench {
                Some(pg) => println!(
                    "{:>9}  {:>8} {:>12.0} {:>12.0} {:>7.2}",
                    r.machines, r.leasers, r.rate, pg, r.rate / pg
                ),
                None => println!("{:>9}  {:>8} {:>12.0} {:>12} {:>7}", r.machines, r.leasers, r.rate, "n/a", "n/a"),
            }
        }
        println!();
        println!("pgbench runs the reference's write set of one cycle (two transactions) with as many clients as leasers.");
        println!("Targets: selector p99 < 2 ms at 100k; lease+finish >= 0.8x pgbench; fleet page and list < 50 ms at 100k, flat to 1M.");
    });
}
