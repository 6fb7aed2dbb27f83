//! shepherd takes fleets of bare-metal machines under management.
//!
//! It keeps the BMDB (the fleet database, on PostgreSQL) in sync with a
//! provider, takes over every new machine by starting an agent on it over
//! SSH, and recovers machines whose agent goes quiet. Many shepherd
//! processes can share one BMDB: all work on a machine happens under a work
//! lease tied to a heartbeated session. See ARCHITECTURE.md for the map.
//!
//! Used as a service (`shepherd run --config …`) or as a library inside an
//! existing actix application.

pub mod admin;
pub mod agent;
pub mod bmcsim;
pub mod bmdb;
pub mod callback;
pub mod config;
pub mod control;
pub mod demo;
pub mod equinix;
pub mod fleetsim;
pub mod hardware;
pub mod initializer;
pub mod machinesim;
pub mod provider;
pub mod provisioner;
pub mod recoverer;
pub mod redfish;
pub mod secret;
pub mod ssh;
pub mod supervisor;
pub mod telemetry;
#[doc(hidden)]
pub mod testing;
pub mod updater;

pub use bmdb::{Bmdb, BmdbError};
pub use config::{Config, ConfigError};
