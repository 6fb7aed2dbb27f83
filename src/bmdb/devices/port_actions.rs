//! What a tenant does to a device's ports (the Metal API's `/ports`):
//! assign and unassign virtual networks, convert to layer 2 or 3, bond and
//! disbond, the native VLAN, batches. Each changes what shepherd wants on
//! the switch ports; the switch ports' round makes it so and reads it back.
//! A NIC in the bond is changed through the bond.

use uuid::Uuid;

use super::super::tenants::networks::VirtualNetwork;
use super::super::{BmdbError, Tx};
use super::ports::DevicePort;

/// Why a port was not changed (the Metal API's 422), naming the port.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortRefusal {
    #[error("port {0} is in bond0: change the bond, or disbond the port first")]
    Bonded(String),
    #[error("bond0 holds no port: bond one first")]
    EmptyBond,
    #[error("virtual network {vxlan} is not assigned to port {port}")]
    NotAssigned { vxlan: i32, port: String },
    #[error("virtual network {vxlan} is in metro {network}, the device in {device}")]
    OtherMetro {
        vxlan: i32,
        network: String,
        device: String,
    },
    #[error("port {0} has virtual networks assigned: unassign them first")]
    HasNetworks(String),
    #[error(
        "port {0} is layer 3: its untagged network is the project's own (convert it to layer 2 first)"
    )]
    Layer3(String),
    #[error("bond0 is layer 2: convert it to layer 3 first")]
    BondLayer2,
}

type Acted = Result<Result<(), PortRefusal>, BmdbError>;

/// After a change of `p`'s device: its switch ports looked at again.
async fn changed(tx: &mut Tx<'_>, p: &DevicePort) -> Acted {
    crate::bmdb::switches::touch_device(tx, p.device_id).await?;
    Ok(Ok(()))
}

/// The port whose VLANs `p` carries: itself, unless a NIC in the bond.
fn owner(p: &DevicePort) -> Result<(), PortRefusal> {
    if !p.is_bond() && p.bonded {
        return Err(PortRefusal::Bonded(p.name.clone()));
    }
    if p.is_bond() && !p.bonded {
        return Err(PortRefusal::EmptyBond);
    }
    Ok(())
}

fn same_metro(n: &VirtualNetwork, device_metro: &str) -> Result<(), PortRefusal> {
    if n.metro != device_metro {
        return Err(PortRefusal::OtherMetro {
            vxlan: n.vxlan,
            network: n.metro.clone(),
            device: device_metro.to_string(),
        });
    }
    Ok(())
}

async fn add(tx: &mut Tx<'_>, port: Uuid, network: Uuid) -> Result<(), BmdbError> {
    tx.execute(
        "INSERT INTO device_port_vlan (assignment_id, port_id, virtual_network_id) \
         VALUES ($1, $2, $3) ON CONFLICT (port_id, virtual_network_id) DO NOTHING",
        &[&Uuid::new_v4(), &port, &network],
    )
    .await?;
    Ok(())
}

async fn set(tx: &mut Tx<'_>, sql: &'static str, port: Uuid) -> Result<(), BmdbError> {
    tx.execute(sql, &[&port]).await?;
    Ok(())
}

/// Assigns `n` to `p` (a layer-3 bond becomes hybrid-bonded).
pub async fn assign(tx: &mut Tx<'_>, p: &DevicePort, n: &VirtualNetwork, metro: &str) -> Acted {
    if let Err(e) = owner(p).and_then(|()| same_metro(n, metro)) {
        return Ok(Err(e));
    }
    add(tx, p.id, n.id).await?;
    changed(tx, p).await
}

/// Takes `n` off `p` (and as its native VLAN).
pub async fn unassign(tx: &mut Tx<'_>, p: &DevicePort, n: &VirtualNetwork) -> Acted {
    if let Err(e) = owner(p) {
        return Ok(Err(e));
    }
    let gone = tx
        .execute(
            "DELETE FROM device_port_vlan WHERE port_id = $1 AND virtual_network_id = $2",
            &[&p.id, &n.id],
        )
        .await?;
    if gone == 0 {
        return Ok(Err(PortRefusal::NotAssigned {
            vxlan: n.vxlan,
            port: p.name.clone(),
        }));
    }
    tx.execute(
        "UPDATE device_port SET native_network = NULL WHERE port_id = $1 AND native_network = $2",
        &[&p.id, &n.id],
    )
    .await?;
    changed(tx, p).await
}

