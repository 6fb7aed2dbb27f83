//! Ports and virtual networks: `/ports/{id}` and its operations,
//! `/projects/{id}/virtual-networks`, `/virtual-networks/{id}`. Another
//! project's port or network is 404; a read-only token's write is 403; a
//! change the port's state refuses is 422 naming why.

use super::*;
use crate::bmdb::devices::port_actions::{self, BatchItem, PortRefusal};
use crate::bmdb::devices::ports::{self, DevicePort};
use crate::bmdb::tenants::networks::{self, VirtualNetwork};
use crate::metal::json as rep;

/// A port the caller sees: it, its device's ports, the device's project
/// and metro.
struct Seen {
    port: DevicePort,
    all: Vec<DevicePort>,
    project: Uuid,
    metro: String,
}

async fn visible_port(admin: &Admin, caller: &Caller, raw: &str) -> Result<Seen, HttpResponse> {
    let pid = id(raw)?;
    let found = read(admin, async |tx| {
        let Some((port, all, project)) = ports::port(tx, pid).await? else {
            return Ok(None);
        };
        let metro = devices::get(tx, port.device_id)
            .await?
            .map(|d| d.metro)
            .unwrap_or_default();
        Ok(Some(Seen {
            port,
            all,
            project,
            metro,
        }))
    })
    .await?;
    match found {
        Some(s) if caller.sees(s.project) => Ok(s),
        _ => Err(not_found()),
    }
}

/// The port as it is now (after a change).
async fn port_answer(admin: &Admin, id: Uuid) -> HttpResponse {
    match read(admin, async |tx| ports::port(tx, id).await).await {
        Ok(Some((p, all, _))) => ok(rep::port(&p, &all)),
        Ok(None) => not_found(),
        Err(e) => e,
    }
}

/// `GET /ports/{id}`.
pub async fn port(admin: web::Data<Admin>, req: HttpRequest, pid: Id) -> HttpResponse {
    let s = attempt!(visible_port(&admin, &caller(&req), &pid).await);
    ok(rep::port(&s.port, &s.all))
}

#[derive(Deserialize, Default)]
struct AssignBody {
    vnid: Option<String>,
}

/// The caller's virtual network named `vnid` (a UUID or a VLAN), else 422.
async fn network_named(
    admin: &Admin,
    project: Uuid,
    vnid: Option<&str>,
) -> Result<VirtualNetwork, HttpResponse> {
    let Some(vnid) = vnid.filter(|v| !v.trim().is_empty()) else {
        return Err(unprocessable(
            "vnid: a virtual network's ID or VLAN is required",
        ));
    };
    read(admin, async |tx| networks::find(tx, project, vnid).await)
        .await?
        .ok_or_else(|| {
            unprocessable(&format!(
                "vnid: {vnid:?} is not one of this project's virtual networks"
            ))
        })
}

fn refused(r: Result<(), PortRefusal>) -> Result<(), HttpResponse> {
    r.map_err(|e| unprocessable(&e.to_string()))
}

/// The operations on a port, by their path's last part.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Assign,
    Unassign,
    Layer2,
    Layer3,
    Bond,
    Disbond,
}

async fn operate(
    admin: &Admin,
    req: &HttpRequest,
    raw_id: &str,
    raw: &[u8],
    op: Op,
    bulk: bool,
) -> HttpResponse {
    let who = caller(req);
    let s = attempt!(visible_port(admin, &who, raw_id).await);
    attempt!(who.may_write());
    let b: AssignBody = if raw.iter().all(u8::is_ascii_whitespace) {
        AssignBody::default()
    } else {
        attempt!(body(req, raw))
    };
    let network = match op {
        Op::Assign | Op::Unassign => Some(attempt!(
            network_named(admin, s.project, b.vnid.as_deref()).await
        )),
        Op::Layer2 if b.vnid.as_deref().is_some_and(|v| !v.trim().is_empty()) => Some(attempt!(
            network_named(admin, s.project, b.vnid.as_deref()).await
        )),
        _ => None,
    };
    let (p, all, metro) = (&s.port, &s.all, s.metro.as_str());
    let done = attempt!(
        write(admin, async |tx| match op {
            Op::Assign =>
                port_actions::assign(tx, p, network.as_ref().expect("named"), metro).await,
            Op::Unassign => port_actions::unassign(tx, p, network.as_ref().expect("named")).await,
            Op::Layer2 => port_actions::to_layer2(tx, p, network.as_ref(), metro).await,
            Op::Layer3 => port_actions::to_layer3(tx, p, all).await,
            Op::Bond => port_actions::bond(tx, p, all, bulk).await,
            Op::Disbond => port_actions::disbond(tx, p, all, bulk).await,
        })
        .await
    );
    attempt!(refused(done));
    port_answer(admin, s.port.id).await
}

