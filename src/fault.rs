//! Whose a failure is, told by its type rather than its words: the
//! runners give work back, back off or fail it from this, and never count
//! shepherd's own trouble against a machine.

/// Whose fault a failure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whose {
    /// shepherd's own or its BMDB's (an outage, a lost session, a
    /// shutdown): it passes by itself; work is given back untouched and
    /// tried again, nothing is held against the machine.
    Ours,
    /// A peer that did not answer or said it was busy (a BMC, a switch,
    /// the provider's 5xx or 429): tried again after a backoff; says
    /// nothing of the machine.
    Peer,
    /// The machine's own, or a refusal that recurs until someone acts:
    /// the work fails with its cause.
    Machine,
}

/// An error that says whose it is.
pub trait Blame: std::error::Error {
    fn whose(&self) -> Whose;

    /// It passes by itself (shepherd's own or a peer's).
    fn is_passing(&self) -> bool {
        self.whose() != Whose::Machine
    }
}

impl Blame for std::convert::Infallible {
    fn whose(&self) -> Whose {
        match *self {}
    }
}
