//! Accepting a machine that enlisted itself (CONTRACTS.md §6): `POST
//! /api/v1/machines/{id}/accept` with its BMC, the machine page's form,
//! and the command line (`shepherd machines accept`) all go through
//! [`accept`]: the BMC checked as an inventory host's, then one audited
//! action (its disks' erasure follows once its BMC is read and agrees
//! with its agent: `installations::erase_accepted`, the Updater's). The
//! password is kept in the BMDB for the inventory, and never shown or
//! logged.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use uuid::Uuid;

use super::html::{back_to_machine, error_page};
use super::request::ApiError;
use super::request::check_reason;
use super::state::{Admin, Operator};
use crate::bmdb::actions::{self, Action, Audit, Outcome};
use crate::bmdb::discovery::Acceptance;
use crate::config::BmcConfig;

/// What an acceptance gives: the machine's BMC (as an inventory host's
/// `bmc`), and the host ID it is listed under.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcceptBody {
    /// `https://host[:port]` (Redfish) or `ipmi://host[:port]`.
    pub bmc_url: String,
    pub bmc_username: String,
    /// Kept in the BMDB for every shepherd sharing it; never shown.
    pub bmc_password: String,
    /// Redfish: the ComputerSystem's `Id` (unset: the BMC's only one).
    pub bmc_system: Option<String>,
    /// `verify` (default), `insecure`, or a CA file's path on shepherd's
    /// host.
    pub bmc_tls: Option<String>,
    /// Its inventory host ID (default: `discovered-` and its MAC's hex).
    pub host_id: Option<String>,
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
    /// Names the request (retried after a lost answer, it acts once).
    pub request_id: Option<Uuid>,
}

impl std::fmt::Debug for AcceptBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcceptBody")
            .field("bmc_url", &self.bmc_url)
            .field("bmc_username", &self.bmc_username)
            .field("host_id", &self.host_id)
            .finish_non_exhaustive()
    }
}

/// The acceptance `b` asks for, checked: Err names the field.
pub fn acceptance(b: &AcceptBody) -> Result<Acceptance, String> {
    let tls = b.bmc_tls.as_deref().unwrap_or("verify");
    let bmc = BmcConfig::accepted(
        &b.bmc_url,
        &b.bmc_username,
        &b.bmc_password,
        b.bmc_system.as_deref(),
        tls,
    )
    .map_err(|(k, m)| format!("bmc_{k}: {m}"))?;
    let host_id = match b.host_id.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(h) => {
            crate::config::inventory::check_id(h).map_err(|e| format!("host_id: {e}"))?;
            Some(h.to_string())
        }
    };
    Ok(Acceptance {
        host_id,
        url: bmc.url.clone(),
        username: bmc.username.clone(),
        password: b.bmc_password.clone(),
        system: bmc.system.clone(),
        tls: bmc.tls.to_stored(),
    })
}

