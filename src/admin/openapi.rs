//! The admin API's OpenAPI 3.1 description, served at
//! `/api/v1/openapi.json`: derived by utoipa from the handlers'
//! annotations and the types they take ([`super::handlers::ActionBody`], …) and
//! answer ([`super::api`]); the lists of values (states, processes,
//! actions) come from the domain's own lists.

use std::sync::OnceLock;

use actix_web::HttpResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder, ServerBuilder};
use utoipa::{Modify, OpenApi};

use super::api::ActionName;

/// The bearer scheme: `Authorization: Bearer <token>` with a token of
/// `admin.token` or `admin.tokens`.
struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A token of admin.token or admin.tokens (named: the audit says who). \
                         A loopback server without tokens asks for none.",
                    ))
                    .build(),
            ),
        );
        openapi.servers = Some(vec![ServerBuilder::new().url("/").build()]);
    }
}

/// The refusals every operation answers alike, said here once instead of
/// in each route's annotation (a route's own answer for a code wins):
/// - a 401 without a valid token (every operation but the open ones,
///   `security(())`);
/// - for every POST a 400 (a field is wrong, named), a 403 (sent from
///   another site) and a 415 (not `application/json`);
/// - a 404 where the path names a machine (`/machines/{id}`);
/// - a 503 from every operation on the fleet (all tags but `health` and
///   `api`): the BMDB failed or did not answer in time.
struct Refusals;

impl Modify for Refusals {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let error = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build()
        };
        for (path, item) in openapi.paths.paths.iter_mut() {
            let machine = path.contains("/machines/{id}");
            let posts = item.post.iter_mut().map(|op| (true, op));
            for (post, op) in item.get.iter_mut().map(|op| (false, op)).chain(posts) {
                let fleet = op
                    .tags
                    .as_ref()
                    .is_some_and(|t| t.iter().all(|t| t != "health" && t != "api"));
                let open = op.security.as_ref().is_some_and(|s| {
                    s.iter()
                        .all(|r| serde_json::to_value(r).is_ok_and(|v| v == serde_json::json!({})))
                });
                let mut add = |code: &str, description: &str| {
                    op.responses
                        .responses
                        .entry(code.to_string())
                        .or_insert_with(|| error(description).into());
                };
                if !open {
                    add("401", "a bearer token is required");
                }
                if post {
                    add("400", "a field is wrong (named)");
                    add("403", "sent from another site");
                    add("415", "not Content-Type: application/json");
                }
                if machine {
                    add("404", "no such machine");
                }
                if fleet {
                    add(
                        "503",
                        "the BMDB failed or did not answer within admin.database_timeout",
                    );
                }
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "shepherd admin API",
        description = "The fleet, operators' actions, installations and rollouts, the recovery brake. \
                       Errors are `{\"error\": …}` naming what was wrong. POSTs want \
                       `Content-Type: application/json` and come from this site.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    paths(
        super::handlers::healthz,
        super::handlers::readyz,
        super::metrics::metrics,
        super::handlers::api_machines,
        super::handlers::api_machine,
        super::firmware::api_baselines,
        super::installs::api_install,
        super::installs::api_deprovision,
        super::servicing::api_service,
        super::discovery::api_accept,
        super::tenancy::api_assign,
        super::tenancy::api_unassign,
        super::handlers::api_action,
        super::rollouts::api_rollouts,
        super::rollouts::api_rollout_create,
        super::rollouts::api_rollout,
        super::rollouts::api_rollout_cancel,
        super::installs::api_images,
        super::handlers::api_brake,
        super::handlers::api_brake_release,
        super::handlers::api_loops,
        openapi_json,
    ),
    components(schemas(ActionName)),
    modifiers(&Security, &Refusals),
    security(("bearer" = [])),
    tags(
        (name = "health", description = "Liveness, readiness, metrics, the control loops"),
        (name = "machines", description = "The fleet and operators' actions"),
        (name = "installations", description = "Operating system installations and rollouts"),
        (name = "recovery", description = "The recovery brake"),
        (name = "tenants", description = "Machines given to tenants' projects (the Metal API's hardware reservations)"),
        (name = "api", description = "This description"),
    )
)]
pub struct ApiDoc;

/// The description as JSON, made once.
pub fn document() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        ApiDoc::openapi()
            .to_pretty_json()
            .expect("the OpenAPI description serializes")
    })
}

/// This API's OpenAPI description.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "api",
    responses(
        (status = 200, description = "the OpenAPI 3.1 description", content_type = "application/json", body = Object)))]
pub async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(document())
}
