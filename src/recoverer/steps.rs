//! The Recoverer's steps on the machine: the agent restarted over SSH,
//! the power cycle, and the wait for the agent's call after either.

use std::time::{Duration, Instant, SystemTime};

use uuid::Uuid;

use crate::bmdb::heartbeats;
use crate::bmdb::selectors::ProvidedMachine;
use crate::bmdb::{BmdbError, ProviderStatus, Session, machines};
use crate::control::wait_until;
use crate::provider::SharedProvider;
use crate::ssh::HostKeyPolicy;
use crate::takeover::TakeoverSettings;

/// How a reboot is waited for.
#[derive(Debug, Clone)]
pub struct RebootWait {
    /// Give up (and fail the work) after this long.
    pub timeout: Duration,
    /// Time between two looks at the provider.
    pub poll: Duration,
    /// If the provider never shows the machine going down, accept it as
    /// back once this long has passed (some providers report a reboot only
    /// as a blip).
    pub settle: Duration,
}

/// The bounds of the gentle steps.
#[derive(Debug, Clone, Copy)]
pub struct AgentWaits {
    /// An agent restarted over SSH must call within this.
    pub restart: Duration,
    /// After a power cycle, the agent may come back by itself within this.
    pub after_reboot: Duration,
}

/// Starts the agent again over SSH, records its new key, and waits (up to
/// `agent_restart_wait`) for it to call. The new agent stops the old one.
pub(super) async fn restart_agent(
    takeover: Option<&TakeoverSettings>,
    waits: AgentWaits,
    session: &Session,
    machine: &ProvidedMachine,
) -> Result<(), String> {
    let Some(t) = takeover else {
        return Err("no agent endpoint is set (bmaas.endpoint)".into());
    };
    let Some(address) = machine.address() else {
        return Err("the machine has no address".into());
    };
    let mid = machine.machine_id;
    let policy = t.ssh.host_keys;
    let known = if policy == HostKeyPolicy::AcceptNew {
        session
            .transact(async |tx| machines::host_key(tx, mid).await)
            .await
            .map_err(|e| format!("reading the recorded host key: {e}"))?
    } else {
        None
    };
    let known_key = crate::takeover::parse_host_key(known.as_deref()).map_err(|e| e.to_string())?;
    let taken = crate::takeover::take_over(t, mid, address, known_key)
        .await
        .map_err(|f| f.cause)?;
    let record_host_key = known.is_none() && policy == HostKeyPolicy::AcceptNew;
    let started_at: SystemTime = session
        .transact(async |tx| {
            crate::takeover::record_agent(tx, mid, &taken, &t.endpoint, record_host_key).await?;
            heartbeats::now(tx).await
        })
        .await
        .map_err(|e| format!("recording the restarted agent: {e}"))?;
    tracing::debug!("agent restarted over SSH; waiting for its call");
    match called_since(session, mid, started_at, waits.restart).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!(
            "the agent was restarted but did not call within {}",
            humantime::format_duration(waits.restart)
        )),
        Err(e) => Err(format!("watching for the restarted agent: {e}")),
    }
}

/// Whether the machine's agent calls (a heartbeat after `since`, by the
/// database's clock) within `within`.
pub(super) async fn called_since(
    session: &Session,
    mid: Uuid,
    since: SystemTime,
    within: Duration,
) -> Result<bool, BmdbError> {
    let deadline = Instant::now() + within;
    let poll = (within / 20).clamp(Duration::from_millis(100), Duration::from_secs(2));
    let called = wait_until(session, poll, deadline, async |tx| {
        Ok(heartbeats::heard_since(tx, mid, since).await?.then_some(()))
    })
    .await?;
    Ok(called.is_some())
}

/// Reboots the machine through the provider and waits until it reports it
/// running.
pub(super) async fn power_cycle(
    provider: &SharedProvider,
    wait: &RebootWait,
    machine: &ProvidedMachine,
) -> Result<(), String> {
    let id = machine.provider_id.as_str();
    provider
        .reboot(id)
        .await
        .map_err(|e| format!("reboot: {e}"))?;
    let started = Instant::now();
    let mut went_down = false;
    loop {
        tokio::time::sleep(wait.poll).await;
        let status = match provider.get_machine(id).await {
            Ok(Some(m)) => m.status,
            Ok(None) => return Err("reboot: the provider no longer knows the machine".into()),
            Err(e) => {
                tracing::debug!(error = %e, "looking at the rebooting machine failed; will look again");
                ProviderStatus::Unknown
            }
        };
        match status {
            ProviderStatus::Running if went_down || started.elapsed() >= wait.settle => {
                return Ok(());
            }
            ProviderStatus::Running => {}
            ProviderStatus::ProvisioningFailedPermanent | ProviderStatus::Missing => {
                return Err(format!("reboot: the provider reports the machine {status}"));
            }
            _ => went_down = true,
        }
        if started.elapsed() >= wait.timeout {
            return Err(format!(
                "reboot: not back after {:?} (last status {status})",
                wait.timeout
            ));
        }
    }
}
