//! Where a next system looks for what the last one left: the magics
//! libblkid's probers (util-linux 2.39+, `libblkid/src/superblocks`,
//! `partitions`) and mdadm and cryptsetup compare, at the offsets they
//! read, from a volume's start or from its end. What `wipefs --no-act`
//! lists is found here too.
//!
//! A magic is matched bare: libblkid checks more (checksums, geometry),
//! so this finds everything it would and sometimes more, which is right
//! for an erasure (it zeroes what is found) and for its check afterwards
//! (it fails when anything is). The probers that compute their offsets
//! from what they read (NTFS's MFT, BitLocker's FVE block, UDF's anchor,
//! ISO 9660's root) are found by the magic they read first, which sits in
//! a volume's first MiB.

use std::fs::File;

use crate::install::partitions::read_at;

/// Where a magic sits in a volume of `len` bytes.
#[derive(Clone, Copy)]
pub enum At {
    /// Bytes from the volume's start.
    Start(u64),
    /// This many whole 512-byte sectors before the end, plus these bytes
    /// (as libblkid counts: the volume's length in whole sectors).
    Sector { back: u64, plus: u64 },
    /// From the volume's length (`None`: the volume is too small for it).
    End(fn(u64) -> Option<u64>),
}

/// One place a prober looks, and what it compares there.
pub struct Signature {
    /// As libblkid reports it (`TYPE`, or `PTTYPE` for a partition table).
    pub name: &'static str,
    pub at: At,
    pub magic: &'static [u8],
}

/// A signature found: whose, and at which byte of the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub name: &'static str,
    pub offset: u64,
    pub len: u64,
}

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.name, self.offset)
    }
}

const fn start(name: &'static str, at: u64, magic: &'static [u8]) -> Signature {
    Signature {
        name,
        at: At::Start(at),
        magic,
    }
}

const fn sector(name: &'static str, back: u64, plus: u64, magic: &'static [u8]) -> Signature {
    Signature {
        name,
        at: At::Sector { back, plus },
        magic,
    }
}

const fn end(name: &'static str, at: fn(u64) -> Option<u64>, magic: &'static [u8]) -> Signature {
    Signature {
        name,
        at: At::End(at),
        magic,
    }
}

const MD_LE: &[u8] = &[0xfc, 0x4e, 0x2b, 0xa9];
const MD_BE: &[u8] = &[0xa9, 0x2b, 0x4e, 0xfc];
const LVM2: &[u8] = b"LVM2 001";
const SWAP1: &[u8] = b"SWAP-SPACE";
const SWAP2: &[u8] = b"SWAPSPACE2";
const BCACHE: &[u8] = &[
    0xc6, 0x85, 0x73, 0xf6, 0x4e, 0x1a, 0x45, 0xca, 0x82, 0x65, 0xf5, 0x7f, 0x48, 0xba, 0x6d, 0x81,
];
const BCACHEFS: &[u8] = &[
    0xc6, 0x85, 0x73, 0xf6, 0x66, 0xce, 0x90, 0xa9, 0xd9, 0x6a, 0x60, 0xcf, 0x80, 0x3d, 0xf7, 0xef,
];
const PROMISE: &[u8] = b"Promise Technology, Inc.";
const LUKS: &[u8] = b"LUKS\xba\xbe";
const LUKS2_SECOND: &[u8] = b"SKUL\xba\xbe";
const EXT: &[u8] = &[0x53, 0xef];

/// `n` 512-byte sectors before the end.
fn sectors_before_end(len: u64, n: u64) -> Option<u64> {
    (len / 512).checked_sub(n).map(|s| s * 512)
}

/// md 0.90: the last 64 KiB-aligned 64 KiB but one.
pub(super) fn md_0_90(len: u64) -> Option<u64> {
    (len > 0x10000).then(|| (len & !0xffff) - 0x10000)
}

/// md 1.0: 8 KiB before the end, 4 KiB-aligned.
pub(super) fn md_1_0(len: u64) -> Option<u64> {
    (len & !0xfff).checked_sub(0x2000)
}

