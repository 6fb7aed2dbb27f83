//! NVMe admin commands through the kernel's pass-through
//! (`NVME_IOCTL_ADMIN_CMD`): Identify, to learn whether and how a
//! namespace formats itself, and Format NVM with a secure erase.

use std::fs::File;
use std::io;

use crate::install::disk::Disk;

/// `struct nvme_passthru_cmd` (linux/nvme_ioctl.h).
#[repr(C)]
#[derive(Default)]
struct Cmd {
    opcode: u8,
    flags: u8,
    rsvd1: u16,
    nsid: u32,
    cdw2: u32,
    cdw3: u32,
    metadata: u64,
    addr: u64,
    metadata_len: u32,
    data_len: u32,
    cdw10: u32,
    cdw11: u32,
    cdw12: u32,
    cdw13: u32,
    cdw14: u32,
    cdw15: u32,
    timeout_ms: u32,
    result: u32,
}
// NVME_IOCTL_ID = _IO('N', 0x40); NVME_IOCTL_ADMIN_CMD = _IOWR('N', 0x41, 72 bytes)
const NVME_IOCTL_ID: libc::c_ulong = 0x4e40;
const NVME_IOCTL_ADMIN_CMD: libc::c_ulong = 0xc048_4e41;

fn admin(file: &File, cmd: &mut Cmd) -> io::Result<u32> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(file);
    // SAFETY: the ioctl reads and writes one `Cmd`, and the buffer its
    // `addr` names is `data_len` bytes the caller owns.
    let r = unsafe { libc::ioctl(fd, NVME_IOCTL_ADMIN_CMD as _, cmd as *mut Cmd) };
    match r {
        0 => Ok(cmd.result),
        r if r > 0 => Err(io::Error::other(format!(
            "the controller answered status {r:#x}"
        ))),
        _ => Err(io::Error::last_os_error()),
    }
}

fn identify(file: &File, nsid: u32, cns: u32) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    let mut cmd = Cmd {
        opcode: 0x06,
        nsid,
        addr: buf.as_mut_ptr() as u64,
        data_len: 4096,
        cdw10: cns,
        ..Cmd::default()
    };
    admin(file, &mut cmd)?;
    Ok(buf)
}

/// A namespace's Format NVM as the controller advertises it: namespace
/// `nsid` with its current LBA format `lbaf`; `ses` 1 (user data erase) or
/// 2 (cryptographic erase).
pub struct Format {
    pub nsid: u32,
    pub lbaf: u32,
    pub ses: u32,
}

/// The Format NVM the namespace `file` takes, or why it takes none.
pub fn advertised(disk: &Disk, file: &File) -> Result<Format, String> {
    let name = disk.path.display();
    let fd = std::os::fd::AsRawFd::as_raw_fd(file);
    // SAFETY: an ioctl without argument on a descriptor we own.
    let nsid = unsafe { libc::ioctl(fd, NVME_IOCTL_ID as _) };
    if nsid <= 0 {
        return Err(format!(
            "{name} is an NVMe controller, not a namespace: name the namespace (nvmeXnY)"
        ));
    }
    let ctrl = identify(file, 0, 1)
        .map_err(|e| format!("{name}: the NVMe Identify Controller failed: {e}"))?;
    let oacs = u16::from_le_bytes([ctrl[256], ctrl[257]]);
    let fna = ctrl[524];
    if oacs & 0b10 == 0 {
        return Err(format!(
            "{name}: the NVMe controller does not advertise Format NVM (OACS bit 1): erase it with overwrite"
        ));
    }
    let ns = identify(file, nsid as u32, 0)
        .map_err(|e| format!("{name}: the NVMe Identify Namespace failed: {e}"))?;
    let flbas = ns[26];
    let lbaf = u32::from(flbas & 0x0f) | (u32::from((flbas >> 5) & 0x3) << 4);
    // Cryptographic erase where advertised (FNA bit 2): the keys are
    // gone in an instant; else user data erase.
    let ses = if fna & 0b100 != 0 { 2 } else { 1 };
    Ok(Format {
        nsid: nsid as u32,
        lbaf,
        ses,
    })
}

/// Formats namespace `nsid` with LBA format `lbaf` and secure erase `ses`,
/// waiting at most `timeout` (at least 60 s).
pub fn format(
    file: &File,
    nsid: u32,
    lbaf: u32,
    ses: u32,
    timeout: std::time::Duration,
) -> io::Result<()> {
    let mut cmd = Cmd {
        opcode: 0x80,
        nsid,
        cdw10: (ses << 9) | (lbaf & 0x0f) | ((lbaf >> 4) << 12),
        // Large disks take minutes; the kernel's default is 60 s.
        timeout_ms: timeout.as_millis().clamp(60_000, u128::from(u32::MAX)) as u32,
        ..Cmd::default()
    };
    admin(file, &mut cmd).map(|_| ())
}
