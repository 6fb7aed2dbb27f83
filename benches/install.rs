//! Installation figures, side by side in one run:
//!
//! 1. the agent's write throughput (`takeover-agent --install`, fetching
//!    from nginx over plain HTTP, so that the agent is what is measured,
//!    and over TLS from shepherd's image server) against `dd bs=4M
//!    oflag=direct` of the same image to the same target (goal ≥ 0.9);
//! 2. the agent's peak RSS while installing that image (goal ≤ 64 MB; the
//!    image is 4 GiB by default);
//! 3. the time from the agent's start to the first byte on the disk (goal
//!    < 2 s);
//! 4. shepherd's image server against nginx serving the same file with the
//!    same certificate, to 50 concurrent downloads (goal ≥ 0.8);
//! 5. this machine's limits, measured in the same run: the image server's
//!    rate to a null sink (curl over TLS), SHA-256 on one core, and the
//!    target's direct-write rate (dd from /dev/zero, oflag=direct); the
//!    agent's throughput from shepherd's image server as a share of the
//!    smallest (goal ≥ 0.9), beside what an operator would do by hand
//!    (`curl URL | tee >(sha256sum) | dd oflag=direct`).
//!
//!     cargo bench --bench install
//!
//! The target is a loop device with direct I/O over a file when run as
//! root (writes reach the disk under it), else the file itself. SHEPHERD_BENCH_IMAGE_MIB (default 4096) sizes the image,
//! SHEPHERD_BENCH_SERVE_MIB (default 256) the file served to the 50
//! clients. Needs nginx (Debian's nginx-light) for the last comparison,
//! and PostgreSQL (the image server asks the BMDB who may download: every
//! download here is by a machine's agent key, as in the field).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shepherd::callback::{CertFiles, ServerIdentity};
use shepherd::images::{DownloadGate, ImageCatalog, ImageServer};
use shepherd_sim::testing::{Sshd, TestDb};

const MIB: u64 = 1 << 20;

fn env_mib(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A file of `mib` MiB that compresses some, like a disk image: runs of
/// pseudo-random bytes and zeros.
fn make_image(path: &Path, mib: u64) {
    use std::io::Write;
    let mut f = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(path).unwrap());
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut block = vec![0u8; MIB as usize];
    for i in 0..mib {
        if i % 4 == 3 {
            block.fill(0);
        } else {
            for w in block.chunks_exact_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                w.copy_from_slice(&x.to_le_bytes());
            }
        }
        f.write_all(&block).unwrap();
    }
    f.flush().unwrap();
    f.get_ref().sync_all().unwrap();
}

fn is_root() -> bool {
    nix_uid() == 0
}

fn nix_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(1)
}

/// The disk both writers write: a loop device over `file` (root), or the
/// file.
struct Target {
    path: PathBuf,
    loop_dev: Option<String>,
}

