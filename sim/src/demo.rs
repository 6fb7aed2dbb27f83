//! `shepherd demo`: the whole system on one machine with no configuration.
//! Long on purpose: a script in Rust (set up, run, watch, check), read
//! from top to bottom.
//!
//! An embedded PostgreSQL (in `var/demo`, wiped first), the Equinix Metal
//! simulator with N hardware reservations whose devices get 127.0.1.x
//! addresses, N simulated machines answering SSH there, and shepherd
//! provisioning and taking all of them over with the takeover-agent. It
//! prints progress every second and the admin page's URL, and exits 0 once
//! every machine is taken over and its agent heartbeating (or keeps running
//! with `--keep-running`). With `--hold` it then watches that no
//! heartbeating machine is recovered; with `--silence N` (or `silence N`
//! typed while it keeps running) it stops N agents and shows those machines
//! rebooted, taken over again and heartbeating. With `--provider static`
//! the machines are owned hardware instead: an inventory whose hosts have
//! simulated BMCs, rebooted through Redfish. With `--cycle N` it takes N
//! machines through their life cycle: installed with first-boot data
//! (an image shepherd serves), deprovisioned, available again.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use crate::bmc::BmcSim;
use crate::equinix::{Addressing, SimConfig, Simulator};
use crate::machine::MachineSim;
use shepherd::bmdb::Bmdb;
use shepherd::config::{BmcConfig, BmcTls, Config, InventoryMachine, ProviderKind};
use shepherd::secret::Secret;
use shepherd::ssh::{HostKeyPolicy, SshIdentity};

pub struct DemoOptions {
    pub machines: usize,
    pub admin_listen: SocketAddr,
    pub keep_running: bool,
    /// Give up if a phase (all heartbeating; silenced ones back) takes
    /// longer.
    pub timeout: Duration,
    /// Once all heartbeat, watch this long that none is recovered.
    pub hold: Duration,
    /// Then silence this many agents and wait for them to be recovered.
    pub silence: usize,
    /// Then install, deprovision and see available again this many
    /// machines.
    pub cycle: usize,
    /// Set by `run`: an agent silent this long is stale.
    pub heartbeat_stale_after: Duration,
    /// Rented (the Equinix simulator) or owned (an inventory with BMCs).
    pub provider: ProviderKind,
}

