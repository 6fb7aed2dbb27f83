//! Devices: a tenant's hold on one machine, from the create that claims
//! an available machine and asks its installation, to the erasure that
//! gives it back (`device`, V18). The Metal API's device state is derived
//! from the machine's own in one table ([`metal_state`]); the devices
//! round writes each change of it as an event and ends deleted devices
//! once their machine is erased.

use std::time::SystemTime;

use shepherd_proto::api::{DiskErasure, ImageInstallation};
use uuid::Uuid;

use super::installations::{self, Asked, Asker, Work};
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
    pub installation: Option<(i32, String)>,
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
        Some((g, kind)) if *g > asked && kind == "erase" => return "deprovisioning",
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
            if f.boot_request.is_some() {
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
                    COALESCE(d.deleted_by, 'shepherd'), COALESCE(d.erase_mode, 'overwrite') \
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
    let installation: (Option<i32>, Option<String>) = (r.get(22), r.get(23));
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
        },
        address: r.get(30),
        reserved: r.get(31),
        deleted_by: r.get(32),
        erase_mode: r.get(33),
    }
}

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
    Ok(tx.query_opt(sql, &[&id]).await?.as_ref().map(device_from))
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
    Ok((rows.iter().map(device_from).collect(), total))
}

/// What a new device asks for.
#[derive(Debug, Clone)]
pub struct NewDevice {
    pub id: Uuid,
    pub project_id: Uuid,
    pub hostname: String,
    pub description: Option<String>,
    pub tags: Vec<String>,
    /// For the answer when no machine is left: what was asked.
    pub plan: String,
    pub metro: String,
    pub operating_system: String,
    pub userdata: String,
    pub customdata: serde_json::Value,
    pub ssh_keys: Vec<String>,
    pub locked: bool,
    /// This machine (a hardware reservation of the project), else any
    /// that fits.
    pub reservation: Option<Uuid>,
    /// Who asks: `token:<id>`, or an operator.
    pub actor: String,
}

/// A machine that may be claimed.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub machine_id: Uuid,
    pub provider_id: String,
    pub location: Option<String>,
    pub hardware_report: Option<Vec<u8>>,
    /// `SecureBootEnable` as its BMC says (None: its BMC has no Secure
    /// Boot to set, or was not read).
    pub bmc_secure_boot: Option<bool>,
}

/// Where a device goes on a machine: its plan and metro, and the Secure
/// Boot its plan asks for (set through the BMC before the machine starts
/// the tenant's system).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub plan: String,
    pub metro: String,
    pub secure_boot: Option<bool>,
}

/// Where a device would go on a candidate machine, or why not.
pub type Placement<'a> = dyn Fn(&Candidate) -> Result<Placed, String> + Sync + 'a;

/// How a create ended.
#[derive(Debug, Clone)]
pub enum Claimed {
    Done(Box<Device>),
    /// No machine of the plan in the metro is available (nothing written).
    NoCapacity(String),
    /// The project holds as many devices as it may.
    Limit(String),
    /// The hardware reservation is not the project's.
    NoReservation,
    /// The reservation's machine cannot take a device now, and why.
    ReservationBusy(String),
}

const CANDIDATES: &str = concat!(
    "SELECT s.machine_id, p.provider_id, p.provider_location, hr.hardware_report_raw, ",
    crate::bmdb::lifecycle::state_column!(),
    ", f.secure_boot_enable \
     FROM machine_summary s \
     JOIN machine_provided p ON p.machine_id = s.machine_id \
     LEFT JOIN machine_project mp ON mp.machine_id = s.machine_id \
     LEFT JOIN machine_hardware_report hr ON hr.machine_id = s.machine_id \
     LEFT JOIN machine_bmc_facts f ON f.machine_id = s.machine_id \
     WHERE (mp.project_id = $1 OR (mp.project_id IS NULL AND $2)) \
       AND ($3::uuid IS NULL OR s.machine_id = $3) \
       AND NOT EXISTS (SELECT 1 FROM device d WHERE d.machine_id = s.machine_id \
                        AND d.deleted_at IS NULL) \
     ORDER BY mp.project_id IS NULL, s.machine_id"
);

