//! A project's virtual networks (`virtual_network`, V31): each a VLAN of
//! `network.tenant_vlans` on the shared switches, so one project's at
//! most. The project's own network (its layer-3 ports') is shepherd's:
//! never listed, assigned by name or deleted.

use std::time::SystemTime;

use uuid::Uuid;

use super::super::{BmdbError, Tx};

/// A virtual network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualNetwork {
    pub id: Uuid,
    pub project_id: Uuid,
    pub vxlan: i32,
    pub metro: String,
    pub description: Option<String>,
    pub tags: Vec<String>,
    pub created_at: SystemTime,
    /// The devices with a port it is assigned to.
    pub devices: Vec<Uuid>,
}

/// Why a virtual network was not made or deleted (the Metal API's 422).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkRefusal {
    #[error("vxlan {vxlan} is outside the VLANs this cloud gives tenants ({first}-{last})")]
    OutOfRange { vxlan: i32, first: u16, last: u16 },
    #[error("vxlan {0} is in use by another virtual network")]
    InUse(i32),
    #[error("no VLAN is left for a new virtual network")]
    Exhausted,
    #[error("virtual network {vxlan} is assigned to {ports} port(s): unassign it first")]
    Assigned { vxlan: i32, ports: i64 },
}

/// The networks `WHERE …` picks, with the devices each is on.
macro_rules! select {
    ($where:literal) => {
        concat!(
            "SELECT n.virtual_network_id, n.project_id, n.vxlan, n.metro, n.description, n.tags, \
                    n.created_at, \
                    ARRAY(SELECT DISTINCT p.device_id FROM device_port p \
                           WHERE p.native_network = n.virtual_network_id \
                              OR p.port_id IN (SELECT a.port_id FROM device_port_vlan a \
                                                WHERE a.virtual_network_id = n.virtual_network_id)) \
               FROM virtual_network n WHERE NOT n.own AND ",
            $where
        )
    };
}

fn from_row(r: &tokio_postgres::Row) -> VirtualNetwork {
    VirtualNetwork {
        id: r.get(0),
        project_id: r.get(1),
        vxlan: r.get(2),
        metro: r.get(3),
        description: r.get(4),
        tags: r.get(5),
        created_at: r.get(6),
        devices: r.get(7),
    }
}

/// Makes a virtual network in `metro`: VLAN `vxlan` if given (within
/// `range`, and no other network's), else the lowest free.
pub async fn create(
    tx: &mut Tx<'_>,
    project: Uuid,
    vxlan: Option<i32>,
    metro: &str,
    description: Option<&str>,
    tags: &[String],
    range: std::ops::RangeInclusive<u16>,
) -> Result<Result<VirtualNetwork, NetworkRefusal>, BmdbError> {
    let vxlan = match vxlan {
        Some(v) if !(i32::from(*range.start())..=i32::from(*range.end())).contains(&v) => {
            return Ok(Err(NetworkRefusal::OutOfRange {
                vxlan: v,
                first: *range.start(),
                last: *range.end(),
            }));
        }
        Some(v) => v,
        None => match crate::bmdb::switches::free_vlan(tx, &range).await? {
            Some(v) => v,
            None => return Ok(Err(NetworkRefusal::Exhausted)),
        },
    };
    let id = Uuid::new_v4();
    let made = tx
        .execute(
            "INSERT INTO virtual_network (virtual_network_id, project_id, vxlan, metro, description, tags) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (vxlan) DO NOTHING",
            &[&id, &project, &vxlan, &metro, &description, &tags],
        )
        .await?;
    if made == 0 {
        return Ok(Err(NetworkRefusal::InUse(vxlan)));
    }
    Ok(Ok(get(tx, id).await?.expect("made above")))
}

/// A virtual network (not a project's own).
pub async fn get(tx: &mut Tx<'_>, id: Uuid) -> Result<Option<VirtualNetwork>, BmdbError> {
    let sql = select!("n.virtual_network_id = $1");
    Ok(tx.query_opt(sql, &[&id]).await?.as_ref().map(from_row))
}

/// A project's virtual networks, in `metro` if given, by VLAN.
pub async fn list(
    tx: &mut Tx<'_>,
    project: Uuid,
    metro: Option<&str>,
) -> Result<Vec<VirtualNetwork>, BmdbError> {
    let sql = select!("n.project_id = $1 AND ($2::text IS NULL OR n.metro = $2) ORDER BY n.vxlan");
    Ok(tx
        .query(sql, &[&project, &metro])
        .await?
        .iter()
        .map(from_row)
        .collect())
}

/// A project's virtual network by what a tenant names it with: its UUID,
/// or its VLAN (`"1001"`).
pub async fn find(
    tx: &mut Tx<'_>,
    project: Uuid,
    vnid: &str,
) -> Result<Option<VirtualNetwork>, BmdbError> {
    let vnid = vnid.trim();
    let sql = if vnid.parse::<Uuid>().is_ok() {
        select!("n.project_id = $1 AND n.virtual_network_id::text = $2")
    } else if vnid.parse::<i32>().is_ok() {
        select!("n.project_id = $1 AND n.vxlan::text = $2")
    } else {
        return Ok(None);
    };
    let canonical = vnid
        .parse::<Uuid>()
        .map(|u| u.to_string())
        .or_else(|_| vnid.parse::<i32>().map(|v| v.to_string()))
        .unwrap_or_default();
    Ok(tx
        .query_opt(sql, &[&project, &canonical])
        .await?
        .as_ref()
        .map(from_row))
}

/// Deletes a virtual network no port uses.
pub async fn delete(tx: &mut Tx<'_>, id: Uuid) -> Result<Result<(), NetworkRefusal>, BmdbError> {
    let r = tx
        .query_one(
            "SELECT n.vxlan, \
                    (SELECT count(*) FROM device_port_vlan a WHERE a.virtual_network_id = n.virtual_network_id) \
                  + (SELECT count(*) FROM device_port p WHERE p.native_network = n.virtual_network_id) \
               FROM virtual_network n WHERE n.virtual_network_id = $1 FOR UPDATE",
            &[&id],
        )
        .await?;
    let (vxlan, ports): (i32, i64) = (r.get(0), r.get(1));
    if ports > 0 {
        return Ok(Err(NetworkRefusal::Assigned { vxlan, ports }));
    }
    tx.execute(
        "DELETE FROM virtual_network WHERE virtual_network_id = $1 AND NOT own",
        &[&id],
    )
    .await?;
    Ok(Ok(()))
}
