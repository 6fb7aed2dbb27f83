//! The Supervisor: owns the session and the registry of control loops.
//!
//! - It opens a session and hands it to every loop; when the session dies
//!   it takes it from them, opens a new one (with backoff) and hands that
//!   over.
//! - A loop that stops by itself is started again, with backoff.
//! - On SIGINT or SIGTERM it drains: no loop starts anything more, running
//!   work on leased machines may finish for up to
//!   `supervisor.drain_timeout`; then it closes the session (which cancels
//!   what is left, in the history) and stops.
//!
//! Its files: `parts.rs` (what is built from the configuration before any
//! actor starts), `loops.rs` (the loops this configuration runs, one
//! registration each), `start.rs` (starting it all, and `shepherd run`).

mod loops;
mod parts;
mod start;

use std::time::Duration;

use actix::prelude::*;

use crate::bmdb::{Bmdb, BmdbSession, CloseSession, GetSession, Session, SessionEnded, Subscribe};
use crate::config::Config;
use crate::control::{LoopStopped, NudgeLoop, Registry};
use crate::status::{GetSupervisorStatus, SupervisorStatus};

pub use loops::{LoopInputs, registrations};
pub use parts::Parts;
pub use start::{Running, run, start, start_with};

/// A new session is tried at most this far apart while the database is
/// away (or `restart_backoff`, if longer): an attempt costs one connection
/// attempt, and shepherd should be back within seconds of the database.
const MAX_SESSION_RETRY: Duration = Duration::from_secs(2);

pub struct Supervisor {
    cfg: Config,
    bmdb: Bmdb,
    /// The endpoint this process serves agents at, recorded with every
    /// session heartbeat.
    serves: Option<String>,
    loops: Registry,
    session: Option<Addr<BmdbSession>>,
    /// The session's handle, to close it even when its actor is gone.
    session_handle: Option<Session>,
    session_backoff: Duration,
    sessions_opened: u64,
    sessions_lost: u64,
    shutting_down: bool,
}

/// Drain and stop. Resolves when the session is closed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown;

impl Supervisor {
    pub fn new(cfg: Config, parts: Parts, loops: Registry) -> Supervisor {
        Supervisor {
            cfg,
            bmdb: parts.bmdb,
            serves: parts.serves,
            loops,
            session: None,
            session_handle: None,
            session_backoff: Duration::ZERO,
            sessions_opened: 0,
            sessions_lost: 0,
            shutting_down: false,
        }
    }

    fn open_session(&mut self, ctx: &mut Context<Self>) {
        if self.shutting_down {
            return;
        }
        let bmdb = self.bmdb.clone();
        let me = ctx.address();
        let serves = self.serves.clone();
        ctx.spawn(
            async move {
                let addr = BmdbSession::open_serving(&bmdb, "shepherd", serves).await?;
                addr.send(Subscribe(me.recipient())).await.map_err(|e| crate::BmdbError::Invalid(e.to_string()))?;
                let session = addr.send(GetSession).await.map_err(|e| crate::BmdbError::Invalid(e.to_string()))?;
                Ok::<_, crate::BmdbError>((addr, session))
            }
            .into_actor(self)
            .map(|r, act, ctx| match r {
                Ok((addr, session)) => {
                    tracing::info!(session_id = %session.id(), "session open; provisioning and taking over");
                    act.session_backoff = Duration::ZERO;
                    act.sessions_opened += 1;
                    if act.shutting_down {
                        // Opened after the drain began: closed at once,
                        // nothing handed over.
                        addr.do_send(CloseSession);
                        return;
                    }
                    act.session = Some(addr);
                    act.session_handle = Some(session.clone());
                    act.loops.hand_over(Some(session));
                }
                Err(e) => {
                    act.session_backoff = next_backoff(act.session_backoff, act.cfg.supervisor.restart_backoff);
                    tracing::warn!(error = %e, retry_in = %humantime::format_duration(act.session_backoff), "could not open a session");
                    ctx.run_later(act.session_backoff, |act, ctx| act.open_session(ctx));
                }
            }),
        );
    }
}

