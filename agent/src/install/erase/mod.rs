//! Erasing disks for the next tenant (`DiskErasure`): what the last one
//! wrote must not be readable afterwards, and the agent proves it by
//! reading back before it reports success.
//!
//! Modes:
//! - metadata: zeros over both ends of the disk, of every partition its
//!   tables list (GPTs from either copy, MBRs with their logical
//!   partitions) and of every volume nested in those (`layers.rs`: md
//!   arrays, LVM logical volumes), over LUKS2's second header wherever its
//!   first says (`luks.rs`), and over any signature libblkid would find
//!   past those ends (`signatures.rs`); every byte written read back, and
//!   every volume probed again (`metadata.rs`).
//! - discard: `BLKSECDISCARD` over the whole disk where the disk takes it
//!   (eMMC, mostly), else `BLKDISCARD`, where the disk advertises discard;
//!   then both ends and random samples read back as zeros (a disk that
//!   keeps discarded data fails here).
//! - secure: the disk's own erase, where the disk advertises it: NVMe Format
//!   with user data (or cryptographic) erase, ATA Security Erase (enhanced
//!   where offered), SCSI SANITIZE (cryptographic erase, block erase or
//!   overwrite). These need not leave zeros (a cryptographic erase leaves
//!   what no key decrypts), so the samples are read before and after: each
//!   must read as zeros or differ from what it held.
//! - overwrite: zeros over every block; then sampled.
//!
//! Every disk chosen is checked for its mode before any is erased. The
//! kernel and disk operations go through [`DiskOps`], so that a disk which
//! says it erased and did not can be stood for in tests.
//!
//! Here: choosing the disks, the modes, reading back, progress. Beside it:
//! `kernel.rs` ([`Kernel`], the machine's own [`DiskOps`]), `secure.rs`
//! (what a disk's own erase is and how it is run: ATA Security Erase and
//! SCSI SANITIZE through `install::sg`), `nvme.rs` (NVMe Format through the
//! admin pass-through). The partition tables a metadata erase follows are
//! read by `install::partitions`.

mod kernel;
mod layers;
mod luks;
pub mod metadata;
mod nvme;
mod secure;
pub mod signatures;

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::Rng as _;

use super::Counters;
use super::disk::{self, Disk};
use crate::api::disk_erasure::Mode;
use crate::api::{DiskErasure, DiskHints};

/// The partitions (byte ranges) of a disk: its GPT's, its MBR's, the kernel's.
pub use super::partitions::byte_ranges as partitions;
pub use kernel::Kernel;
pub use secure::SecureErase;

const MIB: u64 = 1 << 20;
/// What is zeroed at each end of a disk and of each partition.
pub const END_SPAN: u64 = MIB;
/// Random samples read back per disk after a whole-disk erase, each
/// [`SAMPLE_LEN`] long, besides both ends.
pub const SAMPLES: usize = 256;
pub const SAMPLE_LEN: usize = 64 << 10;
/// Discards are issued in pieces this large (progress between them).
const DISCARD_STEP: u64 = 1 << 30;

/// The kernel's and the disk's own operations an erasure asks for.
pub trait DiskOps: Send + Sync {
    /// Whether `disk` can be discarded; the error says why not.
    fn can_discard(&self, disk: &Disk, file: &File) -> Result<(), String>;
    /// Discards `len` bytes from `offset`; `secure`: so that no copy of
    /// them stays anywhere on the disk (`BLKSECDISCARD`), which most disks
    /// refuse (EOPNOTSUPP).
    fn discard(&self, file: &File, offset: u64, len: u64, secure: bool) -> io::Result<()>;
    /// How `disk` erases itself, or why it cannot.
    fn secure_erase(&self, disk: &Disk, file: &File) -> Result<SecureErase, String>;
    /// Carries out `how` on `disk`, waiting at most `timeout`, telling
    /// `progress` how many bytes are erased where the disk says (SCSI
    /// SANITIZE does; NVMe Format and ATA Security Erase do not).
    fn run_secure_erase(
        &self,
        disk: &Disk,
        file: &File,
        how: &SecureErase,
        timeout: Duration,
        progress: &dyn Fn(u64),
    ) -> Result<(), String>;
}

/// Whether `e` is a disk's (or the kernel's) no to a secure discard:
/// EOPNOTSUPP from a disk without it, EINVAL or ENOTTY from older kernels.
fn refuses_secure_discard(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::EINVAL | libc::ENOTTY)
    )
}

