//! `[bmdb]`: the database shepherd keeps its state in (the BMDB), a
//! PostgreSQL server at `url` or, without one, an embedded server
//! (`[bmdb.embedded]`). The section's checks are in `Config::validate`.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::secret::{Secret, redact_database_url};

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

fn serialize_url<S: serde::Serializer>(url: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match url {
        Some(u) => s.serialize_some(&redact_database_url(u)),
        None => s.serialize_none(),
    }
}
