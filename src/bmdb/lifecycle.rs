//! The machine's life cycle: which operator action each state allows, in
//! one table. The API, the CLI and the machine page ask it (a refusal is a
//! 409 naming the state); the guide's docs/src/lifecycle.md shows the same
//! table (a test compares them).
//!
//! The states are the BMDB's (`MachineState`, computed from the summary):
//! `enrolling` → `inspecting` → `available` → `installing` → `installed`
//! → `cleaning` → `available`, with `install-failed`, `clean-failed`,
//! `enroll-failed` and the takeover's and recovery's states beside them.
//! An action's own checks (a retry without a backoff, a second hold)
//! refine the table; they never allow what it refuses.

use uuid::Uuid;

use super::{BmdbError, Tx};
use MachineState::*;

/// Where a machine is in shepherd's eyes, derived from its tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MachineState {
    /// Provided, waiting for its agent.
    Pending,
    /// Its last takeover failed; waiting out the backoff.
    Backoff,
    /// A shepherd process is working on it.
    Leased,
    /// An operator holds it: every control loop leaves it alone.
    Held,
    /// The agent runs.
    AgentStarted,
    /// Its BMC boots it into the live agent (a blank machine, or one taken
    /// back), or that boot waits its turn.
    Enrolling,
    /// An operator asked for an inspection: its BMC boots it into the
    /// live agent, which reports the hardware.
    Inspecting,
    /// Its last boot through the BMC failed; waiting out the backoff.
    EnrollFailed,
    /// The live agent runs (booted through the BMC) and nothing is
    /// installed: ready for an installation.
    Available,
    /// The agent went quiet and its recovery failed; waiting out the
    /// Recoverer's backoff.
    RecoveryBackoff,
    /// Its agent is installing an operating system (asked, not answered).
    Installing,
    /// Its OS installation is done.
    Installed,
    /// Its agent answered the last installation with an error.
    InstallFailed,
    /// Its agent erases its disks (deprovisioning: asked, not answered).
    Cleaning,
    /// Its agent answered the last erasure with an error: held from
    /// installations until an erasure succeeds.
    CleanFailed,
    /// No provider record.
    Unprovided,
    /// It enlisted itself by booting the provisioning network
    /// (`netboot.discover`): its live agent reports, nothing is installed
    /// on or erased from it until an operator accepts it with its BMC.
    Discovered,
    /// Being brought to its baseline through its BMC (firmware, BIOS
    /// settings, RAID, Secure Boot), its restart and the check after it
    /// included.
    Servicing,
    /// Its last servicing failed (the BMC's words in its history): never
    /// handed out until serviced again.
    ServiceFailed,
}

impl MachineState {
    pub const ALL: [MachineState; 19] = [
        MachineState::Pending,
        MachineState::Backoff,
        MachineState::Leased,
        MachineState::Held,
        MachineState::AgentStarted,
        MachineState::Enrolling,
        MachineState::Inspecting,
        MachineState::EnrollFailed,
        MachineState::Available,
        MachineState::RecoveryBackoff,
        MachineState::Installing,
        MachineState::Installed,
        MachineState::InstallFailed,
        MachineState::Cleaning,
        MachineState::CleanFailed,
        MachineState::Unprovided,
        MachineState::Discovered,
        MachineState::Servicing,
        MachineState::ServiceFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MachineState::Pending => "pending",
            MachineState::Backoff => "backoff",
            MachineState::Leased => "leased",
            MachineState::Held => "held",
            MachineState::AgentStarted => "agent-started",
            MachineState::Enrolling => "enrolling",
            MachineState::Inspecting => "inspecting",
            MachineState::EnrollFailed => "enroll-failed",
            MachineState::Available => "available",
            MachineState::RecoveryBackoff => "recovery-backoff",
            MachineState::Installing => "installing",
            MachineState::Installed => "installed",
            MachineState::InstallFailed => "install-failed",
            MachineState::Cleaning => "cleaning",
            MachineState::CleanFailed => "clean-failed",
            MachineState::Unprovided => "unprovided",
            MachineState::Discovered => "discovered",
            MachineState::Servicing => "servicing",
            MachineState::ServiceFailed => "service-failed",
        }
    }

    pub fn parse(s: &str) -> Option<MachineState> {
        Self::ALL.into_iter().find(|m| m.as_str() == s)
    }
}

