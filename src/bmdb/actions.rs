//! What an operator does to a machine: retry now, take over again, reboot,
//! hold and release. Each action is one transaction that checks, acts and
//! writes its audit row (`operator_action`): who (an admin token's name, or
//! `cli`), when, what, why, and what it did.
//!
//! An action is refused, with the reason, when it would not do what it
//! says: a retry without a backoff, taking over a machine another process
//! works on, rebooting a held machine. A request carries its own ID: run
//! again after a lost commit, it finds its audit row and returns it instead
//! of acting twice.

use std::time::SystemTime;

use uuid::Uuid;

use super::{BmdbError, Process, Tx};

/// The actions `act` carries out: the life cycle's operations
/// ([`Operation`], one enum for every name the API, the CLI, the pages and
/// the audit use) but installations and deprovisionings, which
/// `installations` asks for.
pub use super::lifecycle::Operation as Action;

/// Who holds machine `m` and since when: `(by alice since …)`.
async fn holder(tx: &mut Tx<'_>, m: Uuid) -> Result<String, BmdbError> {
    let r = tx
        .query_one(
            "SELECT held_by, held_at FROM machine_hold WHERE machine_id = $1",
            &[&m],
        )
        .await?;
    let at: SystemTime = r.get(1);
    Ok(format!(
        "(by {} since {})",
        r.get::<_, String>(0),
        humantime::format_rfc3339_seconds(at)
    ))
}

/// One operator's request.
#[derive(Debug, Clone)]
pub struct Request {
    /// Names the request: the audit row's ID.
    pub id: Uuid,
    pub machine_id: Uuid,
    pub action: Action,
    /// An admin token's name, or `cli`.
    pub actor: String,
    pub reason: Option<String>,
    /// Retry: only this process's backoff (all of the machine's if None).
    pub process: Option<Process>,
    /// Retake over: also forget the recorded SSH host key.
    pub forget_host_key: bool,
    /// Accept: the machine's BMC and inventory host ID.
    pub accept: Option<super::discovery::Acceptance>,
}

impl Request {
    pub fn new(machine_id: Uuid, action: Action, actor: impl Into<String>) -> Self {
        Request {
            id: Uuid::new_v4(),
            machine_id,
            action,
            actor: actor.into(),
            reason: None,
            process: None,
            forget_host_key: false,
            accept: None,
        }
    }
}

/// An audit row (fleet-wide actions, such as releasing the recovery brake,
/// name no machine).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Audit {
    pub id: Uuid,
    pub machine_id: Option<Uuid>,
    pub action: String,
    pub actor: String,
    #[serde(with = "humantime_serde")]
    pub timestamp: SystemTime,
    pub reason: Option<String>,
    pub detail: String,
}

/// How an action ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done(Audit),
    /// Not done, and why (the machine is as it was).
    Refused(String),
    NotFound,
}

/// Longest reason kept, in characters (longer ones are refused, not cut).
pub const MAX_REASON: usize = 1000;

macro_rules! audit_columns {
    () => {
        "operator_action_id, machine_id, action, actor, \"timestamp\", reason, detail"
    };
}
pub(super) const AUDIT_BY_ID: &str = concat!(
    "SELECT ",
    audit_columns!(),
    " FROM operator_action WHERE operator_action_id = $1"
);
pub(super) const AUDIT_INSERT: &str = concat!(
    "INSERT INTO operator_action (",
    audit_columns!(),
    ") VALUES ($1, $2, $3, $4, now(), $5, $6) RETURNING ",
    audit_columns!()
);
const AUDIT_OF_MACHINE: &str = concat!(
    "SELECT ",
    audit_columns!(),
    " FROM operator_action WHERE machine_id = $1 ORDER BY \"timestamp\", operator_action_id"
);

pub(super) fn audit_from(r: &tokio_postgres::Row) -> Audit {
    Audit {
        id: r.get(0),
        machine_id: r.get(1),
        action: r.get(2),
        actor: r.get(3),
        timestamp: r.get(4),
        reason: r.get(5),
        detail: r.get(6),
    }
}

