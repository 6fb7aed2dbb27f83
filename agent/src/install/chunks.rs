//! An image checked chunk by chunk against its manifest as it is fetched:
//! a chunk is handed on (to the hasher and the disk) only once its
//! SHA-256 is the manifest's, so a source that sends wrong bytes (a
//! corrupt cache, a lying peer) costs that chunk fetched again, never a
//! wrong byte on the disk. The manifest's own rules are
//! `shepherd_proto::manifest`'s.

use bytes::Bytes;
use prost::Message as _;
use shepherd_proto::api::{ImageInstallation, ImageManifest};
use shepherd_proto::manifest;

use super::fetch::{self, AgentKey, AsyncSink, FetchLimits, Piece};

/// Attempts in a row that bring nothing before a manifest's fetch fails
/// (10 s apart after the first few: about ten minutes).
const MANIFEST_RETRIES: u32 = 64;

/// The manifest `req` names, fetched as its image is (the same CA, the
/// same client certificate) and checked: its digest the request's, its
/// image the request's. None when the request names none.
pub async fn fetch_manifest(
    req: &ImageInstallation,
    key: Option<&AgentKey>,
    limits: &FetchLimits,
) -> Result<Option<Chunks>, String> {
    let Some(r) = &req.manifest else {
        return Ok(None);
    };
    if !r.digest.trim().to_ascii_lowercase().starts_with("sha256:") {
        return Err(format!(
            "the image's manifest digest {:?} is not sha256:<hex>",
            r.digest
        ));
    }
    /// The manifest's bytes, up to [`manifest::MAX_MANIFEST`].
    struct Collect<'a>(&'a mut Vec<u8>);
    impl AsyncSink for Collect<'_> {
        async fn put(&mut self, piece: Piece) -> Result<(), String> {
            for b in piece.parts() {
                self.0.extend_from_slice(b);
            }
            if self.0.len() as u64 > manifest::MAX_MANIFEST {
                return Err(format!(
                    "the image's manifest is larger than {} bytes",
                    manifest::MAX_MANIFEST
                ));
            }
            Ok(())
        }
    }
    let mut bytes = Vec::new();
    let sink = Collect(&mut bytes);
    // Patient: a shepherd just restarted computes its images' manifests
    // again, answering 503 meanwhile (minutes for a large image); the
    // installation's deadline bounds the wait.
    let patient = FetchLimits {
        retries: limits.retries.max(MANIFEST_RETRIES),
        ..limits.clone()
    };
    fetch::fetch(
        &r.url,
        &req.ca_certificate,
        key,
        None,
        None,
        &patient,
        sink,
        |_, _| {},
    )
    .await
    .map_err(|e| format!("the image's manifest: {e}"))?;
    let got = manifest::sha256(&bytes);
    if !got.eq_ignore_ascii_case(r.digest.trim()) {
        return Err(format!(
            "the image's manifest from {} has {got}, the request says {}",
            r.url, r.digest
        ));
    }
    let m = ImageManifest::decode(bytes.as_slice())
        .map_err(|e| format!("the image's manifest from {} does not decode: {e}", r.url))?;
    manifest::check(&m, &req.digest, req.size_bytes.map(|s| s as u64))
        .map_err(|e| format!("the image's manifest from {}: {e}", r.url))?;
    Ok(Some(Chunks::new(m)))
}

/// The chunks of one fetch: the manifest, the chunk being gathered.
#[derive(Debug)]
pub struct Chunks {
    manifest: ImageManifest,
    /// The chunk being gathered.
    next: u64,
    count: u64,
    /// Its bytes so far.
    gathered: Piece,
    /// Chunks refused so far.
    pub refused: u32,
}

impl Chunks {
    /// Checks the image against `m`, which [`manifest::check`] passed.
    pub fn new(m: ImageManifest) -> Chunks {
        let count = manifest::chunks(m.size_bytes, m.chunk_size);
        Chunks {
            manifest: m,
            next: 0,
            count,
            gathered: Piece::default(),
            refused: 0,
        }
    }

    /// Where the chunk being gathered starts: where a fetch goes on from
    /// after one was refused.
    pub fn start(&self) -> u64 {
        self.next * self.manifest.chunk_size
    }

    /// The manifest checked against.
    pub fn manifest(&self) -> &ImageManifest {
        &self.manifest
    }

