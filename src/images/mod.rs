//! The image server: shepherd serves the operating system images in one
//! directory to the agents, so that an air-gapped fleet needs no other
//! server. Plain HTTP/1.1 over TLS with a certificate of the callback CA
//! (which every agent already trusts, and which an installation request
//! carries), with Range requests for resumed downloads (actix-files).
//!
//! Long on purpose: the catalog and the server share the one gate
//! (`open_image`) and the per-file digest cache; split, each would reach into
//! the other.
//!
//! It serves only what [`ImageCatalog::list`] lists: regular files inside
//! the directory, nothing hidden, no directories, no device or pipe. A
//! symlink is followed only when the file it opens is inside the
//! directory, which is checked on the opened file itself (its path read
//! back from the kernel), not on the name, so a name swapped for a link
//! after the listing serves nothing outside.
//!
//! Downloads need a credential: the agent's own key, as the callback's
//! mTLS proves it. The server asks every client for a certificate; a
//! download is served only to an agent the BMDB knows by that key
//! (`machine_agent_started`) whose machine's installation request, not yet
//! answered, names the image. Without a certificate the answer is 401,
//! with an unknown one or for an image the machine was not asked to
//! install 403, and 503 when the BMDB cannot tell within the bound. A
//! capability in the URL would travel in logs, proxies and the request
//! itself (readable on the machine by its tenant); the key never leaves
//! the agent, and the grant ends with the request's answer.
//!
//! An installation names a served image by its file name; the
//! [`ImageCatalog`] turns that into the URL agents fetch, the image's size
//! and its SHA-256 digest (computed once per file version, on a blocking
//! thread).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};

pub mod boot;
mod firmware;
mod gate;
mod manifest;
mod swarm;

pub use gate::{DownloadGate, open_image, valid_name};
use gate::{PeerKey, basic_auth, granted, serve_file};

pub use boot::{BootImage, NetbootFiles, SignedChain};
pub use manifest::Known;
use manifest::modified;

/// What an installation needs to fetch a served image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedImage {
    pub url: String,
    pub size_bytes: u64,
    /// `sha256:<hex>` of the file.
    pub digest: String,
    /// DER of the CA the server's certificate chains to.
    pub ca_certificate: Vec<u8>,
    /// Where its manifest is, and the manifest's `sha256:<hex>`.
    pub manifest_url: String,
    pub manifest_digest: String,
    /// Where agents installing it join its swarm, when machines may fetch
    /// its chunks from each other (`installations.peers`).
    pub swarm_url: Option<String>,
    /// The port their chunk servers listen on (0: each chooses).
    pub peer_port: u16,
}

impl ServedImage {
    /// Makes `image` an installation of this served image.
    pub fn apply_to(self, image: &mut shepherd_proto::api::ImageInstallation) {
        image.url = self.url;
        image.digest = self.digest;
        image.size_bytes = Some(self.size_bytes as i64);
        image.ca_certificate = self.ca_certificate;
        image.manifest = Some(shepherd_proto::api::ImageManifestRef {
            url: self.manifest_url,
            digest: self.manifest_digest,
        });
        image.swarm = self
            .swarm_url
            .map(|url| shepherd_proto::api::ImageSwarmRef {
                url,
                port: u32::from(self.peer_port),
            });
    }
}

/// The served directory, and where agents reach it.
#[derive(Clone)]
pub struct ImageCatalog {
    dir: PathBuf,
    /// `https://host:port/`: images under `images/`, their manifests
    /// under `manifests/`, their swarms under `swarms/`.
    root: String,
    ca_der: Vec<u8>,
    /// Digests and manifests by file, valid while its length and
    /// modification time hold.
    digests: Arc<Mutex<HashMap<PathBuf, Known>>>,
    /// Files whose digest a thread is computing.
    hashing: Arc<Mutex<std::collections::HashSet<PathBuf>>>,
    /// The boot image, served per boot at `/boot/<boot>.iso`.
    boot: Option<BootServing>,
    /// `https://host:port/` BMCs fetch boots from, when not `root`.
    boot_root: Option<String>,
    /// Whether installations name the image's swarm (under `swarms/`),
    /// and the port of the agents' chunk servers (0: each chooses).
    peers: bool,
    peer_port: u16,
}

