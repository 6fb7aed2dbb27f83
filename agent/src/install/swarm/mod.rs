//! An image's chunks fetched from the other machines installing it, and
//! served to them (`ImageInstallation.swarm`, CONTRACTS.md §4a).
//!
//! The agent starts its chunk server ([`serve`]), joins the image's swarm
//! at shepherd's image server (which names, nearest first, the members to
//! ask: its ancestors in a tree of those that joined before it), then
//! takes the chunks in order: each from the first member that has it,
//! else from the image server (a `Range`). Every chunk, whatever its
//! source, is checked against the manifest before it is kept, served or
//! handed to the disk: a lying member costs a chunk fetched again and is
//! not asked again, never a wrong byte. Once its own fetch is done the
//! agent serves on while members keep asking, or machines asked to
//! install the image are still to join (up to [`LINGER_MAX`]), then
//! leaves.
//!
//! - [`tls`]: members know each other by their callback keys;
//! - [`store`]: the chunks held for the others, bounded;
//! - [`serve`]: the chunk server;
//! - [`client`]: one request at a time to a member or to a server.

mod client;
pub mod serve;
pub mod store;
pub mod tls;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, header};
use prost::Message as _;
use shepherd_proto::api::{ImageInstallation, ImageManifest, SwarmJoin, SwarmView};
use shepherd_proto::manifest;

use super::Counters;
use super::chunks::Chunks;
use super::fetch::{self, AgentKey, AsyncSink, FetchLimits, Fetched, Piece};
use client::{Ask, Conn, Failure, Within};
use serve::Members;
use store::ChunkStore;

/// A member that failed is not asked again for a while: [`COOL_FIRST`]
/// after one failure, doubled with each failure in a row, up to [`COOL`]
/// (a member busy a moment, on a starved machine, is asked again soon;
/// one that is gone soon costs nothing more).
const COOL: Duration = Duration::from_secs(30);
const COOL_FIRST: Duration = Duration::from_secs(4);
/// Joins tried at the start before the agent fetches from the image
/// server alone (a join shepherd answers 503 is asked again).
const JOIN_TRIES: u32 = 5;
/// Joins asked early (a member not known yet, one that failed) come at
/// most this often.
const MIN_REJOIN: Duration = Duration::from_secs(1);
/// Chunks kept for the other members, at most: a quarter of the memory
/// available, up to this.
pub const CACHE_MAX: usize = 256 << 20;
/// Once its own fetch is done, the agent serves on until no member asked
/// for this long, or for this long at most.
const LINGER_IDLE: Duration = Duration::from_secs(15);
pub const LINGER_MAX: Duration = Duration::from_secs(300);
/// ... or for this long while machines asked to install the image have
/// not joined yet: more than an agent's heartbeat interval (30 s by
/// default), within which each learns of its installation.
const LINGER_AWAITED: Duration = Duration::from_secs(60);

/// Swarms still served after their fetch ended ([`settled`]).
static LINGERING: AtomicUsize = AtomicUsize::new(0);

/// Whether a swarm is still served after its fetch ended.
pub fn lingering() -> bool {
    LINGERING.load(Ordering::Relaxed) > 0
}

/// Once no swarm is served any more (each stops once its members stop
/// asking, [`LINGER_MAX`] at most): what a machine about to reboot, or a
/// process about to end, waits for.
pub async fn settled() {
    while LINGERING.load(Ordering::Relaxed) > 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A swarm joined: the chunk server running, the membership kept up by
/// a task of its own ([`keep_joined`]), whom to ask.
pub struct Swarm {
    manifest: ImageManifest,
    image: Conn,
    store: Arc<ChunkStore>,
    membership: Arc<Membership>,
    server: tokio::task::JoinHandle<()>,
    joiner: tokio::task::JoinHandle<()>,
    key: AgentKey,
    /// Members' connections, by address and key.
    peers: HashMap<(String, Vec<u8>), Peer>,
}

/// The swarm as shepherd last showed it.
#[derive(Default)]
struct Membership {
    view: std::sync::Mutex<SwarmView>,
    members: Arc<Members>,
    /// Told to leave.
    leave: tokio::sync::Notify,
}

struct Peer {
    conn: Conn,
    /// It sent a chunk that did not match: never asked again.
    lied: bool,
    resting_until: Option<Instant>,
    /// Failures in a row.
    failures: u32,
}

/// What asking the members for a chunk came to.
enum FromMembers {
    Got(Bytes),
    /// Every member asked answered that it does not hold it (or there is
    /// none to ask): the image server's.
    NoneHolds,
    /// Some could not be asked (failed, or resting after a failure).
    Missed,
}

/// The bytes to keep for the other members: `asked`, else a quarter of
/// the memory available up to [`CACHE_MAX`].
fn cache_bytes(asked: Option<usize>) -> usize {
    asked.unwrap_or_else(|| {
        let available = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemAvailable:"))?
                    .split_whitespace()
                    .nth(1)?
                    .parse::<usize>()
                    .ok()
            })
            .map_or(CACHE_MAX, |kib| kib * 1024 / 4);
        available.min(CACHE_MAX)
    })
}

