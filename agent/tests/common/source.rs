//! An image source for the installation tests: a real HTTP server on
//! loopback that serves an image and its manifest, and can drop, stall or
//! corrupt a response midway; and the installation's own helpers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message as _;
use shepherd_agent::api::{ImageInstallation, ImageManifestRef};
use shepherd_agent::install::disk::Disk;
use shepherd_agent::install::fetch::FetchLimits;
use shepherd_agent::install::{Counters, Limits, install};
use shepherd_proto::manifest::{self, ManifestBuilder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// ---------------------------------------------------------------- server

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Behaviour {
    Normal,
    /// The first response ends (the connection closed) after this many
    /// body bytes.
    DropOnceAt(u64),
    /// Every response stops sending at this byte of the file, and hangs.
    StallAt(u64),
    /// Ignores Range (always the whole file), and the first response ends
    /// after this many body bytes.
    DropOnceIgnoringRanges(u64),
    /// Sends the byte at this offset changed: in the first response only,
    /// or in every response.
    CorruptAt {
        at: u64,
        once: bool,
    },
    /// Answers the first this many requests for the manifest 503, as a
    /// shepherd computing it does.
    ManifestBusy(usize),
}

pub struct Server {
    pub url: String,
    /// The image's manifest, served at `/manifests/disk.img`.
    pub manifest: ImageManifestRef,
    /// Request lines, with their Range header if any.
    pub log: Arc<Mutex<Vec<String>>>,
    /// Body bytes sent over all connections.
    pub sent: Arc<AtomicU64>,
    /// Where a swarm is joined (`POST`): answered [`Self::set_swarm`]'s
    /// view.
    pub swarm_url: String,
    swarm: Arc<Mutex<Vec<u8>>>,
}

impl Server {
    /// What a join of the swarm is answered: `view`, encoded.
    pub fn set_swarm(&self, view: &shepherd_agent::api::SwarmView) {
        *self.swarm.lock().unwrap() = view.encode_to_vec();
    }
}

pub async fn serve(data: Vec<u8>, behaviour: Behaviour) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut m = ManifestBuilder::new(manifest::CHUNK);
    m.update(&data);
    let m = m.finish().encode_to_vec();
    let manifest = ImageManifestRef {
        url: format!("http://{addr}/manifests/disk.img"),
        digest: manifest::sha256(&m),
    };
    let (data, m) = (Arc::new(data), Arc::new(m));
    let swarm = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::new(Mutex::new(Vec::new()));
    let sent = Arc::new(AtomicU64::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let (l, s, sw) = (log.clone(), sent.clone(), swarm.clone());
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            let (data, log, sent, dropped) = (data.clone(), l.clone(), s.clone(), dropped.clone());
            let (m, swarm) = (m.clone(), sw.clone());
            tokio::spawn(async move {
                let _ = respond(sock, data, m, swarm, behaviour, log, sent, dropped).await;
            });
        }
    });
    Server {
        url: format!("http://{addr}/images/disk.img"),
        manifest,
        log,
        sent,
        swarm_url: format!("http://{addr}/swarms/disk.img"),
        swarm,
    }
}

