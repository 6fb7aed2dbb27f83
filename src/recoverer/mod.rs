//! The Recoverer: brings back machines whose agent went quiet, gently
//! first. A [`LeaseLoop`] on the same lease runner as the Initializer.
//!
//! Long on purpose: the recovery ladder (reboot, then the provider's recreate
//! or the BMC's boot into the agent) and the brake that limits it are one
//! decision per machine, read in order.
//!
//! - Which machines: an operator's reboot request first, then "needs
//!   recovery": no heartbeat `silent_after_start` after the agent started,
//!   or the last one older than `heartbeat_stale_after`, and only while the
//!   agent's callback endpoint was served for that whole time
//!   (`bmdb::callback`): an agent nobody could hear is not silent.
//! - What, in order, each step tried only if the one before failed:
//!   1. **agent restarted**: over SSH, the agent is started again in place
//!      (a takeover without a reboot; the new agent stops the old one) and
//!      has `agent_restart_wait` to call;
//!   2. **rebooted**: a power cycle through the provider (the Equinix API,
//!      or the host's BMC), only if the brake (`bmdb::brake`) lets it; the
//!      agent has `agent_return_wait` to come back by itself (its systemd
//!      unit);
//!   3. **taken over again**: the agent tags are dropped so the Initializer
//!      takes the machine over.
//!
//!   An operator's reboot request skips step 1 and the brake.
//! - The history's `detail` and `shepherd_recoveries_total{step}` say which
//!   step recovered each machine.

use std::rc::Rc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use uuid::Uuid;

use crate::bmdb::bmc_boot;
use crate::bmdb::brake::{self, Judge};
use crate::bmdb::installations;
use crate::bmdb::selectors::{self, ProvidedMachine};
use crate::bmdb::{BmdbError, Process, Tx, Work};
use crate::bmdb::{actions, heartbeats};
use crate::control::{LeaseLoop, Outcome, Record, WorkOutcome, Worker};
use crate::provider::SharedProvider;
use crate::takeover::TakeoverSettings;

mod steps;
pub use steps::{AgentWaits, RebootWait};
use steps::{called_since, power_cycle, restart_agent};

/// Which step recovered a machine (or why none did), as the history, the
/// logs and `/metrics` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct StepLabel {
    pub step: Step,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelValue,
)]
#[allow(non_camel_case_types)]
pub enum Step {
    /// Its agent was restarted over SSH and called.
    agent_restarted,
    /// Power-cycled; its agent came back by itself.
    rebooted,
    /// Power-cycled; the agent tags were dropped for a new takeover.
    taken_over_again,
    /// A power action withheld by the brake.
    braked,
    /// Every step tried failed.
    failed,
    /// Its agent called an endpoint no shepherd served any more: restarted
    /// over SSH with this shepherd's endpoint (no power action).
    rehomed,
    /// Switched on or off at its tenant's request (`power_on`,
    /// `power_off`).
    powered,
    /// Rebooted at its tenant's request: its installed system runs, no
    /// agent is expected back.
    power_cycled,
}

impl Step {
    pub fn detail(self) -> &'static str {
        match self {
            Step::agent_restarted => "agent restarted over SSH; it called back (no power action)",
            Step::rebooted => "rebooted; the agent came back by itself",
            Step::taken_over_again => {
                "rebooted; the agent did not come back, so it is taken over again (through its BMC's virtual media when it boots that way)"
            }
            Step::braked => "power action withheld by the recovery brake",
            Step::failed => "recovery failed",
            Step::rehomed => {
                "agent re-homed over SSH: its callback endpoint was no longer served; it calls this shepherd now"
            }
            Step::powered => "switched on or off through its BMC at its tenant's request",
            Step::power_cycled => {
                "rebooted through its BMC at its tenant's request (its installed system runs; no agent is expected)"
            }
        }
    }
}

/// Recoveries by step, for `/metrics` (`shepherd_recoveries_total`).
#[derive(Clone, Default)]
pub struct RecoveryMetrics {
    pub steps: Family<StepLabel, Counter>,
}

