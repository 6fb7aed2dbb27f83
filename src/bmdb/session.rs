//! Sessions: the right of one process to work on the BMDB, kept alive by
//! heartbeats.
//!
//! A session is alive while `session_deadline > now()` (the database's
//! clock). [`Session`] is a cheap handle; every transaction made under it
//! first checks, in the same round trip as BEGIN, that it is alive, and takes
//! a KEY SHARE lock on the row so garbage collection cannot delete it under a
//! running transaction. The actor that keeps it alive, on a thread of its
//! own, is `BmdbSession` (`bmdb/session_keeper.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use uuid::Uuid;

use super::{Bmdb, BmdbError, Tx};

#[derive(Clone)]
pub struct Session {
    inner: Arc<SessionInner>,
}

struct SessionInner {
    id: Uuid,
    bmdb: Bmdb,
    component: String,
    interval: Duration,
    expired: watch::Sender<bool>,
    /// The deadline by our clock: when the last successful poke (or the
    /// start) was sent, plus the interval. Never later than the database's,
    /// so past it the session is dead whatever the database is doing.
    deadline: std::sync::Mutex<Instant>,
    /// The agent callback endpoint this process serves: each start and
    /// poke also extends its service (`bmdb::callback`).
    serves: Option<String>,
    /// When the process's main loop (where its work runs) last showed it
    /// runs, if it is watched (`BmdbSession::open_serving`): the session
    /// is kept on a thread of its own, and let go once the work it stands
    /// for has not run for an interval.
    main_alive: std::sync::Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.inner.id)
            .field("component", &self.inner.component)
            .finish()
    }
}

const SESSION_START: &str = "INSERT INTO sessions (session_id, session_component_name, session_runtime_info, \
     session_created_at, session_interval_seconds, session_deadline) \
     VALUES ($1, $2, $3, now(), $4, now() + $4::int * interval '1 second')";

const SESSION_POKE: &str = "UPDATE sessions SET session_deadline = now() + make_interval(secs => session_interval_seconds) \
     WHERE session_id = $1 AND session_deadline > now()";

/// Ends a session: work still held is released and recorded as canceled.
const SESSION_DELETE: &str = "WITH released AS ( \
         DELETE FROM work WHERE session_id = $1 RETURNING machine_id, process), \
     history AS ( \
         INSERT INTO work_history (machine_id, process, event, \"timestamp\", failed_cause) \
         SELECT machine_id, process, 'Canceled', now(), 'session closed' FROM released) \
     DELETE FROM sessions WHERE session_id = $1";

/// Deletes sessions expired for longer than the grace period, recording the
/// work they held as canceled; deleting the session releases the work.
const SESSION_GC: &str = "WITH dead AS ( \
         DELETE FROM sessions WHERE session_deadline < now() - make_interval(secs => $1) \
         RETURNING session_id), \
     released AS ( \
         DELETE FROM work WHERE session_id IN (SELECT session_id FROM dead) \
         RETURNING machine_id, process) \
     INSERT INTO work_history (machine_id, process, event, \"timestamp\", failed_cause) \
     SELECT machine_id, process, 'Canceled', now(), 'session expired' FROM released";

impl Bmdb {
    /// Opens a session for `component` (e.g. `shepherd-initializer`), alive
    /// for one interval from now. Keep it alive with `BmdbSession` or
    /// [`Session::poke`].
    pub async fn start_session(
        &self,
        component: &str,
        interval: Option<Duration>,
    ) -> Result<Session, BmdbError> {
        self.start_session_serving(component, interval, None).await
    }

    /// As [`Bmdb::start_session`], for a process that serves the agent
    /// callback at `serves`: the session's start and every poke record that
    /// the endpoint is served (`bmdb::callback`), so silence is judged only
    /// while someone listens.
    pub async fn start_session_serving(
        &self,
        component: &str,
        interval: Option<Duration>,
        serves: Option<String>,
    ) -> Result<Session, BmdbError> {
        let interval = interval.unwrap_or(self.options().session_interval);
        let secs = interval.as_secs().max(1) as i32;
        let id = Uuid::new_v4();
        let sent = Instant::now();
        let runtime_info = format!(
            "shepherd {} pid {} host {}",
            env!("CARGO_PKG_VERSION"),
            std::process::id(),
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_default()
        );
        let served_for = Duration::from_secs(secs as u64);
        self.keeper()
            .transact(async |tx| {
                tx.execute(SESSION_START, &[&id, &component, &runtime_info, &secs])
                    .await?;
                if let Some(e) = &serves {
                    super::callback::serve(tx, e, served_for).await?;
                }
                Ok(())
            })
            .await?;
        tracing::info!(session_id = %id, component, interval_s = secs, "BMDB session started");
        Ok(Session {
            inner: Arc::new(SessionInner {
                id,
                bmdb: self.clone(),
                component: component.to_string(),
                interval: Duration::from_secs(secs as u64),
                expired: watch::channel(false).0,
                deadline: std::sync::Mutex::new(sent + Duration::from_secs(secs as u64)),
                serves,
                main_alive: std::sync::Mutex::new(None),
            }),
        })
    }

