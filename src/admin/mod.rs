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

//! Files by job, none importing another in a circle, and none importing
//! this one: [`routes`] (paths, methods, the server), `handlers` (the
//! JSON answers), `metrics` (the scrape), `request` (parsing and error
//! bodies), `state` ([`Admin`], [`Operator`]), `auth`, the pages
//! (`pages`, `install_pages`, `rollout_pages`, `html`: maud, escaped by
//! construction), installations ([`installs`]),
//! rollouts (`rollouts`), the API's types ([`api`], [`consoles`],
//! [`timeline`]) and its description (`openapi`).

pub mod api;
mod auth;
pub mod consoles;
pub mod discovery;
mod firmware;
mod handlers;
mod html;
mod install_pages;
pub mod installs;
pub mod live;
mod metrics;
pub mod network;
mod openapi;
mod pages;
mod request;
mod rollout_pages;
mod rollouts;
pub mod routes;
mod scrape;
mod servicing;
mod state;
mod tenancy;
mod text;
pub mod timeline;
pub mod tls;

pub use auth::{in_the_clear, token_name as operator_token};
pub use request::ApiError;
pub use routes::{routes, serve};
pub use state::{Admin, CsrfKey, Operator, RequestBudget};