/// The boot image and what each boot's data tells its agent.
#[derive(Debug, Clone)]
pub struct BootServing {
    pub image: BootImage,
    /// `host:port` of the agent callback (`bmaas.endpoint`).
    pub callback_endpoint: String,
}

impl std::fmt::Debug for ImageCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageCatalog")
            .field("dir", &self.dir)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// An image the catalog cannot serve: each names the image.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("{0:?} is not an image name (letters, digits, . _ - +; no directories)")]
    NotAName(String),
    #[error("image {name:?} in {dir}: {message}")]
    NotServed {
        name: String,
        dir: String,
        message: String,
    },
    #[error("reading image {name:?}: {message}")]
    Unreadable { name: String, message: String },
}

impl ImageCatalog {
    /// Images in `dir`, fetched by agents at `endpoint` (`host:port`).
    pub fn new(dir: PathBuf, endpoint: &str, ca_der: Vec<u8>) -> ImageCatalog {
        let host = shepherd_proto::callback::endpoint_host(endpoint).unwrap_or("localhost");
        let port = endpoint.rsplit_once(':').map(|(_, p)| p).unwrap_or("443");
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        ImageCatalog {
            dir,
            root: format!("https://{host}:{port}/"),
            ca_der,
            digests: Default::default(),
            hashing: Default::default(),
            boot: None,
            boot_root: None,
            peers: true,
            peer_port: 0,
        }
    }

    /// Whether machines installing one image fetch its chunks from each
    /// other (`installations.peers`; on unless turned off).
    pub fn with_peers(mut self, peers: bool) -> ImageCatalog {
        self.peers = peers;
        self
    }

    /// The port every agent's chunk server listens on
    /// (`installations.peer_port`; 0: each chooses).
    pub fn with_peer_port(mut self, port: u16) -> ImageCatalog {
        self.peer_port = port;
        self
    }

    /// Serves `boot`'s image too, one copy per boot, fetched by BMCs at
    /// `endpoint` (`host:port`; None: where agents fetch images).
    pub fn with_boot_image(mut self, boot: BootServing, endpoint: Option<&str>) -> ImageCatalog {
        self.boot = Some(boot);
        self.boot_root = endpoint.map(|e| format!("https://{}/", e.trim_end_matches('/')));
        self
    }

    /// Whether boots' copies of the boot image are served.
    pub fn serves_boot_image(&self) -> bool {
        self.boot.is_some()
    }

    /// Where the BMC fetches boot `boot_id`'s copy of the boot image.
    pub fn boot_url(&self, boot_id: uuid::Uuid) -> String {
        format!("{}boot/{boot_id}.iso", self.bmc_root())
    }

    /// Where BMCs reach the image server (ending in `/`).
    fn bmc_root(&self) -> &str {
        match &self.boot_root {
            Some(r) => r.as_str(),
            None => self.root.as_str(),
        }
    }

