//! The agent's side of the callback (CONTRACTS.md §4): where it calls,
//! how it connects, and one call. gRPC over TLS 1.3 with ALPN `h2`,
//! trusting only the CA it was given at its takeover and presenting a
//! self-signed certificate of its ed25519 key. The resident agent calls
//! through it; so do the tests and the heartbeat benchmark.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

pub use shepherd_proto::callback::{HEARTBEAT_PATHS, TlsError, endpoint_host, tls_err};

/// Connects to the callback at `addr`, verifying the server as
/// `server_name` against `ca_der`, authenticating with the key of `seed`.
pub async fn connect(
    addr: SocketAddr,
    server_name: &str,
    ca_der: &[u8],
    seed: &[u8; 32],
) -> Result<Channel, String> {
    let cfg = agent_client_config(ca_der, seed).map_err(|e| e.to_string())?;
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

/// An agent's TLS client configuration: trusts `ca_der` only, presents a
/// self-signed certificate of the ed25519 key `seed`, offers ALPN `h2`.
/// Used by the resident agent, the tests and the benchmark.
pub fn agent_client_config(
    ca_der: &[u8],
    seed: &[u8; 32],
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(ca_der.to_vec()))
        .map_err(|e| tls_err("the callback CA certificate", e))?;
    let (cert, key) = self_signed_agent_cert(seed)?;
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| tls_err("agent TLS", e))?
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![cert], key)
        .map_err(|e| tls_err("agent certificate", e))?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

/// A self-signed certificate of the ed25519 key with this seed.
pub fn self_signed_agent_cert(
    seed: &[u8; 32],
) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>), TlsError> {
    let pkcs8 = ed25519_pkcs8(seed);
    let key = rcgen::KeyPair::try_from(pkcs8.as_slice()).map_err(|e| tls_err("agent key", e))?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())
        .map_err(|e| tls_err("agent certificate", e))?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "shepherd agent");
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2124, 1, 1);
    let cert = params
        .self_signed(&key)
        .map_err(|e| tls_err("agent certificate", e))?;
    Ok((
        cert.der().clone(),
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8)),
    ))
}

/// PKCS#8 v1 of an ed25519 private key (RFC 8410): a fixed prefix and the
/// 32-byte seed.
fn ed25519_pkcs8(seed: &[u8; 32]) -> Vec<u8> {
    const PREFIX: [u8; 16] = [
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    let mut v = PREFIX.to_vec();
    v.extend_from_slice(seed);
    v
}

/// Presents a boot's credential (`data`, the boot image's
/// `shepherd.boot.v1.BootData`) with the key of `seed` until shepherd
/// answers, retrying while it cannot be reached (each failed try told to
/// `log`); Err only when it refuses: another try would be refused too.
pub async fn enroll(
    data: &shepherd_proto::boot::BootData,
    seed: &[u8; 32],
    log: impl Fn(std::fmt::Arguments<'_>),
) -> Result<(), String> {
    let host = endpoint_host(&data.bmaas_endpoint)
        .ok_or_else(|| format!("{:?} is not host:port", data.bmaas_endpoint))?
        .to_string();
    /// How one try ended badly.
    enum Failed {
        /// Shepherd said no: another try would be refused too.
        Refused(String),
        /// Not reached, or not able to answer now.
        Again(String),
    }
    let mut pause = std::time::Duration::from_secs(1);
    loop {
        let tried = async {
            let addr = tokio::net::lookup_host(data.bmaas_endpoint.as_str())
                .await
                .map_err(|e| Failed::Again(format!("cannot resolve {}: {e}", data.bmaas_endpoint)))?
                .next()
                .ok_or_else(|| {
                    Failed::Again(format!("{} resolves to no address", data.bmaas_endpoint))
                })?;
            let channel = connect(addr, &host, &data.ca_certificate, seed)
                .await
                .map_err(Failed::Again)?;
            call::<_, shepherd_proto::boot::EnrollResponse>(
                channel,
                shepherd_proto::callback::ENROLL_PATH,
                shepherd_proto::boot::EnrollRequest {
                    machine_id: data.machine_id.clone(),
                    credential: data.credential.clone(),
                    bmaas_endpoint: data.bmaas_endpoint.clone(),
                },
            )
            .await
            .map_err(|s| match s.code() {
                tonic::Code::Unauthenticated | tonic::Code::InvalidArgument => {
                    Failed::Refused(s.message().to_string())
                }
                _ => Failed::Again(s.message().to_string()),
            })
        }
        .await;
        match tried {
            Ok(_) => return Ok(()),
            Err(Failed::Refused(why)) => {
                return Err(format!("shepherd refused the enrollment: {why}"));
            }
            Err(Failed::Again(e)) => log(format_args!(
                "enrolling: {e}; again in {}",
                humantime::format_duration(pause)
            )),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_secs(30));
    }
}
