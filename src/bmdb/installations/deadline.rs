//! The deadline of an unanswered installation or erasure: a generation on
//! which nothing moved for `installations.deadline` (no agent took it, or
//! its agent's progress stood still or stopped coming) is failed with a
//! cause that says what was last seen, instead of waiting for ever.
//!
//! shepherd's own faults never count against a machine: a generation is
//! judged only while some callback endpoint has been served without a
//! break for the whole deadline plus the agents' retry allowance (a
//! restart of every shepherd or a database outage starts the clock
//! again, as for silence; `bmdb::callback`). The failure is the
//! generation's report, written as an agent's would be (an `Error`
//! `OSInstallationReport`): the state becomes `install-failed` or
//! `clean-failed`, the history says `timed-out` with the cause, and an
//! agent that answers after all overwrites it with the truth.

use std::time::Duration;

use prost::Message as _;
use shepherd_proto::api::{OsInstallationReport, os_installation_report};
use uuid::Uuid;

use super::Kind;
use crate::bmdb::{BmdbError, Tx};

/// Follows `machine_os_installation_request rq`: the generation it asks
/// not answered yet, with what was asked (`mi`) and its agent's progress on
/// it (`p`, if any). Ends in an open WHERE.
macro_rules! in_hand {
    () => {
        " JOIN machine_installation mi \
               ON mi.machine_id = rq.machine_id AND mi.generation = rq.generation \
          LEFT JOIN machine_installation_progress p \
               ON p.machine_id = rq.machine_id AND p.generation = rq.generation \
          WHERE NOT EXISTS (SELECT 1 FROM machine_os_installation_report r \
                             WHERE r.machine_id = rq.machine_id AND r.generation = rq.generation)"
    };
}

/// One generation failed for its deadline.
#[derive(Debug, Clone)]
pub struct TimedOut {
    pub machine_id: Uuid,
    pub generation: i32,
    pub kind: Kind,
    /// What the report and the history say.
    pub cause: String,
}

/// Unanswered generations on which nothing moved for `$1` seconds, judged
/// only while an endpoint was served for `$1 + $2`; with what was last
/// seen: the progress of this generation, else the last failed work on
/// the machine. Locked, so two shepherds fail a generation once.
const STALLED: &str = concat!(
    "SELECT rq.machine_id, rq.generation::int4, mi.kind, \
            installation_phase_name(p.phase), p.bytes_written, \
            to_char(COALESCE(p.advanced_at, mi.requested_at) AT TIME ZONE 'UTC', \
                    'YYYY-MM-DD HH24:MI:SS \"UTC\"'), \
            (SELECT h.process::text || ': ' || h.failed_cause FROM work_history h \
              WHERE h.machine_id = rq.machine_id AND h.failed_cause IS NOT NULL \
                AND h.\"timestamp\" >= mi.requested_at \
              ORDER BY h.work_history_id DESC LIMIT 1) \
       FROM machine_summary s \
       JOIN machine_os_installation_request rq ON rq.machine_id = s.machine_id",
    in_hand!(),
    " AND s.installation IN ('installing', 'cleaning') AND NOT s.held \
        AND COALESCE(p.advanced_at, mi.requested_at) < now() - make_interval(secs => $1) \
        AND EXISTS (SELECT 1 FROM callback_endpoint c WHERE c.served_until > now() \
                      AND c.serving_since <= now() - make_interval(secs => $1 + $2)) \
      ORDER BY rq.machine_id \
      FOR UPDATE OF rq SKIP LOCKED"
);

const REPORT: &str = "INSERT INTO machine_os_installation_report \
         (machine_id, generation, os_installation_result, os_installation_report_raw) \
     VALUES ($1, $2, 'Error', $3) \
     ON CONFLICT (machine_id) DO UPDATE SET generation = EXCLUDED.generation, \
         os_installation_result = EXCLUDED.os_installation_result, \
         os_installation_report_raw = EXCLUDED.os_installation_report_raw";

const HISTORY: &str = "INSERT INTO installation_history (machine_id, generation, event, \"timestamp\", detail) \
     VALUES ($1, $2, 'timed-out', now(), $3)";

/// Fails every generation that missed its deadline, in the caller's
/// transaction; returns them.
pub async fn fail_stalled(
    tx: &mut Tx<'_>,
    deadline: Duration,
    allowance: Duration,
) -> Result<Vec<TimedOut>, BmdbError> {
    let rows = tx
        .query(
            STALLED,
            &[&deadline.as_secs_f64(), &allowance.as_secs_f64()],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let machine_id: Uuid = r.get(0);
        let generation: i32 = r.get(1);
        let kind: Kind = r.get(2);
        let phase: Option<String> = r.get(3);
        let written: Option<i64> = r.get(4);
        let since: String = r.get(5);
        let last_failure: Option<String> = r.get(6);
        let cause = stalled_cause(
            kind,
            deadline,
            phase.as_deref(),
            written,
            &since,
            last_failure.as_deref(),
        );
        let raw = OsInstallationReport {
            generation: i64::from(generation),
            result: Some(os_installation_report::Result::Error(
                os_installation_report::Error {
                    error: cause.clone(),
                },
            )),
        }
        .encode_to_vec();
        tx.execute(REPORT, &[&machine_id, &generation, &raw])
            .await?;
        tx.execute(HISTORY, &[&machine_id, &generation, &cause])
            .await?;
        out.push(TimedOut {
            machine_id,
            generation,
            kind,
            cause,
        });
    }
    Ok(out)
}

/// The words of a deadline's failure: what was asked, what was last seen
/// and since when.
pub fn stalled_cause(
    kind: Kind,
    deadline: Duration,
    phase: Option<&str>,
    written: Option<i64>,
    since: &str,
    last_failure: Option<&str>,
) -> String {
    let what = kind.noun();
    let seen = match (phase, written) {
        (Some(p), Some(w)) => {
            format!("its agent's last progress was {p}, {w} bytes written, at {since}")
        }
        _ => format!("no agent began it (asked at {since})"),
    };
    let failure = last_failure
        .map(|f| format!("; the last failure on the machine: {f}"))
        .unwrap_or_default();
    format!(
        "shepherd: the {what} did not move for {} (installations.deadline): {seen}{failure}",
        humantime::format_duration(deadline)
    )
}

/// The generation in hand of `machine_id` (asked, not answered), in
/// words, with how far its agent had come: "erasing (generation 3):
/// erasing, 600 MB written at 2026-11-27 01:24:10 UTC". None when nothing
/// is in hand.
pub async fn in_hand(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Option<String>, BmdbError> {
    let Some(r) = tx.query_opt(IN_HAND, &[&machine_id]).await? else {
        return Ok(None);
    };
    let kind: Kind = r.get(0);
    let generation: i32 = r.get(1);
    let what = kind.doing();
    let progress: Option<String> = r.get(2);
    Ok(Some(match progress {
        Some(p) => format!("{what} (generation {generation}): {p}"),
        None => format!("{what} (generation {generation}): no progress reported yet"),
    }))
}

const IN_HAND: &str = concat!(
    "SELECT mi.kind, rq.generation, \
        installation_phase_name(p.phase) || ', ' || pg_size_pretty(p.bytes_written) || ' written at ' || \
            to_char(p.progress_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS \"UTC\"') \
       FROM machine_os_installation_request rq",
    in_hand!(),
    " AND rq.machine_id = $1"
);
