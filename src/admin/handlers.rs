//! The JSON handlers: health and readiness, the fleet and one machine,
//! operators' actions, the recovery brake.

use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use serde::Deserialize;

use super::api;
use super::request::ApiError;
use super::request::{
    Page, Query, bad_request, check_reason, error_response, internal, json_body, json_post,
};
use super::state::{Admin, Operator};
use super::text::rfc3339;
use crate::bmdb::actions;
use crate::bmdb::machines::{self, Listing, MachineDetail};
use crate::status::{GetSupervisorStatus, SupervisorStatus};

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", security(()),
    responses((status = 200, description = "alive", body = String, content_type = "text/plain")))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

pub async fn status(admin: &Admin) -> SupervisorStatus {
    match &admin.supervisor {
        Some(s) => s.send(GetSupervisorStatus).await.unwrap_or_default(),
        None => SupervisorStatus::default(),
    }
}

/// Readiness: the BMDB answers and this process holds a session.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "ready", body = api::Readiness),
        (status = 503, description = "not ready: the body says why", body = api::Readiness)))]
pub async fn readyz(admin: web::Data<Admin>) -> HttpResponse {
    // One deadline for everything it asks: a probe never hangs, whatever
    // the database does (a BMDB away is retried for the failover window).
    let bound = admin.database_timeout;
    let deadline = tokio::time::Instant::now() + bound;
    let (db, st, brake) = tokio::join!(
        tokio::time::timeout_at(deadline, admin.bmdb.ping(),),
        tokio::time::timeout_at(deadline, status(&admin)),
        tokio::time::timeout_at(deadline, brake_state(&admin)),
    );
    let db = match db {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(no_answer(bound)),
    };
    let st = st.unwrap_or_default();
    let session_ok = admin.supervisor.is_none() || st.session.is_some();
    // The brake does not make the process unready (it is working as
    // meant), but whoever looks should see it.
    let brake = match brake {
        Ok(Some(Ok(b))) => Some(api::ReadyBrake::State {
            engaged: b.engaged,
            reason: b.reason,
            silent: b.silent,
            limit: b.limit,
        }),
        Ok(Some(Err(e))) => Some(api::ReadyBrake::Unreadable {
            error: e.to_string(),
        }),
        Ok(None) => None,
        Err(_) => Some(api::ReadyBrake::Unreadable {
            error: no_answer(bound),
        }),
    };
    let body = api::Readiness {
        database: match &db {
            Ok(()) => "ok".to_string(),
            Err(e) => e.clone(),
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

/// What a route says when the BMDB did not answer within its bound.
pub fn no_answer(bound: std::time::Duration) -> String {
    format!(
        "the BMDB did not answer within {}",
        humantime::format_duration(bound)
    )
}

/// The recovery brake as it stands, when this process judges silence.
pub async fn brake_state(
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

/// `GET /api/v1/loops`: this process's control loops, each as every loop
/// tells it (what the fleet page's loop table shows).
#[utoipa::path(get, path = "/api/v1/loops", tag = "health",
    responses(
        (status = 200, description = "this process's session and control loops", body = api::Loops)))]
pub async fn api_loops(admin: web::Data<Admin>) -> HttpResponse {
    let st = status(&admin).await;
    HttpResponse::Ok().json(api::Loops {
        session: st.session,
        loops: st.loops.iter().map(api::LoopBody::from).collect(),
    })
}

/// `GET /api/v1/brake`: the recovery brake, the callback endpoints served
/// (silence is judged only on those), the last fleet-wide actions.
#[utoipa::path(get, path = "/api/v1/brake", tag = "recovery",
    responses(
        (status = 200, description = "the brake, the callback endpoints served, the last fleet-wide actions", body = api::BrakeBody),
        (status = 404, description = "this server does not run the Recoverer", body = api::ErrorBody),
        (status = 500, description = "the BMDB failed", body = api::ErrorBody)))]
pub async fn api_brake(admin: web::Data<Admin>) -> HttpResponse {
    let Some(judge) = admin.judge.clone() else {
        return error_response(
            actix_web::http::StatusCode::NOT_FOUND,
            "this server does not run the Recoverer",
        );
    };
    let r = admin
        .bmdb
        .snapshot(async |tx| {
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
                    agents: e.agents,
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
pub struct ReleaseBody {
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
    /// How long, as `30m`, `2h` (default `recoverer.brake_release`).
    #[serde(rename = "for")]
    pub for_: Option<String>,
    pub request_id: Option<uuid::Uuid>,
}

/// Releases the brake for `operator`: the audit row, or the error.
pub async fn release_brake(
    admin: &Admin,
    operator: &Operator,
    body: ReleaseBody,
) -> Result<actions::Audit, ApiError> {
    if admin.judge.is_none() {
        return Err(ApiError::NotFound(
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
                return Err(ApiError::Invalid(
                    "for: not a duration from 1s to 7d (e.g. 30m, 2h)".into(),
                ));
            }
        },
    };
    let reason = check_reason(body.reason).map_err(ApiError::Invalid)?;
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
        Err(e) => Err(e.into()),
    }
}

/// `POST /api/v1/brake/release`, a JSON body (may be empty).
/// Releases the recovery brake for a while (audited).
#[utoipa::path(post, path = "/api/v1/brake/release", tag = "recovery",
    request_body(content = Option<ReleaseBody>, content_type = "application/json", description = "may be empty"),
    responses(
        (status = 200, description = "released: the audit row", body = api::ActionDone),
        (status = 404, description = "this server does not run the Recoverer", body = api::ErrorBody)))]
