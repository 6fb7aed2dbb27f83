//! Test support: every test gets its own freshly migrated database.
//!
//! The server is `SHEPHERD_TEST_DATABASE_URL` if set, else PostgreSQL on
//! 127.0.0.1:5432 if it answers (unless `SHEPHERD_TEST_EMBEDDED` is set),
//! else an embedded server (the same code the
//! service uses without `bmdb.url`), started once per test binary in the
//! temporary directory and stopped when the binary exits. Databases are dropped when
//! their [`TestDb`] is.
//!
//! The support is split by job:
//!
//! - `admin`: a running shepherd's admin API, command line and metrics,
//!   as an operator drives them ([`Admin`]); `rack`: a simulated owned
//!   rack under one shepherd ([`OwnedRack`]).
//! - `db`: test databases ([`TestDb`]), a PostgreSQL of the test's own
//!   ([`OwnPostgres`]) and helpers that read and seed the BMDB.
//! - `sshd`: a private OpenSSH sshd ([`Sshd`]).
//! - `sushy`: the Redfish emulator sushy-tools as a process ([`Sushy`]);
//!   `bmc`: inventories of hosts with BMCs, simulated BMCs ([`sim_bmcs`]).
//! - `processes`: the workspace's binaries as processes ([`bin`],
//!   [`FleetSimProcess`], a fleet in several of them ([`FleetShares`]),
//!   [`ShepherdProcess`]), pgbench and memory use.
//! - `boot`: a stand-in boot image, its boot data, the live agent and
//!   fetching as a BMC does.
//! - `browser`: the admin pages in a headless browser ([`browse`]).
//! - `netns`: network namespaces a test makes ([`Netns`]), and a rack's
//!   two joined by its provisioning link ([`RackNetwork`]).
//! - `ovs`: a real switch, Open vSwitch in user space in a namespace,
//!   managed over SSH ([`OvsSwitch`]), and machines' NICs on its ports.
//! - `ipmi_sim`: OpenIPMI's BMC emulator with Serial-over-LAN in front of
//!   a QEMU guest ([`IpmiSim`]).

mod admin;
mod bmc;
mod boot;
mod browser;
mod builds;
mod db;
mod ipmi_sim;
mod netns;
mod ovs;
mod processes;
mod rack;
mod sshd;
mod sushy;

pub use admin::Admin;
pub use bmc::{inventory_host, inventory_of, sim_bmc, sim_bmcs};
pub use boot::{
    BOOT_SLOT_AT, BOOT_SLOT_LEN, boot_data_file, boot_image_stand_in, fetch_as_bmc,
    fetch_as_bmc_with, gpt_image, https_client, image_server, live_agent,
};
pub use browser::{browse, page, screenshot};
pub use builds::{bin, shipped_agent, stripped_copy};
pub use db::{
    OwnPostgres, TEST_ENDPOINT, TestDb, asked_machine, count, installation_history, machine, pairs,
    serve_test_endpoint, served_since,
};
pub use ipmi_sim::{IPMI_SIM_PASSWORD, IPMI_SIM_USER, IpmiSim, ipmi_sim_usable};
pub use netns::{Netns, RackNetwork, is_root};
pub use ovs::{Lldpd, Nic, OvsSwitch, ovs_usable};
pub use processes::{
    FleetShares, FleetSimProcess, ShepherdProcess, cpu_seconds, installed_by_hand, loopback_env,
    peak_rss_mb, pgbench, succeed,
};
pub use rack::{Deprovisioned, OwnedRack};
pub use sshd::Sshd;
pub use sushy::Sushy;