/// One disk erased.
#[derive(Debug, Clone)]
pub struct ErasedDisk {
    pub disk: String,
    /// Bytes the erase covered.
    pub bytes: u64,
    /// Bytes read back (as zeros, or changed by a secure erase).
    pub checked: u64,
    /// How: "metadata: 6 regions", "NVMe Format …".
    pub how: String,
}

/// What an erasure did.
#[derive(Debug, Clone)]
pub struct Erased {
    pub disks: Vec<ErasedDisk>,
    pub seconds: f64,
}

impl std::fmt::Display for Erased {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let each: Vec<String> = self
            .disks
            .iter()
            .map(|d| {
                format!(
                    "{} ({}, {} erased, {} read back)",
                    d.disk,
                    d.how,
                    disk::bytes(d.bytes),
                    disk::bytes(d.checked)
                )
            })
            .collect();
        write!(f, "erased {} in {:.1} s", each.join(", "), self.seconds)
    }
}

pub use shepherd_proto::names::erase_mode_name as mode_name;

/// The disks `req` chooses: every disk matching all its hints, the boot
/// disk only when allowed. The error names what matched.
pub fn choose(disks: &[Disk], req: &DiskErasure) -> Result<Vec<Disk>, String> {
    let default = DiskHints::default();
    let h = req.disk.as_ref().unwrap_or(&default);
    let matched: Vec<&Disk> = disks.iter().filter(|d| disk::matches(h, d)).collect();
    let chosen: Vec<Disk> = matched
        .iter()
        .filter(|d| req.allow_boot_disk || !d.boot)
        .map(|d| (*d).clone())
        .collect();
    if !chosen.is_empty() {
        return Ok(chosen);
    }
    if disks.is_empty() {
        return Err("the machine has no disk to erase".into());
    }
    if !matched.is_empty() {
        return Err(format!(
            "only the running system's boot disk matches ({}), and the request does not allow erasing it",
            matched
                .iter()
                .map(|d| d.path.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Err(format!(
        "no disk matches the disk hints ({}); the machine has {}",
        disk::describe_hints(h),
        disks
            .iter()
            .map(|d| format!("{} ({})", d.path.display(), disk::bytes(d.size_bytes)))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

fn open(d: &Disk) -> Result<File, String> {
    // Exclusive for block devices: a mounted disk (or one held by md or
    // LVM) refuses, unless it is the boot disk, whose filesystems are
    // mounted by definition.
    let flags = if d.boot { 0 } else { libc::O_EXCL };
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags)
        .open(&d.path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::EBUSY) {
                format!(
                    "cannot open {} to erase it: it is in use (mounted, or held by md or LVM)",
                    d.path.display()
                )
            } else {
                format!("cannot open {} to erase it: {e}", d.path.display())
            }
        })
}

/// Erases the disks `req` chooses of `disks`, checking each mode against
/// every disk first. Blocking: run it on a thread of its own.
pub fn erase(
    req: &DiskErasure,
    disks: &[Disk],
    ops: &dyn DiskOps,
    counters: &Counters,
    deadline: Duration,
    log: &(dyn Fn(std::fmt::Arguments<'_>) + Send + Sync),
) -> Result<Erased, String> {
    let started = Instant::now();
    let mode = Mode::try_from(req.mode)
        .map_err(|_| format!("the erase mode {} is not one this agent knows", req.mode))?;
    let chosen = choose(disks, req)?;
    // Open and check every disk before erasing any.
    let mut plan = Vec::new();
    for d in &chosen {
        let file = open(d)?;
        let size = disk::size_of(&file).unwrap_or(d.size_bytes);
        let mut d = d.clone();
        d.size_bytes = size;
        // A secure erase: how, and what its samples held before (read
        // before anything is erased, to tell that it changed).
        let secure = match mode {
            Mode::Discard => {
                ops.can_discard(&d, &file)?;
                None
            }
            Mode::Secure => {
                let how = ops.secure_erase(&d, &file)?;
                if let Some(m) = how.minutes()
                    && Duration::from_secs(u64::from(m) * 60) > deadline
                {
                    return Err(format!(
                        "{}: the disk says its {} takes {m} min, longer than the erasure's deadline of {}: \
                         ask again with a longer deadline",
                        d.path.display(),
                        how.name(),
                        humantime::format_duration(deadline)
                    ));
                }
                Some((how, Before::read(&file, &d)?))
            }
            _ => None,
        };
        // Read before anything is erased: the partition tables (and the
        // volumes in them) say where, and where to probe afterwards. Not
        // for a secure erase, which may leave noise that looks like a
        // magic.
        let volumes = if mode == Mode::Secure {
            Vec::new()
        } else {
            metadata::volumes(&file, &d)
        };
        let spans = if mode == Mode::Metadata {
            metadata::regions(&file, &volumes)
        } else {
            vec![(0, d.size_bytes)]
        };
        plan.push((d, file, secure, spans, volumes));
    }
    let total: u64 = plan
        .iter()
        .flat_map(|p| p.3.iter().map(|r| r.1 - r.0))
        .sum();
    counters.total.store(total, Ordering::Relaxed);
    counters.set_phase(crate::api::installation_progress::Phase::Erasing);
    let mut done = Vec::new();
    for (d, file, secure, spans, volumes) in plan {
        counters.set_disk(&d.path.display().to_string());
        let over = || {
            if started.elapsed() > deadline {
                Err(format!(
                    "the erasure did not finish within its deadline of {}",
                    humantime::format_duration(deadline)
                ))
            } else {
                Ok(())
            }
        };
        log(format_args!(
            "erasing {} ({}) with {}",
            d.path.display(),
            disk::bytes(d.size_bytes),
            mode_name(mode)
        ));
        let e = match mode {
            Mode::Metadata => metadata::erase(&file, &d, &volumes, &spans, counters)?,
            Mode::Overwrite => {
                let e = overwrite(&file, &d, counters, &over)?;
                metadata::check(&file, &d, &volumes, "the overwrite")?;
                e
            }
            Mode::Discard => {
                let mut at = 0;
                // Secure where the disk takes it: it says so by refusing
                // the first piece, before anything is discarded.
                let mut secure_discard = true;
                while at < d.size_bytes {
                    over()?;
                    let len = DISCARD_STEP.min(d.size_bytes - at);
                    let mut r = ops.discard(&file, at, len, secure_discard);
                    if secure_discard && at == 0 && r.as_ref().is_err_and(refuses_secure_discard) {
                        secure_discard = false;
                        r = ops.discard(&file, at, len, false);
                    }
                    r.map_err(|e| format!("discarding {} at byte {at}: {e}", d.path.display()))?;
                    at += len;
                    counters.written.fetch_add(len, Ordering::Relaxed);
                }
                let checked = sample(&file, &d, "discarded")?;
                metadata::check(&file, &d, &volumes, "the discard")?;
                ErasedDisk {
                    disk: d.path.display().to_string(),
                    bytes: d.size_bytes,
                    checked,
                    how: if secure_discard {
                        "discarded (BLKSECDISCARD)"
                    } else {
                        "discarded (BLKDISCARD)"
                    }
                    .into(),
                }
            }
            Mode::Secure => {
                let (how, before) = secure.expect("checked above");
                log(format_args!("{}: {how}", d.path.display()));
                over()?;
                // What the disks before this one erased, plus what this
                // one says it has.
                let base = counters.written.load(Ordering::Relaxed);
                let progress = |done: u64| {
                    let done = done.min(d.size_bytes);
                    counters.written.store(base + done, Ordering::Relaxed);
                };
                let left = deadline.saturating_sub(started.elapsed());
                ops.run_secure_erase(&d, &file, &how, left, &progress)?;
                counters
                    .written
                    .store(base + d.size_bytes, Ordering::Relaxed);
                let checked = before.compare(&file, &d, &how.to_string())?;
                ErasedDisk {
                    disk: d.path.display().to_string(),
                    bytes: d.size_bytes,
                    checked,
                    how: how.to_string(),
                }
            }
        };
        let _ = disk::reread(&file, &d);
        done.push(e);
    }
    counters.set_phase(crate::api::installation_progress::Phase::Done);
    Ok(Erased {
        disks: done,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn overwrite(
    file: &File,
    d: &Disk,
    counters: &Counters,
    over: &dyn Fn() -> Result<(), String>,
) -> Result<ErasedDisk, String> {
    let name = d.path.display();
    // O_DIRECT where the disk allows it: a pass over the whole disk would
    // otherwise go through (and evict) the page cache. Not O_EXCL: `file`
    // holds the disk exclusively already, and a second exclusive open of
    // it would fail (and fall back to the page cache).
    let direct = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&d.path)
        .ok();
    let mut buf = disk::AlignedBuf::new(disk::WRITE_BLOCK);
    let zero = buf.bytes_mut();
    let mut at = 0u64;
    while at < d.size_bytes {
        over()?;
        let n = (d.size_bytes - at).min(zero.len() as u64) as usize;
        let r = match &direct {
            Some(f) if n % 4096 == 0 => f.write_all_at(&zero[..n], at),
            _ => file.write_all_at(&zero[..n], at),
        };
        r.map_err(|e| format!("overwriting {name} at byte {at}: {e}"))?;
        at += n as u64;
        counters.written.fetch_add(n as u64, Ordering::Relaxed);
    }
    if let Some(f) = &direct {
        f.sync_all().map_err(|e| format!("flushing {name}: {e}"))?;
    }
    file.sync_all()
        .map_err(|e| format!("flushing {name}: {e}"))?;
    let checked = sample(file, d, "overwritten")?;
    Ok(ErasedDisk {
        disk: name.to_string(),
        bytes: d.size_bytes,
        checked,
        how: "overwritten with zeros".into(),
    })
}

/// Drops the disk's cached pages, so that reads come from the disk.
fn drop_cache(file: &File) {
    let fd = std::os::fd::AsRawFd::as_raw_fd(file);
    // BLKFLSBUF = _IO(0x12, 97): flushes and drops a block device's buffers.
    const BLKFLSBUF: libc::c_ulong = 0x1261;
    // SAFETY: ioctl and fadvise on a descriptor we own, no pointers.
    unsafe {
        libc::ioctl(fd, BLKFLSBUF as _);
        libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// Both ends of the disk and [`SAMPLES`] random blocks read back as zeros.
/// Returns the bytes checked.
fn sample(file: &File, d: &Disk, what: &str) -> Result<u64, String> {
    drop_cache(file);
    let mut checked = 0;
    for (at, len) in places(d.size_bytes) {
        checked += check_zero(file, d, at, len, what)?;
    }
    Ok(checked)
}

/// Where a whole-disk erase is read back, as `(offset, length)`: both ends
/// ([`END_SPAN`] each) and [`SAMPLES`] random blocks of [`SAMPLE_LEN`].
fn places(size: u64) -> Vec<(u64, u64)> {
    let tail = size.saturating_sub(END_SPAN);
    let mut places = vec![(0, END_SPAN.min(size)), (tail, size - tail)];
    let len = SAMPLE_LEN as u64;
    if size > len {
        let mut rng = rand::rng();
        let blocks = size / len;
        places.extend((0..SAMPLES).map(|_| (rng.random_range(0..blocks) * len, len)));
    }
    places
}

/// Reads `[at, at + len)` and fails naming the first byte that is not zero.
fn check_zero(file: &File, d: &Disk, at: u64, len: u64, what: &str) -> Result<u64, String> {
    let mut buf = vec![0u8; (len.min(4 * MIB)) as usize];
    let mut pos = at;
    while pos < at + len {
        let n = (at + len - pos).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], pos)
            .map_err(|e| format!("reading {} back at byte {pos}: {e}", d.path.display()))?;
        if let Some(i) = buf[..n].iter().position(|b| *b != 0) {
            return Err(format!(
                "{} was {what} but still holds data at byte {}: the disk said it erased and did not \
                 (its blocks are not to be trusted to the next tenant; erase it with overwrite)",
                d.path.display(),
                pos + i as u64
            ));
        }
        pos += n as u64;
    }
    Ok(len)
}

/// What a secure erase's samples held before it: both ends of the disk and
/// [`SAMPLES`] random blocks, by their SHA-256.
struct Before {
    places: Vec<(u64, u64)>,
    digests: Vec<[u8; 32]>,
}

impl Before {
    fn read(file: &File, d: &Disk) -> Result<Before, String> {
        let places = places(d.size_bytes);
        let digests = places
            .iter()
            .map(|&(at, len)| Ok(digest(&read_span(file, d, at, len)?)))
            .collect::<Result<_, String>>()?;
        Ok(Before { places, digests })
    }

    /// Every place reads as zeros or differs from what it held. Returns
    /// the bytes read.
    fn compare(&self, file: &File, d: &Disk, what: &str) -> Result<u64, String> {
        drop_cache(file);
        let mut checked = 0;
        for (&(at, len), was) in self.places.iter().zip(&self.digests) {
            let now = read_span(file, d, at, len)?;
            if now.iter().any(|b| *b != 0) && digest(&now) == *was {
                return Err(format!(
                    "{} was erased ({what}) but still holds what it held before at bytes {at}..{}: \
                     the disk said it erased and did not (its blocks are not to be trusted to the next \
                     tenant; erase it with overwrite)",
                    d.path.display(),
                    at + len
                ));
            }
            checked += len;
        }
        Ok(checked)
    }
}

fn read_span(file: &File, d: &Disk, at: u64, len: u64) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, at)
        .map_err(|e| format!("reading {} at byte {at}: {e}", d.path.display()))?;
    Ok(buf)
}

fn digest(b: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(b).into()
}
