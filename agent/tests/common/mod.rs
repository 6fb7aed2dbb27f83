//! What the agent's disk tests share: disks (loop devices when this runs
//! as root, files standing for disks otherwise) and GPT images.
#![allow(dead_code)]

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use shepherd_agent::install::disk::Disk;

pub mod source;

pub const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------- disks

/// A disk to write: a loop device over a file when we may make one, else
/// the file itself.
pub struct TestDisk {
    pub file: PathBuf,
    pub device: Option<String>,
    _dir: tempfile::TempDir,
}

pub fn can_loop() -> bool {
    static CAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CAN.get_or_init(|| {
        let root = nix_is_root();
        let ok = root
            && Command::new("losetup")
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
            && Path::new("/dev/loop-control").exists();
        if !ok {
            eprintln!("not root or no loop devices: files stand for the disks");
        }
        ok
    })
}

pub fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

impl TestDisk {
    pub fn new(size: u64) -> TestDisk {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk.img");
        std::fs::File::create(&file).unwrap().set_len(size).unwrap();
        let device = can_loop().then(|| {
            let out = Command::new("losetup")
                .args(["--find", "--show", "--partscan"])
                .arg(&file)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "losetup: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        });
        TestDisk {
            file,
            device,
            _dir: dir,
        }
    }

    pub fn disk(&self) -> Disk {
        match &self.device {
            Some(d) => Disk::probe(Path::new(d)).unwrap(),
            None => Disk::file(&self.file, std::fs::metadata(&self.file).unwrap().len()).unwrap(),
        }
    }

    pub fn path(&self) -> PathBuf {
        match &self.device {
            Some(d) => PathBuf::from(d),
            None => self.file.clone(),
        }
    }

    pub fn read(&self, at: u64, len: usize) -> Vec<u8> {
        let f = std::fs::File::open(self.path()).unwrap();
        let mut b = vec![0u8; len];
        f.read_exact_at(&mut b, at).unwrap();
        b
    }

    pub fn size(&self) -> u64 {
        std::fs::metadata(&self.file).unwrap().len()
    }

    /// Partitions util-linux's `partx` (libblkid's parser) finds on the
    /// disk; None when partx is not installed. (The kernel's own view is
    /// not asked: kernels built without partition table support exist,
    /// this machine's among them.)
    pub fn partitions(&self) -> Option<usize> {
        let out = Command::new("partx")
            .args(["--show", "--noheadings", "--output", "NR"])
            .arg(self.path())
            .output()
            .ok()?;
        Some(String::from_utf8_lossy(&out.stdout).lines().count())
    }
}

impl Drop for TestDisk {
    fn drop(&mut self) {
        if let Some(d) = &self.device {
            let _ = Command::new("losetup").args(["-d", d]).status();
        }
    }
}

// ---------------------------------------------------------------- images

/// A GPT disk image of `size` bytes with two partitions (1 MiB–half,
/// half–end less 1 MiB), filled with data that compresses some but not
/// all the way.
pub fn gpt_image(size: u64) -> Vec<u8> {
    gpt_image_with(size, "0FC63DAF-8483-4772-8E79-3D69D8477DE4")
}

/// The same, its first partition of `first_type` (an EFI system partition's,
/// say).
pub fn gpt_image_with(size: u64, first_type: &str) -> Vec<u8> {
    let sectors = size / 512;
    let mut img = vec![0u8; size as usize];
    // Content: runs of pseudo-random bytes and of zeros.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for (i, chunk) in img.chunks_mut(64 << 10).enumerate() {
        if i % 3 != 2 {
            for b in chunk.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = (x >> 24) as u8 & 0x3f;
            }
        }
    }
    // Protective MBR.
    img[..512].fill(0);
    img[446 + 4] = 0xee;
    img[446 + 1..446 + 4].copy_from_slice(&[0, 2, 0]);
    img[446 + 5..446 + 8].copy_from_slice(&[0xff, 0xff, 0xff]);
    img[446 + 8..446 + 12].copy_from_slice(&1u32.to_le_bytes());
    img[446 + 12..446 + 16]
        .copy_from_slice(&((sectors - 1).min(u32::MAX as u64) as u32).to_le_bytes());
    img[510] = 0x55;
    img[511] = 0xaa;
    // Partition entries: 128 of 128 bytes.
    let mut entries = vec![0u8; 128 * 128];
    let linux = guid_bytes("0FC63DAF-8483-4772-8E79-3D69D8477DE4");
    let first_usable = 34u64;
    let last_usable = sectors - 34;
    let parts = [(2048, sectors / 2 - 1), (sectors / 2, last_usable - 2048)];
    for (i, (start, end)) in parts.iter().enumerate() {
        let e = &mut entries[i * 128..(i + 1) * 128];
        e[..16].copy_from_slice(&if i == 0 {
            guid_bytes(first_type)
        } else {
            linux
        });
        e[16..32].copy_from_slice(&[i as u8 + 1; 16]);
        e[32..40].copy_from_slice(&start.to_le_bytes());
        e[40..48].copy_from_slice(&end.to_le_bytes());
        let name: Vec<u8> = format!("part{}", i + 1)
            .encode_utf16()
            .flat_map(|c| c.to_le_bytes())
            .collect();
        e[56..56 + name.len()].copy_from_slice(&name);
    }
    let entries_crc = crc32fast::hash(&entries);
    let header = |current: u64, backup: u64, entries_lba: u64| {
        let mut h = vec![0u8; 92];
        h[..8].copy_from_slice(b"EFI PART");
        h[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
        h[12..16].copy_from_slice(&92u32.to_le_bytes());
        h[24..32].copy_from_slice(&current.to_le_bytes());
        h[32..40].copy_from_slice(&backup.to_le_bytes());
        h[40..48].copy_from_slice(&first_usable.to_le_bytes());
        h[48..56].copy_from_slice(&last_usable.to_le_bytes());
        h[56..72].copy_from_slice(&[0x42; 16]);
        h[72..80].copy_from_slice(&entries_lba.to_le_bytes());
        h[80..84].copy_from_slice(&128u32.to_le_bytes());
        h[84..88].copy_from_slice(&128u32.to_le_bytes());
        h[88..92].copy_from_slice(&entries_crc.to_le_bytes());
        let crc = crc32fast::hash(&h);
        h[16..20].copy_from_slice(&crc.to_le_bytes());
        let mut sector = vec![0u8; 512];
        sector[..92].copy_from_slice(&h);
        sector
    };
    let last = sectors - 1;
    img[512..1024].copy_from_slice(&header(1, last, 2));
    img[1024..1024 + entries.len()].copy_from_slice(&entries);
    let backup_entries = (last - 32) * 512;
    img[backup_entries as usize..backup_entries as usize + entries.len()].copy_from_slice(&entries);
    img[(last * 512) as usize..].copy_from_slice(&header(last, 1, last - 32));
    img
}

pub fn guid_bytes(s: &str) -> [u8; 16] {
    let h: String = s.chars().filter(|c| *c != '-').collect();
    let b: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    // Mixed endian: the first three fields little-endian.
    [
        b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6], b[8], b[9], b[10], b[11], b[12], b[13],
        b[14], b[15],
    ]
}
