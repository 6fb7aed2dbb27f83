//! A device's ports as the Metal API shows them (`device_port`, V31): one
//! per NIC its machine has cabled to a switch and their bond, the virtual
//! networks assigned to each, the native one, bonding and layer 2. What a
//! port holds here is what shepherd wants on its switch ports
//! (`bmdb::switches`); a change counts once read back there, which a
//! batch's state and the device's `active` wait for.

use std::collections::HashMap;
use std::time::SystemTime;

use uuid::Uuid;

use super::super::{BmdbError, Tx};

/// A virtual network as a port refers to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetRef {
    pub id: Uuid,
    pub vxlan: i32,
}

/// A device's port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePort {
    pub id: Uuid,
    pub device_id: Uuid,
    pub name: String,
    pub mac: Option<String>,
    /// A NIC in the bond (the bond itself: whether any NIC is in it).
    pub bonded: bool,
    pub layer2: bool,
    pub native: Option<NetRef>,
    /// Assigned, with when.
    pub vlans: Vec<(NetRef, Uuid, SystemTime, SystemTime)>,
}

impl DevicePort {
    pub fn is_bond(&self) -> bool {
        self.name == "bond0"
    }
}

/// The Metal API's network type of a device, from its ports: every NIC in
/// a layer-3 bond (`layer3`, or `hybrid-bonded` with VLANs on the bond);
/// in a layer-2 bond (`layer2-bonded`); none bonded (`layer2-individual`);
/// some out of a layer-3 bond (`hybrid`).
pub fn network_type(ports: &[DevicePort]) -> &'static str {
    let bond = ports.iter().find(|p| p.is_bond());
    let nics: Vec<&DevicePort> = ports.iter().filter(|p| !p.is_bond()).collect();
    let bonded = nics.iter().filter(|p| p.bonded).count();
    match bond {
        _ if bonded == 0 => "layer2-individual",
        Some(b) if b.layer2 => "layer2-bonded",
        Some(_) if bonded < nics.len() => "hybrid",
        Some(b) if !b.vlans.is_empty() => "hybrid-bonded",
        _ => "layer3",
    }
}

/// Gives a new device its ports: one per NIC of its machine cabled to a
/// switch (eth0, eth1, ... by switch and port), all in bond0, layer 3.
pub async fn make(tx: &mut Tx<'_>, device: Uuid, machine: Uuid) -> Result<usize, BmdbError> {
    let nics = tx
        .query(
            "SELECT switch_name, port_name, mac FROM switch_port \
              WHERE machine_id = $1 AND role = 'nic' ORDER BY switch_name, port_name",
            &[&machine],
        )
        .await?;
    if nics.is_empty() {
        return Ok(0);
    }
    tx.execute(
        "INSERT INTO device_port (port_id, device_id, name) VALUES ($1, $2, 'bond0')",
        &[&Uuid::new_v4(), &device],
    )
    .await?;
    for (i, r) in nics.iter().enumerate() {
        let (switch, port, mac): (String, String, Option<String>) = (r.get(0), r.get(1), r.get(2));
        tx.execute(
            "INSERT INTO device_port (port_id, device_id, name, switch_name, port_name, mac) \
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &Uuid::new_v4(),
                &device,
                &format!("eth{i}"),
                &switch,
                &port,
                &mac,
            ],
        )
        .await?;
    }
    Ok(nics.len())
}

const PORTS: &str = "\
SELECT p.port_id, p.device_id, p.name, p.mac, \
       CASE WHEN p.name = 'bond0' THEN EXISTS (SELECT 1 FROM device_port e \
             WHERE e.device_id = p.device_id AND e.name <> 'bond0' AND e.bonded) ELSE p.bonded END, \
       p.layer2, n.virtual_network_id, n.vxlan \
  FROM device_port p LEFT JOIN virtual_network n ON n.virtual_network_id = p.native_network \
 WHERE p.device_id = ANY($1) ORDER BY p.device_id, p.name = 'bond0' DESC, p.name";

const VLANS: &str = "\
SELECT a.port_id, n.virtual_network_id, n.vxlan, a.assignment_id, a.created_at, a.updated_at \
  FROM device_port_vlan a JOIN device_port p ON p.port_id = a.port_id \
  JOIN virtual_network n ON n.virtual_network_id = a.virtual_network_id \
 WHERE p.device_id = ANY($1) ORDER BY n.vxlan";

/// The ports of `devices`, by device.
pub async fn of(
    tx: &mut Tx<'_>,
    devices: &[Uuid],
) -> Result<HashMap<Uuid, Vec<DevicePort>>, BmdbError> {
    let mut vlans: HashMap<Uuid, Vec<(NetRef, Uuid, SystemTime, SystemTime)>> = HashMap::new();
    for r in tx.query(VLANS, &[&devices]).await? {
        vlans.entry(r.get(0)).or_default().push((
            NetRef {
                id: r.get(1),
                vxlan: r.get(2),
            },
            r.get(3),
            r.get(4),
            r.get(5),
        ));
    }
    let mut out: HashMap<Uuid, Vec<DevicePort>> = HashMap::new();
    for r in tx.query(PORTS, &[&devices]).await? {
        let id: Uuid = r.get(0);
        let native: Option<Uuid> = r.get(6);
        let port = DevicePort {
            id,
            device_id: r.get(1),
            name: r.get(2),
            mac: r.get(3),
            bonded: r.get(4),
            layer2: r.get(5),
            native: native.map(|id| NetRef {
                id,
                vxlan: r.get(7),
            }),
            vlans: vlans.remove(&id).unwrap_or_default(),
        };
        out.entry(port.device_id).or_default().push(port);
    }
    Ok(out)
}

/// A port, its device and the device's project (deleted devices' ports
/// are gone).
pub async fn port(
    tx: &mut Tx<'_>,
    id: Uuid,
) -> Result<Option<(DevicePort, Vec<DevicePort>, Uuid)>, BmdbError> {
    let Some(r) = tx
        .query_opt(
            "SELECT p.device_id, d.project_id FROM device_port p \
               JOIN device d ON d.device_id = p.device_id AND d.deleted_at IS NULL \
              WHERE p.port_id = $1",
            &[&id],
        )
        .await?
    else {
        return Ok(None);
    };
    let (device, project): (Uuid, Uuid) = (r.get(0), r.get(1));
    let all = of(tx, &[device]).await?.remove(&device).unwrap_or_default();
    let Some(p) = all.iter().find(|p| p.id == id).cloned() else {
        return Ok(None);
    };
    Ok(Some((p, all, project)))
}

/// Whether every switch port of `device`'s machine has been read back as
/// wanted since `since` (the device's ports applied).
pub async fn applied_since(
    tx: &mut Tx<'_>,
    device: Uuid,
    since: SystemTime,
) -> Result<bool, BmdbError> {
    Ok(tx
        .query_one(
            "SELECT COALESCE(bool_and(sp.want_purpose = 'tenant' \
                        AND sp.seen_native IS NOT DISTINCT FROM sp.want_native \
                        AND sp.seen_tagged IS NOT DISTINCT FROM sp.want_tagged \
                        AND sp.seen_at >= $2), false) \
               FROM device d JOIN switch_port sp ON sp.machine_id = d.machine_id AND sp.role = 'nic' \
              WHERE d.device_id = $1",
            &[&device, &since],
        )
        .await?
        .get(0))
}
