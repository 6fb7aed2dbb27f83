//! The disks an image can go to: what they are (from sysfs), which one a
//! request's hints choose, and the writer that puts the image on it.
//!
//! The writer opens the disk with `O_DIRECT` (falling back to the page
//! cache where the target cannot do it, such as a file on tmpfs), writes
//! in large aligned blocks, flushes with fsync, and asks the kernel to
//! re-read the partition table. When an installation fails after the
//! first byte was written, both GPT copies (and the MBR) are wiped, so a
//! half-written or corrupt image never boots.
//!
//! Long on purpose: the disks as sysfs describes them, their selection
//! and the aligned writer share one `Disk` and its tests.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::api::DiskHints;

/// One disk the agent may write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Disk {
    /// `/dev/sda`, `/dev/nvme0n1`, or a file standing for a disk.
    pub path: PathBuf,
    pub size_bytes: u64,
    pub serial: Option<String>,
    /// Lower-case hexadecimal, without prefixes.
    pub wwn: Option<String>,
    pub model: Option<String>,
    /// Its `/dev/disk/by-path` names.
    pub by_path: Vec<String>,
    pub rotational: bool,
    /// The running system boots from it (or runs from it).
    pub boot: bool,
    pub logical_block_size: u32,
}

impl Disk {
    /// A regular file standing for a disk of `size_bytes` (the simulated
    /// floor's machines, tests): created sparse if absent.
    pub fn file(path: impl Into<PathBuf>, size_bytes: u64) -> io::Result<Disk> {
        let path = path.into();
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        if f.metadata()?.len() != size_bytes {
            f.set_len(size_bytes)?;
        }
        Ok(Disk {
            path,
            size_bytes,
            logical_block_size: 512,
            ..Disk::default()
        })
    }

    /// The block device at `path`, described from sysfs.
    pub fn probe(path: &Path) -> io::Result<Disk> {
        let meta = std::fs::metadata(path)?;
        if !meta.file_type().is_block_device() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a block device", path.display()),
            ));
        }
        let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
        let sys = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}"))?;
        let boot = boot_disks();
        Ok(describe(&sys, path.to_path_buf(), &boot))
    }

    fn summary(&self) -> String {
        let mut s = format!("{} ({}", self.path.display(), bytes(self.size_bytes));
        if let Some(m) = &self.model {
            s += &format!(", model {m:?}");
        }
        if let Some(m) = &self.serial {
            s += &format!(", serial {m:?}");
        }
        if self.boot {
            s += ", boot disk";
        }
        s + ")"
    }
}

/// `n` bytes for people: binary units, one decimal.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn read_trimmed(p: impl AsRef<Path>) -> Option<String> {
    let s = std::fs::read_to_string(p).ok()?;
    let s = s.trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// A WWN as hints and sysfs may spell it: `naa.5000c500…`, `0x5000…`,
/// `eui.…`, upper or lower case.
fn normalize_wwn(s: &str) -> String {
    let s = s.trim().to_ascii_lowercase();
    let s = s
        .strip_prefix("naa.")
        .or_else(|| s.strip_prefix("eui."))
        .or_else(|| s.strip_prefix("0x"))
        .unwrap_or(&s);
    s.chars().filter(|c| c.is_ascii_hexdigit()).collect()
}

fn describe(sys: &Path, path: PathBuf, boot: &[String]) -> Disk {
    let name = sys
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let sectors: u64 = read_trimmed(sys.join("size"))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let serial = read_trimmed(sys.join("device/serial"))
        .or_else(|| read_trimmed(sys.join("serial")))
        .or_else(|| {
            // SCSI: the unit serial number VPD page.
            let b = std::fs::read(sys.join("device/vpd_pg80")).ok()?;
            let s = String::from_utf8_lossy(b.get(4..)?).trim().to_string();
            (!s.is_empty()).then_some(s)
        });
    let wwn = read_trimmed(sys.join("wwid"))
        .or_else(|| read_trimmed(sys.join("device/wwid")))
        .map(|w| normalize_wwn(&w))
        .filter(|w| !w.is_empty());
    let by_path = std::fs::read_dir("/dev/disk/by-path")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    std::fs::canonicalize(e.path())
                        .map(|t| t == Path::new("/dev").join(&name))
                        .unwrap_or(false)
                })
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    Disk {
        path,
        size_bytes: sectors * 512,
        serial,
        wwn,
        model: read_trimmed(sys.join("device/model")),
        by_path,
        rotational: read_trimmed(sys.join("queue/rotational")).as_deref() == Some("1"),
        boot: boot.contains(&name),
        logical_block_size: read_trimmed(sys.join("queue/logical_block_size"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(512),
    }
}

/// The whole disks under the filesystems the running system uses (`/`,
/// `/boot`, `/usr`, and where this program runs from), by kernel name,
/// following partitions to their disk and device-mapper devices to what
/// they sit on.
pub fn boot_disks() -> Vec<String> {
    let mut paths = vec![PathBuf::from("/"), PathBuf::from("/boot"), "/usr".into()];
    if let Ok(exe) = std::env::current_exe() {
        paths.push(exe);
    }
    let mut out = Vec::new();
    for p in paths {
        let Ok(m) = std::fs::metadata(&p) else {
            continue;
        };
        let (major, minor) = (libc::major(m.dev()), libc::minor(m.dev()));
        if let Ok(sys) = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")) {
            disks_under(&sys, &mut out, 0);
        }
    }
    out
}