/// Claims a machine for a new device and asks its installation of
/// `image`, in one transaction: among the project's machines (its own
/// first, then the shared pool's when it draws from it) that are
/// `available`, hold no device and that `place` takes (giving the plan
/// and metro the device gets there, or why not), the first that can be
/// locked and asked. A create racing another for the same
/// machine takes the next (the lock, then the unique index on open
/// devices); none left is no capacity, with nothing written.
pub async fn claim(
    tx: &mut Tx<'_>,
    new: &NewDevice,
    image: &ImageInstallation,
    place: &Placement<'_>,
) -> Result<Claimed, BmdbError> {
    // The project's row is the lock its device limit is counted under.
    let Some(p) = tx
        .query_opt(
            "SELECT max_devices, shared_pool FROM project WHERE project_id = $1 FOR UPDATE",
            &[&new.project_id],
        )
        .await?
    else {
        return Err(BmdbError::Invalid(format!(
            "project {} is not in the BMDB",
            new.project_id
        )));
    };
    let (max_devices, shared): (Option<i32>, bool) = (p.get(0), p.get(1));
    if let Some(max) = max_devices {
        let open: i64 = tx
            .query_one(
                "SELECT count(*) FROM device WHERE project_id = $1 AND deleted_at IS NULL",
                &[&new.project_id],
            )
            .await?
            .get(0);
        if open >= i64::from(max) {
            return Ok(Claimed::Limit(format!(
                "the project holds {open} devices, as many as its limit ({max}) allows"
            )));
        }
    }
    if let Some(r) = new.reservation {
        let assigned = tx
            .query_opt(
                "SELECT 1 FROM machine_project WHERE machine_id = $1 AND project_id = $2",
                &[&r, &new.project_id],
            )
            .await?;
        if assigned.is_none() {
            return Ok(Claimed::NoReservation);
        }
    }
    let rows = tx
        .query(CANDIDATES, &[&new.project_id, &shared, &new.reservation])
        .await?;
    let mut refusals = Vec::new();
    for row in &rows {
        let state: String = row.get(4);
        let c = Candidate {
            machine_id: row.get(0),
            provider_id: row.get(1),
            location: row.get(2),
            hardware_report: row.get(3),
            bmc_secure_boot: row.get(5),
        };
        if state != "available" {
            if new.reservation.is_some() {
                refusals.push(format!("machine {} is {state}", c.machine_id));
            }
            continue;
        }
        let Placed {
            plan,
            metro,
            secure_boot,
        } = match place(&c) {
            Ok(p) => p,
            Err(why) => {
                refusals.push(why);
                continue;
            }
        };
        // Its BMC and its agent disagree (serial, memory, Secure Boot),
        // not accepted: its installation would wait. Never a tenant's.
        if let Some(check) = crate::bmdb::hardware::check(tx, c.machine_id).await? {
            if check.blocks() {
                refusals.push(format!(
                    "machine {}: its BMC and its agent disagree ({})",
                    c.machine_id,
                    check.differences.join("; ")
                ));
                continue;
            }
        }
        // Taken by a racing create (locked, or claimed since this read):
        // the next.
        if tx
            .query_opt(
                "SELECT 1 FROM machines WHERE machine_id = $1 FOR UPDATE SKIP LOCKED",
                &[&c.machine_id],
            )
            .await?
            .is_none()
        {
            continue;
        }
        let taken = tx
            .query_opt(
                "SELECT 1 FROM device WHERE machine_id = $1 AND deleted_at IS NULL",
                &[&c.machine_id],
            )
            .await?;
        if taken.is_some() {
            continue;
        }
        let still: String = tx
            .query_one(
                concat!(
                    "SELECT ",
                    crate::bmdb::lifecycle::state_column!(),
                    " FROM machine_summary s LEFT JOIN machine_provided p \
                      ON p.machine_id = s.machine_id WHERE s.machine_id = $1"
                ),
                &[&c.machine_id],
            )
            .await?
            .get(0);
        if still != "available" {
            continue;
        }
        let id = new.id;
        tx.execute(
            "INSERT INTO device (device_id, project_id, machine_id, hostname, description, tags, \
                 plan, metro, operating_system, userdata, customdata, ssh_keys, created_at, \
                 created_by, updated_at, locked, secure_boot) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, now(), $13, now(), $14, $15)",
            &[
                &id,
                &new.project_id,
                &c.machine_id,
                &new.hostname,
                &new.description,
                &new.tags,
                &plan,
                &metro,
                &new.operating_system,
                &new.userdata,
                &new.customdata,
                &new.ssh_keys,
                &new.actor,
                &new.locked,
                &secure_boot,
            ],
        )
        .await?;
        let asker = Asker {
            actor: &new.actor,
            action_id: Uuid::new_v4(),
            rollout_id: None,
            reason: Some("a tenant's device"),
        };
        match installations::ask_for(tx, c.machine_id, Work::Install(image), &asker).await? {
            Asked::Done { generation, .. } => {
                tx.execute(
                    "UPDATE device SET install_generation = $2 WHERE device_id = $1",
                    &[&id, &generation],
                )
                .await?;
                event(
                    tx,
                    new.project_id,
                    Some(id),
                    "instance.created",
                    &format!(
                        "{} created ({plan} in {metro}, {})",
                        new.hostname, new.operating_system
                    ),
                )
                .await?;
                let device = get(tx, id).await?.expect("inserted above");
                return Ok(Claimed::Done(Box::new(device)));
            }
            // Nothing was asked: the device row goes, the next machine.
            Asked::Refused(why) => {
                tx.execute("DELETE FROM device WHERE device_id = $1", &[&id])
                    .await?;
                refusals.push(why);
            }
            Asked::NotFound => {
                tx.execute("DELETE FROM device WHERE device_id = $1", &[&id])
                    .await?;
            }
        }
    }
    if new.reservation.is_some() {
        return Ok(Claimed::ReservationBusy(
            refusals
                .pop()
                .unwrap_or_else(|| "its machine holds another device".into()),
        ));
    }
    Ok(Claimed::NoCapacity(format!(
        "no {} server is available in metro {}",
        new.plan, new.metro
    )))
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

/// How a delete, reinstall or power action ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acted {
    Done,
    /// Not done, and why (a 422 for the tenant).
    Refused(String),
    NotFound,
}

