//! The takeover over SSH (CONTRACTS.md §1), the mechanics the Initializer
//! and the Recoverer share: what a takeover needs ([`TakeoverSettings`]),
//! one takeover ([`take_over`]: connect with the host key policy, upload
//! the agent, exec it with the `TakeoverInit` on stdin, judge its reply),
//! and recording the agent it started ([`record_agent`]).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use prost::Message;
use uuid::Uuid;

use crate::bmdb::{BmdbError, Tx, machines};
use crate::config::{Config, ConfigError, UploadMethod};
use crate::ssh::{self, SshIdentity, SshSettings};
use shepherd_proto::takeover::{AGENT_KEY_LEN, check_reply, init_message};

/// Everything a takeover needs, shared by all workers.
pub struct TakeoverSettings {
    pub ssh: SshSettings,
    pub port: u16,
    pub exchange_timeout: Duration,
    pub identity: SshIdentity,
    /// The agent executable's bytes.
    pub agent: Rc<[u8]>,
    /// Remote path; `{machine_id}` is replaced.
    pub agent_path: String,
    pub endpoint: String,
    pub ca_certificate: Option<Vec<u8>>,
}

impl std::fmt::Debug for TakeoverSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TakeoverSettings")
            .field("ssh", &self.ssh)
            .field("port", &self.port)
            .field("agent_bytes", &self.agent.len())
            .field("agent_path", &self.agent_path)
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl TakeoverSettings {
    /// From `[ssh]` and `[initializer]`: loads (or generates) shepherd's SSH
    /// key and reads the agent executable. Agents are told `endpoint` and,
    /// unless `initializer.agent_ca_certificate` names another, trust
    /// `callback_ca` (the agent callback's own CA). Errors name the key.
    pub fn from_config(
        cfg: &Config,
        endpoint: String,
        callback_ca: Option<Vec<u8>>,
    ) -> Result<TakeoverSettings, ConfigError> {
        let key_err = |key: &str, m: String| ConfigError::Key {
            key: key.to_string(),
            message: m,
        };
        let identity = SshIdentity::load_or_generate(&cfg.ssh.key_file)
            .map_err(|e| key_err("ssh.key_file", e.to_string()))?;
        let binary = match &cfg.initializer.agent_binary {
            Some(p) => p.clone(),
            None => default_agent_binary().ok_or_else(|| {
                key_err(
                    "initializer.agent_binary",
                    "not set, and no takeover-agent next to the shepherd executable".into(),
                )
            })?,
        };
        let agent = std::fs::read(&binary).map_err(|e| {
            key_err(
                "initializer.agent_binary",
                format!("{}: {e}", binary.display()),
            )
        })?;
        if agent.is_empty() {
            return Err(key_err(
                "initializer.agent_binary",
                format!("{} is empty", binary.display()),
            ));
        }
        let ca_certificate = match &cfg.initializer.agent_ca_certificate {
            Some(p) => Some(std::fs::read(p).map_err(|e| {
                key_err(
                    "initializer.agent_ca_certificate",
                    format!("{}: {e}", p.display()),
                )
            })?),
            None => callback_ca,
        };
        Ok(TakeoverSettings {
            ssh: SshSettings {
                user: cfg.ssh.user.clone(),
                connect_timeout: cfg.ssh.connect_timeout,
                host_keys: cfg.ssh.host_keys,
                known_hosts_file: cfg.ssh.known_hosts_file.clone(),
                max_stdout: cfg.ssh.max_stdout,
                max_stderr: 64 << 10,
                upload_by_exec: cfg.ssh.upload == UploadMethod::Exec,
            },
            port: cfg.ssh.port,
            exchange_timeout: cfg.ssh.exchange_timeout,
            identity,
            agent: agent.into(),
            agent_path: cfg.initializer.agent_path.clone(),
            endpoint,
            ca_certificate,
        })
    }

    fn agent_path(&self, machine_id: Uuid) -> String {
        self.agent_path
            .replace("{machine_id}", &machine_id.to_string())
    }
}

