//! TFTP, read-only, for the iPXE binaries and the signed chain's files of
//! a boot being served ([`files`](super::files)), nothing else (RFC 1350),
//! with the options every PXE ROM asks for: `blksize` (RFC 2348), `tsize`
//! and `timeout` (RFC 2349) and `windowsize` (RFC 7440).
//!
//! Written here rather than taken from a crate: the maintained ones run
//! on another runtime (`async-tftp` on smol) or serve a directory
//! read-write from a thread per client (`tftpd`); shepherd needs a few
//! fixed files served from tokio, a transfer per socket, counted.
//!
//! Each transfer runs on its own socket (a new port, as RFC 1350 asks),
//! bound to the provisioning interface; a malformed request is answered
//! with an error or dropped, never a crash.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;

/// The files served: Debian's `ipxe` package's binaries.
pub const SERVED: [&str; 4] = ["undionly.kpxe", "snponly.efi", "ipxe.efi", "ipxe.pxe"];

const RRQ: u16 = 1;
const WRQ: u16 = 2;
const DATA: u16 = 3;
const ACK: u16 = 4;
const ERROR: u16 = 5;
const OACK: u16 = 6;

/// How many times a block (or the OACK) is sent before the transfer is
/// given up.
const TRIES: u32 = 5;

/// A read request, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRequest {
    pub file: String,
    pub mode: String,
    pub blksize: Option<u16>,
    pub tsize: bool,
    pub timeout: Option<u8>,
    pub windowsize: Option<u16>,
}

/// Why a request is refused: the TFTP error code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: u16,
    pub message: String,
}

pub fn refuse(code: u16, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

/// Parses a request packet: Ok(read request), Err(the error to answer),
/// or Err with code 0 and an empty message for a packet to drop.
pub fn parse_request(p: &[u8]) -> Result<ReadRequest, Refusal> {
    if p.len() < 4 || p.len() > 1024 {
        return Err(refuse(0, ""));
    }
    let op = u16::from_be_bytes([p[0], p[1]]);
    match op {
        RRQ => {}
        WRQ => return Err(refuse(2, "read-only server")),
        _ => return Err(refuse(0, "")),
    }
    let fields: Vec<&[u8]> = p[2..].split(|b| *b == 0).collect();
    // Every field ends with a NUL: the last split piece is empty.
    if fields.len() < 3 || !fields.last().is_some_and(|l| l.is_empty()) {
        return Err(refuse(4, "malformed request"));
    }
    let text = |b: &[u8]| std::str::from_utf8(b).map(str::to_string);
    let file = text(fields[0]).map_err(|_| refuse(4, "malformed file name"))?;
    let mode = text(fields[1])
        .map_err(|_| refuse(4, "malformed mode"))?
        .to_ascii_lowercase();
    if mode != "octet" && mode != "netascii" {
        return Err(refuse(4, format!("mode {mode:?} is not served")));
    }
    let mut req = ReadRequest {
        file,
        mode,
        blksize: None,
        tsize: false,
        timeout: None,
        windowsize: None,
    };
    let opts = &fields[2..fields.len() - 1];
    for pair in opts.chunks(2) {
        let [name, value] = pair else { break };
        let (Ok(name), Ok(value)) = (text(name), text(value)) else {
            continue;
        };
        match name.to_ascii_lowercase().as_str() {
            "blksize" => {
                if let Ok(n) = value.parse::<u32>()
                    && n >= 8
                {
                    req.blksize = Some(n.min(1428) as u16);
                }
            }
            "tsize" => req.tsize = true,
            "timeout" => {
                if let Ok(n) = value.parse::<u8>()
                    && n >= 1
                {
                    req.timeout = Some(n);
                }
            }
            "windowsize" => {
                if let Ok(n) = value.parse::<u16>()
                    && n >= 1
                {
                    req.windowsize = Some(n.min(64));
                }
            }
            _ => {} // Unknown options are ignored (RFC 2347).
        }
    }
    Ok(req)
}

/// The file a request names, if it is one of [`SERVED`] (a leading `/`
/// is tolerated, as some ROMs send one).
pub fn served_file(root: &Path, name: &str) -> Result<PathBuf, Refusal> {
    let name = name.trim_start_matches('/');
    if !SERVED.contains(&name) {
        return Err(refuse(1, format!("{name}: not served")));
    }
    let path = root.join(name);
    if !path.is_file() {
        return Err(refuse(1, format!("{name}: not found")));
    }
    Ok(path)
}

fn error_packet(r: &Refusal) -> Vec<u8> {
    let mut p = Vec::with_capacity(5 + r.message.len());
    p.extend_from_slice(&ERROR.to_be_bytes());
    p.extend_from_slice(&r.code.to_be_bytes());
    p.extend_from_slice(r.message.as_bytes());
    p.push(0);
    p
}

fn oack(req: &ReadRequest, size: u64) -> Option<Vec<u8>> {
    let mut p = OACK.to_be_bytes().to_vec();
    let mut put = |k: &str, v: String| {
        p.extend_from_slice(k.as_bytes());
        p.push(0);
        p.extend_from_slice(v.as_bytes());
        p.push(0);
    };
    let mut any = false;
    if let Some(b) = req.blksize {
        put("blksize", b.to_string());
        any = true;
    }
    if req.tsize {
        put("tsize", size.to_string());
        any = true;
    }
    if let Some(t) = req.timeout {
        put("timeout", t.to_string());
        any = true;
    }
    if let Some(w) = req.windowsize {
        put("windowsize", w.to_string());
        any = true;
    }
    any.then_some(p)
}

/// How a transfer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Complete,
    /// The client stopped answering.
    TimedOut,
    /// The client sent an error (many ROMs do after reading `tsize`).
    Aborted,
    Failed,
}

