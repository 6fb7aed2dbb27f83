//! A serial console that is a command on the BMC's SSH (iDRAC's `console
//! com2`, iLO's `vsp`): shepherd logs in with the key the BMC's `console`
//! names, runs the command, and reads what it prints.

use std::time::Duration;

use russh::ChannelMsg;

use crate::config::HostKeyPolicy;
use crate::ssh::{self, SshError, SshIdentity, SshSettings};

pub(super) struct SshStream {
    conn: ssh::Connection,
    channel: russh::Channel<russh::client::Msg>,
    /// Why the channel ended, once it did.
    pub(super) end: Option<String>,
}

/// Why a console over a BMC's SSH could not be opened or written to.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleSshError {
    #[error("{address}: {message}")]
    Address { address: String, message: String },
    #[error("console.host_key: {0}")]
    HostKey(String),
    #[error(transparent)]
    Ssh(#[from] SshError),
    #[error("writing to the console: {0}")]
    Write(String),
}

/// Logs in to `address` as `username` with the key in `key_file`, and
/// starts `command`. `host_key`: the BMC's, pinned (None: any, logged).
pub(super) async fn open(
    address: &str,
    username: &str,
    command: &str,
    key_file: &std::path::Path,
    host_key: Option<&str>,
) -> Result<SshStream, ConsoleSshError> {
    let at = |message: String| ConsoleSshError::Address {
        address: address.to_string(),
        message,
    };
    let addr = tokio::net::lookup_host(address)
        .await
        .map_err(|e| at(e.to_string()))?
        .next()
        .ok_or_else(|| at("no address".into()))?;
    let identity = SshIdentity::load_or_generate(key_file)?;
    let known = match host_key {
        Some(k) => Some(
            russh::keys::PublicKey::from_openssh(k.trim())
                .map_err(|e| ConsoleSshError::HostKey(e.to_string()))?,
        ),
        None => None,
    };
    let settings = SshSettings {
        user: username.to_string(),
        connect_timeout: Duration::from_secs(15),
        host_keys: HostKeyPolicy::AcceptNew,
        known_hosts_file: None,
        max_stdout: 0,
        max_stderr: 0,
        upload_by_exec: false,
    };
    let conn = ssh::connect(&settings, &identity, addr, known).await?;
    if host_key.is_none() {
        tracing::info!(%address, host_key = %ssh::fingerprint(conn.host_key()), "reading a console over a BMC's SSH whose host key is not pinned (console.host_key)");
    }
    let channel = conn.open_exec(command).await?;
    Ok(SshStream {
        conn,
        channel,
        end: None,
    })
}

impl SshStream {
    /// The console's next bytes (what the command writes on either
    /// stream); None when it ended, [`SshStream::end`] saying why.
    pub(super) async fn read(&mut self) -> Option<Vec<u8>> {
        loop {
            match self.channel.wait().await {
                None => {
                    self.end
                        .get_or_insert_with(|| "the BMC closed the channel".into());
                    return None;
                }
                Some(ChannelMsg::Data { data }) | Some(ChannelMsg::ExtendedData { data, .. }) => {
                    return Some(data.to_vec());
                }
                Some(ChannelMsg::ExitStatus { exit_status }) => {
                    self.end = Some(format!("the console's command exited ({exit_status})"));
                }
                Some(ChannelMsg::Failure) => {
                    self.end = Some("the BMC refused to run the console's command".into());
                    return None;
                }
                Some(ChannelMsg::Eof) | Some(ChannelMsg::Close) => {
                    self.end
                        .get_or_insert_with(|| "the BMC closed the console".into());
                    return None;
                }
                Some(_) => {}
            }
        }
    }

    pub(super) async fn write(&mut self, bytes: &[u8]) -> Result<(), ConsoleSshError> {
        self.channel
            .data(bytes)
            .await
            .map_err(|e| ConsoleSshError::Write(e.to_string()))
    }

    pub(super) async fn close(self) {
        let _ = self.channel.close().await;
        self.conn.close().await;
    }
}
