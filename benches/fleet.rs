//! A whole fleet brought up: `fleet-sim` (the Equinix simulator, SSH
//! machines and their resident agents) in a process of its own, 1, 2 and
//! 4 `shepherd run` processes on one BMDB (PostgreSQL), timed from the
//! shepherds' start to every machine taken over and heartbeating.
//!
//!     cargo bench --bench fleet
//!
//! A fleet larger than 2,500 machines is served by several fleet-sim
//! processes, 2,500 each (a process here may hold 20,000 open files; a
//! machine's SSH is a listening socket; see `PER_PROCESS`): `SHEPHERD_BENCH_FLEET=100000
//! SHEPHERD_BENCH_SHEPHERDS=1` is the 100,000-machine run.
//!
//! SHEPHERD_BENCH_FLEET (default "1000,10000") sets the fleet sizes,
//! SHEPHERD_BENCH_SHEPHERDS (default "1,2,4") the process counts. Prints,
//! per run: seconds to all heartbeating, machines/s, the shepherds' CPU
//! seconds per machine and peak RSS (the largest process's), Equinix
//! requests per device (creates and look-ups; and all requests, listings
//! included), picks lost to another leaser, and machines whose agent was
//! started more than once (must be 0). The agent uploaded is the agent as
//! it ships (`--profile agent`); SHEPHERD_BENCH_AGENT=PATH uploads
//! another build instead. SHEPHERD_BENCH_WRAP runs the shepherds under a
//! profiler (`SHEPHERD_BENCH_WRAP="heaptrack -o /tmp/shepherd"`; the RSS
//! printed is then the wrapper's).

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use shepherd_sim::testing::{FleetShares, ShepherdProcess, Sshd, TestDb, cpu_seconds};

const SHEPHERD: &str = env!("CARGO_BIN_EXE_shepherd");

const HEARTBEATING: &str = "SELECT count(*) FROM machine_agent_heartbeat \
                            JOIN machine_agent_started USING (machine_id)";

fn list(var: &str, default: &str) -> Vec<usize> {
    std::env::var(var)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().parse().expect(var))
        .collect()
}

/// The admin server's address, as the log gives it.
fn admin_url(s: &ShepherdProcess) -> Option<String> {
    std::fs::read_to_string(&s.log).ok()?.lines().find_map(|l| {
        l.split("admin server: ")
            .nth(1)
            .map(|u| u.trim().to_string())
    })
}

