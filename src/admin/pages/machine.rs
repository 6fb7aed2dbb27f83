//! A machine's page: what it is and where it stands, the operators'
//! buttons, its installation, hardware, BMC, firmware, servicing, leases,
//! backoffs and its timeline (everything that happened to it); and the
//! buttons' form handler.

use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, html};

use super::super::auth;
use super::super::handlers::{ActionBody, load_detail, run_action};
use super::super::html::{back_to_machine, error_page, page};
use super::super::install_pages::machine_section;
use super::super::state::Admin;
use super::super::text::{hex, rfc3339};
use super::parts::{csrf_field, req_operator};
use crate::bmdb::actions::Action;
use crate::bmdb::machines::MachineDetail;

pub(in super::super) async fn machine_page(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
) -> HttpResponse {
    let d = attempt!(load_detail(&admin, &id).await);
    let operator = req_operator(&req);
    let s = &d.summary;
    let mid = s.machine_id.to_string();
    let done = req
        .query_string()
        .split('&')
        .find_map(|kv| kv.strip_prefix("done="))
        .and_then(|done| d.actions.iter().find(|a| a.id.to_string() == done));
    let csrf = operator.as_ref().map(|op| admin.csrf.token(op, &mid));
    let conformance = d.below.as_ref().map(|m| admin.baselines.conformance(m));
    let body = html! {
        @if let Some(a) = done {
            p.notice #done { (a.action) " by " (a.actor) ": " (a.detail) }
        }
        p { a href="../" { "fleet" } }
        (facts(&d))
        (console(&d))
        (super::super::discovery::section(&d, csrf.as_deref().map(|c| (mid.as_str(), c))))
        @if let (Some(op), Some(csrf)) = (&operator, &csrf) {
            (actions(&d, &op.0, &mid, csrf))
        }
        (machine_section(&admin, &d, operator.as_ref()))
        (hardware(&d))
        (super::super::network::machine_section(&d.ports))
        @if let Some(f) = &d.bmc {
            h2 { "BMC" }
            table #bmc {
                @for (k, v) in f.lines() { tr { th { (k) } td { (v) } } }
            }
        }
        (super::super::firmware::machine_section(&d.firmware))
        @if let Some(c) = &conformance {
            (super::super::firmware::baseline_section(c))
        }
        (super::super::servicing::machine_section(
            &admin,
            operator.as_ref(),
            &d,
            conformance.as_ref().and_then(|c| c.baseline()),
        ))
        h2 { "Leases" }
        ul #leases {
            @for l in &d.leases { li { (l.process) " by " (l.component) } }
            @if d.leases.is_empty() { li.muted { "none: no process works on it now" } }
        }
        h2 { "Backoffs" }
        ul #backoffs {
            @if d.backoffs.is_empty() { li.muted { "none" } }
            @for (p, bo) in &d.backoffs { li { (p) " until " (rfc3339(bo.until)) ": " (bo.cause) } }
        }
        (history(&d))
    };
    page(&format!("shepherd: machine {}", s.machine_id), body, true)
}

/// The machine's table: state, provider, agent, boots, hold, requests,
/// the BMC against the agent, tenancy.
fn facts(d: &MachineDetail) -> Markup {
    let s = &d.summary;
    html! {
        table #machine {
            tr { th { "state" } td #state { (s.state) } }
            tr { th { "provider ID" } td { (s.provider_id.as_deref().unwrap_or("-")) } }
            tr { th { "address" } td { (s.address.as_deref().unwrap_or("-")) } }
            tr { th { "created" } td { (rfc3339(d.created_at)) } }
            tr { th { "agent started" } td {
                @match &d.agent_started {
                    Some((t, k)) => { (rfc3339(*t)) " key " (hex(k)) },
                    None => "-",
                }
            } }
            tr { th { "agent heartbeat" } td { @match d.agent_heartbeat { Some(t) => (rfc3339(t)), None => "-" } } }
            tr { th { "SSH host key" } td { (d.ssh_host_key.as_deref().unwrap_or("-")) } }
            tr { th { "boots" } td #boots { (d.boots()) } }
            @if let Some(h) = &d.hold {
                tr.held { th { "held" } td #hold {
                    "by " (h.by) " since " (rfc3339(h.since))
                    @if let Some(r) = &h.reason { ": " (r) }
                } }
            }
            @if let Some((by, at)) = &d.reboot_request {
                tr { th { "reboot" } td #reboot-request { "requested by " (by) " at " (rfc3339(*at)) } }
            }
            @if let Some(c) = &d.hardware_check {
                tr { th { "BMC vs agent" } td #hardware-check {
                    @match (&c.accepted, c.differences.is_empty()) {
                        (_, true) => "they agree",
                        (Some((by, at)), false) => {
                            (c.differences.join("; ")) " (accepted by " (by) " at " (rfc3339(*at)) ")"
                        },
                        (None, false) => {
                            strong { (c.differences.join("; ")) }
                            ": installations wait until an operator accepts it"
                        },
                    }
                } }
            }
            @if let Some(r) = &d.boot_request {
                tr { th { "boot through the BMC" } td #boot-request {
                    (r.cause) " asked by " (r.requested_by) " at " (rfc3339(r.requested_at))
                    @if let Some(x) = &r.reason { ": " (x) }
                } }
            }
            @if let Some(t) = &d.tenancy {
                tr { th { "project" } td #project {
                    @match &t.assigned_to {
                        Some((id, name)) => { (name) " (" (id) ")" },
                        None => "the shared pool",
                    }
                } }
                @if let Some(dev) = &t.device {
                    tr { th { "device" } td #device {
                        (dev.hostname) " (" (dev.id) ") of project " (dev.project.1) ": " (dev.state) " "
                        span.muted { "(reclaim: " code { "shepherd devices reclaim " (dev.id) } ")" }
                    } }
                }
            }
        }
    }
}

