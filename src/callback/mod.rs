//! The agent callback (CONTRACTS.md §4): the gRPC endpoint resident agents
//! call with heartbeats, hardware reports and installation reports, so that
//! a healthy machine is never taken for a silent one.
//!
//! - [`tls`]: shepherd's own CA and server certificate, and the client
//!   certificate rule (a self-signed ed25519 certificate of the agent's
//!   key, matched against `machine_agent_started` per call).
//! - [`writer`]: the `HeartbeatWriter` actor, which coalesces heartbeats
//!   into one statement per batch (authentication included).
//! - [`server`]: the gRPC service under both package names, over TLS.
//!
//! The agent's side (its client, its TLS configuration) is the agent's
//! crate's, `shepherd_agent::callback`.

pub mod metrics;
pub mod server;
pub mod tls;
pub mod writer;

pub use metrics::{HeartbeatMetrics, Outcome};
pub use server::{AgentCallback, AgentPeer, HEARTBEAT_PATHS};
pub use tls::{CertFiles, ServerIdentity};
pub use writer::{GetWriterStats, HeartbeatWriter, WriterStats};

use std::net::SocketAddr;

use actix::{Actor, Addr};

/// A callback server that is up.
pub struct Callback {
    pub addr: SocketAddr,
    pub writer: Addr<HeartbeatWriter>,
    /// Heartbeats by outcome, batch sizes and write times.
    pub metrics: HeartbeatMetrics,
    /// The CA agents are told to trust (`TakeoverInit.ca_certificate`).
    pub ca_der: Vec<u8>,
    task: tokio::task::JoinHandle<()>,
}

/// Why the agent callback could not start.
#[derive(Debug, thiserror::Error)]
pub enum CallbackError {
    #[error("the callback's TLS: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("{listen}: {message}")]
    Listen { listen: SocketAddr, message: String },
}

impl Callback {
    /// Binds `listen` and serves heartbeats into `bmdb` (on the current
    /// actix system: the writer is an actor).
    pub async fn start(
        bmdb: crate::Bmdb,
        identity: &ServerIdentity,
        listen: SocketAddr,
        max_batch: usize,
        max_writes_in_flight: usize,
    ) -> Result<Callback, CallbackError> {
        let tls = identity.server_config()?;
        let bind = |e: std::io::Error| CallbackError::Listen {
            listen,
            message: e.to_string(),
        };
        let listener = tokio::net::TcpListener::bind(listen).await.map_err(bind)?;
        let addr = listener.local_addr().map_err(bind)?;
        let metrics = HeartbeatMetrics::default();
        let writer =
            HeartbeatWriter::new(bmdb, max_batch, max_writes_in_flight, metrics.clone()).start();
        let task = server::spawn(
            listener,
            tls,
            AgentCallback::new(writer.clone(), metrics.clone()),
        );
        tracing::info!(%addr, "agent callback listening");
        Ok(Callback {
            addr,
            writer,
            metrics,
            ca_der: identity.ca_der.clone(),
            task,
        })
    }
}

impl Drop for Callback {
    fn drop(&mut self) {
        self.task.abort();
    }
}
