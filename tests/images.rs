//! The image server as an attacker meets it: it serves what the catalog
//! lists (regular files inside the directory) and nothing else, whatever
//! the names, links, directories, pipes and hidden files in it, and
//! whatever changes after the listing; and it serves only to an agent the
//! BMDB knows by the key it proves in TLS, for an image its machine was
//! asked to install. Over TLS with a certificate of a callback CA, on
//! loopback, fetched with a real HTTP client presenting the agent's own
//! certificate (the agent's TLS configuration), against PostgreSQL.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message as _;

use shepherd::bmdb::Bmdb;
use shepherd::bmdb::installations::{self, Asked, Asker};
use shepherd::callback::tls::new_ca;
use shepherd::images::{ImageCatalog, ImageServer};
use shepherd_agent::install::fetch::{AgentKey, tls_config};
use shepherd_proto::api::ImageInstallation;
use shepherd_sim::testing::{OwnPostgres, TestDb};
use uuid::Uuid;

const SECRET: &[u8] = b"root:$6$not-for-anyone$:19000:0:99999:7:::\n";

/// A client trusting `ca_der`, showing the certificate of `key` if given,
/// as the agent's fetch does.
fn client(ca_der: &[u8], key: Option<[u8; 32]>) -> awc::Client {
    let tls = tls_config(ca_der, key.map(AgentKey).as_ref()).unwrap();
    awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new((*tls).clone())))
        .timeout(Duration::from_secs(10))
        .finish()
}

/// GET `name` from `server` with `headers`, trusting `ca_der`, showing the
/// certificate of `key` if given: status and body.
async fn get_with(
    server: &ImageServer,
    ca_der: &[u8],
    key: Option<[u8; 32]>,
    name: &str,
    headers: &[(&str, &str)],
) -> (u16, Vec<u8>) {
    let client = client(ca_der, key);
    let url = format!("https://127.0.0.1:{}/images/{name}", server.addr.port());
    let mut req = client.get(&url);
    for (h, v) in headers {
        req = req.insert_header((*h, *v));
    }
    let mut r = req.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let body = r.body().limit(1 << 20).await.unwrap();
    (r.status().as_u16(), body.to_vec())
}

