//! Simulated machines for the demo and for scale runs: an SSH endpoint per
//! machine on its own loopback address (127.0.1.1, 127.0.1.2, …, all on one
//! port), served in-process on russh's server side. Each accepts shepherd's
//! key only, keeps what is uploaded (over SFTP) in a directory of its own,
//! and runs an uploaded file with the channel's stdin when asked to exec
//! it. The takeover tests keep using OpenSSH's sshd; this is for numbers of
//! machines no sshd setup would give.
//!
//! A thousand machines cannot each keep a resident agent process, so the
//! agent a simulated machine runs hands its key over when its takeover
//! succeeds (`TAKEOVER_AGENT_RESIDENT=handoff`) and the machine runs the
//! same heartbeat loop (`agent::resident`) as a task; [`Agents`] holds them,
//! and the demo silences some to see them recovered.
//!
//! Long on purpose: a simulated machine is an SSH server, an SFTP
//! server and the agents it runs, which share its state.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use russh::keys::{PrivateKey, PublicKey};
use russh::server::{Auth, Msg, Session};
use russh::{Channel, ChannelId, ChannelMsg};
use russh_sftp::protocol::{Attrs, FileAttributes, Handle, OpenFlags, Status, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A running set of simulated machines.
pub struct MachineSim {
    pub port: u16,
    pub addresses: Vec<IpAddr>,
    pub root: PathBuf,
    /// The machines' resident agents.
    pub agents: Agents,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for MachineSim {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.agents.stop_all();
    }
}

/// The resident agents of the simulated machines: one heartbeat task per
/// machine whose takeover succeeded. A new takeover of a machine replaces
/// its agent, as a reboot would.
#[derive(Clone)]
pub struct Agents {
    inner: Arc<std::sync::Mutex<AgentsInner>>,
}

struct AgentsInner {
    interval: std::time::Duration,
    /// Names the agents resolve their endpoint's host by, instead of the
    /// system's resolver (several shepherds behind one name on loopback).
    names: Arc<HashMap<String, Vec<IpAddr>>>,
    /// Machines cut off (a partition): their SSH refuses connections.
    cut_off: std::collections::HashSet<IpAddr>,
    running: HashMap<IpAddr, RunningAgent>,
    /// Each machine's directory: its disk (a sparse file) is `disk0` there.
    root: PathBuf,
    /// Machines rebooted into an installed system (their agent stopped).
    rebooted: HashMap<IpAddr, u32>,
    /// Programs run per machine, and of those the agents that handed over
    /// (takeovers that succeeded on the machine's side).
    runs: HashMap<IpAddr, Runs>,
    /// The switch the machines' first NICs hear LLDP from, and the first
    /// machine's address (port p1).
    lldp: Option<(String, Ipv4Addr)>,
}

/// What one simulated machine ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Runs {
    /// Programs run over SSH (each takeover attempt runs one).
    pub execs: u32,
    /// Of those, agents that started and handed their key over.
    pub agents: u32,
}

struct RunningAgent {
    machine_id: String,
    task: tokio::task::JoinHandle<()>,
}

impl Agents {
    fn new(root: PathBuf) -> Agents {
        Agents {
            inner: Arc::new(std::sync::Mutex::new(AgentsInner {
                root,
                rebooted: HashMap::new(),
                interval: std::time::Duration::from_secs(30),
                names: Arc::new(HashMap::new()),
                cut_off: Default::default(),
                running: HashMap::new(),
                runs: HashMap::new(),
                lldp: None,
            })),
        }
    }

    /// The machines' first NICs hear LLDP from `switch`, the machine at
    /// `first` on its port p1, the next on p2, and so on.
    pub fn set_lldp(&self, switch: &str, first: Ipv4Addr) {
        self.inner.lock().unwrap().lldp = Some((switch.to_string(), first));
    }

    /// Time between heartbeats, for agents started from now on.
    pub fn set_interval(&self, every: std::time::Duration) {
        self.inner.lock().unwrap().interval = every;
    }

