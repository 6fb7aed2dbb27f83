//! An image's chunks from the other members of its swarm: a member that
//! holds them saves the image server every byte; a member that lies costs
//! one chunk fetched again, is not asked again, and the disk holds the
//! image; a member's chunk server serves members alone and is known by
//! its key. Real chunk servers (the agent's own) on loopback, a real
//! HTTP image source standing in for shepherd's image server and its
//! swarm's join (whose tree the shepherd tests check against the BMDB).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use shepherd_agent::api::{ImageSwarmRef, SwarmPeer, SwarmView};
use shepherd_agent::install::fetch::AgentKey;
use shepherd_agent::install::swarm::serve::{self, Members};
use shepherd_agent::install::swarm::store::ChunkStore;
use shepherd_agent::install::swarm::tls;
use shepherd_agent::install::{Counters, Limits, install};
use shepherd_proto::manifest::{self, CHUNK};

mod common;
use common::source::*;
use common::*;

fn public(seed: [u8; 32]) -> Vec<u8> {
    ed25519_dalek::SigningKey::from_bytes(&seed)
        .verifying_key()
        .to_bytes()
        .to_vec()
}

/// The installing agent's key.
const AGENT: [u8; 32] = [8; 32];
/// The member's.
const MEMBER: [u8; 32] = [9; 32];

