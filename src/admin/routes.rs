//! The admin's routes: which handler answers which path and method (a
//! wrong method is a 405 naming the right ones), and the server that
//! serves them.

use actix_web::body::BoxBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::middleware::{Next, from_fn};
use actix_web::{HttpResponse, web};

use super::handlers::{
    api_action, api_brake, api_brake_release, api_loops, api_machine, api_machines, healthz,
    no_answer, readyz,
};
use super::html::error_page;
use super::metrics::metrics;
use super::request::{error_response, json_error};
use super::state::Admin;
use super::{auth, firmware, install_pages, installs, openapi, pages, rollout_pages, rollouts};

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
                    // These two answer whatever the BMDB does: `/readyz`
                    // bounds its own reads (its body says what it could
                    // tell), `/metrics` serves this process's own series.
                    .service(read_only("/readyz", readyz))
                    .service(read_only("/metrics", metrics))
                    .service(bounded_by_the_database()),
            ),
    );
}

/// The routes that wait for the BMDB, each answering within
/// `admin.database_timeout`.
fn bounded_by_the_database() -> actix_web::Scope<
    impl actix_web::dev::ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<BoxBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    web::scope("")
        .wrap(from_fn(database_bound))
        .service(read_only("/api/v1/machines", api_machines))
        .service(read_only("/api/v1/machines/{id}", api_machine))
        .service(post_only(
            "/api/v1/machines/{id}/install",
            installs::api_install,
        ))
        .service(post_only(
            "/api/v1/machines/{id}/deprovision",
            installs::api_deprovision,
        ))
        .service(post_only(
            "/api/v1/machines/{id}/service",
            super::servicing::api_service,
        ))
        .service(post_only(
            "/api/v1/machines/{id}/accept",
            super::discovery::api_accept,
        ))
        .service(post_only(
            "/api/v1/machines/{id}/assign",
            super::tenancy::api_assign,
        ))
        .service(post_only(
            "/api/v1/machines/{id}/unassign",
            super::tenancy::api_unassign,
        ))
        .service(post_only("/api/v1/machines/{id}/{action}", api_action))
        .service(read_and_post(
            "/api/v1/rollouts",
            rollouts::api_rollouts,
            rollouts::api_rollout_create,
        ))
        .service(read_only("/api/v1/rollouts/{id}", rollouts::api_rollout))
        .service(post_only(
            "/api/v1/rollouts/{id}/cancel",
            rollouts::api_rollout_cancel,
        ))
        .service(read_only("/api/v1/images", installs::api_images))
        .service(read_only(
            "/api/v1/baselines",
            super::firmware::api_baselines,
        ))
        .service(read_only("/api/v1/openapi.json", openapi::openapi_json))
        .service(read_only("/api/v1/switches", super::handlers::api_switches))
        .service(read_only("/api/v1/brake", api_brake))
        .service(read_only("/api/v1/loops", api_loops))
        .service(post_only("/api/v1/brake/release", api_brake_release))
        .service(post_only("/brake/release", pages::brake_form))
        .service(read_only("/", pages::fleet_page))
        .service(read_only("/events", super::live::events))
        .service(read_and_post("/bulk", pages::bulk_page, pages::bulk_form))
        .service(read_only("/machines/{id}", pages::machine_page))
        .service(read_only(
            "/machines/{id}/console/{capture}",
            pages::console_download,
        ))
        .service(read_only("/firmware", firmware::firmware_page))
        .service(post_only(
            "/machines/{id}/install",
            install_pages::install_form,
        ))
        .service(post_only(
            "/machines/{id}/deprovision",
            install_pages::deprovision_form,
        ))
        .service(post_only(
            "/machines/{id}/service",
            super::servicing::service_form,
        ))
        .service(post_only(
            "/machines/{id}/accept",
            super::discovery::accept_form,
        ))
        .service(post_only("/machines/{id}/{action}", pages::form_action))
        .service(read_and_post(
            "/rollouts",
            rollout_pages::rollouts_page,
            rollout_pages::rollout_form,
        ))
        .service(read_only("/rollouts/{id}", rollout_pages::rollout_page))
        .service(post_only(
            "/rollouts/{id}/cancel",
            rollout_pages::cancel_form,
        ))
}

/// Answers within `admin.database_timeout`: when the database has not
/// answered by then, 503 naming it (JSON for the API, an error page for
/// the pages), never a hang.
pub(crate) async fn database_bound(
    req: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let bound = req
        .app_data::<web::Data<Admin>>()
        .map_or(std::time::Duration::from_secs(1), |a| a.database_timeout);
    // What the answer needs of the request, taken before routing (which
    // wants the request to itself).
    let path = req.path().to_string();
    let back = auth::root(req.request());
    match tokio::time::timeout(bound, next.call(req)).await {
        Ok(answer) => answer,
        Err(_) => {
            let message = no_answer(bound);
            // A probe every second would repeat this: the session's and
            // the pool's own warnings say the database is away.
            tracing::debug!(%path, "{message}; answered 503");
            // The Metal API's Error takes `error` as well as `errors`.
            let answer = if path.starts_with("/api/") || path.starts_with("/metal/") {
                error_response(StatusCode::SERVICE_UNAVAILABLE, &message)
            } else {
                error_page(StatusCode::SERVICE_UNAVAILABLE, &message, &back)
            };
            // The request went with the handler: the answer goes as an
            // error, which actix-web turns into this response.
            Err(actix_web::error::InternalError::from_response(message, answer).into())
        }
    }
}

/// 405 naming the method and what the resource takes, with `Allow`.
pub fn method_not_allowed(
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
pub fn read_and_post<R, RArgs, W, WArgs>(path: &str, read: R, write: W) -> actix_web::Resource
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
pub fn post_only<F, Args>(path: &str, handler: F) -> actix_web::Resource
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
pub fn read_only<F, Args>(path: &str, handler: F) -> actix_web::Resource
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

/// Serves the admin routes on `listen` until the system stops. Returns the
/// bound address (for port 0). (`metal::serve` serves the Metal API's
/// beside them, over HTTPS when asked.)
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