/// Accepts machine `machine` for `operator`: the audit row, or the status
/// and error.
pub async fn accept(
    admin: &Admin,
    operator: &Operator,
    machine: &str,
    body: AcceptBody,
) -> Result<Audit, ApiError> {
    let bad = ApiError::Invalid;
    let machine_id: Uuid = machine
        .parse()
        .map_err(|_| bad("the path's machine ID is not a UUID".into()))?;
    let a = acceptance(&body).map_err(bad)?;
    let mut req = actions::Request::new(machine_id, Action::Accept, operator.0.clone());
    if let Some(r) = body.request_id {
        req.id = r;
    }
    req.reason = check_reason(body.reason).map_err(bad)?;
    req.accept = Some(a);
    match admin
        .bmdb
        .transact(async |tx| actions::act(tx, &req).await)
        .await
    {
        Ok(Outcome::Done(a)) => {
            tracing::info!(%machine_id, actor = %a.actor, detail = %a.detail, "discovered machine accepted");
            Ok(a)
        }
        Ok(Outcome::Refused(why)) => Err(ApiError::Refused(why)),
        Ok(Outcome::NotFound) => Err(ApiError::NotFound(format!(
            "machine {machine_id} is not in the BMDB"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// `POST /api/v1/machines/{id}/accept`.
#[utoipa::path(post, path = "/api/v1/machines/{id}/accept", tag = "machines",
    params(("id" = Uuid, Path, description = "the machine's ID")),
    request_body(content = AcceptBody, content_type = "application/json"),
    responses(
        (status = 200, description = "accepted: the audit row", body = super::api::ActionDone),
        (status = 409, description = "the machine is not discovered (named state), or the host ID is taken", body = super::api::ErrorBody)))]
pub async fn api_accept(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let (parsed, op) = attempt!(super::installs::api_post::<AcceptBody>(&req, &body));
    match accept(&admin, &op, &id, parsed).await {
        Ok(a) => HttpResponse::Ok().json(super::api::ActionDone {
            action: (&a).into(),
        }),
        Err(e) => e.answer(),
    }
}

/// The machine page's acceptance form, as posted.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct AcceptForm {
    csrf: String,
    #[serde(default)]
    bmc_url: String,
    #[serde(default)]
    bmc_username: String,
    #[serde(default)]
    bmc_password: String,
    #[serde(default)]
    bmc_tls: String,
    #[serde(default)]
    host_id: String,
    #[serde(default)]
    reason: String,
}

impl super::auth::Form for AcceptForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// `POST /machines/{id}/accept` from the machine page.
pub(super) async fn accept_form(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
    form: web::Bytes,
) -> HttpResponse {
    let (form, operator, back) = attempt!(super::auth::machine_form::<AcceptForm>(
        &admin, &req, &form, &id
    ));
    let some = |s: String| Some(s).filter(|s| !s.trim().is_empty());
    let body = AcceptBody {
        bmc_url: form.bmc_url,
        bmc_username: form.bmc_username,
        bmc_password: form.bmc_password,
        bmc_system: None,
        bmc_tls: some(form.bmc_tls),
        host_id: some(form.host_id),
        reason: some(form.reason),
        request_id: None,
    };
    match accept(&admin, &operator, &id, body).await {
        Ok(a) => back_to_machine(&req, "accept", a.id, "history"),
        Err(e) => error_page(e.status(), &e.to_string(), &back),
    }
}

/// The machine page's section for a machine that enlisted itself: how,
/// and (while it is `discovered`, for a logged-in operator) the form that
/// accepts it.
pub(super) fn section(
    d: &crate::bmdb::machines::MachineDetail,
    form: Option<(&str, &str)>,
) -> maud::Markup {
    use maud::html;
    let Some(x) = &d.discovery else {
        return html! {};
    };
    // Where its BMC is, if its agent read it in-band: the acceptance's
    // likely URL.
    let in_band = d
        .hardware_report
        .as_deref()
        .and_then(|r| shepherd_proto::summary::summarize(r).ok())
        .and_then(|h| h.bmc_lan)
        .filter(|l| l.ipv4_address != "0.0.0.0");
    let url = in_band
        .as_ref()
        .map(|l| format!("ipmi://{}", l.ipv4_address))
        .unwrap_or_default();
    html! {
        section #discovery {
            h2 { "Enlisted itself" }
            p {
                "Booted the provisioning network from " code { (x.mac) } " (" (x.firmware) ") on "
                (humantime::format_rfc3339_seconds(x.discovered_at)) "; " (x.boots)
                " discovery boot(s), the last on " (humantime::format_rfc3339_seconds(x.last_boot_at)) "."
            }
            @if let Some(l) = &in_band {
                p #discovered-bmc { "Its BMC, as its agent reads it in-band: " (l) "." }
            }
            @match (&x.accepted_at, form) {
                (Some(at), _) => p #accepted {
                    "Accepted by " (x.accepted_by.as_deref().unwrap_or("?")) " on "
                    (humantime::format_rfc3339_seconds(*at)) ": an inventory machine"
                    @match (x.erase_pending, &x.erase_refused) {
                        (true, Some(why)) => { "; its disks are erased once this is resolved: " (why) },
                        (true, None) => "; its disks are erased once its BMC is read and agrees with its agent",
                        (false, _) => "",
                    }
                    "."
                },
                (None, Some((mid, csrf))) => {
                    p { "Nothing is installed on or erased from it until it is accepted with its BMC." }
                    form method="post" action={ (mid) "/accept" } #form-accept {
                        (super::pages::csrf_field(csrf))
                        input type="text" name="bmc_url" placeholder="https://bmc or ipmi://bmc" value=(url) required size="28";
                        " "
                        input type="text" name="bmc_username" placeholder="BMC user" required size="12";
                        " "
                        input type="password" name="bmc_password" placeholder="BMC password" required size="12" autocomplete="off";
                        " "
                        select name="bmc_tls" { option { "verify" } option { "insecure" } }
                        " "
                        input type="text" name="host_id" placeholder="host ID (optional)" size="16";
                        " "
                        input type="text" name="reason" placeholder="reason" maxlength=(crate::bmdb::actions::MAX_REASON) size="20";
                        " "
                        button type="submit" #button-accept { "Accept" }
                    }
                },
                (None, None) => p { "Not accepted yet: nothing is installed on or erased from it until it is." },
            }
        }
    }
}

/// The acceptance's fields, checked, for tests of the form and the CLI.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_field_is_named_and_the_password_is_not_echoed() {
        let mut b = AcceptBody {
            bmc_url: "ftp://bmc".into(),
            bmc_username: "admin".into(),
            bmc_password: "s3cret-pw".into(),
            ..Default::default()
        };
        let e = acceptance(&b).unwrap_err();
        assert!(e.starts_with("bmc_url:"), "{e}");
        b.bmc_url = "ipmi://10.0.0.5".into();
        b.bmc_password = "x".repeat(21);
        let e = acceptance(&b).unwrap_err();
        assert!(e.starts_with("bmc_password:") && !e.contains("xxxx"), "{e}");
        b.bmc_password = "s3cret-pw".into();
        b.host_id = Some("bad\u{7}id".into());
        assert!(acceptance(&b).unwrap_err().starts_with("host_id:"));
        b.host_id = None;
        let a = acceptance(&b).unwrap();
        assert_eq!(a.url, "ipmi://10.0.0.5");
        assert!(!format!("{a:?}").contains("s3cret"));
        assert!(!format!("{b:?}").contains("s3cret"));
    }
}