    /// How agents started from now on resolve the endpoint's host names:
    /// a name listed here stands for its addresses.
    pub fn set_names(&self, names: HashMap<String, Vec<IpAddr>>) {
        self.inner.lock().unwrap().names = Arc::new(names);
    }

    /// Cuts up to `count` machines off (the lowest addresses first), as a
    /// partition would: their agents stop and their SSH refuses every
    /// connection until [`Agents::reconnect`]. Returns each machine's
    /// address and ID.
    pub fn cut_off(&self, count: usize) -> Vec<(IpAddr, String)> {
        let silenced = self.silence(count);
        let mut inner = self.inner.lock().unwrap();
        inner.cut_off.extend(silenced.iter().map(|(ip, _)| *ip));
        silenced
    }

    /// Ends every partition: SSH answers again (the agents stay stopped,
    /// as after a real partition that killed them).
    pub fn reconnect(&self) -> usize {
        let mut inner = self.inner.lock().unwrap();
        let n = inner.cut_off.len();
        inner.cut_off.clear();
        n
    }

    fn is_cut_off(&self, ip: IpAddr) -> bool {
        self.inner.lock().unwrap().cut_off.contains(&ip)
    }

    /// Stops the agents of up to `count` machines (the lowest addresses
    /// first), as if their processes were killed: their machines go silent.
    /// Returns each silenced machine's address and ID.
    pub fn silence(&self, count: usize) -> Vec<(IpAddr, String)> {
        let mut inner = self.inner.lock().unwrap();
        let mut ips: Vec<IpAddr> = inner.running.keys().copied().collect();
        ips.sort();
        ips.truncate(count);
        ips.into_iter()
            .filter_map(|ip| {
                let a = inner.running.remove(&ip)?;
                a.task.abort();
                Some((ip, a.machine_id))
            })
            .collect()
    }

    /// The machine at `ip` lost power: its agent is gone.
    pub fn power_off(&self, ip: IpAddr) {
        if let Some(a) = self.inner.lock().unwrap().running.remove(&ip) {
            a.task.abort();
        }
    }

    /// What each machine ran so far, by address (machines that ran nothing
    /// are absent).
    pub fn runs(&self) -> HashMap<IpAddr, Runs> {
        self.inner.lock().unwrap().runs.clone()
    }

    /// Machines rebooted into an installed system, and how often.
    pub fn rebooted(&self) -> HashMap<IpAddr, u32> {
        self.inner.lock().unwrap().rebooted.clone()
    }

    /// Machines whose agent runs now.
    pub fn running(&self) -> usize {
        self.inner.lock().unwrap().running.len()
    }

    fn exec(&self, ip: IpAddr) {
        self.inner.lock().unwrap().runs.entry(ip).or_default().execs += 1;
    }

    fn host(&self, inner: &AgentsInner, ip: IpAddr) -> SimHost {
        SimHost {
            ip,
            interval: inner.interval,
            names: inner.names.clone(),
            dir: inner.root.join(ip.to_string()),
            rebooted: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            agents: self.clone(),
            lldp: inner.lldp.as_ref().and_then(|(switch, first)| {
                let IpAddr::V4(v4) = ip else { return None };
                let n = u32::from(v4).checked_sub(u32::from(*first))? + 1;
                Some(shepherd_agent::api::LldpNeighbor {
                    chassis_id: switch.clone(),
                    port_id: format!("p{n}"),
                    system_name: switch.clone(),
                    port_description: format!("{switch}:p{n}"),
                })
            }),
        }
    }

    fn start(&self, ip: IpAddr, resident: shepherd_agent::resident::Resident) {
        let mut inner = self.inner.lock().unwrap();
        inner.runs.entry(ip).or_default().agents += 1;
        let host = self.host(&inner, ip);
        let machine_id = resident.machine_id.clone();
        let task = tokio::spawn(shepherd_agent::resident::run(resident, host));
        if let Some(old) = inner.running.insert(ip, RunningAgent { machine_id, task }) {
            old.task.abort();
        }
    }

