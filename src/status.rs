//! What the running parts say about themselves. The Supervisor answers
//! [`GetSupervisorStatus`]; the admin server asks it through a
//! `Recipient`, so the admin server and the Supervisor (which starts it)
//! never reach each other.

use actix::Message;

use crate::control::LoopStatus;

/// Asks the Supervisor for its parts' status.
#[derive(Message)]
#[rtype(result = "SupervisorStatus")]
pub struct GetSupervisorStatus;

/// The Supervisor's session and its loops.
#[derive(Debug, Clone, Default)]
pub struct SupervisorStatus {
    pub session: Option<uuid::Uuid>,
    /// Sessions this process opened, and lost (ended other than by its
    /// own shutdown), since it started.
    pub sessions_opened: u64,
    pub sessions_lost: u64,
    /// Every running loop, in the order they were registered.
    pub loops: Vec<LoopStatus>,
}

impl SupervisorStatus {
    /// The loop registered as `name`, if it runs here.
    pub fn loop_named(&self, name: &str) -> Option<&LoopStatus> {
        self.loops.iter().find(|l| l.name == name)
    }
}