/// A member's chunk server holding `chunks` of the manifest `hex`,
/// serving the keys of `members`: its address and store.
async fn member(
    hex: &str,
    chunks: Vec<Vec<u8>>,
    members: &[[u8; 32]],
) -> (std::net::SocketAddr, Arc<ChunkStore>) {
    let store = Arc::new(ChunkStore::new(hex.into(), chunks.len() as u64, 1 << 30));
    for (i, c) in chunks.into_iter().enumerate() {
        store.put(i as u64, Bytes::from(c));
    }
    store.end();
    let known = Arc::new(Members::default());
    known.set(members.iter().map(|s| public(*s).try_into().unwrap()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve::serve(
        listener,
        tls::server_config(&AgentKey(MEMBER)).unwrap(),
        store.clone(),
        known,
    ));
    (addr, store)
}

/// The image, its source (serving the swarm's join too), and its chunks.
async fn source() -> (Vec<u8>, Server, String, Vec<Vec<u8>>) {
    let data = gpt_image(3 * CHUNK + CHUNK / 2);
    let server = serve(data.clone(), Behaviour::Normal).await;
    let hex = server
        .manifest
        .digest
        .trim_start_matches("sha256:")
        .to_string();
    let chunks = data.chunks(CHUNK as usize).map(<[u8]>::to_vec).collect();
    (data, server, hex, chunks)
}

/// Installs the image from `server` onto a fresh disk, the swarm's view
/// naming the member at `addr` first.
async fn install_with_member(
    data: &[u8],
    server: &Server,
    addr: std::net::SocketAddr,
) -> (TestDisk, shepherd_agent::install::Installed, Arc<Counters>) {
    server.set_swarm(&SwarmView {
        sources: vec![SwarmPeer {
            address: addr.to_string(),
            key: public(MEMBER),
        }],
        member_keys: vec![public(MEMBER), public(AGENT)],
        refresh_seconds: 10,
        awaited: 0,
    });
    let len = data.len() as u64;
    let disk = TestDisk::new(len + MIB);
    let mut req = request(&server.url, &manifest::sha256(data), Some(len));
    req.manifest = Some(server.manifest.clone());
    req.swarm = Some(ImageSwarmRef {
        url: server.swarm_url.clone(),
        port: 0,
    });
    let counters = Arc::new(Counters::default());
    let limits = Limits {
        agent_key: Some(AgentKey(AGENT)),
        ..quick()
    };
    let installed = install(
        &req,
        vec![disk.disk()],
        counters.clone(),
        &limits,
        &log_line,
    )
    .await
    .map_err(|f| f.error)
    .unwrap();
    (disk, installed, counters)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_holding_the_chunks_saves_the_image_server_every_byte() {
    let (data, server, hex, chunks) = source().await;
    let (addr, store) = member(&hex, chunks, &[AGENT]).await;
    let (disk, installed, counters) = install_with_member(&data, &server, addr).await;
    assert_eq!(disk.read(0, data.len()), data, "the disk holds the image");
    assert!(installed.warnings.is_empty(), "{:?}", installed.warnings);
    assert_eq!(
        counters.from_peers.load(Ordering::Relaxed),
        data.len() as u64
    );
    assert_eq!(store.served_chunks.load(Ordering::Relaxed), 4);
    assert_eq!(
        server.sent.load(Ordering::SeqCst),
        0,
        "no byte of the image from the server: {:?}",
        server.log.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_member_costs_one_chunk_and_the_disk_holds_the_image() {
    let (data, server, hex, chunks) = source().await;
    // Every chunk it holds has a byte changed.
    let lies = chunks
        .into_iter()
        .map(|mut c| {
            c[1000] ^= 0x5a;
            c
        })
        .collect();
    let (addr, store) = member(&hex, lies, &[AGENT]).await;
    let (disk, installed, counters) = install_with_member(&data, &server, addr).await;
    assert_eq!(disk.read(0, data.len()), data, "the disk holds the image");
    assert!(
        installed
            .warnings
            .iter()
            .any(|w| w.contains("1 chunks of the image did not match its manifest")),
        "{:?}",
        installed.warnings
    );
    // Asked once, refused, never asked again: every chunk from the
    // server, each by its range.
    assert_eq!(store.served_chunks.load(Ordering::Relaxed), 1);
    assert_eq!(counters.from_peers.load(Ordering::Relaxed), 0);
    assert_eq!(counters.refused.load(Ordering::Relaxed), 1);
    let log = server.log.lock().unwrap().clone();
    for i in 0..4u64 {
        let (start, len) = (i * CHUNK, CHUNK.min(data.len() as u64 - i * CHUNK));
        let range = format!("Range: bytes={start}-{}", start + len - 1);
        assert!(log.iter().any(|l| l.ends_with(&range)), "{range}: {log:?}");
    }
    assert_eq!(server.sent.load(Ordering::SeqCst), data.len() as u64);
}

/// GET `path` from the chunk server at `addr`, showing `seed`'s
/// certificate, expecting `pinned`'s: status and body.
async fn get_chunk(
    addr: std::net::SocketAddr,
    seed: [u8; 32],
    pinned: [u8; 32],
    path: &str,
) -> Result<(u16, Vec<u8>), String> {
    use http_body_util::BodyExt as _;
    let cfg = tls::client_config(&AgentKey(seed), public(pinned).try_into().unwrap())?;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("shepherd-agent").unwrap();
    let tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", "member")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(30), sender.send_request(req))
        .await
        .map_err(|_| "no answer".to_string())?
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Ok((status, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_server_serves_members_alone_and_is_known_by_its_key() {
    let (_, _, hex, chunks) = source().await;
    let (addr, store) = member(&hex, chunks.clone(), &[AGENT]).await;
    let path = format!("/chunks/{hex}/1");
    // A member: the chunk.
    let (status, body) = get_chunk(addr, AGENT, MEMBER, &path).await.unwrap();
    assert_eq!(status, 200);
    assert!(body == chunks[1], "chunk 1");
    // A machine outside the swarm: 403, nothing of the image.
    let stranger = [3u8; 32];
    let (status, body) = get_chunk(addr, stranger, MEMBER, &path).await.unwrap();
    assert_eq!(status, 403, "{}", String::from_utf8_lossy(&body));
    assert!(body.len() < 200);
    // Another image, or a chunk past the end: 404.
    let other = format!("/chunks/{}/1", "0".repeat(64));
    assert_eq!(get_chunk(addr, AGENT, MEMBER, &other).await.unwrap().0, 404);
    let past = format!("/chunks/{hex}/9");
    assert_eq!(get_chunk(addr, AGENT, MEMBER, &past).await.unwrap().0, 404);
    // A server that is not the member shepherd named: no TLS.
    let e = get_chunk(addr, AGENT, stranger, &path).await.unwrap_err();
    assert!(e.contains("TLS"), "{e}");
    assert_eq!(store.served_chunks.load(Ordering::Relaxed), 1);
}
