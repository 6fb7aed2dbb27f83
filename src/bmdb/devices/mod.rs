//! Devices: a tenant's hold on one machine, from the create that claims
//! an available machine and asks its installation, to the erasure that
//! gives it back (`device`, V18). The Metal API's device state is derived
//! from the machine's own in one table ([`metal_state`]); the devices
//! round writes each change of it as an event and ends deleted devices
//! once their machine is erased.

use std::time::SystemTime;

use uuid::Uuid;

use super::installations::Kind;
use super::{BmdbError, Tx};

/// A device, with what its state is derived from.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    pub id: Uuid,
    pub project_id: Uuid,
    pub machine_id: Uuid,
    pub hostname: String,
    pub description: Option<String>,
    pub tags: Vec<String>,
    pub plan: String,
    pub metro: String,
    pub operating_system: String,
    pub userdata: String,
    pub customdata: serde_json::Value,
    pub ssh_keys: Vec<String>,
    pub created_at: SystemTime,
    pub created_by: String,
    pub updated_at: SystemTime,
    pub locked: bool,
    pub facts: StateFacts,
    /// The machine's address, when the provider gave one.
    pub address: Option<String>,
    /// Its machine is assigned to the project (a hardware reservation).
    pub reserved: bool,
    /// Who deleted it (`shepherd` before it is deleted) and how its
    /// machine's disks are erased, for the devices round.
    pub deleted_by: String,
    pub erase_mode: String,
    /// Its ports (the Metal API's `network_ports`): none when its machine
    /// has no NIC cabled to a switch shepherd changes.
    pub ports: Vec<ports::DevicePort>,
}

/// What a device's Metal state is derived from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateFacts {
    pub install_generation: Option<i32>,
    pub reinstalling: bool,
    pub powered_off: bool,
    pub deleting: bool,
    pub deleted: bool,
    pub erase_generation: Option<i32>,
    /// The machine's installation row: generation and kind.
    pub installation: Option<(i32, Kind)>,
    /// The machine's last report: generation and `Success` or `Error`.
    pub report: Option<(i32, String)>,
    /// The generation the agent reported progress of.
    pub progress: Option<i64>,
    /// A boot through the BMC waiting (`disk`: the restart from the disk
    /// after an installation).
    pub boot_request: Option<String>,
    /// A power action waiting: `reboot`, `off` or `on`.
    pub power_request: Option<String>,
    pub last_state: Option<String>,
    /// Its machine's network (`machine_summary.network`): None when no
    /// switch port of it is known; else active only once `tenant`.
    pub network: Option<String>,
}

/// The Metal API's device states, from shepherd's, in one table.
///
/// | shepherd | Metal |
/// |---|---|
/// | erased after a delete | `deleted` |
/// | deleted, erasure asked or waiting to be | `deprovisioning` (`failed` when the erasure failed) |
/// | installation not asked yet | `queued` |
/// | installation asked, no progress yet | `queued` (`reinstalling` for a reinstall) |
/// | installation in progress | `provisioning` (`reinstalling`) |
/// | installation failed | `failed` |
/// | installed, its BMC restarting it from its disk | `provisioning` (`reinstalling`) |
/// | installed, its ports not yet read back on its networks | `provisioning` (`reinstalling`) |
/// | installed, a power-off / power-on asked | `powering_off` / `powering_on` |
/// | installed, powered off by the tenant | `inactive` |
/// | installed and booted | `active` |
pub fn metal_state(f: &StateFacts) -> &'static str {
    if f.deleted {
        return "deleted";
    }
    let reported = |g: i32| {
        f.report
            .as_ref()
            .filter(|(rg, _)| *rg == g)
            .map(|(_, r)| r.as_str())
    };
    if f.deleting {
        return match f.erase_generation.and_then(reported) {
            Some("Error") => "failed",
            _ => "deprovisioning",
        };
    }
    let Some(asked) = f.install_generation else {
        return "queued";
    };
    // An operator's newer request on the machine is followed: an erasure
    // is the device going, an installation its new system.
    let generation = match &f.installation {
        Some((g, Kind::Erase)) if *g > asked => return "deprovisioning",
        Some((g, _)) if *g > asked => *g,
        _ => asked,
    };
    let busy = if f.reinstalling {
        "reinstalling"
    } else {
        "provisioning"
    };
    match reported(generation) {
        Some("Error") => "failed",
        Some(_) => {
            if f.boot_request.is_some() || f.network.as_deref().is_some_and(|n| n != "tenant") {
                busy
            } else {
                match f.power_request.as_deref() {
                    Some("off") => "powering_off",
                    Some("on") => "powering_on",
                    _ if f.powered_off => "inactive",
                    _ => "active",
                }
            }
        }
        None if f.progress == Some(i64::from(generation)) => busy,
        None if f.reinstalling => "reinstalling",
        None => "queued",
    }
}

