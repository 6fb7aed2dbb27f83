//! Agents' heartbeats as the BMDB takes them (CONTRACTS.md §5): a batch
//! authenticated, written and answered in one statement. The callback's
//! `HeartbeatWriter` gathers the batches; this is what it sends.

use shepherd_proto::takeover::AGENT_KEY_LEN;
use uuid::Uuid;

use std::time::SystemTime;

use super::{Bmdb, BmdbError, InstallationResult, Tx};

/// One authenticated-or-not heartbeat, as it goes to the BMDB.
#[derive(Debug, Clone)]
pub struct Beat {
    pub machine_id: Uuid,
    /// The public key the caller proved it holds (its TLS certificate's).
    pub key: [u8; AGENT_KEY_LEN],
    /// `AgentHardwareReport` bytes exactly as received.
    pub hardware_report: Option<Vec<u8>>,
    pub installation: Option<InstallationReport>,
    pub progress: Option<ProgressBeat>,
}

/// An agent's `InstallationProgress`: the bytes exactly as received, and
/// what the BMDB compares between two of them (whether the work moved, or
/// began again from the start).
#[derive(Debug, Clone)]
pub struct ProgressBeat {
    pub generation: i64,
    pub phase: i32,
    pub bytes_written: i64,
    pub raw: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct InstallationReport {
    pub generation: i32,
    pub result: InstallationResult,
    /// `OSInstallationReport` bytes exactly as received.
    pub raw: Vec<u8>,
}

/// What the BMDB said about one heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeatOutcome {
    /// Written; the pending installation request's stored bytes, if any.
    Accepted {
        installation_request: Option<Vec<u8>>,
    },
    /// No `machine_agent_started` row with this machine and key.
    Unauthenticated,
}

/// Authenticates, writes and reads the pending request for a batch, in one
/// statement. `a.machine_id = ANY($1)` tells the planner how few agents a
/// batch names: without it, a batch of a hundred was joined by a scan of
/// every agent (a hash join over the whole fleet per batch). Data-modifying CTEs do not see each other's rows, so a
/// request answered by a report in this very batch is excluded by the
/// batch's own generation.
const WRITE_BEATS: &str = "WITH input AS ( \
         SELECT * FROM unnest($1::uuid[], $2::bytea[], $3::bytea[], $4::int4[], $5::text[], $6::bytea[], \
                              $7::int8[], $8::bytea[], $9::int4[], $10::int8[]) \
             AS i(machine_id, agent_key, hardware, generation, result, report, progress_generation, progress, \
                  progress_phase, progress_written)), \
     auth AS ( \
         SELECT i.* FROM input i JOIN machine_agent_started a \
             ON a.machine_id = i.machine_id AND a.agent_public_key = i.agent_key \
             AND a.machine_id = ANY($1)), \
     heartbeat AS ( \
         INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at) \
         SELECT machine_id, now() FROM auth \
         ON CONFLICT (machine_id) DO UPDATE SET agent_heartbeat_at = EXCLUDED.agent_heartbeat_at), \
     hardware AS ( \
         INSERT INTO machine_hardware_report (machine_id, hardware_report_raw) \
         SELECT machine_id, hardware FROM auth WHERE hardware IS NOT NULL \
         ON CONFLICT (machine_id) DO UPDATE SET hardware_report_raw = EXCLUDED.hardware_report_raw), \
     installation AS ( \
         INSERT INTO machine_os_installation_report \
             (machine_id, generation, os_installation_result, os_installation_report_raw) \
         SELECT machine_id, generation, result::machine_os_installation_result, report \
         FROM auth WHERE generation IS NOT NULL \
         ON CONFLICT (machine_id) DO UPDATE SET generation = EXCLUDED.generation, \
             os_installation_result = EXCLUDED.os_installation_result, \
             os_installation_report_raw = EXCLUDED.os_installation_report_raw), \
     progress AS ( \
         INSERT INTO machine_installation_progress \
             (machine_id, generation, progress_raw, progress_at, phase, bytes_written) \
         SELECT machine_id, progress_generation, progress, now(), progress_phase, progress_written \
         FROM auth WHERE progress IS NOT NULL \
         ON CONFLICT (machine_id) DO UPDATE SET generation = EXCLUDED.generation, \
             progress_raw = EXCLUDED.progress_raw, progress_at = EXCLUDED.progress_at, \
             phase = EXCLUDED.phase, bytes_written = EXCLUDED.bytes_written) \
     SELECT a.machine_id, r.os_installation_request_raw FROM auth a \
     LEFT JOIN machine_os_installation_request r ON r.machine_id = a.machine_id \
         AND a.generation IS DISTINCT FROM r.generation \
         AND NOT EXISTS (SELECT 1 FROM machine_summary s WHERE s.machine_id = a.machine_id \
             AND s.network IS NOT NULL AND s.network <> 'provisioning') \
         AND NOT EXISTS (SELECT 1 FROM machine_os_installation_report p \
             WHERE p.machine_id = r.machine_id AND p.generation = r.generation)";

