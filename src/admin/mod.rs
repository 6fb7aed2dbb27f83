//! The admin HTTP server: health, readiness, Prometheus metrics, a JSON API
//! over the fleet, and server-rendered pages (the fleet by state, a page per
//! machine with its history).
//!
//! Operators act on machines here too (retry, take over again, reboot,
//! hold, release): `POST /api/v1/machines/{id}/{action}` with JSON, or the
//! machine page's buttons; every action is audited ([`crate::bmdb::actions`]).
//!
//! Mount it in any actix-web application with `App::configure(routes)` and
//! an [`Admin`] in the app data; `shepherd run` serves it on `admin.listen`.
//! With tokens set (`admin.token`, `admin.tokens`), every route but
//! `/healthz` and `/login` wants one ([`auth`]); one is required when the
//! server listens beyond loopback.

pub mod api;
mod auth;
mod html;
mod install_pages;
mod openapi;
mod pages;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::time::SystemTime;

use actix::Recipient;
use actix_web::middleware::from_fn;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use crate::bmdb::machines::{self, MachineDetail, MachineState, MachineSummary};
use crate::bmdb::{Bmdb, ProviderStatus, actions};
use crate::control::MailboxStatus;
use crate::secret::Secret;
use crate::status::{GetSupervisorStatus, SupervisorStatus};

/// What the admin routes read from.
#[derive(Clone)]
pub struct Admin {
    pub bmdb: Bmdb,
    pub supervisor: Option<Recipient<GetSupervisorStatus>>,
    /// The process's metric series (Equinix API requests, heartbeats);
    /// `/metrics` adds the fleet's, read from the BMDB at each scrape.
    pub registry: std::sync::Arc<Registry>,
    /// An agent silent this long counts as silent (the Recoverer's
    /// `heartbeat_stale_after`).
    pub heartbeat_stale_after: std::time::Duration,
    /// Bearer tokens by name (`admin.token` is `admin`); none: no auth
    /// (loopback only), actions by `anonymous`.
    pub tokens: Vec<(String, Secret)>,
    /// Signs the pages' forms.
    pub csrf: std::sync::Arc<CsrfKey>,
    /// The Equinix API's request budget, when this process calls it.
    pub equinix: Option<RequestBudget>,
    /// How the Recoverer judges silence and brakes (the brake's state is
    /// shown from it); None: no brake shown.
    pub judge: Option<crate::bmdb::brake::Judge>,
    /// How long an operator's release of the brake lasts by default.
    pub brake_release: std::time::Duration,
    /// Told when a rollout was created or canceled (moves it at once).
    pub rollouts: Option<Recipient<crate::control::RunRound>>,
    /// The images this process serves, when it does.
    pub images: Option<crate::images::ImageCatalog>,
}

impl Admin {
    /// Admin routes over `bmdb`, with no supervisor, metrics or tokens.
    pub fn new(bmdb: Bmdb) -> Self {
        Admin {
            bmdb,
            supervisor: None,
            registry: Default::default(),
            heartbeat_stale_after: crate::bmdb::selectors::RecoveryThresholds::default()
                .heartbeat_stale_after,
            tokens: Vec::new(),
            csrf: std::sync::Arc::new(CsrfKey::random()),
            equinix: None,
            judge: None,
            brake_release: std::time::Duration::from_secs(3600),
            rollouts: None,
            images: None,
        }
    }
}

/// What the Equinix client may spend and has spent.
#[derive(Clone, Debug)]
pub struct RequestBudget {
    pub metrics: crate::equinix::ApiMetrics,
    /// One request per `interval` per slot…
    pub interval: std::time::Duration,
    /// …with this many slots.
    pub parallelism: u32,
}

impl RequestBudget {
    /// Requests an hour the client can make at most.
    pub fn per_hour(&self) -> u64 {
        let per_slot = 3600.0 / self.interval.as_secs_f64().max(0.001);
        (per_slot * f64::from(self.parallelism)) as u64
    }
}

pub use auth::{CsrfKey, Operator};

pub mod installs;

