//! The agent's image installation against real block devices (loop
//! devices, when this runs as root; files standing for disks otherwise)
//! fed by a real HTTP server on loopback that can drop or stall a
//! connection midway. Images are real GPT layouts (the kernel's own parser
//! must find their partitions), compressed by the gzip, zstd and xz
//! programs.

use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use shepherd_agent::api::{DiskHints, OsInstallationRequest, os_installation_request};
use shepherd_agent::install::{Counters, Installer, Limits, install};

mod common;
use common::source::*;
use common::*;

/// Partitions partx finds in an image (None: no partx).
fn image_partitions(image: &[u8]) -> Option<usize> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("image");
    std::fs::write(&path, image).unwrap();
    let out = Command::new("partx")
        .args(["--show", "--noheadings", "--output", "NR"])
        .arg(&path)
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).lines().count())
}

/// `data` compressed by the named program (`gzip`, `zstd`, `xz`).
fn compress(program: &str, data: &[u8]) -> Vec<u8> {
    let mut child = Command::new(program)
        .arg("-c")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let data = data.to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&data).unwrap());
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    feeder.join().unwrap();
    assert!(child.wait().unwrap().success());
    out
}

fn sha256(data: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(data)))
}

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_gzip_zstd_and_xz_images_are_written_byte_for_byte() {
    let image = gpt_image(24 * MIB);
    for (name, served) in [
        ("raw", image.clone()),
        ("gzip", compress("gzip", &image)),
        ("zstd", compress("zstd", &image)),
        ("xz", compress("xz", &image)),
    ] {
        let disk = TestDisk::new(32 * MIB);
        // Whatever was on the disk past the image stays.
        std::fs::File::options()
            .write(true)
            .open(disk.path())
            .unwrap()
            .write_all_at(&[0x5a; 4096], 30 * MIB)
            .unwrap();
        let server = serve(served.clone(), Behaviour::Normal).await;
        let req = request(&server.url, &sha256(&served), Some(served.len() as u64));
        let done = run(&req, vec![disk.disk()])
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(done.format.to_string(), name);
        assert!(done.warnings.is_empty(), "{name}: {:?}", done.warnings);
        assert_eq!(done.written, image.len() as u64, "{name}");
        assert_eq!(done.fetched, served.len() as u64, "{name}");
        assert!(
            disk.read(0, image.len()) == image,
            "{name}: the disk differs from the image"
        );
        assert_eq!(
            disk.read(30 * MIB, 4096),
            vec![0x5a; 4096],
            "{name}: past the image"
        );
        if let Some(n) = disk.partitions() {
            assert_eq!(n, 2, "{name}: partx sees the image's partitions");
        }
        assert_eq!(server.log.lock().unwrap().len(), 1, "{name}: one request");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_mismatch_wipes_both_partition_tables_and_names_both_digests() {
    let image = gpt_image(8 * MIB);
    let disk = TestDisk::new(8 * MIB);
    let server = serve(image.clone(), Behaviour::Normal).await;
    let wrong = format!("sha256:{}", "ab".repeat(32));
    let err = run(&request(&server.url, &wrong, None), vec![disk.disk()])
        .await
        .unwrap_err();
    assert!(err.contains(&wrong), "{err}");
    assert!(err.contains(&sha256(&image)), "{err}");
    assert!(err.contains("wiped"), "{err}");
    // The image's middle was written; its tables are gone.
    assert_eq!(disk.read(0, 1 << 20), vec![0u8; 1 << 20]);
    assert_eq!(disk.read(disk.size() - MIB, 1 << 20), vec![0u8; 1 << 20]);
    assert_eq!(disk.read(2 * MIB, 4096), image[2 << 20..(2 << 20) + 4096]);
    assert_eq!(
        image_partitions(&image),
        Some(2),
        "partx reads the image's GPT"
    );
    if let Some(n) = disk.partitions() {
        assert_eq!(n, 0, "no partition left");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_is_resumed_with_a_range_request_not_restarted() {
    let image = gpt_image(16 * MIB);
    let served = compress("zstd", &image);
    let half = served.len() as u64 / 2;
    let disk = TestDisk::new(16 * MIB);
    let server = serve(served.clone(), Behaviour::DropOnceAt(half)).await;
    let counters = Arc::new(Counters::default());
    let done = install(
        &request(&server.url, &sha256(&served), None),
        vec![disk.disk()],
        counters.clone(),
        &quick(),
        &log_line,
    )
    .await
    .unwrap();
    assert_eq!(done.resumes, 1);
    assert!(disk.read(0, image.len()) == image);
    let log = server.log.lock().unwrap().clone();
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(
        log[1],
        format!("GET /images/disk.img HTTP/1.1 Range: bytes={half}-")
    );
    // Each byte was sent once.
    assert_eq!(server.sent.load(Ordering::SeqCst), served.len() as u64);
    let p = counters.progress(0);
    assert_eq!(p.resumes, 1);
    assert_eq!(p.bytes_fetched, served.len() as i64);
    assert_eq!(p.bytes_written, image.len() as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_ignoring_ranges_is_read_past_what_was_taken() {
    let image = gpt_image(8 * MIB);
    let disk = TestDisk::new(8 * MIB);
    let server = serve(image.clone(), Behaviour::DropOnceIgnoringRanges(3 * MIB)).await;
    let done = run(
        &request(&server.url, &sha256(&image), None),
        vec![disk.disk()],
    )
    .await
    .unwrap();
    assert_eq!(done.written, image.len() as u64);
    assert_eq!(done.resumes, 1);
    assert!(disk.read(0, image.len()) == image);
    let log = server.log.lock().unwrap().clone();
    assert_eq!(log.len(), 2, "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_download_fails_within_the_stall_limit() {
    let image = gpt_image(8 * MIB);
    let disk = TestDisk::new(8 * MIB);
    // Past the first write block (4 MiB), so that the disk was written.
    let server = serve(image.clone(), Behaviour::StallAt(6 * MIB)).await;
    let limits = quick();
    let started = Instant::now();
    let err = install(
        &request(&server.url, &sha256(&image), None),
        vec![disk.disk()],
        Arc::new(Counters::default()),
        &limits,
        &log_line,
    )
    .await
    .unwrap_err()
    .error;
    let took = started.elapsed();
    assert!(err.contains("stalled"), "{err}");
    assert!(err.contains("no data for 2s"), "{err}");
    assert!(err.contains("wiped"), "half an image was written: {err}");
    // The first stall, then each fruitless retry (itself a stall) and its
    // pause.
    let bound = limits.fetch.stall * (limits.fetch.retries + 2) + Duration::from_secs(4);
    assert!(took < bound, "took {took:?}, more than {bound:?}");
    assert!(took >= limits.fetch.stall, "took {took:?}");
    // Resumed, not restarted.
    let log = server.log.lock().unwrap().clone();
    assert!(
        log[1..].iter().all(|l| l.contains("Range: bytes=6291456-")),
        "{log:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hints_must_choose_exactly_one_disk() {
    let image = gpt_image(4 * MIB);
    let server = serve(image.clone(), Behaviour::Normal).await;
    let (small, large) = (TestDisk::new(8 * MIB), TestDisk::new(16 * MIB));
    let mut req = request(&server.url, &sha256(&image), None);
    let err = run(&req, vec![]).await.unwrap_err();
    assert_eq!(err, "the machine has no disk to write");
    let err = run(&req, vec![small.disk(), large.disk()])
        .await
        .unwrap_err();
    assert!(
        err.starts_with("2 disks match the disk hints (none given), one must:"),
        "{err}"
    );
    assert!(err.contains(&small.path().display().to_string()), "{err}");
    assert!(err.contains(&large.path().display().to_string()), "{err}");
    req.disk = Some(DiskHints {
        min_size_bytes: Some(32 * MIB as i64),
        ..Default::default()
    });
    let err = run(&req, vec![small.disk(), large.disk()])
        .await
        .unwrap_err();
    assert!(
        err.starts_with("no disk matches the disk hints (at least 32.0 MiB)"),
        "{err}"
    );
    assert_eq!(server.log.lock().unwrap().len(), 0, "nothing fetched");
    req.disk = Some(DiskHints {
        min_size_bytes: Some(12 * MIB as i64),
        ..Default::default()
    });
    run(&req, vec![small.disk(), large.disk()]).await.unwrap();
    assert!(large.read(0, image.len()) == image);
    assert_eq!(
        small.read(0, 4096),
        vec![0; 4096],
        "the other disk is untouched"
    );
    // The running system's disk is never a candidate unless allowed.
    let mut boot = small.disk();
    boot.boot = true;
    req.disk = None;
    let err = run(&req, vec![boot.clone()]).await.unwrap_err();
    assert!(err.contains("boot disk"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_larger_than_the_disk_fails_and_wipes() {
    let image = gpt_image(12 * MIB);
    let served = compress("gzip", &image);
    let disk = TestDisk::new(8 * MIB);
    let server = serve(served.clone(), Behaviour::Normal).await;
    let err = run(
        &request(&server.url, &sha256(&served), None),
        vec![disk.disk()],
    )
    .await
    .unwrap_err();
    assert!(err.contains("larger than the disk"), "{err}");
    assert!(err.contains("wiped"), "{err}");
    assert_eq!(disk.read(0, 4096), vec![0; 4096]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn formats_that_cannot_be_written_are_refused_before_writing() {
    let mut qcow = b"QFI\xfb\0\0\0\x03".to_vec();
    qcow.resize(1 << 20, 0);
    for served in [qcow.clone(), compress("xz", &qcow)] {
        let disk = TestDisk::new(4 * MIB);
        std::fs::File::options()
            .write(true)
            .open(disk.path())
            .unwrap()
            .write_all_at(&[7; 512], 0)
            .unwrap();
        let server = serve(served.clone(), Behaviour::Normal).await;
        let err = run(
            &request(&server.url, &sha256(&served), None),
            vec![disk.disk()],
        )
        .await
        .unwrap_err();
        assert!(err.contains("qcow2"), "{err}");
        assert!(!err.contains("wiped"), "nothing was written: {err}");
        assert_eq!(disk.read(0, 512), vec![7; 512]);
    }
}

#[test]
fn a_restart_mid_install_never_installs_that_generation_twice() {
    let image = gpt_image(8 * MIB);
    let disk = TestDisk::new(8 * MIB);
    let state = tempfile::tempdir().unwrap();
    let record = state.path().join("agent.installation");
    let rt = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let ask = |url: &str| OsInstallationRequest {
        generation: 5,
        r#type: Some(os_installation_request::Type::Image(request(
            url,
            &sha256(&image),
            None,
        ))),
    };
    let logger: shepherd_agent::resident::Logger = Arc::new(log_line);
    // The first agent gets halfway and dies (its runtime is dropped).
    let first = rt();
    let server = first.block_on(serve(image.clone(), Behaviour::StallAt(4 * MIB)));
    let d = disk.disk();
    first.block_on(async {
        let mut installer = Installer::new(Some(record.clone()));
        assert!(
            installer
                .request(ask(&server.url), || vec![d], quick(), logger.clone())
                .is_none()
        );
        let until = Instant::now() + Duration::from_secs(20);
        while server.sent.load(Ordering::SeqCst) < 4 * MIB {
            assert!(Instant::now() < until, "the download did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(installer.progress().unwrap().generation, 5);
        std::mem::forget(installer);
    });
    let requests = server.log.lock().unwrap().len();
    drop(first);
    assert!(
        std::fs::read_to_string(&record)
            .unwrap()
            .contains("state=started")
    );
    // Its successor is asked for the same generation: it answers from the
    // record, fetches nothing, and the half image cannot boot.
    let second = rt();
    let good = second.block_on(serve(image.clone(), Behaviour::Normal));
    second.block_on(async {
        let mut installer = Installer::new(Some(record.clone()));
        let answer = installer
            .request(
                ask(&good.url),
                || vec![disk.disk()],
                quick(),
                logger.clone(),
            )
            .expect("answered at once");
        assert_eq!(answer.report.generation, 5);
        let Some(shepherd_agent::api::os_installation_report::Result::Error(e)) =
            answer.report.result.clone()
        else {
            panic!("not an error: {:?}", answer.report);
        };
        assert!(e.error.contains("restarted"), "{}", e.error);
        assert!(!answer.reboot);
        // Asked again: the same answer, still nothing fetched.
        let again = installer
            .request(
                ask(&good.url),
                || vec![disk.disk()],
                quick(),
                logger.clone(),
            )
            .unwrap();
        assert_eq!(again.report, answer.report);
    });
    assert_eq!(good.log.lock().unwrap().len(), 0, "nothing fetched again");
    assert_eq!(server.log.lock().unwrap().len(), requests);
    assert_eq!(disk.read(0, 1 << 20), vec![0u8; 1 << 20], "tables wiped");
    assert!(
        std::fs::read_to_string(&record)
            .unwrap()
            .contains("state=failed")
    );
}

/// The resident loop asks for the answer at every call; until shepherd
/// stops asking for the generation, it sends the answer it holds again.
/// Asked after the answer was taken, the installer has nothing new: it
/// never turns a success it gave into a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installation_s_answer_is_given_once_and_never_turned_into_a_failure() {
    let image = gpt_image(8 * MIB);
    let disk = TestDisk::new(8 * MIB);
    let server = serve(image.clone(), Behaviour::Normal).await;
    let logger: shepherd_agent::resident::Logger = Arc::new(log_line);
    let mut installer = Installer::new(None);
    let ask = OsInstallationRequest {
        generation: 3,
        r#type: Some(os_installation_request::Type::Image(request(
            &server.url,
            &sha256(&image),
            None,
        ))),
    };
    assert!(
        installer
            .request(ask.clone(), || vec![disk.disk()], quick(), logger.clone())
            .is_none()
    );
    let until = Instant::now() + Duration::from_secs(60);
    let answer = loop {
        if let Some(a) = installer.poll(&log_line) {
            break a;
        }
        assert!(Instant::now() < until, "not installed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        matches!(
            answer.report.result,
            Some(shepherd_agent::api::os_installation_report::Result::Success(_))
        ),
        "{:?}",
        answer.report
    );
    // shepherd has not taken the report in yet: asked again, the
    // installer has no other answer; asked for the same generation, it
    // starts nothing.
    for _ in 0..5 {
        assert!(installer.poll(&log_line).is_none());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        installer
            .request(ask, || vec![disk.disk()], quick(), logger.clone())
            .is_none()
    );
    assert!(installer.poll(&log_line).is_none());
    assert_eq!(server.log.lock().unwrap().len(), 1, "fetched once");
    installer.acknowledged(3);
    assert_eq!(installer.busy(), None);
    assert!(disk.read(0, image.len()) == image);
}

#[test]
fn a_metropolis_request_is_answered_with_an_error() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut installer = Installer::new(None);
        let answer = installer
            .request(
                OsInstallationRequest {
                    generation: 3,
                    r#type: Some(os_installation_request::Type::Metropolis(Default::default())),
                },
                Vec::new,
                Limits::default(),
                Arc::new(log_line),
            )
            .unwrap();
        let Some(shepherd_agent::api::os_installation_report::Result::Error(e)) =
            answer.report.result
        else {
            panic!("{:?}", answer.report);
        };
        assert!(e.error.contains("cannot install Metropolis"), "{}", e.error);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_efi_boot_entry_for_the_installed_disk_goes_first_in_the_boot_order() {
    const GLOBAL: &str = "8be4df61-93ca-11d2-aa0d-00e098032b8c";
    let image = gpt_image_with(8 * MIB, "C12A7328-F81F-11D2-BA4B-00A0C93EC93B");
    let disk = TestDisk::new(8 * MIB);
    let server = serve(image.clone(), Behaviour::Normal).await;
    // The firmware's variables as efivarfs shows them: attributes, data.
    let vars = tempfile::tempdir().unwrap();
    let var = |name: &str| vars.path().join(format!("{name}-{GLOBAL}"));
    std::fs::write(var("BootOrder"), [7, 0, 0, 0, 1, 0, 2, 0]).unwrap();
    std::fs::write(var("Boot0001"), [7, 0, 0, 0, 1, 0, 0, 0, b'x', 0, 0, 0]).unwrap();
    let mut req = request(&server.url, &sha256(&image), None);
    req.set_efi_boot_entry = true;
    let mut limits = quick();
    limits.efivars = vars.path().to_path_buf();
    for round in 0..2 {
        install(
            &req,
            vec![disk.disk()],
            Arc::new(Counters::default()),
            &limits,
            &log_line,
        )
        .await
        .unwrap();
        // The first free number; the second installation reuses it.
        let entry = std::fs::read(var("Boot0000")).unwrap();
        assert_eq!(entry[..4], [7, 0, 0, 0], "non-volatile, boot and runtime");
        let option = &entry[4..];
        assert_eq!(option[..4], [1, 0, 0, 0], "active");
        let path_len = u16::from_le_bytes([option[4], option[5]]) as usize;
        let desc: Vec<u16> = option[6..]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .take_while(|u| *u != 0)
            .collect();
        assert_eq!(
            String::from_utf16(&desc).unwrap(),
            "shepherd: installed system"
        );
        let path = &option[6 + 2 * (desc.len() + 1)..];
        assert_eq!(path.len(), path_len);
        // Hard drive node: partition 1 from LBA 2048, its GUID, GPT.
        assert_eq!(path[..4], [4, 1, 42, 0]);
        assert_eq!(u32::from_le_bytes(path[4..8].try_into().unwrap()), 1);
        assert_eq!(u64::from_le_bytes(path[8..16].try_into().unwrap()), 2048);
        let sectors = 8 * MIB / 512;
        assert_eq!(
            u64::from_le_bytes(path[16..24].try_into().unwrap()),
            sectors / 2 - 2048
        );
        assert_eq!(path[24..40], [1u8; 16], "the partition's unique GUID");
        assert_eq!(path[40..42], [2, 2]);
        // File node, then the end.
        assert_eq!(path[42..44], [4, 4]);
        let file: Vec<u16> = path[46..]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .take_while(|u| *u != 0)
            .collect();
        assert_eq!(
            String::from_utf16(&file).unwrap(),
            "\\EFI\\BOOT\\BOOTX64.EFI"
        );
        assert_eq!(path[path.len() - 4..], [0x7f, 0xff, 4, 0]);
        assert_eq!(
            std::fs::read(var("BootOrder")).unwrap(),
            [7, 0, 0, 0, 0, 0, 1, 0, 2, 0],
            "round {round}: ours first, the others kept in their order"
        );
    }
    // A disk without an EFI system partition: the image stays, the error
    // says why there is no entry.
    let plain = gpt_image(8 * MIB);
    let server = serve(plain.clone(), Behaviour::Normal).await;
    let mut req = request(&server.url, &sha256(&plain), None);
    req.set_efi_boot_entry = true;
    let err = install(
        &req,
        vec![disk.disk()],
        Arc::new(Counters::default()),
        &limits,
        &log_line,
    )
    .await
    .unwrap_err()
    .error;
    assert!(err.contains("no EFI system partition"), "{err}");
    assert!(disk.read(0, plain.len()) == plain, "written and verified");
}

#[test]
fn guarded_regions_are_kept_as_they_pass_and_written_again() {
    use shepherd_agent::install::disk::{GUARD_LEN, Target, rewrite};
    let image = gpt_image(8 * MIB);
    let disk = TestDisk::new(8 * MIB);
    let mut target = Target::open(&disk.disk()).unwrap();
    // One region straddles the boundary of two 4 MiB write blocks.
    let (a, b) = (MIB, 4 * MIB - 1000);
    target.guard(a);
    target.guard(b);
    for piece in image.chunks(300_000) {
        target.write(piece).unwrap();
    }
    target.finish().unwrap();
    let guards = target.guards();
    assert_eq!(guards.len(), 2);
    for (g, at) in guards.iter().zip([a, b]) {
        assert_eq!(g.offset, at);
        assert!(g.bytes == image[at as usize..at as usize + GUARD_LEN]);
    }
    // The old system writes its superblocks over the new image…
    let f = std::fs::File::options()
        .write(true)
        .open(disk.path())
        .unwrap();
    f.write_all_at(&[0xee; 4096], a).unwrap();
    f.write_all_at(&[0xee; 4096], b + 100).unwrap();
    f.sync_all().unwrap();
    assert!(disk.read(0, image.len()) != image);
    // …and the last writes before the reboot put the image back.
    rewrite(&disk.path(), &guards).unwrap();
    assert!(disk.read(0, image.len()) == image);
}

// ---------------------------------------------------------------- first boot

/// What libblkid says of the filesystem at `offset` of `file`: its
/// `KEY=value` lines.
fn blkid(file: &Path, offset: u64) -> String {
    let out = Command::new("blkid")
        .args(["-p", "-o", "export", "-O"])
        .arg(offset.to_string())
        .arg(file)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A file of the FAT volume at `offset` of `image`, read with mtools.
fn mcopy(image: &Path, offset: u64, name: &str) -> Vec<u8> {
    let out = Command::new("mcopy")
        .arg("-i")
        .arg(format!("{}@@{offset}", image.display()))
        .arg(format!("::{name}"))
        .arg("-")
        .env("MTOOLS_SKIP_CHECK", "1")
        .output()
        .expect("mcopy (mtools)");
    assert!(
        out.status.success(),
        "mcopy {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The disk's partition table as sfdisk (libfdisk, which checks every
/// GPT checksum and where the backup lies) reads it; its complaints fail
/// the test.
fn sfdisk(file: &Path) -> serde_json::Value {
    let out = Command::new("sfdisk")
        .arg("--json")
        .arg(file)
        .output()
        .expect("sfdisk");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.trim().is_empty(),
        "sfdisk: {err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let verify = Command::new("sfdisk")
        .arg("--verify")
        .arg(file)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verify.stdout).into_owned()
        + &String::from_utf8_lossy(&verify.stderr);
    assert!(verify.status.success(), "sfdisk --verify: {said}");
    v["partitiontable"].clone()
}

fn files(list: &[(&str, &str)]) -> std::collections::HashMap<String, Vec<u8>> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nocloud_seed_is_a_new_partition_behind_the_image_and_the_gpt_spans_the_disk() {
    use shepherd_agent::api::FirstBootFiles;
    use shepherd_agent::api::image_installation::FirstBoot;
    let image = gpt_image(48 * MIB);
    let disk = TestDisk::new(128 * MIB);
    let server = serve(image.clone(), Behaviour::Normal).await;
    let mut req = request(&server.url, &sha256(&image), Some(image.len() as u64));
    let seed = [
        (
            "user-data",
            "#cloud-config\nruncmd:\n  - [touch, /var/lib/first-boot-ran]\n",
        ),
        (
            "meta-data",
            "instance-id: m-g1\nlocal-hostname: rack1-u12\n",
        ),
        ("network-config", "version: 2\nethernets: {}\n"),
    ];
    req.first_boot = Some(FirstBoot::Nocloud(FirstBootFiles {
        files: files(&seed),
        disk: None,
    }));
    let counters = Arc::new(Counters::default());
    install(
        &req,
        vec![disk.disk()],
        counters.clone(),
        &quick(),
        &log_line,
    )
    .await
    .unwrap();
    let t = sfdisk(&disk.file);
    let sectors = 128 * MIB / 512;
    assert_eq!(t["label"], "gpt");
    assert_eq!(t["lastlba"], sectors - 34, "the GPT spans the disk: {t}");
    let parts = t["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 3, "{t}");
    let seed_part = &parts[2];
    assert_eq!(seed_part["name"], "cidata");
    assert_eq!(seed_part["type"], "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7");
    let start = seed_part["start"].as_u64().unwrap();
    let size = seed_part["size"].as_u64().unwrap();
    assert_eq!(start % 2048, 0, "aligned to 1 MiB");
    assert!(start + size <= sectors - 33, "before the backup array");
    // Free space between the image's last partition and the seed, for
    // growpart.
    let image_end = parts[1]["start"].as_u64().unwrap() + parts[1]["size"].as_u64().unwrap();
    assert!(start - image_end > 40 * MIB / 512, "{t}");
    // The image's partitions are untouched.
    assert_eq!(
        disk.read(MIB, (46 * MIB) as usize),
        image[MIB as usize..(47 * MIB) as usize]
    );
    let offset = start * 512;
    let probed = blkid(&disk.file, offset);
    assert!(probed.contains("LABEL=CIDATA"), "{probed}");
    assert!(probed.contains("TYPE=vfat"), "{probed}");
    for (name, content) in seed {
        assert_eq!(
            String::from_utf8(mcopy(&disk.file, offset, name)).unwrap(),
            content,
            "{name}"
        );
    }
    // Partitions the kernel's parser (libblkid's, here) finds.
    if let Some(n) = disk.partitions() {
        assert_eq!(n, 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_without_room_for_the_seed_fails_naming_the_space_needed() {
    use shepherd_agent::api::FirstBootFiles;
    use shepherd_agent::api::image_installation::FirstBoot;
    let image = gpt_image(112 * MIB);
    let seed = Some(FirstBoot::Nocloud(FirstBootFiles {
        files: files(&[("user-data", "#cloud-config\n"), ("meta-data", "")]),
        disk: None,
    }));
    // The size known: refused before anything is written.
    let disk = TestDisk::new(128 * MIB);
    let server = serve(image.clone(), Behaviour::Normal).await;
    let mut req = request(&server.url, &sha256(&image), Some(image.len() as u64));
    req.first_boot = seed.clone();
    let err = run(&req, vec![disk.disk()]).await.unwrap_err();
    assert!(err.contains("no room for the first-boot volume"), "{err}");
    assert!(err.contains("nothing was written"), "{err}");
    assert!(err.contains("146.0 MiB"), "the space needed: {err}");
    assert_eq!(
        disk.read(0, (2 * MIB) as usize),
        vec![0; (2 * MIB) as usize]
    );
    assert_eq!(server.sent.load(Ordering::Relaxed), 0, "nothing fetched");
    // Unknown: found once the image is written, which is then wiped.
    let mut req = request(&server.url, &sha256(&image), None);
    req.first_boot = seed;
    let err = run(&req, vec![disk.disk()]).await.unwrap_err();
    assert!(
        err.contains("has no room for the first-boot volume"),
        "{err}"
    );
    assert!(err.contains("wiped"), "{err}");
    assert_eq!(disk.read(0, 4096), vec![0; 4096]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_drive_goes_to_the_other_disk_its_hints_choose() {
    use shepherd_agent::api::FirstBootFiles;
    use shepherd_agent::api::image_installation::FirstBoot;
    let image = gpt_image(16 * MIB);
    let (main, other) = (TestDisk::new(128 * MIB), TestDisk::new(40 * MIB));
    // An old partition table on the other disk goes.
    std::fs::write(&other.file, gpt_image(40 * MIB)).unwrap();
    let server = serve(image.clone(), Behaviour::Normal).await;
    let mut req = request(&server.url, &sha256(&image), None);
    req.disk = Some(DiskHints {
        min_size_bytes: Some((100 * MIB) as i64),
        ..Default::default()
    });
    let drive = [
        (
            "openstack/latest/meta_data.json",
            "{\"uuid\": \"m-g2\", \"hostname\": \"rack1-u12\"}",
        ),
        ("openstack/latest/user_data", "#cloud-config\n"),
    ];
    req.first_boot = Some(FirstBoot::ConfigDrive(FirstBootFiles {
        files: files(&drive),
        disk: Some(DiskHints {
            max_size_bytes: Some((64 * MIB) as i64),
            ..Default::default()
        }),
    }));
    run(&req, vec![main.disk(), other.disk()]).await.unwrap();
    let probed = blkid(&other.file, 0);
    assert!(probed.contains("LABEL=CONFIG-2"), "{probed}");
    assert!(probed.contains("TYPE=vfat"), "{probed}");
    for (name, content) in drive {
        assert_eq!(
            String::from_utf8(mcopy(&other.file, 0, name)).unwrap(),
            content
        );
    }
    assert_eq!(
        main.read(0, image.len()),
        image,
        "the image on the main disk"
    );
    // Hints that choose no other disk: refused before writing.
    let fresh = TestDisk::new(128 * MIB);
    if let Some(FirstBoot::ConfigDrive(f)) = &mut req.first_boot {
        f.disk = Some(DiskHints {
            min_size_bytes: Some((100 * MIB) as i64),
            ..Default::default()
        });
    }
    let err = run(&req, vec![fresh.disk(), other.disk()])
        .await
        .unwrap_err();
    assert!(err.contains("the first-boot volume's disk"), "{err}");
    assert!(err.contains("nothing was written"), "{err}");
    assert_eq!(fresh.read(0, 4096), vec![0; 4096]);
}
