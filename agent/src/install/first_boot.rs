//! The installed system's first-boot data (`ImageInstallation.nocloud`,
//! `config_drive`): a FAT volume labelled `CIDATA` (a NoCloud seed) or
//! `CONFIG-2` (an OpenStack config drive) holding the request's files,
//! where cloud-init looks for it on the first boot.
//!
//! The volume goes into a new partition at the end of the installed disk,
//! behind the image: the image's GPT is moved to the disk's real end (its
//! backup header and array), the partition added, every checksum written
//! anew; the space between the image's last partition and the volume stays
//! free for cloud-init's growpart. An MBR image gets a primary partition.
//! Or, when the request names another disk, the volume is that whole disk.

use std::fs::File;
use std::io::{Cursor, Write as _};
use std::os::unix::fs::FileExt;

use super::disk::{self, Disk};
use super::partitions::{
    BASIC_DATA, GPT_HEADER_LEN, GptHeader, MBR_LEN, MBR_PROTECTIVE, crc32, entry_at, gpt_entries,
    has_mbr_signature, header_at, is_gpt_header, mbr_entries, mbr_entry_at, mbr_slot, put_u32,
    put_u64, read_at, seal_gpt_header,
};
use crate::api::FirstBootFiles;
use crate::api::image_installation::FirstBoot;

const MIB: u64 = 1 << 20;
/// The volume's size: room for the request's files (at most 1 MiB) in a
/// FAT16 filesystem every kernel mounts.
pub const VOLUME_BYTES: u64 = 32 * MIB;
/// The partition's alignment.
const ALIGN: u64 = MIB;
/// The most file bytes a volume takes.
pub const MAX_FILES_BYTES: usize = 4 << 20;

/// What the volume is, as cloud-init finds it.
pub struct Volume<'a> {
    /// `CIDATA` or `CONFIG-2` (blkid's LABEL; cloud-init looks for both
    /// cases).
    pub label: &'static str,
    /// The GPT partition's name.
    pub name: &'static str,
    pub files: &'a FirstBootFiles,
}

impl<'a> Volume<'a> {
    pub fn of(fb: &'a FirstBoot) -> Volume<'a> {
        match fb {
            FirstBoot::Nocloud(files) => Volume {
                label: "CIDATA",
                name: "cidata",
                files,
            },
            FirstBoot::ConfigDrive(files) => Volume {
                label: "CONFIG-2",
                name: "config-2",
                files,
            },
        }
    }
}

/// Checks the files before anything is written: names, sizes.
pub fn check(fb: &FirstBoot) -> Result<(), String> {
    let v = Volume::of(fb);
    if v.files.files.is_empty() {
        return Err(format!("the first-boot volume ({}) has no files", v.name));
    }
    let mut total = 0;
    for (name, bytes) in &v.files.files {
        shepherd_proto::first_boot::check_path(name)
            .map_err(|e| format!("the first-boot volume: {e}"))?;
        total += bytes.len();
    }
    if total > MAX_FILES_BYTES {
        return Err(format!(
            "the first-boot files are {total} bytes; at most {MAX_FILES_BYTES}"
        ));
    }
    Ok(())
}

/// The volume's bytes: a FAT filesystem of [`VOLUME_BYTES`] labelled as
/// cloud-init expects, with every file (directories made as the paths
/// need).
pub fn build(v: &Volume<'_>) -> Result<Vec<u8>, String> {
    let mut image = vec![0u8; VOLUME_BYTES as usize];
    let mut label = [b' '; 11];
    label[..v.label.len()].copy_from_slice(v.label.as_bytes());
    let err = |e: std::io::Error| format!("building the first-boot volume: {e}");
    fatfs::format_volume(
        Cursor::new(&mut image[..]),
        fatfs::FormatVolumeOptions::new().volume_label(label),
    )
    .map_err(err)?;
    let fs = fatfs::FileSystem::new(Cursor::new(&mut image[..]), fatfs::FsOptions::new())
        .map_err(err)?;
    {
        let root = fs.root_dir();
        let mut names: Vec<&String> = v.files.files.keys().collect();
        names.sort();
        for name in names {
            let parts: Vec<&str> = name.split('/').collect();
            let mut dir = root.clone();
            for p in &parts[..parts.len() - 1] {
                dir = match dir.open_dir(p) {
                    Ok(d) => d,
                    Err(_) => dir.create_dir(p).map_err(err)?,
                };
            }
            let mut f = dir.create_file(parts[parts.len() - 1]).map_err(err)?;
            f.truncate().map_err(err)?;
            f.write_all(&v.files.files[name]).map_err(err)?;
            f.flush().map_err(err)?;
        }
    }
    fs.unmount().map_err(err)?;
    Ok(image)
}

/// The room the volume needs beyond the image on its disk: the volume,
/// its alignment, and the moved GPT.
pub fn room_needed() -> u64 {
    VOLUME_BYTES + 2 * ALIGN
}

/// Where the volume went.
#[derive(Debug, Clone)]
pub struct Placed {
    pub disk: String,
    /// Its byte offset on that disk and its partition number (0: the whole
    /// disk).
    pub offset: u64,
    pub partition: u32,
}

/// Writes the volume as a new partition at the end of the disk `f`
/// (`size` bytes, `sector`-byte sectors) that holds a freshly written
/// image: GPT (moved to the disk's end) or MBR.
pub fn add_partition(
    f: &File,
    d: &Disk,
    size: u64,
    sector: u64,
    volume: &[u8],
    name: &str,
) -> Result<Placed, String> {
    let path = d.path.display().to_string();
    let lba1 = read_at(f, sector as usize, sector)
        .map_err(|e| format!("reading {path}'s partition table: {e}"))?;
    let placed = if is_gpt_header(&lba1) {
        gpt_add(f, &path, size, sector, lba1, volume, name)?
    } else {
        mbr_add(f, &path, size, volume)?
    };
    f.write_all_at(volume, placed.offset)
        .map_err(|e| format!("writing the first-boot volume to {path}: {e}"))?;
    f.sync_all().map_err(|e| format!("flushing {path}: {e}"))?;
    let _ = disk::reread(f, d);
    Ok(placed)
}

/// Writes the volume over the whole disk `f` (another disk than the
/// installed one), its old partition tables' last MiB zeroed.
pub fn whole_disk(f: &File, d: &Disk, size: u64, volume: &[u8]) -> Result<Placed, String> {
    let path = d.path.display().to_string();
    if size < volume.len() as u64 {
        return Err(format!(
            "{path} ({}) is smaller than the first-boot volume ({})",
            disk::bytes(size),
            disk::bytes(volume.len() as u64)
        ));
    }
    let zero = vec![0u8; MIB.min(size) as usize];
    f.write_all_at(&zero, size - zero.len() as u64)
        .and_then(|_| f.write_all_at(volume, 0))
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("writing the first-boot volume to {path}: {e}"))?;
    let _ = disk::reread(f, d);
    Ok(Placed {
        disk: path,
        offset: 0,
        partition: 0,
    })
}