/// The admin routes, for `App::configure`. Needs `web::Data<Admin>`.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::scope("")
            // Every answer is what its Content-Type says: no sniffing.
            .wrap(
                actix_web::middleware::DefaultHeaders::new()
                    .add(("X-Content-Type-Options", "nosniff")),
            )
            .service(read_only("/healthz", healthz))
            .service(
                web::resource("/login")
                    .route(web::get().to(auth::login_page))
                    .route(web::post().to(auth::login)),
            )
            .service(
                web::scope("")
                    .wrap(from_fn(auth::require_operator))
                    // Malformed paths answer JSON like the rest (queries: `Query`).
                    .app_data(web::PathConfig::default().error_handler(|e, _| json_error(e)))
                    .service(read_only("/readyz", readyz))
                    .service(read_only("/metrics", metrics))
                    .service(read_only("/api/v1/machines", api_machines))
                    .service(read_only("/api/v1/machines/{id}", api_machine))
                    .service(post_only(
                        "/api/v1/machines/{id}/install",
                        installs::api_install,
                    ))
                    .service(post_only("/api/v1/machines/{id}/{action}", api_action))
                    .service(read_and_post(
                        "/api/v1/rollouts",
                        installs::api_rollouts,
                        installs::api_rollout_create,
                    ))
                    .service(read_only("/api/v1/rollouts/{id}", installs::api_rollout))
                    .service(post_only(
                        "/api/v1/rollouts/{id}/cancel",
                        installs::api_rollout_cancel,
                    ))
                    .service(read_only("/api/v1/images", installs::api_images))
                    .service(read_only("/api/v1/openapi.json", openapi::openapi_json))
                    .service(read_only("/api/v1/brake", api_brake))
                    .service(post_only("/api/v1/brake/release", api_brake_release))
                    .service(post_only("/brake/release", pages::brake_form))
                    .service(read_only("/", pages::fleet_page))
                    .service(read_only("/machines/{id}", pages::machine_page))
                    .service(post_only(
                        "/machines/{id}/install",
                        install_pages::install_form,
                    ))
                    .service(post_only("/machines/{id}/{action}", pages::form_action))
                    .service(read_and_post(
                        "/rollouts",
                        install_pages::rollouts_page,
                        install_pages::rollout_form,
                    ))
                    .service(read_only("/rollouts/{id}", install_pages::rollout_page))
                    .service(post_only(
                        "/rollouts/{id}/cancel",
                        install_pages::cancel_form,
                    )),
            ),
    );
}

/// 405 naming the method and what the resource takes, with `Allow`.
fn method_not_allowed(
    req: &actix_web::HttpRequest,
    allow: &'static str,
    usage: &'static str,
) -> HttpResponse {
    let mut r = error_response(
        actix_web::http::StatusCode::METHOD_NOT_ALLOWED,
        &format!("{} is not allowed here; use {usage}", req.method()),
    );
    r.headers_mut().insert(
        actix_web::http::header::ALLOW,
        actix_web::http::header::HeaderValue::from_static(allow),
    );
    r
}

/// A resource that answers GET and HEAD with `read` and POST with
/// `write`; any other method is 405 with `Allow`.
fn read_and_post<R, RArgs, W, WArgs>(path: &str, read: R, write: W) -> actix_web::Resource
where
    R: actix_web::Handler<RArgs>,
    RArgs: actix_web::FromRequest + 'static,
    R::Output: actix_web::Responder + 'static,
    W: actix_web::Handler<WArgs>,
    WArgs: actix_web::FromRequest + 'static,
    W::Output: actix_web::Responder + 'static,
{
    use actix_web::guard;
    web::resource(path)
        .route(
            web::route()
                .guard(guard::Any(guard::Get()).or(guard::Head()))
                .to(read),
        )
        .route(web::post().to(write))
        .default_service(web::to(|req: actix_web::HttpRequest| async move {
            method_not_allowed(&req, "GET, HEAD, POST", "GET or POST")
        }))
}

/// A resource that answers POST; any other method is 405 with `Allow`.
fn post_only<F, Args>(path: &str, handler: F) -> actix_web::Resource
where
    F: actix_web::Handler<Args>,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    web::resource(path)
        .route(web::post().to(handler))
        .default_service(web::to(|req: actix_web::HttpRequest| async move {
            method_not_allowed(&req, "POST", "POST")
        }))
}

/// A resource that answers GET (and HEAD); any other method is 405 with
/// `Allow`.
fn read_only<F, Args>(path: &str, handler: F) -> actix_web::Resource
where
    F: actix_web::Handler<Args>,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    use actix_web::guard;
    web::resource(path)
        .route(
            web::route()
                .guard(guard::Any(guard::Get()).or(guard::Head()))
                .to(handler),
        )
        .default_service(web::to(|req: actix_web::HttpRequest| async move {
            method_not_allowed(&req, "GET, HEAD", "GET")
        }))
}

/// A query string, deserialized; a bad one is a JSON 400 naming the field
/// (`limit: invalid digit found in string`).
struct Query<T>(T);

impl<T: serde::de::DeserializeOwned> actix_web::FromRequest for Query<T> {
    type Error = actix_web::Error;
    type Future = std::future::Ready<Result<Self, actix_web::Error>>;

    fn from_request(req: &actix_web::HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(
            req.query_string().as_bytes(),
        ));
        std::future::ready(
            serde_path_to_error::deserialize(de)
                .map(Query)
                .map_err(|e| json_error(format!("query {}: {}", e.path(), e.inner()))),
        )
    }
}

fn json_error(e: impl std::fmt::Display + std::fmt::Debug + 'static) -> actix_web::Error {
    let body = error_response(actix_web::http::StatusCode::BAD_REQUEST, &e.to_string());
    actix_web::error::InternalError::from_response(e, body).into()
}

/// A JSON error body, `{"error": msg}`, with `<`, `>` and `&` written as
/// `\u` escapes: a message naming a field of the request can carry its
/// text, and no reader (a browser sniffing it) may take that for markup.
pub(crate) fn error_response(status: actix_web::http::StatusCode, msg: &str) -> HttpResponse {
    let body = json!({ "error": msg })
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026");
    HttpResponse::build(status)
        .content_type("application/json")
        .body(body)
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", security(()),
    responses((status = 200, description = "alive", body = String, content_type = "text/plain")))]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

