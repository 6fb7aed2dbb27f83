//! The Metal API's answers, route by route. Each reads or writes through
//! `bmdb::tenants` and `bmdb::devices`; what a caller may not see is 404.

use actix_web::http::StatusCode;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::auth::Caller;
use super::catalog::{Catalog, stable_id};
use super::json::{self, Paging, not_found, ok, unavailable, unprocessable};
use crate::admin::Admin;
use crate::bmdb::devices::{self, Acted, Claimed, DeviceUpdate, Events, NewDevice};
use crate::bmdb::tenants;
use crate::bmdb::{BmdbError, Tx};

type Id = web::Path<String>;

fn caller(req: &HttpRequest) -> Caller {
    req.extensions()
        .get::<Caller>()
        .cloned()
        .expect("the Metal API's routes run behind require_caller")
}

fn catalog(req: &HttpRequest) -> web::Data<Catalog> {
    req.app_data::<web::Data<Catalog>>()
        .cloned()
        .expect("the Metal API's routes are served with their catalog (metal::serve)")
}

/// A path's ID; anything but a UUID is no such thing (404).
fn id(raw: &str) -> Result<Uuid, HttpResponse> {
    raw.parse().map_err(|_| not_found())
}

/// Runs a read in one snapshot; the BMDB failing is a 503.
async fn read<T>(
    admin: &Admin,
    f: impl AsyncFnMut(&mut Tx<'_>) -> Result<T, BmdbError>,
) -> Result<T, HttpResponse> {
    admin.bmdb.snapshot(f).await.map_err(unavailable)
}

async fn write<T>(
    admin: &Admin,
    f: impl AsyncFnMut(&mut Tx<'_>) -> Result<T, BmdbError>,
) -> Result<T, HttpResponse> {
    admin.bmdb.transact(f).await.map_err(unavailable)
}

macro_rules! attempt {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(r) => return r,
        }
    };
}

/// A JSON body: objects only, parse errors a 422 naming the field.
fn body<T: serde::de::DeserializeOwned>(req: &HttpRequest, raw: &[u8]) -> Result<T, HttpResponse> {
    let json_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_none_or(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if !json_type {
        return Err(unprocessable(
            "the body must be JSON (Content-Type: application/json)",
        ));
    }
    let raw = if raw.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        raw
    };
    let de = &mut serde_json::Deserializer::from_slice(raw);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            unprocessable(&format!("the body: {inner}"))
        } else {
            unprocessable(&format!("{path}: {inner}"))
        }
    })
}

/// The project, if the caller sees it.
async fn visible_project(
    admin: &Admin,
    caller: &Caller,
    raw: &str,
) -> Result<tenants::Project, HttpResponse> {
    let pid = id(raw)?;
    if !caller.sees(pid) {
        return Err(not_found());
    }
    read(admin, async |tx| tenants::project(tx, pid).await)
        .await?
        .ok_or_else(not_found)
}

/// The device, if the caller sees it.
async fn visible_device(
    admin: &Admin,
    caller: &Caller,
    raw: &str,
) -> Result<devices::Device, HttpResponse> {
    let did = id(raw)?;
    let d = read(admin, async |tx| devices::get(tx, did).await)
        .await?
        .ok_or_else(not_found)?;
    if caller.sees(d.project_id) {
        Ok(d)
    } else {
        Err(not_found())
    }
}

/// The metros: the default and every machine's location.
async fn metro_codes(admin: &Admin, c: &Catalog) -> Result<Vec<String>, HttpResponse> {
    let mut codes = read(admin, async |tx| devices::locations(tx).await).await?;
    if !codes.contains(&c.default_metro) {
        codes.insert(0, c.default_metro.clone());
    }
    Ok(codes)
}

fn page_of<T>(all: Vec<T>, offset: i64, limit: i64) -> (Vec<T>, i64) {
    let total = all.len() as i64;
    let page = all
        .into_iter()
        .skip(offset as usize)
        .take(limit as usize)
        .collect();
    (page, total)
}

/// `GET /user`: the token's holder.
pub async fn user(req: HttpRequest) -> HttpResponse {
    let c = caller(&req);
    let (id, name, project) = match &c {
        Caller::Project(t) => (
            t.token_id,
            format!("token {}", json::short_id(t.token_id)),
            Some(t.project_id),
        ),
        Caller::Operator(n) => (stable_id("operator", n), n.clone(), None),
    };
    ok(json!({
        "id": id,
        "short_id": json::short_id(id),
        "full_name": name,
        "first_name": name,
        "href": format!("{}/user", json::BASE),
        "default_project_id": project,
        "customdata": {},
    }))
}