    /// Deletes sessions expired for longer than `grace`, with their work.
    /// Returns how many work leases were released.
    pub async fn collect_expired_sessions(&self, grace: Duration) -> Result<u64, BmdbError> {
        let secs = grace.as_secs_f64();
        let released = self
            .transact(async |tx| tx.execute(SESSION_GC, &[&secs]).await)
            .await?;
        if released > 0 {
            tracing::info!(released, "released work of expired sessions");
        }
        Ok(released)
    }
}

impl Session {
    pub fn id(&self) -> Uuid {
        self.inner.id
    }

    pub fn bmdb(&self) -> &Bmdb {
        &self.inner.bmdb
    }

    pub fn interval(&self) -> Duration {
        self.inner.interval
    }

    pub fn component(&self) -> &str {
        &self.inner.component
    }

    /// Runs `f` in a transaction under this session: fails with
    /// `SessionExpired` (and marks the session expired) if it is not alive.
    pub async fn transact<T>(
        &self,
        f: impl AsyncFnMut(&mut Tx<'_>) -> Result<T, BmdbError>,
    ) -> Result<T, BmdbError> {
        if self.is_expired() {
            return Err(BmdbError::SessionExpired(self.id()));
        }
        let r = self.inner.bmdb.run_tx(Some(self.id()), f).await;
        if let Err(BmdbError::SessionExpired(_)) = &r {
            self.mark_expired();
        }
        r
    }

    /// Extends the deadline by one interval. `SessionExpired` if it had
    /// already passed (or the row is gone).
    pub async fn poke(&self) -> Result<(), BmdbError> {
        let id = self.id();
        let sent = Instant::now();
        let (serves, interval) = (self.inner.serves.as_deref(), self.inner.interval);
        let n = self
            .inner
            .bmdb
            .keeper()
            .transact(async |tx| {
                let n = tx.execute(SESSION_POKE, &[&id]).await?;
                if let (1, Some(e)) = (n, serves) {
                    super::callback::serve(tx, e, interval).await?;
                }
                Ok(n)
            })
            .await?;
        if n == 0 {
            self.mark_expired();
            return Err(BmdbError::SessionExpired(id));
        }
        let mut d = self.inner.deadline.lock().unwrap();
        *d = (*d).max(sent + self.inner.interval);
        Ok(())
    }

    /// When the session dies unless poked before, by our clock.
    pub fn deadline(&self) -> Instant {
        *self.inner.deadline.lock().unwrap()
    }

    /// Ends the session: deletes its row, which releases its work.
    pub async fn close(&self) -> Result<(), BmdbError> {
        let id = self.id();
        self.mark_expired();
        self.inner
            .bmdb
            .keeper()
            .transact(async |tx| tx.execute(SESSION_DELETE, &[&id]).await)
            .await?;
        tracing::info!(session_id = %id, "BMDB session closed");
        Ok(())
    }

    /// Dead: marked so, or past its deadline by our clock.
    pub fn is_expired(&self) -> bool {
        if *self.inner.expired.borrow() {
            return true;
        }
        if Instant::now() >= self.deadline() {
            self.mark_expired();
            return true;
        }
        false
    }

    /// Resolves once the session is known to be dead (marked, or past its
    /// deadline by our clock).
    pub async fn expired(&self) {
        let mut rx = self.inner.expired.subscribe();
        loop {
            if self.is_expired() {
                return;
            }
            let deadline = tokio::time::Instant::from_std(self.deadline());
            tokio::select! {
                r = rx.changed() => if r.is_err() { return },
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    pub(crate) fn mark_expired(&self) {
        self.inner.expired.send_replace(true);
    }

    /// The main loop ran just now.
    pub(super) fn note_main_alive(&self) {
        *self.inner.main_alive.lock().unwrap() = Some(Instant::now());
    }

    /// How long the main loop has not been seen running (None: not
    /// watched).
    pub(super) fn main_quiet_for(&self) -> Option<Duration> {
        self.inner.main_alive.lock().unwrap().map(|t| t.elapsed())
    }
}
