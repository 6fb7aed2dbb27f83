//! Bulk actions from the fleet page: the checked machines and the action
//! come to a page that lists them and asks to confirm (`GET /bulk`); the
//! confirmation (`POST /bulk`, with its CSRF token and a reason) runs the
//! action on each machine as its own button would, audited one by one,
//! and shows what each did or why it was refused.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::html;
use uuid::Uuid;

use super::super::auth;
use super::super::handlers::{ActionBody, run_action};
use super::super::html::{error_page, page};
use super::super::request::internal;
use super::super::state::Admin;
use super::parts::{csrf_field, req_operator};
use crate::bmdb::actions::Action;
use crate::bmdb::machines;

/// Machines one bulk action takes at most.
pub const MAX_MACHINES: usize = 1000;

/// What the confirmation's CSRF token is bound to.
const BULK_FORM: &str = "bulk";

/// The action and the machines, from the fleet page's form (the checked
/// boxes: `machine=ID`, repeated) or the confirmation's (`machines`, the
/// IDs separated by spaces).
fn selection<'a>(
    pairs: impl Iterator<Item = (std::borrow::Cow<'a, str>, std::borrow::Cow<'a, str>)>,
) -> Result<(Action, Vec<Uuid>), String> {
    let (mut action, mut ids) = (None, Vec::new());
    for (k, v) in pairs {
        match k.as_ref() {
            "action" => action = Some(v.into_owned()),
            "machine" | "machines" => {
                for id in v.split_whitespace() {
                    let id: Uuid = id
                        .parse()
                        .map_err(|_| format!("machine: {id:?} is not a machine ID"))?;
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
            }
            _ => {}
        }
    }
    let action = action.ok_or("action: missing")?;
    let action = Action::parse_action(&action).ok_or_else(|| {
        let all: Vec<&str> = Action::ACTIONS.iter().map(|a| a.as_str()).collect();
        format!("action: {action:?} is not one of {}", all.join(", "))
    })?;
    if ids.is_empty() {
        return Err("no machine is checked: check the machines to act on first".into());
    }
    if ids.len() > MAX_MACHINES {
        return Err(format!(
            "{} machines are checked; one bulk action takes {MAX_MACHINES} at most",
            ids.len()
        ));
    }
    Ok((action, ids))
}

/// `GET /bulk?action=…&machine=…`: the machines listed, with the form that
/// confirms.
pub(in super::super) async fn bulk_page(admin: web::Data<Admin>, req: HttpRequest) -> HttpResponse {
    let back = "./";
    let (action, ids) = match selection(form_urlencoded::parse(req.query_string().as_bytes())) {
        Ok(s) => s,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e, back),
    };
    let Some(operator) = req_operator(&req) else {
        return error_page(StatusCode::UNAUTHORIZED, "log in first", back);
    };
    let found = match admin
        .bmdb
        .snapshot(async |tx| machines::summaries(tx, &ids).await)
        .await
    {
        Ok(f) => f,
        Err(e) => return internal(e),
    };
    let missing: Vec<&Uuid> = ids
        .iter()
        .filter(|id| !found.iter().any(|m| m.machine_id == **id))
        .collect();
    let listed: Vec<String> = found.iter().map(|m| m.machine_id.to_string()).collect();
    let body = html! {
        p #bulk-what {
            strong { (action.label()) } ": " span #bulk-count { (found.len()) } " machines, each as its own \
            button would, audited with the reason below. Machines where it does not apply are refused \
            one by one (their reason is shown); the others go ahead."
        }
        @if !missing.is_empty() {
            p.error #bulk-missing {
                "Not in the BMDB (left out): "
                @for (i, id) in missing.iter().enumerate() { @if i > 0 { ", " } (id) }
            }
        }
        table #bulk-machines {
            tr { th { "machine" } th { "provider ID" } th { "state" } }
            @for m in &found {
                tr.machine data-machine=(m.machine_id) {
                    td { a href={ "machines/" (m.machine_id) } { (m.machine_id) } }
                    td { (m.provider_id.as_deref().unwrap_or("-")) }
                    td.state { (m.state) }
                }
            }
        }
        @if !found.is_empty() {
            form #form-bulk method="post" action="bulk" {
                (csrf_field(&admin.csrf.token(&operator, BULK_FORM)))
                input type="hidden" name="action" value=(action.as_str());
                input type="hidden" name="machines" value=(listed.join(" "));
                label { "reason " input name="reason" size="40" maxlength=(crate::bmdb::actions::MAX_REASON); }
                " "
                button type="submit" #button-confirm {
                    "Confirm: " (action.label()) " " (found.len()) " machines"
                }
            }
        }
        p { a href="./" #bulk-cancel { "cancel, back to the fleet" } }
    };
    page(
        &format!("shepherd: {} machines?", action.label()),
        body,
        false,
    )
}

/// The confirmation, as posted.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(in super::super) struct BulkForm {
    csrf: String,
    action: String,
    machines: String,
    #[serde(default)]
    reason: String,
}

impl auth::Form for BulkForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// `POST /bulk`: the action on each machine; a page saying what each did.
pub(in super::super) async fn bulk_form(
    admin: web::Data<Admin>,
    req: HttpRequest,
    form: web::Bytes,
) -> HttpResponse {
    let back = "./";
    let (form, operator) = attempt!(auth::checked_form::<BulkForm>(
        &admin, &req, &form, BULK_FORM, back
    ));
    let pairs = [
        ("action".into(), form.action.as_str().into()),
        ("machines".into(), form.machines.as_str().into()),
    ];
    let (action, ids) = match selection(pairs.into_iter()) {
        Ok(s) => s,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e, back),
    };
    let mut outcomes = Vec::with_capacity(ids.len());
    for id in &ids {
        let body = ActionBody {
            reason: Some(form.reason.clone()),
            ..Default::default()
        };
        let id = id.to_string();
        let r = run_action(&admin, &operator, &id, action.as_str(), body).await;
        outcomes.push((id, r));
    }
    let done = outcomes.iter().filter(|(_, r)| r.is_ok()).count();
    tracing::info!(action = %action, actor = %operator.0, machines = ids.len(), done, "bulk action");
    let body = html! {
        p #bulk-done {
            (action.label()) ": done on " span #bulk-done-count { (done) } " of " (ids.len()) " machines."
        }
        table #bulk-outcomes {
            tr { th { "machine" } th { "outcome" } }
            @for (id, r) in &outcomes {
                @match r {
                    Ok(a) => tr.done data-machine=(id) {
                        td { a href={ "machines/" (id) } { (id) } }
                        td { "done: " (a.detail) }
                    },
                    Err(e) => tr.refused data-machine=(id) {
                        td { a href={ "machines/" (id) } { (id) } }
                        td.error { "not done: " (e) }
                    },
                }
            }
        }
        p { a href="./" #bulk-back { "back to the fleet" } }
    };
    page(&format!("shepherd: {}", action.label()), body, false)
}