#[derive(Deserialize)]
pub struct ProjectsQuery {
    name: Option<String>,
    #[serde(flatten)]
    paging: Paging,
}

/// `GET /projects`: the caller's project, or every project for an operator.
pub async fn projects(
    admin: web::Data<Admin>,
    req: HttpRequest,
    q: web::Query<ProjectsQuery>,
) -> HttpResponse {
    let c = caller(&req);
    let (offset, limit, page) = attempt!(q.paging.window());
    let all = attempt!(read(&admin, async |tx| tenants::projects(tx).await).await);
    let mine: Vec<_> = all
        .into_iter()
        .filter(|p| c.sees(p.id))
        .filter(|p| q.name.as_deref().is_none_or(|n| p.name == n))
        .collect();
    let (page_items, total) = page_of(mine, offset, limit);
    ok(json!({
        "projects": page_items.iter().map(json::project).collect::<Vec<_>>(),
        "meta": json::meta("/projects", page, limit, total),
    }))
}

/// `GET /projects/{id}`.
pub async fn project(admin: web::Data<Admin>, req: HttpRequest, pid: Id) -> HttpResponse {
    let p = attempt!(visible_project(&admin, &caller(&req), &pid).await);
    ok(json::project(&p))
}

#[derive(Deserialize)]
pub struct PlansQuery {
    slug: Option<String>,
}

async fn plan_list(admin: &Admin, req: &HttpRequest, slug: Option<&str>) -> HttpResponse {
    let c = catalog(req);
    let metros = attempt!(metro_codes(admin, &c).await);
    ok(json!({
        "plans": c.plans.iter()
            .filter(|p| slug.is_none_or(|s| p.slug == s))
            .map(|p| json::plan(p, &metros))
            .collect::<Vec<_>>(),
    }))
}

/// `GET /plans`.
pub async fn plans(
    admin: web::Data<Admin>,
    req: HttpRequest,
    q: web::Query<PlansQuery>,
) -> HttpResponse {
    plan_list(&admin, &req, q.slug.as_deref()).await
}

/// `GET /projects/{id}/plans`.
pub async fn project_plans(admin: web::Data<Admin>, req: HttpRequest, pid: Id) -> HttpResponse {
    attempt!(visible_project(&admin, &caller(&req), &pid).await);
    plan_list(&admin, &req, None).await
}

/// `GET /operating-systems`.
pub async fn operating_systems(req: HttpRequest) -> HttpResponse {
    let c = catalog(&req);
    ok(json!({
        "operating_systems": c.operating_systems.iter()
            .map(|o| json::operating_system(o, &c))
            .collect::<Vec<_>>(),
    }))
}

/// `GET /locations/metros`.
pub async fn metros(admin: web::Data<Admin>, req: HttpRequest) -> HttpResponse {
    let c = catalog(&req);
    let codes = attempt!(metro_codes(&admin, &c).await);
    ok(json!({ "metros": codes.iter().map(|m| json::metro(m)).collect::<Vec<_>>() }))
}

/// `GET /locations/metros/{id}`.
pub async fn metro(admin: web::Data<Admin>, req: HttpRequest, mid: Id) -> HttpResponse {
    let c = catalog(&req);
    let codes = attempt!(metro_codes(&admin, &c).await);
    match codes
        .iter()
        .find(|m| stable_id("metro", m).to_string() == *mid || **m == *mid)
    {
        Some(m) => ok(json::metro(m)),
        None => not_found(),
    }
}

#[derive(Deserialize)]
pub struct DevicesQuery {
    hostname: Option<String>,
    tag: Option<String>,
    search: Option<String>,
    metro: Option<String>,
    state: Option<String>,
    #[serde(flatten)]
    paging: Paging,
}

