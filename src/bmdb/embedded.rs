//! An embedded PostgreSQL: the BMDB when no `bmdb.url` is configured.
//!
//! Uses the system's PostgreSQL server binaries (`initdb`, `postgres`),
//! keeps its data in `bmdb.embedded.data_dir`, listens on a unix socket only,
//! and stops when the last handle is dropped. The server process is tied to
//! ours with `PR_SET_PDEATHSIG`: if we die, it shuts down too. If a server is
//! already running on the data directory (another shepherd command), it is
//! used as it is and left running.
//!
//! PostgreSQL refuses to run as root; when we are root, the server runs as
//! the `postgres` system user, which then owns the data directory. That user
//! must be able to reach it: when the configured directory lies below one
//! it cannot enter (root's 0700 home, a `mktemp -d`), the data lives under
//! [`RELOCATED_BASE`] instead, with a symbolic link at the configured path,
//! and the log says so. Nothing about the operator's directories changes.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, Uid, User};

use super::BmdbError;
use crate::config::EmbeddedConfig;

/// Where the data of an embedded server run as `postgres` lives when that
/// user cannot reach the configured directory.
pub const RELOCATED_BASE: &str = "/var/lib/shepherd/embedded";

/// The database shepherd uses inside the embedded server.
pub const EMBEDDED_DATABASE: &str = "shepherd";
const SUPERUSER: &str = "postgres";

fn err(msg: impl Into<String>) -> BmdbError {
    BmdbError::Embedded(msg.into())
}

pub struct EmbeddedPostgres {
    data_dir: PathBuf,
    socket_dir: PathBuf,
    port: u16,
    /// The postmaster we started, if we started it (else we attached).
    owned: Mutex<Option<OwnedServer>>,
}

struct OwnedServer {
    pid: Pid,
    keeper: std::thread::JoinHandle<()>,
}

impl std::fmt::Debug for EmbeddedPostgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedPostgres")
            .field("data_dir", &self.data_dir)
            .field("socket_dir", &self.socket_dir)
            .finish()
    }
}

/// Finds the directory holding `postgres` and `initdb`.
pub fn find_bin_dir(configured: Option<&Path>) -> Result<PathBuf, BmdbError> {
    let has_server = |d: &Path| d.join("postgres").is_file() && d.join("initdb").is_file();
    if let Some(d) = configured {
        return if has_server(d) {
            Ok(d.to_path_buf())
        } else {
            Err(err(format!(
                "bmdb.embedded.bin_dir: {} has no postgres and initdb",
                d.display()
            )))
        };
    }
    // Debian/Ubuntu: /usr/lib/postgresql/<major>/bin, newest first.
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((major, e.path().join("bin")))
        })
        .filter(|(_, d)| has_server(d))
        .collect();
    versions.sort();
    if let Some((_, d)) = versions.pop() {
        return Ok(d);
    }
    for d in std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
    {
        if has_server(&d) {
            return Ok(d);
        }
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if has_server(&d) {
            return Ok(d);
        }
    }
    Err(err(
        "no PostgreSQL server binaries found (install the postgresql package, \
         or set bmdb.embedded.bin_dir, or set bmdb.url to use a running server)",
    ))
}

/// Who runs the server: ourselves, or `postgres` when we are root.
fn server_user() -> Result<Option<User>, BmdbError> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    match User::from_name(SUPERUSER) {
        Ok(Some(u)) => Ok(Some(u)),
        _ => Err(err(
            "running as root, and PostgreSQL refuses root: a `postgres` system user is needed",
        )),
    }
}

fn run_as(cmd: &mut Command, user: &Option<User>) {
    if let Some(u) = user {
        let (uid, gid) = (u.uid, u.gid);
        // SAFETY: only async-signal-safe system calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                nix::unistd::setgroups(&[]).map_err(std::io::Error::from)?;
                nix::unistd::setgid(gid).map_err(std::io::Error::from)?;
                nix::unistd::setuid(uid).map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        cmd.env("HOME", &u.dir).env("USER", &u.name);
    }
}

fn chown_tree(path: &Path, user: &User) -> Result<(), BmdbError> {
    nix::unistd::chown(path, Some(user.uid), Some(user.gid))
        .map_err(|e| err(format!("chown {}: {e}", path.display())))?;
    if path.is_dir() {
        for entry in std::fs::read_dir(path).map_err(|e| err(format!("{}: {e}", path.display())))? {
            let entry = entry.map_err(|e| err(e.to_string()))?;
            chown_tree(&entry.path(), user)?;
        }
    }
    Ok(())
}

