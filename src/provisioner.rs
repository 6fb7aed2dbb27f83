//! The Provisioner: on a timer, brings the provider's machines into the
//! BMDB and turns capacity into machines, up to the limits.
//!
//! Each round lists the provider and the BMDB concurrently, then:
//! - a machine of ours the BMDB does not know (a crash between creating a
//!   device and recording it, or a host added to the inventory) is adopted:
//!   recorded with its address, location, reservation and status;
//! - a machine the BMDB has but the provider does not is reported (log and
//!   status), never deleted;
//! - below `max_machines`, up to `chunk_size` machines are created from
//!   capacity, `creation_interval` apart, each recorded as soon as it exists
//!   (a fleet at its limit lists no capacity).
//!
//! Where the reference refused all work on any disagreement, this keeps
//! doing what is safe and reports the rest.

use std::collections::{BTreeSet, HashSet};

use rand::seq::SliceRandom;

use crate::bmdb::duty::Duty;
use crate::bmdb::machines::{self, NewProvidedMachine};
use crate::bmdb::{BmdbError, Session};
use crate::config::ProvisionerConfig;
use crate::control::{Pace, Round};
use crate::provider::{MachineKind, ProviderMachine, RoundError, SharedProvider};

/// What the Provisioner's rounds added up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProvisionerCounters {
    pub created: u64,
    pub failed_creations: u64,
    pub adopted: u64,
    /// Provider IDs in the BMDB that the provider no longer lists.
    pub missing_in_provider: BTreeSet<String>,
    /// Machines in both.
    pub managed: usize,
}

/// The Provisioner's round, on the round runner: a fleet duty, run as
/// soon as a session starts.
pub struct Provisioner {
    provider: SharedProvider,
    cfg: ProvisionerConfig,
}

impl Provisioner {
    pub fn new(provider: SharedProvider, cfg: ProvisionerConfig) -> Self {
        Provisioner { provider, cfg }
    }
}

impl Round for Provisioner {
    type Outcome = RoundOutcome;
    type Counters = ProvisionerCounters;
    type Error = RoundError;
    const NAME: &'static str = "provisioner";
    const DUTY: Option<Duty> = Some(Duty::Provisioning);
    const AT_SESSION: bool = true;

    fn interval(&self) -> std::time::Duration {
        self.cfg.interval
    }

    async fn round(
        &self,
        session: &Session,
        counters: &ProvisionerCounters,
    ) -> Result<RoundOutcome, RoundError> {
        // At its limit the fleet lists no capacity: a round of a full
        // fleet of 100,000 listed a hundred pages of reservations for none.
        let capacity =
            self.cfg.max_machines == 0 || counters.managed < self.cfg.max_machines as usize;
        reconcile(
            self.provider.clone(),
            session.clone(),
            self.cfg.clone(),
            counters.missing_in_provider.clone(),
            capacity,
        )
        .await
    }

    fn tally(&self, c: &mut ProvisionerCounters, o: RoundOutcome) {
        c.created += o.created;
        c.failed_creations += o.failed_creations;
        c.adopted += o.adopted;
        c.missing_in_provider = o.missing;
        c.managed = o.managed;
    }
}

pub struct RoundOutcome {
    created: u64,
    failed_creations: u64,
    adopted: u64,
    missing: BTreeSet<String>,
    managed: usize,
}

fn record(kind: crate::bmdb::Provider, m: &ProviderMachine) -> NewProvidedMachine {
    NewProvidedMachine {
        provider: kind,
        provider_id: m.provider_id.clone(),
        reservation_id: m.reservation_id.clone(),
        ip_address: m.address.map(|a| a.to_string()),
        location: m.location.clone(),
        status: Some(m.status),
    }
}

/// Records `m`; false if it is recorded already (another shepherd did).
async fn insert(
    session: &Session,
    kind: crate::bmdb::Provider,
    m: &ProviderMachine,
) -> Result<bool, BmdbError> {
    let new = record(kind, m);
    let bmc_boot = [m.provider_id.clone()];
    match session
        .transact(async |tx| {
            machines::create_provided(tx, &new).await?;
            // Tagged in the same transaction: a machine reached only
            // through its BMC is never offered to the SSH takeover.
            if m.boots_from_bmc {
                crate::bmdb::bmc_boot::set_bmc_boot_of(tx, kind, &bmc_boot).await?;
            }
            if !m.boot_macs.is_empty() {
                let macs = [(m.provider_id.clone(), m.boot_macs.clone())];
                crate::bmdb::netboot::add_boot_macs(tx, kind, &macs).await?;
            }
            if !m.ports.is_empty() {
                let cabled: Vec<crate::bmdb::switches::Declared> = m
                    .ports
                    .iter()
                    .map(|p| crate::bmdb::switches::Declared::of(&m.provider_id, p))
                    .collect();
                crate::bmdb::switches::cable(tx, &cabled).await?;
            }
            Ok(())
        })
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.is_unique_violation() => Ok(false),
        Err(e) => Err(e),
    }
}

