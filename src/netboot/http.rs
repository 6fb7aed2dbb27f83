//! The network boot's HTTP side (plain HTTP: neither iPXE nor a UEFI
//! firmware trusts a certificate of ours): each boot's files
//! ([`files`](super::files): iPXE's script, the kernel, the initramfs with
//! the boot's data appended, the signed chain, the ISO for UEFI HTTP boot)
//! and the iPXE binaries. Every `/boot/…` URL is good while its boot is
//! unused and unexpired, as the ISO's copy is (CONTRACTS.md §5); the
//! boot's id is the capability. Every URL answers `HEAD` as its `GET`.

use std::sync::Arc;

use actix_web::http::header;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use uuid::Uuid;

use super::files::{self, BootPart, Unserved};
use super::metrics::NetbootMetrics;
use crate::bmdb::Bmdb;
use crate::images::BootServing;

/// What the handlers share.
#[derive(Clone)]
pub struct Served {
    pub bmdb: Bmdb,
    pub boot: BootServing,
    pub ca_der: Arc<Vec<u8>>,
    /// `http://10.0.0.1:8067`: the base the script's URLs start with.
    pub base: String,
    pub tftp_root: std::path::PathBuf,
    pub metrics: NetbootMetrics,
    pub timeout: std::time::Duration,
    /// The TFTP server a boot's GRUB configuration names.
    pub server: std::net::Ipv4Addr,
}

/// The script iPXE runs for one boot. A firmware with Secure Boot on
/// runs a NIC's iPXE ROM but refuses the kernel it loads: the script then
/// leaves to the firmware, whose own PXE client asks next and gets the
/// signed chain.
pub fn script(base: &str, boot_id: Uuid, cmdline: &str) -> String {
    format!(
        "#!ipxe\n\
         echo shepherd: boot {boot_id}\n\
         kernel {base}/boot/{boot_id}/vmlinuz initrd=initrd {cmdline} || goto refused\n\
         initrd --name initrd {base}/boot/{boot_id}/initrd || goto refused\n\
         boot || goto refused\n\
         :refused\n\
         echo shepherd: this firmware did not start the kernel (Secure Boot?); back to the firmware\n\
         exit 1\n"
    )
}

fn text(status: actix_web::http::StatusCode, body: &str) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/plain; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(format!("{body}\n"))
}

/// The boot, while it may be served.
pub(super) async fn live_boot(
    s: &Served,
    boot_id: Uuid,
) -> Result<crate::bmdb::boot::IssuedBoot, Unserved> {
    let asked = tokio::time::timeout(
        s.timeout,
        s.bmdb
            .transact(async |tx| crate::bmdb::boot::to_serve(tx, boot_id).await),
    )
    .await;
    match asked {
        Ok(Ok(Some(b))) => Ok(b),
        Ok(Ok(None)) => Err(Unserved::NoSuchBoot),
        Ok(Err(e)) => {
            tracing::warn!(boot = %boot_id, error = %e, "the BMDB cannot tell whether this boot is served");
            Err(Unserved::Unavailable(
                "the BMDB cannot tell now whether this boot is served; try again",
            ))
        }
        Err(_) => Err(Unserved::Unavailable(
            "the BMDB did not answer in time; try again",
        )),
    }
}

/// The answer saying why a part is not served, counted and logged.
fn unserved(s: &Served, what: &'static str, boot_id: Uuid, why: Unserved) -> HttpResponse {
    use actix_web::http::StatusCode;
    let (status, result) = match &why {
        Unserved::NoSuchBoot | Unserved::NotInImage(_) => (StatusCode::NOT_FOUND, "refused"),
        Unserved::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        Unserved::Failed(_) => (StatusCode::INTERNAL_SERVER_ERROR, "failed"),
    };
    s.metrics.http(what, result);
    tracing::info!(boot = %boot_id, what, why = %why, "network boot file not served");
    text(status, &why.to_string())
}