/// `GET /projects/{id}/devices`.
pub async fn project_devices(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    q: web::Query<DevicesQuery>,
) -> HttpResponse {
    let c = catalog(&req);
    let p = attempt!(visible_project(&admin, &caller(&req), &pid).await);
    let (offset, limit, page) = attempt!(q.paging.window());
    let (all, _) = attempt!(
        read(&admin, async |tx| devices::list(
            tx,
            Some(p.id),
            0,
            i64::MAX
        )
        .await)
        .await
    );
    let matching: Vec<_> = all
        .into_iter()
        .filter(|d| q.hostname.as_deref().is_none_or(|h| d.hostname.contains(h)))
        .filter(|d| {
            q.tag
                .as_deref()
                .is_none_or(|t| d.tags.iter().any(|x| x == t))
        })
        .filter(|d| q.metro.as_deref().is_none_or(|m| d.metro == m))
        .filter(|d| q.state.as_deref().is_none_or(|s| d.state() == s))
        .filter(|d| {
            q.search.as_deref().is_none_or(|s| {
                d.hostname.contains(s)
                    || d.id.to_string().starts_with(s)
                    || d.description.as_deref().is_some_and(|x| x.contains(s))
                    || d.tags.iter().any(|t| t.contains(s))
            })
        })
        .collect();
    let (items, total) = page_of(matching, offset, limit);
    ok(json!({
        "devices": items.iter().map(|d| json::device(d, &c)).collect::<Vec<_>>(),
        "meta": json::meta(&format!("/projects/{}/devices", p.id), page, limit, total),
    }))
}

/// A new device's SSH key: `{"key": …, "label": …}`.
#[derive(Deserialize, Default)]
pub struct KeyInput {
    key: Option<String>,
    label: Option<String>,
}

/// A metro, as the Metal API takes it: a code, or (the SDK's) a list.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum MetroInput {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
pub struct CreateDevice {
    metro: Option<MetroInput>,
    facility: Option<Vec<String>>,
    plan: Option<String>,
    operating_system: Option<String>,
    hostname: Option<String>,
    description: Option<String>,
    userdata: Option<String>,
    customdata: Option<Value>,
    #[serde(default)]
    tags: Vec<String>,
    hardware_reservation_id: Option<String>,
    #[serde(default)]
    locked: bool,
    #[serde(default)]
    no_ssh_keys: bool,
    #[serde(default)]
    ssh_keys: Vec<KeyInput>,
    #[serde(default)]
    project_ssh_keys: Vec<Uuid>,
    #[serde(default)]
    user_ssh_keys: Vec<Uuid>,
    #[serde(default)]
    always_pxe: bool,
    ipxe_script_url: Option<String>,
    spot_instance: Option<bool>,
}

/// A host name: 1 to 253 of letters, digits, `-` and `.`, in labels of
/// at most 63.
fn check_hostname(h: &str) -> Result<(), String> {
    let ok = !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "hostname: {h:?} is not a host name (letters, digits and '-', in labels of 1 to 63 separated by '.')"
        ))
    }
}

fn check_tags(tags: &[String]) -> Result<(), String> {
    if tags.len() > 64 {
        return Err("tags: at most 64".into());
    }
    for t in tags {
        if t.is_empty() || t.len() > 255 || t.chars().any(char::is_control) {
            return Err(format!(
                "tags: {t:?} is not a tag (1 to 255 printable characters)"
            ));
        }
    }
    Ok(())
}

fn check_description(d: &Option<String>) -> Result<(), String> {
    match d {
        Some(d) if d.len() > 1000 || d.contains('\0') => {
            Err("description: at most 1000 characters, no NUL".into())
        }
        _ => Ok(()),
    }
}

/// The first-boot data a device is installed with: NoCloud, its
/// user-data the tenant's, its meta-data the host name and public keys.
fn first_boot(
    hostname: &str,
    userdata: &str,
    keys: &[String],
) -> crate::admin::installs::FirstBootBody {
    let meta = json!({
        "local-hostname": hostname,
        "hostname": hostname,
        "public-keys": keys,
    });
    let user = if userdata.trim().is_empty() {
        "#cloud-config\n{}\n".to_string()
    } else {
        userdata.to_string()
    };
    crate::admin::installs::FirstBootBody {
        nocloud: Some(
            [
                ("meta-data".to_string(), meta.to_string()),
                ("user-data".to_string(), user),
            ]
            .into_iter()
            .collect(),
        ),
        config_drive: None,
        disk: None,
    }
}

/// The installation of `os` with this first-boot data, as asked of the
/// machine's agent; the error is the answer (422, or 503 while the image
/// is hashed).
async fn installation(
    admin: &Admin,
    image: &str,
    first: crate::admin::installs::FirstBootBody,
) -> Result<shepherd_proto::api::ImageInstallation, HttpResponse> {
    let body = crate::admin::installs::ImageBody {
        served: Some(image.to_string()),
        reboot: true,
        first_boot: Some(first),
        ..Default::default()
    };
    crate::admin::installs::image_request(admin, body)
        .await
        .map_err(|e| {
            let (status, msg) = e.answer();
            if status == StatusCode::SERVICE_UNAVAILABLE {
                json::error(status, &msg)
            } else {
                unprocessable(&msg)
            }
        })
}

