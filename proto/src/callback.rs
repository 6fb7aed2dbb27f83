//! What both ends of the callback (CONTRACTS.md §4) agree on: the
//! method's paths, the endpoint's form, and how a TLS problem is named.

/// The method's path under each package agents in the field use.
pub const HEARTBEAT_PATHS: [&str; 2] = [
    "/cloud.bmaas.server.api.AgentCallback/Heartbeat",
    "/cloud.agent.api.AgentCallback/Heartbeat",
];

/// The live agent's enrollment (`boot.proto`).
pub const ENROLL_PATH: &str = "/shepherd.boot.v1.Enrollment/Enroll";

/// The host of a `host:port` endpoint (brackets of an IPv6 address
/// removed), or None when it is not one.
pub fn endpoint_host(endpoint: &str) -> Option<&str> {
    let (host, port) = endpoint.trim().rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then_some(host)
}

/// Why a TLS configuration, key or certificate of the callback could not be
/// made or read (the agent's here; the server's in shepherd's
/// `callback::tls`): what it was, and why.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {message}")]
pub struct TlsError {
    what: String,
    message: String,
}

/// A [`TlsError`] about `what`.
pub fn tls_err(what: impl Into<String>, message: impl std::fmt::Display) -> TlsError {
    TlsError {
        what: what.into(),
        message: message.to_string(),
    }
}
