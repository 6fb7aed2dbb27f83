//! Each served image's manifest (`shepherd_proto::manifest`): its chunks
//! by SHA-256, computed in the one pass over the file that computes its
//! digest, and served at `GET /manifests/<name>` to the agents the image
//! itself is served to (the same grant). An installation of a served
//! image names it with its digest, so that the agent checks every chunk
//! before the chunk goes to the disk.

use std::sync::Arc;
use std::time::SystemTime;

use actix_web::{HttpRequest, HttpResponse, http::header, web};
use prost::Message as _;
use shepherd_proto::manifest::{CHUNK, ManifestBuilder, sha256};

use super::{DownloadGate, ImageCatalog, granted, modified};

/// What was computed of one version of an image file (its length and
/// modification time): its digest and its manifest.
#[derive(Debug, Clone)]
pub struct Known {
    pub len: u64,
    pub mtime: SystemTime,
    /// `sha256:<hex>` of the file.
    pub digest: String,
    /// The manifest, encoded, and its `sha256:<hex>`.
    pub manifest: Arc<Vec<u8>>,
    pub manifest_digest: String,
}

impl Known {
    /// Reads `file` once, whole.
    pub fn of(mut file: std::fs::File, meta: &std::fs::Metadata) -> std::io::Result<Known> {
        use std::io::Read;
        let mut b = ManifestBuilder::new(CHUNK);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            b.update(&buf[..n]);
        }
        let m = b.finish();
        let manifest = m.encode_to_vec();
        Ok(Known {
            len: m.size_bytes,
            mtime: modified(meta),
            digest: m.digest,
            manifest_digest: sha256(&manifest),
            manifest: Arc::new(manifest),
        })
    }
}

/// `GET /manifests/<name>`: the manifest of image `name`, to an agent
/// with a pending installation of it; 503 with `Retry-After` while the
/// image's digest is still being computed (an agent tries again).
pub(super) async fn serve(
    catalog: web::Data<ImageCatalog>,
    gate: web::Data<DownloadGate>,
    req: HttpRequest,
    name: web::Path<String>,
) -> HttpResponse {
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
