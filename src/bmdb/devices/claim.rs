//! A new device: the claim of an available machine of its plan, and the
//! installation asked for it, in one transaction.

use shepherd_proto::api::ImageInstallation;
use uuid::Uuid;

use super::super::installations::{self, Asked, Asker, Work};
use super::super::{BmdbError, Tx};
use super::*;

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

/// Candidates are read this many at a time: a create looks at the first
/// few that fit, not at the whole fleet (nor at every hardware report).
const BATCH: i64 = 32;

/// The project's machines (its own first, then the shared pool's when
/// `$2`), `available` unless one is named (`$3`, a reservation), holding
/// no device, after `($4, $5)` in that order.
const CANDIDATES: &str = concat!(
    "SELECT c.machine_id, c.provider_id, c.provider_location, hr.hardware_report_raw, \
       c.state, f.secure_boot_enable, c.shared \
     FROM (SELECT s.machine_id, p.provider_id, p.provider_location, mp.project_id IS NULL AS shared, ",
    crate::bmdb::lifecycle::state_column!(),
    " FROM machine_summary s \
       JOIN machine_provided p ON p.machine_id = s.machine_id \
       LEFT JOIN machine_project mp ON mp.machine_id = s.machine_id \
       WHERE (mp.project_id = $1 OR (mp.project_id IS NULL AND $2)) \
         AND ($3::uuid IS NULL OR s.machine_id = $3) \
         AND NOT EXISTS (SELECT 1 FROM device d WHERE d.machine_id = s.machine_id \
                          AND d.deleted_at IS NULL)) c \
     LEFT JOIN machine_hardware_report hr ON hr.machine_id = c.machine_id \
     LEFT JOIN machine_bmc_facts f ON f.machine_id = c.machine_id \
     WHERE ($3::uuid IS NOT NULL OR c.state = 'available') \
       AND (c.shared, c.machine_id) > ($4::bool, $5::uuid) \
     ORDER BY c.shared, c.machine_id \
     LIMIT $6"
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
    let mut refusals = Vec::new();
    let mut after = (false, Uuid::nil());
    loop {
        let rows = tx
            .query(
                CANDIDATES,
                &[
                    &new.project_id,
                    &shared,
                    &new.reservation,
                    &after.0,
                    &after.1,
                    &BATCH,
                ],
            )
            .await?;
        for row in &rows {
            after = (row.get(6), row.get(0));
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
                    super::ports::make(tx, id, c.machine_id).await?;
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
        if (rows.len() as i64) < BATCH {
            break;
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
