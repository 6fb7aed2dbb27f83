//! Configuration: one TOML file, overridden by `SHEPHERD__SECTION__KEY`
//! environment variables, validated once at start.
//!
//! Every key has a default (documented in `config/shepherd.toml`), so an empty
//! configuration is a working one: an embedded PostgreSQL under `var/bmdb`.
//! Unknown keys are errors. Every error names the key it is about and never
//! shows a secret.
//!
//! Long on purpose: every section's struct, its defaults and its checks,
//! beside each other, so that a key's default and rule are read at once.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::secret::{Secret, redact_database_url};

mod error;
pub mod inventory;
pub mod loops;
pub mod metal;
pub mod netboot;

pub use error::ConfigError;
pub use inventory::{BmcConfig, BmcProtocol, BmcTls, BootMethod, Firmware, InventoryMachine};
pub use loops::{EnrollerLease, InitializerLease, LeaseDefaults, LeaseSettings, RecovererLease};
pub use metal::{MetalConfig, OperatingSystemConfig, PlanConfig};
pub use netboot::{AddressRange, IpmiConfig, NetbootConfig, NetbootMode, UefiChain};

/// Environment variables with this prefix override file keys:
/// `SHEPHERD__BMDB__URL` is `bmdb.url`.
pub const ENV_PREFIX: &str = "SHEPHERD";
pub const ENV_SEPARATOR: &str = "__";

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub bmdb: BmdbConfig,
    pub equinix: EquinixConfig,
    pub ssh: SshConfig,
    pub initializer: InitializerConfig,
    pub enroller: EnrollerConfig,
    pub provider: ProviderConfig,
    pub provisioner: ProvisionerConfig,
    pub recoverer: RecovererConfig,
    pub updater: UpdaterConfig,
    pub installations: InstallationsConfig,
    pub supervisor: SupervisorConfig,
    pub admin: AdminConfig,
    pub bmaas: BmaasConfig,
    pub redfish: RedfishConfig,
    pub ipmi: IpmiConfig,
    /// The network boot service; None (no section): nothing listens on
    /// the DHCP or TFTP ports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub netboot: Option<NetbootConfig>,
    /// The Metal API served to tenants (plans, operating systems, metro).
    pub metal: MetalConfig,
    pub log: LogConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Isolation {
    /// Invariants are enforced by constraints; the default on PostgreSQL.
    ReadCommitted,
    /// What CockroachDB runs; serialization failures are retried.
    Serializable,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BmdbConfig {
    /// PostgreSQL connection URL or key/value string. Unset: embedded server.
    #[serde(serialize_with = "serialize_url")]
    pub url: Option<String>,
    /// Password, kept out of the URL (inline, `{ env = … }` or `{ file = … }`).
    pub password: Option<Secret>,
    pub pool_size: u32,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long a pool checkout may wait.
    #[serde(with = "humantime_serde")]
    pub acquire_timeout: Duration,
    /// Session heartbeat interval: the deadline is now + interval and the
    /// session is poked every interval / 2. Whole seconds.
    #[serde(with = "humantime_serde")]
    pub session_interval: Duration,
    /// Sessions expired for longer than this are deleted with their work.
    #[serde(with = "humantime_serde")]
    pub session_gc_grace: Duration,
    pub migrate_on_start: bool,
    pub isolation: Isolation,
    /// Attempts of a transaction that hits serialization failures.
    pub max_attempts: u32,
    /// How long a transaction whose connection was lost is run again on
    /// new connections (a server restart, a failover to another host).
    #[serde(with = "humantime_serde")]
    pub failover_window: Duration,
    pub embedded: EmbeddedConfig,
}

impl Default for BmdbConfig {
    fn default() -> Self {
        BmdbConfig {
            url: None,
            password: None,
            pool_size: 16,
            connect_timeout: Duration::from_secs(5),
            acquire_timeout: Duration::from_secs(10),
            session_interval: Duration::from_secs(10),
            session_gc_grace: Duration::from_secs(60),
            migrate_on_start: true,
            isolation: Isolation::ReadCommitted,
            max_attempts: 10,
            failover_window: Duration::from_secs(30),
            embedded: EmbeddedConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddedConfig {
    /// Data directory of the embedded PostgreSQL (created on first start).
    pub data_dir: PathBuf,
    /// Directory holding `postgres` and `initdb`. Unset: found on the system.
    pub bin_dir: Option<PathBuf>,
    /// Turn off for throwaway databases (tests, demos) only.
    pub fsync: bool,
    #[serde(with = "humantime_serde")]
    pub start_timeout: Duration,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        EmbeddedConfig {
            data_dir: PathBuf::from("var/bmdb"),
            bin_dir: None,
            fsync: true,
            start_timeout: Duration::from_secs(60),
        }
    }
}

/// The Equinix Metal API client (`src/equinix`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EquinixConfig {
    /// Base URL of the API.
    pub api_url: String,
    /// The project whose devices and reservations shepherd manages.
    pub project_id: Option<String>,
    /// The API token (`X-Auth-Token`).
    pub api_key: Option<Secret>,
    /// Minimum time between two API requests (retries included).
    #[serde(with = "humantime_serde")]
    pub api_interval: Duration,
    /// Requests in flight at once. 1: strictly one after another.
    pub parallelism: u32,
    /// One HTTP request, connect to last byte.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// One call, retries of transient failures included.
    #[serde(with = "humantime_serde")]
    pub call_deadline: Duration,
    /// First wait after a transient failure; doubles up to `retry_max`.
    #[serde(with = "humantime_serde")]
    pub retry_initial: Duration,
    #[serde(with = "humantime_serde")]
    pub retry_max: Duration,
    /// Page size of list calls (the API allows up to 1000).
    pub per_page: u32,
}

impl Default for EquinixConfig {
    fn default() -> Self {
        EquinixConfig {
            api_url: "https://api.equinix.com/metal/v1".into(),
            project_id: None,
            api_key: None,
            api_interval: Duration::from_secs(2),
            parallelism: 1,
            request_timeout: Duration::from_secs(30),
            call_deadline: Duration::from_secs(300),
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            per_page: 500,
        }
    }
}

impl EquinixConfig {
    fn validate(&mut self) -> Result<(), ConfigError> {
        let url = self.api_url.trim_end_matches('/').to_string();
        let scheme_ok = url.starts_with("https://") || url.starts_with("http://");
        if !scheme_ok || url.parse::<awc::http::Uri>().is_err() {
            return Err(ConfigError::key(
                "equinix.api_url",
                "must be an http:// or https:// URL",
            ));
        }
        self.api_url = url;
        if let Some(p) = &self.project_id {
            if p.trim().is_empty() {
                self.project_id = None;
            } else if uuid::Uuid::try_parse(p.trim()).is_err() {
                return Err(ConfigError::key(
                    "equinix.project_id",
                    "is not a project ID (a UUID, as the Equinix console shows it)",
                ));
            } else {
                self.project_id = Some(p.trim().to_ascii_lowercase());
            }
        }
        if let Some(k) = &mut self.api_key {
            k.resolve()
                .map_err(|m| ConfigError::key("equinix.api_key", m))?;
        }
        if self.parallelism == 0 {
            return Err(ConfigError::key(
                "equinix.parallelism",
                "must be at least 1",
            ));
        }
        if self.request_timeout.is_zero() {
            return Err(ConfigError::key(
                "equinix.request_timeout",
                "must be positive",
            ));
        }
        if self.call_deadline < self.request_timeout {
            return Err(ConfigError::key(
                "equinix.call_deadline",
                "must be at least equinix.request_timeout",
            ));
        }
        if self.retry_initial.is_zero() || self.retry_max < self.retry_initial {
            return Err(ConfigError::key(
                "equinix.retry_initial",
                "must be positive and not above equinix.retry_max",
            ));
        }
        if !(1..=1000).contains(&self.per_page) {
            return Err(ConfigError::key(
                "equinix.per_page",
                "must be within 1 and 1000",
            ));
        }
        Ok(())
    }

    /// The project ID and API key, which every API call needs.
    pub fn credentials(&self) -> Result<(String, Secret), ConfigError> {
        let project = self
            .project_id
            .clone()
            .ok_or_else(|| ConfigError::key("equinix.project_id", "must be set"))?;
        let key = self
            .api_key
            .clone()
            .ok_or_else(|| ConfigError::key("equinix.api_key", "must be set"))?;
        Ok((project, key))
    }
}

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
    fn validate(&self) -> Result<(), ConfigError> {
        if self.user.is_empty() || self.user.contains(|c: char| c.is_whitespace() || c == '@') {
            return Err(ConfigError::key("ssh.user", "is not a user name"));
        }
        if self.port == 0 {
            return Err(ConfigError::key("ssh.port", "must be 1 to 65535"));
        }
        if self.connect_timeout.is_zero() {
            return Err(ConfigError::key("ssh.connect_timeout", "must be positive"));
        }
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
    fn validate(&self) -> Result<(), ConfigError> {
        self.lease.validate()?;
        if !self.agent_path.starts_with('/') || self.agent_path.contains(['\'', '\n', '\0']) {
            return Err(ConfigError::key(
                "initializer.agent_path",
                "must be an absolute path without quotes or newlines",
            ));
        }
        if let Some(e) = &self.agent_endpoint {
            if e.trim().is_empty() {
                return Err(ConfigError::key(
                    "initializer.agent_endpoint",
                    "must not be empty",
                ));
            }
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
    fn validate(&self) -> Result<(), ConfigError> {
        self.lease.validate()?;
        if self.callback_timeout.is_zero() {
            return Err(ConfigError::key(
                "enroller.callback_timeout",
                "must be positive",
            ));
        }
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Hosts listed in `provider.inventory`.
    Static,
    /// Equinix Metal devices from hardware reservations.
    Equinix,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    pub equinix: EquinixProviderConfig,
    pub inventory: InventoryConfig,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            kind: ProviderKind::Static,
            equinix: EquinixProviderConfig::default(),
            inventory: InventoryConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EquinixProviderConfig {
    /// Devices whose hostname starts with this are shepherd's.
    pub hostname_prefix: String,
    /// Plan of created devices. Unset: the reservation's own plan.
    pub plan: Option<String>,
    pub operating_system: String,
    /// Where devices are created: a metro, or (deprecated) a facility.
    pub metro: Option<String>,
    pub facility: Option<String>,
    /// Tags put on created devices.
    pub tags: Vec<String>,
    /// Label of shepherd's SSH key in the project.
    pub ssh_key_label: String,
    /// How long a listing of hardware reservations is reused.
    #[serde(with = "humantime_serde")]
    pub reservation_cache_ttl: Duration,
    /// How long a reservation that failed to provision is left alone.
    #[serde(with = "humantime_serde")]
    pub failed_reservation_penalty: Duration,
}

impl Default for EquinixProviderConfig {
    fn default() -> Self {
        EquinixProviderConfig {
            hostname_prefix: "shepherd-".into(),
            plan: None,
            operating_system: "ubuntu_22_04".into(),
            metro: None,
            facility: None,
            tags: Vec::new(),
            ssh_key_label: "shepherd".into(),
            reservation_cache_ttl: Duration::from_secs(300),
            failed_reservation_penalty: Duration::from_secs(3600),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct InventoryConfig {
    /// Hosts listed here...
    pub machines: Vec<InventoryMachine>,
    /// ...and in this TOML file (`[[machines]]` tables), read every round.
    pub file: Option<PathBuf>,
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
    fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=4096).contains(&self.max_concurrent) {
            return Err(ConfigError::key(
                "redfish.max_concurrent",
                "must be within 1 and 4096",
            ));
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::key("redfish.timeout", "must be positive"));
        }
        if self.power_timeout.is_zero() {
            return Err(ConfigError::key(
                "redfish.power_timeout",
                "must be positive",
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProvisionerConfig {
    /// Time between reconciliation rounds.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Machines to manage at most (0: no limit).
    pub max_machines: u32,
    /// Machines created per round at most.
    pub chunk_size: u32,
    /// Time between two machine creations.
    #[serde(with = "humantime_serde")]
    pub creation_interval: Duration,
}

impl Default for ProvisionerConfig {
    fn default() -> Self {
        ProvisionerConfig {
            interval: Duration::from_secs(60),
            max_machines: 50,
            chunk_size: 20,
            creation_interval: Duration::from_secs(5),
        }
    }
}

/// The Recoverer: reboots machines whose agent went quiet.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecovererConfig {
    pub enabled: bool,
    /// Recoveries at once, how often to look when idle (and to watch the
    /// brake), the backoff.
    #[serde(flatten)]
    pub lease: LeaseSettings<RecovererLease>,
    /// An agent with no heartbeat this long after it started is quiet.
    #[serde(with = "humantime_serde")]
    pub silent_after_start: Duration,
    /// An agent whose last heartbeat is older than this is quiet.
    #[serde(with = "humantime_serde")]
    pub heartbeat_stale_after: Duration,
    /// Beyond the threshold, how long the agent's callback endpoint must
    /// have been served without a break before its silence counts (the
    /// agents' longest wait between attempts plus a call's timeout).
    #[serde(with = "humantime_serde")]
    pub callback_grace: Duration,
    /// How long an agent restarted over SSH has to call before the machine
    /// is power-cycled instead.
    #[serde(with = "humantime_serde")]
    pub agent_restart_wait: Duration,
    /// After a power cycle, how long the agent has to come back by itself
    /// (its systemd unit) before the machine is taken over again.
    #[serde(with = "humantime_serde")]
    pub agent_return_wait: Duration,
    /// Agents whose callback endpoint no shepherd has served for this long
    /// (their shepherd is gone with its endpoint) are re-homed: restarted
    /// over SSH with this shepherd's endpoint, never power-cycled.
    #[serde(with = "humantime_serde")]
    pub rehome_after: Duration,
    /// The brake: power actions for silence stop while more machines than
    /// the larger of this count...
    pub brake_max_silent: u32,
    /// ...and this share of the fleet are silent, or that many power
    /// actions for silence were taken within `brake_window`.
    pub brake_max_silent_share: f64,
    #[serde(with = "humantime_serde")]
    pub brake_window: Duration,
    /// How long an operator's release of the brake lasts unless given.
    #[serde(with = "humantime_serde")]
    pub brake_release: Duration,
    /// How long a rebooted machine may take to come back.
    #[serde(with = "humantime_serde")]
    pub reboot_timeout: Duration,
    /// Time between looks at a rebooting machine.
    #[serde(with = "humantime_serde")]
    pub reboot_poll: Duration,
    /// A machine never seen going down counts as back after this long.
    #[serde(with = "humantime_serde")]
    pub reboot_settle: Duration,
}

impl Default for RecovererConfig {
    fn default() -> Self {
        RecovererConfig {
            enabled: true,
            lease: LeaseSettings::default(),
            silent_after_start: Duration::from_secs(30 * 60),
            heartbeat_stale_after: Duration::from_secs(10 * 60),
            callback_grace: Duration::from_secs(60),
            agent_restart_wait: Duration::from_secs(2 * 60),
            agent_return_wait: Duration::from_secs(3 * 60),
            rehome_after: Duration::from_secs(5 * 60),
            brake_max_silent: 3,
            brake_max_silent_share: 0.1,
            brake_window: Duration::from_secs(10 * 60),
            brake_release: Duration::from_secs(60 * 60),
            reboot_timeout: Duration::from_secs(10 * 60),
            reboot_poll: Duration::from_secs(5),
            reboot_settle: Duration::from_secs(60),
        }
    }
}

impl RecovererConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.lease.validate()?;
        for (k, d) in [
            ("recoverer.silent_after_start", self.silent_after_start),
            (
                "recoverer.heartbeat_stale_after",
                self.heartbeat_stale_after,
            ),
            ("recoverer.reboot_timeout", self.reboot_timeout),
            ("recoverer.reboot_poll", self.reboot_poll),
            ("recoverer.agent_restart_wait", self.agent_restart_wait),
            ("recoverer.agent_return_wait", self.agent_return_wait),
            ("recoverer.brake_window", self.brake_window),
            ("recoverer.brake_release", self.brake_release),
        ] {
            if d.is_zero() {
                return Err(ConfigError::key(k, "must be positive"));
            }
        }
        if !(0.0..=1.0).contains(&self.brake_max_silent_share) {
            return Err(ConfigError::key(
                "recoverer.brake_max_silent_share",
                "must be within 0 and 1",
            ));
        }
        Ok(())
    }
}

/// The agent callback server (CONTRACTS.md §4): resident agents call it
/// with heartbeats over gRPC and mutual TLS.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BmaasConfig {
    pub enabled: bool,
    pub listen: std::net::SocketAddr,
    /// The address agents are told to call (`TakeoverInit.bmaas_endpoint`),
    /// `host:port`. Unset: `initializer.agent_endpoint` (older
    /// configurations); the Initializer runs only when one is set.
    pub endpoint: Option<String>,
    /// Where the callback's CA and server certificate live (generated on
    /// first start; put your own there under the same names). Unset: the
    /// directory of `ssh.key_file`.
    pub tls_dir: Option<PathBuf>,
    /// Heartbeats written in one statement at most.
    pub max_batch: u32,
    /// Heartbeat batches written at once at most.
    pub max_writes_in_flight: u32,
}

impl Default for BmaasConfig {
    fn default() -> Self {
        BmaasConfig {
            enabled: true,
            listen: ([127, 0, 0, 1], 7830).into(),
            endpoint: None,
            tls_dir: None,
            max_batch: 2000,
            max_writes_in_flight: 2,
        }
    }
}

impl BmaasConfig {
    fn validate(&mut self) -> Result<(), ConfigError> {
        if let Some(e) = &self.endpoint {
            if e.trim().is_empty() {
                self.endpoint = None;
            } else if endpoint_host(e).is_none() {
                return Err(ConfigError::key(
                    "bmaas.endpoint",
                    "must be host:port (the address agents call)",
                ));
            }
        }
        if !(1..=100_000).contains(&self.max_batch) {
            return Err(ConfigError::key(
                "bmaas.max_batch",
                "must be within 1 and 100000",
            ));
        }
        if !(1..=64).contains(&self.max_writes_in_flight) {
            return Err(ConfigError::key(
                "bmaas.max_writes_in_flight",
                "must be within 1 and 64",
            ));
        }
        Ok(())
    }
}

/// The host of a `host:port` endpoint (`[v6]:port` too), read as agents
/// read it.
pub use shepherd_proto::callback::endpoint_host;

/// The admin HTTP server.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    pub enabled: bool,
    pub listen: std::net::SocketAddr,
    /// Bearer token, named `admin` in the audit of operator actions.
    pub token: Option<Secret>,
    /// Named bearer tokens (`alice = { env = "ALICE_TOKEN" }`): each
    /// operator's own, so the audit says who acted. With any token set
    /// (here or `token`), every route but `/healthz` wants one; one is
    /// required when `listen` is not a loopback address.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tokens: std::collections::BTreeMap<String, Secret>,
    /// How long a route waits for the BMDB before it answers 503 naming
    /// it (`/readyz`, the API, the pages; `/metrics` answers without it).
    #[serde(with = "humantime_serde")]
    pub database_timeout: Duration,
    /// HTTPS. Required when `listen` is not a loopback address: no token
    /// crosses a network in the clear.
    pub tls: AdminTlsConfig,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            enabled: true,
            listen: ([127, 0, 0, 1], 9090).into(),
            token: None,
            tokens: Default::default(),
            database_timeout: Duration::from_secs(1),
            tls: AdminTlsConfig::default(),
        }
    }
}

/// The admin server's TLS: a certificate and key from files (read again
/// when either changes), or, without them, a certificate issued at each
/// start by the fleet's CA (the callback's), for the listen address and
/// `names`; the CA's certificate is then written beside the callback's
/// files as `fleet-ca.pem`, for tenants to trust.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminTlsConfig {
    pub enabled: bool,
    /// PEM: the certificate, then its chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// PEM: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// Host names and addresses the issued certificate names, besides the
    /// listen address (what tenants type in their URLs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
}

/// Names the audit uses for actors that are not tokens.
pub const RESERVED_ACTORS: [&str; 2] = ["cli", "anonymous"];

impl AdminConfig {
    fn validate(&mut self) -> Result<(), ConfigError> {
        if self.database_timeout < Duration::from_millis(100)
            || self.database_timeout > Duration::from_secs(60)
        {
            return Err(ConfigError::key(
                "admin.database_timeout",
                "must be within 100ms and 60s",
            ));
        }
        if let Some(t) = &mut self.token {
            t.resolve()
                .map_err(|m| ConfigError::key("admin.token", m))?;
        }
        if self.token.is_some() && self.tokens.contains_key("admin") {
            return Err(ConfigError::key(
                "admin.tokens.admin",
                "is the name admin.token goes by; give this token another name",
            ));
        }
        for (name, t) in &mut self.tokens {
            let key = format!("admin.tokens.{name}");
            let well_formed = !name.is_empty()
                && name.len() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-@".contains(c));
            if !well_formed {
                return Err(ConfigError::key(
                    &key,
                    "a token's name is 1 to 64 of A-Z, a-z, 0-9, '.', '_', '-', '@'",
                ));
            }
            if RESERVED_ACTORS.contains(&name.as_str()) {
                return Err(ConfigError::key(
                    &key,
                    format!("{name:?} is reserved (the audit's name for actions without a token)"),
                ));
            }
            t.resolve().map_err(|m| ConfigError::key(&key, m))?;
            if t.expose().len() < 16 {
                return Err(ConfigError::key(&key, "must be at least 16 characters"));
            }
        }
        let named = self.named_tokens();
        for (i, (a, ta)) in named.iter().enumerate() {
            if let Some((b, _)) = named[i + 1..].iter().find(|(_, tb)| tb == ta) {
                return Err(ConfigError::key(
                    format!("admin.tokens.{b}"),
                    format!("is the same token as {a}'s; the audit could not tell them apart"),
                ));
            }
        }
        match (&self.tls.cert_file, &self.tls.key_file) {
            (Some(_), None) => {
                return Err(ConfigError::key(
                    "admin.tls.key_file",
                    "must be set with admin.tls.cert_file",
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError::key(
                    "admin.tls.cert_file",
                    "must be set with admin.tls.key_file",
                ));
            }
            _ => {}
        }
        if self.enabled && !self.listen.ip().is_loopback() && named.is_empty() {
            return Err(ConfigError::key(
                "admin.token",
                format!(
                    "must be set (or admin.tokens) when admin.listen ({}) is not a loopback address",
                    self.listen
                ),
            ));
        }
        if self.enabled && !self.listen.ip().is_loopback() && !self.tls.enabled {
            return Err(ConfigError::key(
                "admin.tls.enabled",
                format!(
                    "must be true when admin.listen ({}) is not a loopback address: tokens never cross a network in the clear",
                    self.listen
                ),
            ));
        }
        Ok(())
    }

    /// Every token with its name (`admin.token` is `admin`).
    pub fn named_tokens(&self) -> Vec<(String, Secret)> {
        self.token
            .iter()
            .map(|t| ("admin".to_string(), t.clone()))
            .chain(self.tokens.iter().map(|(n, t)| (n.clone(), t.clone())))
            .collect()
    }
}

/// The Updater: refreshes provider records in the BMDB.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpdaterConfig {
    pub enabled: bool,
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
}

impl Default for UpdaterConfig {
    fn default() -> Self {
        UpdaterConfig {
            enabled: true,
            interval: Duration::from_secs(60),
        }
    }
}

/// Operating system installations: rollouts, and the image server.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct InstallationsConfig {
    /// How often running rollouts are moved on.
    #[serde(with = "humantime_serde")]
    pub rollout_interval: Duration,
    /// An installation or erasure on which nothing moved for this long (no
    /// agent took it, or its agent's progress stood still or stopped
    /// coming, while the callback was served) is failed with the cause.
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
    /// shepherd serves the images in this directory (HTTP Range, over TLS
    /// with a certificate of the callback CA, which agents are given).
    /// Unset: no image server; installations name their image's URL.
    pub images_dir: Option<PathBuf>,
    pub images_listen: std::net::SocketAddr,
    /// `host:port` agents fetch served images from. Unset: the host of
    /// `bmaas.endpoint` and the port of `images_listen`.
    pub images_endpoint: Option<String>,
    /// `host:port` BMCs fetch each boot's copy of the boot image from (a
    /// BMC's management network is often not its machine's). Unset:
    /// `images_endpoint`'s.
    pub boot_endpoint: Option<String>,
    /// The boot image (`scripts/boot-image`, its `.slot` beside it) the
    /// image server serves per boot. Unset: `shepherd-boot.iso` beside the
    /// shepherd binary, if there is one.
    pub boot_image: Option<PathBuf>,
}

impl Default for InstallationsConfig {
    fn default() -> Self {
        InstallationsConfig {
            rollout_interval: Duration::from_secs(5),
            deadline: Duration::from_secs(60 * 60),
            images_dir: None,
            images_listen: ([127, 0, 0, 1], 7831).into(),
            images_endpoint: None,
            boot_endpoint: None,
            boot_image: None,
        }
    }
}

impl InstallationsConfig {
    /// Where agents fetch served images: `images_endpoint`, else the
    /// agents' callback host (`callback`, an endpoint) with the image
    /// server's port, else the image server's own address.
    pub fn images_endpoint(&self, callback: Option<&str>) -> String {
        if let Some(e) = &self.images_endpoint {
            return e.clone();
        }
        let port = self.images_listen.port();
        match callback.and_then(endpoint_host) {
            Some(h) if h.contains(':') => format!("[{h}]:{port}"),
            Some(h) => format!("{h}:{port}"),
            None => self.images_listen.to_string(),
        }
    }

    fn validate(&mut self) -> Result<(), ConfigError> {
        if self.rollout_interval.is_zero() {
            return Err(ConfigError::key(
                "installations.rollout_interval",
                "must be positive",
            ));
        }
        if self.deadline < Duration::from_secs(60) {
            return Err(ConfigError::key(
                "installations.deadline",
                "must be at least 1m (an agent reports progress every few seconds while it works)",
            ));
        }
        if self
            .images_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            self.images_dir = None;
        }
        if self
            .boot_image
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            self.boot_image = None;
        }
        if let Some(e) = &self.images_endpoint {
            if e.trim().is_empty() {
                self.images_endpoint = None;
            } else if endpoint_host(e).is_none() {
                return Err(ConfigError::key(
                    "installations.images_endpoint",
                    "must be host:port (where agents fetch served images)",
                ));
            }
        }
        if let Some(e) = &self.boot_endpoint {
            if e.trim().is_empty() {
                self.boot_endpoint = None;
            } else if endpoint_host(e).is_none() {
                return Err(ConfigError::key(
                    "installations.boot_endpoint",
                    "must be host:port (where BMCs fetch boot images)",
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisorConfig {
    /// On SIGINT/SIGTERM, how long running takeovers may finish.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Wait before restarting a failed part; first wait before reopening a
    /// lost session (attempts then double up to 2 s, or this if longer).
    #[serde(with = "humantime_serde")]
    pub restart_backoff: Duration,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        SupervisorConfig {
            drain_timeout: Duration::from_secs(30),
            restart_backoff: Duration::from_secs(1),
        }
    }
}

impl ProviderConfig {
    fn validate(&mut self, equinix: &EquinixConfig) -> Result<(), ConfigError> {
        match self.kind {
            ProviderKind::Equinix => {
                equinix.credentials()?;
                let e = &self.equinix;
                if e.hostname_prefix.is_empty() {
                    return Err(ConfigError::key(
                        "provider.equinix.hostname_prefix",
                        "must not be empty",
                    ));
                }
                if e.metro.is_none() && e.facility.is_none() {
                    return Err(ConfigError::key(
                        "provider.equinix.metro",
                        "a metro (or a facility) must be set",
                    ));
                }
                if e.operating_system.is_empty() {
                    return Err(ConfigError::key(
                        "provider.equinix.operating_system",
                        "must not be empty",
                    ));
                }
            }
            ProviderKind::Static => {
                let mut seen = std::collections::HashSet::new();
                let mut macs = std::collections::HashMap::new();
                for (i, m) in self.inventory.machines.iter_mut().enumerate() {
                    if let Some(bmc) = &mut m.bmc {
                        let id = &m.id;
                        bmc.validate().map_err(|(k, e)| {
                            let e = if k == "secure_boot" {
                                format!("host {id}: {e}")
                            } else {
                                e
                            };
                            ConfigError::key(format!("provider.inventory.machines[{i}].bmc.{k}"), e)
                        })?;
                    }
                    if let Err(e) = inventory::check_id(&m.id) {
                        return Err(ConfigError::key(
                            format!("provider.inventory.machines[{i}].id"),
                            e,
                        ));
                    }
                    if !seen.insert(m.id.clone()) {
                        return Err(ConfigError::key(
                            format!("provider.inventory.machines[{i}].id"),
                            format!("{} is listed twice", m.id),
                        ));
                    }
                    if let Err(e) = m.check_reach() {
                        let key = match m.boot {
                            Some(BootMethod::Network) if m.bmc.is_some() => "mac",
                            Some(BootMethod::VirtualMedia) if m.bmc.is_some() => "boot",
                            _ if m.boots_from_bmc() => "bmc",
                            _ => "address",
                        };
                        return Err(ConfigError::key(
                            format!("provider.inventory.machines[{i}].{key}"),
                            format!("host {}: {e}", m.id),
                        ));
                    }
                    for mac in m.boot_macs() {
                        if let Some(other) = macs.insert(mac, m.id.clone()) {
                            return Err(ConfigError::key(
                                format!("provider.inventory.machines[{i}].mac"),
                                format!("host {}: {mac} is host {other}'s too", m.id),
                            ));
                        }
                    }
                }
                if let Some(f) = &self.inventory.file {
                    inventory::read_file(f)
                        .map_err(|m| ConfigError::key("provider.inventory.file", m))?;
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A tracing filter: `info`, `shepherd=debug,info`. `RUST_LOG` wins if set.
    pub level: String,
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info,tokio_postgres=warn,refinery_core=warn".into(),
            format: LogFormat::Text,
        }
    }
}

fn serialize_url<S: serde::Serializer>(url: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match url {
        Some(u) => s.serialize_some(&redact_database_url(u)),
        None => s.serialize_none(),
    }
}

impl Config {
    /// Loads `path` (if given) under the process environment's overrides, then
    /// validates.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        Self::load_with_env(path, std::env::vars())
    }

    /// As `load`, with the environment given explicitly (for tests and
    /// embedding).
    pub fn load_with_env(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut builder = config::Config::builder();
        if let Some(path) = path {
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                path: path.to_path_buf(),
                message: format!("cannot read: {e}"),
            })?;
            // Check the syntax ourselves: the parser's own message quotes the
            // offending line, which may hold a secret. Report position only.
            if let Err(e) = text.parse::<toml::Table>() {
                let (line, col) = e.span().map(|s| line_col(&text, s.start)).unwrap_or((0, 0));
                return Err(ConfigError::File {
                    path: path.to_path_buf(),
                    message: format!("line {line}, column {col}: {}", e.message()),
                });
            }
            builder = builder.add_source(config::File::from_str(&text, config::FileFormat::Toml));
        }
        let prefix = format!("{ENV_PREFIX}{ENV_SEPARATOR}");
        let env: config::Map<String, String> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .collect();
        builder = builder.add_source(
            config::Environment::with_prefix(ENV_PREFIX)
                .prefix_separator(ENV_SEPARATOR)
                .separator(ENV_SEPARATOR)
                .try_parsing(true)
                .source(Some(env)),
        );
        let raw = builder
            .build()
            .map_err(|e| ConfigError::key("(config)", e.to_string()))?;
        let mut cfg: Config = serde_path_to_error::deserialize(raw).map_err(|e| {
            let (key, message) = loops::keyed_error(e.path().to_string(), &e.inner().to_string());
            let message = clean_serde_message(&message);
            ConfigError::key(
                if key == "." {
                    "(top level)".into()
                } else {
                    key
                },
                message,
            )
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks every key and resolves secrets. Runs once, at start.
    pub fn validate(&mut self) -> Result<(), ConfigError> {
        let b = &mut self.bmdb;
        if let Some(url) = &b.url {
            if url.trim().is_empty() {
                b.url = None;
            } else if let Err(e) = url.parse::<tokio_postgres::Config>() {
                // The parser's message does not echo the URL.
                return Err(ConfigError::key(
                    "bmdb.url",
                    format!("not a PostgreSQL URL: {e}"),
                ));
            }
        }
        if let Some(pw) = &mut b.password {
            pw.resolve()
                .map_err(|m| ConfigError::key("bmdb.password", m))?;
        }
        if b.pool_size == 0 {
            return Err(ConfigError::key("bmdb.pool_size", "must be at least 1"));
        }
        if b.connect_timeout.is_zero() {
            return Err(ConfigError::key("bmdb.connect_timeout", "must be positive"));
        }
        if b.acquire_timeout.is_zero() {
            return Err(ConfigError::key("bmdb.acquire_timeout", "must be positive"));
        }
        if b.session_interval < Duration::from_secs(1)
            || b.session_interval.subsec_nanos() != 0
            || b.session_interval > Duration::from_secs(i32::MAX as u64)
        {
            return Err(ConfigError::key(
                "bmdb.session_interval",
                "must be a whole number of seconds, at least 1s",
            ));
        }
        if b.max_attempts == 0 {
            return Err(ConfigError::key("bmdb.max_attempts", "must be at least 1"));
        }
        if b.embedded.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::key(
                "bmdb.embedded.data_dir",
                "must not be empty",
            ));
        }
        if b.embedded.start_timeout.is_zero() {
            return Err(ConfigError::key(
                "bmdb.embedded.start_timeout",
                "must be positive",
            ));
        }
        self.equinix.validate()?;
        self.ssh.validate()?;
        self.initializer.validate()?;
        self.enroller.validate()?;
        self.provider.validate(&self.equinix)?;
        if self.provisioner.interval.is_zero() {
            return Err(ConfigError::key("provisioner.interval", "must be positive"));
        }
        if self.provisioner.chunk_size == 0 {
            return Err(ConfigError::key(
                "provisioner.chunk_size",
                "must be at least 1",
            ));
        }
        self.recoverer.validate()?;
        self.admin.validate()?;
        self.bmaas.validate()?;
        self.redfish.validate()?;
        self.ipmi.validate()?;
        if let Some(n) = &self.netboot {
            n.validate()?;
            if n.discover && self.provider.kind != ProviderKind::Static {
                // An accepted machine becomes an inventory host.
                return Err(ConfigError::key(
                    "netboot.discover",
                    "machines that enlist themselves are accepted into the static inventory: needs provider.kind = \"static\"",
                ));
            }
        }
        if self.updater.interval.is_zero() {
            return Err(ConfigError::key("updater.interval", "must be positive"));
        }
        self.installations.validate()?;
        self.metal.validate()?;
        if !self.metal.operating_systems.is_empty() && self.installations.images_dir.is_none() {
            return Err(ConfigError::key(
                "metal.operating_systems",
                "are images shepherd serves: set installations.images_dir",
            ));
        }
        if self.supervisor.restart_backoff.is_zero() {
            return Err(ConfigError::key(
                "supervisor.restart_backoff",
                "must be positive",
            ));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return Err(ConfigError::key(
                "log.level",
                format!("not a log filter: {e}"),
            ));
        }
        Ok(())
    }

    /// The effective configuration as TOML, secrets redacted.
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string(self).expect("configuration serializes to TOML")
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    (line, col)
}

/// serde and config phrase type errors with the offending value; strip
/// anything quoted so a mistyped secret never reaches the terminal.
fn clean_serde_message(msg: &str) -> String {
    // A missing field's quoted part is its name, not a value: keep it.
    for prefix in ["missing configuration field ", "missing field "] {
        if let Some(rest) = msg.strip_prefix(prefix) {
            // The config crate names the whole path: keep its last part.
            let path = rest.trim_matches(['"', '`']);
            let name = path.rsplit('.').next().unwrap_or(path);
            if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return format!("missing key `{name}`");
            }
        }
    }
    let mut out = String::with_capacity(msg.len());
    let mut in_quote = false;
    for c in msg.chars() {
        if c == '"' {
            if !in_quote {
                out.push_str("\"…");
            } else {
                out.push('"');
            }
            in_quote = !in_quote;
            continue;
        }
        if !in_quote {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_validate() {
        let cfg = Config::load_with_env(None, env(&[])).unwrap();
        assert_eq!(cfg.bmdb.pool_size, 16);
        assert!(cfg.bmdb.url.is_none());
    }

    #[test]
    fn env_overrides_nested_keys() {
        let cfg = Config::load_with_env(
            None,
            env(&[
                ("SHEPHERD__BMDB__URL", "postgres://u:pw@127.0.0.1/x"),
                ("SHEPHERD__BMDB__POOL_SIZE", "3"),
                ("SHEPHERD__BMDB__EMBEDDED__FSYNC", "false"),
                ("SHEPHERD__BMDB__SESSION_INTERVAL", "4s"),
            ]),
        )
        .unwrap();
        assert_eq!(cfg.bmdb.pool_size, 3);
        assert!(!cfg.bmdb.embedded.fsync);
        assert_eq!(cfg.bmdb.session_interval, Duration::from_secs(4));
        let shown = cfg.to_redacted_toml();
        assert!(shown.contains("u:<redacted>@127.0.0.1"), "{shown}");
        assert!(!shown.contains("pw@"), "{shown}");
    }

    #[test]
    fn ill_typed_and_unknown_keys_are_named() {
        let e =
            Config::load_with_env(None, env(&[("SHEPHERD__BMDB__POOL_SIZE", "many")])).unwrap_err();
        assert_eq!(e.key_name(), Some("bmdb.pool_size"), "{e}");
        let e = Config::load_with_env(None, env(&[("SHEPHERD__BMDB__POOL_SIZ", "1")])).unwrap_err();
        assert!(e.to_string().contains("pool_siz"), "{e}");
        let e =
            Config::load_with_env(None, env(&[("SHEPHERD__BMDB__POOL_SIZE", "0")])).unwrap_err();
        assert_eq!(e.key_name(), Some("bmdb.pool_size"));
    }

    #[test]
    fn an_inventory_host_with_no_way_in_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("shepherd.toml");
        let load = |hosts: &str| {
            std::fs::write(&f, format!("[provider.inventory]\nmachines = [{hosts}]\n")).unwrap();
            Config::load_with_env(Some(&f), Vec::new())
        };
        let e =
            load(r#"{ id = "a", address = "192.0.2.1" }, { id = "rack1-u12", location = "r1" }"#)
                .unwrap_err();
        assert_eq!(
            e.key_name(),
            Some("provider.inventory.machines[1].address"),
            "{e}"
        );
        assert!(
            e.to_string().contains("host rack1-u12: address is missing"),
            "{e}"
        );
        let e = load(r#"{ id = "rack1-u13", boot = "virtual-media" }"#).unwrap_err();
        assert_eq!(
            e.key_name(),
            Some("provider.inventory.machines[0].bmc"),
            "{e}"
        );
        assert!(e.to_string().contains("rack1-u13"), "{e}");
        let e = load(r#"{ id = "x", address = "192.0.2.1", boot = "pxe" }"#).unwrap_err();
        assert!(e.to_string().contains("pxe"), "{e}");
        let ok = load(
            r#"{ id = "rack1-u14", boot = "virtual-media", bmc = { url = "https://10.0.0.5", username = "admin", password = "pw" } }"#,
        )
        .unwrap();
        let m = &ok.provider.inventory.machines[0];
        assert!(m.boots_from_bmc() && m.address.is_none());
    }

    #[test]
    fn a_network_boot_host_and_the_netboot_section_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("shepherd.toml");
        let load = |text: &str| {
            std::fs::write(&f, text).unwrap();
            Config::load_with_env(Some(&f), Vec::new())
        };
        let ipmi = r#"bmc = { url = "ipmi://10.0.0.7", username = "admin", password = "pw" }"#;
        let e = load(&format!(
            "[provider.inventory]\nmachines = [{{ id = \"r2-u3\", boot = \"network\", {ipmi} }}]\n"
        ))
        .unwrap_err();
        assert_eq!(
            e.key_name(),
            Some("provider.inventory.machines[0].mac"),
            "{e}"
        );
        assert!(e.to_string().contains("r2-u3"), "{e}");
        let e = load(&format!(
            "[provider.inventory]\nmachines = [{{ id = \"r2-u3\", boot = \"virtual-media\", {ipmi} }}]\n"
        ))
        .unwrap_err();
        assert!(e.to_string().contains("IPMI has no virtual media"), "{e}");
        let e = load(&format!(
            "[provider.inventory]\nmachines = [\n{{ id = \"a\", boot = \"network\", mac = \"52:54:00:12:34:56\", {ipmi} }},\n{{ id = \"b\", boot = \"network\", macs = [\"52-54-00-12-34-56\"], {ipmi} }}]\n"
        ))
        .unwrap_err();
        assert_eq!(
            e.key_name(),
            Some("provider.inventory.machines[1].mac"),
            "{e}"
        );
        assert!(e.to_string().contains("host a's too"), "{e}");
        let e = load(
            "[provider.inventory]\nmachines = [{ id = \"a\", boot = \"network\", mac = \"52:54:00:12:34:56\", bmc = { url = \"ipmi://10.0.0.7:x\", username = \"admin\", password = \"pw\" } }]\n",
        )
        .unwrap_err();
        assert_eq!(
            e.key_name(),
            Some("provider.inventory.machines[0].bmc.url"),
            "{e}"
        );
        let e = load(
            "[provider.inventory]\nmachines = [{ id = \"a\", boot = \"network\", mac = \"52:54:00:12:34:56\", bmc = { url = \"ipmi://10.0.0.7\", username = \"admin\", password = \"this-is-longer-than-twenty\" } }]\n",
        )
        .unwrap_err();
        assert_eq!(
            e.key_name(),
            Some("provider.inventory.machines[0].bmc.password"),
            "{e}"
        );
        assert!(!e.to_string().contains("this-is-longer"), "{e}");
        let ok = load(&format!(
            "[provider.inventory]\nmachines = [{{ id = \"a\", boot = \"network\", mac = \"52:54:00:AB:34:56\", firmware = \"bios\", {ipmi} }}]\n"
        ))
        .unwrap();
        let m = &ok.provider.inventory.machines[0];
        assert_eq!(m.boot_macs()[0].to_string(), "52:54:00:ab:34:56");
        assert_eq!(
            m.bmc.as_ref().unwrap().ipmi_target(),
            Some(("10.0.0.7".to_string(), 623))
        );
        assert!(ok.netboot.is_none());
        // Secure Boot asked of an IPMI BMC: refused at load, naming the
        // host; a Redfish BMC takes it.
        let e = load(
            "[provider.inventory]\nmachines = [{ id = \"rack1-u7\", boot = \"network\", mac = \"52:54:00:12:34:56\", bmc = { url = \"ipmi://10.0.0.7\", username = \"admin\", password = \"pw\", secure_boot = true } }]\n",
        )
        .unwrap_err();
        assert_eq!(
            e.key_name(),
            Some("provider.inventory.machines[0].bmc.secure_boot"),
            "{e}"
        );
        assert!(e.to_string().contains("host rack1-u7"), "{e}");
        let ok = load(
            "[provider.inventory]\nmachines = [{ id = \"a\", boot = \"virtual-media\", bmc = { url = \"https://10.0.0.7\", username = \"admin\", password = \"pw\", secure_boot = false } }]\n",
        )
        .unwrap();
        assert_eq!(
            ok.provider.inventory.machines[0]
                .bmc
                .as_ref()
                .unwrap()
                .secure_boot,
            Some(false)
        );

        let e = load("[netboot]\nmode = \"proxy\"\n").unwrap_err();
        assert_eq!(e.key_name(), Some("netboot.interface"), "{e}");
        let e = load("[netboot]\ninterface = \"br0\"\nmode = \"dhcp\"\n").unwrap_err();
        assert_eq!(e.key_name(), Some("netboot.range"), "{e}");
        let e = load(
            "[netboot]\ninterface = \"br0\"\nmode = \"dhcp\"\nrange = \"10.0.0.9-10.0.0.1\"\n",
        )
        .unwrap_err();
        assert_eq!(e.key_name(), Some("netboot.range"), "{e}");
        let ok = load("[netboot]\ninterface = \"br0\"\n").unwrap();
        let n = ok.netboot.unwrap();
        assert_eq!(
            (n.mode, n.dhcp_port, n.tftp_port, n.discover),
            (NetbootMode::Proxy, 67, 69, false)
        );
        // What UEFI firmware PXE loads: iPXE in proxy mode, the signed
        // chain when shepherd is the DHCP server (the next server GRUB
        // reads), or as set.
        assert_eq!(n.uefi_chain(), UefiChain::Ipxe);
        let dhcp = load(
            "[netboot]\ninterface = \"br0\"\nmode = \"dhcp\"\nrange = \"10.0.0.1-10.0.0.9\"\n",
        )
        .unwrap()
        .netboot
        .unwrap();
        assert_eq!(dhcp.uefi_chain(), UefiChain::Shim);
        let set = load("[netboot]\ninterface = \"br0\"\nuefi = \"shim\"\n")
            .unwrap()
            .netboot
            .unwrap();
        assert_eq!(set.uefi_chain(), UefiChain::Shim);
        let e = load("[netboot]\ninterface = \"br0\"\nuefi = \"grub\"\n").unwrap_err();
        assert_eq!(e.key_name(), Some("netboot.uefi"), "{e}");
        let e = load("[netboot]\ninterface = \"br0\"\ndiscover = true\ndiscover_per_minute = 0\n")
            .unwrap_err();
        assert_eq!(e.key_name(), Some("netboot.discover_per_minute"), "{e}");
        let e = load("[netboot]\ninterface = \"br0\"\ndiscover_ttl = \"5s\"\n").unwrap_err();
        assert_eq!(e.key_name(), Some("netboot.discover_ttl"), "{e}");
    }

    #[test]
    fn a_mistyped_secret_is_not_echoed() {
        assert_eq!(
            clean_serde_message(r#"invalid type: string "hunter2", expected u32"#),
            "invalid type: string \"…\", expected u32"
        );
    }
}

#[cfg(test)]
mod documented_defaults {
    use super::*;

    /// config/shepherd.toml documents every default: it must load to exactly
    /// the built-in configuration.
    #[test]
    fn the_shipped_file_matches_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/shepherd.toml");
        let from_file = Config::load_with_env(Some(&path), Vec::new()).unwrap();
        let mut defaults = Config::default();
        defaults.validate().unwrap();
        assert_eq!(from_file.to_redacted_toml(), defaults.to_redacted_toml());
    }

    /// ...and writes every key out (set, or commented out when it has no
    /// default), under its section, so an operator finds each one there.
    #[test]
    fn the_shipped_file_documents_every_key() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/shepherd.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let mut missing = Vec::new();
        let all = toml::Value::try_from(Config::default()).unwrap();
        fn walk(prefix: &str, v: &toml::Value, text: &str, missing: &mut Vec<String>) {
            let toml::Value::Table(t) = v else { return };
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match v {
                    toml::Value::Table(_) => {
                        if !text.contains(&format!("[{key}]")) {
                            missing.push(format!("[{key}]"));
                        }
                        walk(&key, v, text, missing);
                    }
                    _ => {
                        if !text
                            .lines()
                            .any(|l| l.trim_start_matches("# ").starts_with(&format!("{k} =")))
                        {
                            missing.push(key);
                        }
                    }
                }
            }
        }
        walk("", &all, &text, &mut missing);
        // Keys without a default (Option) are absent from the serialized
        // defaults; check the known ones are shown commented out.
        for k in [
            "url",
            "password",
            "bin_dir",
            "project_id",
            "api_key",
            "known_hosts_file",
            "agent_binary",
            "agent_endpoint",
            "agent_ca_certificate",
            "endpoint",
            "tls_dir",
            "plan",
            "metro",
            "facility",
            "file",
            "tokens",
            "interface",
            "mode",
            "range",
            "router",
            "dns",
            "lease",
            "tftp_root",
            "discover",
            "discover_per_minute",
            "discover_ttl",
            "address",
            "http_listen",
            "dhcp_port",
            "proxy_port",
            "tftp_port",
            "answer_router_solicitations",
        ] {
            if !text
                .lines()
                .any(|l| l.trim_start_matches("# ").starts_with(&format!("{k} =")))
            {
                missing.push(k.to_string());
            }
        }
        assert!(
            missing.is_empty(),
            "config/shepherd.toml does not document: {missing:?}"
        );
    }
}