/// The address this machine reaches `url`'s host from (no packet sent):
/// where its chunk server listens.
async fn local_ip(url: &str) -> Result<IpAddr, String> {
    let src = fetch::parse(url)?;
    let to = tokio::net::lookup_host((src.host.as_str(), src.port))
        .await
        .map_err(|e| format!("cannot resolve {}: {e}", src.host))?
        .next()
        .ok_or_else(|| format!("{} resolves to no address", src.host))?;
    let any: SocketAddr = if to.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let udp = tokio::net::UdpSocket::bind(any)
        .await
        .map_err(|e| e.to_string())?;
    udp.connect(to)
        .await
        .map_err(|e| format!("no route to {to}: {e}"))?;
    Ok(udp.local_addr().map_err(|e| e.to_string())?.ip())
}

/// Joins (or leaves) the swarm at `conn` once: who the members are now.
async fn join_once(
    conn: &mut Conn,
    port: u16,
    leaving: bool,
    membership: &Membership,
) -> Result<(), String> {
    let body = SwarmJoin {
        port: u32::from(port),
        leaving,
    }
    .encode_to_vec();
    let path = conn.target().to_string();
    let headers = [(header::CONTENT_TYPE, "application/x-protobuf".to_string())];
    let ask = Ask {
        method: Method::POST,
        path: &path,
        headers: &headers,
        body: Bytes::from(body),
    };
    let within = Within {
        head: Duration::from_secs(15),
        stall: Duration::from_secs(15),
        max: 4 << 20,
    };
    let (_, answer) = conn.call(ask, within).await.map_err(|e| e.cause())?;
    if leaving {
        return Ok(());
    }
    let view =
        SwarmView::decode(answer).map_err(|e| format!("the answer is not a SwarmView: {e}"))?;
    let keys: Vec<[u8; 32]> = view
        .member_keys
        .iter()
        .filter_map(|k| <[u8; 32]>::try_from(k.as_slice()).ok())
        .collect();
    *membership.view.lock().unwrap() = view;
    membership.members.set(keys);
    Ok(())
}

/// Joins again every `refresh_seconds`, and at once when the chunk server
/// met a key it does not know (a member that joined since); leaves when
/// told. A failed join keeps the members known before.
async fn keep_joined(mut conn: Conn, port: u16, membership: Arc<Membership>) {
    loop {
        let every = {
            let v = membership.view.lock().unwrap();
            Duration::from_secs(u64::from(v.refresh_seconds.clamp(1, 60)))
        };
        let last = Instant::now();
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = membership.members.stale.notified() => {
                // Asked early: at most one join a second, whoever keeps
                // asking (a stranger held by the chunk server, say).
                tokio::time::sleep(MIN_REJOIN.saturating_sub(last.elapsed())).await;
            }
            _ = membership.leave.notified() => break,
        }
        let _ = join_once(&mut conn, port, false, &membership).await;
    }
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        join_once(&mut conn, port, true, &membership),
    )
    .await;
}

impl Swarm {
    /// Starts the chunk server and joins the swarm `req` names, keeping
    /// `cache` bytes of chunks at most (None: [`cache_bytes`]).
    pub async fn join(
        req: &ImageInstallation,
        chunks: &Chunks,
        key: &AgentKey,
        cache: Option<usize>,
    ) -> Result<Swarm, String> {
        let (url, asked_port) = req
            .swarm
            .as_ref()
            .map(|s| (s.url.clone(), s.port))
            .ok_or("the request names no swarm")?;
        let asked_port = u16::try_from(asked_port)
            .map_err(|_| format!("the swarm's port {asked_port} is not a TCP port"))?;
        let digest = req
            .manifest
            .as_ref()
            .map(|m| m.digest.as_str())
            .unwrap_or("");
        let hex = digest
            .trim()
            .to_ascii_lowercase()
            .trim_start_matches("sha256:")
            .to_string();
        let tls = fetch::tls_config(&req.ca_certificate, Some(key))?;
        let ip = local_ip(&url).await?;
        let listener = tokio::net::TcpListener::bind((ip, asked_port))
            .await
            .map_err(|e| {
                format!("the chunk server cannot listen on {ip} port {asked_port}: {e}")
            })?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let mut conn = Conn::server(&url, tls.clone())?;
        let membership = Arc::new(Membership::default());
        let mut tries = 0;
        while let Err(e) = join_once(&mut conn, port, false, &membership).await {
            tries += 1;
            if tries >= JOIN_TRIES {
                return Err(format!("joining at {url}: {e} ({tries} tries)"));
            }
            tokio::time::sleep(fetch::pause(tries)).await;
        }
        let store = Arc::new(ChunkStore::new(hex, chunks.count(), cache_bytes(cache)));
        let server = tokio::spawn(serve::serve(
            listener,
            tls::server_config(key)?,
            store.clone(),
            membership.members.clone(),
        ));
        let joiner = tokio::spawn(keep_joined(conn, port, membership.clone()));
        Ok(Swarm {
            manifest: chunks.manifest().clone(),
            image: Conn::server(&req.url, tls)?,
            store,
            membership,
            server,
            joiner,
            key: key.clone(),
            peers: HashMap::new(),
        })
    }