async fn reconcile(
    provider: SharedProvider,
    session: Session,
    cfg: ProvisionerConfig,
    known_missing: BTreeSet<String>,
    capacity: bool,
) -> Result<RoundOutcome, RoundError> {
    let kind = provider.kind();
    let crate::provider::Listings {
        listed,
        recorded,
        held,
    } = crate::provider::listings(provider.as_ref(), &session, capacity).await?;
    let in_bmdb: HashSet<&str> = recorded.iter().map(|m| m.provider_id.as_str()).collect();
    let ours: Vec<&ProviderMachine> = listed
        .iter()
        .filter(|m| m.kind == MachineKind::Ours)
        .collect();
    let ours_ids: HashSet<&str> = ours.iter().map(|m| m.provider_id.as_str()).collect();
    let mut capacity: Vec<&ProviderMachine> = listed
        .iter()
        .filter(|m| m.kind == MachineKind::Capacity)
        .collect();
    // In a random order: shepherds sharing a project then rarely reach for
    // the same free reservation at once (in one order, one of two lost
    // nearly every race).
    capacity.shuffle(&mut rand::rng());

    // In the BMDB, gone from the provider: report, keep. A held machine is
    // the operator's (maintenance, a move): not reported.
    let missing: BTreeSet<String> = recorded
        .iter()
        .filter(|m| !ours_ids.contains(m.provider_id.as_str()) && !held.contains(&m.machine_id))
        .map(|m| m.provider_id.clone())
        .collect();
    for id in missing.difference(&known_missing) {
        tracing::warn!(provider_id = %id, "machine is in the BMDB but the provider no longer lists it; leaving it be");
    }
    for id in known_missing.difference(&missing) {
        tracing::info!(provider_id = %id, "machine is listed by the provider again");
    }

    // Ours, unknown to the BMDB: adopt.
    let mut out = RoundOutcome {
        created: 0,
        failed_creations: 0,
        adopted: 0,
        missing,
        managed: 0,
    };
    for m in ours
        .iter()
        .filter(|m| !in_bmdb.contains(m.provider_id.as_str()))
    {
        match insert(&session, kind, m).await {
            Ok(true) => {
                out.adopted += 1;
                tracing::info!(provider_id = %m.provider_id, "adopted a machine the BMDB did not know");
            }
            Ok(false) => {}
            Err(e) => return Err(RoundError::bmdb(format!("adopting {}", m.provider_id))(e)),
        }
    }
    // Which machines boot through their BMC, as the listing says now.
    let bmc_boot: Vec<String> = ours
        .iter()
        .filter(|m| m.boots_from_bmc)
        .map(|m| m.provider_id.clone())
        .collect();
    let network: Vec<(String, Vec<crate::mac::MacAddr>)> = ours
        .iter()
        .filter(|m| m.boots_from_bmc && !m.boot_macs.is_empty())
        .map(|m| (m.provider_id.clone(), m.boot_macs.clone()))
        .collect();
    let (tagged, untagged, macs) = session
        .transact(async |tx| {
            let (tagged, untagged) =
                crate::bmdb::bmc_boot::set_bmc_boot(tx, kind, &bmc_boot).await?;
            let macs = crate::bmdb::netboot::set_boot_macs(tx, kind, &network).await?;
            Ok((tagged, untagged, macs))
        })
        .await
        .map_err(RoundError::bmdb(
            "recording which machines boot through their BMC",
        ))?;
    if macs > 0 {
        tracing::info!(
            changed = macs,
            "machines booted from the network (boot = \"network\"), or their MACs, changed"
        );
    }
    if tagged + untagged > 0 {
        tracing::info!(
            tagged,
            untagged,
            "machines booted through their BMC (boot = \"virtual-media\") changed"
        );
    }
    let managed = ours
        .iter()
        .filter(|m| in_bmdb.contains(m.provider_id.as_str()))
        .count()
        + out.adopted as usize;
    out.managed = managed;

    // Capacity, up to the limits.
    let room = match cfg.max_machines {
        0 => usize::MAX,
        max => (max as usize).saturating_sub(managed),
    };
    let n = room.min(cfg.chunk_size as usize).min(capacity.len());
    if n == 0 {
        return Ok(out);
    }
    tracing::info!(
        creating = n,
        managed,
        capacity = capacity.len(),
        "bringing up machines"
    );
    let started = std::time::Instant::now();
    let mut failed_in_a_row = 0;
    let mut pace = Pace::new(&session, cfg.creation_interval);
    for c in capacity.into_iter().take(n) {
        pace.next()
            .await
            .map_err(RoundError::bmdb("creating machines"))?;
        match provider.create_machine(c).await {
            Ok(m) => {
                failed_in_a_row = 0;
                insert(&session, kind, &m)
                    .await
                    .map_err(RoundError::bmdb(format!(
                        "recording new machine {}",
                        m.provider_id
                    )))?;
                out.created += 1;
                out.managed += 1;
                // The round's summary is the info line: one per machine
                // comes with its takeover.
                tracing::debug!(provider_id = %m.provider_id, reservation = m.reservation_id.as_deref().unwrap_or("none"), "created a machine");
            }
            Err(e) => {
                out.failed_creations += 1;
                failed_in_a_row += 1;
                tracing::warn!(capacity = %c.provider_id, error = %e, "could not create a machine");
                // The provider is failing, not one reservation: keep the
                // API budget and the log for the next round.
                if failed_in_a_row >= CREATE_FAILURES_PER_ROUND {
                    tracing::warn!(
                        created = out.created,
                        "{failed_in_a_row} creations failed in a row; ending the round"
                    );
                    break;
                }
            }
        }
    }
    if out.created > 0 {
        tracing::info!(
            created = out.created,
            failed = out.failed_creations,
            seconds = format_args!("{:.1}", started.elapsed().as_secs_f64()),
            "created {} machines",
            out.created
        );
    }
    Ok(out)
}

/// Creations failing one after another that end a round.
const CREATE_FAILURES_PER_ROUND: u32 = 3;
