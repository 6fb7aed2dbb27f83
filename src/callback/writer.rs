//! The `HeartbeatWriter` actor: every heartbeat's writes, coalesced.
//!
//! Heartbeats that arrive while earlier batches are being written wait
//! together and go to the BMDB as one statement: authenticate (the
//! machine's `machine_agent_started` must hold exactly the caller's key),
//! upsert the heartbeat, the hardware report, the installation report and
//! the installation progress where given, and read the pending installation request, all for every
//! heartbeat of the batch at once. Each caller is answered only after the
//! batch committed. Authentication reads the BMDB in that same statement,
//! so there is no cache to go stale when another process changes a key.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::metrics::{HeartbeatMetrics, Outcome};
use crate::bmdb::{Bmdb, BmdbError, InstallationResult};

/// One authenticated-or-not heartbeat, as it goes to the BMDB.
#[derive(Debug, Clone)]
pub struct Beat {
    pub machine_id: Uuid,
    /// The public key the caller proved it holds (its TLS certificate's).
    pub key: [u8; super::tls::KEY_LEN],
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

/// Sent by the callback server for each heartbeat.
#[derive(Message)]
#[rtype(result = "Result<BeatOutcome, String>")]
pub struct WriteBeat(pub Beat);

#[derive(Message)]
#[rtype(result = "WriterStats")]
pub struct GetWriterStats;

/// The writer's tallies (`/metrics` has them as `HeartbeatMetrics`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WriterStats {
    pub batches: u64,
    pub accepted: u64,
    pub unauthenticated: u64,
}

type Reply = oneshot::Sender<Result<BeatOutcome, String>>;

/// How long a batch may take before its callers are told UNAVAILABLE.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

pub struct HeartbeatWriter {
    bmdb: Bmdb,
    max_batch: usize,
    max_in_flight: usize,
    in_flight: usize,
    pending: Vec<(Beat, Reply)>,
    stats: WriterStats,
    metrics: HeartbeatMetrics,
}

impl HeartbeatWriter {
    pub fn new(
        bmdb: Bmdb,
        max_batch: usize,
        max_in_flight: usize,
        metrics: HeartbeatMetrics,
    ) -> Self {
        HeartbeatWriter {
            bmdb,
            max_batch: max_batch.max(1),
            max_in_flight: max_in_flight.max(1),
            in_flight: 0,
            pending: Vec::new(),
            stats: WriterStats::default(),
            metrics,
        }
    }

    /// Starts a write of what is pending, if a slot is free. A machine that
    /// called twice waits for the next batch with its second heartbeat (one
    /// statement cannot upsert a row twice).
    fn flush(&mut self, ctx: &mut Context<Self>) {
        while self.in_flight < self.max_in_flight && !self.pending.is_empty() {
            let mut seen = HashSet::new();
            let mut batch = Vec::new();
            let mut rest = Vec::new();
            for (beat, reply) in self.pending.drain(..) {
                if batch.len() < self.max_batch && seen.insert(beat.machine_id) {
                    batch.push((beat, reply));
                } else {
                    rest.push((beat, reply));
                }
            }
            self.pending = rest;
            // One lock order for every batch: no deadlock between batches.
            batch.sort_by_key(|(b, _)| b.machine_id);
            self.in_flight += 1;
            let bmdb = self.bmdb.clone();
            // The beats (reports and all) move into the write; the replies
            // stay, with the machine each is for.
            let (beats, replies): (Vec<Beat>, Vec<(Uuid, Reply)>) = batch
                .into_iter()
                .map(|(b, r)| {
                    let id = b.machine_id;
                    (b, (id, r))
                })
                .unzip();
            let started = Instant::now();
            ctx.spawn(
                async move {
                    // Agents give a call 10 s; an answer past that is lost.
                    match tokio::time::timeout(WRITE_TIMEOUT, write(&bmdb, &beats)).await {
                        Ok(r) => r,
                        Err(_) => Err(BmdbError::Unreachable(format!(
                            "no answer within {WRITE_TIMEOUT:?}"
                        ))),
                    }
                }
                    .into_actor(self)
                    .map(move |r, act, ctx| {
                        act.in_flight -= 1;
                        act.record(replies.len(), started.elapsed());
                        match r {
                            Ok(answers) => {
                                for ((machine_id, reply), answer) in replies.into_iter().zip(answers) {
                                    match &answer {
                                        BeatOutcome::Accepted { .. } => {
                                            act.stats.accepted += 1;
                                            act.metrics.count(Outcome::Accepted, 1);
                                        }
                                        BeatOutcome::Unauthenticated => {
                                            act.stats.unauthenticated += 1;
                                            act.metrics.count(Outcome::Unauthenticated, 1);
                                            tracing::debug!(%machine_id, "heartbeat not authenticated");
                                        }
                                    }
                                    let _ = reply.send(Ok(answer));
                                }
                            }
                            Err(e) => {
                                let cause = e.to_string();
                                tracing::warn!(heartbeats = replies.len(), error = %cause, "writing heartbeats failed");
                                for (_, reply) in replies {
                                    let _ = reply.send(Err(cause.clone()));
                                }
                            }
                        }
                        act.flush(ctx);
                    }),
            );
        }
    }

