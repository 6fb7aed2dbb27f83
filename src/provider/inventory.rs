//! The static inventory: an operator's own hosts, listed in the
//! configuration or in a TOML file it names (re-read every round, so an
//! edit takes effect without a restart). Every host is ours; there is no
//! capacity to create machines from. A host with a BMC (`bmc = { url, … }`)
//! is rebooted through it (Redfish or IPMI, by the URL's scheme) and its
//! status is its power state; one without cannot be rebooted.
//!
//! Machines that enlisted themselves and were accepted with their BMC
//! (`bmdb::discovery`) are listed too, read from the BMDB each time the
//! hosts are: booted from the network, at the MAC they enlisted from.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::PathBuf;

use super::bmc::Bmcs;
use super::{BmcRead, FirmwareRead, Fut, MachineKind, Provider, ProviderError, ProviderMachine};
use crate::bmdb::{Provider as ProviderKind, ProviderStatus};
use crate::config::inventory::read_file;
use crate::config::{
    BmcConfig, BootMethod, InventoryConfig, InventoryMachine, IpmiConfig, RedfishConfig,
};

pub struct Inventory {
    listed: Vec<InventoryMachine>,
    file: Option<PathBuf>,
    /// The file's hosts as last read successfully: a file that cannot be
    /// read for a while (mid-edit, a syntax error) does not make its hosts
    /// disappear.
    last_good: RefCell<Vec<InventoryMachine>>,
    /// Problems already reported: each is logged once, when it appears.
    reported: RefCell<BTreeSet<String>>,
    bmcs: Bmcs,
    /// Each BMC host's status as its power state last read: what the
    /// listing reports (hosts without a BMC, or not read yet, are Running).
    power: RefCell<std::collections::HashMap<String, ProviderStatus>>,
    /// Where accepted machines are read from (None: not read).
    bmdb: Option<crate::bmdb::Bmdb>,
    /// The accepted machines as last read (kept while the BMDB fails).
    accepted: RefCell<Vec<InventoryMachine>>,
}

impl Inventory {
    pub fn new(
        cfg: &InventoryConfig,
        redfish: &RedfishConfig,
        ipmi: &IpmiConfig,
        bmdb: Option<crate::bmdb::Bmdb>,
    ) -> Self {
        Inventory {
            bmdb,
            accepted: RefCell::new(Vec::new()),
            listed: cfg.machines.clone(),
            file: cfg.file.clone(),
            last_good: RefCell::new(Vec::new()),
            reported: RefCell::new(BTreeSet::new()),
            bmcs: Bmcs::new(redfish, ipmi),
            power: RefCell::new(std::collections::HashMap::new()),
        }
    }

    fn listed(&self, m: &InventoryMachine) -> ProviderMachine {
        let mut p = machine(m);
        if m.bmc.is_some()
            && let Some(s) = self.power.borrow().get(&m.id)
        {
            p.status = *s;
        }
        p
    }

    /// Reads the accepted machines again (kept as they were when the BMDB
    /// cannot answer: a database outage does not make hosts disappear).
    async fn refresh_accepted(&self) {
        let Some(bmdb) = &self.bmdb else {
            return;
        };
        match bmdb
            .snapshot(async |tx| crate::bmdb::discovery::accepted(tx).await)
            .await
        {
            Ok(hosts) => *self.accepted.borrow_mut() = hosts.iter().map(accepted_host).collect(),
            Err(e) => {
                tracing::warn!(error = %e, kept = self.accepted.borrow().len(), "accepted machines not read from the BMDB; keeping those read before")
            }
        }
    }

    /// Every host, the accepted machines read now.
    async fn hosts_now(&self) -> Vec<InventoryMachine> {
        self.refresh_accepted().await;
        self.hosts()
    }

    fn host(&self, provider_id: &str) -> Option<InventoryMachine> {
        self.hosts().into_iter().find(|m| m.id == provider_id)
    }

    /// The host, read again from the BMDB when it is not known (an
    /// acceptance this process has not listed yet).
    async fn host_now(&self, provider_id: &str) -> Option<InventoryMachine> {
        match self.host(provider_id) {
            Some(h) => Some(h),
            None => {
                self.refresh_accepted().await;
                self.host(provider_id)
            }
        }
    }

