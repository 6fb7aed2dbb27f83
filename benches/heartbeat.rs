//! Agent callback throughput: heartbeats per second accepted end to end
//! over TLS (gRPC, client certificates), with 1k, 10k and 100k agents'
//! machines in the BMDB, beside pgbench running the reference's three
//! transactions per heartbeat (authenticate, upsert the heartbeat, read the
//! installation request) at the same concurrency.
//!
//!     cargo bench --bench heartbeat
//!
//! Agents are simulated by a pool of client connections, each with a key of
//! its own; machine i's agent key is key i mod pool, and each connection
//! heartbeats for its machines in turn, several calls in flight at once.
//! Environment: SHEPHERD_BENCH_SCALES (default "1000,10000,100000"),
//! SHEPHERD_BENCH_SECONDS (per run, default 5), SHEPHERD_BENCH_CONNECTIONS
//! (default 16), SHEPHERD_BENCH_IN_FLIGHT (per connection, default 4),
//! SHEPHERD_BENCH_WRITES (batches written at once, default 2).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use shepherd::callback::{Callback, CertFiles, HEARTBEAT_PATHS, ServerIdentity};
use shepherd_agent::api::{HeartbeatRequest, HeartbeatResponseRaw};
use shepherd_agent::callback as client;
use shepherd_sim::testing::TestDb;

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn machine_id(i: usize) -> uuid::Uuid {
    uuid::Uuid::parse_str(&format!("00000000-0000-4000-8000-{i:012x}")).unwrap()
}

fn seed_of(c: usize) -> [u8; 32] {
    let mut s = [0x5a; 32];
    s[..8].copy_from_slice(&(c as u64).to_le_bytes());
    s
}

/// `n` machines, agent started; machine i's key is connection (i mod pool)'s.
async fn seed(db: &TestDb, n: usize, keys: &[Vec<u8>]) {
    let (client, conn) = db.config.connect(tokio_postgres::NoTls).await.unwrap();
    actix_rt::spawn(conn);
    let n = n as i32;
    let pool = keys.len() as i32;
    client
        .execute(
            "INSERT INTO machines (machine_id) SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(i), 12, '0'))::uuid \
             FROM generate_series(0, $1 - 1) i",
            &[&n],
        )
        .await
        .unwrap();
    client
        .execute(
            "INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key) \
             SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(i), 12, '0'))::uuid, now(), \
             ($2::bytea[])[(i % $3) + 1] FROM generate_series(0, $1 - 1) i",
            &[&n, &keys, &pool],
        )
        .await
        .unwrap();
    client.batch_execute("VACUUM ANALYZE").await.unwrap();
}

/// The reference's heartbeat: three transactions (autocommit statements).
const PGBENCH_SCRIPT: &str = r#"\set i random(0, :machines - 1)
SELECT agent_public_key FROM machine_agent_started WHERE machine_id = CAST('00000000-0000-4000-8000-' || lpad(to_hex(CAST(:i AS int)), 12, '0') AS uuid);
INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at) VALUES (CAST('00000000-0000-4000-8000-' || lpad(to_hex(CAST(:i AS int)), 12, '0') AS uuid), now()) ON CONFLICT (machine_id) DO UPDATE SET agent_heartbeat_at = EXCLUDED.agent_heartbeat_at;
SELECT generation, os_installation_request_raw FROM machine_os_installation_request WHERE machine_id = CAST('00000000-0000-4000-8000-' || lpad(to_hex(CAST(:i AS int)), 12, '0') AS uuid);
"#;

struct Row {
    agents: usize,
    concurrency: usize,
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    batch: f64,
    pgbench: Option<f64>,
}