/// `GET` and `HEAD` of a boot's files ([`files::name`]) and of the
/// network GRUB's shared configuration. A `HEAD` is answered as the `GET`
/// would be (status, type, length), with no body: EDK2's HTTP boot asks
/// the size first.
async fn boot_file(
    s: web::Data<Served>,
    req: HttpRequest,
    path: web::Path<String>,
) -> HttpResponse {
    use actix_web::http::StatusCode;
    let (boot_id, part) = match files::name(&path) {
        files::Named::Boot(id, part) => (id, part),
        files::Named::SharedGrubConfig => {
            s.metrics.http("grub-config", "served");
            return bytes(
                &req,
                "text/plain; charset=utf-8",
                files::shared_grub_config().into_bytes(),
            );
        }
        // GRUB reads it over TFTP only.
        files::Named::MacGrubConfig(_) | files::Named::Nothing => {
            return text(StatusCode::NOT_FOUND, "no such file");
        }
    };
    let what = part.as_str();
    let issued = match live_boot(&s, boot_id).await {
        Ok(b) => b,
        Err(why) => return unserved(&s, what, boot_id, why),
    };
    let peer = req
        .peer_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    if part == BootPart::Iso {
        // A boot whose image is fetched with its own user name and password
        // (virtual media) is not served here without them.
        if issued.media_auth {
            return unserved(&s, what, boot_id, Unserved::NoSuchBoot);
        }
        let data = crate::images::boot::boot_data(&issued, &s.boot.callback_endpoint, &s.ca_der);
        return match s.boot.image.slot(&data) {
            Ok(slot) => {
                s.metrics.http(what, "served");
                crate::images::boot::copy_response(
                    &s.boot.image,
                    slot,
                    &req,
                    boot_id,
                    issued.machine_id,
                )
            }
            Err(e) => unserved(&s, what, boot_id, Unserved::Failed(e.to_string())),
        };
    }
    let base = s.base.clone();
    let source = files::source(
        part,
        &s.boot,
        &issued,
        &s.ca_der,
        |cmdline| script(&base, boot_id, cmdline),
        s.server,
    );
    match source {
        Ok(files::Source::Bytes(b)) => {
            s.metrics.http(what, "served");
            tracing::info!(boot = %boot_id, machine = %issued.machine_id, %peer, what, method = %req.method(), "network boot file served");
            bytes(&req, "text/plain; charset=utf-8", b)
        }
        Ok(files::Source::File { path, tail }) => {
            send(&s, &req, what, boot_id, &peer, &path, tail).await
        }
        Err(why) => unserved(&s, what, boot_id, why),
    }
}

/// `bytes` as the answer (none of them to a `HEAD`).
fn bytes(req: &HttpRequest, content_type: &str, b: Vec<u8>) -> HttpResponse {
    let mut res = HttpResponse::Ok();
    res.content_type(content_type)
        .insert_header((header::CACHE_CONTROL, "no-store"));
    if req.method() == actix_web::http::Method::HEAD {
        return res.body(actix_web::body::SizedStream::new(
            b.len() as u64,
            futures::stream::empty::<Result<web::Bytes, std::io::Error>>(),
        ));
    }
    res.body(b)
}

/// The file at `path` (then `tail`) as boot `boot_id`'s `what`, counted
/// and logged.
async fn send(
    s: &Served,
    req: &HttpRequest,
    what: &'static str,
    boot_id: Uuid,
    peer: &str,
    path: &std::path::Path,
    tail: Vec<u8>,
) -> HttpResponse {
    let head = req.method() == actix_web::http::Method::HEAD;
    match stream_file(path, tail, head).await {
        Ok((len, body)) => {
            s.metrics.http(what, "served");
            tracing::info!(boot = %boot_id, %peer, bytes = len, what, method = %req.method(), "network boot file served");
            let content_type = if path.extension().is_some_and(|e| e == "efi") {
                "application/efi"
            } else {
                "application/octet-stream"
            };
            HttpResponse::Ok()
                .content_type(content_type)
                .insert_header((header::CACHE_CONTROL, "no-store"))
                .body(actix_web::body::SizedStream::new(len, body))
        }
        Err(e) => {
            s.metrics.http(what, "failed");
            tracing::warn!(path = %path.display(), error = %e, what, "network boot file cannot be read");
            text(
                actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
                "the file cannot be read",
            )
        }
    }
}

