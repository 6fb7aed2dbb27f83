//! The command line's values that name the BMDB's: a state, a provider
//! status, a heartbeat, a process. A wrong one lists the right ones.

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