impl Ended {
    pub fn as_str(self) -> &'static str {
        match self {
            Ended::Complete => "complete",
            Ended::TimedOut => "timed_out",
            Ended::Aborted => "aborted",
            Ended::Failed => "failed",
        }
    }
}

/// Sends `data` to `peer` over `sock` (connected), as `req` asked.
pub async fn transfer(sock: &UdpSocket, req: &ReadRequest, data: Arc<Vec<u8>>) -> Ended {
    let blksize = req.blksize.unwrap_or(512) as usize;
    let window = req.windowsize.unwrap_or(1) as u64;
    let wait = Duration::from_secs(u64::from(req.timeout.unwrap_or(1)).clamp(1, 5));
    let blocks = data.len() / blksize + 1; // the last is shorter, maybe empty
    let mut buf = [0u8; 1500];

    // Waits for an ACK; Some(block acked) or None (timeout); Err: the
    // client gave up.
    async fn ack(sock: &UdpSocket, buf: &mut [u8], wait: Duration) -> Result<Option<u16>, Ended> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(until, sock.recv(buf)).await {
                Err(_) => return Ok(None),
                Ok(Err(_)) => return Err(Ended::Failed),
                Ok(Ok(n)) if n >= 4 => {
                    let op = u16::from_be_bytes([buf[0], buf[1]]);
                    match op {
                        ACK => return Ok(Some(u16::from_be_bytes([buf[2], buf[3]]))),
                        ERROR => return Err(Ended::Aborted),
                        _ => continue,
                    }
                }
                Ok(Ok(_)) => continue,
            }
        }
    }

    if let Some(o) = oack(req, data.len() as u64) {
        let mut tries = 0;
        loop {
            if sock.send(&o).await.is_err() {
                return Ended::Failed;
            }
            match ack(sock, &mut buf, wait).await {
                Ok(Some(0)) => break,
                Ok(_) => {
                    tries += 1;
                    if tries >= TRIES {
                        return Ended::TimedOut;
                    }
                }
                Err(e) => return e,
            }
        }
    }

    // Blocks are numbered from 1, modulo 2^16; `next` counts from 0.
    let mut next: u64 = 0;
    let mut tries = 0;
    let mut packet = Vec::with_capacity(4 + blksize);
    while (next as usize) < blocks {
        let end = (next + window).min(blocks as u64);
        for i in next..end {
            let from = i as usize * blksize;
            let to = (from + blksize).min(data.len());
            packet.clear();
            packet.extend_from_slice(&DATA.to_be_bytes());
            packet.extend_from_slice(&(((i + 1) & 0xffff) as u16).to_be_bytes());
            packet.extend_from_slice(&data[from.min(data.len())..to]);
            if sock.send(&packet).await.is_err() {
                return Ended::Failed;
            }
        }
        match ack(sock, &mut buf, wait).await {
            Ok(Some(n)) => {
                // The highest block in the window this ACK names.
                let acked = (next..end).rev().find(|i| ((i + 1) & 0xffff) as u16 == n);
                match acked {
                    Some(i) => {
                        next = i + 1;
                        tries = 0;
                    }
                    None => tries += 1,
                }
            }
            Ok(None) => tries += 1,
            Err(e) => return e,
        }
        if tries >= TRIES {
            return Ended::TimedOut;
        }
    }
    Ended::Complete
}

