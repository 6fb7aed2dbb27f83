//! Servicing: a machine brought to its baseline through its BMC while it
//! is free (`machine_service`, one row per machine: its last servicing;
//! each one's end also in `service_history`). Asked by an operator
//! (`service`, forced on a tenant's machine, audited) or a rollout of a
//! baseline; done by the Servicer in phases: `asked` (to be applied),
//! `restarting` (applied; the restart asked of the Enroller, or made by
//! the Servicer; to be checked after it), then `done` or `failed`. The
//! machine shows `servicing`, then what it was, or `service-failed`.

use std::time::SystemTime;

use uuid::Uuid;

use super::actions::{AUDIT_BY_ID, AUDIT_INSERT, Audit, audit_from};
use super::bmc_boot::{self, BootCause};
use super::lifecycle::{self, MachineState, Operation};
use super::{BmdbError, Tx};

/// How asking for a servicing ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// Asked (or found asked under the same request ID): to which
    /// baseline, the audit row.
    Done {
        service_id: Uuid,
        baseline: String,
        audit: Audit,
    },
    /// Not asked, and why (nothing changed).
    Refused(String),
    NotFound,
}

/// A servicing to ask for.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    /// The audit row's ID: asked again after a lost answer, it finds its
    /// own row instead of asking twice.
    pub action_id: Uuid,
    /// An admin token's name, `cli`, or a rollout's description.
    pub actor: &'a str,
    pub reason: Option<&'a str>,
    /// The baseline that selects the machine (`crate::baselines`).
    pub baseline: &'a str,
    /// The operator says so for a tenant's machine.
    pub forced: bool,
    pub rollout_id: Option<Uuid>,
}

/// A machine's servicing, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Service {
    pub service_id: Uuid,
    pub baseline: String,
    pub forced: bool,
    pub rollout_id: Option<Uuid>,
    pub asked_by: String,
    #[serde(with = "humantime_serde")]
    pub asked_at: SystemTime,
    pub reason: Option<String>,
    /// `asked`, `restarting`, `done`, `failed`.
    pub phase: String,
    /// What was changed, for people.
    pub applied: Option<String>,
    pub restarts: i32,
    #[serde(with = "humantime_serde")]
    pub restarted_at: Option<SystemTime>,
    pub error: Option<String>,
    #[serde(with = "humantime_serde")]
    pub ended_at: Option<SystemTime>,
}

const OF_MACHINE: &str = "SELECT service_id, baseline, forced, rollout_id, asked_by, asked_at, \
     reason, phase, applied, restarts, restarted_at, error, ended_at \
     FROM machine_service WHERE machine_id = $1";

fn service_from(r: &tokio_postgres::Row) -> Service {
    Service {
        service_id: r.get(0),
        baseline: r.get(1),
        forced: r.get(2),
        rollout_id: r.get(3),
        asked_by: r.get(4),
        asked_at: r.get(5),
        reason: r.get(6),
        phase: r.get(7),
        applied: r.get(8),
        restarts: r.get(9),
        restarted_at: r.get(10),
        error: r.get(11),
        ended_at: r.get(12),
    }
}

/// Whose machine it is: a tenant's device's (open), or one installed.
async fn tenants(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Option<String>, BmdbError> {
    Ok(tx
        .query_opt(
            "SELECT device_id::text FROM device WHERE machine_id = $1 AND deleted_at IS NULL",
            &[&machine_id],
        )
        .await?
        .map(|r| format!("device {}", r.get::<_, String>(0))))
}

/// Whether a machine may be serviced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Yes; whose it is when it is a tenant's (forced).
    Askable {
        tenant: Option<String>,
    },
    Refused(String),
    NotFound,
}

