//! Rollouts in the API: an image installed, disks erased or a baseline
//! applied over a set of machines (IDs, or the fleet page's filters), at
//! most N at once, stopped after F failures; read and cancelled. The
//! pages go through the same functions.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use shepherd_proto::api::ImageInstallation;
use uuid::Uuid;

use super::installs::{ErasureBody, ImageBody, api_post, erasure_request, image_request};
use actix_web::http::StatusCode;

use super::request::{ApiError, Page, bad_request, error_response, internal};
use super::state::{Admin, Operator};
use crate::bmdb::rollouts::{self, Member, NewRollout, Rollout};

/// A rollout: the image (or the erasure, or the baseline), and the
/// machines (IDs, or the fleet's filters).
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RolloutBody {
    /// The image every machine installs (give this or `deprovision`).
    #[schema(value_type = Option<ImageBody>)]
    pub image: Option<ImageBody>,
    /// Deprovision every machine instead: erase its disks as this says.
    pub deprovision: Option<ErasureBody>,
    /// Service instead: bring every machine this `[[baselines]]` entry
    /// selects to it (those of the IDs or filters given, else every one
    /// that differs from it). A tenant's machine is skipped.
    pub baseline: Option<String>,
    /// Machines installing at once (default 1).
    #[schema(minimum = 1, maximum = 10000)]
    pub max_parallel: Option<i32>,
    /// Failures tolerated; one more stops the rollout (default 0).
    #[schema(minimum = 0)]
    pub max_failures: Option<i32>,
    /// The machines: these IDs, in this order…
    pub machines: Option<Vec<Uuid>>,
    /// …or the fleet page's filters.
    #[schema(value_type = Option<super::api::MachineStateName>)]
    pub state: Option<String>,
    #[schema(value_type = Option<super::api::ProviderStatusName>)]
    pub provider_status: Option<String>,
    #[schema(value_type = Option<super::api::HeartbeatName>)]
    pub heartbeat: Option<String>,
    pub q: Option<String>,
    pub location: Option<String>,
    /// A project's ID (empty: any).
    #[schema(value_type = Option<String>, pattern = r"^$|^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")]
    pub project: Option<String>,
    #[schema(value_type = Option<super::api::BmcName>)]
    pub bmc: Option<String>,
    #[schema(value_type = Option<super::api::BootName>)]
    pub boot: Option<String>,
    pub plan: Option<String>,
    pub request_id: Option<Uuid>,
}

impl RolloutBody {
    /// Its filters, as the fleet's listing reads them.
    fn page(&self) -> Page {
        Page {
            state: self.state.clone(),
            provider_status: self.provider_status.clone(),
            heartbeat: self.heartbeat.clone(),
            q: self.q.clone(),
            location: self.location.clone(),
            project: self.project.clone(),
            bmc: self.bmc.clone(),
            boot: self.boot.clone(),
            plan: self.plan.clone(),
            limit: None,
            offset: None,
        }
    }
}

