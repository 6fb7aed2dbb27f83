//! SSH to machines, for the takeover: shepherd's identity, host key policy,
//! upload, and running a command with stdin and a capped stdout.
//!
//! Built on russh (the library async-ssh2-tokio wraps): the takeover needs
//! the server's host key on first contact (to record it, `accept-new`), the
//! agent's stdout as bytes with a size cap, and stdin closed after the init
//! message, which the wrapper's API does not give.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::ChannelMsg;
use russh::keys::{PrivateKey, PrivateKeyWithHashAlg, PublicKey};

/// How a machine's SSH host key is checked (`ssh.host_keys`).
pub use crate::config::HostKeyPolicy;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SshError {
    #[error("connect to {addr}: {message}")]
    Connect { addr: SocketAddr, message: String },
    #[error("host key of {addr} changed: expected {expected}, got {got}")]
    HostKeyChanged {
        addr: SocketAddr,
        expected: String,
        got: String,
    },
    #[error("host key of {addr} ({got}) is not in the known hosts file")]
    HostKeyUnknown { addr: SocketAddr, got: String },
    #[error("authenticate as {user}: refused")]
    AuthRefused { user: String },
    #[error("upload to {path}: {message}")]
    Upload { path: String, message: String },
    #[error("run {command}: {message}")]
    Exec { command: String, message: String },
    #[error("agent wrote more than {limit} bytes to stdout")]
    StdoutTooLarge { limit: usize },
    #[error("{step}: timed out after {after:?}")]
    Timeout { step: &'static str, after: Duration },
    #[error("ssh identity {path}: {message}")]
    Identity { path: PathBuf, message: String },
}

/// shepherd's own SSH key. Generated on first use, stored with mode 0600.
#[derive(Clone)]
pub struct SshIdentity {
    key: Arc<PrivateKey>,
    public: String,
}

impl std::fmt::Debug for SshIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshIdentity")
            .field("public", &self.public)
            .finish()
    }
}

impl SshIdentity {
    /// Loads the OpenSSH private key at `path`, or generates an ed25519 key
    /// there (mode 0600, directory 0700) if there is none.
    pub fn load_or_generate(path: &Path) -> Result<SshIdentity, SshError> {
        let err = |message: String| SshError::Identity {
            path: path.to_path_buf(),
            message,
        };
        if path.exists() {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path)
                .map_err(|e| err(e.to_string()))?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                return Err(err(format!(
                    "mode {:o} lets others read it; chmod 600 it",
                    mode & 0o777
                )));
            }
            let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
            let key = PrivateKey::from_openssh(text.as_bytes())
                .map_err(|e| err(format!("not an OpenSSH private key: {e}")))?;
            if key.is_encrypted() {
                return Err(err("is encrypted; shepherd needs an unencrypted key".into()));
            }
            return Ok(Self::from_key(key));
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| err(format!("creating {}: {e}", dir.display())))?;
        }
        let seed: [u8; 32] = rand::random();
        let pair = russh::keys::ssh_key::private::Ed25519Keypair::from_seed(&seed);
        let mut key = PrivateKey::from(pair);
        key.set_comment("shepherd");
        let text = key
            .to_openssh(russh::keys::ssh_key::LineEnding::LF)
            .map_err(|e| err(e.to_string()))?;
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| err(e.to_string()))?;
            f.write_all(text.as_bytes())
                .map_err(|e| err(e.to_string()))?;
        }
        tracing::info!(path = %path.display(), "generated shepherd's SSH key");
        Ok(Self::from_key(key))
    }

    /// An identity from an OpenSSH private key's text (a switch's key,
    /// from configuration).
    pub fn from_openssh(text: &str) -> Result<SshIdentity, russh::keys::ssh_key::Error> {
        let key = PrivateKey::from_openssh(text.as_bytes())?;
        if key.is_encrypted() {
            return Err(russh::keys::ssh_key::Error::Encrypted);
        }
        Ok(Self::from_key(key))
    }

    fn from_key(key: PrivateKey) -> SshIdentity {
        let public = key.public_key().to_openssh().unwrap_or_default();
        SshIdentity {
            key: Arc::new(key),
            public,
        }
    }

    /// The private key (for a server's host key).
    pub fn private_key(&self) -> &PrivateKey {
        &self.key
    }

    /// The public key in OpenSSH format, for authorized_keys or a provider.
    pub fn public_key(&self) -> &str {
        &self.public
    }
}