const FIRST_MACHINE: Ipv4Addr = Ipv4Addr::new(127, 0, 1, 1);

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub async fn run(mut cfg: Config, mut opts: DemoOptions) -> anyhow::Result<()> {
    let n = opts.machines;
    anyhow::ensure!(
        (1..=60_000).contains(&n),
        "--machines must be within 1 and 60000"
    );
    let root = std::env::current_dir()?.join("var/demo");
    // One demo per checkout: a second would wipe the first's database.
    let mut lock = crate::demo_lock::DemoLock::take(&root)?;
    // The database may live elsewhere (root from a directory the database
    // user cannot enter): wipe it through its link.
    shepherd::bmdb::embedded::remove_data_dir(&root.join("bmdb"))?;
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    std::fs::create_dir_all(&root)?;
    let started = Instant::now();

    // The machines, answering SSH on 127.0.1.1, 127.0.1.2, …
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
    let hardware = match opts.provider {
        // The cloud: reservations whose devices get the machines' addresses.
        ProviderKind::Equinix => {
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
            Hardware::Cloud(sim)
        }
        // Owned hardware: an inventory of the machines, each with a BMC
        // (Redfish) on its own address; a restart kills the machine's agent.
        ProviderKind::Static => {
            let bmcs = BmcSim::for_machines(&machines)?;
            cfg.provider.kind = ProviderKind::Static;
            cfg.provider.inventory.machines = machines
                .addresses
                .iter()
                .enumerate()
                .map(|(i, ip)| InventoryMachine {
                    id: format!("node-{:04}", i + 1),
                    address: Some(*ip),
                    boot: None,
                    location: Some(format!("demo rack {}", i / 40 + 1)),
                    bmc: Some(BmcConfig {
                        url: bmcs.url(*ip),
                        username: bmcs.user.clone(),
                        password: Secret::inline(bmcs.password.clone()),
                        system: None,
                        tls: BmcTls::Verify,
                        secure_boot: None,
                        console: None,
                    }),
                    mac: None,
                    macs: Vec::new(),
                    firmware: None,
                    ports: Vec::new(),
                })
                .collect();
            Hardware::Owned(bmcs)
        }
    };
    cfg.provisioner.interval = Duration::from_secs(1);
    cfg.provisioner.max_machines = 0;
    cfg.provisioner.chunk_size = 200;
    cfg.provisioner.creation_interval = Duration::ZERO;
    cfg.ssh.port = ssh_port;
    cfg.ssh.key_file = key_file;
    cfg.ssh.host_keys = HostKeyPolicy::AcceptNew;
    cfg.initializer.agent_path = "/root/agent".into();
    cfg.initializer.lease.parallelism = 32;
    cfg.initializer.lease.poll_interval = Duration::from_millis(200);
    cfg.initializer.lease.backoff_initial = Duration::from_secs(5);
    cfg.updater.interval = Duration::from_secs(5);
    // The images shepherd serves (the life cycle's): one small disk image.
    let images = root.join("images");
    std::fs::create_dir_all(&images)?;
    std::fs::write(images.join(CYCLE_IMAGE), cycle_image())?;
    cfg.installations.images_dir = Some(images);
    cfg.installations.images_listen =
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), free_port()?);
    // The agent callback, where the simulated machines' agents call.
    let callback_port = free_port()?;
    cfg.bmaas.listen = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), callback_port);
    cfg.bmaas.endpoint = Some(format!("127.0.0.1:{callback_port}"));
    // Agents call back often and silence is noticed in seconds (scaled so
    // that large demos stay within what one process can take).
    let every = Duration::from_secs(2).max(Duration::from_millis(10) * n as u32);
    machines.agents.set_interval(every);
    cfg.recoverer.heartbeat_stale_after = every * 5;
    cfg.recoverer.silent_after_start = every * 5;
    cfg.recoverer.lease.poll_interval = Duration::from_secs(1);
    cfg.recoverer.reboot_poll = Duration::from_millis(500);
    cfg.recoverer.reboot_settle = Duration::from_secs(3);
    cfg.recoverer.lease.backoff_initial = Duration::from_secs(5);
    cfg.recoverer.lease.parallelism = 16;
    cfg.recoverer.callback_grace = every * 2;
    cfg.recoverer.agent_restart_wait = every * 5;
    cfg.recoverer.agent_return_wait = every * 3;
    opts.heartbeat_stale_after = cfg.recoverer.heartbeat_stale_after;
    cfg.validate()?;

    let running = shepherd::supervisor::start(cfg).await?;
    let admin = shepherd::metal::serve(
        running.admin.clone(),
        running.metal.clone(),
        opts.admin_listen,
        None,
    )
    .or_else(|_| {
        shepherd::metal::serve(
            running.admin.clone(),
            running.metal.clone(),
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            None,
        )
    })?;
    println!("shepherd demo: {n} machines");
    match &hardware {
        Hardware::Cloud(sim) => println!("  Equinix Metal simulator  {}", sim.api_url()),
        Hardware::Owned(bmcs) => println!(
            "  simulated BMCs (Redfish) {}..{}",
            bmcs.url(machines.addresses[0]),
            bmcs.url(machines.addresses[n - 1])
        ),
    }
    println!(
        "  simulated machines       {}..{} port {ssh_port}",
        machines.addresses[0],
        machines.addresses[n - 1]
    );
    println!("  agent callback           127.0.0.1:{callback_port}");
    println!("  admin page               http://{admin}/");
    lock.say(&format!(
        "pid {}, admin page http://{admin}/",
        std::process::id()
    ))?;
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
    let result = watch(
        &bmdb,
        &machines,
        &opts,
        started,
        admin,
        running.admin.images.as_ref(),
    )
    .await;
    running.shutdown().await;
    match &hardware {
        Hardware::Cloud(sim) => sim.stop().await,
        Hardware::Owned(bmcs) => bmcs.stop().await,
    }
    drop(machines);
    result
}

