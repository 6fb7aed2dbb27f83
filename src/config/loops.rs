//! What every lease loop's section shares (`parallelism`, `poll_interval`
//! and the backoff a failure earns), declared once and flattened into the
//! sections of the loops that work under leases (`[initializer]`,
//! `[enroller]`, `[recoverer]`). Each loop keeps its own defaults (a
//! [`LeaseDefaults`]), so a section that sets one key keeps the others of
//! its loop, not of another.
//!
//! serde buffers the keys of a flattened struct, which loses their path:
//! each field here names itself in its error (`keyed`), and the loader
//! puts that name back on the key it reports.

use std::marker::PhantomData;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, de::Error as _};

use super::error::ConfigError;
use crate::backoff::Backoff;

/// A loop's defaults for its lease settings, and the section they are in.
pub trait LeaseDefaults {
    const SECTION: &'static str;
    const PARALLELISM: u32;
    const POLL_INTERVAL: Duration;
    const BACKOFF_INITIAL: Duration;
    const BACKOFF_MAX: Duration;
    const BACKOFF_EXPONENT: f64;
    const BACKOFF_JITTER: f64 = 0.1;
}

/// The settings of a loop that works on leased machines.
#[derive(Deserialize, Serialize)]
#[serde(default, bound = "")]
pub struct LeaseSettings<D: LeaseDefaults> {
    /// Machines worked on at once.
    #[serde(deserialize_with = "parallelism")]
    pub parallelism: u32,
    /// How often to look for work when there was none.
    #[serde(
        serialize_with = "humantime_serde::serialize",
        deserialize_with = "poll_interval"
    )]
    pub poll_interval: Duration,
    /// The first wait after a failure...
    #[serde(
        serialize_with = "humantime_serde::serialize",
        deserialize_with = "backoff_initial"
    )]
    pub backoff_initial: Duration,
    /// ...the longest...
    #[serde(
        serialize_with = "humantime_serde::serialize",
        deserialize_with = "backoff_max"
    )]
    pub backoff_max: Duration,
    /// ...and by how much each failure after a failure multiplies it.
    #[serde(deserialize_with = "backoff_exponent")]
    pub backoff_exponent: f64,
    /// Waits are lengthened by up to this fraction, at random.
    #[serde(deserialize_with = "backoff_jitter")]
    pub backoff_jitter: f64,
    #[serde(skip)]
    loop_defaults: PhantomData<fn() -> D>,
}

impl<D: LeaseDefaults> Default for LeaseSettings<D> {
    fn default() -> Self {
        LeaseSettings {
            parallelism: D::PARALLELISM,
            poll_interval: D::POLL_INTERVAL,
            backoff_initial: D::BACKOFF_INITIAL,
            backoff_max: D::BACKOFF_MAX,
            backoff_exponent: D::BACKOFF_EXPONENT,
            backoff_jitter: D::BACKOFF_JITTER,
            loop_defaults: PhantomData,
        }
    }
}

impl<D: LeaseDefaults> Clone for LeaseSettings<D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D: LeaseDefaults> Copy for LeaseSettings<D> {}

impl<D: LeaseDefaults> std::fmt::Debug for LeaseSettings<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseSettings")
            .field("section", &D::SECTION)
            .field("parallelism", &self.parallelism)
            .field("poll_interval", &self.poll_interval)
            .field("backoff", &self.backoff())
            .finish()
    }
}

impl<D: LeaseDefaults> LeaseSettings<D> {
    /// The backoff a failure earns a machine.
    pub fn backoff(&self) -> Backoff {
        Backoff {
            initial: self.backoff_initial,
            maximum: Some(self.backoff_max),
            exponent: self.backoff_exponent,
            jitter: self.backoff_jitter,
        }
    }

    /// Checks the settings, naming the key that is wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let key = |k: &str| format!("{}.{k}", D::SECTION);
        ConfigError::within(key("parallelism"), self.parallelism, 1..=1024)?;
        ConfigError::positive(key("poll_interval"), self.poll_interval)?;
        self.backoff()
            .validate()
            .map_err(|m| ConfigError::key(key("backoff"), m))
    }
}

/// The mark around a field's name in a flattened field's error, which the
/// loader moves into the key it reports (`initializer.parallelism`).
pub(super) const FIELD_MARK: char = '\u{1f}';

