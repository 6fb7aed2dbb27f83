//! The `BmdbSession` actor: keeps one BMDB session (`bmdb::session`)
//! alive on a thread of its own, pokes its deadline every interval / 2,
//! garbage-collects sessions expired past the grace period, and tells its
//! subscribers when its own session dies.

use std::time::{Duration, Instant};

use actix::prelude::*;
use uuid::Uuid;

use super::session::Session;
use super::{Bmdb, BmdbError};

/// The thread sessions are kept on (one per actix system): a heartbeat
/// there, and its own connection's I/O, are never held up by the fleet's
/// work on the main thread (a thousand agents' calls and TLS, a switch
/// round's read-backs). A main loop held up for seconds at the start of an
/// erase storm cost the session, and every lease with it, though the
/// database answered.
fn keeper_thread() -> actix::ArbiterHandle {
    static KEEPERS: std::sync::Mutex<Vec<(usize, actix::ArbiterHandle)>> =
        std::sync::Mutex::new(Vec::new());
    let system = actix::System::current().id();
    let mut keepers = KEEPERS.lock().unwrap();
    keepers.retain(|(_, h)| h.spawn(async {}));
    if let Some((_, h)) = keepers.iter().find(|(s, _)| *s == system) {
        return h.clone();
    }
    let h = actix::Arbiter::new().handle();
    keepers.push((system, h.clone()));
    h
}

/// Why a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEndReason {
    /// The deadline passed or the row is gone.
    Expired,
    /// The database could not be reached until past the deadline.
    Unreachable(String),
    /// Closed on request.
    Closed,
}

impl std::fmt::Display for SessionEndReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionEndReason::Expired => {
                f.write_str("expired (the deadline passed or the row is gone)")
            }
            SessionEndReason::Unreachable(e) => {
                write!(f, "database unreachable until the deadline: {e}")
            }
            SessionEndReason::Closed => f.write_str("closed"),
        }
    }
}

/// Sent to subscribers when the session dies.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct SessionEnded {
    pub session_id: Uuid,
    pub reason: SessionEndReason,
}

/// Subscribe to `SessionEnded`. A subscriber added after the end is told at
/// once.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Subscribe(pub Recipient<SessionEnded>);

#[derive(Message)]
#[rtype(result = "Session")]
pub struct GetSession;

/// Orderly stop: deletes the session row, then stops the actor.
#[derive(Message)]
#[rtype(result = "Result<(), BmdbError>")]
pub struct CloseSession;

/// The actor owning one session: heartbeat, expiry detection, garbage
/// collection of other expired sessions, orderly close.
pub struct BmdbSession {
    session: Session,
    subscribers: Vec<Recipient<SessionEnded>>,
    poking: bool,
    /// Heartbeats failed in a row; the next is retried sooner than the
    /// regular tick, so a short outage does not cost the session.
    failures: u32,
    retry: Option<SpawnHandle>,
    ended: Option<SessionEndReason>,
    /// A close is under way: no more heartbeats, and no end but its own.
    closing: bool,
    /// A collection of expired sessions is under way.
    collecting: bool,
    /// When the regular tick last ran: a tick much later than its period
    /// means this process's event loop was held up, not the database.
    ticked: Instant,
}

impl BmdbSession {
    /// Opens a session and starts its actor.
    pub async fn open(bmdb: &Bmdb, component: &str) -> Result<Addr<BmdbSession>, BmdbError> {
        Self::open_serving(bmdb, component, None).await
    }

