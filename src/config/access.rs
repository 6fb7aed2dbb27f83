//! How shepherd reaches machines: `[ssh]` (logging in to them),
//! `[initializer]` (taking them over over SSH), `[enroller]` (booting them
//! into the live agent through their BMC) and `[redfish]` (the calls to
//! BMCs, all of them together).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, EnrollerLease, InitializerLease, LeaseSettings};

/// How a machine's SSH host key is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostKeyPolicy {
    /// Record the key in the BMDB on first contact; refuse a changed key.
    AcceptNew,
    /// Accept only keys listed in `ssh.known_hosts_file`.
    KnownHosts,
    /// Accept any key (what the reference did). Not for production.
    InsecureIgnore,
}

/// How shepherd logs in to machines.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SshConfig {
    pub user: String,
    pub port: u16,
    /// shepherd's private key (OpenSSH format); generated if missing.
    pub key_file: PathBuf,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// The whole takeover exchange: connect, upload, run, reply.
    #[serde(with = "humantime_serde")]
    pub exchange_timeout: Duration,
    pub host_keys: HostKeyPolicy,
    /// For `host_keys = "known-hosts"`.
    pub known_hosts_file: Option<PathBuf>,
    /// Largest agent reply accepted, in bytes.
    pub max_stdout: usize,
    /// "sftp" (falling back to exec when the server has no SFTP) or "exec".
    pub upload: UploadMethod,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UploadMethod {
    Sftp,
    Exec,
}

impl Default for SshConfig {
    fn default() -> Self {
        SshConfig {
            user: "root".into(),
            port: 22,
            key_file: PathBuf::from("var/ssh/shepherd_ed25519"),
            connect_timeout: Duration::from_secs(10),
            exchange_timeout: Duration::from_secs(120),
            host_keys: HostKeyPolicy::AcceptNew,
            known_hosts_file: None,
            max_stdout: 1 << 20,
            upload: UploadMethod::Sftp,
        }
    }
}

impl SshConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.user.is_empty() || self.user.contains(|c: char| c.is_whitespace() || c == '@') {
            return Err(ConfigError::key("ssh.user", "is not a user name"));
        }
        if self.port == 0 {
            return Err(ConfigError::key("ssh.port", "must be 1 to 65535"));
        }
        ConfigError::positive("ssh.connect_timeout", self.connect_timeout)?;
        if self.exchange_timeout < self.connect_timeout {
            return Err(ConfigError::key(
                "ssh.exchange_timeout",
                "must be at least ssh.connect_timeout",
            ));
        }
        if self.host_keys == HostKeyPolicy::KnownHosts && self.known_hosts_file.is_none() {
            return Err(ConfigError::key(
                "ssh.known_hosts_file",
                "must be set when ssh.host_keys is known-hosts",
            ));
        }
        if self.max_stdout < 64 {
            return Err(ConfigError::key(
                "ssh.max_stdout",
                "must be at least 64 bytes",
            ));
        }
        Ok(())
    }
}

/// The Initializer: takes over machines that need their agent started.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct InitializerConfig {
    /// Takeovers at once, how often to look when idle, the backoff.
    #[serde(flatten)]
    pub lease: LeaseSettings<InitializerLease>,
    /// The agent executable to upload. Unset: `takeover-agent` next to the
    /// shepherd executable.
    pub agent_binary: Option<PathBuf>,
    /// Where the agent goes on the machine; `{machine_id}` is replaced.
    pub agent_path: String,
    /// The address agents call back to (`TakeoverInit.bmaas_endpoint`).
    pub agent_endpoint: Option<String>,
    /// DER CA certificate for that endpoint, sent to agents.
    pub agent_ca_certificate: Option<PathBuf>,
}

impl Default for InitializerConfig {
    fn default() -> Self {
        InitializerConfig {
            lease: LeaseSettings::default(),
            agent_binary: None,
            agent_path: "/root/agent".into(),
            agent_endpoint: None,
            agent_ca_certificate: None,
        }
    }
}

impl InitializerConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.lease.validate()?;
        if !self.agent_path.starts_with('/') || self.agent_path.contains(['\'', '\n', '\0']) {
            return Err(ConfigError::key(
                "initializer.agent_path",
                "must be an absolute path without quotes or newlines",
            ));
        }
        if let Some(e) = &self.agent_endpoint
            && e.trim().is_empty()
        {
            return Err(ConfigError::key(
                "initializer.agent_endpoint",
                "must not be empty",
            ));
        }
        Ok(())
    }
}

/// The Enroller: boots machines into the live agent through their BMC
/// (inventory `boot = "virtual-media"`, `inspect`, taking machines back).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnrollerConfig {
    pub enabled: bool,
    /// Boots under way at once (each BMC takes one request at a time),
    /// how often to look when idle, the backoff.
    #[serde(flatten)]
    pub lease: LeaseSettings<EnrollerLease>,
    /// How long a boot's credential, and its copy of the boot image, stay
    /// good after the boot is issued.
    #[serde(with = "humantime_serde")]
    pub credential_ttl: Duration,
    /// From the BMC's reset to the live agent's call back: longer than the
    /// slowest machine's firmware, boot and DHCP.
    #[serde(with = "humantime_serde")]
    pub callback_timeout: Duration,
}

impl Default for EnrollerConfig {
    fn default() -> Self {
        EnrollerConfig {
            enabled: true,
            lease: LeaseSettings::default(),
            credential_ttl: Duration::from_secs(30 * 60),
            callback_timeout: Duration::from_secs(15 * 60),
        }
    }
}

impl EnrollerConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.lease.validate()?;
        ConfigError::positive("enroller.callback_timeout", self.callback_timeout)?;
        if self.credential_ttl <= self.callback_timeout {
            return Err(ConfigError::key(
                "enroller.credential_ttl",
                format!(
                    "must be longer than enroller.callback_timeout ({}): the agent presents it after the boot",
                    humantime::format_duration(self.callback_timeout)
                ),
            ));
        }
        Ok(())
    }
}

/// Calls to BMCs, all of them together.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedfishConfig {
    /// Requests to BMCs in flight at once, over all BMCs (each BMC has one
    /// at a time).
    pub max_concurrent: u32,
    /// One request's limit, connecting included.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// How long a system may take to report `On` (or `Off`) after a reset
    /// (slow BMCs, long power-on self tests).
    #[serde(with = "humantime_serde")]
    pub power_timeout: Duration,
}

impl Default for RedfishConfig {
    fn default() -> Self {
        RedfishConfig {
            max_concurrent: 16,
            timeout: Duration::from_secs(20),
            power_timeout: Duration::from_secs(300),
        }
    }
}

impl RedfishConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::within("redfish.max_concurrent", self.max_concurrent, 1..=4096)?;
        ConfigError::positive("redfish.timeout", self.timeout)?;
        ConfigError::positive("redfish.power_timeout", self.power_timeout)?;
        Ok(())
    }
}
