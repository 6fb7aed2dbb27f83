//! A host's BMC, whatever it speaks: Redfish (`https://`) or IPMI
//! (`ipmi://`), chosen by the URL's scheme (CONTRACTS.md §6). What the
//! inventory asks of a BMC (its facts, a reboot, a boot into the live
//! agent from virtual media or the network, a restart from the disk) is
//! here once, for both.

use crate::bmc::{BmcError, BmcErrorKind};
use crate::bmdb::hardware::SystemFacts;
use crate::config::{BmcConfig, BmcProtocol, BootMethod, Firmware, IpmiConfig, RedfishConfig};
use crate::ipmi::{self, Ipmis};
use crate::redfish;

/// What a BMC says of its system.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BmcSystem {
    /// Redfish's `@odata.id` of the system; empty for IPMI.
    pub path: String,
    pub facts: SystemFacts,
}

impl BmcSystem {
    /// Its power state (`On`, `Off`, …; empty when it does not say).
    pub fn power(&self) -> &str {
        self.facts.power_state.as_deref().unwrap_or("")
    }
}

/// The BMC clients of every host, by protocol.
pub struct Bmcs {
    pub redfish: redfish::Bmcs,
    pub ipmi: Ipmis,
    power_timeout: std::time::Duration,
}

impl Bmcs {
    pub fn new(redfish: &RedfishConfig, ipmi: &IpmiConfig) -> Bmcs {
        Bmcs {
            redfish: redfish::Bmcs::new(redfish),
            ipmi: Ipmis::new(ipmi),
            power_timeout: redfish.power_timeout,
        }
    }

    pub async fn system(&self, host: &str, bmc: &BmcConfig) -> Result<BmcSystem, BmcError> {
        match bmc.protocol() {
            BmcProtocol::Redfish => {
                let s = redfish::system(&self.redfish, host, bmc).await?;
                Ok(BmcSystem {
                    path: s.path,
                    facts: s.facts,
                })
            }
            BmcProtocol::Ipmi => Ok(BmcSystem {
                path: String::new(),
                facts: self.ipmi.ask(host, bmc, ipmi::ReadFacts).await?,
            }),
        }
    }

    /// The machine's firmware components and BIOS settings; None: its BMC
    /// speaks IPMI, which lists none.
    pub async fn firmware(
        &self,
        host: &str,
        bmc: &BmcConfig,
    ) -> Result<Option<crate::bmdb::firmware::Reading>, BmcError> {
        match bmc.protocol() {
            BmcProtocol::Redfish => Ok(Some(redfish::firmware(&self.redfish, host, bmc).await?)),
            BmcProtocol::Ipmi => Ok(None),
        }
    }

    /// Reboots the machine; Ok(how).
    pub async fn reboot(&self, host: &str, bmc: &BmcConfig) -> Result<String, BmcError> {
        match bmc.protocol() {
            BmcProtocol::Redfish => redfish::reboot(&self.redfish, host, bmc).await,
            BmcProtocol::Ipmi => {
                let restart = ipmi::Restart {
                    power_timeout: self.power_timeout,
                };
                self.ipmi.ask(host, bmc, restart).await
            }
        }
    }

    /// Switches the machine on or off; Ok(how).
    pub async fn set_power(
        &self,
        host: &str,
        bmc: &BmcConfig,
        on: bool,
    ) -> Result<String, BmcError> {
        match bmc.protocol() {
            BmcProtocol::Redfish => {
                redfish::set_power(&self.redfish, host, bmc, on, self.power_timeout).await
            }
            BmcProtocol::Ipmi => {
                let set = ipmi::SetPower {
                    on,
                    power_timeout: self.power_timeout,
                };
                self.ipmi.ask(host, bmc, set).await
            }
        }
    }