/// Answers `packet` from `peer`: a transfer on a new socket bound like
/// `bind` (the server's address, port 0, on `device`), or an error.
/// `resolve` gives the file a request names: its bytes and its name in
/// the metrics, or the refusal to answer. Returns how it ended and that
/// name, None when nothing was sent.
pub async fn serve_request<F, Fut>(
    packet: &[u8],
    peer: SocketAddr,
    local: SocketAddr,
    device: Option<&str>,
    resolve: F,
) -> Option<(Ended, String)>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<(String, Vec<u8>), Refusal>>,
{
    let sock = match socket(local, device, peer) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "TFTP: cannot open a transfer socket");
            return None;
        }
    };
    let req = match parse_request(packet) {
        Ok(r) => r,
        Err(r) if r.code == 0 && r.message.is_empty() => return None,
        Err(r) => {
            tracing::info!(%peer, refused = %r.message, "TFTP request refused");
            let _ = sock.send(&error_packet(&r)).await;
            return Some((Ended::Failed, String::new()));
        }
    };
    let (label, data) = match resolve(req.file.clone()).await {
        Ok(x) => x,
        Err(r) => {
            tracing::info!(%peer, file = %req.file, refused = %r.message, "TFTP request refused");
            let _ = sock.send(&error_packet(&r)).await;
            return Some((Ended::Failed, String::new()));
        }
    };
    let ended = transfer(&sock, &req, Arc::new(data)).await;
    tracing::info!(%peer, file = %req.file, ended = ended.as_str(), "TFTP transfer");
    Some((ended, label))
}

/// One of the iPXE binaries ([`SERVED`]) in `root`: its name and bytes.
pub async fn ipxe_binary(root: &Path, name: &str) -> Result<(String, Vec<u8>), Refusal> {
    let path = served_file(root, name)?;
    match tokio::fs::read(&path).await {
        Ok(d) => Ok((name.trim_start_matches('/').to_string(), d)),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "TFTP: cannot read a served file");
            Err(refuse(0, format!("{name}: cannot be read")))
        }
    }
}

fn socket(local: SocketAddr, device: Option<&str>, peer: SocketAddr) -> std::io::Result<UdpSocket> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(local),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    if let Some(d) = device {
        s.bind_device(Some(d.as_bytes()))?;
    }
    s.set_nonblocking(true)?;
    s.bind(&SocketAddr::new(local.ip(), 0).into())?;
    s.connect(&peer.into())?;
    UdpSocket::from_std(s.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rrq(parts: &[&str]) -> Vec<u8> {
        let mut p = RRQ.to_be_bytes().to_vec();
        for s in parts {
            p.extend_from_slice(s.as_bytes());
            p.push(0);
        }
        p
    }

    #[test]
    fn a_rom_s_request_and_its_options_are_read() {
        let r = parse_request(&rrq(&[
            "undionly.kpxe",
            "octet",
            "tsize",
            "0",
            "blksize",
            "1432",
        ]))
        .unwrap();
        assert_eq!(r.file, "undionly.kpxe");
        assert!(r.tsize);
        assert_eq!(r.blksize, Some(1428));
        let o = oack(&r, 70000).unwrap();
        assert_eq!(&o[..2], &OACK.to_be_bytes());
        let text = String::from_utf8_lossy(&o[2..]).to_string();
        assert!(text.contains("blksize\x001428\x00"), "{text:?}");
        assert!(text.contains("tsize\x0070000\x00"), "{text:?}");
        let plain = parse_request(&rrq(&["snponly.efi", "OCTET"])).unwrap();
        assert!(oack(&plain, 1).is_none());
    }

    #[test]
    fn writes_odd_modes_and_garbage_are_refused_or_dropped() {
        let mut wrq = rrq(&["x", "octet"]);
        wrq[1] = 2;
        assert_eq!(parse_request(&wrq).unwrap_err().code, 2);
        assert_eq!(parse_request(&rrq(&["x", "mail"])).unwrap_err().code, 4);
        assert_eq!(parse_request(&[0, 1, b'x']).unwrap_err().code, 0);
        assert_eq!(parse_request(&[0, 9, 0, 0, 0]).unwrap_err().code, 0);
        let mut unended = rrq(&["x", "octet"]);
        unended.pop();
        assert_eq!(parse_request(&unended).unwrap_err().code, 4);
        assert!(parse_request(&vec![0u8; 5000]).is_err());
        let root = Path::new("/nonexistent");
        assert_eq!(served_file(root, "../etc/passwd").unwrap_err().code, 1);
        assert_eq!(served_file(root, "undionly.kpxe").unwrap_err().code, 1);
    }
}
