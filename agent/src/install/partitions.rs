//! Partition tables as they sit on a disk: the GPT (its header, primary at
//! LBA 1 or backup at the last LBA, and its partition array), the MBR (its
//! four primary entries, protective or real), and the partitions the
//! kernel lists. The one reader of them: an erasure's regions
//! ([`byte_ranges`]), the EFI system partition of a boot entry
//! (`efi::find_esp`), and the first-boot volume's new partition
//! (`first_boot`, which also writes tables with the layout and the CRC
//! helpers here).
//!
//! The readers differ on purpose and each keeps its own rules: an erasure
//! reads both GPT copies with either sector size, as libblkid does (a copy
//! whose partition array fails its CRC is left for the other), follows an
//! MBR's extended partitions through their chain of EBRs, and never fails
//! (what it cannot read it leaves out); a boot entry and a first-boot
//! volume read the primary header with the disk's sector size and fail,
//! naming why. No reader checks a header's own CRC.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt as _;
use std::path::Path;

use super::disk::Disk;

/// A GPT header's first eight bytes.
pub const GPT_SIGNATURE: &[u8; 8] = b"EFI PART";
/// The bytes of a GPT header that hold its fields (UEFI 2.x §5.3.2); the
/// rest of its sector is reserved.
pub const GPT_HEADER_LEN: usize = 92;
/// The partition array's entry sizes a reader takes (bytes).
pub const MIN_ENTRY_LEN: u32 = 128;
pub const MAX_ENTRY_LEN: u32 = 4096;
/// The most entries a partition array may have for a reader to take it.
pub const MAX_ENTRIES: u32 = 16384;

/// Where a GPT header keeps each field, in bytes.
pub mod header_at {
    pub const SIZE: usize = 12;
    pub const CRC: usize = 16;
    pub const MY_LBA: usize = 24;
    pub const ALTERNATE_LBA: usize = 32;
    pub const FIRST_USABLE: usize = 40;
    pub const LAST_USABLE: usize = 48;
    pub const ENTRIES_LBA: usize = 72;
    pub const ENTRIES: usize = 80;
    pub const ENTRY_LEN: usize = 84;
    pub const ENTRIES_CRC: usize = 88;
}

/// Where a GPT partition entry keeps each field, in bytes.
pub mod entry_at {
    use std::ops::Range;

    pub const TYPE: Range<usize> = 0..16;
    pub const UNIQUE: Range<usize> = 16..32;
    pub const FIRST_LBA: usize = 32;
    pub const LAST_LBA: usize = 40;
    /// UTF-16LE, 36 units.
    pub const NAME: usize = 56;
}

/// The EFI system partition's type GUID, as text.
pub const ESP_TYPE: &str = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B";
/// Microsoft basic data, as GPT stores it (mixed-endian):
/// EBD0A0A2-B9E5-4433-87C0-68B6B72699C7.
pub const BASIC_DATA: [u8; 16] = [
    0xA2, 0xA0, 0xD0, 0xEB, 0xE5, 0xB9, 0x33, 0x44, 0x87, 0xC0, 0x68, 0xB6, 0xB7, 0x26, 0x99, 0xC7,
];

/// The MBR's length and the sector its entries count in.
pub const MBR_LEN: usize = 512;
pub const MBR_SECTOR: u64 = 512;
/// An MBR's last two bytes.
pub const MBR_SIGNATURE: [u8; 2] = [0x55, 0xAA];
/// The partition type of a GPT's protective MBR entry.
pub const MBR_PROTECTIVE: u8 = 0xEE;
/// Where the four primary entries start, and each one's length.
const MBR_TABLE: usize = 446;
const MBR_ENTRY_LEN: usize = 16;
/// Where an MBR entry keeps each field, in bytes.
pub mod mbr_entry_at {
    pub const TYPE: usize = 4;
    pub const START: usize = 8;
    pub const SECTORS: usize = 12;
}

pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

pub fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The CRC32 a GPT header and its array carry.
pub fn crc32(b: &[u8]) -> u32 {
    let mut c = flate2::Crc::new();
    c.update(b);
    c.sum()
}

