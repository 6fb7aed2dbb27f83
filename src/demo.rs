//! `shepherd demo`: the whole system on one machine with no configuration.
//! An embedded PostgreSQL (in `var/demo`, wiped first), the Equinix Metal
//! simulator with N hardware reservations whose devices get 127.0.1.x
//! addresses, N simulated machines answering SSH there, and shepherd
//! provisioning and taking all of them over with the takeover-agent. It
//! prints progress every second and the admin page's URL, and exits 0 once
//! every machine is taken over (or keeps running with `--keep-running`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use crate::bmdb::Bmdb;
use crate::config::{Config, ProviderKind};
use crate::equinix::sim::{Addressing, SimConfig, Simulator};
use crate::machinesim::MachineSim;
use crate::secret::Secret;
use crate::ssh::{HostKeyPolicy, SshIdentity};

pub struct DemoOptions {
    pub machines: usize,
    pub admin_listen: SocketAddr,
    pub keep_running: bool,
    pub timeout: Duration,
}

const FIRST_MACHINE: Ipv4Addr = Ipv4Addr::new(127, 0, 1, 1);

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub async fn run(mut cfg: Config, opts: DemoOptions) -> anyhow::Result<()> {
    let n = opts.machines;
    anyhow::ensure!(
        (1..=60_000).contains(&n),
        "--machines must be within 1 and 60000"
    );
    let root = std::env::current_dir()?.join("var/demo");
    // The database may live elsewhere (root from a directory the database
    // user cannot enter): wipe it through its link.
    crate::bmdb::embedded::remove_data_dir(&root.join("bmdb"))?;
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    std::fs::create_dir_all(&root)?;
    let started = Instant::now();

    // The cloud: reservations whose devices get 127.0.1.1, 127.0.1.2, …
    let sim = Simulator::start(
        SimConfig {
            reservations: n,
            provisioning_delay: Duration::from_secs(1),
            addressing: Addressing::Sequential(FIRST_MACHINE),
            ..SimConfig::default()
        },
        "127.0.0.1:0".parse()?,
    )
    .await?;
    // The machines, answering SSH on those addresses.
    let key_file = root.join("ssh/shepherd_ed25519");
    let identity = SshIdentity::load_or_generate(&key_file)?;
    let ssh_port = free_port()?;
    let public = russh::keys::PublicKey::from_openssh(identity.public_key())?;
    let machines =
        MachineSim::start(FIRST_MACHINE, n, ssh_port, public, &root.join("machines")).await?;

    cfg.bmdb.url = None;
    cfg.bmdb.embedded.data_dir = root.join("bmdb");
    cfg.bmdb.embedded.fsync = false;
    cfg.bmdb.pool_size = 24;
    cfg.equinix.api_url = sim.api_url();
    cfg.equinix.project_id = Some(sim.project_id().to_string());
    cfg.equinix.api_key = Some(Secret::inline(sim.token()));
    cfg.equinix.api_interval = Duration::from_millis(2);
    cfg.equinix.retry_initial = Duration::from_millis(50);
    cfg.equinix.retry_max = Duration::from_secs(1);
    cfg.equinix.per_page = 1000;
    cfg.provider.kind = ProviderKind::Equinix;
    cfg.provider.equinix.metro = Some("sv".into());
    cfg.provider.equinix.reservation_cache_ttl = Duration::from_secs(2);
    cfg.provisioner.interval = Duration::from_secs(1);
    cfg.provisioner.max_machines = 0;
    cfg.provisioner.chunk_size = 200;
    cfg.provisioner.creation_interval = Duration::ZERO;
    cfg.ssh.port = ssh_port;
    cfg.ssh.key_file = key_file;
    cfg.ssh.host_keys = HostKeyPolicy::AcceptNew;
    cfg.bmaas.endpoint = Some("bmaas.demo.invalid:443".into());
    cfg.initializer.agent_path = "/root/agent".into();
    cfg.initializer.parallelism = 32;
    cfg.initializer.poll_interval = Duration::from_millis(200);
    cfg.initializer.backoff_initial = Duration::from_secs(5);
    cfg.updater.interval = Duration::from_secs(5);
    cfg.bmaas.listen = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    cfg.validate()?;

    let running = crate::supervisor::start(cfg).await?;
    let admin = crate::admin::serve(running.admin.clone(), opts.admin_listen).or_else(|_| {
        crate::admin::serve(
            running.admin.clone(),
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        )
    })?;
    println!("shepherd demo: {n} machines");
    println!("  Equinix Metal simulator  {}", sim.api_url());
    println!(
        "  simulated machines       {}..{} port {ssh_port}",
        machines.addresses[0],
        machines.addresses[n - 1]
    );
    println!("  admin page               http://{admin}/");
    let data = root.join("bmdb");
    match std::fs::read_link(&data) {
        // Relocated: the database user could not enter this directory.
        Ok(target) => println!(
            "  BMDB (embedded)          {} -> {}",
            data.display(),
            target.display()
        ),
        Err(_) => println!("  BMDB (embedded)          {}", data.display()),
    }
    let bmdb: Bmdb = running.admin.bmdb.clone();
    let deadline = started + opts.timeout;
    let mut done_at = None;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (created, taken, backoff): (i64, i64, i64) = bmdb
            .transact(async |tx| {
                let r = tx
                    .query_one(
                        "SELECT (SELECT count(*) FROM machine_provided), (SELECT count(*) FROM machine_agent_started), \
                         (SELECT count(*) FROM work_backoff WHERE until > now())",
                        &[],
                    )
                    .await?;
                Ok((r.get(0), r.get(1), r.get(2)))
            })
            .await?;
        println!(
            "  {:>5.0}s  devices {created:>5}/{n}  taken over {taken:>5}/{n}  backing off {backoff}",
            started.elapsed().as_secs_f64()
        );
        if taken as usize == n && done_at.is_none() {
            done_at = Some(started.elapsed());
            println!(
                "all {n} machines taken over in {:.1}s (peak RSS {:.0} MB); admin page http://{admin}/",
                started.elapsed().as_secs_f64(),
                crate::telemetry::peak_rss_mb()
            );
            if !opts.keep_running {
                break;
            }
        }
        if done_at.is_none() && Instant::now() > deadline {
            running.shutdown().await;
            anyhow::bail!("not every machine was taken over within {:?}", opts.timeout);
        }
        if opts.keep_running && done_at.is_some() {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            println!("keeping the demo up; stop it with Ctrl-C");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            break;
        }
    }
    running.shutdown().await;
    sim.stop().await;
    drop(machines);
    Ok(())
}
