//! `[netboot]`: the network boot service on the provisioning interface
//! (CONTRACTS.md §6), and `[ipmi]`: how IPMI BMCs are driven. Without a
//! `[netboot]` section nothing listens on the DHCP or TFTP ports.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Whether shepherd hands out addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NetbootMode {
    /// proxyDHCP: boot answers to PXE clients only, never an address; the
    /// site's DHCP server keeps doing that.
    #[default]
    Proxy,
    /// A full DHCP server on an isolated provisioning network: addresses
    /// from `range`, leases kept in the BMDB.
    Dhcp,
}

/// What x86-64 UEFI machines' firmware PXE loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UefiChain {
    /// The signed chain: shim, then the distribution's signed network
    /// GRUB, then its signed kernel. Boots with Secure Boot on and off.
    /// Debian's GRUB reads its configuration from the next server its
    /// DHCP answer names: shepherd in `mode = "dhcp"`; in proxy mode the
    /// site's DHCP server must name shepherd as next server (siaddr).
    Shim,
    /// iPXE (`snponly.efi`), as on BIOS: a firmware with Secure Boot on
    /// refuses it.
    Ipxe,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetbootConfig {
    /// The provisioning interface: nothing is served on any other.
    pub interface: String,
    pub mode: NetbootMode,
    /// `mode = "dhcp"`: the addresses handed out, `A-B` (inclusive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range: Option<String>,
    /// `mode = "dhcp"`: the default gateway offered (none: no route).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub router: Option<Ipv4Addr>,
    /// `mode = "dhcp"`: the resolvers offered.
    pub dns: Vec<Ipv4Addr>,
    /// `mode = "dhcp"`: how long an address is leased.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// Where the iPXE binaries are (Debian's `ipxe` package); TFTP serves
    /// these files and nothing else.
    pub tftp_root: PathBuf,
    /// Unknown MACs that boot the network get the live agent and enlist
    /// as `discovered` machines.
    pub discover: bool,
    /// The address announced as the boot server (DHCP's server identifier
    /// and next server, the script's host). Unset: the interface's first
    /// IPv4 address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<Ipv4Addr>,
    /// Where iPXE fetches each boot's script, kernel and initramfs (plain
    /// HTTP: iPXE trusts no certificate of ours).
    pub http_listen: SocketAddr,
    /// The ports, for a test bed that cannot bind the standard ones.
    pub dhcp_port: u16,
    pub proxy_port: u16,
    pub tftp_port: u16,
    /// Unknown MACs given a discovery boot, at most this many a minute
    /// (per shepherd; a discovered machine booting again counts too).
    pub discover_per_minute: u32,
    /// How long a discovery boot's credential is good for: its agent must
    /// enroll within this.
    #[serde(with = "humantime_serde")]
    pub discover_ttl: Duration,
    /// How long a request for a boot's files (its script, kernel,
    /// initramfs, ISO) waits for the BMDB before it is answered 503. iPXE
    /// does not ask again: a boot whose file was refused waits for the
    /// Enroller's `callback_timeout`, so this is longer than the admin
    /// API's bound (a busy BMDB under a rack's enroll storm answers in
    /// seconds).
    #[serde(with = "humantime_serde")]
    pub database_timeout: Duration,
    /// Answer IPv6 router solicitations on the interface with "no router
    /// here" (lifetime 0, no prefixes): iPXE otherwise waits ~15 s for an
    /// IPv6 router before it boots.
    pub answer_router_solicitations: bool,
    /// What x86-64 UEFI machines' firmware PXE loads: `"shim"` (the
    /// signed chain, with Secure Boot on or off) or `"ipxe"`. Unset:
    /// `"shim"` in `mode = "dhcp"`, `"ipxe"` in proxy mode (see
    /// [`UefiChain::Shim`]). UEFI HTTP boot gets the boot's ISO either way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uefi: Option<UefiChain>,
}

impl Default for NetbootConfig {
    fn default() -> Self {
        NetbootConfig {
            interface: String::new(),
            mode: NetbootMode::Proxy,
            range: None,
            router: None,
            dns: Vec::new(),
            lease: Duration::from_secs(3600),
            tftp_root: PathBuf::from("/usr/lib/ipxe"),
            discover: false,
            address: None,
            http_listen: "0.0.0.0:8067".parse().expect("a socket address"),
            dhcp_port: 67,
            proxy_port: 4011,
            tftp_port: 69,
            discover_per_minute: 30,
            discover_ttl: Duration::from_secs(15 * 60),
            database_timeout: Duration::from_secs(15),
            answer_router_solicitations: true,
            uefi: None,
        }
    }
}

/// `mode = "dhcp"`'s pool, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressRange {
    pub first: Ipv4Addr,
    pub last: Ipv4Addr,
}

/// Text that is not an address range shepherd leases from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressRangeError {
    #[error("{0:?} is not a range like 10.0.0.100-10.0.0.199")]
    NotARange(String),
    #[error("{0:?}: the first address is after the last")]
    Backwards(String),
    #[error("{0:?}: more than 65536 addresses")]
    TooLarge(String),
}

impl AddressRange {
    pub fn parse(s: &str) -> Result<AddressRange, AddressRangeError> {
        let bad = || AddressRangeError::NotARange(s.to_string());
        let (a, b) = s.split_once('-').ok_or_else(bad)?;
        let first: Ipv4Addr = a.trim().parse().map_err(|_| bad())?;
        let last: Ipv4Addr = b.trim().parse().map_err(|_| bad())?;
        if u32::from(first) > u32::from(last) {
            return Err(AddressRangeError::Backwards(s.to_string()));
        }
        if u32::from(last) - u32::from(first) >= 1 << 16 {
            return Err(AddressRangeError::TooLarge(s.to_string()));
        }
        Ok(AddressRange { first, last })
    }

