//! Erasing disks the real tools laid out: partition tables by `sgdisk` and
//! `sfdisk`, filesystems by `mkfs.*`, LUKS2 by `cryptsetup`, physical and
//! logical volumes by `pvcreate`, `vgcreate` and `lvcreate`, md arrays'
//! superblocks as mdadm lays them out (this kernel has no md driver to
//! assemble them; `mdadm --examine` and `blkid` read them back). Each
//! layout is erased in each mode a loop device takes, and what libblkid
//! (`wipefs --no-act`, `blkid -p` at each volume), mdadm and cryptsetup
//! find is read before and after: something before, nothing after.
//!
//! Each test prints its rows of the table (layout, mode, found before,
//! found after); `--nocapture` shows them.

use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use shepherd_agent::api::DiskErasure;
use shepherd_agent::api::disk_erasure::Mode;
use shepherd_agent::install::Counters;
use shepherd_agent::install::erase::{self, Kernel};

mod common;
use common::*;

/// Runs a tool of the test's, which must succeed; its output.
fn tool(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether a tool of the test's is installed (`scripts/test` installs
/// them all).
fn has(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn erase_in(d: &TestDisk, mode: Mode) -> Result<erase::Erased, String> {
    erase::erase(
        &DiskErasure {
            mode: mode as i32,
            ..Default::default()
        },
        &[d.disk()],
        &Kernel,
        &Counters::default(),
        Duration::from_secs(300),
        &|l| eprintln!("agent: {l}"),
    )
}

/// Opens the disk for writing.
fn writable(d: &TestDisk) -> std::fs::File {
    std::fs::OpenOptions::new()
        .write(true)
        .open(d.path())
        .unwrap()
}

/// Makes a filesystem (or swap, or a LUKS2 volume) of `kind` in `len`
/// bytes at `at` of the disk: in a file of its own first, then copied in
/// (the tools cannot all write at an offset), holes kept.
fn format(d: &TestDisk, kind: &str, at: u64, len: u64) {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let img = dir.path().join("volume.img");
    std::fs::File::create(&img).unwrap().set_len(len).unwrap();
    let mut cmd = match kind {
        "ext4" => Command::new("mkfs.ext4"),
        "xfs" => Command::new("mkfs.xfs"),
        "btrfs" => Command::new("mkfs.btrfs"),
        "vfat" => Command::new("mkfs.vfat"),
        "swap" => Command::new("mkswap"),
        "luks2" | "luks2-4m" => {
            let key = dir.path().join("key");
            std::fs::write(&key, b"the last tenant's passphrase").unwrap();
            let mut c = Command::new("cryptsetup");
            c.args(["luksFormat", "--batch-mode", "--type", "luks2"])
                .args(["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"])
                .arg("--key-file")
                .arg(&key);
            if kind == "luks2-4m" {
                c.args(["--luks2-metadata-size", "4m", "--luks2-keyslots-size", "8m"]);
            } else {
                c.args(["--luks2-metadata-size", "1m", "--luks2-keyslots-size", "2m"]);
            }
            c
        }
        other => panic!("no tool for {other}"),
    };
    match kind {
        "ext4" => cmd.args(["-q", "-F"]),
        "xfs" | "btrfs" => cmd.args(["-q", "-f"]),
        _ => &mut cmd,
    };
    tool(cmd.arg(&img));
    let src = std::fs::File::open(&img).unwrap();
    let dst = writable(d);
    let mut buf = vec![0u8; MIB as usize];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(MIB) as usize;
        src.read_exact_at(&mut buf[..n], off).unwrap();
        if buf[..n].iter().any(|b| *b != 0) {
            dst.write_all_at(&buf[..n], at + off).unwrap();
        }
        off += n as u64;
    }
    dst.sync_all().unwrap();
}

/// Partitions made by `sgdisk`, one per size (MiB); their byte ranges as
/// (start, length).
fn sgdisk(d: &TestDisk, sizes: &[u64]) -> Vec<(u64, u64)> {
    let mut cmd = Command::new("sgdisk");
    for (i, mib) in sizes.iter().enumerate() {
        cmd.arg("-n").arg(format!("{}:0:+{mib}M", i + 1));
    }
    tool(cmd.arg(d.path()));
    (1..=sizes.len())
        .map(|n| {
            let info = tool(Command::new("sgdisk").arg(format!("-i{n}")).arg(d.path()));
            let sector = |what: &str| -> u64 {
                let line = info.lines().find(|l| l.starts_with(what)).unwrap();
                line.split_whitespace().nth(2).unwrap().parse().unwrap()
            };
            let (first, last) = (sector("First sector:"), sector("Last sector:"));
            (first * 512, (last + 1 - first) * 512)
        })
        .collect()
}

/// Partitions made by `sfdisk` from `script`; their byte ranges.
fn sfdisk(d: &TestDisk, script: &str) -> Vec<(u64, u64)> {
    let mut child = Command::new("sfdisk")
        .args(["--no-reread", "--no-tell-kernel", "--quiet"])
        .arg(d.path())
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
    let table: serde_json::Value =
        serde_json::from_str(&tool(Command::new("sfdisk").arg("--json").arg(d.path()))).unwrap();
    table["partitiontable"]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["start"].as_u64().unwrap() * 512,
                p["size"].as_u64().unwrap() * 512,
            )
        })
        .collect()
}

