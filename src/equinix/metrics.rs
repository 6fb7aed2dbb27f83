//! Counts and times of Equinix API requests, by operation and status.
//!
//! Shared by the client actors (which record) and the admin server's
//! registry (which reads): metric series, the one kind of state actors
//! share here.

use std::fmt;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

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

type Labels = [(&'static str, String); 2];

fn labels(op: Operation, status: &str) -> Labels {
    [
        ("operation", op.as_str().to_string()),
        ("status", status.to_string()),
    ]
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// Request counts and latencies, as Prometheus series. Cheap to clone;
/// clones share counts.
#[derive(Clone, Debug)]
pub struct ApiMetrics {
    requests: Family<Labels, Counter>,
    duration: Family<Labels, Histogram, fn() -> Histogram>,
    recent: std::sync::Arc<std::sync::Mutex<Recent>>,
}

impl Default for ApiMetrics {
    fn default() -> Self {
        ApiMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
            recent: Default::default(),
        }
    }
}

/// Requests per minute over the last hour: slot `minute % 60` holds
/// (minute, requests, throttled).
#[derive(Debug)]
struct Recent([(u64, u32, u32); 60]);

impl Default for Recent {
    fn default() -> Self {
        Recent([(0, 0, 0); 60])
    }
}

/// Requests in the last hour (the request budget's use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LastHour {
    pub requests: u64,
    /// Answered 429 (the API's rate limit).
    pub throttled: u64,
}

fn minute_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        / 60
}

impl ApiMetrics {
    /// Records one request. `status` is the HTTP status, or `error` when no
    /// response came.
    pub fn record(&self, op: Operation, status: &str, elapsed: Duration) {
        let l = labels(op, status);
        self.requests.get_or_create(&l).inc();
        let minute = minute_now();
        if let Ok(mut r) = self.recent.lock() {
            let slot = &mut r.0[(minute % 60) as usize];
            if slot.0 != minute {
                *slot = (minute, 0, 0);
            }
            slot.1 += 1;
            slot.2 += u32::from(status == "429");
        }
        self.duration
            .get_or_create(&l)
            .observe(elapsed.as_secs_f64());
    }

    /// Requests of `op` with `status` so far.
    pub fn count(&self, op: Operation, status: &str) -> u64 {
        self.requests
            .get(&labels(op, status))
            .map(|c| c.get())
            .unwrap_or(0)
    }

    /// Requests in the last 60 minutes (this one included).
    pub fn last_hour(&self) -> LastHour {
        let now = minute_now();
        let mut out = LastHour::default();
        if let Ok(r) = self.recent.lock() {
            for (minute, n, throttled) in r.0.iter() {
                if now.saturating_sub(*minute) < 60 {
                    out.requests += u64::from(*n);
                    out.throttled += u64::from(*throttled);
                }
            }
        }
        out
    }

    /// Adds the series to `r`: `shepherd_equinix_requests_total` and
    /// `shepherd_equinix_request_duration_seconds`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "shepherd_equinix_requests",
            "Equinix API requests by operation and status",
            self.requests.clone(),
        );
        r.register_with_unit(
            "shepherd_equinix_request_duration",
            "Equinix API request latency",
            Unit::Seconds,
            self.duration.clone(),
        );
    }
}
