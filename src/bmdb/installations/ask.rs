//! Asking a machine's agent for an installation or a deprovisioning: the
//! next generation of its request, in one transaction that locks the
//! machine, in steps (`ask_for`).

use std::time::SystemTime;

use prost::Message as _;
use shepherd_proto::api::{
    DiskErasure, ImageInstallation, OsInstallationRequest, os_installation_request,
};
use uuid::Uuid;

use super::Kind;
use super::request::{erase_mode_name, fill_first_boot, first_boot_summary};
use crate::bmdb::actions::{AUDIT_BY_ID, AUDIT_INSERT, Audit, audit_from};
use crate::bmdb::{BmdbError, Tx};

/// How asking for an installation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// The request stands at this generation; the audit row.
    Done {
        generation: i32,
        audit: Audit,
    },
    /// Not asked, and why (nothing changed).
    Refused(String),
    NotFound,
}

/// Who asks, and what to call the request.
#[derive(Debug, Clone)]
pub struct Asker<'a> {
    /// An admin token's name, `cli`, or a rollout's description.
    pub actor: &'a str,
    /// The audit row's ID: a request retried after a lost answer finds its
    /// own row instead of asking twice.
    pub action_id: Uuid,
    pub rollout_id: Option<Uuid>,
    pub reason: Option<&'a str>,
}

const LOCK_MACHINE: &str = "SELECT 1 FROM machines WHERE machine_id = $1 FOR UPDATE";
const CURRENT: &str = "SELECT rq.generation, rp.generation, i.requested_by, i.requested_at, \
            EXISTS (SELECT 1 FROM machine_hold h WHERE h.machine_id = $1), i.kind \
     FROM (SELECT $1::uuid AS machine_id) x \
     LEFT JOIN machine_os_installation_request rq ON rq.machine_id = x.machine_id \
     LEFT JOIN machine_os_installation_report rp ON rp.machine_id = x.machine_id \
     LEFT JOIN machine_installation i ON i.machine_id = x.machine_id";
const PUT_REQUEST: &str = "INSERT INTO machine_os_installation_request \
         (machine_id, generation, os_installation_request_raw) VALUES ($1, $2, $3) \
     ON CONFLICT (machine_id) DO UPDATE SET generation = EXCLUDED.generation, \
         os_installation_request_raw = EXCLUDED.os_installation_request_raw";
const PUT_INSTALLATION: &str = "INSERT INTO machine_installation \
         (machine_id, generation, image_url, image_digest, requested_at, requested_by, rollout_id, \
          reboot_by_bmc, kind, erase_mode, first_boot) \
     VALUES ($1, $2, $3, $4, now(), $5, $6, $7, $8, $9, $10) \
     ON CONFLICT (machine_id) DO UPDATE SET generation = EXCLUDED.generation, \
         image_url = EXCLUDED.image_url, image_digest = EXCLUDED.image_digest, \
         requested_at = EXCLUDED.requested_at, requested_by = EXCLUDED.requested_by, \
         rollout_id = EXCLUDED.rollout_id, reboot_by_bmc = EXCLUDED.reboot_by_bmc, \
         kind = EXCLUDED.kind, erase_mode = EXCLUDED.erase_mode, first_boot = EXCLUDED.first_boot";
const CLEAR_PROGRESS: &str = "DELETE FROM machine_installation_progress WHERE machine_id = $1";
const HISTORY_REQUESTED: &str = "INSERT INTO installation_history \
         (machine_id, generation, event, \"timestamp\", detail) VALUES ($1, $2, $4, now(), $3)";
/// A machine taken over by SSH whose last answered request installed a
/// system runs no agent (it rebooted into that system): it is taken over
/// again (the installed system has host keys of its own). One whose agent
/// still heartbeats well after the report (an installation without a
/// reboot) keeps it, as does one whose last request was an erasure or
/// failed (the agent stays for both).
const RETAKE_DUE: &str = "SELECT EXISTS (SELECT 1 FROM machine_agent_started WHERE machine_id = $1) \
       AND EXISTS (SELECT 1 FROM machine_installation i \
                     JOIN machine_os_installation_report r \
                       ON r.machine_id = i.machine_id AND r.generation = i.generation \
                    WHERE i.machine_id = $1 AND i.kind = 'install' \
                      AND r.os_installation_result = 'Success') \
       AND NOT EXISTS (SELECT 1 FROM machine_agent_heartbeat hb \
            WHERE hb.machine_id = $1 AND hb.agent_heartbeat_at > now() - interval '1 minute' \
              AND hb.agent_heartbeat_at > (SELECT max(\"timestamp\") + interval '20 seconds' \
                    FROM installation_history WHERE machine_id = $1 AND event = 'installed'))";