async fn status(admin: &Admin) -> SupervisorStatus {
    match &admin.supervisor {
        Some(s) => s.send(GetSupervisorStatus).await.unwrap_or_default(),
        None => SupervisorStatus::default(),
    }
}

/// Readiness: the BMDB answers and this process holds a session.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "ready", body = api::Readiness),
        (status = 503, description = "not ready: the body says why", body = api::Readiness),
        (status = 401, description = "a bearer token is required", body = api::ErrorBody)))]
async fn readyz(admin: web::Data<Admin>) -> HttpResponse {
    let db = admin
        .bmdb
        .transact(async |tx| tx.query_one("SELECT 1", &[]).await.map(|_| ()))
        .await;
    let st = status(&admin).await;
    let session_ok = admin.supervisor.is_none() || st.session.is_some();
    // The brake does not make the process unready (it is working as
    // meant), but whoever looks should see it.
    let brake = match brake_state(&admin).await {
        Some(Ok(b)) => Some(api::ReadyBrake::State {
            engaged: b.engaged,
            reason: b.reason,
            silent: b.silent,
            limit: b.limit,
        }),
        Some(Err(e)) => Some(api::ReadyBrake::Unreadable {
            error: e.to_string(),
        }),
        None => None,
    };
    let body = api::Readiness {
        database: match &db {
            Ok(()) => "ok".to_string(),
            Err(e) => e.to_string(),
        },
        session: st.session,
        recovery_brake: brake,
    };
    if db.is_ok() && session_ok {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The recovery brake as it stands, when this process judges silence.
async fn brake_state(
    admin: &Admin,
) -> Option<Result<crate::bmdb::brake::BrakeState, crate::bmdb::BmdbError>> {
    let judge = admin.judge.as_ref()?;
    Some(
        admin
            .bmdb
            .transact(async |tx| crate::bmdb::brake::state(tx, judge).await)
            .await,
    )
}

/// `GET /api/v1/brake`: the recovery brake, the callback endpoints served
/// (silence is judged only on those), the last fleet-wide actions.
#[utoipa::path(get, path = "/api/v1/brake", tag = "recovery",
    responses(
        (status = 200, description = "the brake, the callback endpoints served, the last fleet-wide actions", body = api::BrakeBody),
        (status = 401, description = "a bearer token is required", body = api::ErrorBody),
        (status = 404, description = "this server does not run the Recoverer", body = api::ErrorBody),
        (status = 500, description = "the BMDB failed", body = api::ErrorBody)))]
async fn api_brake(admin: web::Data<Admin>) -> HttpResponse {
    let Some(judge) = admin.judge.clone() else {
        return error_response(
            actix_web::http::StatusCode::NOT_FOUND,
            "this server does not run the Recoverer",
        );
    };
    let r = admin
        .bmdb
        .transact(async |tx| {
            Ok((
                crate::bmdb::brake::state(tx, &judge).await?,
                crate::bmdb::callback::endpoints(tx).await?,
                actions::fleet_actions(tx, 20).await?,
            ))
        })
        .await;
    match r {
        Ok((b, endpoints, acts)) => HttpResponse::Ok().json(api::BrakeBody {
            brake: (&b).into(),
            callback_endpoints: endpoints
                .iter()
                .map(|e| api::CallbackEndpoint {
                    endpoint: e.endpoint.clone(),
                    served: e.served,
                    serving_since: rfc3339(e.serving_since),
                    served_until: rfc3339(e.served_until),
                })
                .collect(),
            operator_actions: acts.iter().map(api::Action::from).collect(),
        }),
        Err(e) => internal(e),
    }
}

/// A brake release's parameters.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReleaseBody {
    #[schema(max_length = 1000)]
    pub(crate) reason: Option<String>,
    /// How long, as `30m`, `2h` (default `recoverer.brake_release`).
    #[serde(rename = "for")]
    pub(crate) for_: Option<String>,
    pub(crate) request_id: Option<uuid::Uuid>,
}

/// Releases the brake for `operator`: the audit row, or the error.
async fn release_brake(
    admin: &Admin,
    operator: &Operator,
    body: ReleaseBody,
) -> Result<actions::Audit, (actix_web::http::StatusCode, String)> {
    use actix_web::http::StatusCode;
    if admin.judge.is_none() {
        return Err((
            StatusCode::NOT_FOUND,
            "this server does not run the Recoverer".into(),
        ));
    }
    let for_ = match body
        .for_
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        None => admin.brake_release,
        Some(s) => match humantime::parse_duration(s) {
            Ok(d) if !d.is_zero() && d <= std::time::Duration::from_secs(7 * 86400) => d,
            _ => {
                return Err((
                    StatusCode::BAD_REQUEST,
                    "for: not a duration from 1s to 7d (e.g. 30m, 2h)".into(),
                ));
            }
        },
    };
    let reason = check_reason(body.reason).map_err(|e| (StatusCode::BAD_REQUEST, e))?;
    let id = body.request_id.unwrap_or_else(uuid::Uuid::new_v4);
    match admin
        .bmdb
        .transact(async |tx| {
            crate::bmdb::brake::release(tx, id, &operator.0, reason.as_deref(), for_).await
        })
        .await
    {
        Ok(a) => {
            tracing::warn!(actor = %a.actor, detail = %a.detail, "operator action: recovery brake released");
            Ok(a)
        }
        Err(e) => Err((StatusCode::SERVICE_UNAVAILABLE, format!("BMDB: {e}"))),
    }
}