/// A volume where a next system would look: its byte range and name.
struct Volume {
    at: u64,
    len: u64,
    name: String,
}

fn volume(name: impl Into<String>, (at, len): (u64, u64)) -> Volume {
    Volume {
        at,
        len,
        name: name.into(),
    }
}

/// What the next system's tools find on the disk: libblkid's every
/// signature on it (`wipefs --no-act`), libblkid's probe at each volume
/// (`blkid -p` from its offset), cryptsetup at each volume, and mdadm on
/// the disk.
fn found(d: &TestDisk, volumes: &[Volume]) -> Vec<String> {
    let mut out = Vec::new();
    let w = Command::new("wipefs")
        .args(["--no-act", "--noheadings", "--output", "TYPE,OFFSET"])
        .arg(d.path())
        .output()
        .unwrap();
    for l in String::from_utf8_lossy(&w.stdout).lines() {
        let mut f = l.split_whitespace();
        if let (Some(t), Some(o)) = (f.next(), f.next()) {
            out.push(format!("{t} at {o} (wipefs)"));
        }
    }
    for v in volumes {
        let b = Command::new("blkid")
            .args([
                "-p",
                "-o",
                "export",
                "-O",
                &v.at.to_string(),
                "-S",
                &v.len.to_string(),
            ])
            .arg(d.path())
            .output()
            .unwrap();
        for l in String::from_utf8_lossy(&b.stdout).lines() {
            if let Some(t) = l
                .strip_prefix("TYPE=")
                .or_else(|| l.strip_prefix("PTTYPE="))
            {
                out.push(format!("{t} in {}", v.name));
            }
        }
        if luks_at(d, v) {
            out.push(format!("LUKS in {} (cryptsetup)", v.name));
        }
    }
    let md = Command::new("mdadm")
        .arg("--examine")
        .arg(d.path())
        .output()
        .unwrap();
    if md.status.success() {
        // mdadm reads partition tables too ("MBR Magic : aa55").
        let text = String::from_utf8_lossy(&md.stdout);
        match text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Version : "))
        {
            Some(v) => out.push(format!("md {v} (mdadm --examine)")),
            None => out.push("a partition table (mdadm --examine)".into()),
        }
    }
    out
}

/// Whether cryptsetup opens a LUKS header in the volume (the volume
/// copied out: cryptsetup reads a device or file from its start).
fn luks_at(d: &TestDisk, v: &Volume) -> bool {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let img = dir.path().join("v.img");
    // LUKS2's second header is at most 4 MiB in, its area 4 MiB long.
    let len = v.len.min(9 * MIB);
    std::fs::write(&img, d.read(v.at, len as usize)).unwrap();
    Command::new("cryptsetup")
        .arg("isLuks")
        .arg(&img)
        .status()
        .unwrap()
        .success()
}

