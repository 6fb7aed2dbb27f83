//! The Equinix Metal API's device subset, served to tenants at
//! `/metal/v1` on the admin server's listener (CONTRACTS.md §7), as
//! `equinix-metal-openapi` describes it: what Terraform configurations,
//! Cluster API providers and the official SDKs written against Equinix
//! Metal need to get, run and give back machines of shepherd's own racks.
//!
//! - A request acts for the project of its `X-Auth-Token` (a project's
//!   token: `bmdb::tenants`), or, with an operator's token (`admin.token`,
//!   `admin.tokens`), for every project. Another project's device, event,
//!   key or reservation is 404, never 403; a read-only token is 403 on
//!   anything that writes.
//! - Devices are `bmdb::devices`: a create claims an available machine of
//!   the plan in the metro and asks its installation, in one transaction.
//! - Answers are the Metal API's: its status codes, `{"errors": [...]}`,
//!   its paging (`page`, `per_page`, `meta`), and no `null` anywhere (the
//!   description allows none: an absent value is left out).
//!
//! Files: [`catalog`] (plans, operating systems, metros), `auth`,
//! `json` (the representations), `handlers` (the routes' answers).

pub mod catalog;

mod auth;
mod handlers;
mod json;

use actix_web::middleware::from_fn;
use actix_web::web;

pub use auth::Caller;
pub use catalog::Catalog;

/// The routes under `/metal/v1`, for `App::configure` before the
/// admin's (`admin::routes`, whose pages take every other path); they
/// read `web::Data<Admin>` and `web::Data<Catalog>`.
pub fn routes(cfg: &mut web::ServiceConfig) {
    use handlers::*;
    cfg.service(
        web::scope("/metal/v1")
            .wrap(from_fn(auth::require_caller))
            .wrap(from_fn(crate::admin::routes::database_bound))
            .app_data(web::PathConfig::default().error_handler(|_, _| {
                actix_web::error::InternalError::from_response(
                    "not found",
                    json::error(actix_web::http::StatusCode::NOT_FOUND, "Not found"),
                )
                .into()
            }))
            .app_data(web::QueryConfig::default().error_handler(|e, _| {
                let msg = format!("the query: {e}");
                actix_web::error::InternalError::from_response(
                    msg.clone(),
                    json::error(actix_web::http::StatusCode::UNPROCESSABLE_ENTITY, &msg),
                )
                .into()
            }))
            .route("/user", web::get().to(user))
            .route("/projects", web::get().to(projects))
            .route("/projects/{id}", web::get().to(project))
            .route("/projects/{id}/plans", web::get().to(project_plans))
            .route("/projects/{id}/devices", web::get().to(project_devices))
            .route("/projects/{id}/devices", web::post().to(create_device))
            .route(
                "/projects/{id}/hardware-reservations",
                web::get().to(project_reservations),
            )
            .route("/projects/{id}/ssh-keys", web::get().to(project_keys))
            .route(
                "/projects/{id}/ssh-keys",
                web::post().to(create_project_key),
            )
            .route("/projects/{id}/events", web::get().to(project_events))
            .route("/plans", web::get().to(plans))
            .route("/operating-systems", web::get().to(operating_systems))
            .route("/locations/metros", web::get().to(metros))
            .route("/locations/metros/{id}", web::get().to(metro))
            .route("/devices/{id}", web::get().to(device))
            .route("/devices/{id}", web::put().to(update_device))
            .route("/devices/{id}", web::delete().to(delete_device))
            .route("/devices/{id}/actions", web::post().to(device_action))
            .route("/devices/{id}/events", web::get().to(device_events))
            .route("/devices/{id}/ssh-keys", web::get().to(device_keys))
            .route("/hardware-reservations/{id}", web::get().to(reservation))
            .route("/ssh-keys", web::get().to(keys))
            .route("/ssh-keys/{id}", web::get().to(key))
            .route("/ssh-keys/{id}", web::put().to(update_key))
            .route("/ssh-keys/{id}", web::delete().to(delete_key))
            .route("/ports/{id}", web::get().to(port))
            .route("/ports/{id}/assign", web::post().to(assign_port))
            .route("/ports/{id}/unassign", web::post().to(unassign_port))
            .route(
                "/ports/{id}/convert/layer-2",
                web::post().to(convert_layer2),
            )
            .route(
                "/ports/{id}/convert/layer-3",
                web::post().to(convert_layer3),
            )
            .route("/ports/{id}/bond", web::post().to(bond_port))
            .route("/ports/{id}/disbond", web::post().to(disbond_port))
            .route(
                "/ports/{id}/native-vlan",
                web::post().to(assign_native_vlan),
            )
            .route(
                "/ports/{id}/native-vlan",
                web::delete().to(delete_native_vlan),
            )
            .route(
                "/ports/{id}/vlan-assignments",
                web::get().to(port_assignments),
            )
            .route(
                "/ports/{id}/vlan-assignments/batches",
                web::get().to(port_batches),
            )
            .route(
                "/ports/{id}/vlan-assignments/batches",
                web::post().to(create_batch),
            )
            .route(
                "/ports/{id}/vlan-assignments/batches/{batch_id}",
                web::get().to(port_batch),
            )
            .route(
                "/ports/{id}/vlan-assignments/{assignment_id}",
                web::get().to(port_assignment),
            )
            .route(
                "/projects/{id}/virtual-networks",
                web::get().to(project_networks),
            )
            .route(
                "/projects/{id}/virtual-networks",
                web::post().to(create_network),
            )
            .route("/virtual-networks/{id}", web::get().to(network))
            .route("/virtual-networks/{id}", web::delete().to(delete_network))
            .route("/events", web::get().to(events))
            .route("/events/{id}", web::get().to(event))
            .default_service(web::to(|| async {
                json::error(actix_web::http::StatusCode::NOT_FOUND, "Not found")
            })),
    );
}

/// Serves the admin routes, and the Metal API's with `catalog`, on
/// `listen` (over HTTPS with `tls`) until the system stops. Returns the
/// bound address (for port 0).
pub fn serve(
    admin: crate::admin::Admin,
    catalog: Option<Catalog>,
    listen: std::net::SocketAddr,
    tls: Option<rustls::ServerConfig>,
) -> std::io::Result<std::net::SocketAddr> {
    let data = web::Data::new(admin);
    let catalog = catalog.map(web::Data::new);
    let server = actix_web::HttpServer::new(move || {
        let app = actix_web::App::new().app_data(data.clone());
        let app = match &catalog {
            Some(c) => app.app_data(c.clone()).configure(routes),
            None => app,
        };
        app.configure(crate::admin::routes)
    })
    .workers(1)
    .disable_signals();
    let server = match tls {
        Some(tls) => server.bind_rustls_0_23(listen, tls)?,
        None => server.bind(listen)?,
    };
    let addr = server.addrs()[0];
    actix_rt::spawn(server.run());
    Ok(addr)
}
