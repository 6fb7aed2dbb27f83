//! Reading requests and answering errors: queries, JSON bodies and their
//! content type, the same-site check, a fleet listing's parameters, the
//! fields the BMDB cannot store, JSON error bodies.

use actix_web::{HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::api;
use super::state::Admin;
use crate::bmdb::machines::{self, MachineState};
use crate::bmdb::{ProviderStatus, actions};

/// A query string, deserialized; a bad one is a JSON 400 naming the field
/// (`limit: invalid digit found in string`).
pub struct Query<T>(pub T);

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

pub fn json_error(e: impl std::fmt::Display + std::fmt::Debug + 'static) -> actix_web::Error {
    let body = error_response(actix_web::http::StatusCode::BAD_REQUEST, &e.to_string());
    actix_web::error::InternalError::from_response(e, body).into()
}

/// Why an operator's request was not done, by kind: the status it is
/// answered with comes from the kind, not from the words (a refusal is
/// not an outage).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// A field of the request is wrong (named): 400.
    #[error("{0}")]
    Invalid(String),
    /// No such machine, project or route: 404.
    #[error("{0}")]
    NotFound(String),
    /// Not allowed now (the machine's state, a hold, work in hand): 409.
    #[error("{0}")]
    Refused(String),
    /// The BMDB failed or did not answer, or what was asked is not ready
    /// (ask again): 503.
    #[error("{0}")]
    Unavailable(String),
}

