//! One request at a time over a kept-alive HTTP/1.1 connection: a chunk
//! from a member's chunk server, a chunk from the image server (a
//! `Range`), the swarm's join. Bounded in time at every step, as the
//! image's own fetch is.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Method, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use crate::install::fetch::{self, Source};

/// Why a request brought nothing.
#[derive(Debug)]
pub enum Failure {
    /// The source does not hold it (404): ask the next.
    NotHeld,
    /// Refused or broken: the cause.
    Failed(String),
}

impl Failure {
    pub fn cause(&self) -> String {
        match self {
            Failure::NotHeld => "not held".into(),
            Failure::Failed(e) => e.clone(),
        }
    }
}

/// One request.
pub struct Ask<'a> {
    pub method: Method,
    pub path: &'a str,
    pub headers: &'a [(header::HeaderName, String)],
    pub body: Bytes,
}

impl<'a> Ask<'a> {
    /// `GET path` with `headers`.
    pub fn get(path: &'a str, headers: &'a [(header::HeaderName, String)]) -> Ask<'a> {
        Ask {
            method: Method::GET,
            path,
            headers,
            body: Bytes::new(),
        }
    }
}

/// An answer's bounds: its head within `head` of the ask, each piece of
/// its body within `stall` of the last, at most `max` bytes of body.
#[derive(Debug, Clone, Copy)]
pub struct Within {
    pub head: Duration,
    pub stall: Duration,
    pub max: u64,
}

enum Dial {
    Member(SocketAddr),
    Server(Source),
}

/// A connection to one source, opened when first needed and again after
/// it broke.
pub struct Conn {
    /// What messages call the source.
    pub name: String,
    dial: Dial,
    tls: Arc<rustls::ClientConfig>,
    sender: Option<SendRequest<Full<Bytes>>>,
}

/// A TCP connection and its TLS within this long.
const CONNECT: Duration = Duration::from_secs(5);

impl Conn {
    /// To the member at `addr` (`tls` pins its key).
    pub fn member(addr: SocketAddr, tls: Arc<rustls::ClientConfig>) -> Conn {
        Conn {
            name: format!("member {addr}"),
            dial: Dial::Member(addr),
            tls,
            sender: None,
        }
    }

    /// The path (and query) of the URL a server connection was made for.
    pub fn target(&self) -> &str {
        match &self.dial {
            Dial::Server(src) => &src.target,
            Dial::Member(_) => "/",
        }
    }

    /// To the image server of `url`.
    pub fn server(url: &str, tls: Arc<rustls::ClientConfig>) -> Result<Conn, String> {
        let src = fetch::parse(url)?;
        Ok(Conn {
            name: src.authority.clone(),
            dial: Dial::Server(src),
            tls,
            sender: None,
        })
    }

    async fn ready(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, String> {
        let alive = match &mut self.sender {
            Some(s) => s.ready().await.is_ok(),
            None => false,
        };
        if alive {
            return Ok(self.sender.as_mut().expect("alive"));
        }
        self.sender = None;
        let io: Box<dyn fetch::Io> = match &self.dial {
            Dial::Server(src) => fetch::connect(src, &self.tls).await?,
            Dial::Member(addr) => {
                let tcp = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(|e| format!("cannot connect: {e}"))?;
                let _ = tcp.set_nodelay(true);
                let name = rustls::pki_types::ServerName::try_from("shepherd-agent")
                    .map_err(|e| e.to_string())?;
                let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS: {e}"))?;
                Box::new(tls)
            }
        };
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(self.sender.insert(sender))
    }

    fn authority(&self) -> String {
        match &self.dial {
            Dial::Server(src) => src.authority.clone(),
            Dial::Member(addr) => addr.to_string(),
        }
    }

    /// `ask`; the answer's status and body, within `within`.
    pub async fn call(
        &mut self,
        ask: Ask<'_>,
        within: Within,
    ) -> Result<(StatusCode, Bytes), Failure> {
        let Ask {
            method,
            path,
            headers,
            body,
        } = ask;
        let Within { head, stall, max } = within;
        let authority = self.authority();
        let asked = async {
            let sender = tokio::time::timeout(CONNECT, self.ready())
                .await
                .map_err(|_| {
                    format!(
                        "no connection within {}",
                        humantime::format_duration(CONNECT)
                    )
                })??;
            let mut req = http::Request::builder()
                .method(method)
                .uri(path)
                .header(header::HOST, authority.as_str())
                .header(header::USER_AGENT, "shepherd-agent");
            for (name, value) in headers {
                req = req.header(name, value.as_str());
            }
            let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
            sender
                .send_request(req)
                .await
                .map_err(|e| format!("the request: {e}"))
        };
        let resp = match tokio::time::timeout(head, asked).await {
            Err(_) => Err(format!(
                "no answer within {}",
                humantime::format_duration(head)
            )),
            Ok(r) => r,
        };
        let resp = resp.map_err(|e| {
            self.sender = None;
            Failure::Failed(e)
        })?;
        let status = resp.status();
        if status == StatusCode::NOT_FOUND {
            // Read to the end: the connection serves the next ask.
            let _ = fetch::reason(resp).await;
            return Err(Failure::NotHeld);
        }
        if !status.is_success() {
            let why = fetch::reason(resp).await;
            self.sender = None;
            return Err(Failure::Failed(format!("answered {status}{why}")));
        }
        let mut body = resp.into_body();
        let mut got = BytesMut::new();
        loop {
            match tokio::time::timeout(stall, body.frame()).await {
                Err(_) => {
                    self.sender = None;
                    return Err(Failure::Failed(format!(
                        "stalled: no data for {}",
                        humantime::format_duration(stall)
                    )));
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    self.sender = None;
                    return Err(Failure::Failed(format!("the connection broke: {e}")));
                }
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        got.extend_from_slice(&data);
                        if got.len() as u64 > max {
                            self.sender = None;
                            return Err(Failure::Failed(format!(
                                "sent more than the {max} bytes asked for"
                            )));
                        }
                    }
                }
            }
        }
        Ok((status, got.freeze()))
    }
}
