//! Machines and their records: creating provided machines, the agent's
//! and the provider's tags, host keys, addresses and the BMC's facts. By
//! job, beside this file:
//!
//! - `fleet.rs`: the fleet listing (one summary row a machine, filtered,
//!   paged and counted);
//! - `filter.rs`: the listing's filters, and the SQL each asks;
//! - `detail.rs`: one machine read whole (its history, backoffs, leases,
//!   tenancy).

use std::time::SystemTime;

use uuid::Uuid;

pub use super::hardware::{BmcFacts, bmc_facts};
pub use super::lifecycle::MachineState;
use super::selectors::{ProvidedMachine, provided_columns};
use super::{BmdbError, HistoryEvent, Process, Provider, ProviderStatus, Tx};

// The fleet's columns (`fleet_one!`) serve one machine's read too.
#[macro_use]
mod fleet;
mod detail;
mod filter;
mod timeline;

pub use detail::*;
pub use filter::{BmcKind, FleetFilter, Heartbeat};
use filter::{SqlValue, interned, params};
pub use fleet::*;
pub use timeline::{Happening, Moment, timeline};

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
const AGENT_STARTED_SET: &str = "INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key, agent_endpoint) \
     VALUES ($1, now(), $2, $3) ON CONFLICT (machine_id) DO UPDATE \
     SET agent_started_at = EXCLUDED.agent_started_at, agent_public_key = EXCLUDED.agent_public_key, \
         agent_endpoint = EXCLUDED.agent_endpoint";
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
const HOST_KEY: &str = "SELECT host_key FROM machine_ssh_host_key WHERE machine_id = $1";
const HOST_KEY_RECORD: &str = "INSERT INTO machine_ssh_host_key (machine_id, host_key, first_seen_at) \
     VALUES ($1, $2, now()) ON CONFLICT (machine_id) DO NOTHING";
const ADDRESS_SET: &str =
    "UPDATE machine_provided SET provider_ip_address = $2 WHERE machine_id = $1";

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