/// Locks machine `machine_id` and says whether it may be serviced
/// (`forced`: an operator says so for a tenant's machine).
pub async fn standing(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    forced: bool,
) -> Result<Standing, BmdbError> {
    if tx
        .query_opt(
            "SELECT 1 FROM machines WHERE machine_id = $1 FOR UPDATE",
            &[&machine_id],
        )
        .await?
        .is_none()
    {
        return Ok(Standing::NotFound);
    }
    let held = tx
        .query_opt(
            "SELECT held_by FROM machine_hold WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?;
    if let Some(h) = held {
        return Ok(Standing::Refused(format!(
            "machine {machine_id} is held (by {}); release it first",
            h.get::<_, String>(0)
        )));
    }
    let state = lifecycle::state_of(tx, machine_id)
        .await?
        .unwrap_or(MachineState::Unprovided);
    if let Some(why) = lifecycle::refusal(machine_id, state, Operation::Service) {
        return Ok(Standing::Refused(why));
    }
    let tenant = match tenants(tx, machine_id).await? {
        Some(d) => Some(d),
        None => (state == MachineState::Installed).then(|| "its installed system".to_string()),
    };
    if let Some(whose) = &tenant
        && !forced
    {
        return Ok(Standing::Refused(format!(
            "machine {machine_id} is a tenant's ({whose}): servicing restarts it; an operator \
             forces it on this one machine to go ahead"
        )));
    }
    let firmware_read = tx
        .query_opt(
            "SELECT read_error FROM machine_firmware_read WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?;
    if firmware_read.is_none() {
        return Ok(Standing::Refused(format!(
            "machine {machine_id}: its BMC has listed no firmware (an IPMI BMC lists none; a \
             Redfish one is read every updater.firmware_interval): it can be serviced once its \
             firmware shows on its page"
        )));
    }
    Ok(Standing::Askable { tenant })
}

/// Asks for machine `machine_id`'s servicing to `ask.baseline`. Refused
/// where the life cycle refuses `service`, while held, on a tenant's
/// machine unless forced, on a machine whose BMC lists no firmware (IPMI,
/// or not read yet: it could be neither changed nor checked), and, for a
/// rollout, on one whose last servicing to that baseline failed (an
/// operator's to try again).
pub async fn ask(tx: &mut Tx<'_>, machine_id: Uuid, ask: &Ask<'_>) -> Result<Asked, BmdbError> {
    if let Some(r) = tx.query_opt(AUDIT_BY_ID, &[&ask.action_id]).await? {
        let audit = audit_from(&r);
        if audit.machine_id != Some(machine_id) || audit.action != Operation::Service.as_str() {
            return Ok(Asked::Refused(format!(
                "request {} was another action's ({})",
                ask.action_id, audit.action
            )));
        }
        let (service_id, baseline) = tx
            .query_opt(
                "SELECT service_id, baseline FROM machine_service WHERE machine_id = $1",
                &[&machine_id],
            )
            .await?
            .map(|r| (r.get(0), r.get(1)))
            .unwrap_or_default();
        return Ok(Asked::Done {
            service_id,
            baseline,
            audit,
        });
    }
    let tenant = match standing(tx, machine_id, ask.forced).await? {
        Standing::Askable { tenant } => tenant,
        Standing::Refused(why) => return Ok(Asked::Refused(why)),
        Standing::NotFound => return Ok(Asked::NotFound),
    };
    if ask.rollout_id.is_some() {
        let failed = tx
            .query_opt(
                "SELECT error FROM machine_service \
                  WHERE machine_id = $1 AND phase = 'failed' AND baseline = $2",
                &[&machine_id, &ask.baseline],
            )
            .await?;
        if let Some(r) = failed {
            return Ok(Asked::Refused(format!(
                "machine {machine_id}'s last servicing to baseline {} failed ({}): a rollout does \
                 not try it again; an operator services it again by hand",
                ask.baseline,
                r.get::<_, Option<String>>(0).unwrap_or_default()
            )));
        }
    }
    let service_id = Uuid::new_v4();
    tx.execute(
        "INSERT INTO machine_service (machine_id, service_id, baseline, forced, rollout_id, \
             asked_by, asked_at, reason, phase) \
         VALUES ($1, $2, $3, $4, $5, $6, now(), $7, 'asked') \
         ON CONFLICT (machine_id) DO UPDATE SET service_id = EXCLUDED.service_id, \
             baseline = EXCLUDED.baseline, forced = EXCLUDED.forced, \
             rollout_id = EXCLUDED.rollout_id, asked_by = EXCLUDED.asked_by, \
             asked_at = EXCLUDED.asked_at, reason = EXCLUDED.reason, phase = 'asked', \
             applied = NULL, restarts = 0, restarted_at = NULL, error = NULL, ended_at = NULL",
        &[
            &machine_id,
            &service_id,
            &ask.baseline,
            &ask.forced,
            &ask.rollout_id,
            &ask.actor,
            &ask.reason,
        ],
    )
    .await?;
    let mut detail = format!("service {service_id}: to baseline {}", ask.baseline);
    if let (Some(whose), true) = (&tenant, ask.forced) {
        detail.push_str(&format!("; forced on a tenant's machine ({whose})"));
    }
    let row = tx
        .query_one(
            AUDIT_INSERT,
            &[
                &ask.action_id,
                &machine_id,
                &Operation::Service.as_str(),
                &ask.actor,
                &ask.reason,
                &detail,
            ],
        )
        .await?;
    Ok(Asked::Done {
        service_id,
        baseline: ask.baseline.to_string(),
        audit: audit_from(&row),
    })
}

/// Machine `machine_id`'s last servicing, if it had one.
pub async fn of_machine(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Option<Service>, BmdbError> {
    Ok(tx
        .query_opt(OF_MACHINE, &[&machine_id])
        .await?
        .as_ref()
        .map(service_from))
}

/// How a restart is had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// The Enroller boots it into the live agent again (a machine booted
    /// through its BMC, nothing installed): the boot's reset is the
    /// restart.
    Boot,
    /// The Enroller restarts it from its disk through its BMC (one booted
    /// through its BMC with a system installed: a tenant's, forced): its
    /// installed system comes back, not the live agent.
    Disk,
    /// The Servicer resets it through its BMC (its agent, or its system,
    /// installed on its disk, comes back by itself).
    Reset,
}

/// How machine `machine_id` restarts: through the Enroller when it is
/// booted through its BMC (into the live agent, or from its disk when a
/// system is installed), else by a reset.
pub async fn restart_of(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Restart, BmdbError> {
    let r = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM machine_bmc_boot WHERE machine_id = $1), \
                    COALESCE((SELECT installation_fulfilled FROM machine_summary \
                               WHERE machine_id = $1), false)",
            &[&machine_id],
        )
        .await?;
    Ok(match (r.get::<_, bool>(0), r.get::<_, bool>(1)) {
        (true, false) => Restart::Boot,
        (true, true) => Restart::Disk,
        (false, _) => Restart::Reset,
    })
}

/// Servicing `service_id` was applied (`applied` says what): its restart
/// is asked (the Enroller's boot) or about to be made (`Reset`), recorded
/// first, so that a worker taking over finds it asked and never restarts
/// twice. False when the servicing is no longer this one.
pub async fn restarting(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    service_id: Uuid,
    applied: &str,
    restart: Restart,
) -> Result<bool, BmdbError> {
    let n = tx
        .execute(
            "UPDATE machine_service SET phase = 'restarting', applied = $3, \
                 restarts = restarts + 1, restarted_at = now() \
             WHERE machine_id = $1 AND service_id = $2 AND phase = 'asked'",
            &[&machine_id, &service_id, &applied],
        )
        .await?;
    let cause = match restart {
        Restart::Boot => Some(BootCause::Service),
        Restart::Disk => Some(BootCause::Disk),
        Restart::Reset => None,
    };
    if let (1, Some(cause)) = (n, cause) {
        bmc_boot::request(
            tx,
            machine_id,
            cause,
            "shepherd",
            Some(&format!("servicing {service_id}: {applied}")),
            true,
        )
        .await?;
    }
    Ok(n == 1)
}

/// Servicing `service_id` ended: `Ok(what was done)` or `Err(why it
/// failed)`, kept in its history too. False when the servicing is no
/// longer this one (asked anew meanwhile).
pub async fn end(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    service_id: Uuid,
    result: &Result<String, String>,
) -> Result<bool, BmdbError> {
    let (phase, applied, error) = match result {
        Ok(done) => ("done", Some(done.as_str()), None),
        Err(e) => ("failed", None, Some(e.as_str())),
    };
    let n = tx
        .execute(
            "UPDATE machine_service SET phase = $3, applied = COALESCE($4, applied), error = $5, \
                 ended_at = now() \
             WHERE machine_id = $1 AND service_id = $2 AND phase IN ('asked', 'restarting')",
            &[&machine_id, &service_id, &phase, &applied, &error],
        )
        .await?;
    if n == 1 {
        tx.execute(
            "INSERT INTO service_history (service_id, machine_id, baseline, rollout_id, asked_by, \
                 asked_at, phase, applied, restarts, error, ended_at) \
             SELECT service_id, machine_id, baseline, rollout_id, asked_by, asked_at, phase, \
                 applied, restarts, error, ended_at FROM machine_service WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?;
    }
    Ok(n == 1)
}

/// A machine's servicings, newest first.
pub async fn history(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Vec<Service>, BmdbError> {
    Ok(tx
        .query(
            "SELECT service_id, baseline, false, rollout_id, asked_by, asked_at, NULL::text, \
                    phase, applied, restarts, NULL::timestamptz, error, ended_at \
               FROM service_history WHERE machine_id = $1 ORDER BY ended_at DESC LIMIT 50",
            &[&machine_id],
        )
        .await?
        .iter()
        .map(service_from)
        .collect())
}

/// How the servicings rollout `rollout_id` asked of its running machines
/// stand, in one query: for each, None while it runs, Some(Ok) done,
/// Some(Err(why)) failed (or superseded by another's).
pub async fn settled(
    tx: &mut Tx<'_>,
    rollout_id: Uuid,
) -> Result<Vec<(Uuid, Option<Result<(), String>>)>, BmdbError> {
    let rows = tx
        .query(
            "SELECT m.machine_id, s.machine_id IS NOT NULL, s.rollout_id, s.phase, s.error, \
                    s.asked_by \
               FROM rollout_machine m LEFT JOIN machine_service s ON s.machine_id = m.machine_id \
              WHERE m.rollout_id = $1 AND m.state = 'running'",
            &[&rollout_id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let standing = if !r.get::<_, bool>(1) {
                Some(Err("the machine's servicing was removed".to_string()))
            } else if r.get::<_, Option<Uuid>>(2) != Some(rollout_id) {
                Some(Err(format!(
                    "superseded: the machine was asked to be serviced by {}",
                    r.get::<_, String>(5)
                )))
            } else {
                match r.get::<_, &str>(3) {
                    "done" => Some(Ok(())),
                    "failed" => Some(Err(r
                        .get::<_, Option<String>>(4)
                        .unwrap_or_else(|| "the servicing failed".into()))),
                    _ => None,
                }
            };
            (r.get(0), standing)
        })
        .collect())
}