/// `len` bytes of `file` from byte `at`.
pub fn read_at(file: &File, len: usize, at: u64) -> io::Result<Vec<u8>> {
    let mut b = vec![0u8; len];
    file.read_exact_at(&mut b, at)?;
    Ok(b)
}

/// The GPT's byte order for a GUID written as text.
pub fn guid_bytes(s: &str) -> [u8; 16] {
    let h: Vec<u8> = s
        .chars()
        .filter(|c| *c != '-')
        .collect::<String>()
        .as_bytes()
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect();
    [
        h[3], h[2], h[1], h[0], h[5], h[4], h[7], h[6], h[8], h[9], h[10], h[11], h[12], h[13],
        h[14], h[15],
    ]
}

/// Whether `b` (a header's sector, or its first [`GPT_HEADER_LEN`] bytes)
/// is a GPT header.
pub fn is_gpt_header(b: &[u8]) -> bool {
    b.starts_with(GPT_SIGNATURE)
}

/// A GPT header's fields, as read (nothing checked: see
/// [`is_gpt_header`] and [`GptHeader::array_in_bounds`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptHeader {
    /// The header's own size, over which its CRC runs.
    pub header_len: u32,
    pub my_lba: u64,
    /// The other copy's LBA: the backup's for the primary.
    pub alternate_lba: u64,
    pub first_usable: u64,
    pub last_usable: u64,
    pub entries_lba: u64,
    pub entries: u32,
    pub entry_len: u32,
    pub entries_crc: u32,
}

impl GptHeader {
    /// The fields of the header `b` (at least [`GPT_HEADER_LEN`] bytes).
    pub fn read(b: &[u8]) -> GptHeader {
        GptHeader {
            header_len: u32_at(b, header_at::SIZE),
            my_lba: u64_at(b, header_at::MY_LBA),
            alternate_lba: u64_at(b, header_at::ALTERNATE_LBA),
            first_usable: u64_at(b, header_at::FIRST_USABLE),
            last_usable: u64_at(b, header_at::LAST_USABLE),
            entries_lba: u64_at(b, header_at::ENTRIES_LBA),
            entries: u32_at(b, header_at::ENTRIES),
            entry_len: u32_at(b, header_at::ENTRY_LEN),
            entries_crc: u32_at(b, header_at::ENTRIES_CRC),
        }
    }

    /// Whether the partition array is one a reader takes: entries of
    /// [`MIN_ENTRY_LEN`] to [`MAX_ENTRY_LEN`] bytes, at most
    /// [`MAX_ENTRIES`] of them (none is allowed).
    pub fn array_in_bounds(&self) -> bool {
        (MIN_ENTRY_LEN..=MAX_ENTRY_LEN).contains(&self.entry_len) && self.entries <= MAX_ENTRIES
    }

    /// The partition array's length in bytes.
    pub fn array_len(&self) -> usize {
        self.entries as usize * self.entry_len as usize
    }
}

/// Writes a GPT header's CRC32: over its first `header_len` bytes, its
/// CRC field zero while it is computed.
pub fn seal_gpt_header(b: &mut [u8], header_len: usize) {
    put_u32(b, header_at::CRC, 0);
    let crc = crc32(&b[..header_len]);
    put_u32(b, header_at::CRC, crc);
}

/// One entry of a GPT's partition array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptEntry {
    /// All zeros: the entry is free.
    pub type_guid: [u8; 16],
    pub unique_guid: [u8; 16],
    pub first_lba: u64,
    /// Inclusive.
    pub last_lba: u64,
}

impl GptEntry {
    /// The fields of the entry `e` (at least 48 bytes).
    pub fn read(e: &[u8]) -> GptEntry {
        GptEntry {
            type_guid: e[entry_at::TYPE].try_into().unwrap(),
            unique_guid: e[entry_at::UNIQUE].try_into().unwrap(),
            first_lba: u64_at(e, entry_at::FIRST_LBA),
            last_lba: u64_at(e, entry_at::LAST_LBA),
        }
    }