impl std::fmt::Display for MachineState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A machine's `MachineState`, from its `machine_summary s` row: the SQL
/// function `machine_state` (`migrations/V24__fleet_tally.sql`), the one
/// home of the derivation, which the summary's trigger also keeps in
/// `machine_summary.state` for the fleet's listing and tally.
macro_rules! state_column {
    () => {
        "machine_state(s) AS state"
    };
}
pub(super) use state_column;

const STATE_OF: &str = concat!(
    "SELECT ",
    state_column!(),
    " FROM machine_summary s LEFT JOIN machine_provided p ON p.machine_id = s.machine_id \
     WHERE s.machine_id = $1"
);

/// One machine's state, as the fleet shows it (None: no such machine).
pub async fn state_of(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
) -> Result<Option<MachineState>, BmdbError> {
    Ok(tx
        .query_opt(STATE_OF, &[&machine_id])
        .await?
        .map(|r| MachineState::parse(r.get(0)).unwrap_or(MachineState::Unprovided)))
}

/// What happens to a machine: an operator's request, a control loop's
/// work ending, an agent's report, the provider's listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// A takeover's lease is taken (the Initializer).
    TakeoverLeased,
    /// The takeover failed: its backoff runs.
    TakeoverFailed,
    /// The takeover finished: the agent runs.
    TakeoverDone,
    /// The agent went quiet and its recovery failed: the Recoverer's
    /// backoff runs.
    RecoveryFailed,
    /// A boot through the BMC failed: its backoff runs.
    BootFailed,
    /// The live agent of a boot through the BMC enrolled.
    LiveAgentEnrolled,
    /// An operator cleared the backoff (`retry`).
    BackoffCleared,
    /// An operator asked for an inspection.
    InspectAsked,
    /// An operator asked for an installation.
    InstallAsked,
    /// The agent reported the installation done.
    Installed,
    /// The agent reported the installation failed.
    InstallFailed,
    /// An operator asked for a deprovisioning.
    DeprovisionAsked,
    /// The agent reported its disks erased.
    Erased,
    /// The agent reported the erasure failed.
    EraseFailed,
    /// An operator held the machine.
    Held,
    /// An operator released it.
    Released,
    /// The provider no longer lists it.
    ProviderForgot,
    /// The provider lists it (again).
    ProviderListed,
    /// An operator accepted a discovered machine with its BMC.
    Accepted,
    /// An operator or a rollout asked for a servicing (forced on a
    /// tenant's machine).
    ServiceAsked,
    /// The Servicer found the machine at its baseline (after its restart).
    ServiceDone,
    /// The servicing failed (the BMC refused, a task failed, the check
    /// after the restart found it short).
    ServiceFailed,
}