#[allow(clippy::too_many_arguments)]
async fn respond(
    mut sock: tokio::net::TcpStream,
    data: Arc<Vec<u8>>,
    manifest: Arc<Vec<u8>>,
    swarm: Arc<Mutex<Vec<u8>>>,
    behaviour: Behaviour,
    log: Arc<Mutex<Vec<String>>>,
    sent: Arc<AtomicU64>,
    dropped: Arc<AtomicBool>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = sock.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let line = text.lines().next().unwrap_or("").to_string();
    // `bytes=START-` or `bytes=START-END`.
    let range = text
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("range: bytes=")
                .map(str::to_string)
        })
        .and_then(|r| {
            let (start, end) = r.split_once('-')?;
            Some((start.parse::<u64>().ok()?, end.parse::<u64>().ok()))
        })
        .filter(|_| !matches!(behaviour, Behaviour::DropOnceIgnoringRanges(_)));
    log.lock().unwrap().push(match range {
        Some((r, None)) => format!("{line} Range: bytes={r}-"),
        Some((r, Some(e))) => format!("{line} Range: bytes={r}-{e}"),
        None => line.clone(),
    });
    if line.starts_with("POST /swarms/") {
        // The join's body read first (closing on unread bytes resets).
        let length = text
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().to_string())
            })
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let body_at = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let mut have = head.len() - body_at;
        while have < length {
            let n = sock.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            have += n;
        }
        let view = swarm.lock().unwrap().clone();
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            view.len()
        );
        sock.write_all(head.as_bytes()).await?;
        sock.write_all(&view).await?;
        return sock.flush().await;
    }
    if line.starts_with("GET /manifests/") {
        let asked = log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("/manifests/"))
            .count();
        if let Behaviour::ManifestBusy(n) = behaviour
            && asked <= n
        {
            let busy = "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
            sock.write_all(busy.as_bytes()).await?;
            return sock.flush().await;
        }
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            manifest.len()
        );
        sock.write_all(head.as_bytes()).await?;
        sock.write_all(&manifest).await?;
        return sock.flush().await;
    }
    let len = data.len() as u64;
    let start = range.map_or(0, |(s, _)| s);
    // One past the last byte sent.
    let stop = range.and_then(|(_, e)| e).map_or(len, |e| (e + 1).min(len));
    let resp = if range.is_some() {
        format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {start}-{}/{len}\r\nETag: \"v1\"\r\nAccept-Ranges: bytes\r\nConnection: close\r\n\r\n",
            stop - start,
            stop - 1
        )
    } else {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nETag: \"v1\"\r\nAccept-Ranges: bytes\r\nConnection: close\r\n\r\n"
        )
    };
    sock.write_all(resp.as_bytes()).await?;
    let mut at = start;
    while at < stop {
        let mut end = (at + (64 << 10)).min(stop);
        match behaviour {
            Behaviour::DropOnceAt(n) | Behaviour::DropOnceIgnoringRanges(n)
                if !dropped.load(Ordering::SeqCst) && end >= n =>
            {
                end = n;
                sock.write_all(&data[at as usize..end as usize]).await?;
                sent.fetch_add(end - at, Ordering::SeqCst);
                dropped.store(true, Ordering::SeqCst);
                // Close without sending the rest.
                return Ok(());
            }
            Behaviour::CorruptAt { at: n, once }
                if (at..end).contains(&n) && !(once && dropped.load(Ordering::SeqCst)) =>
            {
                let mut bytes = data[at as usize..end as usize].to_vec();
                bytes[(n - at) as usize] ^= 0x5a;
                sock.write_all(&bytes).await?;
                sent.fetch_add(end - at, Ordering::SeqCst);
                dropped.store(true, Ordering::SeqCst);
                at = end;
                continue;
            }
            Behaviour::StallAt(n) if end >= n => {
                end = n.max(at);
                sock.write_all(&data[at as usize..end as usize]).await?;
                sent.fetch_add(end - at, Ordering::SeqCst);
                sock.flush().await?;
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return Ok(());
            }
            _ => {}
        }
        sock.write_all(&data[at as usize..end as usize]).await?;
        sent.fetch_add(end - at, Ordering::SeqCst);
        at = end;
    }
    sock.flush().await?;
    Ok(())
}

// ---------------------------------------------------------------- helpers

pub fn request(url: &str, digest: &str, size: Option<u64>) -> ImageInstallation {
    ImageInstallation {
        url: url.into(),
        digest: digest.into(),
        size_bytes: size.map(|s| s as i64),
        ..Default::default()
    }
}

pub fn quick() -> Limits {
    Limits {
        fetch: FetchLimits {
            connect: Duration::from_secs(5),
            stall: Duration::from_secs(2),
            retries: 2,
        },
        deadline: Duration::from_secs(120),
        ..Limits::default()
    }
}

pub fn log_line(l: std::fmt::Arguments<'_>) {
    eprintln!("agent: {l}");
}

pub async fn run(
    req: &ImageInstallation,
    disks: Vec<Disk>,
) -> Result<shepherd_agent::install::Installed, String> {
    install(
        req,
        disks,
        Arc::new(Counters::default()),
        &quick(),
        &log_line,
    )
    .await
    .map_err(|f| f.error)
}