async fn run(n: usize, connections: usize, in_flight: usize, seconds: u64) -> Row {
    let db = TestDb::new().await;
    let bmdb = db
        .bmdb_with(
            TestDb::options(shepherd::config::Isolation::ReadCommitted),
            16,
        )
        .await;
    let keys: Vec<Vec<u8>> = (0..connections)
        .map(|c| {
            ed25519_dalek::SigningKey::from_bytes(&seed_of(c))
                .verifying_key()
                .to_bytes()
                .to_vec()
        })
        .collect();
    seed(&db, n, &keys).await;
    let dir = tempfile::tempdir().unwrap();
    let identity = ServerIdentity::load_or_generate(
        &CertFiles::in_dir(dir.path()),
        &["bmaas.bench".to_string()],
    )
    .unwrap();
    let callback = Callback::start(
        bmdb.clone(),
        &identity,
        "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
        2000,
        env_or("SHEPHERD_BENCH_WRITES", 2),
    )
    .await
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..connections {
        let channel = client::connect(callback.addr, "bmaas.bench", &callback.ca_der, &seed_of(c))
            .await
            .unwrap();
        // This connection's machines: c, c + pool, c + 2 pool, …
        let mine: Arc<Vec<uuid::Uuid>> =
            Arc::new((c..n).step_by(connections).map(machine_id).collect());
        for k in 0..in_flight {
            let (channel, mine, stop) = (channel.clone(), mine.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut next = k;
                while !stop.load(Ordering::Relaxed) {
                    let id = mine[next % mine.len()];
                    next += in_flight;
                    let t = Instant::now();
                    let r = client::call::<_, HeartbeatResponseRaw>(
                        channel.clone(),
                        HEARTBEAT_PATHS[1],
                        HeartbeatRequest {
                            machine_id: id.to_string(),
                            ..Default::default()
                        },
                    )
                    .await;
                    r.expect("heartbeat accepted");
                    lat.push(t.elapsed());
                }
                lat
            }));
        }
    }
    // Warm up, then measure.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = callback
        .writer
        .send(shepherd::callback::GetWriterStats)
        .await
        .unwrap();
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let after = callback
        .writer
        .send(shepherd::callback::GetWriterStats)
        .await
        .unwrap();
    let elapsed = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0;
    let accepted = (after.accepted - before.accepted) as f64;
    let batches = (after.batches - before.batches).max(1) as f64;
    let concurrency = connections * in_flight;
    let pgbench = shepherd_sim::testing::pgbench(
        &db.config,
        PGBENCH_SCRIPT,
        concurrency,
        seconds,
        &[("machines", n.to_string())],
    );
    Row {
        agents: n,
        concurrency,
        rate: accepted / elapsed,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        batch: accepted / batches,
        pgbench,
    }
}

fn main() {
    let scales: Vec<usize> = std::env::var("SHEPHERD_BENCH_SCALES")
        .unwrap_or_else(|_| "1000,10000,100000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let seconds: u64 = env_or("SHEPHERD_BENCH_SECONDS", 5);
    let connections: usize = env_or("SHEPHERD_BENCH_CONNECTIONS", 16);
    let in_flight: usize = env_or("SHEPHERD_BENCH_IN_FLIGHT", 4);
    let system = actix_rt::System::new();
    let rows = system.block_on(async {
        let mut rows = Vec::new();
        for n in scales {
            rows.push(run(n, connections, in_flight, seconds).await);
        }
        rows
    });
    println!();
    println!(
        "Heartbeats accepted end to end over TLS ({connections} client connections, each its own key; {seconds} s per run; clients, server and PostgreSQL share this machine)"
    );
    println!(
        "{:>8} {:>6} {:>12} {:>8} {:>8} {:>7} {:>12} {:>7}",
        "agents", "calls", "heartbeat/s", "p50 ms", "p99 ms", "batch", "pgbench/s", "ratio"
    );
    for r in &rows {
        let (pg, ratio) = match r.pgbench {
            Some(p) => (format!("{p:.0}"), format!("{:.2}", r.rate / p)),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{:>8} {:>6} {:>12.0} {:>8.2} {:>8.2} {:>7.1} {:>12} {:>7}",
            r.agents, r.concurrency, r.rate, r.p50_ms, r.p99_ms, r.batch, pg, ratio
        );
    }
    println!(
        "pgbench runs the reference's heartbeat (authenticate, upsert heartbeat, read the installation request: three transactions) with as many clients as calls in flight."
    );
    println!(
        "Targets: >= 5x the reference shape and >= 20000 heartbeats/s. Peak RSS (clients included): {:.0} MB",
        shepherd_sim::testing::peak_rss_mb()
    );
}