/// `POST /ports/{id}/assign`.
pub async fn assign_port(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    raw: web::Bytes,
) -> HttpResponse {
    operate(&admin, &req, &pid, &raw, Op::Assign, false).await
}

/// `POST /ports/{id}/unassign`.
pub async fn unassign_port(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    raw: web::Bytes,
) -> HttpResponse {
    operate(&admin, &req, &pid, &raw, Op::Unassign, false).await
}

/// `POST /ports/{id}/convert/layer-2`.
pub async fn convert_layer2(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    raw: web::Bytes,
) -> HttpResponse {
    operate(&admin, &req, &pid, &raw, Op::Layer2, false).await
}

/// `POST /ports/{id}/convert/layer-3` (`request_ips` are not offered:
/// the port returns to the project's own network).
pub async fn convert_layer3(admin: web::Data<Admin>, req: HttpRequest, pid: Id) -> HttpResponse {
    operate(&admin, &req, &pid, b"", Op::Layer3, false).await
}

#[derive(Deserialize)]
pub struct BulkQuery {
    bulk_enable: Option<bool>,
    bulk_disable: Option<bool>,
}

/// `POST /ports/{id}/bond`.
pub async fn bond_port(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    q: web::Query<BulkQuery>,
) -> HttpResponse {
    operate(
        &admin,
        &req,
        &pid,
        b"",
        Op::Bond,
        q.bulk_enable.unwrap_or(false),
    )
    .await
}

/// `POST /ports/{id}/disbond`.
pub async fn disbond_port(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    q: web::Query<BulkQuery>,
) -> HttpResponse {
    operate(
        &admin,
        &req,
        &pid,
        b"",
        Op::Disbond,
        q.bulk_disable.unwrap_or(false),
    )
    .await
}

#[derive(Deserialize)]
pub struct NativeQuery {
    vnid: Option<String>,
}

/// `POST /ports/{id}/native-vlan?vnid=…`.
pub async fn assign_native_vlan(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    q: web::Query<NativeQuery>,
) -> HttpResponse {
    let who = caller(&req);
    let s = attempt!(visible_port(&admin, &who, &pid).await);
    attempt!(who.may_write());
    let n = attempt!(network_named(&admin, s.project, q.vnid.as_deref()).await);
    let p = &s.port;
    let done = attempt!(
        write(&admin, async |tx| port_actions::native(tx, p, Some(&n))
            .await)
        .await
    );
    attempt!(refused(done));
    port_answer(&admin, p.id).await
}

/// `DELETE /ports/{id}/native-vlan`.
pub async fn delete_native_vlan(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
) -> HttpResponse {
    let who = caller(&req);
    let s = attempt!(visible_port(&admin, &who, &pid).await);
    attempt!(who.may_write());
    let p = &s.port;
    let done = attempt!(write(&admin, async |tx| port_actions::native(tx, p, None).await).await);
    attempt!(refused(done));
    port_answer(&admin, p.id).await
}

/// `GET /ports/{id}/vlan-assignments`.
pub async fn port_assignments(admin: web::Data<Admin>, req: HttpRequest, pid: Id) -> HttpResponse {
    let s = attempt!(visible_port(&admin, &caller(&req), &pid).await);
    ok(json!({ "vlan_assignments": rep::assignments(&s.port) }))
}

