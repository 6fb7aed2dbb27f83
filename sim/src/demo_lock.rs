//! One demo per checkout: the demo keeps its state in the checkout's
//! `var/demo` and wipes it first, so a second demo started from the same
//! checkout (from any directory: `scripts/demo` runs in the checkout)
//! would wipe the database of one that keeps running. The first holds an
//! exclusive lock on `var/demo.lock` (beside the folder it wipes, which
//! the lock outlives) for as long as it runs, and writes in it who it is;
//! a second is refused before it touches anything, naming the first. The
//! lock is the kernel's (`flock`): a demo killed leaves none behind.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

/// Why a demo cannot run here.
#[derive(Debug, thiserror::Error)]
pub enum DemoLockError {
    #[error(
        "another demo is running from this checkout ({held}), and this one would wipe its \
         database in {dir}: stop it first (Ctrl-C in its terminal, or kill that process), \
         or run this demo from another clone"
    )]
    Held { held: String, dir: PathBuf },
    #[error("the demo's lock {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The lock held while a demo runs (released when dropped, or when the
/// process ends however it ends).
pub struct DemoLock {
    file: nix::fcntl::Flock<File>,
    path: PathBuf,
}

impl DemoLock {
    /// Takes the lock for the demo whose state is `dir` (`…/var/demo`):
    /// `var/demo.lock` beside it.
    pub fn take(dir: &Path) -> Result<DemoLock, DemoLockError> {
        let path = dir.with_extension("lock");
        let io = |source| DemoLockError::Io {
            path: path.clone(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        let file = match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        {
            Ok(f) => f,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                let held = std::fs::read_to_string(&path).unwrap_or_default();
                let held = held.trim();
                return Err(DemoLockError::Held {
                    held: if held.is_empty() {
                        "it has not said who it is yet".into()
                    } else {
                        held.to_string()
                    },
                    dir: dir.to_path_buf(),
                });
            }
            Err((_, e)) => return Err(io(e.into())),
        };
        let mut lock = DemoLock { file, path };
        lock.say(&format!("pid {}", std::process::id()))?;
        Ok(lock)
    }

    /// Writes who holds it (`pid N, admin page …`), for a demo refused.
    pub fn say(&mut self, who: &str) -> Result<(), DemoLockError> {
        let io = |source| DemoLockError::Io {
            path: self.path.clone(),
            source,
        };
        self.file.set_len(0).map_err(io)?;
        self.file.write_all_at(who.as_bytes(), 0).map_err(io)
    }
}
