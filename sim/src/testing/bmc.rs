//! BMCs for tests: an inventory of hosts with their BMCs (what the
//! static provider reads of them), and simulated BMCs on loopback
//! addresses of the test's choosing.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use shepherd::config::{BmcConfig, InventoryConfig, InventoryMachine, RedfishConfig};
use shepherd::provider::inventory::Inventory;

use crate::bmc::{BmcSim, FirmwareOptions};

/// An inventory host at 127.0.0.1 with `bmc`.
pub fn inventory_host(id: &str, bmc: Option<BmcConfig>) -> InventoryMachine {
    InventoryMachine {
        id: id.into(),
        address: Some("127.0.0.1".parse().unwrap()),
        boot: None,
        location: None,
        bmc,
        mac: None,
        macs: Vec::new(),
        firmware: None,
        ports: Vec::new(),
    }
}

/// The static provider over `hosts`, with the default Redfish settings.
pub fn inventory_of(hosts: Vec<InventoryMachine>) -> Inventory {
    Inventory::new(
        &InventoryConfig {
            machines: hosts,
            file: None,
        },
        &RedfishConfig::default(),
        &Default::default(),
        None,
    )
}

/// Simulated BMCs on a free port of each of `addresses` (loopback), their
/// systems back 100 ms after a restart, their updates as `firmware` says.
pub fn sim_bmcs(addresses: &[&str], firmware: FirmwareOptions) -> BmcSim {
    let addresses: Vec<IpAddr> = addresses.iter().map(|a| a.parse().unwrap()).collect();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    BmcSim::start_with(
        &addresses,
        port,
        Duration::from_millis(100),
        Arc::new(|_| {}),
        firmware,
    )
    .unwrap()
}

/// The BMC settings of the simulated machine at `machine`.
pub fn sim_bmc(sim: &BmcSim, machine: &str) -> BmcConfig {
    BmcConfig::accepted(
        &sim.url(machine.parse().unwrap()),
        &sim.user,
        &sim.password,
        None,
        "verify",
    )
    .unwrap()
}