    /// The host and its BMC; an error naming the host when it is gone from
    /// the inventory or has no BMC to be `what` (e.g. "booted through it").
    async fn with_bmc(
        &self,
        provider_id: &str,
        what: &str,
    ) -> Result<(InventoryMachine, crate::config::BmcConfig), ProviderError> {
        let host = self.host_now(provider_id).await.ok_or_else(|| {
            ProviderError::Inventory(format!("host {provider_id} is no longer in the inventory"))
        })?;
        let bmc = host.bmc.clone().ok_or_else(|| {
            ProviderError::Unsupported(format!(
                "host {provider_id} has no BMC in the inventory to be {what}"
            ))
        })?;
        Ok((host, bmc))
    }

    /// Logs the problems not reported yet; forgets the ones that are gone
    /// (so they are reported again if they come back).
    fn report(&self, problems: BTreeSet<String>) {
        let mut reported = self.reported.borrow_mut();
        for p in problems.difference(&reported) {
            tracing::warn!(problem = %p, "inventory file");
        }
        for p in reported.difference(&problems) {
            tracing::info!(problem = %p, "inventory file problem resolved");
        }
        *reported = problems;
    }

    fn hosts(&self) -> Vec<InventoryMachine> {
        let mut all = self.listed.clone();
        let accepted = self.accepted.borrow().clone();
        let Some(f) = &self.file else {
            for m in accepted {
                if !all.iter().any(|x| x.id == m.id) {
                    all.push(m);
                }
            }
            return all;
        };
        let mut problems = BTreeSet::new();
        let from_file = match read_file(f) {
            Ok(read) => {
                problems.extend(read.problems);
                *self.last_good.borrow_mut() = read.hosts.clone();
                read.hosts
            }
            Err(e) => {
                let kept = self.last_good.borrow().clone();
                problems.insert(format!(
                    "{e}; keeping the {} hosts last read from it",
                    kept.len()
                ));
                kept
            }
        };
        for m in from_file {
            if all.iter().any(|x| x.id == m.id) {
                problems.insert(format!(
                    "{}: host {} is also in the configuration; the file's entry is skipped",
                    f.display(),
                    m.id
                ));
                continue;
            }
            all.push(m);
        }
        self.report(problems);
        for m in accepted {
            if !all.iter().any(|x| x.id == m.id) {
                all.push(m);
            }
        }
        all
    }
}

/// An accepted machine as an inventory host: its BMC, booted from the
/// network at the MAC it enlisted from.
fn accepted_host(a: &crate::bmdb::discovery::AcceptedHost) -> InventoryMachine {
    let b = &a.acceptance;
    InventoryMachine {
        id: a.host_id().to_string(),
        address: None,
        location: None,
        bmc: Some(crate::config::BmcConfig {
            url: b.url.clone(),
            username: b.username.clone(),
            password: crate::secret::Secret::inline(b.password.clone()),
            system: b.system.clone(),
            tls: crate::config::inventory::BmcTls::from_stored(&b.tls),
            secure_boot: None,
            console: None,
        }),
        boot: Some(BootMethod::Network),
        mac: Some(a.mac),
        macs: Vec::new(),
        firmware: Some(if a.firmware == "bios" {
            crate::config::inventory::Firmware::Bios
        } else {
            crate::config::inventory::Firmware::Uefi
        }),
        ports: Vec::new(),
    }
}

fn machine(m: &InventoryMachine) -> ProviderMachine {
    ProviderMachine {
        provider_id: m.id.clone(),
        address: m.address,
        location: m.location.clone(),
        reservation_id: None,
        status: ProviderStatus::Running,
        kind: MachineKind::Ours,
        boots_from_bmc: m.boots_from_bmc(),
        boot_macs: if m.boot == Some(BootMethod::Network) {
            m.boot_macs()
        } else {
            Vec::new()
        },
        ports: m.ports.clone(),
    }
}

impl Provider for Inventory {
    fn kind(&self) -> ProviderKind {
        ProviderKind::None
    }

