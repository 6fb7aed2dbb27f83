//! The command line's values that name the BMDB's: a state, a provider
//! status, a heartbeat, a process. A wrong one lists the right ones. And
//! the fleet's filters as flags (`FilterArgs`), for `list` and rollouts.

use shepherd::bmdb::machines::{self, MachineState};

/// A value that names none of its kind: what it is not, and the names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{not_a}one of: {}", .names.join(", "))]
pub struct NotOneOf {
    not_a: &'static str,
    names: Vec<String>,
}

/// The one of `all` named `s`, or what it is not (`not_a`) and the names.
fn named<T: Copy>(
    s: &str,
    all: &[T],
    name: impl Fn(T) -> String,
    not_a: &'static str,
) -> Result<T, NotOneOf> {
    all.iter()
        .copied()
        .find(|t| name(*t) == s)
        .ok_or_else(|| NotOneOf {
            not_a,
            names: all.iter().map(|t| name(*t)).collect(),
        })
}

pub fn parse_provider_status(s: &str) -> Result<shepherd::bmdb::ProviderStatus, NotOneOf> {
    use shepherd::bmdb::ProviderStatus;
    named(
        s,
        &ProviderStatus::ALL,
        |p| p.to_string(),
        "not a provider status; ",
    )
}

pub fn parse_heartbeat(s: &str) -> Result<machines::Heartbeat, NotOneOf> {
    named(s, &machines::Heartbeat::ALL, |h| h.as_str().into(), "")
}

pub fn parse_process(s: &str) -> Result<shepherd::bmdb::Process, NotOneOf> {
    use shepherd::bmdb::Process;
    named(s, &Process::ALL, |p| p.to_string(), "not a process; ")
}

pub fn parse_state(s: &str) -> Result<MachineState, NotOneOf> {
    named(
        s,
        &MachineState::ALL,
        |m| m.as_str().into(),
        "not a state; ",
    )
}

pub fn parse_bmc(s: &str) -> Result<machines::BmcKind, NotOneOf> {
    named(
        s,
        &machines::BmcKind::ALL,
        |b| b.as_str().into(),
        "not a BMC protocol; ",
    )
}

pub fn parse_boot(s: &str) -> Result<shepherd::config::BootMethod, NotOneOf> {
    use shepherd::config::BootMethod;
    named(
        s,
        &BootMethod::ALL,
        |b| b.as_str().into(),
        "not a boot path; ",
    )
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
    /// Machines at this provider location (an inventory host's `location`).
    #[arg(long)]
    pub location: Option<String>,
    /// Machines assigned to this project (its ID), or holding its devices.
    #[arg(long)]
    pub project: Option<uuid::Uuid>,
    /// Machines whose BMC speaks redfish or ipmi (as last read), or none.
    #[arg(long, value_parser = parse_bmc)]
    pub bmc: Option<machines::BmcKind>,
    /// Machines shepherd reaches first over ssh, virtual-media or network.
    #[arg(long, value_parser = parse_boot)]
    pub boot: Option<shepherd::config::BootMethod>,
    /// Machines labeled with this plan (a `metal.plans` slug).
    #[arg(long)]
    pub plan: Option<String>,
}

impl FilterArgs {
    /// Whether any filter is given.
    pub fn any(&self) -> bool {
        self.state.is_some()
            || self.provider_status.is_some()
            || self.heartbeat.is_some()
            || self.search.is_some()
            || self.location.is_some()
            || self.project.is_some()
            || self.bmc.is_some()
            || self.boot.is_some()
            || self.plan.is_some()
    }

    /// The filters given, as `name=value` words (a rollout's selection,
    /// named as the API's filters are).
    pub fn described(&self) -> String {
        let words = [
            ("state", self.state.map(|s| s.to_string())),
            (
                "provider_status",
                self.provider_status.map(|s| s.to_string()),
            ),
            ("heartbeat", self.heartbeat.map(|h| h.as_str().to_string())),
            ("q", self.search.clone()),
            ("location", self.location.clone()),
            ("project", self.project.map(|p| p.to_string())),
            ("bmc", self.bmc.map(|b| b.as_str().to_string())),
            ("boot", self.boot.map(|b| b.as_str().to_string())),
            ("plan", self.plan.clone()),
        ];
        words
            .into_iter()
            .filter_map(|(k, v)| Some(format!("{k}={}", v?)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The BMDB's filter, silence judged after `stale_after`.
    pub fn fleet(&self, stale_after: std::time::Duration) -> machines::FleetFilter {
        machines::FleetFilter {
            state: self.state,
            provider_status: self.provider_status,
            heartbeat: self.heartbeat,
            stale_after,
            search: self.search.clone(),
            location: self.location.clone(),
            project: self.project,
            bmc: self.bmc,
            boot: self.boot,
            plan: self.plan.clone(),
        }
    }
}