    fn record(&mut self, size: usize, took: Duration) {
        self.stats.batches += 1;
        self.metrics.write_seconds.observe(took.as_secs_f64());
        self.metrics.batch_size.observe(size as f64);
    }
}

impl Actor for HeartbeatWriter {
    type Context = Context<Self>;
}

impl Handler<WriteBeat> for HeartbeatWriter {
    type Result = ResponseFuture<Result<BeatOutcome, String>>;

    fn handle(&mut self, msg: WriteBeat, ctx: &mut Context<Self>) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.pending.push((msg.0, tx));
        self.flush(ctx);
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err("the heartbeat writer stopped".into()))
        })
    }
}

impl Handler<GetWriterStats> for HeartbeatWriter {
    type Result = MessageResult<GetWriterStats>;

    fn handle(&mut self, _: GetWriterStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats.clone())
    }
}

/// Authenticates, writes and reads the pending request for a batch, in one
/// statement. Data-modifying CTEs do not see each other's rows, so a
/// request answered by a report in this very batch is excluded by the
/// batch's own generation.
const WRITE_BEATS: &str = "WITH input AS ( \
         SELECT * FROM unnest($1::uuid[], $2::bytea[], $3::bytea[], $4::int4[], $5::text[], $6::bytea[], \
                              $7::int8[], $8::bytea[], $9::int4[], $10::int8[]) \
             AS i(machine_id, agent_key, hardware, generation, result, report, progress_generation, progress, \
                  progress_phase, progress_written)), \
     auth AS ( \
         SELECT i.* FROM input i JOIN machine_agent_started a \
             ON a.machine_id = i.machine_id AND a.agent_public_key = i.agent_key), \
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
             ON a.machine_id = i.machine_id AND a.agent_public_key = i.agent_key), \
     heartbeat AS ( \
         INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at) \
         SELECT machine_id, now() FROM auth \
         ON CONFLICT (machine_id) DO UPDATE SET agent_heartbeat_at = EXCLUDED.agent_heartbeat_at) \
     SELECT a.machine_id, r.os_installation_request_raw \
     FROM auth a CROSS JOIN (SELECT set_config('synchronous_commit', 'off', true)) AS soft_state \
     LEFT JOIN machine_os_installation_request r ON r.machine_id = a.machine_id \
         AND NOT EXISTS (SELECT 1 FROM machine_os_installation_report p \
             WHERE p.machine_id = r.machine_id AND p.generation = r.generation)";

async fn write(bmdb: &Bmdb, beats: &[Beat]) -> Result<Vec<BeatOutcome>, BmdbError> {
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

/// A live agent's enrollment (CONTRACTS.md §5), written as it comes (they
/// are one per boot, not worth batching).
#[derive(Message)]
#[rtype(result = "Result<crate::bmdb::boot::Enrolled, String>")]
pub struct WriteEnrollment {
    pub machine_id: uuid::Uuid,
    pub credential: Vec<u8>,
    pub key: [u8; super::tls::KEY_LEN],
    pub endpoint: String,
}

impl Handler<WriteEnrollment> for HeartbeatWriter {
    type Result = ResponseFuture<Result<crate::bmdb::boot::Enrolled, String>>;

    fn handle(&mut self, msg: WriteEnrollment, _: &mut Context<Self>) -> Self::Result {
        let bmdb = self.bmdb.clone();
        Box::pin(async move {
            bmdb.transact(async |tx| {
                crate::bmdb::boot::enroll(
                    tx,
                    msg.machine_id,
                    &msg.credential,
                    &msg.key,
                    &msg.endpoint,
                )
                .await
            })
            .await
            .map_err(|e| e.to_string())
        })
    }
}
