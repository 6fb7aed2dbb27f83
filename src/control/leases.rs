//! The lease runner: the life of work on one machine, written once.
//!
//! Long on purpose: the life of one lease (select, lease, prepare, work, then
//! exactly one ending, each against the session's death) is read in order in
//! one place; split, its steps would each need the others' invariants.
//!
//! A control loop ([`LeaseLoop`]) says which machine needs it (its
//! selector, run inside the lease transaction, then its `prepare` step in
//! the same transaction once the machine is leased), what its work on one
//! leased machine is (an async function returning an [`Outcome`]), and how
//! it backs off. [`WorkMailbox`] owns the rest: it leases machines under
//! the current session, one [`Worker`] actor per leased machine, up to
//! `parallelism` at once; it refills a free slot as soon as a worker
//! reports done, and polls every `poll_interval` when there was nothing to
//! do. Without a session it waits for one. Each worker runs [`run`]: the
//! work against the session's death, then exactly one of finish, fail
//! (with the loop's backoff) or cancel, with what the work learned written
//! in the same transaction.

use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::Instrument;
use uuid::Uuid;

use super::messages::{
    Drain, Durations, GetLoopStatus, LoopKind, LoopStatus, LoopStopped, RunRound, SetSession,
};
use crate::bmdb::{Backoff, BmdbError, Process, Session, Tx, Work};

/// A control loop that works on one leased machine at a time.
pub trait LeaseLoop: 'static {
    /// What the selector picks with each machine.
    type Pick: 'static;
    /// What the work is handed with each machine: the pick, prepared.
    type Item: 'static;
    /// What the work learned, written when its outcome is recorded.
    type Record: Record + 'static;
    /// The work's name in logs and causes: `takeover`, `recovery`.
    const WORK: &'static str;
    /// Whether it works under the process of another loop (the Enroller
    /// beside the Initializer): its metric series then name the loop too.
    const SHARES_PROCESS: bool = false;

    /// The BMDB process its leases are taken under.
    const PROCESS: Process;

    /// Picks one machine, inside the lease transaction.
    fn select(
        &self,
        tx: &mut Tx<'_>,
    ) -> impl Future<Output = Result<Option<(Uuid, Self::Pick)>, BmdbError>>;

    /// Once the machine is leased, in the same transaction: what the work
    /// needs from the BMDB, read or written with its lease (one commit;
    /// a database that fails here leases nothing, so nothing is given
    /// back). An error the database made fails the machine with the
    /// loop's backoff, in a lease of its own.
    fn prepare(
        &self,
        tx: &mut Tx<'_>,
        machine_id: Uuid,
        pick: Self::Pick,
    ) -> impl Future<Output = Result<Self::Item, BmdbError>>;

    /// The span a worker's logs carry.
    fn span(&self, machine_id: Uuid, item: &Self::Item) -> tracing::Span;

    /// The work on one leased machine. It may read and write under the
    /// work's session, but it does not end the work: the runner does, from
    /// the outcome.
    fn work<'a>(
        &'a self,
        work: &'a Work<Self::Item>,
    ) -> impl Future<Output = Outcome<Self::Record>> + 'a;

    /// Hears how a work whose outcome carried `record` ended (to count it,
    /// to log what the record means). Not called for work given back.
    fn ended(&self, _record: &Self::Record, _outcome: &WorkOutcome) {}
}

/// How a loop's work on one machine went.
#[derive(Debug)]
pub enum Outcome<R> {
    /// Done: the lease is finished and `R` written with it.
    Finished(R),
    /// Not done: the lease is failed with `cause` and the loop's backoff,
    /// and `record` (what was learned on the way) written with it.
    Failed { cause: String, record: R },
    /// Nothing was done to the machine and it is not its fault (the BMDB
    /// was away before the work began): the lease is cancelled with why,
    /// without a backoff.
    GiveBack(String),
}

/// What a work's outcome writes in the transaction that ends its lease.
pub trait Record {
    /// What the work did, for the history's `detail` (finished work).
    fn detail(&self) -> Option<&str> {
        None
    }

    fn write(
        &self,
        tx: &mut Tx<'_>,
        machine_id: Uuid,
    ) -> impl Future<Output = Result<(), BmdbError>>;
}

