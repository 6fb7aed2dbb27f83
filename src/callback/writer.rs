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
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::metrics::{HeartbeatMetrics, Outcome};
use crate::bmdb::heartbeats::write;
pub use crate::bmdb::heartbeats::{Beat, BeatOutcome, InstallationReport, ProgressBeat};
use crate::bmdb::{Bmdb, BmdbError};

/// Why a heartbeat or an enrollment was not written: shepherd's own
/// trouble, never the agent's (it is told UNAVAILABLE and calls again).
#[derive(Debug, Clone, thiserror::Error)]
pub enum WriteError {
    /// The BMDB's cause, shared by every heartbeat of the batch.
    #[error(transparent)]
    Bmdb(Arc<BmdbError>),
    #[error("the heartbeat writer stopped")]
    Stopped,
}

impl crate::fault::Blame for WriteError {
    fn whose(&self) -> crate::fault::Whose {
        match self {
            WriteError::Bmdb(e) => crate::fault::Blame::whose(e.as_ref()),
            WriteError::Stopped => crate::fault::Whose::Ours,
        }
    }
}

/// Sent by the callback server for each heartbeat.
#[derive(Message)]
#[rtype(result = "Result<BeatOutcome, WriteError>")]
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

type Reply = oneshot::Sender<Result<BeatOutcome, WriteError>>;

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
                                tracing::warn!(heartbeats = replies.len(), error = %e, "writing heartbeats failed");
                                let cause = WriteError::Bmdb(Arc::new(e));
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
    type Result = ResponseFuture<Result<BeatOutcome, WriteError>>;

    fn handle(&mut self, msg: WriteBeat, ctx: &mut Context<Self>) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.pending.push((msg.0, tx));
        self.flush(ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(WriteError::Stopped)) })
    }
}

impl Handler<GetWriterStats> for HeartbeatWriter {
    type Result = MessageResult<GetWriterStats>;

    fn handle(&mut self, _: GetWriterStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats.clone())
    }
}

/// A live agent's enrollment (CONTRACTS.md §5), written as it comes (they
/// are one per boot, not worth batching).
#[derive(Message)]
#[rtype(result = "Result<crate::bmdb::boot::Enrolled, WriteError>")]
pub struct WriteEnrollment {
    pub machine_id: uuid::Uuid,
    pub credential: Vec<u8>,
    pub key: [u8; super::tls::KEY_LEN],
    pub endpoint: String,
}

impl Handler<WriteEnrollment> for HeartbeatWriter {
    type Result = ResponseFuture<Result<crate::bmdb::boot::Enrolled, WriteError>>;

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
            .map_err(|e| WriteError::Bmdb(Arc::new(e)))
        })
    }
}