/// ZFS's third and fourth labels' nvlists (each label 256 KiB, its nvlist
/// 16 KiB in), the last two 256 KiB-aligned quarters of a MiB.
fn zfs_label(len: u64, back: u64) -> Option<u64> {
    (len - len % 0x40000).checked_sub(back).map(|l| l + 0x4000)
}

/// Every place the probers look. Sorted by where, from the start, then
/// from the end.
pub static SIGNATURES: &[Signature] = &[
    // Partition tables.
    start("dos", 510, &[0x55, 0xaa]),
    start("gpt", 512, b"EFI PART"),
    start("gpt", 4096, b"EFI PART"),
    sector("gpt", 1, 0, b"EFI PART"),
    end("gpt", |l| l.checked_sub(4096), b"EFI PART"),
    start("mac", 0, b"ER"),
    start("sgi", 0, &[0x0b, 0xe5, 0xa9, 0x41]),
    start("sun", 508, &[0xda, 0xbe]),
    start("bsd", 64, &[0x57, 0x45, 0x56, 0x82]),
    start("bsd", 128, &[0x57, 0x45, 0x56, 0x82]),
    start("bsd", 512, &[0x57, 0x45, 0x56, 0x82]),
    start("solaris", 524, &[0xee, 0xde, 0x0d, 0x60]),
    start("aix", 0, &[0xc9, 0xc2, 0xd4, 0xc1]),
    // RAID members and volume managers.
    start("linux_raid_member", 0, MD_LE),
    start("linux_raid_member", 4096, MD_LE),
    end("linux_raid_member", md_0_90, MD_LE),
    end("linux_raid_member", md_0_90, MD_BE),
    end("linux_raid_member", md_1_0, MD_LE),
    start("LVM2_member", 0, b"LABELONE"),
    start("LVM2_member", 24, LVM2),
    start("LVM2_member", 512, b"LABELONE"),
    start("LVM2_member", 536, LVM2),
    start("LVM2_member", 1024, b"LABELONE"),
    start("LVM2_member", 1048, LVM2),
    start("LVM2_member", 1536, b"LABELONE"),
    start("LVM2_member", 1560, LVM2),
    start("LVM1_member", 0, b"HM"),
    start("hpt37x_raid_member", 4640, &[0xf0, 0x16, 0x78, 0x5a]),
    start("hpt37x_raid_member", 4640, &[0xfd, 0x16, 0x78, 0x5a]),
    start("stratis", 516, b"!Stra0tis\x86\xff\x02^Arh"),
    start("stratis", 4612, b"!Stra0tis\x86\xff\x02^Arh"),
    start("ubi", 0, b"UBI#"),
    start("VMFS_volume_member", 1 << 20, &[0x0d, 0xd0, 0x01, 0xc0]),
    sector("ddf_raid_member", 1, 0, &[0xde, 0x11, 0xde, 0x11]),
    sector("ddf_raid_member", 257, 0, &[0xde, 0x11, 0xde, 0x11]),
    sector("isw_raid_member", 2, 0, b"Intel Raid ISM Cfg Sig. "),
    sector("lsi_mega_raid_member", 1, 0, b"$XIDE$"),
    sector("nvidia_raid_member", 2, 0, b"NVIDIA  "),
    sector("hpt45x_raid_member", 11, 0, &[0xf3, 0x16, 0x78, 0x5a]),
    sector("hpt45x_raid_member", 11, 0, &[0xfd, 0x16, 0x78, 0x5a]),
    sector("adaptec_raid_member", 1, 0, &[0x37, 0xfc, 0x4d, 0x1e]),
    sector("silicon_medley_raid_member", 1, 0x60, &[0, 0, 0, 0x2f]),
    sector("jmicron_raid_member", 1, 0, b"JM"),
    sector("promise_fasttrack_raid_member", 63, 0, PROMISE),
    sector("promise_fasttrack_raid_member", 255, 0, PROMISE),
    sector("promise_fasttrack_raid_member", 256, 0, PROMISE),
    sector("promise_fasttrack_raid_member", 16, 0, PROMISE),
    sector("promise_fasttrack_raid_member", 399, 0, PROMISE),
    sector("promise_fasttrack_raid_member", 591, 0, PROMISE),
    sector("promise_fasttrack_raid_member", 675, 0, PROMISE),
    sector("promise_fasttrack_raid_member", 735, 0, PROMISE),
    sector("promise_fasttrack_raid_member", 911, 0, PROMISE),
    sector("promise_fasttrack_raid_member", 974, 0, PROMISE),
    sector("promise_fasttrack_raid_member", 991, 0, PROMISE),
    sector("promise_fasttrack_raid_member", 951, 0, PROMISE),
    sector("promise_fasttrack_raid_member", 3087, 0, PROMISE),
    end(
        "drbd",
        |l| l.checked_sub(4096 - 60),
        &[0x83, 0x74, 0x02, 0x6b],
    ),
    end(
        "drbd",
        |l| l.checked_sub(4096 - 60),
        &[0x83, 0x74, 0x02, 0x6c],
    ),
    end(
        "drbd",
        |l| l.checked_sub(4096 - 60),
        &[0x83, 0x74, 0x02, 0x6d],
    ),
    start("drbdmanage_control_volume", 0, b"$DRBDmgr=q"),
    // Encryption and integrity.
    start("crypto_LUKS", 0, LUKS),
    // LUKS2's second header, at each metadata size LUKS2 allows (`luks.rs`'s
    // `AREAS`, which erases the whole area it heads).
    start("crypto_LUKS", 16 << 10, LUKS2_SECOND),
    start("crypto_LUKS", 32 << 10, LUKS2_SECOND),
    start("crypto_LUKS", 64 << 10, LUKS2_SECOND),
    start("crypto_LUKS", 128 << 10, LUKS2_SECOND),
    start("crypto_LUKS", 256 << 10, LUKS2_SECOND),
    start("crypto_LUKS", 512 << 10, LUKS2_SECOND),
    start("crypto_LUKS", 1 << 20, LUKS2_SECOND),
    start("crypto_LUKS", 2 << 20, LUKS2_SECOND),
    start("crypto_LUKS", 4 << 20, LUKS2_SECOND),
    start("DM_verity_hash", 0, b"verity\0\0"),
    start("DM_integrity", 0, b"integrt\0"),
    start("DM_snapshot_cow", 0, b"SnAp"),
    start("BitLocker", 0, b"\xeb\x52\x90-FVE-FS-"),
    start("BitLocker", 0, b"\xeb\x58\x90-FVE-FS-"),
    start("BitLocker", 0, b"\xeb\x58\x90MSWIN4.1"),
    start("cs_fvault2", 88, b"CS"),
    start("vdo", 0, b"dmvdo001"),
    start("bcache", 4120, BCACHE),
    start("ceph_bluestore", 0, b"bluestore block device"),
    // Swap and hibernation images, for 4 to 64 KiB pages.
    start("swap", 4086, SWAP1),
    start("swap", 4086, SWAP2),
    start("swap", 8182, SWAP1),
    start("swap", 8182, SWAP2),
    start("swap", 16374, SWAP1),
    start("swap", 16374, SWAP2),
    start("swap", 32758, SWAP1),
    start("swap", 32758, SWAP2),
    start("swap", 65526, SWAP1),
    start("swap", 65526, SWAP2),
    start("swsuspend", 4086, b"S1SUSPEND"),
    start("swsuspend", 4086, b"S2SUSPEND"),
    start("swsuspend", 4086, b"ULSUSPEND"),
    start("swsuspend", 4086, b"LINHIB0001"),
    // Filesystems.
    start("vfat", 54, b"FAT1"),
    start("vfat", 54, b"MSDOS"),
    start("vfat", 82, b"FAT32   "),
    start("vfat", 82, b"MSWIN"),
    start("ntfs", 3, b"NTFS    "),
    start("exfat", 3, b"EXFAT   "),
    start("ReFS", 0, b"\0\0\0ReFS\0"),
    start("xfs", 0, b"XFSB"),
    start("exfs", 0, b"EXFS"),
    start("ext2/ext3/ext4", 1080, EXT),
    start("btrfs", 65600, b"_BHRfS_M"),
    start("bcachefs", 4120, BCACHEFS),
    start("bcachefs", (2 << 20) + 24, BCACHEFS),
    end("bcachefs", |l| l.checked_sub((1 << 20) - 24), BCACHEFS),
    start("f2fs", 1024, &[0x10, 0x20, 0xf5, 0xf2]),
    start("erofs", 1024, &[0xe2, 0xe1, 0xf5, 0xe0]),
    start("nilfs2", 1030, &[0x34, 0x34]),
    sector("nilfs2", 8, 6, &[0x34, 0x34]),
    start("jfs", 32768, b"JFS1"),
    start("reiserfs", 8212, b"ReIsErFs"),
    start("reiserfs", 8244, b"ReIsErFs"),
    start("reiserfs", 65588, b"ReIsEr"),
    start("reiser4", 65536, b"ReIsEr4"),
    start("iso9660", 32769, b"CD001"),
    start("iso9660", 32777, b"CDROM"),
    start("udf", 32769, b"BEA01"),
    start("udf", 32769, b"NSR0"),
    start("hfsplus", 1024, b"H+"),
    start("hfsplus", 1024, b"HX"),
    start("hfs", 1024, b"BD"),
    start("apfs", 32, b"NXSB"),
    start("ufs", 1372, &[0x19, 0x01, 0x54, 0x19]),
    start("ufs", 9564, &[0x19, 0x01, 0x54, 0x19]),
    start("ufs", 66908, &[0x19, 0x01, 0x54, 0x19]),
    start("ufs", 263516, &[0x19, 0x01, 0x54, 0x19]),
    // ZFS's four labels' nvlists: XDR, either byte order.
    start("zfs_member", 16384, &[0x01, 0x01]),
    start("zfs_member", 16384, &[0x01, 0x00]),
    start("zfs_member", 278528, &[0x01, 0x01]),
    start("zfs_member", 278528, &[0x01, 0x00]),
    end("zfs_member", |l| zfs_label(l, 0x80000), &[0x01, 0x01]),
    end("zfs_member", |l| zfs_label(l, 0x80000), &[0x01, 0x00]),
    end("zfs_member", |l| zfs_label(l, 0x40000), &[0x01, 0x01]),
    end("zfs_member", |l| zfs_label(l, 0x40000), &[0x01, 0x00]),
    start("squashfs", 0, b"hsqs"),
    start("squashfs3", 0, b"sqsh"),
    start("cramfs", 0, &[0x45, 0x3d, 0xcd, 0x28]),
    start("cramfs", 0, &[0x28, 0xcd, 0x3d, 0x45]),
    start("romfs", 0, b"-rom1fs-"),
    start("minix", 1040, &[0x7f, 0x13]),
    start("minix", 1040, &[0x8f, 0x13]),
    start("minix", 1040, &[0x68, 0x24]),
    start("minix", 1040, &[0x78, 0x24]),
    start("minix", 1048, &[0x5a, 0x4d]),
    start("gfs2", 65536, &[0x01, 0x16, 0x19, 0x70]),
    start("ocfs2", 1024, b"OCFSV2"),
    start("ocfs2", 2048, b"OCFSV2"),
    start("ocfs2", 4096, b"OCFSV2"),
    start("ocfs2", 8192, b"OCFSV2"),
    start("ocfs", 8192, b"OracleCFS"),
    start("oracleasm", 32, b"ORCLDISK"),
    start("vxfs", 1024, &[0xf5, 0xfc, 0x01, 0xa5]),
    start("vxfs", 8192, &[0xa5, 0x01, 0xfc, 0xf5]),
    start("nss", 4096, b"SPB5"),
    start("hpfs", 8192, &[0x49, 0xe8, 0x95, 0xf9]),
    start("ubifs", 0, &[0x31, 0x18, 0x10, 0x06]),
    start("befs", 32, b"1SFB"),
    start("befs", 544, b"1SFB"),
    start("mpool", 0, b"mpoolDev"),
    start("zonefs", 0, b"SFOZ"),
    start("scoutfs", 65540, &[0x8b, 0x42, 0x3c, 0x10]),
    start("VMFS", 2 << 20, &[0x5e, 0xf1, 0xab, 0x2f]),
];

