//! Work: a lease on one machine for one process, under a session.
//!
//! Obtained from [`Session::lease`]; ended by exactly one of `finish`, `fail`
//! or `cancel`, each of which deletes the `work` row (failing with
//! `LeaseLost` if it is gone) and appends to `work_history` in the same
//! transaction. A `Work` dropped without being ended is cancelled in the
//! background; if even that cannot run, the lease dies with its session.

use std::time::Duration;

use uuid::Uuid;

use super::{Backoff, BmdbError, HistoryEvent, Process, Session, Tx};

/// Inserts the work row unless a conflicting one exists (0 rows then).
const WORK_START: &str = "WITH w AS ( \
         INSERT INTO work (machine_id, session_id, process) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING \
         RETURNING machine_id, process) \
     INSERT INTO work_history (machine_id, process, event, \"timestamp\") \
     SELECT machine_id, process, 'Started', now() FROM w";

/// Deletes the work row and records the event; no row means the lease is lost.
const WORK_RELEASE: &str = "WITH w AS ( \
         DELETE FROM work WHERE machine_id = $1 AND process = $2 AND session_id = $3 \
         RETURNING machine_id, process) \
     INSERT INTO work_history (machine_id, process, event, \"timestamp\", failed_cause, detail) \
     SELECT machine_id, process, $4, now(), $5, $6 FROM w";

const BACKOFF_CLEAR: &str = "DELETE FROM work_backoff WHERE machine_id = $1 AND process = $2";

const BACKOFF_LAST: &str =
    "SELECT last_interval_seconds FROM work_backoff WHERE machine_id = $1 AND process = $2";

const BACKOFF_SET: &str = "INSERT INTO work_backoff (machine_id, process, until, cause, last_interval_seconds) \
     VALUES ($1, $2, now() + make_interval(secs => $3), $4, $5) \
     ON CONFLICT (machine_id, process) DO UPDATE \
     SET until = EXCLUDED.until, cause = EXCLUDED.cause, last_interval_seconds = EXCLUDED.last_interval_seconds";

/// Releases the lease as `Canceled`, retried until recorded or the session
/// is gone.
async fn cancel(
    session: &Session,
    mid: Uuid,
    process: Process,
    cause: Option<&str>,
) -> Result<(), BmdbError> {
    let sid = session.id();
    until_recorded(session, mid, process, "cancel", async || {
        session
            .transact(async |tx| {
                release(tx, mid, process, sid, HistoryEvent::Canceled, cause, None).await
            })
            .await
    })
    .await?;
    Ok(())
}

/// Releases a lease whose creation may or may not have committed (its
/// answer was lost): cancelled if it exists, nothing if it does not.
pub(super) async fn release_unknown(
    session: &Session,
    mid: Uuid,
    process: Process,
) -> Result<(), BmdbError> {
    match cancel(session, mid, process, Some("lease outcome unknown")).await {
        Err(BmdbError::LeaseLost { .. }) => Ok(()),
        r => r,
    }
}

