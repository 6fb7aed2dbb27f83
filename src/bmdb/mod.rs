//! The BMDB: the fleet database on PostgreSQL (shared/CONTRACTS.md §2).
//!
//! - [`Bmdb`]: a pool of connections; opens sessions, runs migrations.
//! - [`Session`]: a heartbeated lease on the right to work; every transaction
//!   made under it first checks it is alive. [`BmdbSession`] is the actor
//!   that keeps one alive and tells its subscribers when it dies.
//! - [`Work`]: a lease on one machine for one process, ended by `finish`,
//!   `fail` (writing a [`Backoff`]) or `cancel`, each recorded in history.
//! - [`selectors`]: the index-driven "needs agent start" and "needs recovery"
//!   queries.

pub mod actions;
pub mod bmc_boot;
pub mod boot;
pub mod brake;
pub mod callback;
mod conn;
pub mod console;
pub mod console_sessions;
pub mod devices;
pub mod discovery;
pub mod duty;
pub mod embedded;
pub mod error;
pub mod firmware;
pub mod firmware_grants;
pub mod hardware;
pub mod heartbeats;
pub mod installations;
pub mod lifecycle;
pub mod machines;
mod migrate;
mod model;
pub mod netboot;
pub mod overview;
pub mod plan_labels;
pub mod rollouts;
pub mod selectors;
pub mod servicing;
mod session;
mod session_keeper;
pub mod switches;
pub mod tenants;
mod work;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;
use uuid::Uuid;

pub use crate::backoff::{BACKOFF_CEILING_SECONDS, Backoff};
pub use conn::Tx;
pub use embedded::EmbeddedPostgres;
pub use error::BmdbError;
use error::describe_pg_error;
pub use migrate::MigrationReport;
pub use model::{HistoryEvent, InstallationResult, Process, Provider, ProviderStatus};
pub use session::Session;
pub use session_keeper::{
    BmdbSession, CloseSession, GetSession, SessionEndReason, SessionEnded, Subscribe,
};
pub use work::Work;

use crate::config::{BmdbConfig, Isolation};
use conn::{PgConn, PgManager};
/// The pool's last failure to open a connection, so that a checkout that
/// times out can say why.
#[derive(Clone, Default)]
struct LastConnectError(Arc<std::sync::Mutex<Option<(std::time::Instant, String)>>>);

impl std::fmt::Debug for LastConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LastConnectError")
    }
}

impl bb8::ErrorSink<tokio_postgres::Error> for LastConnectError {
    fn sink(&self, e: tokio_postgres::Error) {
        let message = describe_pg_error(&e);
        tracing::debug!(error = %message, "opening a BMDB connection failed");
        *self.0.lock().unwrap() = Some((std::time::Instant::now(), message));
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<tokio_postgres::Error>> {
        Box::new(self.clone())
    }
}

impl LastConnectError {
    /// The error behind a checkout timeout: a recent connect failure.
    fn pool_error(&self, waited: Duration, pool_size: u32) -> BmdbError {
        let recent = self
            .0
            .lock()
            .unwrap()
            .as_ref()
            .filter(|(at, _)| at.elapsed() <= waited + Duration::from_secs(1))
            .map(|(_, m)| m.clone());
        match recent {
            Some(m) => BmdbError::Unreachable(format!(
                "no connection within {waited:?}; last attempt: {m}"
            )),
            None => BmdbError::Pool(format!(
                "no free connection within {waited:?} (all {pool_size} in use)"
            )),
        }
    }
}

/// Settings that shape every transaction.
#[derive(Debug, Clone)]
pub struct BmdbOptions {
    pub isolation: Isolation,
    pub max_attempts: u32,
    pub session_interval: Duration,
    pub session_gc_grace: Duration,
    /// How long a transaction whose connection was lost before COMMIT is
    /// run again on new connections: a server restart, or a failover to
    /// another host, kills every pooled connection at once.
    pub failover_window: Duration,
}

impl From<&BmdbConfig> for BmdbOptions {
    fn from(c: &BmdbConfig) -> Self {
        BmdbOptions {
            isolation: c.isolation,
            max_attempts: c.max_attempts,
            session_interval: c.session_interval,
            session_gc_grace: c.session_gc_grace,
            failover_window: c.failover_window,
        }
    }
}

/// What the pool's transactions came to, since this process started
/// (`/metrics`: `shepherd_bmdb_transactions_total`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BmdbCounters {
    /// Transactions and statements that committed.
    pub committed: u64,
    /// Run again after a serialization failure or deadlock.
    pub retried_conflict: u64,
    /// Run again after their connection was lost before COMMIT (a restart
    /// or failover of the server).
    pub retried_connection: u64,
    /// Whose connection was lost during COMMIT: outcome unknown, handled
    /// by the caller's `CommitUnknown` rule.
    pub commit_unknown: u64,
    /// Failed: the error went to the caller.
    pub failed: u64,
    /// Statements run (BEGIN and COMMIT aside), by every handle of this
    /// process.
    pub statements: u64,
}

