//! What the fleet page reads beyond the machines: activity over the last
//! hours (from `work_history`) and the sessions alive with what each runs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use uuid::Uuid;

use super::{BmdbError, Process, Tx};

/// One time bucket of the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Activity {
    #[serde(with = "humantime_serde")]
    pub start: SystemTime,
    /// ShepherdAgentStart work finished: an agent started.
    pub takeovers: i64,
    /// Work of any process failed.
    pub failures: i64,
    /// ShepherdRecovery work finished: a machine rebooted.
    pub recoveries: i64,
}

const ACTIVITY: &str = "SELECT date_bin(make_interval(secs => $1), \"timestamp\", $2::timestamptz) AS b, \
       count(*) FILTER (WHERE process = 'ShepherdAgentStart' AND event = 'Finished'), \
       count(*) FILTER (WHERE event = 'Failed'), \
       count(*) FILTER (WHERE process = 'ShepherdRecovery' AND event = 'Finished') \
     FROM work_history WHERE \"timestamp\" >= $2 GROUP BY b";

/// The last `buckets` buckets of `bucket` each, oldest first, ending with
/// the one now is in; empty buckets included.
pub async fn activity(
    tx: &mut Tx<'_>,
    bucket: Duration,
    buckets: u32,
) -> Result<Vec<Activity>, BmdbError> {
    let step = bucket.as_secs().max(1);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let first = (now / step).saturating_sub(u64::from(buckets.max(1)) - 1) * step;
    let origin = UNIX_EPOCH + Duration::from_secs(first);
    let rows = tx.query(ACTIVITY, &[&(step as f64), &origin]).await?;
    let mut out: Vec<Activity> = (0..u64::from(buckets.max(1)))
        .map(|i| Activity {
            start: origin + Duration::from_secs(i * step),
            takeovers: 0,
            failures: 0,
            recoveries: 0,
        })
        .collect();
    for r in rows {
        let start: SystemTime = r.get(0);
        let i = start
            .duration_since(origin)
            .map(|d| d.as_secs() / step)
            .unwrap_or(0) as usize;
        if let Some(a) = out.get_mut(i) {
            a.takeovers = r.get(1);
            a.failures = r.get(2);
            a.recoveries = r.get(3);
        }
    }
    Ok(out)
}

/// A session alive now, with its leases and duties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionView {
    pub session_id: Uuid,
    pub component: String,
    pub runtime_info: String,
    pub created_at: SystemTime,
    pub deadline: SystemTime,
    /// Leases held, per process.
    pub leases: Vec<(Process, i64)>,
    /// Fleet duties held (`provisioning`, `provider-updates`).
    pub duties: Vec<String>,
}

const SESSIONS: &str = "SELECT session_id, session_component_name, session_runtime_info, \
       session_created_at, session_deadline FROM sessions \
     WHERE session_deadline > now() ORDER BY session_created_at, session_id";
const SESSION_LEASES: &str = "SELECT session_id, process, count(*) FROM work \
     GROUP BY session_id, process ORDER BY process";
const SESSION_DUTIES: &str = "SELECT session_id, duty FROM fleet_duty ORDER BY duty";

pub async fn sessions(tx: &mut Tx<'_>) -> Result<Vec<SessionView>, BmdbError> {
    let mut out: Vec<SessionView> = tx
        .query(SESSIONS, &[])
        .await?
        .iter()
        .map(|r| SessionView {
            session_id: r.get(0),
            component: r.get(1),
            runtime_info: r.get(2),
            created_at: r.get(3),
            deadline: r.get(4),
            leases: Vec::new(),
            duties: Vec::new(),
        })
        .collect();
    for r in tx.query(SESSION_LEASES, &[]).await? {
        let id: Uuid = r.get(0);
        if let Some(s) = out.iter_mut().find(|s| s.session_id == id) {
            s.leases.push((r.get(1), r.get(2)));
        }
    }
    for r in tx.query(SESSION_DUTIES, &[]).await? {
        let id: Uuid = r.get(0);
        if let Some(s) = out.iter_mut().find(|s| s.session_id == id) {
            s.duties.push(r.get(1));
        }
    }
    Ok(out)
}

/// Sessions alive now, of every shepherd.
pub async fn sessions_alive(tx: &mut Tx<'_>) -> Result<i64, BmdbError> {
    Ok(tx
        .query_one(
            "SELECT count(*) FROM sessions WHERE session_deadline > now()",
            &[],
        )
        .await?
        .get(0))
}

/// Machines backed off now, per process (only the processes some are).
pub async fn active_backoffs(tx: &mut Tx<'_>) -> Result<Vec<(Process, i64)>, BmdbError> {
    Ok(tx
        .query(
            "SELECT process, count(*) FROM work_backoff WHERE until > now() GROUP BY process",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}