/// Whether `user` can enter `dir` (search permission on it and every
/// directory above it, ACLs included): asked of the kernel, as that user.
fn can_enter(dir: &Path, user: &User) -> bool {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "cd -- \"$1\"", "sh"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    run_as(&mut cmd, &Some(user.clone()));
    cmd.status().map(|s| s.success()).unwrap_or(false)
}

/// The data directory the server will really use for `configured`: itself
/// if `user` can reach it, else a directory under [`RELOCATED_BASE`] named
/// after it, linked from `configured`.
fn reachable_data_dir(configured: &Path, user: &User) -> Result<PathBuf, BmdbError> {
    let parent = configured.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(parent).map_err(|e| {
        err(format!(
            "bmdb.embedded.data_dir {}: {e}",
            configured.display()
        ))
    })?;
    if let Ok(target) = std::fs::read_link(configured) {
        // Relocated by an earlier start (or linked by the operator).
        let target = if target.is_absolute() {
            target
        } else {
            parent.join(target)
        };
        std::fs::create_dir_all(&target)
            .map_err(|e| err(format!("bmdb.embedded.data_dir {}: {e}", target.display())))?;
        return Ok(target);
    }
    if can_enter(parent, user) {
        return Ok(configured.to_path_buf());
    }
    if configured.join("PG_VERSION").exists() {
        return Err(err(format!(
            "bmdb.embedded.data_dir {} holds a database, but the `{}` user the server runs as \
             cannot reach it: let it search the directories above, or move the data",
            configured.display(),
            user.name
        )));
    }
    if configured.is_dir() {
        // Empty, or what a failed start left: nothing of value.
        std::fs::remove_dir_all(configured)
            .map_err(|e| err(format!("{}: {e}", configured.display())))?;
    }
    let name: String = configured
        .to_string_lossy()
        .trim_start_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name = if name.len() > 60 {
        format!("{}-{:016x}", &name[name.len() - 40..], fxhash(configured))
    } else {
        name
    };
    let target = Path::new(RELOCATED_BASE).join(name);
    std::fs::create_dir_all(&target).map_err(|e| {
        err(format!(
            "relocating the embedded database to {}: {e}",
            target.display()
        ))
    })?;
    std::os::unix::fs::symlink(&target, configured).map_err(|e| {
        err(format!(
            "linking {} to {}: {e}",
            configured.display(),
            target.display()
        ))
    })?;
    tracing::info!(
        configured = %configured.display(),
        data_dir = %target.display(),
        "the embedded PostgreSQL runs as {}, which cannot reach the configured data directory; \
         its data lives in {} instead (linked from the configured path)",
        user.name,
        target.display()
    );
    Ok(target)
}

/// Removes an embedded server's data directory, and the relocated data a
/// symbolic link there points to (the demo's wipe). A server still
/// shutting down there (it ends with the process that started it, a
/// moment after) is waited for, up to 10 s, so that none of its last
/// files lands in a directory being removed.
pub fn remove_data_dir(path: &Path) -> std::io::Result<()> {
    if let Ok(target) = std::fs::read_link(path) {
        let target = match path.parent() {
            Some(p) if !target.is_absolute() => p.join(target),
            _ => target,
        };
        if target.exists() {
            remove_after_server(&target)?;
        }
        return std::fs::remove_file(path);
    }
    if path.exists() {
        remove_after_server(path)?;
    }
    Ok(())
}

fn remove_after_server(data_dir: &Path) -> std::io::Result<()> {
    let until = Instant::now() + Duration::from_secs(10);
    while running_postmaster(data_dir).is_some() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::remove_dir_all(data_dir)
}

/// The PID in `postmaster.pid`, if that process is alive.
fn running_postmaster(data_dir: &Path) -> Option<Pid> {
    let f = std::fs::File::open(data_dir.join("postmaster.pid")).ok()?;
    let mut first = String::new();
    BufReader::new(f).read_line(&mut first).ok()?;
    let pid = Pid::from_raw(first.trim().parse().ok()?);
    kill(pid, None).ok().map(|_| pid)
}

fn log_tail(path: &Path) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(2000)));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    s.lines()
        .rev()
        .take(6)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join(" | ")
}