/// Runs `req` in `tx`.
pub async fn act(tx: &mut Tx<'_>, req: &Request) -> Result<Outcome, BmdbError> {
    if let Some(r) = &req.reason {
        let n = r.chars().count();
        if n > MAX_REASON {
            return Ok(Outcome::Refused(format!(
                "the reason is {n} characters; at most {MAX_REASON}"
            )));
        }
    }
    if let Some(r) = tx.query_opt(AUDIT_BY_ID, &[&req.id]).await? {
        let a = audit_from(&r);
        if a.machine_id != Some(req.machine_id) {
            return Ok(Outcome::Refused(format!(
                "request {} was another action's ({} {})",
                req.id,
                a.action,
                a.machine_id
                    .map(|m| m.to_string())
                    .unwrap_or_else(|| "fleet".into())
            )));
        }
        return Ok(Outcome::Done(a));
    }
    // The summary row is what the selectors lock: holding it, no control
    // loop leases the machine under this transaction.
    let Some(row) = tx
        .query_opt(
            "SELECT held, reboot_requested, bmc_boot, boot_request FROM machine_summary \
              WHERE machine_id = $1 FOR UPDATE",
            &[&req.machine_id],
        )
        .await?
    else {
        return Ok(Outcome::NotFound);
    };
    let (held, reboot_requested): (bool, bool) = (row.get(0), row.get(1));
    let (bmc_boot, boot_request): (bool, Option<String>) = (row.get(2), row.get(3));
    // Read after the lock (a statement of its own: under READ COMMITTED it
    // sees a lease committed while the lock was awaited).
    let working: Option<Process> = tx
        .query_opt(
            "SELECT process FROM work WHERE machine_id = $1 AND process = ANY($2)",
            &[&req.machine_id, &&Process::SHEPHERD[..]],
        )
        .await?
        .map(|r| r.get(0));
    let m = req.machine_id;
    if let Some(state) = super::lifecycle::state_of(tx, m).await?
        && let Some(why) = super::lifecycle::refusal(m, state, req.action)
    {
        if state == super::lifecycle::MachineState::Held {
            // Who holds it says more than the table.
            let by = holder(tx, m).await?;
            return Ok(Outcome::Refused(if req.action == Action::Hold {
                format!("machine {m} is already held {by}")
            } else {
                format!(
                    "machine {m} is held {by}; release it before asking for {}",
                    req.action
                )
            }));
        }
        if let (super::lifecycle::MachineState::Leased, Some(p)) = (state, working) {
            return Ok(Outcome::Refused(format!(
                "machine {m} is leased for {p}: {} is not allowed while a shepherd works on it; \
                     ask again once that work ends",
                req.action
            )));
        }
        return Ok(Outcome::Refused(why));
    }
    let detail = match req.action {
        Action::Accept => {
            let Some(a) = &req.accept else {
                return Ok(Outcome::Refused(format!(
                    "accepting machine {m} needs its BMC (url, username, password)"
                )));
            };
            match super::discovery::accept(tx, m, a, &req.actor).await? {
                Ok(detail) => detail,
                Err(why) => return Ok(Outcome::Refused(why)),
            }
        }
        Action::Install | Action::Deprovision => {
            return Ok(Outcome::Refused(format!(
                "{} is asked through an installation request, not an action",
                req.action
            )));
        }
        Action::Service => {
            return Ok(Outcome::Refused(format!(
                "{} is asked through a servicing request (its baseline), not an action",
                req.action
            )));
        }
        Action::Retry => {
            let rows = tx
                .query(
                    "DELETE FROM work_backoff WHERE machine_id = $1 \
                       AND ($2::process IS NULL OR process = $2) AND until > now() \
                     RETURNING process",
                    &[&m, &req.process],
                )
                .await?;
            if rows.is_empty() {
                return Ok(Outcome::Refused(match req.process {
                    Some(p) => format!("machine {m} is not backed off for {p}"),
                    None => format!("machine {m} is not backed off"),
                }));
            }
            let mut cleared: Vec<String> = rows
                .iter()
                .map(|r| r.get::<_, Process>(0).to_string())
                .collect();
            cleared.sort();
            format!("cleared the backoff of {}", cleared.join(", "))
        }
        Action::Retakeover => {
            if let Some(p) = working {
                return Ok(Outcome::Refused(format!(
                    "machine {m} is leased for {p}; take it over again once that work ends"
                )));
            }
            let n = tx
                .execute(
                    "WITH h AS (DELETE FROM machine_agent_heartbeat WHERE machine_id = $1) \
                     DELETE FROM machine_agent_started WHERE machine_id = $1",
                    &[&m],
                )
                .await?;
            let mut detail = if n == 0 {
                "no agent was recorded; the Initializer takes it over when due".to_string()
            } else {
                "dropped its agent; the Initializer takes it over again".to_string()
            };
            if req.forget_host_key {
                let k = tx
                    .execute(
                        "DELETE FROM machine_ssh_host_key WHERE machine_id = $1",
                        &[&m],
                    )
                    .await?;
                detail.push_str(if k == 0 {
                    "; no host key was recorded"
                } else {
                    "; forgot its SSH host key"
                });
            }
            if held {
                detail.push_str(" (after it is released: it is held)");
            }
            detail
        }
        Action::Reboot => {
            if held {
                return Ok(Outcome::Refused(format!(
                    "machine {m} is held; release it before rebooting it"
                )));
            }
            if reboot_requested {
                return Ok(Outcome::Refused(format!(
                    "a reboot of machine {m} is already requested"
                )));
            }
            tx.execute(
                "INSERT INTO machine_reboot_request (machine_id, requested_at, requested_by, reason) \
                 VALUES ($1, now(), $2, $3)",
                &[&m, &req.actor, &req.reason],
            )
            .await?;
            match working {
                Some(p) => format!("requested; the Recoverer reboots it once the {p} work ends"),
                None => "requested; the Recoverer reboots it on its next lease".into(),
            }
        }
        Action::Hold => {
            if held {
                let by = holder(tx, m).await?;
                return Ok(Outcome::Refused(format!(
                    "machine {m} is already held {by}"
                )));
            }
            tx.execute(
                "INSERT INTO machine_hold (machine_id, held_at, held_by, reason) \
                 VALUES ($1, now(), $2, $3)",
                &[&m, &req.actor, &req.reason],
            )
            .await?;
            match working {
                Some(p) => format!("held; the {p} work running now ends first"),
                None => "held; no control loop takes it until it is released".into(),
            }
        }
        Action::Inspect => {
            if held {
                return Ok(Outcome::Refused(format!(
                    "machine {m} is held; release it before inspecting it"
                )));
            }
            if !bmc_boot {
                return Ok(Outcome::Refused(format!(
                    "machine {m} is not booted through a BMC: its inventory entry needs a bmc and boot = \"virtual-media\""
                )));
            }
            if boot_request.as_deref() == Some("inspect") {
                return Ok(Outcome::Refused(format!(
                    "an inspection of machine {m} is already requested"
                )));
            }
            super::bmc_boot::request(
                tx,
                m,
                super::bmc_boot::BootCause::Inspect,
                &req.actor,
                req.reason.as_deref(),
                true,
            )
            .await?;
            // Asked by an operator: now, not after a backoff.
            let cleared = tx
                .execute(
                    "DELETE FROM work_backoff WHERE machine_id = $1 \
                       AND process = 'ShepherdAgentStart' AND until > now()",
                    &[&m],
                )
                .await?;
            let mut detail = match working {
                Some(p) => format!(
                    "requested; the Enroller boots it into the agent through its BMC once the {p} work ends"
                ),
                None => "requested; the Enroller boots it into the agent through its BMC".into(),
            };
            if let Some(c) = boot_request {
                detail.push_str(&format!(" (it replaces the boot asked for {c})"));
            }
            if cleared > 0 {
                detail.push_str("; cleared its ShepherdAgentStart backoff");
            }
            detail
        }
        Action::AcceptHardware => match super::hardware::accept(tx, m, &req.actor).await? {
            Some(accepted) => format!("accepted: {accepted}; installations may go ahead"),
            None => {
                return Ok(Outcome::Refused(format!(
                    "machine {m}: nothing to accept: its BMC and its agent's hardware report do not disagree"
                )));
            }
        },
        Action::Release => {
            if !held {
                return Ok(Outcome::Refused(format!("machine {m} is not held")));
            }
            tx.execute("DELETE FROM machine_hold WHERE machine_id = $1", &[&m])
                .await?;
            "released; the control loops take it again".into()
        }
    };
    let r = tx
        .query_one(
            AUDIT_INSERT,
            &[
                &req.id,
                &Some(m),
                &req.action.as_str(),
                &req.actor,
                &req.reason,
                &detail,
            ],
        )
        .await?;
    Ok(Outcome::Done(audit_from(&r)))
}

