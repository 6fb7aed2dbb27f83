//! Erasing disks for the next tenant, against real block devices (loop
//! devices when this runs as root, files standing for disks otherwise):
//! every mode leaves no trace of what was written first (the whole small
//! disk is read back here), modes a disk does not advertise are refused
//! before anything is erased, and a disk that says it erased and did not
//! is caught by the agent's own read-back.

use std::os::unix::fs::FileExt;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use shepherd_agent::api::disk_erasure::Mode;
use shepherd_agent::api::installation_progress::Phase;
use shepherd_agent::api::{
    DiskErasure, DiskHints, OsInstallationRequest, os_installation_report, os_installation_request,
};
use shepherd_agent::install::disk::Disk;
use shepherd_agent::install::erase::{self, DiskOps, Kernel, SecureErase};
use shepherd_agent::install::{Counters, Installer, Limits};

mod common;
use common::*;

/// Fills the disk with a pattern no erased block holds, over a GPT whose
/// partitions carry an ext4 superblock, an md 1.2 superblock and an LVM
/// label where those live.
fn dirty(d: &TestDisk) -> Vec<u8> {
    let size = d.size();
    let mut img = gpt_image(size);
    // No zero byte left outside the partition tables themselves.
    let tables = MIB as usize;
    let end = img.len() - tables;
    for (i, b) in img[tables..end].iter_mut().enumerate() {
        if *b == 0 {
            *b = 0xA5 ^ (i as u8) | 1;
        }
    }
    let sectors = size / 512;
    let (p1, p2) = (2048 * 512, (sectors / 2) * 512);
    // ext4's magic at 1024 + 56 of the first partition.
    img[(p1 + 1080) as usize..(p1 + 1082) as usize].copy_from_slice(&[0x53, 0xEF]);
    // md 1.2's magic 4 KiB into the second; LVM's label in its second sector.
    img[(p2 + 4096) as usize..(p2 + 4100) as usize].copy_from_slice(&0xa92b4efcu32.to_le_bytes());
    img[(p2 + 512) as usize..(p2 + 520) as usize].copy_from_slice(b"LABELONE");
    // Through the device (its page cache is what the agent reads).
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.path())
        .unwrap();
    f.write_all_at(&img, 0).unwrap();
    f.sync_all().unwrap();
    img
}

fn whole(d: &TestDisk) -> Vec<u8> {
    d.read(0, d.size() as usize)
}

/// Offsets of the first non-zero byte, and how many there are.
fn nonzero(b: &[u8]) -> (Option<usize>, usize) {
    (
        b.iter().position(|x| *x != 0),
        b.iter().filter(|x| **x != 0).count(),
    )
}

fn request(mode: Mode) -> DiskErasure {
    DiskErasure {
        mode: mode as i32,
        ..Default::default()
    }
}

fn run(req: &DiskErasure, disks: &[Disk], ops: &dyn DiskOps) -> Result<erase::Erased, String> {
    erase::erase(
        req,
        disks,
        ops,
        &Counters::default(),
        Duration::from_secs(120),
        &|l| eprintln!("agent: {l}"),
    )
}

