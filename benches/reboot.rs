//! Reboots through BMCs: 200 inventory hosts whose BMCs are OpenStack's
//! Redfish emulator (sushy-tools, fake driver, one process), each reached
//! at its own address (127.0.2.x, forwarded to the emulator), so that each
//! host has a BMC of its own, as in a rack. All are rebooted at once
//! through the inventory provider with the global cap on BMC requests at
//! 1, 8 and 32; printed: the time until every reset was accepted, until
//! every host was seen off and on again, and the BMC requests per second.
//!
//!     cargo bench --bench reboot
//!
//! SHEPHERD_BENCH_HOSTS (default 200). The emulator's fake driver brings a
//! system back 1 to 11 s after a restart (at random), which bounds "all
//! back" from below.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use shepherd::bmdb::ProviderStatus;
use shepherd::config::{InventoryConfig, InventoryMachine, RedfishConfig};
use shepherd::provider::Provider;
use shepherd::provider::inventory::Inventory;
use shepherd_sim::testing::{Sshd, Sushy};

/// Forwards `port` of each address to `to`: many BMC addresses, one
/// emulator.
async fn forwarders(addresses: &[IpAddr], port: u16, to: SocketAddr) {
    for a in addresses {
        let l = tokio::net::TcpListener::bind(SocketAddr::new(*a, port))
            .await
            .unwrap();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = l.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
            }
        });
    }
}

/// Requests the emulator has logged so far.
fn requests(sushy: &Sushy) -> usize {
    sushy
        .log()
        .lines()
        .filter(|l| l.contains("\"GET ") || l.contains("\"POST "))
        .count()
}

fn main() {
    let hosts: usize = std::env::var("SHEPHERD_BENCH_HOSTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    actix_rt::System::new().block_on(async move {
        let names: Vec<String> = (0..hosts).map(|i| format!("node-{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let sushy = Sushy::start(&refs, "admin", "bench-pw-19e2");
        let to: SocketAddr = sushy.url.trim_start_matches("http://").parse().unwrap();
        let addresses: Vec<IpAddr> = (0..hosts)
            .map(|i| IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 0, 2, 1)) + i as u32)))
            .collect();
        let port = Sshd::free_port();
        forwarders(&addresses, port, to).await;
        let machines: Vec<InventoryMachine> = (0..hosts)
            .map(|i| {
                let mut bmc = sushy.bmc(i);
                bmc.url = format!("http://{}", SocketAddr::new(addresses[i], port));
                InventoryMachine {
                    id: names[i].clone(),
                    address: Some(addresses[i]),
                    boot: None,
                    location: None,
                    bmc: Some(bmc),
                    mac: None,
                    macs: Vec::new(),
                    firmware: None,
                    ports: Vec::new(),
                }
            })
            .collect();
        println!();
        println!(
            "Reboots of {hosts} hosts through their BMCs (sushy-tools fake driver, one process, a BMC address per host)"
        );
        println!("    cap   resets accepted s   all off and on again s   BMC requests/s");
        for cap in [1u32, 8, 32] {
            let inv = Inventory::new(
                &InventoryConfig {
                    machines: machines.clone(),
                    file: None,
                },
                &RedfishConfig {
                    max_concurrent: cap,
                    timeout: Duration::from_secs(60),
                    ..RedfishConfig::default()
                },
                &Default::default(),
                None,
            );
            // Everything on before the run.
            loop {
                let on = futures::future::join_all(names.iter().map(|n| inv.get_machine(n))).await;
                if on
                    .iter()
                    .all(|m| matches!(m, Ok(Some(m)) if m.status == ProviderStatus::Running))
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let before = requests(&sushy);
            let t = Instant::now();
            let accepted = futures::future::join_all(names.iter().map(|n| inv.reboot(n))).await;
            let accepted_s = t.elapsed().as_secs_f64();
            if let Some(Err(e)) = accepted.iter().find(|r| r.is_err()) {
                panic!("reboot failed: {e}");
            }
            // Each host seen off (the restart) then on again.
            let mut back = vec![false; hosts];
            while back.iter().any(|b| !b) {
                let states =
                    futures::future::join_all(names.iter().map(|n| inv.get_machine(n))).await;
                for (i, s) in states.iter().enumerate() {
                    if matches!(s, Ok(Some(m)) if m.status == ProviderStatus::Running) {
                        back[i] = true;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let back_s = t.elapsed().as_secs_f64();
            let rate = (requests(&sushy) - before) as f64 / back_s;
            println!("  {cap:>5}   {accepted_s:>17.2}   {back_s:>22.2}   {rate:>14.0}");
        }
        println!();
        println!(
            "One request in flight per BMC; the cap bounds requests to all BMCs together. A reboot is: read the system (reset types), reset."
        );
    });
}
