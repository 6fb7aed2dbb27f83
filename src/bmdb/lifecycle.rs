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

use super::machines::MachineState;
use super::machines::MachineState::*;

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
pub fn refusal(machine: uuid::Uuid, state: MachineState, op: Operation) -> Option<String> {
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