    /// Boots the machine at `ip` into shepherd's live agent: `boot` (its
    /// network boot) yields the boot's data (an encoded `BootData`), with
    /// whose credential the agent enrolls a fresh key and then heartbeats,
    /// as the boot image's agent does. A boot that fails, or an enrollment
    /// refused, leaves the machine at its firmware, as a real one stays
    /// (shepherd's Enroller boots it again). A power off ends it.
    pub fn boot_live<F>(&self, ip: IpAddr, boot: F)
    where
        F: std::future::Future<Output = Result<Vec<u8>, String>> + Send + 'static,
    {
        let mut inner = self.inner.lock().unwrap();
        let host = self.host(&inner, ip);
        let agents = self.clone();
        let task = tokio::spawn(async move {
            use prost::Message as _;
            let data = match boot.await.and_then(|b| {
                shepherd_proto::boot::BootData::decode(b.as_slice()).map_err(|e| e.to_string())
            }) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(machine = %ip, error = %e, "network boot failed: the machine stays at its firmware");
                    return;
                }
            };
            let seed: [u8; 32] = rand::random();
            let log = |line: std::fmt::Arguments<'_>| tracing::debug!(machine = %ip, "live agent: {line}");
            if let Err(e) = shepherd_agent::callback::enroll(&data, &seed, log).await {
                tracing::warn!(machine = %ip, error = %e, "the live agent did not enroll");
                return;
            }
            {
                let mut inner = agents.inner.lock().unwrap();
                inner.runs.entry(ip).or_default().agents += 1;
                if let Some(a) = inner.running.get_mut(&ip) {
                    a.machine_id = data.machine_id.clone();
                }
            }
            let resident = shepherd_agent::resident::Resident {
                machine_id: data.machine_id,
                endpoint: data.bmaas_endpoint,
                ca_certificate: data.ca_certificate,
                seed,
            };
            shepherd_agent::resident::run(resident, host).await;
        });
        let machine_id = String::new();
        if let Some(old) = inner.running.insert(ip, RunningAgent { machine_id, task }) {
            old.task.abort();
        }
    }

    fn stop_all(&self) {
        for (_, a) in self.inner.lock().unwrap().running.drain() {
            a.task.abort();
        }
    }
}

/// A simulated machine as its resident agent sees it.
struct SimHost {
    ip: IpAddr,
    interval: std::time::Duration,
    names: Arc<HashMap<String, Vec<IpAddr>>>,
    /// The machine's directory (its disk lives there).
    dir: PathBuf,
    /// Set once the agent rebooted the machine into an installed system:
    /// the agent then stops, as the installed system runs none.
    rebooted: Arc<std::sync::atomic::AtomicBool>,
    agents: Agents,
    /// What its first NIC hears over LLDP.
    lldp: Option<shepherd_agent::api::LldpNeighbor>,
}

/// The simulated disk's size: sparse, so only what is written takes room.
pub const SIM_DISK_BYTES: u64 = 480_103_981_056;

/// A simulated machine's disks are files: a discard punches a hole (the
/// file reads zeros there, as a disk that advertises discard returns);
/// they have no erase of their own.
struct SimDiskOps;

impl shepherd_agent::install::erase::DiskOps for SimDiskOps {
    fn can_discard(
        &self,
        disk: &shepherd_agent::install::disk::Disk,
        file: &std::fs::File,
    ) -> Result<(), String> {
        match file.metadata() {
            Ok(m) if m.is_file() => Ok(()),
            Ok(_) => Err(format!("{} is not a simulated disk", disk.path.display())),
            Err(e) => Err(format!("{}: {e}", disk.path.display())),
        }
    }

    fn discard(
        &self,
        file: &std::fs::File,
        offset: u64,
        len: u64,
        _secure: bool,
    ) -> std::io::Result<()> {
        use nix::fcntl::{FallocateFlags, fallocate};
        fallocate(
            file,
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            offset as i64,
            len as i64,
        )
        .map_err(std::io::Error::from)
    }

    fn secure_erase(
        &self,
        disk: &shepherd_agent::install::disk::Disk,
        _: &std::fs::File,
    ) -> Result<shepherd_agent::install::erase::SecureErase, String> {
        Err(format!(
            "{} (simulated) has no erase of its own",
            disk.path.display()
        ))
    }