/// Where the machines come from and how they are rebooted.
enum Hardware {
    Cloud(Simulator),
    Owned(BmcSim),
}

/// The fleet as the progress line shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Progress {
    created: i64,
    taken: i64,
    heartbeating: i64,
    recoveries: i64,
    backing_off: i64,
}

const PROGRESS: &str = "SELECT (SELECT count(*) FROM machine_provided), \
     (SELECT count(*) FROM machine_agent_started), \
     (SELECT count(*) FROM machine_agent_heartbeat h JOIN machine_agent_started s USING (machine_id) \
       WHERE h.agent_heartbeat_at > now() - $1 * interval '1 second'), \
     (SELECT count(*) FROM work_history WHERE process = 'ShepherdRecovery' AND event = 'Started'), \
     (SELECT count(*) FROM work_backoff WHERE until > now())";

async fn progress(bmdb: &Bmdb, fresh: Duration) -> anyhow::Result<Progress> {
    let fresh = fresh.as_secs_f64();
    Ok(bmdb
        .transact(async |tx| {
            let r = tx.query_one(PROGRESS, &[&fresh]).await?;
            Ok(Progress {
                created: r.get(0),
                taken: r.get(1),
                heartbeating: r.get(2),
                recoveries: r.get(3),
                backing_off: r.get(4),
            })
        })
        .await?)
}

/// Machines whose recovery started, by ID.
async fn recoveries_started(bmdb: &Bmdb) -> anyhow::Result<BTreeSet<String>> {
    Ok(bmdb
        .transact(async |tx| {
            Ok(tx
                .query(
                    "SELECT DISTINCT machine_id::text FROM work_history \
                     WHERE process = 'ShepherdRecovery' AND event = 'Started'",
                    &[],
                )
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect())
        })
        .await?)
}

/// Machines recovered, by ID, with how (the last recovery's history detail).
async fn recovered_machines(
    bmdb: &Bmdb,
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    Ok(bmdb
        .transact(async |tx| {
            Ok(tx
                .query(
                    "SELECT DISTINCT ON (machine_id) machine_id::text, coalesce(detail, 'recovered') \
                       FROM work_history \
                      WHERE process = 'ShepherdRecovery' AND event = 'Finished' \
                      ORDER BY machine_id, work_history_id DESC",
                    &[],
                )
                .await?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect())
        })
        .await?)
}

/// Of `ids`, those that heartbeated after `since` (seconds ago).
async fn heartbeating_since(
    bmdb: &Bmdb,
    ids: &[String],
    since: Duration,
) -> anyhow::Result<BTreeSet<String>> {
    let (ids, since) = (ids.to_vec(), since.as_secs_f64());
    Ok(bmdb
        .transact(async |tx| {
            Ok(tx
                .query(
                    "SELECT machine_id::text FROM machine_agent_heartbeat \
                     JOIN machine_agent_started USING (machine_id) \
                     WHERE machine_id::text = ANY($1) \
                       AND agent_heartbeat_at > now() - $2 * interval '1 second'",
                    &[&ids, &since],
                )
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect())
        })
        .await?)
}

/// Agents silenced and not yet back.
struct Silenced {
    at: Instant,
    machines: Vec<(IpAddr, String)>,
    back: BTreeSet<String>,
}

impl Silenced {
    fn start(machines: &MachineSim, count: usize) -> Option<Silenced> {
        let silenced = machines.agents.silence(count);
        if silenced.is_empty() {
            println!("  no agent is running to silence");
            return None;
        }
        for (ip, id) in &silenced {
            println!("  silenced the agent of machine {id} ({ip})");
        }
        Some(Silenced {
            at: Instant::now(),
            machines: silenced,
            back: BTreeSet::new(),
        })
    }

