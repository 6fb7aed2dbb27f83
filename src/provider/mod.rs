//! Providers: where machines come from. Equinix Metal (devices created from
//! hardware reservations) or a static inventory of an operator's own hosts.
//!
//! A provider lists the machines that are ours and the capacity we could
//! turn into machines, creates a machine from capacity, reboots one, and
//! looks one up. The Provisioner reconciles that with the BMDB; the
//! Initializer asks it for an address the BMDB lacks; the Recoverer reboots.

pub mod bmc;
pub mod equinix;
pub mod inventory;

use std::net::IpAddr;
use std::rc::Rc;

use futures::future::LocalBoxFuture;

use crate::bmdb::{Provider as ProviderKind, ProviderStatus};

/// A machine as the provider sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderMachine {
    /// The provider's ID: a device ID, an inventory host ID, or (for
    /// capacity) a hardware reservation ID.
    pub provider_id: String,
    pub address: Option<IpAddr>,
    pub location: Option<String>,
    pub reservation_id: Option<String>,
    pub status: ProviderStatus,
    pub kind: MachineKind,
    /// Its BMC boots it into the agent (inventory `boot =
    /// "virtual-media"` or `"network"`): the BMDB's `machine_bmc_boot` tag.
    pub boots_from_bmc: bool,
    /// The provisioning NICs it boots the network from (inventory `boot =
    /// "network"`): the BMDB's `machine_boot_mac`.
    pub boot_macs: Vec<crate::mac::MacAddr>,
    /// The switch ports it is cabled to (inventory `ports`): recorded
    /// with it, so that nothing reaches it before they are moved to the
    /// provisioning network.
    pub ports: Vec<crate::config::HostPort>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineKind {
    /// A machine that is ours (a device with our prefix, an inventory host).
    Ours,
    /// Capacity: something we could create a machine from.
    Capacity,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("{0}")]
    Api(#[from] crate::equinix::EquinixError),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Inventory(String),
    /// From a host's BMC: names the host, the BMC and what it said (its
    /// kind tells an outage from a refusal, e.g. a user name and password
    /// for the boot image's URL refused).
    #[error("{0}")]
    Bmc(#[from] crate::bmc::BmcError),
}

impl ProviderError {
    /// The provider's API was away, not the machine at fault: work that
    /// needed it is given back, not failed (no backoff earned).
    pub fn is_transient(&self) -> bool {
        match self {
            ProviderError::Api(e) => e.is_transient(),
            _ => false,
        }
    }
}

impl crate::fault::Blame for ProviderError {
    /// The API or a BMC away or busy is a peer's; anything else recurs.
    fn whose(&self) -> crate::fault::Whose {
        use crate::fault::Whose;
        match self {
            ProviderError::Api(e) if e.is_transient() => Whose::Peer,
            ProviderError::Bmc(e) if e.kind.is_transient() => Whose::Peer,
            _ => Whose::Machine,
        }
    }
}

/// Why a round over the provider's listings (the Provisioner's, the
/// Updater's) stopped: what it was doing, and the provider's or the
/// BMDB's cause.
#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    #[error("{doing}: {source}")]
    Provider {
        doing: String,
        #[source]
        source: ProviderError,
    },
    #[error("{doing}: {source}")]
    Bmdb {
        doing: String,
        #[source]
        source: crate::bmdb::BmdbError,
    },
}

impl RoundError {
    /// `doing`, failed in the provider.
    pub fn provider(doing: impl Into<String>) -> impl FnOnce(ProviderError) -> RoundError {
        let doing = doing.into();
        move |source| RoundError::Provider { doing, source }
    }

    /// `doing`, failed in the BMDB.
    pub fn bmdb(doing: impl Into<String>) -> impl FnOnce(crate::bmdb::BmdbError) -> RoundError {
        let doing = doing.into();
        move |source| RoundError::Bmdb { doing, source }
    }
}

impl crate::fault::Blame for RoundError {
    fn whose(&self) -> crate::fault::Whose {
        match self {
            RoundError::Provider { source, .. } => crate::fault::Blame::whose(source),
            RoundError::Bmdb { source, .. } => crate::fault::Blame::whose(source),
        }
    }
}

type Fut<'a, T> = LocalBoxFuture<'a, Result<T, ProviderError>>;

/// Object-safe, so one `Rc<dyn Provider>` serves every actor.
pub trait Provider {
    fn kind(&self) -> ProviderKind;

    /// Ours and capacity, every one.
    fn list_machines(&self) -> Fut<'_, Vec<ProviderMachine>>;