/// Nothing to write.
impl Record for () {
    async fn write(&self, _: &mut Tx<'_>, _: Uuid) -> Result<(), BmdbError> {
        Ok(())
    }
}

/// A worker's life: the work against its session's death, then its outcome
/// recorded. Every way out ends the lease, or leaves it to its dead session.
pub async fn run<L: LeaseLoop>(
    control: Rc<L>,
    backoff: Rc<Backoff>,
    mut work: Work<L::Item>,
) -> WorkOutcome {
    let session = work.session().clone();
    let outcome = tokio::select! {
        o = control.work(&work) => o,
        _ = session.expired() => {
            tracing::warn!("session died mid-{}; stopping", L::WORK);
            return WorkOutcome::Aborted;
        }
    };
    let mid = work.machine_id();
    let (record, ended) = match outcome {
        Outcome::Finished(record) => {
            let r = work
                .finish_noting(record.detail(), async |tx| record.write(tx, mid).await)
                .await;
            let ended = match r {
                Ok(()) => WorkOutcome::Finished,
                Err(BmdbError::SessionExpired(_)) => WorkOutcome::Aborted,
                // The database refused the record (an outage is retried
                // until recorded): fail the work, so it runs again after
                // the backoff.
                Err(e) => {
                    let cause = format!("recording the {}: {e}", L::WORK);
                    fail::<L>(&backoff, &mut work, cause, None).await
                }
            };
            (record, ended)
        }
        Outcome::Failed { cause, record } => {
            let ended = fail::<L>(&backoff, &mut work, cause, Some(&record)).await;
            (record, ended)
        }
        Outcome::GiveBack(cause) => {
            return match work.cancel_because(&cause).await {
                Ok(()) => WorkOutcome::Canceled(cause),
                Err(e) => {
                    tracing::warn!(%cause, error = %e, "could not give the machine back; the lease ends with its session");
                    WorkOutcome::Aborted
                }
            };
        }
    };
    control.ended(&record, &ended);
    ended
}

/// Ends `work` as failed with `cause` and the loop's backoff, writing
/// `record` with it; the outcome to report. A failure that cannot be
/// recorded with its record is recorded without it; one that cannot be
/// recorded at all cancels the lease, naming the cause.
async fn fail<L: LeaseLoop>(
    backoff: &Backoff,
    work: &mut Work<L::Item>,
    cause: String,
    record: Option<&L::Record>,
) -> WorkOutcome {
    let mid = work.machine_id();
    let mut record = record;
    loop {
        let r = work
            .fail_with(backoff, &cause, async |tx| match record {
                Some(r) => r.write(tx, mid).await,
                None => Ok(()),
            })
            .await;
        return match r {
            Ok(wait) => {
                tracing::warn!(%cause, retry_in_s = wait.as_secs(), "{} failed", L::WORK);
                WorkOutcome::Failed(cause)
            }
            Err(BmdbError::SessionExpired(_)) => {
                tracing::warn!(%cause, "{} failed; the session ended before that was recorded", L::WORK);
                WorkOutcome::Aborted
            }
            Err(e) if record.is_some() => {
                tracing::warn!(%cause, error = %e, "what the {} learned could not be recorded; recording the failure without it", L::WORK);
                record = None;
                continue;
            }
            Err(e) => {
                // Not recordable at all (the database refused it): the lease
                // must still end, so give the machine back, saying why.
                tracing::error!(%cause, error = %e, "{} failed and the failure could not be recorded; cancelling the lease", L::WORK);
                let why = format!("{cause} (the failure could not be recorded: {e})");
                if let Err(e) = work.cancel_because(&why).await {
                    tracing::error!(error = %e, "could not cancel the lease either; it ends with its session");
                }
                WorkOutcome::Failed(cause)
            }
        };
    }
}

