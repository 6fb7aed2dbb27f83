//! Erasure figures, side by side in one run, on one target:
//!
//! 1. `metadata` on a disk whose GPT lists ten partitions (each with an
//!    ext4 superblock where mkfs puts it): seconds (goal well under one
//!    per disk), bytes written and read back, regions;
//! 2. `overwrite` against `dd if=/dev/zero bs=4M oflag=direct` over the
//!    same target (goal ≥ 0.9 of dd's rate, read-back included);
//! 3. `discard` (a loop device punches holes in its file): seconds.
//!
//!     cargo bench --bench erase
//!
//! The target is a loop device with direct I/O over a file when run as
//! root, else the file itself (then no discard).
//! SHEPHERD_BENCH_ERASE_MIB (default 2048) sizes it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use shepherd_agent::api::DiskErasure;
use shepherd_agent::api::disk_erasure::Mode;
use shepherd_agent::install::Counters;
use shepherd_agent::install::disk::Disk;
use shepherd_agent::install::erase::{self, Kernel};

const MIB: u64 = 1 << 20;

struct Target {
    file: PathBuf,
    device: Option<String>,
    _dir: tempfile::TempDir,
}

impl Target {
    fn new(mib: u64) -> Target {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let file = dir.path().join("disk.img");
        std::fs::File::create(&file)
            .unwrap()
            .set_len(mib * MIB)
            .unwrap();
        let root = nix_root();
        let device = root
            .then(|| {
                let out = Command::new("losetup")
                    .args(["--find", "--show", "--direct-io=on"])
                    .arg(&file)
                    .output()
                    .ok()?;
                out.status
                    .success()
                    .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
            })
            .flatten();
        Target {
            file,
            device,
            _dir: dir,
        }
    }

    fn path(&self) -> PathBuf {
        self.device
            .as_ref()
            .map(PathBuf::from)
            .unwrap_or_else(|| self.file.clone())
    }

    fn disk(&self, mib: u64) -> Disk {
        match &self.device {
            Some(d) => Disk::probe(Path::new(d)).unwrap(),
            None => Disk::file(&self.file, mib * MIB).unwrap(),
        }
    }

    /// Ten partitions in a GPT, each with ext4's magic, as an installed
    /// system leaves them.
    fn partition(&self, mib: u64) {
        let each = (mib - 2) / 10;
        let script = format!("label: gpt\n{}", format!(",{each}M,L\n").repeat(10));
        let mut child = Command::new("sfdisk")
            .args(["--quiet", "--no-reread"])
            .arg(self.path())
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("sfdisk");
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success());
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.path())
            .unwrap();
        for i in 0..10 {
            let start = MIB + i * each * MIB;
            std::os::unix::fs::FileExt::write_all_at(&f, &[0x53, 0xef], start + 1080).unwrap();
        }
        f.sync_all().unwrap();
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(d) = &self.device {
            let _ = Command::new("losetup").args(["-d", d]).status();
        }
    }
}

fn nix_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"))
}

fn run(mode: Mode, disk: &Disk) -> (Duration, erase::Erased) {
    let req = DiskErasure {
        mode: mode as i32,
        ..Default::default()
    };
    let t = Instant::now();
    let e = erase::erase(
        &req,
        std::slice::from_ref(disk),
        &Kernel,
        &Counters::default(),
        Duration::from_secs(3600),
        &|_| {},
    )
    .unwrap();
    (t.elapsed(), e)
}

fn main() {
    let mib: u64 = std::env::var("SHEPHERD_BENCH_ERASE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2048);
    let t = Target::new(mib);
    let disk = t.disk(mib);
    let kind = if t.device.is_some() {
        "loop device, direct I/O"
    } else {
        "file"
    };
    println!("erase figures: a {mib} MiB target ({kind}) on this machine\n");
    println!("| figure | value | goal |");
    println!("|---|---|---|");

    t.partition(mib);
    let (took, e) = run(Mode::Metadata, &disk);
    println!(
        "| metadata: seconds (10 partitions; {} written and read back; {}) | {:.3} | < 1 |",
        shepherd_agent::install::disk::bytes(e.disks[0].bytes),
        e.disks[0].how,
        took.as_secs_f64()
    );

    // dd's rate over the same target, then the agent's.
    let t0 = Instant::now();
    let dd = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", t.path().display()))
        .args(["bs=4M", "oflag=direct", "conv=notrunc,fsync", "status=none"])
        .arg(format!("count={}", mib / 4))
        .status()
        .unwrap();
    assert!(dd.success());
    let dd_rate = (mib * MIB) as f64 / t0.elapsed().as_secs_f64();
    let (took, _) = run(Mode::Overwrite, &disk);
    let rate = (mib * MIB) as f64 / took.as_secs_f64();
    println!(
        "| overwrite: MiB/s, read-back included (dd: {:.0} MiB/s) | {:.0} ({:.2} of dd) | ≥ 0.9 of dd |",
        dd_rate / MIB as f64,
        rate / MIB as f64,
        rate / dd_rate
    );
    if t.device.is_some() {
        let (took, _) = run(Mode::Discard, &disk);
        println!(
            "| discard: seconds, read-back included (the loop device punches holes) | {:.3} | |",
            took.as_secs_f64()
        );
    } else {
        println!("| discard | not run: no loop device (run as root) | |");
    }
}
