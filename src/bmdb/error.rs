//! What can go wrong with the BMDB, said for an operator, and told apart:
//! an outage (retried), a conflict, a lost session, a refusal.

use tokio_postgres::error::SqlState;
use uuid::Uuid;

use super::model::Process;

#[derive(Debug, thiserror::Error)]
pub enum BmdbError {
    #[error("session {0} expired")]
    SessionExpired(Uuid),
    #[error("machine {machine_id}: already leased for {process} or a conflicting process")]
    WorkConflict { machine_id: Uuid, process: Process },
    #[error("machine {machine_id}: lease for {process} is no longer held")]
    LeaseLost { machine_id: Uuid, process: Process },
    #[error("database: {message}")]
    Database {
        message: String,
        code: Option<SqlState>,
    },
    /// The connection was refused, lost or shut down by the server before
    /// the transaction committed: nothing was written.
    #[error("database unreachable: {0}")]
    Unreachable(String),
    /// The connection was lost while COMMIT was under way: the transaction
    /// may or may not have been written.
    #[error("database connection lost during commit, outcome unknown: {0}")]
    CommitUnknown(String),
    #[error("database pool: {0}")]
    Pool(String),
    #[error("transaction gave up after {attempts} attempts on serialization failures: {last}")]
    RetriesExhausted { attempts: u32, last: String },
    #[error("migration: {0}")]
    Migration(String),
    #[error("embedded PostgreSQL: {0}")]
    Embedded(String),
    #[error("{0}")]
    Invalid(String),
}

impl BmdbError {
    pub fn code(&self) -> Option<&SqlState> {
        match self {
            BmdbError::Database { code, .. } => code.as_ref(),
            _ => None,
        }
    }

    /// Serialization failures and deadlocks: the transaction may succeed if
    /// run again.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.code(),
            Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
        )
    }

    pub fn is_unique_violation(&self) -> bool {
        self.code() == Some(&SqlState::UNIQUE_VIOLATION)
    }

    /// The database could not be reached or did not answer: the same call
    /// may succeed once it is back (database restarts, network blips, an
    /// exhausted pool). A `CommitUnknown` may have been written.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            BmdbError::Unreachable(_) | BmdbError::CommitUnknown(_) | BmdbError::Pool(_)
        )
    }
}

/// Whether `e` means the connection is gone (refused, reset, closed, or the
/// server shutting it down), as opposed to an answer from a working server.
fn is_connection_error(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        let c = code.code();
        // 08: connection exception; 57P01-57P03: admin/crash shutdown,
        // cannot connect now (starting up or shutting down); 25006: a
        // write refused by a read-only server, i.e. a connection that
        // landed on a standby (after a failover, the old primary demoted):
        // as good as lost, and nothing was written.
        return c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03" | "25006");
    }
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        if inner.is::<std::io::Error>() {
            return true;
        }
        src = inner.source();
    }
    false
}

/// tokio-postgres shows a server error as "db error"; say what it was.
pub(crate) fn describe_pg_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{}: {}", db.severity(), db.message());
            if let Some(detail) = db.detail() {
                s.push_str(" (");
                s.push_str(detail);
                s.push(')');
            }
            s
        }
        None => {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(inner) = src {
                s.push_str(": ");
                s.push_str(&inner.to_string());
                src = inner.source();
            }
            s
        }
    }
}

impl From<tokio_postgres::Error> for BmdbError {
    fn from(e: tokio_postgres::Error) -> Self {
        if is_connection_error(&e) {
            return BmdbError::Unreachable(describe_pg_error(&e));
        }
        BmdbError::Database {
            message: describe_pg_error(&e),
            code: e.code().cloned(),
        }
    }
}

impl crate::fault::Blame for BmdbError {
    /// The BMDB away, a conflict or a lost lease or session are shepherd's
    /// own; a statement the database refused is not (it will be refused
    /// again).
    fn whose(&self) -> crate::fault::Whose {
        use crate::fault::Whose;
        match self {
            BmdbError::SessionExpired(_)
            | BmdbError::WorkConflict { .. }
            | BmdbError::LeaseLost { .. }
            | BmdbError::Unreachable(_)
            | BmdbError::CommitUnknown(_)
            | BmdbError::Pool(_)
            | BmdbError::RetriesExhausted { .. } => Whose::Ours,
            BmdbError::Database { .. } if self.is_retryable() => Whose::Ours,
            BmdbError::Database { .. }
            | BmdbError::Migration(_)
            | BmdbError::Embedded(_)
            | BmdbError::Invalid(_) => Whose::Machine,
        }
    }
}