impl EmbeddedPostgres {
    /// Starts (or attaches to) the server for `cfg.data_dir`, and makes sure
    /// the `shepherd` database exists.
    ///
    /// A server found running may be on its way out (the process that
    /// started it just ended, and it shuts down with it): once it is gone,
    /// this one starts its own.
    pub async fn start(cfg: &EmbeddedConfig) -> Result<EmbeddedPostgres, BmdbError> {
        let mut attached_to_a_leaving_server = 0;
        loop {
            let c = cfg.clone();
            let server = tokio::task::spawn_blocking(move || Self::start_blocking(&c))
                .await
                .map_err(|e| err(format!("start task failed: {e}")))??;
            match server
                .wait_ready_and_create_database(cfg.start_timeout)
                .await
            {
                Ok(()) => return Ok(server),
                Err(e)
                    if server.owned.lock().unwrap().is_none()
                        && running_postmaster(&server.data_dir).is_none()
                        && attached_to_a_leaving_server < 3 =>
                {
                    attached_to_a_leaving_server += 1;
                    tracing::info!(data_dir = %server.data_dir.display(), error = %e,
                        "the embedded PostgreSQL found running has shut down; starting one");
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn start_blocking(cfg: &EmbeddedConfig) -> Result<EmbeddedPostgres, BmdbError> {
        let cwd = std::env::current_dir().map_err(|e| err(e.to_string()))?;
        let data_dir = cwd.join(&cfg.data_dir);
        let user = server_user()?;
        let data_dir = match &user {
            Some(u) => reachable_data_dir(&data_dir, u)?,
            None => data_dir,
        };
        std::fs::create_dir_all(&data_dir).map_err(|e| {
            err(format!(
                "bmdb.embedded.data_dir {}: {e}",
                data_dir.display()
            ))
        })?;
        // The socket path must fit sun_path (108 bytes).
        let socket_dir = if data_dir.as_os_str().len() + 20 < 100 {
            data_dir.clone()
        } else {
            let dir = std::env::temp_dir().join(format!("shepherd-pg-{:x}", fxhash(&data_dir)));
            std::fs::create_dir_all(&dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
            if let Some(u) = &user {
                chown_tree(&dir, u)?;
            }
            dir
        };
        let port = 5432;
        let server = EmbeddedPostgres {
            data_dir: data_dir.clone(),
            socket_dir,
            port,
            owned: Mutex::new(None),
        };
        if let Some(pid) = running_postmaster(&data_dir) {
            tracing::info!(data_dir = %data_dir.display(), %pid, "using the embedded PostgreSQL already running");
            return Ok(server);
        }

        let bin = find_bin_dir(cfg.bin_dir.as_deref())?;
        if let Some(u) = &user {
            chown_tree(&data_dir, u)?;
        }
        std::fs::set_permissions(
            &data_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .map_err(|e| err(format!("{}: {e}", data_dir.display())))?;

        if !data_dir.join("PG_VERSION").exists() {
            tracing::info!(data_dir = %data_dir.display(), "initializing the embedded PostgreSQL");
            let mut cmd = Command::new(bin.join("initdb"));
            cmd.arg("-D")
                .arg(&data_dir)
                .args([
                    "-U",
                    SUPERUSER,
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--no-instructions",
                ])
                .stdin(Stdio::null());
            if !cfg.fsync {
                cmd.arg("--no-sync");
            }
            run_as(&mut cmd, &user);
            let out = cmd
                .output()
                .map_err(|e| err(format!("running {}: {e}", bin.join("initdb").display())))?;
            if !out.status.success() {
                return Err(err(format!(
                    "initdb failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        }

        let log_path = data_dir.join("shepherd-postgres.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| err(format!("{}: {e}", log_path.display())))?;
        if let Some(u) = &user {
            let _ = nix::unistd::chown(&log_path, Some(u.uid), Some(u.gid));
        }
        let mut cmd = Command::new(bin.join("postgres"));
        let mut args: Vec<OsString> = vec![
            "-D".into(),
            data_dir.clone().into(),
            "-k".into(),
            server.socket_dir.clone().into(),
            "-p".into(),
            port.to_string().into(),
            "-c".into(),
            "listen_addresses=".into(),
            "-c".into(),
            "max_connections=200".into(),
            // No JIT: the BMDB's queries are short, and the systemd unit's
            // MemoryDenyWriteExecute forbids the code LLVM would write.
            "-c".into(),
            "jit=off".into(),
        ];
        if !cfg.fsync {
            for o in [
                "fsync=off",
                "synchronous_commit=off",
                "full_page_writes=off",
            ] {
                args.push("-c".into());
                args.push(o.into());
            }
        }
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| err(e.to_string()))?)
            .stderr(log);
        run_as(&mut cmd, &user);
        // SAFETY: prctl and setpgid are async-signal-safe. Fast shutdown if
        // we die; a process group of its own, so that a terminal's Ctrl-C
        // reaches us (and our orderly shutdown) rather than the server.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGINT).map_err(std::io::Error::from)?;
                nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))
                    .map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        // PDEATHSIG fires when the spawning *thread* exits, so spawn from a
        // thread that lives exactly as long as the server.
        let (tx, rx) = std::sync::mpsc::channel();
        let keeper = std::thread::Builder::new()
            .name("bmdb-embedded".into())
            .spawn(move || match cmd.spawn() {
                Ok(mut child) => {
                    let _ = tx.send(Ok(child.id()));
                    let status = child.wait();
                    tracing::debug!(?status, "embedded PostgreSQL exited");
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            })
            .map_err(|e| err(e.to_string()))?;
        let pid = rx
            .recv()
            .map_err(|e| err(e.to_string()))?
            .map_err(|e| err(format!("starting {}: {e}", bin.join("postgres").display())))?;
        tracing::info!(data_dir = %data_dir.display(), pid, "embedded PostgreSQL started");
        *server.owned.lock().unwrap() = Some(OwnedServer {
            pid: Pid::from_raw(pid as i32),
            keeper,
        });
        Ok(server)
    }

    async fn wait_ready_and_create_database(&self, timeout: Duration) -> Result<(), BmdbError> {
        let deadline = Instant::now() + timeout;
        let mut admin = self.config_for("postgres");
        admin.connect_timeout(Duration::from_secs(2));
        let client = loop {
            match admin.connect(tokio_postgres::NoTls).await {
                Ok((client, conn)) => {
                    tokio::spawn(conn);
                    break client;
                }
                Err(e) => {
                    // Ours ended, or the one found running is gone.
                    let exited = match self.owned.lock().unwrap().as_ref() {
                        Some(o) => o.keeper.is_finished(),
                        None => running_postmaster(&self.data_dir).is_none(),
                    };
                    if exited || Instant::now() > deadline {
                        return Err(err(format!(
                            "server did not come up ({}); log: {}",
                            super::error::describe_pg_error(&e),
                            log_tail(&self.data_dir.join("shepherd-postgres.log"))
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let exists = client
            .query_opt(
                "SELECT 1 FROM pg_database WHERE datname = $1",
                &[&EMBEDDED_DATABASE],
            )
            .await?
            .is_some();
        if !exists {
            match client
                .batch_execute(&format!("CREATE DATABASE {EMBEDDED_DATABASE}"))
                .await
            {
                Ok(()) => {}
                // Created meanwhile by another process.
                Err(e)
                    if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Client configuration for `dbname` on this server.
    pub fn config_for(&self, dbname: &str) -> tokio_postgres::Config {
        let mut c = tokio_postgres::Config::new();
        c.host_path(&self.socket_dir)
            .port(self.port)
            .user(SUPERUSER)
            .dbname(dbname);
        c
    }

    /// Client configuration for the shepherd database.
    pub fn client_config(&self) -> tokio_postgres::Config {
        self.config_for(EMBEDDED_DATABASE)
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Where its unix socket is (the `host` of a connection string).
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// Fast shutdown of a server we started; waits up to 30 s, then
    /// immediate shutdown. A no-op for a server we attached to.
    pub fn stop(&self) {
        let Some(owned) = self.owned.lock().unwrap().take() else {
            return;
        };
        let _ = kill(owned.pid, Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !owned.keeper.is_finished() {
            if Instant::now() > deadline {
                let _ = kill(owned.pid, Signal::SIGQUIT);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = owned.keeper.join();
        tracing::info!(data_dir = %self.data_dir.display(), "embedded PostgreSQL stopped");
    }
}

impl Drop for EmbeddedPostgres {
    fn drop(&mut self) {
        self.stop();
    }
}

fn fxhash(p: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    p.hash(&mut h);
    h.finish()
}