/// `POST /projects/{id}/devices`: claims an available machine of the
/// plan in the metro (or the reservation's) and asks its installation.
pub async fn create_device(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    raw: web::Bytes,
) -> HttpResponse {
    let c = catalog(&req);
    let who = caller(&req);
    let project = attempt!(visible_project(&admin, &who, &pid).await);
    attempt!(who.may_write());
    let b: CreateDevice = attempt!(body(&req, &raw));
    let plan_slug = match b.plan.as_deref().map(str::trim) {
        Some(p) if !p.is_empty() => p.to_string(),
        _ => return unprocessable("plan: required"),
    };
    let Some(plan) = c.plan_by(&plan_slug).cloned() else {
        return unprocessable(&format!(
            "plan: {plan_slug:?} is not a plan of this shepherd"
        ));
    };
    let os_slug = match b.operating_system.as_deref().map(str::trim) {
        Some(o) if !o.is_empty() => o.to_string(),
        _ => return unprocessable("operating_system: required"),
    };
    let Some(os) = c.operating_system(&os_slug).cloned() else {
        return unprocessable(&format!(
            "operating_system: {os_slug:?} is not an operating system of this shepherd"
        ));
    };
    if b.always_pxe || b.ipxe_script_url.as_deref().is_some_and(|u| !u.is_empty()) {
        return unprocessable("always_pxe and ipxe_script_url: custom iPXE is not offered here");
    }
    if b.spot_instance == Some(true) {
        return unprocessable("spot_instance: spot instances are not offered here");
    }
    let metros = attempt!(metro_codes(&admin, &c).await);
    let wanted: Vec<String> = match (&b.metro, &b.facility) {
        (Some(MetroInput::One(m)), _) => vec![m.trim().to_string()],
        (Some(MetroInput::Many(ms)), _) => ms.iter().map(|m| m.trim().to_string()).collect(),
        (None, Some(f)) => f.iter().map(|m| m.trim().to_string()).collect(),
        (None, None) => return unprocessable("metro: required"),
    };
    let any = wanted.iter().any(|m| m == "any");
    let chosen: Vec<String> = if any {
        metros.clone()
    } else {
        wanted
            .iter()
            .filter_map(|w| {
                metros
                    .iter()
                    .find(|m| *m == w || stable_id("metro", m).to_string() == *w)
                    .cloned()
            })
            .collect()
    };
    if chosen.is_empty() {
        return unprocessable(&format!(
            "metro: {} is not a metro of this shepherd (its metros: {})",
            wanted.join(", "),
            metros.join(", ")
        ));
    }
    let hostname = match b.hostname.as_deref().map(str::trim) {
        Some(h) if !h.is_empty() => h.to_string(),
        _ => String::new(),
    };
    let device_id = Uuid::new_v4();
    let hostname = if hostname.is_empty() {
        format!(
            "{}-{}",
            plan.slug.split('.').next().unwrap_or("device"),
            json::short_id(device_id)
        )
    } else {
        hostname
    };
    if let Err(m) = check_hostname(&hostname)
        .and(check_tags(&b.tags))
        .and(check_description(&b.description))
    {
        return unprocessable(&m);
    }
    let customdata = match b.customdata {
        None => json!({}),
        Some(v @ Value::Object(_)) => v,
        Some(_) => return unprocessable("customdata: must be an object"),
    };
    if !b.user_ssh_keys.is_empty() {
        return unprocessable(
            "user_ssh_keys: users' keys are not kept here; use project_ssh_keys or ssh_keys",
        );
    }
    let reservation = match b.hardware_reservation_id.as_deref().map(str::trim) {
        None | Some("") | Some("next-available") => None,
        Some(r) => match r.parse::<Uuid>() {
            Ok(u) => Some(u),
            Err(_) => return not_found(),
        },
    };
    // The keys: those given, else every key of the project.
    let project_keys =
        attempt!(read(&admin, async |tx| tenants::keys(tx, Some(project.id)).await).await);
    let mut keys: Vec<String> = Vec::new();
    for (i, k) in b.ssh_keys.iter().enumerate() {
        let Some(line) = k.key.as_deref() else {
            return unprocessable(&format!("ssh_keys[{i}].key: required"));
        };
        match tenants::parse_public_key(line) {
            Ok((line, _)) => keys.push(line),
            Err(e) => return unprocessable(&format!("ssh_keys[{i}].key: {e}")),
        }
        let _ = &k.label;
    }
    for kid in &b.project_ssh_keys {
        match project_keys.iter().find(|k| k.id == *kid) {
            Some(k) => keys.push(k.key.clone()),
            None => {
                return unprocessable(&format!(
                    "project_ssh_keys: {kid} is not a key of this project"
                ));
            }
        }
    }
    if b.ssh_keys.is_empty() && b.project_ssh_keys.is_empty() && !b.no_ssh_keys {
        keys.extend(project_keys.iter().map(|k| k.key.clone()));
    }
    keys.dedup();
    let userdata = b.userdata.unwrap_or_default();
    let image =
        attempt!(installation(&admin, &os.image, first_boot(&hostname, &userdata, &keys)).await);
    let new = NewDevice {
        id: device_id,
        project_id: project.id,
        hostname,
        description: b.description,
        tags: b.tags,
        plan: plan.slug.clone(),
        metro: chosen[0].clone(),
        operating_system: os.slug.clone(),
        userdata,
        customdata,
        ssh_keys: keys,
        locked: b.locked,
        reservation,
        actor: who.actor(),
    };
    let cat = c.clone();
    let chosen_metros = chosen.clone();
    let plan_slug = plan.slug.clone();
    let by_reservation = reservation.is_some();
    let place = move |cand: &devices::Candidate| -> Result<devices::Placed, String> {
        let metro = cat.metro_of(cand.location.as_deref());
        let Some(of) = cat.plan_of_raw(cand.hardware_report.as_deref(), cand.bmc_secure_boot)
        else {
            return Err(format!("machine {} meets no plan", cand.machine_id));
        };
        // A reservation is its machine, of its plan, where it is.
        if by_reservation || (of.slug == plan_slug && chosen_metros.contains(&metro)) {
            Ok(devices::Placed {
                plan: of.slug.clone(),
                metro,
                secure_boot: of.secure_boot,
            })
        } else {
            Err(format!(
                "machine {} is a {} in {metro}",
                cand.machine_id, of.slug
            ))
        }
    };
    let claimed = attempt!(
        write(&admin, async |tx| devices::claim(tx, &new, &image, &place)
            .await)
        .await
    );
    match claimed {
        Claimed::Done(d) => {
            let d = *d;
            tracing::info!(device_id = %d.id, machine_id = %d.machine_id, project = %project.name, actor = %who.actor(), plan = %d.plan, "device created");
            json::answer(StatusCode::CREATED, json::device(&d, &c))
        }
        Claimed::NoCapacity(_) => unprocessable(&format!(
            "There aren't available servers in that metro: no {} server is available in {}",
            plan.slug,
            chosen.join(", ")
        )),
        Claimed::Limit(why) => {
            unprocessable(&format!("The project's device limit is reached: {why}"))
        }
        Claimed::NoReservation => not_found(),
        Claimed::ReservationBusy(why) => unprocessable(&format!(
            "The hardware reservation is not provisionable: {why}"
        )),
    }
}

