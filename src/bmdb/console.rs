//! What machines' serial consoles printed during the boots shepherd made
//! (`machine_console`, `migrations/V25__console.sql`): a capture begun,
//! its tail written as it grows, ended; a machine's latest read back.

use std::time::SystemTime;

use uuid::Uuid;

use super::{BmdbError, Tx};

/// One capture as the BMDB keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleCapture {
    pub capture_id: Uuid,
    pub machine_id: Uuid,
    pub cause: String,
    pub source: String,
    pub started_at: SystemTime,
    pub updated_at: SystemTime,
    pub ended_at: Option<SystemTime>,
    pub bytes_seen: i64,
    pub tail: Vec<u8>,
    pub error: Option<String>,
}

const BEGIN: &str = "INSERT INTO machine_console (capture_id, machine_id, cause, source) \
     VALUES ($1, $2, $3, $4)";
/// The machine's captures beyond the newest `$2`, deleted.
const PRUNE: &str = "DELETE FROM machine_console WHERE capture_id IN ( \
       SELECT capture_id FROM machine_console WHERE machine_id = $1 \
        ORDER BY started_at DESC, capture_id OFFSET $2)";
const WRITE: &str = "UPDATE machine_console SET tail = $2, bytes_seen = $3, error = $4, \
       updated_at = now(), ended_at = CASE WHEN $5 THEN now() END \
     WHERE capture_id = $1 AND ended_at IS NULL";
macro_rules! capture_columns {
    () => {
        "SELECT capture_id, machine_id, cause, source, started_at, updated_at, \
         ended_at, bytes_seen, tail, error FROM machine_console "
    };
}
const LATEST: &str = concat!(
    capture_columns!(),
    "WHERE machine_id = $1 ORDER BY started_at DESC, capture_id LIMIT $2"
);
const ONE: &str = concat!(
    capture_columns!(),
    "WHERE machine_id = $1 AND capture_id = $2"
);

/// Begins capture `capture_id` of `machine_id`'s console, keeping the
/// newest `kept` of its captures.
pub async fn begin(
    tx: &mut Tx<'_>,
    capture_id: Uuid,
    machine_id: Uuid,
    cause: &str,
    source: &str,
    kept: i64,
) -> Result<(), BmdbError> {
    tx.execute(BEGIN, &[&capture_id, &machine_id, &cause, &source])
        .await?;
    tx.execute(PRUNE, &[&machine_id, &kept.max(1)]).await?;
    Ok(())
}

/// Writes what capture `capture_id` holds now; `ended`: and ends it. A
/// capture already ended is left as it is (false).
pub async fn write(
    tx: &mut Tx<'_>,
    capture_id: Uuid,
    tail: &[u8],
    bytes_seen: u64,
    error: Option<&str>,
    ended: bool,
) -> Result<bool, BmdbError> {
    let seen = i64::try_from(bytes_seen).unwrap_or(i64::MAX);
    Ok(tx
        .execute(WRITE, &[&capture_id, &tail, &seen, &error, &ended])
        .await?
        > 0)
}

/// `machine_id`'s newest `n` captures, newest first.
pub async fn latest(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    n: i64,
) -> Result<Vec<ConsoleCapture>, BmdbError> {
    Ok(tx
        .query(LATEST, &[&machine_id, &n])
        .await?
        .iter()
        .map(capture_from)
        .collect())
}

/// One of `machine_id`'s captures, while it is kept.
pub async fn capture(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    capture_id: Uuid,
) -> Result<Option<ConsoleCapture>, BmdbError> {
    Ok(tx
        .query_opt(ONE, &[&machine_id, &capture_id])
        .await?
        .as_ref()
        .map(capture_from))
}

fn capture_from(r: &tokio_postgres::Row) -> ConsoleCapture {
    ConsoleCapture {
        capture_id: r.get(0),
        machine_id: r.get(1),
        cause: r.get(2),
        source: r.get(3),
        started_at: r.get(4),
        updated_at: r.get(5),
        ended_at: r.get(6),
        bytes_seen: r.get(7),
        tail: r.get(8),
        error: r.get(9),
    }
}
