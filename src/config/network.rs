//! `[network]`: the switches machines are cabled to, and the VLANs
//! shepherd moves their ports between (the provisioning network, an idle
//! one that reaches nothing, the BMCs', the projects' own). A host's
//! cabling is its inventory entry's `ports`.

use std::collections::HashSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::secret::Secret;

/// `[network]`. No switch (the default): shepherd moves no port, and a
/// machine's network is whatever its cabling gives it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub switches: Vec<SwitchConfig>,
    /// Where shepherd's services answer (DHCP, TFTP, the boot and image
    /// servers, the agents' callback): a machine's ports are on it while
    /// shepherd works on the machine.
    pub provisioning_vlan: u16,
    /// Where a free machine waits: a VLAN nothing else is on.
    pub idle_vlan: u16,
    /// The BMCs' network (a port declared `bmc = true`). Unset: BMC ports
    /// are left as cabled, and never moved.
    pub bmc_vlan: Option<u16>,
    /// The VLANs given to projects (each its own network) and their
    /// virtual networks: `"FIRST-LAST"`.
    pub tenant_vlans: String,
    /// How often the ports' round runs (each switch changed by one
    /// shepherd at a time, its changes in one batch).
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// A switch's session (connect, change, read back) ends after this.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            switches: Vec::new(),
            provisioning_vlan: 10,
            idle_vlan: 4000,
            bmc_vlan: None,
            tenant_vlans: "1000-3999".into(),
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(20),
        }
    }
}

/// A switch shepherd changes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchConfig {
    /// Its name in ports' cabling, the pages and the metrics.
    pub name: String,
    /// How it is driven: `"ovs"` (Open vSwitch's `ovs-vsctl` over SSH).
    pub driver: SwitchDriverKind,
    /// Its management address, `host[:port]` (22 by default).
    pub address: String,
    #[serde(default = "default_username")]
    pub username: String,
    /// The OpenSSH private key shepherd logs in with: `{ file = "PATH" }`,
    /// `{ env = "VAR" }` or inline; never printed.
    pub private_key: Secret,
    /// Its SSH host key (`ssh-ed25519 AAAA…`). Unset: the key shown at
    /// first contact is recorded in the BMDB and required after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_key: Option<String>,
    /// `ovs`: the OVSDB to change (`ovs-vsctl --db=`); unset: its default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ovs_db: Option<String>,
    /// Its ports cabled to other switches (trunks): shepherd keeps on
    /// them, tagged, the provisioning network, the BMCs' and every
    /// tenant's network, and nothing untagged; never the idle VLAN.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uplinks: Vec<String>,
}

fn default_username() -> String {
    "root".into()
}

/// The switch drivers shepherd has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SwitchDriverKind {
    Ovs,
}

/// A host's cabling: one of its NICs (or its BMC) on a switch's port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HostPort {
    pub switch: String,
    pub port: String,
    /// The NIC's MAC (checked against what the agent reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<crate::mac::MacAddr>,
    /// The host's BMC, not a NIC: kept on `network.bmc_vlan`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bmc: bool,
}

/// A switch's management address that is not `host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{address:?} is not host[:port]")]
pub struct AddressError {
    pub address: String,
}

/// `host[:port]` (`[v6]:port` too), port 22 unless given.
pub fn ssh_target(address: &str) -> Result<(String, u16), AddressError> {
    let bad = || AddressError {
        address: address.to_string(),
    };
    if address.is_empty() || address.contains(char::is_whitespace) {
        return Err(bad());
    }
    if let Some(rest) = address.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or_else(bad)?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| bad())?,
            None if tail.is_empty() => 22,
            None => return Err(bad()),
        };
        return Ok((host.to_string(), port));
    }
    match address.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => {
            Ok((host.to_string(), port.parse().map_err(|_| bad())?))
        }
        Some(_) => Ok((address.to_string(), 22)),
        None => Ok((address.to_string(), 22)),
    }
}

