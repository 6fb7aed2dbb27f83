//! Operating system installations as the BMDB keeps them: an operator's
//! request becomes the next generation of the machine's
//! `machine_os_installation_request` (CONTRACTS.md §2, §4a), with who
//! asked and for which image beside it (`machine_installation`); agents'
//! progress and reports arrive through the callback; the history says
//! requested, installed, failed. One file per job:
//!
//! - `ask.rs`: asking for an installation or a deprovisioning, in steps;
//! - `request.rs`: what a request holds and how it is checked (the image,
//!   the first-boot data filled per machine);
//! - `kind.rs`: an installation or an erasure, the one word for each;
//! - `view.rs`: an installation read back, with its progress and history;
//! - `download.rs`: which agent may download which served image;
//! - `swarm.rs`: the machines installing one image, fetching its chunks
//!   from each other;
//! - `deadline.rs`: an unanswered generation on which nothing moved for
//!   too long, failed with its cause.

mod ask;
mod deadline;
mod download;
mod kind;
mod request;
pub mod swarm;
mod view;

pub use ask::{Asked, Asker, ErasureOfAccepted, Work, ask, ask_for, deprovision, erase_accepted};
pub use deadline::{TimedOut, fail_stalled, in_hand, stalled_cause};
pub use download::{DownloadGrant, download_grant, served_name};
pub use kind::Kind;
pub use request::{
    MAX_FIRST_BOOT, check_erasure, check_first_boot_path, check_image, erase_mode_name,
    fill_first_boot, first_boot_summary,
};
pub use view::{HistoryEntry, Installation, UnderWay, installation, report_error, under_way};
