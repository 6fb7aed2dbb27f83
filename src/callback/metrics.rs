//! The callback's Prometheus series: heartbeats by outcome, and the size
//! and write time of each batch. Recorded where things happen (the server
//! for refusals, the writer for the rest), read by the admin server's
//! registry.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// Why a heartbeat was or was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Accepted,
    /// Unknown machine, or a key that is not the one its takeover recorded.
    Unauthenticated,
    NoCertificate,
    /// Malformed: not a machine ID, a report that does not decode.
    Invalid,
    /// The BMDB did not take it.
    Unavailable,
}

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Outcome::Accepted,
        Outcome::Unauthenticated,
        Outcome::NoCertificate,
        Outcome::Invalid,
        Outcome::Unavailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Unauthenticated => "unauthenticated",
            Outcome::NoCertificate => "no_certificate",
            Outcome::Invalid => "invalid",
            Outcome::Unavailable => "unavailable",
        }
    }
}

type Labels = [(&'static str, &'static str); 1];

/// Upper bounds (seconds) of the write latency histogram.
pub const WRITE_BUCKETS: [f64; 8] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 5.0];
/// Upper bounds of the batch size histogram.
pub const BATCH_BUCKETS: [f64; 5] = [1.0, 10.0, 100.0, 1000.0, 10000.0];

/// Cheap to clone; clones share the series.
#[derive(Clone, Debug)]
pub struct HeartbeatMetrics {
    heartbeats: Family<Labels, Counter>,
    pub batch_size: Histogram,
    pub write_seconds: Histogram,
}

impl Default for HeartbeatMetrics {
    fn default() -> Self {
        let heartbeats = Family::default();
        // Every outcome is a series from the start, at 0.
        for o in Outcome::ALL {
            let _ = heartbeats.get_or_create(&[("result", o.as_str())]);
        }
        HeartbeatMetrics {
            heartbeats,
            batch_size: Histogram::new(BATCH_BUCKETS),
            write_seconds: Histogram::new(WRITE_BUCKETS),
        }
    }
}

impl HeartbeatMetrics {
    pub fn count(&self, outcome: Outcome, n: u64) {
        self.heartbeats
            .get_or_create(&[("result", outcome.as_str())])
            .inc_by(n);
    }

    /// Heartbeats with `outcome` so far.
    pub fn get(&self, outcome: Outcome) -> u64 {
        self.heartbeats
            .get_or_create(&[("result", outcome.as_str())])
            .get()
    }

    pub fn register(&self, r: &mut Registry) {
        r.register(
            "shepherd_heartbeats",
            "Agent heartbeats by outcome",
            self.heartbeats.clone(),
        );
        r.register(
            "shepherd_heartbeat_batch_size",
            "Heartbeats written per statement",
            self.batch_size.clone(),
        );
        r.register_with_unit(
            "shepherd_heartbeat_write",
            "Time to write one batch of heartbeats",
            Unit::Seconds,
            self.write_seconds.clone(),
        );
    }
}
