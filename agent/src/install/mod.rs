//! Installing an operating system image (CONTRACTS.md §4a,
//! `ImageInstallation`): one pass from the network to the disk, with
//! memory bounded whatever the image's size, verified before success.
//!
//! - [`disk`]: the machine's disks, the hints that choose one, the writer.
//! - [`fetch`]: HTTP(S) with connect, stall and total limits, resumed with
//!   a Range request after a dropped connection.
//! - [`pipeline`]: hashing, decompression (gzip, zstd, xz by their magic
//!   bytes) and writing, on threads of their own.
//! - [`efi`]: the EFI boot entry for the installed disk, when asked.
//! - [`record`]: what the agent did with which generation, kept across its
//!   restarts so that no generation is installed twice.
//! - [`Installer`]: the resident agent's side: one installation at a time,
//!   its progress for the heartbeats, its report once done.

pub mod disk;
pub mod efi;
pub mod erase;
pub mod fetch;
pub mod first_boot;
pub mod pipeline;
pub mod record;
pub mod sg;

use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::api::installation_progress::Phase;
use crate::api::{
    ImageInstallation, InstallationProgress, OsInstallationReport, OsInstallationRequest,
    os_installation_report, os_installation_request,
};
use disk::Disk;
use record::{Outcome, Record};

pub use shepherd_proto::digest::{Algorithm, ExpectedDigest, parse_digest};

/// How long an installation may take, its download's limits, the key
/// its downloads from shepherd show, and where the machine's EFI
/// variables are.
#[derive(Debug, Clone)]
pub struct Limits {
    pub fetch: fetch::FetchLimits,
    /// The agent's key (its callback's): shepherd's image server serves
    /// only agents it knows.
    pub agent_key: Option<fetch::AgentKey>,
    /// Used when the request names no deadline.
    pub deadline: Duration,
    /// efivarfs, where a boot entry is written when asked.
    pub efivars: PathBuf,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fetch: fetch::FetchLimits::default(),
            agent_key: None,
            deadline: Duration::from_secs(2 * 3600),
            efivars: PathBuf::from("/sys/firmware/efi/efivars"),
        }
    }
}

/// What an installation in hand has done so far, shared between its
/// threads and the heartbeats.
#[derive(Debug)]
pub struct Counters {
    phase: AtomicI32,
    pub fetched: AtomicU64,
    pub written: AtomicU64,
    pub total: AtomicU64,
    pub resumes: AtomicU32,
    started: Instant,
    disk: Mutex<String>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            phase: AtomicI32::new(Phase::Preparing as i32),
            fetched: AtomicU64::new(0),
            written: AtomicU64::new(0),
            total: AtomicU64::new(0),
            resumes: AtomicU32::new(0),
            started: Instant::now(),
            disk: Mutex::new(String::new()),
        }
    }
}

impl Counters {
    pub fn set_phase(&self, p: Phase) {
        self.phase.store(p as i32, Ordering::Relaxed);
    }

    /// The disk in hand, as the progress names it.
    pub fn set_disk(&self, disk: &str) {
        *self.disk.lock().unwrap() = disk.to_string();
    }

    pub fn phase(&self) -> Phase {
        Phase::try_from(self.phase.load(Ordering::Relaxed)).unwrap_or(Phase::Unknown)
    }

    /// The progress as a heartbeat carries it.
    pub fn progress(&self, generation: i64) -> InstallationProgress {
        let fetched = self.fetched.load(Ordering::Relaxed);
        let secs = self.started.elapsed().as_secs_f64();
        InstallationProgress {
            generation,
            phase: self.phase.load(Ordering::Relaxed),
            bytes_fetched: fetched as i64,
            bytes_written: self.written.load(Ordering::Relaxed) as i64,
            bytes_total: self.total.load(Ordering::Relaxed) as i64,
            rate_bytes_per_second: if secs > 0.0 {
                (fetched as f64 / secs) as i64
            } else {
                0
            },
            disk: self.disk.lock().unwrap().clone(),
            resumes: self.resumes.load(Ordering::Relaxed) as i32,
        }
    }
}

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