    /// Whether a partition is there (its type GUID is not all zeros).
    pub fn is_used(&self) -> bool {
        self.type_guid.iter().any(|b| *b != 0)
    }
}

/// The entries of a partition array of `entry_len`-byte entries, in order
/// (the first is partition 1).
pub fn gpt_entries(array: &[u8], entry_len: usize) -> impl Iterator<Item = GptEntry> + '_ {
    array.chunks(entry_len).map(GptEntry::read)
}

/// The partitions (byte ranges `[start, end)`) of the GPT of `file`
/// (`size` bytes, read with `sector`-byte sectors), as libblkid reads
/// them: every copy (the primary at LBA 1, the backup at the last LBA or
/// where the primary says) whose partition array matches its CRC, so a
/// primary whose array was lost yields to the backup's; when no array
/// matches, the first copy whose array is in bounds, unchecked. Nothing
/// when there is no GPT.
pub fn gpt_ranges(file: &File, size: u64, sector: u64) -> Vec<(u64, u64)> {
    let last = (size / sector).saturating_sub(1);
    let mut copies = vec![1, last];
    let mut checked = Vec::new();
    let mut unchecked = None;
    let mut i = 0;
    while i < copies.len() {
        let header_lba = copies[i];
        i += 1;
        let Ok(b) = read_at(file, GPT_HEADER_LEN, header_lba * sector) else {
            continue;
        };
        if !is_gpt_header(&b) {
            continue;
        }
        let h = GptHeader::read(&b);
        if header_lba == 1
            && (2..last).contains(&h.alternate_lba)
            && !copies.contains(&h.alternate_lba)
        {
            copies.push(h.alternate_lba);
        }
        if !h.array_in_bounds() {
            continue;
        }
        let Ok(array) = read_at(file, h.array_len(), h.entries_lba * sector) else {
            continue;
        };
        let ranges: Vec<(u64, u64)> = gpt_entries(&array, h.entry_len as usize)
            .filter(GptEntry::is_used)
            .map(|e| (e.first_lba * sector, (e.last_lba + 1) * sector))
            .filter(|(s, e)| s < e)
            .collect();
        if crc32(&array) == h.entries_crc {
            checked.extend(ranges);
        } else if unchecked.is_none() {
            unchecked = Some(ranges);
        }
    }
    if checked.is_empty() {
        unchecked.unwrap_or_default()
    } else {
        checked
    }
}

/// Whether `mbr` (its 512 bytes) carries the MBR's signature.
pub fn has_mbr_signature(mbr: &[u8]) -> bool {
    mbr[510..512] == MBR_SIGNATURE
}

/// The bytes of primary entry `i` (0 to 3) in the MBR.
pub fn mbr_slot(i: usize) -> Range<usize> {
    MBR_TABLE + i * MBR_ENTRY_LEN..MBR_TABLE + (i + 1) * MBR_ENTRY_LEN
}

/// One primary entry of an MBR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MbrEntry {
    /// The partition type; 0: the entry is free.
    pub kind: u8,
    /// In 512-byte sectors.
    pub start: u32,
    pub sectors: u32,
}

impl MbrEntry {
    /// The fields of the 16-byte entry `e`.
    pub fn read(e: &[u8]) -> MbrEntry {
        MbrEntry {
            kind: e[mbr_entry_at::TYPE],
            start: u32_at(e, mbr_entry_at::START),
            sectors: u32_at(e, mbr_entry_at::SECTORS),
        }
    }
}

/// The four primary entries of `mbr`, in order.
pub fn mbr_entries(mbr: &[u8]) -> impl Iterator<Item = MbrEntry> + '_ {
    (0..4).map(move |i| MbrEntry::read(&mbr[mbr_slot(i)]))
}

/// MBR partition types of an extended partition (CHS, LBA, Linux), whose
/// logical partitions are found through a chain of EBRs.
pub const MBR_EXTENDED: [u8; 3] = [0x05, 0x0F, 0x85];
/// The most EBRs a chain is followed through.
const MAX_EBRS: usize = 256;

