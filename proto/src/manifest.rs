//! An image's manifest (`ImageManifest`): its chunks by SHA-256, made by
//! the image server in the pass that computes the image's digest, and
//! checked by the agent chunk by chunk before a chunk is written. The one
//! home of its rules (the chunk size, what a valid manifest is, where a
//! chunk lies) for both ends.

use sha2::Digest as _;

use crate::api::ImageManifest;

/// The image server's chunk size: a few pieces of a download, small
/// enough that a chunk fetched again costs little.
pub const CHUNK: u64 = 4 << 20;
/// The chunk sizes a manifest may have.
pub const MIN_CHUNK: u64 = 64 << 10;
pub const MAX_CHUNK: u64 = 64 << 20;
/// The most a manifest may weigh: 64 MiB chunks of a 16 TiB image.
pub const MAX_MANIFEST: u64 = 16 << 20;

/// `sha256:<hex>` of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&sha2::Sha256::digest(bytes)))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Makes an image's manifest and whole digest from its bytes, in order.
pub struct ManifestBuilder {
    chunk_size: u64,
    whole: sha2::Sha256,
    chunk: sha2::Sha256,
    in_chunk: u64,
    size: u64,
    hashes: Vec<u8>,
}

impl ManifestBuilder {
    pub fn new(chunk_size: u64) -> ManifestBuilder {
        ManifestBuilder {
            chunk_size,
            whole: sha2::Sha256::new(),
            chunk: sha2::Sha256::new(),
            in_chunk: 0,
            size: 0,
            hashes: Vec::new(),
        }
    }

    pub fn update(&mut self, mut b: &[u8]) {
        self.whole.update(b);
        self.size += b.len() as u64;
        while !b.is_empty() {
            let n = ((self.chunk_size - self.in_chunk) as usize).min(b.len());
            self.chunk.update(&b[..n]);
            self.in_chunk += n as u64;
            b = &b[n..];
            if self.in_chunk == self.chunk_size {
                let h = std::mem::take(&mut self.chunk).finalize();
                self.hashes.extend_from_slice(&h);
                self.in_chunk = 0;
            }
        }
    }

    pub fn finish(mut self) -> ImageManifest {
        if self.in_chunk > 0 {
            let h = std::mem::take(&mut self.chunk).finalize();
            self.hashes.extend_from_slice(&h);
        }
        ImageManifest {
            size_bytes: self.size,
            chunk_size: self.chunk_size,
            chunk_sha256: self.hashes,
            digest: format!("sha256:{}", hex(&self.whole.finalize())),
        }
    }
}

/// How many chunks an image of `size` bytes has.
pub fn chunks(size: u64, chunk_size: u64) -> u64 {
    size.div_ceil(chunk_size)
}

/// Whether `m` is a manifest an agent may follow: its chunk size allowed,
/// one hash per chunk, its length and digest the request's (where the
/// request gives a length). The error names what is wrong.
pub fn check(m: &ImageManifest, digest: &str, size: Option<u64>) -> Result<(), String> {
    let c = m.chunk_size;
    if !(MIN_CHUNK..=MAX_CHUNK).contains(&c) || !c.is_power_of_two() {
        return Err(format!(
            "the manifest's chunk size {c} is not a power of two from {MIN_CHUNK} to {MAX_CHUNK}"
        ));
    }
    let want = chunks(m.size_bytes, c) * 32;
    if m.chunk_sha256.len() as u64 != want {
        return Err(format!(
            "the manifest has {} bytes of chunk hashes, a {}-byte image in {c}-byte chunks needs {want}",
            m.chunk_sha256.len(),
            m.size_bytes
        ));
    }
    if !m.digest.trim().eq_ignore_ascii_case(digest.trim()) {
        return Err(format!(
            "the manifest is of an image whose digest is {}, the request's is {digest}",
            m.digest
        ));
    }
    if let Some(s) = size
        && s != m.size_bytes
    {
        return Err(format!(
            "the manifest is of a {}-byte image, the request's is {s} bytes",
            m.size_bytes
        ));
    }
    Ok(())
}

/// Chunk `i` of a checked manifest: where it starts, its length, its hash.
pub fn chunk(m: &ImageManifest, i: u64) -> (u64, u64, &[u8]) {
    let start = i * m.chunk_size;
    let len = m.chunk_size.min(m.size_bytes - start);
    let h = &m.chunk_sha256[(i * 32) as usize..(i * 32 + 32) as usize];
    (start, len, h)
}

/// Whether `bytes` are chunk `i` of the checked manifest `m`.
pub fn matches(m: &ImageManifest, i: u64, parts: &[&[u8]]) -> bool {
    let mut h = sha2::Sha256::new();
    let mut len = 0;
    for p in parts {
        h.update(p);
        len += p.len() as u64;
    }
    let (_, want_len, want) = chunk(m, i);
    len == want_len && h.finalize().as_slice() == want
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_is_its_chunks_hashes_in_order_and_checks_against_its_request() {
        let image: Vec<u8> = (0..(150u32 << 10)).map(|i| (i % 251) as u8).collect();
        let mut b = ManifestBuilder::new(MIN_CHUNK);
        // Fed in pieces that straddle the chunks.
        for piece in image.chunks(10_000) {
            b.update(piece);
        }
        let m = b.finish();
        assert_eq!(m.size_bytes, image.len() as u64);
        assert_eq!(m.digest, sha256(&image));
        assert_eq!(chunks(m.size_bytes, m.chunk_size), 3);
        assert!(check(&m, &m.digest, Some(image.len() as u64)).is_ok());
        for i in 0..3 {
            let (s, n, _) = chunk(&m, i);
            assert!(matches(&m, i, &[&image[s as usize..(s + n) as usize]]));
        }
        // The last chunk is short; a byte changed is another chunk.
        assert_eq!(chunk(&m, 2).1, (150 - 128) << 10);
        let mut bad = image[..MIN_CHUNK as usize].to_vec();
        bad[7] ^= 1;
        assert!(!matches(&m, 0, &[&bad]));
        assert!(check(&m, "sha256:00", None).unwrap_err().contains("digest"));
        assert!(
            check(&m, &m.digest, Some(1))
                .unwrap_err()
                .contains("1 bytes")
        );
        let mut short = m.clone();
        short.chunk_sha256.pop();
        assert!(
            check(&short, &m.digest, None)
                .unwrap_err()
                .contains("needs 96")
        );
        let mut odd = m.clone();
        odd.chunk_size = 100_000;
        assert!(check(&odd, &m.digest, None).is_err());
    }
}