    /// Prints those newly back; true once all are.
    async fn check(&mut self, bmdb: &Bmdb) -> anyhow::Result<bool> {
        let ids: Vec<String> = self.machines.iter().map(|(_, id)| id.clone()).collect();
        let now_back = heartbeating_since(bmdb, &ids, self.at.elapsed()).await?;
        let recovered = recovered_machines(bmdb).await?;
        for (ip, id) in &self.machines {
            let Some(how) = recovered.get(id) else {
                continue;
            };
            if now_back.contains(id) && self.back.insert(id.clone()) {
                println!(
                    "  machine {id} ({ip}) recovered: {how}; heartbeating ({:.1}s after it went silent)",
                    self.at.elapsed().as_secs_f64()
                );
            }
        }
        Ok(self.back.len() == self.machines.len())
    }
}

/// What the operator may type while the demo keeps running.
fn commands() -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

async fn watch(
    bmdb: &Bmdb,
    machines: &MachineSim,
    opts: &DemoOptions,
    started: Instant,
    admin: SocketAddr,
    admin_images: Option<&shepherd::images::ImageCatalog>,
) -> anyhow::Result<()> {
    let n = opts.machines as i64;
    let deadline = started + opts.timeout;
    let fresh = opts.heartbeat_stale_after;
    let mut all_at: Option<Instant> = None;
    let mut hold_checked = opts.hold.is_zero();
    let mut silenced: Option<Silenced> = None;
    let mut silence_pending = opts.silence;
    let mut cycled = false;
    let mut last: Option<Progress> = None;
    let mut input = None;
    // Set once the operator's input is read from (it may end: stdin closed).
    let mut listening = false;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    // Listening from here on: a signal that comes while progress is read
    // is not lost.
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            line = async { input.as_mut().map(|rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>| rx.recv()).unwrap().await }, if input.is_some() => {
                match line.as_deref().map(str::split_whitespace).map(|w| w.collect::<Vec<_>>()).as_deref() {
                    None => input = None,
                    Some(["silence", k]) => match k.parse::<usize>() {
                        Ok(k) if silenced.is_none() => silenced = Silenced::start(machines, k),
                        Ok(_) => println!("  still waiting for the last silenced machines"),
                        Err(_) => println!("  silence wants a number of machines: silence 3"),
                    },
                    Some(["quit"] | ["exit"]) => return Ok(()),
                    Some([]) => {}
                    Some(_) => println!("  commands: silence N, quit"),
                }
                continue;
            }
            _ = &mut shutdown => return Ok(()),
        }
        let p = progress(bmdb, fresh).await?;
        if !opts.keep_running || last.map(|l| l != p).unwrap_or(true) {
            println!(
                "  {:>5.0}s  devices {:>5}/{n}  taken over {:>5}/{n}  heartbeating {:>5}/{n}  recoveries {}  backing off {}",
                started.elapsed().as_secs_f64(),
                p.created,
                p.taken,
                p.heartbeating,
                p.recoveries,
                p.backing_off,
            );
        }
        last = Some(p);
        if all_at.is_none() && p.taken == n && p.heartbeating == n {
            all_at = Some(Instant::now());
            println!(
                "all {n} machines taken over in {:.1}s and heartbeating (peak RSS {:.0} MB); admin page http://{admin}/",
                started.elapsed().as_secs_f64(),
                shepherd::telemetry::peak_rss_mb()
            );
            if !opts.hold.is_zero() {
                println!(
                    "  holding {} to see that no heartbeating machine is recovered",
                    humantime::format_duration(opts.hold)
                );
            }
        }
        let Some(all) = all_at else {
            if Instant::now() > deadline {
                anyhow::bail!(
                    "not every machine was taken over and heartbeating within {}",
                    humantime::format_duration(opts.timeout)
                );
            }
            continue;
        };
        if !hold_checked {
            if p.recoveries > 0 {
                anyhow::bail!(
                    "{} heartbeating machines were recovered while holding",
                    p.recoveries
                );
            }
            if all.elapsed() < opts.hold {
                continue;
            }
            println!(
                "  held {}: no machine recovered",
                humantime::format_duration(opts.hold)
            );
            hold_checked = true;
        }
        if silence_pending > 0 && silenced.is_none() {
            silenced = Silenced::start(machines, silence_pending);
            silence_pending = 0;
        }
        if let Some(s) = &mut silenced {
            if s.check(bmdb).await? {
                let ids: BTreeSet<String> = s.machines.iter().map(|(_, id)| id.clone()).collect();
                let recovered = recoveries_started(bmdb).await?;
                let others: Vec<&String> = recovered.difference(&ids).collect();
                println!(
                    "all {} silenced machines recovered and heartbeating again in {:.1}s; {} other machines recovered",
                    ids.len(),
                    s.at.elapsed().as_secs_f64(),
                    others.len()
                );
                if !others.is_empty() && !opts.keep_running {
                    anyhow::bail!("machines recovered that were never silenced: {others:?}");
                }
                silenced = None;
            } else if s.at.elapsed() > opts.timeout {
                anyhow::bail!(
                    "silenced machines not back within {}",
                    humantime::format_duration(opts.timeout)
                );
            }
            continue;
        }
        if opts.cycle > 0 && !cycled {
            cycled = true;
            life_cycle(bmdb, machines, opts.cycle, admin_images).await?;
            continue;
        }
        if !opts.keep_running {
            return Ok(());
        }
        if !listening {
            println!("keeping the demo up; type `silence N` to silence N agents, Ctrl-C to stop");
            input = Some(commands());
            listening = true;
        }
    }
}