/// Settings of one takeover's SSH side.
#[derive(Debug, Clone)]
pub struct SshSettings {
    pub user: String,
    pub connect_timeout: Duration,
    pub host_keys: HostKeyPolicy,
    pub known_hosts_file: Option<PathBuf>,
    pub max_stdout: usize,
    pub max_stderr: usize,
    /// Upload with exec + cat instead of SFTP.
    pub upload_by_exec: bool,
}

/// Decides on the server's key and remembers what it was shown.
struct Handler {
    addr: SocketAddr,
    policy: HostKeyPolicy,
    known: Option<PublicKey>,
    known_hosts_file: Option<PathBuf>,
    seen: Arc<Mutex<Option<PublicKey>>>,
}

impl russh::client::Handler for Handler {
    type Error = russh::Error;

    async fn check_server_key(&mut self, key: &PublicKey) -> Result<bool, Self::Error> {
        *self.seen.lock().unwrap() = Some(key.clone());
        Ok(match self.policy {
            HostKeyPolicy::InsecureIgnore => true,
            HostKeyPolicy::AcceptNew => self
                .known
                .as_ref()
                .is_none_or(|k| k.key_data() == key.key_data()),
            HostKeyPolicy::KnownHosts => match &self.known_hosts_file {
                Some(f) => russh::keys::check_known_hosts_path(
                    &self.addr.ip().to_string(),
                    self.addr.port(),
                    key,
                    f,
                )
                .unwrap_or(false),
                None => false,
            },
        })
    }
}

/// AES-GCM first: with AES instructions (any server CPU of the last decade)
/// it costs a fraction of ChaCha20-Poly1305 per byte, and the takeover's
/// bytes are mostly the agent upload.
const CIPHERS: &[russh::cipher::Name] = &[
    russh::cipher::AES_256_GCM,
    russh::cipher::CHACHA20_POLY1305,
    russh::cipher::AES_256_CTR,
    russh::cipher::AES_128_CTR,
];

/// An authenticated SSH connection to a machine.
pub struct Connection {
    handle: russh::client::Handle<Handler>,
    host_key: PublicKey,
}

pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(russh::keys::HashAlg::Sha256).to_string()
}

/// Connects to `addr` and authenticates with `identity`. `known` is the host
/// key recorded for the machine (for `accept-new`).
pub async fn connect(
    settings: &SshSettings,
    identity: &SshIdentity,
    addr: SocketAddr,
    known: Option<PublicKey>,
) -> Result<Connection, SshError> {
    let seen = Arc::new(Mutex::new(None));
    let handler = Handler {
        addr,
        policy: settings.host_keys,
        known: known.clone(),
        known_hosts_file: settings.known_hosts_file.clone(),
        seen: seen.clone(),
    };
    let config = Arc::new(russh::client::Config {
        inactivity_timeout: None,
        preferred: russh::Preferred {
            cipher: std::borrow::Cow::Borrowed(CIPHERS),
            ..Default::default()
        },
        ..Default::default()
    });
    let connecting = russh::client::connect(config, addr, handler);
    let mut handle = match tokio::time::timeout(settings.connect_timeout, connecting).await {
        Err(_) => {
            return Err(SshError::Timeout {
                step: "connect",
                after: settings.connect_timeout,
            });
        }
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            let shown = seen.lock().unwrap().clone();
            return Err(match (e, shown) {
                (russh::Error::UnknownKey, Some(got)) => match settings.host_keys {
                    HostKeyPolicy::KnownHosts => SshError::HostKeyUnknown {
                        addr,
                        got: fingerprint(&got),
                    },
                    _ => SshError::HostKeyChanged {
                        addr,
                        expected: known.as_ref().map(fingerprint).unwrap_or_default(),
                        got: fingerprint(&got),
                    },
                },
                (e, _) => SshError::Connect {
                    addr,
                    message: describe(&e),
                },
            });
        }
    };
    let host_key = seen
        .lock()
        .unwrap()
        .clone()
        .expect("the handshake showed a host key");
    let auth = handle
        .authenticate_publickey(
            &settings.user,
            PrivateKeyWithHashAlg::new(identity.key.clone(), None),
        )
        .await
        .map_err(|e| SshError::Connect {
            addr,
            message: format!("authentication: {}", describe(&e)),
        })?;
    if !auth.success() {
        return Err(SshError::AuthRefused {
            user: settings.user.clone(),
        });
    }
    Ok(Connection { handle, host_key })
}

