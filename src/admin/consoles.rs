//! A machine's console in the API: what it printed during the boots
//! shepherd made (`ConsoleBody`), and who was on it over SSH
//! (`ConsoleSessionBody`).

use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::text::rfc3339;

/// A boot's serial console, as shepherd captured it.
#[derive(Serialize, ToSchema)]
pub struct ConsoleBody {
    pub capture_id: Uuid,
    /// What shepherd was doing: `enroll`, `inspect`, `service`, ...
    pub cause: String,
    /// How it was read: `sol ipmi://host:port`, `ssh user@host:22 "cmd"`.
    pub source: String,
    pub started_at: String,
    /// Absent while it is captured.
    pub ended_at: Option<String>,
    /// Bytes the console printed (more than it keeps).
    pub bytes_seen: i64,
    /// Its last bytes as text (terminal escapes and carriage returns
    /// removed).
    pub tail: String,
    /// Its last lines that hold something, at most 20.
    pub last_lines: Vec<String>,
    /// The last time it could not be read, why.
    pub error: Option<String>,
}

impl From<&crate::bmdb::console::ConsoleCapture> for ConsoleBody {
    fn from(c: &crate::bmdb::console::ConsoleCapture) -> Self {
        let tail = crate::console::text(&c.tail);
        ConsoleBody {
            capture_id: c.capture_id,
            cause: c.cause.clone(),
            source: c.source.clone(),
            started_at: rfc3339(c.started_at),
            ended_at: c.ended_at.map(rfc3339),
            bytes_seen: c.bytes_seen,
            last_lines: crate::console::last_lines(&tail, 20),
            tail,
            error: c.error.clone(),
        }
    }
}

/// One connection to a machine's console over shepherd's SSH (the audit).
#[derive(Serialize, ToSchema)]
pub struct ConsoleSessionBody {
    pub session_id: Uuid,
    /// `operator NAME` or `tenant project PROJECT key LABEL`.
    pub who: String,
    /// The SHA-256 fingerprint of the key they logged in with.
    pub key_fingerprint: String,
    /// The client's address.
    pub peer: Option<String>,
    pub started_at: String,
    /// Absent while they are on it.
    pub ended_at: Option<String>,
    /// They held the keyboard at some time.
    pub wrote: bool,
    pub bytes_typed: i64,
    pub bytes_shown: i64,
    /// `left` (the escape), `disconnected`.
    pub end_reason: Option<String>,
}

impl From<&crate::bmdb::console_sessions::ConsoleSession> for ConsoleSessionBody {
    fn from(s: &crate::bmdb::console_sessions::ConsoleSession) -> Self {
        ConsoleSessionBody {
            session_id: s.session_id,
            who: s.who.clone(),
            key_fingerprint: s.key_fingerprint.clone(),
            peer: s.peer.clone(),
            started_at: rfc3339(s.started_at),
            ended_at: s.ended_at.map(rfc3339),
            wrote: s.wrote,
            bytes_typed: s.bytes_typed,
            bytes_shown: s.bytes_shown,
            end_reason: s.end_reason.clone(),
        }
    }
}
