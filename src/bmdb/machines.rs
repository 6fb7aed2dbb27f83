//! Machines and their tags: creating provided machines, setting tags,
//! reading leases, backoffs and history.
//!
//! Long, not yet by job: machines, tags, leases, backoffs, history and the
//! BMC facts' write share the machine's rows; the split by job (tags and
//! history apart) is issue 49's.

use std::time::SystemTime;

use uuid::Uuid;

pub use super::hardware::{BmcFacts, bmc_facts};
pub use super::lifecycle::MachineState;
use super::lifecycle::state_column;
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
const HISTORY: &str = "SELECT process, event, \"timestamp\", failed_cause, detail FROM work_history \
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

#[derive(Debug, Clone, PartialEq)]
pub struct HistoryEntry {
    pub process: Process,
    pub event: HistoryEvent,
    pub timestamp: SystemTime,
    pub failed_cause: Option<String>,
    /// What a finished piece of work did (a recovery's step).
    pub detail: Option<String>,
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
            detail: r.get(4),
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

/// One row of the fleet listing.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineSummary {
    pub machine_id: Uuid,
    pub provider: Option<Provider>,
    pub provider_id: Option<String>,
    pub address: Option<String>,
    pub provider_status: Option<ProviderStatus>,
    pub state: MachineState,
    pub agent_heartbeat: Option<SystemTime>,
}

impl MachineSummary {
    fn from_row(r: &tokio_postgres::Row) -> Self {
        MachineSummary {
            machine_id: r.get(0),
            provider: r.get(1),
            provider_id: r.get(2),
            address: r.get(3),
            provider_status: r.get(4),
            state: MachineState::parse(r.get(5)).unwrap_or(MachineState::Unprovided),
            agent_heartbeat: r.get(6),
        }
    }
}

macro_rules! fleet_query {
    ($filter:literal) => {
        concat!(
            "SELECT *, count(*) OVER () FROM (SELECT m.machine_id, p.provider, p.provider_id, \
                    p.provider_ip_address, p.provider_status, ",
            state_column!(),
            ", s.agent_heartbeat_at, s.agent_started_at \
             FROM machines m \
             JOIN machine_summary s ON s.machine_id = m.machine_id \
             LEFT JOIN machine_provided p ON p.machine_id = m.machine_id) f ",
            $filter,
            " ORDER BY provider_id NULLS LAST, machine_id LIMIT $1 OFFSET $2"
        )
    };
}
const FLEET_FILTERED: &str = fleet_query!(
    "WHERE ($3::text IS NULL OR state = $3) \
       AND ($4::provider_status IS NULL OR provider_status = $4) \
       AND ($5::text IS NULL OR CASE $5 \
             WHEN 'heartbeating' THEN agent_heartbeat_at > now() - make_interval(secs => $6) \
             WHEN 'silent' THEN agent_started_at IS NOT NULL AND (agent_heartbeat_at IS NULL \
                  OR agent_heartbeat_at <= now() - make_interval(secs => $6)) \
             ELSE agent_started_at IS NULL END) \
       AND ($7::text IS NULL OR machine_id::text LIKE $7 || '%' \
             OR provider_id ILIKE '%' || $7 || '%' ESCAPE '\\' \
             OR provider_ip_address LIKE $7 || '%' ESCAPE '\\')"
);
const FLEET_COUNTS: &str = concat!(
    "SELECT state, count(*) FROM (SELECT ",
    state_column!(),
    " FROM machine_summary s LEFT JOIN machine_provided p ON p.machine_id = s.machine_id) f GROUP BY state"
);

/// Whether a machine's agent heartbeats, as the fleet page filters it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heartbeat {
    /// A heartbeat within the staleness threshold.
    Heartbeating,
    /// An agent started, with no heartbeat within it.
    Silent,
    /// No agent started.
    NoAgent,
}

impl Heartbeat {
    pub const ALL: [Heartbeat; 3] = [
        Heartbeat::Heartbeating,
        Heartbeat::Silent,
        Heartbeat::NoAgent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Heartbeat::Heartbeating => "heartbeating",
            Heartbeat::Silent => "silent",
            Heartbeat::NoAgent => "no-agent",
        }
    }

    pub fn parse(s: &str) -> Option<Heartbeat> {
        Self::ALL.into_iter().find(|h| h.as_str() == s)
    }
}

