//! One image onto one disk (`ImageInstallation`): the request checked, the
//! disk chosen, the image fetched, hashed and written on threads of their
//! own, verified, and on failure the disk's partition tables wiped; then
//! the first-boot volume and the EFI boot entry when asked. Writing the
//! running system's own disk first holds this program in memory and
//! remounts every filesystem read-only.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::disk::{self, Disk};
use super::{Counters, Limits, chunks, efi, fetch, first_boot, pipeline, swarm};
use crate::api::ImageInstallation;
use crate::api::installation_progress::Phase;
use shepherd_proto::digest::{ExpectedDigest, parse_digest};

/// A finished installation.
#[derive(Debug, Clone)]
pub struct Installed {
    pub disk: PathBuf,
    pub format: pipeline::Format,
    pub fetched: u64,
    pub written: u64,
    pub digest: String,
    pub resumes: u32,
    /// What went wrong without failing it (the partition table not
    /// re-read, say).
    pub warnings: Vec<String>,
    /// The running system's boot disk was written: these regions are to be
    /// written again just before the reboot (see `disk::Target::guard`).
    pub guards: Vec<disk::Guard>,
}

/// Why an installation failed, and whether the disk was wiped.
#[derive(Debug, Clone)]
pub struct Failed {
    pub error: String,
    pub disk: Option<PathBuf>,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.error)
    }
}

pub(super) fn failed(error: impl Into<String>) -> Failed {
    Failed {
        error: error.into(),
        disk: None,
    }
}

/// What a request asks for that this agent cannot do, checked before
/// anything is fetched or written.
pub fn check(req: &ImageInstallation) -> Result<ExpectedDigest, String> {
    if req.url.trim().is_empty() {
        return Err("the request names no image URL".into());
    }
    if req.digest.trim().is_empty() {
        return Err("the request names no digest; an image is never written unverified".into());
    }
    let digest = parse_digest(&req.digest)?;
    if let Some(fb) = &req.first_boot {
        first_boot::check(fb)?;
    }
    if req.size_bytes.is_some_and(|s| s < 0) {
        return Err(format!(
            "size_bytes {} is negative",
            req.size_bytes.unwrap()
        ));
    }
    if req.deadline_seconds < 0 {
        return Err(format!(
            "deadline_seconds {} is negative",
            req.deadline_seconds
        ));
    }
    Ok(digest)
}

