//! Tenants on networks of their own, on a real switch: Open vSwitch in
//! user space in a network namespace, managed over SSH by an sshd in that
//! namespace (`shepherd_sim::testing::OvsSwitch`). Each machine's NIC is
//! a namespace of its own on a switch port, so isolation is shown by
//! traffic (ARP and TCP), never by reading configuration back.
//!
//! The machines are a simulated owned rack (`fleet-sim --provider
//! static`, taken over over SSH); their agents reach shepherd over the
//! host's loopback, so the NIC namespaces stand for their data ports. A
//! namespace on the provisioning VLAN stands for shepherd's services, one
//! on the BMC VLAN for a BMC.
//!
//! Needs root (network namespaces); skipped, saying so, without it.
//!
//! - `lifecycle`: ports through a machine's life, isolation, faults;
//! - `tenants`: the Metal API's ports and virtual networks through
//!   Equinix's SDK, and layer 2 by traffic;
//! - `lldp`: the agent hears which switch port its NIC is on;
//! - `services`: shepherd's own DHCP, TFTP and boot HTTP, answering on
//!   its NIC on the switch, reached from the provisioning network only; a
//!   tenant's DHCP server never heard there;
//! - `trunk`: two switches joined by a trunk, a project's network across
//!   both, another project's apart.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use serde_json::{Value, json};
use shepherd_sim::testing::{
    Admin, Nic, OvsSwitch, OwnedRack, RackNetwork, ShepherdProcess, bin, is_root,
};

const PROVISIONING: u16 = 10;
const BMC: u16 = 20;
const IDLE: u16 = 4000;
const SERVICES: Ipv4Addr = Ipv4Addr::new(10, 90, 0, 100);
const A_BMC: Ipv4Addr = Ipv4Addr::new(10, 90, 0, 200);
const PORT: u16 = 8080;

/// Changes made twice: a port set to what shepherd set it to last time
/// while the switch still held that (read back before the change).
/// Setting it again after someone else changed it is no repeat.
const TWICE: &str = "SELECT count(*) FROM (SELECT after_native, after_tagged, before_native, \
        before_tagged, lag(after_native) OVER w AS n, lag(after_tagged) OVER w AS t \
      FROM switch_change WINDOW w AS (PARTITION BY switch_name, port_name ORDER BY change_id)) c \
     WHERE c.after_native IS NOT DISTINCT FROM c.n AND c.after_tagged = c.t \
       AND c.before_native IS NOT DISTINCT FROM c.n AND c.before_tagged IS NOT DISTINCT FROM c.t";

fn nic_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 90, 1, i as u8)
}

/// Each switch port's machine, and the project of the device on it.
async fn ports_of(admin: &Admin) -> BTreeMap<String, (String, Option<String>, Value)> {
    let mut out = BTreeMap::new();
    for d in admin.machine_details().await {
        let project = d["tenancy"]["device"]["project"]["id"]
            .as_str()
            .map(str::to_string);
        for p in d["ports"].as_array().into_iter().flatten() {
            out.insert(
                p["port"].as_str().unwrap().to_string(),
                (
                    d["machine"]["machine_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    project.clone(),
                    p.clone(),
                ),
            );
        }
    }
    out
}

/// Waits until every port in `want` holds its VLAN on the switch (read
/// by the test, with `ovs-vsctl`).
async fn until_tags(rack: &mut OwnedRack, sw: &OvsSwitch, want: &[(&str, u16)], what: &str) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(p, v)| (p.to_string(), v.to_string()))
        .collect();
    rack.shepherd
        .until(
            Duration::from_secs(120),
            Duration::from_millis(200),
            async || {
                let seen: Vec<(String, String)> =
                    want.iter().map(|(p, _)| (p.clone(), sw.tag(p))).collect();
                if seen == want {
                    Ok(())
                } else {
                    Err(format!("{what}: the switch holds {seen:?}, not {want:?}"))
                }
            },
        )
        .await
}

/// The reachability of every pair, as seen: (from, to, reached).
async fn pairs(nics: &[(&str, &Nic)], to: &[(&str, Ipv4Addr)]) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    for (from, nic) in nics {
        for (name, ip) in to {
            if *ip == nic.ip {
                continue;
            }
            out.push((
                from.to_string(),
                name.to_string(),
                nic.reaches(*ip, PORT, Duration::from_secs(2)).await,
            ));
        }
    }
    out
}

/// A rack of `n` machines (from `first`) whose NICs are `sw`'s ports p1..pn, shepherd
/// moving them (and the key file it logs in to the switch with).
async fn rack_on(
    sw: &OvsSwitch,
    n: usize,
    first: Ipv4Addr,
) -> (OwnedRack, tempfile::NamedTempFile) {
    rack_with(sw, n, first, None, &|_| {}).await
}

