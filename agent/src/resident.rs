//! The resident agent's side of the callback (shared/CONTRACTS.md §4): after
//! its takeover an agent calls `Heartbeat` every interval with its key, its
//! hardware report with the first call that succeeds, and answers an
//! installation request with a report of that generation. It backs off
//! while the server is unreachable.
//!
//! Between calls more than [`KEEP_CONNECTION_BELOW`] apart it holds no
//! connection: a server with ten thousand agents calling every 30 s would
//! otherwise keep ten thousand TLS and HTTP/2 connections (tens of KB
//! each) open for one short call per connection every 30 s. A handshake
//! per call costs less than that.
//!
//! One loop, two homes: `takeover-agent` runs it once per real host, and the
//! demo's simulated machines run one per machine in a single process; a
//! [`Host`] supplies what differs.

use std::net::SocketAddr;
use std::time::Duration;

use prost::Message as _;

use crate::api::{
    AgentHardwareReport, HeartbeatRequest, HeartbeatResponseRaw, OsInstallationRequest,
};
use crate::callback as client;

/// What the agent was told at its takeover, and its key.
#[derive(Clone)]
pub struct Resident {
    pub machine_id: String,
    /// `host:port` of the callback server.
    pub endpoint: String,
    /// DER of the CA the server's certificate must chain to.
    pub ca_certificate: Vec<u8>,
    /// The ed25519 seed whose public key the takeover reported.
    pub seed: [u8; 32],
}

impl std::fmt::Debug for Resident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resident")
            .field("machine_id", &self.machine_id)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// Where log lines of work beside the heartbeat loop go.
