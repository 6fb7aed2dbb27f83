//! IPMI Serial-over-LAN through Debian's `ipmitool` (`sol activate`), as
//! Ironic reads consoles. The password reaches ipmitool through a pipe it
//! reads as `-f /dev/fd/3`, never on its command line or in its
//! environment (its standard input carries the keystrokes). Cipher suite
//! 17 is tried first, then 3, as `crate::ipmi` does.
//!
//! A session is ended by closing ipmitool's standard input: at its end of
//! input ipmitool deactivates the payload and closes its session, as its
//! `~.` escape does, but nothing is typed on the machine (`~.` is taken
//! only after a newline, and that newline would reach the console: an
//! operator's half-typed line would run).

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::Stdio;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::config::{BmcConfig, IpmiConfig};

/// The suites asked for, in order.
pub(super) const SUITES: [u8; 2] = [17, 3];

/// What ipmitool writes around the console's own bytes.
const BANNERS: [&str; 3] = [
    "[SOL Session operational.  Use ~? for help]\r\n",
    "[SOL Session operational.  Use ~? for help]\n",
    "[terminated ipmitool]",
];

/// Why ipmitool could not be started, or did not deactivate a payload.
#[derive(Debug, thiserror::Error)]
pub(super) enum SolError {
    #[error("a pipe for ipmitool's password: {0}")]
    Pipe(std::io::Error),
    #[error("cannot run {} ({source}; Debian's ipmitool package has it, or set ipmi.ipmitool)", .ipmitool.display())]
    Spawn {
        ipmitool: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("ipmitool sol deactivate {0}")]
    Deactivate(String),
}

pub(super) struct SolStream {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
    /// Whether any console byte came yet (a failure before one may be the
    /// cipher suite's).
    pub(super) spoke: bool,
    /// ipmitool said the session is operational, not yet told.
    opened: bool,
}

/// The pipe's read end, the password written into it (a password is far
/// below a pipe's buffer).
fn password_pipe(bmc: &BmcConfig) -> std::io::Result<OwnedFd> {
    use std::io::Write as _;
    let (reader, mut writer) = std::io::pipe()?;
    writer.write_all(bmc.password.expose().as_bytes())?;
    writer.write_all(b"\n")?;
    drop(writer);
    Ok(reader.into())
}

