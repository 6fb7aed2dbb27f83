//! Who may download, and serving what they may: the image server's
//! gate (the BMDB, asked within a bound), its refusals, and the one way a
//! served file is opened ([`open_image`]) and sent.

use std::path::Path;

use actix_web::{HttpRequest, HttpResponse, web};

use crate::bmdb::Bmdb;
use crate::bmdb::installations::{DownloadGrant, download_grant};

/// A file name the catalog serves: no directories, nothing hidden.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.len() <= 255
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-+".contains(c))
}

/// Opens the image `name` of `dir`, if it is one to serve: a valid name
/// (nothing hidden, no directories in it), opened without blocking (a pipe
/// is no image), a regular file, and, read back from the opened file
/// itself, inside `dir` (a symlink pointing out, or a name swapped for
/// one, serves nothing). Errors say which of these failed, for the log
/// and the API; the image server answers them all 404.
pub fn open_image(dir: &Path, name: &str) -> std::io::Result<(std::fs::File, std::fs::Metadata)> {
    use std::io::{Error, ErrorKind};
    use std::os::fd::AsRawFd as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    if !valid_name(name) {
        return Err(Error::new(ErrorKind::NotFound, "not an image name"));
    }
    let root = std::fs::canonicalize(dir)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(dir.join(name))?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(Error::new(ErrorKind::NotFound, "not a regular file"));
    }
    let opened = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    let inside = opened
        .strip_prefix(&root)
        .ok()
        .filter(|rel| !rel.as_os_str().is_empty())
        .is_some_and(|rel| rel.iter().all(|c| !c.to_string_lossy().starts_with('.')));
    if !inside {
        return Err(Error::new(
            ErrorKind::NotFound,
            "a link to a file outside the image directory",
        ));
    }
    Ok((file, meta))
}

/// Who may download: the BMDB, asked within `timeout`.
#[derive(Clone)]
pub struct DownloadGate {
    pub bmdb: Bmdb,
    pub timeout: std::time::Duration,
}

impl DownloadGate {
    /// `f` in one transaction, within the bound; Err: the 503 saying the
    /// BMDB cannot tell `what` now.
    pub(super) async fn ask<T>(
        &self,
        req: &HttpRequest,
        name: &str,
        what: &str,
        f: impl AsyncFnMut(&mut crate::bmdb::Tx<'_>) -> Result<T, crate::bmdb::BmdbError>,
    ) -> Result<T, HttpResponse> {
        use actix_web::http::StatusCode;
        match tokio::time::timeout(self.timeout, self.bmdb.transact(f)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                tracing::warn!(image = %name, error = %e, "the BMDB cannot tell {what}");
                Err(refuse(
                    req,
                    name,
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("the BMDB cannot tell now {what}; try again"),
                ))
            }
            Err(_) => Err(refuse(
                req,
                name,
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "the BMDB did not answer within {}; try again",
                    humantime::format_duration(self.timeout)
                ),
            )),
        }
    }
}

/// Why a download is refused (before the file is looked at, so nothing
/// about the directory is told to whoever has no grant).
pub(super) fn refuse(
    req: &HttpRequest,
    name: &str,
    status: actix_web::http::StatusCode,
    why: &str,
) -> HttpResponse {
    tracing::info!(
        image = %name,
        peer = %req.peer_addr().map(|a| a.to_string()).unwrap_or_default(),
        status = status.as_u16(),
        "image download refused: {why}"
    );
    let mut r = HttpResponse::build(status);
    if status == actix_web::http::StatusCode::UNAUTHORIZED {
        r.insert_header(("WWW-Authenticate", "MutualTLS"));
    }
    r.content_type("text/plain; charset=utf-8")
        .body(format!("{why}\n"))
}

