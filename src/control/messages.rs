//! What the runners, the registry and the supervisor say to each other,
//! and what every loop says about itself ([`LoopStatus`]).

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix::Message;
use uuid::Uuid;

use crate::bmdb::Session;
use crate::bmdb::duty::Holder;

/// The session to work under, or None to stop starting work.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetSession(pub Option<Session>);

/// Runs a round now (right after a session starts; an operator just asked
/// for something the round does).
#[derive(Message)]
#[rtype(result = "()")]
pub struct RunRound;

/// Which runner a loop is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoopKind {
    /// Work on one leased machine at a time (`control::leases`).
    #[default]
    Lease,
    /// Work over the fleet on a timer (`control::rounds`).
    Round,
}

impl LoopKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LoopKind::Lease => "lease",
            LoopKind::Round => "round",
        }
    }
}

/// The upper bounds, in seconds, of [`Durations`]' buckets: from a
/// lease's quick refusal to an hour's installation watch.
pub const DURATION_BUCKETS: [f64; 12] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// How long a loop's works (a lease loop: one machine's; a round loop: a
/// round) took, as a histogram its runner keeps (controller-runtime's
/// reconcile time).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Durations {
    /// Seconds, all works together.
    pub sum: f64,
    pub count: u64,
    /// Works per bucket of [`DURATION_BUCKETS`] (not cumulative), the
    /// last one above them all.
    pub buckets: [u64; DURATION_BUCKETS.len() + 1],
}

impl Durations {
    pub fn observe(&mut self, took: Duration) {
        let s = took.as_secs_f64();
        self.sum += s;
        self.count += 1;
        let i = DURATION_BUCKETS
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(DURATION_BUCKETS.len());
        self.buckets[i] += 1;
    }
}

/// What a loop says about itself, the same for every loop.
#[derive(Debug, Clone, Default)]
pub struct LoopStatus {
    /// The registration's name: `initializer`, `provisioner`.
    pub name: &'static str,
    pub kind: LoopKind,
    /// A lease loop's BMDB process (`ShepherdAgentStart`).
    pub process: Option<&'static str>,
    /// A lease loop that works under the process of another (the
    /// Enroller beside the Initializer): its series carry a `loop` label.
    pub shares_process: bool,
    /// The session it works under, if any.
    pub session: Option<Uuid>,
    /// Whether it takes work now (a session, and not draining).
    pub active: bool,
    /// Workers allowed at once (1 for a round loop).
    pub parallelism: usize,
    /// Workers running now (a round under way is 1).
    pub running: usize,
    /// Works or rounds ended well, failed, and given back or cut short
    /// (a lease loop's cancelled and aborted work).
    pub done: u64,
    pub failed: u64,
    pub given_back: u64,
    /// A lease loop's leases taken, idle polls and picks lost to another
    /// leaser.
    pub leased: u64,
    pub idle_polls: u64,
    pub conflicts: u64,
    /// Who holds a round loop's fleet duty, as of its last round.
    pub duty: Option<Holder>,
    /// The last failure: when, and its cause.
    pub last_error: Option<(SystemTime, String)>,
    /// How long its works took (given back ones too).
    pub durations: Durations,
    /// The loop's own counters (a round's `Counters`), for a view that
    /// knows their type ([`LoopStatus::counters`]).
    pub own: Option<Arc<dyn Any + Send + Sync>>,
}

impl LoopStatus {
    /// The loop's own counters, if they are a `T`.
    pub fn counters<T: 'static>(&self) -> Option<&T> {
        self.own.as_ref()?.downcast_ref::<T>()
    }
}

/// Asks a runner for its [`LoopStatus`].
#[derive(Message)]
#[rtype(result = "LoopStatus")]
pub struct GetLoopStatus;

/// Stop starting work (a drain): a lease loop leases nothing more and its
/// workers go on; a round loop runs no more rounds. Its supervisor no
/// longer hears of it stopping.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Drain;

/// Sent to a runner's supervisor when it stops by itself.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct LoopStopped {
    pub name: &'static str,
}

/// Runs the named loop now (a round; a lease loop looks for work): an
/// operator just asked for something it does.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct NudgeLoop(pub &'static str);