/// Layer 2: the port leaves the project's own network (its VLANs only,
/// `n` assigned too if given).
pub async fn to_layer2(
    tx: &mut Tx<'_>,
    p: &DevicePort,
    n: Option<&VirtualNetwork>,
    metro: &str,
) -> Acted {
    if let Err(e) = owner(p) {
        return Ok(Err(e));
    }
    if let Some(n) = n {
        if let Err(e) = same_metro(n, metro) {
            return Ok(Err(e));
        }
        add(tx, p.id, n.id).await?;
    }
    set(
        tx,
        "UPDATE device_port SET layer2 = true WHERE port_id = $1",
        p.id,
    )
    .await?;
    changed(tx, p).await
}

/// Layer 3: the bond back on the project's own network with every NIC in
/// it (no VLAN may be assigned, as Equinix asks); a NIC rejoins the bond.
pub async fn to_layer3(tx: &mut Tx<'_>, p: &DevicePort, all: &[DevicePort]) -> Acted {
    let bond = all.iter().find(|x| x.is_bond());
    if p.is_bond() {
        if !p.vlans.is_empty() {
            return Ok(Err(PortRefusal::HasNetworks(p.name.clone())));
        }
        if let Some(n) = all
            .iter()
            .find(|x| !x.is_bond() && !x.bonded && !x.vlans.is_empty())
        {
            return Ok(Err(PortRefusal::HasNetworks(n.name.clone())));
        }
        set(
            tx,
            "UPDATE device_port SET layer2 = false, native_network = NULL, \
                    bonded = (name <> 'bond0') OR bonded \
              WHERE device_id = (SELECT device_id FROM device_port WHERE port_id = $1)",
            p.id,
        )
        .await?;
        return changed(tx, p).await;
    }
    if !p.vlans.is_empty() {
        return Ok(Err(PortRefusal::HasNetworks(p.name.clone())));
    }
    if bond.is_some_and(|b| b.layer2) {
        return Ok(Err(PortRefusal::BondLayer2));
    }
    set(
        tx,
        "UPDATE device_port SET bonded = true, layer2 = false, native_network = NULL WHERE port_id = $1",
        p.id,
    )
    .await?;
    changed(tx, p).await
}

/// Puts `p` (every NIC with `bulk`, or for the bond) in the bond; a NIC
/// with its own VLANs must shed them first.
pub async fn bond(tx: &mut Tx<'_>, p: &DevicePort, all: &[DevicePort], bulk: bool) -> Acted {
    let nics: Vec<&DevicePort> = all
        .iter()
        .filter(|x| !x.is_bond() && (bulk || p.is_bond() || x.id == p.id))
        .collect();
    if let Some(n) = nics.iter().find(|x| !x.bonded && !x.vlans.is_empty()) {
        return Ok(Err(PortRefusal::HasNetworks(n.name.clone())));
    }
    for n in nics {
        set(
            tx,
            "UPDATE device_port SET bonded = true, layer2 = false, native_network = NULL WHERE port_id = $1",
            n.id,
        )
        .await?;
    }
    changed(tx, p).await
}

/// Takes `p` (every NIC with `bulk`, or for the bond) out of the bond: a
/// NIC out of the bond is layer 2, with no VLAN until one is assigned.
pub async fn disbond(tx: &mut Tx<'_>, p: &DevicePort, all: &[DevicePort], bulk: bool) -> Acted {
    for n in all
        .iter()
        .filter(|x| !x.is_bond() && x.bonded && (bulk || p.is_bond() || x.id == p.id))
    {
        set(
            tx,
            "UPDATE device_port SET bonded = false, layer2 = true, native_network = NULL WHERE port_id = $1",
            n.id,
        )
        .await?;
    }
    changed(tx, p).await
}