    fn run_secure_erase(
        &self,
        disk: &shepherd_agent::install::disk::Disk,
        _: &std::fs::File,
        _: &shepherd_agent::install::erase::SecureErase,
        _: std::time::Duration,
        _: &dyn Fn(u64),
    ) -> Result<(), String> {
        Err(format!(
            "{} (simulated) has no erase of its own",
            disk.path.display()
        ))
    }
}

impl shepherd_agent::resident::Host for SimHost {
    fn disk_ops(&self) -> std::sync::Arc<dyn shepherd_agent::install::erase::DiskOps> {
        std::sync::Arc::new(SimDiskOps)
    }

    fn interval(&self) -> std::time::Duration {
        self.interval
    }

    fn alive(&self) -> bool {
        !self.rebooted.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// One NVMe disk, a sparse file in the machine's directory, with the
    /// serial and model of its hardware report.
    fn disks(&self) -> Vec<shepherd_agent::install::disk::Disk> {
        let report = simulated_hardware(self.ip);
        let Some(d) = report
            .report
            .and_then(|n| n.block_device.into_iter().next())
        else {
            return Vec::new();
        };
        let _ = std::fs::create_dir_all(&self.dir);
        match shepherd_agent::install::disk::Disk::file(self.dir.join("disk0"), SIM_DISK_BYTES) {
            Ok(mut disk) => {
                disk.serial = Some(d.serial_number);
                disk.model = Some(d.device_model);
                disk.by_path = vec!["pci-0000:01:00.0-nvme-1".into()];
                vec![disk]
            }
            Err(e) => {
                tracing::warn!(machine = %self.ip, error = %e, "cannot make the simulated disk");
                Vec::new()
            }
        }
    }

    /// EFI variables are files in the machine's directory.
    fn install_limits(&self) -> shepherd_agent::install::Limits {
        let efivars = self.dir.join("efivars");
        let _ = std::fs::create_dir_all(&efivars);
        shepherd_agent::install::Limits {
            efivars,
            ..Default::default()
        }
    }

    /// The machine boots its installed system: the agent stops.
    fn reboot(&self) -> Result<(), String> {
        self.rebooted
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let mut inner = self.agents.inner.lock().unwrap();
        *inner.rebooted.entry(self.ip).or_default() += 1;
        Ok(())
    }

    fn logger(&self) -> shepherd_agent::resident::Logger {
        let ip = self.ip;
        Arc::new(
            move |line: std::fmt::Arguments<'_>| tracing::debug!(machine = %ip, "agent: {line}"),
        )
    }

    fn hardware_report(&self) -> shepherd_agent::api::AgentHardwareReport {
        let mut report = simulated_hardware(self.ip);
        if let Some(nic) = report
            .report
            .as_mut()
            .and_then(|n| n.network_interface.first_mut())
        {
            nic.lldp = self.lldp.clone();
        }
        report
    }

    fn log(&self, line: std::fmt::Arguments<'_>) {
        tracing::debug!(machine = %self.ip, "agent: {line}");
    }

    fn resolve(&self, endpoint: &str) -> Option<Vec<SocketAddr>> {
        let (host, port) = endpoint.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        let ips = self.names.get(host)?;
        Some(ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect())
    }
}

/// A small server, the same for every simulated machine but for its serial
/// number and MAC addresses (taken from its address).
pub fn simulated_hardware(ip: IpAddr) -> shepherd_agent::api::AgentHardwareReport {
    use shepherd_agent::api::{
        AgentHardwareReport, BlockDevice, Cpu, EfiSupport, NetworkInterface, Node, block_device,
    };
    let octets = match ip {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => v6.octets()[12..].try_into().unwrap(),
    };
    let nic = |port: u8| NetworkInterface {
        mac: vec![0x02, 0x5e, octets[2], octets[3], 0x00, port],
        driver: "ixgbe".into(),
        supported_speed_bytes: vec![1_250_000_000],
        link_up: port == 0,
        current_speed_bytes: if port == 0 { 1_250_000_000 } else { 0 },
        lldp: None,
    };
    let disk = |n: u8| BlockDevice {
        vendor: "SIM".into(),
        device_model: "SIMNVME 480G".into(),
        serial_number: format!("S{}{}N{n}", octets[2], octets[3]),
        capacity_bytes: 480_103_981_056,
        logical_block_size_bytes: 512,
        physical_block_size_bytes: 4096,
        protocol: block_device::Protocol::Nvme as i32,
        ..Default::default()
    };
    AgentHardwareReport {
        report: Some(Node {
            manufacturer: "Shepherd Simulated Metal".into(),
            product: "s1.small.x86".into(),
            serial_number: format!("SIM-{ip}"),
            memory_installed_bytes: 32 << 30,
            memory_usable_ratio: 0.97,
            cpu: vec![Cpu {
                cores: 8,
                hardware_threads: 16,
                vendor: "GenuineIntel".into(),
                model: "Simulated Xeon E-2278G".into(),
                ..Default::default()
            }],
            block_device: vec![disk(0), disk(1)],
            network_interface: vec![nic(0), nic(1)],
            efi_support: EfiSupport::Enabled as i32,
            bmc_lan: None,
            secure_boot: None,
        }),
        warning: vec![],
    }
}

impl MachineSim {
    /// Blank machines known by the addresses of their BMCs (no system on
    /// their disks, so nothing answers SSH): each gets an agent only by
    /// booting the network ([`Agents::boot_live`]).
    pub fn blank(addresses: Vec<IpAddr>, root: &Path) -> std::io::Result<MachineSim> {
        for ip in &addresses {
            std::fs::create_dir_all(root.join(ip.to_string()))?;
        }
        Ok(MachineSim {
            port: 0,
            addresses,
            root: root.to_path_buf(),
            agents: Agents::new(root.to_path_buf()),
            tasks: Vec::new(),
        })
    }

