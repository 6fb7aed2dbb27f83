//! A client of the agent callback: what the resident agent does, for the
//! tests and the benchmark (the agent binary carries its own copy, to stay
//! small). gRPC over TLS 1.3 with ALPN `h2`, trusting only shepherd's CA and
//! presenting a self-signed certificate of the agent's ed25519 key.

use std::net::SocketAddr;
use std::sync::Arc;

use tonic::Status;
use tonic::transport::{Channel, Endpoint};

/// Connects to the callback at `addr`, verifying the server as
/// `server_name` against `ca_der`, authenticating with the key of `seed`.
pub async fn connect(
    addr: SocketAddr,
    server_name: &str,
    ca_der: &[u8],
    seed: &[u8; 32],
) -> Result<Channel, String> {
    let cfg = super::tls::agent_client_config(ca_der, seed).map_err(|e| e.to_string())?;
    connect_with(addr, server_name, cfg).await
}

/// Connects to `addr` over TLS with the client configuration `cfg` (which
/// must offer ALPN `h2`).
pub async fn connect_with(
    addr: SocketAddr,
    server_name: &str,
    cfg: Arc<rustls::ClientConfig>,
) -> Result<Channel, String> {
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
        .map_err(|e| format!("server name {server_name}: {e}"))?;
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(CONNECT_TIMEOUT);
    endpoint
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let (cfg, name) = (cfg.clone(), name.clone());
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                tcp.set_nodelay(true)?;
                let tls = tokio_rustls::TlsConnector::from(cfg)
                    .connect(name, tcp)
                    .await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|e| format!("connect to {addr}: {}", cause(&e)))
}

/// A connection attempt to one address gives up after this long (a host
/// that is down answers nothing; a dead process's port refuses at once).
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// What went wrong, from the innermost cause out: tonic's "transport
/// error" says nothing, its sources say "connection refused", "timed
/// out", or what TLS disliked.
pub fn cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(e) = next {
        let text = e.to_string();
        if !text.is_empty()
            && text != "transport error"
            && !parts.last().is_some_and(|p| p.contains(&text))
        {
            parts.push(text);
        }
        next = e.source();
    }
    // The innermost is the most specific; keep the chain short.
    parts.reverse();
    parts.truncate(2);
    match parts.as_slice() {
        [] => "transport error".into(),
        [one] => one.clone(),
        [inner, outer] if outer.contains(inner.as_str()) => outer.clone(),
        [inner, outer] => format!("{inner} ({outer})"),
        _ => unreachable!(),
    }
}

/// One unary call of `path` with request `Req`, answer decoded as `Resp`
/// (a `…Raw` type keeps the answer's bytes as they came).
pub async fn call<Req, Resp>(
    channel: Channel,
    path: &'static str,
    request: Req,
) -> Result<Resp, Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(cause(&e)))?;
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    grpc.unary(
        tonic::Request::new(request),
        http::uri::PathAndQuery::from_static(path),
        codec,
    )
    .await
    .map(tonic::Response::into_inner)
}
