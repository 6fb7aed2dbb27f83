//! The BMDB's enum types, spelled exactly as in the schema.

use std::fmt;

use postgres_types::{FromSql, ToSql};
use serde::{Deserialize, Serialize};

/// A kind of work on a machine. The `Shepherd*` processes exclude each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ToSql, FromSql, Serialize, Deserialize)]
#[postgres(name = "process")]
pub enum Process {
    UnitTest1,
    UnitTest2,
    ShepherdAccess,
    ShepherdAgentStart,
    ShepherdRecovery,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ToSql, FromSql, Serialize, Deserialize)]
#[postgres(name = "provider")]
pub enum Provider {
    Equinix,
    Lumen,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ToSql, FromSql, Serialize, Deserialize)]
#[postgres(name = "provider_status")]
pub enum ProviderStatus {
    Missing,
    Provisioning,
    ProvisioningFailedPermanent,
    Running,
    Stopped,
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ToSql, FromSql, Serialize, Deserialize)]
#[postgres(name = "work_history_event")]
pub enum HistoryEvent {
    Started,
    Finished,
    Failed,
    Canceled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ToSql, FromSql, Serialize, Deserialize)]
#[postgres(name = "machine_os_installation_result")]
pub enum InstallationResult {
    Success,
    Error,
}

macro_rules! display_as_debug {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(self, f)
            }
        }
    )*};
}
display_as_debug!(
    Process,
    Provider,
    ProviderStatus,
    HistoryEvent,
    InstallationResult
);

impl Process {
    pub const ALL: [Process; 5] = [
        Process::UnitTest1,
        Process::UnitTest2,
        Process::ShepherdAccess,
        Process::ShepherdAgentStart,
        Process::ShepherdRecovery,
    ];

    /// The processes shepherd's own loops work under (the rest are the
    /// schema's test processes): the one list the pages, `/metrics` and
    /// the operators' actions go by.
    pub const SHEPHERD: [Process; 3] = [
        Process::ShepherdAccess,
        Process::ShepherdAgentStart,
        Process::ShepherdRecovery,
    ];

    /// The schema's spelling (`ShepherdAgentStart`).
    pub fn as_str(self) -> &'static str {
        match self {
            Process::UnitTest1 => "UnitTest1",
            Process::UnitTest2 => "UnitTest2",
            Process::ShepherdAccess => "ShepherdAccess",
            Process::ShepherdAgentStart => "ShepherdAgentStart",
            Process::ShepherdRecovery => "ShepherdRecovery",
        }
    }

    /// A process from the schema's spelling.
    pub fn parse(s: &str) -> Option<Process> {
        Self::ALL.into_iter().find(|p| p.to_string() == s)
    }
}

impl ProviderStatus {
    pub const ALL: [ProviderStatus; 6] = [
        ProviderStatus::Missing,
        ProviderStatus::Provisioning,
        ProviderStatus::ProvisioningFailedPermanent,
        ProviderStatus::Running,
        ProviderStatus::Stopped,
        ProviderStatus::Unknown,
    ];
}