/// `POST /api/v1/brake/release`, a JSON body (may be empty).
/// Releases the recovery brake for a while (audited).
#[utoipa::path(post, path = "/api/v1/brake/release", tag = "recovery",
    request_body(content = Option<ReleaseBody>, content_type = "application/json", description = "may be empty"),
    responses(
        (status = 200, description = "released: the audit row", body = api::ActionDone),
        (status = 400, description = "a field is wrong (named)", body = api::ErrorBody),
        (status = 401, description = "a bearer token is required", body = api::ErrorBody),
        (status = 403, description = "sent from another site", body = api::ErrorBody),
        (status = 404, description = "this server does not run the Recoverer", body = api::ErrorBody),
        (status = 415, description = "not Content-Type: application/json", body = api::ErrorBody),
        (status = 503, description = "the BMDB failed", body = api::ErrorBody)))]
async fn api_brake_release(
    admin: web::Data<Admin>,
    req: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    use actix_web::http::StatusCode;
    if let Err(r) = json_post(&req, &body) {
        return r;
    }
    let parsed: ReleaseBody = match json_body(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(operator) = req.extensions().get::<Operator>().cloned() else {
        return error_response(StatusCode::UNAUTHORIZED, "a bearer token is required");
    };
    match release_brake(&admin, &operator, parsed).await {
        Ok(a) => HttpResponse::Ok().json(api::ActionDone {
            action: (&a).into(),
        }),
        Err((status, msg)) => error_response(status, &msg),
    }
}

/// An API POST's JSON body (empty: the defaults), or a 400 naming the
/// field that is wrong.
fn json_body<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, HttpResponse> {
    // Nothing, or JSON's null: every field takes its default.
    let text = body.trim_ascii();
    if text.is_empty() || text == b"null" {
        return Ok(T::default());
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        error_response(
            actix_web::http::StatusCode::BAD_REQUEST,
            &format!("body {}: {}", e.path(), e.inner()),
        )
    })
}

/// An API POST with a body must say `Content-Type: application/json` (no
/// form can); one without a body may say nothing, but no other type. It
/// must come from this site.
fn json_post(req: &HttpRequest, body: &[u8]) -> Result<(), HttpResponse> {
    use actix_web::http::StatusCode;
    let content_type = req
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or("").trim_start().to_ascii_lowercase());
    let acceptable = match content_type {
        Some(t) => t.starts_with("application/json"),
        None => body.trim_ascii().is_empty(),
    };
    if !acceptable {
        return Err(error_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "actions want Content-Type: application/json",
        ));
    }
    auth::same_origin(req).map_err(|e| error_response(StatusCode::FORBIDDEN, &e))
}

/// A fleet listing's query: filters and paging.
#[derive(Deserialize, Default, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct Page {
    #[param(value_type = Option<api::MachineStateName>)]
    state: Option<String>,
    #[param(value_type = Option<api::ProviderStatusName>)]
    provider_status: Option<String>,
    #[param(value_type = Option<api::HeartbeatName>)]
    heartbeat: Option<String>,
    /// A machine ID's prefix, part of a provider ID, an address's prefix.
    q: Option<String>,
    /// Machines on the page (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// Machines skipped.
    #[param(minimum = 0)]
    offset: Option<i64>,
}

impl Page {
    /// (limit, offset): `default` without a limit; a limit outside 1 to
    /// 1000 or a negative offset is a 400 naming it.
    fn window(&self, default: i64) -> Result<(i64, i64), HttpResponse> {
        let limit = self.limit.unwrap_or(default);
        if !(1..=1000).contains(&limit) {
            return Err(bad_request(format!("limit: {limit} is outside 1 to 1000")));
        }
        let offset = self.offset.unwrap_or(0);
        if offset < 0 {
            return Err(bad_request(format!("offset: {offset} is negative")));
        }
        Ok((limit, offset))
    }

    /// The filter, or a 400 naming the bad field.
    fn filter(&self, admin: &Admin) -> Result<machines::FleetFilter, HttpResponse> {
        no_nul("q", self.q.as_deref()).map_err(bad_request)?;
        let provider_status = match self.provider_status.as_deref() {
            None | Some("") => None,
            Some(s) => Some(
                ProviderStatus::ALL
                    .into_iter()
                    .find(|p| p.to_string() == s)
                    .ok_or_else(|| {
                        let all: Vec<String> =
                            ProviderStatus::ALL.iter().map(|p| p.to_string()).collect();
                        bad_request(format!("provider_status must be one of {}", all.join(", ")))
                    })?,
            ),
        };
        let heartbeat = match self.heartbeat.as_deref() {
            None | Some("") => None,
            Some(s) => Some(machines::Heartbeat::parse(s).ok_or_else(|| {
                let all: Vec<&str> = machines::Heartbeat::ALL
                    .iter()
                    .map(|h| h.as_str())
                    .collect();
                bad_request(format!("heartbeat must be one of {}", all.join(", ")))
            })?),
        };
        Ok(machines::FleetFilter {
            state: parse_state(&self.state)?,
            provider_status,
            heartbeat,
            stale_after: admin.heartbeat_stale_after,
            search: self.q.clone(),
        })
    }
}

