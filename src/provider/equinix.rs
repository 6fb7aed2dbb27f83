//! Equinix Metal as a provider: devices whose hostname carries the
//! configured prefix are ours; free hardware reservations (provisionable,
//! no device, not penalized) are capacity. The reservation list is cached
//! for `reservation_cache_ttl`; a reservation that failed to provision is
//! left alone for `failed_reservation_penalty`. shepherd's SSH key is
//! ensured in the project at start and given to every device created.
//!
//! The device listing is shared: one listing (one paginated call) serves
//! every caller within `listing_ttl` (the Provisioner's and the Updater's
//! rounds alike), callers arriving while it is in flight wait for the same
//! one, and a device created meanwhile is added to it (as its reservation
//! is marked taken in the reservation listing), so that neither is stale
//! about what shepherd did itself.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{LocalBoxFuture, Shared};

use super::{Fut, MachineKind, Provider, ProviderError, ProviderMachine};
use crate::bmdb::{Provider as ProviderKind, ProviderStatus};
use crate::config::EquinixProviderConfig;
use crate::equinix::model::{Device, DeviceCreateRequest, DeviceState, HardwareReservation};
use crate::equinix::{EquinixApi, EquinixError};

pub struct Equinix {
    api: EquinixApi,
    cfg: EquinixProviderConfig,
    ssh_key_id: String,
    /// One actor's state (`Rc<dyn Provider>` lives on one arbiter).
    reservations: Listing<Reservation>,
    penalized: RefCell<HashMap<String, Instant>>,
    listing_ttl: Duration,
    /// Our devices as machines: a fleet's listing is kept in the few
    /// fields shepherd reads, not as the API's full device objects.
    devices: Listing<ProviderMachine>,
}

type Fetch<T> = Shared<LocalBoxFuture<'static, Result<Rc<Listed<T>>, EquinixError>>>;

/// What a listing's items are found by: a reservation's or a device's ID.
trait Identified {
    fn id(&self) -> &str;
}

/// A hardware reservation in the few fields a create reads: a fleet's
/// listing is kept so, not as the API's objects (ten strings each; 100,000
/// of those held some 70 MB for as long as the listing lived).
#[derive(Debug, Clone)]
struct Reservation {
    id: String,
    provisionable: bool,
    /// A device occupies it (included or referenced).
    occupied: bool,
    /// Its plan's slug (or name).
    plan: Option<String>,
    /// Its facility's code.
    location: Option<String>,
}

impl From<HardwareReservation> for Reservation {
    fn from(r: HardwareReservation) -> Self {
        Reservation {
            occupied: r.is_occupied(),
            provisionable: r.provisionable,
            plan: r.plan.and_then(|p| p.slug.or(p.name)),
            location: r.facility.map(|f| f.code),
            id: r.id,
        }
    }
}

impl Identified for Reservation {
    fn id(&self) -> &str {
        &self.id
    }
}

impl Identified for ProviderMachine {
    fn id(&self) -> &str {
        &self.provider_id
    }
}

/// A listing's items, indexed by ID: a create finds its reservation and
/// records its device without a scan of the fleet (three scans per
/// create were a quarter of shepherd's CPU at 100,000 machines).
#[derive(Clone)]
struct Listed<T> {
    items: Vec<T>,
    by_id: HashMap<String, usize>,
}

impl<T: Identified> Listed<T> {
    fn new(items: Vec<T>) -> Self {
        let by_id = items
            .iter()
            .enumerate()
            .map(|(i, t)| (t.id().to_string(), i))
            .collect();
        Listed { items, by_id }
    }

    fn get(&self, id: &str) -> Option<&T> {
        self.by_id.get(id).map(|&i| &self.items[i])
    }

    fn get_mut(&mut self, id: &str) -> Option<&mut T> {
        self.by_id.get(id).map(|&i| &mut self.items[i])
    }

    /// Puts `item` in place of the one with its ID, or adds it.
    fn upsert(&mut self, item: T) {
        match self.by_id.get(item.id()) {
            Some(&i) => self.items[i] = item,
            None => {
                self.by_id.insert(item.id().to_string(), self.items.len());
                self.items.push(item);
            }
        }
    }
}

/// A listing shared by its callers: reused while fresh, and one fetch in
/// flight at a time, whose result every caller waiting gets. Callers share
/// one copy (a create looks one reservation up in a listing of thousands).
struct Listing<T> {
    cached: RefCell<Option<(Instant, Rc<Listed<T>>)>>,
    fetching: RefCell<Option<Fetch<T>>>,
}