    /// Boots the machine into the live agent: from `image_url` through
    /// virtual media, or from the network (where the network boot service
    /// answers its MAC). Ok(how it was started), once it is on.
    pub async fn boot_agent(
        &self,
        host: &str,
        bmc: &BmcConfig,
        via: BootMethod,
        firmware: Firmware,
        image_url: &str,
        credentials: Option<(String, String)>,
    ) -> Result<String, BmcError> {
        match (via, bmc.protocol()) {
            (BootMethod::Network, BmcProtocol::Redfish) => {
                let reset = redfish::boot_from_network(&self.redfish, host, bmc).await?;
                Ok(format!("{reset} with a one-time Pxe boot override"))
            }
            (BootMethod::Network, BmcProtocol::Ipmi) => {
                let efi = firmware == Firmware::Uefi;
                let set = ipmi::SetBootDevice {
                    device: ipmi::BootDevice::Pxe,
                    efi,
                };
                self.ipmi.ask(host, bmc, set).await?;
                let restart = ipmi::Restart {
                    power_timeout: self.power_timeout,
                };
                let how = self.ipmi.ask(host, bmc, restart).await?;
                Ok(format!(
                    "{how} with boot device pxe{} once",
                    if efi { " (EFI)" } else { "" }
                ))
            }
            (_, BmcProtocol::Redfish) => {
                let with_auth = credentials.is_some();
                let boot =
                    redfish::boot_from_media_with(&self.redfish, host, bmc, image_url, credentials)
                        .await?;
                let mut how = format!("{} with the boot image from {}", boot.reset, boot.media);
                if with_auth {
                    how.push_str(" (fetched with the boot's user name and password)");
                }
                if boot.plain_insert {
                    how.push_str(
                        " (the BMC refused Inserted/WriteProtected: inserted without them)",
                    );
                }
                if let Some(old) = &boot.ejected_before {
                    how.push_str(&format!(" (ejected {old} first)"));
                }
                Ok(how)
            }
            (_, BmcProtocol::Ipmi) => Err(BmcError {
                host: host.to_string(),
                bmc: bmc.url.clone(),
                kind: BmcErrorKind::Config(
                    "IPMI has no virtual media: list the host with boot = \"network\"".into(),
                ),
            }),
        }
    }

    /// Ends a boot into the agent: virtual media ejected and the override
    /// cleared, or (network) the boot device set back to the disk. Ok(true)
    /// if media was inserted.
    pub async fn end_agent_boot(
        &self,
        host: &str,
        bmc: &BmcConfig,
        via: BootMethod,
        firmware: Firmware,
    ) -> Result<bool, BmcError> {
        match (via, bmc.protocol()) {
            (BootMethod::Network, BmcProtocol::Redfish) => {
                redfish::clear_boot_override(&self.redfish, host, bmc).await?;
                Ok(false)
            }
            (_, BmcProtocol::Redfish) => redfish::end_media_boot(&self.redfish, host, bmc).await,
            (_, BmcProtocol::Ipmi) => {
                let set = ipmi::SetBootDevice {
                    device: ipmi::BootDevice::Disk,
                    efi: firmware == Firmware::Uefi,
                };
                self.ipmi.ask(host, bmc, set).await?;
                Ok(false)
            }
        }
    }

    /// Restarts the machine from its disk (media ejected, override
    /// cleared, or the boot device set to the disk); Ok(how). Through
    /// Redfish, Secure Boot is set as `secure_boot` asks (a tenant's plan),
    /// else as the host's `bmc.secure_boot` does, else left; IPMI has no
    /// Secure Boot to set (a plan that asks for it takes only machines
    /// already booting that way).
    pub async fn boot_from_disk(
        &self,
        host: &str,
        bmc: &BmcConfig,
        via: BootMethod,
        firmware: Firmware,
        secure_boot: Option<bool>,
    ) -> Result<String, BmcError> {
        match bmc.protocol() {
            BmcProtocol::Redfish => {
                let eject = via != BootMethod::Network;
                let reset =
                    redfish::boot_from_disk(&self.redfish, host, bmc, eject, secure_boot).await?;
                Ok(if eject {
                    format!("media ejected, override cleared, {reset}")
                } else {
                    format!("override cleared, {reset}")
                })
            }
            BmcProtocol::Ipmi => {
                self.end_agent_boot(host, bmc, via, firmware).await?;
                let restart = ipmi::Restart {
                    power_timeout: self.power_timeout,
                };
                let how = self.ipmi.ask(host, bmc, restart).await?;
                Ok(format!("boot device disk, {how}"))
            }
        }
    }
}
