//! The disks' own erase commands through the kernel's SCSI generic
//! interface (`SG_IO`): ATA Security Erase on ATA disks (by ATA
//! PASS-THROUGH (16), which libata translates), and SANITIZE on SCSI and
//! SAS disks. Building commands and reading answers are plain functions,
//! tested without a disk; only [`sg_io`] talks to the kernel.
//!
//! Long on purpose: the SCSI and ATA commands and their answers, laid
//! out byte by byte as SAT-4/SBC-4 give them, with their tests.

use std::fs::File;
use std::io;
use std::time::Duration;

/// The password shepherd sets for the length of an ATA Security Erase.
/// The disk clears it when the erase completes; if the machine loses power
/// mid-erase, the disk stays locked with it, and `hdparm --user-master u
/// --security-unlock shepherd` (then `--security-disable`) frees it. It
/// guards nothing, so it is no secret; it is named in every error.
pub const ATA_PASSWORD: &str = "shepherd";

/// `struct sg_io_hdr` (scsi/sg.h).
#[repr(C)]
struct SgIoHdr {
    interface_id: libc::c_int,
    dxfer_direction: libc::c_int,
    cmd_len: u8,
    mx_sb_len: u8,
    iovec_count: u16,
    dxfer_len: u32,
    dxferp: *mut libc::c_void,
    cmdp: *const u8,
    sbp: *mut u8,
    timeout: u32,
    flags: u32,
    pack_id: libc::c_int,
    usr_ptr: *mut libc::c_void,
    status: u8,
    masked_status: u8,
    msg_status: u8,
    sb_len_wr: u8,
    host_status: u16,
    driver_status: u16,
    resid: libc::c_int,
    duration: u32,
    info: u32,
}

const SG_IO: libc::c_ulong = 0x2285;
const SG_DXFER_NONE: libc::c_int = -1;
const SG_DXFER_TO_DEV: libc::c_int = -2;
const SG_DXFER_FROM_DEV: libc::c_int = -3;

/// Data a command moves.
pub enum Data<'a> {
    None,
    In(&'a mut [u8]),
    Out(&'a [u8]),
}

/// Fixed or descriptor sense data, reduced to what says why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
    /// The progress indication of an operation under way (of 65536), where
    /// the sense-key specific field holds one (SKSV set, key NOT READY or
    /// NO SENSE).
    pub progress: Option<u16>,
}

impl Sense {
    pub fn parse(b: &[u8]) -> Option<Sense> {
        let (key, asc, ascq, specific) = match b.first()? & 0x7f {
            // Fixed: the sense-key specific field at bytes 15..18.
            0x70 | 0x71 if b.len() >= 14 => (b[2] & 0x0f, b[12], b[13], b.get(15..18)),
            // Descriptor: a sense-key specific descriptor (type 02h) among
            // those from byte 8 holds it at its bytes 4..7.
            0x72 | 0x73 if b.len() >= 4 => {
                let mut specific = None;
                let mut at = 8;
                while let (Some(&kind), Some(&len)) = (b.get(at), b.get(at + 1)) {
                    if kind == 0x02 {
                        specific = b.get(at + 4..at + 7);
                        break;
                    }
                    at += 2 + usize::from(len);
                }
                (b[1] & 0x0f, b[2], b[3], specific)
            }
            _ => return None,
        };
        let progress = match specific {
            Some(s) if s[0] & 0x80 != 0 && matches!(key, 0x0 | 0x2) => {
                Some(u16::from_be_bytes([s[1], s[2]]))
            }
            _ => None,
        };
        Some(Sense {
            key,
            asc,
            ascq,
            progress,
        })
    }

    /// LOGICAL UNIT NOT READY, SANITIZE IN PROGRESS.
    pub fn sanitizing(&self) -> bool {
        (self.key, self.asc, self.ascq) == (0x2, 0x04, 0x1b)
    }

    /// The disk does not know the command or a field of it (ILLEGAL
    /// REQUEST): it does not have what was asked.
    pub fn illegal_request(&self) -> bool {
        self.key == 0x5
    }
}

