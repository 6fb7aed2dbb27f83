//! The static inventory's hosts (`InventoryMachine`, a host's BMC), and
//! its file (`file.rs`): an operator's hosts as `[[machines]]`
//! entries, read and checked entry by entry. Configuration, like the
//! inline list: the provider re-reads the file every round, and the
//! configuration's check reads it once at load.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use crate::mac::MacAddr;
use crate::secret::Secret;

/// A host of the inventory: its ID, address, location, BMC and how
/// shepherd reaches it first.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InventoryMachine {
    pub id: String,
    /// Where shepherd logs in over SSH. Unset: the host is reached through
    /// its BMC only (`boot = "virtual-media"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<std::net::IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Its BMC: how it is rebooted and where its out-of-band facts come
    /// from. Without one the host cannot be rebooted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc: Option<BmcConfig>,
    /// How shepherd first reaches it: `"ssh"` (a takeover at `address`,
    /// the default when there is one), `"virtual-media"` or `"network"`
    /// (its BMC boots it into the agent, from a virtual CD or over the
    /// provisioning network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<BootMethod>,
    /// The provisioning NIC's address (`boot = "network"`): the network
    /// boot service answers this MAC only (CONTRACTS.md §6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacAddr>,
    /// More than one provisioning NIC.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub macs: Vec<MacAddr>,
    /// Its firmware, for an IPMI boot device (`"uefi"`, the default, sets
    /// the EFI flag; `"bios"` does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    /// Its cabling: the switch ports its NICs (and its BMC) are on
    /// (`network.switches`), which shepherd moves between networks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<super::network::HostPort>,
}

/// A machine's firmware, as far as booting it from the network cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Firmware {
    #[default]
    Uefi,
    Bios,
}

/// How shepherd reaches a host of the inventory (CONTRACTS.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BootMethod {
    /// A login over SSH at the host's address (a takeover).
    Ssh,
    /// Its BMC boots it into shepherd's boot image (the live agent).
    VirtualMedia,
    /// Its BMC boots it from the provisioning network (PXE), where the
    /// network boot service hands it the live agent (CONTRACTS.md §6).
    Network,
}

impl BootMethod {
    pub const ALL: [BootMethod; 3] = [
        BootMethod::Ssh,
        BootMethod::VirtualMedia,
        BootMethod::Network,
    ];

    pub fn parse(s: &str) -> Option<BootMethod> {
        Self::ALL.into_iter().find(|b| b.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BootMethod::Ssh => "ssh",
            BootMethod::VirtualMedia => "virtual-media",
            BootMethod::Network => "network",
        }
    }
}

impl InventoryMachine {
    /// Whether its BMC boots it into the agent: `boot = "virtual-media"`
    /// or `"network"`.
    pub fn boots_from_bmc(&self) -> bool {
        matches!(
            self.boot,
            Some(BootMethod::VirtualMedia | BootMethod::Network)
        )
    }

    /// Its provisioning NICs (`mac` and `macs`), each once.
    pub fn boot_macs(&self) -> Vec<MacAddr> {
        let mut all: Vec<MacAddr> = self.mac.iter().chain(&self.macs).copied().collect();
        all.sort();
        all.dedup();
        all
    }

    /// What makes the entry unusable, if anything: no way in (neither an
    /// address nor a boot through its BMC), a boot through a BMC it does
    /// not have, a network boot without a MAC, or virtual media asked of
    /// an IPMI BMC.
    pub fn check_reach(&self) -> Result<(), String> {
        match (self.boot, self.address, &self.bmc) {
            (Some(b @ (BootMethod::VirtualMedia | BootMethod::Network)), _, None) => Err(format!(
                "boot = \"{}\" needs a bmc to boot it through",
                b.as_str()
            )),
            (Some(BootMethod::Network), _, Some(_)) if self.boot_macs().is_empty() => Err(
                "boot = \"network\" needs the provisioning NIC's mac (or macs)".into(),
            ),
            (Some(BootMethod::VirtualMedia), _, Some(bmc)) if bmc.protocol() == BmcProtocol::Ipmi => {
                Err("boot = \"virtual-media\" needs a Redfish BMC (https://…): IPMI has no virtual media; use boot = \"network\"".into())
            }
            (Some(BootMethod::Ssh) | None, None, _) => Err(
                "address is missing (give an address to log in at, or boot = \"virtual-media\" or \"network\" with a bmc)"
                    .into(),
            ),
            _ => Ok(()),
        }
    }
}

/// How a BMC is spoken to, by its URL's scheme (CONTRACTS.md §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BmcProtocol {
    /// `https://` (or `http://` for an emulator).
    Redfish,
    /// `ipmi://host[:port]`: IPMI 2.0 over LAN (RMCP+).
    Ipmi,
}