impl ApiError {
    pub fn status(&self) -> actix_web::http::StatusCode {
        use actix_web::http::StatusCode;
        match self {
            ApiError::Invalid(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Refused(_) => StatusCode::CONFLICT,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The JSON answer: `{"error": …}` with [`ApiError::status`].
    pub fn answer(&self) -> HttpResponse {
        error_response(self.status(), &self.to_string())
    }
}

impl From<crate::bmdb::BmdbError> for ApiError {
    fn from(e: crate::bmdb::BmdbError) -> Self {
        ApiError::Unavailable(format!("BMDB: {e}"))
    }
}

/// A JSON error body, `{"error": msg}`, with `<`, `>` and `&` written as
/// `\u` escapes: a message naming a field of the request can carry its
/// text, and no reader (a browser sniffing it) may take that for markup.
pub fn error_response(status: actix_web::http::StatusCode, msg: &str) -> HttpResponse {
    let body = json!({ "error": msg })
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026");
    HttpResponse::build(status)
        .content_type("application/json")
        .body(body)
}

/// `body` without JSON's white space around it (space, tab, line feed,
/// carriage return: not the form feed or vertical tab ASCII also counts,
/// which no JSON parser takes).
fn json_trim(body: &[u8]) -> &[u8] {
    let ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let start = body.iter().position(|b| !ws(b)).unwrap_or(body.len());
    let end = body.iter().rposition(|b| !ws(b)).map_or(start, |e| e + 1);
    &body[start..end]
}

/// An API POST's JSON body (empty: the defaults), or a 400 naming the
/// field that is wrong.
pub fn json_body<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, HttpResponse> {
    // Nothing: every field takes its default.
    let text = json_trim(body);
    if text.is_empty() {
        return Ok(T::default());
    }
    // Every body the API takes is an object: serde would also take a
    // struct from an array, which no schema of the description allows.
    if !text.starts_with(b"{") {
        return Err(error_response(
            actix_web::http::StatusCode::BAD_REQUEST,
            "body: a JSON object is required (or no body at all)",
        ));
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
pub fn json_post(req: &HttpRequest, body: &[u8]) -> Result<(), HttpResponse> {
    use actix_web::http::StatusCode;
    let content_type = req
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or("").trim_start().to_ascii_lowercase());
    let acceptable = match content_type {
        Some(t) => t.starts_with("application/json"),
        None => json_trim(body).is_empty(),
    };
    if !acceptable {
        return Err(error_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "actions want Content-Type: application/json",
        ));
    }
    same_origin(req).map_err(|e| error_response(StatusCode::FORBIDDEN, &e))
}

/// A fleet listing's query: filters and paging.
#[derive(Deserialize, Default, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct Page {
    #[param(value_type = Option<api::MachineStateName>)]
    pub state: Option<String>,
    #[param(value_type = Option<api::ProviderStatusName>)]
    pub provider_status: Option<String>,
    #[param(value_type = Option<api::HeartbeatName>)]
    pub heartbeat: Option<String>,
    /// A machine ID's prefix, part of a provider ID, an address's prefix.
    pub q: Option<String>,
    /// The provider's location (an inventory host's `location`), exactly.
    pub location: Option<String>,
    /// A project's ID: machines assigned to it or holding its devices
    /// (empty: any).
    #[param(value_type = Option<String>, pattern = r"^$|^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")]
    pub project: Option<String>,
    /// The BMC's protocol as last read (`none`: no BMC read).
    #[param(value_type = Option<api::BmcName>)]
    pub bmc: Option<String>,
    /// How shepherd reaches the machine first.
    #[param(value_type = Option<api::BootName>)]
    pub boot: Option<String>,
    /// A plan's slug (`metal.plans`), as the machine is labeled.
    pub plan: Option<String>,
    /// Machines on the page (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// Machines skipped.
    #[param(minimum = 0)]
    pub offset: Option<i64>,
}

impl Page {
    /// The filters by name, as a query string, a form's hidden fields or
    /// a rollout's description carry them (the empty ones too).
    pub fn filters(&self) -> [(&'static str, Option<&str>); 9] {
        [
            ("state", self.state.as_deref()),
            ("provider_status", self.provider_status.as_deref()),
            ("heartbeat", self.heartbeat.as_deref()),
            ("q", self.q.as_deref()),
            ("location", self.location.as_deref()),
            ("project", self.project.as_deref()),
            ("bmc", self.bmc.as_deref()),
            ("boot", self.boot.as_deref()),
            ("plan", self.plan.as_deref()),
        ]
    }

    /// The filters given (not empty), by name.
    pub fn given(&self) -> Vec<(&'static str, &str)> {
        self.filters()
            .into_iter()
            .filter_map(|(k, v)| Some((k, v.filter(|v| !v.is_empty())?)))
            .collect()
    }

    /// (limit, offset): `default` without a limit; a limit outside 1 to
    /// 1000 or a negative offset is a 400 naming it.
    pub fn window(&self, default: i64) -> Result<(i64, i64), HttpResponse> {
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
    pub fn filter(&self, admin: &Admin) -> Result<machines::FleetFilter, HttpResponse> {
        for (k, v) in self.filters() {
            no_nul(k, v).map_err(bad_request)?;
        }
        let given = |v: &Option<String>| v.clone().filter(|v| !v.is_empty());
        let provider_status = named(
            "provider_status",
            &self.provider_status,
            &ProviderStatus::ALL,
            |p| p.to_string(),
        )?;
        let heartbeat = named(
            "heartbeat",
            &self.heartbeat,
            &machines::Heartbeat::ALL,
            |h| h.as_str().into(),
        )?;
        let bmc = named("bmc", &self.bmc, &machines::BmcKind::ALL, |b| {
            b.as_str().into()
        })?;
        let boot = named("boot", &self.boot, &crate::config::BootMethod::ALL, |b| {
            b.as_str().into()
        })?;
        let project = match self.project.as_deref() {
            None | Some("") => None,
            Some(s) => Some(uuid::Uuid::parse_str(s).map_err(|_| {
                bad_request(format!("project: {s:?} is not a project's ID (a UUID)"))
            })?),
        };
        Ok(machines::FleetFilter {
            state: parse_state(&self.state)?,
            provider_status,
            heartbeat,
            stale_after: admin.heartbeat_stale_after,
            search: self.q.clone(),
            location: given(&self.location),
            project,
            bmc,
            boot,
            plan: given(&self.plan),
        })
    }
}

/// The one of `all` whose name (`name`) a filter's value is (none when
/// absent or empty), or a 400 naming `field` and listing the names.
fn named<T: Copy>(
    field: &str,
    value: &Option<String>,
    all: &[T],
    name: impl Fn(T) -> String,
) -> Result<Option<T>, HttpResponse> {
    match value.as_deref() {
        None | Some("") => Ok(None),
        Some(v) => all
            .iter()
            .copied()
            .find(|t| name(*t) == v)
            .map(Some)
            .ok_or_else(|| {
                let names: Vec<String> = all.iter().map(|t| name(*t)).collect();
                bad_request(format!("{field} must be one of {}", names.join(", ")))
            }),
    }
}

/// Text the BMDB stores or searches: PostgreSQL's text holds no NUL
/// character, so one is a 400 naming the field, not a database error.
pub fn no_nul(field: &str, value: Option<&str>) -> Result<(), String> {
    match value {
        Some(v) if v.contains('\0') => Err(format!("{field}: contains a NUL character")),
        _ => Ok(()),
    }
}

/// An operator's reason as given: at most `MAX_REASON` characters (before
/// trimming), no NUL; kept trimmed, and none when blank.
pub fn check_reason(reason: Option<String>) -> Result<Option<String>, String> {
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

pub fn bad_request(msg: String) -> HttpResponse {
    error_response(actix_web::http::StatusCode::BAD_REQUEST, &msg)
}

pub fn parse_state(s: &Option<String>) -> Result<Option<MachineState>, HttpResponse> {
    match s.as_deref() {
        None | Some("") => Ok(None),
        Some(s) => MachineState::parse(s).map(Some).ok_or_else(|| {
            let all: Vec<&str> = MachineState::ALL.iter().map(|m| m.as_str()).collect();
            bad_request(format!("state must be one of {}", all.join(", ")))
        }),
    }
}

pub fn internal(e: impl std::fmt::Display) -> HttpResponse {
    error_response(
        actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
        &e.to_string(),
    )
}

/// Refuses a request the browser marks as coming from another site.
pub fn same_origin(req: &HttpRequest) -> Result<(), String> {
    let header = |n: &str| req.headers().get(n).and_then(|v| v.to_str().ok());
    if let Some(site) = header("sec-fetch-site")
        && site != "same-origin"
        && site != "none"
    {
        return Err(format!(
            "a cross-site request is refused (Sec-Fetch-Site: {site})"
        ));
    }
    if let Some(origin) = header("origin") {
        let host = header("host").unwrap_or("");
        let origin_host = origin
            .split_once("://")
            .map(|(_, h)| h.trim_end_matches('/'))
            .unwrap_or("");
        if origin_host.is_empty() || !origin_host.eq_ignore_ascii_case(host) {
            return Err(format!(
                "a cross-site request is refused (Origin {origin} is not this server, {host})"
            ));
        }
    }
    Ok(())
}