impl std::fmt::Display for Sense {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = match self.key {
            0x0 => "no sense",
            0x1 => "recovered error",
            0x2 => "not ready",
            0x3 => "medium error",
            0x4 => "hardware error",
            0x5 => "illegal request",
            0x6 => "unit attention",
            0x7 => "data protect",
            0xb => "aborted command",
            _ => "sense",
        };
        write!(
            f,
            "{key} (sense key {:#x}, ASC/ASCQ {:02x}/{:02x})",
            self.key, self.asc, self.ascq
        )
    }
}

/// Why a command did not succeed.
#[derive(Debug)]
pub enum SgError {
    /// The ioctl itself failed (not a SCSI generic device, no permission).
    Io(io::Error),
    /// The disk answered CHECK CONDITION.
    Check(Sense),
    /// The disk was still at work when the time allowed ran out: of 65536,
    /// how far it said it had come.
    StillRunning { progress: Option<u16> },
    /// Another SCSI status, or the host adapter or driver failed it.
    Status { status: u8, host: u16, driver: u16 },
}

impl std::fmt::Display for SgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SgError::Io(e) => write!(f, "SG_IO: {e}"),
            SgError::Check(s) => write!(f, "the disk answered {s}"),
            SgError::StillRunning { progress } => {
                write!(f, "the disk was still at it when its time ran out")?;
                if let Some(p) = progress {
                    write!(f, " ({}% done)", u32::from(*p) * 100 / 65536)?;
                }
                write!(
                    f,
                    "; it goes on by itself, and answers NOT READY until it has ended"
                )
            }
            SgError::Status {
                status,
                host,
                driver,
            } => write!(
                f,
                "SCSI status {status:#x}, host status {host:#x}, driver status {driver:#x}"
            ),
        }
    }
}

/// Sends `cdb` to the disk open as `file`, waiting at most `timeout`.
pub fn sg_io(file: &File, cdb: &[u8], data: Data<'_>, timeout: Duration) -> Result<(), SgError> {
    let mut sense = [0u8; 64];
    let (dir, ptr, len) = match data {
        Data::None => (SG_DXFER_NONE, std::ptr::null_mut(), 0),
        Data::In(b) => (SG_DXFER_FROM_DEV, b.as_mut_ptr().cast(), b.len()),
        Data::Out(b) => (SG_DXFER_TO_DEV, b.as_ptr() as *mut libc::c_void, b.len()),
    };
    let mut hdr = SgIoHdr {
        interface_id: b'S' as libc::c_int,
        dxfer_direction: dir,
        cmd_len: cdb.len() as u8,
        mx_sb_len: sense.len() as u8,
        iovec_count: 0,
        dxfer_len: len as u32,
        dxferp: ptr,
        cmdp: cdb.as_ptr(),
        sbp: sense.as_mut_ptr(),
        timeout: timeout.as_millis().min(u128::from(u32::MAX - 1)) as u32,
        flags: 0,
        pack_id: 0,
        usr_ptr: std::ptr::null_mut(),
        status: 0,
        masked_status: 0,
        msg_status: 0,
        sb_len_wr: 0,
        host_status: 0,
        driver_status: 0,
        resid: 0,
        duration: 0,
        info: 0,
    };
    let fd = std::os::fd::AsRawFd::as_raw_fd(file);
    // SAFETY: the header points at `cdb`, `sense` and the data buffer, all
    // alive and as long as it says for the length of the call.
    let r = unsafe { libc::ioctl(fd, SG_IO as _, &mut hdr as *mut SgIoHdr) };
    if r != 0 {
        return Err(SgError::Io(io::Error::last_os_error()));
    }
    if hdr.status == 0x02 || (hdr.driver_status & 0x08) != 0 {
        let n = usize::from(hdr.sb_len_wr).min(sense.len());
        if let Some(s) = Sense::parse(&sense[..n]) {
            return Err(SgError::Check(s));
        }
    }
    if hdr.status != 0 || hdr.host_status != 0 || (hdr.driver_status & 0x0f) != 0 {
        return Err(SgError::Status {
            status: hdr.status,
            host: hdr.host_status,
            driver: hdr.driver_status,
        });
    }
    Ok(())
}

