//! What every runner is handed by its supervisor.

use actix::Message;

use crate::bmdb::Session;

/// The session to work under, or None to stop starting work.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetSession(pub Option<Session>);
