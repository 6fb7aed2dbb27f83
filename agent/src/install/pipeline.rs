//! From fetched bytes to the disk, on two threads beside the fetcher: one
//! hashes the bytes as fetched, one decompresses and writes. Bounded
//! channels between them keep the memory flat whatever the image's size
//! (a few pieces in flight, the write block, the decoder's window).

use std::io::{BufRead, Read};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use sha2::Digest as _;

use super::disk::{Target, WriteError};
use super::{Algorithm, Counters};

/// Pieces queued between two stages.
pub const QUEUE: usize = 4;

/// What the pipeline is fed: pieces, then `End` (anything else, such as
/// the sender dropped, is an abort).
pub enum Feed {
    Piece(Bytes),
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

/// A `Read` over the pieces of a channel; an abort is an error.
struct Pieces {
    rx: std::sync::mpsc::Receiver<Feed>,
    cur: Bytes,
    ended: bool,
}

impl Read for Pieces {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Feed::Piece(b)) => self.cur = b,
                Ok(Feed::End) => self.ended = true,
                Err(_) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::BrokenPipe,
                        Abandoned,
                    ));
                }
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur.split_to(n));
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

/// Hashes the feed as it passes, forwarding it to `out`; returns the hex
/// digest once the feed ends, None on an abort.
pub fn hash(
    mut rx: tokio::sync::mpsc::Receiver<Feed>,
    out: std::sync::mpsc::SyncSender<Feed>,
    algorithm: Algorithm,
) -> Option<String> {
    let mut h256 = sha2::Sha256::new();
    let mut h512 = sha2::Sha512::new();
    while let Some(f) = rx.blocking_recv() {
        match f {
            Feed::Piece(b) => {
                match algorithm {
                    Algorithm::Sha256 => h256.update(&b),
                    Algorithm::Sha512 => h512.update(&b),
                }
                if out.send(Feed::Piece(b)).is_err() {
                    return None;
                }
            }
            Feed::End => {
                let _ = out.send(Feed::End);
                return Some(match algorithm {
                    Algorithm::Sha256 => hex::encode(h256.finalize()),
                    Algorithm::Sha512 => hex::encode(h512.finalize()),
                });
            }
        }
    }
    None
}

/// Decompresses the feed (its format told by its first bytes) onto the
/// target; the target is left unflushed.
pub fn write(
    rx: std::sync::mpsc::Receiver<Feed>,
    target: &mut Target,
    counters: &Arc<Counters>,
) -> Result<Written, Stop> {
    let mut input = std::io::BufReader::with_capacity(
        256 << 10,
        Pieces {
            rx,
            cur: Bytes::new(),
            ended: false,
        },
    );
    // Enough of the head to tell the format (a VDI's signature is at 64).
    let head = {
        let b = input.fill_buf().map_err(|e| read_err(Format::Raw, e))?;
        b[..b.len().min(68)].to_vec()
    };
    if head.is_empty() {
        return Err(Stop::Failed("the image is empty".into()));
    }
    let format = detect(&head).map_err(Stop::Failed)?;
    let mut reader: Box<dyn Read> = match format {
        Format::Raw => Box::new(input),
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
        target.write(&buf[..n]).map_err(|e| match e {
            WriteError::TooSmall { .. } | WriteError::Io { .. } => Stop::Failed(e.to_string()),
        })?;
        counters.written.store(target.written(), Ordering::Relaxed);
    }
    Ok(Written {
        format,
        bytes: target.written(),
    })
}
