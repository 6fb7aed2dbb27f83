//! The protocol between shepherd and its agent, apart from either
//! program: what the service needs to speak to agents and to judge what
//! they say, and what the agent needs to answer. The service depends on
//! this crate, not on the agent (whose disk writer, HTTP client and
//! decompressors it has no use for); the agent depends on it too.
//!
//! - [`api`]: the protobuf messages (CONTRACTS.md §1 and §4), generated
//!   from the `.proto` files beside this crate at build time.
//! - [`boot`]: the per-boot data of the boot image and the live agent's
//!   enrollment (CONTRACTS.md §5).
//! - [`takeover`]: the takeover's init message and the judge of its reply.
//! - [`digest`]: an image's digest as an installation request names it.
//! - [`manifest`]: an image's manifest, its chunks by SHA-256.
//! - [`first_boot`]: the first-boot files' names, as both sides check them.
//! - [`names`]: erase modes and phases as people name them, and the
//!   checks of an erasure both ends make.
//! - [`summary`]: a stored hardware report, decoded for operators.
//! - [`callback`]: the callback's method paths, endpoint form, TLS errors.
//! - [`files`]: files written whole or not at all (state, keys, shepherd's
//!   secrets, the fleet CA it publishes).

/// Generated from `agent.proto`, `callback.proto` and `bmaas_server.proto`.
#[allow(clippy::large_enum_variant)]
pub mod api {
    include!(concat!(env!("OUT_DIR"), "/cloud.agent.api.rs"));
}

/// Generated from `boot.proto`: one boot of the boot image, and its live
/// agent's enrollment (CONTRACTS.md §5).
pub mod boot {
    include!(concat!(env!("OUT_DIR"), "/shepherd.boot.v1.rs"));
}

pub mod callback;
pub mod digest;
pub mod files;
pub mod first_boot;
pub mod manifest;
pub mod names;
pub mod summary;
pub mod takeover;

pub use takeover::{AGENT_KEY_LEN, ReplyError, Takeover, check_reply, init_message};
