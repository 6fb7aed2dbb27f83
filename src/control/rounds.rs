//! The round runner: work over the whole fleet on a timer, written once.
//!
//! A loop ([`Round`]) says what it is called, how often it runs, which
//! fleet duty it needs (if any), what one round does under a session, and
//! how a round's outcome adds to its counters. [`RoundRunner`] owns the
//! rest: the interval, the session, one round at a time, the duty (the
//! shepherd holding it works, the others stand by and say who holds it),
//! counting rounds and failed rounds, logging a failure with the next
//! round's time, a round on demand (`RunRound`), telling its supervisor
//! when it stops (`LoopStopped`), and pacing a round's steps ([`Pace`]).

use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;

use super::messages::{
    Drain, Durations, GetLoopStatus, LoopKind, LoopStatus, LoopStopped, RunRound, SetSession,
};
use crate::bmdb::Session;
use crate::bmdb::duty::{Duty, DutyRoundError, Holder, Turn, note_holder, on_duty};
use crate::fault::{Blame, Whose};

/// A loop that works in rounds on a timer.
pub trait Round: 'static {
    /// What one round returns.
    type Outcome: 'static;
    /// What the rounds add up to, for status pages and `/metrics`.
    type Counters: Clone + Default + std::fmt::Debug + Unpin + Send + Sync + 'static;
    /// Why a round failed, saying whose fault it was.
    type Error: Blame + 'static;

    /// The loop's one name: in the registry, the logs ("provisioner
    /// round failed"), the pages, the API and `/metrics`.
    const NAME: &'static str;
    /// The fleet duty a round needs: only the shepherd holding it works.
    const DUTY: Option<Duty> = None;
    /// Whether a round runs as soon as a session is handed over (and not
    /// only at the next tick).
    const AT_SESSION: bool = false;
    /// Whether a failed round is worth a warning (else a debug line: a
    /// loop that only watches).
    const WARN_ON_FAILURE: bool = true;

    fn interval(&self) -> Duration;

    /// One round under `session`, knowing what the rounds so far added up
    /// to. An error is the round's cause, logged by the runner (a passing
    /// one of shepherd's own, such as the BMDB away, without a warning).
    fn round<'a>(
        &'a self,
        session: &'a Session,
        counters: &'a Self::Counters,
    ) -> impl Future<Output = Result<Self::Outcome, Self::Error>> + 'a;

    /// Adds a round's outcome to the counters.
    fn tally(&self, counters: &mut Self::Counters, outcome: Self::Outcome);
}

/// What a round runner has done.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundStatus<C> {
    pub name: &'static str,
    /// Rounds run by this process (a stand-by is not a round).
    pub rounds: u64,
    pub failed_rounds: u64,
    /// Who holds the loop's fleet duty as of the last round (None before
    /// the first, or for a loop without one).
    pub duty: Option<Holder>,
    /// The last failed round: when, and its cause.
    pub last_error: Option<(std::time::SystemTime, String)>,
    pub counters: C,
}

/// A round's steps paced `every` apart (an API's budget: the Provisioner's
/// creations), each only while the round's session lives: the first step
/// at once, each next one after the interval, and an error naming the
/// session's end instead of a step under a dead session.
pub struct Pace<'a> {
    session: &'a Session,
    every: Duration,
    steps: u64,
}

impl<'a> Pace<'a> {
    pub fn new(session: &'a Session, every: Duration) -> Self {
        Pace {
            session,
            every,
            steps: 0,
        }
    }

    /// Waits for the next step's turn; `SessionExpired` if the session
    /// ended meanwhile.
    pub async fn next(&mut self) -> Result<(), crate::bmdb::BmdbError> {
        if self.steps > 0 && !self.every.is_zero() {
            tokio::time::sleep(self.every).await;
        }
        self.steps += 1;
        if self.session.is_expired() {
            return Err(crate::bmdb::BmdbError::SessionExpired(self.session.id()));
        }
        Ok(())
    }
}

pub struct RoundRunner<R: Round> {
    round: Rc<R>,
    session: Option<Session>,
    in_round: bool,
    draining: bool,
    status: RoundStatus<R::Counters>,
    durations: Durations,
    /// Told when this runner stops by itself.
    supervisor: Option<Recipient<LoopStopped>>,
}

impl<R: Round> RoundRunner<R> {
    pub fn new(round: R) -> Self {
        RoundRunner {
            round: Rc::new(round),
            session: None,
            in_round: false,
            draining: false,
            status: RoundStatus {
                name: R::NAME,
                ..RoundStatus::default()
            },
            durations: Durations::default(),
            supervisor: None,
        }
    }