    /// As [`BmdbSession::open`], for a process serving the agent callback
    /// at `serves` (see [`Bmdb::start_session_serving`]).
    ///
    /// The session is started and kept on a thread of its own
    /// ([`keeper_thread`]); the calling thread, where the work runs, shows
    /// every second that it runs, and the session is let go once it has
    /// not for an interval (a process whose work is stuck keeps no lease).
    pub async fn open_serving(
        bmdb: &Bmdb,
        component: &str,
        serves: Option<String>,
    ) -> Result<Addr<BmdbSession>, BmdbError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (bmdb, component) = (bmdb.clone(), component.to_string());
        // What is sent over is Send; the start itself runs there.
        let spawned = keeper_thread().spawn_fn(move || {
            actix::spawn(async move {
                let r = match bmdb.start_session_serving(&component, None, serves).await {
                    Ok(session) => {
                        session.note_main_alive();
                        Ok((session.clone(), BmdbSession::new(session).start()))
                    }
                    Err(e) => Err(e),
                };
                let _ = tx.send(r);
            });
        });
        let gone = || BmdbError::Unreachable("the sessions' thread stopped".into());
        if !spawned {
            return Err(gone());
        }
        let (session, addr) = rx.await.map_err(|_| gone())??;
        // The main loop's sign of life, until the session ends.
        actix::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            while !session.is_expired() {
                every.tick().await;
                session.note_main_alive();
            }
        });
        Ok(addr)
    }

    pub fn new(session: Session) -> Self {
        BmdbSession {
            session,
            subscribers: Vec::new(),
            poking: false,
            failures: 0,
            retry: None,
            ended: None,
            closing: false,
            collecting: false,
            ticked: Instant::now(),
        }
    }

    fn end(&mut self, reason: SessionEndReason, ctx: &mut Context<Self>) {
        if self.ended.is_some() {
            return;
        }
        match &reason {
            SessionEndReason::Closed => {}
            r => tracing::warn!(session_id = %self.session.id(), reason = %r, "BMDB session ended"),
        }
        self.session.mark_expired();
        for s in &self.subscribers {
            s.do_send(SessionEnded {
                session_id: self.session.id(),
                reason: reason.clone(),
            });
        }
        self.ended = Some(reason);
        ctx.stop();
    }

    fn heartbeat(&mut self, ctx: &mut Context<Self>) {
        if self.poking || self.ended.is_some() || self.closing {
            return;
        }
        if let Some(h) = self.retry.take() {
            ctx.cancel_future(h);
        }
        let session = self.session.clone();
        if let Some(quiet) = session
            .main_quiet_for()
            .filter(|q| *q >= session.interval())
        {
            // The work this session stands for has not run for an
            // interval: let the session go, so that its machines pass to
            // another shepherd, rather than hold them from a stuck one.
            tracing::warn!(session_id = %session.id(), quiet_ms = quiet.as_millis() as u64,
                "this process's main loop has not run for an interval: the session is not kept alive");
            return;
        }
        self.poking = true;
        // A poke that cannot land before the deadline is useless: give up on
        // it in time to try again.
        let left = session.deadline().saturating_duration_since(Instant::now());
        let timeout = (session.interval() / 2)
            .min(left)
            .max(Duration::from_millis(100));
        let sent = Instant::now();
        let fut = async move {
            match tokio::time::timeout(timeout, session.poke()).await {
                Ok(r) => r?,
                // How long it really took says whose the delay was: far
                // past the timeout, this process was too busy to notice.
                Err(_) => {
                    return Err(BmdbError::Unreachable(format!(
                        "heartbeat took longer than {timeout:?} (given up after {:.1?})",
                        sent.elapsed()
                    )));
                }
            }
            let took = sent.elapsed();
            if took > session.interval() / 4 {
                tracing::warn!(session_id = %session.id(), took_ms = took.as_millis() as u64, "session heartbeat slow");
            }
            Ok::<_, BmdbError>(())
        };
        ctx.spawn(fut.into_actor(self).map(move |r, act, ctx| {
            act.poking = false;
            match r {
                Ok(()) => {
                    if act.failures > 0 {
                        tracing::info!(session_id = %act.session.id(), failures = act.failures, "session heartbeat succeeded again");
                    }
                    act.failures = 0;
                    act.collect(ctx);
                }
                Err(BmdbError::SessionExpired(_)) => act.end(SessionEndReason::Expired, ctx),
                Err(e) if act.session.is_expired() => {
                    act.end(SessionEndReason::Unreachable(e.to_string()), ctx)
                }
                Err(e) => {
                    act.failures += 1;
                    // 250 ms, 500 ms, then every second until the deadline.
                    let wait = Duration::from_millis(250 << (act.failures - 1).min(2));
                    if act.failures == 1 {
                        tracing::warn!(session_id = %act.session.id(), error = %e, "session heartbeat failed; retrying until the deadline");
                    } else {
                        tracing::debug!(session_id = %act.session.id(), error = %e, failures = act.failures, "session heartbeat failed again");
                    }
                    act.retry = Some(ctx.run_later(wait, |act, ctx| {
                        act.retry = None;
                        act.heartbeat(ctx);
                    }));
                }
            }
        }));
    }

    /// Deletes sessions expired past the grace period, after a good
    /// heartbeat, one collection at a time. Housekeeping on the fleet's
    /// pool: it never holds up the next heartbeat, and its failure is not
    /// the session's.
    fn collect(&mut self, ctx: &mut Context<Self>) {
        if self.collecting {
            return;
        }
        self.collecting = true;
        let bmdb = self.session.bmdb().clone();
        let grace = bmdb.options().session_gc_grace;
        let fut = async move {
            if let Err(e) = bmdb.collect_expired_sessions(grace).await {
                tracing::warn!(error = %e, "garbage collection of expired sessions failed");
            }
        };
        ctx.spawn(
            fut.into_actor(self)
                .map(|(), act, _| act.collecting = false),
        );
    }
}