pub type Logger = std::sync::Arc<dyn Fn(std::fmt::Arguments<'_>) + Send + Sync>;

/// The machine an agent runs on, as the heartbeat loop sees it.
pub trait Host: Send + 'static {
    /// Time until the next heartbeat; read before each wait.
    fn interval(&self) -> Duration;
    /// False once the agent should exit (say, its executable was removed).
    fn alive(&self) -> bool {
        true
    }
    /// The disks an installation may write (chosen among by the request's
    /// hints); read when an installation starts.
    fn disks(&self) -> Vec<crate::install::disk::Disk> {
        crate::install::disk::list()
    }
    /// Where the record of the last installation is kept across restarts
    /// (None: in memory only).
    fn install_record(&self) -> Option<std::path::PathBuf> {
        None
    }
    /// Time and retry limits of installations.
    fn install_limits(&self) -> crate::install::Limits {
        crate::install::Limits::default()
    }
    /// The disk operations an erasure asks for (discard, the disk's own
    /// erase): the kernel's.
    fn disk_ops(&self) -> std::sync::Arc<dyn crate::install::erase::DiskOps> {
        std::sync::Arc::new(crate::install::erase::Kernel)
    }
    /// Reboots into the installed system, once its report was received.
    fn reboot(&self) -> Result<(), String> {
        Err("this host does not reboot".into())
    }
    /// What the machine is made of, sent with the first heartbeat.
    fn hardware_report(&self) -> AgentHardwareReport;
    /// Where the agent's own log lines go.
    fn log(&self, line: std::fmt::Arguments<'_>);
    /// The same, for an installation's own task.
    fn logger(&self) -> Logger;
    /// The addresses `endpoint` stands for, when this host resolves it its
    /// own way (a simulated fleet's names); None: the system's resolver,
    /// as gRPC clients resolve DNS names.
    fn resolve(&self, _endpoint: &str) -> Option<Vec<SocketAddr>> {
        None
    }
    /// An agent refused as unauthenticated for this long exits: another
    /// agent holds the machine's key now (it was taken over again).
    fn refused_limit(&self) -> Duration {
        REFUSED_LIMIT
    }
}

/// While an installation is in hand the agent calls at least this often,
/// so that its progress is seen.
pub const INSTALLING_INTERVAL: Duration = Duration::from_secs(5);
/// ...and for this long after one, so that its report is seen at once and
/// the request an operator asks next (an installation after a
/// deprovisioning, a retry after a failure) is taken within seconds, not
/// at the next ordinary call.
pub const FOLLOW_UP: Duration = Duration::from_secs(60);
/// No answer within this long is a lost call: reconnect.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Agents calling at least this often keep their connection between calls.
pub const KEEP_CONNECTION_BELOW: Duration = Duration::from_secs(10);
const BACKOFF_INITIAL: Duration = Duration::from_millis(250);
/// Refused as unauthenticated for this long by default: exit.
pub const REFUSED_LIMIT: Duration = Duration::from_secs(10 * 60);
/// Between two addresses of the endpoint, a random pause of up to this
/// (capped at a quarter of the interval), so that a dead shepherd's agents
/// do not all reach the next one at the same instant.
const FAILOVER_JITTER: Duration = Duration::from_secs(1);

/// Where the agent calls: the endpoint's addresses, and the one that
/// answered last (sticky until it fails).
struct Addresses {
    endpoint: String,
    list: Vec<SocketAddr>,
    current: usize,
    /// Addresses tried without an answer since the last that answered.
    failed_in_row: usize,
}

impl Addresses {
    async fn resolve(&mut self, host: &impl Host) -> bool {
        let found = match host.resolve(&self.endpoint) {
            Some(v) => Ok(v),
            None => tokio::net::lookup_host(self.endpoint.as_str())
                .await
                .map(|a| a.collect::<Vec<_>>()),
        };
        match found {
            Ok(v) if !v.is_empty() => {
                // Keep calling the one that answered, if it is still listed.
                let keep = self.list.get(self.current).copied();
                self.current = keep
                    .and_then(|k| v.iter().position(|a| *a == k))
                    .unwrap_or_else(|| rand::random_range(0..v.len()));
                if v != self.list {
                    let shown: Vec<String> = v.iter().map(|a| a.to_string()).collect();
                    host.log(format_args!(
                        "{} resolves to {}",
                        self.endpoint,
                        shown.join(", ")
                    ));
                }
                self.list = v;
                true
            }
            Ok(_) => {
                host.log(format_args!(
                    "cannot resolve {}: no addresses",
                    self.endpoint
                ));
                false
            }
            Err(e) => {
                host.log(format_args!("cannot resolve {}: {e}", self.endpoint));
                false
            }
        }
    }

    fn current(&self) -> Option<SocketAddr> {
        self.list.get(self.current).copied()
    }

    /// The current address failed: move to the next. True while some
    /// address of this resolution is still untried since the last answer.
    fn fail_over(&mut self) -> bool {
        self.failed_in_row += 1;
        if !self.list.is_empty() {
            self.current = (self.current + 1) % self.list.len();
        }
        self.failed_in_row < self.list.len()
    }

    fn answered(&mut self) {
        self.failed_in_row = 0;
    }
}

/// Heartbeats until `host.alive()` turns false, or until the server has
/// refused the agent's key for `host.refused_limit()`.
///
/// The endpoint may be a name with several addresses (several shepherds
/// behind one name, CONTRACTS.md §4a): the agent calls one, sticks to it
/// while it answers, and when it fails moves to the next after a short
/// random pause; once every address failed it backs off (never longer
/// than its interval, so shepherd's silence thresholds and the agent's
/// retries agree) and resolves the name again.
pub async fn run(resident: Resident, host: impl Host) {
    let endpoint = resident.endpoint.as_str();
    let server_name = crate::callback::endpoint_host(endpoint)
        .unwrap_or("localhost")
        .to_string();
    let mut report_sent = false;
    let mut lldp_sent = crate::lldp::changes();
    // The report of an installation, sent until shepherd has it.
    let mut answer: Option<crate::install::Answer> = None;
    let mut installer =
        crate::install::Installer::new(host.install_record()).with_disk_ops(host.disk_ops());
    let mut channel = None;
    let mut backoff = BACKOFF_INITIAL;
    // When the installer last had a job in hand (FOLLOW_UP).
    let mut last_busy: Option<std::time::Instant> = None;
    let mut refused_since: Option<std::time::Instant> = None;
    let mut addrs = Addresses {
        endpoint: endpoint.to_string(),
        list: Vec::new(),
        current: 0,
        failed_in_row: 0,
    };
    host.log(format_args!(
        "resident for machine {}, calling {endpoint}",
        resident.machine_id
    ));
    // The TLS client (its certificate made from the key) once, for every
    // connection.
    let tls = match crate::callback::agent_client_config(&resident.ca_certificate, &resident.seed) {
        Ok(t) => t,
        Err(e) => {
            host.log(format_args!("cannot make the TLS client: {e}"));
            return;
        }
    };
    // Once the running system's own disk was written, its files are not
    // looked at again (reading the new image as the old filesystem makes
    // the kernel record errors, which it writes to the disk).
    while installer.wrote_boot_disk() || host.alive() {
        // Resolve when nothing is known yet, and after every address failed.
        if addrs.list.is_empty() || (channel.is_none() && addrs.failed_in_row >= addrs.list.len()) {
            addrs.failed_in_row = 0;
            addrs.resolve(&host).await;
        }
        let mut failed_over = false;
        if channel.is_none() {
            if let Some(addr) = addrs.current() {
                match client::connect_with(addr, &server_name, tls.clone()).await {
                    Ok(c) => channel = Some((c, addr)),
                    Err(e) => {
                        host.log(format_args!("{e}"));
                        failed_over = addrs.fail_over();
                    }
                }
            }
        }
        if let Some(a) = installer.poll(&|l| host.log(l)) {
            answer = Some(a);
        }
        let ok = match channel.clone() {
            None => false,
            Some((c, addr)) => {
                // Something learned since the report was sent (a switch's
                // LLDP): sent again.
                if crate::lldp::changes() != lldp_sent {
                    report_sent = false;
                    lldp_sent = crate::lldp::changes();
                }
                let req = HeartbeatRequest {
                    machine_id: resident.machine_id.clone(),
                    hardware_report: (!report_sent).then(|| host.hardware_report()),
                    installation_report: answer.as_ref().map(|a| a.report.clone()),
                    installation_progress: installer.progress(),
                };
                let call = client::call::<_, HeartbeatResponseRaw>(
                    c,
                    crate::callback::HEARTBEAT_PATHS[1],
                    req,
                );
                match tokio::time::timeout(CALL_TIMEOUT, call).await {
                    Ok(Ok(resp)) => {
                        report_sent = true;
                        refused_since = None;
                        addrs.answered();
                        let asked = resp
                            .installation_request
                            .and_then(|raw| OsInstallationRequest::decode(raw.as_slice()).ok());
                        // An answer sent and no longer asked for was received.
                        if let Some(a) = answer.take_if(|a| {
                            asked
                                .as_ref()
                                .is_none_or(|r| r.generation != a.report.generation)
                        }) {
                            installer.acknowledged(a.report.generation);
                            if a.reboot {
                                // The machines still fetching the image
                                // from this one first (they stop asking
                                // soon after their own last chunk).
                                if crate::install::swarm::lingering() {
                                    host.log(format_args!(
                                        "serving the image's swarm until its members stop asking"
                                    ));
                                    let _ = tokio::time::timeout(
                                        crate::install::swarm::LINGER_MAX,
                                        crate::install::swarm::settled(),
                                    )
                                    .await;
                                }
                                installer.rebooting(&|l| host.log(l));
                                host.log(format_args!(
                                    "generation {} installed and reported: rebooting",
                                    a.report.generation
                                ));
                                if let Err(e) = host.reboot() {
                                    host.log(format_args!("cannot reboot: {e}"));
                                }
                            }
                        }
                        if let Some(r) = asked {
                            let pending = answer
                                .as_ref()
                                .is_some_and(|a| a.report.generation == r.generation);
                            if !pending {
                                if let Some(a) = installer.request(
                                    r,
                                    || host.disks(),
                                    crate::install::Limits {
                                        agent_key: Some(crate::install::fetch::AgentKey(
                                            resident.seed,
                                        )),
                                        ..host.install_limits()
                                    },
                                    host.logger(),
                                ) {
                                    answer = Some(a);
                                }
                            }
                        }
                        true
                    }
                    Ok(Err(status)) if status.code() == tonic::Code::Unauthenticated => {
                        // Another agent holds the machine's key (a new
                        // takeover), or shepherd has not recorded ours yet.
                        addrs.answered();
                        let since = *refused_since.get_or_insert_with(std::time::Instant::now);
                        let limit = host.refused_limit();
                        if since.elapsed() >= limit {
                            host.log(format_args!(
                                "refused as unauthenticated for {}: this agent's key is no longer the machine's; exiting",
                                humantime::format_duration(limit)
                            ));
                            return;
                        }
                        host.log(format_args!(
                            "heartbeat refused by {addr}: {}",
                            status.message()
                        ));
                        false
                    }
                    Ok(Err(status)) => {
                        host.log(format_args!(
                            "heartbeat to {addr} failed: {} ({:?})",
                            status.message(),
                            status.code()
                        ));
                        if status.code() == tonic::Code::Unavailable {
                            // The server (or its database) is away: the
                            // next address may be fine.
                            channel = None;
                            failed_over = addrs.fail_over();
                        }
                        false
                    }
                    Err(_) => {
                        host.log(format_args!(
                            "heartbeat to {addr} timed out after {}",
                            humantime::format_duration(CALL_TIMEOUT)
                        ));
                        channel = None;
                        failed_over = addrs.fail_over();
                        false
                    }
                }
            }
        };
        let mut every = if installer.wrote_boot_disk() {
            INSTALLING_INTERVAL
        } else {
            host.interval()
        };
        if installer.busy().is_some() {
            last_busy = Some(std::time::Instant::now());
        }
        if last_busy.is_some_and(|t| t.elapsed() < FOLLOW_UP) {
            every = every.min(INSTALLING_INTERVAL);
        }
        if every >= KEEP_CONNECTION_BELOW {
            channel = None;
        }
        let wait = if ok {
            backoff = BACKOFF_INITIAL;
            every
        } else if failed_over {
            // Another address is still untried: go to it soon.
            let cap = FAILOVER_JITTER.min(every / 4).max(Duration::from_millis(1));
            Duration::from_millis(rand::random_range(0..cap.as_millis() as u64))
        } else {
            let w = backoff.min(every);
            backoff = (backoff * 2).min(every);
            w
        };
        tokio::time::sleep(wait).await;
    }
    host.log(format_args!("stopping"));
}

/// The handoff file: the seed, then the machine ID, the endpoint and the
/// CA, each as a big-endian u32 length and its bytes.
pub fn write_handoff(path: &std::path::Path, r: &Resident) -> std::io::Result<()> {
    let mut b = Vec::with_capacity(64 + r.ca_certificate.len());
    b.extend_from_slice(&r.seed);
    for part in [
        r.machine_id.as_bytes(),
        r.endpoint.as_bytes(),
        &r.ca_certificate,
    ] {
        b.extend_from_slice(&(part.len() as u32).to_be_bytes());
        b.extend_from_slice(part);
    }
    crate::files::write_private(path, &b)
}

/// The resident agent's state, kept (0600) beside it when it runs as a
/// systemd unit, so that it comes back after a reboot with its key: the
/// handoff file's format.
pub fn write_state(path: &std::path::Path, r: &Resident) -> std::io::Result<()> {
    write_handoff(path, r)
}

/// Reads a state file written by [`write_state`] (and leaves it).
pub fn read_state(path: &std::path::Path) -> std::io::Result<Resident> {
    parse_handoff(&std::fs::read(path)?)
}

/// Reads (and removes) a handoff file written by [`write_handoff`].
pub fn take_handoff(path: &std::path::Path) -> std::io::Result<Resident> {
    let b = std::fs::read(path)?;
    let _ = std::fs::remove_file(path);
    parse_handoff(&b)
}

fn parse_handoff(b: &[u8]) -> std::io::Result<Resident> {
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "truncated handoff file");
    let seed: [u8; 32] = b.get(..32).ok_or_else(bad)?.try_into().unwrap();
    let mut rest = &b[32..];
    let mut parts = Vec::with_capacity(3);
    for _ in 0..3 {
        let len = u32::from_be_bytes(rest.get(..4).ok_or_else(bad)?.try_into().unwrap()) as usize;
        parts.push(rest.get(4..4 + len).ok_or_else(bad)?.to_vec());
        rest = &rest[4 + len..];
    }
    let text = |v: Vec<u8>| {
        String::from_utf8(v)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "handoff: not UTF-8"))
    };
    let ca_certificate = parts.pop().unwrap();
    let endpoint = text(parts.pop().unwrap())?;
    let machine_id = text(parts.pop().unwrap())?;
    Ok(Resident {
        machine_id,
        endpoint,
        ca_certificate,
        seed,
    })
}
