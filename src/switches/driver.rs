//! The seam a switch's driver plugs into: set ports' VLANs in one batch,
//! read ports back. A vendor's CLI (EOS, NX-OS, OS10, Junos, SONiC) is a
//! new [`SwitchDriver`] beside [`super::ovs::Ovs`] and a name in
//! `config::SwitchDriverKind`; the round, the BMDB and the life cycle do
//! not change. Only Open vSwitch was tried.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::ssh::SshError;

/// A port's VLANs: the untagged one (None: untagged frames dropped) and
/// the tagged ones, ascending, without the untagged one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PortVlans {
    pub native: Option<u16>,
    pub tagged: Vec<u16>,
}

impl PortVlans {
    pub fn new(native: Option<u16>, tagged: impl IntoIterator<Item = u16>) -> PortVlans {
        let mut tagged: Vec<u16> = tagged.into_iter().filter(|t| Some(*t) != native).collect();
        tagged.sort_unstable();
        tagged.dedup();
        PortVlans { native, tagged }
    }

    /// Access to one VLAN.
    pub fn access(vlan: u16) -> PortVlans {
        PortVlans::new(Some(vlan), [])
    }
}

impl std::fmt::Display for PortVlans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.native, self.tagged.is_empty()) {
            (Some(n), true) => write!(f, "VLAN {n}"),
            (n, _) => {
                if let Some(n) = n {
                    write!(f, "VLAN {n} untagged, ")?;
                }
                let t: Vec<String> = self.tagged.iter().map(u16::to_string).collect();
                write!(f, "tagged {}", t.join(","))
            }
        }
    }
}

/// Why a switch could not be changed or read: each names the switch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SwitchError {
    #[error("switch {switch}: {source}")]
    Ssh {
        switch: String,
        #[source]
        source: SshError,
    },
    #[error("switch {switch}: the private key: {message}")]
    Key { switch: String, message: String },
    #[error("switch {switch} refused `{command}` (exit {status}): {said}")]
    Refused {
        switch: String,
        command: String,
        status: String,
        said: String,
    },
    #[error("switch {switch}: port {port} does not exist")]
    NoSuchPort { switch: String, port: String },
    #[error("switch {switch}: cannot read what `{command}` printed: {why}")]
    Unreadable {
        switch: String,
        command: String,
        why: String,
    },
    #[error("switch {switch}: port {port} reads back as {seen}, not {wanted}")]
    NotApplied {
        switch: String,
        port: String,
        seen: String,
        wanted: String,
    },
    #[error("switch {switch}: no answer within {after:?}")]
    Timeout { switch: String, after: Duration },
}

impl SwitchError {
    /// The switch it names.
    pub fn switch(&self) -> &str {
        match self {
            SwitchError::Ssh { switch, .. }
            | SwitchError::Key { switch, .. }
            | SwitchError::Refused { switch, .. }
            | SwitchError::NoSuchPort { switch, .. }
            | SwitchError::Unreadable { switch, .. }
            | SwitchError::NotApplied { switch, .. }
            | SwitchError::Timeout { switch, .. } => switch,
        }
    }
}

/// One session with a switch.
#[allow(async_fn_in_trait)]
pub trait SwitchDriver {
    /// Sets each port's VLANs, all in one batch (on a switch that has
    /// transactions, in one).
    async fn apply(&mut self, changes: &[(String, PortVlans)]) -> Result<(), SwitchError>;

    /// The ports' VLANs as the switch holds them now.
    async fn read(&mut self, ports: &[String]) -> Result<BTreeMap<String, PortVlans>, SwitchError>;

    /// Ends the session.
    async fn close(self);
}
