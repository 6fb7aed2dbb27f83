//! What one boot's network boot reads, by name, over HTTP and TFTP alike.
//!
//! Two chains load the same kernel and initramfs (the boot's data appended
//! to it as the slot's archive):
//!
//! - **iPXE** (BIOS; and UEFI with `netboot.uefi = "ipxe"`): a PXE ROM
//!   loads an iPXE binary over TFTP, which fetches `boot/<id>.ipxe` over
//!   HTTP, then the kernel and initramfs over HTTP.
//! - **The signed chain** (UEFI x86-64, `netboot.uefi = "shim"`, with
//!   Secure Boot on or off): EDK2's PXE loads `boot/<id>/shimx64.efi`
//!   over TFTP (shim, signed by the Microsoft UEFI CA), which loads
//!   `grubx64.efi` from the same directory (the distribution's network
//!   GRUB, verified by shim). GRUB reads its prefix's `grub/grub.cfg`,
//!   the same for every boot, which reads `grub/mac/<MAC>.cfg` (the
//!   configuration of the boot the machine with that MAC is being served:
//!   in proxy mode GRUB does not know the boot file's directory), which
//!   loads the kernel (verified through shim) and the initramfs over
//!   TFTP: Debian's signed network GRUB has no HTTP.
//!   UEFI HTTP boot loads the boot's copy of the ISO, `boot/<id>.iso`, as
//!   a RAM disk, whose EFI boot is the same shim and the ISO's GRUB.
//!
//! Every `boot/…` name is served only while its boot is unused and
//! unexpired (CONTRACTS.md §5): the boot's id is the capability. The
//! shared `grub/grub.cfg` names no boot and holds nothing of one.

use std::path::PathBuf;

use uuid::Uuid;

use crate::bmdb::boot::IssuedBoot;

/// One of a boot's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootPart {
    /// `boot/<id>.ipxe`: iPXE's script.
    Script,
    /// `boot/<id>/vmlinuz`.
    Kernel,
    /// `boot/<id>/initrd`: the initramfs, then the boot's data.
    Initrd,
    /// `boot/<id>/shimx64.efi`: the signed chain's first stage.
    Shim,
    /// `boot/<id>/grubx64.efi`: the signed network GRUB (the name shim
    /// loads).
    Grub,
    /// `boot/<id>/grub.cfg`: the boot's GRUB configuration.
    GrubConfig,
    /// `boot/<id>.iso`: the boot's copy of the ISO (UEFI HTTP boot).
    Iso,
}

impl BootPart {
    /// The name in logs and in the metrics' `what` and `file` labels.
    pub fn as_str(self) -> &'static str {
        match self {
            BootPart::Script => "script",
            BootPart::Kernel => "kernel",
            BootPart::Initrd => "initrd",
            BootPart::Shim => "shim",
            BootPart::Grub => "grub",
            BootPart::GrubConfig => "grub-config",
            BootPart::Iso => "iso",
        }
    }

    /// Every part, as [`BootPart::path`] names it.
    pub const ALL: [BootPart; 7] = [
        BootPart::Script,
        BootPart::Kernel,
        BootPart::Initrd,
        BootPart::Shim,
        BootPart::Grub,
        BootPart::GrubConfig,
        BootPart::Iso,
    ];

    /// Its path on the network boot's servers (no leading `/`).
    pub fn path(self, boot_id: Uuid) -> String {
        match self {
            BootPart::Script => format!("boot/{boot_id}.ipxe"),
            BootPart::Iso => format!("boot/{boot_id}.iso"),
            BootPart::Kernel => format!("boot/{boot_id}/vmlinuz"),
            BootPart::Initrd => format!("boot/{boot_id}/initrd"),
            BootPart::Shim => format!("boot/{boot_id}/shimx64.efi"),
            BootPart::Grub => format!("boot/{boot_id}/grubx64.efi"),
            BootPart::GrubConfig => format!("boot/{boot_id}/grub.cfg"),
        }
    }
}

/// What a requested path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    /// A boot's file (the id may name no boot: that is asked of the BMDB).
    Boot(Uuid, BootPart),
    /// The network GRUB's configuration for every boot (`grub/grub.cfg`).
    SharedGrubConfig,
    /// The configuration of the boot the machine with this MAC is being
    /// served (`grub/mac/52:54:00:12:34:56.cfg`), if any.
    MacGrubConfig(crate::mac::MacAddr),
    /// Nothing served.
    Nothing,
}