/// Serves the image `name` of `dir` (opened by [`open_image`]) to `req`,
/// whose holder `machine_id`'s grant lets it fetch it.
pub(super) async fn serve_file(
    dir: &Path,
    name: &str,
    req: &HttpRequest,
    machine_id: uuid::Uuid,
) -> HttpResponse {
    use actix_web::Responder as _;
    let opened = {
        let (dir, name) = (dir.to_path_buf(), name.to_string());
        web::block(move || {
            let (file, _) = open_image(&dir, &name)?;
            actix_files::NamedFile::from_file(file, dir.join(&name))
        })
        .await
    };
    let opened = match opened {
        Ok(r) => r,
        Err(e) => Err(std::io::Error::other(e.to_string())),
    };
    match opened {
        // Read on this worker, as nginx reads by default: a thread hop per
        // 64 KiB (actix-files' asynchronous mode) costs a third of a
        // download's rate on a small machine (the install bench). Keep
        // `images_dir` on local storage.
        Ok(f) => f
            .use_etag(true)
            .use_last_modified(true)
            .prefer_utf8(false)
            .read_mode_threshold(u64::MAX)
            .set_content_type(actix_web::mime::APPLICATION_OCTET_STREAM)
            .respond_to(req)
            .map_into_boxed_body(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(image = %name, machine = %machine_id, error = %e, "an image asked for is not served");
            HttpResponse::NotFound().body("no such image\n")
        }
        Err(e) => {
            tracing::warn!(image = %name, error = %e, "serving an image failed");
            HttpResponse::InternalServerError().body("the image cannot be read\n")
        }
    }
}

/// The `user:password` of `req`'s HTTP basic authorization, decoded.
pub(super) fn basic_auth(req: &HttpRequest) -> Option<Vec<u8>> {
    use base64::Engine as _;
    req.headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        })
}

/// The key a client proved in the TLS handshake, kept per connection.
#[derive(Debug, Clone, Copy)]
pub(super) struct PeerKey(pub(super) [u8; crate::callback::tls::KEY_LEN]);

/// What the BMDB grants the agent whose key `req`'s TLS handshake proved,
/// for image `name`; else the answer refusing it: 401 without a client
/// certificate, 503 when the BMDB cannot tell within the bound.
pub(super) async fn grant(
    gate: &DownloadGate,
    req: &HttpRequest,
    name: &str,
) -> Result<DownloadGrant, HttpResponse> {
    let Some(PeerKey(key)) = req.conn_data::<PeerKey>().copied() else {
        return Err(refuse(
            req,
            name,
            actix_web::http::StatusCode::UNAUTHORIZED,
            "a download needs the agent's client certificate (the key of its callback)",
        ));
    };
    gate.ask(req, name, "whether this agent may download", async |tx| {
        download_grant(tx, &key, name).await
    })
    .await
}

/// The answer to an agent `grant` allows nothing of image `name`.
pub(super) fn refusal(req: &HttpRequest, name: &str, grant: &DownloadGrant) -> HttpResponse {
    let why = match grant {
        DownloadGrant::NotAsked { machine_id } => {
            format!("machine {machine_id} has no pending installation of this image")
        }
        _ => "no machine's agent holds this key".into(),
    };
    refuse(req, name, actix_web::http::StatusCode::FORBIDDEN, &why)
}

/// The machine whose agent (by the key its TLS client certificate
/// proved) has a pending installation of image `name`, which may fetch
/// `what` of it; else the answer refusing it.
pub(super) async fn granted(
    gate: &DownloadGate,
    req: &HttpRequest,
    name: &str,
    what: &str,
) -> Result<uuid::Uuid, HttpResponse> {
    match grant(gate, req, name).await? {
        DownloadGrant::Allowed {
            machine_id,
            generation,
        } => {
            // A download from its first byte at info; a range further on
            // (a resumption, or a chunk an agent's swarm did not hold: many
            // per image) at debug.
            let range = req.headers().get(actix_web::http::header::RANGE);
            if range.is_none_or(|r| r.as_bytes().starts_with(b"bytes=0-")) {
                tracing::info!(image = %name, machine = %machine_id, generation, range = range.is_some(), what, "image download");
            } else {
                tracing::debug!(image = %name, machine = %machine_id, generation, what, "image download of a range");
            }
            Ok(machine_id)
        }
        other => Err(refusal(req, name, &other)),
    }
}