/// Installs the image `req` names on the one disk of `disks` its hints
/// choose. On failure after the first byte reached the disk, the disk's
/// partition tables are wiped.
pub async fn install(
    req: &ImageInstallation,
    disks: Vec<Disk>,
    counters: Arc<Counters>,
    limits: &Limits,
    log: &(dyn Fn(std::fmt::Arguments<'_>) + Send + Sync),
) -> Result<Installed, Failed> {
    let expected = check(req).map_err(failed)?;
    let chosen = disk::select(&disks, req.disk.as_ref(), req.allow_boot_disk).map_err(failed)?;
    // Where the first-boot volume goes, known before anything is written.
    let first_boot_disk = match req.first_boot.as_ref().map(first_boot::Volume::of) {
        Some(v) => match &v.files.disk {
            Some(h) => {
                let others: Vec<Disk> = disks
                    .iter()
                    .filter(|d| d.path != chosen.path)
                    .cloned()
                    .collect();
                let d = disk::select(&others, Some(h), req.allow_boot_disk).map_err(|e| {
                    failed(format!(
                        "the first-boot volume's disk: {e}; nothing was written"
                    ))
                })?;
                Some(d)
            }
            None => {
                if let Some(size) = req.size_bytes {
                    let needed = size as u64 + first_boot::room_needed();
                    if chosen.size_bytes < needed {
                        return Err(failed(format!(
                            "{} ({}) has no room for the first-boot volume after the image ({}): \
                             it needs {} in all; nothing was written",
                            chosen.path.display(),
                            disk::bytes(chosen.size_bytes),
                            disk::bytes(size as u64),
                            disk::bytes(needed)
                        )));
                    }
                }
                None
            }
        },
        None => None,
    };
    if let Some(size) = req.size_bytes {
        counters.total.store(size as u64, Ordering::Relaxed);
    }
    counters.set_disk(&chosen.path.display().to_string());
    let deadline = if req.deadline_seconds > 0 {
        Duration::from_secs(req.deadline_seconds as u64)
    } else {
        limits.deadline
    };
    // The manifest, when the request names one: fetched and checked
    // before anything is written.
    let chunks = tokio::time::timeout(
        deadline,
        chunks::fetch_manifest(req, limits.agent_key.as_ref(), &limits.fetch),
    )
    .await
    .unwrap_or_else(|_| Err("the image's manifest did not come within the deadline".into()))
    .map_err(|e| failed(format!("{e}; nothing was written")))?;
    if let Some(c) = &chunks {
        log(format_args!(
            "checking each of the image's {} chunks against its manifest before writing it",
            c.count()
        ));
    }
    let path = chosen.path.clone();
    let mut target = disk::Target::open(&chosen).map_err(failed)?;
    if chosen.boot {
        for start in disk::mounted_partition_starts(&path) {
            target.guard(start);
        }
        log(format_args!(
            "writing the running system's boot disk {}: holding this program in memory and remounting every filesystem read-only",
            path.display()
        ));
        prepare_boot_disk_write(log);
    }
    log(format_args!(
        "installing {} onto {} ({})",
        req.url,
        path.display(),
        disk::bytes(chosen.size_bytes)
    ));
    counters.set_phase(Phase::Writing);

    let (tx, rx) = tokio::sync::mpsc::channel(pipeline::QUEUE);
    let (write_done, written) = tokio::sync::oneshot::channel();
    // With a manifest, every chunk is checked against it as it comes, and
    // the manifest is of the request's image (its digest the request's,
    // itself known by the SHA-256 the request names): all of them matching
    // is the whole image's check, and the bytes are not hashed twice.
    let mut hasher = chunks
        .is_none()
        .then(|| pipeline::Hasher::new(expected.algorithm));
    let wc = counters.clone();
    std::thread::Builder::new()
        .name("install-write".into())
        .spawn(move || {
            let r = pipeline::write(rx, &mut target, &wc);
            let _ = write_done.send((target, r));
        })
        .map_err(|e| failed(format!("cannot start a thread: {e}")))?;

    /// Hashes each piece as it arrives (without a manifest) and hands it
    /// to the writer.
    struct ToWriter<'a> {
        tx: &'a tokio::sync::mpsc::Sender<pipeline::Feed>,
        hasher: Option<&'a mut pipeline::Hasher>,
        counters: &'a Counters,
    }
    impl fetch::AsyncSink for ToWriter<'_> {
        async fn put(&mut self, piece: fetch::Piece) -> Result<(), String> {
            self.counters
                .fetched
                .fetch_add(piece.len() as u64, Ordering::Relaxed);
            if let Some(h) = &mut self.hasher {
                h.update(&piece);
            }
            self.tx
                .send(pipeline::Feed::Piece(piece))
                .await
                .map_err(|_| "the disk writer stopped".to_string())
        }
    }
    let ca = req.ca_certificate.clone();
    let size = req.size_bytes.map(|s| s as u64);
    let fetched = {
        let sink = ToWriter {
            tx: &tx,
            hasher: hasher.as_mut(),
            counters: &counters,
        };
        let rc = counters.clone();
        let on_resume = move |at: u64, cause: &str| {
            rc.resumes.fetch_add(1, Ordering::Relaxed);
            log(format_args!(
                "resuming the download at byte {at} after: {cause}"
            ));
        };
        // The image's swarm, when the request names one: its chunks from
        // the other machines installing it first.
        let joined = match (&chunks, &req.swarm, limits.agent_key.as_ref()) {
            (Some(c), Some(_), Some(key)) => {
                match swarm::Swarm::join(req, c, key, limits.swarm_cache).await {
                    Ok(s) => {
                        let (members, sources) = s.sizes();
                        log(format_args!(
                            "fetching from the image's swarm ({members} machines; {sources} to ask before the image server)"
                        ));
                        Some(s)
                    }
                    Err(e) => {
                        log(format_args!(
                            "the image's swarm: {e}; fetching from the image server alone"
                        ));
                        None
                    }
                }
            }
            _ => None,
        };
        let f = async {
            match (joined, chunks) {
                (Some(s), _) => s.fetch(&limits.fetch, &counters, sink, log).await,
                (None, chunks) => {
                    fetch::fetch(
                        &req.url,
                        &ca,
                        limits.agent_key.as_ref(),
                        size,
                        chunks,
                        &limits.fetch,
                        sink,
                        on_resume,
                    )
                    .await
                }
            }
        };
        match tokio::time::timeout(deadline, f).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "the installation did not finish within its deadline of {}",
                humantime::format_duration(deadline)
            )),
        }
    };
    if let Ok(f) = &fetched {
        counters.refused.fetch_max(f.refused, Ordering::Relaxed);
        if counters.total.load(Ordering::Relaxed) == 0 {
            counters.total.store(f.bytes, Ordering::Relaxed);
        }
        let _ = tx.send(pipeline::Feed::End).await;
    }
    drop(tx);
    let digest = fetched.is_ok().then(|| match hasher {
        Some(h) => h.finish(),
        // Every chunk matched the manifest of the request's image.
        None => expected.hex.clone(),
    });
    let (mut target, wrote) = written
        .await
        .map_err(|_| failed("the disk writer thread died"))?;
    counters.set_phase(Phase::Verifying);
    // A failure from here on leaves no bootable half-image behind.
    let wipe_for = |target: &mut disk::Target, error: String| -> Failed {
        if !target.touched() {
            return Failed { error, disk: None };
        }
        match target.wipe() {
            Ok(()) => Failed {
                error: format!(
                    "{error}; the partition tables of {} were wiped",
                    path.display()
                ),
                disk: Some(path.clone()),
            },
            Err(e) => Failed {
                error: format!("{error}; wiping the partition tables failed too: {e}"),
                disk: Some(path.clone()),
            },
        }
    };
    let written = match (fetched, wrote) {
        (_, Err(pipeline::Stop::Failed(e))) => return Err(wipe_for(&mut target, e)),
        (Err(e), _) => return Err(wipe_for(&mut target, e)),
        (Ok(_), Err(pipeline::Stop::Abandoned)) => {
            return Err(wipe_for(&mut target, "the download was abandoned".into()));
        }
        (Ok(f), Ok(w)) => (f, w),
    };
    let (fetched, w) = written;
    let finish = tokio::task::spawn_blocking(move || {
        let r = target.finish();
        (target, r)
    })
    .await
    .map_err(|_| failed("flushing the disk panicked"))?;
    let (mut target, flushed) = finish;
    if let Err(e) = flushed {
        return Err(wipe_for(&mut target, e.to_string()));
    }
    let Some(got) = digest else {
        return Err(wipe_for(
            &mut target,
            "the image's digest was not computed".into(),
        ));
    };
    let got = ExpectedDigest {
        algorithm: expected.algorithm,
        hex: got,
    };
    if got != expected {
        return Err(wipe_for(
            &mut target,
            format!(
                "digest mismatch: the request says {expected}, the {} bytes fetched from {} have {got}",
                fetched.bytes, req.url
            ),
        ));
    }
    if let Some(size) = size {
        if fetched.bytes != size {
            return Err(wipe_for(
                &mut target,
                format!(
                    "the image is {} bytes, the request says {size}",
                    fetched.bytes
                ),
            ));
        }
    }
    let mut warnings = Vec::new();
    if fetched.refused > 0 {
        warnings.push(format!(
            "{} chunks of the image did not match its manifest and were fetched again",
            fetched.refused
        ));
    }
    if !chosen.boot {
        // The boot disk's partitions are in use: its table is read anew
        // at the reboot.
        if let Err(e) = target.reread_partitions() {
            warnings.push(e);
        }
    }
    if let Some(fb) = &req.first_boot {
        counters.set_phase(Phase::FirstBoot);
        let v = first_boot::Volume::of(fb);
        let placed = first_boot::build(&v).and_then(|bytes| match &first_boot_disk {
            Some(other) => {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&other.path)
                    .map_err(|e| format!("cannot open {}: {e}", other.path.display()))?;
                let size = disk::size_of(&f).unwrap_or(other.size_bytes);
                first_boot::whole_disk(&f, other, size, &bytes)
            }
            None => {
                let sector = u64::from(chosen.logical_block_size.max(512));
                let size = target.size().unwrap_or(chosen.size_bytes);
                // Read and written through the page cache (the image went
                // around it, and is flushed).
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&chosen.path)
                    .map_err(|e| format!("cannot open {}: {e}", chosen.path.display()))?;
                first_boot::add_partition(&f, &chosen, size, sector, &bytes, v.name)
            }
        });
        match placed {
            Ok(p) => log(format_args!(
                "wrote the first-boot volume {} ({} files) to {}{}",
                v.label,
                v.files.files.len(),
                p.disk,
                if p.partition > 0 {
                    format!(", partition {} at byte {}", p.partition, p.offset)
                } else {
                    " (the whole disk)".into()
                }
            )),
            Err(e) => return Err(wipe_for(&mut target, e)),
        }
    }
    let guards = target.guards();
    if req.set_efi_boot_entry {
        let sector = u64::from(chosen.logical_block_size.max(512));
        match efi::set_boot_entry(&path, sector, &limits.efivars) {
            Ok(name) => log(format_args!(
                "{name} ({}) boots {} from {} first",
                efi::DESCRIPTION,
                efi::LOADER,
                path.display()
            )),
            Err(e) => {
                return Err(Failed {
                    error: format!(
                        "the image is written and verified, but the EFI boot entry was not set: {e}"
                    ),
                    disk: Some(path),
                });
            }
        }
    }
    counters.set_phase(Phase::Done);
    Ok(Installed {
        disk: path,
        format: w.format,
        fetched: fetched.bytes,
        written: w.bytes,
        digest: got.to_string(),
        resumes: fetched.resumes,
        warnings,
        guards,
    })
}

