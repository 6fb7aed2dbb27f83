//! The firmware a BMC says its machine runs, as components named the way
//! Ironic's firmware interface names them:
//! - `bios`: the system's `BiosVersion`;
//! - `bmc`: its first manager's `FirmwareVersion`;
//! - `nic:<Id>`: a network adapter's (its chassis' `NetworkAdapters`,
//!   the first controller's `FirmwarePackageVersion`);
//! - `inventory:<Id>`: every member of the `UpdateService`'s
//!   `FirmwareInventory`, with its `Updateable`.
//!
//! With them, the system's BIOS settings (its `Bios` resource's
//! `Attributes` and `AttributeRegistry`) and its storage (each `Storage`
//! with its `Drives` and its `Volumes`, and whether it offers volumes at
//! all: RAID through the BMC).
//!
//! A resource the BMC does not offer (404) or implement (501) is left out,
//! not an error: many list no inventory, sushy-tools among them. A part
//! the BMC answers with an error of its own (a 500 for a volume list) is
//! left out too, and named in the reading's `partial`: the rest is still
//! read. An unreachable BMC or refused credentials end the whole read.

use actix::prelude::*;
use awc::http::Method;
use serde_json::Value;

use super::client::{BmcClient, BmcError, BmcErrorKind, Conn};
use super::system::{SystemInfo, members, text};
use crate::bmdb::firmware::{Bios, Component, Drive, Reading, Storage, Volume};

/// At most this many members of a collection are read (a BMC listing
/// more is cut there).
const MAX_MEMBERS: usize = 64;

/// Reads the system's firmware components and BIOS settings.
#[derive(Message)]
#[rtype(result = "Result<Reading, BmcError>")]
pub struct GetFirmware {
    pub system: Option<String>,
}

sequence!(GetFirmware => Reading, |c, msg| {
    let info = c.get_system(&msg.system).await?;
    let mut partial = Vec::new();
    let components = components(&mut c, &info, &mut partial).await?;
    let bios = match &info.bios {
        Some(path) => part(&mut partial, "the BIOS settings", bios(&mut c, path).await)?.flatten(),
        None => None,
    };
    let storage = match &info.storage {
        Some(path) => part(&mut partial, "the storage", storage(&mut c, path).await)?,
        None => None,
    };
    Ok(Reading {
        components,
        bios,
        storage,
        partial,
    })
});

