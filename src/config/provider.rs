//! Where machines come from: `[equinix]`, the Equinix Metal API client
//! (its pace, retries and credentials), and `[provider]`, the provider
//! of machines: the static inventory (`[provider.inventory]`) or Equinix
//! Metal devices from hardware reservations (`[provider.equinix]`).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::inventory::{self, BootMethod, InventoryMachine};
use crate::secret::Secret;

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
    pub(super) fn validate(&mut self) -> Result<(), ConfigError> {
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
        ConfigError::positive("equinix.request_timeout", self.request_timeout)?;
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
        ConfigError::within("equinix.per_page", self.per_page, 1..=1000)?;
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

impl ProviderConfig {
    pub(super) fn validate(&mut self, equinix: &EquinixConfig) -> Result<(), ConfigError> {
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
                        .map_err(|e| ConfigError::key("provider.inventory.file", e.to_string()))?;
                }
            }
        }
        Ok(())
    }
}