/// What its serial console printed during the last boots shepherd made
/// through its BMC: the newest in full view (its last lines), the others
/// folded.
fn console(d: &MachineDetail) -> Markup {
    html! {
        @if !d.consoles.is_empty() || !d.console_sessions.is_empty() {
            section #console {
                h2 { "Console" }
                @for (i, c) in d.consoles.iter().enumerate() {
                    @let text = crate::console::text(&c.tail);
                    @let lines = crate::console::last_lines(&text, 40);
                    details.console open[i == 0] data-capture=(c.capture_id) {
                        summary {
                            (c.cause) " boot, " (rfc3339(c.started_at))
                            @match c.ended_at {
                                Some(t) => { " to " (rfc3339(t)) },
                                None => " (being read)",
                            }
                            ": " (c.bytes_seen) " bytes, read with " (c.source)
                        }
                        @if let Some(e) = &c.error {
                            p.error.console-error { "the console could not be read: " (e) }
                        }
                        @if lines.is_empty() {
                            p.muted { "it printed nothing" }
                        } @else {
                            pre.console-tail { (lines.join("\n")) }
                            p { a.console-download href={ (d.summary.machine_id) "/console/" (c.capture_id) } download {
                                "download all it kept (" (c.tail.len()) " bytes)"
                            } }
                        }
                    }
                }
                @if !d.console_sessions.is_empty() {
                    (console_sessions(d))
                }
            }
        }
    }
}

/// `GET /machines/{id}/console/{capture}`: what a boot's console kept,
/// whole, as text (terminal escapes removed), to download.
pub(in super::super) async fn console_download(
    admin: web::Data<Admin>,
    path: web::Path<(String, String)>,
) -> HttpResponse {
    let (id, capture) = path.into_inner();
    let not_found = || {
        error_page(
            actix_web::http::StatusCode::NOT_FOUND,
            &format!("machine {id} has no console capture {capture} (only its last ones are kept)"),
            "../",
        )
    };
    let Ok(machine) = id.parse() else {
        return super::super::request::bad_request("the path's machine ID is not a UUID".into());
    };
    let Ok(capture_id) = capture.parse() else {
        return not_found();
    };
    let c = match admin
        .bmdb
        .snapshot(async |tx| crate::bmdb::console::capture(tx, machine, capture_id).await)
        .await
    {
        Ok(Some(c)) => c,
        Ok(None) => return not_found(),
        Err(e) => return super::super::request::internal(e),
    };
    HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .insert_header((
            "Content-Disposition",
            format!("attachment; filename=\"console-{id}-{}.txt\"", c.capture_id),
        ))
        .body(crate::console::text(&c.tail))
}

/// Who was on the console over shepherd's SSH (the audit).
fn console_sessions(d: &MachineDetail) -> Markup {
    html! {
        table #console-sessions {
            caption { "On its console over SSH" }
            tr { th { "who" } th { "from" } th { "when" } th { "keyboard" } th { "typed" } th { "shown" } th { "ended" } }
            @for s in &d.console_sessions {
                tr data-session=(s.session_id) {
                    td { (s.who) br; small.muted { (s.key_fingerprint) } }
                    td { (s.peer.as_deref().unwrap_or("")) }
                    td { (rfc3339(s.started_at)) }
                    td { @if s.wrote { "held" } @else { "read only" } }
                    td { (s.bytes_typed) " bytes" }
                    td { (s.bytes_shown) " bytes" }
                    td {
                        @match (s.ended_at, &s.end_reason) {
                            (Some(t), r) => { (rfc3339(t)) ": " (r.as_deref().unwrap_or("")) },
                            (None, _) => "on it now",
                        }
                    }
                }
            }
        }
    }
}

