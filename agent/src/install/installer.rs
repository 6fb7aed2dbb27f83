//! The resident agent's installations (`OsInstallationRequest`): at most
//! one in hand (an image or an erasure), its progress for the heartbeats,
//! its report once done, and the record that keeps a generation from being
//! carried out twice across restarts.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::disk::{self, Disk};
use super::image::{Failed, Installed, check, failed, install};
use super::record::{self, Outcome, Record};
use super::{Counters, Limits, erase};
use crate::api::installation_progress::Phase;
use crate::api::{
    InstallationProgress, OsInstallationReport, OsInstallationRequest, os_installation_report,
    os_installation_request,
};

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
    /// The task's result; None once [`Installer::poll`] took it (the
    /// caller holds the answer until shepherd received it).
    done: Option<tokio::sync::oneshot::Receiver<Result<Finished, Failed>>>,
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
            done: Some(rx),
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
            done: Some(rx),
        });
        None
    }

    /// The answer of the installation in hand once it is done (then the
    /// record says so), once: asked again before shepherd acknowledged it,
    /// None (the caller holds the answer and sends it again).
    pub fn poll(&mut self, log: &dyn Fn(std::fmt::Arguments<'_>)) -> Option<Answer> {
        let job = self.job.as_mut()?;
        let result = match job.done.as_mut()?.try_recv() {
            Ok(r) => r,
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => return None,
            Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                Err(failed("the installation task ended without a result"))
            }
        };
        job.done = None;
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