/// `GET /ipxe/{file}`: an iPXE binary, for UEFI HTTP boot with
/// `netboot.uefi = "ipxe"` (and `HEAD`, its size).
async fn ipxe_binary(
    s: web::Data<Served>,
    req: HttpRequest,
    name: web::Path<String>,
) -> HttpResponse {
    use actix_web::http::StatusCode;
    let path = match super::tftp::served_file(&s.tftp_root, &name) {
        Ok(p) => p,
        Err(r) => {
            s.metrics.http("ipxe", "refused");
            return text(StatusCode::NOT_FOUND, &r.message);
        }
    };
    let head = req.method() == actix_web::http::Method::HEAD;
    match stream_file(&path, Vec::new(), head).await {
        Ok((len, body)) => {
            s.metrics.http("ipxe", "served");
            HttpResponse::Ok()
                .content_type("application/efi")
                .body(actix_web::body::SizedStream::new(len, body))
        }
        Err(_) => {
            s.metrics.http("ipxe", "failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, "cannot be read")
        }
    }
}

type Chunks = futures::stream::LocalBoxStream<'static, Result<web::Bytes, std::io::Error>>;

/// The file, zero-padded to a multiple of 4 when `tail` follows (an
/// initramfs's archives start 4-aligned), then `tail`: its length and
/// its bytes as a stream (none for a `HEAD`: the length alone).
async fn stream_file(
    path: &std::path::Path,
    tail: Vec<u8>,
    head: bool,
) -> std::io::Result<(u64, Chunks)> {
    use futures::StreamExt as _;
    use tokio::io::AsyncReadExt as _;
    let file = tokio::fs::File::open(path).await?;
    let len = file.metadata().await?.len();
    let pad = if tail.is_empty() {
        0
    } else {
        (4 - len % 4) % 4
    };
    let mut tail_bytes = vec![0u8; pad as usize];
    tail_bytes.extend_from_slice(&tail);
    let total = len + tail_bytes.len() as u64;
    if head {
        return Ok((total, futures::stream::empty().boxed_local()));
    }
    let body = futures::stream::unfold(Some((file, len)), |state| async move {
        let (mut file, left) = state?;
        if left == 0 {
            return None;
        }
        let mut buf = vec![0u8; (256 << 10).min(left as usize)];
        match file.read_exact(&mut buf).await {
            Ok(_) => Some((
                Ok(web::Bytes::from(buf)),
                Some((file, left - (256 << 10).min(left))),
            )),
            Err(e) => Some((Err(e), None)),
        }
    })
    .chain(futures::stream::iter(
        (!tail_bytes.is_empty()).then(|| Ok(web::Bytes::from(tail_bytes))),
    ))
    .boxed_local();
    Ok((total, body))
}

/// Starts the server on `listen`.
pub fn start(
    served: Served,
    listen: std::net::SocketAddr,
) -> std::io::Result<actix_web::dev::ServerHandle> {
    let data = web::Data::new(served);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .route("/{path:boot/.*}", web::get().to(boot_file))
            .route("/{path:boot/.*}", web::head().to(boot_file))
            .route("/{path:grub/grub.cfg}", web::get().to(boot_file))
            .route("/{path:grub/grub.cfg}", web::head().to(boot_file))
            .route("/ipxe/{name}", web::get().to(ipxe_binary))
            .route("/ipxe/{name}", web::head().to(ipxe_binary))
    })
    .workers(1)
    .disable_signals()
    .bind(listen)?
    .run();
    let handle = server.handle();
    actix_rt::spawn(server);
    Ok(handle)
}