/// `GET /devices/{id}`.
pub async fn device(admin: web::Data<Admin>, req: HttpRequest, did: Id) -> HttpResponse {
    let c = catalog(&req);
    let d = attempt!(visible_device(&admin, &caller(&req), &did).await);
    ok(json::device(&d, &c))
}

#[derive(Deserialize)]
pub struct UpdateDevice {
    hostname: Option<String>,
    description: Option<String>,
    tags: Option<Vec<String>>,
    locked: Option<bool>,
    userdata: Option<String>,
    customdata: Option<Value>,
    always_pxe: Option<bool>,
    ipxe_script_url: Option<String>,
}

/// `PUT /devices/{id}`: host name, description, tags, locked (and the
/// userdata and customdata kept for the next reinstall).
pub async fn update_device(
    admin: web::Data<Admin>,
    req: HttpRequest,
    did: Id,
    raw: web::Bytes,
) -> HttpResponse {
    let c = catalog(&req);
    let who = caller(&req);
    let d = attempt!(visible_device(&admin, &who, &did).await);
    attempt!(who.may_write());
    let b: UpdateDevice = attempt!(body(&req, &raw));
    if b.always_pxe == Some(true) || b.ipxe_script_url.as_deref().is_some_and(|u| !u.is_empty()) {
        return unprocessable("always_pxe and ipxe_script_url: custom iPXE is not offered here");
    }
    let hostname = b.hostname.map(|h| h.trim().to_string());
    if let Some(h) = &hostname {
        if let Err(m) = check_hostname(h) {
            return unprocessable(&m);
        }
    }
    if let Err(m) =
        check_tags(b.tags.as_deref().unwrap_or(&[])).and(check_description(&b.description))
    {
        return unprocessable(&m);
    }
    let customdata = match b.customdata {
        None => None,
        Some(v @ Value::Object(_)) => Some(v),
        Some(_) => return unprocessable("customdata: must be an object"),
    };
    let u = DeviceUpdate {
        hostname,
        description: b.description,
        tags: b.tags,
        locked: b.locked,
        userdata: b.userdata,
        customdata,
    };
    let updated = attempt!(write(&admin, async |tx| devices::update(tx, d.id, &u).await).await);
    match updated {
        Some(d) => ok(json::device(&d, &c)),
        None => not_found(),
    }
}

