//! One machine read whole: its history, backoffs and leases, its summary
//! and records, and its tenancy (project, device).

use super::*;

const HISTORY: &str = "SELECT process, event, \"timestamp\", failed_cause, detail FROM work_history \
     WHERE machine_id = $1 ORDER BY work_history_id";
const BACKOFF: &str = "SELECT until, cause, last_interval_seconds FROM work_backoff \
     WHERE machine_id = $1 AND process = $2";
const LEASES: &str = "SELECT w.process, w.session_id, s.session_component_name FROM work w \
     JOIN sessions s ON s.session_id = w.session_id WHERE w.machine_id = $1 ORDER BY w.process";

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
    pub hold: Option<crate::bmdb::actions::Hold>,
    /// A reboot an operator asked for, not yet done: (by, when).
    pub reboot_request: Option<(String, SystemTime)>,
    /// What operators did to it, oldest first.
    pub actions: Vec<crate::bmdb::actions::Audit>,
    /// The installation shepherd asked of it last, with its progress.
    pub installation: Option<crate::bmdb::installations::Installation>,
    /// Booted through its BMC (`boot = "virtual-media"` or `"network"`).
    pub bmc_boot: bool,
    /// How: `virtual-media` or `network` (None: it is not).
    pub boot_via: Option<String>,
    /// The provisioning NICs the network boot service answers for it.
    pub boot_macs: Vec<crate::mac::MacAddr>,
    /// A boot into the live agent asked for and not yet done.
    pub boot_request: Option<crate::bmdb::bmc_boot::BootRequest>,
    /// Its BMC's facts against its agent's report.
    pub hardware_check: Option<crate::bmdb::hardware::HardwareCheck>,
    /// It enlisted itself by booting the provisioning network.
    pub discovery: Option<crate::bmdb::discovery::Discovery>,
    /// The project it is assigned to, and the tenant's device on it.
    pub tenancy: Option<Tenancy>,
    /// Its firmware as its BMC lists it.
    pub firmware: crate::bmdb::firmware::Firmware,
    /// What a baseline is chosen by and compared with (None: its BMC is
    /// not read).
    pub below: Option<crate::bmdb::firmware::Below>,
    /// Its last servicing (to its baseline), if it had one.
    pub service: Option<crate::bmdb::servicing::Service>,
    /// Its serial console during the last boots shepherd made, newest
    /// first (three at most).
    pub consoles: Vec<crate::bmdb::console::ConsoleCapture>,
    /// Who was on its console over shepherd's SSH, newest first (ten at
    /// most).
    pub console_sessions: Vec<crate::bmdb::console_sessions::ConsoleSession>,
    /// The switch ports it is cabled to, and what is wanted and seen on
    /// each.
    pub ports: Vec<crate::bmdb::switches::PortView>,
    /// What happened to it, newest first (200 at most).
    pub timeline: Vec<super::Moment>,
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
    let device = match crate::bmdb::devices::on_machine(tx, machine_id).await? {
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
const SUMMARY_ONE: &str = fleet_one!();

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
    let installation = crate::bmdb::installations::installation(tx, machine_id).await?;
    // Read in a snapshot ([`crate::bmdb::Bmdb::snapshot`]), the state
    // agrees with the tags and the installation read above.
    let summary = tx.query_one(SUMMARY_ONE, &[&machine_id]).await?;
    let summary = MachineSummary::from_row(&summary);
    let bmc = bmc_facts(tx, machine_id).await?;
    let hardware_report: Option<Vec<u8>> = r.get(4);
    // Judged from what this detail read already.
    let hardware_check = match (&bmc, &hardware_report) {
        (Some(f), Some(raw)) => crate::bmdb::hardware::judge(tx, machine_id, f, raw).await?,
        _ => None,
    };
    let boot_via = crate::bmdb::netboot::via(tx, machine_id).await?;
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
        hold: crate::bmdb::actions::hold(tx, machine_id).await?,
        reboot_request: crate::bmdb::actions::reboot_request(tx, machine_id).await?,
        actions: crate::bmdb::actions::audit(tx, machine_id).await?,
        installation,
        bmc_boot: boot_via.is_some(),
        boot_via,
        boot_macs: crate::bmdb::netboot::macs_of(tx, machine_id).await?,
        boot_request: crate::bmdb::bmc_boot::requested(tx, machine_id).await?,
        hardware_check,
        discovery: crate::bmdb::discovery::of(tx, machine_id).await?,
        tenancy: tenancy(tx, machine_id).await?,
        firmware: crate::bmdb::firmware::of_machine(tx, machine_id).await?,
        below: crate::bmdb::firmware::below(tx, Some(&[machine_id]), true)
            .await?
            .pop(),
        service: crate::bmdb::servicing::of_machine(tx, machine_id).await?,
        consoles: crate::bmdb::console::latest(tx, machine_id, 3).await?,
        console_sessions: crate::bmdb::console_sessions::recent(tx, machine_id, 10).await?,
        ports: crate::bmdb::switches::machine_ports(tx, machine_id).await?,
        timeline: super::timeline(tx, machine_id, 200).await?,
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