fn no_room(path: &str, used_end: u64, size: u64) -> String {
    format!(
        "{path} has no room for the first-boot volume: the image's partitions end at {}, the disk is {}; \
         the volume needs {} free at the disk's end",
        disk::bytes(used_end),
        disk::bytes(size),
        disk::bytes(room_needed())
    )
}

fn gpt_add(
    f: &File,
    path: &str,
    size: u64,
    sector: u64,
    mut header: Vec<u8>,
    volume: &[u8],
    name: &str,
) -> Result<Placed, String> {
    let h = GptHeader::read(&header);
    let header_len = h.header_len as usize;
    if !(GPT_HEADER_LEN..=sector as usize).contains(&header_len) {
        return Err(format!(
            "{path}: the GPT header's size {header_len} is not valid"
        ));
    }
    let (old_backup, first_usable) = (h.alternate_lba, h.first_usable);
    let (entries_lba, count, entry_len) = (h.entries_lba, h.entries as usize, h.entry_len as usize);
    // Unlike an erasure's reader, an empty array is refused: the volume
    // needs an entry.
    if !h.array_in_bounds() || count == 0 {
        return Err(format!("{path}: the GPT's partition array is not valid"));
    }
    let mut entries = read_at(f, h.array_len(), entries_lba * sector)
        .map_err(|e| format!("reading {path}'s partition array: {e}"))?;
    let mut used_end = first_usable;
    let mut free = None;
    for (i, e) in gpt_entries(&entries, entry_len).enumerate() {
        if !e.is_used() {
            free.get_or_insert(i);
        } else {
            used_end = used_end.max(e.last_lba + 1);
        }
    }
    let Some(slot) = free else {
        return Err(format!(
            "{path}: the image's GPT has no free entry for the first-boot volume"
        ));
    };
    let array_sectors = ((count * entry_len) as u64).div_ceil(sector);
    let last = size / sector - 1;
    let Some(last_usable) = last.checked_sub(array_sectors + 1) else {
        return Err(no_room(path, used_end * sector, size));
    };
    let len = volume.len() as u64 / sector;
    let align = ALIGN / sector;
    let Some(start) = (last_usable + 1)
        .checked_sub(len)
        .map(|s| s / align * align)
    else {
        return Err(no_room(path, used_end * sector, size));
    };
    if start < used_end || start < first_usable {
        return Err(no_room(path, used_end * sector, size));
    }
    // The new entry.
    let e = &mut entries[slot * entry_len..(slot + 1) * entry_len];
    e.fill(0);
    e[entry_at::TYPE].copy_from_slice(&BASIC_DATA);
    e[entry_at::UNIQUE].copy_from_slice(uuid::Uuid::new_v4().to_bytes_le().as_slice());
    put_u64(e, entry_at::FIRST_LBA, start);
    put_u64(e, entry_at::LAST_LBA, start + len - 1);
    for (i, u) in name.encode_utf16().take(36).enumerate() {
        let at = entry_at::NAME + 2 * i;
        e[at..at + 2].copy_from_slice(&u.to_le_bytes());
    }
    let entries_crc = crc32(&entries);
    // The primary header: the disk's real end.
    put_u64(&mut header, header_at::ALTERNATE_LBA, last);
    put_u64(&mut header, header_at::LAST_USABLE, last_usable);
    put_u32(&mut header, header_at::ENTRIES_CRC, entries_crc);
    seal_gpt_header(&mut header, header_len);
    // The backup: the same, at the end, pointing at its own array.
    let mut backup = header.clone();
    put_u64(&mut backup, header_at::MY_LBA, last);
    put_u64(&mut backup, header_at::ALTERNATE_LBA, 1);
    put_u64(&mut backup, header_at::ENTRIES_LBA, last - array_sectors);
    seal_gpt_header(&mut backup, header_len);
    let io = |e: std::io::Error| format!("writing {path}'s partition table: {e}");
    // The image's old backup header (now inside free space) goes.
    if old_backup != last && old_backup > used_end && old_backup < start {
        f.write_all_at(&vec![0u8; sector as usize], old_backup * sector)
            .map_err(io)?;
    }
    f.write_all_at(&entries, entries_lba * sector).map_err(io)?;
    f.write_all_at(&entries, (last - array_sectors) * sector)
        .map_err(io)?;
    f.write_all_at(&backup, last * sector).map_err(io)?;
    f.write_all_at(&header, sector).map_err(io)?;
    // The protective MBR covers the whole disk.
    let mut mbr = read_at(f, MBR_LEN, 0).map_err(io)?;
    if mbr[mbr_slot(0)][mbr_entry_at::TYPE] == MBR_PROTECTIVE {
        put_u32(
            &mut mbr[mbr_slot(0)],
            mbr_entry_at::SECTORS,
            last.min(u64::from(u32::MAX)) as u32,
        );
        f.write_all_at(&mbr, 0).map_err(io)?;
    }
    Ok(Placed {
        disk: path.to_string(),
        offset: start * sector,
        partition: slot as u32 + 1,
    })
}

