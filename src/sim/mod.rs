//! The simulated floor: everything that stands in for the outside world,
//! for the demo, the tests and the benchmarks. Nothing in the service
//! imports it, and the service builds without it (the `sim` feature, on by
//! default; `cargo check --no-default-features` builds shepherd alone).
//!
//! - [`equinix`]: the Equinix Metal API simulator (`equinix-sim`).
//! - [`machine`]: machines that answer SSH and run the uploaded agent.
//! - [`bmc`]: Redfish BMCs for the simulated machines.
//! - [`fleet`]: a whole simulated fleet as a process (`fleet-sim`).
//! - [`demo`]: `shepherd demo`, the service run against the above.
//! - [`testing`]: test support (databases, sshd, PostgreSQL and BMC
//!   emulators as processes) for `tests/` and `benches/`.

pub mod bmc;
pub mod demo;
pub mod equinix;
pub mod fleet;
pub mod machine;
#[doc(hidden)]
pub mod testing;
