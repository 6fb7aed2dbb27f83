//! The machine's own kernel and disks as an erasure's [`DiskOps`]:
//! discard through `BLKDISCARD`/`BLKSECDISCARD` where sysfs says the disk
//! takes it, and the disk's own erase through `secure.rs`.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::time::Duration;

use super::DiskOps;
use super::secure::{self, SecureErase};
use crate::install::disk::Disk;

/// The machine's own kernel and disks.
pub struct Kernel;

impl DiskOps for Kernel {
    fn can_discard(&self, disk: &Disk, file: &File) -> Result<(), String> {
        let meta = file
            .metadata()
            .map_err(|e| format!("{}: {e}", disk.path.display()))?;
        if !meta.file_type().is_block_device() {
            return Err(format!(
                "{} is not a block device: it cannot be discarded",
                disk.path.display()
            ));
        }
        let sys = format!(
            "/sys/dev/block/{}:{}/queue/discard_max_bytes",
            libc::major(meta.rdev()),
            libc::minor(meta.rdev())
        );
        let max: u64 = std::fs::read_to_string(&sys)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if max == 0 {
            return Err(format!(
                "{} does not advertise discard (its queue/discard_max_bytes is 0): erase it with overwrite",
                disk.path.display()
            ));
        }
        Ok(())
    }

    fn discard(&self, file: &File, offset: u64, len: u64, secure: bool) -> io::Result<()> {
        // BLKDISCARD = _IO(0x12, 119), BLKSECDISCARD = _IO(0x12, 125)
        const BLKDISCARD: libc::c_ulong = 0x1277;
        const BLKSECDISCARD: libc::c_ulong = 0x127d;
        let request = if secure { BLKSECDISCARD } else { BLKDISCARD };
        let range: [u64; 2] = [offset, len];
        let fd = std::os::fd::AsRawFd::as_raw_fd(file);
        // SAFETY: the ioctl reads two u64 from `range`.
        let r = unsafe { libc::ioctl(fd, request as _, range.as_ptr()) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn secure_erase(&self, disk: &Disk, file: &File) -> Result<SecureErase, String> {
        secure::advertised(disk, file)
    }

    fn run_secure_erase(
        &self,
        disk: &Disk,
        file: &File,
        how: &SecureErase,
        timeout: Duration,
        progress: &dyn Fn(u64),
    ) -> Result<(), String> {
        secure::run(disk, file, how, timeout, progress)
    }
}