/// Deletes a device: its machine's disks are erased in `erase_mode`
/// (asked now, or by the devices round as soon as the machine can be
/// asked), and the device is gone once they are. `by`: the tenant's token
/// or an operator (reclaim).
pub async fn delete(
    tx: &mut Tx<'_>,
    id: Uuid,
    by: &str,
    force: bool,
    erase_mode: &str,
) -> Result<Acted, BmdbError> {
    let Some(r) = tx
        .query_opt(
            "SELECT machine_id, locked, deleting_at IS NOT NULL, project_id, hostname FROM device \
             WHERE device_id = $1 AND deleted_at IS NULL FOR UPDATE",
            &[&id],
        )
        .await?
    else {
        return Ok(Acted::NotFound);
    };
    let (machine_id, locked, deleting, project, hostname): (Uuid, bool, bool, Uuid, String) =
        (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
    if locked && !force {
        return Ok(Acted::Refused(
            "the device is locked: unlock it (locked: false) before deleting it".into(),
        ));
    }
    if deleting {
        return Ok(Acted::Done);
    }
    tx.execute(
        "UPDATE device SET deleting_at = now(), deleted_by = $2, erase_mode = $3, \
             updated_at = now() WHERE device_id = $1",
        &[&id, &by, &erase_mode],
    )
    .await?;
    event(
        tx,
        project,
        Some(id),
        "instance.deleted",
        &format!("{hostname} deleted (by {by}): its disks are erased before the machine is reused"),
    )
    .await?;
    ask_erasure(tx, id, machine_id, by, erase_mode).await?;
    Ok(Acted::Done)
}

/// Asks the erasure of a deleted device's machine; false when the machine
/// cannot be asked yet (its installation unanswered), left for the round.
async fn ask_erasure(
    tx: &mut Tx<'_>,
    device: Uuid,
    machine_id: Uuid,
    by: &str,
    erase_mode: &str,
) -> Result<Option<String>, BmdbError> {
    let asker = Asker {
        actor: by,
        action_id: Uuid::new_v4(),
        rollout_id: None,
        reason: Some("the device on it was deleted"),
    };
    let mode = shepherd_proto::names::parse_erase_mode(erase_mode)
        .map_err(|e| BmdbError::Invalid(format!("device {device}: erase mode: {e}")))?;
    let erasure = DiskErasure {
        mode: mode.into(),
        ..Default::default()
    };
    match installations::ask_for(tx, machine_id, Work::Erase(&erasure), &asker).await? {
        Asked::Done { generation, .. } => {
            tx.execute(
                "UPDATE device SET erase_generation = $2 WHERE device_id = $1",
                &[&device, &generation],
            )
            .await?;
            Ok(None)
        }
        Asked::Refused(why) => Ok(Some(why)),
        Asked::NotFound => Ok(Some(format!("machine {machine_id} is not in the BMDB"))),
    }
}

/// Reinstalls a device with `image` (its operating system, or a new one).
pub async fn reinstall(
    tx: &mut Tx<'_>,
    id: Uuid,
    image: &ImageInstallation,
    operating_system: &str,
    by: &str,
) -> Result<Acted, BmdbError> {
    let Some(r) = tx
        .query_opt(
            "SELECT machine_id, deleting_at IS NOT NULL, project_id, hostname FROM device \
             WHERE device_id = $1 AND deleted_at IS NULL FOR UPDATE",
            &[&id],
        )
        .await?
    else {
        return Ok(Acted::NotFound);
    };
    let (machine_id, deleting, project, hostname): (Uuid, bool, Uuid, String) =
        (r.get(0), r.get(1), r.get(2), r.get(3));
    if deleting {
        return Ok(Acted::Refused("the device is being deleted".into()));
    }
    let asker = Asker {
        actor: by,
        action_id: Uuid::new_v4(),
        rollout_id: None,
        reason: Some("the tenant reinstalls the device"),
    };
    match installations::ask_for(tx, machine_id, Work::Install(image), &asker).await? {
        Asked::Done { generation, .. } => {
            tx.execute(
                "UPDATE device SET install_generation = $2, reinstalling = true, \
                     powered_off = false, operating_system = $3, updated_at = now() \
                 WHERE device_id = $1",
                &[&id, &generation, &operating_system],
            )
            .await?;
            event(
                tx,
                project,
                Some(id),
                "instance.reinstall",
                &format!("{hostname} reinstalled with {operating_system} (by {by})"),
            )
            .await?;
            Ok(Acted::Done)
        }
        Asked::Refused(why) => Ok(Acted::Refused(format!("cannot reinstall now: {why}"))),
        Asked::NotFound => Ok(Acted::NotFound),
    }
}

/// A power action: `reboot`, `off` or `on`, done by the Recoverer under
/// its lease through the machine's BMC (a reboot as `cycle`: no agent is
/// expected back, the tenant's system runs).
pub async fn power(tx: &mut Tx<'_>, id: Uuid, power: &str, by: &str) -> Result<Acted, BmdbError> {
    let Some(d) = get(tx, id).await? else {
        return Ok(Acted::NotFound);
    };
    let state = d.state();
    let want_on = power != "off";
    if !matches!(state, "active" | "inactive") {
        return Ok(Acted::Refused(format!(
            "the device is {state}: power actions wait until it is active"
        )));
    }
    // Switched through its BMC (read by the Updater), or rebooted through
    // its provider's API: none of these, nothing can do it.
    let reachable: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM machine_bmc_facts WHERE machine_id = $1) \
                 OR ($2 AND EXISTS (SELECT 1 FROM machine_provided \
                                    WHERE machine_id = $1 AND provider = 'Equinix'))",
            &[&d.machine_id, &(power == "reboot")],
        )
        .await?
        .get(0);
    if !reachable {
        return Ok(Acted::Refused(format!(
            "the device's machine has no BMC shepherd reads: it cannot be {}",
            if power == "reboot" {
                "rebooted"
            } else {
                "switched on or off"
            }
        )));
    }
    if d.facts.power_request.is_some() {
        return Ok(Acted::Refused(
            "a power action on the device is under way".into(),
        ));
    }
    match (power, d.facts.powered_off) {
        ("on", false) => return Ok(Acted::Refused("the device is powered on already".into())),
        ("off", true) => return Ok(Acted::Refused("the device is powered off already".into())),
        ("reboot", true) => {
            return Ok(Acted::Refused(
                "the device is powered off: power it on instead".into(),
            ));
        }
        _ => {}
    }
    tx.execute(
        "INSERT INTO machine_reboot_request (machine_id, requested_at, requested_by, reason, power) \
         VALUES ($1, now(), $2, $3, $4) ON CONFLICT (machine_id) DO NOTHING",
        &[
            &d.machine_id,
            &by,
            &format!("device {id}: power {power}"),
            &if power == "reboot" { "cycle" } else { power },
        ],
    )
    .await?;
    tx.execute(
        "UPDATE device SET powered_off = $2, updated_at = now() WHERE device_id = $1",
        &[&id, &!want_on],
    )
    .await?;
    let what = match power {
        "off" => "powered off",
        "on" => "powered on",
        _ => "rebooted",
    };
    event(
        tx,
        d.project_id,
        Some(id),
        &format!("instance.power_{power}"),
        &format!("{} {what} (by {by})", d.hostname),
    )
    .await?;
    Ok(Acted::Done)
}