/// Deserializes `T`, naming `field` in the error.
fn keyed<'de, De: Deserializer<'de>, T: Deserialize<'de>>(
    field: &str,
    d: De,
) -> Result<T, De::Error> {
    T::deserialize(d).map_err(|e| De::Error::custom(format!("{FIELD_MARK}{field}{FIELD_MARK}{e}")))
}

fn keyed_duration<'de, De: Deserializer<'de>>(field: &str, d: De) -> Result<Duration, De::Error> {
    humantime_serde::deserialize(d)
        .map_err(|e: De::Error| De::Error::custom(format!("{FIELD_MARK}{field}{FIELD_MARK}{e}")))
}

fn parallelism<'de, De: Deserializer<'de>>(d: De) -> Result<u32, De::Error> {
    keyed("parallelism", d)
}

fn poll_interval<'de, De: Deserializer<'de>>(d: De) -> Result<Duration, De::Error> {
    keyed_duration("poll_interval", d)
}

fn backoff_initial<'de, De: Deserializer<'de>>(d: De) -> Result<Duration, De::Error> {
    keyed_duration("backoff_initial", d)
}

fn backoff_max<'de, De: Deserializer<'de>>(d: De) -> Result<Duration, De::Error> {
    keyed_duration("backoff_max", d)
}

fn backoff_exponent<'de, De: Deserializer<'de>>(d: De) -> Result<f64, De::Error> {
    keyed("backoff_exponent", d)
}

fn backoff_jitter<'de, De: Deserializer<'de>>(d: De) -> Result<f64, De::Error> {
    keyed("backoff_jitter", d)
}

/// The key and message of a deserialization error at `path`: a flattened
/// field's marked name joins the path.
pub(super) fn keyed_error(path: String, message: &str) -> (String, String) {
    let mut parts = message.splitn(3, FIELD_MARK);
    match (parts.next(), parts.next(), parts.next()) {
        (Some(before), Some(field), Some(rest)) => {
            let key = if path == "." || path.is_empty() {
                field.to_string()
            } else {
                format!("{path}.{field}")
            };
            (key, format!("{before}{rest}"))
        }
        _ => (path, message.to_string()),
    }
}

/// The Initializer's defaults: takeovers are slow to retry (an SSH refusal
/// rarely mends itself within minutes).
pub struct InitializerLease;
impl LeaseDefaults for InitializerLease {
    const SECTION: &'static str = "initializer";
    const PARALLELISM: u32 = 8;
    const POLL_INTERVAL: Duration = Duration::from_secs(1);
    const BACKOFF_INITIAL: Duration = Duration::from_secs(5 * 60);
    const BACKOFF_MAX: Duration = Duration::from_secs(4 * 3600);
    const BACKOFF_EXPONENT: f64 = 1.2;
}

/// The Enroller's defaults.
pub struct EnrollerLease;
impl LeaseDefaults for EnrollerLease {
    const SECTION: &'static str = "enroller";
    const PARALLELISM: u32 = 8;
    const POLL_INTERVAL: Duration = Duration::from_secs(1);
    const BACKOFF_INITIAL: Duration = Duration::from_secs(60);
    const BACKOFF_MAX: Duration = Duration::from_secs(2 * 3600);
    const BACKOFF_EXPONENT: f64 = 2.0;
}

/// The Recoverer's defaults.
pub struct RecovererLease;
impl LeaseDefaults for RecovererLease {
    const SECTION: &'static str = "recoverer";
    const PARALLELISM: u32 = 4;
    const POLL_INTERVAL: Duration = Duration::from_secs(5);
    const BACKOFF_INITIAL: Duration = Duration::from_secs(60);
    const BACKOFF_MAX: Duration = Duration::from_secs(3600);
    const BACKOFF_EXPONENT: f64 = 1.2;
}

/// The Servicer's defaults: a failed servicing is the machine's
/// (`service-failed`); the backoff is for shepherd's own faults.
pub struct ServicerLease;
impl LeaseDefaults for ServicerLease {
    const SECTION: &'static str = "servicing";
    const PARALLELISM: u32 = 16;
    const POLL_INTERVAL: Duration = Duration::from_secs(2);
    const BACKOFF_INITIAL: Duration = Duration::from_secs(60);
    const BACKOFF_MAX: Duration = Duration::from_secs(3600);
    const BACKOFF_EXPONENT: f64 = 2.0;
}