fn describe(e: &russh::Error) -> String {
    match e {
        russh::Error::IO(io) => io.to_string(),
        other => other.to_string(),
    }
}

/// What a command printed and how it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output {
    pub stdout: Vec<u8>,
    /// The first `max_stderr` bytes.
    pub stderr: Vec<u8>,
    pub exit_status: Option<u32>,
    pub exit_signal: Option<String>,
}

impl Output {
    /// stderr as text for an error message: trimmed, last line-ish.
    pub fn stderr_text(&self) -> String {
        let s = String::from_utf8_lossy(&self.stderr);
        let s = s.trim();
        let tail: String = s
            .chars()
            .rev()
            .take(300)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        tail.replace('\n', " | ")
    }
}

impl Connection {
    /// The host key the server presented.
    pub fn host_key(&self) -> &PublicKey {
        &self.host_key
    }

    /// Runs `command` with `stdin` then EOF, collecting stdout (at most
    /// `max_stdout` bytes, else an error) and the head of stderr.
    pub async fn run(
        &self,
        command: &str,
        stdin: &[u8],
        settings: &SshSettings,
    ) -> Result<Output, SshError> {
        let exec_err = |message: String| SshError::Exec {
            command: command.to_string(),
            message,
        };
        let mut channel = self.open_exec(command).await?;
        if !stdin.is_empty() {
            channel
                .data(stdin)
                .await
                .map_err(|e| exec_err(format!("writing stdin: {}", describe(&e))))?;
        }
        channel
            .eof()
            .await
            .map_err(|e| exec_err(format!("closing stdin: {}", describe(&e))))?;
        let mut out = Output::default();
        while let Some(msg) = channel.wait().await {
            match msg {
                ChannelMsg::Data { data } => {
                    if out.stdout.len() + data.len() > settings.max_stdout {
                        let _ = channel.close().await;
                        return Err(SshError::StdoutTooLarge {
                            limit: settings.max_stdout,
                        });
                    }
                    out.stdout.extend_from_slice(&data);
                }
                ChannelMsg::ExtendedData { data, ext: 1 } => {
                    let room = settings.max_stderr.saturating_sub(out.stderr.len());
                    out.stderr.extend_from_slice(&data[..data.len().min(room)]);
                }
                ChannelMsg::ExitStatus { exit_status } => out.exit_status = Some(exit_status),
                ChannelMsg::ExitSignal { signal_name, .. } => {
                    out.exit_signal = Some(format!("{signal_name:?}"))
                }
                ChannelMsg::Failure => return Err(exec_err("the server refused to run it".into())),
                _ => {}
            }
        }
        Ok(out)
    }

    /// Starts `command` and hands back its channel, for a command that
    /// streams until it is closed (a BMC's serial console).
    pub async fn open_exec(
        &self,
        command: &str,
    ) -> Result<russh::Channel<russh::client::Msg>, SshError> {
        let exec_err = |message: String| SshError::Exec {
            command: command.to_string(),
            message,
        };
        let channel = self
            .handle
            .channel_open_session()
            .await
            .map_err(|e| exec_err(describe(&e)))?;
        channel
            .exec(true, command)
            .await
            .map_err(|e| exec_err(describe(&e)))?;
        Ok(channel)
    }