    /// `count` machines from `first` (a 127.x address) on `port`, letting in
    /// `authorized`, keeping their files under `root/<address>/`.
    pub async fn start(
        first: Ipv4Addr,
        count: usize,
        port: u16,
        authorized: PublicKey,
        root: &Path,
    ) -> std::io::Result<MachineSim> {
        if !IpAddr::V4(first).is_loopback() {
            return Err(std::io::Error::other(format!(
                "simulated machines live on loopback, not {first}"
            )));
        }
        shepherd::telemetry::raise_open_files_limit();
        let seed: [u8; 32] = rand::random();
        let host_key = PrivateKey::from(russh::keys::ssh_key::private::Ed25519Keypair::from_seed(
            &seed,
        ));
        let config = Arc::new(russh::server::Config {
            keys: vec![host_key],
            auth_rejection_time: std::time::Duration::from_millis(10),
            auth_rejection_time_initial: Some(std::time::Duration::ZERO),
            inactivity_timeout: Some(std::time::Duration::from_secs(300)),
            ..Default::default()
        });
        let mut tasks = Vec::new();
        let mut addresses = Vec::new();
        let agents = Agents::new(root.to_path_buf());
        for i in 0..count {
            let ip = Ipv4Addr::from(u32::from(first) + i as u32);
            let listener = TcpListener::bind(SocketAddr::new(IpAddr::V4(ip), port)).await?;
            let dir = root.join(ip.to_string());
            std::fs::create_dir_all(&dir)?;
            let (config, authorized, agents) = (config.clone(), authorized.clone(), agents.clone());
            addresses.push(IpAddr::V4(ip));
            tasks.push(tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    if agents.is_cut_off(IpAddr::V4(ip)) {
                        // A partition: the connection dies unanswered.
                        drop(stream);
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    let handler = Machine {
                        ip: IpAddr::V4(ip),
                        agents: agents.clone(),
                        root: dir.clone(),
                        authorized: authorized.clone(),
                        channels: HashMap::new(),
                    };
                    let config = config.clone();
                    tokio::spawn(async move {
                        if let Ok(session) =
                            russh::server::run_stream(config, stream, handler).await
                        {
                            let _ = session.await;
                        }
                    });
                }
            }));
        }
        Ok(MachineSim {
            port,
            addresses,
            root: root.to_path_buf(),
            agents,
            tasks,
        })
    }
}