    /// Ours only: what a refresh of the BMDB's records needs (listing the
    /// capacity too cost the Updater a hundred pages of reservations a
    /// round at 100,000).
    fn list_ours(&self) -> Fut<'_, Vec<ProviderMachine>> {
        Box::pin(async move {
            let mut all = self.list_machines().await?;
            all.retain(|m| m.kind == MachineKind::Ours);
            Ok(all)
        })
    }

    /// One of ours, or None if the provider does not know it.
    fn get_machine<'a>(&'a self, provider_id: &'a str) -> Fut<'a, Option<ProviderMachine>>;

    /// Turns capacity into one of ours.
    fn create_machine<'a>(&'a self, capacity: &'a ProviderMachine) -> Fut<'a, ProviderMachine>;

    fn reboot<'a>(&'a self, provider_id: &'a str) -> Fut<'a, ()>;

    /// Switches the machine on or off through its BMC (a tenant's
    /// `power_on`, `power_off`); Ok (how).
    fn set_power<'a>(&'a self, provider_id: &'a str, on: bool) -> Fut<'a, String> {
        let _ = on;
        Box::pin(async move {
            Err(ProviderError::Unsupported(format!(
                "machine {provider_id}: this provider cannot switch machines on or off"
            )))
        })
    }

    /// The machine's Redfish BMC, to change what is below its system
    /// (servicing); None when it has none, or speaks IPMI.
    fn redfish_bmc<'a>(
        &'a self,
        provider_id: &'a str,
    ) -> Fut<'a, Option<crate::redfish::RedfishBmc>> {
        let _ = provider_id;
        Box::pin(async move { Ok(None) })
    }

    /// Where the machine's serial console is read through its BMC; None
    /// when it has none shepherd reads.
    fn console<'a>(
        &'a self,
        provider_id: &'a str,
    ) -> Fut<'a, Option<crate::console::ConsoleSource>> {
        let _ = provider_id;
        Box::pin(async move { Ok(None) })
    }

    /// Boots the machine into the live agent through its BMC, as it is
    /// listed: from the boot image at `image_url` (virtual media) or from
    /// the provisioning network. `credentials`: a user name and password
    /// for the image's URL, given to the BMC (a
    /// [`crate::bmc::BmcErrorKind::MediaAuthRefused`] when it refuses them). Ok (how it was started) once it is on.
    fn boot_agent<'a>(
        &'a self,
        provider_id: &'a str,
        image_url: &'a str,
        credentials: Option<(String, String)>,
    ) -> Fut<'a, String> {
        let _ = (image_url, credentials);
        Box::pin(async move {
            Err(ProviderError::Unsupported(format!(
                "machine {provider_id}: this provider cannot boot machines through a BMC"
            )))
        })
    }

    /// Ends a boot into the agent: virtual media ejected and the boot
    /// override cleared (or the boot device set back to the disk), so it
    /// boots from its disk next; Ok(true) if media was inserted.
    fn end_agent_boot<'a>(&'a self, provider_id: &'a str) -> Fut<'a, bool> {
        Box::pin(async move {
            Err(ProviderError::Unsupported(format!(
                "machine {provider_id}: this provider cannot boot machines through a BMC"
            )))
        })
    }

    /// Ends any boot into the agent and restarts the machine from its
    /// disk through its BMC, Secure Boot set as `secure_boot` asks (a
    /// tenant's plan; None: as the host's configuration does); Ok (the
    /// reset used).
    fn boot_from_disk<'a>(
        &'a self,
        provider_id: &'a str,
        secure_boot: Option<bool>,
    ) -> Fut<'a, String> {
        let _ = secure_boot;
        Box::pin(async move {
            Err(ProviderError::Unsupported(format!(
                "machine {provider_id}: this provider cannot boot machines through a BMC"
            )))
        })
    }

    /// What the BMC of each machine that has one says about it, read now.
    /// Providers without BMCs have none.
    fn bmc_facts(&self) -> Fut<'_, Vec<BmcRead>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// The firmware of each of these machines whose BMC lists it, read
    /// now. Providers without BMCs have none.
    fn bmc_firmware<'a>(&'a self, _provider_ids: &'a [String]) -> Fut<'a, Vec<FirmwareRead>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// One machine's firmware, read from its BMC.
#[derive(Debug, Clone)]
pub struct FirmwareRead {
    pub provider_id: String,
    pub firmware: Result<crate::bmdb::firmware::Reading, String>,
}

/// One machine's BMC, read.
#[derive(Debug, Clone)]
pub struct BmcRead {
    pub provider_id: String,
    pub bmc_url: String,
    pub system: Result<bmc::BmcSystem, String>,
}

pub type SharedProvider = Rc<dyn Provider>;

/// What the provider lists (with its capacity when `capacity`, else ours
/// only) and what the BMDB records for it (with the machines an operator
/// holds), fetched concurrently: the start of every Provisioner and
/// Updater round.
pub async fn listings(
    provider: &dyn Provider,
    session: &crate::bmdb::Session,
    capacity: bool,
) -> Result<Listings, RoundError> {
    let kind = provider.kind();
    let listing = if capacity {
        provider.list_machines()
    } else {
        provider.list_ours()
    };
    let (listed, recorded) = futures::join!(
        listing,
        session.transact(async |tx| Ok((
            crate::bmdb::machines::provided_by(tx, kind).await?,
            crate::bmdb::actions::held_ids(tx).await?
        )))
    );
    let listed = listed.map_err(RoundError::provider("listing the provider"))?;
    let (recorded, held) = recorded.map_err(RoundError::bmdb("listing the BMDB"))?;
    Ok(Listings {
        listed,
        recorded,
        held,
    })
}

/// A round's view: the provider's machines, the BMDB's records, and which
/// of those are held (`machine_hold`: left alone).
pub struct Listings {
    pub listed: Vec<ProviderMachine>,
    pub recorded: Vec<crate::bmdb::selectors::ProvidedMachine>,
    pub held: std::collections::HashSet<uuid::Uuid>,
}

/// Begins capturing `machine_id`'s serial console for a boot shepherd
/// makes (`cause`: `enrollment`, `recovery`, …), when its BMC has one
/// shepherd reads and `consoles` is given. None otherwise: the boot goes
/// ahead without.
pub async fn capture_console(
    provider: &SharedProvider,
    consoles: Option<&crate::console::Consoles>,
    machine_id: uuid::Uuid,
    provider_id: &str,
    cause: &str,
) -> Option<crate::console::Capture> {
    let consoles = consoles?;
    match provider.console(provider_id).await {
        Ok(Some(source)) => consoles.capture(machine_id, &source, cause).await,
        Ok(None) => None,
        Err(e) => {
            tracing::debug!(%machine_id, error = %e, "no console to capture");
            None
        }
    }
}