const RETAKE_OVER: &str = "WITH h AS (DELETE FROM machine_agent_heartbeat WHERE machine_id = $1), \
          k AS (DELETE FROM machine_ssh_host_key WHERE machine_id = $1) \
     DELETE FROM machine_agent_started WHERE machine_id = $1";

/// What is asked of the machine's agent.
#[derive(Debug, Clone, Copy)]
pub enum Work<'a> {
    Install(&'a ImageInstallation),
    Erase(&'a DiskErasure),
}

/// Asks the machine's agent to install `image`, as the next generation.
/// Refused while an installation is pending (asked, not answered) or the
/// machine is held.
pub async fn ask(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    image: &ImageInstallation,
    asker: &Asker<'_>,
) -> Result<Asked, BmdbError> {
    ask_for(tx, machine_id, Work::Install(image), asker).await
}

/// Asks the machine's agent to erase its disks (deprovisioning), as the
/// next generation; refused as [`ask`] is, and where the life cycle's
/// table does not allow it.
pub async fn deprovision(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    erasure: &DiskErasure,
    asker: &Asker<'_>,
) -> Result<Asked, BmdbError> {
    ask_for(tx, machine_id, Work::Erase(erasure), asker).await
}

/// Asks the machine's agent for `work`: [`ask`] or [`deprovision`]. In
/// steps: a request asked before under its ID answers as then; the
/// machine is locked and refused where it must be; the request is built;
/// an installed machine is reached (booted into the agent through its
/// BMC, or taken over again); then the request, the installation, the
/// history and the audit are written.
pub async fn ask_for(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    work: Work<'_>,
    asker: &Asker<'_>,
) -> Result<Asked, BmdbError> {
    let op = work.operation();
    if let Some(before) = asked_before(tx, machine_id, op, asker).await? {
        return Ok(before);
    }
    let current = match standing(tx, machine_id, op).await? {
        Standing::Askable(c) => c,
        Standing::Refused(why) => return Ok(Asked::Refused(why)),
        Standing::NotFound => return Ok(Asked::NotFound),
    };
    let generation = current
        .requested
        .max(current.reported)
        .unwrap_or(0)
        .saturating_add(1);
    // A machine booted through its BMC is restarted from its disk by its
    // BMC once installed, not by its agent: BMCs that apply the media's
    // ejection only at a power cycle would boot the agent again.
    let bmc_boot: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM machine_bmc_boot WHERE machine_id = $1)",
            &[&machine_id],
        )
        .await?
        .get(0);
    let request = build(tx, machine_id, work, generation, bmc_boot).await?;
    let installed = current.reported.is_some() && current.requested == current.reported;
    let reached = if installed {
        reach_installed(tx, machine_id, work, asker, bmc_boot).await?
    } else {
        Reached::default()
    };
    record(tx, machine_id, work, asker, generation, &request, reached).await
}

impl Work<'_> {
    /// The life cycle's operation this work is.
    fn operation(self) -> crate::bmdb::lifecycle::Operation {
        match self {
            Work::Install(_) => crate::bmdb::lifecycle::Operation::Install,
            Work::Erase(_) => crate::bmdb::lifecycle::Operation::Deprovision,
        }
    }

    /// What it is, for the history and the audit: the image's URL, or the
    /// erasure.
    fn describe(self) -> String {
        match self {
            Work::Install(image) => image.url.clone(),
            Work::Erase(e) => format!(
                "erase ({}, {})",
                erase_mode_name(e.mode),
                match &e.disk {
                    Some(h) if *h != Default::default() => "the disks its hints choose",
                    _ => "every disk",
                }
            ),
        }
    }
}

/// The answer given before to a request of this ID, if it was asked
/// (refused when the ID was another action's or machine's).
async fn asked_before(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    op: crate::bmdb::lifecycle::Operation,
    asker: &Asker<'_>,
) -> Result<Option<Asked>, BmdbError> {
    let Some(r) = tx.query_opt(AUDIT_BY_ID, &[&asker.action_id]).await? else {
        return Ok(None);
    };
    let audit = audit_from(&r);
    if audit.machine_id != Some(machine_id) || audit.action != op.as_str() {
        return Ok(Some(Asked::Refused(format!(
            "request {} was another action's ({} {})",
            asker.action_id,
            audit.action,
            audit
                .machine_id
                .map(|m| m.to_string())
                .unwrap_or_else(|| "fleet".into())
        ))));
    }
    // The detail says "generation N: URL".
    let generation = audit
        .detail
        .strip_prefix("generation ")
        .and_then(|d| d.split(':').next())
        .and_then(|g| g.parse().ok())
        .unwrap_or(0);
    Ok(Some(Asked::Done { generation, audit }))
}

/// The generations asked and answered so far.
struct Current {
    requested: Option<i32>,
    reported: Option<i32>,
}

/// Whether the machine may be asked.
enum Standing {
    Askable(Current),
    Refused(String),
    NotFound,
}