#[derive(Deserialize)]
pub struct DeleteQuery {
    force_delete: Option<bool>,
}

/// `DELETE /devices/{id}`: 204; the machine is erased, then available.
pub async fn delete_device(
    admin: web::Data<Admin>,
    req: HttpRequest,
    did: Id,
    q: web::Query<DeleteQuery>,
) -> HttpResponse {
    let who = caller(&req);
    let d = attempt!(visible_device(&admin, &who, &did).await);
    attempt!(who.may_write());
    let force = q.force_delete.unwrap_or(false) && matches!(who, Caller::Operator(_));
    let actor = who.actor();
    let mode = catalog(&req).erase_mode.clone();
    let done = attempt!(
        write(&admin, async |tx| devices::delete(
            tx, d.id, &actor, force, &mode
        )
        .await)
        .await
    );
    acted(done, StatusCode::NO_CONTENT, || {
        tracing::info!(device_id = %d.id, machine_id = %d.machine_id, actor = %actor, "device deleted: its machine is erased");
    })
}

fn acted(a: Acted, status: StatusCode, log: impl FnOnce()) -> HttpResponse {
    match a {
        Acted::Done => {
            log();
            HttpResponse::build(status).finish()
        }
        Acted::Refused(why) => unprocessable(&why),
        Acted::NotFound => not_found(),
    }
}

#[derive(Deserialize)]
pub struct ActionInput {
    #[serde(rename = "type")]
    kind: Option<String>,
    operating_system: Option<String>,
}

/// `POST /devices/{id}/actions`: `power_on`, `power_off`, `reboot`,
/// `reinstall` (202).
pub async fn device_action(
    admin: web::Data<Admin>,
    req: HttpRequest,
    did: Id,
    raw: web::Bytes,
) -> HttpResponse {
    let c = catalog(&req);
    let who = caller(&req);
    let d = attempt!(visible_device(&admin, &who, &did).await);
    attempt!(who.may_write());
    let b: ActionInput = attempt!(body(&req, &raw));
    let actor = who.actor();
    let kind = b.kind.unwrap_or_default();
    let done = match kind.as_str() {
        "power_on" | "power_off" | "reboot" => {
            let power = match kind.as_str() {
                "power_on" => "on",
                "power_off" => "off",
                _ => "reboot",
            };
            attempt!(
                write(&admin, async |tx| devices::power(tx, d.id, power, &actor)
                    .await)
                .await
            )
        }
        "reinstall" => {
            let slug = b
                .operating_system
                .unwrap_or_else(|| d.operating_system.clone());
            let Some(os) = c.operating_system(&slug).cloned() else {
                return unprocessable(&format!(
                    "operating_system: {slug:?} is not an operating system of this shepherd"
                ));
            };
            let image = attempt!(
                installation(
                    &admin,
                    &os.image,
                    first_boot(&d.hostname, &d.userdata, &d.ssh_keys)
                )
                .await
            );
            attempt!(
                write(&admin, async |tx| devices::reinstall(
                    tx, d.id, &image, &os.slug, &actor
                )
                .await)
                .await
            )
        }
        "rescue" => return unprocessable("type: rescue is not offered here"),
        "" => return unprocessable("type: required"),
        other => {
            return unprocessable(&format!(
                "type: {other:?} is not one of power_on, power_off, reboot, reinstall"
            ));
        }
    };
    acted(done, StatusCode::ACCEPTED, || {
        tracing::info!(device_id = %d.id, machine_id = %d.machine_id, action = %kind, actor = %actor, "device action");
    })
}