macro_rules! device_select {
    () => {
        concat!(
            "SELECT d.device_id, d.project_id, d.machine_id, d.hostname, d.description, d.tags, \
                    d.plan, d.metro, d.operating_system, d.userdata, d.customdata, d.ssh_keys, \
                    d.created_at, d.created_by, d.updated_at, d.locked, \
                    d.install_generation, d.reinstalling, d.powered_off, d.deleting_at IS NOT NULL, \
                    d.deleted_at IS NOT NULL, d.erase_generation, \
                    i.generation, i.kind, rp.generation, rp.os_installation_result::text, \
                    pr.generation, s.boot_request, rr.power, d.last_state, \
                    p.provider_ip_address, \
                    EXISTS (SELECT 1 FROM machine_project mp WHERE mp.machine_id = d.machine_id \
                             AND mp.project_id = d.project_id), \
                    COALESCE(d.deleted_by, 'shepherd'), COALESCE(d.erase_mode, 'overwrite'), \
                    s.network \
             FROM device d \
             JOIN machine_summary s ON s.machine_id = d.machine_id \
             LEFT JOIN machine_provided p ON p.machine_id = d.machine_id \
             LEFT JOIN machine_installation i ON i.machine_id = d.machine_id \
             LEFT JOIN machine_os_installation_report rp ON rp.machine_id = d.machine_id \
             LEFT JOIN machine_installation_progress pr ON pr.machine_id = d.machine_id \
             LEFT JOIN machine_reboot_request rr ON rr.machine_id = d.machine_id "
        )
    };
}

fn device_from(r: &tokio_postgres::Row) -> Device {
    let installation: (Option<i32>, Option<Kind>) = (r.get(22), r.get(23));
    let report: (Option<i32>, Option<String>) = (r.get(24), r.get(25));
    Device {
        id: r.get(0),
        project_id: r.get(1),
        machine_id: r.get(2),
        hostname: r.get(3),
        description: r.get(4),
        tags: r.get(5),
        plan: r.get(6),
        metro: r.get(7),
        operating_system: r.get(8),
        userdata: r.get(9),
        customdata: r.get(10),
        ssh_keys: r.get(11),
        created_at: r.get(12),
        created_by: r.get(13),
        updated_at: r.get(14),
        locked: r.get(15),
        facts: StateFacts {
            install_generation: r.get(16),
            reinstalling: r.get(17),
            powered_off: r.get(18),
            deleting: r.get(19),
            deleted: r.get(20),
            erase_generation: r.get(21),
            installation: installation.0.zip(installation.1),
            report: report.0.zip(report.1),
            progress: r.get(26),
            boot_request: r.get(27),
            power_request: r.get(28),
            last_state: r.get(29),
            network: r.get(34),
        },
        address: r.get(30),
        reserved: r.get(31),
        deleted_by: r.get(32),
        erase_mode: r.get(33),
        ports: Vec::new(),
    }
}

/// Fills each device's ports.
async fn with_ports(tx: &mut Tx<'_>, mut devices: Vec<Device>) -> Result<Vec<Device>, BmdbError> {
    let ids: Vec<Uuid> = devices.iter().map(|d| d.id).collect();
    let mut ports = ports::of(tx, &ids).await?;
    for d in &mut devices {
        d.ports = ports.remove(&d.id).unwrap_or_default();
    }
    Ok(devices)
}