/// `GET /ports/{id}/vlan-assignments/{assignment_id}`.
pub async fn port_assignment(
    admin: web::Data<Admin>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> HttpResponse {
    let (pid, aid) = path.into_inner();
    let s = attempt!(visible_port(&admin, &caller(&req), &pid).await);
    let aid = attempt!(id(&aid));
    let all = rep::assignments(&s.port);
    match all.into_iter().find(|a| a["id"] == json!(aid)) {
        Some(a) => ok(a),
        None => not_found(),
    }
}

#[derive(Deserialize)]
struct BatchBody {
    vlan_assignments: Vec<BatchEntry>,
}

#[derive(Deserialize)]
struct BatchEntry {
    vlan: Value,
    state: Option<String>,
    native: Option<bool>,
}

/// `POST /ports/{id}/vlan-assignments/batches`: every assignment at once,
/// or none (422 naming the first it refuses).
pub async fn create_batch(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    raw: web::Bytes,
) -> HttpResponse {
    let who = caller(&req);
    let s = attempt!(visible_port(&admin, &who, &pid).await);
    attempt!(who.may_write());
    let b: BatchBody = attempt!(body(&req, &raw));
    if b.vlan_assignments.is_empty() {
        return unprocessable("vlan_assignments: at least one is required");
    }
    let mut items = Vec::new();
    for (i, e) in b.vlan_assignments.iter().enumerate() {
        let vlan = match &e.vlan {
            Value::String(v) => v.clone(),
            Value::Number(n) => n.to_string(),
            _ => {
                return unprocessable(&format!(
                    "vlan_assignments[{i}].vlan: a VLAN (\"1001\") is required"
                ));
            }
        };
        let assigned = match e.state.as_deref().unwrap_or("assigned") {
            "assigned" => true,
            "unassigned" => false,
            other => {
                return unprocessable(&format!(
                    "vlan_assignments[{i}].state: {other:?} is not assigned or unassigned"
                ));
            }
        };
        let network = attempt!(network_named(&admin, s.project, Some(&vlan)).await);
        items.push(BatchItem {
            network,
            assigned,
            native: e.native.unwrap_or(false),
        });
    }
    let (p, project, metro) = (&s.port, s.project, s.metro.as_str());
    let made = attempt!(
        write(&admin, async |tx| port_actions::batch(
            tx, p, project, metro, &items
        )
        .await)
        .await
    );
    let made = match made {
        Ok(b) => b,
        Err(e) => return unprocessable(&e.to_string()),
    };
    let port = match read(&admin, async |tx| ports::port(tx, p.id).await).await {
        Ok(Some((p, all, _))) => rep::port(&p, &all),
        Ok(None) => return not_found(),
        Err(e) => return e,
    };
    json::answer(StatusCode::CREATED, rep::batch(&made, port, false))
}

/// Each batch of the port (or the one asked), with its state.
async fn batches_of(
    admin: &Admin,
    s: &Seen,
    only: Option<Uuid>,
) -> Result<Vec<Value>, HttpResponse> {
    let (p, all, device) = (&s.port, &s.all, s.port.device_id);
    read(admin, async |tx| {
        let mut out = Vec::new();
        for b in port_actions::batches(tx, p.id, only).await? {
            let applied = ports::applied_since(tx, device, b.created_at).await?;
            out.push(rep::batch(&b, rep::port(p, all), applied));
        }
        Ok(out)
    })
    .await
}

/// `GET /ports/{id}/vlan-assignments/batches`.
pub async fn port_batches(admin: web::Data<Admin>, req: HttpRequest, pid: Id) -> HttpResponse {
    let s = attempt!(visible_port(&admin, &caller(&req), &pid).await);
    let all = attempt!(batches_of(&admin, &s, None).await);
    ok(json!({ "batches": all }))
}

/// `GET /ports/{id}/vlan-assignments/batches/{batch_id}`.
pub async fn port_batch(
    admin: web::Data<Admin>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> HttpResponse {
    let (pid, bid) = path.into_inner();
    let s = attempt!(visible_port(&admin, &caller(&req), &pid).await);
    let bid = attempt!(id(&bid));
    match attempt!(batches_of(&admin, &s, Some(bid)).await).pop() {
        Some(b) => ok(b),
        None => not_found(),
    }
}

#[derive(Deserialize)]
pub struct NetworksQuery {
    metro: Option<String>,
}

/// `GET /projects/{id}/virtual-networks`.
pub async fn project_networks(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    q: web::Query<NetworksQuery>,
) -> HttpResponse {
    let p = attempt!(visible_project(&admin, &caller(&req), &pid).await);
    let metro = q.metro.as_deref();
    let all = attempt!(read(&admin, async |tx| networks::list(tx, p.id, metro).await).await);
    ok(json!({ "virtual_networks": all.iter().map(rep::virtual_network).collect::<Vec<_>>() }))
}

#[derive(Deserialize)]
struct CreateNetwork {
    vxlan: Option<i32>,
    metro: Option<String>,
    facility: Option<String>,
    description: Option<String>,
    tags: Option<Vec<String>>,
}

/// `POST /projects/{id}/virtual-networks`: a VLAN of the tenants' range,
/// the one asked (`vxlan`) or the lowest free, in the metro asked (else
/// the cloud's).
pub async fn create_network(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    raw: web::Bytes,
) -> HttpResponse {
    let who = caller(&req);
    let p = attempt!(visible_project(&admin, &who, &pid).await);
    attempt!(who.may_write());
    let b: CreateNetwork = attempt!(body(&req, &raw));
    let c = catalog(&req);
    let metros = attempt!(metro_codes(&admin, &c).await);
    let metro = match b.metro.as_deref().or(b.facility.as_deref()) {
        Some(m) => match metros
            .iter()
            .find(|x| x.as_str() == m || stable_id("metro", x).to_string() == m)
        {
            Some(code) => code.clone(),
            None => {
                return unprocessable(&format!(
                    "metro: {m} is not a metro of this shepherd (its metros: {})",
                    metros.join(", ")
                ));
            }
        },
        None => c.default_metro.clone(),
    };
    if let Err(m) =
        check_tags(b.tags.as_deref().unwrap_or(&[])).and(check_description(&b.description))
    {
        return unprocessable(&m);
    }
    let range = c.tenant_vlans.clone();
    let tags = b.tags.unwrap_or_default();
    let made = attempt!(
        write(&admin, async |tx| networks::create(
            tx,
            p.id,
            b.vxlan,
            &metro,
            b.description.as_deref(),
            &tags,
            range.clone()
        )
        .await)
        .await
    );
    match made {
        Ok(n) => json::answer(StatusCode::CREATED, rep::virtual_network(&n)),
        Err(e) => unprocessable(&e.to_string()),
    }
}

async fn visible_network(
    admin: &Admin,
    caller: &Caller,
    raw: &str,
) -> Result<VirtualNetwork, HttpResponse> {
    let nid = id(raw)?;
    match read(admin, async |tx| networks::get(tx, nid).await).await? {
        Some(n) if caller.sees(n.project_id) => Ok(n),
        _ => Err(not_found()),
    }
}

/// `GET /virtual-networks/{id}`.
pub async fn network(admin: web::Data<Admin>, req: HttpRequest, nid: Id) -> HttpResponse {
    let n = attempt!(visible_network(&admin, &caller(&req), &nid).await);
    ok(rep::virtual_network(&n))
}

/// `DELETE /virtual-networks/{id}`: refused (422) while a port uses it.
pub async fn delete_network(admin: web::Data<Admin>, req: HttpRequest, nid: Id) -> HttpResponse {
    let who = caller(&req);
    let n = attempt!(visible_network(&admin, &who, &nid).await);
    attempt!(who.may_write());
    let gone = attempt!(write(&admin, async |tx| networks::delete(tx, n.id).await).await);
    match gone {
        Ok(()) => HttpResponse::NoContent().finish(),
        Err(e) => unprocessable(&e.to_string()),
    }
}