fn failed(error: impl Into<String>) -> Failed {
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
    let mut hasher = pipeline::Hasher::new(expected.algorithm);
    let wc = counters.clone();
    std::thread::Builder::new()
        .name("install-write".into())
        .spawn(move || {
            let r = pipeline::write(rx, &mut target, &wc);
            let _ = write_done.send((target, r));
        })
        .map_err(|e| failed(format!("cannot start a thread: {e}")))?;

    /// Hashes each piece as it arrives and hands it to the writer.
    struct ToWriter<'a> {
        tx: &'a tokio::sync::mpsc::Sender<pipeline::Feed>,
        hasher: &'a mut pipeline::Hasher,
        counters: &'a Counters,
    }
    impl fetch::AsyncSink for ToWriter<'_> {
        async fn put(&mut self, piece: fetch::Piece) -> Result<(), String> {
            self.counters
                .fetched
                .fetch_add(piece.len() as u64, Ordering::Relaxed);
            self.hasher.update(&piece);
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
            hasher: &mut hasher,
            counters: &counters,
        };
        let rc = counters.clone();
        let on_resume = move |at: u64, cause: &str| {
            rc.resumes.fetch_add(1, Ordering::Relaxed);
            log(format_args!(
                "resuming the download at byte {at} after: {cause}"
            ));
        };
        let f = fetch::fetch(
            &req.url,
            &ca,
            limits.agent_key.as_ref(),
            size,
            &limits.fetch,
            sink,
            on_resume,
        );
        match tokio::time::timeout(deadline, f).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "the installation did not finish within its deadline of {}",
                humantime::format_duration(deadline)
            )),
        }
    };
    if let Ok(f) = &fetched {
        if counters.total.load(Ordering::Relaxed) == 0 {
            counters.total.store(f.bytes, Ordering::Relaxed);
        }
        let _ = tx.send(pipeline::Feed::End).await;
    }
    drop(tx);
    let digest = fetched.is_ok().then(|| hasher.finish());
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

/// The resident agent's installations: at most one in hand, its progress,
/// and its report once done. A generation already carried out (by this
/// process or an earlier one, per the record) is answered from the record,
/// never installed again.
pub struct Installer {
    record_path: Option<PathBuf>,
    /// The record when there is no file for it.
    memory: Option<Record>,
    job: Option<Job>,
    /// After writing the running system's own disk: the disk and the
    /// regions to write again just before the reboot.
    guards: Option<(PathBuf, Vec<disk::Guard>)>,
    /// How disks are discarded and erase themselves.
    ops: Arc<dyn erase::DiskOps>,
}

struct Job {
    generation: i64,
    reboot: bool,
    counters: Arc<Counters>,
    done: tokio::sync::oneshot::Receiver<Result<Finished, Failed>>,
}

/// What a job did.
#[derive(Debug, Clone)]
pub enum Finished {
    Installed(Installed),
    Erased(erase::Erased),
}

/// The report of an installation, and whether to reboot once it is
/// received.
#[derive(Debug, Clone)]
pub struct Answer {
    pub report: OsInstallationReport,
    pub reboot: bool,
}

fn report(generation: i64, outcome: &Outcome) -> OsInstallationReport {
    OsInstallationReport {
        generation,
        result: Some(match outcome {
            Outcome::Succeeded => {
                os_installation_report::Result::Success(os_installation_report::Success {})
            }
            Outcome::Failed(e) => {
                os_installation_report::Result::Error(os_installation_report::Error {
                    error: e.clone(),
                })
            }
            Outcome::Started => os_installation_report::Result::Error(os_installation_report::Error {
                error: "the agent restarted while installing this generation; it is not installed twice"
                    .into(),
            }),
        }),
    }
}

impl Installer {
    pub fn new(record_path: Option<PathBuf>) -> Installer {
        Installer {
            record_path,
            memory: None,
            job: None,
            guards: None,
            ops: Arc::new(erase::Kernel),
        }
    }

    /// Disks discarded and erased through `ops` (tests stand a disk that
    /// lies for the kernel's).
    pub fn with_disk_ops(mut self, ops: Arc<dyn erase::DiskOps>) -> Installer {
        self.ops = ops;
        self
    }

    fn read_record(&self) -> Option<Record> {
        match &self.record_path {
            Some(p) => record::read(p),
            None => self.memory.clone(),
        }
    }