fn disks_under(sys: &Path, out: &mut Vec<String>, depth: u32) {
    if depth > 8 {
        return;
    }
    // A partition's directory sits in its disk's.
    let disk = if sys.join("partition").exists() {
        match sys.parent() {
            Some(p) => p.to_path_buf(),
            None => return,
        }
    } else {
        sys.to_path_buf()
    };
    let slaves: Vec<PathBuf> = std::fs::read_dir(disk.join("slaves"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::canonicalize(e.path()).ok())
                .collect()
        })
        .unwrap_or_default();
    if slaves.is_empty() {
        if let Some(n) = disk.file_name() {
            let n = n.to_string_lossy().into_owned();
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    for s in slaves {
        disks_under(&s, out, depth + 1);
    }
}

/// The machine's disks: every block device in /sys/block but for those
/// that stand for no hardware (RAM disks, zram, loop devices, optical and
/// floppy drives, device-mapper and md devices built on the real ones).
pub fn list() -> Vec<Disk> {
    let boot = boot_disks();
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut disks: Vec<Disk> = dir
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            !["ram", "zram", "loop", "sr", "fd", "dm-", "md", "nbd"]
                .iter()
                .any(|p| n.starts_with(p))
        })
        .filter_map(|e| {
            let sys = std::fs::canonicalize(e.path()).ok()?;
            let dev = Path::new("/dev").join(e.file_name());
            Some(describe(&sys, dev, &boot))
        })
        .filter(|d| d.size_bytes > 0)
        .collect();
    disks.sort_by(|a, b| a.path.cmp(&b.path));
    disks
}

/// The one disk of `disks` every hint matches; the boot disk only when
/// `allow_boot_disk`. The error says which disks matched, or which were
/// looked at.
pub fn select(
    disks: &[Disk],
    hints: Option<&DiskHints>,
    allow_boot_disk: bool,
) -> Result<Disk, String> {
    let default = DiskHints::default();
    let h = hints.unwrap_or(&default);
    let matched: Vec<&Disk> = disks.iter().filter(|d| matches(h, d)).collect();
    let candidates: Vec<&Disk> = matched
        .iter()
        .copied()
        .filter(|d| allow_boot_disk || !d.boot)
        .collect();
    let list = |v: &[&Disk]| v.iter().map(|d| d.summary()).collect::<Vec<_>>().join(", ");
    match candidates.as_slice() {
        [one] => Ok((*one).clone()),
        [] if disks.is_empty() => Err("the machine has no disk to write".into()),
        [] if !matched.is_empty() => Err(format!(
            "only the running system's boot disk matches the disk hints ({}), and the request does not allow writing it",
            list(&matched)
        )),
        [] => Err(format!(
            "no disk matches the disk hints ({}); the machine has {}",
            describe_hints(h),
            list(&disks.iter().collect::<Vec<_>>())
        )),
        many => Err(format!(
            "{} disks match the disk hints ({}), one must: {}",
            many.len(),
            describe_hints(h),
            list(many)
        )),
    }
}

/// Whether `d` matches every hint of `h` given.
pub fn matches(h: &DiskHints, d: &Disk) -> bool {
    (h.serial.is_empty() || d.serial.as_deref() == Some(h.serial.trim()))
        && (h.wwn.is_empty() || d.wwn.as_deref() == Some(normalize_wwn(&h.wwn).as_str()))
        && (h.model.is_empty() || d.model.as_deref().map(str::trim) == Some(h.model.trim()))
        && (h.by_path.is_empty() || {
            let want = h.by_path.trim_start_matches("/dev/disk/by-path/");
            d.by_path.iter().any(|p| p == want)
        })
        && h.min_size_bytes.is_none_or(|m| d.size_bytes as i64 >= m)
        && h.max_size_bytes.is_none_or(|m| d.size_bytes as i64 <= m)
        && h.rotational.is_none_or(|r| d.rotational == r)
}

