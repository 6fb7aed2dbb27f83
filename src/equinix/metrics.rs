//! Counts and times of Equinix API requests, by operation and status.
//!
//! Shared by the client actors (which record) and whoever exports metrics
//! (which reads): a registry, the one kind of state actors share here.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An Equinix API operation, as counted and as named in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    ListDevices,
    GetDevice,
    CreateDevice,
    DeleteDevice,
    RebootDevice,
    ListReservations,
    GetReservation,
    ListSshKeys,
    CreateSshKey,
    UpdateSshKey,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::ListDevices => "list_devices",
            Operation::GetDevice => "get_device",
            Operation::CreateDevice => "create_device",
            Operation::DeleteDevice => "delete_device",
            Operation::RebootDevice => "reboot_device",
            Operation::ListReservations => "list_reservations",
            Operation::GetReservation => "get_reservation",
            Operation::ListSshKeys => "list_ssh_keys",
            Operation::CreateSshKey => "create_ssh_key",
            Operation::UpdateSshKey => "update_ssh_key",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Upper bounds (seconds) of the latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestStats {
    pub count: u64,
    pub seconds_total: f64,
    /// Cumulative counts per `LATENCY_BUCKETS` bound.
    pub buckets: [u64; LATENCY_BUCKETS.len()],
}

/// A registry of request statistics. Cheap to clone; clones share counts.
#[derive(Clone, Default)]
pub struct ApiMetrics {
    inner: Arc<Mutex<BTreeMap<(Operation, String), RequestStats>>>,
}

impl ApiMetrics {
    /// Records one request. `status` is the HTTP status, or `error` when no
    /// response came.
    pub fn record(&self, op: Operation, status: &str, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let mut m = self.inner.lock().unwrap();
        let s = m.entry((op, status.to_string())).or_default();
        s.count += 1;
        s.seconds_total += secs;
        for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
            if secs <= *bound {
                s.buckets[i] += 1;
            }
        }
    }

    /// Every (operation, status) seen so far.
    pub fn snapshot(&self) -> Vec<(Operation, String, RequestStats)> {
        let m = self.inner.lock().unwrap();
        m.iter()
            .map(|((op, st), s)| (*op, st.clone(), s.clone()))
            .collect()
    }

    /// Requests of `op` with `status` so far.
    pub fn count(&self, op: Operation, status: &str) -> u64 {
        let m = self.inner.lock().unwrap();
        m.get(&(op, status.to_string()))
            .map(|s| s.count)
            .unwrap_or(0)
    }

    /// All requests so far.
    pub fn total(&self) -> u64 {
        self.inner.lock().unwrap().values().map(|s| s.count).sum()
    }
}