/// `ipmitool … sol WHAT` on `target` in `suite`, its password on
/// descriptor 3, started.
fn sol(
    cfg: &IpmiConfig,
    target: &(String, u16),
    bmc: &BmcConfig,
    suite: u8,
    what: &str,
) -> Result<Child, SolError> {
    let pw = password_pipe(bmc).map_err(SolError::Pipe)?;
    let raw = pw.as_raw_fd();
    let mut cmd = std::process::Command::new(&cfg.ipmitool);
    cmd.args(["-I", "lanplus", "-H", &target.0, "-p"])
        .arg(target.1.to_string())
        .args(["-U", &bmc.username, "-C"])
        .arg(suite.to_string())
        .args(["-f", "/dev/fd/3", "sol", what])
        .env_remove("IPMI_PASSWORD")
        .env_remove("IPMITOOL_PASSWORD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: dup2 and fcntl are async-signal-safe; only the child's
    // descriptor 3 is touched.
    unsafe {
        cmd.pre_exec(move || {
            if raw == 3 {
                let fd = std::os::fd::BorrowedFd::borrow_raw(3);
                nix::fcntl::fcntl(
                    fd,
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                )
                .map_err(std::io::Error::from)?;
            } else {
                let from = std::os::fd::BorrowedFd::borrow_raw(raw);
                let to = <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(3);
                let dup = nix::unistd::dup2_raw(from, to).map_err(std::io::Error::from)?;
                std::mem::forget(dup);
            }
            Ok(())
        });
    }
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let child = cmd.spawn().map_err(|source| SolError::Spawn {
        ipmitool: cfg.ipmitool.clone(),
        source,
    })?;
    drop(pw);
    Ok(child)
}

/// Starts `ipmitool … sol activate` on `target` in `suite`.
pub(super) fn activate(
    cfg: &IpmiConfig,
    target: &(String, u16),
    bmc: &BmcConfig,
    suite: u8,
) -> Result<SolStream, SolError> {
    let mut child = sol(cfg, target, bmc, suite, "activate")?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().expect("piped");
    Ok(SolStream {
        child,
        stdin,
        stdout,
        spoke: false,
        opened: false,
    })
}

/// Deactivates the SOL payload on `target` (`ipmitool … sol
/// deactivate`): the one a session of ours held when its BMC stopped
/// answering, so that the console can be activated again; Ok when it
/// exited 0.
pub(super) async fn deactivate(
    cfg: &IpmiConfig,
    target: &(String, u16),
    bmc: &BmcConfig,
    suite: u8,
) -> Result<(), SolError> {
    let mut child = sol(cfg, target, bmc, suite, "deactivate")?;
    drop(child.stdin.take());
    match tokio::time::timeout(std::time::Duration::from_secs(15), child.wait()).await {
        Ok(Ok(s)) if s.success() => Ok(()),
        Ok(Ok(s)) => Err(SolError::Deactivate(format!("exited ({s})"))),
        Ok(Err(e)) => Err(SolError::Deactivate(e.to_string())),
        Err(_) => Err(SolError::Deactivate("did not end within 15 s".into())),
    }
}

impl SolStream {
    /// The console's next bytes (none when only ipmitool's banner came:
    /// [`SolStream::opened`] tells); None when ipmitool ended (then
    /// [`SolStream::ended`] says why).
    pub(super) async fn read(&mut self) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = self.stdout.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            let mut chunk = buf[..n].to_vec();
            for (k, b) in BANNERS.iter().enumerate() {
                if let Some(i) = find(&chunk, b.as_bytes()) {
                    chunk.drain(i..i + b.len());
                    self.opened |= k < 2;
                }
            }
            if chunk.is_empty() && !self.opened {
                continue;
            }
            self.spoke |= !chunk.is_empty();
            return Some(chunk);
        }
    }

    /// Why ipmitool ended: its exit and its last words (the password
    /// redacted, should it ever print it).
    pub(super) async fn ended(mut self, bmc: &BmcConfig) -> String {
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                e.read_to_string(&mut err),
            )
            .await;
        }
        let status = tokio::time::timeout(std::time::Duration::from_secs(2), self.child.wait())
            .await
            .ok()
            .and_then(Result::ok);
        let said: Vec<&str> = err
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("tcgetattr") && !l.starts_with("tcsetattr"))
            .collect();
        let mut why = match status {
            Some(s) if s.success() => "ipmitool ended the session".to_string(),
            Some(s) => format!("ipmitool exited ({s})"),
            None => "ipmitool did not exit".to_string(),
        };
        if !said.is_empty() {
            why.push_str(": ");
            why.push_str(&said.join("; "));
        }
        let pw = bmc.password.expose();
        if pw.is_empty() {
            why
        } else {
            why.replace(pw, "[redacted]")
        }
    }

    /// Whether ipmitool said the session is operational since this was
    /// last asked.
    pub(super) fn opened(&mut self) -> bool {
        std::mem::take(&mut self.opened)
    }

    /// Ends ipmitool at once: its BMC stopped answering, so nothing can be
    /// deactivated.
    pub(super) async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    /// Keystrokes to the console.
    pub(super) async fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match &mut self.stdin {
            Some(s) => s.write_all(bytes).await,
            None => Ok(()),
        }
    }

    /// Leaves the session without typing on the machine: ipmitool's
    /// input ends, so it deactivates the payload (the BMC frees it at once)
    /// and exits; ended after a while if it does not.
    pub(super) async fn close(mut self) {
        drop(self.stdin.take());
        if tokio::time::timeout(std::time::Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
