//! The Equinix Metal API: the client actor and its models. (The simulator
//! of the subset shepherd uses is `sim::equinix`, apart from the service.)

pub mod client;
pub mod metrics;
pub mod model;

pub use client::{ClientSettings, EquinixApi, EquinixClient, EquinixError, WITNESS_TAG_PREFIX};
pub use metrics::{ApiMetrics, Operation};
