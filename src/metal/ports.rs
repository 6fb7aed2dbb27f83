//! The representations of ports, virtual networks, VLAN assignments and
//! their batches, as the Metal API's description has them (nulls are
//! dropped by `json::answer`).

use serde_json::{Value, json};
use uuid::Uuid;

use super::json::{BASE, metro, time};
use crate::bmdb::devices::ports::{DevicePort, network_type};
use crate::bmdb::tenants::networks::VirtualNetwork;

fn href(path: String) -> Value {
    json!({ "href": format!("{BASE}{path}") })
}

/// A virtual network.
pub fn virtual_network(n: &VirtualNetwork) -> Value {
    json!({
        "id": n.id,
        "vxlan": n.vxlan,
        "description": n.description,
        "tags": n.tags,
        "created_at": time(n.created_at),
        "href": format!("{BASE}/virtual-networks/{}", n.id),
        "metro": metro(&n.metro),
        "metro_code": n.metro,
        "assigned_to": href(format!("/projects/{}", n.project_id)),
        "assigned_to_virtual_circuit": false,
        "instances": n.devices.iter().map(|d| href(format!("/devices/{d}"))).collect::<Vec<_>>(),
        "metal_gateways": [],
    })
}

/// A network a port refers to: its href, ID and VLAN.
fn network_ref(id: Uuid, vxlan: i32) -> Value {
    json!({
        "id": id,
        "vxlan": vxlan,
        "href": format!("{BASE}/virtual-networks/{id}"),
    })
}

/// A device's port, among all of the device's (`all`, for the bond and
/// the network type).
pub fn port(p: &DevicePort, all: &[DevicePort]) -> Value {
    let bond = all.iter().find(|x| x.is_bond());
    json!({
        "id": p.id,
        "name": p.name,
        "type": if p.is_bond() { "NetworkBondPort" } else { "NetworkPort" },
        "network_type": network_type(all),
        "data": { "bonded": p.bonded, "mac": p.mac },
        "bond": (!p.is_bond() && p.bonded).then(|| bond.map(|b| json!({ "id": b.id, "name": b.name }))),
        "disbond_operation_supported": true,
        "native_virtual_network": p.native.as_ref().map(|n| network_ref(n.id, n.vxlan)),
        "virtual_networks": p.vlans.iter().map(|(n, ..)| network_ref(n.id, n.vxlan)).collect::<Vec<_>>(),
        "href": format!("{BASE}/ports/{}", p.id),
    })
}

/// A device's `network_ports`: the bond first, then each NIC.
pub fn network_ports(all: &[DevicePort]) -> Vec<Value> {
    all.iter().map(|p| port(p, all)).collect()
}

/// A port's assignments.
pub fn assignments(p: &DevicePort) -> Vec<Value> {
    p.vlans
        .iter()
        .map(|(n, id, created, updated)| {
            json!({
                "id": id,
                "vlan": n.vxlan,
                "native": p.native.as_ref().is_some_and(|x| x.id == n.id),
                "state": "assigned",
                "created_at": time(*created),
                "updated_at": time(*updated),
                "port": href(format!("/ports/{}", p.id)),
                "virtual_network": href(format!("/virtual-networks/{}", n.id)),
            })
        })
        .collect()
}

/// A batch: `completed` once the device's switch ports were read back as
/// wanted after it, `in_progress` until then.
pub fn batch(b: &crate::bmdb::devices::port_actions::Batch, port: Value, applied: bool) -> Value {
    let n = b.items.as_array().map_or(0, Vec::len);
    json!({
        "id": b.id,
        "state": if !b.errors.is_empty() { "failed" } else if applied { "completed" } else { "in_progress" },
        "quantity": n,
        "created_at": time(b.created_at),
        "updated_at": time(b.created_at),
        "error_messages": b.errors,
        "vlan_assignments": b.items,
        "port": port,
        "project": href(format!("/projects/{}", b.project_id)),
    })
}