/// A name a switch or port may have: what a switch's CLI takes as one
/// word.
pub fn check_port_name(s: &str) -> Result<(), NetworkValueError> {
    if s.is_empty() || s.len() > 64 {
        return Err(NetworkValueError::NameLength(s.to_string()));
    }
    match s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._-/:".contains(*c)))
    {
        Some(c) => Err(NetworkValueError::NameCharacter(s.to_string(), c)),
        None => Ok(()),
    }
}

/// A switch or port name, or a VLAN range, that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkValueError {
    #[error("{0:?} must be 1 to 64 characters")]
    NameLength(String),
    #[error("{0:?} holds {1:?}: letters, digits and . _ - / : only")]
    NameCharacter(String, char),
    #[error("{0:?} is not FIRST-LAST")]
    NotARange(String),
    #[error("{0:?} is not a VLAN (1 to 4094)")]
    NotAVlan(String),
    #[error("{0:?}: {1} comes after {2}")]
    Backwards(String, u16, u16),
}

/// `"FIRST-LAST"`, within 1..=4094.
pub fn parse_vlan_range(s: &str) -> Result<std::ops::RangeInclusive<u16>, NetworkValueError> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| NetworkValueError::NotARange(s.to_string()))?;
    let num = |x: &str| {
        x.trim()
            .parse::<u16>()
            .ok()
            .filter(|v| (1..=4094).contains(v))
            .ok_or_else(|| NetworkValueError::NotAVlan(x.to_string()))
    };
    let (a, b) = (num(a)?, num(b)?);
    if a > b {
        return Err(NetworkValueError::Backwards(s.to_string(), a, b));
    }
    Ok(a..=b)
}

impl NetworkConfig {
    /// The tenants' VLANs (checked by `validate`).
    pub fn tenant_range(&self) -> std::ops::RangeInclusive<u16> {
        parse_vlan_range(&self.tenant_vlans).unwrap_or(1000..=3999)
    }

    pub fn switch(&self, name: &str) -> Option<&SwitchConfig> {
        self.switches.iter().find(|s| s.name == name)
    }

    pub fn validate(&mut self) -> Result<(), ConfigError> {
        let vlan = |key: &str, v: u16| {
            if (1..=4094).contains(&v) {
                Ok(())
            } else {
                Err(ConfigError::key(
                    format!("network.{key}"),
                    format!("{v} is not a VLAN (1 to 4094)"),
                ))
            }
        };
        vlan("provisioning_vlan", self.provisioning_vlan)?;
        vlan("idle_vlan", self.idle_vlan)?;
        if let Some(b) = self.bmc_vlan {
            vlan("bmc_vlan", b)?;
        }
        let range = parse_vlan_range(&self.tenant_vlans)
            .map_err(|e| ConfigError::key("network.tenant_vlans", e.to_string()))?;
        let mut own = vec![
            ("provisioning_vlan", self.provisioning_vlan),
            ("idle_vlan", self.idle_vlan),
        ];
        own.extend(self.bmc_vlan.map(|b| ("bmc_vlan", b)));
        for (i, (k, v)) in own.iter().enumerate() {
            if range.contains(v) {
                return Err(ConfigError::key(
                    format!("network.{k}"),
                    format!("{v} is among network.tenant_vlans ({})", self.tenant_vlans),
                ));
            }
            if let Some((k2, _)) = own[..i].iter().find(|(_, w)| w == v) {
                return Err(ConfigError::key(
                    format!("network.{k}"),
                    format!("{v} is network.{k2} too: each network needs a VLAN of its own"),
                ));
            }
        }
        if self.interval < Duration::from_millis(100) {
            return Err(ConfigError::key(
                "network.interval",
                "must be at least 100ms",
            ));
        }
        if self.timeout < Duration::from_secs(1) {
            return Err(ConfigError::key("network.timeout", "must be at least 1s"));
        }
        let mut names = HashSet::new();
        for (i, s) in self.switches.iter_mut().enumerate() {
            let key = |k: &str| format!("network.switches[{i}].{k}");
            check_port_name(&s.name).map_err(|e| ConfigError::key(key("name"), e.to_string()))?;
            if !names.insert(s.name.clone()) {
                return Err(ConfigError::key(
                    key("name"),
                    format!("{:?} names another switch too", s.name),
                ));
            }
            ssh_target(&s.address).map_err(|e| ConfigError::key(key("address"), e.to_string()))?;
            if s.username.is_empty() {
                return Err(ConfigError::key(key("username"), "is empty"));
            }
            s.private_key
                .resolve()
                .map_err(|e| ConfigError::key(key("private_key"), e))?;
            russh::keys::PrivateKey::from_openssh(s.private_key.expose().as_bytes()).map_err(
                |_| ConfigError::key(key("private_key"), "is not an OpenSSH private key"),
            )?;
            if let Some(h) = &s.host_key {
                russh::keys::PublicKey::from_openssh(h.trim()).map_err(|e| {
                    ConfigError::key(key("host_key"), format!("not an OpenSSH public key: {e}"))
                })?;
            }
            let odd = |db: &&String| {
                db.is_empty()
                    || db
                        .chars()
                        .any(|c| c.is_whitespace() || "'\"\\$`;".contains(c))
            };
            if let Some(db) = s.ovs_db.as_ref().filter(odd) {
                return Err(ConfigError::key(
                    key("ovs_db"),
                    format!("{db:?} is not an OVSDB address (unix:PATH, tcp:HOST:PORT)"),
                ));
            }
            let mut uplinks = HashSet::new();
            for (j, u) in s.uplinks.iter().enumerate() {
                let key = format!("network.switches[{i}].uplinks[{j}]");
                check_port_name(u).map_err(|e| ConfigError::key(&key, e.to_string()))?;
                if !uplinks.insert(u) {
                    return Err(ConfigError::key(key, format!("{u:?} is listed twice")));
                }
            }
        }
        Ok(())
    }