    /// Tells `supervisor` when this runner stops by itself.
    pub fn supervised_by(mut self, supervisor: Recipient<LoopStopped>) -> Self {
        self.supervisor = Some(supervisor);
        self
    }

    fn run_round(&mut self, ctx: &mut Context<Self>) {
        if self.in_round {
            return;
        }
        let Some(session) = self.session.clone() else {
            return;
        };
        self.in_round = true;
        let started = std::time::Instant::now();
        let round = self.round.clone();
        let counters = self.status.counters.clone();
        let work = async move {
            let one = round.round(&session, &counters);
            match R::DUTY {
                Some(duty) => on_duty(&session, duty, one).await,
                None => one.await.map(Turn::Done).map_err(DutyRoundError::Round),
            }
        };
        ctx.spawn(work.into_actor(self).map(move |r, act, _| {
            act.in_round = false;
            match r {
                Ok(Turn::StandBy(holder)) => act.note_duty(Holder::Other(holder)),
                Ok(Turn::Done(outcome)) => {
                    act.note_duty(Holder::Us);
                    act.status.rounds += 1;
                    act.durations.observe(started.elapsed());
                    act.round.tally(&mut act.status.counters, outcome);
                }
                Err(e) => {
                    act.status.rounds += 1;
                    act.status.failed_rounds += 1;
                    act.durations.observe(started.elapsed());
                    act.status.last_error = Some((std::time::SystemTime::now(), e.to_string()));
                    // A round cut short by a shutdown or a lost session is
                    // not worth a warning; the BMDB away is said once by
                    // the session, not by every loop.
                    if act.session.is_none() || !R::WARN_ON_FAILURE {
                        tracing::debug!(error = %e, "{} round stopped or failed", R::NAME);
                    } else if e.whose() == Whose::Ours {
                        tracing::info!(error = %e, "{} round could not run; next round in {}",
                            R::NAME, humantime::format_duration(act.round.interval()));
                    } else {
                        tracing::warn!(error = %e, "{} round failed; next round in {}",
                            R::NAME, humantime::format_duration(act.round.interval()));
                    }
                }
            }
        }));
    }

    fn note_duty(&mut self, now: Holder) {
        if let Some(duty) = R::DUTY {
            note_holder(duty, &mut self.status.duty, now);
        }
    }
}

impl<R: Round> Actor for RoundRunner<R> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.round.interval(), |act, ctx| act.run_round(ctx));
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // A drained loop's stop is its supervisor's doing.
        if let Some(s) = self.supervisor.as_ref().filter(|_| !self.draining) {
            s.do_send(LoopStopped { name: R::NAME });
        }
    }
}

impl<R: Round> Handler<SetSession> for RoundRunner<R> {
    type Result = ();

    fn handle(&mut self, msg: SetSession, ctx: &mut Context<Self>) {
        if self.draining {
            return;
        }
        self.session = msg.0;
        if R::AT_SESSION {
            self.run_round(ctx);
        }
    }
}

impl<R: Round> Handler<RunRound> for RoundRunner<R> {
    type Result = ();

    fn handle(&mut self, _: RunRound, ctx: &mut Context<Self>) {
        self.run_round(ctx);
    }
}

impl<R: Round> Handler<Drain> for RoundRunner<R> {
    type Result = ();

    /// No more rounds: a round under way ends by itself (its session is
    /// closed after the drain).
    fn handle(&mut self, _: Drain, _: &mut Context<Self>) {
        self.draining = true;
        self.session = None;
    }
}

impl<R: Round> Handler<GetLoopStatus> for RoundRunner<R> {
    type Result = MessageResult<GetLoopStatus>;

    fn handle(&mut self, _: GetLoopStatus, _: &mut Context<Self>) -> Self::Result {
        let s = &self.status;
        MessageResult(LoopStatus {
            name: R::NAME,
            kind: LoopKind::Round,
            process: None,
            shares_process: false,
            session: self.session.as_ref().map(Session::id),
            active: self.session.is_some() && !self.draining,
            parallelism: 1,
            running: self.in_round as usize,
            done: s.rounds - s.failed_rounds,
            failed: s.failed_rounds,
            given_back: 0,
            leased: 0,
            idle_polls: 0,
            conflicts: 0,
            duty: s.duty,
            last_error: s.last_error.clone(),
            durations: self.durations.clone(),
            own: Some(std::sync::Arc::new(s.counters.clone())),
        })
    }
}
