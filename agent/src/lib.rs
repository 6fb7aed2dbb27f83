//! The agent's wing: the code that runs on the machines shepherd manages.
//!
//! `takeover-agent` ([`program`]) is uploaded over SSH to every
//! machine taken over, answers the takeover on stdin and then stays as the
//! resident agent, calling back with heartbeats and its hardware report.
//! shepherd itself uses this crate for the protocol's messages and the
//! judging of an agent's reply, never the other way round: nothing here
//! knows the BMDB, actix or the admin server, so the agent carries only
//! what a machine needs (ARCHITECTURE.md, "The house").
//!
//! - [`api`]: the protobuf messages (CONTRACTS.md §1 and §4), generated
//!   from `proto/` at build time.
//! - [`takeover`]: the takeover exchange's init message and the judge of
//!   its reply.
//! - [`resident`]: the heartbeat loop, parameterised by a [`resident::Host`].
//! - [`callback`]: how an agent reaches the callback (TLS, gRPC, endpoint).
//! - [`hardware`]: the hardware report read from /proc and /sys, and its
//!   summary for operators.
//! - [`install`]: operating system images written to a disk, streamed,
//!   verified, resumed, bounded (CONTRACTS.md §4a).
//! - [`files`]: private files (state, keys).
//! - [`program`]: the `takeover-agent` program itself.

/// Generated from `proto/agent.proto` and `proto/callback.proto`.
#[allow(clippy::large_enum_variant)]
pub mod api {
    include!(concat!(env!("OUT_DIR"), "/cloud.agent.api.rs"));
}

pub mod callback;
pub mod files;
pub mod hardware;
pub mod install;
pub mod program;
pub mod resident;
pub mod takeover;

pub use takeover::{AGENT_KEY_LEN, ReplyError, Takeover, check_reply, init_message};
