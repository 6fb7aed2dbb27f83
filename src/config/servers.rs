//! `[bmaas]`, the agent callback server, and `[admin]`, the admin HTTP
//! server (its tokens, the names the audit reserves, its TLS).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, endpoint_host};
use crate::secret::Secret;

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
    pub(super) fn validate(&mut self) -> Result<(), ConfigError> {
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
        ConfigError::within("bmaas.max_batch", self.max_batch, 1..=100_000)?;
        ConfigError::within(
            "bmaas.max_writes_in_flight",
            self.max_writes_in_flight,
            1..=64,
        )?;
        Ok(())
    }
}

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
    /// BMDB connections of the admin server's own (the API, the pages,
    /// the Metal API), apart from `bmdb.pool_size`'s, which the fleet's
    /// work shares: an enrollment storm holding those cannot keep an
    /// operator or a tenant waiting. 0: share the fleet's pool.
    pub database_connections: u32,
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
            database_connections: 4,
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
    pub(super) fn validate(&mut self) -> Result<(), ConfigError> {
        if self.database_timeout < Duration::from_millis(100)
            || self.database_timeout > Duration::from_secs(60)
        {
            return Err(ConfigError::key(
                "admin.database_timeout",
                "must be within 100ms and 60s",
            ));
        }
        if self.database_connections > 64 {
            return Err(ConfigError::key(
                "admin.database_connections",
                format!(
                    "{} is more than 64; a few serve operators and tenants (0 shares bmdb.pool_size's)",
                    self.database_connections
                ),
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
