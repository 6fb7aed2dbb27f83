//! Open vSwitch, driven as Ironic's networking-generic-switch drives it:
//! `ovs-vsctl` over SSH. A batch is one `ovs-vsctl` call (one OVSDB
//! transaction: all of it or none); a read is `list Port` in JSON.
//!
//! OVS's `vlan_mode`: `access` (one untagged VLAN, `tag`),
//! `native-untagged` (`tag` untagged, `trunks` tagged) and `trunk`
//! (`trunks` tagged). An empty `trunks` on a trunk means every VLAN, so
//! shepherd never asks for a port with no VLAN at all.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::driver::{PortVlans, SwitchDriver, SwitchError};
use crate::config::{HostKeyPolicy, SwitchConfig};
use crate::ssh::{self, Connection, SshIdentity, SshSettings, shell_quote};

/// An OVS switch reached over SSH.
pub struct Ovs {
    name: String,
    conn: Connection,
    settings: SshSettings,
    db: Option<String>,
}

impl Ovs {
    /// Logs in to `cfg`'s switch at `addr`, its host key checked against
    /// `known` (the configured or recorded one; None: any, recorded by the
    /// caller).
    pub async fn connect(
        cfg: &SwitchConfig,
        addr: SocketAddr,
        known: Option<russh::keys::PublicKey>,
        timeout: Duration,
    ) -> Result<Ovs, SwitchError> {
        let identity =
            SshIdentity::from_openssh(cfg.private_key.expose()).map_err(|e| SwitchError::Key {
                switch: cfg.name.clone(),
                message: e.to_string(),
            })?;
        let settings = SshSettings {
            user: cfg.username.clone(),
            connect_timeout: timeout,
            host_keys: HostKeyPolicy::AcceptNew,
            known_hosts_file: None,
            max_stdout: 4 << 20,
            max_stderr: 16 << 10,
            upload_by_exec: false,
        };
        let conn = ssh::connect(&settings, &identity, addr, known)
            .await
            .map_err(|source| SwitchError::Ssh {
                switch: cfg.name.clone(),
                source,
            })?;
        Ok(Ovs {
            name: cfg.name.clone(),
            conn,
            settings,
            db: cfg.ovs_db.clone(),
        })
    }

    /// The host key the switch showed.
    pub fn host_key(&self) -> &russh::keys::PublicKey {
        self.conn.host_key()
    }

    fn vsctl(&self) -> String {
        match &self.db {
            Some(db) => format!("ovs-vsctl --timeout=15 --db={}", shell_quote(db)),
            None => "ovs-vsctl --timeout=15".to_string(),
        }
    }

    async fn run(&self, command: &str) -> Result<String, SwitchError> {
        let out = self
            .conn
            .run(command, b"", &self.settings)
            .await
            .map_err(|source| SwitchError::Ssh {
                switch: self.name.clone(),
                source,
            })?;
        if out.exit_status != Some(0) {
            let said = out.stderr_text();
            if let Some(port) = missing_port(&said) {
                return Err(SwitchError::NoSuchPort {
                    switch: self.name.clone(),
                    port,
                });
            }
            return Err(SwitchError::Refused {
                switch: self.name.clone(),
                command: command.to_string(),
                status: out
                    .exit_status
                    .map(|s| s.to_string())
                    .or(out.exit_signal)
                    .unwrap_or_else(|| "none".into()),
                said,
            });
        }
        String::from_utf8(out.stdout).map_err(|_| SwitchError::Unreadable {
            switch: self.name.clone(),
            command: command.to_string(),
            why: "not UTF-8".into(),
        })
    }
}

/// The `ovs-vsctl` arguments that give `port` exactly `vlans`.
pub fn set_port(port: &str, vlans: &PortVlans) -> Option<String> {
    let p = shell_quote(port);
    let list = |v: &[u16]| v.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
    Some(match (vlans.native, vlans.tagged.is_empty()) {
        (Some(n), true) => {
            format!("-- set Port {p} vlan_mode=access tag={n} -- clear Port {p} trunks")
        }
        (Some(n), false) => {
            let mut all = vlans.tagged.clone();
            all.push(n);
            all.sort_unstable();
            format!(
                "-- set Port {p} vlan_mode=native-untagged tag={n} trunks={}",
                list(&all)
            )
        }
        (None, false) => format!(
            "-- set Port {p} vlan_mode=trunk trunks={} -- clear Port {p} tag",
            list(&vlans.tagged)
        ),
        (None, true) => return None,
    })
}

/// The port `ovs-vsctl` says has no row (`no row "p9" in table Port`).
fn missing_port(said: &str) -> Option<String> {
    let rest = said.split("no row \"").nth(1)?;
    let (port, tail) = rest.split_once('"')?;
    tail.contains("table Port").then(|| port.to_string())
}

/// An OVSDB atom or set of integers: `10`, `["set",[]]`, `["set",[1,2]]`.
fn ints(v: &serde_json::Value) -> Option<Vec<u16>> {
    match v {
        serde_json::Value::Number(n) => Some(vec![u16::try_from(n.as_u64()?).ok()?]),
        serde_json::Value::Array(a) if a.len() == 2 && a[0] == "set" => a[1]
            .as_array()?
            .iter()
            .map(|x| x.as_u64().and_then(|x| u16::try_from(x).ok()))
            .collect(),
        _ => None,
    }
}

/// A string atom, or None for an empty set.
fn text(v: &serde_json::Value) -> Option<Option<String>> {
    match v {
        serde_json::Value::String(s) => Some(Some(s.clone())),
        serde_json::Value::Array(a) if a.len() == 2 && a[0] == "set" => {
            a[1].as_array().filter(|x| x.is_empty()).map(|_| None)
        }
        _ => None,
    }
}