/// The hints given, for people.
pub fn describe_hints(h: &DiskHints) -> String {
    let mut v = Vec::new();
    if !h.serial.is_empty() {
        v.push(format!("serial {:?}", h.serial));
    }
    if !h.wwn.is_empty() {
        v.push(format!("wwn {:?}", h.wwn));
    }
    if !h.model.is_empty() {
        v.push(format!("model {:?}", h.model));
    }
    if !h.by_path.is_empty() {
        v.push(format!("by-path {:?}", h.by_path));
    }
    if let Some(m) = h.min_size_bytes {
        v.push(format!("at least {}", bytes(m.max(0) as u64)));
    }
    if let Some(m) = h.max_size_bytes {
        v.push(format!("at most {}", bytes(m.max(0) as u64)));
    }
    if let Some(r) = h.rotational {
        v.push(if r { "rotational" } else { "not rotational" }.into());
    }
    if v.is_empty() {
        "none given".into()
    } else {
        v.join(", ")
    }
}

/// Writes are gathered into blocks of this size.
pub const WRITE_BLOCK: usize = 4 << 20;
const ALIGN: usize = 4096;

/// A buffer aligned for `O_DIRECT`.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// The buffer is owned memory, used by one thread at a time.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len, ALIGN).expect("layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes and uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in new with this layout.
        unsafe {
            std::alloc::dealloc(
                self.ptr,
                std::alloc::Layout::from_size_align(self.len, ALIGN).unwrap(),
            )
        }
    }
}

/// Why writing the disk failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("the image is larger than the disk {disk} ({size}): it needs more than {needed} bytes")]
    TooSmall {
        disk: String,
        size: String,
        needed: u64,
    },
    #[error("writing {disk} at byte {offset}: {source}")]
    Io {
        disk: String,
        offset: u64,
        source: io::Error,
    },
}

/// An open disk being written from its first byte on.
pub struct Target {
    file: File,
    disk: Disk,
    direct: bool,
    buf: AlignedBuf,
    fill: usize,
    /// Bytes on the disk so far.
    pos: u64,
    /// Whether anything was written (so a failure must wipe).
    touched: bool,
    /// Regions the old system may still write after the image (see
    /// [`Target::guard`]), with the image's bytes there once they passed.
    guards: Vec<Guard>,
}

/// A region of the disk to write again just before the reboot, with what
/// the image has there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    pub offset: u64,
    pub bytes: Vec<u8>,
}

/// The size of a guarded region: a filesystem's superblock lives in the
/// first 4 KiB of its partition (ext4 at 1024, XFS and btrfs's primary
/// copy within 64 KiB: 64 KiB covers them all).
pub const GUARD_LEN: usize = 64 << 10;

