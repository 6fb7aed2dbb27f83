//! Making the installed disk the first thing the firmware boots: an EFI
//! boot entry (`Boot####`, UEFI 2.x §3.1.3 `EFI_LOAD_OPTION`) for the
//! image's EFI system partition, put first in `BootOrder`, written through
//! efivarfs. The entry points at the partition by its GPT identity (a
//! hard-drive media device path: number, start, size, unique GUID) and at
//! the removable-media boot program, `\EFI\BOOT\BOOTX64.EFI`, which images
//! made to boot on any machine carry.

use std::io::Read as _;
use std::path::Path;

use super::partitions;

/// The EFI global variable vendor GUID, as efivarfs names files.
const GLOBAL: &str = "8be4df61-93ca-11d2-aa0d-00e098032b8c";
/// Non-volatile, boot service and runtime access.
const ATTRIBUTES: u32 = 0x7;
/// The entry's description; an entry already carrying it is reused.
pub const DESCRIPTION: &str = "shepherd: installed system";
/// The boot program the entry starts.
pub const LOADER: &str = r"\EFI\BOOT\BOOTX64.EFI";

/// An EFI system partition as the GPT describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EspPartition {
    /// 1-based.
    pub number: u32,
    pub first_lba: u64,
    pub sectors: u64,
    pub unique_guid: [u8; 16],
}

/// The first EFI system partition in the GPT of `disk` (read with
/// `sector`-byte sectors).
pub fn find_esp(disk: &Path, sector: u64) -> Result<EspPartition, String> {
    let f = std::fs::File::open(disk).map_err(|e| format!("{}: {e}", disk.display()))?;
    let header = partitions::read_at(&f, sector as usize, sector)
        .map_err(|e| format!("reading the GPT header of {}: {e}", disk.display()))?;
    if !partitions::is_gpt_header(&header) {
        return Err(format!(
            "{} has no GPT: an EFI boot entry needs the image's EFI system partition",
            disk.display()
        ));
    }
    let h = partitions::GptHeader::read(&header);
    // At most 1024 entries are looked at; no upper bound on their size.
    let count = h.entries.min(1024) as usize;
    let size = h.entry_len as usize;
    if size < partitions::MIN_ENTRY_LEN as usize {
        return Err(format!("{}: GPT entries of {size} bytes", disk.display()));
    }
    let entries = partitions::read_at(&f, count * size, h.entries_lba * sector)
        .map_err(|e| format!("reading the GPT entries of {}: {e}", disk.display()))?;
    let esp = partitions::guid_bytes(partitions::ESP_TYPE);
    for (i, e) in partitions::gpt_entries(&entries, size).enumerate() {
        if e.type_guid == esp {
            return Ok(EspPartition {
                number: i as u32 + 1,
                first_lba: e.first_lba,
                sectors: e.last_lba.saturating_sub(e.first_lba) + 1,
                unique_guid: e.unique_guid,
            });
        }
    }
    Err(format!(
        "{} has no EFI system partition to boot from",
        disk.display()
    ))
}

fn utf16z(s: &str) -> Vec<u8> {
    s.encode_utf16()
        .chain(std::iter::once(0))
        .flat_map(|c| c.to_le_bytes())
        .collect()
}

/// The `EFI_LOAD_OPTION` of an entry starting `loader` on `esp`.
pub fn load_option(esp: &EspPartition, description: &str, loader: &str) -> Vec<u8> {
    let mut path = Vec::new();
    // Hard drive media device path: type 4, subtype 1, 42 bytes.
    path.extend_from_slice(&[0x04, 0x01]);
    path.extend_from_slice(&42u16.to_le_bytes());
    path.extend_from_slice(&esp.number.to_le_bytes());
    path.extend_from_slice(&esp.first_lba.to_le_bytes());
    path.extend_from_slice(&esp.sectors.to_le_bytes());
    path.extend_from_slice(&esp.unique_guid);
    path.extend_from_slice(&[0x02, 0x02]); // GPT, GUID signature
    // File path media device path: type 4, subtype 4.
    let file = utf16z(loader);
    path.extend_from_slice(&[0x04, 0x04]);
    path.extend_from_slice(&((4 + file.len()) as u16).to_le_bytes());
    path.extend_from_slice(&file);
    // End of the device path.
    path.extend_from_slice(&[0x7f, 0xff, 0x04, 0x00]);
    let mut option = Vec::new();
    option.extend_from_slice(&1u32.to_le_bytes()); // LOAD_OPTION_ACTIVE
    option.extend_from_slice(&(path.len() as u16).to_le_bytes());
    option.extend_from_slice(&utf16z(description));
    option.extend_from_slice(&path);
    option
}

