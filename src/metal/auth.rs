//! Who a Metal API request acts for: the `X-Auth-Token` header, looked up
//! in the BMDB at every request (by its SHA-256: a revoked token is
//! refused from the moment the revocation commits), or an operator's
//! token from the configuration.

use actix_web::body::BoxBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::middleware::Next;
use actix_web::{HttpMessage, web};
use uuid::Uuid;

use super::json;
use crate::admin::Admin;
use crate::bmdb::tenants::{self, TokenHolder};

/// Whom a request acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A project's token: that project only.
    Project(TokenHolder),
    /// An operator's token (`admin.token`, `admin.tokens`): every project.
    Operator(String),
}

impl Caller {
    /// Whether it sees `project`.
    pub fn sees(&self, project: Uuid) -> bool {
        match self {
            Caller::Project(t) => t.project_id == project,
            Caller::Operator(_) => true,
        }
    }

    /// Its project, for a project's token.
    pub fn project(&self) -> Option<Uuid> {
        match self {
            Caller::Project(t) => Some(t.project_id),
            Caller::Operator(_) => None,
        }
    }

    /// What the audit and the history call it: `token:<id>` or the
    /// operator's token name.
    pub fn actor(&self) -> String {
        match self {
            Caller::Project(t) => format!("token:{}", t.token_id),
            Caller::Operator(name) => name.clone(),
        }
    }

    /// Refused (403) when the token is read-only.
    pub fn may_write(&self) -> Result<(), actix_web::HttpResponse> {
        match self {
            Caller::Project(t) if t.read_only => Err(json::error(
                StatusCode::FORBIDDEN,
                "This token is read-only: it cannot create, update, delete or act",
            )),
            _ => Ok(()),
        }
    }
}

/// Middleware: the [`Caller`] into the request's extensions, or 401.
pub async fn require_caller(
    req: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let Some(admin) = req.app_data::<web::Data<Admin>>().cloned() else {
        return next.call(req).await;
    };
    let token = req
        .headers()
        .get("x-auth-token")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string);
    let refuse = |req: ServiceRequest, why: &str| {
        let (r, _) = req.into_parts();
        Ok(ServiceResponse::new(
            r,
            json::error(StatusCode::UNAUTHORIZED, why),
        ))
    };
    let Some(token) = token else {
        return refuse(
            req,
            "Invalid authentication token: X-Auth-Token is required",
        );
    };
    if crate::admin::in_the_clear(req.request()) {
        return refuse(
            req,
            "Tokens are not taken over plain HTTP beyond loopback: use HTTPS",
        );
    }
    let caller = if let Some(name) = crate::admin::operator_token(&admin, token.as_bytes()) {
        Caller::Operator(name)
    } else {
        let looked = tokio::time::timeout(
            admin.database_timeout,
            admin
                .bmdb
                .transact(async |tx| tenants::authenticate(tx, &token).await),
        )
        .await;
        match looked {
            Ok(Ok(Some(holder))) => Caller::Project(holder),
            Ok(Ok(None)) => return refuse(req, "Invalid authentication token"),
            Ok(Err(e)) => {
                let (r, _) = req.into_parts();
                return Ok(ServiceResponse::new(
                    r,
                    json::error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &format!("BMDB: {e}: the token could not be checked"),
                    ),
                ));
            }
            Err(_) => {
                let (r, _) = req.into_parts();
                return Ok(ServiceResponse::new(
                    r,
                    json::error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &format!(
                            "the BMDB did not answer within {:?}: the token could not be checked",
                            admin.database_timeout
                        ),
                    ),
                ));
            }
        }
    };
    req.extensions_mut().insert(caller);
    next.call(req).await
}
