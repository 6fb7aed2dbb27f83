//! A machine's timeline: everything that happened to it, in one list, from
//! the tables that keep it (work, operators' actions, installations and
//! erasures, servicings, power cycles, console captures and connections).

use std::time::SystemTime;

use uuid::Uuid;

use crate::bmdb::{BmdbError, Tx};

/// What kind of thing happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Happening {
    /// A control loop's work (leased, finished, failed).
    Work,
    /// An operator's action.
    Operator,
    /// An installation or an erasure asked, done or failed.
    Installation,
    /// A servicing to a baseline, ended.
    Servicing,
    /// A power cycle through the BMC (for silence, or asked).
    Power,
    /// The serial console read during a boot shepherd made.
    Console,
    /// Someone on the serial console over SSH.
    ConsoleSession,
}

impl Happening {
    fn parse(s: &str) -> Happening {
        match s {
            "operator" => Happening::Operator,
            "installation" => Happening::Installation,
            "servicing" => Happening::Servicing,
            "power" => Happening::Power,
            "console" => Happening::Console,
            "console-session" => Happening::ConsoleSession,
            _ => Happening::Work,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Happening::Work => "work",
            Happening::Operator => "operator",
            Happening::Installation => "installation",
            Happening::Servicing => "servicing",
            Happening::Power => "power",
            Happening::Console => "console",
            Happening::ConsoleSession => "console-session",
        }
    }
}

/// One thing that happened to a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moment {
    pub at: SystemTime,
    pub kind: Happening,
    /// What, in a few words.
    pub what: String,
    /// Its cause or detail.
    pub detail: Option<String>,
    /// It went wrong.
    pub failed: bool,
}

const TIMELINE: &str = "SELECT at, kind, what, detail, failed FROM ( \
       SELECT \"timestamp\" AS at, 'work' AS kind, process::text || ' ' || event::text AS what, \
              COALESCE(failed_cause, detail) AS detail, failed_cause IS NOT NULL AS failed \
         FROM work_history WHERE machine_id = $1 \
       UNION ALL SELECT \"timestamp\", 'operator', 'operator ' || actor || ': ' || action, \
              detail || COALESCE(' (reason: ' || reason || ')', ''), false \
         FROM operator_action WHERE machine_id = $1 \
       UNION ALL SELECT \"timestamp\", 'installation', 'installation ' || generation || ' ' || event, \
              detail, event = 'failed' \
         FROM installation_history WHERE machine_id = $1 \
       UNION ALL SELECT ended_at, 'servicing', 'servicing to ' || baseline || ' ' || phase, \
              COALESCE(error, applied), error IS NOT NULL \
         FROM service_history WHERE machine_id = $1 \
       UNION ALL SELECT \"timestamp\", 'power', \
              CASE WHEN requested THEN 'power cycle, asked' ELSE 'power cycle for silence' END, NULL, false \
         FROM recovery_power_action WHERE machine_id = $1 \
       UNION ALL SELECT started_at, 'console', 'console read during a boot (' || cause || ')', \
              bytes_seen || ' bytes printed, read with ' || source || COALESCE('; ' || error, ''), \
              error IS NOT NULL \
         FROM machine_console WHERE machine_id = $1 \
       UNION ALL SELECT started_at, 'console-session', who || ' on the console over SSH', \
              CASE WHEN wrote THEN 'held the keyboard' ELSE 'read only' END \
              || COALESCE('; ' || end_reason, '; on it now'), false \
         FROM console_session WHERE machine_id = $1) t \
     ORDER BY at DESC LIMIT $2";

/// The newest `n` things that happened to `machine_id`, newest first.
pub async fn timeline(tx: &mut Tx<'_>, machine_id: Uuid, n: i64) -> Result<Vec<Moment>, BmdbError> {
    Ok(tx
        .query(TIMELINE, &[&machine_id, &n])
        .await?
        .iter()
        .map(|r| Moment {
            at: r.get(0),
            kind: Happening::parse(r.get(1)),
            what: r.get(2),
            detail: r.get(3),
            failed: r.get(4),
        })
        .collect())
}