    /// Where a BMC fetches `name` with the firmware grant `grant_id` (its
    /// user name; the grant's secret its password).
    pub fn firmware_url(&self, grant_id: uuid::Uuid, name: &str) -> String {
        format!("{}firmware/{grant_id}/{name}", self.bmc_root())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The images served now: (name, size), by name.
    pub fn list(&self) -> std::io::Result<Vec<(String, u64)>> {
        let mut v: Vec<(String, u64)> = std::fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let (_, m) = open_image(&self.dir, &name).ok()?;
                Some((name, m.len()))
            })
            .collect();
        v.sort();
        Ok(v)
    }

    /// The served image `name`: its URL, size and digest. Blocks while the
    /// digest of a new or changed file is computed.
    pub fn resolve(&self, name: &str) -> Result<ServedImage, CatalogError> {
        let (path, file, meta) = self.open(name)?;
        let known = match self.known(&path, &meta) {
            Some(k) => k,
            None => {
                let k = Known::of(file, &meta).map_err(|e| CatalogError::Unreadable {
                    name: name.to_string(),
                    message: e.to_string(),
                })?;
                self.digests.lock().unwrap().insert(path, k.clone());
                k
            }
        };
        Ok(self.served(name, &known))
    }

    /// `name`'s manifest (encoded), when its digest is known; its digest
    /// computed on a thread of its own meanwhile.
    pub fn manifest(&self, name: &str) -> Result<Option<Known>, CatalogError> {
        Ok(self.known_soon(name, std::time::Duration::ZERO)?.ok())
    }

    /// [`Self::resolve`] for a caller that must answer soon (the API): a
    /// new or changed file's digest is computed on a thread of its own
    /// (one per file, however often asked), waited for `wait` at most;
    /// `Ok(Err(Hashing))` while it is still being computed.
    pub fn resolve_soon(
        &self,
        name: &str,
        wait: std::time::Duration,
    ) -> Result<Result<ServedImage, Hashing>, CatalogError> {
        Ok(self.known_soon(name, wait)?.map(|k| self.served(name, &k)))
    }

    /// What is known of `name`, computed on a thread of its own (one per
    /// file, however often asked) when new or changed, waited for `wait`
    /// at most.
    fn known_soon(
        &self,
        name: &str,
        wait: std::time::Duration,
    ) -> Result<Result<Known, Hashing>, CatalogError> {
        let (path, _, meta) = self.open(name)?;
        if let Some(k) = self.known(&path, &meta) {
            return Ok(Ok(k));
        }
        if !self.hashing.lock().unwrap().contains(&path) {
            let (catalog, image) = (self.clone(), name.to_string());
            std::thread::Builder::new()
                .name("image-digest".into())
                .spawn(move || catalog.hash_once(&image))
                .map_err(|e| CatalogError::Unreadable {
                    name: name.to_string(),
                    message: format!("no thread to hash it on: {e}"),
                })?;
        }
        let until = std::time::Instant::now() + wait;
        while std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10).min(wait));
            if let Some(k) = self.known(&path, &meta) {
                return Ok(Ok(k));
            }
        }
        Ok(Err(Hashing {
            name: name.to_string(),
            size_bytes: meta.len(),
        }))
    }

    /// Computes the digest of every served image not known yet, one after
    /// the other (at start, so that the first installation of a large
    /// image need not wait for it); an image being hashed is not hashed
    /// again by [`Self::resolve_soon`] meanwhile.
    pub fn hash_all(&self) {
        for (name, _) in self.list().unwrap_or_default() {
            self.hash_once(&name);
        }
    }

    /// Computes `name`'s digest unless a thread already is.
    fn hash_once(&self, name: &str) {
        let path = self.dir.join(name);
        if !self.hashing.lock().unwrap().insert(path.clone()) {
            return;
        }
        if let Err(e) = self.resolve(name) {
            tracing::warn!(image = %name, error = %e, "image not hashed");
        }
        self.hashing.lock().unwrap().remove(&path);
    }

    fn open(
        &self,
        name: &str,
    ) -> Result<(PathBuf, std::fs::File, std::fs::Metadata), CatalogError> {
        if !valid_name(name) {
            return Err(CatalogError::NotAName(name.to_string()));
        }
        let (file, meta) = open_image(&self.dir, name).map_err(|e| CatalogError::NotServed {
            name: name.to_string(),
            dir: self.dir.display().to_string(),
            message: e.to_string(),
        })?;
        Ok((self.dir.join(name), file, meta))
    }

    /// What was computed of `path` while its length and modification time
    /// were those of `meta`.
    fn known(&self, path: &Path, meta: &std::fs::Metadata) -> Option<Known> {
        self.digests
            .lock()
            .unwrap()
            .get(path)
            .filter(|k| k.len == meta.len() && k.mtime == modified(meta))
            .cloned()
    }

    fn served(&self, name: &str, k: &Known) -> ServedImage {
        ServedImage {
            url: format!("{}images/{name}", self.root),
            size_bytes: k.len,
            digest: k.digest.clone(),
            ca_certificate: self.ca_der.clone(),
            manifest_url: format!("{}manifests/{name}", self.root),
            manifest_digest: k.manifest_digest.clone(),
            swarm_url: self.peers.then(|| format!("{}swarms/{name}", self.root)),
            peer_port: self.peer_port,
        }
    }
}

/// A served image whose digest is still being computed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hashing {
    pub name: String,
    pub size_bytes: u64,
}

impl std::fmt::Display for Hashing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "image {:?} ({} bytes) is new or changed, and its SHA-256 is being computed \
             (once per version of the file): ask again in a moment",
            self.name, self.size_bytes
        )
    }
}