    fn list_machines(&self) -> Fut<'_, Vec<ProviderMachine>> {
        Box::pin(async move {
            Ok(self
                .hosts_now()
                .await
                .iter()
                .map(|m| self.listed(m))
                .collect())
        })
    }

    /// A host with a BMC: its status is the system's power state.
    fn get_machine<'a>(&'a self, provider_id: &'a str) -> Fut<'a, Option<ProviderMachine>> {
        Box::pin(async move {
            let Some(host) = self.host_now(provider_id).await else {
                return Ok(None);
            };
            let mut m = machine(&host);
            if let Some(bmc) = &host.bmc {
                let system = self.bmcs.system(&host.id, bmc).await?;
                m.status = crate::redfish::provider_status(system.power());
                self.power.borrow_mut().insert(host.id.clone(), m.status);
            }
            Ok(Some(m))
        })
    }

    fn create_machine<'a>(&'a self, _capacity: &'a ProviderMachine) -> Fut<'a, ProviderMachine> {
        Box::pin(async {
            Err(ProviderError::Unsupported(
                "a static inventory has no capacity".into(),
            ))
        })
    }

    /// Every BMC host's system, read concurrently (the BMC clients cap how
    /// many requests are in flight).
    fn bmc_facts(&self) -> Fut<'_, Vec<BmcRead>> {
        Box::pin(async move {
            let hosts: Vec<InventoryMachine> = self
                .hosts_now()
                .await
                .into_iter()
                .filter(|h| h.bmc.is_some())
                .collect();
            let reads = futures::future::join_all(hosts.iter().map(|h| async move {
                let bmc = h.bmc.as_ref().expect("filtered on a BMC");
                let system = self.bmcs.system(&h.id, bmc).await;
                BmcRead {
                    provider_id: h.id.clone(),
                    bmc_url: bmc.url.clone(),
                    system: system.map_err(|e| e.to_string()),
                }
            }))
            .await;
            let mut power = self.power.borrow_mut();
            for r in &reads {
                match &r.system {
                    Ok(s) => power.insert(
                        r.provider_id.clone(),
                        crate::redfish::provider_status(s.power()),
                    ),
                    // Not known now: not a reason to say otherwise.
                    Err(_) => power.remove(&r.provider_id),
                };
            }
            Ok(reads)
        })
    }

    /// The firmware of those hosts whose BMC lists it (Redfish), read
    /// concurrently.
    fn bmc_firmware<'a>(&'a self, provider_ids: &'a [String]) -> Fut<'a, Vec<FirmwareRead>> {
        Box::pin(async move {
            let wanted: std::collections::HashSet<&str> =
                provider_ids.iter().map(String::as_str).collect();
            let hosts: Vec<InventoryMachine> = self
                .hosts_now()
                .await
                .into_iter()
                .filter(|h| h.bmc.is_some() && wanted.contains(h.id.as_str()))
                .collect();
            let reads = futures::future::join_all(hosts.iter().map(|h| async move {
                let bmc = h.bmc.as_ref().expect("filtered on a BMC");
                match self.bmcs.firmware(&h.id, bmc).await {
                    Ok(None) => None,
                    Ok(Some(c)) => Some(FirmwareRead {
                        provider_id: h.id.clone(),
                        firmware: Ok(c),
                    }),
                    Err(e) => Some(FirmwareRead {
                        provider_id: h.id.clone(),
                        firmware: Err(e.to_string()),
                    }),
                }
            }))
            .await;
            Ok(reads.into_iter().flatten().collect())
        })
    }

    fn redfish_bmc<'a>(
        &'a self,
        provider_id: &'a str,
    ) -> Fut<'a, Option<crate::redfish::RedfishBmc>> {
        Box::pin(async move {
            let Some(bmc) = self.host_now(provider_id).await.and_then(|h| h.bmc) else {
                return Ok(None);
            };
            if bmc.protocol() != crate::config::BmcProtocol::Redfish {
                return Ok(None);
            }
            let client = self.bmcs.redfish.get(provider_id, &bmc)?;
            Ok(Some(crate::redfish::RedfishBmc {
                host: provider_id.to_string(),
                config: bmc,
                client,
            }))
        })
    }

    fn console<'a>(
        &'a self,
        provider_id: &'a str,
    ) -> Fut<'a, Option<crate::console::ConsoleSource>> {
        Box::pin(async move {
            Ok(self
                .host_now(provider_id)
                .await
                .and_then(|h| h.bmc)
                .and_then(|b| crate::console::ConsoleSource::of(&b)))
        })
    }

    fn boot_agent<'a>(
        &'a self,
        provider_id: &'a str,
        image_url: &'a str,
        credentials: Option<(String, String)>,
    ) -> Fut<'a, String> {
        Box::pin(async move {
            let (host, bmc) = self.with_bmc(provider_id, "booted through it").await?;
            let via = host.boot.unwrap_or(BootMethod::VirtualMedia);
            let how = self
                .bmcs
                .boot_agent(
                    &host.id,
                    &bmc,
                    via,
                    host.firmware.unwrap_or_default(),
                    image_url,
                    credentials,
                )
                .await?;
            tracing::info!(host = %host.id, bmc = %bmc.url, via = via.as_str(), how = %how, "booting into the agent through the BMC");
            Ok(how)
        })
    }

    fn boot_from_disk<'a>(
        &'a self,
        provider_id: &'a str,
        secure_boot: Option<bool>,
    ) -> Fut<'a, String> {
        Box::pin(async move {
            let (host, bmc) = self
                .with_bmc(provider_id, "restarted from its disk")
                .await?;
            let via = host.boot.unwrap_or(BootMethod::VirtualMedia);
            let reset = self
                .bmcs
                .boot_from_disk(
                    &host.id,
                    &bmc,
                    via,
                    host.firmware.unwrap_or_default(),
                    secure_boot,
                )
                .await?;
            tracing::info!(host = %host.id, bmc = %bmc.url, %reset, "restarted from its disk through the BMC");
            Ok(reset)
        })
    }

    fn end_agent_boot<'a>(&'a self, provider_id: &'a str) -> Fut<'a, bool> {
        Box::pin(async move {
            let (host, bmc) = self.with_bmc(provider_id, "its boot ended").await?;
            let via = host.boot.unwrap_or(BootMethod::VirtualMedia);
            self.bmcs
                .end_agent_boot(&host.id, &bmc, via, host.firmware.unwrap_or_default())
                .await
                .map_err(ProviderError::from)
        })
    }

    fn reboot<'a>(&'a self, provider_id: &'a str) -> Fut<'a, ()> {
        Box::pin(async move {
            let (host, bmc) = self.host_with_bmc(provider_id, "rebooted").await?;
            let how = self.bmcs.reboot(&host.id, &bmc).await?;
            tracing::info!(host = %host.id, bmc = %bmc.url, reset = %how, "reboot accepted by the BMC");
            Ok(())
        })
    }

    fn set_power<'a>(&'a self, provider_id: &'a str, on: bool) -> Fut<'a, String> {
        Box::pin(async move {
            let (host, bmc) = self
                .host_with_bmc(provider_id, "switched on or off")
                .await?;
            self.bmcs
                .set_power(&host.id, &bmc, on)
                .await
                .map_err(ProviderError::from)
        })
    }
}