    /// Members listed at the last join, and whom this one asks.
    pub fn sizes(&self) -> (usize, usize) {
        let v = self.membership.view.lock().unwrap();
        (v.member_keys.len(), v.sources.len())
    }

    /// How long a member that has its image serves on without being
    /// asked: None when it is the only one and none is awaited.
    fn idle_limit(&self) -> Option<Duration> {
        let v = self.membership.view.lock().unwrap();
        if v.awaited > 0 {
            Some(LINGER_AWAITED)
        } else if v.member_keys.len() > 1 {
            Some(LINGER_IDLE)
        } else {
            None
        }
    }

    /// Chunk `i` from the first member that has it, checked; or why none
    /// gave it.
    async fn ask_members(
        &mut self,
        i: u64,
        stall: Duration,
        counters: &Counters,
        log: &(dyn Fn(std::fmt::Arguments<'_>) + Send + Sync),
    ) -> FromMembers {
        let (_, len, _) = manifest::chunk(&self.manifest, i);
        let path = format!("/chunks/{}/{i}", self.store.manifest);
        let sources = self.membership.view.lock().unwrap().sources.clone();
        let mut missed = false;
        for source in sources {
            let Ok(key) = <[u8; 32]>::try_from(source.key.as_slice()) else {
                continue;
            };
            let Ok(addr) = source.address.parse::<SocketAddr>() else {
                continue;
            };
            let peer = match self
                .peers
                .entry((source.address.clone(), source.key.clone()))
            {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let Ok(tls) = tls::client_config(&self.key, key) else {
                        continue;
                    };
                    e.insert(Peer {
                        conn: Conn::member(addr, tls),
                        lied: false,
                        resting_until: None,
                        failures: 0,
                    })
                }
            };
            if peer.lied {
                continue;
            }
            if peer.resting_until.is_some_and(|t| Instant::now() < t) {
                missed = true;
                continue;
            }
            let within = Within {
                head: serve::WAIT + Duration::from_secs(10),
                stall,
                max: len,
            };
            let asked = peer.conn.call(Ask::get(&path, &[]), within).await;
            match asked {
                Ok((_, chunk))
                    if chunk.len() as u64 == len
                        && manifest::matches(&self.manifest, i, &[&chunk]) =>
                {
                    peer.failures = 0;
                    counters.from_peers.fetch_add(len, Ordering::Relaxed);
                    return FromMembers::Got(chunk);
                }
                Ok(_) => {
                    peer.lied = true;
                    counters.refused.fetch_add(1, Ordering::Relaxed);
                    log(format_args!(
                        "chunk {i} from {} does not match the image's manifest: refused, and that member is not asked again",
                        peer.conn.name
                    ));
                }
                Err(Failure::NotHeld) => peer.failures = 0,
                Err(Failure::Failed(e)) => {
                    missed = true;
                    peer.failures += 1;
                    let cool = (COOL_FIRST * 2u32.pow(peer.failures.min(4) - 1)).min(COOL);
                    peer.resting_until = Some(Instant::now() + cool);
                    log(format_args!(
                        "{} failed ({e}): not asked for {}",
                        peer.conn.name,
                        humantime::format_duration(cool)
                    ));
                    // It may have left since the last join: whom to ask
                    // instead, from the next chunk on.
                    self.membership.members.stale.notify_one();
                }
            }
        }
        if missed {
            FromMembers::Missed
        } else {
            FromMembers::NoneHolds
        }
    }

    /// Chunk `i` from the image server, checked; tried again as a whole
    /// fetch is.
    async fn ask_server(
        &mut self,
        i: u64,
        limits: &FetchLimits,
        counters: &Counters,
    ) -> Result<Bytes, String> {
        let (start, len, _) = manifest::chunk(&self.manifest, i);
        let range = format!("bytes={start}-{}", start + len - 1);
        let target = self.image.target().to_string();
        let headers = [
            (header::RANGE, range),
            (header::ACCEPT_ENCODING, "identity".to_string()),
        ];
        let within = Within {
            head: limits.connect,
            stall: limits.stall,
            max: len,
        };
        let mut fruitless = 0u32;
        loop {
            let asked = self.image.call(Ask::get(&target, &headers), within).await;
            let cause = match asked {
                Ok((_, chunk))
                    if chunk.len() as u64 == len
                        && manifest::matches(&self.manifest, i, &[&chunk]) =>
                {
                    return Ok(chunk);
                }
                Ok(_) => {
                    counters.refused.fetch_add(1, Ordering::Relaxed);
                    format!(
                        "chunk {i} from {} does not match the manifest",
                        self.image.name
                    )
                }
                Err(Failure::NotHeld) => {
                    return Err(format!("{} answered 404 for {target}", self.image.name));
                }
                Err(Failure::Failed(e)) => e,
            };
            fruitless += 1;
            if fruitless > limits.retries {
                return Err(format!(
                    "fetching chunk {i} (bytes {start}..{}) from {} failed: {cause} ({fruitless} attempts in a row)",
                    start + len,
                    self.image.name
                ));
            }
            counters.resumes.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(fetch::pause(fruitless)).await;
        }
    }

    /// Fetches the image chunk by chunk into `sink` (members first, then
    /// the server), keeping each for the other members; then serves on
    /// in the background while they keep asking.
    pub async fn fetch<S: AsyncSink>(
        mut self,
        limits: &FetchLimits,
        counters: &Counters,
        mut sink: S,
        log: &(dyn Fn(std::fmt::Arguments<'_>) + Send + Sync),
    ) -> Result<Fetched, String> {
        let count = manifest::chunks(self.manifest.size_bytes, self.manifest.chunk_size);
        let before = counters.refused.load(Ordering::Relaxed);
        let mut taken = 0u64;
        let mut outcome = Ok(());
        for i in 0..count {
            let mut asked = self.ask_members(i, limits.stall, counters, log).await;
            if let FromMembers::Missed = asked {
                // Some could not be asked: whom to ask now (those that
                // left are gone from it), and every member not a liar
                // asked once more before the image server.
                self.membership.members.renew().await;
                for p in self.peers.values_mut() {
                    p.resting_until = None;
                }
                asked = self.ask_members(i, limits.stall, counters, log).await;
            }
            let chunk = match asked {
                FromMembers::Got(c) => c,
                other => {
                    let why = match other {
                        FromMembers::NoneHolds if self.sizes().1 == 0 => "no member to ask",
                        FromMembers::NoneHolds => "no member asked held it",
                        _ => "members could not be asked",
                    };
                    log(format_args!("chunk {i} from the image server: {why}"));
                    match self.ask_server(i, limits, counters).await {
                        Ok(c) => c,
                        Err(e) => {
                            outcome = Err(e);
                            break;
                        }
                    }
                }
            };
            taken += chunk.len() as u64;
            self.store.put(i, chunk.clone());
            if let Err(e) = sink.put(Piece::from(chunk)).await {
                outcome = Err(e);
                break;
            }
        }
        self.store.end();
        let refused = counters.refused.load(Ordering::Relaxed) - before;
        match outcome {
            Ok(()) => {
                LINGERING.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(self.linger());
                Ok(Fetched {
                    bytes: taken,
                    resumes: 0,
                    refused,
                })
            }
            Err(e) => {
                self.leave().await;
                Err(e)
            }
        }
    }

    /// Serves on while members keep asking, or machines asked to install
    /// the image are still to join, then leaves: at once when it is the
    /// swarm's only member and none is awaited (as shepherd says now,
    /// not at the last join: a fetch may take less than a refresh).
    async fn linger(self) {
        self.membership.members.renew().await;
        let started = Instant::now();
        let mut served = self.store.served_chunks.load(Ordering::Relaxed);
        let mut asked_at = started;
        while started.elapsed() < LINGER_MAX {
            match self.idle_limit() {
                Some(idle) if asked_at.elapsed() < idle => {}
                _ => break,
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.store.served_chunks.load(Ordering::Relaxed);
            if now != served {
                (served, asked_at) = (now, Instant::now());
            }
        }
        self.leave().await;
        LINGERING.fetch_sub(1, Ordering::Relaxed);
    }

    /// Leaves the swarm and stops serving.
    async fn leave(self) {
        self.server.abort();
        self.membership.leave.notify_one();
        let _ = self.joiner.await;
    }
}