impl<T: Identified + Clone + 'static> Listing<T> {
    fn new() -> Self {
        Listing {
            cached: RefCell::new(None),
            fetching: RefCell::new(None),
        }
    }

    async fn get(
        &self,
        ttl: Duration,
        fetch: impl FnOnce() -> LocalBoxFuture<'static, Result<Vec<T>, EquinixError>>,
    ) -> Result<Rc<Listed<T>>, EquinixError> {
        if let Some((at, list)) = self.cached.borrow().as_ref()
            && at.elapsed() < ttl
        {
            return Ok(list.clone());
        }
        let f = self
            .fetching
            .borrow_mut()
            .get_or_insert_with(|| {
                fetch()
                    .map(|r| r.map(|items| Rc::new(Listed::new(items))))
                    .boxed_local()
                    .shared()
            })
            .clone();
        let result = f.await;
        *self.fetching.borrow_mut() = None;
        if let Ok(list) = &result {
            *self.cached.borrow_mut() = Some((Instant::now(), list.clone()));
        }
        result
    }

    fn invalidate(&self) {
        *self.cached.borrow_mut() = None;
    }

    /// The cached listing whatever its age, if there is one.
    fn any(&self) -> Option<Rc<Listed<T>>> {
        self.cached.borrow().as_ref().map(|(_, list)| list.clone())
    }

    /// Changes the cached listing, if there is one (copying it only if a
    /// caller still holds it).
    fn amend(&self, f: impl FnOnce(&mut Listed<T>)) {
        if let Some((_, list)) = self.cached.borrow_mut().as_mut() {
            f(Rc::make_mut(list));
        }
    }
}

impl Equinix {
    /// Ensures shepherd's SSH key (by label) in the project, then returns
    /// the provider.
    pub async fn start(
        api: EquinixApi,
        cfg: EquinixProviderConfig,
        ssh_public_key: &str,
    ) -> Result<Equinix, EquinixError> {
        let key = api
            .ensure_ssh_key(&cfg.ssh_key_label, ssh_public_key)
            .await?;
        tracing::info!(label = %cfg.ssh_key_label, key_id = %key.id, "SSH key ensured in the Equinix project");
        Ok(Equinix {
            api,
            cfg,
            ssh_key_id: key.id,
            reservations: Listing::new(),
            penalized: RefCell::new(HashMap::new()),
            listing_ttl: Duration::ZERO,
            devices: Listing::new(),
        })
    }

    /// Shares each device listing for `ttl` (zero: every caller lists).
    pub fn with_listing_ttl(mut self, ttl: Duration) -> Self {
        self.listing_ttl = ttl;
        self
    }

    /// The project's devices: the shared listing if fresh, else the one in
    /// flight, else a new one.
    async fn devices(&self) -> Result<Rc<Listed<ProviderMachine>>, EquinixError> {
        let api = self.api.clone();
        let prefix = self.cfg.hostname_prefix.clone();
        self.devices
            .get(self.listing_ttl, move || {
                async move {
                    // Each page kept as machines as it arrives: the API's
                    // device objects of a whole fleet were most of
                    // shepherd's memory at 100,000 machines.
                    let keep =
                        move |d: Device| d.hostname.starts_with(&prefix).then(|| machine_of(&d));
                    api.list_devices_kept(std::sync::Arc::new(keep)).await
                }
                .boxed_local()
            })
            .await
    }

    /// What shepherd just created, in the shared listings.
    fn created(&self, d: &Device, reservation: &str) {
        self.devices.amend(|list| list.upsert(machine_of(d)));
        self.reservations.amend(|list| {
            if let Some(r) = list.get_mut(reservation) {
                r.occupied = true;
            }
        });
    }

    async fn reservations(&self) -> Result<Rc<Listed<Reservation>>, EquinixError> {
        let api = self.api.clone();
        self.reservations
            .get(self.cfg.reservation_cache_ttl, move || {
                async move {
                    let keep = |r: HardwareReservation| Some(Reservation::from(r));
                    api.list_reservations_kept(std::sync::Arc::new(keep)).await
                }
                .boxed_local()
            })
            .await
    }

    fn penalize(&self, reservation: &str) {
        self.penalized.borrow_mut().insert(
            reservation.to_string(),
            Instant::now() + self.cfg.failed_reservation_penalty,
        );
        // The listing is stale too.
        self.reservations.invalidate();
    }

    fn is_penalized(&self, reservation: &str) -> bool {
        let mut p = self.penalized.borrow_mut();
        match p.get(reservation) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                p.remove(reservation);
                false
            }
            None => false,
        }
    }
}

/// The BMDB's view of a device state.
pub fn status_of(state: DeviceState) -> ProviderStatus {
    match state {
        DeviceState::Queued | DeviceState::Provisioning | DeviceState::Reinstalling => {
            ProviderStatus::Provisioning
        }
        DeviceState::Active | DeviceState::PoweringOn => ProviderStatus::Running,
        DeviceState::Inactive | DeviceState::PoweringOff => ProviderStatus::Stopped,
        DeviceState::Failed => ProviderStatus::ProvisioningFailedPermanent,
        DeviceState::Deprovisioning | DeviceState::Deleted => ProviderStatus::Missing,
        DeviceState::Unknown => ProviderStatus::Unknown,
    }
}

pub fn machine_of(d: &Device) -> ProviderMachine {
    ProviderMachine {
        boots_from_bmc: false,
        boot_macs: Vec::new(),
        ports: Vec::new(),
        provider_id: d.id.clone(),
        address: d.public_address(),
        location: d.location().map(str::to_string),
        reservation_id: d.reservation_id().map(str::to_string),
        status: status_of(d.state),
        kind: MachineKind::Ours,
    }
}

