//! Each served image's manifest (`shepherd_proto::manifest`): its chunks
//! by SHA-256, computed in the one pass over the file that computes its
//! digest (served at `GET /manifests/<name>` by `images::manifest_file`,
//! to the agents the image itself is served to). An installation of a
//! served image names it with its digest, so that the agent checks every
//! chunk before the chunk goes to the disk.

use std::sync::Arc;
use std::time::SystemTime;

use prost::Message as _;
use shepherd_proto::manifest::{CHUNK, ManifestBuilder, sha256};

/// A file's modification time, as its version is told by (with its
/// length).
pub fn modified(meta: &std::fs::Metadata) -> SystemTime {
    meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)
}

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