/// What `ovs-vsctl list Port` printed that is not ports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortsUnreadable {
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error("no \"data\" array")]
    NoData,
    #[error("a row is not [name, tag, trunks, vlan_mode]: {0}")]
    Row(String),
    #[error("port {port}: {column} is {value}")]
    Column {
        port: String,
        column: &'static str,
        value: String,
    },
}

/// `ovs-vsctl --format=json --columns=name,tag,trunks,vlan_mode list
/// Port` read into each port's VLANs, as a frame sees them.
pub fn parse_ports(json: &str) -> Result<BTreeMap<String, PortVlans>, PortsUnreadable> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| PortsUnreadable::NotJson(e.to_string()))?;
    let rows = v["data"].as_array().ok_or(PortsUnreadable::NoData)?;
    let mut out = BTreeMap::new();
    for row in rows {
        let r = row
            .as_array()
            .filter(|r| r.len() == 4 && r[0].is_string())
            .ok_or_else(|| PortsUnreadable::Row(row.to_string()))?;
        let name = r[0].as_str().unwrap_or_default();
        let bad = |column: &'static str, i: usize| PortsUnreadable::Column {
            port: name.to_string(),
            column,
            value: r[i].to_string(),
        };
        let tag = ints(&r[1]).ok_or_else(|| bad("tag", 1))?.first().copied();
        let trunks = ints(&r[2]).ok_or_else(|| bad("trunks", 2))?;
        let mode = text(&r[3]).ok_or_else(|| bad("vlan_mode", 3))?;
        let vlans = match (mode.as_deref(), tag) {
            (None | Some("access"), Some(t)) => PortVlans::access(t),
            (Some("native-untagged"), Some(t)) => PortVlans::new(Some(t), trunks),
            (Some("native-tagged"), Some(t)) => PortVlans::new(None, trunks.into_iter().chain([t])),
            // A trunk: an empty list is every VLAN, which shepherd never
            // sets (it reads as no VLAN, so is always changed).
            _ => PortVlans::new(None, trunks),
        };
        out.insert(name.to_string(), vlans);
    }
    Ok(out)
}

impl SwitchDriver for Ovs {
    async fn apply(&mut self, changes: &[(String, PortVlans)]) -> Result<(), SwitchError> {
        if changes.is_empty() {
            return Ok(());
        }
        let mut command = self.vsctl();
        for (port, vlans) in changes {
            let args = set_port(port, vlans).ok_or_else(|| SwitchError::NotApplied {
                switch: self.name.clone(),
                port: port.clone(),
                seen: "not asked".into(),
                wanted: "no VLAN (refused: on OVS that is every VLAN)".into(),
            })?;
            command.push(' ');
            command.push_str(&args);
        }
        self.run(&command).await.map(drop)
    }

    async fn read(&mut self, ports: &[String]) -> Result<BTreeMap<String, PortVlans>, SwitchError> {
        if ports.is_empty() {
            return Ok(BTreeMap::new());
        }
        let names: Vec<String> = ports.iter().map(|p| shell_quote(p)).collect();
        let command = format!(
            "{} --format=json --columns=name,tag,trunks,vlan_mode list Port {}",
            self.vsctl(),
            names.join(" ")
        );
        let out = self.run(&command).await?;
        parse_ports(&out).map_err(|e| SwitchError::Unreadable {
            switch: self.name.clone(),
            command,
            why: e.to_string(),
        })
    }

    async fn close(self) {
        self.conn.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_read_as_frames_see_them() {
        let json = r#"{"data":[["p1",10,["set",[]],["set",[]]],
            ["p2",20,["set",[]],"access"],
            ["p3",20,["set",[20,30,40]],"native-untagged"],
            ["p4",["set",[]],["set",[30,40]],"trunk"],
            ["p5",["set",[]],30,["set",[]]],
            ["p6",["set",[]],["set",[]],["set",[]]]],
            "headings":["name","tag","trunks","vlan_mode"]}"#;
        let p = parse_ports(json).unwrap();
        assert_eq!(p["p1"], PortVlans::access(10));
        assert_eq!(p["p2"], PortVlans::access(20));
        assert_eq!(p["p3"], PortVlans::new(Some(20), [30, 40]));
        assert_eq!(p["p4"], PortVlans::new(None, [30, 40]));
        assert_eq!(p["p5"], PortVlans::new(None, [30]));
        assert_eq!(p["p6"], PortVlans::default());
        assert!(parse_ports(r#"{"data":[["p1","x",1,2]]}"#).is_err());
    }

    #[test]
    fn each_shape_is_one_set_and_never_every_vlan() {
        assert_eq!(
            set_port("p1", &PortVlans::access(10)).unwrap(),
            "-- set Port 'p1' vlan_mode=access tag=10 -- clear Port 'p1' trunks"
        );
        assert_eq!(
            set_port("p1", &PortVlans::new(Some(20), [40, 30])).unwrap(),
            "-- set Port 'p1' vlan_mode=native-untagged tag=20 trunks=20,30,40"
        );
        assert_eq!(
            set_port("p1", &PortVlans::new(None, [30])).unwrap(),
            "-- set Port 'p1' vlan_mode=trunk trunks=30 -- clear Port 'p1' tag"
        );
        assert_eq!(set_port("p1", &PortVlans::default()), None);
        assert_eq!(
            missing_port("ovs-vsctl: no row \"p9\" in table Port"),
            Some("p9".into())
        );
    }
}
