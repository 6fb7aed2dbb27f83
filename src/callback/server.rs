//! The gRPC server agents call back to (CONTRACTS.md §4): TLS with client
//! certificates (see `tls`), `Heartbeat` under both package names, each
//! call validated here and written by the `HeartbeatWriter`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use actix::Addr;
use prost::Message;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::{Code, Status};
use uuid::Uuid;

use super::metrics::{HeartbeatMetrics, Outcome};
use super::tls::{KEY_LEN, ed25519_key};
use super::writer::{
    Beat, BeatOutcome, HeartbeatWriter, InstallationReport, ProgressBeat, WriteBeat,
    WriteEnrollment,
};
use crate::bmdb::InstallationResult;
use shepherd_proto::api::{
    AgentHardwareReport, HeartbeatRequestRaw, HeartbeatResponseRaw, InstallationProgress,
    OsInstallationReport, os_installation_report,
};

use shepherd_proto::boot::{EnrollRequest, EnrollResponse};
use shepherd_proto::callback::ENROLL_PATH;
/// The method's path under each package agents in the field use.
pub use shepherd_proto::callback::HEARTBEAT_PATHS;

use crate::bmdb::boot::Enrolled;

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the TLS handshake established about the caller.
#[derive(Debug, Clone)]
pub struct AgentPeer {
    pub remote: SocketAddr,
    /// The ed25519 key of its certificate.
    pub key: Option<[u8; KEY_LEN]>,
}

/// The same message whether the machine is unknown or the key is wrong.
const NOT_AUTHENTICATED: &str =
    "not authenticated: no agent with this key was started on this machine";

/// The key the caller proved in TLS.
fn caller_key(peer: Option<&AgentPeer>) -> Result<[u8; KEY_LEN], Status> {
    peer.and_then(|p| p.key).ok_or_else(|| {
        Status::unauthenticated("a client certificate with an ed25519 key is required")
    })
}

/// A request's `machine_id`.
fn machine_id(raw: &str) -> Result<Uuid, Status> {
    Uuid::parse_str(raw.trim()).map_err(|_| {
        Status::invalid_argument(format!(
            "machine_id {:?} is not a UUID",
            raw.chars().take(64).collect::<String>()
        ))
    })
}

/// Validates a heartbeat and turns it into what the writer writes.
fn beat(peer: Option<&AgentPeer>, req: HeartbeatRequestRaw) -> Result<Beat, Status> {
    let key = caller_key(peer)?;
    let machine_id = machine_id(&req.machine_id)?;
    if let Some(hw) = &req.hardware_report {
        AgentHardwareReport::decode(hw.as_slice()).map_err(|e| {
            Status::invalid_argument(format!("hardware_report does not decode: {e}"))
        })?;
    }
    let installation = match req.installation_report {
        None => None,
        Some(raw) => {
            let report = OsInstallationReport::decode(raw.as_slice()).map_err(|e| {
                Status::invalid_argument(format!("installation_report does not decode: {e}"))
            })?;
            let generation = i32::try_from(report.generation).map_err(|_| {
                Status::invalid_argument(format!(
                    "installation_report.generation {} is outside the 32-bit range",
                    report.generation
                ))
            })?;
            let result = match report.result {
                Some(os_installation_report::Result::Success(_)) => InstallationResult::Success,
                Some(os_installation_report::Result::Error(_)) => InstallationResult::Error,
                None => {
                    return Err(Status::invalid_argument(
                        "installation_report has neither success nor error",
                    ));
                }
            };
            Some(InstallationReport {
                generation,
                result,
                raw,
            })
        }
    };
    let progress = match req.installation_progress {
        None => None,
        Some(raw) => {
            let p = InstallationProgress::decode(raw.as_slice()).map_err(|e| {
                Status::invalid_argument(format!("installation_progress does not decode: {e}"))
            })?;
            Some(ProgressBeat {
                generation: p.generation,
                phase: p.phase,
                bytes_written: p.bytes_written,
                raw,
            })
        }
    };
    Ok(Beat {
        machine_id,
        key,
        hardware_report: req.hardware_report,
        installation,
        progress,
    })
}

/// The `AgentCallback` service under both of its names, and the live
/// agents' `Enrollment` (CONTRACTS.md §5).
#[derive(Clone)]
pub struct AgentCallback {
    writer: Addr<HeartbeatWriter>,
    metrics: HeartbeatMetrics,
}

impl AgentCallback {
    pub fn new(writer: Addr<HeartbeatWriter>, metrics: HeartbeatMetrics) -> Self {
        AgentCallback { writer, metrics }
    }
}

/// A live agent presents its boot's credential with the key of its
/// certificate (see `bmdb::boot::enroll`).
struct Enroll(Addr<HeartbeatWriter>);

