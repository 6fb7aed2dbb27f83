//! Each boot's copy of the boot image (CONTRACTS.md §5): the ISO
//! `scripts/boot-image` built, with its per-boot slot (a second initramfs,
//! its place given by the `.slot` file beside the ISO) replaced by that
//! boot's data: a `newc` cpio archive of `/shepherd/boot-data` (the
//! encoded `BootData`), zero-padded to the slot's length (the kernel skips
//! the padding). The ISO is never rebuilt; the copy is made as it is read,
//! in whatever ranges the BMC asks for.

use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

/// The base image and where its slot is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootImage {
    pub path: PathBuf,
    pub len: u64,
    pub slot_offset: u64,
    pub slot_len: u64,
    /// The same kernel and initramfs as files, for network boot
    /// (`<iso>.vmlinuz`, `<iso>.initrd` beside it; the boot's data is
    /// appended to the initramfs as the slot's archive), and the kernel's
    /// command line (the `.slot` file's `cmdline` line).
    pub netboot: Option<NetbootFiles>,
}

/// The kernel and initramfs a network boot loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetbootFiles {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub cmdline: String,
    /// The signed chain that loads them on UEFI (with Secure Boot on or
    /// off), when the image has one beside it.
    pub signed: Option<SignedChain>,
}

/// The first stages of a signed UEFI network boot, as `scripts/boot-image`
/// writes them beside the ISO: shim (signed by the Microsoft UEFI CA,
/// `<iso>.shimx64.efi`) and the network GRUB it verifies (signed by the
/// distribution whose key shim carries, `<iso>.grubnetx64.efi`), which in
/// turn has shim verify the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedChain {
    pub shim: PathBuf,
    pub grub: PathBuf,
}

/// The kernel's command line when the `.slot` file names none (as the
/// ISO's GRUB boots it).
pub const DEFAULT_CMDLINE: &str = "console=tty0 console=ttyS0,115200 quiet panic=30";

/// A boot's data, as its agent reads it (`/shepherd/boot-data`).
pub fn boot_data(
    issued: &crate::bmdb::boot::IssuedBoot,
    callback_endpoint: &str,
    ca_der: &[u8],
) -> Vec<u8> {
    use prost::Message as _;
    shepherd_proto::boot::BootData {
        machine_id: issued.machine_id.to_string(),
        bmaas_endpoint: callback_endpoint.to_string(),
        ca_certificate: ca_der.to_vec(),
        credential: issued.credential.clone(),
    }
    .encode_to_vec()
}

/// What the placeholder in the slot says, as `scripts/boot-image` writes it.
const PLACEHOLDER: &[u8] = b"SHEPHERD-BOOT-DATA-SLOT-PLACEHOLDER";

fn find(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A boot image that cannot be served, or a boot's data that does not
/// fit it: each names the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootImageError {
    /// The file (the ISO or its `.slot`) and what is wrong with it.
    #[error("{file}: {message}")]
    File { file: String, message: String },
    #[error(
        "the boot's data ({bytes} bytes as an archive) does not fit the image's {slot}-byte slot"
    )]
    TooBig { bytes: usize, slot: u64 },
}

