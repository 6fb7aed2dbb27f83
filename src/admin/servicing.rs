//! Servicing in the API: asking one machine to be brought to its baseline
//! through its BMC (`POST /api/v1/machines/{id}/service`); a tenant's
//! machine only when the operator forces it, audited. The pages and the
//! CLI go through the same function; rollouts of a baseline through
//! `rollouts.rs`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::installs::api_post;
use super::request::{ApiError, check_reason};
use super::state::{Admin, Operator};
use crate::bmdb::servicing::{Ask, Asked};

/// A servicing of one machine.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceBody {
    /// Service a tenant's machine (its restart interrupts the tenant).
    #[serde(default)]
    pub force: bool,
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
    pub request_id: Option<Uuid>,
}

/// The answer to a servicing asked: its ID, the baseline, the audit row.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ServiceAsked {
    pub service_id: Uuid,
    pub baseline: String,
    pub action: super::api::Action,
}

/// Asks `machine` to be serviced to the baseline that selects it.
pub async fn service(
    admin: &Admin,
    operator: &Operator,
    machine: &str,
    body: ServiceBody,
) -> Result<ServiceAsked, ApiError> {
    let machine_id: Uuid = machine
        .parse()
        .map_err(|_| ApiError::Invalid("the path's machine ID is not a UUID".into()))?;
    let reason = check_reason(body.reason).map_err(ApiError::Invalid)?;
    let action_id = body.request_id.unwrap_or_else(Uuid::new_v4);
    let ask = Ask {
        action_id,
        actor: &operator.0,
        reason: reason.as_deref(),
        baseline: "",
        forced: body.force,
        rollout_id: None,
    };
    let baselines = admin.baselines.clone();
    match admin
        .bmdb
        .transact(async |tx| baselines.ask_service(tx, machine_id, &ask).await)
        .await?
    {
        Asked::Done {
            service_id,
            baseline,
            audit,
        } => {
            tracing::info!(%machine_id, %service_id, %baseline, actor = %operator.0, detail = %audit.detail, "servicing asked");
            Ok(ServiceAsked {
                service_id,
                baseline,
                action: (&audit).into(),
            })
        }
        Asked::Refused(why) => Err(ApiError::Refused(why)),
        Asked::NotFound => Err(ApiError::NotFound(format!(
            "machine {machine_id} is not in the BMDB"
        ))),
    }
}

/// `POST /api/v1/machines/{id}/service`.
#[utoipa::path(post, path = "/api/v1/machines/{id}/service", tag = "machines",
    params(("id" = Uuid, Path, description = "the machine's ID")),
    request_body(content = ServiceBody, content_type = "application/json"),
    responses(
        (status = 200, description = "asked: the servicing's ID, its baseline and the audit row", body = ServiceAsked),
        (status = 409, description = "not free (a tenant's machine without force, work in hand, held), no baseline selects it, or its BMC lists no firmware", body = super::api::ErrorBody),
        (status = 503, description = "the BMDB failed or did not answer within admin.database_timeout", body = super::api::ErrorBody)))]
pub async fn api_service(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let (parsed, op) = attempt!(api_post::<ServiceBody>(&req, &body));
    match service(&admin, &op, &id, parsed).await {
        Ok(a) => HttpResponse::Ok().json(a),
        Err(e) => e.answer(),
    }
}

/// The machine page's servicing section: its last servicing, and the
/// form that asks for one where the life cycle allows it and a baseline
/// selects the machine (`force` offered for a tenant's).
pub(super) fn machine_section(
    admin: &Admin,
    operator: Option<&Operator>,
    d: &crate::bmdb::machines::MachineDetail,
    baseline: Option<&str>,
) -> maud::Markup {
    use super::text::rfc3339;
    use maud::html;
    let state = d.summary.state;
    let mid = d.summary.machine_id.to_string();
    let form = match (operator, baseline) {
        (Some(op), Some(name)) if crate::bmdb::lifecycle::Operation::Service.allows(state) => {
            Some((admin.csrf.token(op, &mid), name))
        }
        _ => None,
    };
    let tenants = state == crate::bmdb::machines::MachineState::Installed
        || d.tenancy.as_ref().is_some_and(|t| t.device.is_some());
    html! {
        @if let Some(s) = &d.service {
            h2 { "Servicing" }
            p #servicing class=(s.phase) {
                (s.service_id) " to baseline " (s.baseline) ": " (s.phase) ", asked by " (s.asked_by)
                " at " (rfc3339(s.asked_at))
                @if s.forced { " (forced on a tenant's machine)" }
            }
            table #servicing-detail {
                @for (k, v) in [
                    ("applied", s.applied.clone()),
                    ("restarts", Some(s.restarts.to_string())),
                    ("restarted", s.restarted_at.map(rfc3339)),
                    ("error", s.error.clone()),
                    ("ended", s.ended_at.map(rfc3339)),
                ] {
                    @if let Some(v) = v { tr { th { (k) } td { (v) } } }
                }
            }
        }
        @if let Some((csrf, name)) = &form {
            form method="post" action={ (mid) "/service" } #form-service {
                (super::pages::csrf_field(csrf))
                @if tenants {
                    label { input type="checkbox" name="force" value="true"; " a tenant's machine: restart it anyway" }
                    " "
                }
                input type="text" name="reason" placeholder="reason" size="20";
                " "
                button type="submit" #button-service { "Service to baseline " (name) }
            }
        }
    }
}

/// The machine page's servicing form, as posted.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct ServiceForm {
    csrf: String,
    #[serde(default)]
    force: String,
    #[serde(default)]
    reason: String,
}

impl super::auth::Form for ServiceForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// `POST /machines/{id}/service` from the machine page.
pub(super) async fn service_form(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
    form: web::Bytes,
) -> HttpResponse {
    let (form, operator, back) = attempt!(super::auth::machine_form::<ServiceForm>(
        &admin, &req, &form, &id
    ));
    let body = ServiceBody {
        force: form.force == "true",
        reason: Some(form.reason).filter(|r| !r.trim().is_empty()),
        request_id: None,
    };
    match service(&admin, &operator, &id, body).await {
        Ok(a) => super::html::back_to_machine(&req, "service", a.action.id, "servicing"),
        Err(e) => super::html::error_page(e.status(), &e.to_string(), &back),
    }
}