/// Locks the machine and says whether `op` may be asked of it: not held,
/// allowed by the life cycle's table, its previous request answered, its
/// BMC read and agreeing with its agent's hardware report.
async fn standing(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    op: crate::bmdb::lifecycle::Operation,
) -> Result<Standing, BmdbError> {
    if tx.query_opt(LOCK_MACHINE, &[&machine_id]).await?.is_none() {
        return Ok(Standing::NotFound);
    }
    let r = tx.query_one(CURRENT, &[&machine_id]).await?;
    let (requested, reported): (Option<i32>, Option<i32>) = (r.get(0), r.get(1));
    let (by, at): (Option<String>, Option<SystemTime>) = (r.get(2), r.get(3));
    let pending = r.get::<_, Option<Kind>>(5).unwrap_or(Kind::Install).doing();
    if r.get::<_, bool>(4) {
        return Ok(Standing::Refused(format!(
            "machine {machine_id} is held; release it first"
        )));
    }
    if let Some(state) = crate::bmdb::lifecycle::state_of(tx, machine_id).await?
        && let Some(why) = crate::bmdb::lifecycle::refusal(machine_id, state, op)
    {
        return Ok(Standing::Refused(why));
    }
    if let Some(g) = requested.filter(|g| Some(*g) != reported) {
        return Ok(Standing::Refused(format!(
            "machine {machine_id} is {pending} generation {g}{}; its agent has not reported yet",
            match (by, at) {
                (Some(by), Some(at)) => format!(
                    " (asked by {by} at {})",
                    humantime::format_rfc3339_seconds(at)
                ),
                _ => String::new(),
            }
        )));
    }
    if crate::bmdb::hardware::bmc_unread(tx, machine_id).await? {
        return Ok(Standing::Refused(format!(
            "machine {machine_id}: its BMC has not been read yet, so it cannot be checked against \
             its agent's report (the Updater reads BMCs every updater.interval): ask again once \
             its BMC's facts show on its page"
        )));
    }
    if let Some(c) = crate::bmdb::hardware::check(tx, machine_id).await?
        && c.blocks()
    {
        return Ok(Standing::Refused(format!(
            "machine {machine_id}: its BMC and its agent's hardware report disagree ({}): \
                 is the right machine behind that BMC? Accept the difference first \
                 (accept-hardware) if it is",
            c.differences.join("; ")
        )));
    }
    Ok(Standing::Askable(Current {
        requested,
        reported,
    }))
}

/// The request as the agent gets it, and what the installation row says.
struct Built {
    raw: Vec<u8>,
    reboot_by_bmc: bool,
    url: String,
    digest: String,
    erase_mode: Option<&'static str>,
    first_boot: Option<String>,
}

/// Builds generation `generation` of the request for `work`: an image's
/// first-boot data filled for this machine, its reboot left to the BMC
/// for a machine booted through it.
async fn build(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    work: Work<'_>,
    generation: i32,
    bmc_boot: bool,
) -> Result<Built, BmdbError> {
    Ok(match work {
        Work::Install(image) => {
            let reboot_by_bmc = bmc_boot && image.reboot;
            let mut asked = image.clone();
            if asked.first_boot.is_some() {
                let provider_id: Option<String> = tx
                    .query_opt(
                        "SELECT provider_id FROM machine_provided WHERE machine_id = $1",
                        &[&machine_id],
                    )
                    .await?
                    .map(|r| r.get(0));
                fill_first_boot(&mut asked, machine_id, provider_id.as_deref(), generation);
            }
            if reboot_by_bmc {
                asked.reboot = false;
            }
            let first_boot = first_boot_summary(&asked);
            Built {
                raw: OsInstallationRequest {
                    generation: generation.into(),
                    r#type: Some(os_installation_request::Type::Image(asked)),
                }
                .encode_to_vec(),
                reboot_by_bmc,
                url: image.url.clone(),
                digest: image.digest.clone(),
                erase_mode: None,
                first_boot,
            }
        }
        Work::Erase(e) => Built {
            raw: OsInstallationRequest {
                generation: generation.into(),
                r#type: Some(os_installation_request::Type::Erasure(e.clone())),
            }
            .encode_to_vec(),
            reboot_by_bmc: false,
            url: String::new(),
            digest: String::new(),
            erase_mode: Some(erase_mode_name(e.mode)),
            first_boot: None,
        },
    })
}

/// How an installed machine (which runs no agent) is reached.
#[derive(Default, Clone, Copy)]
struct Reached {
    /// Its BMC boots it into the live agent first.
    boot_first: bool,
    /// It is taken over again over SSH.
    retaken: bool,
}

