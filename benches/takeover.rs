//! Takeover throughput: the Initializer against one local OpenSSH sshd,
//! with the agent as it ships (`--profile agent`, stripped) as the
//! payload, beside OpenSSH's own client doing the same upload + exec
//! under `xargs -P`.
//!
//!     cargo bench --bench takeover
//!
//! SHEPHERD_BENCH_MACHINES (default 500) machines per run, at parallelism 1,
//! 8 and 32. Each shepherd run is a child process, so the peak RSS printed
//! is that run's own. OpenSSH's client is timed on the first
//! SHEPHERD_BENCH_BASELINE_MACHINES (default 100) only: two handshakes a
//! machine make its serial run minutes long, and its rate is per machine.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use actix::prelude::*;
use shepherd::bmdb::machines::{self, NewProvidedMachine};
use shepherd::bmdb::{Backoff, BmdbSession, GetSession, Provider};
use shepherd::control::{SetSession, WorkMailbox};
use shepherd::initializer::Initializer;
use shepherd::ssh::{HostKeyPolicy, SshIdentity, SshSettings};
use shepherd::takeover::TakeoverSettings;
use shepherd_sim::testing::{Sshd, TestDb};

/// One shepherd run (in a child process): prints "rate rss".
fn child(machines: usize, parallelism: usize, agent: std::path::PathBuf) {
    actix_rt::System::new().block_on(async move {
        let db = TestDb::new().await;
        let bmdb = db.bmdb().await;
        let keys = tempfile::tempdir().unwrap();
        let identity = SshIdentity::load_or_generate(&keys.path().join("id_ed25519")).unwrap();
        let sshd = Sshd::start(SocketAddr::new([127, 0, 0, 1].into(), Sshd::free_port()), &[identity.public_key()]);
        for i in 0..machines {
            let m = NewProvidedMachine {
                provider: Provider::Equinix,
                provider_id: format!("bench-{i}"),
                reservation_id: None,
                ip_address: Some("127.0.0.1".into()),
                location: None,
                status: None,
            };
            bmdb.transact(async |tx| machines::create_provided(tx, &m).await).await.unwrap();
        }
        let settings = TakeoverSettings {
            ssh: SshSettings {
                user: "root".into(),
                connect_timeout: Duration::from_secs(10),
                host_keys: HostKeyPolicy::AcceptNew,
                known_hosts_file: None,
                max_stdout: 1 << 20,
                max_stderr: 64 << 10,
                upload_by_exec: false,
            },
            port: sshd.addr.port(),
            exchange_timeout: Duration::from_secs(120),
            identity,
            agent: std::fs::read(&agent).unwrap().into(),
            agent_path: format!("{}/agent-{{machine_id}}", sshd.dir().display()),
            endpoint: "bmaas.bench:443".into(),
            ca_certificate: None,
        };
        let backoff = Backoff::constant(Duration::from_secs(3600));
        let mailbox =
            WorkMailbox::new("initializer", Initializer::new(Provider::Equinix, std::rc::Rc::new(settings), None), backoff, parallelism, Duration::from_millis(50))
                .start();
        let session = BmdbSession::open(&bmdb, "bench").await.unwrap();
        let t = Instant::now();
        mailbox.send(SetSession(Some(session.send(GetSession).await.unwrap()))).await.unwrap();
        loop {
            let (done, failed): (i64, i64) = bmdb
                .transact(async |tx| {
                    let r = tx
                        .query_one(
                            "SELECT (SELECT count(*) FROM machine_agent_started), (SELECT count(*) FROM work_backoff)",
                            &[],
                        )
                        .await?;
                    Ok((r.get(0), r.get(1)))
                })
                .await
                .unwrap();
            assert_eq!(failed, 0, "takeovers failed; sshd log: {}", sshd.log());
            if done as usize == machines {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let rate = machines as f64 / t.elapsed().as_secs_f64();
        println!("{rate} {}", shepherd::telemetry::peak_rss_mb());
    });
}

/// OpenSSH's client doing the same: upload (scp, over SFTP) then run the
/// agent with the init message on stdin, `parallelism` machines at a time.
fn baseline(machines: usize, parallelism: usize, agent: &std::path::Path) -> Option<f64> {
    if Command::new("ssh").arg("-V").output().is_err() {
        return None;
    }
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("id_ed25519");
    let identity = SshIdentity::load_or_generate(&key).unwrap();
    let sshd = Sshd::start(
        SocketAddr::new([127, 0, 0, 1].into(), Sshd::free_port()),
        &[identity.public_key()],
    );
    let init = keys.path().join("init.bin");
    {
        use prost::Message;
        let m = shepherd_agent::init_message(uuid::Uuid::new_v4(), "bmaas.bench:443", None);
        std::fs::write(&init, m.encode_to_vec()).unwrap();
    }
    let opts = format!(
        "-i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes",
        key.display()
    );
    let dir = sshd.dir().display().to_string();
    let script = format!(
        "scp -q {opts} -P {port} {agent} root@127.0.0.1:{dir}/base-$0 && \
         ssh {opts} -p {port} root@127.0.0.1 {dir}/base-$0 < {init} > /dev/null",
        port = sshd.addr.port(),
        init = init.display(),
        agent = agent.display(),
    );
    let t = Instant::now();
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "seq {machines} | xargs -P {parallelism} -n 1 sh -c '{script}'"
        ))
        .status()
        .ok()?;
    let rate = machines as f64 / t.elapsed().as_secs_f64();
    status.success().then_some(rate)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        child(
            args[2].parse().unwrap(),
            args[3].parse().unwrap(),
            args[4].clone().into(),
        );
        return;
    }
    let machines: usize = std::env::var("SHEPHERD_BENCH_MACHINES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    // The payload both sides upload: the agent as it ships.
    let agent = shepherd_sim::testing::shipped_agent();
    let payload = std::fs::metadata(&agent).map(|m| m.len()).unwrap_or(0);
    let parallelisms: Vec<usize> = std::env::var("SHEPHERD_BENCH_PARALLELISM")
        .unwrap_or_else(|_| "1,8,32".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let sample: usize = std::env::var("SHEPHERD_BENCH_BASELINE_MACHINES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100)
        .min(machines);
    let mut rows = Vec::new();
    for p in parallelisms {
        let out = Command::new(&args[0])
            .args(["--child", &machines.to_string(), &p.to_string()])
            .arg(&agent)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().last().unwrap_or_default().to_string();
        let mut it = line
            .split_whitespace()
            .map(|x| x.parse::<f64>().unwrap_or(0.0));
        let (rate, rss) = (it.next().unwrap_or(0.0), it.next().unwrap_or(0.0));
        if !out.status.success() {
            eprintln!(
                "run at parallelism {p} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let base = baseline(sample, p, &agent);
        rows.push((p, rate, rss, base));
    }
    println!();
    println!(
        "Takeover of {machines} machines against one local sshd (OpenSSH's client: {sample}); payload {:.2} MB (the agent as it ships)",
        payload as f64 / 1e6
    );
    println!(
        "{:>11} {:>18} {:>20} {:>7} {:>14}",
        "parallelism", "shepherd mach./s", "ssh+scp xargs mach./s", "ratio", "peak RSS MB"
    );
    for (p, rate, rss, base) in rows {
        match base {
            Some(b) => println!(
                "{p:>11} {rate:>18.1} {b:>20.1} {:>7.2} {rss:>14.1}",
                rate / b
            ),
            None => println!(
                "{p:>11} {rate:>18.1} {:>20} {:>7} {rss:>14.1}",
                "n/a", "n/a"
            ),
        }
    }
    let _ = std::fs::remove_file(&agent);
    println!();
    println!("Targets: >= 1.5x the ssh baseline; peak RSS < 64 MB at parallelism 32.");
}
