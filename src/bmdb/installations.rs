//! Operating system installations as the BMDB keeps them: an operator's
//! request becomes the next generation of the machine's
//! `machine_os_installation_request` (CONTRACTS.md §2, §4a), with who
//! asked and for which image beside it (`machine_installation`); agents'
//! progress and reports arrive through the callback; the history says
//! requested, installed, failed.

use std::time::SystemTime;

use prost::Message as _;
use shepherd_proto::api::{
    DiskErasure, ImageInstallation, InstallationProgress, OsInstallationReport,
    OsInstallationRequest, image_installation, os_installation_report, os_installation_request,
};
use uuid::Uuid;

use super::actions::{AUDIT_BY_ID, AUDIT_INSERT, Audit, audit_from};
use super::{BmdbError, InstallationResult, Tx};

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

pub use shepherd_proto::names::{check_erasure, erase_mode_name_of as erase_mode_name};

/// The first-boot data of `image` as shown: the volume and each file's
/// name, size and SHA-256 (never its bytes: user-data holds secrets).
pub fn first_boot_summary(image: &ImageInstallation) -> Option<String> {
    use sha2::Digest as _;
    let (volume, files) = match image.first_boot.as_ref()? {
        image_installation::FirstBoot::Nocloud(f) => ("nocloud", f),
        image_installation::FirstBoot::ConfigDrive(f) => ("config-drive", f),
    };
    let mut names: Vec<&String> = files.files.keys().collect();
    names.sort();
    let each: Vec<String> = names
        .iter()
        .map(|n| {
            let b = &files.files[*n];
            format!(
                "{n} {} B sha256:{}",
                b.len(),
                hex::encode(sha2::Sha256::digest(b))
            )
        })
        .collect();
    let on = if files.disk.is_some() {
        " (on another disk)"
    } else {
        ""
    };
    Some(format!("{volume}{on}: {}", each.join(", ")))
}

/// Checks what shepherd can check of an image request before any agent
/// sees it; the error names the field.
pub fn check_image(image: &ImageInstallation) -> Result<(), String> {
    let url = image.url.trim();
    if url.is_empty() {
        return Err("image.url: required".into());
    }
    match url.parse::<http::Uri>() {
        Ok(u) if matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() => {}
        _ => {
            return Err(format!(
                "image.url: {url:?} is not an http:// or https:// URL"
            ));
        }
    }
    shepherd_proto::digest::parse_digest(&image.digest)
        .map_err(|e| format!("image.digest: {e}"))?;
    if image.size_bytes.is_some_and(|s| s < 0) {
        return Err("image.size_bytes: negative".into());
    }
    if image.deadline_seconds < 0 {
        return Err("image.deadline_seconds: negative".into());
    }
    if let Some(fb) = &image.first_boot {
        let files = match fb {
            image_installation::FirstBoot::Nocloud(f)
            | image_installation::FirstBoot::ConfigDrive(f) => f,
        };
        if files.files.is_empty() {
            return Err("image.first_boot: no files".into());
        }
        let mut total = 0;
        for (name, content) in &files.files {
            check_first_boot_path(name).map_err(|e| format!("image.first_boot: {e}"))?;
            total += name.len() + content.len();
        }
        if total > MAX_FIRST_BOOT {
            return Err(format!(
                "image.first_boot: {total} bytes; at most {MAX_FIRST_BOOT}"
            ));
        }
    }
    if let Some(h) = &image.disk {
        shepherd_proto::names::check_disk_hints("image.disk", h)?;
    }
    Ok(())
}

/// The most first-boot data an installation carries, all files together
/// (the volume the agent writes is 16 MiB at least).
pub const MAX_FIRST_BOOT: usize = 1 << 20;

/// A first-boot file's path inside its volume (shared with the agent).
pub use shepherd_proto::first_boot::check_path as check_first_boot_path;

