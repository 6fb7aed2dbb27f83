//! What a tenant does to a device: delete (its machine erased), reinstall,
//! power.

use shepherd_proto::api::{DiskErasure, ImageInstallation};
use uuid::Uuid;

use super::super::installations::{self, Asked, Asker, Work};
use super::super::{BmdbError, Tx};
use super::*;

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
    // Its ports go with it: the networks they held are free to delete.
    tx.execute("DELETE FROM device_port WHERE device_id = $1", &[&id])
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
pub(super) async fn ask_erasure(
    tx: &mut Tx<'_>,
    device: Uuid,
    machine_id: Uuid,
    by: &str,
    erase_mode: &str,
) -> Result<Option<String>, BmdbError> {
    // Its ports leave the tenant's network before anything of shepherd's
    // reaches the machine: the erasure is asked once they are read back
    // on the provisioning network (the devices round asks again).
    let network: Option<String> = tx
        .query_opt(
            "SELECT network FROM machine_summary WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?
        .and_then(|r| r.get(0));
    if network.as_deref().is_some_and(|n| n != "provisioning") {
        return Ok(Some(format!(
            "machine {machine_id}'s ports are not on the provisioning network yet"
        )));
    }
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
