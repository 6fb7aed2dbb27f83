//! Installing an operating system image (CONTRACTS.md §4a,
//! `ImageInstallation`): one pass from the network to the disk, with
//! memory bounded whatever the image's size, verified before success.
//!
//! - [`disk`]: the machine's disks, the hints that choose one, the writer.
//! - [`fetch`]: HTTP(S) with connect, stall and total limits, resumed with
//!   a Range request after a dropped connection.
//! - [`swarm`]: the image's chunks fetched from other machines installing
//!   it (each checked against the manifest), and served to them.
//! - [`pipeline`]: hashing, decompression (gzip, zstd, xz by their magic
//!   bytes) and writing, on threads of their own.
//! - [`efi`]: the EFI boot entry for the installed disk, when asked.
//! - [`first_boot`]: the first-boot volume (cloud-init's NoCloud or config
//!   drive), when asked.
//! - [`partitions`]: reading the GPT and MBR partition tables (the EFI
//!   entry, the first-boot volume and an erasure's regions use it).
//! - [`erase`]: erasing disks (`DiskErasure`), through [`sg`] where a
//!   disk's own erase is asked for.
//! - [`record`]: what the agent did with which generation, kept across its
//!   restarts so that no generation is installed twice.
//! - [`install()`] (`image.rs`): one image onto one disk, from the request
//!   to the verified write, the first-boot volume and the boot entry.
//! - [`Installer`] (`installer.rs`): the resident agent's side: one
//!   installation at a time, its progress for the heartbeats, its report
//!   once done.
//!
//! Here: the limits an installation runs with and its [`Counters`].

pub mod chunks;
pub mod disk;
pub mod efi;
pub mod erase;
pub mod fetch;
pub mod first_boot;
mod image;
mod installer;
pub mod partitions;
pub mod pipeline;
pub mod record;
pub mod sg;
pub mod swarm;

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::api::InstallationProgress;
use crate::api::installation_progress::Phase;

pub use image::{Failed, Installed, check, install};
pub use installer::{Answer, Finished, Installer};
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
    /// Bytes of chunks kept for the other machines installing the same
    /// image (None: a quarter of the memory available, up to
    /// [`swarm::CACHE_MAX`]).
    pub swarm_cache: Option<usize>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fetch: fetch::FetchLimits::default(),
            agent_key: None,
            deadline: Duration::from_secs(2 * 3600),
            efivars: PathBuf::from("/sys/firmware/efi/efivars"),
            swarm_cache: None,
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
    /// Of `fetched`, bytes from the image's swarm.
    pub from_peers: AtomicU64,
    /// Chunks that did not match the manifest, fetched again.
    pub refused: AtomicU32,
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
            from_peers: AtomicU64::new(0),
            refused: AtomicU32::new(0),
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

    /// The progress as a heartbeat carries it. Its rate is of the bytes
    /// fetched, or for an erasure (which fetches nothing) of those written
    /// or discarded.
    pub fn progress(&self, generation: i64) -> InstallationProgress {
        let fetched = self.fetched.load(Ordering::Relaxed);
        let written = self.written.load(Ordering::Relaxed);
        let moved = if fetched > 0 { fetched } else { written };
        let secs = self.started.elapsed().as_secs_f64();
        InstallationProgress {
            generation,
            phase: self.phase.load(Ordering::Relaxed),
            bytes_fetched: fetched as i64,
            bytes_written: written as i64,
            bytes_total: self.total.load(Ordering::Relaxed) as i64,
            rate_bytes_per_second: if secs > 0.0 {
                (moved as f64 / secs) as i64
            } else {
                0
            },
            disk: self.disk.lock().unwrap().clone(),
            resumes: self.resumes.load(Ordering::Relaxed) as i32,
            bytes_from_peers: self.from_peers.load(Ordering::Relaxed) as i64,
            chunks_refused: self.refused.load(Ordering::Relaxed) as i32,
        }
    }
}