/// [`WRITE_BEATS`] for a batch of heartbeats alone (no hardware report,
/// installation report or progress: a fleet's steady state): two arrays
/// to bind and one table written instead of eight and four, and committed
/// without waiting for the WAL's flush (`synchronous_commit = off` for
/// this transaction only). A heartbeat is soft state, renewed every
/// interval: a database crash loses at most the last few hundred
/// milliseconds of them, against thresholds of minutes, while the flush
/// is what a batch of heartbeats waits for most. Reports and hardware
/// (what an agent is told is kept) go through [`WRITE_BEATS`] and are
/// flushed before they are answered.
const WRITE_HEARTBEATS: &str = "WITH auth AS ( \
         SELECT i.machine_id FROM unnest($1::uuid[], $2::bytea[]) AS i(machine_id, agent_key) \
         JOIN machine_agent_started a \
             ON a.machine_id = i.machine_id AND a.agent_public_key = i.agent_key \
             AND a.machine_id = ANY($1)), \
     heartbeat AS ( \
         INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at) \
         SELECT machine_id, now() FROM auth \
         ON CONFLICT (machine_id) DO UPDATE SET agent_heartbeat_at = EXCLUDED.agent_heartbeat_at) \
     SELECT a.machine_id, r.os_installation_request_raw \
     FROM auth a CROSS JOIN (SELECT set_config('synchronous_commit', 'off', true)) AS soft_state \
     LEFT JOIN machine_os_installation_request r ON r.machine_id = a.machine_id \
         AND NOT EXISTS (SELECT 1 FROM machine_summary s WHERE s.machine_id = a.machine_id \
             AND s.network IS NOT NULL AND s.network <> 'provisioning') \
         AND NOT EXISTS (SELECT 1 FROM machine_os_installation_report p \
             WHERE p.machine_id = r.machine_id AND p.generation = r.generation)";

/// Writes `beats` and answers each with its installation request, if one
/// waits: never to a machine whose switch ports are not on the
/// provisioning network (`machine_summary.network`), which shepherd's
/// services do not reach.
pub async fn write(bmdb: &Bmdb, beats: &[Beat]) -> Result<Vec<BeatOutcome>, BmdbError> {
    let ids: Vec<Uuid> = beats.iter().map(|b| b.machine_id).collect();
    let keys: Vec<Vec<u8>> = beats.iter().map(|b| b.key.to_vec()).collect();
    let heartbeats_alone = beats
        .iter()
        .all(|b| b.hardware_report.is_none() && b.installation.is_none() && b.progress.is_none());
    if heartbeats_alone {
        let rows = bmdb
            .query_idempotent(WRITE_HEARTBEATS, &[&ids, &keys])
            .await?;
        return Ok(outcomes(beats, &rows));
    }
    let hardware: Vec<Option<Vec<u8>>> = beats.iter().map(|b| b.hardware_report.clone()).collect();
    let generations: Vec<Option<i32>> = beats
        .iter()
        .map(|b| b.installation.as_ref().map(|i| i.generation))
        .collect();
    let results: Vec<Option<&str>> = beats
        .iter()
        .map(|b| {
            b.installation.as_ref().map(|i| match i.result {
                InstallationResult::Success => "Success",
                InstallationResult::Error => "Error",
            })
        })
        .collect();
    let reports: Vec<Option<Vec<u8>>> = beats
        .iter()
        .map(|b| b.installation.as_ref().map(|i| i.raw.clone()))
        .collect();
    let progress_generations: Vec<Option<i64>> = beats
        .iter()
        .map(|b| b.progress.as_ref().map(|p| p.generation))
        .collect();
    let progress: Vec<Option<Vec<u8>>> = beats
        .iter()
        .map(|b| b.progress.as_ref().map(|p| p.raw.clone()))
        .collect();
    let progress_phases: Vec<Option<i32>> = beats
        .iter()
        .map(|b| b.progress.as_ref().map(|p| p.phase))
        .collect();
    let progress_written: Vec<Option<i64>> = beats
        .iter()
        .map(|b| b.progress.as_ref().map(|p| p.bytes_written))
        .collect();
    // One statement, its own transaction: one round trip per batch. Every
    // part is an upsert of the same values, so running it twice is the
    // same as once.
    let rows = bmdb
        .query_idempotent(
            WRITE_BEATS,
            &[
                &ids,
                &keys,
                &hardware,
                &generations,
                &results,
                &reports,
                &progress_generations,
                &progress,
                &progress_phases,
                &progress_written,
            ],
        )
        .await?;
    Ok(outcomes(beats, &rows))
}

/// Each beat's answer from the rows the statement returned: accepted
/// (with the request pending for it) when its machine and key matched.
fn outcomes(beats: &[Beat], rows: &[tokio_postgres::Row]) -> Vec<BeatOutcome> {
    let mut answered: std::collections::HashMap<Uuid, Option<Vec<u8>>> = rows
        .iter()
        .map(|r| (r.get::<_, Uuid>(0), r.get::<_, Option<Vec<u8>>>(1)))
        .collect();
    beats
        .iter()
        .map(|b| match answered.remove(&b.machine_id) {
            Some(request) => BeatOutcome::Accepted {
                installation_request: request,
            },
            None => BeatOutcome::Unauthenticated,
        })
        .collect()
}

/// The database's clock: what heartbeats are compared against (an agent
/// heard "since" a moment is heard after this).
pub async fn now(tx: &mut Tx<'_>) -> Result<SystemTime, BmdbError> {
    Ok(tx.query_one("SELECT now()", &[]).await?.get(0))
}

/// Whether the machine's agent called after `since` (its restart, or a
/// power action), by the database's clock.
pub async fn heard_since(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    since: SystemTime,
) -> Result<bool, BmdbError> {
    Ok(tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM machine_agent_heartbeat \
             WHERE machine_id = $1 AND agent_heartbeat_at > $2)",
            &[&machine_id, &since],
        )
        .await?
        .get(0))
}

/// Forgets the machine's agent (its key, its heartbeat) and any reboot
/// asked of it: it is to be taken over again.
pub async fn forget_agent(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<(), BmdbError> {
    tx.execute(
        "WITH a AS (DELETE FROM machine_agent_started WHERE machine_id = $1), \
              r AS (DELETE FROM machine_reboot_request WHERE machine_id = $1) \
         DELETE FROM machine_agent_heartbeat WHERE machine_id = $1",
        &[&machine_id],
    )
    .await?;
    Ok(())
}