impl Target {
    /// Opens `disk` for writing: exclusively (a mounted disk refuses) unless
    /// it is the boot disk, whose filesystems are mounted by definition.
    pub fn open(disk: &Disk) -> Result<Target, String> {
        let open = |direct: bool| {
            let mut o = std::fs::OpenOptions::new();
            o.write(true);
            let mut flags = 0;
            if direct {
                flags |= libc::O_DIRECT;
            }
            let is_block = std::fs::metadata(&disk.path)
                .map(|m| m.file_type().is_block_device())
                .unwrap_or(false);
            if is_block && !disk.boot {
                flags |= libc::O_EXCL;
            }
            o.custom_flags(flags).open(&disk.path)
        };
        let (file, direct) = match open(true) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => match open(false) {
                Ok(f) => (f, false),
                Err(e) => return Err(open_error(disk, e)),
            },
            Err(e) => return Err(open_error(disk, e)),
        };
        Ok(Target {
            file,
            disk: disk.clone(),
            direct,
            buf: AlignedBuf::new(WRITE_BLOCK),
            fill: 0,
            pos: 0,
            touched: false,
            guards: Vec::new(),
        })
    }

    pub fn disk(&self) -> &Disk {
        &self.disk
    }

    /// Keeps the image's bytes at `offset` (`GUARD_LEN` of them) as they
    /// pass, to write them again just before the reboot: a filesystem of
    /// the running system mounted there may still write its superblock
    /// after the image was written (an error it records while reading the
    /// new data as its own, say).
    pub fn guard(&mut self, offset: u64) {
        self.guards.push(Guard {
            offset,
            bytes: Vec::new(),
        });
    }

    /// The guarded regions with the image's bytes there.
    pub fn guards(&self) -> Vec<Guard> {
        self.guards
            .iter()
            .filter(|g| !g.bytes.is_empty())
            .cloned()
            .collect()
    }

    /// Bytes handed to [`Target::write`] so far.
    pub fn written(&self) -> u64 {
        self.pos + self.fill as u64
    }

    pub fn write(&mut self, mut data: &[u8]) -> Result<(), WriteError> {
        while !data.is_empty() {
            let room = WRITE_BLOCK - self.fill;
            let n = room.min(data.len());
            self.buf.bytes_mut()[self.fill..self.fill + n].copy_from_slice(&data[..n]);
            self.fill += n;
            data = &data[n..];
            if self.fill == WRITE_BLOCK {
                self.flush_block()?;
            }
        }
        Ok(())
    }

    fn too_small(&self, needed: u64) -> WriteError {
        WriteError::TooSmall {
            disk: self.disk.path.display().to_string(),
            size: bytes(self.disk.size_bytes),
            needed,
        }
    }

    fn io(&self, offset: u64, source: io::Error) -> WriteError {
        WriteError::Io {
            disk: self.disk.path.display().to_string(),
            offset,
            source,
        }
    }

    /// Writes what is buffered at the current position (a whole block, or
    /// the tail).
    fn flush_block(&mut self) -> Result<(), WriteError> {
        let end = self.pos + self.fill as u64;
        if end > self.disk.size_bytes {
            return Err(self.too_small(self.disk.size_bytes));
        }
        let block = self.disk.logical_block_size.max(512) as usize;
        if self.direct && self.fill % block != 0 {
            // The tail is not a whole block: write it through the page
            // cache.
            clear_direct(&self.file);
            self.direct = false;
        }
        self.touched = true;
        let (pos, fill) = (self.pos, self.fill);
        // Keep what the image has in the guarded regions (assembled across
        // blocks: a region may straddle two).
        for g in &mut self.guards {
            let (from, to) = (g.offset, g.offset + GUARD_LEN as u64);
            if to <= pos || from >= end {
                continue;
            }
            if g.bytes.is_empty() {
                g.bytes = vec![0; GUARD_LEN];
            }
            let a = from.max(pos);
            let b = to.min(end);
            let src = &self.buf.bytes_mut()[(a - pos) as usize..(b - pos) as usize];
            g.bytes[(a - from) as usize..(b - from) as usize].copy_from_slice(src);
        }
        if let Err(e) = self.file.write_all_at(&self.buf.bytes_mut()[..fill], pos) {
            return Err(self.io(pos, e));
        }
        self.pos = end;
        self.fill = 0;
        Ok(())
    }

    /// Writes what is buffered, flushes the disk, and has the kernel read
    /// its new partition table. Returns the bytes written.
    pub fn finish(&mut self) -> Result<u64, WriteError> {
        if self.fill > 0 {
            self.flush_block()?;
        }
        if let Err(e) = self.file.sync_all() {
            return Err(self.io(self.pos, e));
        }
        Ok(self.pos)
    }

    /// The disk's size as the kernel says it (a file's length).
    pub fn size(&self) -> Option<u64> {
        size_of(&self.file)
    }

    /// Whether anything reached the disk.
    pub fn touched(&self) -> bool {
        self.touched
    }

    /// Asks the kernel to re-read the partition table (block devices only;
    /// a busy boot disk keeps its old view until the reboot).
    pub fn reread_partitions(&self) -> Result<(), String> {
        reread_partitions(&self.file, &self.disk)
    }

    /// Wipes the partition tables this disk may carry now; see [`wipe`].
    pub fn wipe(&mut self) -> Result<(), String> {
        self.fill = 0;
        wipe(&self.file, &self.disk)
    }
}

fn open_error(disk: &Disk, e: io::Error) -> String {
    if e.raw_os_error() == Some(libc::EBUSY) {
        format!(
            "cannot open {} for writing: it is in use (mounted, or held by another device)",
            disk.path.display()
        )
    } else {
        format!("cannot open {} for writing: {e}", disk.path.display())
    }
}

