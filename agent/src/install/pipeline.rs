//! From fetched bytes to the disk: the fetcher hashes the bytes as they
//! arrive (decrypting and hashing on one thread, with no hop between
//! them), one thread decompresses and writes. A bounded channel between
//! them keeps the memory flat whatever the image's size (a few pieces in
//! flight, the write block, the decoder's window).

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use sha2::Digest as _;

use super::fetch::Piece;

use super::disk::{Target, WriteError};
use super::{Algorithm, Counters};

/// Pieces queued between two stages.
pub const QUEUE: usize = 4;

/// What the pipeline is fed: pieces, then `End` (anything else, such as
/// the sender dropped, is an abort).
pub enum Feed {
    Piece(Piece),
    End,
}

/// The image formats recognised by their first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Raw,
    Gzip,
    Zstd,
    Xz,
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Format::Raw => "raw",
            Format::Gzip => "gzip",
            Format::Zstd => "zstd",
            Format::Xz => "xz",
        })
    }
}

/// Formats that cannot be written as they are, by their magic bytes.
fn refused(head: &[u8]) -> Option<&'static str> {
    const KNOWN: [(&[u8], &str); 7] = [
        (
            b"QFI\xfb",
            "qcow2 (convert it to raw: qemu-img convert -O raw)",
        ),
        (b"KDMV", "VMDK (convert it to raw: qemu-img convert -O raw)"),
        (
            b"vhdxfile",
            "VHDX (convert it to raw: qemu-img convert -O raw)",
        ),
        (
            b"conectix",
            "VHD (convert it to raw: qemu-img convert -O raw)",
        ),
        (b"BZh", "bzip2 (recompress it with zstd, xz or gzip)"),
        (
            b"\x04\x22\x4d\x18",
            "LZ4 (recompress it with zstd, xz or gzip)",
        ),
        (b"PK\x03\x04", "a ZIP archive"),
    ];
    KNOWN
        .iter()
        .find(|(m, _)| head.starts_with(m))
        .map(|(_, n)| *n)
        .or_else(|| {
            // VDI: its signature is at byte 64.
            (head.len() >= 68 && head[64..68] == [0x7f, 0x10, 0xda, 0xbe])
                .then_some("VDI (convert it to raw: qemu-img convert -O raw)")
        })
}

pub fn detect(head: &[u8]) -> Result<Format, String> {
    if let Some(name) = refused(head) {
        return Err(format!(
            "the image is {name}; it cannot be written to a disk as it is"
        ));
    }
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Format::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Format::Zstd
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        Format::Xz
    } else {
        Format::Raw
    })
}

/// The pieces of a channel, taken whole or read as a stream; an abort is
/// an error.
struct Pieces {
    rx: tokio::sync::mpsc::Receiver<Feed>,
    cur: Piece,
    ended: bool,
}

impl Pieces {
    /// The next piece of the channel; None at the end.
    fn recv(&mut self) -> std::io::Result<Option<Piece>> {
        while !self.ended {
            match self.rx.blocking_recv() {
                Some(Feed::Piece(p)) if p.is_empty() => {}
                Some(Feed::Piece(p)) => return Ok(Some(p)),
                Some(Feed::End) => self.ended = true,
                None => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::BrokenPipe,
                        Abandoned,
                    ));
                }
            }
        }
        Ok(None)
    }

    /// The next piece (what is left of the current one first); None at
    /// the end.
    fn next_piece(&mut self) -> std::io::Result<Option<Piece>> {
        if !self.cur.is_empty() {
            return Ok(Some(std::mem::take(&mut self.cur)));
        }
        self.recv()
    }

    /// Up to the first `n` bytes, left in place.
    fn head(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        while self.cur.len() < n {
            let Some(p) = self.recv()? else { break };
            for part in p.parts() {
                self.cur.push(part.clone());
            }
        }
        let mut head = Vec::with_capacity(n);
        for part in self.cur.parts() {
            let k = (n - head.len()).min(part.len());
            head.extend_from_slice(&part[..k]);
            if head.len() == n {
                break;
            }
        }
        Ok(head)
    }
}

impl Read for Pieces {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.cur.is_empty() {
            match self.next_piece()? {
                Some(p) => self.cur = p,
                None => return Ok(0),
            }
        }
        let first = &self.cur.parts()[0];
        let n = buf.len().min(first.len());
        buf[..n].copy_from_slice(&first[..n]);
        self.cur.advance(n);
        Ok(n)
    }
}

