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
//!
//! The house (ARCHITECTURE.md): the service's modules below; the protocol
//! it shares with its agent in its own crate (`shepherd_proto`); the agent
//! that runs on machines in another (`shepherd_agent`, which the service
//! never depends on); everything simulated, and the test support, in
//! `shepherd_sim`, which only the tests, the benchmarks and the demo use.

/// The value of a `Result<T, HttpResponse>`, or, for its `Err`, that
/// response returned at once: the web handlers' early answer (the admin
/// API and pages, the Metal API).
macro_rules! attempt {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(r) => return r,
        }
    };
}

pub mod admin;
pub mod backoff;
pub mod baselines;
pub mod bmc;
pub mod bmdb;
pub mod brake_watch;
pub mod callback;
pub mod config;
pub mod console;
pub mod control;
pub mod deadlines;
pub mod devices;
pub mod enroller;
pub mod equinix;
pub mod fault;
pub mod fleet_tally;
pub mod images;
pub mod initializer;
pub mod ipmi;
pub mod mac;
pub mod metal;
pub mod netboot;
pub mod plan_labels;
pub mod provider;
pub mod provisioner;
pub mod recoverer;
pub mod redfish;
pub mod rollouts;
pub mod secret;
pub mod servicer;
pub mod sos;
pub mod ssh;
pub mod status;
pub mod supervisor;
pub mod switches;
pub mod takeover;
pub mod telemetry;
pub mod tls;
pub mod updater;

pub use bmdb::{Bmdb, BmdbError};
pub use config::{Config, ConfigError};
