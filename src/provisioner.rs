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
//!   capacity, `creation_interval` apart, each recorded as soon as it exists.
//!
//! Where the reference refused all work on any disagreement, this keeps
//! doing what is safe and reports the rest.

use std::collections::{BTreeSet, HashSet};
use std::rc::Rc;

use actix::prelude::*;
use rand::seq::SliceRandom;

use crate::bmdb::duty::{Duty, Holder, Turn, note_holder, on_duty};
use crate::bmdb::machines::{self, NewProvidedMachine};
use crate::bmdb::{BmdbError, Session};
use crate::config::ProvisionerConfig;
use crate::control::SetSession;
use crate::provider::{MachineKind, ProviderMachine, SharedProvider};

/// What the Provisioner has seen and done.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProvisionerStatus {
    pub rounds: u64,
    pub failed_rounds: u64,
    pub created: u64,
    pub failed_creations: u64,
    pub adopted: u64,
    /// Provider IDs in the BMDB that the provider no longer lists.
    pub missing_in_provider: BTreeSet<String>,
    /// Machines in both.
    pub managed: usize,
    /// Who holds the fleet's provisioning duty as of the last round (None
    /// before the first).
    pub duty: Option<Holder>,
}

#[derive(Message)]
#[rtype(result = "ProvisionerStatus")]
pub struct GetProvisionerStatus;

/// Runs a round now (tests, and right after a session starts).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Reconcile;

/// Sent to whoever supervises the Provisioner when it stops.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ProvisionerStopped;

pub struct Provisioner {
    provider: SharedProvider,
    cfg: ProvisionerConfig,
    session: Option<Session>,
    in_round: bool,
    status: ProvisionerStatus,
    supervisor: Option<Recipient<ProvisionerStopped>>,
}

impl Provisioner {
    pub fn new(provider: SharedProvider, cfg: ProvisionerConfig) -> Self {
        Provisioner {
            provider,
            cfg,
            session: None,
            in_round: false,
            status: ProvisionerStatus::default(),
            supervisor: None,
        }
    }

    /// Tells `supervisor` when this actor stops.
    pub fn supervised_by(mut self, supervisor: Recipient<ProvisionerStopped>) -> Self {
        self.supervisor = Some(supervisor);
        self
    }

    fn round(&mut self, ctx: &mut Context<Self>) {
        if self.in_round {
            return;
        }
        let Some(session) = self.session.clone() else {
            return;
        };
        self.in_round = true;
        let provider = self.provider.clone();
        let cfg = self.cfg.clone();
        let known_missing = self.status.missing_in_provider.clone();
        let round = async move {
            on_duty(
                &session,
                Duty::Provisioning,
                reconcile(provider, session.clone(), cfg, known_missing),
            )
            .await
        };
        ctx.spawn(round.into_actor(self).map(|r, act, _| {
            act.in_round = false;
            match r {
                Ok(Turn::StandBy(holder)) => {
                    note_holder(Duty::Provisioning, &mut act.status.duty, Holder::Other(holder));
                }
                Ok(Turn::Done(o)) => {
                    note_holder(Duty::Provisioning, &mut act.status.duty, Holder::Us);
                    act.status.rounds += 1;
                    act.status.created += o.created;
                    act.status.failed_creations += o.failed_creations;
                    act.status.adopted += o.adopted;
                    act.status.missing_in_provider = o.missing;
                    act.status.managed = o.managed;
                }
                Err(e) => {
                    act.status.rounds += 1;
                    act.status.failed_rounds += 1;
                    tracing::warn!(error = %e, "provisioning round failed; next round in {}", humantime::format_duration(act.cfg.interval));
                }
            }
        }));
    }
}

struct RoundOutcome {
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
    match session
        .transact(async |tx| machines::create_provided(tx, &new).await)
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
) -> Result<RoundOutcome, String> {
    let kind = provider.kind();
    let crate::provider::Listings {
        listed,
        recorded,
        held,
    } = crate::provider::listings(provider.as_ref(), &session).await?;
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
            Err(e) => return Err(format!("adopting {}: {e}", m.provider_id)),
        }
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
    for (i, c) in capacity.into_iter().take(n).enumerate() {
        if i > 0 && !cfg.creation_interval.is_zero() {
            tokio::time::sleep(cfg.creation_interval).await;
        }
        if session.is_expired() {
            return Err("the session ended".into());
        }
        match provider.create_machine(c).await {
            Ok(m) => {
                failed_in_a_row = 0;
                insert(&session, kind, &m)
                    .await
                    .map_err(|e| format!("recording new machine {}: {e}", m.provider_id))?;
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

impl Actor for Provisioner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.cfg.interval, |act, ctx| act.round(ctx));
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        if let Some(s) = &self.supervisor {
            s.do_send(ProvisionerStopped);
        }
    }
}

/// Stops the Provisioner (a drain).
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopProvisioner;

impl Handler<StopProvisioner> for Provisioner {
    type Result = ();

    fn handle(&mut self, _: StopProvisioner, ctx: &mut Context<Self>) {
        self.supervisor = None;
        ctx.stop();
    }
}

impl Handler<SetSession> for Provisioner {
    type Result = ();

    fn handle(&mut self, msg: SetSession, ctx: &mut Context<Self>) {
        self.session = msg.0;
        self.round(ctx);
    }
}

impl Handler<Reconcile> for Provisioner {
    type Result = ();

    fn handle(&mut self, _: Reconcile, ctx: &mut Context<Self>) {
        self.round(ctx);
    }
}

impl Handler<GetProvisionerStatus> for Provisioner {
    type Result = MessageResult<GetProvisionerStatus>;

    fn handle(&mut self, _: GetProvisionerStatus, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.status.clone())
    }
}

/// For the Initializer: the provider's address of a machine the BMDB has
/// none for.
pub fn address_lookup(provider: SharedProvider) -> crate::initializer::AddressLookup {
    Rc::new(move |m| {
        let provider = provider.clone();
        Box::pin(async move {
            provider
                .get_machine(&m.provider_id)
                .await
                .map(|found| found.and_then(|f| f.address))
                .map_err(|e| e.to_string())
        })
    })
}
