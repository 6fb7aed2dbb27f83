//! The Equinix Metal API: the client actor, its models, and a simulator of
//! the subset shepherd uses.

pub mod client;
pub mod metrics;
pub mod model;
pub mod sim;

pub use client::{ClientSettings, EquinixApi, EquinixClient, EquinixError, WITNESS_TAG_PREFIX};
pub use metrics::{ApiMetrics, Operation};