/// Where the network GRUB looks for its configuration: its prefix (`-p
/// /grub` in Debian's image) on the TFTP server it was loaded from.
pub const SHARED_GRUB_CONFIG: &str = "grub/grub.cfg";

/// What `path` (a TFTP file name or an HTTP path, a leading `/`
/// tolerated) names.
pub fn name(path: &str) -> Named {
    let path = path.trim_start_matches('/');
    if path == SHARED_GRUB_CONFIG {
        return Named::SharedGrubConfig;
    }
    if let Some(mac) = path
        .strip_prefix("grub/mac/")
        .and_then(|m| m.strip_suffix(".cfg"))
    {
        return match mac.parse() {
            Ok(mac) => Named::MacGrubConfig(mac),
            Err(_) => Named::Nothing,
        };
    }
    let Some(rest) = path.strip_prefix("boot/") else {
        return Named::Nothing;
    };
    let (id, part) = match rest.split_once('/') {
        Some((id, "vmlinuz")) => (id, BootPart::Kernel),
        Some((id, "initrd")) => (id, BootPart::Initrd),
        Some((id, "shimx64.efi")) => (id, BootPart::Shim),
        Some((id, "grubx64.efi")) => (id, BootPart::Grub),
        Some((id, "grub.cfg")) => (id, BootPart::GrubConfig),
        Some(_) => return Named::Nothing,
        None => match (rest.strip_suffix(".ipxe"), rest.strip_suffix(".iso")) {
            (Some(id), _) => (id, BootPart::Script),
            (_, Some(id)) => (id, BootPart::Iso),
            _ => return Named::Nothing,
        },
    };
    match Uuid::parse_str(id) {
        Ok(id) => Named::Boot(id, part),
        Err(_) => Named::Nothing,
    }
}

/// The network GRUB's configuration for every boot: it reads the
/// configuration of the boot its machine's MAC is being served (GRUB
/// knows its MAC, not the boot file's directory when a proxyDHCP named
/// it); a machine with no boot served leaves the firmware to boot the next
/// device.
pub fn shared_grub_config() -> String {
    "# shepherd: the network GRUB's configuration for every boot; each\n\
     # boot's own is read by the machine's MAC.\n\
     set timeout=0\n\
     source $prefix/mac/${net_default_mac}.cfg\n\
     echo \"shepherd: no boot is served to ${net_default_mac} (used, expired or unknown); back to the firmware\"\n\
     exit 1\n"
        .to_string()
}

/// Boot `boot_id`'s GRUB configuration: its kernel (which GRUB has shim
/// verify) and initramfs from `server` over TFTP, with `cmdline`.
pub fn grub_config(server: std::net::Ipv4Addr, boot_id: Uuid, cmdline: &str) -> String {
    let kernel = BootPart::Kernel.path(boot_id);
    let initrd = BootPart::Initrd.path(boot_id);
    format!(
        "# shepherd: boot {boot_id}\n\
         set timeout=0\n\
         echo \"shepherd: boot {boot_id}\"\n\
         linux (tftp,{server})/{kernel} {cmdline}\n\
         initrd (tftp,{server})/{initrd}\n\
         boot\n\
         echo \"shepherd: this firmware did not start the kernel; back to the firmware\"\n\
         exit 1\n"
    )
}

/// What a part is made of: a file then bytes after it (the initramfs and
/// its boot's data), or bytes alone.
#[derive(Debug)]
pub enum Source {
    File { path: PathBuf, tail: Vec<u8> },
    Bytes(Vec<u8>),
}

