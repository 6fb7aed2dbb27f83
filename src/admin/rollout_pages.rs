//! The pages' side of rollouts: the fleet page's form that rolls an image
//! over its filtered set, the rollouts page (the latest rollouts) and a
//! rollout's page (its counts and machines, a cancel button). Forms post
//! through the same functions as the API (`rollouts.rs`), with the pages'
//! CSRF tokens.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, html};

use super::auth;
use super::html::{error_page, page};
use super::install_pages::{ImageForm, image_fields, some};
use super::pages::{csrf_field, req_operator};
use super::request::internal;
use super::rollouts::{self, RolloutBody};
use super::state::{Admin, Operator};
use super::text::rfc3339;

/// What the rollouts' forms' CSRF tokens are bound to.
const ROLLOUT_FORMS: &str = "rollouts";

/// The fleet page's rollout form for the machines its filters show.
pub(super) fn fleet_rollout_form(
    admin: &Admin,
    operator: Option<&Operator>,
    filters: &[(&str, Option<&str>)],
    matching: crate::bmdb::machines::Matching,
) -> Markup {
    let Some(op) = operator else {
        return html! {};
    };
    html! {
        details #rollout-form {
            summary { "Install an image on these " (matching) " machines (a rollout)" }
            form method="post" action="rollouts" #form-rollout {
                (csrf_field(&admin.csrf.token(op, ROLLOUT_FORMS)))
                @for (k, v) in filters {
                    @if let Some(v) = v.filter(|v| !v.is_empty()) {
                        input type="hidden" name=(k) value=(v);
                    }
                }
                (image_fields(admin))
                br;
                label { "at once " input name="max_parallel" size="3" value="1"; } " "
                label { "stop after more than " input name="max_failures" size="3" value="0"; " failures" } " "
                button type="submit" #button-rollout { "Start the rollout" }
            }
        }
    }
}

/// `POST /rollouts` from the fleet page.
pub(super) async fn rollout_form(
    admin: web::Data<Admin>,
    req: HttpRequest,
    form: web::Bytes,
) -> HttpResponse {
    let back = "./".to_string();
    let (form, operator) = attempt!(auth::checked_form::<ImageForm>(
        &admin,
        &req,
        &form,
        ROLLOUT_FORMS,
        &back
    ));
    let image = match form.image() {
        Ok(i) => i,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e, &back),
    };
    let number = |what: &str, s: &str| -> Result<Option<i32>, String> {
        match some(s) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| format!("{what}: {v:?} is not a number")),
        }
    };
    let (max_parallel, max_failures) = match (
        number("at once", &form.max_parallel),
        number("failures", &form.max_failures),
    ) {
        (Ok(p), Ok(f)) => (p, f),
        (Err(e), _) | (_, Err(e)) => return error_page(StatusCode::BAD_REQUEST, &e, &back),
    };
    let body = RolloutBody {
        image: Some(image),
        deprovision: None,
        baseline: None,
        max_parallel,
        max_failures,
        machines: None,
        state: some(&form.state),
        provider_status: some(&form.provider_status),
        heartbeat: some(&form.heartbeat),
        q: some(&form.q),
        location: some(&form.location),
        project: some(&form.project),
        bmc: some(&form.bmc),
        boot: some(&form.boot),
        plan: some(&form.plan),
        request_id: None,
    };
    match rollouts::create_rollout(&admin, &operator, body).await {
        Ok(r) => HttpResponse::SeeOther()
            .insert_header((
                "Location",
                format!("{}/{}", req.path().trim_end_matches('/'), r.id),
            ))
            .finish(),
        Err(e) => error_page(e.status(), &e.to_string(), &back),
    }
}

fn counts(c: &crate::bmdb::rollouts::Counts) -> Markup {
    html! {
        span.counts {
            span data-count="done" { (c.done) " done" } ", "
            span data-count="running" { (c.running) " running" } ", "
            span data-count="failed" { (c.failed) " failed" } ", "
            span data-count="waiting" { (c.waiting) " waiting" } ", "
            span data-count="skipped" { (c.skipped) " skipped" }
        }
    }
}