/// GET `/manifests/<name>` as [`get_with`] does `/images/<name>`, until
/// its digest is computed (503 meanwhile).
async fn get_manifest(
    server: &ImageServer,
    ca_der: &[u8],
    key: Option<[u8; 32]>,
    name: &str,
) -> (u16, Vec<u8>) {
    let client = client(ca_der, key);
    let url = format!("https://127.0.0.1:{}/manifests/{name}", server.addr.port());
    for _ in 0..200 {
        let mut r = client
            .get(&url)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let body = r.body().limit(1 << 20).await.unwrap();
        if r.status().as_u16() != 503 {
            return (r.status().as_u16(), body.to_vec());
        }
        assert!(r.headers().contains_key("retry-after"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url}: 503 for 10 s");
}

async fn get(server: &ImageServer, ca_der: &[u8], key: [u8; 32], name: &str) -> (u16, Vec<u8>) {
    get_with(server, ca_der, Some(key), name, &[]).await
}

/// A machine whose agent holds the key of `seed`.
async fn machine(bmdb: &Bmdb, seed: [u8; 32]) -> Uuid {
    shepherd_sim::testing::machine(bmdb, Some(seed)).await
}

/// Asks `machine` to install the served image `name` (as an operator
/// does); its generation.
async fn ask(bmdb: &Bmdb, machine: Uuid, name: &str) -> i32 {
    let image = ImageInstallation {
        url: format!("https://127.0.0.1:7831/images/{name}"),
        digest: format!("sha256:{}", "0".repeat(64)),
        ..Default::default()
    };
    let asker = Asker {
        actor: "test",
        action_id: Uuid::new_v4(),
        rollout_id: None,
        reason: None,
    };
    match bmdb
        .transact(async |tx| installations::ask(tx, machine, &image, &asker).await)
        .await
        .unwrap()
    {
        Asked::Done { generation, .. } => generation,
        other => panic!("asking {machine} for {name}: {other:?}"),
    }
}

/// The image the pending request of `machine` names, changed in place
/// (the attacks below try many names under one grant).
async fn rename_request(bmdb: &Bmdb, machine: Uuid, name: &str) {
    let url = format!("https://127.0.0.1:7831/images/{name}");
    bmdb.transact(async |tx| {
        tx.execute(
            "UPDATE machine_installation SET image_url = $2 WHERE machine_id = $1",
            &[&machine, &url],
        )
        .await
    })
    .await
    .unwrap();
}

fn start(catalog: &ImageCatalog, bmdb: &Bmdb, ca_der: &[u8], ca_key: &str) -> ImageServer {
    shepherd_sim::testing::image_server(catalog, bmdb, ca_der, ca_key)
}

fn link(target: &Path, name: &Path) {
    std::os::unix::fs::symlink(target, name).unwrap();
}

#[actix_rt::test]
async fn only_regular_files_inside_the_directory_are_served() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("images");
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("shadow"), SECRET).unwrap();
    std::fs::write(dir.join("img.raw"), b"an image\n").unwrap();
    std::fs::write(dir.join("other.raw"), b"another image\n").unwrap();
    std::fs::write(dir.join(".hidden.raw"), b"hidden\n").unwrap();
    std::fs::create_dir(dir.join("sub.raw")).unwrap();
    std::fs::write(dir.join("sub.raw/inner.raw"), b"inner\n").unwrap();
    nix::unistd::mkfifo(&dir.join("pipe.raw"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    // Links: out of the directory (absolute and relative), in it, to a
    // directory, to a hidden file.
    link(&outside.join("shadow"), &dir.join("shadow.raw"));
    link(Path::new("../outside/shadow"), &dir.join("relative.raw"));
    link(Path::new("img.raw"), &dir.join("alias.raw"));
    link(Path::new("sub.raw"), &dir.join("subdir-link.raw"));
    link(Path::new(".hidden.raw"), &dir.join("unhidden.raw"));
    link(Path::new("/etc/passwd"), &dir.join("passwd.raw"));

    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let seed = [7u8; 32];
    let m = machine(&bmdb, seed).await;
    ask(&bmdb, m, "img.raw").await;
    let (ca_der, ca_key) = new_ca().unwrap();
    let catalog = ImageCatalog::new(dir.clone(), "127.0.0.1:7830", ca_der.clone());
    let server = start(&catalog, &bmdb, &ca_der, &ca_key);

    // The listing: regular files, and a link that stays inside.
    let listed: Vec<String> = catalog
        .list()
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(listed, ["alias.raw", "img.raw", "other.raw"]);
    // Each asked of the machine in turn, with its agent's key.
    for name in &listed {
        rename_request(&bmdb, m, name).await;
        let (status, body) = get(&server, &ca_der, seed, name).await;
        assert_eq!(status, 200, "{name}");
        assert!(body.ends_with(b"image\n"), "{name}: {body:?}");
        assert!(catalog.resolve(name).is_ok(), "{name}");
    }
    // Everything else is 404, and never the bytes behind it.
    for name in [
        "shadow.raw",
        "relative.raw",
        "passwd.raw",
        "sub.raw",
        "subdir-link.raw",
        ".hidden.raw",
        "unhidden.raw",
        "pipe.raw",
        "missing.raw",
        "..%2Foutside%2Fshadow",
        "sub.raw%2Finner.raw",
    ] {
        rename_request(&bmdb, m, name).await;
        let (status, body) = get(&server, &ca_der, seed, name).await;
        // An encoded slash is decoded to a path no request can name: no
        // grant. The rest are granted and then not found.
        let expected = if name.contains("%2F") { 403 } else { 404 };
        assert_eq!(
            status,
            expected,
            "{name}: {}",
            String::from_utf8_lossy(&body)
        );
        assert!(
            !body.windows(8).any(|w| w == &SECRET[..8]) && !body.starts_with(b"root:"),
            "{name} leaked"
        );
        assert!(catalog.resolve(name).is_err(), "{name} resolves");
    }

    // A listed file replaced by a link out after the listing: nothing
    // outside is served under its name (checked on the opened file).
    std::fs::remove_file(dir.join("other.raw")).unwrap();
    link(&outside.join("shadow"), &dir.join("other.raw"));
    rename_request(&bmdb, m, "other.raw").await;
    let (status, body) = get(&server, &ca_der, seed, "other.raw").await;
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    assert!(catalog.resolve("other.raw").is_err());
    assert_eq!(
        catalog
            .list()
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect::<Vec<_>>(),
        ["alias.raw", "img.raw"]
    );
    server.stop().await;
}

#[actix_rt::test]
async fn downloads_need_the_key_of_an_agent_whose_machine_was_asked_for_the_image() {
    // Bounded: once, in a full run, this hung after the BMDB's restart
    // (nothing connected, nothing moving); a failure naming it beats a
    // run that never ends.
    tokio::time::timeout(Duration::from_secs(240), downloads_need_the_key())
        .await
        .expect("the image server's downloads did not finish in 4 minutes (a hang after the BMDB's restart?)");
}

async fn downloads_need_the_key() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("images");
    std::fs::create_dir_all(&dir).unwrap();
    let image: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.join("img.raw"), &image).unwrap();
    std::fs::write(dir.join("other.raw"), b"another image\n").unwrap();
    let mut pg = OwnPostgres::start().await;
    let bmdb = pg.bmdb().await;
    bmdb.migrate().await.unwrap();
    let (seed_a, seed_b, stranger) = ([1u8; 32], [2u8; 32], [3u8; 32]);
    let a = machine(&bmdb, seed_a).await;
    let b = machine(&bmdb, seed_b).await;
    let generation = ask(&bmdb, a, "img.raw").await;
    ask(&bmdb, b, "other.raw").await;
    let (ca_der, ca_key) = new_ca().unwrap();
    let catalog = ImageCatalog::new(dir.clone(), "127.0.0.1:7830", ca_der.clone());
    let server = start(&catalog, &bmdb, &ca_der, &ca_key);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();

    // No certificate: 401 saying what is needed, whether or not the image
    // exists (nothing about the directory is told).
    for name in ["img.raw", "missing.raw"] {
        let (status, body) = get_with(&server, &ca_der, None, name, &[]).await;
        assert_eq!(status, 401, "{name}: {}", text(&body));
        assert!(
            text(&body).contains("client certificate"),
            "{}",
            text(&body)
        );
    }
    // A key no machine's agent holds: 403.
    let (status, body) = get(&server, &ca_der, stranger, "img.raw").await;
    assert_eq!(status, 403, "{}", text(&body));
    assert!(
        text(&body).contains("no machine's agent"),
        "{}",
        text(&body)
    );
    // Another machine's agent (asked for another image): 403 naming it.
    let (status, body) = get(&server, &ca_der, seed_b, "img.raw").await;
    assert_eq!(status, 403, "{}", text(&body));
    assert!(text(&body).contains(&b.to_string()), "{}", text(&body));
    // ... which downloads its own.
    let (status, body) = get(&server, &ca_der, seed_b, "other.raw").await;
    assert_eq!((status, body.as_slice()), (200, &b"another image\n"[..]));
    // The right agent: the image, whole and resumed.
    let (status, body) = get(&server, &ca_der, seed_a, "img.raw").await;
    assert_eq!(status, 200);
    assert!(body == image, "the image's bytes");
    let (status, body) = get_with(
        &server,
        &ca_der,
        Some(seed_a),
        "img.raw",
        &[("Range", "bytes=100000-")],
    )
    .await;
    assert_eq!(status, 206);
    assert!(body == image[100_000..], "the resumed bytes");
    // Its manifest, to the same agent alone: the image's chunks by
    // SHA-256 (one, the image being smaller than a chunk), and the
    // digest an installation of it names.
    let (status, body) = get_manifest(&server, &ca_der, Some(seed_a), "img.raw").await;
    assert_eq!(status, 200, "{}", text(&body));
    let m = shepherd_proto::api::ImageManifest::decode(body.as_slice()).unwrap();
    assert_eq!(
        (m.size_bytes, m.digest.as_str()),
        (image.len() as u64, sha256(&image).as_str())
    );
    shepherd_proto::manifest::check(&m, &sha256(&image), Some(image.len() as u64)).unwrap();
    assert!(shepherd_proto::manifest::matches(&m, 0, &[&image]));
    let served = catalog.resolve("img.raw").unwrap();
    assert_eq!(
        served.manifest_digest,
        shepherd_proto::manifest::sha256(&body)
    );
    assert_eq!(
        served.manifest_url,
        "https://127.0.0.1:7830/manifests/img.raw"
    );
    for (key, want) in [(Some(seed_b), 403), (Some(stranger), 403), (None, 401)] {
        let (status, body) = get_manifest(&server, &ca_der, key, "img.raw").await;
        assert_eq!(status, want, "{}", text(&body));
    }

    // The grant ends with the request's answer.
    bmdb.transact(async |tx| {
        tx.execute(
            "INSERT INTO machine_os_installation_report (machine_id, generation, os_installation_result, os_installation_report_raw) \
             VALUES ($1, $2, 'Error', ''::bytea)",
            &[&a, &generation],
        )
        .await
    })
    .await
    .unwrap();
    let (status, body) = get(&server, &ca_der, seed_a, "img.raw").await;
    assert_eq!(status, 403, "{}", text(&body));

    // The BMDB away: 503 within the bound, never a hang, never the image.
    pg.stop();
    let started = Instant::now();
    let (status, body) = get(&server, &ca_der, seed_b, "other.raw").await;
    assert_eq!(status, 503, "{}", text(&body));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(text(&body).contains("BMDB"), "{}", text(&body));
    pg.start_again().await;
    let mut back = None;
    for _ in 0..100 {
        let (status, body) = get(&server, &ca_der, seed_b, "other.raw").await;
        if status == 200 {
            back = Some(body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(back.as_deref(), Some(&b"another image\n"[..]));
    server.stop().await;
}

/// POSTs `body` to `/swarms/<name>` showing the certificate of `key` if
/// given: status and body.
async fn post_swarm(
    server: &ImageServer,
    ca_der: &[u8],
    key: Option<[u8; 32]>,
    name: &str,
    body: Vec<u8>,
) -> (u16, Vec<u8>) {
    let url = format!("https://127.0.0.1:{}/swarms/{name}", server.addr.port());
    let mut r = client(ca_der, key)
        .post(&url)
        .send_body(body)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let body = r.body().limit(1 << 20).await.unwrap();
    (r.status().as_u16(), body.to_vec())
}

/// `seed`'s agent joins `name`'s swarm serving on `port`: the view.
async fn join(
    server: &ImageServer,
    ca_der: &[u8],
    seed: [u8; 32],
    name: &str,
    port: u32,
) -> shepherd_proto::api::SwarmView {
    let join = shepherd_proto::api::SwarmJoin {
        port,
        leaving: false,
    };
    let (status, body) = post_swarm(server, ca_der, Some(seed), name, join.encode_to_vec()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    shepherd_proto::api::SwarmView::decode(body.as_slice()).unwrap()
}

#[actix_rt::test]
async fn a_swarm_is_joined_under_the_image_grant_and_each_member_asks_those_before_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("images");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("img.raw"), b"an image\n").unwrap();
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let seeds: Vec<[u8; 32]> = (1..=7).map(|i| [i; 32]).collect();
    let (mut keys, mut ms) = (Vec::new(), Vec::new());
    for seed in &seeds {
        let m = machine(&bmdb, *seed).await;
        ask(&bmdb, m, "img.raw").await;
        ms.push(m);
        keys.push(
            ed25519_dalek::SigningKey::from_bytes(seed)
                .verifying_key()
                .to_bytes()
                .to_vec(),
        );
    }
    let (other, stranger) = ([20u8; 32], [21u8; 32]);
    let o = machine(&bmdb, other).await;
    ask(&bmdb, o, "other.raw").await;
    let (ca_der, ca_key) = new_ca().unwrap();
    let catalog = ImageCatalog::new(dir.clone(), "127.0.0.1:7830", ca_der.clone());
    assert_eq!(
        catalog.resolve("img.raw").unwrap().swarm_url.as_deref(),
        Some("https://127.0.0.1:7830/swarms/img.raw"),
        "on unless turned off"
    );
    let mut image = ImageInstallation::default();
    catalog
        .clone()
        .with_peer_port(7832)
        .resolve("img.raw")
        .unwrap()
        .apply_to(&mut image);
    assert_eq!(
        image.swarm.map(|s| s.port),
        Some(7832),
        "the port the room's firewall opens"
    );
    let off = catalog.clone().with_peers(false);
    let mut image = ImageInstallation::default();
    off.resolve("img.raw").unwrap().apply_to(&mut image);
    assert_eq!(image.swarm, None);
    let server = start(&catalog, &bmdb, &ca_der, &ca_key);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let join_body = |port| {
        shepherd_proto::api::SwarmJoin {
            port,
            leaving: false,
        }
        .encode_to_vec()
    };

    // Outside the grant: nobody learns of the members.
    for (key, want) in [(None, 401), (Some(stranger), 403), (Some(other), 403)] {
        let (status, body) = post_swarm(&server, &ca_der, key, "img.raw", join_body(4000)).await;
        assert_eq!(status, want, "{}", text(&body));
        assert!(!body.windows(4).any(|w| w == b"4001"), "{}", text(&body));
    }
    // A bad join: 400 naming what is wrong.
    let (status, body) = post_swarm(
        &server,
        &ca_der,
        Some(seeds[0]),
        "img.raw",
        b"\xff\xff".to_vec(),
    )
    .await;
    assert_eq!(status, 400, "{}", text(&body));
    assert!(text(&body).contains("SwarmJoin"), "{}", text(&body));
    let (status, body) = post_swarm(
        &server,
        &ca_der,
        Some(seeds[0]),
        "img.raw",
        join_body(70000),
    )
    .await;
    assert_eq!(status, 400, "{}", text(&body));
    assert!(text(&body).contains("70000"), "{}", text(&body));

    // Seven members in join order: the first asks the server alone, the
    // next four ask it, the sixth asks the second and then the first.
    let mut views = Vec::new();
    for (i, seed) in seeds.iter().enumerate() {
        views.push(join(&server, &ca_der, *seed, "img.raw", 4001 + i as u32).await);
    }
    let sources = |v: &shepherd_proto::api::SwarmView| {
        v.sources
            .iter()
            .map(|p| (p.address.clone(), p.key.clone()))
            .collect::<Vec<_>>()
    };
    let at = |i: usize| (format!("127.0.0.1:{}", 4001 + i), keys[i].clone());
    assert!(views[0].sources.is_empty());
    // Those asked to install the image and not joined yet are awaited.
    let awaited: Vec<u32> = views.iter().map(|v| v.awaited).collect();
    assert_eq!(awaited, [6, 5, 4, 3, 2, 1, 0]);
    for v in &views[1..5] {
        assert_eq!(sources(v), [at(0)]);
    }
    assert_eq!(sources(&views[5]), [at(1), at(0)]);
    assert_eq!(sources(&views[6]), [at(1), at(0)]);
    assert_eq!(views[6].member_keys, keys, "every member, whom each serves");
    assert!(views[6].refresh_seconds > 0);
    // Joining again keeps a member's place.
    let again = join(&server, &ca_der, seeds[5], "img.raw", 4006).await;
    assert_eq!(sources(&again), [at(1), at(0)]);

    // The first leaves: the second takes its place at the top.
    let leaving = shepherd_proto::api::SwarmJoin {
        port: 4001,
        leaving: true,
    };
    let (status, body) = post_swarm(
        &server,
        &ca_der,
        Some(seeds[0]),
        "img.raw",
        leaving.encode_to_vec(),
    )
    .await;
    assert_eq!(status, 204, "{}", text(&body));
    let second = join(&server, &ca_der, seeds[1], "img.raw", 4002).await;
    assert!(second.sources.is_empty());
    assert_eq!(second.member_keys, keys[1..]);
    assert_eq!(second.awaited, 0, "one that joined and left is not awaited");
    let sixth = join(&server, &ca_der, seeds[5], "img.raw", 4006).await;
    assert_eq!(
        sources(&sixth),
        [at(1)],
        "the sixth is the fifth now: below the second"
    );

    // A member whose installation was answered stays one while it serves,
    // and leaves; it cannot join anew.
    let answered = ms[2];
    bmdb.transact(async |tx| {
        tx.execute(
            "INSERT INTO machine_os_installation_report (machine_id, generation, os_installation_result, os_installation_report_raw) \
             SELECT machine_id, generation, 'Success', ''::bytea FROM machine_os_installation_request WHERE machine_id = $1",
            &[&answered],
        )
        .await
    })
    .await
    .unwrap();
    let stays = join(&server, &ca_der, seeds[2], "img.raw", 4003).await;
    assert_eq!(stays.member_keys, keys[1..]);
    let (status, _) = post_swarm(
        &server,
        &ca_der,
        Some(seeds[2]),
        "img.raw",
        leaving.encode_to_vec(),
    )
    .await;
    assert_eq!(status, 204);
    let (status, body) =
        post_swarm(&server, &ca_der, Some(seeds[2]), "img.raw", join_body(4003)).await;
    assert_eq!(status, 403, "{}", text(&body));
    assert!(
        text(&body).contains("no pending installation"),
        "{}",
        text(&body)
    );
    server.stop().await;
}

/// `sha256:<hex>` of `data`.
fn sha256(data: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(data)))
}