    /// How many chunks the image has.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Where the next byte given belongs.
    pub fn at(&self) -> u64 {
        self.start() + self.gathered.len() as u64
    }

    /// Takes the image's bytes from [`Self::at`] on; the chunks they
    /// complete, checked, to hand on in order. A chunk that does not match
    /// is dropped whole, and the error names it: fetch again from
    /// [`Self::start`].
    pub fn push(&mut self, mut data: Bytes) -> Result<Vec<Piece>, String> {
        let mut ready = Vec::new();
        while !data.is_empty() {
            if self.next >= self.count {
                return Err(format!(
                    "the source sent more than the manifest's {} bytes",
                    self.manifest.size_bytes
                ));
            }
            let (start, len, _) = manifest::chunk(&self.manifest, self.next);
            let want = (len - self.gathered.len() as u64) as usize;
            self.gathered.push(data.split_to(want.min(data.len())));
            if self.gathered.len() as u64 == len {
                let chunk = self.gathered.take();
                let parts: Vec<&[u8]> = chunk.parts().iter().map(|b| b.as_ref()).collect();
                if !manifest::matches(&self.manifest, self.next, &parts) {
                    self.refused += 1;
                    return Err(format!(
                        "chunk {} (bytes {start}..{}) does not match the image's manifest: fetching it again",
                        self.next,
                        start + len
                    ));
                }
                self.next += 1;
                ready.push(chunk);
            }
        }
        Ok(ready)
    }

    /// Whether every chunk was handed on; the error says where it ended.
    pub fn finish(&self) -> Result<(), String> {
        if self.next == self.count {
            Ok(())
        } else {
            Err(format!(
                "the source ended at byte {} of the manifest's {}",
                self.at(),
                self.manifest.size_bytes
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shepherd_proto::manifest::{MIN_CHUNK, ManifestBuilder};

    fn image() -> (Vec<u8>, ImageManifest) {
        let image: Vec<u8> = (0..(200u32 << 10)).map(|i| (i * 7 % 253) as u8).collect();
        let mut b = ManifestBuilder::new(MIN_CHUNK);
        b.update(&image);
        (image, b.finish())
    }

    fn bytes(ready: Vec<Piece>) -> Vec<u8> {
        ready
            .iter()
            .flat_map(|p| p.parts().iter().flat_map(|b| b.to_vec()))
            .collect()
    }

    #[test]
    fn chunks_are_handed_on_once_whole_and_matching() {
        let (image, m) = image();
        let mut c = Chunks::new(m);
        let mut out = Vec::new();
        for piece in image.chunks(50_000) {
            out.extend(bytes(c.push(Bytes::copy_from_slice(piece)).unwrap()));
            // Nothing but whole, checked chunks is handed on.
            assert!(
                out.len() as u64 % MIN_CHUNK == 0 || out.len() == image.len(),
                "at {}",
                c.at()
            );
            if out.len() < image.len() {
                assert!(c.finish().is_err(), "not all there yet");
            }
        }
        assert_eq!(out, image);
        c.finish().unwrap();
    }

    #[test]
    fn a_wrong_chunk_is_refused_whole_and_fetched_again_from_its_start() {
        let (image, m) = image();
        let mut c = Chunks::new(m);
        let mut bad = image.clone();
        bad[MIN_CHUNK as usize + 5] ^= 0xff;
        let first = c.push(Bytes::copy_from_slice(&bad[..100_000])).unwrap();
        assert_eq!(bytes(first), image[..MIN_CHUNK as usize]);
        let e = c.push(Bytes::copy_from_slice(&bad[100_000..])).unwrap_err();
        assert!(e.contains("chunk 1 (bytes 65536..131072)"), "{e}");
        assert_eq!((c.start(), c.at(), c.refused), (MIN_CHUNK, MIN_CHUNK, 1));
        // Again from the chunk's start, right this time: all of it.
        let rest = c
            .push(Bytes::copy_from_slice(&image[MIN_CHUNK as usize..]))
            .unwrap();
        assert_eq!(bytes(rest), image[MIN_CHUNK as usize..]);
        c.finish().unwrap();
        // More than the manifest says: refused.
        assert!(c.push(Bytes::from_static(b"x")).is_err());
    }
}