impl tonic::server::UnaryService<EnrollRequest> for Enroll {
    type Response = EnrollResponse;
    type Future =
        Pin<Box<dyn Future<Output = Result<tonic::Response<EnrollResponse>, Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<EnrollRequest>) -> Self::Future {
        let writer = self.0.clone();
        let peer = request.extensions().get::<AgentPeer>().cloned();
        Box::pin(async move {
            let key = caller_key(peer.as_ref())?;
            let req = request.into_inner();
            let machine_id = machine_id(&req.machine_id)?;
            let endpoint = req.bmaas_endpoint.chars().take(256).collect::<String>();
            let outcome = writer
                .send(WriteEnrollment {
                    machine_id,
                    credential: req.credential,
                    key,
                    endpoint,
                })
                .await
                .map_err(|e| Status::unavailable(format!("heartbeat writer: {e}")))?
                .map_err(|e| {
                    Status::unavailable(format!("the BMDB did not take the enrollment: {e}"))
                })?;
            let remote = peer.map(|p| p.remote.to_string()).unwrap_or_default();
            match outcome {
                Enrolled::Enrolled { boot_id } => {
                    tracing::info!(machine = %machine_id, boot = %boot_id, %remote, "a live agent enrolled: its key is the machine's agent key");
                    Ok(tonic::Response::new(EnrollResponse {}))
                }
                Enrolled::Again { .. } => Ok(tonic::Response::new(EnrollResponse {})),
                Enrolled::Refused(why) => {
                    tracing::warn!(machine = %machine_id, %remote, "enrollment refused: {why}");
                    Err(Status::unauthenticated(format!(
                        "enrollment refused: {why}"
                    )))
                }
            }
        })
    }
}

struct Heartbeat(Addr<HeartbeatWriter>, HeartbeatMetrics);

impl tonic::server::UnaryService<HeartbeatRequestRaw> for Heartbeat {
    type Response = HeartbeatResponseRaw;
    type Future =
        Pin<Box<dyn Future<Output = Result<tonic::Response<HeartbeatResponseRaw>, Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<HeartbeatRequestRaw>) -> Self::Future {
        let writer = self.0.clone();
        let metrics = self.1.clone();
        let peer = request.extensions().get::<AgentPeer>().cloned();
        Box::pin(async move {
            let beat = beat(peer.as_ref(), request.into_inner()).inspect_err(|s| {
                metrics.count(
                    if s.code() == Code::Unauthenticated {
                        Outcome::NoCertificate
                    } else {
                        Outcome::Invalid
                    },
                    1,
                );
            })?;
            let answer = writer.send(WriteBeat(beat)).await;
            if !matches!(answer, Ok(Ok(_))) {
                metrics.count(Outcome::Unavailable, 1);
            }
            match answer {
                Ok(Ok(BeatOutcome::Accepted {
                    installation_request,
                })) => Ok(tonic::Response::new(HeartbeatResponseRaw {
                    installation_request,
                })),
                Ok(Ok(BeatOutcome::Unauthenticated)) => {
                    Err(Status::unauthenticated(NOT_AUTHENTICATED))
                }
                Ok(Err(e)) => Err(Status::unavailable(format!(
                    "the BMDB did not take the heartbeat: {e}"
                ))),
                Err(e) => Err(Status::unavailable(format!("heartbeat writer: {e}"))),
            }
        })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for AgentCallback {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let writer = self.writer.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            if req.uri().path() == ENROLL_PATH {
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                    EnrollResponse,
                    EnrollRequest,
                >::default());
                Ok(grpc.unary(Enroll(writer), req).await)
            } else if HEARTBEAT_PATHS.contains(&req.uri().path()) {
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                    HeartbeatResponseRaw,
                    HeartbeatRequestRaw,
                >::default());
                Ok(grpc.unary(Heartbeat(writer, metrics), req).await)
            } else {
                Ok(Status::new(
                    Code::Unimplemented,
                    format!("no method {}", req.uri().path()),
                )
                .into_http())
            }
        })
    }
}

/// A TLS connection from an agent, with what its handshake established.
pub struct AgentConn {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    peer: AgentPeer,
}

impl tonic::transport::server::Connected for AgentConn {
    type ConnectInfo = AgentPeer;

    fn connect_info(&self) -> AgentPeer {
        self.peer.clone()
    }
}

impl AsyncRead for AgentConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for AgentConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Accepts TCP connections on `listener` and completes their TLS
/// handshakes concurrently; yields the connections that made it.
fn incoming(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
) -> tokio_stream::wrappers::ReceiverStream<Result<AgentConn, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::spawn(async move {
        loop {
            let (tcp, remote) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: pause, go on.
                    tracing::warn!(error = %e, "agent callback: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            if tx.is_closed() {
                return;
            }
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let key = stream
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .and_then(|c| ed25519_key(c));
                        let peer = AgentPeer { remote, key };
                        let _ = tx.send(Ok(AgentConn { stream, peer })).await;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(%remote, error = %e, "agent callback: TLS handshake failed")
                    }
                    Err(_) => tracing::debug!(%remote, "agent callback: TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Serves the callback on `listener` until the process ends.
pub fn spawn(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    service: AgentCallback,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let r = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(60)))
            .serve_with_incoming(service, incoming(listener, tls))
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "agent callback server stopped");
        }
    })
}
