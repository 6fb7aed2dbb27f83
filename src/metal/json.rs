//! The Metal API's representations of shepherd's records, its errors and
//! its paging. No `null` is ever sent (`answer` drops them): the
//! description marks nothing nullable, and clients read an absent value
//! as unset.

use std::time::SystemTime;

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use super::catalog::{Catalog, stable_id};
use crate::bmdb::devices::ports::{DevicePort, network_type};
use crate::bmdb::devices::{Device, Event};
use crate::bmdb::tenants::Project;
use crate::bmdb::tenants::networks::VirtualNetwork;
use crate::config::{OperatingSystemConfig, PlanConfig};

pub const BASE: &str = "/metal/v1";

/// RFC 3339 in UTC, with `Z`.
pub fn time(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn drop_nulls(v: &mut Value) {
    match v {
        Value::Object(o) => {
            o.retain(|_, v| !v.is_null());
            o.values_mut().for_each(drop_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// A JSON answer, its nulls left out.
pub fn answer(status: StatusCode, mut body: Value) -> HttpResponse {
    drop_nulls(&mut body);
    HttpResponse::build(status)
        .content_type("application/json")
        .body(body.to_string())
}

pub fn ok(body: Value) -> HttpResponse {
    answer(StatusCode::OK, body)
}

/// An error, as the Metal API gives them: `{"errors": ["…"]}`.
pub fn error(status: StatusCode, msg: &str) -> HttpResponse {
    answer(status, json!({ "errors": [msg] }))
}

pub fn not_found() -> HttpResponse {
    error(StatusCode::NOT_FOUND, "Not found")
}

pub fn unprocessable(msg: &str) -> HttpResponse {
    error(StatusCode::UNPROCESSABLE_ENTITY, msg)
}

/// The BMDB failed: 503 naming it (the answer is not the Metal API's, but
/// nothing else is true).
pub fn unavailable(e: impl std::fmt::Display) -> HttpResponse {
    error(StatusCode::SERVICE_UNAVAILABLE, &format!("BMDB: {e}"))
}

fn href(path: String) -> Value {
    json!({ "href": format!("{BASE}{path}") })
}

/// The first 8 hexadecimal digits of an ID, as Equinix's short IDs.
pub fn short_id(id: Uuid) -> String {
    id.simple().to_string()[..8].to_string()
}

/// Paging, as the Metal API's list endpoints take it (text: a query
/// flattened into another is read as strings).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Paging {
    pub page: Option<String>,
    pub per_page: Option<String>,
}

impl Paging {
    /// Offset, limit and page; a page or size out of range is a 422.
    pub fn window(&self) -> Result<(i64, i64, i64), HttpResponse> {
        let number = |name: &str, v: &Option<String>, default: i64| match v.as_deref() {
            None => Ok(default),
            Some(t) => t
                .trim()
                .parse::<i64>()
                .map_err(|_| unprocessable(&format!("{name}: {t:?} is not a number"))),
        };
        let page = number("page", &self.page, 1)?;
        let per = number("per_page", &self.per_page, 10)?;
        if !(1..=100_000).contains(&page) {
            return Err(unprocessable("page: from 1 to 100000"));
        }
        if !(1..=1000).contains(&per) {
            return Err(unprocessable("per_page: from 1 to 1000"));
        }
        Ok(((page - 1) * per, per, page))
    }
}

/// A list's `meta`: self, first, last, and next and previous where they
/// are (the SDKs page until `next` is absent).
pub fn meta(path: &str, page: i64, per: i64, total: i64) -> Value {
    let last = ((total + per - 1) / per).max(1);
    let at = |p: i64| json!({ "href": format!("{BASE}{path}?page={p}&per_page={per}") });
    json!({
        "self": at(page),
        "first": at(1),
        "last": at(last),
        "next": (page < last).then(|| at(page + 1)),
        "previous": (page > 1).then(|| at((page - 1).min(last))),
        "current_page": page,
        "last_page": last,
        "total": total,
    })
}

pub fn project(p: &Project) -> Value {
    json!({
        "id": p.id,
        "name": p.name,
        "href": format!("{BASE}/projects/{}", p.id),
        "created_at": time(p.created_at),
        "updated_at": time(p.created_at),
        "type": "default",
        "customdata": {},
        "tags": [],
        "max_devices": p.max_devices.map(|m| json!({ "total": m })).unwrap_or(json!({})),
        "organization": href(format!("/organizations/{}", stable_id("organization", &p.id.to_string()))),
        "devices": p.device_ids.iter()
            .map(|d| href(format!("/devices/{d}")))
            .collect::<Vec<_>>(),
        "members": [],
        "memberships": [],
        "invitations": [],
        "ssh_keys": p.key_ids.iter()
            .map(|k| href(format!("/ssh-keys/{k}")))
            .collect::<Vec<_>>(),
        "volumes": [],
    })
}

pub fn metro(code: &str) -> Value {
    let id = stable_id("metro", code);
    json!({
        "id": id,
        "code": code,
        "name": code,
        "href": format!("{BASE}/locations/metros/{id}"),
    })
}

fn facility(code: &str) -> Value {
    json!({
        "id": stable_id("facility", code),
        "code": code,
        "name": code,
        "features": ["baremetal"],
        "metro": metro(code),
    })
}

pub fn plan(p: &PlanConfig, metros: &[String]) -> Value {
    let id = stable_id("plan", &p.slug);
    let mut specs = json!({
        "cpus": [{ "count": p.cpus_min, "type": format!("{} threads at least", p.cpus_min) }],
        "memory": { "total": format!("{}GB", p.memory_gib_min) },
        "features": { "raid": false, "txt": false, "uefi": true },
    });
    if p.disks_min > 0 {
        specs["drives"] = json!([{
            "count": p.disks_min,
            "size": format!("{}GB", p.disk_gib_min),
            "type": "any",
            "category": "storage",
        }]);
    }
    json!({
        "id": id,
        "slug": p.slug,
        "name": p.name.clone().unwrap_or_else(|| p.slug.clone()),
        "description": p.description.clone().unwrap_or_else(|| format!(
            "{} CPU threads, {} GiB of memory, {} disks of {} GiB at least{}",
            p.cpus_min, p.memory_gib_min, p.disks_min, p.disk_gib_min,
            match p.secure_boot {
                Some(true) => "; Secure Boot on",
                Some(false) => "; Secure Boot off",
                None => "",
            }
        )),
        "class": p.slug,
        "line": "baremetal",
        "type": "standard",
        "legacy": false,
        "categories": ["compute", "current_gen"],
        "deployment_types": ["on_demand"],
        "pricing": { "hour": 0.0 },
        "specs": specs,
        "available_in_metros": metros.iter().map(|m| json!({
            "href": format!("{BASE}/locations/metros/{}", stable_id("metro", m)),
            "price": { "hour": 0.0 },
        })).collect::<Vec<_>>(),
        "href": format!("{BASE}/plans/{id}"),
    })
}

pub fn operating_system(o: &OperatingSystemConfig, catalog: &Catalog) -> Value {
    let (distro, version) = match o.slug.split_once('_') {
        Some((d, v)) => (d.to_string(), v.replace('_', ".")),
        None => (o.slug.clone(), String::new()),
    };
    json!({
        "id": stable_id("operating-system", &o.slug),
        "slug": o.slug,
        "name": o.name,
        "distro": o.distro.clone().unwrap_or(distro),
        "distro_label": o.distro.clone().unwrap_or_else(|| o.name.clone()),
        "version": o.version.clone().unwrap_or(version),
        "preinstallable": false,
        "licensed": false,
        "pricing": {},
        "provisionable_on": catalog.plans.iter().map(|p| p.slug.clone()).collect::<Vec<_>>(),
    })
}

/// The actions a device in `state` takes.
fn actions(state: &str) -> Vec<Value> {
    let names: &[(&str, &str)] = match state {
        "active" => &[
            ("power_off", "Power Off"),
            ("reboot", "Reboot"),
            ("reinstall", "Reinstall"),
        ],
        "inactive" => &[("power_on", "Power On"), ("reinstall", "Reinstall")],
        "failed" => &[("reinstall", "Reinstall")],
        _ => &[],
    };
    names
        .iter()
        .map(|(t, n)| json!({ "type": t, "name": n }))
        .collect()
}

pub fn device(d: &Device, catalog: &Catalog) -> Value {
    let state = d.state();
    let path = format!("/devices/{}", d.id);
    let ip = d
        .address
        .as_deref()
        .and_then(|a| a.parse::<std::net::IpAddr>().ok());
    let ip_addresses: Vec<Value> = ip
        .iter()
        .map(|ip| {
            let v4 = ip.is_ipv4();
            json!({
                "id": stable_id("ip", &format!("{}/{ip}", d.id)),
                "address": ip.to_string(),
                "address_family": if v4 { 4 } else { 6 },
                "cidr": if v4 { 32 } else { 128 },
                "netmask": if v4 { "255.255.255.255" } else { "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff" },
                "network": ip.to_string(),
                "public": false,
                "management": true,
                "manageable": false,
                "enabled": true,
                "global_ip": false,
                "created_at": time(d.created_at),
                "assigned_to": href(path.clone()),
                "href": format!("{BASE}/ips/{}", stable_id("ip", &format!("{}/{ip}", d.id))),
            })
        })
        .collect();
    let plan = catalog
        .plan(&d.plan)
        .map(|p| self::plan(p, std::slice::from_ref(&d.metro)))
        .unwrap_or_else(|| json!({ "slug": d.plan, "name": d.plan }));
    let os = catalog
        .operating_system(&d.operating_system)
        .map(|o| operating_system(o, catalog))
        .unwrap_or_else(|| json!({ "slug": d.operating_system, "name": d.operating_system }));
    let creator = d
        .created_by
        .strip_prefix("token:")
        .and_then(|t| t.parse::<Uuid>().ok())
        .unwrap_or_else(|| stable_id("operator", &d.created_by));
    json!({
        "id": d.id,
        "short_id": short_id(d.id),
        "href": format!("{BASE}{path}"),
        "hostname": d.hostname,
        "description": d.description,
        "state": state,
        "created_at": time(d.created_at),
        "updated_at": time(d.updated_at),
        "always_pxe": false,
        "billing_cycle": "hourly",
        "customdata": d.customdata,
        "userdata": d.userdata,
        "locked": d.locked,
        "network_frozen": false,
        "spot_instance": false,
        "tags": d.tags,
        "user": "root",
        "metro": metro(&d.metro),
        "facility": facility(&d.metro),
        "plan": plan,
        "operating_system": os,
        "project": href(format!("/projects/{}", d.project_id)),
        "project_lite": href(format!("/projects/{}", d.project_id)),
        "hardware_reservation": d.reserved.then(|| json!({
            "id": d.machine_id,
            "href": format!("{BASE}/hardware-reservations/{}", d.machine_id),
        })),
        "created_by": { "id": creator, "short_id": short_id(creator) },
        "ssh_keys": [],
        "volumes": [],
        "provisioning_events": [],
        "actions": actions(state),
        "ip_addresses": ip_addresses,
        "network_ports": network_ports(&d.ports),
    })
}

/// A hardware reservation: a machine assigned to a project, of the plan
/// its hardware report meets, in its metro.
pub fn reservation(r: &crate::bmdb::devices::Reservation, catalog: &Catalog) -> Value {
    let plan = catalog.plan_of_raw(r.hardware_report.as_deref(), r.bmc_secure_boot);
    let metro = catalog.metro_of(r.location.as_deref());
    let provisionable = r.device.is_none() && r.state == "available" && plan.is_some();
    json!({
        "id": r.machine_id,
        "short_id": short_id(r.machine_id),
        "href": format!("{BASE}/hardware-reservations/{}", r.machine_id),
        "created_at": time(r.assigned_at),
        "provisionable": provisionable,
        "spare": false,
        "need_of_service": matches!(r.state.as_str(), "install-failed" | "clean-failed" | "enroll-failed" | "recovery-backoff" | "backoff"),
        "facility": facility(&metro),
        "plan": plan.map(|p| self::plan(p, std::slice::from_ref(&metro))),
        "project": href(format!("/projects/{}", r.project_id)),
        "device": r.device.as_ref().map(|d| json!({
            "id": d.id,
            "href": format!("{BASE}/devices/{}", d.id),
            "hostname": d.hostname,
            "state": d.state(),
        })),
    })
}

/// A project's SSH key.
pub fn key(k: &crate::bmdb::tenants::SshKey) -> Value {
    json!({
        "id": k.id,
        "href": format!("{BASE}/ssh-keys/{}", k.id),
        "label": k.label,
        "key": k.key,
        "fingerprint": k.fingerprint,
        "created_at": time(k.created_at),
        "updated_at": time(k.updated_at),
        "tags": [],
        "entity": href(format!("/projects/{}", k.project_id)),
    })
}

pub fn event(e: &Event) -> Value {
    let mut relationships = vec![href(format!("/projects/{}", e.project_id))];
    if let Some(d) = e.device_id {
        relationships.push(href(format!("/devices/{d}")));
    }
    json!({
        "id": e.id,
        "href": format!("{BASE}/events/{}", e.id),
        "state": "success",
        "type": e.kind,
        "body": e.body,
        "interpolated": e.body,
        "created_at": time(e.at),
        "relationships": relationships,
        "modified_by": {},
    })
}

// Ports, virtual networks, VLAN assignments and their batches.

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
