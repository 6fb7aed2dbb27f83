//! Boots into the live agent through a machine's BMC, asked for
//! (`machine_boot_request`: a blank machine, `inspect`, the Recoverer's
//! last step, an installation of an installed machine), and which machines
//! boot that way (`machine_bmc_boot`, from the inventory). The Enroller
//! does them; [`super::boot`] holds each boot's credential.

use std::time::{Duration, SystemTime};

use uuid::Uuid;

use super::{BmdbError, Tx};

/// Why a machine is to be booted into the agent through its BMC
/// (`machine_boot_request.cause`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BootCause {
    /// A blank machine, listed with `boot = "virtual-media"` and no agent.
    Enroll,
    /// An operator asked (`inspect`).
    Inspect,
    /// The Recoverer's last step for a machine whose agent went quiet.
    Recovery,
    /// An installation asked of a machine whose agent is gone (installed).
    Install,
    /// A deprovisioning asked of such a machine.
    Deprovision,
    /// Restart from the disk through the BMC: an installation is done.
    Disk,
    /// A servicing's restart: what it changed takes effect, the live
    /// agent comes back.
    Service,
}

impl BootCause {
    pub fn as_str(self) -> &'static str {
        match self {
            BootCause::Enroll => "enroll",
            BootCause::Inspect => "inspect",
            BootCause::Recovery => "recovery",
            BootCause::Install => "install",
            BootCause::Deprovision => "deprovision",
            BootCause::Disk => "disk",
            BootCause::Service => "service",
        }
    }

    pub fn parse(s: &str) -> Option<BootCause> {
        [
            BootCause::Enroll,
            BootCause::Inspect,
            BootCause::Recovery,
            BootCause::Install,
            BootCause::Deprovision,
            BootCause::Disk,
            BootCause::Service,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }
}

impl std::fmt::Display for BootCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

const TAG_BMC_BOOT: &str = "INSERT INTO machine_bmc_boot (machine_id, since) \
     SELECT machine_id, now() FROM machine_provided WHERE provider = $1 AND provider_id = ANY($2) \
     ON CONFLICT (machine_id) DO NOTHING";
const UNTAG_BMC_BOOT: &str = "DELETE FROM machine_bmc_boot b USING machine_provided p \
     WHERE p.machine_id = b.machine_id AND p.provider = $1 AND NOT (p.provider_id = ANY($2))";

/// Makes the `machine_bmc_boot` tags of `provider`'s machines those of
/// `ids` (the ones listed with `boot = "virtual-media"`). Returns (tagged,
/// untagged) counts.
pub async fn set_bmc_boot(
    tx: &mut Tx<'_>,
    provider: super::Provider,
    ids: &[String],
) -> Result<(u64, u64), BmdbError> {
    let tagged = tx.execute(TAG_BMC_BOOT, &[&provider, &ids]).await?;
    let untagged = tx.execute(UNTAG_BMC_BOOT, &[&provider, &ids]).await?;
    Ok((tagged, untagged))
}

/// Tags `ids` of `provider` `machine_bmc_boot`, leaving the others be.
pub async fn set_bmc_boot_of(
    tx: &mut Tx<'_>,
    provider: super::Provider,
    ids: &[String],
) -> Result<u64, BmdbError> {
    tx.execute(TAG_BMC_BOOT, &[&provider, &ids]).await
}

/// The one statement that asks for a boot (the V13 trigger asking a
/// machine installed through its BMC to restart from its disk is the
/// only other writer): `$5` only a machine booted through its BMC, `$6`
/// only an installed one whose live agent left with the reboot.
macro_rules! request_sql {
    ($on_conflict:literal) => {
        concat!(
            "INSERT INTO machine_boot_request (machine_id, requested_at, requested_by, cause, reason) \
             SELECT $1, now(), $2, $3, $4 \
              WHERE (NOT $5 OR EXISTS (SELECT 1 FROM machine_bmc_boot WHERE machine_id = $1)) \
                AND (NOT $6 OR (EXISTS (SELECT 1 FROM machine_os_installation_report \
                                        WHERE machine_id = $1 AND os_installation_result = 'Success') \
                                AND NOT EXISTS (SELECT 1 FROM machine_summary \
                                                WHERE machine_id = $1 AND live_agent))) \
             ON CONFLICT (machine_id) ",
            $on_conflict
        )
    };
}
const REQUEST: &str = request_sql!("DO NOTHING");
const REQUEST_REPLACE: &str =
    request_sql!("DO UPDATE SET requested_at = now(), requested_by = $2, cause = $3, reason = $4");

/// Which machines a boot request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Only {
    /// Any machine.
    Any,
    /// A machine booted through its BMC (`machine_bmc_boot`): the
    /// Recoverer's taking one back.
    BootedByBmc,
    /// One booted through its BMC, installed, its live agent gone with
    /// the reboot: an installation or a deprovisioning reaches it first.
    InstalledByBmc,
}

/// Asks for a boot of `machine_id` into the agent; a boot already asked
/// for stands (false), unless `replace`.
pub async fn request(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    cause: BootCause,
    by: &str,
    reason: Option<&str>,
    replace: bool,
) -> Result<bool, BmdbError> {
    request_if(tx, machine_id, Only::Any, cause, by, reason, replace).await
}

/// As [`request`], for the machines `only` names (false for another, or
/// when a boot is already asked for and not `replace`d).
pub async fn request_if(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    only: Only,
    cause: BootCause,
    by: &str,
    reason: Option<&str>,
    replace: bool,
) -> Result<bool, BmdbError> {
    let q = if replace { REQUEST_REPLACE } else { REQUEST };
    let bmc = only != Only::Any;
    let installed = only == Only::InstalledByBmc;
    Ok(tx
        .execute(
            q,
            &[&machine_id, &by, &cause.as_str(), &reason, &bmc, &installed],
        )
        .await?
        == 1)
}

/// A boot asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootRequest {
    pub cause: BootCause,
    pub requested_at: SystemTime,
    pub requested_by: String,
    pub reason: Option<String>,
}

/// The boot asked for `machine_id`, if any.
pub async fn requested(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
) -> Result<Option<BootRequest>, BmdbError> {
    let r = tx
        .query_opt(
            "SELECT cause, requested_at, requested_by, reason FROM machine_boot_request \
             WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?;
    Ok(r.map(|r| BootRequest {
        cause: BootCause::parse(r.get(0)).unwrap_or(BootCause::Enroll),
        requested_at: r.get(1),
        requested_by: r.get(2),
        reason: r.get(3),
    }))
}

/// The boot asked for is done: its request goes.
pub async fn request_done(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<(), BmdbError> {
    tx.execute(
        "DELETE FROM machine_boot_request WHERE machine_id = $1",
        &[&machine_id],
    )
    .await?;
    Ok(())
}

/// How long the oldest boot asked for (of a machine not held) has waited;
/// zero when none is.
pub async fn oldest_request_age(tx: &mut Tx<'_>) -> Result<Duration, BmdbError> {
    let secs: f64 = tx
        .query_one(
            "SELECT COALESCE(EXTRACT(epoch FROM now() - min(r.requested_at))::float8, 0) \
               FROM machine_boot_request r \
              WHERE NOT EXISTS (SELECT 1 FROM machine_hold h WHERE h.machine_id = r.machine_id)",
            &[],
        )
        .await?
        .get(0);
    Ok(Duration::from_secs_f64(secs.max(0.0)))
}
