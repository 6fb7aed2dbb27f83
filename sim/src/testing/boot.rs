//! Boot images: a stand-in image and its slot, the boot data a slot holds,
//! the live agent as the image starts it, and fetching as a BMC does.

use std::time::Duration;

use super::bin;

/// Where a stand-in boot image holds its slot, and the slot's length (as
/// `scripts/boot-image` makes it).
pub const BOOT_SLOT_AT: u64 = 1 << 20;
pub const BOOT_SLOT_LEN: u64 = 16384;

/// A stand-in for `scripts/boot-image`'s output in `dir`: 3 MiB of bytes
/// with the placeholder slot at 1 MiB, and its `.slot` file. Its path and
/// bytes.
pub fn boot_image_stand_in(dir: &std::path::Path) -> (std::path::PathBuf, Vec<u8>) {
    let mut bytes: Vec<u8> = (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    let mut slot = b"070701".to_vec();
    slot.extend_from_slice(b"SHEPHERD-BOOT-DATA-SLOT-PLACEHOLDER\n");
    slot.resize(BOOT_SLOT_LEN as usize, 0);
    let at = BOOT_SLOT_AT as usize;
    bytes[at..at + BOOT_SLOT_LEN as usize].copy_from_slice(&slot);
    let path = dir.join("shepherd-boot.iso");
    std::fs::write(&path, &bytes).unwrap();
    std::fs::write(
        dir.join("shepherd-boot.iso.slot"),
        format!("offset {BOOT_SLOT_AT}\nlength {BOOT_SLOT_LEN}\nkernel test\n"),
    )
    .unwrap();
    (path, bytes)
}

/// The boot data file (`shepherd/boot-data`, encoded `BootData`) a boot's
/// slot holds, as GNU cpio extracts it (the boot image's kernel reads the
/// same newc archive).
pub fn boot_data_file(slot: &[u8]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("cpio")
        .args(["-idm", "--quiet"])
        .current_dir(dir.path())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("GNU cpio");
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(slot).unwrap();
    assert!(child.wait().unwrap().success(), "cpio read the slot");
    std::fs::read(dir.path().join("shepherd/boot-data")).unwrap()
}

/// The real live agent (`takeover-agent --live`), as the boot image's init
/// starts it, from a copy of its own in `dir` (the files beside it are its
/// settings: heartbeats every second, no disks) with `boot_data` (an
/// encoded `BootData`); its output piped.
pub fn live_agent(dir: &std::path::Path, boot_data: &[u8]) -> std::process::Child {
    std::fs::create_dir_all(dir).unwrap();
    let exe = dir.join("takeover-agent");
    std::fs::copy(bin("takeover-agent"), &exe).unwrap();
    std::fs::write(dir.join("takeover-agent.interval"), "1s").unwrap();
    std::fs::write(dir.join("takeover-agent.disks"), "").unwrap();
    let file = dir.join("boot-data");
    std::fs::write(&file, boot_data).unwrap();
    let mut tries = 0;
    loop {
        let spawned = std::process::Command::new(&exe)
            .arg("--live")
            .arg(&file)
            .env("TAKEOVER_AGENT_REBOOT", "0")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn();
        match spawned {
            // The copy's write descriptor may live on for a moment in a
            // child another test thread forked meanwhile (until its exec
            // closes it): "text file busy". It passes; try again.
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r.unwrap(),
        }
    }
}

/// GETs (or HEADs) `url` as a BMC fetches a boot image: trusting the
/// fleet's CA (`ca_der`), no client certificate, one `range` if given.
/// (status, body, Content-Length).
pub async fn fetch_as_bmc(
    ca_der: &[u8],
    url: &str,
    range: Option<&str>,
    head: bool,
) -> (u16, Vec<u8>, Option<String>) {
    fetch_as_bmc_with(ca_der, url, range, head, None).await
}

/// An HTTPS client trusting only the CA `ca_der` (shepherd's fleet CA,
/// which issues its servers' certificates).
pub fn https_client(ca_der: &[u8], timeout: Duration) -> awc::Client {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(ca_der.to_vec()))
        .unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    // An idle connection is kept 2 s, under the server's 5 s keep-alive:
    // one kept longer may be closed by the server just as a request goes
    // out on it, and a POST is not asked again.
    awc::Client::builder()
        .connector(
            awc::Connector::new()
                .rustls_0_23(std::sync::Arc::new(tls))
                .conn_keep_alive(Duration::from_secs(2)),
        )
        .timeout(timeout)
        .finish()
}

/// [`fetch_as_bmc`] with the user name and password `InsertMedia` gave the
/// BMC (HTTP basic), as a BMC that takes them fetches.
pub async fn fetch_as_bmc_with(
    ca_der: &[u8],
    url: &str,
    range: Option<&str>,
    head: bool,
    basic: Option<(&str, &str)>,
) -> (u16, Vec<u8>, Option<String>) {
    let client = https_client(ca_der, Duration::from_secs(20));
    let mut req = if head {
        client.head(url)
    } else {
        client.get(url)
    };
    if let Some(r) = range {
        req = req.insert_header(("Range", r));
    }
    if let Some((user, password)) = basic {
        req = req.basic_auth(user, password);
    }
    let mut r = req.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let len = r
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = r.body().limit(16 << 20).await.unwrap();
    (r.status().as_u16(), body.to_vec(), len)
}

/// A raw disk image of `len` bytes with a GPT and one Linux partition of
/// 8 MiB from 1 MiB (room behind it for a first-boot volume), made with
/// sfdisk.
pub fn gpt_image(path: &std::path::Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
    let mut child = std::process::Command::new("sfdisk")
        .arg("--quiet")
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("sfdisk");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"label: gpt\nstart=2048, size=16384, type=L\n")
        .unwrap();
    assert!(child.wait().unwrap().success());
}

/// `catalog`'s image server on a free port of 127.0.0.1, over TLS with a
/// certificate of the CA (`ca_der`, `ca_key`), its gate asking `bmdb`.
pub fn image_server(
    catalog: &shepherd::images::ImageCatalog,
    bmdb: &shepherd::bmdb::Bmdb,
    ca_der: &[u8],
    ca_key: &str,
) -> shepherd::images::ImageServer {
    let id = shepherd::callback::tls::ServerIdentity::issued_by(
        ca_der,
        ca_key,
        &["127.0.0.1".to_string()],
    )
    .unwrap();
    shepherd::images::ImageServer::start(
        catalog,
        shepherd::images::DownloadGate {
            bmdb: bmdb.clone(),
            timeout: Duration::from_secs(2),
        },
        "127.0.0.1:0".parse().unwrap(),
        id.web_server_config().unwrap(),
        1,
    )
    .unwrap()
}