/// An event of a project (and device).
pub async fn event(
    tx: &mut Tx<'_>,
    project: Uuid,
    device: Option<Uuid>,
    kind: &str,
    body: &str,
) -> Result<(), BmdbError> {
    tx.execute(
        "INSERT INTO project_event (event_id, project_id, device_id, type, body, \"timestamp\") \
         VALUES ($1, $2, $3, $4, $5, clock_timestamp())",
        &[&Uuid::new_v4(), &project, &device, &kind, &body],
    )
    .await?;
    Ok(())
}

/// An event as the Metal API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: Uuid,
    pub project_id: Uuid,
    pub device_id: Option<Uuid>,
    pub kind: String,
    pub body: String,
    pub at: SystemTime,
}

/// Which events: a project's, a device's, or one.
#[derive(Debug, Clone, Copy)]
pub enum Events {
    Project(Uuid),
    Device(Uuid),
    One(Uuid),
    /// Every project's (an operator's view), or those of `Some` project.
    All(Option<Uuid>),
}

/// A page of events, newest first, and how many there are in all.
pub async fn events(
    tx: &mut Tx<'_>,
    which: Events,
    offset: i64,
    limit: i64,
) -> Result<(Vec<Event>, i64), BmdbError> {
    macro_rules! events_in {
        ($cond:literal) => {
            (
                concat!(
                    "SELECT event_id, project_id, device_id, type, body, \"timestamp\" \
                     FROM project_event WHERE ",
                    $cond,
                    " ORDER BY \"timestamp\" DESC, event_id OFFSET $2 LIMIT $3"
                ),
                concat!("SELECT count(*) FROM project_event WHERE ", $cond),
            )
        };
    }
    let ((list, count), id): ((&'static str, &'static str), Option<Uuid>) = match which {
        Events::Project(p) => (events_in!("project_id = $1"), Some(p)),
        Events::Device(d) => (events_in!("device_id = $1"), Some(d)),
        Events::One(e) => (events_in!("event_id = $1"), Some(e)),
        Events::All(p) => (events_in!("($1::uuid IS NULL OR project_id = $1)"), p),
    };
    let rows = tx.query(list, &[&id, &offset, &limit]).await?;
    // The count has no $2 and $3: its own parameters.
    let total: i64 = tx.query_one(count, &[&id]).await?.get(0);
    Ok((
        rows.iter()
            .map(|r| Event {
                id: r.get(0),
                project_id: r.get(1),
                device_id: r.get(2),
                kind: r.get(3),
                body: r.get(4),
                at: r.get(5),
            })
            .collect(),
        total,
    ))
}

