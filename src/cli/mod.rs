//! The `shepherd` command's BMDB client, one file per command group: the
//! schema (`migrate`), the fleet and operators' actions (`machines`),
//! installations (`install`), rollouts (`rollouts`), what is below
//! the operating system (`firmware`) and bringing it to its baseline
//! (`servicing`), the recovery brake
//! (`brake`), tenants' projects, tokens and devices (`tenants`), the
//! switches (`switches`). Each opens the BMDB itself with a small pool and prints what
//! it found or did; `main.rs` only parses the command line and dispatches.

pub mod brake;
pub mod firmware;
pub mod install;
pub mod machines;
pub mod migrate;
pub mod parse;
pub mod rollouts;
pub mod servicing;
pub mod switches;
pub mod tenants;
