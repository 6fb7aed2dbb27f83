//! The two runners every control loop runs on. A loop says what it is
//! about; the runner owns the rest.
//!
//! **Leases** ([`leases`]): for loops that work on one machine at a time
//! under a work lease (the Initializer, the Recoverer). The loop provides
//! ([`LeaseLoop`]):
//! - its process, its name and its backoff;
//! - a selector, run inside the lease transaction (which machine needs me);
//! - its work on one leased machine, an async function that returns an
//!   [`Outcome`]: finished (with what to record in the same transaction),
//!   failed (with a cause, and what was learned on the way), or given back
//!   untouched.
//!
//! The runner ([`WorkMailbox`]) guarantees: machines are leased under the
//! current session, one worker actor per leased machine, up to the
//! parallelism, refilled as soon as one ends; a worker whose session dies
//! stops at once (nothing more is written under it); every outcome is
//! recorded by exactly one of finish, fail (with the backoff) or cancel,
//! through database outages for as long as the session lives; a result
//! that cannot be recorded fails the work, and a failure that cannot be
//! recorded cancels the lease naming the cause: no lease is ever left
//! without a worker, and every loop ends its failures the same way.
//!
//! **Rounds** ([`rounds`]): for loops that work on a timer over the whole
//! fleet (the Provisioner, the Updater, the RolloutDriver, the brake's
//! watcher). The loop provides ([`Round`]): its name, its interval, the
//! fleet duty it needs if any, one round (an async function under a
//! session), and how a round's outcome adds to its counters. The runner
//! ([`RoundRunner`]) guarantees: one round at a time, only under a live
//! session, only in the shepherd holding the duty (the others stand by and
//! say who holds it), rounds and failed rounds counted, failures logged
//! with the next round's time, a round on demand (`RunRound`), a stop
//! that its supervisor hears of.

//!
//! **The registry** ([`registry`]): each loop is declared once, by a
//! [`Registration`] (its name, its kind, how to build it with its
//! settings). The [`Registry`] starts every loop and starts it again
//! when it stops by itself, hands it the session, drains it, and asks it
//! for its [`LoopStatus`] (the same for every loop: what the pages, the
//! API and `/metrics` show); nothing about a loop is written anywhere
//! else.

pub mod leases;
pub mod messages;
pub mod registry;
pub mod rounds;

pub use leases::{
    GetStatus, LeaseLoop, MailboxStatus, Outcome, Record, WorkMailbox, WorkOutcome, Worker,
    WorkerDone, wait_until,
};
pub use messages::{
    DURATION_BUCKETS, Drain, Durations, GetLoopStatus, LoopKind, LoopStatus, LoopStopped,
    NudgeLoop, RunRound, SetSession,
};
pub use registry::{Registration, Registry};
pub use rounds::{Pace, Round, RoundRunner, RoundStatus};