/// Asks for `name` without waiting until its digest is known.
fn resolved_soon(catalog: &ImageCatalog, name: &str) -> shepherd::images::ServedImage {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match catalog.resolve_soon(name, Duration::ZERO).unwrap() {
            Ok(served) => return served,
            Err(hashing) => assert_eq!(hashing.name, name),
        }
        assert!(Instant::now() < deadline, "{name} never hashed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_image_added_or_changed_while_serving_is_hashed_on_a_thread_while_the_api_answers() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("images");
    std::fs::create_dir_all(&dir).unwrap();
    let catalog = ImageCatalog::new(dir.clone(), "127.0.0.1:7830", b"ca".to_vec());
    // Served since start: hashed by hash_all, known at once afterwards.
    std::fs::write(dir.join("old.raw"), b"an image from before\n").unwrap();
    catalog.hash_all();
    let old = catalog
        .resolve_soon("old.raw", Duration::ZERO)
        .unwrap()
        .expect("hashed at start");
    assert_eq!(old.digest, sha256(b"an image from before\n"));
    // Added later: the first ask starts the hash and does not wait for it.
    let data = vec![7u8; 4 << 20];
    std::fs::write(dir.join("new.raw"), &data).unwrap();
    let hashing = catalog
        .resolve_soon("new.raw", Duration::ZERO)
        .unwrap()
        .expect_err("a new image is not hashed yet");
    assert_eq!(hashing.size_bytes, data.len() as u64);
    let message = hashing.to_string();
    assert!(
        message.contains("\"new.raw\"") && message.contains("ask again"),
        "{message}"
    );
    let served = resolved_soon(&catalog, "new.raw");
    assert_eq!(served.digest, sha256(&data));
    assert_eq!(served.size_bytes, data.len() as u64);
    assert_eq!(served.url, "https://127.0.0.1:7830/images/new.raw");
    // Changed in place (another length): hashed again, the old digest
    // never answered for it.
    let changed = vec![9u8; 5 << 20];
    std::fs::write(dir.join("new.raw"), &changed).unwrap();
    assert_eq!(resolved_soon(&catalog, "new.raw").digest, sha256(&changed));
    // Waiting long enough answers with the digest in one ask.
    std::fs::write(dir.join("small.raw"), b"small").unwrap();
    let small = catalog
        .resolve_soon("small.raw", Duration::from_secs(10))
        .unwrap()
        .expect("hashed within the wait");
    assert_eq!(small.digest, sha256(b"small"));
    // What is not served is an error, not a hash.
    let err = catalog
        .resolve_soon("missing.raw", Duration::ZERO)
        .unwrap_err();
    assert!(
        matches!(&err, shepherd::images::CatalogError::NotServed { name, .. } if name == "missing.raw"),
        "{err}"
    );
}
