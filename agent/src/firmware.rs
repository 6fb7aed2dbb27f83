//! How the firmware booted this system: EFI (booted by it, supported, or
//! a legacy BIOS) and Secure Boot (UEFI's `SecureBoot` and `SetupMode`
//! variables, the kernel's lockdown), read from /sys under a root (`/`
//! for the machine itself) for the hardware report.

use std::path::Path;

use crate::api::{EfiSupport, SecureBoot, secure_boot};

/// EFI: booted by it (/sys/firmware/efi), else supported but unused when
/// the BIOS says so (SMBIOS type 0, characteristics extension byte 2 bit 3,
/// "UEFI is supported"), else a legacy BIOS: unsupported.
pub fn efi(root: &Path) -> EfiSupport {
    if root.join("sys/firmware/efi").is_dir() {
        return EfiSupport::Enabled;
    }
    match std::fs::read(root.join("sys/firmware/dmi/entries/0-0/raw")) {
        Ok(raw) if raw.first() == Some(&0) && raw.get(1).is_some_and(|l| *l >= 0x14) => {
            if raw.get(0x13).is_some_and(|b| b & 0x08 != 0) {
                EfiSupport::Supported
            } else {
                EfiSupport::Unsupported
            }
        }
        // No BIOS information to read (not root, no DMI): booted without
        // EFI, which is all that is known.
        _ if root.join("sys/firmware").is_dir() || root.join("sys/class").is_dir() => {
            EfiSupport::Unsupported
        }
        _ => EfiSupport::Unknown,
    }
}

/// UEFI's global variables' GUID (SecureBoot, SetupMode).
const EFI_GLOBAL: &str = "8be4df61-93ca-11d2-aa0d-00e098032b8c";

/// A UEFI global variable's one-byte value (efivarfs: four bytes of
/// attributes, then the value); None when it cannot be read.
fn efi_flag(root: &Path, name: &str) -> Option<bool> {
    let raw =
        std::fs::read(root.join(format!("sys/firmware/efi/efivars/{name}-{EFI_GLOBAL}"))).ok()?;
    raw.get(4).map(|b| *b == 1)
}

/// Secure Boot as this system booted: the firmware's SecureBoot and
/// SetupMode variables, and the kernel's lockdown (the bracketed word of
/// /sys/kernel/security/lockdown).
pub fn secure_boot(root: &Path) -> SecureBoot {
    let state = match efi_flag(root, "SecureBoot") {
        Some(true) => secure_boot::State::On,
        Some(false) => secure_boot::State::Off,
        // Booted by UEFI without the variable: firmware with no Secure
        // Boot at all.
        None if std::fs::read_dir(root.join("sys/firmware/efi/efivars"))
            .is_ok_and(|mut d| d.next().is_some()) =>
        {
            secure_boot::State::Off
        }
        None => secure_boot::State::Unknown,
    };
    let lockdown = std::fs::read_to_string(root.join("sys/kernel/security/lockdown"))
        .ok()
        .and_then(|l| {
            let from = l.find('[')?;
            let to = l[from..].find(']')? + from;
            Some(l[from + 1..to].to_string())
        })
        .unwrap_or_default();
    SecureBoot {
        state: state as i32,
        setup_mode: efi_flag(root, "SetupMode").unwrap_or(false),
        lockdown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(root: &Path, path: &str, bytes: &[u8]) {
        let p = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }

    #[test]
    fn secure_boot_is_read_from_uefi_s_variables_and_the_kernel_s_lockdown() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let var = |name: &str| format!("/sys/firmware/efi/efivars/{name}-{EFI_GLOBAL}");
        put(r, &var("SecureBoot"), &[6, 0, 0, 0, 1]);
        put(r, &var("SetupMode"), &[6, 0, 0, 0, 0]);
        put(
            r,
            "/sys/kernel/security/lockdown",
            b"none [integrity] confidentiality\n",
        );
        let sb = secure_boot(r);
        assert_eq!(sb.state, secure_boot::State::On as i32);
        assert!(!sb.setup_mode);
        assert_eq!(sb.lockdown, "integrity");
        put(r, &var("SecureBoot"), &[6, 0, 0, 0, 0]);
        put(r, &var("SetupMode"), &[6, 0, 0, 0, 1]);
        put(
            r,
            "/sys/kernel/security/lockdown",
            b"[none] integrity confidentiality\n",
        );
        let sb = secure_boot(r);
        assert_eq!(sb.state, secure_boot::State::Off as i32);
        assert!(sb.setup_mode);
        assert_eq!(sb.lockdown, "none");
        // UEFI firmware without Secure Boot: variables, none of them it.
        std::fs::remove_file(r.join(var("SecureBoot").trim_start_matches('/'))).unwrap();
        assert_eq!(secure_boot(r).state, secure_boot::State::Off as i32);
    }
}
