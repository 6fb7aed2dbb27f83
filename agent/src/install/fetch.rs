//! Fetching an image over HTTP(S), bounded in time at every step: the
//! connection (TCP, TLS and the response's head) within `connect`, every
//! piece of the body within `stall` of the last, the whole within the
//! installation's deadline. A connection that drops or stalls midway is
//! resumed where it stopped with a `Range` request (`If-Range` the first
//! response's validator); a server that answers a resumption with the
//! whole body again is read past what was already taken. Only attempts
//! that bring nothing count against `retries`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::header;
use http_body_util::BodyExt as _;
use hyper_util::rt::TokioIo;

use super::chunks::Chunks;

/// Bytes are handed on in pieces of at least this size (the last may be
/// shorter).
pub const PIECE: usize = 1 << 20;

/// Fetched bytes handed on together: the buffers the body arrived in, in
/// order, not copied (the hasher and the writer read them where they are).
#[derive(Debug, Clone, Default)]
pub struct Piece {
    parts: Vec<Bytes>,
    len: usize,
}

impl Piece {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    pub fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.len += b.len();
            self.parts.push(b);
        }
    }

    /// The first `n` bytes go, the rest stays.
    pub fn advance(&mut self, mut n: usize) {
        n = n.min(self.len);
        self.len -= n;
        let mut drop = 0;
        for p in &mut self.parts {
            if n == 0 {
                break;
            }
            let k = n.min(p.len());
            p.advance(k);
            n -= k;
            if p.is_empty() {
                drop += 1;
            }
        }
        self.parts.drain(..drop);
    }

    /// All of it, leaving it empty.
    pub fn take(&mut self) -> Piece {
        std::mem::take(self)
    }
}

impl From<Bytes> for Piece {
    fn from(b: Bytes) -> Piece {
        let mut p = Piece::default();
        p.push(b);
        p
    }
}

#[derive(Debug, Clone)]
pub struct FetchLimits {
    pub connect: Duration,
    pub stall: Duration,
    /// Attempts in a row that bring no byte before the fetch fails.
    pub retries: u32,
}

impl Default for FetchLimits {
    fn default() -> Self {
        FetchLimits {
            connect: Duration::from_secs(15),
            stall: Duration::from_secs(30),
            retries: 5,
        }
    }
}

/// What was fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fetched {
    pub bytes: u64,
    /// Connections resumed after the first.
    pub resumes: u32,
    /// Chunks that did not match the manifest, fetched again.
    pub refused: u32,
}

/// Where the image is.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    https: bool,
    pub(crate) host: String,
    pub(crate) port: u16,
    /// The request target: path and query.
    pub(crate) target: String,
    pub(crate) authority: String,
}

pub(crate) fn parse(url: &str) -> Result<Source, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("the image URL {url:?} is not a URL: {e}"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        other => {
            return Err(format!(
                "the image URL {url:?} has scheme {:?}; http and https are supported",
                other.unwrap_or("")
            ));
        }
    };
    let authority = uri
        .authority()
        .ok_or_else(|| format!("the image URL {url:?} names no host"))?;
    if authority.as_str().contains('@') {
        return Err("the image URL carries credentials; they are not supported".into());
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok(Source {
        https,
        port: authority.port_u16().unwrap_or(if https { 443 } else { 80 }),
        host,
        target: uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into()),
        authority: authority.as_str().to_string(),
    })
}

pub(crate) trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// The agent's ed25519 key, shown to shepherd's image server (the
/// request's CA) as the callback shows it: downloads from it need it.
#[derive(Clone)]
pub struct AgentKey(pub [u8; 32]);

impl std::fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentKey(..)")
    }
}