impl Provider for Equinix {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Equinix
    }

    fn list_machines(&self) -> Fut<'_, Vec<ProviderMachine>> {
        Box::pin(async move {
            let mut out: Vec<ProviderMachine> = self.devices().await?.items.clone();
            for r in self.reservations().await?.items.iter() {
                if r.provisionable && !r.occupied && !self.is_penalized(&r.id) {
                    out.push(ProviderMachine {
                        boots_from_bmc: false,
                        boot_macs: Vec::new(),
                        ports: Vec::new(),
                        provider_id: r.id.clone(),
                        address: None,
                        location: r.location.clone(),
                        reservation_id: Some(r.id.clone()),
                        status: ProviderStatus::Missing,
                        kind: MachineKind::Capacity,
                    });
                }
            }
            Ok(out)
        })
    }

    fn list_ours(&self) -> Fut<'_, Vec<ProviderMachine>> {
        Box::pin(async move { Ok(self.devices().await?.items.clone()) })
    }

    fn get_machine<'a>(&'a self, provider_id: &'a str) -> Fut<'a, Option<ProviderMachine>> {
        Box::pin(async move {
            match self.api.get_device(provider_id).await {
                Ok(d) => Ok(Some(machine_of(&d))),
                Err(e) if e.is_not_found() => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
    }

    fn create_machine<'a>(&'a self, capacity: &'a ProviderMachine) -> Fut<'a, ProviderMachine> {
        Box::pin(async move {
            let reservation = capacity
                .reservation_id
                .clone()
                .unwrap_or_else(|| capacity.provider_id.clone());
            let plan = match &self.cfg.plan {
                Some(p) => p.clone(),
                None => {
                    // A reservation's plan does not change: the last
                    // listing that holds it serves, however old. Listing
                    // again per create once the listing's time to live
                    // ran out cost a whole listing (a hundred pages at
                    // 100,000 reservations) per device.
                    let known = self
                        .reservations
                        .any()
                        .and_then(|l| l.get(&reservation).cloned());
                    let found = match known {
                        Some(r) => Some(r),
                        None => self.reservations().await?.get(&reservation).cloned(),
                    };
                    match found {
                        None => {
                            return Err(ProviderError::Unsupported(format!(
                                "reservation {reservation} is no longer listed in the project \
                                 (gone since it was chosen)"
                            )));
                        }
                        Some(r) => r.plan.ok_or_else(|| {
                            ProviderError::Unsupported(format!(
                                "reservation {reservation} has no plan; set provider.equinix.plan"
                            ))
                        })?,
                    }
                }
            };
            let short: String = reservation.chars().filter(|c| *c != '-').take(12).collect();
            let mut tags = self.cfg.tags.clone();
            tags.push("shepherd".into());
            let request = DeviceCreateRequest {
                hostname: format!("{}{short}", self.cfg.hostname_prefix),
                plan,
                operating_system: self.cfg.operating_system.clone(),
                metro: self.cfg.metro.clone(),
                facility: if self.cfg.metro.is_none() {
                    self.cfg.facility.clone().map(|f| vec![f])
                } else {
                    None
                },
                hardware_reservation_id: reservation.clone(),
                project_ssh_keys: vec![self.ssh_key_id.clone()],
                tags,
            };
            match self.api.create_device(request).await {
                Ok(d) => {
                    self.created(&d, &reservation);
                    Ok(machine_of(&d))
                }
                Err(e) => {
                    self.penalize(&reservation);
                    Err(e.into())
                }
            }
        })
    }

    fn reboot<'a>(&'a self, provider_id: &'a str) -> Fut<'a, ()> {
        Box::pin(async move { Ok(self.api.reboot_device(provider_id).await?) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(id: &str, status: ProviderStatus) -> ProviderMachine {
        ProviderMachine {
            provider_id: id.into(),
            address: None,
            location: None,
            reservation_id: None,
            status,
            kind: MachineKind::Ours,
            boots_from_bmc: false,
            boot_macs: Vec::new(),
            ports: Vec::new(),
        }
    }

    #[test]
    fn a_listing_finds_replaces_and_adds_by_id() {
        let mut l = Listed::new(vec![
            machine("a", ProviderStatus::Provisioning),
            machine("b", ProviderStatus::Running),
        ]);
        assert_eq!(l.get("b").unwrap().status, ProviderStatus::Running);
        assert!(l.get("c").is_none());
        l.upsert(machine("a", ProviderStatus::Running));
        l.upsert(machine("c", ProviderStatus::Provisioning));
        assert_eq!(l.items.len(), 3, "a replaced in place, c added");
        assert_eq!(l.get("a").unwrap().status, ProviderStatus::Running);
        assert_eq!(l.get("c").unwrap().status, ProviderStatus::Provisioning);
        l.get_mut("c").unwrap().status = ProviderStatus::Stopped;
        assert_eq!(l.items[2].status, ProviderStatus::Stopped);
    }
}