/// Reaches an installed machine, unless a boot since brought the live
/// agent back: one booted through its BMC is booted into the live agent
/// first, which then takes the request (asked before the request is
/// written, which makes any agent enrolled so far older than it); one
/// taken over by SSH is taken over again (its installed system must let
/// shepherd's SSH key in).
async fn reach_installed(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    work: Work<'_>,
    asker: &Asker<'_>,
    bmc_boot: bool,
) -> Result<Reached, BmdbError> {
    let cause = match work {
        Work::Install(_) => crate::bmdb::bmc_boot::BootCause::Install,
        Work::Erase(_) => crate::bmdb::bmc_boot::BootCause::Deprovision,
    };
    let boot_first = crate::bmdb::bmc_boot::request_if(
        tx,
        machine_id,
        crate::bmdb::bmc_boot::Only::InstalledByBmc,
        cause,
        asker.actor,
        None,
        false,
    )
    .await?;
    let retaken = !bmc_boot
        && tx
            .query_one(RETAKE_DUE, &[&machine_id])
            .await?
            .get::<_, bool>(0)
        && tx.execute(RETAKE_OVER, &[&machine_id]).await? > 0;
    Ok(Reached {
        boot_first,
        retaken,
    })
}

/// Writes the request, the installation, the history and the audit.
async fn record(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    work: Work<'_>,
    asker: &Asker<'_>,
    generation: i32,
    b: &Built,
    reached: Reached,
) -> Result<Asked, BmdbError> {
    let (kind, event) = match work {
        Work::Install(_) => (Kind::Install, "requested"),
        Work::Erase(_) => (Kind::Erase, "erase-requested"),
    };
    tx.execute(
        PUT_INSTALLATION,
        &[
            &machine_id,
            &generation,
            &b.url,
            &b.digest,
            &asker.actor,
            &asker.rollout_id,
            &b.reboot_by_bmc,
            &kind.as_str(),
            &b.erase_mode,
            &b.first_boot,
        ],
    )
    .await?;
    tx.execute(PUT_REQUEST, &[&machine_id, &generation, &b.raw])
        .await?;
    tx.execute(CLEAR_PROGRESS, &[&machine_id]).await?;
    let what = work.describe();
    let mut detail = format!("generation {generation}: {what}");
    if let Some(f) = &b.first_boot {
        detail.push_str(&format!("; first boot: {f}"));
    }
    if reached.boot_first {
        detail.push_str("; its BMC boots it into the agent first");
    }
    if reached.retaken {
        detail.push_str(
            "; its agent left with the installed system: the Initializer takes it over again over SSH \
             (its recorded SSH host key forgotten: the installed system has its own)",
        );
    }
    if b.reboot_by_bmc {
        detail.push_str("; its BMC restarts it from its disk once installed");
    }
    tx.execute(
        HISTORY_REQUESTED,
        &[
            &machine_id,
            &generation,
            &format!("{what} (by {})", asker.actor),
            &event,
        ],
    )
    .await?;
    let row = tx
        .query_one(
            AUDIT_INSERT,
            &[
                &asker.action_id,
                &machine_id,
                &work.operation().as_str(),
                &asker.actor,
                &asker.reason,
                &detail,
            ],
        )
        .await?;
    Ok(Asked::Done {
        generation,
        audit: audit_from(&row),
    })
}

/// Accepted machines whose BMC has been read since (`discovery`): their
/// disks' erasure asked, as whoever accepted them (a machine that
/// enlisted itself may hold anyone's data, and `available` promises none),
/// once its BMC agrees with its agent's report. Each machine, and the
/// generation asked or why it was refused (the refusal kept, the erasure
/// still pending); `new`: the outcome differs from the last round's.
pub async fn erase_accepted(tx: &mut Tx<'_>) -> Result<Vec<ErasureOfAccepted>, BmdbError> {
    use crate::bmdb::discovery;
    let mut out = Vec::new();
    for (m, actor) in discovery::erasures_due(tx).await? {
        // No longer `discovered`: the life cycle allows the erasure.
        discovery::erasure_asking(tx, m).await?;
        let asker = Asker {
            actor: &actor,
            action_id: Uuid::new_v4(),
            rollout_id: None,
            reason: Some("accepted: its disks erased before it is available"),
        };
        let erasure = DiskErasure::default();
        let asked = match ask_for(tx, m, Work::Erase(&erasure), &asker).await? {
            Asked::Done { generation, .. } => Ok(generation),
            Asked::Refused(why) => Err(why),
            Asked::NotFound => Err(format!("machine {m} is not in the BMDB")),
        };
        let new = discovery::erasure_asked(tx, m, asked.as_ref().err().map(String::as_str)).await?;
        out.push(ErasureOfAccepted {
            machine_id: m,
            asked,
            new,
        });
    }
    Ok(out)
}

/// One accepted machine's erasure, asked or refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErasureOfAccepted {
    pub machine_id: Uuid,
    pub asked: Result<i32, String>,
    pub new: bool,
}
