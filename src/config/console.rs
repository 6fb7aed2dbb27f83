//! Serial consoles: `[console]` (how shepherd keeps what machines print)
//! and a BMC's `console` (how a machine's serial console is reached
//! through its BMC: IPMI Serial-over-LAN, or a command on the BMC's SSH).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[console]`: what shepherd keeps of the consoles it reads.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleSettings {
    /// Read a machine's console during every boot shepherd makes through
    /// its BMC (enrollment, inspection, servicing, recovery).
    pub capture: bool,
    /// The bytes of each boot's console kept (its last ones).
    pub tail_bytes: usize,
    /// Captures kept per machine (the oldest go).
    pub kept: i64,
    /// A capture ends after this at the latest.
    #[serde(with = "humantime_serde")]
    pub capture_for: Duration,
    /// How often a capture's tail is written to the BMDB while it runs.
    #[serde(with = "humantime_serde")]
    pub write_every: Duration,
    /// After the console's reader ended (the BMC closed it), the wait
    /// before it is opened again (doubled, up to a minute, while it ends
    /// without printing a byte).
    #[serde(with = "humantime_serde")]
    pub reopen_after: Duration,
    /// Where machines' consoles are served over SSH (`ssh -p PORT
    /// MACHINE@host`, as Equinix Metal's SOS); unset: not served.
    pub listen: Option<std::net::SocketAddr>,
    /// The console server's SSH host key (an OpenSSH private key, made on
    /// first start).
    pub host_key_file: PathBuf,
    /// Operators' public keys, in authorized_keys' form (one a line, its
    /// comment the operator's name in the audit), read at each login;
    /// unset: only tenants, with their projects' keys.
    pub operator_keys: Option<PathBuf>,
    /// How often the console server tells the BMDB its connections are
    /// alive; a connection not told so for four times this is ended in
    /// the audit by any shepherd's console server (its shepherd stopped).
    #[serde(with = "humantime_serde")]
    pub keep_alive: Duration,
}

impl Default for ConsoleSettings {
    fn default() -> Self {
        ConsoleSettings {
            capture: true,
            tail_bytes: 64 * 1024,
            kept: 10,
            capture_for: Duration::from_secs(30 * 60),
            write_every: Duration::from_secs(2),
            reopen_after: Duration::from_secs(5),
            listen: None,
            host_key_file: PathBuf::from("var/ssh/console_host_ed25519"),
            operator_keys: None,
            keep_alive: Duration::from_secs(30),
        }
    }
}

impl ConsoleSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::within("console.tail_bytes", self.tail_bytes, 1024..=16 << 20)?;
        ConfigError::within("console.kept", self.kept, 1..=1000)?;
        for (k, v) in [
            ("console.capture_for", self.capture_for),
            ("console.write_every", self.write_every),
            ("console.reopen_after", self.reopen_after),
            ("console.keep_alive", self.keep_alive),
        ] {
            ConfigError::positive(k, v)?;
        }
        if self.listen.is_some() && self.host_key_file.as_os_str().is_empty() {
            return Err(ConfigError::key(
                "console.host_key_file",
                "is empty: the console server needs a host key",
            ));
        }
        Ok(())
    }
}

/// How a machine's serial console is reached through its BMC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConsoleVia {
    /// IPMI Serial-over-LAN (`ipmitool sol activate`): an `ipmi://` BMC's
    /// default.
    Sol,
    /// A command on the BMC's SSH (iDRAC's `console com2`, iLO's `vsp`).
    Ssh,
    /// Not read.
    None,
}

/// A BMC's `console` (unset: SOL for an `ipmi://` BMC, none for Redfish,
/// which has no serial console of its own).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    pub via: ConsoleVia,
    /// SSH: `host[:port]` (default: the BMC's host, port 22).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// SSH: the user (default: the BMC's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// SSH: the command that attaches to the serial console.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// SSH: a private key file (OpenSSH format) to log in with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// SSH: the BMC's host key (`ssh-ed25519 AAAA…`); a different one is
    /// refused. Unset: any key, its fingerprint logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_key: Option<String>,
}

impl ConsoleConfig {
    /// Err: the key under `console` that is wrong, and why.
    pub fn validate(&self, bmc_url: &str) -> Result<(), (&'static str, String)> {
        match self.via {
            ConsoleVia::None => Ok(()),
            ConsoleVia::Sol => {
                if bmc_url.starts_with("ipmi://") {
                    Ok(())
                } else {
                    Err((
                        "console.via",
                        "is sol, but Serial-over-LAN is IPMI's: this BMC speaks Redfish (name its SSH console: via = \"ssh\")".into(),
                    ))
                }
            }
            ConsoleVia::Ssh => {
                if self.command.as_deref().is_none_or(|c| c.trim().is_empty()) {
                    return Err((
                        "console.command",
                        "is needed with via = \"ssh\": the BMC's command that attaches to the serial console (iDRAC: \"console com2\", iLO: \"vsp\")".into(),
                    ));
                }
                match &self.key_file {
                    None => {
                        return Err((
                            "console.key_file",
                            "is needed with via = \"ssh\": the private key shepherd logs in to the BMC's SSH with".into(),
                        ));
                    }
                    Some(f) if !f.is_file() => {
                        return Err((
                            "console.key_file",
                            format!("{} is not a readable file", f.display()),
                        ));
                    }
                    Some(_) => {}
                }
                if let Some(k) = &self.host_key
                    && russh::keys::PublicKey::from_openssh(k.trim()).is_err()
                {
                    return Err((
                        "console.host_key",
                        "is not an OpenSSH public key (ssh-ed25519 AAAA…)".into(),
                    ));
                }
                Ok(())
            }
        }
    }
}