    /// Whether `port` of `switch` is one of its uplinks.
    pub fn is_uplink(&self, switch: &str, port: &str) -> bool {
        self.switch(switch)
            .is_some_and(|s| s.uplinks.iter().any(|u| u == port))
    }

    /// Checks a host's `ports` against the switches (`key`: the host's
    /// configuration key), and that no port is cabled twice (`seen`).
    pub fn check_ports(
        &self,
        key: &str,
        ports: &[HostPort],
        seen: &mut HashSet<(String, String)>,
    ) -> Result<(), ConfigError> {
        for (j, p) in ports.iter().enumerate() {
            let key = format!("{key}.ports[{j}]");
            if self.switch(&p.switch).is_none() {
                return Err(ConfigError::key(
                    format!("{key}.switch"),
                    format!("{:?} is not in network.switches", p.switch),
                ));
            }
            check_port_name(&p.port)
                .map_err(|e| ConfigError::key(format!("{key}.port"), e.to_string()))?;
            if self.is_uplink(&p.switch, &p.port) {
                return Err(ConfigError::key(
                    format!("{key}.port"),
                    format!("{} port {} is one of its uplinks", p.switch, p.port),
                ));
            }
            if !seen.insert((p.switch.clone(), p.port.clone())) {
                return Err(ConfigError::key(
                    format!("{key}.port"),
                    format!("{} port {} is cabled to another host too", p.switch, p.port),
                ));
            }
        }
        if ports.iter().filter(|p| p.bmc).count() > 1 {
            return Err(ConfigError::key(
                format!("{key}.ports"),
                "names more than one BMC port",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_read_as_ssh_reads_them() {
        assert_eq!(ssh_target("10.0.0.1").unwrap(), ("10.0.0.1".into(), 22));
        assert_eq!(ssh_target("leaf1:2222").unwrap(), ("leaf1".into(), 2222));
        assert_eq!(ssh_target("[fd00::1]:22").unwrap(), ("fd00::1".into(), 22));
        assert_eq!(ssh_target("fd00::1").unwrap(), ("fd00::1".into(), 22));
        assert!(ssh_target("leaf1:x").is_err());
        assert!(ssh_target("").is_err());
    }

    /// Each mistake is named by its key; the private key never shown.
    #[test]
    fn bad_networks_are_named_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("switch_ed25519");
        let pair = russh::keys::ssh_key::private::Ed25519Keypair::from_seed(&[7; 32]);
        let secret = russh::keys::PrivateKey::from(pair)
            .to_openssh(russh::keys::ssh_key::LineEnding::LF)
            .unwrap()
            .to_string();
        std::fs::write(&key, &secret).unwrap();
        let f = dir.path().join("shepherd.toml");
        let load_with = |network: &str, switch: &str, hosts: &str| {
            std::fs::write(
                &f,
                format!(
                    "[network]\n{network}\n[[network.switches]]\nname = \"leaf1\"\ndriver = \"ovs\"\n\
                     address = \"192.0.2.9\"\nprivate_key = {{ file = \"{}\" }}\n{switch}\n\
                     [provider.inventory]\nmachines = [{hosts}]\n",
                    key.display()
                ),
            )
            .unwrap();
            crate::config::Config::load_with_env(Some(&f), Vec::new())
        };
        let load = |network: &str, hosts: &str| load_with(network, "", hosts);
        let host =
            |ports: &str| format!("{{ id = \"a\", address = \"192.0.2.1\", ports = [{ports}] }}");
        let ok = load("", &host("{ switch = \"leaf1\", port = \"p1\" }")).unwrap();
        assert_eq!(ok.network.switches[0].name, "leaf1");
        for (network, hosts, key_name, says) in [
            (
                "idle_vlan = 10",
                host(""),
                "network.idle_vlan",
                "network.provisioning_vlan too",
            ),
            (
                "idle_vlan = 1500",
                host(""),
                "network.idle_vlan",
                "among network.tenant_vlans",
            ),
            (
                "tenant_vlans = \"9-3\"",
                host(""),
                "network.tenant_vlans",
                "comes after",
            ),
            (
                "",
                host("{ switch = \"leaf9\", port = \"p1\" }"),
                "provider.inventory.machines[0].ports[0].switch",
                "not in network.switches",
            ),
            (
                "",
                host(
                    "{ switch = \"leaf1\", port = \"p1\" }, { switch = \"leaf1\", port = \"p1\" }",
                ),
                "provider.inventory.machines[0].ports[1].port",
                "cabled to another host too",
            ),
            (
                "",
                host("{ switch = \"leaf1\", port = \"p1; reboot\" }"),
                "provider.inventory.machines[0].ports[0].port",
                "letters, digits",
            ),
            (
                "",
                host("{ switch = \"leaf1\", port = \"b1\", bmc = true }"),
                "provider.inventory.machines[0].ports",
                "set network.bmc_vlan",
            ),
        ] {
            let e = load(network, &hosts).unwrap_err();
            assert_eq!(e.key_name(), Some(key_name), "{e}");
            assert!(e.to_string().contains(says), "{e}");
        }
        // Uplinks: port names, each once, never a host's port.
        let up = load_with(
            "",
            "uplinks = [\"p48\"]",
            &host("{ switch = \"leaf1\", port = \"p1\" }"),
        );
        assert_eq!(up.unwrap().network.switches[0].uplinks, ["p48"]);
        for (switch, hosts, key_name, says) in [
            (
                "uplinks = [\"p48\", \"p48\"]",
                host(""),
                "network.switches[0].uplinks[1]",
                "listed twice",
            ),
            (
                "uplinks = [\"p 48\"]",
                host(""),
                "network.switches[0].uplinks[0]",
                "letters, digits",
            ),
            (
                "uplinks = [\"p48\"]",
                host("{ switch = \"leaf1\", port = \"p48\" }"),
                "provider.inventory.machines[0].ports[0].port",
                "one of its uplinks",
            ),
        ] {
            let e = load_with("", switch, &hosts).unwrap_err();
            assert_eq!(e.key_name(), Some(key_name), "{e}");
            assert!(e.to_string().contains(says), "{e}");
        }
        std::fs::write(&key, "not a key").unwrap();
        let e = load("", &host("")).unwrap_err();
        assert_eq!(e.key_name(), Some("network.switches[0].private_key"), "{e}");
        let shown = ok.to_redacted_toml();
        assert!(!shown.contains(secret.lines().nth(1).unwrap()), "{shown}");
    }
}
