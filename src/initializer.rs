//! The Initializer: starts the agent on every provided machine that needs
//! it. A [`LeaseLoop`]: the selector is "needs agent start", the work is
//! the takeover over SSH; it ends finished with `machine_agent_started`
//! (and, on first contact, the host key), or failed with a cause naming
//! the step (and the host key it was shown).

use std::net::IpAddr;
use std::rc::Rc;

use futures::future::LocalBoxFuture;
use uuid::Uuid;

use crate::bmdb::selectors::{self, ProvidedMachine};
use crate::bmdb::{BmdbError, Process, Provider, Tx, Work, machines};
use crate::control::{LeaseLoop, Outcome, Record, WorkOutcome, Worker};
use crate::provider::ProviderError;
use crate::ssh::HostKeyPolicy;
use crate::takeover::{TakenOver, TakeoverSettings, parse_host_key, record_agent, take_over};

/// Asks the provider for a machine's address when the BMDB has none.
pub type AddressLookup =
    Rc<dyn Fn(ProvidedMachine) -> LocalBoxFuture<'static, Result<Option<IpAddr>, ProviderError>>>;

pub type InitializerWorker = Worker<Initializer>;

/// The Initializer control loop.
pub struct Initializer {
    provider: Provider,
    takeover: Rc<TakeoverSettings>,
    address_lookup: Option<AddressLookup>,
}

impl Initializer {
    pub fn new(
        provider: Provider,
        takeover: Rc<TakeoverSettings>,
        address_lookup: Option<AddressLookup>,
    ) -> Self {
        Initializer {
            provider,
            takeover,
            address_lookup,
        }
    }
}

/// What a takeover writes when its lease ends.
#[derive(Debug)]
pub enum Takeover {
    /// The agent started: its key and endpoint, the host key on first
    /// contact, and the address it was reached at (remembered when the
    /// provider had to be asked for it).
    Started {
        taken: TakenOver,
        record_host_key: bool,
        looked_up: bool,
        address: IpAddr,
        endpoint: String,
    },
    /// It failed; the host key presented on first contact, if any, is
    /// remembered (under `accept-new`).
    Failed { host_key: Option<String> },
}

impl Record for Takeover {
    async fn write(&self, tx: &mut Tx<'_>, mid: Uuid) -> Result<(), BmdbError> {
        match self {
            Takeover::Started {
                taken,
                record_host_key,
                looked_up,
                address,
                endpoint,
            } => {
                record_agent(tx, mid, taken, endpoint, *record_host_key).await?;
                if *looked_up {
                    machines::set_address(tx, mid, &address.to_string()).await?;
                }
                Ok(())
            }
            Takeover::Failed { host_key: Some(k) } => machines::record_host_key(tx, mid, k).await,
            Takeover::Failed { host_key: None } => Ok(()),
        }
    }
}

/// A machine to take over, with the SSH host key recorded for it (read
/// with its lease).
pub struct Candidate {
    pub machine: ProvidedMachine,
    pub host_key: Option<String>,
}

impl LeaseLoop for Initializer {
    type Pick = ProvidedMachine;
    type Item = Candidate;
    type Record = Takeover;
    const WORK: &'static str = "takeover";

    const PROCESS: Process = Process::ShepherdAgentStart;

    async fn select(&self, tx: &mut Tx<'_>) -> Result<Option<(Uuid, ProvidedMachine)>, BmdbError> {
        let mut m = selectors::needs_agent_start(tx, self.provider, 1).await?;
        Ok(m.pop().map(|m| (m.machine_id, m)))
    }

    /// The recorded host key, read with the lease (under the policy that
    /// records one).
    async fn prepare(
        &self,
        tx: &mut Tx<'_>,
        machine_id: Uuid,
        machine: ProvidedMachine,
    ) -> Result<Candidate, BmdbError> {
        let host_key = match self.takeover.ssh.host_keys {
            HostKeyPolicy::AcceptNew => machines::host_key(tx, machine_id).await?,
            _ => None,
        };
        Ok(Candidate { machine, host_key })
    }

    fn span(&self, machine_id: Uuid, c: &Candidate) -> tracing::Span {
        tracing::info_span!("takeover", %machine_id, provider_id = %c.machine.provider_id)
    }

    async fn work(&self, work: &Work<Candidate>) -> Outcome<Takeover> {
        let failed = |cause: String| Outcome::Failed {
            cause,
            record: Takeover::Failed { host_key: None },
        };
        let machine = &work.item().machine;
        let mid = machine.machine_id;
        let policy = self.takeover.ssh.host_keys;
        let known = work.item().host_key.clone();
        let known_key = match parse_host_key(known.as_deref()) {
            Ok(k) => k,
            Err(cause) => return failed(cause.to_string()),
        };

        // The address: from the BMDB, else from the provider (and remembered).
        let (address, looked_up) = match machine.address() {
            Some(a) => (a, false),
            None => match &self.address_lookup {
                None => return failed("the machine has no address".into()),
                Some(lookup) => match lookup(machine.clone()).await {
                    Ok(Some(a)) => (a, true),
                    Ok(None) => {
                        return failed("the provider has no address for the machine".into());
                    }
                    // The provider's API away is not the machine's fault:
                    // the lease goes back, no backoff.
                    Err(e) if e.is_transient() => {
                        return Outcome::GiveBack(format!(
                            "asking the provider for the address: {e}"
                        ));
                    }
                    Err(e) => return failed(format!("asking the provider for the address: {e}")),
                },
            },
        };

        // One line per machine at info: its outcome (a fleet of thousands
        // would drown an operator in steps).
        tracing::debug!(%address, "taking over");
        match take_over(&self.takeover, mid, address, known_key).await {
            Err(f) => Outcome::Failed {
                cause: f.cause,
                record: Takeover::Failed {
                    host_key: f
                        .host_key
                        .filter(|_| known.is_none() && policy == HostKeyPolicy::AcceptNew),
                },
            },
            Ok(taken) => {
                for w in &taken.warnings {
                    tracing::warn!(warning = %w, "agent warning");
                }
                Outcome::Finished(Takeover::Started {
                    taken,
                    record_host_key: known.is_none() && policy == HostKeyPolicy::AcceptNew,
                    looked_up,
                    address,
                    endpoint: self.takeover.endpoint.clone(),
                })
            }
        }
    }

    fn ended(&self, record: &Takeover, outcome: &WorkOutcome) {
        let Takeover::Started { taken, address, .. } = record else {
            return;
        };
        let agent_key = hex(&taken.agent_key);
        match outcome {
            WorkOutcome::Finished => tracing::info!(%address, %agent_key, "agent started"),
            WorkOutcome::Aborted => {
                tracing::warn!(%agent_key, "the agent started, but the session ended before it was recorded; the machine will be taken over again")
            }
            WorkOutcome::Failed(cause) | WorkOutcome::Canceled(cause) => {
                tracing::error!(%agent_key, %cause, "the agent started, but recording it failed")
            }
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