impl Inventory {
    /// The host and its BMC now; the error says it cannot be `done`
    /// without one.
    async fn host_with_bmc(
        &self,
        provider_id: &str,
        done: &str,
    ) -> Result<(InventoryMachine, BmcConfig), ProviderError> {
        let host = self.host_now(provider_id).await.ok_or_else(|| {
            ProviderError::Inventory(format!("host {provider_id} is no longer in the inventory"))
        })?;
        match host.bmc.clone() {
            Some(bmc) => Ok((host, bmc)),
            None => Err(ProviderError::Unsupported(format!(
                "host {provider_id} has no BMC in the inventory: it cannot be {done}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_syntax_error_names_the_line_and_keeps_the_hosts_read_before() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("inventory.toml");
        std::fs::write(&f, "[[machines]]\nid = \"a\"\naddress = \"192.0.2.1\"\n").unwrap();
        let inv = Inventory::new(
            &InventoryConfig {
                machines: vec![],
                file: Some(f.clone()),
            },
            &RedfishConfig::default(),
            &IpmiConfig::default(),
            None,
        );
        assert_eq!(inv.hosts().len(), 1);
        std::fs::write(&f, "[[machines]]\nid = \"a\"\naddress = 192.0.2.1\n").unwrap();
        let e = read_file(&f).unwrap_err();
        let e = e.to_string();
        assert!(e.contains(":3:") || e.contains("line 3:"), "{e}");
        // The hosts read before stay; the problem is reported (once).
        assert_eq!(inv.hosts().len(), 1);
        assert_eq!(inv.reported.borrow().len(), 1);
        assert_eq!(inv.hosts().len(), 1);
        assert_eq!(inv.reported.borrow().len(), 1);
    }
}
