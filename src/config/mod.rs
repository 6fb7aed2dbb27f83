//! Configuration: one TOML file, overridden by `SHEPHERD__SECTION__KEY`
//! environment variables, validated once at start.
//!
//! Every key has a default (documented in `config/shepherd.toml`), so an empty
//! configuration is a working one: an embedded PostgreSQL under `var/bmdb`.
//! Unknown keys are errors. Every error names the key it is about and never
//! shows a secret.
//!
//! One file per subject, each section's struct beside its defaults and its
//! checks, so that a key's default and rule are read at once:
//! - `bmdb.rs`: `[bmdb]`;
//! - `provider.rs`: `[equinix]`, `[provider]`;
//! - `access.rs`: `[ssh]`, `[initializer]`, `[enroller]`, `[redfish]`;
//! - `control.rs`: `[provisioner]`, `[recoverer]`, `[updater]`,
//!   `[supervisor]`;
//! - `servers.rs`: `[bmaas]`, `[admin]`;
//! - `installations.rs`: `[installations]`;
//! - `netboot.rs`: `[netboot]`, `[ipmi]`;
//! - `metal.rs`: `[metal]`;
//! - `baselines.rs`: `[[baselines]]`;
//! - `network.rs`: `[network]` (switches, VLANs);
//! - `log.rs`: `[log]`.
//!
//! `loops.rs` holds what the lease loops' sections share, `inventory/` the
//! static inventory's hosts. This file: `Config` itself, its loading (the
//! file, then the environment's overrides) and `Config::validate`, which
//! runs each section's checks and holds those of `[bmdb]`, `[provisioner]`,
//! `[updater]` and `[supervisor]` and those across sections.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod access;
mod baselines;
mod bmdb;
mod console;
mod control;
mod error;
mod installations;
pub mod inventory;
mod log;
pub mod loops;
pub mod metal;
pub mod netboot;
pub mod network;
mod provider;
mod servers;

pub use access::{
    EnrollerConfig, HostKeyPolicy, InitializerConfig, RedfishConfig, SshConfig, UploadMethod,
};
pub use baselines::{BaselineConfig, ComponentConfig, ServicingConfig, VolumeConfig};
pub use bmdb::{BmdbConfig, EmbeddedConfig, Isolation};
pub use console::{ConsoleConfig, ConsoleSettings, ConsoleVia};
pub use control::{ProvisionerConfig, RecovererConfig, SupervisorConfig, UpdaterConfig};
pub use error::ConfigError;
pub use installations::InstallationsConfig;
pub use inventory::{BmcConfig, BmcProtocol, BmcTls, BootMethod, Firmware, InventoryMachine};
pub use log::{LogConfig, LogFormat};
pub use loops::{
    EnrollerLease, InitializerLease, LeaseDefaults, LeaseSettings, RecovererLease, ServicerLease,
};
pub use metal::{MetalConfig, OperatingSystemConfig, PlanConfig};
pub use netboot::{AddressRange, IpmiConfig, NetbootConfig, NetbootMode, UefiChain};
pub use network::{HostPort, NetworkConfig, SwitchConfig, SwitchDriverKind};
pub use provider::{
    EquinixConfig, EquinixProviderConfig, InventoryConfig, ProviderConfig, ProviderKind,
};
pub use servers::{AdminConfig, AdminTlsConfig, BmaasConfig, RESERVED_ACTORS};

/// Environment variables with this prefix override file keys:
/// `SHEPHERD__BMDB__URL` is `bmdb.url`.
pub const ENV_PREFIX: &str = "SHEPHERD";
pub const ENV_SEPARATOR: &str = "__";

/// The host of a `host:port` endpoint (`[v6]:port` too), read as agents
/// read it.
pub use shepherd_proto::callback::endpoint_host;

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
    /// What should be below machines' operating systems, per group of
    /// machines: firmware versions, BIOS settings, RAID layouts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub baselines: Vec<BaselineConfig>,
    /// Applying them: the Servicer.
    pub servicing: ServicingConfig,
    pub console: ConsoleSettings,
    /// The switches machines are cabled to, and the networks their ports
    /// are moved between.
    pub network: NetworkConfig,
    pub log: LogConfig,
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
        ConfigError::positive("bmdb.connect_timeout", b.connect_timeout)?;
        ConfigError::positive("bmdb.acquire_timeout", b.acquire_timeout)?;
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
        ConfigError::positive("bmdb.embedded.start_timeout", b.embedded.start_timeout)?;
        self.equinix.validate()?;
        self.ssh.validate()?;
        self.initializer.validate()?;
        self.enroller.validate()?;
        self.provider.validate(&self.equinix)?;
        ConfigError::positive("provisioner.interval", self.provisioner.interval)?;
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
        self.updater.validate()?;
        self.installations.validate()?;
        self.metal.validate()?;
        if !self.metal.operating_systems.is_empty() && self.installations.images_dir.is_none() {
            return Err(ConfigError::key(
                "metal.operating_systems",
                "are images shepherd serves: set installations.images_dir",
            ));
        }
        baselines::validate(&self.baselines, &self.metal.plans)?;
        self.servicing.validate()?;
        self.console.validate()?;
        self.network.validate()?;
        let mut cabled = std::collections::HashSet::new();
        for (i, m) in self.provider.inventory.machines.iter().enumerate() {
            self.network.check_ports(
                &format!("provider.inventory.machines[{i}]"),
                &m.ports,
                &mut cabled,
            )?;
            if m.ports.iter().any(|p| p.bmc) && self.network.bmc_vlan.is_none() {
                return Err(ConfigError::key(
                    format!("provider.inventory.machines[{i}].ports"),
                    "declares a BMC port: set network.bmc_vlan",
                ));
            }
        }
        if self.baselines.iter().any(|b| !b.components.is_empty())
            && self.installations.images_dir.is_none()
        {
            return Err(ConfigError::key(
                "baselines",
                "name firmware images shepherd serves: set installations.images_dir",
            ));
        }
        ConfigError::positive(
            "supervisor.restart_backoff",
            self.supervisor.restart_backoff,
        )?;
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
mod documented_defaults;
#[cfg(test)]
mod tests;