/// ATA commands, through ATA PASS-THROUGH (16) (SAT-4).
pub mod ata {
    use super::*;

    pub const IDENTIFY_DEVICE: u8 = 0xec;
    pub const SECURITY_SET_PASSWORD: u8 = 0xf1;
    pub const SECURITY_ERASE_PREPARE: u8 = 0xf3;
    pub const SECURITY_ERASE_UNIT: u8 = 0xf4;

    /// How a command moves its data.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub enum Protocol {
        NonData,
        PioIn,
        PioOut,
    }

    /// The ATA PASS-THROUGH (16) CDB for a 28-bit `command` moving at most
    /// one 512-byte block.
    pub fn cdb(protocol: Protocol, command: u8) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[0] = 0x85;
        let (proto, flags, count) = match protocol {
            // T_LENGTH 0: no data.
            Protocol::NonData => (3u8, 0x00u8, 0u8),
            // T_DIR from the device, BYT_BLOK blocks, T_LENGTH in the
            // sector count: one 512-byte block.
            Protocol::PioIn => (4, 0x0e, 1),
            Protocol::PioOut => (5, 0x06, 1),
        };
        c[1] = proto << 1;
        c[2] = flags;
        c[6] = count;
        c[14] = command;
        c
    }

    /// The disk's security state, IDENTIFY DEVICE word 128 (and 89, 90).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct Security {
        pub supported: bool,
        pub enabled: bool,
        pub locked: bool,
        pub frozen: bool,
        pub count_expired: bool,
        pub enhanced_erase: bool,
        /// What the disk says a normal erase takes, in minutes (at least).
        pub normal_minutes: Option<u32>,
        pub enhanced_minutes: Option<u32>,
    }

    /// Minutes from an erase time word (ACS-3 7.12.7.47): bit 15 chooses the
    /// 15-bit or the 8-bit form, each counting 2 minutes; 0 is "not given".
    fn minutes(w: u16) -> Option<u32> {
        let v = if w & 0x8000 != 0 {
            w & 0x7fff
        } else {
            w & 0xff
        };
        (v != 0).then_some(u32::from(v) * 2)
    }

    impl Security {
        pub fn from_identify(words: &[u16; 256]) -> Security {
            let w = words[128];
            Security {
                supported: w & 1 != 0,
                enabled: w & (1 << 1) != 0,
                locked: w & (1 << 2) != 0,
                frozen: w & (1 << 3) != 0,
                count_expired: w & (1 << 4) != 0,
                enhanced_erase: w & (1 << 5) != 0,
                normal_minutes: minutes(words[89]),
                enhanced_minutes: minutes(words[90]),
            }
        }

        /// Why this disk cannot be erased now, with what to do instead.
        pub fn refusal(&self, disk: &str) -> Option<String> {
            if !self.supported {
                return Some(format!(
                    "{disk}: the ATA disk does not support the Security feature set (IDENTIFY DEVICE word 128): erase it with overwrite"
                ));
            }
            if self.frozen {
                return Some(format!(
                    "{disk}: the ATA disk's security is frozen (its firmware sent SECURITY FREEZE LOCK at boot, as most do, so that \
                     nothing running can set a password). A suspend to RAM and resume of the machine, or a power cycle of the disk \
                     alone (hot-plug), unfreezes it; or erase it with overwrite"
                ));
            }
            if self.locked {
                return Some(format!(
                    "{disk}: the ATA disk is locked by a password: unlock it (hdparm --security-unlock), or erase it with overwrite"
                ));
            }
            if self.enabled {
                return Some(format!(
                    "{disk}: the ATA disk already has a user password set (security enabled), not by this erasure: \
                     disable it (hdparm --security-disable), or erase it with overwrite"
                ));
            }
            if self.count_expired {
                return Some(format!(
                    "{disk}: the ATA disk refuses security commands until it is power cycled (its password attempt counter expired)"
                ));
            }
            None
        }
    }

    /// The 256 words of IDENTIFY DEVICE data.
    pub fn words(block: &[u8; 512]) -> [u16; 256] {
        let mut w = [0u16; 256];
        for (i, c) in block.chunks_exact(2).enumerate() {
            w[i] = u16::from_le_bytes([c[0], c[1]]);
        }
        w
    }

    /// The 512-byte block SECURITY SET PASSWORD and SECURITY ERASE UNIT
    /// take: word 0 the control bits (bit 0: the master password, never
    /// here; bit 1: enhanced erase), words 1-16 the password.
    pub fn password_block(password: &str, enhanced: bool) -> [u8; 512] {
        let mut b = [0u8; 512];
        if enhanced {
            b[0] |= 0b10;
        }
        let p = password.as_bytes();
        b[2..2 + p.len().min(32)].copy_from_slice(&p[..p.len().min(32)]);
        b
    }

    pub fn identify(file: &File) -> Result<[u16; 256], SgError> {
        let mut block = [0u8; 512];
        sg_io(
            file,
            &cdb(Protocol::PioIn, IDENTIFY_DEVICE),
            Data::In(&mut block),
            Duration::from_secs(30),
        )?;
        Ok(words(&block))
    }

    /// SECURITY SET PASSWORD (user, [`ATA_PASSWORD`]), SECURITY ERASE
    /// PREPARE, SECURITY ERASE UNIT. The disk disables its security again
    /// when the erase completes.
    pub fn security_erase(
        file: &File,
        enhanced: bool,
        timeout: Duration,
    ) -> Result<(), (&'static str, SgError)> {
        let block = password_block(ATA_PASSWORD, false);
        sg_io(
            file,
            &cdb(Protocol::PioOut, SECURITY_SET_PASSWORD),
            Data::Out(&block),
            Duration::from_secs(30),
        )
        .map_err(|e| ("SECURITY SET PASSWORD", e))?;
        sg_io(
            file,
            &cdb(Protocol::NonData, SECURITY_ERASE_PREPARE),
            Data::None,
            Duration::from_secs(30),
        )
        .map_err(|e| ("SECURITY ERASE PREPARE", e))?;
        let block = password_block(ATA_PASSWORD, enhanced);
        sg_io(
            file,
            &cdb(Protocol::PioOut, SECURITY_ERASE_UNIT),
            Data::Out(&block),
            timeout,
        )
        .map_err(|e| ("SECURITY ERASE UNIT", e))
    }
}