/// Text the BMDB stores or searches: PostgreSQL's text holds no NUL
/// character, so one is a 400 naming the field, not a database error.
pub(crate) fn no_nul(field: &str, value: Option<&str>) -> Result<(), String> {
    match value {
        Some(v) if v.contains('\0') => Err(format!("{field}: contains a NUL character")),
        _ => Ok(()),
    }
}

/// An operator's reason as given: at most `MAX_REASON` characters (before
/// trimming), no NUL; kept trimmed, and none when blank.
pub(crate) fn check_reason(reason: Option<String>) -> Result<Option<String>, String> {
    no_nul("reason", reason.as_deref())?;
    if let Some(r) = &reason {
        let n = r.chars().count();
        if n > actions::MAX_REASON {
            return Err(format!(
                "reason: {n} characters; at most {}",
                actions::MAX_REASON
            ));
        }
    }
    Ok(reason
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty()))
}

fn bad_request(msg: String) -> HttpResponse {
    error_response(actix_web::http::StatusCode::BAD_REQUEST, &msg)
}

fn parse_state(s: &Option<String>) -> Result<Option<MachineState>, HttpResponse> {
    match s.as_deref() {
        None | Some("") => Ok(None),
        Some(s) => MachineState::parse(s).map(Some).ok_or_else(|| {
            let all: Vec<&str> = MachineState::ALL.iter().map(|m| m.as_str()).collect();
            bad_request(format!("state must be one of {}", all.join(", ")))
        }),
    }
}

fn internal(e: impl std::fmt::Display) -> HttpResponse {
    error_response(
        actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
        &e.to_string(),
    )
}

/// A page of the fleet as the API and the fleet page show it.
struct Listing {
    machines: Vec<MachineSummary>,
    /// Machines the filter matches.
    matching: i64,
    counts: Vec<(MachineState, i64)>,
    heartbeating: i64,
    silent: i64,
}

impl Listing {
    async fn read(
        tx: &mut crate::bmdb::Tx<'_>,
        admin: &Admin,
        filter: &machines::FleetFilter,
        (limit, offset): (i64, i64),
    ) -> Result<Listing, crate::bmdb::BmdbError> {
        let (machines, matching) = machines::fleet_page(tx, filter, limit, offset).await?;
        let counts = machines::fleet_counts(tx).await?;
        let (heartbeating, silent) =
            machines::agent_counts(tx, admin.heartbeat_stale_after).await?;
        Ok(Listing {
            machines,
            matching,
            counts,
            heartbeating,
            silent,
        })
    }
}

/// The fleet, filtered and paged, with counts per state.
#[utoipa::path(get, path = "/api/v1/machines", tag = "machines", params(Page),
    responses(
        (status = 200, description = "a page of the fleet", body = api::MachineList),
        (status = 400, description = "a parameter is wrong (named)", body = api::ErrorBody),
        (status = 401, description = "a bearer token is required", body = api::ErrorBody),
        (status = 500, description = "the BMDB failed", body = api::ErrorBody)))]
async fn api_machines(admin: web::Data<Admin>, Query(q): Query<Page>) -> HttpResponse {
    let filter = match q.filter(&admin) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let (limit, offset) = match q.window(100) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let r = admin
        .bmdb
        .transact(async |tx| Listing::read(tx, &admin, &filter, (limit, offset)).await)
        .await;
    match r {
        Ok(l) => HttpResponse::Ok().json(api::MachineList {
            machines: l.machines.iter().map(api::Machine::from).collect(),
            matching: l.matching,
            counts: api::MachineList::counts(&l.counts),
            agents: api::AgentCounts {
                heartbeating: l.heartbeating,
                silent: l.silent,
            },
            limit,
            offset,
        }),
        Err(e) => internal(e),
    }
}

async fn load_detail(admin: &Admin, id: &str) -> Result<MachineDetail, HttpResponse> {
    let id: uuid::Uuid = id
        .parse()
        .map_err(|_| bad_request("the path's machine ID is not a UUID".into()))?;
    match admin
        .bmdb
        .transact(async |tx| machines::detail(tx, id).await)
        .await
    {
        Ok(Some(d)) => Ok(d),
        Ok(None) => Err(error_response(
            actix_web::http::StatusCode::NOT_FOUND,
            &format!("machine {id} is not in the BMDB"),
        )),
        Err(e) => Err(internal(e)),
    }
}

/// One machine: tags, leases, backoffs, history, hold, operators' actions,
/// its installation.
#[utoipa::path(get, path = "/api/v1/machines/{id}", tag = "machines",
    params(("id" = Uuid, Path, description = "the machine's ID")),
    responses(
        (status = 200, description = "the machine", body = api::MachineDetailBody),
        (status = 400, description = "the ID is not a UUID", body = api::ErrorBody),
        (status = 401, description = "a bearer token is required", body = api::ErrorBody),
        (status = 404, description = "no such machine", body = api::ErrorBody),
        (status = 500, description = "the BMDB failed", body = api::ErrorBody)))]