/// A part of the read: its value; or None, its failure noted in
/// `partial`, when the BMC answered for it with an error of its own. An
/// unreachable BMC or refused credentials end the whole read.
fn part<T>(
    partial: &mut Vec<String>,
    what: &str,
    r: Result<T, BmcError>,
) -> Result<Option<T>, BmcError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e)
            if matches!(
                e.kind,
                BmcErrorKind::Http { .. } | BmcErrorKind::Protocol(_)
            ) =>
        {
            partial.push(format!("{what}: {}", e.kind));
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The `Bios` resource at `path`: its attributes and their registry.
async fn bios(c: &mut Conn, path: &str) -> Result<Option<Bios>, BmcError> {
    Ok(optional(c, path).await?.map(|b| Bios {
        registry: text(&b["AttributeRegistry"]),
        attributes: b["Attributes"].as_object().cloned().unwrap_or_default(),
    }))
}

/// Each storage resource of the collection at `path`, with its drives
/// and volumes.
async fn storage(c: &mut Conn, path: &str) -> Result<Vec<Storage>, BmcError> {
    let mut out = Vec::new();
    for s in collection(c, path).await? {
        let Some(id) = text(&s["Id"]) else {
            continue;
        };
        let mut drives = Vec::new();
        let links: Vec<String> = s["Drives"]
            .as_array()
            .map(|a| a.iter().filter_map(|d| text(&d["@odata.id"])).collect())
            .unwrap_or_default();
        for link in links.into_iter().take(MAX_MEMBERS) {
            if let Some(d) = optional(c, &link).await? {
                drives.push(Drive {
                    id: text(&d["Id"]).unwrap_or_default(),
                    name: text(&d["Name"]),
                    capacity_bytes: d["CapacityBytes"].as_i64(),
                    media_type: text(&d["MediaType"]),
                    protocol: text(&d["Protocol"]),
                    serial_number: text(&d["SerialNumber"]),
                });
            }
        }
        let volumes_path = text(&s["Volumes"]["@odata.id"]);
        let mut volumes = Vec::new();
        if let Some(p) = &volumes_path {
            for v in collection(c, p).await? {
                volumes.push(Volume {
                    id: text(&v["Id"]).unwrap_or_default(),
                    name: text(&v["Name"]),
                    raid_type: text(&v["RAIDType"]).or_else(|| text(&v["VolumeType"])),
                    capacity_bytes: v["CapacityBytes"].as_i64(),
                    drives: v["Links"]["Drives"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|d| text(&d["@odata.id"]))
                                .filter_map(|p| p.rsplit('/').next().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default(),
                });
            }
        }
        out.push(Storage {
            id,
            name: text(&s["Name"]),
            volumes_offered: volumes_path.is_some(),
            drives,
            volumes,
        });
    }
    Ok(out)
}

/// GET `path`; None when the BMC answers 404 or 501 (it does not offer
/// it, or does not implement it).
async fn optional(c: &mut Conn, path: &str) -> Result<Option<Value>, BmcError> {
    match c.call(Method::GET, path, None, path).await {
        Ok(v) => Ok(Some(v)),
        Err(BmcError {
            kind: BmcErrorKind::Http {
                status: 404 | 501, ..
            },
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The members of the collection at `path` (none when it is not there).
async fn collection(c: &mut Conn, path: &str) -> Result<Vec<Value>, BmcError> {
    let Some(list) = optional(c, path).await? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for member in members(&list).into_iter().take(MAX_MEMBERS) {
        if let Some(v) = optional(c, &member).await? {
            out.push(v);
        }
    }
    Ok(out)
}

async fn components(
    c: &mut Conn,
    info: &SystemInfo,
    partial: &mut Vec<String>,
) -> Result<Vec<Component>, BmcError> {
    let mut out = Vec::new();
    if let Some(version) = info.facts.bios_version.clone() {
        out.push(Component {
            component: "bios".into(),
            name: None,
            version,
            updateable: None,
        });
    }
    if let Some(manager) = info.managed_by.first() {
        let bmc = part(
            partial,
            "the manager's firmware",
            manager_firmware(c, manager).await,
        )?;
        out.extend(bmc.flatten());
    }
    let nics = part(partial, "the network adapters", adapters(c, info).await)?;
    out.extend(nics.unwrap_or_default());
    let inventory = part(partial, "the firmware inventory", inventory(c).await)?;
    out.extend(inventory.unwrap_or_default());
    // A component once: the first listing of an id wins.
    let mut named = std::collections::HashSet::new();
    out.retain(|c| named.insert(c.component.clone()));
    Ok(out)
}

/// `bmc`: the manager's own firmware.
async fn manager_firmware(c: &mut Conn, manager: &str) -> Result<Option<Component>, BmcError> {
    let Some(m) = optional(c, manager).await? else {
        return Ok(None);
    };
    Ok(text(&m["FirmwareVersion"]).map(|version| Component {
        component: "bmc".into(),
        name: text(&m["Model"]).or_else(|| text(&m["Name"])),
        version,
        updateable: None,
    }))
}

/// `nic:<Id>`: the network adapters of the system's chassis.
async fn adapters(c: &mut Conn, info: &SystemInfo) -> Result<Vec<Component>, BmcError> {
    let mut out = Vec::new();
    for chassis in &info.chassis {
        let Some(ch) = optional(c, chassis).await? else {
            continue;
        };
        let Some(adapters) = text(&ch["NetworkAdapters"]["@odata.id"]) else {
            continue;
        };
        for a in collection(c, &adapters).await? {
            let version = a["Controllers"]
                .as_array()
                .and_then(|cs| cs.iter().find_map(|c| text(&c["FirmwarePackageVersion"])));
            if let (Some(id), Some(version)) = (text(&a["Id"]), version) {
                out.push(Component {
                    component: format!("nic:{id}"),
                    name: text(&a["Model"]).or_else(|| text(&a["Name"])),
                    version,
                    updateable: None,
                });
            }
        }
    }
    Ok(out)
}

/// `inventory:<Id>`: the `UpdateService`'s `FirmwareInventory`.
async fn inventory(c: &mut Conn) -> Result<Vec<Component>, BmcError> {
    Ok(inventory_members(c)
        .await?
        .into_iter()
        .filter_map(|m| {
            Some(Component {
                component: format!("inventory:{}", m.id),
                name: (!m.name.is_empty()).then_some(m.name),
                version: m.version?,
                updateable: m.updateable,
            })
        })
        .collect())
}

/// Where an update of `component` (as [`GetFirmware`] names it) is to be
/// applied, as `UpdateService`'s `Targets` names it:
/// - `inventory:<Id>`: that `FirmwareInventory` member;
/// - `bios`: the inventory member that stands for the BIOS (its `Id` or
///   `Name` says BIOS or System ROM), else the system itself (sushy-tools
///   and BMCs that list no inventory);
/// - `bmc`: the system's manager;
/// - `nic:<Id>`: that network adapter of the system's chassis.
///
/// A BMC that updates several parts through one `UpdateService` must be
/// told which, and some refuse an update that names none.
pub(super) async fn update_target(
    c: &mut Conn,
    system: &Option<String>,
    component: &str,
) -> Result<String, BmcError> {
    let missing = |c: &mut Conn, what: String| {
        c.err(BmcErrorKind::Protocol(format!(
            "firmware {component}: {what}: no update target for it"
        )))
    };
    if let Some(id) = component.strip_prefix("inventory:") {
        return match inventory_members(c)
            .await?
            .into_iter()
            .find(|m| m.id == id && !m.path.is_empty())
        {
            Some(m) => Ok(m.path),
            None => Err(missing(
                c,
                format!("the BMC's FirmwareInventory lists no member {id:?}"),
            )),
        };
    }
    let info = c.get_system(system).await?;
    match component {
        "bios" => {
            let stands_for_bios = |m: &Member| {
                let (id, name) = (m.id.to_ascii_lowercase(), m.name.to_ascii_lowercase());
                !m.path.is_empty()
                    && !id.starts_with("previous")
                    && m.updateable != Some(false)
                    && (id == "bios"
                        || id.contains("bios")
                        || name.contains("bios")
                        || name.contains("system rom"))
            };
            let members = inventory_members(c).await?;
            Ok(match members.iter().find(|m| stands_for_bios(m)) {
                Some(m) => m.path.clone(),
                None => info.path,
            })
        }
        "bmc" => match info.managed_by.first() {
            Some(m) => Ok(m.clone()),
            None => Err(missing(c, "its system names no manager".into())),
        },
        _ => match component.strip_prefix("nic:") {
            Some(id) => {
                for chassis in &info.chassis {
                    let Some(ch) = optional(c, chassis).await? else {
                        continue;
                    };
                    let Some(adapters) = text(&ch["NetworkAdapters"]["@odata.id"]) else {
                        continue;
                    };
                    let list = optional(c, &adapters).await?.unwrap_or_default();
                    for member in members(&list).into_iter().take(MAX_MEMBERS) {
                        if member.trim_end_matches('/').rsplit('/').next() == Some(id) {
                            return Ok(member);
                        }
                    }
                }
                Err(missing(
                    c,
                    format!("no chassis of its system lists a network adapter {id:?}"),
                ))
            }
            None => Err(c.err(BmcErrorKind::Config(format!(
                "firmware {component}: not bios, bmc, nic:<Id> or inventory:<Id>"
            )))),
        },
    }
}

/// A `FirmwareInventory` member, as a target is chosen among them.
struct Member {
    path: String,
    id: String,
    name: String,
    version: Option<String>,
    updateable: Option<bool>,
}

/// The `UpdateService`'s `FirmwareInventory` members (none when it lists
/// none).
async fn inventory_members(c: &mut Conn) -> Result<Vec<Member>, BmcError> {
    let root = c
        .call(Method::GET, "/redfish/v1/", None, "the service root")
        .await?;
    let Some(updates) = text(&root["UpdateService"]["@odata.id"]) else {
        return Ok(Vec::new());
    };
    let Some(u) = optional(c, &updates).await? else {
        return Ok(Vec::new());
    };
    let Some(inventory) = text(&u["FirmwareInventory"]["@odata.id"]) else {
        return Ok(Vec::new());
    };
    Ok(collection(c, &inventory)
        .await?
        .into_iter()
        .filter_map(|m| {
            Some(Member {
                path: text(&m["@odata.id"]).unwrap_or_default(),
                id: text(&m["Id"])?,
                name: text(&m["Name"]).unwrap_or_default(),
                version: text(&m["Version"]),
                updateable: m["Updateable"].as_bool(),
            })
        })
        .collect())
}
