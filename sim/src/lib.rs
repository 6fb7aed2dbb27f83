//! The simulated floor: everything that stands in for the outside world,
//! for the demo, the tests and the benchmarks: the `shepherd-sim` crate,
//! beside the service. Nothing in the service imports it; shepherd's tests
//! and benchmarks take it as a dev-dependency, so what ships (the package,
//! the container) holds no simulator and no test support.
//!
//! - [`equinix`]: the Equinix Metal API simulator (`equinix-sim`).
//! - [`machine`]: machines that answer SSH and run the uploaded agent.
//! - [`bmc`]: Redfish BMCs for the simulated machines.
//! - [`pxe`]: the machines' network boot (PXE ROM, iPXE), against
//!   shepherd's real network boot service in a namespace.
//! - [`rack`]: blank owned machines booted through their BMCs and the
//!   network (`fleet-sim --boot network`).
//! - [`fleet`]: a whole simulated fleet as a process (`fleet-sim`).
//! - [`demo`]: `shepherd-demo` (the quick start of README.md and
//!   docs/src/install.md, `scripts/demo`), the service run against the
//!   above.
//! - [`testing`]: test support (databases, sshd, PostgreSQL and BMC
//!   emulators as processes) for `tests/` and `benches/`.

pub mod bmc;
pub mod demo;
pub mod demo_lock;
pub mod equinix;
pub mod fleet;
pub mod machine;
pub mod pxe;
pub mod rack;
#[doc(hidden)]
pub mod testing;

pub use testing::bin;