impl RecoveryMetrics {
    /// Adds the series to `registry`, every step at 0 until it happens
    /// (so that rates and alerts see the series from the start).
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        for step in [
            Step::agent_restarted,
            Step::rebooted,
            Step::taken_over_again,
            Step::braked,
            Step::failed,
            Step::rehomed,
            Step::powered,
            Step::power_cycled,
        ] {
            let _ = self.steps.get_or_create(&StepLabel { step });
        }
        registry.register(
            "shepherd_recoveries",
            "Recoveries by the step that ended them: agent restarted over SSH, rebooted (agent back by itself), taken over again, braked (power action withheld), failed, rehomed (agent moved to a served endpoint)",
            self.steps.clone(),
        );
    }

    fn count(&self, step: Step) {
        self.steps.get_or_create(&StepLabel { step }).inc();
    }
}

/// The actor that recovers one leased machine: the shared worker running
/// the Recoverer's work.
pub type RecovererWorker = Worker<Recoverer>;

pub struct Recoverer {
    provider: SharedProvider,
    judge: Judge,
    wait: RebootWait,
    waits: AgentWaits,
    /// How to restart an agent over SSH (None: no endpoint, no takeovers;
    /// the gentle step is skipped).
    takeover: Option<Rc<TakeoverSettings>>,
    metrics: RecoveryMetrics,
    /// Agents whose endpoint went unserved this long are re-homed.
    rehome_after: Duration,
    /// Where a power cycle's serial console is captured (None: not read).
    consoles: Option<crate::console::Consoles>,
}

impl Recoverer {
    /// Re-homes agents whose endpoint went unserved for `after` (default:
    /// five minutes).
    pub fn rehoming_after(mut self, after: Duration) -> Self {
        self.rehome_after = after;
        self
    }

    /// Captures each power cycle's serial console with `consoles`.
    pub fn with_consoles(mut self, consoles: crate::console::Consoles) -> Self {
        self.consoles = Some(consoles);
        self
    }

    pub fn new(
        provider: SharedProvider,
        judge: Judge,
        wait: RebootWait,
        waits: AgentWaits,
        takeover: Option<Rc<TakeoverSettings>>,
        metrics: RecoveryMetrics,
    ) -> Self {
        Recoverer {
            provider,
            judge,
            wait,
            waits,
            takeover,
            metrics,
            rehome_after: Duration::from_secs(5 * 60),
            consoles: None,
        }
    }
}

/// How a recovery ended: its step, and, when the machine was installing
/// or erasing, what was interrupted (in the history's detail: "…; it was
/// erasing (generation 3): erasing, 600 MB written at …, begun again
/// from the start by its next agent").
#[derive(Debug, Clone)]
pub struct Recovered {
    pub step: Step,
    detail: String,
}

impl Recovered {
    pub fn new(step: Step, interrupted: Option<&str>) -> Recovered {
        let detail = match (interrupted, step) {
            (Some(i), Step::taken_over_again | Step::rebooted) => format!(
                "{}; it was {i}, which its next agent begins again from the start",
                step.detail()
            ),
            (Some(i), _) => format!("{}; it was {i}", step.detail()),
            (None, _) => step.detail().to_string(),
        };
        Recovered { step, detail }
    }
}

/// A recovery ends naming its step, and writes what that step means: a
/// machine taken over again loses its agent tags; a recovered one, its
/// reboot request.
impl Record for Recovered {
    fn detail(&self) -> Option<&str> {
        Some(&self.detail)
    }

    async fn write(&self, tx: &mut Tx<'_>, mid: Uuid) -> Result<(), BmdbError> {
        match self.step {
            Step::taken_over_again => {
                heartbeats::forget_agent(tx, mid).await?;
                // A machine booted through its BMC is taken back that way:
                // a boot into the live agent is asked (the Enroller's).
                bmc_boot::request_if(
                    tx,
                    mid,
                    bmc_boot::Only::BootedByBmc,
                    bmc_boot::BootCause::Recovery,
                    "shepherd",
                    Some("the agent did not come back after a reboot"),
                    false,
                )
                .await
                .map(|_| ())
            }
            Step::agent_restarted
            | Step::rebooted
            | Step::rehomed
            | Step::powered
            | Step::power_cycled => actions::drop_reboot_request(tx, mid).await,
            Step::braked | Step::failed => Ok(()),
        }
    }
}

