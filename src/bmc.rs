//! What every BMC protocol shares (Redfish in [`crate::redfish`], IPMI in
//! [`crate::ipmi`]): the error an operator reads, naming the host, the BMC
//! and what it said.

/// What went wrong talking to a BMC, for an operator: `host node-1: BMC
/// https://10.0.0.5: …`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("host {host}: BMC {bmc}: {kind}")]
pub struct BmcError {
    pub host: String,
    pub bmc: String,
    pub kind: BmcErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BmcErrorKind {
    #[error("credentials refused (HTTP 401){}", detail(.0))]
    Unauthorized(String),
    #[error("HTTP {status} for {what}{}", detail(.message))]
    Http {
        status: u16,
        what: String,
        message: String,
    },
    /// IPMI: no session with these credentials.
    #[error("credentials refused: {0}")]
    Credentials(String),
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// Redfish: `InsertMedia` refused with a user name and password for the
    /// image's URL (the caller may ask again without them).
    #[error("InsertMedia refused with a user name and password: {0}")]
    MediaAuthRefused(String),
    #[error("unexpected answer: {0}")]
    Protocol(String),
    #[error("{0}")]
    Config(String),
}

fn detail(m: &str) -> String {
    if m.is_empty() {
        String::new()
    } else {
        format!(": {m}")
    }
}

impl BmcErrorKind {
    /// A failure that may pass by itself (the BMC is busy or unreachable).
    pub fn is_transient(&self) -> bool {
        match self {
            BmcErrorKind::Unreachable(_) => true,
            BmcErrorKind::Http { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }
}