/// Lays out `layout` on a fresh disk of `mib` MiB, erases it in each mode
/// a loop device takes, and prints a row for each: what was found before
/// and after. Nothing may be found after.
fn each_mode(name: &str, mib: u64, layout: &dyn Fn(&TestDisk) -> Vec<Volume>) {
    let mut modes = vec![Mode::Metadata, Mode::Overwrite];
    if can_loop() {
        modes.push(Mode::Discard);
    }
    for mode in modes {
        let d = TestDisk::new(mib * MIB);
        let volumes = layout(&d);
        let before = found(&d, &volumes);
        assert!(!before.is_empty(), "{name}: the tools find it first");
        let e = erase_in(&d, mode).unwrap_or_else(|e| panic!("{name}, {mode:?}: {e}"));
        let after = found(&d, &volumes);
        // A line of its own, past the harness's "test … ".
        println!(
            "\n| {name} | {} | {} | {} | {} |",
            erase::mode_name(mode),
            before.join("; "),
            if after.is_empty() {
                "nothing".to_string()
            } else {
                after.join("; ")
            },
            e.disks[0].how
        );
        assert!(after.is_empty(), "{name}, {mode:?}: still found: {after:?}");
    }
}

#[test]
fn a_gpt_of_every_common_filesystem_swap_and_luks2() {
    each_mode("GPT: ext4, xfs, btrfs, vfat, swap, LUKS2", 560, &|d| {
        let parts = sgdisk(d, &[16, 300, 120, 16, 8, 24]);
        let kinds = ["ext4", "xfs", "btrfs", "vfat", "swap", "luks2-4m"];
        let mut v = vec![volume("the disk", (0, d.size()))];
        for (kind, &(at, len)) in kinds.iter().zip(&parts) {
            format(d, kind, at, len);
            let name = kind.trim_end_matches("-4m").replace("luks2", "LUKS2");
            v.push(volume(format!("the {name} partition"), (at, len)));
        }
        v
    });
}

#[test]
fn an_mbr_with_logical_partitions_behind_their_ebrs() {
    each_mode("MBR: a primary and three logical partitions", 96, &|d| {
        let script = "label: dos\nstart=2048, size=8192, type=83\nstart=10240, size=150000, type=5\n\
                      size=16384, type=83\nsize=16384, type=83\nsize=16384, type=83\n";
        let parts = sfdisk(d, script);
        let mut v = vec![volume("the disk", (0, d.size()))];
        for (i, &(at, len)) in parts
            .iter()
            .enumerate()
            .filter(|(_, p)| p.1 != 150000 * 512)
        {
            format(d, "ext4", at, len);
            v.push(volume(format!("partition {}", i + 1), (at, len)));
        }
        v
    });
}

#[test]
fn a_gpt_whose_primary_array_is_lost() {
    each_mode("GPT, primary array lost (backup read)", 64, &|d| {
        let parts = sgdisk(d, &[16, 16]);
        let mut v = vec![volume("the disk", (0, d.size()))];
        for (i, &p) in parts.iter().enumerate() {
            format(d, "ext4", p.0, p.1);
            v.push(volume(format!("partition {}", i + 1), p));
        }
        writable(d)
            .write_all_at(&vec![0u8; 32 * 512], 2 * 512)
            .unwrap();
        v
    });
}

#[test]
fn a_luks2_volume_whose_second_header_is_past_the_first_mib() {
    each_mode("LUKS2, 4 MiB metadata, over the disk", 64, &|d| {
        format(d, "luks2-4m", 0, d.size());
        vec![volume("the disk", (0, d.size()))]
    });
}

// ------------------------------------------------------------------- md