impl LeaseLoop for Recoverer {
    type Pick = Recovery;
    type Item = Recovery;
    type Record = Recovered;
    const WORK: &'static str = "recovery";

    const PROCESS: Process = Process::ShepherdRecovery;

    async fn select(&self, tx: &mut Tx<'_>) -> Result<Option<(Uuid, Recovery)>, BmdbError> {
        let j = &self.judge;
        let (mut m, requested) = match selectors::reboot_requested(tx, j.provider, 1).await?.pop() {
            Some(m) => (Some(m), true),
            None => (
                selectors::needs_recovery(
                    tx,
                    j.provider,
                    1,
                    j.thresholds,
                    j.own_endpoint.as_deref(),
                )
                .await?
                .pop(),
                false,
            ),
        };
        if let Some(machine) = m.take() {
            return Ok(Some((
                machine.machine_id,
                Recovery {
                    machine,
                    requested,
                    rehome: None,
                    interrupted: None,
                    power: None,
                },
            )));
        }
        // Agents whose shepherd is gone with its endpoint: to this one.
        let Some(own) = self.takeover.as_ref().map(|t| t.endpoint.as_str()) else {
            return Ok(None);
        };
        let mut r = selectors::needs_rehome(tx, j.provider, 1, own, self.rehome_after).await?;
        Ok(r.pop().map(|(machine, endpoint)| {
            (
                machine.machine_id,
                Recovery {
                    machine,
                    requested: false,
                    rehome: Some(endpoint),
                    interrupted: None,
                    power: None,
                },
            )
        }))
    }

    /// Reads what the machine was installing or erasing, if anything,
    /// for the history to say what was interrupted.
    async fn prepare(
        &self,
        tx: &mut Tx<'_>,
        mid: Uuid,
        mut r: Recovery,
    ) -> Result<Recovery, BmdbError> {
        r.interrupted = installations::in_hand(tx, mid).await?;
        if r.requested {
            r.power = actions::requested_power(tx, mid).await?;
        }
        Ok(r)
    }

    fn span(&self, machine_id: Uuid, r: &Recovery) -> tracing::Span {
        tracing::info_span!("recovery", %machine_id, provider_id = %r.machine.provider_id)
    }

    async fn work(&self, work: &Work<Recovery>) -> Outcome<Recovered> {
        let interrupted = work.item().interrupted.as_deref();
        match self.recover(work).await {
            Ok(step) => Outcome::Finished(Recovered::new(step, interrupted)),
            Err(Failure { step, cause }) => Outcome::Failed {
                cause,
                record: Recovered::new(step, interrupted),
            },
        }
    }

    fn ended(&self, r: &Recovered, outcome: &WorkOutcome) {
        let step = &r.step;
        match outcome {
            WorkOutcome::Finished => {
                self.metrics.count(*step);
                tracing::info!(step = ?step, "recovered: {}", r.detail);
            }
            WorkOutcome::Failed(_) if matches!(step, Step::braked | Step::failed) => {
                self.metrics.count(*step)
            }
            _ => {}
        }
    }
}

/// A machine to recover, and why.
#[derive(Debug, Clone)]
pub struct Recovery {
    pub machine: ProvidedMachine,
    /// An operator asked for a reboot (`machine_reboot_request`); otherwise
    /// its agent went quiet.
    pub requested: bool,
    /// Its agent calls this endpoint, which no shepherd serves any more:
    /// re-home it (restart it over SSH with ours), nothing else.
    pub rehome: Option<String>,
    /// What the machine was installing or erasing when it was picked, in
    /// words (read by `prepare`).
    pub interrupted: Option<String>,
    /// A tenant's power action asked (`cycle`, `off`, `on`; read by
    /// `prepare`), instead of an operator's reboot.
    pub power: Option<String>,
}

/// Why a recovery did not end well: the step, and the cause.
struct Failure {
    step: Step,
    cause: String,
}