/// Sets the AgentStarted tag (now, with the agent's public key and the
/// callback endpoint it was given, which decides whether its silence can be
/// judged: `bmdb::callback`).
pub async fn set_agent_started(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    public_key: &[u8],
    endpoint: Option<&str>,
) -> Result<(), BmdbError> {
    tx.execute(AGENT_STARTED_SET, &[&machine_id, &public_key, &endpoint])
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

/// Many machines' provider records in one statement.
const PROVIDED_UPDATE: &str = "UPDATE machine_provided p SET provider_ip_address = u.ip, \
     provider_location = u.loc, provider_reservation_id = u.res, \
     provider_status = u.st::provider_status \
     FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(id, ip, loc, res, st) \
     WHERE p.machine_id = u.id";

/// Locks the summaries of `$1`'s machines, in the machines' order.
const SUMMARY_LOCK: &str = "SELECT 1 FROM machine_summary WHERE machine_id = ANY($1) \
     ORDER BY machine_id FOR NO KEY UPDATE";

/// Overwrites what the provider says about each of `changed`, in one
/// statement however many there are.
pub async fn update_provided(
    tx: &mut Tx<'_>,
    changed: &[ProvidedMachine],
) -> Result<(), BmdbError> {
    let ids: Vec<Uuid> = changed.iter().map(|m| m.machine_id).collect();
    let ips: Vec<Option<&str>> = changed.iter().map(|m| m.ip_address.as_deref()).collect();
    let locations: Vec<Option<&str>> = changed.iter().map(|m| m.location.as_deref()).collect();
    let reservations: Vec<Option<&str>> = changed
        .iter()
        .map(|m| m.reservation_id.as_deref())
        .collect();
    let statuses: Vec<Option<String>> = changed
        .iter()
        .map(|m| m.status.map(|s| s.to_string()))
        .collect();
    // The update moves each machine's summary (a trigger) in whatever order
    // its join takes: their rows are locked first in the machines' order,
    // as the heartbeat writer's batches lock them, so that the two never
    // wait on each other in a circle (seen under a rack's enroll storm).
    tx.execute(SUMMARY_LOCK, &[&ids]).await?;
    tx.execute(
        PROVIDED_UPDATE,
        &[&ids, &ips, &locations, &reservations, &statuses],
    )
    .await?;
    Ok(())
}

/// Upserts what BMCs said, one row per machine, touching a row only if
/// something differs. A failed read (`read_error`) keeps the facts read
/// before and records the error. Returns the machines whose row changed.
const BMC_FACTS_WRITE: &str = "INSERT INTO machine_bmc_facts AS f (machine_id, bmc_url, system_path, \
     power_state, manufacturer, model, serial_number, bios_version, processor_count, processor_model, \
     memory_gib, health, read_error, secure_boot_enable, secure_boot_current_boot, secure_boot_mode) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], \
         $7::text[], $8::text[], $9::int4[], $10::text[], $11::float8[], $12::text[], $13::text[], \
         $14::bool[], $15::text[], $16::text[]) \
     ON CONFLICT (machine_id) DO UPDATE SET bmc_url = EXCLUDED.bmc_url, \
     system_path = CASE WHEN EXCLUDED.read_error IS NULL THEN EXCLUDED.system_path ELSE f.system_path END, \
     power_state = CASE WHEN EXCLUDED.read_error IS NULL THEN EXCLUDED.power_state ELSE f.power_state END, \
     manufacturer = CASE WHEN EXCLUDED.read_error IS NULL THEN EXCLUDED.manufacturer ELSE f.manufacturer END, \
     model = CASE WHEN EXCLUDED.read_error IS NULL THEN EXCLUDED.model ELSE f.model END, \
     serial_number = CASE WHEN EXCLUDED.read_error IS NULL THEN EXCLUDED.serial_number ELSE f.serial_number END, \
     bios_version = CASE WHEN EXCLUDED.read_error IS NULL THEN EXCLUDED.bios_version ELSE f.bios_version END, \
     processor_count = CASE WHEN EXCLUDED.read_error IS NULL THEN EXCLUDED.processor_count ELSE f.processor_count END, \
     processor_model = CASE WHEN EXCLUDED.read_error IS NULL THEN EXCLUDED.processor_model ELSE f.processor_model END, \
     memory_gib = CASE WHEN EXCLUDED.read_error IS NULL THEN EXCLUDED.memory_gib ELSE f.memory_gib END, \
     health = CASE WHEN EXCLUDED.read_error IS NULL THEN EXCLUDED.health ELSE f.health END, \
     secure_boot_enable = CASE WHEN EXCLUDED.read_error IS NULL THEN EXCLUDED.secure_boot_enable ELSE f.secure_boot_enable END, \
     secure_boot_current_boot = CASE WHEN EXCLUDED.read_error IS NULL THEN EXCLUDED.secure_boot_current_boot ELSE f.secure_boot_current_boot END, \
     secure_boot_mode = CASE WHEN EXCLUDED.read_error IS NULL THEN EXCLUDED.secure_boot_mode ELSE f.secure_boot_mode END, \
     read_error = EXCLUDED.read_error, changed_at = now() \
     WHERE CASE WHEN EXCLUDED.read_error IS NULL \
       THEN (f.bmc_url, f.system_path, f.power_state, f.manufacturer, f.model, f.serial_number, f.bios_version, f.processor_count, f.processor_model, f.memory_gib, f.health, f.secure_boot_enable, f.secure_boot_current_boot, f.secure_boot_mode, f.read_error) \
         IS DISTINCT FROM (EXCLUDED.bmc_url, EXCLUDED.system_path, EXCLUDED.power_state, EXCLUDED.manufacturer, EXCLUDED.model, EXCLUDED.serial_number, EXCLUDED.bios_version, EXCLUDED.processor_count, EXCLUDED.processor_model, EXCLUDED.memory_gib, EXCLUDED.health, EXCLUDED.secure_boot_enable, EXCLUDED.secure_boot_current_boot, EXCLUDED.secure_boot_mode, NULL) \
       ELSE (f.bmc_url, f.read_error) IS DISTINCT FROM (EXCLUDED.bmc_url, EXCLUDED.read_error) END \
     RETURNING machine_id";

/// Writes what BMCs said about machines, in one statement, only where it
/// changed: the machines whose row was written.
pub async fn write_bmc_facts(
    tx: &mut Tx<'_>,
    rows: &[(Uuid, BmcFacts)],
) -> Result<Vec<Uuid>, BmdbError> {
    let mut rows: Vec<&(Uuid, BmcFacts)> = rows.iter().collect();
    // One lock order for every writer.
    rows.sort_by_key(|(id, _)| *id);
    let col = |f: fn(&BmcFacts) -> Option<String>| -> Vec<Option<String>> {
        rows.iter().map(|(_, x)| f(x)).collect()
    };
    let ids: Vec<Uuid> = rows.iter().map(|(id, _)| *id).collect();
    let urls: Vec<String> = rows.iter().map(|(_, f)| f.bmc_url.clone()).collect();
    let counts: Vec<Option<i32>> = rows.iter().map(|(_, f)| f.system.processor_count).collect();
    let memory: Vec<Option<f64>> = rows.iter().map(|(_, f)| f.system.memory_gib).collect();
    let secure_enable: Vec<Option<bool>> = rows
        .iter()
        .map(|(_, f)| f.system.secure_boot.as_ref()?.enable)
        .collect();
    let written = tx
        .query(
            BMC_FACTS_WRITE,
            &[
                &ids,
                &urls,
                &col(|f| f.system_path.clone()),
                &col(|f| f.system.power_state.clone()),
                &col(|f| f.system.manufacturer.clone()),
                &col(|f| f.system.model.clone()),
                &col(|f| f.system.serial_number.clone()),
                &col(|f| f.system.bios_version.clone()),
                &counts,
                &col(|f| f.system.processor_model.clone()),
                &memory,
                &col(|f| f.system.health.clone()),
                &col(|f| f.read_error.clone()),
                &secure_enable,
                &col(|f| f.system.secure_boot.as_ref()?.current_boot.clone()),
                &col(|f| f.system.secure_boot.as_ref()?.mode.clone()),
            ],
        )
        .await?;
    Ok(written.iter().map(|r| r.get(0)).collect())
}