/// A counter from a shepherd's /metrics, summed over the series whose
/// labels contain `labels`.
async fn metric(s: &ShepherdProcess, name: &str, labels: &str) -> u64 {
    let Some(url) = admin_url(s) else { return 0 };
    let Ok(mut r) = awc::Client::default()
        .get(format!("{url}metrics"))
        .send()
        .await
    else {
        return 0;
    };
    let body = r.body().limit(16 << 20).await.unwrap_or_default();
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The machines one fleet-sim process serves: a listening socket each,
/// within the 20,000 open files a process may have here. Fewer than that:
/// every takeover starts an agent process, and a process holding 12,500
/// descriptors spent half its CPU copying and closing them at each start
/// (the simulator's cost, not shepherd's, on the same two cores).
const PER_PROCESS: usize = 2_500;

struct Run {
    seconds: f64,
    cpu_per_machine_ms: f64,
    peak_rss_mb: f64,
    creates_per_device: f64,
    requests_per_device: f64,
    lost_picks: u64,
    again: u64,
    fleet_cpu: f64,
    complete: bool,
}

async fn run(machines: usize, shepherds: usize, first: Ipv4Addr, agent: &Path) -> Run {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let dir = tempfile::tempdir().unwrap();
    // Agents call every 10 s per thousand machines (at least 10 s): the
    // heartbeat load stays near a thousand calls a second.
    let interval = format!("{}s", (machines / 100).max(10));
    let fleet = FleetShares::start(
        dir.path(),
        machines,
        first,
        PER_PROCESS,
        &["--agent-interval", &interval],
    );
    let fleet_cpu_before = fleet.cpu_seconds();
    let started = Instant::now();
    let mut procs: Vec<ShepherdProcess> = (0..shepherds)
        .map(|i| {
            let callback = format!("127.0.0.1:{}", Sshd::free_port());
            ShepherdProcess::start(
                Path::new(SHEPHERD),
                &fleet.api().config,
                dir.path().join(format!("shepherd-{i}.log")),
                &[
                    ("SHEPHERD__BMDB__URL", db.url()),
                    ("SHEPHERD__ADMIN__LISTEN", "127.0.0.1:0".into()),
                    ("SHEPHERD__BMAAS__LISTEN", callback.clone()),
                    ("SHEPHERD__BMAAS__ENDPOINT", callback),
                    (
                        "SHEPHERD__INITIALIZER__AGENT_BINARY",
                        agent.display().to_string(),
                    ),
                    // The whole fleet in one round; then a listing every
                    // 5 s, as an operator at this size would set it.
                    ("SHEPHERD__PROVISIONER__CHUNK_SIZE", machines.to_string()),
                    ("SHEPHERD__PROVISIONER__INTERVAL", "5s".into()),
                    ("SHEPHERD__UPDATER__INTERVAL", "30s".into()),
                    ("SHEPHERD__LOG__LEVEL", "info,tokio_postgres=warn".into()),
                ],
            )
        })
        .collect();
    let deadline = Duration::from_secs(
        std::env::var("SHEPHERD_BENCH_FLEET_TIMEOUT")
            .ok()
            .and_then(|v| v.parse().ok())
            // 900 s, or 20 ms a machine for the largest fleets.
            .unwrap_or(900.max(machines as u64 / 50)),
    );
    let mut last_print = Instant::now();
    let mut complete = false;
    // The count joins every machine's heartbeat: asked four times a second
    // at 100,000 it was a tenth of a core of PostgreSQL's.
    let poll = Duration::from_millis((machines as u64 / 20).clamp(250, 2000));
    while started.elapsed() < deadline {
        let n: i64 = bmdb
            .transact(async |tx| Ok(tx.query_one(HEARTBEATING, &[]).await?.get(0)))
            .await
            .unwrap_or(0);
        if n as usize >= machines {
            complete = true;
            break;
        }
        for p in &mut procs {
            p.assert_running();
        }
        if last_print.elapsed() > Duration::from_secs(30) {
            eprintln!(
                "    {machines} machines, {shepherds} shepherds: {n} heartbeating after {:.0}s",
                started.elapsed().as_secs_f64()
            );
            last_print = Instant::now();
        }
        tokio::time::sleep(poll).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu: f64 = procs.iter().map(|p| cpu_seconds(p.pid())).sum();
    let rss = procs.iter().map(|p| p.peak_rss_mb()).fold(0.0, f64::max);
    let mut lost_picks = 0;
    for p in &procs {
        lost_picks += metric(p, "shepherd_lease_selections_total", "result=\"lost\"").await;
    }
    let stats = fleet.api().api_stats().await;
    let mut again = 0;
    for share in fleet.shares() {
        again += share.report().await["taken_over_again"]
            .as_object()
            .map(|m| m.len() as u64)
            .unwrap_or(0);
    }
    let devices = stats["devices"].as_u64().unwrap_or(0).max(1) as f64;
    let requests = |op: &str| stats["requests"][op].as_u64().unwrap_or(0) as f64;
    let all: f64 = stats["requests"]
        .as_object()
        .map(|m| m.values().filter_map(|v| v.as_u64()).sum::<u64>() as f64)
        .unwrap_or(0.0);
    let fleet_cpu = fleet.cpu_seconds() - fleet_cpu_before;
    for p in &mut procs {
        p.terminate(Duration::from_secs(30));
    }
    if !complete {
        eprintln!("    incomplete; logs kept in {}", dir.keep().display());
    }
    Run {
        seconds,
        cpu_per_machine_ms: cpu / machines as f64 * 1000.0,
        peak_rss_mb: rss,
        creates_per_device: (requests("create_device") + requests("get_reservation")) / devices,
        requests_per_device: all / devices,
        lost_picks,
        again,
        fleet_cpu,
        complete,
    }
}

fn main() {
    let sizes = list("SHEPHERD_BENCH_FLEET", "1000,10000");
    let counts = list("SHEPHERD_BENCH_SHEPHERDS", "1,2,4");
    // The agent as it ships: the takeover's bytes are mostly its upload.
    let agent = shepherd_sim::testing::shipped_agent();
    let size = std::fs::metadata(&agent).map(|m| m.len()).unwrap_or(0);
    let which = match std::env::var("SHEPHERD_BENCH_AGENT") {
        Ok(path) => format!("{path}, stripped"),
        Err(_) => "as it ships: --profile agent, stripped".into(),
    };
    println!("agent payload: {:.1} MB ({which})", size as f64 / 1e6);
    actix_rt::System::new().block_on(async {
        println!(
            "{:>8} {:>9} {:>9} {:>10} {:>12} {:>9} {:>13} {:>12} {:>10} {:>8} {:>10}",
            "machines",
            "shepherds",
            "seconds",
            "machines/s",
            "cpu ms/mach",
            "rss MB",
            "creates/dev",
            "requests/dev",
            "lost picks",
            "again",
            "fleet cpu s"
        );
        let mut block = 0u8;
        for &n in &sizes {
            for &k in &counts {
                // Each run its own addresses: no connection of the last run
                // lingers on them.
                block = block.wrapping_add(1);
                let first = Ipv4Addr::new(127, 64 + block, 0, 1);
                let r = run(n, k, first, &agent).await;
                println!(
                    "{:>8} {:>9} {:>9.1} {:>10.1} {:>12.2} {:>9.1} {:>13.3} {:>12.3} {:>10} {:>8} {:>10.1}{}",
                    n,
                    k,
                    r.seconds,
                    n as f64 / r.seconds,
                    r.cpu_per_machine_ms,
                    r.peak_rss_mb,
                    r.creates_per_device,
                    r.requests_per_device,
                    r.lost_picks,
                    r.again,
                    r.fleet_cpu,
                    if r.complete { "" } else { "  (timed out)" }
                );
            }
        }
    });
    let _ = std::fs::remove_file(&agent);
}