/// One SSH connection to one simulated machine.
struct Machine {
    ip: IpAddr,
    agents: Agents,
    root: PathBuf,
    authorized: PublicKey,
    channels: HashMap<ChannelId, Channel<Msg>>,
}

/// A remote absolute path, inside the machine's directory.
fn local(root: &Path, remote: &str) -> PathBuf {
    let rel: PathBuf = Path::new(remote)
        .components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .collect();
    root.join(rel)
}

/// The program of an exec request: a single, possibly single-quoted, path.
fn program(command: &str) -> String {
    let c = command.trim();
    match c.strip_prefix('\'').and_then(|c| c.strip_suffix('\'')) {
        Some(inner) => inner.replace(r"'\''", "'"),
        None => c.to_string(),
    }
}

impl russh::server::Handler for Machine {
    type Error = russh::Error;

    async fn auth_publickey_offered(
        &mut self,
        _user: &str,
        key: &PublicKey,
    ) -> Result<Auth, Self::Error> {
        Ok(if key.key_data() == self.authorized.key_data() {
            Auth::Accept
        } else {
            Auth::reject()
        })
    }

    async fn auth_publickey(&mut self, _user: &str, key: &PublicKey) -> Result<Auth, Self::Error> {
        Ok(if key.key_data() == self.authorized.key_data() {
            Auth::Accept
        } else {
            Auth::reject()
        })
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: russh::server::ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.channels.insert(channel.id(), channel);
        reply.accept().await;
        Ok(())
    }

    async fn subsystem_request(
        &mut self,
        id: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        match (name, self.channels.remove(&id)) {
            ("sftp", Some(channel)) => {
                session.channel_success(id)?;
                let sftp = Sftp {
                    root: self.root.clone(),
                    files: HashMap::new(),
                    next: 0,
                };
                tokio::spawn(russh_sftp::server::run(channel.into_stream(), sftp));
            }
            _ => session.channel_failure(id)?,
        }
        Ok(())
    }

    async fn exec_request(
        &mut self,
        id: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(channel) = self.channels.remove(&id) else {
            return session.channel_failure(id);
        };
        let path = local(&self.root, &program(&String::from_utf8_lossy(data)));
        session.channel_success(id)?;
        tokio::spawn(run(channel, path, self.ip, self.agents.clone()));
        Ok(())
    }
}

fn spawn(path: &Path) -> std::io::Result<tokio::process::Child> {
    tokio::process::Command::new(path)
        // A simulated fleet of thousands cannot keep a resident agent
        // process per machine: the agent hands its key over instead.
        .env("TAKEOVER_AGENT_RESIDENT", "handoff")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
}

/// Runs `path` with the channel's data as stdin; its output back.
/// A handoff the program leaves starts the machine's resident agent.
async fn run(mut channel: Channel<Msg>, path: PathBuf, ip: IpAddr, agents: Agents) {
    agents.exec(ip);
    // While another thread forks to start a program, the child holds (until
    // its exec) every descriptor open at that moment, including a file just
    // uploaded over another connection: exec then fails with ETXTBSY for a
    // moment. A real machine has no such neighbours; wait it out.
    let mut spawned = spawn(&path);
    for _ in 0..50 {
        match &spawned {
            Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) => {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                spawned = spawn(&path);
            }
            _ => break,
        }
    }
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let _ = channel
                .extended_data_bytes(1, format!("exec {}: {e}\n", path.display()).into_bytes())
                .await;
            let _ = channel.exit_status(127).await;
            let _ = channel.eof().await;
            let _ = channel.close().await;
            return;
        }
    };
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reading = async move {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let _ = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
        (out, err)
    };
    let mut reading = std::pin::pin!(reading);
    let (out, err) = loop {
        tokio::select! {
            msg = channel.wait() => match msg {
                Some(ChannelMsg::Data { data }) => {
                    if let Some(s) = stdin.as_mut() {
                        let _ = s.write_all(&data).await;
                    }
                }
                Some(ChannelMsg::Eof) => stdin = None,
                None => return,
                _ => {}
            },
            r = &mut reading => break r,
        }
    };
    let status = child
        .wait()
        .await
        .ok()
        .and_then(|s| s.code())
        .unwrap_or(255);
    let mut handoff = path.clone().into_os_string();
    handoff.push(".handoff");
    match shepherd_agent::resident::take_handoff(Path::new(&handoff)) {
        Ok(resident) => agents.start(ip, resident),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(machine = %ip, "agent handoff: {e}"),
    }
    // The program ran from memory, as on a machine booted into RAM: a fleet
    // of thousands cannot keep a copy of the agent each on this disk.
    let _ = std::fs::remove_file(&path);
    if !out.is_empty() {
        let _ = channel.data_bytes(out).await;
    }
    if !err.is_empty() {
        let _ = channel.extended_data_bytes(1, err).await;
    }
    let _ = channel.exit_status(status as u32).await;
    let _ = channel.eof().await;
    let _ = channel.close().await;
}

