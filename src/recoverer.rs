//! The Recoverer: reboots machines whose agent went quiet, so that the
//! Initializer takes them over again. A [`ControlLoop`] on the same
//! work-lease mailbox as the Initializer: the selector is "needs recovery"
//! (no heartbeat `silent_after_start` after the agent started, or the last
//! heartbeat older than `heartbeat_stale_after`), the worker reboots the
//! machine through the provider, waits (bounded) until the provider reports
//! it back, and finishes the work by dropping its AgentStarted and
//! AgentHeartbeat tags.

use std::rc::Rc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::Instrument;
use uuid::Uuid;

use crate::bmdb::selectors::{self, ProvidedMachine, RecoveryThresholds};
use crate::bmdb::{Backoff, BmdbError, Process, ProviderStatus, Tx, Work};
use crate::control::{ControlLoop, WorkOutcome, Worker, WorkerDone};
use crate::provider::SharedProvider;

const DROP_AGENT_TAGS: &str = "WITH a AS (DELETE FROM machine_agent_started WHERE machine_id = $1), \
     r AS (DELETE FROM machine_reboot_request WHERE machine_id = $1) \
     DELETE FROM machine_agent_heartbeat WHERE machine_id = $1";

/// How a reboot is waited for.
#[derive(Debug, Clone)]
pub struct RebootWait {
    /// Give up (and fail the work) after this long.
    pub timeout: Duration,
    /// Time between two looks at the provider.
    pub poll: Duration,
    /// If the provider never shows the machine going down, accept it as
    /// back once this long has passed (some providers report a reboot only
    /// as a blip).
    pub settle: Duration,
}

/// The actor that recovers one leased machine: the shared worker running
/// the Recoverer's job.
pub type RecovererWorker = Worker<Recoverer>;

pub struct Recoverer {
    shared: Rc<Shared>,
}

struct Shared {
    provider: SharedProvider,
    thresholds: RecoveryThresholds,
    backoff: Backoff,
    wait: RebootWait,
}

impl Recoverer {
    pub fn new(
        provider: SharedProvider,
        thresholds: RecoveryThresholds,
        backoff: Backoff,
        wait: RebootWait,
    ) -> Self {
        Recoverer {
            shared: Rc::new(Shared {
                provider,
                thresholds,
                backoff,
                wait,
            }),
        }
    }
}

impl ControlLoop for Recoverer {
    type Item = Recovery;

    fn process(&self) -> Process {
        Process::ShepherdRecovery
    }

    fn name(&self) -> &'static str {
        "recoverer"
    }

    async fn select(&self, tx: &mut Tx<'_>) -> Result<Option<(Uuid, Recovery)>, BmdbError> {
        let s = &self.shared;
        let kind = s.provider.kind();
        let (mut m, requested) = match selectors::reboot_requested(tx, kind, 1).await?.pop() {
            Some(m) => (Some(m), true),
            None => (
                selectors::needs_recovery(tx, kind, 1, s.thresholds)
                    .await?
                    .pop(),
                false,
            ),
        };
        Ok(m.take()
            .map(|machine| (machine.machine_id, Recovery { machine, requested })))
    }

    fn start_worker(&self, work: Work<Recovery>, done: Recipient<WorkerDone>) {
        let span = tracing::info_span!("recovery", machine_id = %work.machine_id(), provider_id = %work.item().machine.provider_id);
        RecovererWorker::start(
            work.machine_id(),
            run(work, self.shared.clone()).instrument(span),
            done,
        );
    }
}

/// A machine to reboot, and why.
#[derive(Debug, Clone)]
pub struct Recovery {
    pub machine: ProvidedMachine,
    /// An operator asked for it (`machine_reboot_request`); otherwise its
    /// agent went quiet.
    pub requested: bool,
}

async fn run(mut work: Work<Recovery>, shared: Rc<Shared>) -> WorkOutcome {
    let session = work.session().clone();
    let result = tokio::select! {
        r = recover(&shared, work.item()) => r,
        _ = session.expired() => return WorkOutcome::Aborted,
    };
    let mid = work.machine_id();
    match result {
        Ok(()) => match work
            .finish(async |tx| tx.execute(DROP_AGENT_TAGS, &[&mid]).await.map(|_| ()))
            .await
        {
            Ok(()) => {
                tracing::info!("machine back after reboot; agent tags dropped for a new takeover");
                WorkOutcome::Finished
            }
            Err(BmdbError::SessionExpired(_)) => WorkOutcome::Aborted,
            Err(e) => {
                let cause = format!("recording the recovery: {e}");
                let _ = work.fail(&shared.backoff, &cause).await;
                WorkOutcome::Failed(cause)
            }
        },
        Err(cause) => match work.fail(&shared.backoff, &cause).await {
            Err(BmdbError::SessionExpired(_)) => WorkOutcome::Aborted,
            r => {
                if let Ok(wait) = r {
                    tracing::warn!(%cause, retry_in_s = wait.as_secs(), "recovery failed");
                }
                WorkOutcome::Failed(cause)
            }
        },
    }
}

/// Reboots the machine and waits until the provider reports it running.
async fn recover(shared: &Shared, recovery: &Recovery) -> Result<(), String> {
    let id = recovery.machine.provider_id.as_str();
    if recovery.requested {
        tracing::info!("rebooting at an operator's request");
    } else {
        tracing::info!("agent quiet; rebooting");
    }
    shared
        .provider
        .reboot(id)
        .await
        .map_err(|e| format!("reboot: {e}"))?;
    let started = Instant::now();
    let mut went_down = false;
    loop {
        tokio::time::sleep(shared.wait.poll).await;
        let status = match shared.provider.get_machine(id).await {
            Ok(Some(m)) => m.status,
            Ok(None) => return Err("reboot: the provider no longer knows the machine".into()),
            Err(e) => {
                tracing::debug!(error = %e, "looking at the rebooting machine failed; will look again");
                ProviderStatus::Unknown
            }
        };
        match status {
            ProviderStatus::Running if went_down || started.elapsed() >= shared.wait.settle => {
                return Ok(());
            }
            ProviderStatus::Running => {}
            ProviderStatus::ProvisioningFailedPermanent | ProviderStatus::Missing => {
                return Err(format!("reboot: the provider reports the machine {status}"));
            }
            _ => went_down = true,
        }
        if started.elapsed() >= shared.wait.timeout {
            return Err(format!(
                "reboot: not back after {:?} (last status {status})",
                shared.wait.timeout
            ));
        }
    }
}
