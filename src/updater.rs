//! The Updater: on a timer, refreshes what the BMDB knows from the provider
//! (status, address, location, reservation) for every provided machine,
//! from one paginated list call per round (the reference made one GET per
//! machine), writing only the rows that changed. A machine the provider no
//! longer lists gets the status `Missing`; nothing is deleted. Machines
//! with a BMC (inventory hosts) have it read first: its power state is
//! their status, and its facts go to `machine_bmc_facts`, again only when
//! they changed. A Redfish BMC's firmware is read when due
//! (`updater.firmware_interval`, or its system's BIOS version changed) into
//! `machine_firmware`, each new version into its history.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use uuid::Uuid;

use crate::bmdb::duty::Duty;
use crate::bmdb::firmware;
use crate::bmdb::machines::{self, BmcFacts};
use crate::bmdb::selectors::ProvidedMachine;
use crate::bmdb::{ProviderStatus, Session};
use crate::control::Round;
use crate::provider::{BmcRead, MachineKind, ProviderMachine, RoundError, SharedProvider};

/// What the Updater's rounds added up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpdaterCounters {
    /// Rows written, over all rounds.
    pub updated: u64,
}

/// The Updater's round, on the round runner: a fleet duty.
pub struct Updater {
    provider: SharedProvider,
    interval: Duration,
    firmware_interval: Duration,
}

impl Updater {
    pub fn new(provider: SharedProvider, cfg: &crate::config::UpdaterConfig) -> Self {
        Updater {
            provider,
            interval: cfg.interval,
            firmware_interval: cfg.firmware_interval,
        }
    }
}

impl Round for Updater {
    type Outcome = u64;
    type Counters = UpdaterCounters;
    type Error = RoundError;
    const NAME: &'static str = "updater";
    const DUTY: Option<Duty> = Some(Duty::ProviderUpdates);

    fn interval(&self) -> Duration {
        self.interval
    }

    async fn round(&self, session: &Session, _: &UpdaterCounters) -> Result<u64, RoundError> {
        update(
            self.provider.clone(),
            session.clone(),
            self.firmware_interval,
        )
        .await
    }

    fn tally(&self, c: &mut UpdaterCounters, written: u64) {
        c.updated += written;
    }
}

/// The row `recorded` should become given what the provider lists.
fn refreshed(recorded: &ProvidedMachine, listed: Option<&ProviderMachine>) -> ProvidedMachine {
    let mut m = recorded.clone();
    match listed {
        Some(l) => {
            m.ip_address = l.address.map(|a| a.to_string()).or(m.ip_address);
            m.location = l.location.clone().or(m.location);
            m.reservation_id = l.reservation_id.clone().or(m.reservation_id);
            m.status = Some(l.status);
        }
        None => m.status = Some(ProviderStatus::Missing),
    }
    m
}

/// The row a BMC read becomes.
fn facts(read: &BmcRead) -> BmcFacts {
    match &read.system {
        Ok(s) => BmcFacts {
            bmc_url: read.bmc_url.clone(),
            system_path: Some(s.path.clone()).filter(|p| !p.is_empty()),
            system: s.facts.clone(),
            read_error: None,
            changed_at: None,
        },
        Err(e) => BmcFacts {
            bmc_url: read.bmc_url.clone(),
            read_error: Some(e.clone()),
            ..BmcFacts::default()
        },
    }
}

