//! The agent's wing: the code that runs on the machines shepherd manages.
//!
//! `takeover-agent` ([`program`]) is uploaded over SSH to every
//! machine taken over, answers the takeover on stdin and then stays as the
//! resident agent, calling back with heartbeats and its hardware report.
//! The protocol it shares with shepherd (the messages, the takeover's
//! judge, digests, the hardware summary) is the `shepherd-proto` crate,
//! re-exported here; shepherd depends on that, never on this: nothing
//! here knows the BMDB, actix or the admin server, and nothing of the
//! service compiles the disk writer (ARCHITECTURE.md, "The house").
//!
//! - [`api`], [`takeover`], [`files`]: from `shepherd-proto`.
//! - [`resident`]: the heartbeat loop, parameterised by a [`resident::Host`].
//! - [`callback`]: how an agent reaches the callback (TLS, gRPC, endpoint).
//! - [`hardware`]: the hardware report read from /proc and /sys, and its
//!   summary for operators; [`bmc_lan`]: the BMC's LAN channel, read
//!   in-band through the host's IPMI system interface.
//! - [`install`]: operating system images written to a disk, streamed,
//!   verified, resumed, bounded (CONTRACTS.md §4a).
//! - [`program`]: the `takeover-agent` program itself.

pub use shepherd_proto::{api, files, takeover};

pub mod bmc_lan;
pub mod callback;
pub mod firmware;
pub mod hardware;
pub mod install;
pub mod lldp;
pub mod program;
pub mod resident;

pub use takeover::{AGENT_KEY_LEN, ReplyError, Takeover, check_reply, init_message};