impl Event {
    pub fn as_str(self) -> &'static str {
        match self {
            Event::TakeoverLeased => "takeover leased",
            Event::TakeoverFailed => "takeover failed",
            Event::TakeoverDone => "takeover done",
            Event::RecoveryFailed => "recovery failed",
            Event::BootFailed => "boot failed",
            Event::LiveAgentEnrolled => "live agent enrolled",
            Event::BackoffCleared => "backoff cleared (retry)",
            Event::InspectAsked => "inspect asked",
            Event::InstallAsked => "install asked",
            Event::Installed => "installation reported done",
            Event::InstallFailed => "installation reported failed",
            Event::DeprovisionAsked => "deprovision asked",
            Event::Erased => "erasure reported done",
            Event::EraseFailed => "erasure reported failed",
            Event::Held => "hold",
            Event::Released => "release",
            Event::ProviderForgot => "provider forgot it",
            Event::ProviderListed => "provider lists it",
            Event::Accepted => "accept (its BMC read)",
            Event::ServiceAsked => "service asked",
            Event::ServiceDone => "serviced: at its baseline",
            Event::ServiceFailed => "servicing failed",
        }
    }
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The life cycle's transitions, declared: from a state, on an event, to
/// a state. The BMDB derives a machine's state from its rows (the SQL of
/// `state_column!`, over the summary its triggers keep); a test makes
/// every `from` from rows, writes the event as shepherd and its agents
/// write it, and reads `to` back, so the derivation, the triggers and
/// this table cannot drift apart. Every state is in it.
pub const TRANSITIONS: &[(MachineState, Event, MachineState)] = &[
    // SSH takeover.
    (Pending, Event::TakeoverLeased, Leased),
    (Leased, Event::TakeoverFailed, Backoff),
    (Leased, Event::TakeoverDone, AgentStarted),
    (Backoff, Event::BackoffCleared, Pending),
    (AgentStarted, Event::RecoveryFailed, RecoveryBackoff),
    (RecoveryBackoff, Event::BackoffCleared, AgentStarted),
    // Through the BMC.
    (Enrolling, Event::BootFailed, EnrollFailed),
    (EnrollFailed, Event::BackoffCleared, Enrolling),
    (Enrolling, Event::LiveAgentEnrolled, Available),
    (Available, Event::InspectAsked, Inspecting),
    (Inspecting, Event::LiveAgentEnrolled, Available),
    // Installations.
    (AgentStarted, Event::InstallAsked, Installing),
    (Available, Event::InstallAsked, Installing),
    (InstallFailed, Event::InstallAsked, Installing),
    (Installing, Event::Installed, Installed),
    (Installing, Event::InstallFailed, InstallFailed),
    // Deprovisioning.
    (AgentStarted, Event::DeprovisionAsked, Cleaning),
    (Available, Event::DeprovisionAsked, Cleaning),
    (InstallFailed, Event::DeprovisionAsked, Cleaning),
    (CleanFailed, Event::DeprovisionAsked, Cleaning),
    (Cleaning, Event::Erased, Available),
    (Cleaning, Event::EraseFailed, CleanFailed),
    // Operators' holds.
    (Pending, Event::Held, Held),
    (Available, Event::Held, Held),
    (Installed, Event::Held, Held),
    (Held, Event::Released, Pending),
    // The provider.
    (Pending, Event::ProviderForgot, Unprovided),
    (Unprovided, Event::ProviderListed, Pending),
    // Machines that enlisted themselves: accepted with their BMC (and,
    // once the BMC is read and agrees with the agent, the erasure asked),
    // an inventory machine whose live agent erases its disks first.
    (Discovered, Event::Accepted, Cleaning),
    // Servicing: only while free (a tenant's machine when forced), and
    // never handed out when it failed.
    (Available, Event::ServiceAsked, Servicing),
    (AgentStarted, Event::ServiceAsked, Servicing),
    (Installed, Event::ServiceAsked, Servicing),
    (ServiceFailed, Event::ServiceAsked, Servicing),
    (Servicing, Event::ServiceDone, Available),
    (Servicing, Event::ServiceFailed, ServiceFailed),
];

/// The transitions as the guide shows them, a table.
pub fn transitions_table() -> String {
    let mut t = String::from("| from | event | to |\n|---|---|---|\n");
    for (from, event, to) in TRANSITIONS {
        t += &format!("| `{from}` | {event} | `{to}` |\n");
    }
    t
}

/// The transitions as the guide shows them: a Mermaid state diagram.
pub fn state_diagram() -> String {
    let id = |s: MachineState| s.as_str().replace('-', "_");
    let mut d = String::from("```mermaid\nstateDiagram-v2\n");
    for state in MachineState::ALL {
        d += &format!("    state \"{state}\" as {}\n", id(state));
    }
    for (from, event, to) in TRANSITIONS {
        d += &format!("    {} --> {}: {event}\n", id(*from), id(*to));
    }
    d += "```\n";
    d
}

/// What an operator can ask of one machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Retry,
    Retakeover,
    Reboot,
    Hold,
    Release,
    Inspect,
    AcceptHardware,
    Install,
    Deprovision,
    Accept,
    Service,
}

