//! A stored hardware report (`AgentHardwareReport`), decoded for
//! operators: the service's pages, JSON and command line show it; the
//! agent reads the report itself (`shepherd_agent::hardware`).

use crate::api::{AgentHardwareReport, EfiSupport, block_device, secure_boot};

/// A stored hardware report, decoded for operators (pages, JSON, CLI).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct HardwareSummary {
    pub manufacturer: String,
    pub product: String,
    pub serial_number: String,
    pub memory_bytes: i64,
    /// The share of it the kernel can use.
    pub memory_usable_ratio: f32,
    pub cpus: Vec<CpuSummary>,
    pub disks: Vec<DiskSummary>,
    pub nics: Vec<NicSummary>,
    pub efi: String,
    /// The BMC's LAN channel, as the agent read it in-band.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bmc_lan: Option<BmcLanSummary>,
    /// How the firmware booted the agent, as the agent read it (none: an
    /// agent that does not say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<SecureBootSummary>,
    pub warnings: Vec<String>,
}

/// Secure Boot as the agent's system booted.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SecureBootSummary {
    /// `on`, `off` or `unknown`.
    pub state: &'static str,
    pub setup_mode: bool,
    /// The kernel's lockdown (`none`, `integrity`, `confidentiality`;
    /// empty: not said).
    pub lockdown: String,
}