#[derive(Default)]
struct Counters {
    committed: AtomicU64,
    retried_conflict: AtomicU64,
    retried_connection: AtomicU64,
    commit_unknown: AtomicU64,
    failed: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> BmdbCounters {
        BmdbCounters {
            committed: self.committed.load(Ordering::Relaxed),
            retried_conflict: self.retried_conflict.load(Ordering::Relaxed),
            retried_connection: self.retried_connection.load(Ordering::Relaxed),
            commit_unknown: self.commit_unknown.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            statements: conn::STATEMENTS.load(Ordering::Relaxed),
        }
    }

    fn count<T>(&self, r: &Result<T, BmdbError>) {
        let c = match r {
            Ok(_) => &self.committed,
            Err(BmdbError::CommitUnknown(_)) => &self.commit_unknown,
            Err(_) => &self.failed,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// How every pool of a [`Bmdb`] is built: `size` connections, tested on
/// checkout only when closed or idle, waited for in slices (see
/// [`Bmdb::connect`]), its connect failures kept in `errors`.
fn pool_builder(
    size: u32,
    acquire_timeout: Duration,
    errors: &LastConnectError,
) -> bb8::Builder<PgManager> {
    bb8::Pool::builder()
        .max_size(size)
        .connection_timeout(acquire_timeout.min(POOL_WAIT_SLICE))
        .test_on_check_out(true)
        .error_sink(Box::new(errors.clone()))
}

/// A handle on the BMDB: cheap to clone, shared by every actor.
#[derive(Clone)]
pub struct Bmdb {
    inner: Arc<Inner>,
}

struct Inner {
    pool: bb8::Pool<PgManager>,
    /// What the pool connects with: a handle with a pool of its own
    /// ([`Bmdb::with_own_pool`]) connects the same way.
    pg: tokio_postgres::Config,
    options: BmdbOptions,
    acquire_timeout: Duration,
    pool_size: u32,
    connect_errors: LastConnectError,
    /// Shared by every handle on the BMDB, whichever pool it draws from.
    counters: Arc<Counters>,
    /// The connection sessions are kept alive through ([`Bmdb::keeper`]),
    /// opened at the first session.
    keeper: std::sync::OnceLock<Bmdb>,
    /// Kept alive as long as any handle is: the embedded server, if any.
    _embedded: Option<Arc<EmbeddedPostgres>>,
}

impl Bmdb {
    /// Connects as configured: to `bmdb.url`, or to an embedded PostgreSQL
    /// started under `bmdb.embedded.data_dir` when no URL is set. Runs the
    /// migrations when `bmdb.migrate_on_start` is set.
    pub async fn open(cfg: &BmdbConfig) -> Result<Bmdb, BmdbError> {
        let (pg, embedded) = match &cfg.url {
            Some(url) => {
                let mut pg: tokio_postgres::Config = url
                    .parse()
                    .map_err(|e| BmdbError::Invalid(format!("bmdb.url: {e}")))?;
                if let Some(pw) = &cfg.password {
                    pg.password(pw.expose());
                }
                (pg, None)
            }
            None => {
                let server = EmbeddedPostgres::start(&cfg.embedded).await?;
                (server.client_config(), Some(Arc::new(server)))
            }
        };
        let mut bmdb = Self::connect(
            pg,
            cfg.pool_size,
            cfg.connect_timeout,
            cfg.acquire_timeout,
            cfg.into(),
        )
        .await?;
        Arc::get_mut(&mut bmdb.inner)
            .expect("a freshly connected handle is not shared")
            ._embedded = embedded;
        if cfg.migrate_on_start {
            bmdb.migrate().await?;
        }
        Ok(bmdb)
    }

    /// Connects a pool to `pg`. Fails if the database cannot be reached.
    pub async fn connect(
        mut pg: tokio_postgres::Config,
        pool_size: u32,
        connect_timeout: Duration,
        acquire_timeout: Duration,
        options: BmdbOptions,
    ) -> Result<Bmdb, BmdbError> {
        pg.connect_timeout(connect_timeout);
        if pg.get_application_name().is_none() {
            pg.application_name("shepherd");
        }
        // Several hosts are a replicated cluster: only its primary takes
        // writes, and a connection must find it.
        if pg.get_hosts().len() > 1
            && pg.get_target_session_attrs() == tokio_postgres::config::TargetSessionAttrs::Any
        {
            pg.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
        }
        // A server whose host died answers nothing, not even a reset: the
        // kernel's keepalives find that out in seconds rather than after
        // the default two hours of silence (unless the URL says otherwise).
        if pg.get_keepalives() && pg.get_keepalives_idle() == KEEPALIVES_DEFAULT_IDLE {
            pg.keepalives_idle(Duration::from_secs(5));
            if pg.get_keepalives_interval().is_none() {
                pg.keepalives_interval(Duration::from_secs(2));
            }
            if pg.get_keepalives_retries().is_none() {
                pg.keepalives_retries(3);
            }
        }
        let connect_errors = LastConnectError::default();
        // Checkout tests a connection only when it is closed or has been
        // idle (a database restart leaves the pool full of dead ones); a
        // busy connection is handed out without a round trip.
        // bb8 uses one setting both for a checkout's wait and for how long
        // (and how sparsely: up to half of it between attempts) it retries
        // a connection that failed. A short slice keeps reconnecting brisk
        // after a database outage; `conn` waits slice after slice up to
        // `acquire_timeout`.
        let pool = pool_builder(pool_size, acquire_timeout, &connect_errors)
            .build(PgManager::new(pg.clone()))
            .await
            .map_err(BmdbError::from)?;
        // Fail now, with the server's reason, rather than at first use.
        drop(pool.dedicated_connection().await.map_err(|e| {
            let where_ = describe_target(&pg);
            match BmdbError::from(e) {
                BmdbError::Database { message, code } => BmdbError::Database {
                    message: format!("cannot connect to {where_}: {message}"),
                    code,
                },
                BmdbError::Unreachable(m) => {
                    BmdbError::Unreachable(format!("cannot connect to {where_}: {m}"))
                }
                other => other,
            }
        })?);
        Ok(Bmdb {
            inner: Arc::new(Inner {
                pool,
                pg,
                options,
                acquire_timeout,
                pool_size,
                connect_errors,
                counters: Arc::default(),
                keeper: Default::default(),
                _embedded: None,
            }),
        })
    }

    /// A handle on the same BMDB that draws from a pool of its own, of up
    /// to `size` connections, opened as they are needed: the admin API's,
    /// so that fleet work holding every connection of the shared pool (an
    /// enrollment storm) never turns an operator's request into a 503.
    /// `size` 0: the same pool as this handle.
    pub fn with_own_pool(&self, size: u32) -> Bmdb {
        if size == 0 {
            return self.clone();
        }
        let connect_errors = LastConnectError::default();
        let pool = pool_builder(size, self.inner.acquire_timeout, &connect_errors)
            .build_unchecked(PgManager::new(self.inner.pg.clone()));
        Bmdb {
            inner: Arc::new(Inner {
                pool,
                pg: self.inner.pg.clone(),
                options: self.inner.options.clone(),
                acquire_timeout: self.inner.acquire_timeout,
                pool_size: size,
                connect_errors,
                counters: self.inner.counters.clone(),
                keeper: Default::default(),
                _embedded: self.inner._embedded.clone(),
            }),
        }
    }

    /// The handle sessions start, heartbeat and close through: a
    /// connection of their own, so that fleet work holding every connection
    /// of the pool (a thousand agents reporting at once) never delays a
    /// heartbeat past its deadline, which would cost every lease.
    pub(crate) fn keeper(&self) -> Bmdb {
        self.inner
            .keeper
            .get_or_init(|| self.with_own_pool(1))
            .clone()
    }

    pub fn options(&self) -> &BmdbOptions {
        &self.inner.options
    }

    /// What this process's transactions came to so far.
    pub fn counters(&self) -> BmdbCounters {
        self.inner.counters.snapshot()
    }

    pub(crate) async fn conn(&self) -> Result<bb8::PooledConnection<'_, PgManager>, BmdbError> {
        let deadline = std::time::Instant::now() + self.inner.acquire_timeout;
        loop {
            match self.inner.pool.get().await {
                Ok(c) => return Ok(c),
                Err(bb8::RunError::User(e)) => return Err(e.into()),
                Err(bb8::RunError::TimedOut) if std::time::Instant::now() < deadline => {}
                Err(bb8::RunError::TimedOut) => {
                    return Err(self
                        .inner
                        .connect_errors
                        .pool_error(self.inner.acquire_timeout, self.inner.pool_size));
                }
            }
        }
    }

    /// Runs one idempotent statement, which is its own transaction, outside
    /// any session: one round trip instead of three (for the hot path: a
    /// batch of heartbeats). Retried like a transaction; a connection lost
    /// before the answer means the statement may have been applied, which
    /// is why it must be idempotent.
    pub async fn query_idempotent(
        &self,
        sql: &'static str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, BmdbError> {
        self.retrying(async |conn| conn.query_alone(sql, params).await)
            .await
    }

    /// Whether the BMDB answers a query (readiness), retried like any.
    pub async fn ping(&self) -> Result<(), BmdbError> {
        self.query_idempotent("SELECT 1", &[]).await.map(|_| ())
    }

    /// Runs `f` in a transaction outside any session (reads, fixtures,
    /// administration). Retries on serialization failure.
    pub async fn transact<T>(
        &self,
        f: impl AsyncFnMut(&mut Tx<'_>) -> Result<T, BmdbError>,
    ) -> Result<T, BmdbError> {
        self.run_tx(None, f).await
    }

    /// Runs `f`, a read of several statements, in a transaction whose
    /// statements all see the same moment: what one page or API answer
    /// shows is never half of one change and half of the next.
    pub async fn snapshot<T>(
        &self,
        mut f: impl AsyncFnMut(&mut Tx<'_>) -> Result<T, BmdbError>,
    ) -> Result<T, BmdbError> {
        let isolation = self.inner.options.isolation;
        self.retrying(async |conn| attempt_tx(conn, isolation, true, None, &mut f).await)
            .await
    }

    /// The one transaction loop: begin (with the session check pipelined),
    /// run `f`, commit, under [`Bmdb::retrying`].
    pub(crate) async fn run_tx<T>(
        &self,
        session: Option<Uuid>,
        mut f: impl AsyncFnMut(&mut Tx<'_>) -> Result<T, BmdbError>,
    ) -> Result<T, BmdbError> {
        let isolation = self.inner.options.isolation;
        self.retrying(async |conn| attempt_tx(conn, isolation, false, session, &mut f).await)
            .await
    }

    /// Runs `attempt` on a fresh checkout until it is done: on a
    /// serialization failure or deadlock it waits a jittered while and runs
    /// again (up to `max_attempts`); on a connection lost mid-way it runs
    /// again on another connection, for up to `failover_window` (a
    /// server restart kills every pooled connection at once).
    async fn retrying<T>(
        &self,
        attempt: impl AsyncFnMut(&mut PgConn) -> Result<T, BmdbError>,
    ) -> Result<T, BmdbError> {
        let r = self.retrying_uncounted(attempt).await;
        self.inner.counters.count(&r);
        r
    }

    async fn retrying_uncounted<T>(
        &self,
        mut attempt: impl AsyncFnMut(&mut PgConn) -> Result<T, BmdbError>,
    ) -> Result<T, BmdbError> {
        let max_attempts = self.inner.options.max_attempts;
        let window = self.inner.options.failover_window;
        let counters = &self.inner.counters;
        let mut attempts = 0u32;
        let mut lost = 0u32;
        let mut lost_since = None;
        loop {
            // A fresh checkout each attempt: a lost connection is discarded
            // by the pool and the next one is tested.
            let mut conn = self.conn().await?;
            attempts += 1;
            match attempt(&mut conn).await {
                Err(e) if e.is_retryable() => {
                    if attempts >= max_attempts {
                        return Err(BmdbError::RetriesExhausted {
                            attempts,
                            last: e.to_string(),
                        });
                    }
                    counters.retried_conflict.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(attempts, error = %e, "retrying");
                    drop(conn);
                    tokio::time::sleep(retry_delay(attempts)).await;
                }
                Err(BmdbError::Unreachable(m))
                    if lost_since
                        .get_or_insert_with(std::time::Instant::now)
                        .elapsed()
                        < window =>
                {
                    lost += 1;
                    attempts -= 1;
                    counters.retried_connection.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(lost, error = %m, "connection lost mid-way; retrying");
                    conn.mark_broken();
                    drop(conn);
                    tokio::time::sleep(Duration::from_millis(50 << lost.min(4))).await;
                }
                Err(e @ BmdbError::Unreachable(_)) => {
                    conn.mark_broken();
                    return Err(e);
                }
                other => return other,
            }
        }
    }
}

/// One wait of a checkout, and the window in which the pool retries a
/// failed connection (at most half of it apart).
const POOL_WAIT_SLICE: Duration = Duration::from_secs(1);

/// tokio-postgres' keepalive idle time unless told otherwise.
const KEEPALIVES_DEFAULT_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

const SESSION_CHECK: &str =
    "SELECT 1 FROM sessions WHERE session_id = $1 AND session_deadline > now() FOR KEY SHARE";

async fn attempt_tx<T>(
    conn: &mut PgConn,
    isolation: Isolation,
    snapshot: bool,
    session: Option<Uuid>,
    f: &mut impl AsyncFnMut(&mut Tx<'_>) -> Result<T, BmdbError>,
) -> Result<T, BmdbError> {
    let check;
    let first: Option<(&'static str, &[&(dyn tokio_postgres::types::ToSql + Sync)])> =
        match &session {
            Some(id) => {
                check = [id as &(dyn tokio_postgres::types::ToSql + Sync)];
                Some((SESSION_CHECK, &check[..]))
            }
            None => None,
        };
    let (mut tx, rows) = conn.begin(isolation, snapshot, first).await?;
    if let Some(id) = session
        && rows.is_empty()
    {
        let _ = tx.rollback().await;
        return Err(BmdbError::SessionExpired(id));
    }
    match f(&mut tx).await {
        Ok(v) => match tx.commit().await {
            Ok(()) => Ok(v),
            Err(BmdbError::Unreachable(m)) => Err(BmdbError::CommitUnknown(m)),
            Err(e) => Err(e),
        },
        Err(e) => {
            // The connection stays usable: a failed rollback marks it for
            // rollback at its next use.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// Exponential with full jitter: up to 2ms, 4ms, … 256ms.
fn retry_delay(attempt: u32) -> Duration {
    let ceiling = 1u64 << attempt.min(8);
    Duration::from_micros(rand::rng().random_range(0..=ceiling * 1000))
}

fn describe_target(pg: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let ports = pg.get_ports();
    let mut hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            // One port for all hosts, or one each.
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match h {
                Host::Tcp(h) => format!("{h}:{port}"),
                Host::Unix(p) => format!("{}:{port}", p.display()),
            }
        })
        .collect();
    if hosts.is_empty() {
        hosts.push("localhost:5432".into());
    }
    let db = pg.get_dbname().unwrap_or("(default database)");
    match hosts.as_slice() {
        [one] => format!("PostgreSQL at {one}, database {db}"),
        many => format!(
            "PostgreSQL at {} (the writable one), database {db}",
            many.join(", ")
        ),
    }
}