/// Writes the guarded regions again, with `O_DIRECT` and a flush: the last
/// writes before the reboot, so nothing of the old system lands after them.
pub fn rewrite(path: &Path, guards: &[Guard]) -> Result<(), String> {
    let open = |flags| {
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(flags)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))
    };
    let direct = open(libc::O_DIRECT).ok();
    let buffered = open(0)?;
    let mut buf = AlignedBuf::new(GUARD_LEN);
    for g in guards {
        buf.bytes_mut()[..g.bytes.len()].copy_from_slice(&g.bytes);
        let data = &buf.bytes_mut()[..g.bytes.len()];
        // Partitions start on sector boundaries; anything else goes
        // through the page cache, flushed below.
        let written = match &direct {
            Some(f) if g.offset % 512 == 0 => f.write_all_at(data, g.offset),
            _ => buffered.write_all_at(data, g.offset),
        };
        written.map_err(|e| format!("rewriting {} at byte {}: {e}", path.display(), g.offset))?;
    }
    buffered
        .sync_all()
        .map_err(|e| format!("flushing {}: {e}", path.display()))
}

/// The starting bytes of the partitions of `disk` (a whole disk's device
/// path) on which a filesystem is mounted read-write or was (the running
/// system's).
pub fn mounted_partition_starts(disk: &Path) -> Vec<u64> {
    let Some(name) = disk.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Vec::new();
    };
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut starts = Vec::new();
    for l in mounts.lines() {
        let Some(dev) = l.split_whitespace().next() else {
            continue;
        };
        let Some(part) = dev.strip_prefix("/dev/") else {
            continue;
        };
        // The partition of this disk (its directory sits in the disk's).
        let sys = Path::new("/sys/block").join(&name).join(part);
        let start = match read_trimmed(sys.join("start")).and_then(|s| s.parse::<u64>().ok()) {
            Some(s) => s * 512,
            None if part == name => 0,
            None => continue,
        };
        if !starts.contains(&start) {
            starts.push(start);
        }
    }
    starts
}

/// Zeroes the first and the last MiB of the disk: the MBR, both GPT
/// headers and their partition arrays. Then nothing boots from it and no
/// partition of the failed image is found.
pub fn wipe(file: &File, disk: &Disk) -> Result<(), String> {
    const SPAN: u64 = 1 << 20;
    let size = disk.size_bytes;
    let zero = vec![0u8; SPAN.min(size) as usize];
    // No alignment to honour for these writes.
    clear_direct(file);
    for at in [0, size.saturating_sub(SPAN)] {
        file.write_all_at(&zero, at)
            .map_err(|e| format!("wiping {} at byte {at}: {e}", disk.path.display()))?;
    }
    file.sync_all()
        .map_err(|e| format!("flushing {}: {e}", disk.path.display()))?;
    let _ = reread_partitions(file, disk);
    Ok(())
}

/// Turns `O_DIRECT` off on `file`.
fn clear_direct(file: &File) {
    let fd = std::os::fd::AsRawFd::as_raw_fd(file);
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_DIRECT);
        }
    }
}

/// A block device's size as the kernel says it; a regular file's length.
pub fn size_of(f: &File) -> Option<u64> {
    let meta = f.metadata().ok()?;
    if !meta.file_type().is_block_device() {
        return Some(meta.len());
    }
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x80081272;
    let mut size: u64 = 0;
    let fd = std::os::fd::AsRawFd::as_raw_fd(f);
    // SAFETY: the ioctl writes one u64 into `size`.
    let r = unsafe { libc::ioctl(fd, BLKGETSIZE64 as _, &mut size) };
    (r == 0).then_some(size)
}

/// Asks the kernel to re-read `disk`'s partition table (block devices).
pub fn reread(file: &File, disk: &Disk) -> Result<(), String> {
    reread_partitions(file, disk)
}

fn reread_partitions(file: &File, disk: &Disk) -> Result<(), String> {
    let is_block = file
        .metadata()
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false);
    if !is_block {
        return Ok(());
    }
    // BLKRRPART = _IO(0x12, 95)
    const BLKRRPART: libc::c_ulong = 0x125f;
    let fd = std::os::fd::AsRawFd::as_raw_fd(file);
    // SAFETY: an ioctl without argument on an fd we own.
    let r = unsafe { libc::ioctl(fd, BLKRRPART as _) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(format!(
            "the kernel did not re-read the partition table of {}: {e}",
            disk.path.display()
        ));
    }
    Ok(())
}
