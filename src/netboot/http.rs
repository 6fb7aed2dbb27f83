//! The network boot's HTTP side (plain HTTP: iPXE trusts no certificate of
//! ours): each boot's iPXE script, the kernel and the initramfs with that
//! boot's data appended, and the iPXE binaries for UEFI HTTP boot. Every
//! `/boot/…` URL is good while its boot is unused and unexpired, as the
//! ISO's copy is (CONTRACTS.md §5); the boot's id is the capability.

use std::sync::Arc;

use actix_web::http::header;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use uuid::Uuid;

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
}

/// The script iPXE runs for one boot.
pub fn script(base: &str, boot_id: Uuid, cmdline: &str) -> String {
    format!(
        "#!ipxe\n\
         echo shepherd: boot {boot_id}\n\
         kernel {base}/boot/{boot_id}/vmlinuz initrd=initrd {cmdline}\n\
         initrd --name initrd {base}/boot/{boot_id}/initrd\n\
         boot\n"
    )
}

fn text(status: actix_web::http::StatusCode, body: &str) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/plain; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(format!("{body}\n"))
}

/// The boot, while it may be served; Err: the answer saying why not.
async fn live_boot(
    s: &Served,
    boot_id: Uuid,
    what: &'static str,
) -> Result<crate::bmdb::boot::IssuedBoot, HttpResponse> {
    use actix_web::http::StatusCode;
    let asked = tokio::time::timeout(
        s.timeout,
        s.bmdb
            .transact(async |tx| crate::bmdb::boot::to_serve(tx, boot_id).await),
    )
    .await;
    match asked {
        Ok(Ok(Some(b))) => Ok(b),
        Ok(Ok(None)) => {
            s.metrics.http(what, "refused");
            tracing::info!(boot = %boot_id, what, "network boot file refused: no such boot (used, expired or unknown)");
            Err(text(
                StatusCode::NOT_FOUND,
                "no such boot (used, expired or unknown)",
            ))
        }
        Ok(Err(e)) => {
            s.metrics.http(what, "unavailable");
            tracing::warn!(boot = %boot_id, error = %e, "the BMDB cannot tell whether this boot is served");
            Err(text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the BMDB cannot tell now whether this boot is served; try again",
            ))
        }
        Err(_) => {
            s.metrics.http(what, "unavailable");
            Err(text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the BMDB did not answer in time; try again",
            ))
        }
    }
}

/// `GET /boot/{id}.ipxe`, `/boot/{id}/vmlinuz`, `/boot/{id}/initrd`.
async fn boot_file(
    s: web::Data<Served>,
    req: HttpRequest,
    path: web::Path<String>,
) -> HttpResponse {
    use actix_web::http::StatusCode;
    let path = path.into_inner();
    let (id, what) = match path.split_once('/') {
        Some((id, "vmlinuz")) => (id, "kernel"),
        Some((id, "initrd")) => (id, "initrd"),
        None => match path.strip_suffix(".ipxe") {
            Some(id) => (id, "script"),
            None => return text(StatusCode::NOT_FOUND, "no such file"),
        },
        Some(_) => return text(StatusCode::NOT_FOUND, "no such file"),
    };
    let Ok(boot_id) = Uuid::parse_str(id) else {
        return text(StatusCode::NOT_FOUND, "no such boot");
    };
    let Some(files) = s.boot.image.netboot.clone() else {
        s.metrics.http(what, "refused");
        return text(
            StatusCode::NOT_FOUND,
            "this boot image has no kernel and initramfs for network boot (scripts/boot-image writes them beside the ISO)",
        );
    };
    let issued = match live_boot(&s, boot_id, what).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let peer = req
        .peer_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    match what {
        "script" => {
            s.metrics.http(what, "served");
            tracing::info!(boot = %boot_id, machine = %issued.machine_id, %peer, "iPXE script served");
            HttpResponse::Ok()
                .content_type("text/plain; charset=utf-8")
                .insert_header((header::CACHE_CONTROL, "no-store"))
                .body(script(&s.base, boot_id, &files.cmdline))
        }
        "kernel" => send(&s, what, boot_id, &peer, &files.kernel, Vec::new()).await,
        _ => {
            let data =
                crate::images::boot::boot_data(&issued, &s.boot.callback_endpoint, &s.ca_der);
            match s.boot.image.slot(&data) {
                Ok(slot) => send(&s, what, boot_id, &peer, &files.initrd, slot).await,
                Err(e) => {
                    s.metrics.http(what, "failed");
                    tracing::warn!(boot = %boot_id, error = %e, "network boot: cannot make this boot's data");
                    text(StatusCode::INTERNAL_SERVER_ERROR, &e)
                }
            }
        }
    }
}

/// The file at `path` (then `tail`) as boot `boot_id`'s `what`, counted
/// and logged.
async fn send(
    s: &Served,
    what: &'static str,
    boot_id: Uuid,
    peer: &str,
    path: &std::path::Path,
    tail: Vec<u8>,
) -> HttpResponse {
    match stream_file(path, tail).await {
        Ok((len, body)) => {
            s.metrics.http(what, "served");
            tracing::info!(boot = %boot_id, %peer, bytes = len, what, "network boot file served");
            HttpResponse::Ok()
                .content_type("application/octet-stream")
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

/// `GET /ipxe/{file}`: an iPXE binary, for UEFI HTTP boot.
async fn ipxe_binary(s: web::Data<Served>, name: web::Path<String>) -> HttpResponse {
    use actix_web::http::StatusCode;
    let path = match super::tftp::served_file(&s.tftp_root, &name) {
        Ok(p) => p,
        Err(r) => {
            s.metrics.http("ipxe", "refused");
            return text(StatusCode::NOT_FOUND, &r.message);
        }
    };
    match stream_file(&path, Vec::new()).await {
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
/// its bytes as a stream.
async fn stream_file(path: &std::path::Path, tail: Vec<u8>) -> std::io::Result<(u64, Chunks)> {
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
            .route("/boot/{path:.*}", web::get().to(boot_file))
            .route("/ipxe/{name}", web::get().to(ipxe_binary))
    })
    .workers(1)
    .disable_signals()
    .bind(listen)?
    .run();
    let handle = server.handle();
    actix_rt::spawn(server);
    Ok(handle)
}