/// Where `s` sits in the volume `[start, end)` of the disk, if it fits.
fn offset(s: &Signature, start: u64, end: u64) -> Option<u64> {
    let len = end.checked_sub(start)?;
    let at = match s.at {
        At::Start(at) => at,
        At::Sector { back, plus } => sectors_before_end(len, back)? + plus,
        At::End(f) => f(len)?,
    };
    (at + s.magic.len() as u64 <= len).then_some(start + at)
}

/// A volume's first bytes read at once: every place from the start but
/// the few past ZFS's second label.
const HEAD: u64 = 288 << 10;
/// Its last bytes read at once: every place from the end (Promise's
/// farthest, 3087 sectors back, included).
const TAIL: u64 = 1600 << 10;

/// Every signature of [`SIGNATURES`] in the volume `[start, end)` of
/// `file`. What cannot be read is not found (a disk's read errors show
/// when it is erased). A few reads per volume: its head and its tail
/// whole, then the places past them one by one.
pub fn probe(file: &File, start: u64, end: u64) -> Vec<Found> {
    let len = end.saturating_sub(start);
    let window = |at: u64, n: u64| read_at(file, n as usize, at).ok().map(|b| (at, b));
    let head = window(start, len.min(HEAD));
    let tail = window(end - len.min(TAIL), len.min(TAIL));
    // Whether `magic` is at `at`: in a window read, else read alone.
    let holds = |at: u64, magic: &[u8]| -> bool {
        let n = magic.len();
        for (w, b) in head.iter().chain(&tail) {
            if at >= *w && at + n as u64 <= w + b.len() as u64 {
                let i = (at - w) as usize;
                return &b[i..i + n] == magic;
            }
        }
        read_at(file, n, at).is_ok_and(|b| b == magic)
    };
    let mut found: Vec<Found> = Vec::new();
    for s in SIGNATURES {
        let Some(at) = offset(s, start, end) else {
            continue;
        };
        if holds(at, s.magic) && !found.iter().any(|f| f.offset == at && f.name == s.name) {
            found.push(Found {
                name: s.name,
                offset: at,
                len: s.magic.len() as u64,
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_relative_places_are_libblkids() {
        let len = 64 << 20;
        // md 0.90: 64 KiB-aligned, 64 KiB before; 1.0: 8 KiB before.
        assert_eq!(md_0_90(len), Some(len - 0x10000));
        assert_eq!(md_0_90(len + 4096), Some(len - 0x10000));
        assert_eq!(md_1_0(len + 512), Some(len - 0x2000));
        // ZFS's labels 2 and 3: 512 and 256 KiB before a 256 KiB boundary.
        assert_eq!(zfs_label(len + 1000, 0x80000), Some(len - 0x80000 + 0x4000));
        assert_eq!(zfs_label(len, 0x40000), Some(len - 0x40000 + 0x4000));
        assert_eq!(md_0_90(0x10000), None);
        assert_eq!(sectors_before_end(1024, 3), None);
    }

    #[test]
    fn magics_are_found_where_they_sit_and_nowhere_else() {
        let t = tempfile::NamedTempFile::new().unwrap();
        let len = 8u64 << 20;
        let mut disk = vec![0u8; len as usize];
        // A VMFS volume's magic 1 MiB into, and md 0.90's near the end of,
        // a volume that begins 8 KiB past the first MiB.
        let vol = (1 << 20) + 8192;
        let vmfs = (vol + (1 << 20)) as usize;
        disk[vmfs..vmfs + 4].copy_from_slice(&[0x0d, 0xd0, 0x01, 0xc0]);
        let md = (vol + md_0_90(len - vol).unwrap()) as usize;
        disk[md..md + 4].copy_from_slice(MD_LE);
        std::fs::write(t.path(), &disk).unwrap();
        let f = File::open(t.path()).unwrap();
        let found = probe(&f, vol, len);
        assert_eq!(
            found,
            vec![
                Found {
                    name: "linux_raid_member",
                    offset: md as u64,
                    len: 4
                },
                Found {
                    name: "VMFS_volume_member",
                    offset: vmfs as u64,
                    len: 4
                },
            ]
        );
        assert_eq!(found[1].to_string(), "VMFS_volume_member at byte 2105344");
        // From the disk's start, neither is where a prober looks.
        assert!(probe(&f, 0, len).is_empty());
    }
}
