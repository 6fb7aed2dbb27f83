//! The work-lease mailbox: the runner every control loop shares.
//!
//! A control loop answers three questions: which machine needs me (its
//! selector), what do I do with one (its worker actor), how do I back off
//! (the worker's business, through `Work::fail`). [`WorkMailbox`] owns the
//! rest: it leases machines under the current session, one worker per
//! leased machine, up to `parallelism` at once; it refills a free slot as
//! soon as a worker reports done, and polls every `poll_interval` when there
//! was nothing to do. Without a session it waits for one; when its session
//! dies, the workers notice (they watch it) and stop, and the mailbox waits
//! for the next.

use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use uuid::Uuid;

use crate::bmdb::{BmdbError, Process, Session, Tx, Work};

/// A control loop, as the mailbox runs it.
pub trait ControlLoop: 'static {
    /// What the selector hands the worker with each machine.
    type Item: 'static;

    fn process(&self) -> Process;

    /// For logs and status: `initializer`, `recoverer`.
    fn name(&self) -> &'static str;

    /// Picks one machine, inside the lease transaction.
    fn select(
        &self,
        tx: &mut Tx<'_>,
    ) -> impl Future<Output = Result<Option<(Uuid, Self::Item)>, BmdbError>>;

    /// Starts the worker for a leased machine. The worker must end the work
    /// (or see its session die) and then send `WorkerDone` to `done`.
    fn start_worker(&self, work: Work<Self::Item>, done: Recipient<WorkerDone>);
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
}

/// The session to lease under, or None to stop leasing.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetSession(pub Option<Session>);

/// Stop taking new work (a drain); running workers go on.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopLeasing;

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
}

pub struct WorkMailbox<C: ControlLoop> {
    control: Rc<C>,
    parallelism: usize,
    poll_interval: Duration,
    session: Option<Session>,
    status: MailboxStatus,
    /// A lease transaction is under way.
    in_lease: bool,
    poll_timer: Option<SpawnHandle>,
    draining: bool,
}

impl<C: ControlLoop> WorkMailbox<C> {
    pub fn new(control: C, parallelism: usize, poll_interval: Duration) -> Self {
        let parallelism = parallelism.max(1);
        WorkMailbox {
            status: MailboxStatus {
                name: control.name(),
                parallelism,
                ..MailboxStatus::default()
            },
            control: Rc::new(control),
            parallelism,
            poll_interval,
            session: None,
            in_lease: false,
            poll_timer: None,
            draining: false,
        }
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
        let process = control.process();
        let lease = async move {
            session
                .lease_counted(process, async |tx| control.select(tx).await)
                .await
        };
        ctx.spawn(lease.into_actor(self).map(|(result, lost), act, ctx| {
            act.in_lease = false;
            act.status.conflicts += lost as u64;
            match result {
                Ok(Some(work)) => {
                    act.status.leased += 1;
                    act.status.running += 1;
                    tracing::debug!(mailbox = act.status.name, machine_id = %work.machine_id(), "leased");
                    act.control.start_worker(work, ctx.address().recipient());
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
                Err(e) => {
                    tracing::warn!(mailbox = act.status.name, error = %e, "leasing failed");
                    act.poll_later(ctx, act.poll_interval);
                }
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

impl<C: ControlLoop> Actor for WorkMailbox<C> {
    type Context = Context<Self>;
}

impl<C: ControlLoop> Handler<SetSession> for WorkMailbox<C> {
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

impl<C: ControlLoop> Handler<WorkerDone> for WorkMailbox<C> {
    type Result = ();

    fn handle(&mut self, msg: WorkerDone, ctx: &mut Context<Self>) {
        self.status.running = self.status.running.saturating_sub(1);
        match &msg.outcome {
            WorkOutcome::Finished => self.status.finished += 1,
            WorkOutcome::Failed(_) => self.status.failed += 1,
            WorkOutcome::Aborted | WorkOutcome::Canceled(_) => self.status.aborted += 1,
        }
        self.fill(ctx);
    }
}

impl<C: ControlLoop> Handler<StopLeasing> for WorkMailbox<C> {
    type Result = ();

    fn handle(&mut self, _: StopLeasing, ctx: &mut Context<Self>) {
        self.draining = true;
        if let Some(t) = self.poll_timer.take() {
            ctx.cancel_future(t);
        }
    }
}

impl<C: ControlLoop> Handler<GetStatus> for WorkMailbox<C> {
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
pub struct Worker<C: ControlLoop> {
    job: Option<futures::future::LocalBoxFuture<'static, WorkOutcome>>,
    machine_id: Uuid,
    done: Recipient<WorkerDone>,
    outcome: WorkOutcome,
    _loop: std::marker::PhantomData<fn() -> C>,
}

impl<C: ControlLoop> Worker<C> {
    pub fn start(
        machine_id: Uuid,
        job: impl Future<Output = WorkOutcome> + 'static,
        done: Recipient<WorkerDone>,
    ) -> Addr<Worker<C>> {
        Worker {
            job: Some(Box::pin(job)),
            machine_id,
            done,
            outcome: WorkOutcome::Aborted,
            _loop: std::marker::PhantomData,
        }
        .start()
    }
}

impl<C: ControlLoop> Actor for Worker<C> {
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
        });
    }
}
