//! Machines' serial consoles, read through their BMCs: IPMI
//! Serial-over-LAN (`ipmitool sol activate`, `sol.rs`) or a command on the
//! BMC's SSH (iDRAC's `console com2`, iLO's `vsp`; `ssh.rs`). During every
//! boot shepherd makes through a BMC, a `Console` actor (`capture.rs`, one
//! per machine) reads it and keeps its last bytes, written to the BMDB
//! (`bmdb::console`) as it goes, so a failed boot says what the machine
//! printed. By job, beside this file:
//!
//! - `tail.rs`: the bounded tail of what a console printed;
//! - `sol.rs`, `ssh.rs`: the two ways to read one (`Stream`);
//! - `capture.rs`: the actor, one per machine console being read;
//! - `consoles.rs`: what callers hold: [`Consoles`], the actors by
//!   machine, a place on a console ([`ConsoleLink`]) and a capture under
//!   way ([`Capture`]);
//! - `reader.rs`: the task that reads one, and watches a SOL console's
//!   BMC.

use std::path::PathBuf;

use crate::config::{BmcConfig, ConsoleConfig, ConsoleVia};

mod capture;
mod consoles;
mod ping;
mod reader;
mod sol;
mod ssh;
mod tail;
mod viewers;

pub use capture::Attached;
pub use capture::LINES_IN_A_CAUSE;
pub use consoles::{Capture, ConsoleLink, Consoles, told};
pub use tail::{Tail, last_lines, text};
pub use viewers::{Keyboard, ToViewer, VIEWER_BACKLOG};

/// Where a machine's serial console is read, as its BMC settings say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsoleSource {
    /// IPMI Serial-over-LAN on the BMC at `target`.
    Sol {
        target: (String, u16),
        bmc: BmcConfig,
    },
    /// `command` on the BMC's SSH at `address`.
    Ssh {
        address: String,
        username: String,
        command: String,
        key_file: PathBuf,
        host_key: Option<String>,
    },
}

impl ConsoleSource {
    /// The console of the machine whose BMC is `bmc`; None when it is not
    /// read (a Redfish BMC without an SSH console named, or `via = none`).
    pub fn of(bmc: &BmcConfig) -> Option<ConsoleSource> {
        match bmc.console_via() {
            ConsoleVia::None => None,
            ConsoleVia::Sol => Some(ConsoleSource::Sol {
                target: bmc.ipmi_target()?,
                bmc: bmc.clone(),
            }),
            ConsoleVia::Ssh => {
                let c: &ConsoleConfig = bmc.console.as_ref()?;
                let host = bmc_host(&bmc.url)?;
                Some(ConsoleSource::Ssh {
                    address: c.address.clone().unwrap_or_else(|| format!("{host}:22")),
                    username: c.username.clone().unwrap_or_else(|| bmc.username.clone()),
                    command: c.command.clone()?,
                    key_file: c.key_file.clone()?,
                    host_key: c.host_key.clone(),
                })
            }
        }
    }

    /// For people and the BMDB: `sol ipmi://host:port`, `ssh user@host:22
    /// "console com2"`; never a secret.
    pub fn describe(&self) -> String {
        match self {
            ConsoleSource::Sol { target, .. } => {
                format!("sol ipmi://{}:{}", target.0, target.1)
            }
            ConsoleSource::Ssh {
                address,
                username,
                command,
                ..
            } => format!("ssh {username}@{address} {command:?}"),
        }
    }
}

/// The host of a BMC's URL (`https://host:port`, `ipmi://host`).
fn bmc_host(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let host_port = rest.split('/').next()?;
    let host = match host_port.strip_prefix('[') {
        Some(v6) => return v6.split_once(']').map(|(h, _)| format!("[{h}]")),
        None => host_port.split(':').next()?,
    };
    (!host.is_empty()).then(|| host.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bmc_s_host_is_read_from_its_url() {
        assert_eq!(
            bmc_host("https://10.0.0.5:8443").as_deref(),
            Some("10.0.0.5")
        );
        assert_eq!(
            bmc_host("ipmi://bmc.example").as_deref(),
            Some("bmc.example")
        );
        assert_eq!(bmc_host("ipmi://[::1]:623").as_deref(), Some("[::1]"));
        assert_eq!(bmc_host("nonsense"), None);
    }
}