async fn event_list(admin: &Admin, which: Events, paging: &Paging, path: &str) -> HttpResponse {
    let (offset, limit, page) = attempt!(paging.window());
    let (list, total) = attempt!(
        read(admin, async |tx| devices::events(tx, which, offset, limit)
            .await)
        .await
    );
    ok(json!({
        "events": list.iter().map(json::event).collect::<Vec<_>>(),
        "meta": json::meta(path, page, limit, total),
    }))
}

/// `GET /devices/{id}/events`.
pub async fn device_events(
    admin: web::Data<Admin>,
    req: HttpRequest,
    did: Id,
    q: web::Query<Paging>,
) -> HttpResponse {
    let d = attempt!(visible_device(&admin, &caller(&req), &did).await);
    event_list(
        &admin,
        Events::Device(d.id),
        &q,
        &format!("/devices/{}/events", d.id),
    )
    .await
}

/// `GET /projects/{id}/events`.
pub async fn project_events(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    q: web::Query<Paging>,
) -> HttpResponse {
    let p = attempt!(visible_project(&admin, &caller(&req), &pid).await);
    event_list(
        &admin,
        Events::Project(p.id),
        &q,
        &format!("/projects/{}/events", p.id),
    )
    .await
}

/// `GET /events`: the caller's project's (every project's, for an
/// operator).
pub async fn events(
    admin: web::Data<Admin>,
    req: HttpRequest,
    q: web::Query<Paging>,
) -> HttpResponse {
    let c = caller(&req);
    event_list(&admin, Events::All(c.project()), &q, "/events").await
}

/// `GET /events/{id}`.
pub async fn event(admin: web::Data<Admin>, req: HttpRequest, eid: Id) -> HttpResponse {
    let c = caller(&req);
    let eid = attempt!(id(&eid));
    let (list, _) = attempt!(
        read(&admin, async |tx| devices::events(
            tx,
            Events::One(eid),
            0,
            1
        )
        .await)
        .await
    );
    match list.first() {
        Some(e) if c.sees(e.project_id) => ok(json::event(e)),
        _ => not_found(),
    }
}

#[derive(Deserialize)]
pub struct ReservationsQuery {
    provisionable: Option<String>,
    #[serde(flatten)]
    paging: Paging,
}

/// `GET /projects/{id}/hardware-reservations`: the machines assigned to
/// the project.
pub async fn project_reservations(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    q: web::Query<ReservationsQuery>,
) -> HttpResponse {
    let c = catalog(&req);
    let p = attempt!(visible_project(&admin, &caller(&req), &pid).await);
    let (offset, limit, page) = attempt!(q.paging.window());
    let all = attempt!(
        read(&admin, async |tx| devices::reservations(
            tx,
            Some(p.id),
            None
        )
        .await)
        .await
    );
    let only = q.provisionable.as_deref() == Some("only");
    let shown: Vec<Value> = all
        .iter()
        .map(|r| json::reservation(r, &c))
        .filter(|v| !only || v["provisionable"] == json!(true))
        .collect();
    let (items, total) = page_of(shown, offset, limit);
    ok(json!({
        "hardware_reservations": items,
        "meta": json::meta(&format!("/projects/{}/hardware-reservations", p.id), page, limit, total),
    }))
}

/// `GET /hardware-reservations/{id}`.
pub async fn reservation(admin: web::Data<Admin>, req: HttpRequest, rid: Id) -> HttpResponse {
    let c = catalog(&req);
    let who = caller(&req);
    let rid = attempt!(id(&rid));
    let found = attempt!(
        read(&admin, async |tx| devices::reservations(
            tx,
            None,
            Some(rid)
        )
        .await)
        .await
    );
    match found.first() {
        Some(r) if who.sees(r.project_id) => ok(json::reservation(r, &c)),
        _ => not_found(),
    }
}

/// `GET /projects/{id}/ssh-keys`.
pub async fn project_keys(admin: web::Data<Admin>, req: HttpRequest, pid: Id) -> HttpResponse {
    let p = attempt!(visible_project(&admin, &caller(&req), &pid).await);
    let keys = attempt!(read(&admin, async |tx| tenants::keys(tx, Some(p.id)).await).await);
    ok(json!({ "ssh_keys": keys.iter().map(json::key).collect::<Vec<_>>() }))
}

#[derive(Deserialize)]
pub struct KeyBody {
    key: Option<String>,
    label: Option<String>,
}