// The rooms, after the macro they use.
mod actions;
mod claim;
mod events;
pub mod port_actions;
pub mod ports;
pub use actions::{Acted, delete, power, reinstall};
pub use claim::{Candidate, Claimed, NewDevice, Placed, Placement, claim};
pub use events::{Advanced, Event, Events, advance, event, events};

impl Device {
    pub fn state(&self) -> &'static str {
        metal_state(&self.facts)
    }
}

/// A device that is not deleted (a deleted one is gone for its tenant).
pub async fn get(tx: &mut Tx<'_>, id: Uuid) -> Result<Option<Device>, BmdbError> {
    let sql = concat!(
        device_select!(),
        "WHERE d.device_id = $1 AND d.deleted_at IS NULL"
    );
    let found: Vec<Device> = tx
        .query_opt(sql, &[&id])
        .await?
        .as_ref()
        .map(device_from)
        .into_iter()
        .collect();
    Ok(with_ports(tx, found).await?.pop())
}

/// The device running on a machine, if any.
pub async fn on_machine(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Option<Device>, BmdbError> {
    let sql = concat!(
        device_select!(),
        "WHERE d.machine_id = $1 AND d.deleted_at IS NULL"
    );
    Ok(tx
        .query_opt(sql, &[&machine_id])
        .await?
        .as_ref()
        .map(device_from))
}

/// A page of a project's devices (every project's with None), oldest
/// first, and how many there are in all.
pub async fn list(
    tx: &mut Tx<'_>,
    project: Option<Uuid>,
    offset: i64,
    limit: i64,
) -> Result<(Vec<Device>, i64), BmdbError> {
    let sql = concat!(
        device_select!(),
        "WHERE d.deleted_at IS NULL AND ($1::uuid IS NULL OR d.project_id = $1) \
         ORDER BY d.created_at, d.device_id OFFSET $2 LIMIT $3"
    );
    let rows = tx.query(sql, &[&project, &offset, &limit]).await?;
    let total: i64 = tx
        .query_one(
            "SELECT count(*) FROM device WHERE deleted_at IS NULL \
             AND ($1::uuid IS NULL OR project_id = $1)",
            &[&project],
        )
        .await?
        .get(0);
    Ok((
        with_ports(tx, rows.iter().map(device_from).collect()).await?,
        total,
    ))
}

/// What an update changes (None: left as it is).
#[derive(Debug, Clone, Default)]
pub struct DeviceUpdate {
    pub hostname: Option<String>,
    pub description: Option<String>,
    pub tags: Option<Vec<String>>,
    pub locked: Option<bool>,
    pub userdata: Option<String>,
    pub customdata: Option<serde_json::Value>,
}

pub async fn update(
    tx: &mut Tx<'_>,
    id: Uuid,
    u: &DeviceUpdate,
) -> Result<Option<Device>, BmdbError> {
    let n = tx
        .execute(
            "UPDATE device SET hostname = COALESCE($2, hostname), \
                 description = COALESCE($3, description), tags = COALESCE($4, tags), \
                 locked = COALESCE($5, locked), userdata = COALESCE($6, userdata), \
                 customdata = COALESCE($7, customdata), updated_at = now() \
             WHERE device_id = $1 AND deleted_at IS NULL",
            &[
                &id,
                &u.hostname,
                &u.description,
                &u.tags,
                &u.locked,
                &u.userdata,
                &u.customdata,
            ],
        )
        .await?;
    if n == 0 {
        return Ok(None);
    }
    get(tx, id).await
}

/// A machine assigned to a project: a hardware reservation.
#[derive(Debug, Clone)]
pub struct Reservation {
    pub machine_id: Uuid,
    pub project_id: Uuid,
    pub assigned_at: SystemTime,
    pub location: Option<String>,
    pub hardware_report: Option<Vec<u8>>,
    /// `SecureBootEnable` as its BMC says (None: nothing to set).
    pub bmc_secure_boot: Option<bool>,
    /// The machine's state (`MachineState`).
    pub state: String,
    pub device: Option<Device>,
}

const RESERVATIONS: &str = concat!(
    "SELECT mp.machine_id, mp.project_id, mp.assigned_at, p.provider_location, \
            hr.hardware_report_raw, ",
    crate::bmdb::lifecycle::state_column!(),
    ", f.secure_boot_enable FROM machine_project mp \
     JOIN machine_summary s ON s.machine_id = mp.machine_id \
     LEFT JOIN machine_provided p ON p.machine_id = mp.machine_id \
     LEFT JOIN machine_hardware_report hr ON hr.machine_id = mp.machine_id \
     LEFT JOIN machine_bmc_facts f ON f.machine_id = mp.machine_id \
     WHERE ($1::uuid IS NULL OR mp.project_id = $1) AND ($2::uuid IS NULL OR mp.machine_id = $2) \
     ORDER BY mp.assigned_at, mp.machine_id"
);

/// A project's hardware reservations (or one, by its machine), each with
/// the device on it.
pub async fn reservations(
    tx: &mut Tx<'_>,
    project: Option<Uuid>,
    machine: Option<Uuid>,
) -> Result<Vec<Reservation>, BmdbError> {
    let rows = tx.query(RESERVATIONS, &[&project, &machine]).await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.get(0)).collect();
    // The devices on them, in one query.
    let sql = concat!(
        device_select!(),
        "WHERE d.machine_id = ANY($1) AND d.deleted_at IS NULL"
    );
    let mut devices: std::collections::HashMap<Uuid, Device> = tx
        .query(sql, &[&ids])
        .await?
        .iter()
        .map(|r| {
            let d = device_from(r);
            (d.machine_id, d)
        })
        .collect();
    Ok(rows
        .iter()
        .map(|r| {
            let machine_id: Uuid = r.get(0);
            Reservation {
                machine_id,
                project_id: r.get(1),
                assigned_at: r.get(2),
                location: r.get(3),
                hardware_report: r.get(4),
                state: r.get(5),
                bmc_secure_boot: r.get(6),
                device: devices.remove(&machine_id),
            }
        })
        .collect())
}