/// What blkid's low-level probe and wipefs find on the disk (nothing,
/// once erased).
fn signatures(d: &TestDisk) -> String {
    let out = Command::new("wipefs")
        .arg("--no-act")
        .arg(d.path())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn metadata_leaves_no_partition_table_nor_signature_and_reads_back_zeros() {
    let d = TestDisk::new(64 * MIB);
    let before = dirty(&d);
    assert!(!signatures(&d).trim().is_empty(), "the GPT is found first");
    let e = run(&request(Mode::Metadata), &[d.disk()], &Kernel).unwrap();
    eprintln!("{e}");
    let after = whole(&d);
    // Both ends of the disk and of each partition: zeros.
    let size = d.size() as usize;
    let m = MIB as usize;
    let p2 = (size / 512 / 2) * 512;
    for (at, len) in [(0, m), (size - m, m), (2048 * 512, m), (p2 - m, m), (p2, m)] {
        assert_eq!(nonzero(&after[at..at + len]).0, None, "region at {at}");
    }
    assert_eq!(signatures(&d).trim(), "", "wipefs finds nothing");
    if let Some(n) = d.partitions() {
        assert_eq!(n, 0);
    }
    for magic in [&b"EFI PART"[..], b"LABELONE", &0xa92b4efcu32.to_le_bytes()] {
        assert!(
            !after.windows(magic.len()).any(|w| w == magic),
            "{magic:?} is gone"
        );
    }
    assert_eq!(&after[2048 * 512 + 1080..2048 * 512 + 1082], &[0, 0]);
    // Metadata only: the middle of a partition stays.
    assert_eq!(after[8 * m..9 * m], before[8 * m..9 * m]);
    assert!(e.disks[0].checked >= 5 * MIB, "{e}");
}

#[test]
fn overwrite_leaves_every_byte_zero() {
    let d = TestDisk::new(24 * MIB);
    dirty(&d);
    let counters = Counters::default();
    let e = erase::erase(
        &request(Mode::Overwrite),
        &[d.disk()],
        &Kernel,
        &counters,
        Duration::from_secs(120),
        &|l| eprintln!("agent: {l}"),
    )
    .unwrap();
    assert_eq!(nonzero(&whole(&d)), (None, 0));
    let p = counters.progress(3);
    assert_eq!(p.bytes_written, (24 * MIB) as i64);
    assert_eq!(p.bytes_total, (24 * MIB) as i64);
    assert_eq!(e.disks[0].bytes, 24 * MIB);
}

#[test]
fn discard_erases_a_disk_that_advertises_it_and_is_refused_elsewhere() {
    let d = TestDisk::new(24 * MIB);
    let before = dirty(&d);
    match &d.device {
        Some(_) => {
            // A loop device discards by punching holes into its file; it
            // refuses a secure discard, and that refusal touches nothing.
            let e = run(&request(Mode::Discard), &[d.disk()], &Kernel).unwrap();
            assert_eq!(nonzero(&whole(&d)), (None, 0));
            assert_eq!(e.disks[0].how, "discarded (BLKDISCARD)");
        }
        None => {
            let err = run(&request(Mode::Discard), &[d.disk()], &Kernel).unwrap_err();
            assert!(err.contains("cannot be discarded"), "{err}");
            assert_eq!(whole(&d), before, "nothing erased");
        }
    }
}

#[test]
fn secure_is_refused_on_a_disk_that_advertises_no_erase_of_its_own_before_any_disk_is_touched() {
    let (a, b) = (TestDisk::new(8 * MIB), TestDisk::new(8 * MIB));
    let (before_a, before_b) = (dirty(&a), dirty(&b));
    let err = run(&request(Mode::Secure), &[a.disk(), b.disk()], &Kernel).unwrap_err();
    assert!(err.contains("advertises no secure erase"), "{err}");
    assert!(err.contains("erase it with overwrite"), "{err}");
    assert_eq!(whole(&a), before_a);
    assert_eq!(whole(&b), before_b);
}

/// A disk that answers every erase with success and keeps its data.
struct Liar;

impl DiskOps for Liar {
    fn can_discard(&self, _: &Disk, _: &std::fs::File) -> Result<(), String> {
        Ok(())
    }
    fn discard(&self, _: &std::fs::File, _: u64, _: u64, _: bool) -> std::io::Result<()> {
        Ok(())
    }
    fn secure_erase(&self, _: &Disk, _: &std::fs::File) -> Result<SecureErase, String> {
        Ok(SecureErase::NvmeFormat {
            nsid: 1,
            lbaf: 0,
            ses: 1,
        })
    }
    fn run_secure_erase(
        &self,
        _: &Disk,
        _: &std::fs::File,
        _: &SecureErase,
        _: std::time::Duration,
        _: &dyn Fn(u64),
    ) -> Result<(), String> {
        Ok(())
    }
}

#[test]
fn a_disk_that_says_it_erased_and_did_not_is_caught_by_the_read_back() {
    let d = TestDisk::new(8 * MIB);
    dirty(&d);
    let err = run(&request(Mode::Discard), &[d.disk()], &Liar).unwrap_err();
    assert!(err.contains("still holds data at byte"), "{err}");
    assert!(err.contains("did not"), "{err}");
    // A secure erase need not leave zeros, so it is compared with what
    // the samples held before.
    let err = run(&request(Mode::Secure), &[d.disk()], &Liar).unwrap_err();
    assert!(err.contains("still holds what it held before"), "{err}");
    assert!(err.contains("did not"), "{err}");
}

/// A disk that discards (by writing zeros), securely where it `takes_secure`,
/// and keeps which kind each discard asked for.
struct Discarder {
    takes_secure: bool,
    asked: std::sync::Mutex<Vec<bool>>,
}

impl DiskOps for Discarder {
    fn can_discard(&self, _: &Disk, _: &std::fs::File) -> Result<(), String> {
        Ok(())
    }
    fn discard(&self, f: &std::fs::File, at: u64, len: u64, secure: bool) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt as _;
        self.asked.lock().unwrap().push(secure);
        if secure && !self.takes_secure {
            return Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        f.write_all_at(&vec![0u8; len as usize], at)
    }
    fn secure_erase(&self, _: &Disk, _: &std::fs::File) -> Result<SecureErase, String> {
        Err("no".into())
    }
    fn run_secure_erase(
        &self,
        _: &Disk,
        _: &std::fs::File,
        _: &SecureErase,
        _: std::time::Duration,
        _: &dyn Fn(u64),
    ) -> Result<(), String> {
        unreachable!()
    }
}

#[test]
fn discard_is_secure_where_the_disk_takes_it_and_plain_where_it_refuses() {
    for (takes_secure, how, asked) in [
        (true, "discarded (BLKSECDISCARD)", vec![true]),
        (false, "discarded (BLKDISCARD)", vec![true, false]),
    ] {
        let d = TestDisk::new(8 * MIB);
        dirty(&d);
        let ops = Discarder {
            takes_secure,
            asked: Default::default(),
        };
        let e = run(&request(Mode::Discard), &[d.disk()], &ops).unwrap();
        assert_eq!(e.disks[0].how, how);
        assert_eq!(nonzero(&whole(&d)), (None, 0));
        assert_eq!(*ops.asked.lock().unwrap(), asked, "{how}");
    }
}

/// A disk with an erase of its own (`how`) that leaves what no key
/// decrypts: random bytes (a cryptographic erase), with `keep` bytes from
/// `keep_at` left as they were.
struct OwnErase {
    how: SecureErase,
    keep_at: u64,
    keep: u64,
}

impl DiskOps for OwnErase {
    fn can_discard(&self, _: &Disk, _: &std::fs::File) -> Result<(), String> {
        Err("no".into())
    }
    fn discard(&self, _: &std::fs::File, _: u64, _: u64, _: bool) -> std::io::Result<()> {
        unreachable!()
    }
    fn secure_erase(&self, _: &Disk, _: &std::fs::File) -> Result<SecureErase, String> {
        Ok(self.how.clone())
    }
    fn run_secure_erase(
        &self,
        d: &Disk,
        f: &std::fs::File,
        _: &SecureErase,
        _: std::time::Duration,
        _: &dyn Fn(u64),
    ) -> Result<(), String> {
        use rand::RngCore as _;
        use std::os::unix::fs::FileExt as _;
        let mut buf = vec![0u8; MIB as usize];
        // Whole MiB at a time: the kept span is MiB-aligned.
        for at in (0..d.size_bytes).step_by(MIB as usize) {
            if (self.keep_at..self.keep_at.saturating_add(self.keep)).contains(&at) {
                continue;
            }
            rand::rng().fill_bytes(&mut buf);
            f.write_all_at(&buf, at).map_err(|e| e.to_string())?;
        }
        f.sync_all().map_err(|e| e.to_string())
    }
}

fn crypto() -> SecureErase {
    SecureErase::ScsiSanitize(shepherd_agent::install::sg::scsi::Sanitize::CryptoErase)
}

#[test]
fn a_secure_erase_may_leave_noise_but_not_what_was_there() {
    let d = TestDisk::new(8 * MIB);
    let before = dirty(&d);
    let e = run(
        &request(Mode::Secure),
        &[d.disk()],
        &OwnErase {
            how: crypto(),
            keep_at: u64::MAX,
            keep: 0,
        },
    )
    .unwrap();
    assert_eq!(e.disks[0].how, "SCSI SANITIZE (cryptographic erase)");
    assert!(e.disks[0].checked >= 2 * MIB, "{e}");
    assert_ne!(whole(&d), before);
    // The last MiB kept (a disk that skipped its end): caught.
    dirty(&d);
    let err = run(
        &request(Mode::Secure),
        &[d.disk()],
        &OwnErase {
            how: crypto(),
            keep_at: 7 * MIB,
            keep: MIB,
        },
    )
    .unwrap_err();
    assert!(
        err.contains("still holds what it held before at bytes 7340032.."),
        "{err}"
    );
}

#[test]
fn hints_choose_which_disks_and_the_boot_disk_only_when_allowed() {
    let (small, big) = (TestDisk::new(8 * MIB), TestDisk::new(24 * MIB));
    let (before_small, _) = (dirty(&small), dirty(&big));
    let mut req = request(Mode::Overwrite);
    req.disk = Some(DiskHints {
        min_size_bytes: Some((16 * MIB) as i64),
        ..Default::default()
    });
    let e = run(&req, &[small.disk(), big.disk()], &Kernel).unwrap();
    assert_eq!(e.disks.len(), 1);
    assert_eq!(nonzero(&whole(&big)), (None, 0));
    assert_eq!(whole(&small), before_small, "not chosen: untouched");
    // The boot disk: only when allowed.
    let mut boot = small.disk();
    boot.boot = true;
    let err = run(&request(Mode::Overwrite), &[boot.clone()], &Kernel).unwrap_err();
    assert!(err.contains("boot disk"), "{err}");
    assert_eq!(whole(&small), before_small);
    // No hint matching: named.
    req.disk = Some(DiskHints {
        serial: "NOPE".into(),
        ..Default::default()
    });
    let err = run(&req, &[small.disk()], &Kernel).unwrap_err();
    assert!(err.contains("no disk matches"), "{err}");
    assert!(err.contains("serial \"NOPE\""), "{err}");
}

/// The runtime the resident agent's installer runs on.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The installer's answer once its job in hand is done.
async fn answered(installer: &mut Installer) -> shepherd_agent::install::Answer {
    loop {
        if let Some(a) = installer.poll(&|l| eprintln!("agent: {l}")) {
            return a;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn the_resident_agent_answers_an_erasure_and_shows_its_progress() {
    let rt = runtime();
    let d = TestDisk::new(16 * MIB);
    dirty(&d);
    let state = tempfile::tempdir().unwrap();
    let record = state.path().join("agent.installation");
    let disk = d.disk();
    let answer = rt.block_on(async {
        let mut installer = Installer::new(Some(record.clone()));
        let req = OsInstallationRequest {
            generation: 4,
            r#type: Some(os_installation_request::Type::Erasure(request(
                Mode::Overwrite,
            ))),
        };
        let log: Arc<dyn Fn(std::fmt::Arguments<'_>) + Send + Sync> =
            Arc::new(|l| eprintln!("agent: {l}"));
        let d2 = disk.clone();
        assert!(
            installer
                .request(
                    req.clone(),
                    move || vec![d2],
                    Limits::default(),
                    log.clone()
                )
                .is_none(),
            "started"
        );
        let p = installer.progress().unwrap();
        assert!(
            [Phase::Erasing as i32, Phase::Done as i32].contains(&p.phase),
            "{p:?}"
        );
        answered(&mut installer).await
    });
    assert_eq!(answer.report.generation, 4);
    assert!(
        matches!(
            answer.report.result,
            Some(os_installation_report::Result::Success(_))
        ),
        "{:?}",
        answer.report
    );
    assert!(!answer.reboot, "an erasure never reboots");
    assert_eq!(nonzero(&whole(&d)), (None, 0));
    // Asked again (the answer lost), it is answered from the record.
    let again = rt.block_on(async {
        let mut installer = Installer::new(Some(record.clone()));
        let req = OsInstallationRequest {
            generation: 4,
            r#type: Some(os_installation_request::Type::Erasure(request(
                Mode::Overwrite,
            ))),
        };
        installer.request(req, Vec::new, Limits::default(), Arc::new(|_| {}))
    });
    assert!(
        matches!(
            again.map(|a| a.report.result),
            Some(Some(os_installation_report::Result::Success(_)))
        ),
        "answered from the record"
    );
    // An erasure whose disks cannot be chosen is answered at once.
    let refused = rt.block_on(async {
        let mut installer = Installer::new(None);
        let mut e = request(Mode::Metadata);
        e.disk = Some(DiskHints {
            serial: "NOPE".into(),
            ..Default::default()
        });
        installer.request(
            OsInstallationRequest {
                generation: 5,
                r#type: Some(os_installation_request::Type::Erasure(e)),
            },
            move || vec![disk],
            Limits::default(),
            Arc::new(|_| {}),
        )
    });
    match refused.and_then(|a| a.report.result) {
        Some(os_installation_report::Result::Error(e)) => {
            assert!(e.error.contains("no disk matches"), "{}", e.error)
        }
        other => panic!("{other:?}"),
    }
}