/// Runs `end` (a transaction that ends a lease) until the database answers:
/// errors that mean it could not be reached are retried, with a growing
/// pause, for as long as the session lives, so that a lease always ends
/// with its outcome recorded, or with its session. `Ok(None)`: an earlier
/// attempt whose answer was lost had written it (the lease is gone while
/// the session is alive).
async fn until_recorded<R>(
    session: &Session,
    mid: Uuid,
    process: Process,
    what: &str,
    mut end: impl AsyncFnMut() -> Result<R, BmdbError>,
) -> Result<Option<R>, BmdbError> {
    let mut maybe_written = false;
    let mut failures = 0u32;
    loop {
        match end().await {
            Ok(r) => {
                if failures > 0 {
                    tracing::info!(machine_id = %mid, %process, failures, "recorded the {what} once the database answered");
                }
                return Ok(Some(r));
            }
            Err(BmdbError::LeaseLost { .. }) if maybe_written => return Ok(None),
            Err(e) if e.is_transient() => {
                maybe_written |= matches!(e, BmdbError::CommitUnknown(_));
                failures += 1;
                if failures == 1 {
                    tracing::warn!(machine_id = %mid, %process, error = %e,
                        "could not record the {what}; retrying until it is recorded or the session ends");
                }
                if session.is_expired() {
                    return Err(BmdbError::SessionExpired(session.id()));
                }
                let pause = Duration::from_millis(100 << failures.min(4));
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = session.expired() => return Err(BmdbError::SessionExpired(session.id())),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Inserts the work row and its `Started` history; false if the machine is
/// already leased for this or a conflicting process.
pub(super) async fn start(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    session_id: Uuid,
    process: Process,
) -> Result<bool, BmdbError> {
    let n = tx
        .execute(WORK_START, &[&machine_id, &session_id, &process])
        .await?;
    Ok(n == 1)
}

/// Deletes the work row and records `event` with its cause (failures) or
/// what the work did (`work_history.detail`); `LeaseLost` without the row.
async fn release(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    process: Process,
    session_id: Uuid,
    event: HistoryEvent,
    cause: Option<&str>,
    detail: Option<&str>,
) -> Result<(), BmdbError> {
    let n = tx
        .execute(
            WORK_RELEASE,
            &[&machine_id, &process, &session_id, &event, &cause, &detail],
        )
        .await?;
    if n == 0 {
        return Err(BmdbError::LeaseLost {
            machine_id,
            process,
        });
    }
    Ok(())
}

/// A leased machine, with what the selector returned about it.
pub struct Work<T> {
    session: Session,
    machine_id: Uuid,
    process: Process,
    item: T,
    ended: bool,
}

impl<T> std::fmt::Debug for Work<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("machine_id", &self.machine_id)
            .field("process", &self.process)
            .field("session", &self.session.id())
            .finish()
    }
}

impl<T> Work<T> {
    pub(super) fn new(session: Session, machine_id: Uuid, process: Process, item: T) -> Self {
        Work {
            session,
            machine_id,
            process,
            item,
            ended: false,
        }
    }

    pub fn machine_id(&self) -> Uuid {
        self.machine_id
    }

    pub fn process(&self) -> Process {
        self.process
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    /// What the selector returned with the machine.
    pub fn item(&self) -> &T {
        &self.item
    }

    /// Success: runs `f` in the transaction that releases the lease, clears
    /// the process's backoff and records `Finished`. If `f` fails nothing is
    /// written and the lease is still held (fail or cancel it). A database
    /// that cannot be reached is retried until the result is recorded or the
    /// session is gone.
    pub async fn finish(
        &mut self,
        f: impl AsyncFnMut(&mut Tx<'_>) -> Result<(), BmdbError>,
    ) -> Result<(), BmdbError> {
        self.finish_noting(None, f).await
    }

    /// As [`Work::finish`], saying in the history what the work did (a
    /// recovery: "agent restarted over SSH", …).
    pub async fn finish_noting(
        &mut self,
        detail: Option<&str>,
        mut f: impl AsyncFnMut(&mut Tx<'_>) -> Result<(), BmdbError>,
    ) -> Result<(), BmdbError> {
        let (mid, process, sid) = (self.machine_id, self.process, self.session.id());
        let session = self.session.clone();
        until_recorded(&session, mid, process, "finish", async || {
            session
                .transact(async |tx| {
                    release(tx, mid, process, sid, HistoryEvent::Finished, None, detail).await?;
                    tx.execute(BACKOFF_CLEAR, &[&mid, &process]).await?;
                    f(tx).await
                })
                .await
        })
        .await?;
        self.ended = true;
        Ok(())
    }

    /// Failure: releases the lease, records `Failed` with `cause`, and backs
    /// the process off on this machine. Returns the wait until the next
    /// attempt. Retried like `finish` while the database cannot be reached.
    pub async fn fail(&mut self, backoff: &Backoff, cause: &str) -> Result<Duration, BmdbError> {
        self.fail_with(backoff, cause, async |_| Ok(())).await
    }

    /// As `fail`, also running `f` in the same transaction (to record what
    /// was learned on the way to the failure).
    pub async fn fail_with(
        &mut self,
        backoff: &Backoff,
        cause: &str,
        mut f: impl AsyncFnMut(&mut Tx<'_>) -> Result<(), BmdbError>,
    ) -> Result<Duration, BmdbError> {
        let (mid, process, sid) = (self.machine_id, self.process, self.session.id());
        let session = self.session.clone();
        let wait = until_recorded(&session, mid, process, "failure", async || {
            session
                .transact(async |tx| {
                    release(
                        tx,
                        mid,
                        process,
                        sid,
                        HistoryEvent::Failed,
                        Some(cause),
                        None,
                    )
                    .await?;
                    let last: Option<i64> = tx
                        .query_opt(BACKOFF_LAST, &[&mid, &process])
                        .await?
                        .and_then(|r| r.get(0));
                    let interval = backoff.next_interval_seconds(last);
                    let wait = backoff.wait_for(interval);
                    tx.execute(
                        BACKOFF_SET,
                        &[&mid, &process, &wait.as_secs_f64(), &cause, &interval],
                    )
                    .await?;
                    f(tx).await?;
                    Ok(wait)
                })
                .await
        })
        .await?
        // Written by an attempt whose answer was lost: the backoff it set is
        // at least the first interval.
        .unwrap_or(backoff.initial);
        self.ended = true;
        tracing::info!(machine_id = %mid, process = %process, wait_s = wait.as_secs(), cause, "work failed, backing off");
        Ok(wait)
    }

    /// Gives the machine back untouched: releases the lease, records
    /// `Canceled`. The backoff, if any, stays. Retried like `finish`.
    pub async fn cancel(&mut self) -> Result<(), BmdbError> {
        cancel(&self.session, self.machine_id, self.process, None).await?;
        self.ended = true;
        Ok(())
    }

    /// As [`Work::cancel`], with why in the history.
    pub async fn cancel_because(&mut self, cause: &str) -> Result<(), BmdbError> {
        cancel(&self.session, self.machine_id, self.process, Some(cause)).await?;
        self.ended = true;
        Ok(())
    }

    /// Whether finish, fail or cancel went through.
    pub fn is_ended(&self) -> bool {
        self.ended
    }
}

impl<T> Drop for Work<T> {
    fn drop(&mut self) {
        if self.ended || self.session.is_expired() {
            return;
        }
        tracing::warn!(machine_id = %self.machine_id, process = %self.process,
            "work dropped without finish, fail or cancel; cancelling");
        let (mid, process) = (self.machine_id, self.process);
        let session = self.session.clone();
        let cancel = async move {
            match cancel(&session, mid, process, Some("work dropped")).await {
                Ok(()) => {}
                Err(BmdbError::SessionExpired(_)) => {
                    tracing::warn!(machine_id = %mid, "the session ended before the dropped work was cancelled; the lease ends with it");
                }
                Err(e) => {
                    tracing::error!(machine_id = %mid, error = %e, "could not cancel dropped work; it ends with its session");
                }
            }
        };
        // Actors run on actix arbiters (a LocalSet); elsewhere the lease is
        // left to expire with its session.
        if actix_rt::Arbiter::try_current().is_some() {
            actix_rt::spawn(cancel);
        } else {
            tracing::warn!(machine_id = %mid, "no actix arbiter to cancel dropped work on; it ends with its session");
        }
    }
}

/// How many times a lease runs its selector when the pick is taken.
const LEASE_SELECTIONS: u32 = 3;

/// Leasing: a session takes a machine for a process (this file owns the
/// work row; `session.rs` knows nothing of it).
impl Session {
    /// Leases one machine for `process`: runs `selector` and inserts the work
    /// row in one transaction. `Ok(None)`: the selector found nothing.
    /// `WorkConflict`: the machine is leased already (for this or a
    /// conflicting process).
    ///
    /// Under READ COMMITTED a selector's snapshot may predate another
    /// leaser's commit; if its pick turns out to be leased, the selector runs
    /// again (a statement sees every commit before it started) up to
    /// `LEASE_SELECTIONS` times before the conflict is reported.
    pub async fn lease<T>(
        &self,
        process: Process,
        selector: impl AsyncFnMut(&mut Tx<'_>) -> Result<Option<(Uuid, T)>, BmdbError>,
    ) -> Result<Option<Work<T>>, BmdbError> {
        self.lease_counted(process, selector).await.0
    }

    /// As [`Session::lease`], with how many picks were lost to other
    /// leasers on the way (machines leased by another process or session
    /// between the selector's read and the insert).
    pub async fn lease_counted<T>(
        &self,
        process: Process,
        selector: impl AsyncFnMut(&mut Tx<'_>) -> Result<Option<(Uuid, T)>, BmdbError>,
    ) -> (Result<Option<Work<T>>, BmdbError>, u32) {
        let (leased, lost, _) = self
            .lease_prepared(process, selector, async |_, _, pick| Ok(pick))
            .await;
        (leased, lost)
    }

    /// As [`Session::lease_counted`], and once the machine is leased,
    /// `prepare` runs in the same transaction (what the work needs read or
    /// written with its lease: one commit, and nothing to give back when
    /// the database fails before it). When the lease fails, the machine
    /// whose preparation failed, if it was one's.
    pub async fn lease_prepared<P, T>(
        &self,
        process: Process,
        mut selector: impl AsyncFnMut(&mut Tx<'_>) -> Result<Option<(Uuid, P)>, BmdbError>,
        mut prepare: impl AsyncFnMut(&mut Tx<'_>, Uuid, P) -> Result<T, BmdbError>,
    ) -> (Result<Option<Work<T>>, BmdbError>, u32, Option<Uuid>) {
        let sid = self.id();
        let mut picked = None;
        let mut preparing = None;
        let mut lost = 0u32;
        let leased = self
            .transact(async |tx| {
                let mut selections = 0;
                lost = 0;
                preparing = None;
                loop {
                    let Some((machine_id, pick)) = selector(tx).await? else {
                        return Ok(None);
                    };
                    if start(tx, machine_id, sid, process).await? {
                        picked = Some(machine_id);
                        preparing = Some(machine_id);
                        let item = prepare(tx, machine_id, pick).await?;
                        preparing = None;
                        return Ok(Some((machine_id, item)));
                    }
                    selections += 1;
                    lost += 1;
                    if selections >= LEASE_SELECTIONS {
                        return Err(BmdbError::WorkConflict {
                            machine_id,
                            process,
                        });
                    }
                }
            })
            .await;
        let leased = match leased {
            Ok(l) => l,
            // The lease may have been written with nobody to work it: give
            // it back (a no-op if it was not), so no machine stays leased
            // without a worker.
            Err(BmdbError::CommitUnknown(m)) => {
                if let Some(machine_id) = picked {
                    tracing::warn!(%machine_id, %process, error = %m, "lease outcome unknown; releasing it");
                    let _ = release_unknown(self, machine_id, process).await;
                }
                return (Err(BmdbError::CommitUnknown(m)), lost, None);
            }
            Err(e) => return (Err(e), lost, preparing),
        };
        (
            Ok(leased.map(|(machine_id, item)| Work::new(self.clone(), machine_id, process, item))),
            lost,
            None,
        )
    }
}