    pub fn contains(&self, a: Ipv4Addr) -> bool {
        (u32::from(self.first)..=u32::from(self.last)).contains(&u32::from(a))
    }

    pub fn len(&self) -> u32 {
        u32::from(self.last) - u32::from(self.first) + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn nth(&self, i: u32) -> Option<Ipv4Addr> {
        (i < self.len()).then(|| Ipv4Addr::from(u32::from(self.first) + i))
    }
}

impl NetbootConfig {
    /// What UEFI machines' firmware PXE loads, the mode's default unless
    /// set.
    pub fn uefi_chain(&self) -> UefiChain {
        self.uefi.unwrap_or(match self.mode {
            NetbootMode::Dhcp => UefiChain::Shim,
            NetbootMode::Proxy => UefiChain::Ipxe,
        })
    }

    /// The pool, in `mode = "dhcp"`.
    pub fn pool(&self) -> Option<AddressRange> {
        self.range
            .as_deref()
            .and_then(|r| AddressRange::parse(r).ok())
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let i = self.interface.trim();
        if i.is_empty() {
            return Err(ConfigError::key(
                "netboot.interface",
                "is missing: name the provisioning interface (nothing is served on any other)",
            ));
        }
        if i.len() > 15 || i.contains(['/', ' ', '\0']) {
            return Err(ConfigError::key(
                "netboot.interface",
                format!("{i:?} is not an interface name"),
            ));
        }
        match (self.mode, &self.range) {
            (NetbootMode::Dhcp, None) => {
                return Err(ConfigError::key(
                    "netboot.range",
                    "is missing: mode = \"dhcp\" hands out addresses from a range like 10.0.0.100-10.0.0.199",
                ));
            }
            (NetbootMode::Dhcp, Some(r)) => {
                AddressRange::parse(r).map_err(|e| ConfigError::key("netboot.range", e))?;
            }
            (NetbootMode::Proxy, Some(_)) => {
                return Err(ConfigError::key(
                    "netboot.range",
                    "is for mode = \"dhcp\"; a proxy hands out no addresses",
                ));
            }
            (NetbootMode::Proxy, None) => {}
        }
        if self.mode == NetbootMode::Dhcp && self.lease < Duration::from_secs(60) {
            return Err(ConfigError::key("netboot.lease", "must be at least 1m"));
        }
        if !self.tftp_root.is_absolute() {
            return Err(ConfigError::key(
                "netboot.tftp_root",
                "must be an absolute path (Debian's ipxe package: /usr/lib/ipxe)",
            ));
        }
        for (k, p) in [
            ("dhcp_port", self.dhcp_port),
            ("proxy_port", self.proxy_port),
            ("tftp_port", self.tftp_port),
        ] {
            if p == 0 {
                return Err(ConfigError::key(
                    format!("netboot.{k}"),
                    "must be 1 to 65535",
                ));
            }
        }
        if self.discover && self.discover_per_minute == 0 {
            return Err(ConfigError::key(
                "netboot.discover_per_minute",
                "must be at least 1 with discover = true (or turn discover off)",
            ));
        }
        if !(Duration::from_secs(60)..=Duration::from_secs(24 * 3600)).contains(&self.discover_ttl)
        {
            return Err(ConfigError::key(
                "netboot.discover_ttl",
                "must be from 1m to 24h",
            ));
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(60)).contains(&self.database_timeout) {
            return Err(ConfigError::key(
                "netboot.database_timeout",
                "must be from 1s to 1m (iPXE gives up on a request after about a minute)",
            ));
        }
        Ok(())
    }
}

/// How IPMI BMCs are driven: Debian's `ipmitool`, as Ironic and Metal3 do.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct IpmiConfig {
    /// The `ipmitool` program.
    pub ipmitool: PathBuf,
    /// One command's limit, its retries included.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Commands in flight at once over all IPMI BMCs (each BMC has one at
    /// a time).
    pub max_concurrent: u32,
}

impl Default for IpmiConfig {
    fn default() -> Self {
        IpmiConfig {
            ipmitool: PathBuf::from("ipmitool"),
            timeout: Duration::from_secs(20),
            max_concurrent: 16,
        }
    }
}

impl IpmiConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.timeout < Duration::from_secs(1) {
            return Err(ConfigError::key("ipmi.timeout", "must be at least 1s"));
        }
        ConfigError::within("ipmi.max_concurrent", self.max_concurrent, 1..=4096)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_checked_and_counted() {
        let r = AddressRange::parse("10.0.0.100 - 10.0.0.199").unwrap();
        assert_eq!(r.len(), 100);
        assert_eq!(r.nth(99), Some("10.0.0.199".parse().unwrap()));
        assert_eq!(r.nth(100), None);
        assert!(r.contains("10.0.0.150".parse().unwrap()));
        assert!(!r.contains("10.0.0.200".parse().unwrap()));
        assert!(AddressRange::parse("10.0.0.9-10.0.0.1").is_err());
        assert!(AddressRange::parse("10.0.0.1").is_err());
        assert!(AddressRange::parse("10.0.0.0-10.2.0.0").is_err());
    }
}