/// The Secure Boot the plan of the machine's open device asks for (None:
/// no device, or a plan that leaves it to the host's configuration).
pub async fn secure_boot_wanted(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
) -> Result<Option<bool>, BmdbError> {
    Ok(tx
        .query_opt(
            "SELECT secure_boot FROM device WHERE machine_id = $1 AND deleted_at IS NULL",
            &[&machine_id],
        )
        .await?
        .and_then(|r| r.get(0)))
}

/// The metros machines are in: their distinct inventory locations, and
/// `default` for the machines that have none (none: no machine, no metro).
pub async fn metros(tx: &mut Tx<'_>, default: &str) -> Result<Vec<String>, BmdbError> {
    Ok(tx
        .query(
            "SELECT DISTINCT COALESCE(NULLIF(btrim(provider_location), ''), $1) \
             FROM machine_provided ORDER BY 1",
            &[&default],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// What `/metrics` says of tenants: projects, tokens live and revoked, and
/// devices per Metal state as the devices round last saw them (a device
/// it has not seen yet is `queued`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantCounts {
    pub projects: i64,
    pub tokens_live: i64,
    pub tokens_revoked: i64,
    pub devices: Vec<(String, i64)>,
}

pub async fn tenant_counts(tx: &mut Tx<'_>) -> Result<TenantCounts, BmdbError> {
    let r = tx
        .query_one(
            "SELECT (SELECT count(*) FROM project), \
                    (SELECT count(*) FROM api_token WHERE revoked_at IS NULL), \
                    (SELECT count(*) FROM api_token WHERE revoked_at IS NOT NULL)",
            &[],
        )
        .await?;
    let devices = tx
        .query(
            "SELECT COALESCE(last_state, 'queued'), count(*) FROM device \
             WHERE deleted_at IS NULL GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    Ok(TenantCounts {
        projects: r.get(0),
        tokens_live: r.get(1),
        tokens_revoked: r.get(2),
        devices,
    })
}

/// Every Metal state a device may be in, for series that start at 0.
pub const METAL_STATES: [&str; 10] = [
    "queued",
    "provisioning",
    "deprovisioning",
    "reinstalling",
    "active",
    "inactive",
    "failed",
    "powering_on",
    "powering_off",
    "deleted",
];
