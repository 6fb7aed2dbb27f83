//! Pooled PostgreSQL connections with a per-connection prepared statement
//! cache, and the transaction type every BMDB query runs in.
//!
//! Statements are prepared once per connection and reused, so a query costs
//! one round trip. BEGIN is pipelined with the first statement of a
//! transaction (the session liveness check), so a transaction costs one
//! round trip more than its statements: the COMMIT.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row, Statement};

use super::BmdbError;
use crate::config::Isolation;

/// A pooled connection: the client, its statement cache, and whether a
/// transaction is open on it (if so when it goes back to the pool, its user
/// was cancelled, and the connection is discarded).
pub struct PgConn {
    client: Client,
    statements: HashMap<&'static str, Statement>,
    in_transaction: bool,
    /// When a transaction last ended on it: an idle connection is tested
    /// before it is handed out.
    last_used: Instant,
    /// Lost mid-use: the pool must not hand it out again.
    broken: bool,
}

/// Statements this process ran in the BMDB (BEGIN and COMMIT aside):
/// `shepherd_bmdb_statements_total`.
pub(crate) static STATEMENTS: AtomicU64 = AtomicU64::new(0);

/// A connection idle for longer than this is pinged at checkout (a server
/// restart or failover kills idle connections without our knowing).
const IDLE_CHECK_AFTER: Duration = Duration::from_secs(1);

impl PgConn {
    pub(crate) fn mark_broken(&mut self) {
        self.broken = true;
    }

    pub(crate) fn client_mut(&mut self) -> &mut Client {
        &mut self.client
    }

    /// `sql`'s prepared statement, about to run (counted in
    /// [`STATEMENTS`]).
    async fn statement(&mut self, sql: &'static str) -> Result<Statement, tokio_postgres::Error> {
        STATEMENTS.fetch_add(1, Ordering::Relaxed);
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql).await?;
        self.statements.insert(sql, s.clone());
        Ok(s)
    }

    /// Runs one statement as its own transaction (no BEGIN or COMMIT: one
    /// round trip). A caller dropped mid-statement leaves the connection
    /// marked as in use, and the pool discards it.
    pub(crate) async fn query_alone(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, BmdbError> {
        let stmt = self.statement(sql).await?;
        self.in_transaction = true;
        let rows = self.client.query(&stmt, params).await;
        self.in_transaction = false;
        self.last_used = Instant::now();
        Ok(rows?)
    }

    /// Starts a transaction and, in the same round trip, runs `first` (the
    /// session check) if given. Returns the transaction and `first`'s rows.
    /// `snapshot`: a transaction whose statements all see one moment
    /// (REPEATABLE READ; SERIALIZABLE already is one). Not READ ONLY: a
    /// write refused as read-only reads as a standby's refusal (25006), a
    /// lost connection, and would be retried for the failover window.
    pub(crate) async fn begin(
        &mut self,
        isolation: Isolation,
        snapshot: bool,
        first: Option<(&'static str, &[&(dyn ToSql + Sync)])>,
    ) -> Result<(Tx<'_>, Vec<Row>), BmdbError> {
        let begin = match (isolation, snapshot) {
            (Isolation::ReadCommitted, false) => "BEGIN ISOLATION LEVEL READ COMMITTED",
            (Isolation::ReadCommitted, true) => "BEGIN ISOLATION LEVEL REPEATABLE READ",
            (Isolation::Serializable, _) => "BEGIN ISOLATION LEVEL SERIALIZABLE",
        };
        let rows = match first {
            Some((sql, params)) => {
                let stmt = self.statement(sql).await?;
                self.in_transaction = true;
                // Both requests are written before either reply is read.
                let (b, rows) = futures::join!(
                    self.client.batch_execute(begin),
                    self.client.query(&stmt, params)
                );
                b?;
                rows?
            }
            None => {
                self.in_transaction = true;
                self.client.batch_execute(begin).await?;
                Vec::new()
            }
        };
        Ok((Tx { conn: self }, rows))
    }
}

/// An open transaction. Commit with [`Tx::commit`]; anything else rolls back.
pub struct Tx<'a> {
    conn: &'a mut PgConn,
}

impl Tx<'_> {
    pub async fn query(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, BmdbError> {
        let stmt = self.conn.statement(sql).await?;
        Ok(self.conn.client.query(&stmt, params).await?)
    }

    pub async fn query_opt(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, BmdbError> {
        let stmt = self.conn.statement(sql).await?;
        Ok(self.conn.client.query_opt(&stmt, params).await?)
    }

    pub async fn query_one(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, BmdbError> {
        let stmt = self.conn.statement(sql).await?;
        Ok(self.conn.client.query_one(&stmt, params).await?)
    }

    pub async fn execute(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, BmdbError> {
        let stmt = self.conn.statement(sql).await?;
        Ok(self.conn.client.execute(&stmt, params).await?)
    }

    pub(crate) async fn commit(self) -> Result<(), BmdbError> {
        let r = self.conn.client.batch_execute("COMMIT").await;
        self.conn.in_transaction = false;
        self.conn.last_used = Instant::now();
        Ok(r?)
    }

    pub(crate) async fn rollback(self) -> Result<(), BmdbError> {
        let r = self.conn.client.batch_execute("ROLLBACK").await;
        self.conn.in_transaction = false;
        self.conn.last_used = Instant::now();
        Ok(r?)
    }
}

/// bb8 connection manager for [`PgConn`].
pub struct PgManager {
    config: tokio_postgres::Config,
}

impl PgManager {
    pub fn new(config: tokio_postgres::Config) -> Self {
        PgManager { config }
    }
}

impl bb8::ManageConnection for PgManager {
    type Connection = PgConn;
    type Error = tokio_postgres::Error;

    async fn connect(&self) -> Result<PgConn, tokio_postgres::Error> {
        let (client, connection) = self.config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %super::error::describe_pg_error(&e), "BMDB connection closed");
            }
        });
        Ok(PgConn {
            client,
            statements: HashMap::new(),
            in_transaction: false,
            last_used: Instant::now(),
            broken: false,
        })
    }

    /// At checkout: a closed connection fails at once (no round trip); one
    /// idle for a while is pinged; a busy one is trusted.
    async fn is_valid(&self, conn: &mut PgConn) -> Result<(), tokio_postgres::Error> {
        if conn.client.is_closed() || conn.last_used.elapsed() >= IDLE_CHECK_AFTER {
            conn.client.batch_execute("").await?;
            conn.last_used = Instant::now();
        }
        Ok(())
    }

    /// On return to the pool. A connection whose user was cancelled in the
    /// middle of a transaction (an actor stopped, a timeout) still holds
    /// that transaction's locks, such as the KEY SHARE on its session row
    /// that closing the session waits for: it is closed, so the server
    /// rolls back and releases them now, not whenever the pool next hands
    /// that connection out.
    fn has_broken(&self, conn: &mut PgConn) -> bool {
        conn.broken || conn.in_transaction || conn.client.is_closed()
    }
}