/// `takeover-agent` beside the running executable, if there is one.
pub fn default_agent_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [
        dir.join("takeover-agent"),
        dir.parent()?.join("takeover-agent"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// A successful takeover.
#[derive(Debug, Clone)]
pub struct TakenOver {
    pub agent_key: [u8; AGENT_KEY_LEN],
    pub warnings: Vec<String>,
    /// The host key presented, OpenSSH format.
    pub host_key: String,
}

/// A failed takeover: what went wrong, and the host key if we got that far.
#[derive(Debug, Clone)]
pub struct TakeoverFailure {
    pub cause: String,
    pub host_key: Option<String>,
}

/// Connects, uploads the agent, runs it with the init message and judges the
/// reply, all within `exchange_timeout`.
pub async fn take_over(
    s: &TakeoverSettings,
    machine_id: Uuid,
    address: IpAddr,
    known_host_key: Option<russh::keys::PublicKey>,
) -> Result<TakenOver, TakeoverFailure> {
    let addr = SocketAddr::new(address, s.port);
    let mut step = "connect";
    let mut host_key = None;
    let exchange = async {
        let conn = ssh::connect(&s.ssh, &s.identity, addr, known_host_key)
            .await
            .map_err(|e| e.to_string())?;
        host_key = conn.host_key().to_openssh().ok();
        let path = s.agent_path(machine_id);
        step = "upload";
        conn.upload(&path, &s.agent, &s.ssh)
            .await
            .map_err(|e| e.to_string())?;
        step = "run agent";
        let init = init_message(machine_id, &s.endpoint, s.ca_certificate.as_deref());
        let out = conn
            .run(&ssh::shell_quote(&path), &init.encode_to_vec(), &s.ssh)
            .await
            .map_err(|e| match e {
                ssh::SshError::Exec { .. } => e.to_string(),
                e => format!("run agent: {e}"),
            })?;
        conn.close().await;
        if let Some(sig) = &out.exit_signal {
            return Err(format!(
                "run agent: agent killed by signal {sig}: {}",
                out.stderr_text()
            ));
        }
        match out.exit_status {
            Some(0) => {}
            Some(code) => {
                return Err(format!(
                    "run agent: agent exited with status {code}: {}",
                    out.stderr_text()
                ));
            }
            None => {
                return Err(format!(
                    "run agent: agent ended without an exit status: {}",
                    out.stderr_text()
                ));
            }
        }
        step = "agent reply";
        check_reply(&init, &out.stdout).map_err(|e| format!("agent reply: {e}"))
    };
    let result = tokio::time::timeout(s.exchange_timeout, exchange).await;
    match result {
        Ok(Ok(t)) => Ok(TakenOver {
            agent_key: t.key,
            warnings: t.warnings,
            host_key: host_key.unwrap_or_default(),
        }),
        Ok(Err(cause)) => Err(TakeoverFailure { cause, host_key }),
        Err(_) => Err(TakeoverFailure {
            cause: format!(
                "{step}: timed out (the whole exchange may take {:?})",
                s.exchange_timeout
            ),
            host_key,
        }),
    }
}

/// A recorded host key that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the recorded host key is unreadable: {0}")]
pub struct UnreadableHostKey(String);

/// A recorded host key (`machine_ssh_host_key`), parsed.
pub fn parse_host_key(
    recorded: Option<&str>,
) -> Result<Option<russh::keys::PublicKey>, UnreadableHostKey> {
    recorded
        .map(russh::keys::PublicKey::from_openssh)
        .transpose()
        .map_err(|e| UnreadableHostKey(e.to_string()))
}

/// Records a takeover's agent (its key and the endpoint it was given) and,
/// on first contact under `accept-new`, the machine's host key.
pub async fn record_agent(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    taken: &TakenOver,
    endpoint: &str,
    record_host_key: bool,
) -> Result<(), BmdbError> {
    machines::set_agent_started(tx, machine_id, &taken.agent_key, Some(endpoint)).await?;
    if record_host_key {
        machines::record_host_key(tx, machine_id, &taken.host_key).await?;
    }
    Ok(())
}
