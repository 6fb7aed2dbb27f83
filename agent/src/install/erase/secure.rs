//! A disk's own erase (`DiskErasure` mode secure): what each kind of
//! disk advertises and how it is carried out. NVMe Format through
//! `nvme`, ATA Security Erase and SCSI SANITIZE through the SCSI
//! generic pass-through (`install::sg`).

use std::fs::File;
use std::time::Duration;

use crate::install::disk::Disk;
use crate::install::sg;

/// A disk's own erase, as it advertises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecureErase {
    /// NVMe Format NVM of namespace `nsid` with its current LBA format;
    /// `ses` 1 (user data erase) or 2 (cryptographic erase).
    NvmeFormat { nsid: u32, lbaf: u32, ses: u32 },
    /// ATA SECURITY ERASE UNIT, enhanced or normal; `minutes` as the disk
    /// estimates it.
    AtaSecurityErase {
        enhanced: bool,
        minutes: Option<u32>,
    },
    /// SCSI SANITIZE with this service action.
    ScsiSanitize(sg::scsi::Sanitize),
}

impl SecureErase {
    /// The command, as operators know it.
    pub fn name(&self) -> &'static str {
        match self {
            SecureErase::NvmeFormat { .. } => "NVMe Format",
            SecureErase::AtaSecurityErase { .. } => "ATA Security Erase",
            SecureErase::ScsiSanitize(_) => "SCSI SANITIZE",
        }
    }

    /// How long the disk says it takes, where it says so.
    pub fn minutes(&self) -> Option<u32> {
        match self {
            SecureErase::AtaSecurityErase { minutes, .. } => *minutes,
            _ => None,
        }
    }
}

impl std::fmt::Display for SecureErase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self.name();
        match self {
            SecureErase::NvmeFormat { nsid, ses, .. } => write!(
                f,
                "{name} of namespace {nsid} with {}",
                if *ses == 2 {
                    "cryptographic erase"
                } else {
                    "user data erase"
                }
            ),
            SecureErase::AtaSecurityErase { enhanced, minutes } => {
                let kind = if *enhanced { "enhanced" } else { "normal" };
                write!(f, "{name} ({kind})")?;
                match minutes {
                    Some(m) => write!(f, ", which the disk says takes {m} min"),
                    None => Ok(()),
                }
            }
            SecureErase::ScsiSanitize(a) => write!(f, "{name} ({})", a.name()),
        }
    }
}

/// How `disk` erases itself (by its kind: NVMe, ATA, SCSI), or why it
/// cannot.
pub fn advertised(disk: &Disk, file: &File) -> Result<SecureErase, String> {
    let name = disk
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if name.starts_with("nvme") {
        return super::nvme::advertised(disk, file).map(|f| SecureErase::NvmeFormat {
            nsid: f.nsid,
            lbaf: f.lbaf,
            ses: f.ses,
        });
    }
    if name.starts_with("sd") {
        let vendor = std::fs::read_to_string(format!("/sys/class/block/{name}/device/vendor"))
            .unwrap_or_default();
        return if vendor.trim() == "ATA" {
            ata_advertised(disk, file)
        } else {
            scsi_advertised(disk, file)
        };
    }
    Err(format!(
        "{} advertises no secure erase: it is not an NVMe, ATA or SCSI disk (a virtio or loop \
         device, or a file): erase it with overwrite or discard",
        disk.path.display()
    ))
}

/// Carries out `how` on `disk`, waiting at most `timeout`, telling
/// `progress` how many bytes are erased where the disk says.
pub fn run(
    disk: &Disk,
    file: &File,
    how: &SecureErase,
    timeout: Duration,
    progress: &dyn Fn(u64),
) -> Result<(), String> {
    let name = disk.path.display();
    match how {
        SecureErase::NvmeFormat { nsid, lbaf, ses } => {
            super::nvme::format(file, *nsid, *lbaf, *ses, timeout)
                .map_err(|e| format!("{name}: the NVMe Format failed: {e}"))
        }
        SecureErase::AtaSecurityErase { enhanced, .. } => {
            sg::ata::security_erase(file, *enhanced, timeout).map_err(|(step, e)| {
                format!(
                    "{name}: the ATA Security Erase failed at {step}: {e} (if the disk stays locked, \
                     its user password is \"{}\": hdparm --user-master u --security-unlock {0} {name}, \
                     then --security-disable {0})",
                    sg::ATA_PASSWORD
                )
            })
        }
        SecureErase::ScsiSanitize(a) => {
            let size = u128::from(disk.size_bytes);
            let of_65536 = |p: u16| progress((size * u128::from(p) / 65536) as u64);
            sg::scsi::sanitize(file, *a, timeout, &of_65536)
                .map_err(|e| format!("{name}: the SCSI SANITIZE ({}) failed: {e}", a.name()))
        }
    }
}

/// An ATA disk's Security Erase, if it offers one and is not frozen.
fn ata_advertised(disk: &Disk, file: &File) -> Result<SecureErase, String> {
    let name = disk.path.display().to_string();
    let words =
        sg::ata::identify(file).map_err(|e| format!("{name}: ATA IDENTIFY DEVICE failed: {e}"))?;
    let s = sg::ata::Security::from_identify(&words);
    if let Some(why) = s.refusal(&name) {
        return Err(why);
    }
    Ok(SecureErase::AtaSecurityErase {
        enhanced: s.enhanced_erase,
        minutes: if s.enhanced_erase {
            s.enhanced_minutes
        } else {
            s.normal_minutes
        },
    })
}

/// A SCSI disk's SANITIZE, strongest first, if it reports one.
fn scsi_advertised(disk: &Disk, file: &File) -> Result<SecureErase, String> {
    let name = disk.path.display();
    match sg::scsi::advertised(file) {
        Ok(Some(a)) => Ok(SecureErase::ScsiSanitize(a)),
        Ok(None) => Err(format!(
            "{name}: the SCSI disk does not advertise SANITIZE (REPORT SUPPORTED OPERATION CODES): erase it with overwrite"
        )),
        Err(e) => Err(format!(
            "{name}: asking the SCSI disk for SANITIZE failed: {e}: erase it with overwrite"
        )),
    }
}