fn next_backoff(last: Duration, initial: Duration) -> Duration {
    if last.is_zero() {
        initial
    } else {
        (last * 2).min(MAX_SESSION_RETRY.max(initial))
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.loops.start_all(ctx.address().recipient(), None);
        self.open_session(ctx);
    }
}

impl Handler<SessionEnded> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: SessionEnded, ctx: &mut Context<Self>) {
        if self.shutting_down {
            return;
        }
        tracing::warn!(session_id = %msg.session_id, reason = %msg.reason, "session ended; opening a new one");
        self.sessions_lost += 1;
        self.session = None;
        self.session_handle = None;
        self.loops.hand_over(None);
        self.session_backoff =
            next_backoff(self.session_backoff, self.cfg.supervisor.restart_backoff);
        ctx.run_later(self.session_backoff, |act, ctx| act.open_session(ctx));
    }
}

impl Handler<LoopStopped> for Supervisor {
    type Result = ();

    /// A loop stopped by itself: started again after `restart_backoff`,
    /// under the current session.
    fn handle(&mut self, msg: LoopStopped, ctx: &mut Context<Self>) {
        if self.shutting_down {
            return;
        }
        self.loops.stopped(msg.name);
        let wait = self.cfg.supervisor.restart_backoff;
        tracing::error!(r#loop = msg.name, restart_in = %humantime::format_duration(wait), "a control loop stopped; restarting it");
        ctx.run_later(wait, move |act, ctx| {
            if act.shutting_down {
                return;
            }
            let me = ctx.address().recipient();
            let Some(s) = act.session.clone() else {
                act.loops.start(msg.name, me, None);
                return;
            };
            // The session's handle, asked of its actor, then the start.
            ctx.spawn(
                async move { s.send(GetSession).await.ok() }
                    .into_actor(act)
                    .map(move |session, act, _| {
                        act.loops.start(msg.name, me, session);
                    }),
            );
        });
    }
}

impl Handler<NudgeLoop> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: NudgeLoop, _: &mut Context<Self>) {
        if !self.loops.nudge(msg.0) {
            tracing::debug!(r#loop = msg.0, "no such loop runs here: not nudged");
        }
    }
}

impl Handler<GetSupervisorStatus> for Supervisor {
    type Result = ResponseFuture<SupervisorStatus>;

    fn handle(&mut self, _: GetSupervisorStatus, _: &mut Context<Self>) -> Self::Result {
        let session = self.session.clone();
        let loops = self.loops.statuses();
        let (sessions_opened, sessions_lost) = (self.sessions_opened, self.sessions_lost);
        Box::pin(async move {
            let session = match session {
                Some(s) => s
                    .send(GetSession)
                    .await
                    .ok()
                    .filter(|s| !s.is_expired())
                    .map(|s| s.id()),
                None => None,
            };
            SupervisorStatus {
                session,
                sessions_opened,
                sessions_lost,
                loops: loops.await,
            }
        })
    }
}

impl Handler<Shutdown> for Supervisor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _: Shutdown, _: &mut Context<Self>) -> Self::Result {
        self.shutting_down = true;
        let session = self.session.take();
        let handle = self.session_handle.take();
        // Nothing may start under the session once the drain begins.
        self.loops.hand_over(None);
        let drain = self.loops.drain(self.cfg.supervisor.drain_timeout);
        Box::pin(
            async move {
                match drain.await {
                    0 => tracing::info!("drained: no work running"),
                    running => {
                        tracing::warn!(running, "drain timeout: cancelling the work still running")
                    }
                }
                // Closed by its actor (which then stops heartbeating); when
                // that actor is gone (it ended the session by our clock
                // during the drain), by the handle: the row and its leases
                // must go now, not when another shepherd collects them.
                let by_actor = match session {
                    Some(s) => s.send(CloseSession).await.ok(),
                    None => None,
                };
                let closed = match (by_actor, handle) {
                    (Some(r), _) => r,
                    (None, Some(h)) => h.close().await,
                    (None, None) => Ok(()),
                };
                if let Err(e) = closed {
                    tracing::warn!(error = %e, "could not close the session; it will expire");
                }
            }
            .into_actor(self),
        )
    }
}