impl Actor for BmdbSession {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let period = self.session.interval() / 2;
        // The deadline runs from the start's send: a start that was slow to
        // commit leaves less than an interval, so the first poke goes now.
        self.heartbeat(ctx);
        self.ticked = Instant::now();
        ctx.run_interval(period, move |act, ctx| {
            let late = act.ticked.elapsed().saturating_sub(period);
            act.ticked = Instant::now();
            if late > Duration::from_secs(1) {
                tracing::warn!(session_id = %act.session.id(), late_ms = late.as_millis() as u64,
                    "session heartbeat ran late: this process's event loop was held up");
            }
            act.heartbeat(ctx);
        });
        // The deadline by our clock (send time of the last good poke plus the
        // interval) is never later than the database's: once it passes, the
        // session is dead to us, whatever a heartbeat in flight may say.
        ctx.run_interval(Duration::from_millis(250).min(period), |act, ctx| {
            // A closing session is expired by its own close: its end is
            // the close's, once the DELETE committed (ending it now would
            // drop the close with the actor).
            if act.ended.is_none() && !act.closing && act.session.is_expired() {
                act.end(
                    SessionEndReason::Unreachable(
                        "no successful heartbeat before the deadline".into(),
                    ),
                    ctx,
                );
            }
        });
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.session.mark_expired();
    }
}

impl Handler<Subscribe> for BmdbSession {
    type Result = ();

    fn handle(&mut self, msg: Subscribe, _ctx: &mut Context<Self>) {
        if let Some(reason) = &self.ended {
            msg.0.do_send(SessionEnded {
                session_id: self.session.id(),
                reason: reason.clone(),
            });
        }
        self.subscribers.push(msg.0);
    }
}

impl Handler<GetSession> for BmdbSession {
    type Result = MessageResult<GetSession>;

    fn handle(&mut self, _: GetSession, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult(self.session.clone())
    }
}

/// Not atomic: a heartbeat in flight holds the session row until it
/// commits, and the close's DELETE waits for it. An atomic handler would
/// stop the actor from driving that heartbeat to its COMMIT: each waiting
/// for the other, for ever.
impl Handler<CloseSession> for BmdbSession {
    type Result = ResponseActFuture<Self, Result<(), BmdbError>>;

    fn handle(&mut self, _: CloseSession, _ctx: &mut Context<Self>) -> Self::Result {
        self.closing = true;
        let session = self.session.clone();
        Box::pin(
            async move { session.close().await }
                .into_actor(self)
                .map(|r, act, ctx| {
                    act.end(SessionEndReason::Closed, ctx);
                    r
                }),
        )
    }
}