/// md's superblock, as mdadm writes it for a one-disk RAID1 over a whole
/// disk of `len` bytes, in `version` ("0.90", "1.0", "1.1", "1.2"):
/// where it goes, its bytes, and where the array's data starts and how
/// long it is.
fn md_superblock(version: &str, len: u64) -> (u64, Vec<u8>, u64, u64) {
    let sectors = len / 512;
    let put32 = |b: &mut [u8], at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let put64 = |b: &mut [u8], at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    let fold = |sum: u64| ((sum & 0xffff_ffff) + (sum >> 32)) as u32;
    let words = |b: &[u8]| -> u64 {
        b.chunks(4)
            .map(|w| u64::from(u32::from_le_bytes(w.try_into().unwrap())))
            .sum()
    };
    if version == "0.90" {
        let at = (len & !0xffff) - 0x10000;
        let kib = ((at / 1024) & !63) as u32;
        let mut sb = vec![0u8; 4096];
        put32(&mut sb, 0, 0xa92b_4efc);
        put32(&mut sb, 8, 90);
        put32(&mut sb, 20, 0x5348_4550);
        put32(&mut sb, 24, 1_700_000_000);
        put32(&mut sb, 28, 1);
        put32(&mut sb, 32, kib);
        put32(&mut sb, 36, 1);
        put32(&mut sb, 40, 1);
        put32(&mut sb, 128, 1_700_000_000);
        put32(&mut sb, 132, 1);
        put32(&mut sb, 136, 1);
        put32(&mut sb, 140, 1);
        put32(&mut sb, 156, 1);
        put32(&mut sb, 172, u32::MAX);
        for disk in [512, 3968] {
            put32(&mut sb, disk + 16, 6);
        }
        let sum = fold(words(&sb));
        put32(&mut sb, 152, sum);
        return (at, sb, 0, u64::from(kib) * 1024);
    }
    let (sb_sector, data_offset, data_size, size) = match version {
        "1.0" => {
            let at = (sectors - 16) & !7;
            (at, 0, at - 16, (at - 16) & !127)
        }
        "1.1" => (0, 2048, sectors - 2048, (sectors - 2048) & !127),
        "1.2" => (8, 2048, sectors - 2048, (sectors - 2048) & !127),
        other => panic!("md {other}?"),
    };
    let max_dev = 128usize;
    let mut sb = vec![0u8; 512];
    put32(&mut sb, 0, 0xa92b_4efc);
    put32(&mut sb, 4, 1);
    sb[16..32].copy_from_slice(b"shepherd-md-test");
    sb[32..42].copy_from_slice(b"shepherd:0");
    put64(&mut sb, 64, 1_700_000_000);
    put32(&mut sb, 72, 1);
    put64(&mut sb, 80, size);
    put32(&mut sb, 92, 1);
    put64(&mut sb, 128, data_offset);
    put64(&mut sb, 136, data_size);
    put64(&mut sb, 144, sb_sector);
    sb[168..184].copy_from_slice(b"shepherd-md-disk");
    put64(&mut sb, 192, 1_700_000_000);
    put64(&mut sb, 200, 1);
    put64(&mut sb, 208, u64::MAX);
    put32(&mut sb, 220, max_dev as u32);
    for i in 1..max_dev {
        sb[256 + 2 * i..258 + 2 * i].copy_from_slice(&0xffffu16.to_le_bytes());
    }
    let sum = fold(words(&sb[..256 + 2 * max_dev]));
    put32(&mut sb, 216, sum);
    (sb_sector * 512, sb, data_offset * 512, size * 512)
}

fn md_layout(version: &'static str) {
    each_mode(
        &format!("md {version} over the disk, ext4 in the array"),
        64,
        &|d| {
            let (at, sb, data, len) = md_superblock(version, d.size());
            format(d, "ext4", data, len);
            let f = writable(d);
            f.write_all_at(&sb, at).unwrap();
            f.sync_all().unwrap();
            vec![
                volume("the disk", (0, d.size())),
                volume(format!("the md {version} array"), (data, len)),
            ]
        },
    );
}

#[test]
fn md_0_90_with_a_filesystem_in_its_array() {
    md_layout("0.90");
}

#[test]
fn md_1_0_with_a_filesystem_in_its_array() {
    md_layout("1.0");
}

#[test]
fn md_1_1_with_a_filesystem_in_its_array() {
    md_layout("1.1");
}

#[test]
fn md_1_2_with_a_filesystem_in_its_array() {
    md_layout("1.2");
}

// ------------------------------------------------------------------ LVM

/// An LVM tool run on the loop device alone, without device-mapper (this
/// kernel has none: volumes are made, never activated).
fn lvm(d: &TestDisk, args: &[&str]) -> String {
    let dev = d.path();
    tool(
        Command::new(args[0])
            .args(["--driverloaded", "n", "--devices"])
            .arg(&dev)
            .args(&args[1..]),
    )
}