/// The description of a load option's bytes.
fn description_of(option: &[u8]) -> Option<String> {
    let text = option.get(6..)?;
    let units: Vec<u16> = text
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .take_while(|u| *u != 0)
        .collect();
    String::from_utf16(&units).ok()
}

fn read_var(path: &Path) -> Option<Vec<u8>> {
    let mut b = Vec::new();
    std::fs::File::open(path).ok()?.read_to_end(&mut b).ok()?;
    (b.len() >= 4).then(|| b[4..].to_vec())
}

/// efivarfs makes existing variables immutable; this lets one be written.
fn clear_immutable(path: &Path) {
    const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
    const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
    const FS_IMMUTABLE_FL: libc::c_long = 0x10;
    let Ok(f) = std::fs::File::open(path) else {
        return;
    };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    let mut flags: libc::c_long = 0;
    // SAFETY: the ioctls read and write one long through the pointer.
    unsafe {
        if libc::ioctl(fd, FS_IOC_GETFLAGS as _, &mut flags) == 0 && flags & FS_IMMUTABLE_FL != 0 {
            flags &= !FS_IMMUTABLE_FL;
            libc::ioctl(fd, FS_IOC_SETFLAGS as _, &flags);
        }
    }
}

/// Writes a variable in one write, as efivarfs wants.
fn write_var(path: &Path, data: &[u8]) -> Result<(), String> {
    use std::io::Write as _;
    clear_immutable(path);
    let mut b = ATTRIBUTES.to_le_bytes().to_vec();
    b.extend_from_slice(data);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(&b)
        .map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Adds (or rewrites) shepherd's boot entry for the EFI system partition
/// of `disk` in the variables under `efivars`, and puts it first in
/// `BootOrder`. Returns the entry's name (`Boot0003`).
pub fn set_boot_entry(disk: &Path, sector: u64, efivars: &Path) -> Result<String, String> {
    if !efivars.is_dir() {
        return Err(format!(
            "no EFI variables at {}: the machine did not boot with UEFI",
            efivars.display()
        ));
    }
    let esp = find_esp(disk, sector)?;
    let option = load_option(&esp, DESCRIPTION, LOADER);
    // Ours if one carries our description, else the lowest free number.
    let mut used = Vec::new();
    let mut ours = None;
    for e in std::fs::read_dir(efivars)
        .map_err(|e| format!("{}: {e}", efivars.display()))?
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(n) = name
            .strip_suffix(&format!("-{GLOBAL}"))
            .and_then(|n| n.strip_prefix("Boot"))
            .filter(|n| n.len() == 4)
            .and_then(|n| u16::from_str_radix(n, 16).ok())
        else {
            continue;
        };
        used.push(n);
        if read_var(&e.path())
            .and_then(|v| description_of(&v))
            .as_deref()
            == Some(DESCRIPTION)
        {
            ours = Some(n);
        }
    }
    let number = ours
        .or_else(|| (0..=0xffffu16).find(|n| !used.contains(n)))
        .ok_or("every Boot#### number is taken")?;
    let name = format!("Boot{number:04X}");
    write_var(&efivars.join(format!("{name}-{GLOBAL}")), &option)?;
    let order_path = efivars.join(format!("BootOrder-{GLOBAL}"));
    let mut order: Vec<u16> = read_var(&order_path)
        .unwrap_or_default()
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .filter(|n| *n != number)
        .collect();
    order.insert(0, number);
    let bytes: Vec<u8> = order.iter().flat_map(|n| n.to_le_bytes()).collect();
    write_var(&order_path, &bytes)?;
    Ok(name)
}
