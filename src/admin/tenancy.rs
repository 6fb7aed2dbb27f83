//! Tenancy in the operator's API: a machine given to a project (its
//! hardware reservation there; moved when another project held it) or
//! given back to the shared pool, as `shepherd projects assign` and
//! `unassign` do, audited in `tenant_audit` with the operator's name. A
//! tenant's device is reclaimed by deprovisioning its machine (the device
//! ends once the machine is erased).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::installs::api_post;
use super::request::error_response;
use super::state::Admin;
use crate::bmdb::tenants::{self, Assigned};

/// A machine given to a project.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AssignBody {
    /// The project's ID or name.
    #[schema(value_type = String, required = true)]
    pub project: Option<String>,
}

/// What was done.
#[derive(Serialize, ToSchema)]
pub struct TenancyChanged {
    pub detail: String,
}

fn answer(r: Result<Assigned, crate::bmdb::BmdbError>, machine: Uuid) -> HttpResponse {
    match r {
        Ok(Assigned::Done(detail)) => HttpResponse::Ok().json(TenancyChanged { detail }),
        Ok(Assigned::Refused(why)) => error_response(StatusCode::CONFLICT, &why),
        Ok(Assigned::NotFound) => error_response(
            StatusCode::NOT_FOUND,
            &format!("machine {machine} is not in the BMDB"),
        ),
        Err(e) => error_response(StatusCode::SERVICE_UNAVAILABLE, &format!("BMDB: {e}")),
    }
}

fn machine_id(raw: &str) -> Result<Uuid, HttpResponse> {
    raw.parse().map_err(|_| {
        error_response(
            StatusCode::BAD_REQUEST,
            "the path's machine ID is not a UUID",
        )
    })
}

/// `POST /api/v1/machines/{id}/assign`.
#[utoipa::path(post, path = "/api/v1/machines/{id}/assign", tag = "tenants",
    params(("id" = Uuid, Path, description = "the machine's ID")),
    request_body(content = AssignBody, content_type = "application/json"),
    responses(
        (status = 200, description = "assigned, or moved from another project", body = TenancyChanged),
        (status = 404, description = "no such machine or project", body = super::api::ErrorBody),
        (status = 409, description = "another project's device runs on it: reclaim it first", body = super::api::ErrorBody)))]
pub async fn api_assign(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let (b, op) = attempt!(api_post::<AssignBody>(&req, &body));
    let m = attempt!(machine_id(&id));
    let Some(project) = b
        .project
        .filter(|p| !p.trim().is_empty() && !p.contains('\0'))
    else {
        return error_response(StatusCode::BAD_REQUEST, "project: required");
    };
    let found = admin
        .bmdb
        .snapshot(async |tx| tenants::find_project(tx, &project).await)
        .await;
    let p = match found {
        Ok(Some(p)) => p,
        Ok(None) => {
            return error_response(
                StatusCode::NOT_FOUND,
                &format!("no project {project:?} (by ID or name)"),
            );
        }
        Err(e) => return error_response(StatusCode::SERVICE_UNAVAILABLE, &format!("BMDB: {e}")),
    };
    let r = admin
        .bmdb
        .transact(async |tx| tenants::assign(tx, p.id, m, &op.0).await)
        .await;
    answer(r, m)
}

/// `POST /api/v1/machines/{id}/unassign`.
#[utoipa::path(post, path = "/api/v1/machines/{id}/unassign", tag = "tenants",
    params(("id" = Uuid, Path, description = "the machine's ID")),
    request_body(content = Option<super::api::Empty>, content_type = "application/json", description = "empty"),
    responses(
        (status = 200, description = "back in the shared pool", body = TenancyChanged),
        (status = 400, description = "the ID is not a UUID, or the body is not empty JSON", body = super::api::ErrorBody),
        (status = 409, description = "a device runs on it: reclaim it first", body = super::api::ErrorBody)))]
pub async fn api_unassign(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let (_, op) = attempt!(api_post::<super::api::Empty>(&req, &body));
    let m = attempt!(machine_id(&id));
    let r = admin
        .bmdb
        .transact(async |tx| tenants::unassign(tx, m, &op.0).await)
        .await;
    answer(r, m)
}
