//! A machine's timeline in the API (`MachineDetailBody::timeline`):
//! everything that happened to it, newest first, as its page shows it.

use serde::Serialize;
use utoipa::ToSchema;

use super::text::rfc3339;
use crate::bmdb::machines::Moment;

/// One thing that happened to a machine.
#[derive(Serialize, ToSchema)]
pub struct MomentBody {
    pub at: String,
    /// `work`, `operator`, `installation`, `servicing`, `power`,
    /// `console` (its serial console read during a boot) or
    /// `console-session` (someone on it over SSH).
    pub kind: String,
    /// What, in a few words.
    pub what: String,
    /// Its cause or detail.
    pub detail: Option<String>,
    /// It went wrong.
    pub failed: bool,
}

impl From<&Moment> for MomentBody {
    fn from(m: &Moment) -> Self {
        MomentBody {
            at: rfc3339(m.at),
            kind: m.kind.as_str().to_string(),
            what: m.what.clone(),
            detail: m.detail.clone(),
            failed: m.failed,
        }
    }
}