/// Which machines a fleet listing shows. Default: all.
#[derive(Debug, Clone, Default)]
pub struct FleetFilter {
    pub state: Option<MachineState>,
    pub provider_status: Option<ProviderStatus>,
    pub heartbeat: Option<Heartbeat>,
    /// A heartbeat older than this is silent.
    pub stale_after: std::time::Duration,
    /// A machine ID's prefix, part of a provider ID (any case), or an
    /// address's prefix.
    pub search: Option<String>,
}

/// A page of the fleet, in provider ID order, with the number of machines
/// the filter matches.
pub async fn fleet_page(
    tx: &mut Tx<'_>,
    filter: &FleetFilter,
    limit: i64,
    offset: i64,
) -> Result<(Vec<MachineSummary>, i64), BmdbError> {
    let search = filter
        .search
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_")
                .to_lowercase()
        });
    let rows = tx
        .query(
            FLEET_FILTERED,
            &[
                &limit,
                &offset,
                &filter.state.map(|s| s.as_str()),
                &filter.provider_status,
                &filter.heartbeat.map(|h| h.as_str()),
                &filter.stale_after.as_secs_f64(),
                &search,
            ],
        )
        .await?;
    let total = rows.first().map(|r| r.get(8)).unwrap_or(0);
    Ok((rows.iter().map(MachineSummary::from_row).collect(), total))
}

/// Machines per state.
const AGENT_COUNTS: &str = "SELECT \
       count(*) FILTER (WHERE h.agent_heartbeat_at > now() - make_interval(secs => $1)), \
       count(*) FILTER (WHERE h.agent_heartbeat_at IS NULL \
                          OR h.agent_heartbeat_at <= now() - make_interval(secs => $1)) \
     FROM machine_agent_started a LEFT JOIN machine_agent_heartbeat h ON h.machine_id = a.machine_id";

/// Machines with a started agent: (heartbeating within `fresh`, silent).
pub async fn agent_counts(
    tx: &mut Tx<'_>,
    fresh: std::time::Duration,
) -> Result<(i64, i64), BmdbError> {
    let r = tx.query_one(AGENT_COUNTS, &[&fresh.as_secs_f64()]).await?;
    Ok((r.get(0), r.get(1)))
}

pub async fn fleet_counts(tx: &mut Tx<'_>) -> Result<Vec<(MachineState, i64)>, BmdbError> {
    let rows = tx.query(FLEET_COUNTS, &[]).await?;
    let mut out: Vec<(MachineState, i64)> = rows
        .iter()
        .filter_map(|r| Some((MachineState::parse(r.get(0))?, r.get(1))))
        .collect();
    out.sort_by_key(|(s, _)| MachineState::ALL.iter().position(|x| x == s));
    Ok(out)
}

/// Everything the BMDB says about one machine.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineDetail {
    pub summary: MachineSummary,
    pub created_at: SystemTime,
    pub provided: Option<ProvidedMachine>,
    pub agent_started: Option<(SystemTime, Vec<u8>)>,
    pub agent_heartbeat: Option<SystemTime>,
    /// `machine_hardware_report.hardware_report_raw`, as the agent sent it.
    pub hardware_report: Option<Vec<u8>>,
    pub installation_request: Option<i32>,
    pub installation_report: Option<(i32, crate::bmdb::InstallationResult)>,
    pub ssh_host_key: Option<String>,
    /// What its BMC says (inventory hosts with one).
    pub bmc: Option<BmcFacts>,
    pub leases: Vec<Lease>,
    pub backoffs: Vec<(Process, BackoffState)>,
    pub history: Vec<HistoryEntry>,
    /// An operator's hold, if held.
    pub hold: Option<super::actions::Hold>,
    /// A reboot an operator asked for, not yet done: (by, when).
    pub reboot_request: Option<(String, SystemTime)>,
    /// What operators did to it, oldest first.
    pub actions: Vec<super::actions::Audit>,
    /// The installation shepherd asked of it last, with its progress.
    pub installation: Option<super::installations::Installation>,
    /// Booted through its BMC (`boot = "virtual-media"` or `"network"`).
    pub bmc_boot: bool,
    /// How: `virtual-media` or `network` (None: it is not).
    pub boot_via: Option<String>,
    /// The provisioning NICs the network boot service answers for it.
    pub boot_macs: Vec<crate::mac::MacAddr>,
    /// A boot into the live agent asked for and not yet done.
    pub boot_request: Option<super::bmc_boot::BootRequest>,
    /// Its BMC's facts against its agent's report.
    pub hardware_check: Option<super::hardware::HardwareCheck>,
    /// It enlisted itself by booting the provisioning network.
    pub discovery: Option<super::discovery::Discovery>,
    /// The project it is assigned to, and the tenant's device on it.
    pub tenancy: Option<Tenancy>,
}