/// Fails `machine_id` with `cause` and the loop's backoff, in a lease of
/// its own (its preparation was refused inside the lease that picked it,
/// which then rolled back).
async fn fail_preparation<L: LeaseLoop>(
    backoff: &Backoff,
    session: &Session,
    machine_id: Uuid,
    cause: &str,
) {
    let leased = session
        .lease(L::PROCESS, async move |_: &mut Tx<'_>| {
            Ok(Some((machine_id, ())))
        })
        .await;
    match leased {
        Ok(Some(mut w)) => match w.fail_with(backoff, cause, async |_| Ok(())).await {
            Ok(wait) => {
                tracing::warn!(%machine_id, %cause, retry_in_s = wait.as_secs(), "{} failed", L::WORK)
            }
            Err(e) => {
                tracing::warn!(%machine_id, %cause, error = %e, "could not record a failed preparation")
            }
        },
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(%machine_id, %cause, error = %e, "could not lease the machine to record a failed preparation")
        }
    }
}

/// Looks at a condition every `every` until it holds, until `deadline`
/// (then `None`). A look the BMDB could not answer (a restart, a
/// failover) is not the machine's fault: it is looked at again; a dead
/// session or another error ends the wait with it.
pub async fn wait_until<T>(
    session: &Session,
    every: Duration,
    deadline: std::time::Instant,
    mut look: impl AsyncFnMut(&mut Tx<'_>) -> Result<Option<T>, BmdbError>,
) -> Result<Option<T>, BmdbError> {
    loop {
        match session.transact(async |tx| look(tx).await).await {
            Ok(Some(t)) => return Ok(Some(t)),
            Ok(None) => {}
            Err(e) if e.is_transient() => {
                tracing::debug!(error = %e, "the BMDB did not answer a look; looking again")
            }
            Err(e) => return Err(e),
        }
        if std::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(every).await;
    }
}

/// How a worker's work ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkOutcome {
    Finished,
    Failed(String),
    /// The session died: nothing could be recorded.
    Aborted,
    /// Given back untouched (history `Canceled`, no backoff), with why.
    Canceled(String),
}

#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct WorkerDone {
    pub machine_id: Uuid,
    pub outcome: WorkOutcome,
    /// From the worker's start to its end.
    pub took: Duration,
}

#[derive(Message)]
#[rtype(result = "MailboxStatus")]
pub struct GetStatus;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MailboxStatus {
    pub name: &'static str,
    pub parallelism: usize,
    pub running: usize,
    pub leased: u64,
    pub finished: u64,
    pub failed: u64,
    pub aborted: u64,
    /// Lease transactions that found nothing to lease.
    pub idle_polls: u64,
    /// Picks lost to another leaser (the selector ran again).
    pub conflicts: u64,
    pub session: Option<Uuid>,
    pub leasing: bool,
    /// The last failure (a work's, naming its machine, or leasing's).
    pub last_error: Option<(std::time::SystemTime, String)>,
}

pub struct WorkMailbox<L: LeaseLoop> {
    control: Rc<L>,
    /// What a failure earns the machine (the loop's section's).
    backoff: Rc<Backoff>,
    parallelism: usize,
    poll_interval: Duration,
    session: Option<Session>,
    status: MailboxStatus,
    durations: Durations,
    /// A lease transaction is under way.
    in_lease: bool,
    poll_timer: Option<SpawnHandle>,
    draining: bool,
    /// Told when this mailbox stops by itself.
    supervisor: Option<Recipient<LoopStopped>>,
}

impl<L: LeaseLoop> WorkMailbox<L> {
    /// The mailbox of the loop `name` (its one name: the registry's, the
    /// logs', the status').
    pub fn new(
        name: &'static str,
        control: L,
        backoff: Backoff,
        parallelism: usize,
        poll_interval: Duration,
    ) -> Self {
        let parallelism = parallelism.max(1);
        WorkMailbox {
            status: MailboxStatus {
                name,
                parallelism,
                ..MailboxStatus::default()
            },
            control: Rc::new(control),
            backoff: Rc::new(backoff),
            durations: Durations::default(),
            parallelism,
            poll_interval,
            session: None,
            in_lease: false,
            poll_timer: None,
            draining: false,
            supervisor: None,
        }
    }

    /// Tells `supervisor` when this mailbox stops by itself.
    pub fn supervised_by(mut self, supervisor: Recipient<LoopStopped>) -> Self {
        self.supervisor = Some(supervisor);
        self
    }

    fn note_error(&mut self, error: String) {
        self.status.last_error = Some((std::time::SystemTime::now(), error));
    }