/// The TLS client for image servers: the request's CA if it gave one
/// (shepherd's image server, shown `key`'s certificate when it asks),
/// else the web PKI roots (and no certificate).
pub fn tls_config(
    ca_der: &[u8],
    key: Option<&AgentKey>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    if ca_der.is_empty() {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    } else {
        roots
            .add(rustls::pki_types::CertificateDer::from(ca_der.to_vec()))
            .map_err(|e| format!("the request's CA certificate: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let cfg = match key {
        Some(AgentKey(seed)) if !ca_der.is_empty() => {
            let (cert, key) = crate::callback::self_signed_agent_cert(seed)
                .map_err(|e| format!("the agent's certificate: {e}"))?;
            cfg.with_client_auth_cert(vec![cert], key)
                .map_err(|e| format!("the agent's certificate: {e}"))?
        }
        _ => cfg.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

pub(crate) async fn connect(
    src: &Source,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<Box<dyn Io>, String> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((src.host.as_str(), src.port))
        .await
        .map_err(|e| format!("cannot resolve {}: {e}", src.host))?
        .collect();
    let mut last = format!("{} resolves to no address", src.host);
    for addr in addrs {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(tcp) => {
                let _ = tcp.set_nodelay(true);
                if !src.https {
                    return Ok(Box::new(tcp));
                }
                let name = rustls::pki_types::ServerName::try_from(src.host.clone())
                    .map_err(|e| format!("server name {}: {e}", src.host))?;
                return match tokio_rustls::TlsConnector::from(tls.clone())
                    .connect(name, tcp)
                    .await
                {
                    Ok(s) => Ok(Box::new(s)),
                    Err(e) => Err(format!("TLS with {addr}: {e}")),
                };
            }
            Err(e) => last = format!("cannot connect to {addr}: {e}"),
        }
    }
    Err(last)
}

/// How one attempt ended.
enum Attempt {
    /// The body is complete.
    Done,
    /// Cut short (dropped, stalled, refused): the cause; try again.
    Broken(String),
    /// Not worth trying again (a 404, a changed length): the cause.
    Fatal(String),
}

/// Fetches `url` from byte 0 to its end, handing every piece (of at least
/// [`PIECE`] bytes but the last, in order, each byte exactly once) to `sink`; a sink error
/// stops the fetch with that error. With `chunks`, a piece is a chunk of
/// the image's manifest, handed on once it matches; one that does not is
/// fetched again from its start. `on_resume` is told of every resumption
/// and its cause.
#[allow(clippy::too_many_arguments)]
pub async fn fetch<S, R>(
    url: &str,
    ca_der: &[u8],
    key: Option<&AgentKey>,
    expected_size: Option<u64>,
    chunks: Option<Chunks>,
    limits: &FetchLimits,
    mut sink: S,
    mut on_resume: R,
) -> Result<Fetched, String>
where
    S: AsyncSink,
    R: FnMut(u64, &str),
{
    let src = parse(url)?;
    let tls = tls_config(ca_der, key)?;
    let mut state = State {
        taken: 0,
        total: expected_size,
        validator: None,
        piece: Piece::default(),
        chunks,
    };
    let mut resumes = 0;
    let mut fruitless = 0;
    loop {
        let before = state.taken;
        let mut outcome = attempt(&src, &tls, limits, &mut state, &mut sink).await;
        if let (Attempt::Done, Some(c)) = (&outcome, &state.chunks)
            && let Err(e) = c.finish()
        {
            state.taken = c.at();
            outcome = Attempt::Broken(e);
        }
        match outcome {
            Attempt::Done => {
                if !state.piece.is_empty() {
                    sink.put(state.piece.take()).await?;
                }
                return Ok(Fetched {
                    bytes: state.taken,
                    resumes,
                    refused: state.chunks.map_or(0, |c| c.refused),
                });
            }
            Attempt::Fatal(e) => return Err(e),
            Attempt::Broken(cause) => {
                if state.taken > before {
                    fruitless = 0;
                } else {
                    fruitless += 1;
                }
                if fruitless > limits.retries {
                    return Err(format!(
                        "fetching {url} failed at byte {}: {cause} ({} attempts in a row brought nothing)",
                        state.taken, fruitless
                    ));
                }
                tokio::time::sleep(pause(fruitless)).await;
                resumes += 1;
                on_resume(state.taken, &cause);
            }
        }
    }
}

/// The wait before another attempt after `fruitless` attempts in a row
/// that brought nothing: doubling from half a second, at most 10 s.
pub(crate) fn pause(fruitless: u32) -> Duration {
    Duration::from_millis(250 * (1 << fruitless.min(5))).min(Duration::from_secs(10))
}

/// Where the pieces go.
pub trait AsyncSink {
    fn put(&mut self, piece: Piece)
    -> impl std::future::Future<Output = Result<(), String>> + Send;
}

struct State {
    /// Bytes of the body taken so far (handed on or in `piece`).
    taken: u64,
    total: Option<u64>,
    /// The first response's ETag (strong) or Last-Modified.
    validator: Option<String>,
    piece: Piece,
    /// The manifest's check, and the chunk it gathers.
    chunks: Option<Chunks>,
}

async fn attempt<S: AsyncSink>(
    src: &Source,
    tls: &Arc<rustls::ClientConfig>,
    limits: &FetchLimits,
    state: &mut State,
    sink: &mut S,
) -> Attempt {
    let head = async {
        let io = connect(src, tls).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| format!("HTTP with {}: {e}", src.authority))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = http::Request::get(src.target.as_str())
            .header(header::HOST, src.authority.as_str())
            .header(header::USER_AGENT, "shepherd-agent")
            .header(header::ACCEPT_ENCODING, "identity");
        if state.taken > 0 {
            req = req.header(header::RANGE, format!("bytes={}-", state.taken));
            if let Some(v) = &state.validator {
                req = req.header(header::IF_RANGE, v.as_str());
            }
        }
        let req = req
            .body(http_body_util::Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        sender
            .send_request(req)
            .await
            .map_err(|e| format!("request to {}: {e}", src.authority))
    };
    let resp = match tokio::time::timeout(limits.connect, head).await {
        Err(_) => {
            return Attempt::Broken(format!(
                "{} did not answer within {}",
                src.authority,
                humantime::format_duration(limits.connect)
            ));
        }
        Ok(Err(e)) => return Attempt::Broken(e),
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    // Bytes of this body to drop: a server that ignored the Range sends
    // the whole again.
    let mut skip = 0u64;
    match status.as_u16() {
        200 => {
            skip = state.taken;
            let len = content_length(&resp);
            if let (Some(total), Some(len)) = (state.total, len) {
                if total != len {
                    return Attempt::Fatal(format!(
                        "the image at {} is {len} bytes, expected {total}",
                        src.target
                    ));
                }
            }
            state.total = state.total.or(len);
            if state.validator.is_none() {
                state.validator = validator(&resp);
            }
        }
        206 if state.taken > 0 => {
            let range = resp
                .headers()
                .get(header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let start = range
                .strip_prefix("bytes ")
                .and_then(|r| r.split('-').next())
                .and_then(|s| s.parse::<u64>().ok());
            if start != Some(state.taken) {
                return Attempt::Fatal(format!(
                    "asked {} for bytes from {}, it sent {range:?}",
                    src.authority, state.taken
                ));
            }
        }
        500..=599 | 408 | 429 => {
            return Attempt::Broken(format!("{} answered {status}", src.authority));
        }
        _ => {
            return Attempt::Fatal(format!(
                "{} answered {status} for {}{}",
                src.authority,
                src.target,
                reason(resp).await
            ));
        }
    }
    let mut body = resp.into_body();
    loop {
        let frame = match tokio::time::timeout(limits.stall, body.frame()).await {
            Err(_) => {
                return Attempt::Broken(format!(
                    "the download stalled: no data for {}",
                    humantime::format_duration(limits.stall)
                ));
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => return Attempt::Broken(format!("the connection broke: {e}")),
            Ok(Some(Ok(f))) => f,
        };
        let Ok(mut data) = frame.into_data() else {
            continue;
        };
        if skip > 0 {
            let n = skip.min(data.len() as u64) as usize;
            let _ = data.split_to(n);
            skip -= n as u64;
        }
        state.taken += data.len() as u64;
        if let Some(total) = state.total {
            if state.taken > total {
                return Attempt::Fatal(format!(
                    "{} sent more than the {total} bytes expected",
                    src.authority
                ));
            }
        }
        let ready = match &mut state.chunks {
            None => {
                state.piece.push(data);
                if state.piece.len() < PIECE {
                    continue;
                }
                vec![state.piece.take()]
            }
            Some(c) => match c.push(data) {
                Ok(ready) => ready,
                Err(refused) => {
                    // Again from the refused chunk's start.
                    state.taken = c.start();
                    return Attempt::Broken(refused);
                }
            },
        };
        for piece in ready {
            if let Err(e) = sink.put(piece).await {
                return Attempt::Fatal(e);
            }
        }
    }
    match state.total {
        Some(total) if state.taken < total => Attempt::Broken(format!(
            "the connection ended at byte {} of {total}",
            state.taken
        )),
        _ => Attempt::Done,
    }
}

/// ": <the first line of the body>" of a refusal, when it has one
/// (shepherd's image server says why), read within a second.
pub(crate) async fn reason(resp: http::Response<hyper::body::Incoming>) -> String {
    let body = http_body_util::Limited::new(resp.into_body(), 1024);
    let text = match tokio::time::timeout(Duration::from_secs(1), body.collect()).await {
        Ok(Ok(b)) => b.to_bytes(),
        _ => return String::new(),
    };
    let text = String::from_utf8_lossy(&text);
    let line: String = text
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    if line.trim().is_empty() {
        String::new()
    } else {
        format!(": {}", line.trim())
    }
}

fn content_length<B>(r: &http::Response<B>) -> Option<u64> {
    r.headers()
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

fn validator<B>(r: &http::Response<B>) -> Option<String> {
    let etag = r
        .headers()
        .get(header::ETAG)
        .and_then(|v| v.to_str().ok())
        .filter(|e| !e.starts_with("W/"));
    etag.or_else(|| {
        r.headers()
            .get(header::LAST_MODIFIED)
            .and_then(|v| v.to_str().ok())
    })
    .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_keeps_its_parts_in_order_and_advances_across_them() {
        let mut p = Piece::default();
        p.push(Bytes::from_static(b"abc"));
        p.push(Bytes::new());
        p.push(Bytes::from_static(b"defg"));
        assert_eq!((p.len(), p.parts().len()), (7, 2));
        p.advance(4);
        assert_eq!(p.len(), 3);
        assert_eq!(p.parts(), [Bytes::from_static(b"efg")]);
        p.advance(10);
        assert!(p.is_empty() && p.parts().is_empty());
    }
}