/// What the writer did.
#[derive(Debug)]
pub struct Written {
    pub format: Format,
    pub bytes: u64,
}

/// Why the pipeline stopped.
#[derive(Debug)]
pub enum Stop {
    /// The feed was abandoned (the fetch failed): nothing to add.
    Abandoned,
    /// The image could not be read or written: the cause.
    Failed(String),
}

fn read_err(format: Format, e: std::io::Error) -> Stop {
    if e.get_ref().is_some_and(|r| r.is::<Abandoned>()) {
        Stop::Abandoned
    } else {
        Stop::Failed(format!("the {format} image is corrupt: {e}"))
    }
}

/// The feed stopped without its end.
#[derive(Debug)]
struct Abandoned;

impl std::fmt::Display for Abandoned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the download was abandoned")
    }
}

impl std::error::Error for Abandoned {}

/// The digest of the image as fetched.
pub struct Hasher {
    algorithm: Algorithm,
    h256: sha2::Sha256,
    h512: sha2::Sha512,
}

impl Hasher {
    pub fn new(algorithm: Algorithm) -> Hasher {
        Hasher {
            algorithm,
            h256: sha2::Sha256::new(),
            h512: sha2::Sha512::new(),
        }
    }

    pub fn update(&mut self, piece: &Piece) {
        for part in piece.parts() {
            match self.algorithm {
                Algorithm::Sha256 => self.h256.update(part),
                Algorithm::Sha512 => self.h512.update(part),
            }
        }
    }

    /// The hex digest.
    pub fn finish(self) -> String {
        match self.algorithm {
            Algorithm::Sha256 => hex::encode(self.h256.finalize()),
            Algorithm::Sha512 => hex::encode(self.h512.finalize()),
        }
    }
}

/// Decompresses the feed (its format told by its first bytes) onto the
/// target; the target is left unflushed.
pub fn write(
    rx: tokio::sync::mpsc::Receiver<Feed>,
    target: &mut Target,
    counters: &Arc<Counters>,
) -> Result<Written, Stop> {
    let mut pieces = Pieces {
        rx,
        cur: Piece::default(),
        ended: false,
    };
    // Enough of the head to tell the format (a VDI's signature is at 64).
    let head = pieces.head(68).map_err(|e| read_err(Format::Raw, e))?;
    if head.is_empty() {
        return Err(Stop::Failed("the image is empty".into()));
    }
    let format = detect(&head).map_err(Stop::Failed)?;
    let write_err = |e: WriteError| match e {
        WriteError::TooSmall { .. } | WriteError::Io { .. } => Stop::Failed(e.to_string()),
    };
    if format == Format::Raw {
        // As fetched: each byte is copied once, into the block written.
        while let Some(p) = pieces.next_piece().map_err(|e| read_err(format, e))? {
            for part in p.parts() {
                target.write(part).map_err(write_err)?;
            }
            counters.written.store(target.written(), Ordering::Relaxed);
        }
        return Ok(Written {
            format,
            bytes: target.written(),
        });
    }
    let input = std::io::BufReader::with_capacity(256 << 10, pieces);
    let mut reader: Box<dyn Read> = match format {
        Format::Raw => unreachable!("written above"),
        Format::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(input)),
        Format::Zstd => Box::new(
            zstd::stream::read::Decoder::with_buffer(input)
                .map_err(|e| Stop::Failed(format!("the zstd image cannot be read: {e}")))?,
        ),
        Format::Xz => Box::new(liblzma::bufread::XzDecoder::new_multi_decoder(input)),
    };
    let mut buf = vec![0u8; 1 << 20];
    let mut first = true;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_err(format, e)),
        };
        if first && format != Format::Raw {
            // A compressed image of a format that cannot be written.
            if let Some(name) = refused(&buf[..n]) {
                return Err(Stop::Failed(format!(
                    "the {format} image holds {name}; it cannot be written to a disk as it is"
                )));
            }
        }
        first = false;
        target.write(&buf[..n]).map_err(write_err)?;
        counters.written.store(target.written(), Ordering::Relaxed);
    }
    Ok(Written {
        format,
        bytes: target.written(),
    })
}
