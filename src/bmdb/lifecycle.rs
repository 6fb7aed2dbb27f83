//! The machine's life cycle: which operator action each state allows, in
//! one table. The API, the CLI and the machine page ask it (a refusal is a
//! 409 naming the state); README.md shows the same table (a test compares
//! them).
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
}

impl MachineState {
    pub const ALL: [MachineState; 16] = [
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

/// A machine's `MachineState`, from `machine_summary s` and
/// `machine_provided p`.
macro_rules! state_column {
    () => {
        "CASE WHEN s.shepherd_work AND s.boot_request = 'inspect' THEN 'inspecting' \
              WHEN s.shepherd_work AND s.boot_request IS NOT NULL AND s.boot_request <> 'disk' \
                   THEN 'enrolling' \
              WHEN s.shepherd_work THEN 'leased' \
              WHEN s.held THEN 'held' \
              WHEN ((s.boot_request IS NOT NULL AND s.boot_request <> 'disk') \
                        OR (s.bmc_boot AND s.agent_started_at IS NULL \
                        AND NOT s.installation_fulfilled AND p.provider_ip_address IS NULL)) \
                   AND s.agent_start_not_before > now() THEN 'enroll-failed' \
              WHEN s.boot_request = 'inspect' THEN 'inspecting' \
              WHEN s.boot_request IS NOT NULL AND s.boot_request <> 'disk' THEN 'enrolling' \
              WHEN s.bmc_boot AND s.agent_started_at IS NULL AND NOT s.installation_fulfilled \
                   AND p.provider_ip_address IS NULL THEN 'enrolling' \
              WHEN s.installation IN ('installing', 'cleaning') AND s.agent_started_at IS NOT NULL \
                   AND NOT s.installation_fulfilled THEN s.installation \
              WHEN s.installation = 'clean-failed' AND s.installation_fulfilled \
                   THEN 'clean-failed' \
              WHEN s.live_agent AND s.agent_started_at IS NOT NULL \
                   AND s.recovery_not_before <= now() THEN 'available' \
              WHEN s.installation_fulfilled THEN COALESCE(s.installation, 'installed') \
              WHEN s.agent_started_at IS NOT NULL AND s.recovery_not_before > now() \
                   THEN 'recovery-backoff' \
              WHEN s.agent_started_at IS NOT NULL THEN 'agent-started' \
              WHEN p.machine_id IS NULL THEN 'unprovided' \
              WHEN s.agent_start_not_before > now() THEN 'backoff' \
              ELSE 'pending' END AS state"
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
}

impl Operation {
    pub const ALL: [Operation; 9] = [
        Operation::Retry,
        Operation::Retakeover,
        Operation::Reboot,
        Operation::Hold,
        Operation::Release,
        Operation::Inspect,
        Operation::AcceptHardware,
        Operation::Install,
        Operation::Deprovision,
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
        }
    }

    pub fn parse(s: &str) -> Option<Operation> {
        Self::ALL.into_iter().find(|o| o.as_str() == s)
    }

    /// The states this operation is allowed in.
    pub fn allowed(self) -> &'static [MachineState] {
        match self {
            // Clears backoffs: anywhere but where work is in hand or
            // there is no machine.
            Operation::Retry => &[
                Pending,
                Backoff,
                Leased,
                Held,
                AgentStarted,
                Enrolling,
                Inspecting,
                EnrollFailed,
                Available,
                RecoveryBackoff,
                Installed,
                InstallFailed,
                CleanFailed,
            ],
            // Drops the agent: not while it writes or erases a disk, nor
            // while a shepherd works on it or its BMC boots it.
            Operation::Retakeover => &[
                Pending,
                Backoff,
                Held,
                AgentStarted,
                EnrollFailed,
                Available,
                RecoveryBackoff,
                Installed,
                InstallFailed,
                CleanFailed,
            ],
            // A reboot kills what the agent writes: not then, nor while
            // its BMC boots it.
            Operation::Reboot => &[
                Pending,
                Backoff,
                Leased,
                AgentStarted,
                EnrollFailed,
                Available,
                RecoveryBackoff,
                Installed,
                InstallFailed,
                CleanFailed,
            ],
            Operation::Hold => &[
                Pending,
                Backoff,
                Leased,
                AgentStarted,
                Enrolling,
                Inspecting,
                EnrollFailed,
                Available,
                RecoveryBackoff,
                Installing,
                Installed,
                InstallFailed,
                Cleaning,
                CleanFailed,
                Unprovided,
            ],
            // A hold shows as `held` unless work in hand shows first.
            Operation::Release => &[Held, Leased, Enrolling, Inspecting],
            Operation::Inspect => &[
                Pending,
                Backoff,
                Leased,
                AgentStarted,
                Enrolling,
                EnrollFailed,
                Available,
                RecoveryBackoff,
                Installed,
                InstallFailed,
                CleanFailed,
            ],
            Operation::AcceptHardware => &[
                Pending,
                Backoff,
                Leased,
                Held,
                AgentStarted,
                Enrolling,
                Inspecting,
                EnrollFailed,
                Available,
                RecoveryBackoff,
                Installing,
                Installed,
                InstallFailed,
                Cleaning,
                CleanFailed,
            ],
            // Waits for the agent of a machine not taken over yet; an
            // installed system's BMC boots the agent again; never onto
            // disks that failed their erasure, nor while the BMC boots it.
            Operation::Install => &[
                Pending,
                Backoff,
                Leased,
                AgentStarted,
                Available,
                Installed,
                InstallFailed,
            ],
            // From an agent that answers, or an installed system whose
            // agent comes back (through the BMC, or taken over again).
            Operation::Deprovision => &[
                AgentStarted,
                Available,
                Installed,
                InstallFailed,
                CleanFailed,
            ],
        }
    }

    pub fn allows(self, state: MachineState) -> bool {
        self.allowed().contains(&state)
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

/// The table as README.md shows it: one row per state, a column per
/// operation, `yes` where allowed.
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
