//! The HTTP client BMCs are reached with: its TLS (`tls.rs`), its
//! timeouts, connections kept briefly, and what a connection the BMC
//! closed under a request looks like.

use std::sync::Arc;
use std::time::Duration;

use crate::config::BmcTls;

/// Whether a request failed because its kept connection was closed by the
/// BMC before any answer (the end of the stream, or a reset).
pub(super) fn stale_connection(e: &awc::error::SendRequestError) -> bool {
    use awc::error::{ConnectError, SendRequestError};
    use std::io::ErrorKind;
    let io_stale = |e: &std::io::Error| {
        matches!(
            e.kind(),
            ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::UnexpectedEof
        )
    };
    match e {
        SendRequestError::Connect(ConnectError::Disconnected) => true,
        SendRequestError::Send(e) => io_stale(e),
        SendRequestError::Response(actix_web::error::ParseError::Io(e)) => io_stale(e),
        SendRequestError::Response(actix_web::error::ParseError::Incomplete) => true,
        _ => false,
    }
}

/// How long a connection to a BMC is kept idle for the next request:
/// briefly (a sequence of calls shares it), below the idle timeout of the
/// BMCs' web servers (5 s and more), so that a BMC rarely closes one as
/// it is taken again.
const BMC_KEEP_ALIVE: Duration = Duration::from_secs(1);

pub(super) fn client(
    tls: &BmcTls,
    timeout: Duration,
) -> Result<awc::Client, super::tls::CaFileError> {
    let connector = awc::Connector::new()
        .timeout(timeout.min(Duration::from_secs(10)))
        .conn_keep_alive(BMC_KEEP_ALIVE);
    let connector = match tls {
        BmcTls::Verify => connector,
        BmcTls::Insecure => connector.rustls_0_23(Arc::new(super::tls::insecure_client_config())),
        BmcTls::CaFile { ca_file } => {
            connector.rustls_0_23(Arc::new(super::tls::ca_client_config(ca_file)?))
        }
    };
    Ok(awc::Client::builder()
        .timeout(timeout)
        .connector(connector)
        .add_default_header((
            "User-Agent",
            concat!("shepherd/", env!("CARGO_PKG_VERSION")),
        ))
        .finish())
}
