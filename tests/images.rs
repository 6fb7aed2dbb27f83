//! The image server as an attacker meets it: it serves what the catalog
//! lists (regular files inside the directory) and nothing else, whatever
//! the names, links, directories, pipes and hidden files in it, and
//! whatever changes after the listing. Over TLS with a certificate of a
//! callback CA, on loopback, fetched with a real HTTP client.

use std::path::Path;
use std::sync::Arc;

use shepherd::callback::tls::{ServerIdentity, new_ca};
use shepherd::images::{ImageCatalog, ImageServer};

const SECRET: &[u8] = b"root:$6$not-for-anyone$:19000:0:99999:7:::\n";

/// GET `name` from `server`, trusting `ca_der`: status and body.
async fn get(server: &ImageServer, ca_der: &[u8], name: &str) -> (u16, Vec<u8>) {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(ca_der.to_vec()))
        .unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let client = awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(tls)))
        .timeout(std::time::Duration::from_secs(5))
        .finish();
    let url = format!("https://127.0.0.1:{}/images/{name}", server.addr.port());
    let mut r = client
        .get(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let body = r.body().limit(1 << 20).await.unwrap();
    (r.status().as_u16(), body.to_vec())
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

    let (ca_der, ca_key) = new_ca().unwrap();
    let id = ServerIdentity::issued_by(&ca_der, &ca_key, &["127.0.0.1".to_string()]).unwrap();
    let catalog = ImageCatalog::new(dir.clone(), "127.0.0.1:7830", ca_der.clone());
    let server = ImageServer::start(
        &catalog,
        "127.0.0.1:0".parse().unwrap(),
        id.web_server_config().unwrap(),
        1,
    )
    .unwrap();

    // The listing: regular files, and a link that stays inside.
    let listed: Vec<String> = catalog
        .list()
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(listed, ["alias.raw", "img.raw", "other.raw"]);
    for name in &listed {
        let (status, body) = get(&server, &ca_der, name).await;
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
        let (status, body) = get(&server, &ca_der, name).await;
        assert_eq!(status, 404, "{name}: {}", String::from_utf8_lossy(&body));
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
    let (status, body) = get(&server, &ca_der, "other.raw").await;
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