async fn api_machine(admin: web::Data<Admin>, id: web::Path<String>) -> HttpResponse {
    match load_detail(&admin, &id).await {
        Ok(d) => HttpResponse::Ok().json(api::MachineDetailBody::from(&d)),
        Err(r) => r,
    }
}

/// An action's parameters, as the API and the forms give them.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    #[schema(max_length = 1000)]
    reason: Option<String>,
    /// Retry: only this process's backoff.
    #[schema(value_type = Option<api::ProcessName>)]
    process: Option<String>,
    /// Retake over: also forget the recorded SSH host key.
    #[serde(default)]
    forget_host_key: bool,
    /// Names the request (retried after a lost answer, it acts once).
    request_id: Option<uuid::Uuid>,
}

/// Runs an action for `operator`: the audit row, or the error response.
async fn run_action(
    admin: &Admin,
    operator: &Operator,
    id: &str,
    action: &str,
    body: ActionBody,
) -> Result<actions::Audit, (actix_web::http::StatusCode, String)> {
    use actix_web::http::StatusCode;
    let bad = |m: String| (StatusCode::BAD_REQUEST, m);
    let machine_id: uuid::Uuid = id
        .parse()
        .map_err(|_| bad("the path's machine ID is not a UUID".into()))?;
    let Some(action) = actions::Action::parse(action) else {
        let all: Vec<&str> = actions::Action::ALL.iter().map(|a| a.as_str()).collect();
        return Err((
            StatusCode::NOT_FOUND,
            format!(
                "not an action: the path's action must be one of {}",
                all.join(", ")
            ),
        ));
    };
    let process = match body.process.as_deref() {
        None | Some("") => None,
        Some(p) => Some(crate::bmdb::Process::parse(p).ok_or_else(|| {
            bad("process: not a process (ShepherdAgentStart, ShepherdRecovery, …)".into())
        })?),
    };
    if process.is_some() && action != actions::Action::Retry {
        return Err(bad(format!("process: only retry takes one, not {action}")));
    }
    if body.forget_host_key && action != actions::Action::Retakeover {
        return Err(bad(format!(
            "forget_host_key: only retakeover takes it, not {action}"
        )));
    }
    let reason = check_reason(body.reason).map_err(bad)?;
    let mut req = actions::Request::new(machine_id, action, operator.0.clone());
    if let Some(r) = body.request_id {
        req.id = r;
    }
    req.reason = reason;
    req.process = process;
    req.forget_host_key = body.forget_host_key;
    match admin
        .bmdb
        .transact(async |tx| actions::act(tx, &req).await)
        .await
    {
        Ok(actions::Outcome::Done(a)) => {
            tracing::info!(%machine_id, action = %a.action, actor = %a.actor, detail = %a.detail, "operator action");
            Ok(a)
        }
        Ok(actions::Outcome::Refused(why)) => Err((StatusCode::CONFLICT, why)),
        Ok(actions::Outcome::NotFound) => Err((
            StatusCode::NOT_FOUND,
            format!("machine {machine_id} is not in the BMDB"),
        )),
        Err(e) => Err((StatusCode::SERVICE_UNAVAILABLE, format!("BMDB: {e}"))),
    }
}

/// `POST /api/v1/machines/{id}/{action}`, a JSON body (may be empty).
/// An operator's action on a machine (audited; a `request_id` sent again
/// acts once).
#[utoipa::path(post, path = "/api/v1/machines/{id}/{action}", tag = "machines",
    params(
        ("id" = Uuid, Path, description = "the machine's ID"),
        ("action" = api::ActionName, Path, description = "what to do")),
    request_body(content = Option<ActionBody>, content_type = "application/json", description = "may be empty"),
    responses(
        (status = 200, description = "done: the audit row", body = api::ActionDone),
        (status = 400, description = "a field is wrong (named)", body = api::ErrorBody),
        (status = 401, description = "a bearer token is required", body = api::ErrorBody),
        (status = 403, description = "sent from another site", body = api::ErrorBody),
        (status = 404, description = "no such machine or action", body = api::ErrorBody),
        (status = 409, description = "refused: it would not do what it says (the reason)", body = api::ErrorBody),
        (status = 415, description = "not Content-Type: application/json", body = api::ErrorBody),
        (status = 503, description = "the BMDB failed", body = api::ErrorBody)))]