/// The first-boot data as this machine's agent gets it: the placeholders
/// `{{machine_id}}`, `{{provider_id}}`, `{{generation}}` and
/// `{{instance_id}}` filled in the meta files (NoCloud's `meta-data` and
/// `network-config`; the config drive's `meta_data.json` and
/// `network_data.json`; never in user-data, which may be a template of its
/// own), and the instance ID set to `<machine>-g<generation>`: it changes
/// with every installation, so cloud-init runs again on each.
pub fn fill_first_boot(
    image: &mut ImageInstallation,
    machine_id: Uuid,
    provider_id: Option<&str>,
    generation: i32,
) {
    let instance_id = format!("{machine_id}-g{generation}");
    let fill = |b: &[u8]| -> Vec<u8> {
        String::from_utf8_lossy(b)
            .replace("{{machine_id}}", &machine_id.to_string())
            .replace("{{provider_id}}", provider_id.unwrap_or(""))
            .replace("{{generation}}", &generation.to_string())
            .replace("{{instance_id}}", &instance_id)
            .into_bytes()
    };
    match image.first_boot.as_mut() {
        Some(image_installation::FirstBoot::Nocloud(f)) => {
            for name in ["meta-data", "network-config"] {
                if let Some(b) = f.files.get_mut(name) {
                    *b = fill(b);
                }
            }
            let meta = f.files.entry("meta-data".into()).or_default();
            // JSON is YAML too: a JSON object gets the key instead of a line.
            if let Ok(serde_json::Value::Object(mut o)) = serde_json::from_slice(meta) {
                o.insert("instance-id".into(), instance_id.clone().into());
                *meta = serde_json::to_vec_pretty(&o).unwrap_or_default();
                return;
            }
            let text = String::from_utf8_lossy(meta);
            let mut lines: Vec<&str> = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("instance-id:"))
                .collect();
            let id = format!("instance-id: {instance_id}");
            lines.insert(0, &id);
            *meta = (lines.join("\n") + "\n").into_bytes();
        }
        Some(image_installation::FirstBoot::ConfigDrive(f)) => {
            for name in [
                "openstack/latest/meta_data.json",
                "openstack/latest/network_data.json",
            ] {
                if let Some(b) = f.files.get_mut(name) {
                    *b = fill(b);
                }
            }
            let meta = f
                .files
                .entry("openstack/latest/meta_data.json".into())
                .or_insert_with(|| b"{}".to_vec());
            let mut v: serde_json::Value =
                serde_json::from_slice(meta).unwrap_or_else(|_| serde_json::json!({}));
            if let Some(o) = v.as_object_mut() {
                o.insert("uuid".into(), instance_id.clone().into());
            }
            *meta = serde_json::to_vec_pretty(&v).unwrap_or_default();
        }
        None => {}
    }
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
    fn operation(self) -> super::lifecycle::Operation {
        match self {
            Work::Install(_) => super::lifecycle::Operation::Install,
            Work::Erase(_) => super::lifecycle::Operation::Deprovision,
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
    op: super::lifecycle::Operation,
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
    op: super::lifecycle::Operation,
) -> Result<Standing, BmdbError> {
    if tx.query_opt(LOCK_MACHINE, &[&machine_id]).await?.is_none() {
        return Ok(Standing::NotFound);
    }
    let r = tx.query_one(CURRENT, &[&machine_id]).await?;
    let (requested, reported): (Option<i32>, Option<i32>) = (r.get(0), r.get(1));
    let (by, at): (Option<String>, Option<SystemTime>) = (r.get(2), r.get(3));
    let pending = match r.get::<_, Option<String>>(5).as_deref() {
        Some("erase") => "erasing",
        _ => "installing",
    };
    if r.get::<_, bool>(4) {
        return Ok(Standing::Refused(format!(
            "machine {machine_id} is held; release it first"
        )));
    }
    if let Some(state) = super::lifecycle::state_of(tx, machine_id).await? {
        if let Some(why) = super::lifecycle::refusal(machine_id, state, op) {
            return Ok(Standing::Refused(why));
        }
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
    if super::hardware::bmc_unread(tx, machine_id).await? {
        return Ok(Standing::Refused(format!(
            "machine {machine_id}: its BMC has not been read yet, so it cannot be checked against \
             its agent's report (the Updater reads BMCs every updater.interval): ask again once \
             its BMC's facts show on its page"
        )));
    }
    if let Some(c) = super::hardware::check(tx, machine_id).await? {
        if c.blocks() {
            return Ok(Standing::Refused(format!(
                "machine {machine_id}: its BMC and its agent's hardware report disagree ({}): \
                 is the right machine behind that BMC? Accept the difference first \
                 (accept-hardware) if it is",
                c.differences.join("; ")
            )));
        }
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
        Work::Install(_) => super::bmc_boot::BootCause::Install,
        Work::Erase(_) => super::bmc_boot::BootCause::Deprovision,
    };
    let boot_first = super::bmc_boot::request_if(
        tx,
        machine_id,
        super::bmc_boot::Only::InstalledByBmc,
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
        Work::Install(_) => ("install", "requested"),
        Work::Erase(_) => ("erase", "erase-requested"),
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
            &kind,
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

/// A machine's installation as the pages and the API show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Installation {
    pub generation: i32,
    pub image_url: String,
    pub image_digest: String,
    pub requested_by: String,
    pub requested_at: SystemTime,
    pub rollout_id: Option<Uuid>,
    /// `installing`, `installed` or `install-failed`; for an erasure
    /// `cleaning`, `available` or `clean-failed`.
    pub state: String,
    /// `install` or `erase`.
    pub kind: String,
    /// An erasure's mode.
    pub erase_mode: Option<String>,
    /// The first-boot data, as digests ([`first_boot_summary`]).
    pub first_boot: Option<String>,
    /// The agent's latest progress, and when it came.
    pub progress: Option<(InstallationProgress, SystemTime)>,
    /// The report of this generation: its result and, for an error, what
    /// the agent said.
    pub result: Option<(InstallationResult, Option<String>)>,
    pub history: Vec<HistoryEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    pub generation: i32,
    pub event: String,
    pub timestamp: SystemTime,
    pub detail: Option<String>,
}

const VIEW: &str = "SELECT i.generation, i.image_url, i.image_digest, i.requested_by, i.requested_at, \
            i.rollout_id, s.installation, p.progress_raw, p.progress_at, p.generation, \
            rp.generation, rp.os_installation_result, rp.os_installation_report_raw, \
            i.kind, i.erase_mode, i.first_boot \
     FROM machine_installation i \
     JOIN machine_summary s ON s.machine_id = i.machine_id \
     LEFT JOIN machine_installation_progress p ON p.machine_id = i.machine_id \
     LEFT JOIN machine_os_installation_report rp ON rp.machine_id = i.machine_id \
     WHERE i.machine_id = $1";
const HISTORY: &str = "SELECT generation, event, \"timestamp\", detail FROM installation_history \
     WHERE machine_id = $1 ORDER BY \"timestamp\", generation LIMIT 200";

/// The error an `OSInstallationReport`'s bytes carry, if they decode to
/// one.
pub fn report_error(raw: &[u8]) -> Option<String> {
    match OsInstallationReport::decode(raw).ok()?.result? {
        os_installation_report::Result::Error(e) => Some(e.error),
        os_installation_report::Result::Success(_) => None,
    }
}

/// The installation shepherd asked of `machine_id`, if any.
pub async fn installation(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
) -> Result<Option<Installation>, BmdbError> {
    let Some(r) = tx.query_opt(VIEW, &[&machine_id]).await? else {
        return Ok(None);
    };
    let generation: i32 = r.get(0);
    let progress = match (
        r.get::<_, Option<Vec<u8>>>(7),
        r.get::<_, Option<SystemTime>>(8),
        r.get::<_, Option<i64>>(9),
    ) {
        (Some(raw), Some(at), Some(g)) if g == i64::from(generation) => {
            InstallationProgress::decode(raw.as_slice())
                .ok()
                .map(|p| (p, at))
        }
        _ => None,
    };
    let result = match (
        r.get::<_, Option<i32>>(10),
        r.get::<_, Option<InstallationResult>>(11),
        r.get::<_, Option<Vec<u8>>>(12),
    ) {
        (Some(g), Some(res), raw) if g == generation => {
            Some((res, raw.as_deref().and_then(report_error)))
        }
        _ => None,
    };
    let history = tx
        .query(HISTORY, &[&machine_id])
        .await?
        .iter()
        .map(|h| HistoryEntry {
            generation: h.get(0),
            event: h.get(1),
            timestamp: h.get(2),
            detail: h.get(3),
        })
        .collect();
    Ok(Some(Installation {
        generation,
        image_url: r.get(1),
        image_digest: r.get(2),
        requested_by: r.get(3),
        requested_at: r.get(4),
        rollout_id: r.get(5),
        state: r
            .get::<_, Option<String>>(6)
            .unwrap_or_else(|| "installing".into()),
        kind: r.get(13),
        erase_mode: r.get(14),
        first_boot: r.get(15),
        progress,
        result,
        history,
    }))
}

/// Whether an agent may download a served image (the image server's
/// gate): the agent is known by the key it proved in TLS, and its
/// machine's installation request, not yet answered, names the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownloadGrant {
    Allowed {
        machine_id: Uuid,
        generation: i32,
    },
    /// No machine's agent holds this key.
    UnknownAgent,
    /// The agent is known, but its machine was not asked to install this
    /// image (or its request was answered already).
    NotAsked {
        machine_id: Uuid,
    },
}

const DOWNLOADER: &str = "SELECT a.machine_id, i.generation, i.image_url, r.generation \
     FROM machine_agent_started a \
     LEFT JOIN machine_installation i USING (machine_id) \
     LEFT JOIN machine_os_installation_report r USING (machine_id) \
     WHERE a.agent_public_key = $1";

/// Whether the agent holding `key` may download the served image `name`
/// (see [`DownloadGrant`]): its machine's pending request's URL has the
/// path `/images/<name>`.
pub async fn download_grant(
    tx: &mut Tx<'_>,
    key: &[u8],
    name: &str,
) -> Result<DownloadGrant, BmdbError> {
    let rows = tx.query(DOWNLOADER, &[&key]).await?;
    let mut grant = DownloadGrant::UnknownAgent;
    for r in rows {
        let machine_id: Uuid = r.get(0);
        let asked: Option<i32> = r.get(1);
        let url: Option<String> = r.get(2);
        let answered: Option<i32> = r.get(3);
        let pending = asked.filter(|g| answered.is_none_or(|a| a < *g));
        let names = url.as_deref().is_some_and(|u| served_name(u) == Some(name));
        match pending {
            Some(generation) if names => {
                return Ok(DownloadGrant::Allowed {
                    machine_id,
                    generation,
                });
            }
            _ => grant = DownloadGrant::NotAsked { machine_id },
        }
    }
    Ok(grant)
}

/// The image name of a URL whose path is `/images/<name>` (how the image
/// server's catalog makes them), with no query.
pub fn served_name(url: &str) -> Option<&str> {
    let after_scheme = url.split_once("://")?.1;
    let path = &after_scheme[after_scheme.find('/')?..];
    let name = path.strip_prefix("/images/")?;
    (!name.is_empty() && !name.contains(['/', '?', '#'])).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::served_name;

    #[test]
    fn served_names_are_the_last_segment_of_an_images_path() {
        assert_eq!(
            served_name("https://10.0.2.100:7831/images/a.img"),
            Some("a.img")
        );
        assert_eq!(
            served_name("https://[::1]:7831/images/a+b.raw.zst"),
            Some("a+b.raw.zst")
        );
        for not in [
            "https://h/images/",
            "https://h/images/a/b.img",
            "https://h/other/a.img",
            "https://h/images/a.img?x=1",
            "https://h/x/images/a.img",
            "images/a.img",
            "https://h",
        ] {
            assert_eq!(served_name(not), None, "{not}");
        }
    }
}

#[cfg(test)]
mod first_boot_tests {
    use super::*;
    use shepherd_proto::api::FirstBootFiles;
    use shepherd_proto::api::image_installation::FirstBoot;

    fn with(fb: FirstBoot) -> ImageInstallation {
        ImageInstallation {
            first_boot: Some(fb),
            ..Default::default()
        }
    }

    fn files(list: &[(&str, &str)]) -> FirstBootFiles {
        FirstBootFiles {
            files: list
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
            disk: None,
        }
    }

    #[test]
    fn first_boot_templates_are_filled_per_machine_and_generation() {
        let m = Uuid::from_u128(7);
        let mut i = with(FirstBoot::Nocloud(files(&[
            (
                "meta-data",
                "instance-id: mine\nlocal-hostname: web-{{provider_id}}\n",
            ),
            ("user-data", "#cloud-config\n# {{provider_id}} stays\n"),
        ])));
        fill_first_boot(&mut i, m, Some("rack1-u12"), 3);
        let Some(FirstBoot::Nocloud(f)) = &i.first_boot else {
            panic!()
        };
        let meta = String::from_utf8(f.files["meta-data"].clone()).unwrap();
        assert_eq!(
            meta,
            format!("instance-id: {m}-g3\nlocal-hostname: web-rack1-u12\n")
        );
        assert_eq!(
            f.files["user-data"],
            b"#cloud-config\n# {{provider_id}} stays\n"
        );
        // JSON meta-data keeps being JSON.
        let mut i = with(FirstBoot::Nocloud(files(&[(
            "meta-data",
            "{\"local-hostname\": \"h\"}",
        )])));
        fill_first_boot(&mut i, m, None, 1);
        let Some(FirstBoot::Nocloud(f)) = &i.first_boot else {
            panic!()
        };
        let v: serde_json::Value = serde_json::from_slice(&f.files["meta-data"]).unwrap();
        assert_eq!(v["instance-id"], format!("{m}-g1"));
        assert_eq!(v["local-hostname"], "h");
        // A config drive's meta_data.json gets its uuid, made if absent.
        let mut i = with(FirstBoot::ConfigDrive(files(&[(
            "openstack/latest/user_data",
            "#cloud-config\n",
        )])));
        fill_first_boot(&mut i, m, None, 2);
        let Some(FirstBoot::ConfigDrive(f)) = &i.first_boot else {
            panic!()
        };
        let v: serde_json::Value =
            serde_json::from_slice(&f.files["openstack/latest/meta_data.json"]).unwrap();
        assert_eq!(v["uuid"], format!("{m}-g2"));
        // Shown as digests only.
        let s = first_boot_summary(&i).unwrap();
        assert!(
            s.starts_with("config-drive: openstack/latest/meta_data.json "),
            "{s}"
        );
        assert!(!s.contains("cloud-config"), "{s}");
    }

    #[test]
    fn first_boot_paths_must_be_plain_relative_names() {
        for good in ["user-data", "openstack/latest/meta_data.json"] {
            assert!(check_first_boot_path(good).is_ok(), "{good}");
        }
        for bad in ["", "/etc/passwd", "../x", "a//b", "a/./b", "a\\b"] {
            assert!(check_first_boot_path(bad).is_err(), "{bad:?}");
        }
    }
}