/// SCSI commands (SPC-5, SBC-4).
pub mod scsi {
    use super::*;

    pub const SANITIZE: u8 = 0x48;

    /// SANITIZE service actions.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub enum Sanitize {
        Overwrite = 0x01,
        BlockErase = 0x02,
        CryptoErase = 0x03,
    }

    impl Sanitize {
        /// Strongest and quickest first.
        pub const PREFERRED: [Sanitize; 3] = [
            Sanitize::CryptoErase,
            Sanitize::BlockErase,
            Sanitize::Overwrite,
        ];

        pub fn name(self) -> &'static str {
            match self {
                Sanitize::Overwrite => "overwrite",
                Sanitize::BlockErase => "block erase",
                Sanitize::CryptoErase => "cryptographic erase",
            }
        }
    }

    /// REPORT SUPPORTED OPERATION CODES for one command and service action.
    pub fn report_one_cdb(opcode: u8, service_action: u16) -> [u8; 12] {
        let mut c = [0u8; 12];
        c[0] = 0xa3;
        c[1] = 0x0c;
        // Reporting options 010b: this opcode with this service action.
        c[2] = 0x02;
        c[3] = opcode;
        c[4..6].copy_from_slice(&service_action.to_be_bytes());
        c[6..10].copy_from_slice(&64u32.to_be_bytes());
        c
    }

    /// Whether the one-command answer says "supported" (SUPPORT 011b as the
    /// standard says, 101b in a vendor-specific way).
    pub fn supported(answer: &[u8]) -> bool {
        matches!(answer.get(1).map(|b| b & 0x07), Some(0b011) | Some(0b101))
    }

    /// SANITIZE with `action`, IMMED (the command returns once the
    /// sanitize has started; REQUEST SENSE says how far it has come).
    /// Overwrite takes a parameter list: one pass of zeros, not inverted.
    pub fn sanitize_cdb(action: Sanitize) -> [u8; 10] {
        let mut c = [0u8; 10];
        c[0] = SANITIZE;
        c[1] = 0x80 | action as u8;
        if action == Sanitize::Overwrite {
            c[7..9].copy_from_slice(&(OVERWRITE_PARAMETERS.len() as u16).to_be_bytes());
        }
        c
    }

    /// The overwrite parameter list: OWCOUNT 1, a 4-byte pattern of zeros.
    pub const OVERWRITE_PARAMETERS: [u8; 8] = [0x01, 0, 0, 4, 0, 0, 0, 0];

    /// Which SANITIZE service action the disk supports, strongest first;
    /// `Ok(None)` when it supports none, an error when it cannot say.
    pub fn advertised(file: &File) -> Result<Option<Sanitize>, SgError> {
        for action in Sanitize::PREFERRED {
            let mut answer = [0u8; 64];
            match sg_io(
                file,
                &report_one_cdb(SANITIZE, action as u16),
                Data::In(&mut answer),
                Duration::from_secs(30),
            ) {
                Ok(()) if supported(&answer) => return Ok(Some(action)),
                Ok(()) => {}
                Err(SgError::Check(s)) if s.illegal_request() => {
                    // A disk that does not know REPORT SUPPORTED OPERATION
                    // CODES says nothing of SANITIZE: not advertised.
                    if s.asc == 0x20 {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// REQUEST SENSE, fixed format, 252 bytes at most.
    pub const REQUEST_SENSE: [u8; 6] = [0x03, 0, 0, 0, 252, 0];

    /// How often a sanitize under way is asked how far it has come.
    const POLL: Duration = Duration::from_secs(5);

    /// Starts SANITIZE with `action` and waits, for `timeout` at most, for
    /// it to end, telling `progress` how far it has come (of 65536) each
    /// time the disk says.
    pub fn sanitize(
        file: &File,
        action: Sanitize,
        timeout: Duration,
        progress: &dyn Fn(u16),
    ) -> Result<(), SgError> {
        let started = std::time::Instant::now();
        let data = if action == Sanitize::Overwrite {
            Data::Out(&OVERWRITE_PARAMETERS)
        } else {
            Data::None
        };
        sg_io(file, &sanitize_cdb(action), data, Duration::from_secs(60))?;
        let mut last = None;
        loop {
            let mut answer = [0u8; 252];
            let state = match sg_io(
                file,
                &REQUEST_SENSE,
                Data::In(&mut answer),
                Duration::from_secs(30),
            ) {
                Ok(()) => sanitize_state(&answer),
                // A disk that answers REQUEST SENSE itself with the
                // condition, rather than as its data.
                Err(SgError::Check(s)) if s.sanitizing() => Ok(Some(s.progress)),
                Err(e) => return Err(e),
            };
            match state {
                Ok(Some(p)) => {
                    if let Some(p) = p {
                        progress(p);
                    }
                    last = p.or(last);
                }
                Ok(None) => return Ok(()),
                Err(s) => return Err(SgError::Check(s)),
            }
            if started.elapsed() + POLL > timeout {
                return Err(SgError::StillRunning { progress: last });
            }
            std::thread::sleep(POLL);
        }
    }

    /// What REQUEST SENSE's `answer` says of a sanitize: still under way
    /// (with its progress if given), ended (None), or failed (the sense).
    pub fn sanitize_state(answer: &[u8]) -> Result<Option<Option<u16>>, Sense> {
        match Sense::parse(answer) {
            Some(s) if s.sanitizing() => Ok(Some(s.progress)),
            // UNIT ATTENTION (a reset, a changed mode page) is reported
            // once, ahead of the rest: the next answer says.
            Some(s) if s.key == 0x6 => Ok(Some(None)),
            // NO SENSE: nothing under way, nothing wrong; a sanitize that
            // failed says so (MEDIUM ERROR, SANITIZE COMMAND FAILED).
            Some(s) if s.key == 0x0 => Ok(None),
            Some(s) => Err(s),
            // No sense data at all: nothing to report.
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ata_pass_through_cdbs_are_those_hdparm_sends() {
        // hdparm -I: ATA_16, PIO Data-In, T_DIR|BYT_BLOK|T_LENGTH=2, one block.
        let c = ata::cdb(ata::Protocol::PioIn, ata::IDENTIFY_DEVICE);
        assert_eq!(&c[..3], &[0x85, 0x08, 0x0e]);
        assert_eq!((c[6], c[14]), (1, 0xec));
        let c = ata::cdb(ata::Protocol::PioOut, ata::SECURITY_ERASE_UNIT);
        assert_eq!(&c[..3], &[0x85, 0x0a, 0x06]);
        assert_eq!((c[6], c[14]), (1, 0xf4));
        let c = ata::cdb(ata::Protocol::NonData, ata::SECURITY_ERASE_PREPARE);
        assert_eq!(&c[..3], &[0x85, 0x06, 0x00]);
        assert_eq!((c[6], c[14]), (0, 0xf3));
    }

    fn identify(w128: u16, w89: u16, w90: u16) -> [u16; 256] {
        let mut block = [0u8; 512];
        block[256..258].copy_from_slice(&w128.to_le_bytes());
        block[178..180].copy_from_slice(&w89.to_le_bytes());
        block[180..182].copy_from_slice(&w90.to_le_bytes());
        ata::words(&block)
    }

    #[test]
    fn ata_security_word_decides_and_explains() {
        // Supported, not enabled, not frozen, enhanced erase; 8-bit times.
        let s = ata::Security::from_identify(&identify(0b10_0001, 30, 5));
        assert!(s.supported && s.enhanced_erase && !s.frozen);
        assert_eq!((s.normal_minutes, s.enhanced_minutes), (Some(60), Some(10)));
        assert_eq!(s.refusal("/dev/sda"), None);
        // The 15-bit form, bit 15 set.
        let s = ata::Security::from_identify(&identify(1, 0x8000 | 400, 0));
        assert_eq!((s.normal_minutes, s.enhanced_minutes), (Some(800), None));
        // Frozen, as most firmware leaves a disk: refused, with the way out.
        let frozen = ata::Security::from_identify(&identify(0b1001, 0, 0))
            .refusal("/dev/sdb")
            .unwrap();
        assert!(frozen.contains("/dev/sdb") && frozen.contains("frozen"));
        assert!(frozen.contains("suspend") && frozen.contains("overwrite"));
        // Not supported (QEMU's emulated ATA disks).
        let none = ata::Security::from_identify(&identify(0, 0, 0))
            .refusal("/dev/sdc")
            .unwrap();
        assert!(none.contains("does not support the Security feature set"));
        // Locked, or a password someone else set.
        assert!(
            ata::Security::from_identify(&identify(0b0111, 0, 0))
                .refusal("d")
                .unwrap()
                .contains("locked")
        );
        assert!(
            ata::Security::from_identify(&identify(0b0011, 0, 0))
                .refusal("d")
                .unwrap()
                .contains("already has a user password")
        );
    }

    #[test]
    fn ata_password_block_holds_the_password_and_the_mode() {
        let b = ata::password_block(ATA_PASSWORD, true);
        assert_eq!(b[0], 0b10);
        assert_eq!(&b[2..10], b"shepherd");
        assert!(b[10..].iter().all(|&x| x == 0));
        assert_eq!(ata::password_block(ATA_PASSWORD, false)[0], 0);
    }

    #[test]
    fn scsi_sanitize_cdbs_and_the_support_answer() {
        assert_eq!(
            scsi::report_one_cdb(scsi::SANITIZE, 3),
            [0xa3, 0x0c, 0x02, 0x48, 0, 3, 0, 0, 0, 64, 0, 0]
        );
        assert_eq!(
            scsi::sanitize_cdb(scsi::Sanitize::CryptoErase),
            [0x48, 0x83, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            scsi::sanitize_cdb(scsi::Sanitize::Overwrite),
            [0x48, 0x81, 0, 0, 0, 0, 0, 0, 8, 0]
        );
        assert!(scsi::supported(&[0, 0b011, 0, 10]));
        assert!(scsi::supported(&[0, 0b101]));
        // 001b: not supported; 000b: no data.
        assert!(!scsi::supported(&[0, 0b001]));
        assert!(!scsi::supported(&[0, 0]));
    }

    #[test]
    fn sense_in_both_formats() {
        let mut fixed = [0u8; 18];
        fixed[0] = 0x70;
        fixed[2] = 0x05;
        fixed[12] = 0x20;
        let s = Sense::parse(&fixed).unwrap();
        assert_eq!((s.key, s.asc, s.ascq), (5, 0x20, 0));
        assert!(s.illegal_request());
        let s = Sense::parse(&[0x72, 0x0b, 0x00, 0x00, 0, 0, 0, 0]).unwrap();
        assert_eq!(s.key, 0xb);
        assert_eq!(
            s.to_string(),
            "aborted command (sense key 0xb, ASC/ASCQ 00/00)"
        );
        assert_eq!(Sense::parse(&[]), None);
    }

    #[test]
    fn a_sanitize_under_way_says_how_far_it_has_come_in_both_formats() {
        // Fixed: NOT READY, 04/1B, SKSV and a quarter done.
        let mut fixed = [0u8; 18];
        fixed[0] = 0x70;
        fixed[2] = 0x02;
        (fixed[12], fixed[13]) = (0x04, 0x1b);
        fixed[15..18].copy_from_slice(&[0x80, 0x40, 0x00]);
        assert_eq!(scsi::sanitize_state(&fixed), Ok(Some(Some(0x4000))));
        // Without SKSV, no progress is given.
        fixed[15] = 0;
        assert_eq!(scsi::sanitize_state(&fixed), Ok(Some(None)));
        // Descriptor: an information descriptor (type 0) first, then the
        // sense-key specific one (type 2) with half done.
        let desc = [
            0x72, 0x02, 0x04, 0x1b, 0, 0, 0, 22, // header
            0x00, 0x0a, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, // information
            0x02, 0x06, 0, 0, 0x80, 0x80, 0x00, 0, // sense-key specific
        ];
        assert_eq!(scsi::sanitize_state(&desc), Ok(Some(Some(0x8000))));
        // Ended: NO SENSE.
        let mut done = [0u8; 18];
        done[0] = 0x70;
        assert_eq!(scsi::sanitize_state(&done), Ok(None));
        // A unit attention first: ask again.
        let mut attention = done;
        attention[2] = 0x06;
        (attention[12], attention[13]) = (0x29, 0x00);
        assert_eq!(scsi::sanitize_state(&attention), Ok(Some(None)));
        // Failed: MEDIUM ERROR, SANITIZE COMMAND FAILED (31/03).
        let mut failed = done;
        failed[2] = 0x03;
        (failed[12], failed[13]) = (0x31, 0x03);
        let s = scsi::sanitize_state(&failed).unwrap_err();
        assert_eq!(
            s.to_string(),
            "medium error (sense key 0x3, ASC/ASCQ 31/03)"
        );
        assert_eq!(
            SgError::StillRunning {
                progress: Some(0x4000)
            }
            .to_string(),
            "the disk was still at it when its time ran out (25% done); it goes on by itself, \
             and answers NOT READY until it has ended"
        );
    }
}
