//! Who a request acts for, and the guards of the routes that change things.
//!
//! - Tokens: `Authorization: Bearer <token>`, or the login cookie a browser
//!   gets from `/login` (HttpOnly, `SameSite=Strict`: a cross-site request
//!   does not carry it). Each token has a name; the audit records it. A
//!   server without tokens (loopback only) acts for `anonymous`.
//! - Forms (the pages' buttons) carry a CSRF token, an HMAC of the operator
//!   and the machine under a key of this process's, and are refused when the
//!   browser says the request is cross-site (`Sec-Fetch-Site`, `Origin`).
//! - The JSON API's POSTs want `Content-Type: application/json`, which no
//!   form can send and no cross-site script can without a CORS preflight
//!   (which this server never grants).

use actix_web::body::BoxBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};

use super::html::{error_page, login_form};
use super::request::{error_response, same_origin};
use super::state::{Admin, Operator};
use super::text::{hex, unhex};

/// The login cookie's name.
pub const COOKIE: &str = "shepherd_admin";

fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The name of the operator's token `given` is, if any. Every token is
/// compared, in constant time each.
pub fn token_name(admin: &Admin, given: &[u8]) -> Option<String> {
    let mut found = None;
    for (name, token) in &admin.tokens {
        if same(given, token.expose().as_bytes()) {
            found = Some(name.clone());
        }
    }
    found
}

/// Whether this request came over plain HTTP to an address beyond
/// loopback: no token is taken there (an embedding application's server
/// may listen anywhere; `shepherd run` serves HTTPS there, `admin.tls`).
pub fn in_the_clear(req: &HttpRequest) -> bool {
    let c = req.app_config();
    !c.secure() && !c.local_addr().ip().is_loopback()
}

/// The token of an `Authorization: Bearer <token>` value; the scheme's
/// name is case-insensitive (RFC 7235 §2.1), spaces around it are allowed.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
        .filter(|t| !t.is_empty())
}

/// Who the request acts for, if anyone.
pub fn identify(admin: &Admin, req: &HttpRequest) -> Option<Operator> {
    if admin.tokens.is_empty() {
        return Some(Operator("anonymous".into()));
    }
    // No token is taken where it crossed a network in the clear.
    if in_the_clear(req) {
        return None;
    }
    let bearer = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    if let Some(b) = bearer {
        return token_name(admin, b.as_bytes()).map(Operator);
    }
    let value = req
        .headers()
        .get_all("cookie")
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))?;
    token_name(admin, &unhex(value)?).map(Operator)
}

/// The path from the request's page back to the admin root (`./`,
/// `../`…), whatever prefix the routes are mounted under.
pub fn root(req: &HttpRequest) -> String {
    let rest = req.match_info().unprocessed();
    let depth = rest.matches('/').count().saturating_sub(1);
    if depth == 0 {
        "./".into()
    } else {
        "../".repeat(depth)
    }
}

/// Middleware: the request's [`Operator`] into its extensions, or 401.
/// A browser asking for a page is sent to the login form.
pub async fn require_operator(
    req: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let Some(admin) = req.app_data::<web::Data<Admin>>().cloned() else {
        return next.call(req).await;
    };
    match identify(&admin, req.request()) {
        Some(op) => {
            req.extensions_mut().insert(op);
            next.call(req).await
        }
        None => {
            let wants_page = req.method() == actix_web::http::Method::GET
                && !req.path().contains("/api/")
                && req
                    .headers()
                    .get("accept")
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|a| a.contains("text/html"));
            let (r, _) = req.into_parts();
            let resp = if wants_page {
                HttpResponse::Unauthorized()
                    .insert_header(("WWW-Authenticate", "Bearer"))
                    .content_type("text/html; charset=utf-8")
                    .body(login_form(&root(&r), None))
            } else {
                let mut r = error_response(
                    actix_web::http::StatusCode::UNAUTHORIZED,
                    "a bearer token is required",
                );
                r.headers_mut().insert(
                    actix_web::http::header::WWW_AUTHENTICATE,
                    actix_web::http::header::HeaderValue::from_static("Bearer"),
                );
                r
            };
            Ok(ServiceResponse::new(r, resp))
        }
    }
}

/// `POST /login`: a token in a form; sets the login cookie.
pub async fn login(
    admin: web::Data<Admin>,
    req: HttpRequest,
    form: web::Form<LoginForm>,
) -> HttpResponse {
    if let Err(e) = same_origin(&req) {
        return HttpResponse::Forbidden().content_type("text/plain").body(e);
    }
    let root = root(&req);
    if token_name(&admin, form.token.trim().as_bytes()).is_none() {
        return HttpResponse::Unauthorized()
            .content_type("text/html; charset=utf-8")
            .body(login_form(
                &root,
                Some("That is not a token of this server."),
            ));
    }
    // The cookie covers the routes wherever they are mounted, and the
    // browser goes to the fleet page there.
    let path = req.path().trim_end_matches("login").to_string();
    let cookie = format!(
        "{COOKIE}={}; Path={path}; HttpOnly; SameSite=Strict",
        hex(form.token.trim().as_bytes())
    );
    HttpResponse::SeeOther()
        .insert_header(("Set-Cookie", cookie))
        .insert_header(("Location", path))
        .finish()
}

#[derive(serde::Deserialize)]
pub struct LoginForm {
    token: String,
}

/// `GET /login`.
pub async fn login_page(req: HttpRequest) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(login_form(&root(&req), None))
}

/// The forms the pages post: each carries the CSRF token of its page.
pub trait Form: serde::de::DeserializeOwned {
    fn csrf(&self) -> &str;
}

/// A machine page's posted form, checked as [`checked_form`] checks it
/// (its CSRF token bound to the machine): the form, the operator, and the
/// link back to the machine's page for an error page.
pub(super) fn machine_form<T: Form>(
    admin: &Admin,
    req: &HttpRequest,
    body: &[u8],
    machine: &str,
) -> Result<(T, Operator, String), HttpResponse> {
    // The link is escaped where the error page writes it.
    let back = format!("../{machine}");
    let (form, operator) = checked_form::<T>(admin, req, body, machine, &back)?;
    Ok((form, operator, back))
}

/// A page's posted form, checked: from this site, parsed, by a logged-in
/// operator, with a CSRF token bound to `bound` (a machine ID, or a form's
/// name). Otherwise the error page, with a link back to `back`.
pub(super) fn checked_form<T: Form>(
    admin: &Admin,
    req: &HttpRequest,
    body: &[u8],
    bound: &str,
    back: &str,
) -> Result<(T, Operator), HttpResponse> {
    use actix_web::http::StatusCode;
    use error_page;
    same_origin(req).map_err(|e| error_page(StatusCode::FORBIDDEN, &e, back))?;
    let form: T = serde_urlencoded::from_bytes(body)
        .map_err(|e| error_page(StatusCode::BAD_REQUEST, &format!("the form: {e}"), back))?;
    let operator = req
        .extensions()
        .get::<Operator>()
        .cloned()
        .ok_or_else(|| error_page(StatusCode::UNAUTHORIZED, "log in first", back))?;
    if !admin.csrf.verify(&operator, bound, form.csrf()) {
        return Err(error_page(
            StatusCode::FORBIDDEN,
            "the form's CSRF token is not valid here (reload the page and try again)",
            back,
        ));
    }
    Ok((form, operator))
}
