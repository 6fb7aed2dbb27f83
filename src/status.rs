//! What the running parts say about themselves. The Supervisor answers
//! [`GetSupervisorStatus`]; the admin server asks it through a
//! `Recipient`, so the admin server and the Supervisor (which starts it)
//! never reach each other.

use actix::Message;

/// Asks the Supervisor for its parts' status.
#[derive(Message)]
#[rtype(result = "SupervisorStatus")]
pub struct GetSupervisorStatus;

/// The Supervisor's session and its parts, each None while not running.
#[derive(Debug, Clone, Default)]
pub struct SupervisorStatus {
    pub session: Option<uuid::Uuid>,
    /// Sessions this process opened, and lost (ended other than by its
    /// own shutdown), since it started.
    pub sessions_opened: u64,
    pub sessions_lost: u64,
    pub initializer: Option<crate::control::MailboxStatus>,
    /// The Enroller (boots through BMCs), on the same process's leases.
    pub enroller: Option<crate::control::MailboxStatus>,
    pub recoverer: Option<crate::control::MailboxStatus>,
    pub provisioner: Option<crate::provisioner::ProvisionerStatus>,
    pub updater: Option<crate::updater::UpdaterStatus>,
}