/// Before the running system's own disk is overwritten: this program
/// stays in memory, nothing more is written back to the old filesystems
/// (they are remounted read-only, as the kernel's emergency remount does),
/// and what was dirty is flushed first. The emergency remount runs in the
/// kernel's own time, and remounting writes each filesystem's superblock:
/// the image is written only once every filesystem on a device shows
/// read-only (or after 30 s), so no late write of the old system lands on
/// the new one.
fn prepare_boot_disk_write(log: &(dyn Fn(std::fmt::Arguments<'_>) + Send + Sync)) {
    let _ = nix::sys::mman::mlockall(
        nix::sys::mman::MlockAllFlags::MCL_CURRENT | nix::sys::mman::MlockAllFlags::MCL_FUTURE,
    );
    nix::unistd::sync();
    if let Err(e) = std::fs::write("/proc/sysrq-trigger", b"u") {
        log(format_args!("the emergency read-only remount failed: {e}"));
        return;
    }
    let started = Instant::now();
    loop {
        let writable = writable_mounts();
        if writable.is_empty() {
            break;
        }
        if started.elapsed() > Duration::from_secs(30) {
            log(format_args!(
                "still writable after 30 s: {}; writing the image anyway",
                writable.join(", ")
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    nix::unistd::sync();
}

/// Mount points of filesystems on devices that are still read-write.
fn writable_mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (dev, at, opts) = (*f.first()?, *f.get(1)?, *f.get(3)?);
            (dev.starts_with("/dev/") && opts.split(',').any(|o| o == "rw")).then(|| at.to_string())
        })
        .collect()
}