/// The partitions (byte ranges) of the MBR of `file`, its protective
/// entry left out, with each extended partition's logical partitions and
/// the EBRs that list them; nothing without an MBR.
pub fn mbr_ranges(file: &File) -> Vec<(u64, u64)> {
    let Ok(b) = read_at(file, MBR_LEN, 0) else {
        return Vec::new();
    };
    if !has_mbr_signature(&b) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for e in mbr_entries(&b).filter(|e| e.kind != 0 && e.kind != MBR_PROTECTIVE) {
        out.push(sectors_range(u64::from(e.start), u64::from(e.sectors)));
        if MBR_EXTENDED.contains(&e.kind) {
            out.extend(logical_ranges(file, u64::from(e.start)));
        }
    }
    out.retain(|(s, e)| s < e);
    out
}

/// `[start, start + n)` sectors of 512 bytes, as bytes.
fn sectors_range(start: u64, n: u64) -> (u64, u64) {
    (start * MBR_SECTOR, (start + n) * MBR_SECTOR)
}

/// The logical partitions of the extended partition starting at sector
/// `extended` and the EBRs listing them: each EBR's first entry is a
/// partition (from the EBR), its second the next EBR (from the extended
/// partition's start). The chain stops where an EBR lacks its signature,
/// points back, or after [`MAX_EBRS`].
fn logical_ranges(file: &File, extended: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut ebr = extended;
    for _ in 0..MAX_EBRS {
        let Ok(b) = read_at(file, MBR_LEN, ebr * MBR_SECTOR) else {
            break;
        };
        if !has_mbr_signature(&b) {
            break;
        }
        out.push(sectors_range(ebr, 1));
        let mut entries = mbr_entries(&b);
        let (logical, next) = (entries.next().unwrap(), entries.next().unwrap());
        if logical.kind != 0 && logical.sectors > 0 {
            out.push(sectors_range(
                ebr + u64::from(logical.start),
                u64::from(logical.sectors),
            ));
        }
        let following = extended + u64::from(next.start);
        if !MBR_EXTENDED.contains(&next.kind) || next.start == 0 || following <= ebr {
            break;
        }
        ebr = following;
    }
    out
}

/// The partitions (byte ranges) the kernel lists for the block device
/// named `name` (`sda`): nothing for a file or an unknown name.
pub fn kernel_ranges(name: &str) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    if let Ok(dir) = std::fs::read_dir(Path::new("/sys/class/block").join(name)) {
        for e in dir.flatten() {
            let p = e.path();
            let read = |f: &str| -> Option<u64> {
                std::fs::read_to_string(p.join(f)).ok()?.trim().parse().ok()
            };
            if let (Some(start), Some(len)) = (read("start"), read("size")) {
                out.push((start * 512, (start + len) * 512));
            }
        }
    }
    out
}