/// An erasure cut short (the agent killed, its record left saying it had
/// begun) is never answered from that record: its successor runs it again
/// whole, and only then reports it done.
#[test]
fn an_erasure_cut_short_by_a_restart_is_run_again_whole() {
    let rt = runtime();
    let d = TestDisk::new(16 * MIB);
    dirty(&d);
    let state = tempfile::tempdir().unwrap();
    let record = state.path().join("agent.installation");
    // What the killed agent left: generation 6 begun, its disk half done.
    shepherd_agent::install::record::write(
        &record,
        &shepherd_agent::install::record::Record {
            generation: 6,
            outcome: shepherd_agent::install::record::Outcome::Started,
            disk: None,
            reboot: false,
            erase: true,
        },
    )
    .unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.path())
        .unwrap();
    f.write_all_at(&vec![0; 8 * MIB as usize], 0).unwrap();
    f.sync_all().unwrap();
    assert_ne!(nonzero(&whole(&d)), (None, 0), "the tenant's data is left");
    let disk = d.disk();
    let answer = rt.block_on(async {
        let mut installer = Installer::new(Some(record.clone()));
        let req = OsInstallationRequest {
            generation: 6,
            r#type: Some(os_installation_request::Type::Erasure(request(
                Mode::Overwrite,
            ))),
        };
        assert!(
            installer
                .request(req, move || vec![disk], Limits::default(), Arc::new(|_| {}))
                .is_none(),
            "begun again, not answered from the record"
        );
        answered(&mut installer).await
    });
    assert!(
        matches!(
            answer.report.result,
            Some(os_installation_report::Result::Success(_))
        ),
        "{:?}",
        answer.report
    );
    assert_eq!(nonzero(&whole(&d)), (None, 0), "every byte erased");
}