/// As [`rack_on`], shepherd and the fleet inside `inside` (a NIC on the
/// switch) if given, the configuration edited further by `more`.
async fn rack_with(
    sw: &OvsSwitch,
    n: usize,
    first: Ipv4Addr,
    inside: Option<&shepherd_sim::testing::Netns>,
    more: &dyn Fn(&mut toml::Table),
) -> (OwnedRack, tempfile::NamedTempFile) {
    let key_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key_file.path(), &sw.client_key).unwrap();
    let address = match inside {
        None => sw.ssh,
        Some(ns) => sw.ssh_from(ns),
    };
    let (address, key_path) = (address.to_string(), key_file.path().display().to_string());
    let db = sw.db.display().to_string();
    let edit = move |t: &mut toml::Table| {
        let network: toml::Table = toml::from_str(&format!(
            "provisioning_vlan = {PROVISIONING}\nidle_vlan = {IDLE}\nbmc_vlan = {BMC}\n\
             tenant_vlans = \"1000-1999\"\ninterval = \"500ms\"\ntimeout = \"5s\"\n\
             [[switches]]\nname = \"leaf1\"\ndriver = \"ovs\"\naddress = \"{address}\"\n\
             private_key = {{ file = \"{key_path}\" }}\novs_db = \"unix:{db}\"\n"
        ))
        .unwrap();
        t.insert("network".into(), network.into());
        let machines = t["provider"]["inventory"]["machines"]
            .as_array_mut()
            .unwrap();
        for (i, m) in machines.iter_mut().enumerate() {
            let port: toml::Value = toml::from_str::<toml::Table>(&format!(
                "p = [{{ switch = \"leaf1\", port = \"p{}\" }}]",
                i + 1
            ))
            .unwrap()["p"]
                .clone();
            m.as_table_mut().unwrap().insert("ports".into(), port);
        }
        more(t);
    };
    let rack = match inside {
        None => OwnedRack::start_edited(n, first, "1s", 16 << 20, &[], &edit).await,
        Some(ns) => OwnedRack::start_inside(ns, n, first, "1s", 16 << 20, &[], &edit).await,
    };
    (rack, key_file)
}

/// Creates a device named `host` in `project` and returns its ID.
async fn device(rack: &OwnedRack, project: uuid::Uuid, token: &str, host: &str) -> String {
    device_with(rack, project, token, host, json!({})).await
}

/// As [`device`], with more of the create's fields (`more`, an object:
/// `hardware_reservation_id`, …).
async fn device_with(
    rack: &OwnedRack,
    project: uuid::Uuid,
    token: &str,
    host: &str,
    more: Value,
) -> String {
    let mut body = json!({"metro": "sv", "plan": OwnedRack::PLAN,
                          "operating_system": OwnedRack::OPERATING_SYSTEM, "hostname": host});
    body.as_object_mut()
        .unwrap()
        .extend(more.as_object().cloned().unwrap_or_default());
    // No machine while one is still leased (work finishing on it under
    // a loaded machine): asked again, for up to a minute.
    let until = std::time::Instant::now() + Duration::from_secs(60);
    let (s, d) = loop {
        let (s, d) = rack
            .admin
            .call(
                "POST",
                &format!("/metal/v1/projects/{project}/devices"),
                Some(token),
                Some(body.clone()),
            )
            .await;
        let leased = async || rack.admin.counts().await.get("leased").copied();
        if s == 422 && std::time::Instant::now() < until && leased().await.unwrap_or(0) > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        break (s, d);
    };
    assert_eq!(s, 201, "{d}");
    d["id"].as_str().unwrap().to_string()
}

/// A new virtual network of `project` in the test's metro, as the API
/// answered it.
async fn virtual_network(
    rack: &OwnedRack,
    project: uuid::Uuid,
    token: &str,
    description: &str,
) -> Value {
    let (s, vn) = rack
        .admin
        .call(
            "POST",
            &format!("/metal/v1/projects/{project}/virtual-networks"),
            Some(token),
            Some(json!({"metro": "sv", "description": description})),
        )
        .await;
    assert_eq!(s, 201, "{vn}");
    vn
}

/// A device's bond port's ID.
async fn bond_of(rack: &OwnedRack, device: &str, token: &str) -> String {
    let (s, d) = rack
        .admin
        .call(
            "GET",
            &format!("/metal/v1/devices/{device}"),
            Some(token),
            None,
        )
        .await;
    assert_eq!(s, 200, "{d}");
    d["network_ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "bond0")
        .unwrap_or_else(|| panic!("no bond0: {d:#}"))["id"]
        .as_str()
        .unwrap()
        .to_string()
}

mod lifecycle;
mod lldp;
mod services;
mod tenants;
mod trunk;