    /// Uploads `bytes` to `path` with mode 0755, atomically: written to a
    /// temporary name beside it, then renamed over it (a running old binary
    /// is no obstacle).
    pub async fn upload(
        &self,
        path: &str,
        bytes: &[u8],
        settings: &SshSettings,
    ) -> Result<(), SshError> {
        let tmp = format!("{path}.upload-{:08x}", rand::random::<u32>());
        if settings.upload_by_exec {
            return self.upload_by_exec(path, &tmp, bytes, settings).await;
        }
        match self.upload_by_sftp(path, &tmp, bytes).await {
            Err(SftpUnavailable(reason)) => {
                tracing::debug!(%reason, "no SFTP; uploading with exec");
                self.upload_by_exec(path, &tmp, bytes, settings).await
            }
            Ok(r) => r,
        }
    }

    async fn upload_by_sftp(
        &self,
        path: &str,
        tmp: &str,
        bytes: &[u8],
    ) -> Result<Result<(), SshError>, SftpUnavailable> {
        use russh_sftp::client::SftpSession;
        use russh_sftp::protocol::{FileAttributes, OpenFlags};
        use tokio::io::AsyncWriteExt;
        let err = |message: String| SshError::Upload {
            path: path.to_string(),
            message,
        };
        let channel = self
            .handle
            .channel_open_session()
            .await
            .map_err(|e| SftpUnavailable(describe(&e)))?;
        channel
            .request_subsystem(true, "sftp")
            .await
            .map_err(|e| SftpUnavailable(describe(&e)))?;
        let sftp = SftpSession::new(channel.into_stream())
            .await
            .map_err(|e| SftpUnavailable(e.to_string()))?;
        let result = async {
            let mut attrs = FileAttributes::empty();
            attrs.permissions = Some(0o755);
            let mut f = sftp
                .open_with_flags_and_attributes(
                    tmp,
                    OpenFlags::CREATE | OpenFlags::TRUNCATE | OpenFlags::WRITE,
                    attrs,
                )
                .await
                .map_err(|e| err(format!("creating {tmp}: {e}")))?;
            f.write_all(bytes)
                .await
                .map_err(|e| err(format!("writing: {e}")))?;
            f.shutdown()
                .await
                .map_err(|e| err(format!("closing: {e}")))?;
            let mut mode = FileAttributes::empty();
            mode.permissions = Some(0o755);
            sftp.set_metadata(tmp, mode)
                .await
                .map_err(|e| err(format!("chmod 0755: {e}")))?;
            // SFTP v3 rename does not replace: remove the old file first.
            let _ = sftp.remove_file(path).await;
            sftp.rename(tmp, path)
                .await
                .map_err(|e| err(format!("renaming into place: {e}")))?;
            Ok(())
        }
        .await;
        if result.is_err() {
            let _ = sftp.remove_file(tmp).await;
        }
        let _ = sftp.close().await;
        Ok(result)
    }

    async fn upload_by_exec(
        &self,
        path: &str,
        tmp: &str,
        bytes: &[u8],
        settings: &SshSettings,
    ) -> Result<(), SshError> {
        let command = format!(
            "umask 077 && cat > {t} && chmod 0755 {t} && mv -f {t} {p}",
            t = shell_quote(tmp),
            p = shell_quote(path)
        );
        let out = self
            .run(&command, bytes, settings)
            .await
            .map_err(|e| SshError::Upload {
                path: path.to_string(),
                message: e.to_string(),
            })?;
        if out.exit_status != Some(0) {
            return Err(SshError::Upload {
                path: path.to_string(),
                message: match out.exit_status {
                    Some(code) => format!("exit status {code}: {}", out.stderr_text()),
                    None => format!("no exit status: {}", out.stderr_text()),
                },
            });
        }
        Ok(())
    }

    pub async fn close(self) {
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, "", "")
            .await;
    }
}

struct SftpUnavailable(String);

/// Single-quotes `s` for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_is_generated_once_private_and_reloaded() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/id_ed25519");
        let a = SshIdentity::load_or_generate(&path).unwrap();
        assert!(a.public_key().starts_with("ssh-ed25519 "));
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let b = SshIdentity::load_or_generate(&path).unwrap();
        assert_eq!(a.public_key(), b.public_key());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = SshIdentity::load_or_generate(&path).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        assert!(!format!("{a:?}").contains("PRIVATE"));
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("/root/agent"), "'/root/agent'");
        assert_eq!(shell_quote("a'b"), r"'a'\''b'");
    }
}