/// A machine's tenant: the project it is assigned to (None: the shared
/// pool), and the device on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenancy {
    /// (ID, name) of the project it is assigned to.
    pub assigned_to: Option<(Uuid, String)>,
    /// The device on it: ID, project (ID, name), host name, Metal state.
    pub device: Option<TenantDevice>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantDevice {
    pub id: Uuid,
    pub project: (Uuid, String),
    pub hostname: String,
    pub state: &'static str,
}

/// A machine's line in the fleet's tenant column: its project (assigned,
/// or its device's) and its device (ID, host name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantLine {
    pub project: Option<String>,
    pub device: Option<(Uuid, String)>,
}

/// Tenant lines by machine (machines with neither are absent).
pub type Tenants = std::collections::HashMap<Uuid, TenantLine>;

/// The fleet page's tenancy column, for a page of machines.
pub async fn tenants_of(tx: &mut Tx<'_>, ids: &[Uuid]) -> Result<Tenants, BmdbError> {
    let rows = tx
        .query(
            "SELECT m.machine_id, COALESCE(dp.name, ap.name), d.device_id, d.hostname \
             FROM unnest($1::uuid[]) AS m (machine_id) \
             LEFT JOIN machine_project mp ON mp.machine_id = m.machine_id \
             LEFT JOIN project ap ON ap.project_id = mp.project_id \
             LEFT JOIN device d ON d.machine_id = m.machine_id AND d.deleted_at IS NULL \
             LEFT JOIN project dp ON dp.project_id = d.project_id \
             WHERE mp.machine_id IS NOT NULL OR d.device_id IS NOT NULL",
            &[&ids],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let device: Option<Uuid> = r.get(2);
            let hostname: Option<String> = r.get(3);
            (
                r.get(0),
                TenantLine {
                    project: r.get(1),
                    device: device.zip(hostname),
                },
            )
        })
        .collect())
}

