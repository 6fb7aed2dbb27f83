//! The firmware a BMC says its machine runs, as components named the way
//! Ironic's firmware interface names them:
//! - `bios`: the system's `BiosVersion`;
//! - `bmc`: its first manager's `FirmwareVersion`;
//! - `nic:<Id>`: a network adapter's (its chassis' `NetworkAdapters`,
//!   the first controller's `FirmwarePackageVersion`);
//! - `inventory:<Id>`: every member of the `UpdateService`'s
//!   `FirmwareInventory`, with its `Updateable`.
//!
//!
//! With them, the system's BIOS settings (its `Bios` resource's
//! `Attributes` and `AttributeRegistry`).
//!
//! A resource the BMC does not offer (404) or implement (501) is left out,
//! not an error: many list no inventory, sushy-tools among them.

use actix::prelude::*;
use awc::http::Method;
use serde_json::Value;

use super::client::{BmcClient, BmcError, BmcErrorKind, Conn, SystemInfo, members};
use crate::bmdb::firmware::{Bios, Component, Reading};

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
    let components = components(&mut c, &info).await?;
    let bios = match &info.bios {
        Some(path) => optional(&mut c, path).await?.map(|b| Bios {
            registry: text(&b["AttributeRegistry"]),
            attributes: b["Attributes"].as_object().cloned().unwrap_or_default(),
        }),
        None => None,
    };
    Ok(Reading { components, bios })
});

fn text(v: &Value) -> Option<String> {
    v.as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
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

async fn components(c: &mut Conn, info: &SystemInfo) -> Result<Vec<Component>, BmcError> {
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
        if let Some(m) = optional(c, manager).await? {
            if let Some(version) = text(&m["FirmwareVersion"]) {
                out.push(Component {
                    component: "bmc".into(),
                    name: text(&m["Model"]).or_else(|| text(&m["Name"])),
                    version,
                    updateable: None,
                });
            }
        }
    }
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
    let root = c
        .call(Method::GET, "/redfish/v1/", None, "the service root")
        .await?;
    if let Some(updates) = text(&root["UpdateService"]["@odata.id"]) {
        if let Some(u) = optional(c, &updates).await? {
            if let Some(inventory) = text(&u["FirmwareInventory"]["@odata.id"]) {
                for m in collection(c, &inventory).await? {
                    if let (Some(id), Some(version)) = (text(&m["Id"]), text(&m["Version"])) {
                        out.push(Component {
                            component: format!("inventory:{id}"),
                            name: text(&m["Name"]),
                            version,
                            updateable: m["Updateable"].as_bool(),
                        });
                    }
                }
            }
        }
    }
    // A component once: the first listing of an id wins.
    let mut named = std::collections::HashSet::new();
    out.retain(|c| named.insert(c.component.clone()));
    // A component once: the first listing of an id wins.
    let mut named = std::collections::HashSet::new();
    out.retain(|c| named.insert(c.component.clone()));
    Ok(out)
}