    /// Leases as long as there are free slots and machines to lease.
    fn fill(&mut self, ctx: &mut Context<Self>) {
        if self.in_lease || self.draining || self.status.running >= self.parallelism {
            return;
        }
        let Some(session) = self.session.clone() else {
            return;
        };
        if let Some(t) = self.poll_timer.take() {
            ctx.cancel_future(t);
        }
        self.in_lease = true;
        let control = self.control.clone();
        let process = L::PROCESS;
        let lease = async move {
            session
                .lease_prepared(
                    process,
                    async |tx| control.select(tx).await,
                    async |tx, id, pick| control.prepare(tx, id, pick).await,
                )
                .await
        };
        ctx.spawn(lease.into_actor(self).map(|(result, lost, preparing), act, ctx| {
            act.in_lease = false;
            act.status.conflicts += lost as u64;
            match result {
                Ok(Some(work)) => {
                    act.status.leased += 1;
                    act.status.running += 1;
                    tracing::debug!(mailbox = act.status.name, machine_id = %work.machine_id(), "leased");
                    let span = act.control.span(work.machine_id(), work.item());
                    Worker::<L>::start(
                        work.machine_id(),
                        run(act.control.clone(), act.backoff.clone(), work).instrument(span),
                        ctx.address().recipient(),
                    );
                    act.fill(ctx);
                }
                Ok(None) => {
                    act.status.idle_polls += 1;
                    act.poll_later(ctx, act.poll_interval)
                }
                Err(BmdbError::SessionExpired(id)) => {
                    tracing::warn!(mailbox = act.status.name, session_id = %id, "session expired; waiting for a new one");
                    act.session = None;
                    act.status.session = None;
                }
                Err(BmdbError::WorkConflict { .. }) => act.poll_later(ctx, Duration::from_millis(10)),
                Err(e) => match preparing.filter(|_| !e.is_transient()) {
                    // The machine's preparation was refused: its failure,
                    // with the backoff, so that the next poll picks
                    // another.
                    Some(machine_id) => {
                        let cause = format!("preparing the {}: {e}", L::WORK);
                        act.note_error(format!("machine {machine_id}: {cause}"));
                        act.status.failed += 1;
                        let (backoff, session) = (act.backoff.clone(), act.session.clone());
                        ctx.spawn(
                            async move {
                                if let Some(s) = session {
                                    fail_preparation::<L>(&backoff, &s, machine_id, &cause).await;
                                }
                            }
                            .into_actor(act)
                            .map(|_, act, ctx| act.poll_later(ctx, Duration::from_millis(10))),
                        );
                    }
                    None => {
                        tracing::warn!(mailbox = act.status.name, error = %e, "leasing failed");
                        act.note_error(format!("leasing: {e}"));
                        act.poll_later(ctx, act.poll_interval);
                    }
                },
            }
        }));
    }

    fn poll_later(&mut self, ctx: &mut Context<Self>, after: Duration) {
        if self.poll_timer.is_none() {
            self.poll_timer = Some(ctx.run_later(after, |act, ctx| {
                act.poll_timer = None;
                act.fill(ctx);
            }));
        }
    }
}

impl<L: LeaseLoop> Actor for WorkMailbox<L> {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Context<Self>) {
        // A drained loop's stop is its supervisor's doing.
        if let Some(s) = self.supervisor.as_ref().filter(|_| !self.draining) {
            s.do_send(LoopStopped {
                name: self.status.name,
            });
        }
    }
}

impl<L: LeaseLoop> Handler<SetSession> for WorkMailbox<L> {
    type Result = ();

    fn handle(&mut self, msg: SetSession, ctx: &mut Context<Self>) {
        self.session = msg.0;
        self.status.session = self.session.as_ref().map(Session::id);
        if let Some(s) = self.session.clone() {
            let id = s.id();
            // Forget the session the moment it is known dead.
            ctx.spawn(
                async move { s.expired().await }
                    .into_actor(self)
                    .map(move |_, act, _| {
                        if act.status.session == Some(id) {
                            act.session = None;
                            act.status.session = None;
                        }
                    }),
            );
            self.fill(ctx);
        }
    }
}