impl BmcProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            BmcProtocol::Redfish => "redfish",
            BmcProtocol::Ipmi => "ipmi",
        }
    }
}

/// The port IPMI over LAN answers on unless the URL names another.
pub const IPMI_PORT: u16 = 623;

/// A host's baseboard management controller, spoken to with Redfish or
/// IPMI.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BmcConfig {
    /// `https://host[:port]` (`http://` for an emulator).
    pub url: String,
    pub username: String,
    /// Inline, `{ env = "VAR" }` or `{ file = "PATH" }`; never printed.
    pub password: Secret,
    /// The ComputerSystem's `Id` (or `@odata.id`). Unset: the BMC's only
    /// system (more than one is an error naming the machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    #[serde(default)]
    pub tls: BmcTls,
    /// Secure Boot as shepherd sets it before each boot it makes through
    /// this BMC (Redfish's `SecureBoot`): `true` on, `false` off; unset:
    /// left as it is. An IPMI BMC cannot set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
    /// Its serial console (unset: SOL for `ipmi://`, none for Redfish).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console: Option<super::ConsoleConfig>,
}

impl BmcConfig {
    /// How its serial console is reached (unset: SOL for `ipmi://`).
    pub fn console_via(&self) -> super::ConsoleVia {
        match &self.console {
            Some(c) => c.via,
            None if self.url.starts_with("ipmi://") => super::ConsoleVia::Sol,
            None => super::ConsoleVia::None,
        }
    }

    pub fn protocol(&self) -> BmcProtocol {
        if self.url.starts_with("ipmi://") {
            BmcProtocol::Ipmi
        } else {
            BmcProtocol::Redfish
        }
    }

    /// An IPMI BMC's host and port (`ipmi://host[:port]`).
    pub fn ipmi_target(&self) -> Option<(String, u16)> {
        let rest = self.url.strip_prefix("ipmi://")?.trim_end_matches('/');
        if rest.is_empty() || rest.contains(['/', '@', '?', '#']) {
            return None;
        }
        // [v6]:port, v6 alone, host:port, host.
        if let Some(v6) = rest.strip_prefix('[') {
            let (host, after) = v6.split_once(']')?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().ok()?,
                None if after.is_empty() => IPMI_PORT,
                None => return None,
            };
            return Some((host.to_string(), port));
        }
        if rest.matches(':').count() > 1 {
            return rest
                .parse::<std::net::Ipv6Addr>()
                .ok()
                .map(|a| (a.to_string(), IPMI_PORT));
        }
        match rest.split_once(':') {
            Some((h, p)) if !h.is_empty() => {
                Some((h.to_string(), p.parse().ok().filter(|p| *p > 0)?))
            }
            Some(_) => None,
            None => Some((rest.to_string(), IPMI_PORT)),
        }
    }

    /// Checks the URL and user and loads the password. Err: the key under
    /// `bmc` that is wrong (`url`, `username`, `password`) and why.
    pub fn validate(&mut self) -> Result<(), (&'static str, String)> {
        if let Some(c) = &self.console {
            c.validate(&self.url)?;
        }
        if self.url.starts_with("ipmi://") {
            if let Some(on) = self.secure_boot {
                return Err((
                    "secure_boot",
                    format!(
                        "is {on}, but an IPMI BMC cannot set Secure Boot (Redfish's SecureBoot resource does): set it in the machine's firmware, or leave secure_boot unset"
                    ),
                ));
            }
            if self.ipmi_target().is_none() {
                return Err((
                    "url",
                    format!(
                        "{:?} is not an IPMI BMC address like ipmi://10.0.0.5 or ipmi://bmc.example:623 (no path, no credentials)",
                        self.url
                    ),
                ));
            }
            self.url = self.url.trim_end_matches('/').to_string();
            if self.username.trim().is_empty() {
                return Err(("username", "must not be empty".into()));
            }
            self.password
                .resolve()
                .map_err(|m| ("password", m.to_string()))?;
            let len = self.password.expose().len();
            if len > 20 {
                return Err((
                    "password",
                    format!("is {len} bytes long; IPMI 2.0 takes at most 20"),
                ));
            }
            if self.username.len() > 16 {
                return Err(("username", "IPMI 2.0 takes at most 16 bytes".into()));
            }
            return Ok(());
        }
        let url = self.url.trim_end_matches('/').to_string();
        let scheme_ok = url.starts_with("https://") || url.starts_with("http://");
        let uri = url.parse::<awc::http::Uri>();
        let plain = uri
            .as_ref()
            .map(|u| u.path().is_empty() || u.path() == "/")
            .unwrap_or(false);
        if !scheme_ok || uri.is_err() || !plain || url.contains('@') {
            return Err((
                "url",
                format!(
                    "{:?} is not a BMC address like https://10.0.0.5, https://bmc.example:8443 or ipmi://10.0.0.5 (no path, no credentials)",
                    self.url
                ),
            ));
        }
        self.url = url;
        if self.username.trim().is_empty() {
            return Err(("username", "must not be empty".into()));
        }
        self.password
            .resolve()
            .map_err(|m| ("password", m.to_string()))?;
        if let BmcTls::CaFile { ca_file } = &self.tls
            && !ca_file.is_file()
        {
            return Err((
                "tls.ca_file",
                format!("{} is not a readable file", ca_file.display()),
            ));
        }
        Ok(())
    }
}