/// Makes `n` (assigned to the layer-2 port `p`) its untagged VLAN; None
/// takes the native VLAN away.
pub async fn native(tx: &mut Tx<'_>, p: &DevicePort, n: Option<&VirtualNetwork>) -> Acted {
    if let Err(e) = owner(p) {
        return Ok(Err(e));
    }
    if let Some(n) = n {
        if !p.layer2 {
            return Ok(Err(PortRefusal::Layer3(p.name.clone())));
        }
        if !p.vlans.iter().any(|(v, ..)| v.id == n.id) {
            return Ok(Err(PortRefusal::NotAssigned {
                vxlan: n.vxlan,
                port: p.name.clone(),
            }));
        }
    }
    tx.execute(
        "UPDATE device_port SET native_network = $2 WHERE port_id = $1",
        &[&p.id, &n.map(|n| n.id)],
    )
    .await?;
    changed(tx, p).await
}

/// One assignment of a batch: a network, assigned or not, native or not.
#[derive(Debug, Clone)]
pub struct BatchItem {
    pub network: VirtualNetwork,
    pub assigned: bool,
    pub native: bool,
}

/// A batch recorded: its id and each item with its assignment's id.
#[derive(Debug, Clone)]
pub struct Batch {
    pub id: Uuid,
    pub port_id: Uuid,
    pub project_id: Uuid,
    pub items: serde_json::Value,
    pub errors: Vec<String>,
    pub created_at: std::time::SystemTime,
}

/// Applies `items` to `p` at once (all or none) and records the batch.
pub async fn batch(
    tx: &mut Tx<'_>,
    p: &DevicePort,
    project: Uuid,
    metro: &str,
    items: &[BatchItem],
) -> Result<Result<Batch, PortRefusal>, BmdbError> {
    if let Err(e) = owner(p) {
        return Ok(Err(e));
    }
    for i in items {
        if let Err(e) = same_metro(&i.network, metro) {
            return Ok(Err(e));
        }
        if i.native && i.assigned && !p.layer2 {
            return Ok(Err(PortRefusal::Layer3(p.name.clone())));
        }
    }
    let mut recorded = Vec::new();
    for i in items {
        if i.assigned {
            add(tx, p.id, i.network.id).await?;
            if i.native {
                tx.execute(
                    "UPDATE device_port SET native_network = $2 WHERE port_id = $1",
                    &[&p.id, &i.network.id],
                )
                .await?;
            }
        } else {
            tx.execute(
                "DELETE FROM device_port_vlan WHERE port_id = $1 AND virtual_network_id = $2",
                &[&p.id, &i.network.id],
            )
            .await?;
            tx.execute(
                "UPDATE device_port SET native_network = NULL WHERE port_id = $1 AND native_network = $2",
                &[&p.id, &i.network.id],
            )
            .await?;
        }
        recorded.push(serde_json::json!({
            "id": Uuid::new_v4(),
            "vlan": i.network.vxlan,
            "state": if i.assigned { "assigned" } else { "unassigned" },
            "native": i.native,
        }));
    }
    let id = Uuid::new_v4();
    let items = serde_json::Value::Array(recorded);
    let r = tx
        .query_one(
            "INSERT INTO port_vlan_batch (batch_id, port_id, project_id, assignments) \
             VALUES ($1, $2, $3, $4) RETURNING created_at",
            &[&id, &p.id, &project, &items],
        )
        .await?;
    crate::bmdb::switches::touch_device(tx, p.device_id).await?;
    Ok(Ok(Batch {
        id,
        port_id: p.id,
        project_id: project,
        items,
        errors: Vec::new(),
        created_at: r.get(0),
    }))
}

/// A port's batches, newest first (or the one asked).
pub async fn batches(
    tx: &mut Tx<'_>,
    port: Uuid,
    only: Option<Uuid>,
) -> Result<Vec<Batch>, BmdbError> {
    Ok(tx
        .query(
            "SELECT batch_id, port_id, project_id, assignments, error_messages, created_at \
               FROM port_vlan_batch WHERE port_id = $1 AND ($2::uuid IS NULL OR batch_id = $2) \
              ORDER BY created_at DESC",
            &[&port, &only],
        )
        .await?
        .iter()
        .map(|r| Batch {
            id: r.get(0),
            port_id: r.get(1),
            project_id: r.get(2),
            items: r.get(3),
            errors: r.get(4),
            created_at: r.get(5),
        })
        .collect())
}