impl Operation {
    pub const ALL: [Operation; 11] = [
        Operation::Retry,
        Operation::Retakeover,
        Operation::Reboot,
        Operation::Hold,
        Operation::Release,
        Operation::Inspect,
        Operation::AcceptHardware,
        Operation::Install,
        Operation::Deprovision,
        Operation::Accept,
        Operation::Service,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Retry => "retry",
            Operation::Retakeover => "retakeover",
            Operation::Reboot => "reboot",
            Operation::Hold => "hold",
            Operation::Release => "release",
            Operation::Inspect => "inspect",
            Operation::AcceptHardware => "accept-hardware",
            Operation::Install => "install",
            Operation::Deprovision => "deprovision",
            Operation::Accept => "accept",
            Operation::Service => "service",
        }
    }

    /// The operations `actions::act` carries out by name alone: the first
    /// seven (installations and deprovisionings are asked through
    /// `installations`; an acceptance carries its BMC: `actions::Request`'s
    /// `accept`).
    pub const ACTIONS: &'static [Operation] = Operation::ALL.as_slice().split_at(7).0;

    pub fn parse(s: &str) -> Option<Operation> {
        Self::ALL.into_iter().find(|o| o.as_str() == s)
    }

    /// One of [`Operation::ACTIONS`], by name.
    pub fn parse_action(s: &str) -> Option<Operation> {
        Self::ACTIONS.iter().copied().find(|o| o.as_str() == s)
    }

    /// A button's label.
    pub fn label(self) -> &'static str {
        match self {
            Operation::Retry => "Retry now",
            Operation::Retakeover => "Take over again",
            Operation::Reboot => "Reboot",
            Operation::Hold => "Hold",
            Operation::Release => "Release",
            Operation::Inspect => "Inspect",
            Operation::AcceptHardware => "Accept the hardware differences",
            Operation::Install => "Install",
            Operation::Deprovision => "Deprovision",
            Operation::Accept => "Accept",
            Operation::Service => "Service to its baseline",
        }
    }

    /// Whether this operation is allowed in `state`: the table
    /// docs/src/lifecycle.md shows ([`markdown_table`]).
    pub fn allows(self, state: MachineState) -> bool {
        match self {
            // Clears backoffs: anywhere but where work is in hand or
            // there is no machine.
            Operation::Retry => !matches!(state, Installing | Cleaning | Unprovided | Discovered),
            // Drops the agent: not while it writes or erases a disk, nor
            // while a shepherd works on it or its BMC boots it.
            Operation::Retakeover => !matches!(
                state,
                Leased
                    | Enrolling
                    | Inspecting
                    | Installing
                    | Cleaning
                    | Unprovided
                    | Discovered
                    | Servicing
            ),
            // A reboot kills what the agent writes: not then, nor while
            // its BMC boots it (nor a held machine).
            Operation::Reboot => !matches!(
                state,
                Held | Enrolling
                    | Inspecting
                    | Installing
                    | Cleaning
                    | Unprovided
                    | Discovered
                    | Servicing
            ),
            Operation::Hold => !matches!(state, Held | Discovered),
            // A hold shows as `held` unless work in hand shows first.
            Operation::Release => {
                matches!(state, Held | Leased | Enrolling | Inspecting | Servicing)
            }
            Operation::Inspect => !matches!(
                state,
                Held | Inspecting | Installing | Cleaning | Unprovided | Discovered | Servicing
            ),
            Operation::AcceptHardware => state != Unprovided,
            // Waits for the agent of a machine not taken over yet; an
            // installed system's BMC boots the agent again; never onto
            // disks that failed their erasure, nor while the BMC boots it.
            Operation::Install => matches!(
                state,
                Pending | Backoff | Leased | AgentStarted | Available | Installed | InstallFailed
            ),
            // From an agent that answers, or an installed system whose
            // agent comes back (through the BMC, or taken over again).
            Operation::Deprovision => matches!(
                state,
                AgentStarted | Available | Installed | InstallFailed | CleanFailed
            ),
            // Only what enlisted itself (again while its erasure waits: a BMC
            // given wrong is given anew).
            Operation::Accept => state == Discovered,
            // While free: taken over or enrolled and nothing installed, or
            // failed before; a tenant's installed machine only when the
            // operator forces it (the action's own check).
            Operation::Service => {
                matches!(state, AgentStarted | Available | Installed | ServiceFailed)
            }
        }
    }

    /// The states this operation is allowed in, in [`MachineState::ALL`]'s
    /// order.
    pub fn allowed(self) -> Vec<MachineState> {
        MachineState::ALL
            .into_iter()
            .filter(|s| self.allows(*s))
            .collect()
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why `op` is refused for `machine` in `state`, if it is.
pub fn refusal(machine: Uuid, state: MachineState, op: Operation) -> Option<String> {
    if op.allows(state) {
        return None;
    }
    if op == Operation::Release {
        return Some(format!("machine {machine} is not held (it is {state})"));
    }
    let allowed: Vec<&str> = op.allowed().iter().map(|s| s.as_str()).collect();
    Some(format!(
        "machine {machine} is {state}: {op} is not allowed there (it is allowed when the machine is {})",
        allowed.join(", ")
    ))
}

/// The table as docs/src/lifecycle.md shows it: one row per state, a
/// column per operation, `yes` where allowed.
pub fn markdown_table() -> String {
    let mut s = String::from("| state |");
    for op in Operation::ALL {
        s += &format!(" {op} |");
    }
    s += "\n|---|";
    for _ in Operation::ALL {
        s += "---|";
    }
    s += "\n";
    for state in MachineState::ALL {
        s += &format!("| `{state}` |");
        for op in Operation::ALL {
            s += if op.allows(state) { " yes |" } else { " |" };
        }
        s += "\n";
    }
    s
}