async fn image(
    dir: web::Data<PathBuf>,
    gate: web::Data<DownloadGate>,
    req: HttpRequest,
    name: web::Path<String>,
) -> HttpResponse {
    match granted(&gate, &req, &name, "image").await {
        Ok(machine_id) => serve_file(dir.get_ref(), &name, &req, machine_id).await,
        Err(refused) => refused,
    }
}

/// `GET /manifests/<name>`: the manifest of image `name`, to an agent
/// with a pending installation of it; 503 with `Retry-After` while the
/// image's digest is still being computed (an agent tries again).
async fn manifest_file(
    catalog: web::Data<ImageCatalog>,
    gate: web::Data<DownloadGate>,
    req: HttpRequest,
    name: web::Path<String>,
) -> HttpResponse {
    use actix_web::http::header;
    if let Err(refused) = granted(&gate, &req, &name, "manifest").await {
        return refused;
    }
    let (catalog, image) = (catalog.get_ref().clone(), name.to_string());
    let known = web::block(move || catalog.manifest(&image)).await;
    match known {
        Ok(Ok(Some(k))) => {
            let etag = format!("\"{}\"", k.manifest_digest.trim_start_matches("sha256:"));
            if req
                .headers()
                .get(header::IF_NONE_MATCH)
                .is_some_and(|v| v.as_bytes() == etag.as_bytes())
            {
                return HttpResponse::NotModified()
                    .insert_header((header::ETAG, etag))
                    .finish();
            }
            HttpResponse::Ok()
                .content_type("application/x-protobuf")
                .insert_header((header::ETAG, etag))
                .insert_header((header::CACHE_CONTROL, "no-cache"))
                .body(k.manifest.as_ref().clone())
        }
        Ok(Ok(None)) => HttpResponse::ServiceUnavailable()
            .insert_header((header::RETRY_AFTER, "5"))
            .content_type("text/plain; charset=utf-8")
            .body(format!(
                "the SHA-256 of image {name:?} is being computed (once per version of the file): \
                 ask again in a moment\n"
            )),
        Ok(Err(e)) => HttpResponse::NotFound()
            .content_type("text/plain; charset=utf-8")
            .body(format!("{e}\n")),
        Err(e) => HttpResponse::InternalServerError()
            .content_type("text/plain; charset=utf-8")
            .body(format!("reading image {name:?}: {e}\n")),
    }
}

/// Whether `req` carries boot `credential`'s media user name and password
/// (HTTP basic); compared by digest.
fn media_auth_ok(req: &HttpRequest, credential: &[u8]) -> bool {
    use sha2::Digest as _;
    let Some(given) = basic_auth(req) else {
        return false;
    };
    let (user, password) = crate::bmdb::boot::media_credentials(credential);
    let want = sha2::Sha256::digest(format!("{user}:{password}").as_bytes());
    sha2::Sha256::digest(&given) == want
}

/// `GET /boot/<boot>.iso`: the boot image with that boot's data in its
/// slot, while the boot is unused and unexpired (CONTRACTS.md §5). The
/// BMC fetches it without a client certificate: the boot's id is the
/// capability, and it ends when the agent enrolls or the boot expires.
/// One range or the whole, as often as asked; never cached by the way.
async fn boot_iso(
    boot: web::Data<Option<(BootServing, Vec<u8>)>>,
    gate: web::Data<DownloadGate>,
    req: HttpRequest,
    name: web::Path<String>,
) -> HttpResponse {
    use actix_web::http::header;
    let not_found = || {
        HttpResponse::NotFound()
            .content_type("text/plain; charset=utf-8")
            .body("no such boot (used, expired or unknown)\n")
    };
    let Some((serving, ca_der)) = boot.get_ref().clone() else {
        return not_found();
    };
    let Some(boot_id) = name
        .strip_suffix(".iso")
        .and_then(|id| uuid::Uuid::parse_str(id).ok())
    else {
        return not_found();
    };
    let found = gate
        .ask(&req, &name, "whether this boot is served", async |tx| {
            crate::bmdb::boot::to_serve(tx, boot_id).await
        })
        .await;
    let issued = match found {
        Ok(Some(b)) => b,
        Ok(None) => {
            tracing::info!(boot = %boot_id, "boot image refused: no such boot (used, expired or unknown)");
            return not_found();
        }
        Err(unavailable) => return unavailable,
    };
    if issued.media_auth && !media_auth_ok(&req, &issued.credential) {
        tracing::info!(boot = %boot_id, "boot image refused: no or wrong user name and password for this boot");
        return HttpResponse::Unauthorized()
            .insert_header((header::WWW_AUTHENTICATE, "Basic realm=\"shepherd boot\""))
            .content_type("text/plain; charset=utf-8")
            .body("this boot's image is served with its user name and password\n");
    }
    let data = boot::boot_data(&issued, &serving.callback_endpoint, &ca_der);
    let slot = match serving.image.slot(&data) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(boot = %boot_id, error = %e, "boot image: cannot make this boot's copy");
            return HttpResponse::InternalServerError().body(format!("{e}\n"));
        }
    };
    boot::copy_response(&serving.image, slot, &req, boot_id, issued.machine_id)
}

