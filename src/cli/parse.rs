//! The command line's values that name the BMDB's: a state, a provider
//! status, a heartbeat, a process. A wrong one lists the right ones. And
//! the fleet's filters as flags (`FilterArgs`), for `list` and rollouts.

use shepherd::bmdb::machines::{self, MachineState};

pub fn parse_provider_status(s: &str) -> Result<shepherd::bmdb::ProviderStatus, String> {
    use shepherd::bmdb::ProviderStatus;
    ProviderStatus::ALL
        .into_iter()
        .find(|p| p.to_string() == s)
        .ok_or_else(|| {
            let all: Vec<String> = ProviderStatus::ALL.iter().map(|p| p.to_string()).collect();
            format!("not a provider status; one of: {}", all.join(", "))
        })
}

pub fn parse_heartbeat(s: &str) -> Result<machines::Heartbeat, String> {
    machines::Heartbeat::parse(s).ok_or_else(|| {
        let all: Vec<&str> = machines::Heartbeat::ALL
            .iter()
            .map(|h| h.as_str())
            .collect();
        format!("one of: {}", all.join(", "))
    })
}

pub fn parse_process(s: &str) -> Result<shepherd::bmdb::Process, String> {
    shepherd::bmdb::Process::parse(s).ok_or_else(|| {
        let all: Vec<String> = shepherd::bmdb::Process::ALL
            .iter()
            .map(|p| p.to_string())
            .collect();
        format!("not a process; one of: {}", all.join(", "))
    })
}

pub fn parse_state(s: &str) -> Result<MachineState, String> {
    MachineState::parse(s).ok_or_else(|| {
        let all: Vec<&str> = MachineState::ALL.iter().map(|m| m.as_str()).collect();
        format!("not a state; one of: {}", all.join(", "))
    })
}

/// The fleet's filters, as `list` takes them and a rollout chooses its
/// machines by (the fleet page's and the API's too).
#[derive(clap::Args, Default)]
pub struct FilterArgs {
    /// Machines in this state.
    #[arg(long, value_parser = parse_state)]
    pub state: Option<MachineState>,
    /// Machines whose provider reports this status (Running, Provisioning,
    /// Stopped…).
    #[arg(long, value_parser = parse_provider_status)]
    pub provider_status: Option<shepherd::bmdb::ProviderStatus>,
    /// Machines whose agent is heartbeating, silent (started, no heartbeat
    /// within recoverer.heartbeat_stale_after) or no-agent.
    #[arg(long, value_parser = parse_heartbeat)]
    pub heartbeat: Option<machines::Heartbeat>,
    /// Machines matching this: a machine ID's prefix, part of a provider
    /// ID, or an address's prefix.
    #[arg(long)]
    pub search: Option<String>,
}

impl FilterArgs {
    /// Whether any filter is given.
    pub fn any(&self) -> bool {
        self.state.is_some()
            || self.provider_status.is_some()
            || self.heartbeat.is_some()
            || self.search.is_some()
    }

    /// The BMDB's filter, silence judged after `stale_after`.
    pub fn fleet(&self, stale_after: std::time::Duration) -> machines::FleetFilter {
        machines::FleetFilter {
            state: self.state,
            provider_status: self.provider_status,
            heartbeat: self.heartbeat,
            stale_after,
            search: self.search.clone(),
        }
    }
}