async fn api_action(
    admin: web::Data<Admin>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    body: web::Bytes,
) -> HttpResponse {
    let err = |status, msg: String| error_response(status, &msg);
    use actix_web::http::StatusCode;
    if let Err(r) = json_post(&req, &body) {
        return r;
    }
    let parsed: ActionBody = match json_body(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(operator) = req.extensions().get::<Operator>().cloned() else {
        return err(
            StatusCode::UNAUTHORIZED,
            "a bearer token is required".into(),
        );
    };
    let (id, action) = path.into_inner();
    match run_action(&admin, &operator, &id, &action, parsed).await {
        Ok(a) => HttpResponse::Ok().json(api::ActionDone {
            action: (&a).into(),
        }),
        Err((status, msg)) => err(status, msg),
    }
}

// ---- metrics ----

type Labels = Vec<(&'static str, String)>;

/// Series read at scrape time, registered into a registry of the scrape's.
struct Scrape(Registry);

impl Scrape {
    fn gauge(&mut self, name: &str, help: &str, value: i64) {
        let g: Gauge = Gauge::default();
        g.set(value);
        self.0.register(name, help, g);
    }

    fn gauges(&mut self, name: &str, help: &str, values: impl IntoIterator<Item = (Labels, i64)>) {
        let f: Family<Labels, Gauge> = Family::default();
        for (l, v) in values {
            f.get_or_create(&l).set(v);
        }
        self.0.register(name, help, f);
    }

    /// Counters kept elsewhere (a mailbox's tallies), as of now. `name`
    /// without `_total`.
    fn counters(
        &mut self,
        name: &str,
        help: &str,
        values: impl IntoIterator<Item = (Labels, u64)>,
    ) {
        let f: Family<Labels, Counter> = Family::default();
        for (l, v) in values {
            f.get_or_create(&l).inc_by(v);
        }
        self.0.register(name, help, f);
    }
}

/// The series read from the BMDB.
fn fleet_samples(
    p: &mut Scrape,
    sessions: i64,
    backoffs: &[(String, i64)],
    counts: &[(MachineState, i64)],
    heartbeating: i64,
    silent: i64,
    brake: Option<&crate::bmdb::brake::BrakeState>,
) {
    p.gauge(
        "shepherd_bmdb_sessions",
        "BMDB sessions alive (all shepherd processes)",
        sessions,
    );
    p.gauges(
        "shepherd_active_backoffs",
        "Machines backed off now, per process",
        // The processes that back off, at 0 when none is.
        ["ShepherdAgentStart", "ShepherdRecovery"]
            .into_iter()
            .filter(|p| !backoffs.iter().any(|(b, _)| b == p))
            .map(|p| (labels(&[("process", p)]), 0))
            .chain(
                backoffs
                    .iter()
                    .map(|(process, n)| (labels(&[("process", process)]), *n)),
            ),
    );
    p.gauges(
        "shepherd_agents",
        "Machines with a started agent, heartbeating or silent",
        [
            (labels(&[("state", "heartbeating")]), heartbeating),
            (labels(&[("state", "silent")]), silent),
        ],
    );
    p.gauges(
        "shepherd_machines",
        "Machines per state",
        MachineState::ALL.iter().map(|s| {
            let n = counts
                .iter()
                .find(|(c, _)| c == s)
                .map(|(_, n)| *n)
                .unwrap_or(0);
            (labels(&[("state", s.as_str())]), n)
        }),
    );
    if let Some(b) = brake {
        p.gauge(
            "shepherd_recovery_brake_engaged",
            "Whether the recovery brake holds: no power action for silence until it lets go or an operator releases it",
            b.engaged as i64,
        );
        p.gauge(
            "shepherd_silent_machines",
            "Machines judged silent now (their callback endpoint served for the whole threshold), held ones excepted",
            b.silent,
        );
        p.gauge(
            "shepherd_recovery_brake_limit",
            "The most silent machines, and power actions for silence in the window, before the brake holds",
            b.limit,
        );
        p.gauge(
            "shepherd_recovery_power_actions_in_window",
            "Power actions for silence within the brake's window (all shepherds)",
            b.power_actions_in_window,
        );
    }
}

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// A counter family over the mailboxes: one series per process and per
/// (label value, count) that `values` gives for its status.
fn mailbox_counters(
    p: &mut Scrape,
    mailboxes: &[(&str, &Option<MailboxStatus>)],
    (name, help, label): (&str, &str, &'static str),
    values: impl Fn(&MailboxStatus) -> Vec<(&'static str, u64)>,
) {
    let mut series = Vec::new();
    for (process, m) in mailboxes {
        if let Some(m) = m {
            for (value, n) in values(m) {
                series.push((labels(&[("process", process), (label, value)]), n));
            }
        }
    }
    p.counters(name, help, series);
}

fn mailbox_samples(p: &mut Scrape, mailboxes: &[(&str, &Option<MailboxStatus>)]) {
    mailbox_counters(
        p,
        mailboxes,
        (
            "shepherd_leases",
            "Work leases by process and how they ended (this process)",
            "event",
        ),
        |m| {
            vec![
                ("started", m.leased),
                ("finished", m.finished),
                ("failed", m.failed),
                ("canceled", m.aborted),
            ]
        },
    );
    mailbox_counters(
        p,
        mailboxes,
        (
            "shepherd_lease_selections",
            "Lease attempts of a control loop by outcome: a machine leased, nothing to lease, or a pick lost to another leaser (this process)",
            "result",
        ),
        |m| {
            vec![
                ("leased", m.leased),
                ("nothing", m.idle_polls),
                ("lost", m.conflicts),
            ]
        },
    );
    for (name, help, value) in [
        (
            "shepherd_mailbox_running",
            "Workers running now, per control loop",
            (|m: &MailboxStatus| m.running) as fn(&MailboxStatus) -> usize,
        ),
        (
            "shepherd_mailbox_parallelism",
            "Workers allowed at once, per control loop",
            |m: &MailboxStatus| m.parallelism,
        ),
    ] {
        let values = mailboxes.iter().filter_map(|(process, m)| {
            m.as_ref()
                .map(|m| (labels(&[("process", process)]), value(m) as i64))
        });
        p.gauges(name, help, values);
    }
}

const SESSIONS_ALIVE: &str = "SELECT count(*) FROM sessions WHERE session_deadline > now()";
const ACTIVE_BACKOFFS: &str =
    "SELECT process::text, count(*) FROM work_backoff WHERE until > now() GROUP BY process";

/// OpenMetrics text for Prometheus.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses(
        (status = 200, description = "the series", body = String, content_type = "application/openmetrics-text"),
        (status = 401, description = "a bearer token is required", body = api::ErrorBody),
        (status = 500, description = "encoding failed", body = api::ErrorBody)))]
async fn metrics(admin: web::Data<Admin>) -> HttpResponse {
    let db = admin
        .bmdb
        .transact(async |tx| {
            let sessions: i64 = tx.query_one(SESSIONS_ALIVE, &[]).await?.get(0);
            let backoffs: Vec<(String, i64)> = tx
                .query(ACTIVE_BACKOFFS, &[])
                .await?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            let counts = machines::fleet_counts(tx).await?;
            let agents = machines::agent_counts(tx, admin.heartbeat_stale_after).await?;
            let brake = match &admin.judge {
                Some(j) => Some(crate::bmdb::brake::state(tx, j).await?),
                None => None,
            };
            Ok((sessions, backoffs, counts, agents, brake))
        })
        .await;
    let st = status(&admin).await;
    let mut p = Scrape(Registry::default());
    // What this process knows by itself is served while the BMDB is away
    // (a restart, a failover): that is when it is looked at.
    p.gauge(
        "shepherd_bmdb_up",
        "Whether the BMDB answered this scrape's queries",
        db.is_ok() as i64,
    );
    p.gauge(
        "shepherd_session_up",
        "Whether this process holds a live session",
        st.session.is_some() as i64,
    );
    p.counters(
        "shepherd_sessions",
        "BMDB sessions this process opened, and lost (ended other than by its own shutdown)",
        [
            (labels(&[("event", "opened")]), st.sessions_opened),
            (labels(&[("event", "lost")]), st.sessions_lost),
        ],
    );
    let tx = admin.bmdb.counters();
    p.counters(
        "shepherd_bmdb_transactions",
        "BMDB transactions of this process by outcome: committed, run again after a conflict or a lost connection, commit outcome unknown (connection lost during COMMIT), failed",
        [
            ("committed", tx.committed),
            ("retried-conflict", tx.retried_conflict),
            ("retried-connection", tx.retried_connection),
            ("commit-unknown", tx.commit_unknown),
            ("failed", tx.failed),
        ]
        .map(|(o, n)| (labels(&[("outcome", o)]), n)),
    );
    mailbox_samples(
        &mut p,
        &[
            ("ShepherdAgentStart", &st.initializer),
            ("ShepherdRecovery", &st.recoverer),
        ],
    );
    match db {
        Ok((sessions, backoffs, counts, (heartbeating, silent), brake)) => {
            fleet_samples(
                &mut p,
                sessions,
                &backoffs,
                &counts,
                heartbeating,
                silent,
                brake.as_ref(),
            );
        }
        Err(e) => {
            tracing::debug!(error = %e, "/metrics: the BMDB did not answer; serving this process's own series")
        }
    }
    if let Some(budget) = &admin.equinix {
        let used = budget.metrics.last_hour();
        p.gauge(
            "shepherd_equinix_requests_last_hour",
            "Equinix API requests this process made in the last 60 minutes",
            used.requests as i64,
        );
        p.gauge(
            "shepherd_equinix_throttled_last_hour",
            "Equinix API requests answered 429 (rate limited) in the last 60 minutes",
            used.throttled as i64,
        );
        p.gauge(
            "shepherd_equinix_budget_per_hour",
            "Equinix API requests an hour this process can make at most (its client's interval and parallelism)",
            budget.per_hour() as i64,
        );
    }
    if let Some(prov) = &st.provisioner {
        p.gauge(
            "shepherd_provisioner_discrepancies",
            "Machines in the BMDB the provider no longer lists",
            prov.counters.missing_in_provider.len() as i64,
        );
        p.counters(
            "shepherd_provisioner_machines",
            "Machines created or adopted by the provisioner",
            [
                (labels(&[("how", "created")]), prov.counters.created),
                (labels(&[("how", "adopted")]), prov.counters.adopted),
            ],
        );
    }
    let mut body = String::new();
    let encoded = prometheus_client::encoding::text::encode_registry(&mut body, &admin.registry)
        .and_then(|()| prometheus_client::encoding::text::encode_registry(&mut body, &p.0))
        .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut body));
    if let Err(e) = encoded {
        return internal(format!("encoding metrics: {e}"));
    }
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(body)
}

/// Serves the admin routes on `listen` until the system stops. Returns the
/// bound address (for port 0).
pub fn serve(admin: Admin, listen: std::net::SocketAddr) -> std::io::Result<std::net::SocketAddr> {
    let data = web::Data::new(admin);
    let server = actix_web::HttpServer::new(move || {
        actix_web::App::new()
            .app_data(data.clone())
            .configure(routes)
    })
    .workers(1)
    .disable_signals()
    .bind(listen)?;
    let addr = server.addrs()[0];
    actix_rt::spawn(server.run());
    Ok(addr)
}