/// The buttons: one form per action the machine's state and records
/// allow, each with its CSRF token and a reason.
fn actions(d: &MachineDetail, operator: &str, mid: &str, csrf: &str) -> Markup {
    let allowed: Vec<&str> = crate::bmdb::lifecycle::Operation::ALL
        .iter()
        .filter(|o| o.allows(d.summary.state))
        .map(|o| o.as_str())
        .collect();
    let shown = Action::ACTIONS.iter().copied().filter(|&action| {
        let available = match action {
            Action::Install | Action::Deprovision | Action::Accept | Action::Service => false,
            Action::Retry => !d.backoffs.is_empty(),
            Action::Hold => d.hold.is_none(),
            Action::Release => d.hold.is_some(),
            Action::Reboot => d.hold.is_none() && d.reboot_request.is_none(),
            Action::Retakeover => true,
            Action::AcceptHardware => d.hardware_check.as_ref().is_some_and(|c| c.blocks()),
            Action::Inspect => {
                d.hold.is_none()
                    && d.bmc_boot
                    && d.boot_request
                        .as_ref()
                        .is_none_or(|r| r.cause != crate::bmdb::bmc_boot::BootCause::Inspect)
            }
        };
        available && action.allows(d.summary.state)
    });
    html! {
        section.actions #actions {
            h2 { "Actions" }
            p.muted { "As " (operator) "; each is recorded with its reason." }
            p #allowed {
                "In state " b { (d.summary.state) } ", the life cycle allows: "
                @if allowed.is_empty() { "nothing" } @else { (allowed.join(", ")) } "."
            }
            @for action in shown {
                form method="post" action={ (mid) "/" (action.as_str()) } id={ "form-" (action.as_str()) } {
                    (csrf_field(csrf))
                    @if action == Action::Retry {
                        select name="process" {
                            option value="" { "every process" }
                            @for (p, _) in &d.backoffs { option { (p) } }
                        }
                        " "
                    }
                    @if action == Action::Retakeover {
                        label { input type="checkbox" name="forget_host_key" value="true"; " forget the SSH host key" }
                        " "
                    }
                    input type="text" name="reason" placeholder="reason"
                        maxlength=(crate::bmdb::actions::MAX_REASON) size="24";
                    " "
                    button type="submit" id={ "button-" (action.as_str()) } { (action.label()) }
                }
            }
        }
    }
}

fn hardware(d: &MachineDetail) -> Markup {
    let summary = d
        .hardware_report
        .as_deref()
        .map(shepherd_proto::summary::summarize);
    html! {
        h2 { "Hardware" }
        @match summary {
            None => p #hardware { "no report yet" },
            Some(Err(e)) => p #hardware { (e) },
            Some(Ok(h)) => table #hardware {
                tr { th { "system" } td { (h.manufacturer) " " (h.product) " (serial " (h.serial_number) ")" } }
                tr { th { "memory" } td { (shepherd_proto::summary::bytes(h.memory_bytes)) } }
                tr { th { "EFI" } td { (h.efi) } }
                @if let Some(sb) = &h.secure_boot { tr { th { "Secure Boot" } td #secure-boot { (sb) } } }
                @if let Some(l) = &h.bmc_lan { tr { th { "BMC" } td #bmc-lan { (l) } } }
                @for c in &h.cpus {
                    tr { th { "CPU" } td { (c.vendor) " " (c.model) ": " (c.cores) " cores, " (c.threads) " threads" } }
                }
                @for x in &h.disks {
                    tr { th { "disk" } td { (x.protocol) " " (x.model) " " (shepherd_proto::summary::bytes(x.capacity_bytes)) } }
                }
                @for n in &h.nics {
                    tr { th { "NIC" } td {
                        (n.mac) " " (n.driver) " link " @if n.link_up { "up" } @else { "down" }
                        @if let Some(l) = &n.lldp { ", on " (l) " (LLDP)" }
                    } }
                }
            },
        }
    }
}

/// The machine's timeline: its work, the operators' actions, its
/// installations and erasures, servicings, power cycles, console captures
/// and connections, newest first.
fn history(d: &MachineDetail) -> Markup {
    html! {
        h2 { "Timeline" }
        table #history {
            tr { th { "time" } th { "what" } th { "cause or detail" } }
            @for m in &d.timeline {
                tr class={ "event " (m.kind.as_str()) @if m.failed { " failed" } } {
                    td { (rfc3339(m.at)) }
                    td { (m.what) }
                    td { (m.detail.as_deref().unwrap_or("")) }
                }
            }
            @if d.timeline.is_empty() {
                tr { td.muted colspan="3" { "nothing yet" } }
            }
        }
    }
}

/// A button's form, as posted.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(in super::super) struct ActionForm {
    csrf: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    process: String,
    #[serde(default)]
    forget_host_key: Option<String>,
}

impl auth::Form for ActionForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// `POST /machines/{id}/{action}` from the machine page's buttons: checks
/// the origin and the CSRF token, acts, and sends the browser back to the
/// machine page with the audit entry shown.
pub(in super::super) async fn form_action(
    admin: web::Data<Admin>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    form: web::Bytes,
) -> HttpResponse {
    let (id, action) = path.into_inner();
    let (form, operator, back) =
        attempt!(auth::machine_form::<ActionForm>(&admin, &req, &form, &id));
    let body = ActionBody {
        reason: Some(form.reason),
        process: Some(form.process),
        forget_host_key: form
            .forget_host_key
            .is_some_and(|v| v == "true" || v == "on"),
        request_id: None,
    };
    match run_action(&admin, &operator, &id, &action, body).await {
        // Back to the machine page, wherever the routes are mounted.
        Ok(a) => back_to_machine(&req, &action, a.id, "history"),
        Err(e) => error_page(e.status(), &e.to_string(), &back),
    }
}