fn mbr_add(f: &File, path: &str, size: u64, volume: &[u8]) -> Result<Placed, String> {
    let mut mbr =
        read_at(f, MBR_LEN, 0).map_err(|e| format!("reading {path}'s partition table: {e}"))?;
    if !has_mbr_signature(&mbr) {
        return Err(format!(
            "{path}: the image has neither a GPT nor an MBR partition table: no first-boot volume can be added"
        ));
    }
    let mut used_end = MIB / 512;
    let mut free = None;
    // Every entry in use counts, a protective one too.
    for (i, e) in mbr_entries(&mbr).enumerate() {
        if e.kind == 0 {
            free.get_or_insert(i);
        } else {
            used_end = used_end.max(u64::from(e.start) + u64::from(e.sectors));
        }
    }
    let Some(slot) = free else {
        return Err(format!(
            "{path}: the image's MBR has no free primary entry for the first-boot volume"
        ));
    };
    let sectors = (size / 512).min(u64::from(u32::MAX));
    let len = volume.len() as u64 / 512;
    let Some(start) = sectors
        .checked_sub(len)
        .map(|s| s / (ALIGN / 512) * (ALIGN / 512))
    else {
        return Err(no_room(path, used_end * 512, size));
    };
    if start < used_end {
        return Err(no_room(path, used_end * 512, size));
    }
    let e = &mut mbr[mbr_slot(slot)];
    e.copy_from_slice(&[
        0, 0xFE, 0xFF, 0xFF, 0x0C, 0xFE, 0xFF, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    put_u32(e, mbr_entry_at::START, start as u32);
    put_u32(e, mbr_entry_at::SECTORS, len as u32);
    f.write_all_at(&mbr, 0)
        .map_err(|e| format!("writing {path}'s partition table: {e}"))?;
    Ok(Placed {
        disk: path.to_string(),
        offset: start * 512,
        partition: slot as u32 + 1,
    })
}