/// Its tenancy, if it has any.
pub async fn tenancy(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Option<Tenancy>, BmdbError> {
    let assigned_to = tx
        .query_opt(
            "SELECT p.project_id, p.name FROM machine_project mp JOIN project p USING (project_id) \
             WHERE mp.machine_id = $1",
            &[&machine_id],
        )
        .await?
        .map(|r| (r.get(0), r.get(1)));
    let device = match super::devices::on_machine(tx, machine_id).await? {
        Some(d) => {
            let name: String = tx
                .query_one(
                    "SELECT name FROM project WHERE project_id = $1",
                    &[&d.project_id],
                )
                .await?
                .get(0);
            Some(TenantDevice {
                id: d.id,
                project: (d.project_id, name),
                hostname: d.hostname.clone(),
                state: d.state(),
            })
        }
        None => None,
    };
    Ok(
        (assigned_to.is_some() || device.is_some()).then_some(Tenancy {
            assigned_to,
            device,
        }),
    )
}

const DETAIL: &str = "SELECT m.machine_created_at, \
       a.agent_started_at, a.agent_public_key, h.agent_heartbeat_at, \
       hr.hardware_report_raw, rq.generation, rp.generation, rp.os_installation_result, k.host_key \
     FROM machines m \
     LEFT JOIN machine_agent_started a ON a.machine_id = m.machine_id \
     LEFT JOIN machine_agent_heartbeat h ON h.machine_id = m.machine_id \
     LEFT JOIN machine_hardware_report hr ON hr.machine_id = m.machine_id \
     LEFT JOIN machine_os_installation_request rq ON rq.machine_id = m.machine_id \
     LEFT JOIN machine_os_installation_report rp ON rp.machine_id = m.machine_id \
     LEFT JOIN machine_ssh_host_key k ON k.machine_id = m.machine_id \
     WHERE m.machine_id = $1";
const BACKOFFS: &str = "SELECT process, until, cause, last_interval_seconds FROM work_backoff \
     WHERE machine_id = $1 ORDER BY process";
const SUMMARY_ONE: &str = fleet_query!("WHERE machine_id = $3");

/// A machine's tags, leases, backoffs and history; None if unknown. Read
/// it in a [`crate::bmdb::Bmdb::snapshot`], so that its parts agree.
pub async fn detail(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Option<MachineDetail>, BmdbError> {
    let Some(r) = tx.query_opt(DETAIL, &[&machine_id]).await? else {
        return Ok(None);
    };
    let started: Option<SystemTime> = r.get(1);
    let key: Option<Vec<u8>> = r.get(2);
    let report_gen: Option<i32> = r.get(6);
    let report_result: Option<crate::bmdb::InstallationResult> = r.get(7);
    let backoffs = tx
        .query(BACKOFFS, &[&machine_id])
        .await?
        .iter()
        .map(|b| {
            (
                b.get(0),
                BackoffState {
                    until: b.get(1),
                    cause: b.get(2),
                    last_interval_seconds: b.get(3),
                },
            )
        })
        .collect();
    let installation = super::installations::installation(tx, machine_id).await?;
    // Read in a snapshot ([`crate::bmdb::Bmdb::snapshot`]), the state
    // agrees with the tags and the installation read above.
    let summary = tx
        .query_one(SUMMARY_ONE, &[&1i64, &0i64, &machine_id])
        .await?;
    let summary = MachineSummary::from_row(&summary);
    let bmc = bmc_facts(tx, machine_id).await?;
    let hardware_report: Option<Vec<u8>> = r.get(4);
    // Judged from what this detail read already.
    let hardware_check = match (&bmc, &hardware_report) {
        (Some(f), Some(raw)) => super::hardware::judge(tx, machine_id, f, raw).await?,
        _ => None,
    };
    let boot_via = super::netboot::via(tx, machine_id).await?;
    Ok(Some(MachineDetail {
        summary,
        created_at: r.get(0),
        provided: provided(tx, machine_id).await?,
        agent_started: started.zip(key),
        agent_heartbeat: r.get(3),
        hardware_report,
        installation_request: r.get(5),
        installation_report: report_gen.zip(report_result),
        ssh_host_key: r.get(8),
        bmc,
        leases: leases(tx, machine_id).await?,
        backoffs,
        history: history(tx, machine_id).await?,
        hold: super::actions::hold(tx, machine_id).await?,
        reboot_request: super::actions::reboot_request(tx, machine_id).await?,
        actions: super::actions::audit(tx, machine_id).await?,
        installation,
        bmc_boot: boot_via.is_some(),
        boot_via,
        boot_macs: super::netboot::macs_of(tx, machine_id).await?,
        boot_request: super::bmc_boot::requested(tx, machine_id).await?,
        hardware_check,
        discovery: super::discovery::of(tx, machine_id).await?,
        tenancy: tenancy(tx, machine_id).await?,
    }))
}

impl MachineDetail {
    /// How it is reached and booted, for the pages and the command line:
    /// `network (PXE) from 52:54:00:12:34:56`, `virtual media`, `ssh`.
    pub fn boots(&self) -> String {
        match self.boot_via.as_deref() {
            None if self.discovery.is_some() => format!(
                "network: it enlisted itself from {} (discovery boots until accepted)",
                self.discovery
                    .as_ref()
                    .map(|d| d.mac.as_str())
                    .unwrap_or("")
            ),
            Some("network") => {
                let macs: Vec<String> = self.boot_macs.iter().map(|m| m.to_string()).collect();
                format!("network (PXE, then iPXE) from {}", macs.join(", "))
            }
            Some(_) => "virtual media (the BMC's virtual CD)".to_string(),
            None => "ssh (a takeover at its address)".to_string(),
        }
    }
}

/// Many machines' provider records in one statement.
const PROVIDED_UPDATE: &str = "UPDATE machine_provided p SET provider_ip_address = u.ip, \
     provider_location = u.loc, provider_reservation_id = u.res, \
     provider_status = u.st::provider_status \
     FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(id, ip, loc, res, st) \
     WHERE p.machine_id = u.id";

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