pub async fn api_brake_release(
    admin: web::Data<Admin>,
    req: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    use actix_web::http::StatusCode;
    if let Err(r) = json_post(&req, &body) {
        return r;
    }
    let parsed: ReleaseBody = attempt!(json_body(&body));
    let Some(operator) = req.extensions().get::<Operator>().cloned() else {
        return error_response(StatusCode::UNAUTHORIZED, "a bearer token is required");
    };
    match release_brake(&admin, &operator, parsed).await {
        Ok(a) => HttpResponse::Ok().json(api::ActionDone {
            action: (&a).into(),
        }),
        Err(e) => e.answer(),
    }
}

/// The fleet, filtered and paged, with counts per state.
#[utoipa::path(get, path = "/api/v1/machines", tag = "machines", params(Page),
    responses(
        (status = 200, description = "a page of the fleet", body = api::MachineList),
        (status = 400, description = "a parameter is wrong (named)", body = api::ErrorBody),
        (status = 500, description = "the BMDB failed", body = api::ErrorBody)))]
pub async fn api_machines(admin: web::Data<Admin>, Query(q): Query<Page>) -> HttpResponse {
    let filter = attempt!(q.filter(&admin));
    let (limit, offset) = attempt!(q.window(100));
    let r = admin
        .bmdb
        .snapshot(async |tx| {
            Listing::read(tx, &filter, (limit, offset), admin.heartbeat_stale_after).await
        })
        .await;
    match r {
        Ok(l) => HttpResponse::Ok().json(api::MachineList {
            machines: l
                .machines
                .iter()
                .map(|m| {
                    let mut a = api::Machine::from(m);
                    if let Some(t) = l.tenants.get(&m.machine_id) {
                        a.project = t.project.clone();
                        a.device = t.device.as_ref().map(|(id, _)| *id);
                    }
                    a
                })
                .collect(),
            matching: l.matching.count,
            matching_more: l.matching.more,
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

pub async fn load_detail(admin: &Admin, id: &str) -> Result<MachineDetail, HttpResponse> {
    let id: uuid::Uuid = id
        .parse()
        .map_err(|_| bad_request("the path's machine ID is not a UUID".into()))?;
    match admin
        .bmdb
        .snapshot(async |tx| machines::detail(tx, id).await)
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
        (status = 500, description = "the BMDB failed", body = api::ErrorBody)))]
pub async fn api_machine(admin: web::Data<Admin>, id: web::Path<String>) -> HttpResponse {
    match load_detail(&admin, &id).await {
        Ok(d) => HttpResponse::Ok().json(api::MachineDetailBody {
            baseline: d
                .below
                .as_ref()
                .and_then(|b| api::ConformanceBody::of(&admin.baselines.conformance(b))),
            ..api::MachineDetailBody::from(&d)
        }),
        Err(r) => r,
    }
}

/// An action's parameters, as the API and the forms give them.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionBody {
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
    /// Retry: only this process's backoff.
    #[schema(value_type = Option<api::ProcessName>)]
    pub process: Option<String>,
    /// Retake over: also forget the recorded SSH host key.
    #[serde(default)]
    pub forget_host_key: bool,
    /// Names the request (retried after a lost answer, it acts once).
    pub request_id: Option<uuid::Uuid>,
}

/// Runs an action for `operator`: the audit row, or the error response.
pub async fn run_action(
    admin: &Admin,
    operator: &Operator,
    id: &str,
    action: &str,
    body: ActionBody,
) -> Result<actions::Audit, ApiError> {
    let bad = ApiError::Invalid;
    let machine_id: uuid::Uuid = id
        .parse()
        .map_err(|_| bad("the path's machine ID is not a UUID".into()))?;
    let Some(action) = actions::Action::parse_action(action) else {
        let all: Vec<&str> = actions::Action::ACTIONS
            .iter()
            .map(|a| a.as_str())
            .collect();
        return Err(ApiError::NotFound(format!(
            "not an action: the path's action must be one of {}",
            all.join(", ")
        )));
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
        Ok(actions::Outcome::Refused(why)) => Err(ApiError::Refused(why)),
        Ok(actions::Outcome::NotFound) => Err(ApiError::NotFound(format!(
            "machine {machine_id} is not in the BMDB"
        ))),
        Err(e) => Err(e.into()),
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
        (status = 404, description = "no such machine or action", body = api::ErrorBody),
        (status = 409, description = "refused: it would not do what it says (the reason)", body = api::ErrorBody)))]
pub async fn api_action(
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
    let parsed: ActionBody = attempt!(json_body(&body));
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
        Err(e) => e.answer(),
    }
}

/// `GET /api/v1/switches`: each switch, whether it answers, its ports.
pub async fn api_switches(admin: web::Data<Admin>) -> HttpResponse {
    match admin
        .bmdb
        .snapshot(async |tx| crate::bmdb::switches::switches(tx).await)
        .await
    {
        Ok(s) => HttpResponse::Ok().json(super::network::SwitchList {
            switches: s.iter().map(super::network::SwitchBody::from).collect(),
        }),
        Err(e) => super::request::internal(e),
    }
}