impl std::fmt::Display for SecureBootSummary {
    /// `on, kernel locked down (integrity)`, `off`, `off (setup mode)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.state)?;
        if self.setup_mode {
            f.write_str(" (setup mode)")?;
        }
        match self.lockdown.as_str() {
            "" | "none" => Ok(()),
            l => write!(f, ", kernel locked down ({l})"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BmcLanSummary {
    pub channel: u32,
    pub ipv4_address: String,
    pub address_source: String,
    pub mac: String,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CpuSummary {
    pub vendor: String,
    pub model: String,
    pub cores: i32,
    pub threads: i32,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DiskSummary {
    pub model: String,
    pub serial_number: String,
    /// The World Wide Name, hex.
    pub wwn: String,
    pub capacity_bytes: i64,
    pub protocol: String,
    pub rotational: bool,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct NicSummary {
    pub mac: String,
    pub driver: String,
    pub link_up: bool,
    pub speed_bytes: i64,
    /// The switch port its LLDP frames name (none heard: absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lldp: Option<LldpSummary>,
}

/// What a switch's LLDP frames on a NIC say.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LldpSummary {
    pub chassis_id: String,
    pub port_id: String,
    pub system_name: String,
    pub port_description: String,
}

impl LldpSummary {
    /// Whether it names switch `switch`'s port `port`: the system name
    /// or chassis ID is the switch's name, and the port ID or description
    /// is the port's name (or ends in it, after a colon).
    pub fn names(&self, switch: &str, port: &str) -> bool {
        let sw = [&self.system_name, &self.chassis_id]
            .iter()
            .any(|s| s.eq_ignore_ascii_case(switch));
        let p = self.port_id.eq_ignore_ascii_case(port)
            || self.port_description.eq_ignore_ascii_case(port)
            || self
                .port_description
                .split([':', ' '])
                .any(|w| w.eq_ignore_ascii_case(port));
        sw && p
    }
}

impl std::fmt::Display for LldpSummary {
    /// `leaf1 Ethernet1`, with the chassis ID when it differs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = if self.system_name.is_empty() {
            &self.chassis_id
        } else {
            &self.system_name
        };
        write!(f, "{name} {}", self.port_id)
    }
}

impl std::fmt::Display for BmcLanSummary {
    /// `10.0.0.41 (dhcp), MAC 52:54:00:4e:10:04, LAN channel 1 (read in-band)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}), MAC {}, LAN channel {} (read in-band)",
            self.ipv4_address, self.address_source, self.mac, self.channel
        )
    }
}

/// Decodes `hardware_report_raw` (an `AgentHardwareReport`).
pub fn summarize(raw: &[u8]) -> Result<HardwareSummary, String> {
    use prost::Message;
    let r = AgentHardwareReport::decode(raw).map_err(|e| format!("undecodable report: {e}"))?;
    let n = r.report.unwrap_or_default();
    Ok(HardwareSummary {
        manufacturer: n.manufacturer,
        product: n.product,
        serial_number: n.serial_number,
        memory_bytes: n.memory_installed_bytes,
        memory_usable_ratio: n.memory_usable_ratio,
        cpus: n
            .cpu
            .into_iter()
            .map(|c| CpuSummary {
                vendor: c.vendor,
                model: c.model,
                cores: c.cores,
                threads: c.hardware_threads,
            })
            .collect(),
        disks: n
            .block_device
            .into_iter()
            .map(|d| DiskSummary {
                model: d.device_model,
                serial_number: d.serial_number,
                wwn: d.wwn.iter().map(|b| format!("{b:02x}")).collect(),
                capacity_bytes: d.capacity_bytes,
                protocol: block_device::Protocol::try_from(d.protocol)
                    .map(|p| p.as_str_name().trim_start_matches("PROTOCOL_").to_string())
                    .unwrap_or_else(|_| d.protocol.to_string()),
                rotational: d.rotational,
            })
            .collect(),
        nics: n
            .network_interface
            .into_iter()
            .map(|i| NicSummary {
                mac: mac_text(&i.mac),
                driver: i.driver,
                link_up: i.link_up,
                speed_bytes: i.current_speed_bytes,
                lldp: i.lldp.map(|l| LldpSummary {
                    chassis_id: l.chassis_id,
                    port_id: l.port_id,
                    system_name: l.system_name,
                    port_description: l.port_description,
                }),
            })
            .collect(),
        efi: EfiSupport::try_from(n.efi_support)
            .map(|e| {
                e.as_str_name()
                    .trim_start_matches("EFI_SUPPORT_")
                    .to_string()
            })
            .unwrap_or_else(|_| n.efi_support.to_string()),
        bmc_lan: n.bmc_lan.map(|b| BmcLanSummary {
            channel: b.channel,
            ipv4_address: b.ipv4_address,
            address_source: b.address_source,
            mac: mac_text(&b.mac),
        }),
        secure_boot: n.secure_boot.map(|s| SecureBootSummary {
            state: match secure_boot::State::try_from(s.state) {
                Ok(secure_boot::State::On) => "on",
                Ok(secure_boot::State::Off) => "off",
                _ => "unknown",
            },
            setup_mode: s.setup_mode,
            lockdown: s.lockdown,
        }),
        warnings: r.warning,
    })
}

/// `52:54:00:12:34:56`.
fn mac_text(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// `1.5 TiB`, `64 GiB`.
pub fn bytes(n: i64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", units[u])
    } else {
        format!("{v:.1} {}", units[u])
    }
}

impl std::fmt::Display for HardwareSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} {} (serial {}), memory {} ({:.0}% usable), EFI {}",
            self.manufacturer,
            self.product,
            if self.serial_number.is_empty() {
                "-"
            } else {
                &self.serial_number
            },
            bytes(self.memory_bytes),
            self.memory_usable_ratio * 100.0,
            self.efi
        )?;
        for c in &self.cpus {
            writeln!(
                f,
                "cpu   {} {}: {} cores, {} threads",
                c.vendor, c.model, c.cores, c.threads
            )?;
        }
        for d in &self.disks {
            writeln!(
                f,
                "disk  {} {} {}{}{}{}",
                d.protocol,
                d.model,
                bytes(d.capacity_bytes),
                if d.rotational { ", rotational" } else { "" },
                if d.serial_number.is_empty() {
                    String::new()
                } else {
                    format!(", serial {}", d.serial_number)
                },
                if d.wwn.is_empty() {
                    String::new()
                } else {
                    format!(", wwn {}", d.wwn)
                }
            )?;
        }
        for n in &self.nics {
            writeln!(
                f,
                "nic   {} {} link {}{}",
                n.mac,
                n.driver,
                if n.link_up { "up" } else { "down" },
                if n.speed_bytes > 0 {
                    format!(" {} Gbit/s", n.speed_bytes * 8 / 1_000_000_000)
                } else {
                    String::new()
                }
            )?;
        }
        if let Some(b) = &self.bmc_lan {
            writeln!(f, "bmc   {}", b)?;
        }
        for w in &self.warnings {
            writeln!(f, "warning {w}")?;
        }
        Ok(())
    }
}