impl BootImage {
    /// The ISO at `path` and its `<path>.slot` (`offset N`, `length N`
    /// lines), checked: the slot lies inside the ISO and holds the
    /// placeholder.
    pub fn open(path: &Path) -> Result<BootImage, BootImageError> {
        let slot_file = {
            let mut p = path.as_os_str().to_owned();
            p.push(".slot");
            PathBuf::from(p)
        };
        let bad = |f: &Path, message: String| BootImageError::File {
            file: f.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(&slot_file).map_err(|e| {
            bad(
                &slot_file,
                format!("{e} (scripts/boot-image writes it beside the ISO)"),
            )
        })?;
        let field = |name: &str| -> Result<u64, BootImageError> {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .ok_or_else(|| bad(&slot_file, format!("no {name:?} line")))
        };
        let (slot_offset, slot_len) = (field("offset ")?, field("length ")?);
        let file = std::fs::File::open(path).map_err(|e| bad(path, e.to_string()))?;
        let len = file.metadata().map_err(|e| bad(path, e.to_string()))?.len();
        if !(512..=1 << 20).contains(&slot_len) || slot_offset + slot_len > len {
            return Err(bad(
                &slot_file,
                format!(
                    "the slot (byte {slot_offset}, {slot_len} bytes) is not inside the {len}-byte image"
                ),
            ));
        }
        let mut slot = vec![0u8; slot_len as usize];
        file.read_exact_at(&mut slot, slot_offset)
            .map_err(|e| bad(path, e.to_string()))?;
        if !slot.starts_with(b"070701") || !find(&slot, PLACEHOLDER) {
            return Err(bad(
                path,
                format!("no placeholder at byte {slot_offset}: the .slot file is not this image's"),
            ));
        }
        let beside = |ext: &str| {
            let mut p = path.as_os_str().to_owned();
            p.push(ext);
            Some(PathBuf::from(p)).filter(|p| p.is_file())
        };
        let signed = match (beside(".shimx64.efi"), beside(".grubnetx64.efi")) {
            (Some(shim), Some(grub)) => Some(SignedChain { shim, grub }),
            _ => None,
        };
        let netboot = match (beside(".vmlinuz"), beside(".initrd")) {
            (Some(kernel), Some(initrd)) => Some(NetbootFiles {
                kernel,
                initrd,
                signed,
                cmdline: text
                    .lines()
                    .find_map(|l| l.strip_prefix("cmdline "))
                    .map(|c| c.trim().to_string())
                    .filter(|c| !c.is_empty())
                    .unwrap_or_else(|| DEFAULT_CMDLINE.to_string()),
            }),
            _ => None,
        };
        Ok(BootImage {
            path: path.to_path_buf(),
            len,
            slot_offset,
            slot_len,
            netboot,
        })
    }

    /// The slot's bytes for one boot: `data` as `/shepherd/boot-data`.
    pub fn slot(&self, data: &[u8]) -> Result<Vec<u8>, BootImageError> {
        let mut out = Vec::with_capacity(self.slot_len as usize);
        cpio_entry(&mut out, "shepherd", 0o040755, &[]);
        cpio_entry(&mut out, "shepherd/boot-data", 0o100600, data);
        cpio_entry(&mut out, "TRAILER!!!", 0, &[]);
        if out.len() as u64 > self.slot_len {
            return Err(BootImageError::TooBig {
                bytes: out.len(),
                slot: self.slot_len,
            });
        }
        out.resize(self.slot_len as usize, 0);
        Ok(out)
    }

    /// Bytes `[at, at + buf.len())` of the copy whose slot is `slot`.
    pub fn read_at(
        &self,
        file: &std::fs::File,
        slot: &[u8],
        buf: &mut [u8],
        at: u64,
    ) -> std::io::Result<()> {
        file.read_exact_at(buf, at)?;
        let (from, to) = (at, at + buf.len() as u64);
        let (s_from, s_to) = (self.slot_offset, self.slot_offset + self.slot_len);
        if from < s_to && s_from < to {
            let a = from.max(s_from);
            let b = to.min(s_to);
            buf[(a - from) as usize..(b - from) as usize]
                .copy_from_slice(&slot[(a - s_from) as usize..(b - s_from) as usize]);
        }
        Ok(())
    }
}

/// Bytes of a boot's copy read per step.
const BOOT_PIECE: usize = 256 << 10;

/// The answer to a `GET` or `HEAD` of one boot's copy of `image` (its slot
/// holding `slot`): the whole, or the one range asked, streamed as read;
/// a `HEAD` gets the same status and headers, and no body. Served to a
/// BMC's virtual media (the image server) and to UEFI HTTP boot, which
/// boots it as a RAM disk (the network boot's HTTP).
pub fn copy_response(
    image: &BootImage,
    slot: Vec<u8>,
    req: &actix_web::HttpRequest,
    boot_id: uuid::Uuid,
    machine_id: uuid::Uuid,
) -> actix_web::HttpResponse {
    use actix_web::http::{StatusCode, header};
    use actix_web::{HttpResponse, web};
    use std::sync::Arc;
    let image = image.clone();
    let len = image.len;
    let ranged = range(
        req.headers()
            .get(header::RANGE)
            .and_then(|v| v.to_str().ok()),
        len,
    );
    let (status, first, last) = match ranged {
        Ok(None) => (StatusCode::OK, 0, len.saturating_sub(1)),
        Ok(Some((a, b))) => (StatusCode::PARTIAL_CONTENT, a, b),
        Err(Unsatisfiable) => {
            return HttpResponse::RangeNotSatisfiable()
                .insert_header((header::CONTENT_RANGE, format!("bytes */{len}")))
                .finish();
        }
    };
    // A BMC streaming the image reads it in many ranges: one line at info
    // per start, the rest at debug.
    if first == 0 {
        tracing::info!(boot = %boot_id, machine = %machine_id, last, method = %req.method(), "boot image served");
    } else {
        tracing::debug!(boot = %boot_id, machine = %machine_id, first, last, "boot image range served");
    }
    let mut res = HttpResponse::build(status);
    res.insert_header((header::CONTENT_TYPE, "application/x-iso9660-image"))
        .insert_header((header::ACCEPT_RANGES, "bytes"))
        .insert_header((header::CACHE_CONTROL, "no-store"));
    if status == StatusCode::PARTIAL_CONTENT {
        res.insert_header((header::CONTENT_RANGE, format!("bytes {first}-{last}/{len}")));
    }
    let count = if len == 0 { 0 } else { last - first + 1 };
    if req.method() == actix_web::http::Method::HEAD {
        // The length the GET would have (actix sends no body for a HEAD).
        let none = futures::stream::empty::<Result<web::Bytes, std::io::Error>>();
        return res.body(actix_web::body::SizedStream::new(count, none));
    }
    let file = match std::fs::File::open(&image.path) {
        Ok(f) => Arc::new(f),
        Err(e) => {
            tracing::warn!(path = %image.path.display(), error = %e, "boot image: cannot open");
            return HttpResponse::InternalServerError().body("the boot image cannot be read\n");
        }
    };
    let slot = Arc::new(slot);
    let image = Arc::new(image);
    let end = first + count;
    let body = futures::stream::unfold(first, move |at| {
        let (file, slot, image) = (file.clone(), slot.clone(), image.clone());
        async move {
            if at >= end {
                return None;
            }
            let n = (end - at).min(BOOT_PIECE as u64) as usize;
            let read = web::block(move || {
                let mut buf = vec![0u8; n];
                image.read_at(&file, &slot, &mut buf, at).map(|()| buf)
            })
            .await;
            let piece = match read {
                Ok(Ok(buf)) => Ok(web::Bytes::from(buf)),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            };
            Some((piece, at + n as u64))
        }
    });
    res.body(actix_web::body::SizedStream::new(count, body))
}

/// One `newc` entry: header, name (NUL-ended, padded to 4), data (padded
/// to 4).
fn cpio_entry(out: &mut Vec<u8>, name: &str, mode: u32, data: &[u8]) {
    let fields = [
        0u32,                  // ino
        mode,                  // mode
        0,                     // uid
        0,                     // gid
        1,                     // nlink
        0,                     // mtime
        data.len() as u32,     // filesize
        0,                     // devmajor
        0,                     // devminor
        0,                     // rdevmajor
        0,                     // rdevminor
        name.len() as u32 + 1, // namesize
        0,                     // check
    ];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08X}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
    out.extend_from_slice(data);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// A `Range` this server cannot satisfy (416).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsatisfiable;

/// A `Range` header's one range over `len` bytes: (first, last) inclusive.
/// None: no header, or one this server answers with the whole (several
/// ranges).
pub fn range(header: Option<&str>, len: u64) -> Result<Option<(u64, u64)>, Unsatisfiable> {
    let Some(h) = header else { return Ok(None) };
    let Some(spec) = h.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') || len == 0 {
        return Ok(None);
    }
    let (a, b) = spec.split_once('-').ok_or(Unsatisfiable)?;
    let (a, b) = (a.trim(), b.trim());
    let r = if a.is_empty() {
        let n: u64 = b.parse().map_err(|_| Unsatisfiable)?;
        if n == 0 {
            return Err(Unsatisfiable);
        }
        (len.saturating_sub(n), len - 1)
    } else {
        let first: u64 = a.parse().map_err(|_| Unsatisfiable)?;
        let last = if b.is_empty() {
            len - 1
        } else {
            b.parse::<u64>().map_err(|_| Unsatisfiable)?.min(len - 1)
        };
        if first >= len || last < first {
            return Err(Unsatisfiable);
        }
        (first, last)
    };
    Ok(Some(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_read_as_rfc_9110_says() {
        assert_eq!(range(None, 100), Ok(None));
        assert_eq!(range(Some("bytes=0-9"), 100), Ok(Some((0, 9))));
        assert_eq!(range(Some("bytes=90-"), 100), Ok(Some((90, 99))));
        assert_eq!(range(Some("bytes=-10"), 100), Ok(Some((90, 99))));
        assert_eq!(range(Some("bytes=-1000"), 100), Ok(Some((0, 99))));
        assert_eq!(range(Some("bytes=50-1000"), 100), Ok(Some((50, 99))));
        assert_eq!(range(Some("bytes=0-1,5-6"), 100), Ok(None));
        assert_eq!(range(Some("items=0-1"), 100), Ok(None));
        assert_eq!(range(Some("bytes=100-"), 100), Err(Unsatisfiable));
        assert_eq!(range(Some("bytes=9-3"), 100), Err(Unsatisfiable));
        assert_eq!(range(Some("bytes=x-3"), 100), Err(Unsatisfiable));
    }

    #[test]
    fn the_slot_is_an_archive_the_kernel_reads_padded_to_the_slot() {
        let image = BootImage {
            path: PathBuf::new(),
            len: 1 << 20,
            slot_offset: 4096,
            slot_len: 4096,
            netboot: None,
        };
        let slot = image.slot(b"hello").unwrap();
        assert_eq!(slot.len(), 4096);
        assert!(slot.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&slot);
        assert!(text.contains("shepherd/boot-data\0"));
        assert!(text.contains("hello"));
        assert!(text.contains("TRAILER!!!"));
        assert!(
            image.slot(&vec![1u8; 5000]).is_err(),
            "too big for the slot"
        );
    }
}