impl BmcConfig {
    /// The BMC an operator gives when accepting a discovered machine,
    /// checked as an inventory host's: `tls` is `verify`, `insecure` or a
    /// CA file's path. Err: the field at fault (`url`, `username`,
    /// `password`, `tls`) and why.
    pub fn accepted(
        url: &str,
        username: &str,
        password: &str,
        system: Option<&str>,
        tls: &str,
    ) -> Result<BmcConfig, (&'static str, String)> {
        let mut bmc = BmcConfig {
            url: url.trim().to_string(),
            username: username.to_string(),
            password: Secret::inline(password),
            system: system
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from),
            tls: BmcTls::from_stored(tls),
            secure_boot: None,
            console: None,
        };
        if password.is_empty() {
            return Err(("password", "must not be empty".into()));
        }
        bmc.validate().map_err(|(k, m)| match k {
            "tls.ca_file" => ("tls", m),
            k => (k, m),
        })?;
        Ok(bmc)
    }
}

impl BmcTls {
    /// As `machine_accepted_bmc.tls` keeps it: `verify`, `insecure` or a
    /// CA file's path.
    pub fn from_stored(s: &str) -> BmcTls {
        match s.trim() {
            "" | "verify" => BmcTls::Verify,
            "insecure" => BmcTls::Insecure,
            path => BmcTls::CaFile {
                ca_file: PathBuf::from(path),
            },
        }
    }

    pub fn to_stored(&self) -> String {
        match self {
            BmcTls::Verify => "verify".into(),
            BmcTls::Insecure => "insecure".into(),
            BmcTls::CaFile { ca_file } => ca_file.display().to_string(),
        }
    }
}

/// How a BMC's TLS certificate is checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum BmcTls {
    /// Against the web's public roots (`"verify"`).
    #[default]
    Verify,
    /// Not at all (`"insecure"`): BMCs often ship self-signed certificates.
    Insecure,
    /// Against this CA (`{ ca_file = "PATH" }`, PEM).
    CaFile { ca_file: PathBuf },
}

impl Serialize for BmcTls {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            BmcTls::Verify => s.serialize_str("verify"),
            BmcTls::Insecure => s.serialize_str("insecure"),
            BmcTls::CaFile { ca_file } => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("ca_file", ca_file)?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for BmcTls {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = BmcTls;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(r#""verify", "insecure" or { ca_file = "PATH" }"#)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<BmcTls, E> {
                match v {
                    "verify" => Ok(BmcTls::Verify),
                    "insecure" => Ok(BmcTls::Insecure),
                    other => Err(E::invalid_value(serde::de::Unexpected::Str(other), &self)),
                }
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<BmcTls, A::Error> {
                let mut ca_file = None;
                while let Some(k) = map.next_key::<String>()? {
                    match k.as_str() {
                        "ca_file" => ca_file = Some(map.next_value::<PathBuf>()?),
                        other => return Err(serde::de::Error::unknown_field(other, &["ca_file"])),
                    }
                }
                ca_file
                    .map(|ca_file| BmcTls::CaFile { ca_file })
                    .ok_or_else(|| serde::de::Error::missing_field("ca_file"))
            }
        }
        d.deserialize_any(V)
    }
}

/// The longest provider ID the BMDB holds (`machine_provided.provider_id`).
pub const MAX_ID_LEN: usize = 128;

/// What is wrong with a host's ID, if anything. Shared by the inline list
/// (a configuration error) and the file (the entry is skipped).
pub fn check_id(id: &str) -> Result<(), String> {
    if id.trim().is_empty() {
        return Err("id is empty".into());
    }
    if id.chars().count() > MAX_ID_LEN {
        return Err(format!(
            "id is {} characters long, at most {MAX_ID_LEN} are allowed",
            id.chars().count()
        ));
    }
    if id.chars().any(char::is_control) {
        return Err("id contains control characters".into());
    }
    Ok(())
}

mod file;
pub use file::{FileHosts, read_file};

#[cfg(test)]
mod tests;
