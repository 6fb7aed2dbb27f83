//! Who reached a machine's serial console over shepherd's SSH
//! (`console_session`, `migrations/V27__console_sessions.sql`), and who
//! may: an operator names any machine, a tenant only its own devices, with
//! its project's keys.

use std::time::SystemTime;

use uuid::Uuid;

use super::{BmdbError, Tx};

/// A console connection, as it begins.
#[derive(Debug, Clone)]
pub struct Login {
    pub session_id: Uuid,
    pub machine_id: Uuid,
    /// `operator NAME` or `tenant project PROJECT key LABEL`.
    pub who: String,
    pub key_fingerprint: String,
    pub peer: Option<String>,
}

/// A console connection as the BMDB keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSession {
    pub session_id: Uuid,
    pub who: String,
    pub key_fingerprint: String,
    pub peer: Option<String>,
    pub started_at: SystemTime,
    pub ended_at: Option<SystemTime>,
    pub wrote: bool,
    pub bytes_typed: i64,
    pub bytes_shown: i64,
    pub end_reason: Option<String>,
}

/// What a tenant's key opens: its device's machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantGrant {
    pub machine_id: Uuid,
    pub project_id: Uuid,
    /// The key's label in its project.
    pub label: String,
    pub provider_id: Option<String>,
}

const BEGIN: &str = "INSERT INTO console_session (session_id, machine_id, who, key_fingerprint, peer) \
     VALUES ($1, $2, $3, $4, $5)";
const WROTE: &str = "UPDATE console_session SET wrote = true WHERE session_id = $1";
const END: &str = "UPDATE console_session SET ended_at = now(), bytes_typed = $2, \
       bytes_shown = $3, end_reason = $4 WHERE session_id = $1 AND ended_at IS NULL";
const RECENT: &str = "SELECT session_id, who, key_fingerprint, peer, started_at, ended_at, wrote, \
       bytes_typed, bytes_shown, end_reason FROM console_session \
     WHERE machine_id = $1 ORDER BY started_at DESC, session_id LIMIT $2";
/// A machine by its ID ($1, when the name is one) or its provider's ID.
const MACHINE: &str = "SELECT machine_id, provider_id FROM machine_summary WHERE machine_id = $1 \
     UNION ALL (SELECT machine_id, provider_id FROM machine_summary WHERE provider_id = $2 LIMIT 1) \
     LIMIT 1";
/// A live device (not being deleted) and its project's key with this
/// fingerprint.
const TENANT: &str = "SELECT d.machine_id, d.project_id, k.label, s.provider_id FROM device d \
       JOIN project_ssh_key k ON k.project_id = d.project_id \
       JOIN machine_summary s ON s.machine_id = d.machine_id \
     WHERE d.device_id = $1 AND d.deleted_at IS NULL AND d.deleting_at IS NULL \
       AND k.fingerprint = $2";

/// The connections this console server serves, still alive ($1).
const KEEP: &str = "UPDATE console_session SET seen_at = now() \
     WHERE session_id = ANY($1) AND ended_at IS NULL";
/// Connections no console server kept alive for $1 seconds: their shepherd
/// stopped without ending them.
const SWEEP: &str = "UPDATE console_session SET ended_at = seen_at, \
       end_reason = 'its shepherd stopped without ending it (no word from it since)' \
     WHERE ended_at IS NULL AND seen_at < now() - make_interval(secs => $1)";

/// Keeps `sessions` (the connections this console server serves) alive.
pub async fn keep(tx: &mut Tx<'_>, sessions: &[Uuid]) -> Result<u64, BmdbError> {
    tx.execute(KEEP, &[&sessions]).await
}

/// Ends the connections no console server kept alive for `silent`: their
/// shepherd stopped. Returns how many.
pub async fn sweep(tx: &mut Tx<'_>, silent: std::time::Duration) -> Result<u64, BmdbError> {
    tx.execute(SWEEP, &[&silent.as_secs_f64()]).await
}

/// Records a console connection's start.
pub async fn begin(tx: &mut Tx<'_>, login: &Login) -> Result<(), BmdbError> {
    tx.execute(
        BEGIN,
        &[
            &login.session_id,
            &login.machine_id,
            &login.who,
            &login.key_fingerprint,
            &login.peer,
        ],
    )
    .await?;
    Ok(())
}

/// Records that the connection holds the keyboard.
pub async fn wrote(tx: &mut Tx<'_>, session_id: Uuid) -> Result<(), BmdbError> {
    tx.execute(WROTE, &[&session_id]).await?;
    Ok(())
}

/// Records a console connection's end: what went each way, and why.
pub async fn end(
    tx: &mut Tx<'_>,
    session_id: Uuid,
    typed: u64,
    shown: u64,
    reason: &str,
) -> Result<(), BmdbError> {
    let (typed, shown) = (
        i64::try_from(typed).unwrap_or(i64::MAX),
        i64::try_from(shown).unwrap_or(i64::MAX),
    );
    tx.execute(END, &[&session_id, &typed, &shown, &reason])
        .await?;
    Ok(())
}

/// `machine_id`'s newest `n` console connections, newest first.
pub async fn recent(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    n: i64,
) -> Result<Vec<ConsoleSession>, BmdbError> {
    Ok(tx
        .query(RECENT, &[&machine_id, &n])
        .await?
        .iter()
        .map(|r| ConsoleSession {
            session_id: r.get(0),
            who: r.get(1),
            key_fingerprint: r.get(2),
            peer: r.get(3),
            started_at: r.get(4),
            ended_at: r.get(5),
            wrote: r.get(6),
            bytes_typed: r.get(7),
            bytes_shown: r.get(8),
            end_reason: r.get(9),
        })
        .collect())
}

/// The machine an operator names (its ID, or its provider's ID): its ID
/// and its provider's ID (None when not provided).
pub async fn machine_named(
    tx: &mut Tx<'_>,
    name: &str,
) -> Result<Option<(Uuid, Option<String>)>, BmdbError> {
    let id = Uuid::parse_str(name).ok();
    Ok(tx
        .query_opt(MACHINE, &[&id, &name])
        .await?
        .map(|r| (r.get(0), r.get(1))))
}

/// What a tenant logging in as `device` with the key of `fingerprint`
/// may reach: the device's machine, when the key is its project's.
pub async fn tenant_grant(
    tx: &mut Tx<'_>,
    device: &str,
    fingerprint: &str,
) -> Result<Option<TenantGrant>, BmdbError> {
    let Ok(device) = Uuid::parse_str(device) else {
        return Ok(None);
    };
    Ok(tx
        .query_opt(TENANT, &[&device, &fingerprint])
        .await?
        .map(|r| TenantGrant {
            machine_id: r.get(0),
            project_id: r.get(1),
            label: r.get(2),
            provider_id: r.get(3),
        }))
}
