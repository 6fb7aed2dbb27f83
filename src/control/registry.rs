//! The loops a shepherd runs, each registered once.
//!
//! A loop is declared by one [`Registration`]: its name, its kind (lease
//! or round) and how to build it (with its settings). The [`Registry`]
//! then gives every loop the same things without the loop writing any of
//! them, as controller-runtime's manager does for its controllers: it
//! starts it (and starts it again when it stops by itself), hands it the
//! session, drains it, asks it for its [`LoopStatus`] (which the pages,
//! the API and `/metrics` show alike for every loop), and runs it on
//! demand ([`NudgeLoop`]).

use std::future::Future;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::leases::{LeaseLoop, WorkMailbox};
use super::messages::{
    Drain, GetLoopStatus, LoopKind, LoopStatus, LoopStopped, RunRound, SetSession,
};
use super::rounds::{Round, RoundRunner};
use crate::bmdb::{Backoff, Session};
use crate::config::{LeaseDefaults, LeaseSettings};

/// A running loop, as its supervisor reaches it.
#[derive(Clone)]
pub struct LoopHandle {
    session: Recipient<SetSession>,
    drain: Recipient<Drain>,
    status: Recipient<GetLoopStatus>,
    nudge: Recipient<RunRound>,
}

impl LoopHandle {
    fn of<A>(addr: Addr<A>) -> LoopHandle
    where
        A: Actor<Context = Context<A>>
            + Handler<SetSession>
            + Handler<Drain>
            + Handler<GetLoopStatus>
            + Handler<RunRound>,
    {
        LoopHandle {
            session: addr.clone().recipient(),
            drain: addr.clone().recipient(),
            status: addr.clone().recipient(),
            nudge: addr.recipient(),
        }
    }
}

type Start = Box<dyn Fn(Recipient<LoopStopped>) -> LoopHandle>;

/// One loop, declared once: its name, its kind, how to build and start it.
pub struct Registration {
    pub name: &'static str,
    pub kind: LoopKind,
    start: Start,
}

impl Registration {
    /// A loop on the lease runner, named after its configuration section,
    /// with that section's backoff, parallelism and poll interval; `make`
    /// builds it each time it starts.
    pub fn lease<L: LeaseLoop, D: LeaseDefaults>(
        settings: &LeaseSettings<D>,
        make: impl Fn() -> L + 'static,
    ) -> Registration {
        Registration::lease_named(
            D::SECTION,
            settings.backoff(),
            settings.parallelism as usize,
            settings.poll_interval,
            make,
        )
    }

    /// A loop on the lease runner, named `name`, its failures earning
    /// `backoff`.
    pub fn lease_named<L: LeaseLoop>(
        name: &'static str,
        backoff: Backoff,
        parallelism: usize,
        poll_interval: Duration,
        make: impl Fn() -> L + 'static,
    ) -> Registration {
        Registration {
            name,
            kind: LoopKind::Lease,
            start: Box::new(move |stopped| {
                LoopHandle::of(
                    WorkMailbox::new(name, make(), backoff.clone(), parallelism, poll_interval)
                        .supervised_by(stopped)
                        .start(),
                )
            }),
        }
    }

    /// A loop on the round runner, named [`Round::NAME`]; `make` builds
    /// it (with its interval) each time it starts.
    pub fn round<R: Round>(make: impl Fn() -> R + 'static) -> Registration {
        Registration {
            name: R::NAME,
            kind: LoopKind::Round,
            start: Box::new(move |stopped| {
                LoopHandle::of(RoundRunner::new(make()).supervised_by(stopped).start())
            }),
        }
    }
}

/// Every loop of a shepherd, and the running ones' handles.
#[derive(Default)]
pub struct Registry {
    loops: Vec<(Registration, Option<LoopHandle>)>,
}

impl Registry {
    pub fn new(registrations: Vec<Registration>) -> Registry {
        let mut r = Registry::default();
        for reg in registrations {
            r.register(reg);
        }
        r
    }

    /// Adds a loop (started with the others, or by [`Registry::start`]).
    /// A second loop of the same name replaces the first.
    pub fn register(&mut self, reg: Registration) {
        self.loops.retain(|(r, _)| r.name != reg.name);
        self.loops.push((reg, None));
    }

    /// The loops' names, in the order they were registered.
    pub fn names(&self) -> Vec<&'static str> {
        self.loops.iter().map(|(r, _)| r.name).collect()
    }

    /// Starts the loop `name` (again), telling `stopped` when it stops by
    /// itself, and hands it `session`. False when no loop has that name.
    pub fn start(
        &mut self,
        name: &str,
        stopped: Recipient<LoopStopped>,
        session: Option<Session>,
    ) -> bool {
        let Some((reg, handle)) = self.loops.iter_mut().find(|(r, _)| r.name == name) else {
            return false;
        };
        let h = (reg.start)(stopped);
        if session.is_some() {
            h.session.do_send(SetSession(session));
        }
        *handle = Some(h);
        true
    }

    /// Starts every loop.
    pub fn start_all(&mut self, stopped: Recipient<LoopStopped>, session: Option<Session>) {
        for name in self.names() {
            self.start(name, stopped.clone(), session.clone());
        }
    }

    /// Forgets the handle of a loop that stopped.
    pub fn stopped(&mut self, name: &str) {
        for (r, h) in &mut self.loops {
            if r.name == name {
                *h = None;
            }
        }
    }

    fn running(&self) -> impl Iterator<Item = (&Registration, &LoopHandle)> {
        self.loops
            .iter()
            .filter_map(|(r, h)| h.as_ref().map(|h| (r, h)))
    }

    /// Hands `session` (or None: start nothing more) to every loop.
    pub fn hand_over(&self, session: Option<Session>) {
        for (_, h) in self.running() {
            h.session.do_send(SetSession(session.clone()));
        }
    }

    /// Runs the loop `name` now. False when none runs by that name.
    pub fn nudge(&self, name: &str) -> bool {
        match self.running().find(|(r, _)| r.name == name) {
            Some((_, h)) => {
                h.nudge.do_send(RunRound);
                true
            }
            None => false,
        }
    }

    /// Every running loop's status, in registration order.
    pub fn statuses(&self) -> impl Future<Output = Vec<LoopStatus>> + 'static {
        let asks: Vec<_> = self
            .running()
            .map(|(r, h)| (r.name, r.kind, h.status.clone()))
            .collect();
        async move {
            let mut out = Vec::with_capacity(asks.len());
            for (name, kind, status) in asks {
                match status.send(GetLoopStatus).await {
                    Ok(s) => out.push(s),
                    // Stopped between the look and the answer: say so.
                    Err(_) => out.push(LoopStatus {
                        name,
                        kind,
                        ..LoopStatus::default()
                    }),
                }
            }
            out
        }
    }

    /// Drains every loop: nothing new starts; then waits up to `timeout`
    /// for the lease loops' running work to end. The work still running
    /// then (0 when drained).
    pub fn drain(&self, timeout: Duration) -> impl Future<Output = usize> + 'static {
        let handles: Vec<(LoopKind, LoopHandle)> =
            self.running().map(|(r, h)| (r.kind, h.clone())).collect();
        async move {
            for (_, h) in &handles {
                let _ = h.drain.send(Drain).await;
            }
            let deadline = Instant::now() + timeout;
            loop {
                let mut running = 0;
                for (kind, h) in &handles {
                    if *kind == LoopKind::Lease {
                        running += h
                            .status
                            .send(GetLoopStatus)
                            .await
                            .map(|s| s.running)
                            .unwrap_or(0);
                    }
                }
                if running == 0 || Instant::now() >= deadline {
                    return running;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