/// Creates a rollout; the rollout, or the error.
pub async fn create_rollout(
    admin: &Admin,
    operator: &Operator,
    body: RolloutBody,
) -> Result<Rollout, ApiError> {
    let bad = ApiError::Invalid;
    let page = body.page();
    let max_parallel = body.max_parallel.unwrap_or(1);
    if !(1..=10_000).contains(&max_parallel) {
        return Err(bad(format!(
            "max_parallel: {max_parallel} is outside 1 to 10000"
        )));
    }
    let max_failures = body.max_failures.unwrap_or(0);
    if max_failures < 0 {
        return Err(bad(format!("max_failures: {max_failures} is negative")));
    }
    let (image, erasure) = match (body.image, &body.deprovision, &body.baseline) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => {
            return Err(bad(
                "give one of image (an installation), deprovision or baseline".into(),
            ));
        }
        (None, None, None) => {
            return Err(bad("image: required (or deprovision, or baseline)".into()));
        }
        (Some(i), None, None) => (image_request(admin, i).await?, None),
        (None, Some(d), None) => (
            ImageInstallation::default(),
            Some(erasure_request(d).map_err(|e| bad(format!("deprovision.{e}")))?),
        ),
        (None, None, Some(b)) => {
            if admin.baselines.named(b).is_none() {
                return Err(bad(format!(
                    "baseline: {b:?} is not a declared [[baselines]] name"
                )));
            }
            (ImageInstallation::default(), None)
        }
    };
    let given = page.given();
    let by_filter = !given.is_empty();
    if body.machines.is_some() && by_filter {
        let names: Vec<&str> = page.filters().iter().map(|(k, _)| *k).collect();
        return Err(bad(format!(
            "machines: give machine IDs or filters ({}), not both",
            names.join(", ")
        )));
    }
    let filter = page.filter(admin).map_err(|_| {
        bad("a filter is not valid: see GET /api/v1/machines for the values".into())
    })?;
    let selection = match &body.machines {
        Some(ids) => format!("{} machines by ID", ids.len()),
        None if given.is_empty() => "every machine".to_string(),
        None => given
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
    };
    let id = body.request_id.unwrap_or_else(Uuid::new_v4);
    let machines = body.machines;
    let baseline = body.baseline.clone();
    let selection = match &baseline {
        Some(b) if !by_filter && machines.is_none() => {
            format!("the machines baseline {b} selects that differ from it")
        }
        Some(b) => format!("{selection}, of those baseline {b} selects"),
        None => selection,
    };
    let r = admin
        .bmdb
        .transact(async |tx| {
            let ids: Vec<Uuid> = match &machines {
                Some(ids) => {
                    let mut seen = std::collections::HashSet::new();
                    ids.iter().copied().filter(|i| seen.insert(*i)).collect()
                }
                None => crate::bmdb::machines::fleet_page(tx, &filter, 100_000, 0)
                    .await?
                    .0
                    .into_iter()
                    .map(|m| m.machine_id)
                    .collect(),
            };
            let ids = match &baseline {
                Some(b) => {
                    let drifting = !by_filter && machines.is_none();
                    admin
                        .baselines
                        .selected(tx, b, Some(&ids), drifting)
                        .await?
                }
                None => ids,
            };
            rollouts::create(
                tx,
                &NewRollout {
                    id,
                    image: &image,
                    erasure: erasure.as_ref(),
                    baseline: baseline.as_deref(),
                    max_parallel,
                    max_failures,
                    selection: &selection,
                    machines: &ids,
                    created_by: &operator.0,
                },
            )
            .await
        })
        .await
        .map_err(ApiError::from)?;
    tracing::info!(rollout = %r.id, machines = r.counts.waiting, image = %r.image_url, actor = %operator.0, %selection, "rollout created");
    if let Some(loops) = &admin.loops {
        loops.do_send(crate::control::NudgeLoop("rollouts"));
    }
    Ok(r)
}

/// `POST /api/v1/rollouts`.
#[utoipa::path(post, path = "/api/v1/rollouts", tag = "installations",
    request_body(content = RolloutBody, content_type = "application/json"),
    responses(
        (status = 201, description = "the rollout, started", body = super::api::RolloutOne),
        (status = 503, description = "the BMDB failed or did not answer within admin.database_timeout, or the served image is new and still being hashed (ask again)", body = super::api::ErrorBody)))]
pub async fn api_rollout_create(
    admin: web::Data<Admin>,
    req: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    let (parsed, op) = attempt!(api_post::<RolloutBody>(&req, &body));
    match create_rollout(&admin, &op, parsed).await {
        Ok(r) => HttpResponse::Created().json(super::api::RolloutOne {
            rollout: (&r).into(),
        }),
        Err(e) => e.answer(),
    }
}

/// `GET /api/v1/rollouts`: the latest 100.
#[utoipa::path(get, path = "/api/v1/rollouts", tag = "installations",
    responses(
        (status = 200, description = "the latest 100 rollouts", body = super::api::RolloutList),
        (status = 500, description = "the BMDB failed", body = super::api::ErrorBody)))]