#[test]
fn an_ata_erase_longer_than_the_deadline_is_refused_before_it_starts() {
    let d = TestDisk::new(8 * MIB);
    let before = dirty(&d);
    // run() gives the erasure two minutes; the disk says six.
    let slow = OwnErase {
        how: SecureErase::AtaSecurityErase {
            enhanced: false,
            minutes: Some(6),
        },
        keep_at: 0,
        keep: u64::MAX,
    };
    let err = run(&request(Mode::Secure), &[d.disk()], &slow).unwrap_err();
    assert!(
        err.contains("takes 6 min, longer than the erasure's deadline of 2m"),
        "{err}"
    );
    assert_eq!(whole(&d), before);
}

/// A disk whose own erase says how far it has come, halfway and at its end,
/// as SCSI SANITIZE does; it keeps what the erasure's progress read then.
struct Reporting<'a> {
    counters: &'a Counters,
    seen: std::sync::Mutex<Vec<u64>>,
}

impl DiskOps for Reporting<'_> {
    fn can_discard(&self, _: &Disk, _: &std::fs::File) -> Result<(), String> {
        Err("no".into())
    }
    fn discard(&self, _: &std::fs::File, _: u64, _: u64, _: bool) -> std::io::Result<()> {
        unreachable!()
    }
    fn secure_erase(&self, _: &Disk, _: &std::fs::File) -> Result<SecureErase, String> {
        Ok(crypto())
    }
    fn run_secure_erase(
        &self,
        d: &Disk,
        f: &std::fs::File,
        _: &SecureErase,
        _: std::time::Duration,
        progress: &dyn Fn(u64),
    ) -> Result<(), String> {
        let half = d.size_bytes / 2;
        for (at, len) in [(0, half), (half, d.size_bytes - half)] {
            f.write_all_at(&vec![0u8; len as usize], at)
                .map_err(|e| e.to_string())?;
            progress(at + len);
            let written = self
                .counters
                .written
                .load(std::sync::atomic::Ordering::Relaxed);
            self.seen.lock().unwrap().push(written);
        }
        Ok(())
    }
}

#[test]
fn a_secure_erase_that_reports_its_progress_shows_it_across_disks() {
    let (a, b) = (TestDisk::new(8 * MIB), TestDisk::new(8 * MIB));
    dirty(&a);
    dirty(&b);
    let counters = Counters::default();
    let ops = Reporting {
        counters: &counters,
        seen: Default::default(),
    };
    erase::erase(
        &request(Mode::Secure),
        &[a.disk(), b.disk()],
        &ops,
        &counters,
        Duration::from_secs(120),
        &|l| eprintln!("agent: {l}"),
    )
    .unwrap();
    // The second disk's progress counts on from the first's whole size.
    assert_eq!(
        *ops.seen.lock().unwrap(),
        [4 * MIB, 8 * MIB, 12 * MIB, 16 * MIB]
    );
    let p = counters.progress(3);
    assert_eq!(
        (p.bytes_written, p.bytes_total),
        ((16 * MIB) as i64, (16 * MIB) as i64)
    );
}