impl Recoverer {
    /// The steps, gentle first. Returns the step that recovered the machine.
    async fn recover(&self, work: &Work<Recovery>) -> Result<Step, Failure> {
        let shared = self;
        let recovery = work.item();
        let session = work.session();
        let mid = work.machine_id();
        let fail = |step, cause: String| Failure { step, cause };
        if let Some(unserved) = &recovery.rehome {
            // Never a power action: the machine is fine, its shepherd is not.
            tracing::info!(endpoint = %unserved, "agent calls an endpoint no shepherd serves; re-homing it over SSH");
            return match restart_agent(
                shared.takeover.as_deref(),
                shared.waits,
                session,
                &recovery.machine,
            )
            .await
            {
                Ok(()) => Ok(Step::rehomed),
                Err(cause) => Err(fail(
                    Step::failed,
                    format!("re-homing the agent (its endpoint {unserved} is not served): {cause}"),
                )),
            };
        }
        // A tenant's power action on the system it runs: the BMC alone,
        // no brake (it is no recovery) and no agent expected.
        match recovery.power.as_deref() {
            Some(p @ ("on" | "off")) => {
                let on = p == "on";
                return match shared
                    .provider
                    .set_power(&recovery.machine.provider_id, on)
                    .await
                {
                    Ok(how) => {
                        tracing::info!(%how, "powered {p} at its tenant's request");
                        Ok(Step::powered)
                    }
                    Err(e) => Err(fail(Step::failed, format!("power {p}: {e}"))),
                };
            }
            Some("cycle") => {
                return power_cycle(&shared.provider, &shared.wait, &recovery.machine)
                    .await
                    .map(|()| Step::power_cycled)
                    .map_err(|c| fail(Step::failed, c));
            }
            _ => {}
        }
        let mut gentle = None;
        if recovery.requested {
            tracing::info!("rebooting at an operator's request");
        } else {
            match restart_agent(
                shared.takeover.as_deref(),
                shared.waits,
                session,
                &recovery.machine,
            )
            .await
            {
                Ok(()) => return Ok(Step::agent_restarted),
                Err(cause) => {
                    tracing::info!(%cause, "agent quiet and not restarted over SSH; power-cycling");
                    gentle = Some(cause);
                }
            }
        }
        let gentle_note = gentle
            .as_deref()
            .map(|c| format!(" (agent restart over SSH failed: {c})"))
            .unwrap_or_default();
        // Through the brake, which holds across shepherds.
        let judge = &shared.judge;
        let requested = recovery.requested;
        let allowed = session
            .transact(async |tx| {
                let r = brake::take_power_action(tx, judge, mid, requested).await?;
                let now = heartbeats::now(tx).await?;
                Ok((r, now))
            })
            .await;
        let powered_at = match allowed {
            Ok((Ok(()), now)) => now,
            Ok((Err(st), _)) => {
                return Err(fail(
                    Step::braked,
                    format!(
                        "power action withheld: the recovery brake holds: {}{gentle_note}",
                        st.reason.unwrap_or_default()
                    ),
                ));
            }
            Err(e) => {
                return Err(fail(
                    Step::failed,
                    format!("consulting the recovery brake: {e}{gentle_note}"),
                ));
            }
        };
        // What the machine prints from the power cycle until its agent
        // calls (or the wait for it ends): a failure says its last lines.
        let capture = crate::provider::capture_console(
            &shared.provider,
            shared.consoles.as_ref(),
            mid,
            &recovery.machine.provider_id,
            if requested { "reboot" } else { "recovery" },
        )
        .await;
        if let Err(c) = power_cycle(&shared.provider, &shared.wait, &recovery.machine).await {
            return Err(fail(
                Step::failed,
                crate::console::told(capture, format!("{c}{gentle_note}")).await,
            ));
        }
        match called_since(session, mid, powered_at, shared.waits.after_reboot).await {
            Ok(true) => Ok(Step::rebooted),
            Ok(false) => Ok(Step::taken_over_again),
            Err(e) => Err(fail(
                Step::failed,
                crate::console::told(
                    capture,
                    format!("rebooted, then watching for the agent: {e}"),
                )
                .await,
            )),
        }
    }
}