fn check_label(label: &str) -> Result<(), HttpResponse> {
    if label.trim().is_empty() || label.len() > 255 || label.chars().any(char::is_control) {
        Err(unprocessable("label: 1 to 255 printable characters"))
    } else {
        Ok(())
    }
}

/// `POST /projects/{id}/ssh-keys` (201).
pub async fn create_project_key(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    raw: web::Bytes,
) -> HttpResponse {
    let who = caller(&req);
    let p = attempt!(visible_project(&admin, &who, &pid).await);
    attempt!(who.may_write());
    let b: KeyBody = attempt!(body(&req, &raw));
    let Some(line) = b.key.as_deref() else {
        return unprocessable("key: required");
    };
    let (line, fingerprint) = match tenants::parse_public_key(line) {
        Ok(v) => v,
        Err(e) => return unprocessable(&format!("key: {e}")),
    };
    let label = b.label.unwrap_or_else(|| fingerprint.clone());
    attempt!(check_label(&label));
    let added = attempt!(
        write(&admin, async |tx| tenants::add_key(
            tx,
            p.id,
            &label,
            &line,
            &fingerprint
        )
        .await)
        .await
    );
    match added {
        Ok(k) => json::answer(StatusCode::CREATED, json::key(&k)),
        Err(why) => unprocessable(&why),
    }
}

/// `GET /ssh-keys`: the keys of the caller's project.
pub async fn keys(admin: web::Data<Admin>, req: HttpRequest) -> HttpResponse {
    let c = caller(&req);
    let keys = attempt!(read(&admin, async |tx| tenants::keys(tx, c.project()).await).await);
    ok(json!({ "ssh_keys": keys.iter().map(json::key).collect::<Vec<_>>() }))
}

async fn visible_key(
    admin: &Admin,
    who: &Caller,
    raw: &str,
) -> Result<tenants::SshKey, HttpResponse> {
    let kid = id(raw)?;
    match read(admin, async |tx| tenants::key(tx, kid).await).await? {
        Some(k) if who.sees(k.project_id) => Ok(k),
        _ => Err(not_found()),
    }
}

/// `GET /ssh-keys/{id}`.
pub async fn key(admin: web::Data<Admin>, req: HttpRequest, kid: Id) -> HttpResponse {
    let k = attempt!(visible_key(&admin, &caller(&req), &kid).await);
    ok(json::key(&k))
}

/// `PUT /ssh-keys/{id}`.
pub async fn update_key(
    admin: web::Data<Admin>,
    req: HttpRequest,
    kid: Id,
    raw: web::Bytes,
) -> HttpResponse {
    let who = caller(&req);
    let k = attempt!(visible_key(&admin, &who, &kid).await);
    attempt!(who.may_write());
    let b: KeyBody = attempt!(body(&req, &raw));
    if let Some(l) = &b.label {
        attempt!(check_label(l));
    }
    let parsed = match b.key.as_deref().map(tenants::parse_public_key) {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(e)) => return unprocessable(&format!("key: {e}")),
    };
    let updated = attempt!(
        write(&admin, async |tx| {
            tenants::update_key(
                tx,
                k.id,
                b.label.as_deref(),
                parsed.as_ref().map(|(l, f)| (l.as_str(), f.as_str())),
            )
            .await
        })
        .await
    );
    match updated {
        Some(k) => ok(json::key(&k)),
        None => not_found(),
    }
}

/// `DELETE /ssh-keys/{id}` (204).
pub async fn delete_key(admin: web::Data<Admin>, req: HttpRequest, kid: Id) -> HttpResponse {
    let who = caller(&req);
    let k = attempt!(visible_key(&admin, &who, &kid).await);
    attempt!(who.may_write());
    match attempt!(write(&admin, async |tx| tenants::delete_key(tx, k.id).await).await) {
        true => HttpResponse::NoContent().finish(),
        false => not_found(),
    }
}

/// `GET /devices/{id}/ssh-keys`: the project's keys the device was
/// installed with.
pub async fn device_keys(admin: web::Data<Admin>, req: HttpRequest, did: Id) -> HttpResponse {
    let d = attempt!(visible_device(&admin, &caller(&req), &did).await);
    let keys = attempt!(
        read(&admin, async |tx| tenants::keys(tx, Some(d.project_id))
            .await)
        .await
    );
    ok(json!({
        "ssh_keys": keys.iter()
            .filter(|k| d.ssh_keys.iter().any(|l| l.trim() == k.key.trim()))
            .map(json::key)
            .collect::<Vec<_>>(),
    }))
}