/// The image the life cycle installs.
const CYCLE_IMAGE: &str = "demo-os.img";

/// A 16 MiB disk image: an MBR with one Linux partition, its bytes a
/// pattern (what an image would hold).
fn cycle_image() -> Vec<u8> {
    let mut img = vec![0u8; 16 << 20];
    for (i, b) in img.iter_mut().enumerate().skip(1 << 20) {
        *b = (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] | 1;
    }
    let e = &mut img[446..462];
    e[4] = 0x83;
    e[8..12].copy_from_slice(&2048u32.to_le_bytes());
    e[12..16].copy_from_slice(&(14u32 * 2048).to_le_bytes());
    img[510] = 0x55;
    img[511] = 0xAA;
    img
}

/// `machine`'s state as the fleet shows it.
async fn state(bmdb: &Bmdb, machine: uuid::Uuid) -> anyhow::Result<String> {
    Ok(bmdb
        .transact(async |tx| shepherd::bmdb::lifecycle::state_of(tx, machine).await)
        .await?
        .map(|s| s.to_string())
        .unwrap_or_default())
}

/// Waits until every machine of `ids` is in `want` (a `fail` state
/// fails it), printing each as it arrives.
async fn wait_states(
    bmdb: &Bmdb,
    ids: &[(uuid::Uuid, String)],
    want: &str,
    fail: &str,
    at: Instant,
) -> anyhow::Result<()> {
    let mut left: Vec<&(uuid::Uuid, String)> = ids.iter().collect();
    let deadline = Instant::now() + Duration::from_secs(300);
    while !left.is_empty() {
        let mut still = Vec::new();
        for m in left {
            let s = state(bmdb, m.0).await?;
            if s == want {
                println!(
                    "    {:>5.1}s  {} ({}) {want}",
                    at.elapsed().as_secs_f64(),
                    m.1,
                    m.0
                );
            } else if s == fail {
                let i = bmdb
                    .transact(async |tx| shepherd::bmdb::installations::installation(tx, m.0).await)
                    .await?;
                let why = i
                    .and_then(|i| i.result.and_then(|r| r.1))
                    .unwrap_or_default();
                anyhow::bail!("{} ({}) is {fail}: {why}", m.1, m.0);
            } else {
                still.push(m);
            }
        }
        left = still;
        if !left.is_empty() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} machines not {want} within 5 minutes",
                left.len()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

/// Takes `n` machines through their life cycle and prints it: installed
/// with first-boot data, deprovisioned (metadata erase), available again.
async fn life_cycle(
    bmdb: &Bmdb,
    machines: &MachineSim,
    n: usize,
    images: Option<&shepherd::images::ImageCatalog>,
) -> anyhow::Result<()> {
    use shepherd::bmdb::installations::{self, Asked, Asker};
    use shepherd_proto::api::image_installation::FirstBoot;
    use shepherd_proto::api::{DiskErasure, FirstBootFiles, disk_erasure::Mode};
    let catalog = images.ok_or_else(|| anyhow::anyhow!("this shepherd serves no images"))?;
    let served = catalog
        .resolve(CYCLE_IMAGE)
        .map_err(|e| anyhow::anyhow!("{CYCLE_IMAGE}: {e}"))?;
    let rows: Vec<(uuid::Uuid, String, Option<String>)> = bmdb
        .transact(async |tx| {
            Ok(tx
                .query(
                    "SELECT machine_id, provider_id, provider_ip_address FROM machine_provided \
                     ORDER BY provider_ip_address LIMIT $1",
                    &[&(n as i64)],
                )
                .await?
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect())
        })
        .await?;
    let ids: Vec<(uuid::Uuid, String)> = rows.iter().map(|r| (r.0, r.1.clone())).collect();
    let at = Instant::now();
    println!(
        "life cycle of {} machines: installing {CYCLE_IMAGE} with cloud-init data (host name = provider id)",
        ids.len()
    );
    let files = [
        ("meta-data", "local-hostname: {{provider_id}}\n"),
        (
            "user-data",
            "#cloud-config\nruncmd:\n  - [sh, -c, 'echo first boot > /var/tmp/first-boot']\n",
        ),
    ];
    let mut image = shepherd_proto::api::ImageInstallation {
        reboot: true,
        first_boot: Some(FirstBoot::Nocloud(FirstBootFiles {
            files: files
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
            disk: None,
        })),
        ..Default::default()
    };
    served.apply_to(&mut image);
    let asker = |reason| Asker {
        actor: "demo",
        action_id: uuid::Uuid::new_v4(),
        rollout_id: None,
        reason: Some(reason),
    };
    for (id, name) in &ids {
        let a = asker("demo: life cycle");
        match bmdb
            .transact(async |tx| installations::ask(tx, *id, &image, &a).await)
            .await?
        {
            Asked::Done { audit, .. } => println!("    {name}: {}", audit.detail),
            other => anyhow::bail!("{name}: install: {other:?}"),
        }
    }
    wait_states(bmdb, &ids, "installed", "install-failed", at).await?;
    println!(
        "  all installed in {:.1}s (rebooted into the installed system: their agents are gone)",
        at.elapsed().as_secs_f64()
    );
    let erase = DiskErasure {
        mode: Mode::Metadata as i32,
        ..Default::default()
    };
    let at = Instant::now();
    for (id, name) in &ids {
        let a = asker("demo: tenant left");
        match bmdb
            .transact(async |tx| installations::deprovision(tx, *id, &erase, &a).await)
            .await?
        {
            Asked::Done { audit, .. } => println!("    {name}: {}", audit.detail),
            other => anyhow::bail!("{name}: deprovision: {other:?}"),
        }
    }
    wait_states(bmdb, &ids, "available", "clean-failed", at).await?;
    // What is left on the disks: no partition table, no seed.
    let mut clean = 0;
    for ip in rows.iter().filter_map(|r| r.2.as_deref()) {
        let disk = machines.root.join(ip).join("disk0");
        let mut head = vec![0u8; 1 << 20];
        use std::os::unix::fs::FileExt;
        if std::fs::File::open(&disk)?
            .read_exact_at(&mut head, 0)
            .is_ok()
            && head.iter().all(|b| *b == 0)
        {
            clean += 1;
        }
    }
    println!(
        "  all deprovisioned and available again in {:.1}s; {clean} of {} disks start with a zeroed MiB (no partition table); agents heartbeating, ready for the next tenant",
        at.elapsed().as_secs_f64(),
        ids.len()
    );
    anyhow::ensure!(
        clean == ids.len(),
        "{} disks still hold a partition table",
        ids.len() - clean
    );
    Ok(())
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