async fn update(
    provider: SharedProvider,
    session: Session,
    firmware_every: Duration,
) -> Result<u64, RoundError> {
    // BMCs first: their power states are the listing's statuses.
    let reads = provider
        .bmc_facts()
        .await
        .map_err(RoundError::provider("reading BMCs"))?;
    let crate::provider::Listings {
        listed,
        mut recorded,
        held,
    } = crate::provider::listings(provider.as_ref(), &session, false).await?;
    // A held machine's record stays as the operator left it.
    recorded.retain(|r| !held.contains(&r.machine_id));
    let mut written = 0;
    if !reads.is_empty() {
        let ids: HashMap<&str, uuid::Uuid> = recorded
            .iter()
            .map(|r| (r.provider_id.as_str(), r.machine_id))
            .collect();
        let read_by_id: HashMap<uuid::Uuid, &BmcRead> = reads
            .iter()
            .filter_map(|r| Some((*ids.get(r.provider_id.as_str())?, r)))
            .collect();
        let rows: Vec<(uuid::Uuid, BmcFacts)> =
            read_by_id.iter().map(|(id, r)| (*id, facts(r))).collect();
        let changed = session
            .transact(async |tx| machines::write_bmc_facts(tx, &rows).await)
            .await
            .map_err(RoundError::bmdb("writing BMC facts"))?;
        for id in &changed {
            let read = read_by_id[id];
            match &read.system {
                Ok(s) => tracing::info!(machine_id = %id, provider_id = %read.provider_id,
                    power = %s.power(), health = s.facts.health.as_deref().unwrap_or("unknown"), "BMC facts changed"),
                Err(e) => {
                    tracing::warn!(machine_id = %id, provider_id = %read.provider_id, error = %e, "reading the BMC failed")
                }
            }
        }
        written += changed.len() as u64;
        // Accepted machines whose BMC is read now: their erasure asked.
        let erasures = session
            .transact(async |tx| crate::bmdb::installations::erase_accepted(tx).await)
            .await
            .map_err(RoundError::bmdb("asking accepted machines' erasures"))?;
        for e in erasures.iter().filter(|e| e.asked.is_ok() || e.new) {
            match &e.asked {
                Ok(g) => tracing::info!(machine_id = %e.machine_id, generation = g,
                    "accepted machine: its BMC read, its disks' erasure asked before it is available"),
                Err(why) => tracing::warn!(machine_id = %e.machine_id, %why,
                    "accepted machine: its disks' erasure cannot be asked yet"),
            }
        }
        // The firmware reads that are due: their failure is logged, and the
        // round's other work goes on.
        match read_firmware(&provider, &session, &read_by_id, firmware_every).await {
            Ok(n) => written += n,
            Err(e) => tracing::warn!(error = %e, "the firmware reads due failed this round"),
        }
    }
    let by_id: HashMap<&str, &ProviderMachine> = listed
        .iter()
        .filter(|m| m.kind == MachineKind::Ours)
        .map(|m| (m.provider_id.as_str(), m))
        .collect();
    let changed: Vec<ProvidedMachine> = recorded
        .iter()
        .map(|r| (r, refreshed(r, by_id.get(r.provider_id.as_str()).copied())))
        .filter(|(r, new)| *r != new)
        .map(|(_, new)| new)
        .collect();
    if changed.is_empty() {
        return Ok(written);
    }
    session
        .transact(async |tx| machines::update_provided(tx, &changed).await)
        .await
        .map_err(RoundError::bmdb(format!(
            "writing {} changed machines",
            changed.len()
        )))?;
    // A machine coming up is routine (its takeover logs it); anything else
    // is worth a line of its own.
    let before: HashMap<uuid::Uuid, &ProvidedMachine> =
        recorded.iter().map(|r| (r.machine_id, r)).collect();
    let mut statuses: std::collections::BTreeMap<String, usize> = Default::default();
    for m in &changed {
        let status = m
            .status
            .map(|s| s.to_string())
            .unwrap_or_else(|| "unknown".into());
        *statuses.entry(status.clone()).or_default() += 1;
        let was = before.get(&m.machine_id);
        let routine = matches!(
            m.status,
            Some(ProviderStatus::Provisioning | ProviderStatus::Running)
        ) && was
            .is_none_or(|w| w.ip_address.is_none() || w.ip_address == m.ip_address);
        if routine {
            tracing::debug!(machine_id = %m.machine_id, provider_id = %m.provider_id, %status,
                address = m.ip_address.as_deref().unwrap_or("none"), "provider record updated");
        } else {
            tracing::info!(machine_id = %m.machine_id, provider_id = %m.provider_id, %status,
                address = m.ip_address.as_deref().unwrap_or("none"), "provider record updated");
        }
    }
    tracing::info!(
        updated = changed.len(),
        "updated {} provider records: {}",
        changed.len(),
        statuses
            .iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(written + changed.len() as u64)
}

/// The most machines whose firmware one round reads: a fleet's first
/// round (every machine due) is spread over several.
const FIRMWARE_READS_PER_ROUND: usize = 100;

/// Reads the firmware of the machines whose Redfish BMC answered this
/// round and whose firmware read is due (none yet, one older than `every`,
/// or a system BIOS version other than the one recorded), and records it.
/// Ok(the versions seen for the first time).
async fn read_firmware(
    provider: &SharedProvider,
    session: &Session,
    reads: &HashMap<Uuid, &BmcRead>,
    every: Duration,
) -> Result<u64, RoundError> {
    let answered: HashMap<Uuid, (&str, Option<&String>)> = reads
        .iter()
        .filter(|(_, r)| !r.bmc_url.starts_with("ipmi://"))
        .filter_map(|(id, r)| {
            let s = r.system.as_ref().ok()?;
            Some((*id, (r.provider_id.as_str(), s.facts.bios_version.as_ref())))
        })
        .collect();
    if answered.is_empty() {
        return Ok(0);
    }
    let ids: Vec<Uuid> = answered.keys().copied().collect();
    let last = session
        .transact(async |tx| firmware::last_reads(tx, &ids).await)
        .await
        .map_err(RoundError::bmdb("reading when firmware was read"))?;
    let now = SystemTime::now();
    // Never read first, then the changed BIOS versions, then the oldest
    // reads; at most FIRMWARE_READS_PER_ROUND (the rest next round).
    let mut due: Vec<(Option<SystemTime>, Uuid, &str)> = answered
        .iter()
        .filter_map(|(id, (pid, bios))| match last.get(id) {
            None => Some((None, *id, *pid)),
            Some((_, recorded)) if recorded.as_ref() != *bios => Some((None, *id, *pid)),
            Some((at, _)) if now.duration_since(*at).is_ok_and(|d| d >= every) => {
                Some((Some(*at), *id, *pid))
            }
            Some(_) => None,
        })
        .collect();
    due.sort();
    due.truncate(FIRMWARE_READS_PER_ROUND);
    let due: HashMap<String, Uuid> = due
        .into_iter()
        .map(|(_, id, pid)| (pid.to_string(), id))
        .collect();
    if due.is_empty() {
        return Ok(0);
    }
    let pids: Vec<String> = due.keys().cloned().collect();
    let read = provider
        .bmc_firmware(&pids)
        .await
        .map_err(RoundError::provider("reading firmware"))?;
    let seen = session
        .transact(async |tx| {
            let mut all = Vec::new();
            for r in &read {
                let id = due[&r.provider_id];
                all.push((id, r, firmware::record(tx, id, &r.firmware).await?));
            }
            Ok(all)
        })
        .await
        .map_err(RoundError::bmdb("writing firmware"))?;
    let mut count = 0;
    for (id, r, versions) in seen {
        match &r.firmware {
            Err(e) => {
                tracing::warn!(machine_id = %id, provider_id = %r.provider_id, error = %e, "reading the BMC's firmware failed")
            }
            Ok(read) if !read.partial.is_empty() => {
                tracing::warn!(machine_id = %id, provider_id = %r.provider_id, left_out = %read.partial.join("; "),
                    "the BMC's firmware read in part")
            }
            Ok(_) => {}
        }
        for v in versions {
            tracing::info!(machine_id = %id, provider_id = %r.provider_id, component = %v.component,
                previous = v.previous.as_deref().unwrap_or("none"), version = %v.version, "firmware version seen");
            count += 1;
        }
    }
    Ok(count)
}