/// Why a part is not served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unserved {
    #[error("no such boot (used, expired or unknown)")]
    NoSuchBoot,
    /// The boot image has no such file (an iPXE-only image has no signed
    /// chain; one without `.vmlinuz` no network boot at all).
    #[error("{0}")]
    NotInImage(&'static str),
    #[error("{0}")]
    Unavailable(&'static str),
    #[error("{0}")]
    Failed(String),
}

/// Part `part` of `issued` (already found unused and unexpired) as `files`
/// and the boot's data make it; the ISO is not one (it is served in
/// ranges, `images::boot::copy_response`). `server` is the TFTP server
/// the GRUB configuration names; `script` the iPXE script's text.
pub fn source(
    part: BootPart,
    boot: &crate::images::BootServing,
    issued: &IssuedBoot,
    ca_der: &[u8],
    script: impl FnOnce(&str) -> String,
    server: std::net::Ipv4Addr,
) -> Result<Source, Unserved> {
    let Some(files) = boot.image.netboot.as_ref() else {
        return Err(Unserved::NotInImage(
            "this boot image has no kernel and initramfs for network boot (scripts/boot-image writes them beside the ISO)",
        ));
    };
    let signed = || {
        files.signed.as_ref().ok_or(Unserved::NotInImage(
            "this boot image has no signed chain (scripts/boot-image writes shim and GRUB beside the ISO)",
        ))
    };
    let file = |path: &PathBuf| Source::File {
        path: path.clone(),
        tail: Vec::new(),
    };
    Ok(match part {
        BootPart::Script => Source::Bytes(script(&files.cmdline).into_bytes()),
        BootPart::Kernel => file(&files.kernel),
        BootPart::Initrd => {
            let data = crate::images::boot::boot_data(issued, &boot.callback_endpoint, ca_der);
            let slot = boot
                .image
                .slot(&data)
                .map_err(|e| Unserved::Failed(e.to_string()))?;
            Source::File {
                path: files.initrd.clone(),
                tail: slot,
            }
        }
        BootPart::Shim => file(&signed()?.shim),
        BootPart::Grub => file(&signed()?.grub),
        BootPart::GrubConfig => {
            signed()?;
            Source::Bytes(grub_config(server, issued.boot_id, &files.cmdline).into_bytes())
        }
        BootPart::Iso => return Err(Unserved::Failed("the ISO is served in ranges".into())),
    })
}

/// The file (zero-padded to a multiple of 4 when a tail follows: an
/// initramfs's archives start 4-aligned), then the tail, in memory.
pub async fn read_whole(source: Source) -> std::io::Result<Vec<u8>> {
    match source {
        Source::Bytes(b) => Ok(b),
        Source::File { path, tail } => {
            let mut data = tokio::fs::read(&path).await?;
            if !tail.is_empty() {
                data.resize(data.len().div_ceil(4) * 4, 0);
                data.extend_from_slice(&tail);
            }
            Ok(data)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_s_path_names_that_part_and_nothing_else_is_a_boot_s() {
        let id = Uuid::new_v4();
        for part in BootPart::ALL {
            assert_eq!(name(&part.path(id)), Named::Boot(id, part), "{part:?}");
            assert_eq!(name(&format!("/{}", part.path(id))), Named::Boot(id, part));
        }
        assert_eq!(name("/grub/grub.cfg"), Named::SharedGrubConfig);
        assert_eq!(
            name("/grub/mac/52:54:00:4e:00:03.cfg"),
            Named::MacGrubConfig("52:54:00:4e:00:03".parse().unwrap())
        );
        for other in [
            "grub/x86_64-efi/grub.cfg",
            "grub/mac/nonsense.cfg",
            "grub/mac/52:54:00:4e:00:03",
            "boot/not-a-uuid.ipxe",
            &format!("boot/{id}/../../etc/passwd"),
            &format!("boot/{id}/mmx64.efi"),
            &format!("boot/{id}"),
            "snponly.efi",
        ] {
            assert_eq!(name(other), Named::Nothing, "{other}");
        }
    }

    #[test]
    fn the_boot_s_grub_configuration_loads_its_kernel_and_initramfs_over_tftp() {
        let id = Uuid::new_v4();
        let cfg = grub_config("10.0.0.1".parse().unwrap(), id, "console=ttyS0 quiet");
        assert!(
            cfg.contains(&format!(
                "linux (tftp,10.0.0.1)/boot/{id}/vmlinuz console=ttyS0 quiet\n"
            )),
            "{cfg}"
        );
        assert!(
            cfg.contains(&format!("initrd (tftp,10.0.0.1)/boot/{id}/initrd\n")),
            "{cfg}"
        );
        assert!(shared_grub_config().contains("source $prefix/mac/${net_default_mac}.cfg\n"));
    }
}