impl<L: LeaseLoop> Handler<WorkerDone> for WorkMailbox<L> {
    type Result = ();

    fn handle(&mut self, msg: WorkerDone, ctx: &mut Context<Self>) {
        self.status.running = self.status.running.saturating_sub(1);
        self.durations.observe(msg.took);
        match &msg.outcome {
            WorkOutcome::Finished => self.status.finished += 1,
            WorkOutcome::Failed(cause) => {
                self.status.failed += 1;
                self.note_error(format!("machine {}: {cause}", msg.machine_id));
            }
            WorkOutcome::Aborted | WorkOutcome::Canceled(_) => self.status.aborted += 1,
        }
        self.fill(ctx);
    }
}

impl<L: LeaseLoop> Handler<Drain> for WorkMailbox<L> {
    type Result = ();

    fn handle(&mut self, _: Drain, ctx: &mut Context<Self>) {
        self.draining = true;
        if let Some(t) = self.poll_timer.take() {
            ctx.cancel_future(t);
        }
    }
}

impl<L: LeaseLoop> Handler<RunRound> for WorkMailbox<L> {
    type Result = ();

    /// Looks for work now.
    fn handle(&mut self, _: RunRound, ctx: &mut Context<Self>) {
        self.fill(ctx);
    }
}

impl<L: LeaseLoop> Handler<GetLoopStatus> for WorkMailbox<L> {
    type Result = MessageResult<GetLoopStatus>;

    fn handle(&mut self, _: GetLoopStatus, _: &mut Context<Self>) -> Self::Result {
        let s = &self.status;
        MessageResult(LoopStatus {
            name: s.name,
            kind: LoopKind::Lease,
            process: Some(L::PROCESS.as_str()),
            shares_process: L::SHARES_PROCESS,
            session: s.session,
            active: self.session.is_some() && !self.draining,
            parallelism: s.parallelism,
            // A lease under way while draining is work the drain waits
            // for: it may commit, and its worker then runs.
            running: s.running + (self.draining && self.in_lease) as usize,
            done: s.finished,
            failed: s.failed,
            given_back: s.aborted,
            leased: s.leased,
            idle_polls: s.idle_polls,
            conflicts: s.conflicts,
            duty: None,
            last_error: s.last_error.clone(),
            durations: self.durations.clone(),
            own: None,
        })
    }
}

impl<L: LeaseLoop> Handler<GetStatus> for WorkMailbox<L> {
    type Result = MessageResult<GetStatus>;

    fn handle(&mut self, _: GetStatus, _: &mut Context<Self>) -> Self::Result {
        let mut s = self.status.clone();
        s.leasing = self.session.is_some() && !self.draining;
        MessageResult(s)
    }
}

/// One actor per leased machine: runs its control loop's job (which ends
/// the work) to an outcome, tells the mailbox, and stops. Generic over the
/// control loop it works for, so each loop's worker is a type of its own
/// (`InitializerWorker`, `RecovererWorker`) on one shared runner.
pub struct Worker<L: LeaseLoop> {
    job: Option<futures::future::LocalBoxFuture<'static, WorkOutcome>>,
    machine_id: Uuid,
    done: Recipient<WorkerDone>,
    outcome: WorkOutcome,
    started: Instant,
    _loop: std::marker::PhantomData<fn() -> L>,
}

impl<L: LeaseLoop> Worker<L> {
    pub fn start(
        machine_id: Uuid,
        job: impl Future<Output = WorkOutcome> + 'static,
        done: Recipient<WorkerDone>,
    ) -> Addr<Worker<L>> {
        Worker {
            job: Some(Box::pin(job)),
            machine_id,
            done,
            outcome: WorkOutcome::Aborted,
            started: Instant::now(),
            _loop: std::marker::PhantomData,
        }
        .start()
    }
}

impl<L: LeaseLoop> Actor for Worker<L> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let job = self.job.take().expect("a worker starts with its job");
        ctx.spawn(job.into_actor(self).map(|outcome, act, ctx| {
            act.outcome = outcome;
            ctx.stop();
        }));
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.done.do_send(WorkerDone {
            machine_id: self.machine_id,
            outcome: self.outcome.clone(),
            took: self.started.elapsed(),
        });
    }
}
