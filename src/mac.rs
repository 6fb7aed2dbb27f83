//! A NIC's hardware (MAC) address, as an operator writes it
//! (`52:54:00:12:34:56`, upper or lower case, `:` or `-` between the
//! bytes) and as shepherd prints and stores it (lower case, `:`).

use std::fmt;
use std::str::FromStr;

/// A 48-bit Ethernet address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The first six bytes of a DHCP `chaddr`, when the hardware type is
    /// Ethernet (1) and the length 6.
    pub fn from_chaddr(htype: u8, hlen: u8, chaddr: &[u8]) -> Option<MacAddr> {
        if htype != 1 || hlen != 6 || chaddr.len() < 6 {
            return None;
        }
        let mut b = [0u8; 6];
        b.copy_from_slice(&chaddr[..6]);
        Some(MacAddr(b))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// Text that is not a MAC address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a MAC address like 52:54:00:12:34:56")]
pub struct NotAMac(pub String);

impl FromStr for MacAddr {
    type Err = NotAMac;

    fn from_str(s: &str) -> Result<MacAddr, NotAMac> {
        let bad = || NotAMac(s.to_string());
        let t = s.trim();
        let sep = if t.contains(':') { ':' } else { '-' };
        let parts: Vec<&str> = t.split(sep).collect();
        if parts.len() != 6 {
            return Err(bad());
        }
        let mut b = [0u8; 6];
        for (i, p) in parts.iter().enumerate() {
            if p.len() != 2 {
                return Err(bad());
            }
            b[i] = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        Ok(MacAddr(b))
    }
}

impl serde::Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MacAddr, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_an_operator_writes_is_one_address() {
        let a: MacAddr = "52:54:00:12:34:56".parse().unwrap();
        for s in [
            "52:54:00:12:34:56",
            "52-54-00-12-34-56",
            "52:54:00:12:34:56 ",
        ] {
            assert_eq!(s.parse::<MacAddr>().unwrap(), a);
        }
        let b: MacAddr = "AA-BB-CC-DD-EE-0F".parse().unwrap();
        assert_eq!(b.to_string(), "aa:bb:cc:dd:ee:0f");
        for bad in [
            "",
            "52:54:00:12:34",
            "52:54:00:12:34:5g",
            "525400123456",
            "52:54:00:12:34:567",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad}");
        }
    }
}