/// A machine's audit rows, oldest first.
pub async fn audit(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Vec<Audit>, BmdbError> {
    Ok(tx
        .query(AUDIT_OF_MACHINE, &[&machine_id])
        .await?
        .iter()
        .map(audit_from)
        .collect())
}

/// A machine's hold: by whom, since when, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub by: String,
    pub since: SystemTime,
    pub reason: Option<String>,
}

pub async fn hold(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Option<Hold>, BmdbError> {
    Ok(tx
        .query_opt(
            "SELECT held_by, held_at, reason FROM machine_hold WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?
        .map(|r| Hold {
            by: r.get(0),
            since: r.get(1),
            reason: r.get(2),
        }))
}

/// Whether a reboot is requested and not yet done: (by, when).
pub async fn reboot_request(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
) -> Result<Option<(String, SystemTime)>, BmdbError> {
    Ok(tx
        .query_opt(
            "SELECT requested_by, requested_at FROM machine_reboot_request WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?
        .map(|r| (r.get(0), r.get(1))))
}

/// The power action asked with a machine's reboot request (`on`, `off`,
/// `cycle`), None for a plain reboot or no request.
pub async fn requested_power(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
) -> Result<Option<String>, BmdbError> {
    Ok(tx
        .query_opt(
            "SELECT power FROM machine_reboot_request WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?
        .map(|r| r.get::<_, String>(0))
        .filter(|p| p != "reboot"))
}

/// A machine's reboot request answered: dropped.
pub async fn drop_reboot_request(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<(), BmdbError> {
    tx.execute(
        "DELETE FROM machine_reboot_request WHERE machine_id = $1",
        &[&machine_id],
    )
    .await?;
    Ok(())
}

/// Every held machine (the Provisioner and the Updater leave them alone).
pub async fn held_ids(tx: &mut Tx<'_>) -> Result<std::collections::HashSet<Uuid>, BmdbError> {
    Ok(tx
        .query("SELECT machine_id FROM machine_hold", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// The fleet-wide audit row with this ID, if any.
pub async fn fleet_audit(tx: &mut Tx<'_>, id: Uuid) -> Result<Option<Audit>, BmdbError> {
    Ok(tx
        .query_opt(AUDIT_BY_ID, &[&id])
        .await?
        .as_ref()
        .map(audit_from)
        .filter(|a| a.machine_id.is_none()))
}

/// Appends a fleet-wide audit row.
pub async fn record_fleet_action(
    tx: &mut Tx<'_>,
    id: Uuid,
    action: &str,
    actor: &str,
    reason: Option<&str>,
    detail: &str,
) -> Result<Audit, BmdbError> {
    if reason.is_some_and(|r| r.len() > MAX_REASON) {
        return Err(BmdbError::Invalid(format!(
            "the reason is longer than {MAX_REASON} bytes"
        )));
    }
    let none: Option<Uuid> = None;
    let r = tx
        .query_one(
            AUDIT_INSERT,
            &[&id, &none, &action, &actor, &reason, &detail],
        )
        .await?;
    Ok(audit_from(&r))
}

/// The last fleet-wide actions, newest first.
pub async fn fleet_actions(tx: &mut Tx<'_>, limit: i64) -> Result<Vec<Audit>, BmdbError> {
    const SQL: &str = concat!(
        "SELECT ",
        audit_columns!(),
        " FROM operator_action WHERE machine_id IS NULL ORDER BY \"timestamp\" DESC LIMIT $1"
    );
    Ok(tx
        .query(SQL, &[&limit])
        .await?
        .iter()
        .map(audit_from)
        .collect())
}