/// The little SFTP a takeover needs: create, write, close, chmod, remove,
/// rename.
struct Sftp {
    root: PathBuf,
    files: HashMap<String, std::fs::File>,
    next: u64,
}

fn ok(id: u32) -> Status {
    Status {
        id,
        status_code: StatusCode::Ok,
        error_message: "Ok".into(),
        language_tag: "en-US".into(),
    }
}

impl russh_sftp::server::Handler for Sftp {
    type Error = StatusCode;

    fn unimplemented(&self) -> Self::Error {
        StatusCode::OpUnsupported
    }

    async fn open(
        &mut self,
        id: u32,
        filename: String,
        _flags: OpenFlags,
        attrs: FileAttributes,
    ) -> Result<Handle, Self::Error> {
        let path = local(&self.root, &filename);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|_| StatusCode::Failure)?;
        }
        let f = std::fs::File::create(&path).map_err(|_| StatusCode::Failure)?;
        if let Some(mode) = attrs.permissions {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777));
        }
        self.next += 1;
        let handle = self.next.to_string();
        self.files.insert(handle.clone(), f);
        Ok(Handle { id, handle })
    }

    async fn write(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<Status, Self::Error> {
        use std::os::unix::fs::FileExt;
        let f = self.files.get(&handle).ok_or(StatusCode::Failure)?;
        f.write_all_at(&data, offset)
            .map_err(|_| StatusCode::Failure)?;
        Ok(ok(id))
    }

    async fn close(&mut self, id: u32, handle: String) -> Result<Status, Self::Error> {
        self.files.remove(&handle);
        Ok(ok(id))
    }

    async fn setstat(
        &mut self,
        id: u32,
        path: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        if let Some(mode) = attrs.permissions {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(
                local(&self.root, &path),
                std::fs::Permissions::from_mode(mode & 0o7777),
            )
            .map_err(|_| StatusCode::NoSuchFile)?;
        }
        Ok(ok(id))
    }

    async fn stat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        let m = std::fs::metadata(local(&self.root, &path)).map_err(|_| StatusCode::NoSuchFile)?;
        let mut attrs = FileAttributes::empty();
        attrs.size = Some(m.len());
        Ok(Attrs { id, attrs })
    }

    async fn remove(&mut self, id: u32, filename: String) -> Result<Status, Self::Error> {
        std::fs::remove_file(local(&self.root, &filename)).map_err(|_| StatusCode::NoSuchFile)?;
        Ok(ok(id))
    }

    async fn rename(
        &mut self,
        id: u32,
        oldpath: String,
        newpath: String,
    ) -> Result<Status, Self::Error> {
        std::fs::rename(local(&self.root, &oldpath), local(&self.root, &newpath))
            .map_err(|_| StatusCode::Failure)?;
        Ok(ok(id))
    }

    async fn realpath(
        &mut self,
        id: u32,
        path: String,
    ) -> Result<russh_sftp::protocol::Name, Self::Error> {
        Ok(russh_sftp::protocol::Name {
            id,
            files: vec![russh_sftp::protocol::File::dummy(if path.is_empty() {
                "/".to_string()
            } else {
                path
            })],
        })
    }
}