/// `GET /rollouts`: the latest rollouts.
pub(super) async fn rollouts_page(admin: web::Data<Admin>) -> HttpResponse {
    let list = match admin
        .bmdb
        .transact(async |tx| crate::bmdb::rollouts::list(tx, 100).await)
        .await
    {
        Ok(l) => l,
        Err(e) => return internal(e),
    };
    let body = html! {
        p { a href="./" { "fleet" } }
        p.muted { "Start a rollout from the fleet page: filter the machines, then install an image on them." }
        table #rollouts {
            tr {
                th { "rollout" } th { "state" } th { "machines" } th { "image" } th { "selection" }
                th { "by" } th { "created" }
            }
            @for r in &list {
                tr data-rollout=(r.id) {
                    td { a href={ "rollouts/" (r.id) } { (r.id) } }
                    td { (r.state) }
                    td { (counts(&r.counts)) }
                    td { (r.image_url) }
                    td { (r.selection) }
                    td { (r.created_by) }
                    td { (rfc3339(r.created_at)) }
                }
            }
            @if list.is_empty() {
                tr { td.muted colspan="7" { "no rollout yet" } }
            }
        }
    };
    page("shepherd: rollouts", body, true)
}

/// `GET /rollouts/{id}`: one rollout, its machines, a cancel button.
pub(super) async fn rollout_page(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
) -> HttpResponse {
    let (r, members) = match rollouts::load_rollout(&admin, &id).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let cancel = (r.state == "running")
        .then(|| req_operator(&req))
        .flatten()
        .map(|op| admin.csrf.token(&op, ROLLOUT_FORMS));
    let body = html! {
        p { a href="../" { "fleet" } " · " a href="../rollouts" { "rollouts" } }
        table #rollout {
            tr { th { "state" } td #rollout-state { (r.state) } }
            tr { th { "machines" } td #rollout-counts { (counts(&r.counts)) } }
            tr { th { "image" } td { (r.image_url) } }
            tr { th { "selection" } td { (r.selection) } }
            tr { th { "at once" } td { (r.max_parallel) } }
            tr { th { "stops after" } td { "more than " (r.max_failures) " failures" } }
            tr { th { "by" } td { (r.created_by) " at " (rfc3339(r.created_at)) } }
            @if let Some(why) = &r.end_reason {
                tr { th { "ended" } td #rollout-end {
                    @if let Some(t) = r.ended_at { (rfc3339(t)) } ": " (why)
                } }
            }
        }
        @if let Some(csrf) = &cancel {
            form method="post" action={ (r.id) "/cancel" } #form-cancel {
                (csrf_field(csrf))
                button type="submit" #button-cancel { "Cancel (machines installing finish)" }
            }
        }
        table #rollout-machines {
            tr {
                th { "#" } th { "machine" } th { "state" } th { "generation" } th { "started" }
                th { "ended" } th { "error" }
            }
            @for m in &members {
                tr data-state=(m.state) {
                    td { (m.position) }
                    td { a href={ "../machines/" (m.machine_id) } { (m.machine_id) } }
                    td { (m.state) }
                    td { @if let Some(g) = m.generation { (g) } }
                    td { @if let Some(t) = m.started_at { (rfc3339(t)) } }
                    td { @if let Some(t) = m.ended_at { (rfc3339(t)) } }
                    td { (m.error.as_deref().unwrap_or("")) }
                }
            }
        }
    };
    page(&format!("shepherd: rollout {}", r.id), body, true)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CancelForm {
    csrf: String,
}

impl auth::Form for CancelForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// `POST /rollouts/{id}/cancel` from a rollout's page.
pub(super) async fn cancel_form(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
    form: web::Bytes,
) -> HttpResponse {
    // Back to the rollout's page: only a rollout ID goes into the link.
    let back = match uuid::Uuid::parse_str(&id) {
        Ok(u) => format!("../{u}"),
        Err(_) => "../".to_string(),
    };
    let (_, operator) = attempt!(auth::checked_form::<CancelForm>(
        &admin,
        &req,
        &form,
        ROLLOUT_FORMS,
        &back
    ));
    match rollouts::cancel_rollout(&admin, &operator, &id).await {
        Ok(r) => HttpResponse::SeeOther()
            .insert_header((
                "Location",
                format!(
                    "{}/{}",
                    req.path().trim_end_matches(&format!("/{}/cancel", r.id)),
                    r.id
                ),
            ))
            .finish(),
        Err(resp) => resp,
    }
}