pub async fn api_rollouts(admin: web::Data<Admin>) -> HttpResponse {
    match admin
        .bmdb
        .transact(async |tx| rollouts::list(tx, 100).await)
        .await
    {
        Ok(v) => HttpResponse::Ok().json(super::api::RolloutList {
            rollouts: v.iter().map(super::api::RolloutView::from).collect(),
        }),
        Err(e) => internal(e),
    }
}

fn rollout_id(id: &str) -> Result<Uuid, HttpResponse> {
    id.parse()
        .map_err(|_| bad_request("the path's rollout ID is not a UUID".into()))
}

/// A rollout and its machines, or the error response.
pub async fn load_rollout(admin: &Admin, id: &str) -> Result<(Rollout, Vec<Member>), HttpResponse> {
    let id = rollout_id(id)?;
    match admin
        .bmdb
        .snapshot(async |tx| {
            Ok(match rollouts::get(tx, id).await? {
                Some(r) => Some((r, rollouts::members(tx, id).await?)),
                None => None,
            })
        })
        .await
    {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Err(error_response(
            StatusCode::NOT_FOUND,
            &format!("rollout {id} does not exist"),
        )),
        Err(e) => Err(internal(e)),
    }
}

/// `GET /api/v1/rollouts/{id}`.
#[utoipa::path(get, path = "/api/v1/rollouts/{id}", tag = "installations",
    params(("id" = Uuid, Path, description = "the rollout's ID")),
    responses(
        (status = 200, description = "the rollout and its machines", body = super::api::RolloutDetail),
        (status = 400, description = "the ID is not a UUID", body = super::api::ErrorBody),
        (status = 404, description = "no such rollout", body = super::api::ErrorBody),
        (status = 500, description = "the BMDB failed", body = super::api::ErrorBody)))]
pub async fn api_rollout(admin: web::Data<Admin>, id: web::Path<String>) -> HttpResponse {
    match load_rollout(&admin, &id).await {
        Ok((r, members)) => HttpResponse::Ok().json(super::api::RolloutDetail {
            rollout: (&r).into(),
            machines: members
                .iter()
                .map(super::api::RolloutMachine::from)
                .collect(),
        }),
        Err(r) => r,
    }
}

/// Cancels a rollout for `operator`.
pub async fn cancel_rollout(
    admin: &Admin,
    operator: &Operator,
    id: &str,
) -> Result<Rollout, HttpResponse> {
    let id = rollout_id(id)?;
    match admin
        .bmdb
        .transact(async |tx| rollouts::cancel(tx, id, &operator.0).await)
        .await
    {
        Ok(Some(r)) => {
            tracing::info!(rollout = %id, actor = %operator.0, state = %r.state, "rollout canceled");
            Ok(r)
        }
        Ok(None) => Err(error_response(
            StatusCode::NOT_FOUND,
            &format!("rollout {id} does not exist"),
        )),
        Err(e) => Err(error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("BMDB: {e}"),
        )),
    }
}

/// `POST /api/v1/rollouts/{id}/cancel`.
#[utoipa::path(post, path = "/api/v1/rollouts/{id}/cancel", tag = "installations",
    params(("id" = Uuid, Path, description = "the rollout's ID")),
    request_body(content = Option<super::api::Empty>, content_type = "application/json", description = "empty"),
    responses(
        (status = 200, description = "canceled (or already ended): the rollout", body = super::api::RolloutOne),
        (status = 400, description = "the ID is not a UUID, or the body is not empty", body = super::api::ErrorBody),
        (status = 404, description = "no such rollout", body = super::api::ErrorBody)))]
pub async fn api_rollout_cancel(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let (_, op) = attempt!(api_post::<super::api::Empty>(&req, &body));
    match cancel_rollout(&admin, &op, &id).await {
        Ok(r) => HttpResponse::Ok().json(super::api::RolloutOne {
            rollout: (&r).into(),
        }),
        Err(r) => r,
    }
}