impl Target {
    fn new(file: &Path, bytes: u64) -> Target {
        std::fs::File::create(file).unwrap().set_len(bytes).unwrap();
        if is_root() {
            let out = Command::new("losetup")
                .args(["--find", "--show", "--direct-io=on"])
                .arg(file)
                .output()
                .unwrap();
            if out.status.success() {
                let dev = String::from_utf8(out.stdout).unwrap().trim().to_string();
                return Target {
                    path: PathBuf::from(&dev),
                    loop_dev: Some(dev),
                };
            }
        }
        Target {
            path: file.to_path_buf(),
            loop_dev: None,
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(d) = &self.loop_dev {
            let _ = Command::new("losetup").args(["-d", d]).status();
        }
    }
}

fn sha256_file(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    format!("sha256:{}", text.split_whitespace().next().unwrap())
}

/// Drops the page cache's copy of the target's writes, so each writer
/// starts alike (the image stays cached: both read it from memory).
fn settle() {
    let _ = Command::new("sync").status();
}

fn dd(image: &Path, target: &Path) -> f64 {
    dd_into(target, &[format!("if={}", image.display())])
}

/// Seconds `dd` takes writing into `target` with direct I/O, 4 MiB blocks,
/// synced at the end, reading as `input` says (`if=…`, `count=…`).
fn dd_into(target: &Path, input: &[String]) -> f64 {
    settle();
    let started = Instant::now();
    let out = Command::new("dd")
        .args(input)
        .arg(format!("of={}", target.display()))
        .args(["bs=4M", "oflag=direct", "conv=fsync,notrunc"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    started.elapsed().as_secs_f64()
}

struct AgentRun {
    seconds: f64,
    first_byte: f64,
    peak_rss_mb: f64,
}

fn agent(url: &str, digest: &str, target: &Path, ca: &Path, key: &Path) -> AgentRun {
    settle();
    let out = Command::new(shepherd_sim::testing::shipped_agent())
        .args(["--install", url, digest])
        .arg(target)
        .arg(ca)
        .arg("--key")
        .arg(key)
        .output()
        .unwrap();
    let v = shepherd_sim::testing::installed_by_hand(&out);
    AgentRun {
        seconds: v["seconds"].as_f64().unwrap(),
        first_byte: v["first_byte_seconds"].as_f64().unwrap(),
        peak_rss_mb: v["peak_rss_kb"].as_f64().unwrap() / 1024.0,
    }
}

/// MiB/s of SHA-256 over `mib` MiB in memory, on this one thread (the
/// agent hashes on one).
fn sha256_rate(mib: u64) -> f64 {
    use sha2::Digest as _;
    let block = vec![0x5au8; MIB as usize];
    let started = Instant::now();
    let mut h = sha2::Sha256::new();
    for _ in 0..mib {
        h.update(&block);
    }
    std::hint::black_box(h.finalize());
    mib as f64 / started.elapsed().as_secs_f64()
}

/// MiB/s the target takes with direct I/O: `mib` MiB from /dev/zero.
fn direct_write_rate(target: &Path, mib: u64) -> f64 {
    let blocks = mib / 4;
    let seconds = dd_into(
        target,
        &["if=/dev/zero".to_string(), format!("count={blocks}")],
    );
    (blocks * 4) as f64 / seconds
}

/// The files curl shows shepherd's image server: the CA, and an agent's
/// certificate and key.
struct CurlTls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl CurlTls {
    fn args(&self) -> String {
        format!(
            "--cacert '{}' --cert '{}' --key '{}'",
            self.ca.display(),
            self.cert.display(),
            self.key.display()
        )
    }
}

/// MiB/s of one download of `url` into nothing (curl over TLS).
fn null_sink_rate(url: &str, tls: &CurlTls, bytes: u64) -> f64 {
    let started = Instant::now();
    let out = Command::new("curl")
        .args(["-sSf", "-o", "/dev/null", "--cacert"])
        .arg(&tls.ca)
        .arg("--cert")
        .arg(&tls.cert)
        .arg("--key")
        .arg(&tls.key)
        .arg(url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bytes as f64 / MIB as f64 / started.elapsed().as_secs_f64()
}

/// Seconds an operator's pipeline takes to install `url` by hand: fetch,
/// hash beside, write with direct I/O.
fn by_hand(url: &str, tls: &CurlTls, target: &Path) -> f64 {
    settle();
    let script = format!(
        "set -o pipefail; curl -sSf {} '{url}' | tee >(sha256sum >/dev/null) \
         | dd of='{}' bs=4M iflag=fullblock oflag=direct conv=fsync,notrunc status=none",
        tls.args(),
        target.display()
    );
    let started = Instant::now();
    let out = Command::new("bash").args(["-c", &script]).output().unwrap();
    assert!(
        out.status.success(),
        "by hand: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    started.elapsed().as_secs_f64()
}

/// nginx serving `dir` on `port` over TLS with `cert`/`key`; its pid.
struct Nginx {
    child: std::process::Child,
}

impl Nginx {
    fn start(
        dir: &Path,
        (port, plain): (u16, u16),
        cert: &Path,
        key: &Path,
        work: &Path,
    ) -> Option<Nginx> {
        let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|p| Path::new(p).exists())?;
        let conf = work.join("nginx.conf");
        std::fs::write(
            &conf,
            format!(
                "daemon off; worker_processes auto; pid {work}/nginx.pid; error_log {work}/error.log;\n\
                 events {{ worker_connections 1024; }}\n\
                 http {{ access_log off; sendfile on; tcp_nopush on; types {{ }} default_type application/octet-stream;\n\
                   client_body_temp_path {work}/body; proxy_temp_path {work}/proxy; fastcgi_temp_path {work}/fastcgi;\n\
                   uwsgi_temp_path {work}/uwsgi; scgi_temp_path {work}/scgi;\n\
                   server {{ listen 127.0.0.1:{port} ssl; ssl_certificate {cert}; ssl_certificate_key {key};\n\
                     ssl_protocols TLSv1.2 TLSv1.3; location /images/ {{ alias {dir}/; }} }}\n\
                   server {{ listen 127.0.0.1:{plain}; location /images/ {{ alias {dir}/; }} }} }}\n",
                work = work.display(),
                cert = cert.display(),
                key = key.display(),
                dir = dir.display(),
            ),
        )
        .unwrap();
        let child = Command::new(nginx)
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(work)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", plain)).is_err() {
            assert!(Instant::now() < until, "nginx did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Nginx { child })
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // TERM: the master stops its workers too (KILL would orphan them).
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// 50 clients fetching `url` at once (the agent's own HTTP client); the
/// aggregate bytes per second.
async fn fifty(url: &str, ca: &[u8], seeds: &[[u8; 32]], size: u64) -> f64 {
    use shepherd_agent::install::fetch::{AgentKey, AsyncSink, FetchLimits, Piece, fetch};
    struct Count(Arc<std::sync::atomic::AtomicU64>);
    impl AsyncSink for Count {
        async fn put(&mut self, piece: Piece) -> Result<(), String> {
            self.0
                .fetch_add(piece.len() as u64, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
    }
    let total = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for seed in seeds.iter().take(50) {
        let (url, ca, total) = (url.to_string(), ca.to_vec(), total.clone());
        let key = AgentKey(*seed);
        tasks.push(tokio::spawn(async move {
            fetch(
                &url,
                &ca,
                Some(&key),
                Some(size),
                None,
                &FetchLimits::default(),
                Count(total),
                |_, _| {},
            )
            .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(
        total.load(std::sync::atomic::Ordering::Relaxed),
        50 * size,
        "every client got every byte"
    );
    (50 * size) as f64 / secs
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("install: bench");
        return;
    }
    let image_mib = env_mib("SHEPHERD_BENCH_IMAGE_MIB", 4096);
    let serve_mib = env_mib("SHEPHERD_BENCH_SERVE_MIB", 256);
    let work = tempfile::tempdir_in(
        std::env::var("SHEPHERD_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into()),
    )
    .or_else(|_| tempfile::tempdir())
    .unwrap();
    let images = work.path().join("images");
    std::fs::create_dir(&images).unwrap();
    eprintln!("making a {image_mib} MiB image and a {serve_mib} MiB file to serve…");
    let image = images.join("disk.img");
    make_image(&image, image_mib);
    let served = images.join("served.img");
    make_image(&served, serve_mib);
    let digest = sha256_file(&image);
    let target = Target::new(&work.path().join("target.img"), (image_mib + 16) * MIB);
    let tls = work.path().join("tls");
    let identity = ServerIdentity::load_or_generate(
        &CertFiles::in_dir(&tls),
        &["127.0.0.1".to_string(), "localhost".to_string()],
    )
    .unwrap();
    let ca_path = work.path().join("ca.der");
    std::fs::write(&ca_path, &identity.ca_der).unwrap();
    let ca_pem = work.path().join("ca.pem");
    std::fs::write(
        &ca_pem,
        pem::encode(&pem::Pem::new("CERTIFICATE", identity.ca_der.clone())),
    )
    .unwrap();
    // The installing agent's key, as the resident agent keeps it, and as
    // curl shows it.
    let seed: [u8; 32] = rand::random();
    let key_path = work.path().join("agent.key");
    std::fs::write(&key_path, seed).unwrap();
    let (cert, key) = shepherd_agent::callback::self_signed_agent_cert(&seed).unwrap();
    let curl_tls = CurlTls {
        ca: ca_pem.clone(),
        cert: work.path().join("agent.pem"),
        key: work.path().join("agent-key.pem"),
    };
    std::fs::write(
        &curl_tls.cert,
        pem::encode(&pem::Pem::new("CERTIFICATE", cert.to_vec())),
    )
    .unwrap();
    std::fs::write(
        &curl_tls.key,
        pem::encode(&pem::Pem::new("PRIVATE KEY", key.secret_der().to_vec())),
    )
    .unwrap();
    let downloaders: Vec<[u8; 32]> = (0..50).map(|_| rand::random()).collect();
    let system = actix_rt::System::new();
    system.block_on(async move {
        let db = TestDb::new().await;
        let bmdb = db.bmdb().await;
        shepherd_sim::testing::asked_machine(&bmdb, seed, "disk.img").await;
        for s in &downloaders {
            shepherd_sim::testing::asked_machine(&bmdb, *s, "served.img").await;
        }
        let port = Sshd::free_port();
        let catalog = ImageCatalog::new(
            images.clone(),
            &format!("127.0.0.1:{port}"),
            identity.ca_der.clone(),
        );
        let server = ImageServer::start(
            &catalog,
            DownloadGate {
                bmdb: bmdb.clone(),
                timeout: Duration::from_secs(5),
            },
            ([127, 0, 0, 1], port).into(),
            identity.web_server_config().unwrap(),
            2,
        )
        .unwrap();
        let nginx_ports = (Sshd::free_port(), Sshd::free_port());
        let nginx_work = work.path().join("nginx");
        std::fs::create_dir(&nginx_work).unwrap();
        let files = CertFiles::in_dir(&tls);
        let nginx = Nginx::start(
            &images,
            nginx_ports,
            &files.server_cert,
            &files.server_key,
            &nginx_work,
        );
        let tls_url = format!("https://127.0.0.1:{port}/images/disk.img");
        let plain_url = nginx
            .as_ref()
            .map(|_| format!("http://127.0.0.1:{}/images/disk.img", nginx_ports.1));
        let target_path = target.path.clone();
        let (image2, ca2) = (image.clone(), ca_path.clone());
        let image_bytes = image_mib * MIB;
        // Alternate, twice each: the disk's caches favour nobody.
        let runs = tokio::task::spawn_blocking(move || {
            let mut dd_s = Vec::new();
            let mut plain_runs = Vec::new();
            let mut tls_runs = Vec::new();
            let mut limits = (0.0f64, 0.0f64, 0.0f64);
            let mut hand = Vec::new();
            for _ in 0..2 {
                dd_s.push(dd(&image2, &target_path));
                if let Some(u) = &plain_url {
                    plain_runs.push(agent(u, &digest, &target_path, &ca2, &key_path));
                }
                tls_runs.push(agent(&tls_url, &digest, &target_path, &ca2, &key_path));
                hand.push(by_hand(&tls_url, &curl_tls, &target_path));
                // The limits: the best seen of each.
                limits.0 = limits.0.max(null_sink_rate(&tls_url, &curl_tls, image_bytes));
                limits.1 = limits.1.max(sha256_rate(1024));
                limits.2 = limits.2.max(direct_write_rate(&target_path, image_mib.min(2048)));
            }
            (dd_s, plain_runs, tls_runs, limits, hand)
        })
        .await
        .unwrap();
        let (dd_s, plain_runs, tls_runs, limits, hand) = runs;
        let bytes = (image_mib * MIB) as f64;
        let dd_best = dd_s.iter().cloned().fold(f64::MAX, f64::min);
        let best = |runs: &[AgentRun]| runs.iter().map(|r| r.seconds).fold(f64::MAX, f64::min);
        let all: Vec<&AgentRun> = plain_runs.iter().chain(tls_runs.iter()).collect();
        let peak = all.iter().map(|r| r.peak_rss_mb).fold(0.0, f64::max);
        let first = all.iter().map(|r| r.first_byte).fold(0.0, f64::max);
        let dd_rate = bytes / dd_best / MIB as f64;
        let plain_rate = (!plain_runs.is_empty()).then(|| bytes / best(&plain_runs) / MIB as f64);
        let tls_rate = bytes / best(&tls_runs) / MIB as f64;

        // Serving: shepherd's image server, then nginx, same file and cert.
        let served_url = format!("https://127.0.0.1:{port}/images/served.img");
        let size = serve_mib * MIB;
        let ours = fifty(&served_url, &identity.ca_der, &downloaders, size).await;
        let theirs = match &nginx {
            Some(_) => Some(
                fifty(
                    &format!("https://127.0.0.1:{}/images/served.img", nginx_ports.0),
                    &identity.ca_der,
                    &downloaders,
                    size,
                )
                .await,
            ),
            None => None,
        };
        drop(nginx);
        server.stop().await;

        let target_kind = if target.loop_dev.is_some() {
            "loop device (direct I/O)"
        } else {
            "file"
        };
        println!();
        println!(
            "install: {image_mib} MiB raw image onto a {target_kind}, best of 2 runs each; serving: {serve_mib} MiB to 50 clients"
        );
        println!("| figure | shepherd | reference | ratio | goal |");
        println!("|---|---|---|---|---|");
        if let Some(r) = plain_rate {
            println!(
                "| write throughput: agent from nginx (HTTP) vs dd bs=4M oflag=direct | {r:.0} MiB/s | {dd_rate:.0} MiB/s | {:.2} | ≥ 0.9 |",
                r / dd_rate
            );
        }
        println!(
            "| write throughput: agent from shepherd's image server (TLS) vs dd | {tls_rate:.0} MiB/s | {dd_rate:.0} MiB/s | {:.2} | ≥ 0.9 |",
            tls_rate / dd_rate
        );
        println!("| agent peak RSS, installing {image_mib} MiB | {peak:.1} MB | | | ≤ 64 MB |");
        println!("| time to the first byte on disk | {first:.3} s | | | < 2 s |");
        let (sink, sha, write) = limits;
        let smallest = sink.min(sha).min(write);
        let hand_rate = bytes / hand.iter().cloned().fold(f64::MAX, f64::min) / MIB as f64;
        println!("| limit: shepherd's image server to a null sink (curl, TLS) | {sink:.0} MiB/s | | | |");
        println!("| limit: SHA-256 on one core | {sha:.0} MiB/s | | | |");
        println!("| limit: the target's direct writes (dd from /dev/zero) | {write:.0} MiB/s | | | |");
        println!(
            "| agent from shepherd's image server vs the smallest limit | {tls_rate:.0} MiB/s | {smallest:.0} MiB/s | {:.2} | ≥ 0.9 |",
            tls_rate / smallest
        );
        println!(
            "| by hand: curl \\| tee >(sha256sum) \\| dd oflag=direct, vs the smallest limit | {hand_rate:.0} MiB/s | {smallest:.0} MiB/s | {:.2} | |",
            hand_rate / smallest
        );
        match theirs {
            Some(t) => println!(
                "| image serving, 50 concurrent downloads (vs nginx) | {:.0} MiB/s | {:.0} MiB/s | {:.2} | ≥ 0.8 |",
                ours / MIB as f64,
                t / MIB as f64,
                ours / t
            ),
            None => println!(
                "| image serving, 50 concurrent downloads | {:.0} MiB/s | (no nginx here) | | ≥ 0.8 |",
                ours / MIB as f64
            ),
        }
    });
}