    fn write_record(&mut self, r: Record, log: &dyn Fn(std::fmt::Arguments<'_>)) {
        if let Some(p) = &self.record_path {
            if let Err(e) = record::write(p, &r) {
                log(format_args!(
                    "cannot keep the installation record {}: {e}",
                    p.display()
                ));
            }
        }
        self.memory = Some(r);
    }

    /// Whether the running system's own disk was written (its files are
    /// the image's now: nothing is to be read from them).
    pub fn wrote_boot_disk(&self) -> bool {
        self.guards.is_some()
    }

    /// The generation in hand, if any.
    pub fn busy(&self) -> Option<i64> {
        self.job.as_ref().map(|j| j.generation)
    }

    /// Progress of the installation in hand, or of the last one done.
    pub fn progress(&self) -> Option<InstallationProgress> {
        self.job.as_ref().map(|j| j.counters.progress(j.generation))
    }

    /// shepherd asks for `req`. Returns the answer when it is known at once
    /// (a request this agent cannot carry out, a generation already done);
    /// otherwise starts installing it (unless it is in hand already).
    pub fn request(
        &mut self,
        req: OsInstallationRequest,
        disks: impl FnOnce() -> Vec<Disk>,
        limits: Limits,
        log: Arc<dyn Fn(std::fmt::Arguments<'_>) + Send + Sync>,
    ) -> Option<Answer> {
        let generation = req.generation;
        if self.busy() == Some(generation) {
            return None;
        }
        let error = |e: &str| {
            Some(Answer {
                report: report(generation, &Outcome::Failed(e.to_string())),
                reboot: false,
            })
        };
        if let Some(r) = self.read_record() {
            // An erasure cut short by a restart is simply run again.
            let again = r.erase && r.outcome == Outcome::Started;
            if r.generation == generation && !again {
                if r.outcome == Outcome::Started {
                    // Cut short by a restart: whatever is on the disk is
                    // not to be booted.
                    if let Some(d) = &r.disk {
                        if let Ok(f) = std::fs::OpenOptions::new().write(true).open(d) {
                            let size = f.metadata().map(|m| m.len()).unwrap_or(0);
                            let disk = Disk {
                                path: d.clone(),
                                size_bytes: disk::size_of(&f).unwrap_or(size),
                                ..Disk::default()
                            };
                            let _ = disk::wipe(&f, &disk);
                        }
                    }
                    let outcome = Outcome::Failed(
                        "the agent restarted while installing this generation; it is not installed twice \
                         (the disk's partition tables were wiped)"
                            .into(),
                    );
                    self.write_record(
                        Record {
                            generation,
                            outcome: outcome.clone(),
                            disk: r.disk.clone(),
                            reboot: false,
                            erase: false,
                        },
                        &*log,
                    );
                    return Some(Answer {
                        report: report(generation, &outcome),
                        reboot: false,
                    });
                }
                return Some(Answer {
                    report: report(generation, &r.outcome),
                    reboot: r.reboot && r.outcome == Outcome::Succeeded,
                });
            }
        }
        if self.job.is_some() {
            // Another generation is in hand: it finishes first.
            return None;
        }
        let image = match req.r#type {
            Some(os_installation_request::Type::Image(i)) => i,
            Some(os_installation_request::Type::Erasure(e)) => {
                return self.start_erasure(generation, e, disks(), limits, log);
            }
            Some(os_installation_request::Type::Metropolis(_)) => {
                return error(
                    "this agent cannot install Metropolis requests; it installs disk images (ImageInstallation)",
                );
            }
            None => {
                return error("the request names no installation (no known member of its type)");
            }
        };
        if let Err(e) = check(&image) {
            return error(&e);
        }
        let disks = disks();
        let chosen = match disk::select(&disks, image.disk.as_ref(), image.allow_boot_disk) {
            Ok(d) => d,
            Err(e) => return error(&e),
        };
        self.write_record(
            Record {
                generation,
                outcome: Outcome::Started,
                disk: Some(chosen.path.clone()),
                reboot: image.reboot,
                erase: false,
            },
            &*log,
        );
        let counters = Arc::new(Counters::default());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let c = counters.clone();
        let reboot = image.reboot;
        tokio::spawn(async move {
            let l = log.clone();
            let r = install(&image, disks, c.clone(), &limits, &move |a| l(a))
                .await
                .map(Finished::Installed);
            if r.is_err() {
                c.set_phase(Phase::Failed);
            }
            let _ = tx.send(r);
        });
        self.job = Some(Job {
            generation,
            reboot,
            counters,
            done: rx,
        });
        None
    }

    /// Starts erasing as `req` asks (checked first: a wrong request is
    /// answered at once).
    fn start_erasure(
        &mut self,
        generation: i64,
        req: crate::api::DiskErasure,
        disks: Vec<Disk>,
        limits: Limits,
        log: Arc<dyn Fn(std::fmt::Arguments<'_>) + Send + Sync>,
    ) -> Option<Answer> {
        if let Err(e) = erase::choose(&disks, &req) {
            return Some(Answer {
                report: report(generation, &Outcome::Failed(e)),
                reboot: false,
            });
        }
        self.write_record(
            Record {
                generation,
                outcome: Outcome::Started,
                disk: None,
                reboot: false,
                erase: true,
            },
            &*log,
        );
        let counters = Arc::new(Counters::default());
        counters.set_phase(Phase::Erasing);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let c = counters.clone();
        let ops = self.ops.clone();
        let deadline = if req.deadline_seconds > 0 {
            Duration::from_secs(req.deadline_seconds as u64)
        } else {
            limits.deadline
        };
        let spawned = std::thread::Builder::new()
            .name("erase".into())
            .spawn(move || {
                let l = log.clone();
                let r = erase::erase(&req, &disks, &*ops, &c, deadline, &move |a| l(a))
                    .map(Finished::Erased)
                    .map_err(failed);
                if r.is_err() {
                    c.set_phase(Phase::Failed);
                }
                let _ = tx.send(r);
            });
        if let Err(e) = spawned {
            return Some(Answer {
                report: report(
                    generation,
                    &Outcome::Failed(format!("cannot start a thread: {e}")),
                ),
                reboot: false,
            });
        }
        self.job = Some(Job {
            generation,
            reboot: false,
            counters,
            done: rx,
        });
        None
    }

    /// The answer of the installation in hand once it is done (then the
    /// record says so).
    pub fn poll(&mut self, log: &dyn Fn(std::fmt::Arguments<'_>)) -> Option<Answer> {
        let job = self.job.as_mut()?;
        let result = match job.done.try_recv() {
            Ok(r) => r,
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => return None,
            Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                Err(failed("the installation task ended without a result"))
            }
        };
        let (generation, reboot) = (job.generation, job.reboot);
        let erase = matches!(result, Ok(Finished::Erased(_)));
        let (outcome, disk) = match &result {
            Ok(Finished::Erased(e)) => {
                log(format_args!("generation {generation}: {e}"));
                (Outcome::Succeeded, None)
            }
            Ok(Finished::Installed(i)) => {
                log(format_args!(
                    "installed generation {generation}: {} ({} image, {} fetched, {} written, {} resumes) on {}",
                    i.digest,
                    i.format,
                    disk::bytes(i.fetched),
                    disk::bytes(i.written),
                    i.resumes,
                    i.disk.display()
                ));
                for w in &i.warnings {
                    log(format_args!("{w}"));
                }
                if !i.guards.is_empty() {
                    self.guards = Some((i.disk.clone(), i.guards.clone()));
                }
                (Outcome::Succeeded, Some(i.disk.clone()))
            }
            Err(f) => {
                log(format_args!("generation {generation} failed: {f}"));
                (Outcome::Failed(f.error.clone()), f.disk.clone())
            }
        };
        let record = Record {
            generation,
            outcome: outcome.clone(),
            disk,
            reboot,
            erase,
        };
        if self.guards.is_some() {
            // The record's file was on the disk just written: only the
            // memory keeps it (the next boot is the installed system's).
            self.memory = Some(record);
        } else {
            self.write_record(record, log);
        }
        Some(Answer {
            report: report(generation, &outcome),
            reboot: reboot && outcome == Outcome::Succeeded,
        })
    }

    /// The answer was received: the job is over.
    pub fn acknowledged(&mut self, generation: i64) {
        if self
            .job
            .as_ref()
            .is_some_and(|j| j.generation == generation)
        {
            let done = self
                .job
                .as_ref()
                .is_some_and(|j| matches!(j.counters.phase(), Phase::Done | Phase::Failed));
            if done {
                self.job = None;
            }
        }
    }

    /// Marks the installation in hand as rebooting, flushes every
    /// filesystem, and writes the guarded regions of a boot disk again: the
    /// last writes before the reboot (which itself flushes nothing).
    pub fn rebooting(&self, log: &dyn Fn(std::fmt::Arguments<'_>)) {
        if let Some(j) = &self.job {
            j.counters.set_phase(Phase::Rebooting);
        }
        // Everything written reaches the disks now, the old system's last
        // superblock writes included, so that the rewrites below come last.
        nix::unistd::sync();
        if let Some((path, guards)) = &self.guards {
            // Twice, a moment apart: what the old filesystems had queued
            // has landed by the second.
            let _ = disk::rewrite(path, guards);
            std::thread::sleep(Duration::from_millis(300));
            match disk::rewrite(path, guards) {
                Ok(()) => log(format_args!(
                    "wrote the image's first {} KiB of {} partitions again",
                    disk::GUARD_LEN >> 10,
                    guards.len()
                )),
                Err(e) => log(format_args!("{e}")),
            }
        }
    }
}