/// What one pass of the devices round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Advanced {
    /// Devices whose state changed: device, from, to.
    pub changed: Vec<(Uuid, Option<String>, String)>,
    /// Deleted devices whose erasure was asked now.
    pub erasures_asked: Vec<Uuid>,
    /// Deleted devices whose machine was erased: gone.
    pub ended: Vec<Uuid>,
}

/// The devices round: asks the erasure of deleted devices that could not
/// be asked before, ends those whose erasure succeeded (their machine is
/// available again), and writes every change of a device's Metal state as
/// an event. Locks what it changes, so shepherds may run it side by side.
pub async fn advance(tx: &mut Tx<'_>) -> Result<Advanced, BmdbError> {
    let mut out = Advanced::default();
    let sql = concat!(
        device_select!(),
        "WHERE d.deleted_at IS NULL AND d.device_id IN (SELECT device_id FROM device \
           WHERE deleted_at IS NULL FOR UPDATE SKIP LOCKED)"
    );
    let rows = tx.query(sql, &[]).await?;
    for r in &rows {
        let d = device_from(r);
        let f = &d.facts;
        if f.deleting && f.erase_generation.is_none() {
            if ask_erasure(tx, d.id, d.machine_id, &d.deleted_by, &d.erase_mode)
                .await?
                .is_none()
            {
                out.erasures_asked.push(d.id);
            }
            continue;
        }
        let succeeded = |g: i32| f.report.as_ref() == Some(&(g, "Success".to_string()));
        let erased = f.deleting && f.erase_generation.is_some_and(succeeded);
        // An operator's erasure of the machine under a device (a
        // deprovisioning, not the device's delete) ends it too.
        let reclaimed = !f.deleting
            && f.install_generation.is_some_and(|asked| {
                f.installation
                    .as_ref()
                    .is_some_and(|(g, kind)| *g > asked && kind == "erase" && succeeded(*g))
            });
        if erased || reclaimed {
            tx.execute(
                "UPDATE device SET deleted_at = now(), last_state = 'deleted' WHERE device_id = $1",
                &[&d.id],
            )
            .await?;
            event(
                tx,
                d.project_id,
                Some(d.id),
                "instance.deprovisioned",
                &format!(
                    "{}: its machine's disks are erased; the device is gone",
                    d.hostname
                ),
            )
            .await?;
            out.ended.push(d.id);
            continue;
        }
        let state = d.state();
        if f.last_state.as_deref() != Some(state) {
            tx.execute(
                "UPDATE device SET last_state = $2 WHERE device_id = $1",
                &[&d.id, &state],
            )
            .await?;
            // The first look at a new device is no change to tell.
            if f.last_state.is_some() || state != "queued" {
                event(
                    tx,
                    d.project_id,
                    Some(d.id),
                    &format!("instance.{state}"),
                    &format!("{} is {state}", d.hostname),
                )
                .await?;
            }
            if state == "active" && f.reinstalling {
                tx.execute(
                    "UPDATE device SET reinstalling = false WHERE device_id = $1",
                    &[&d.id],
                )
                .await?;
            }
            out.changed
                .push((d.id, f.last_state.clone(), state.to_string()));
        }
    }
    Ok(out)
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

/// The metros machines are in: their distinct inventory locations.
pub async fn locations(tx: &mut Tx<'_>) -> Result<Vec<String>, BmdbError> {
    Ok(tx
        .query(
            "SELECT DISTINCT provider_location FROM machine_provided \
             WHERE provider_location IS NOT NULL AND provider_location <> '' ORDER BY 1",
            &[],
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
