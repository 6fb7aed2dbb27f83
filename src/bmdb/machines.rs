//! Machines and their tags: creating provided machines, setting tags,
//! reading leases, backoffs and history.

use std::time::SystemTime;

use uuid::Uuid;

use super::selectors::{ProvidedMachine, provided_columns};
use super::{BmdbError, HistoryEvent, Process, Provider, ProviderStatus, Tx};

/// A machine the provider has for us, to be recorded in the BMDB.
#[derive(Debug, Clone)]
pub struct NewProvidedMachine {
    pub provider: Provider,
    pub provider_id: String,
    pub reservation_id: Option<String>,
    pub ip_address: Option<String>,
    pub location: Option<String>,
    pub status: Option<ProviderStatus>,
}

const MACHINE_INSERT: &str =
    "INSERT INTO machines (machine_id, machine_created_at) VALUES ($1, now())";
const PROVIDED_INSERT: &str = "INSERT INTO machine_provided (machine_id, provider, provider_id, \
     provider_reservation_id, provider_ip_address, provider_location, provider_status) \
     VALUES ($1, $2, $3, $4, $5, $6, $7)";
const AGENT_STARTED_SET: &str = "INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key) \
     VALUES ($1, now(), $2) ON CONFLICT (machine_id) DO UPDATE \
     SET agent_started_at = EXCLUDED.agent_started_at, agent_public_key = EXCLUDED.agent_public_key";
const PROVIDED_BY: &str = concat!(
    "SELECT ",
    provided_columns!(),
    " FROM machine_provided p WHERE p.provider = $1 ORDER BY p.provider_id"
);
const PROVIDED_ONE: &str = concat!(
    "SELECT ",
    provided_columns!(),
    " FROM machine_provided p WHERE p.machine_id = $1"
);
const HISTORY: &str = "SELECT process, event, \"timestamp\", failed_cause FROM work_history \
     WHERE machine_id = $1 ORDER BY work_history_id";
const BACKOFF: &str = "SELECT until, cause, last_interval_seconds FROM work_backoff \
     WHERE machine_id = $1 AND process = $2";
const HOST_KEY: &str = "SELECT host_key FROM machine_ssh_host_key WHERE machine_id = $1";
const HOST_KEY_RECORD: &str = "INSERT INTO machine_ssh_host_key (machine_id, host_key, first_seen_at) \
     VALUES ($1, $2, now()) ON CONFLICT (machine_id) DO NOTHING";
const ADDRESS_SET: &str =
    "UPDATE machine_provided SET provider_ip_address = $2 WHERE machine_id = $1";
const LEASES: &str = "SELECT w.process, w.session_id, s.session_component_name FROM work w \
     JOIN sessions s ON s.session_id = w.session_id WHERE w.machine_id = $1 ORDER BY w.process";

/// Creates a machine with its `machine_provided` tag. A machine with the same
/// (provider, provider_id) is a unique violation: the caller's transaction
/// fails and nothing is written.
pub async fn create_provided(tx: &mut Tx<'_>, m: &NewProvidedMachine) -> Result<Uuid, BmdbError> {
    let id = Uuid::new_v4();
    tx.execute(MACHINE_INSERT, &[&id]).await?;
    tx.execute(
        PROVIDED_INSERT,
        &[
            &id,
            &m.provider,
            &m.provider_id,
            &m.reservation_id,
            &m.ip_address,
            &m.location,
            &m.status,
        ],
    )
    .await?;
    Ok(id)
}

/// Sets the AgentStarted tag (now, with the agent's public key).
pub async fn set_agent_started(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    public_key: &[u8],
) -> Result<(), BmdbError> {
    tx.execute(AGENT_STARTED_SET, &[&machine_id, &public_key])
        .await?;
    Ok(())
}

/// Every machine of `provider`, by provider ID.
pub async fn provided_by(
    tx: &mut Tx<'_>,
    provider: Provider,
) -> Result<Vec<ProvidedMachine>, BmdbError> {
    let rows = tx.query(PROVIDED_BY, &[&provider]).await?;
    Ok(rows.iter().map(ProvidedMachine::from_row).collect())
}

pub async fn provided(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
) -> Result<Option<ProvidedMachine>, BmdbError> {
    Ok(tx
        .query_opt(PROVIDED_ONE, &[&machine_id])
        .await?
        .as_ref()
        .map(ProvidedMachine::from_row))
}

#[derive(Debug, Clone, PartialEq)]
pub struct HistoryEntry {
    pub process: Process,
    pub event: HistoryEvent,
    pub timestamp: SystemTime,
    pub failed_cause: Option<String>,
}

/// A machine's work history, oldest first.
pub async fn history(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Vec<HistoryEntry>, BmdbError> {
    let rows = tx.query(HISTORY, &[&machine_id]).await?;
    Ok(rows
        .iter()
        .map(|r| HistoryEntry {
            process: r.get(0),
            event: r.get(1),
            timestamp: r.get(2),
            failed_cause: r.get(3),
        })
        .collect())
}

#[derive(Debug, Clone, PartialEq)]
pub struct BackoffState {
    pub until: SystemTime,
    pub cause: String,
    pub last_interval_seconds: Option<i64>,
}

pub async fn backoff(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    process: Process,
) -> Result<Option<BackoffState>, BmdbError> {
    Ok(tx
        .query_opt(BACKOFF, &[&machine_id, &process])
        .await?
        .map(|r| BackoffState {
            until: r.get(0),
            cause: r.get(1),
            last_interval_seconds: r.get(2),
        }))
}

#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    pub process: Process,
    pub session_id: Uuid,
    pub component: String,
}

/// The work leases held on a machine right now.
pub async fn leases(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Vec<Lease>, BmdbError> {
    let rows = tx.query(LEASES, &[&machine_id]).await?;
    Ok(rows
        .iter()
        .map(|r| Lease {
            process: r.get(0),
            session_id: r.get(1),
            component: r.get(2),
        })
        .collect())
}

/// The SSH host key recorded for a machine (OpenSSH public key line).
pub async fn host_key(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Option<String>, BmdbError> {
    Ok(tx
        .query_opt(HOST_KEY, &[&machine_id])
        .await?
        .map(|r| r.get(0)))
}

/// Records a machine's SSH host key unless one is recorded already.
pub async fn record_host_key(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    key: &str,
) -> Result<(), BmdbError> {
    tx.execute(HOST_KEY_RECORD, &[&machine_id, &key]).await?;
    Ok(())
}

/// Sets the address the provider gives a machine.
pub async fn set_address(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    address: &str,
) -> Result<(), BmdbError> {
    tx.execute(ADDRESS_SET, &[&machine_id, &address]).await?;
    Ok(())
}
