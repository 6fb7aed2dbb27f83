//! The Metal API's answers, route by route. Each reads or writes through
//! `bmdb::tenants` and `bmdb::devices`; what a caller may not see is 404.

use actix_web::http::StatusCode;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::error::Category;
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

// The rooms.
mod create;
mod device;
mod events;
mod keys;
mod ports;
mod reservations;
pub use create::*;
pub use device::*;
pub use events::*;
pub use keys::*;
pub use ports::*;
pub use reservations::*;

/// A JSON body: objects only, parse errors a 422 naming the field (or,
/// for a body that is not JSON, where it stops being JSON).
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
        match inner.classify() {
            // Not JSON at all: where it stops being JSON, not a field.
            Category::Syntax | Category::Eof | Category::Io => {
                unprocessable(&format!("the body is not JSON: {inner}"))
            }
            Category::Data if path == "." || path.is_empty() || path.contains('?') => {
                unprocessable(&format!("the body: {inner}"))
            }
            Category::Data => unprocessable(&format!("{path}: {inner}")),
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

/// The device a change is asked of, if the caller sees it and may write.
async fn writable_device(
    admin: &Admin,
    caller: &Caller,
    raw: &str,
) -> Result<devices::Device, HttpResponse> {
    let d = visible_device(admin, caller, raw).await?;
    caller.may_write()?;
    Ok(d)
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
    read(admin, async |tx| {
        devices::metros(tx, &c.default_metro).await
    })
    .await
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