/// Keeps the key of a client's certificate, if it showed one, with the
/// connection.
fn peer_key(conn: &dyn std::any::Any, ext: &mut actix_web::dev::Extensions) {
    type Tls = actix_tls::accept::rustls_0_23::TlsStream<actix_web::rt::net::TcpStream>;
    let key = conn
        .downcast_ref::<Tls>()
        .and_then(|tls| tls.get_ref().1.peer_certificates()?.first().cloned())
        .and_then(|cert| crate::callback::tls::ed25519_key(&cert));
    if let Some(k) = key {
        ext.insert(PeerKey(k));
    }
}

/// How long [`ImageServer::stop`] waits at most.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(35);

/// A running image server.
pub struct ImageServer {
    pub addr: SocketAddr,
    handle: actix_web::dev::ServerHandle,
}

impl ImageServer {
    /// Serves `catalog`'s directory on `listen` with `tls` (the callback
    /// CA's certificate, a client certificate asked for), to the agents
    /// `gate` lets download.
    pub fn start(
        catalog: &ImageCatalog,
        gate: DownloadGate,
        listen: SocketAddr,
        tls: rustls::ServerConfig,
        workers: usize,
    ) -> std::io::Result<ImageServer> {
        // As actix binds: the address reused, a backlog for a rack's
        // agents connecting at once.
        let socket = match listen {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        socket.bind(listen)?;
        let listener = socket.listen(1024)?.into_std()?;
        ImageServer::start_on(catalog, gate, listener, tls, workers)
    }

    /// [`Self::start`] on a socket already listening (one handed over by
    /// systemd, or bound in another network namespace).
    pub fn start_on(
        catalog: &ImageCatalog,
        gate: DownloadGate,
        listener: std::net::TcpListener,
        tls: rustls::ServerConfig,
        workers: usize,
    ) -> std::io::Result<ImageServer> {
        let dir = web::Data::new(catalog.dir.clone());
        let images = web::Data::new(catalog.clone());
        let gate = web::Data::new(gate);
        let boot = web::Data::new(catalog.boot.clone().map(|b| (b, catalog.ca_der.clone())));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(dir.clone())
                .app_data(gate.clone())
                .app_data(boot.clone())
                .app_data(images.clone())
                .route("/images/{name}", web::get().to(image))
                .route("/images/{name}", web::head().to(image))
                .route("/manifests/{name}", web::get().to(manifest_file))
                .route("/manifests/{name}", web::head().to(manifest_file))
                .route("/swarms/{name}", web::post().to(swarm::join))
                .route("/boot/{name}", web::get().to(boot_iso))
                .route("/boot/{name}", web::head().to(boot_iso))
                .route("/firmware/{grant}/{name}", web::get().to(firmware::fetch))
                .route("/firmware/{grant}/{name}", web::head().to(firmware::fetch))
        })
        .on_connect(peer_key)
        .workers(workers.max(1))
        .disable_signals()
        .listen_rustls_0_23(listener, tls)?;
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        tracing::info!(%addr, dir = %catalog.dir.display(), "image server listening");
        Ok(ImageServer { addr, handle })
    }

    /// Stops accepting and lets what is in flight finish (actix's 30 s
    /// shutdown timeout); gives up waiting after [`STOP_WAIT`], naming
    /// the server: a stop whose completion is never told must not hang
    /// its caller.
    pub async fn stop(&self) {
        if tokio::time::timeout(STOP_WAIT, self.handle.stop(true))
            .await
            .is_err()
        {
            tracing::warn!(addr = %self.addr, "the image server did not say it stopped within {}s", STOP_WAIT.as_secs());
        }
    }
}
