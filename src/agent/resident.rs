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

use std::time::Duration;

use prost::Message as _;

use super::api::{
    AgentHardwareReport, HeartbeatRequest, HeartbeatResponseRaw, OsInstallationReport,
    OsInstallationRequest, os_installation_report,
};
use crate::callback::client;

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

/// The machine an agent runs on, as the heartbeat loop sees it.
pub trait Host: Send + 'static {
    /// Time until the next heartbeat; read before each wait.
    fn interval(&self) -> Duration;
    /// False once the agent should exit (say, its executable was removed).
    fn alive(&self) -> bool {
        true
    }
    /// The outcome of installing what generation `generation` asked for.
    fn install(&self, generation: i64) -> os_installation_report::Result;
    /// What the machine is made of, sent with the first heartbeat.
    fn hardware_report(&self) -> AgentHardwareReport;
    /// Where the agent's own log lines go.
    fn log(&self, line: std::fmt::Arguments<'_>);
}

/// No answer within this long is a lost call: reconnect.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Agents calling at least this often keep their connection between calls.
pub const KEEP_CONNECTION_BELOW: Duration = Duration::from_secs(10);
const BACKOFF_INITIAL: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Heartbeats until `host.alive()` turns false.
pub async fn run(resident: Resident, host: impl Host) {
    let endpoint = resident.endpoint.as_str();
    let server_name = crate::config::endpoint_host(endpoint)
        .unwrap_or("localhost")
        .to_string();
    let mut report_sent = false;
    let mut answer: Option<OsInstallationReport> = None;
    let mut channel = None;
    let mut backoff = BACKOFF_INITIAL;
    host.log(format_args!(
        "resident for machine {}, calling {endpoint}",
        resident.machine_id
    ));
    // The TLS client (its certificate made from the key) once, for every
    // connection.
    let tls =
        match crate::callback::tls::agent_client_config(&resident.ca_certificate, &resident.seed) {
            Ok(t) => t,
            Err(e) => {
                host.log(format_args!("cannot make the TLS client: {e}"));
                return;
            }
        };
    while host.alive() {
        if channel.is_none() {
            match tokio::net::lookup_host(endpoint)
                .await
                .map(|mut a| a.next())
            {
                Ok(Some(addr)) => {
                    match client::connect_with(addr, &server_name, tls.clone()).await {
                        Ok(c) => channel = Some(c),
                        Err(e) => host.log(format_args!("{e}")),
                    }
                }
                Ok(None) | Err(_) => host.log(format_args!("cannot resolve {endpoint}")),
            }
        }
        let ok = match channel.clone() {
            None => false,
            Some(c) => {
                let req = HeartbeatRequest {
                    machine_id: resident.machine_id.clone(),
                    hardware_report: (!report_sent).then(|| host.hardware_report()),
                    installation_report: answer.clone(),
                };
                let call = client::call::<_, HeartbeatResponseRaw>(
                    c,
                    crate::callback::HEARTBEAT_PATHS[1],
                    req,
                );
                match tokio::time::timeout(CALL_TIMEOUT, call).await {
                    Ok(Ok(resp)) => {
                        report_sent = true;
                        answer = resp.installation_request.and_then(|raw| {
                            let r = OsInstallationRequest::decode(raw.as_slice()).ok()?;
                            Some(OsInstallationReport {
                                generation: r.generation,
                                result: Some(host.install(r.generation)),
                            })
                        });
                        true
                    }
                    Ok(Err(status)) => {
                        host.log(format_args!("heartbeat refused: {status}"));
                        if status.code() == tonic::Code::Unavailable {
                            channel = None;
                        }
                        false
                    }
                    Err(_) => {
                        host.log(format_args!("heartbeat timed out"));
                        channel = None;
                        false
                    }
                }
            }
        };
        let every = host.interval();
        if every >= KEEP_CONNECTION_BELOW {
            channel = None;
        }
        let wait = if ok {
            backoff = BACKOFF_INITIAL;
            every
        } else {
            let w = backoff.min(every);
            backoff = (backoff * 2).min(BACKOFF_MAX);
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
    crate::secret::write_private(path, &b)
}

/// Reads (and removes) a handoff file written by [`write_handoff`].
pub fn take_handoff(path: &std::path::Path) -> std::io::Result<Resident> {
    let b = std::fs::read(path)?;
    let _ = std::fs::remove_file(path);
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