#[test]
fn an_lvm_physical_volume_with_a_filesystem_and_luks2_in_its_logical_volumes() {
    if !can_loop() || !has("pvcreate") {
        eprintln!("skipped: pvcreate takes block devices only (run as root, with lvm2 installed)");
        return;
    }
    each_mode("LVM: PV on the disk, ext4 and LUKS2 in two LVs", 64, &|d| {
        let dev = d.path();
        let dev = dev.to_str().unwrap();
        lvm(d, &["pvcreate", "--yes", dev]);
        // A name of this disk's own: the loop device is reused.
        let vg = format!("shepherd{}", dev.trim_start_matches("/dev/loop"));
        lvm(d, &["vgcreate", &vg, dev]);
        for lv in ["data", "secret"] {
            lvm(d, &["lvcreate", "-an", "-Zn", "-L", "8M", "-n", lv, &vg]);
        }
        let pe_start: u64 = lvm(
            d,
            &[
                "pvs",
                "--noheadings",
                "--nosuffix",
                "--units",
                "b",
                "-o",
                "pe_start",
                dev,
            ],
        )
        .trim()
        .parse()
        .unwrap();
        // "data /dev/loop0:0-1": each LV's extents on the PV (4 MiB each).
        let segs = lvm(
            d,
            &[
                "lvs",
                "--noheadings",
                "--segments",
                "-o",
                "lv_name,seg_pe_ranges",
                &vg,
            ],
        );
        let mut v = vec![volume("the disk", (0, d.size()))];
        for l in segs.lines() {
            let mut f = l.split_whitespace();
            let (lv, range) = (f.next().unwrap(), f.next().unwrap());
            let (first, last) = range.rsplit(':').next().unwrap().split_once('-').unwrap();
            let (first, last): (u64, u64) = (first.parse().unwrap(), last.parse().unwrap());
            let at = pe_start + first * 4 * MIB;
            let len = (last + 1 - first) * 4 * MIB;
            format(d, if lv == "data" { "ext4" } else { "luks2" }, at, len);
            v.push(volume(format!("the LV {lv}"), (at, len)));
        }
        assert_eq!(v.len(), 3, "{segs}");
        v
    });
}

/// Every signature found, named with its offset, when one is left: the
/// erasure fails rather than call the disk erased.
#[test]
fn a_signature_left_after_the_erasure_fails_it_naming_the_signature_and_offset() {
    let d = TestDisk::new(64 * MIB);
    // A VMFS volume's magic 1 MiB into a partition: past the partition's
    // first MiB, where libblkid looks.
    let parts = sgdisk(&d, &[32]);
    let at = parts[0].0 + MIB;
    let f = writable(&d);
    f.write_all_at(&[0x0d, 0xd0, 0x01, 0xc0], at).unwrap();
    f.sync_all().unwrap();
    let before = found(&d, &[volume("the partition", parts[0])]);
    assert!(
        before.iter().any(|s| s.starts_with("VMFS_volume_member")),
        "{before:?}"
    );
    // Erased like any other: found, zeroed, and gone.
    erase_in(&d, Mode::Metadata).unwrap();
    assert_eq!(
        found(&d, &[volume("the partition", parts[0])]),
        Vec::<String>::new()
    );
    // A signature the erasure did not zero (written where the disk's
    // ends are zeroed, it would be gone; here the check itself is shown
    // to fire): the probe names it.
    let volumes = [erase::metadata::Volume {
        start: parts[0].0,
        end: parts[0].0 + parts[0].1,
        what: "the partition".into(),
    }];
    f.write_all_at(&[0x0d, 0xd0, 0x01, 0xc0], at).unwrap();
    f.sync_all().unwrap();
    let file = std::fs::File::open(d.path()).unwrap();
    let err =
        erase::metadata::check(&file, &d.disk(), &volumes, "the metadata erasure").unwrap_err();
    assert!(
        err.contains(&format!(
            "a VMFS_volume_member signature is still at byte {at} (the partition)"
        )),
        "{err}"
    );
}