/// The partitions (byte ranges) of the disk `d`: its GPT's (primary, else
/// backup; read with 512- and with 4096-byte sectors), its MBR's, and for
/// a block device the kernel's list. Sorted, without repeats.
pub fn byte_ranges(file: &File, d: &Disk) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for sector in [512u64, 4096] {
        out.extend(gpt_ranges(file, d.size_bytes, sector));
    }
    out.extend(mbr_ranges(file));
    if let Some(name) = d.path.file_name().map(|n| n.to_string_lossy().into_owned()) {
        out.extend(kernel_ranges(&name));
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_text_in_the_gpts_byte_order() {
        assert_eq!(
            guid_bytes("EBD0A0A2-B9E5-4433-87C0-68B6B72699C7"),
            BASIC_DATA
        );
        let esp = guid_bytes(ESP_TYPE);
        assert_eq!(esp[..4], [0x28, 0x73, 0x2A, 0xC1]);
        assert_eq!(esp[8..], [0xBA, 0x4B, 0x00, 0xA0, 0xC9, 0x3E, 0xC9, 0x3B]);
    }

    /// A disk image of `sectors` 512-byte sectors with a GPT header at
    /// `header_lba` whose array (at `entries_lba`, 128 entries of 128
    /// bytes) holds one partition, over LBAs `first..=last`.
    fn gpt_disk(sectors: u64, header_lba: u64, entries_lba: u64, first: u64, last: u64) -> Vec<u8> {
        let mut disk = vec![0u8; (sectors * 512) as usize];
        let h = (header_lba * 512) as usize;
        disk[h..h + 8].copy_from_slice(GPT_SIGNATURE);
        put_u32(&mut disk[h..], header_at::SIZE, 92);
        put_u64(&mut disk[h..], header_at::ENTRIES_LBA, entries_lba);
        put_u32(&mut disk[h..], header_at::ENTRIES, 128);
        put_u32(&mut disk[h..], header_at::ENTRY_LEN, 128);
        let e = (entries_lba * 512) as usize;
        disk[e..][entry_at::TYPE].copy_from_slice(&BASIC_DATA);
        put_u64(&mut disk[e..], entry_at::FIRST_LBA, first);
        put_u64(&mut disk[e..], entry_at::LAST_LBA, last);
        disk
    }

    fn file_of(bytes: &[u8]) -> (tempfile::NamedTempFile, File) {
        let t = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(t.path(), bytes).unwrap();
        let f = File::open(t.path()).unwrap();
        (t, f)
    }

    #[test]
    fn the_primary_gpt_is_read_else_the_backup() {
        let sectors = 256;
        let primary = gpt_disk(sectors, 1, 2, 34, 99);
        let (_t, f) = file_of(&primary);
        assert_eq!(
            gpt_ranges(&f, sectors * 512, 512),
            vec![(34 * 512, 100 * 512)]
        );
        // Only a backup header, at the last LBA, its array before it.
        let backup = gpt_disk(sectors, sectors - 1, sectors - 33, 40, 49);
        let (_t, f) = file_of(&backup);
        assert_eq!(
            gpt_ranges(&f, sectors * 512, 512),
            vec![(40 * 512, 50 * 512)]
        );
        // No GPT at all.
        let zeros = vec![0u8; (sectors * 512) as usize];
        let (_t, f) = file_of(&zeros);
        assert!(gpt_ranges(&f, sectors * 512, 512).is_empty());
    }

    /// A GPT disk whose primary and backup copies hold one partition
    /// each, their arrays sealed with their CRCs.
    fn sealed_gpt(sectors: u64, primary: (u64, u64), backup: (u64, u64)) -> Vec<u8> {
        let mut disk = vec![0u8; (sectors * 512) as usize];
        for (header_lba, entries_lba, (first, last)) in
            [(1, 2, primary), (sectors - 1, sectors - 33, backup)]
        {
            let e = (entries_lba * 512) as usize;
            disk[e..][entry_at::TYPE].copy_from_slice(&BASIC_DATA);
            put_u64(&mut disk[e..], entry_at::FIRST_LBA, first);
            put_u64(&mut disk[e..], entry_at::LAST_LBA, last);
            let crc = crc32(&disk[e..e + 128 * 128]);
            let h = (header_lba * 512) as usize;
            disk[h..h + 8].copy_from_slice(GPT_SIGNATURE);
            put_u32(&mut disk[h..], header_at::SIZE, 92);
            put_u64(&mut disk[h..], header_at::MY_LBA, header_lba);
            put_u64(
                &mut disk[h..],
                header_at::ALTERNATE_LBA,
                if header_lba == 1 { sectors - 1 } else { 1 },
            );
            put_u64(&mut disk[h..], header_at::ENTRIES_LBA, entries_lba);
            put_u32(&mut disk[h..], header_at::ENTRIES, 128);
            put_u32(&mut disk[h..], header_at::ENTRY_LEN, 128);
            put_u32(&mut disk[h..], header_at::ENTRIES_CRC, crc);
            seal_gpt_header(&mut disk[h..], 92);
        }
        disk
    }

    #[test]
    fn a_primary_array_lost_under_an_intact_header_yields_to_the_backup() {
        let sectors = 256;
        let disk = sealed_gpt(sectors, (34, 99), (34, 99));
        let (_t, f) = file_of(&disk);
        assert_eq!(
            gpt_ranges(&f, sectors * 512, 512),
            vec![(34 * 512, 100 * 512); 2]
        );
        // The primary's array zeroed, its header left: the backup's
        // partition is still found (libblkid, partx and sgdisk read it).
        let mut lost = disk.clone();
        lost[2 * 512..34 * 512].fill(0);
        let (_t, f) = file_of(&lost);
        assert_eq!(
            gpt_ranges(&f, sectors * 512, 512),
            vec![(34 * 512, 100 * 512)]
        );
        // Two copies that differ: both are erased.
        let differ = sealed_gpt(sectors, (34, 99), (120, 129));
        let (_t, f) = file_of(&differ);
        assert_eq!(
            gpt_ranges(&f, sectors * 512, 512),
            vec![(34 * 512, 100 * 512), (120 * 512, 130 * 512)]
        );
    }

    #[test]
    fn logical_partitions_are_found_through_the_chain_of_ebrs() {
        let mut disk = vec![0u8; 64 * 1024 * 512];
        let put = |b: &mut [u8], at: u64, i: usize, kind: u8, start: u32, sectors: u32| {
            let sector = &mut b[(at * 512) as usize..][..512];
            sector[510..512].copy_from_slice(&MBR_SIGNATURE);
            let e = &mut sector[mbr_slot(i)];
            e[mbr_entry_at::TYPE] = kind;
            put_u32(e, mbr_entry_at::START, start);
            put_u32(e, mbr_entry_at::SECTORS, sectors);
        };
        // A primary partition, and an extended one from sector 10240 with
        // three logical partitions, each 2048 sectors after its EBR.
        put(&mut disk, 0, 0, 0x83, 2048, 8192);
        put(&mut disk, 0, 1, 0x05, 10240, 40960);
        for (k, ebr) in [10240u64, 20480, 30720].into_iter().enumerate() {
            put(&mut disk, ebr, 0, 0x83, 2048, 4096);
            if k < 2 {
                // The next EBR, 10240 sectors on, from the extended
                // partition's start (sector 10240).
                put(&mut disk, ebr, 1, 0x05, ebr as u32, 8192);
            }
        }
        let (_t, f) = file_of(&disk);
        let mut found = mbr_ranges(&f);
        found.sort();
        let mut want = vec![sectors_range(2048, 8192), sectors_range(10240, 40960)];
        for ebr in [10240u64, 20480, 30720] {
            want.push(sectors_range(ebr, 1));
            want.push(sectors_range(ebr + 2048, 4096));
        }
        want.sort();
        assert_eq!(found, want);
        // A chain that points back ends.
        put(&mut disk, 30720, 1, 0x05, 10240, 8192);
        let (_t, f) = file_of(&disk);
        assert_eq!(mbr_ranges(&f).len(), found.len());
    }

    #[test]
    fn mbr_entries_but_the_protective_one() {
        let mut mbr = vec![0u8; 4096];
        mbr[510..512].copy_from_slice(&MBR_SIGNATURE);
        let put = |mbr: &mut [u8], i: usize, kind: u8, start: u32, sectors: u32| {
            let e = &mut mbr[mbr_slot(i)];
            e[mbr_entry_at::TYPE] = kind;
            put_u32(e, mbr_entry_at::START, start);
            put_u32(e, mbr_entry_at::SECTORS, sectors);
        };
        put(&mut mbr, 0, MBR_PROTECTIVE, 1, 7);
        put(&mut mbr, 2, 0x83, 2, 4);
        let kinds: Vec<u8> = mbr_entries(&mbr).map(|e| e.kind).collect();
        assert_eq!(kinds, [MBR_PROTECTIVE, 0, 0x83, 0]);
        let (_t, f) = file_of(&mbr);
        assert_eq!(mbr_ranges(&f), vec![(2 * 512, 6 * 512)]);
    }
}
