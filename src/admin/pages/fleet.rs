//! The fleet page: the brake's banner, the life cycle drawn with its
//! counts, the installations and erasures under way, the activity chart,
//! the sessions, this process's loops, the callback endpoints, the
//! provisioner, the Equinix request budget, and the machines
//! (`machines.rs`) with the rollout form.

use std::time::{Duration, SystemTime};

use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, html};

use super::super::auth;
use super::super::handlers::{ReleaseBody, release_brake, status};
use super::super::html::{REFRESH_SECONDS, error_page, live_page};
use super::super::live::{Progress, UNDER_WAY_SHOWN};
use super::super::request::{Page, Query, internal};
use super::super::rollout_pages::fleet_rollout_form;
use super::super::state::Admin;
use super::super::text::rfc3339;
use super::charts;
use super::machines::{Choices, in_state, machines_section};
use super::parts::{ago, csrf_field, req_operator};
use crate::bmdb::brake::BrakeState;
use crate::bmdb::callback::ServedEndpoint as Endpoint;
use crate::bmdb::duty::Holder;
use crate::bmdb::installations::UnderWay;
use crate::bmdb::machines::{Listing, MachineState};
use crate::bmdb::overview::{self, SessionView};
use crate::status::SupervisorStatus as Status;

/// Machines per page of the fleet.
const PAGE_SIZE: i64 = 100;
/// The chart: buckets of this long…
const CHART_BUCKET: Duration = Duration::from_secs(600);
/// …this many (six hours).
const CHART_BUCKETS: u32 = 36;

/// What the brake's release form's CSRF token is bound to.
const BRAKE_FORM: &str = "recovery-brake";

/// The brake's release, as the fleet page's form posts it.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(in super::super) struct BrakeForm {
    csrf: String,
    #[serde(default)]
    reason: String,
    #[serde(default, rename = "for")]
    for_: String,
}

impl auth::Form for BrakeForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// `POST /brake/release` from the fleet page's banner: checks the origin
/// and the CSRF token, releases, and sends the browser back to the page.
pub(in super::super) async fn brake_form(
    admin: web::Data<Admin>,
    req: HttpRequest,
    form: web::Bytes,
) -> HttpResponse {
    let back = "../".to_string();
    let (form, operator) = attempt!(auth::checked_form::<BrakeForm>(
        &admin, &req, &form, BRAKE_FORM, &back
    ));
    let body = ReleaseBody {
        reason: Some(form.reason),
        for_: Some(form.for_),
        request_id: None,
    };
    match release_brake(&admin, &operator, body).await {
        Ok(_) => HttpResponse::SeeOther()
            .insert_header(("Location", "../#brake"))
            .finish(),
        Err(e) => error_page(e.status(), &e.to_string(), &back),
    }
}

pub(in super::super) async fn fleet_page(
    admin: web::Data<Admin>,
    req: HttpRequest,
    Query(q): Query<Page>,
) -> HttpResponse {
    let filter = attempt!(q.filter(&admin));
    let (limit, offset) = attempt!(q.window(PAGE_SIZE));
    let r = admin
        .bmdb
        .snapshot(async |tx| {
            Ok((
                Listing::read(tx, &filter, (limit, offset), admin.heartbeat_stale_after).await?,
                overview::activity(tx, CHART_BUCKET, CHART_BUCKETS).await?,
                overview::sessions(tx).await?,
                match &admin.judge {
                    Some(j) => Some(crate::bmdb::brake::state(tx, j).await?),
                    None => None,
                },
                crate::bmdb::callback::endpoints(tx).await?,
                crate::bmdb::installations::under_way(tx, UNDER_WAY_SHOWN).await?,
                crate::bmdb::tenants::project_names(tx).await?,
            ))
        })
        .await;
    let (listing, activity, sessions, brake, endpoints, under_way, projects) = match r {
        Ok(v) => v,
        Err(e) => return internal(e),
    };
    let st = status(&admin).await;
    let operator = req_operator(&req);
    let brake_csrf = operator
        .as_ref()
        .map(|o| admin.csrf.token(o, BRAKE_FORM))
        .unwrap_or_default();
    let total: i64 = listing.counts.iter().map(|(_, n)| n).sum();
    let body = html! {
        @if let Some(br) = &brake {
            (brake_banner(&admin, br, &brake_csrf))
        }
        nav {
            a href="#machines" { "machines" }
            a href="#activity" { "activity" }
            a href="#sessions" { "sessions" }
            a href="#loops" { "loops" }
            a href="#provisioner" { "provisioner" }
            a href="#budget" { "Equinix requests" }
            a href="rollouts" { "rollouts" }
            a href="firmware" { "firmware" }
            a href="metrics" { "metrics" }
        }
        div.row {
            section #overview {
                p #total { (total) " machines" }
                p #agents {
                    "agents: " span #heartbeating { (listing.heartbeating) } " heartbeating, "
                    span #silent { (listing.silent) } " silent (no heartbeat within "
                    (humantime::format_duration(admin.heartbeat_stale_after)) ")"
                }
                (charts::life_cycle(&listing.counts, filter.state, &|s| in_state(&q, s)))
                table #counts {
                    tr { th { "state" } th { "machines" } }
                    @for s in MachineState::ALL {
                        @let n = listing.counts.iter().find(|(c, _)| *c == s).map_or(0, |(_, n)| *n);
                        tr data-state=(s) {
                            td { a href=(in_state(&q, s)) { (s) } }
                            td.count { (n) }
                        }
                    }
                }
            }
            (progress_section(&under_way))
            section #activity {
                h2 { "Activity, last " (humantime::format_duration(CHART_BUCKET * CHART_BUCKETS)) }
                (charts::activity(&activity, CHART_BUCKET))
            }
        }
        (sessions_section(&sessions, &st))
        (loops_section(&st.loops))
        (endpoints_section(&endpoints))
        div.row {
            (provisioner_section(&st))
            (budget_section(&admin))
        }
        // The machines go last (they are long); the overview stays on top.
        (machines_section(&q, &filter, &listing, (offset, limit), &Choices {
            projects,
            plans: admin.plans.clone(),
        }))
        (fleet_rollout_form(&admin, operator.as_ref(), &q.filters(), listing.matching))
        p.muted {
            "Rendered " (rfc3339(SystemTime::now())) "; "
            span #live { "kept up to date as it changes (without scripts: reloaded every " (REFRESH_SECONDS) " s)" }
        }
    };
    live_page("shepherd: fleet", body, LIVE_SCRIPT)
}

/// The installations and erasures under way, with the agents' progress
/// (`GET /events` redraws it).
fn progress_section(under: &[UnderWay]) -> Markup {
    html! {
        section #progress {
            h2 { "Installing and erasing now" }
            table {
                thead { tr { th { "machine" } th { "doing" } th { "phase" } th { "progress" } th { "reported" } } }
                tbody {
                    @for u in under {
                        @let p = Progress::from(u);
                        tr data-machine=(p.machine_id) {
                            td { a href={ "machines/" (p.machine_id) } { (p.provider_id.clone().unwrap_or_else(|| p.machine_id.to_string())) } }
                            td { (p.state) }
                            td { (p.phase.as_deref().unwrap_or("not reported yet")) }
                            td {
                                @if let Some(pc) = p.percent {
                                    progress max="100" value=(pc) {} " " (pc) " %"
                                }
                            }
                            td { (p.reported_at.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
            @if under.is_empty() {
                p.muted #progress-none { "none" }
            }
        }
    }
}

/// The fleet page's live updates: `GET /events`' frames redraw the counts
/// (the life cycle's and the table's), the agents and the installations
/// and erasures under way. It writes text only (`textContent`), never
/// markup. The stream is opened once its first frame would be news (the
/// page is fresh as rendered): a headless browser's dump, whose virtual
/// time stands still while a request is open, is not held by it.
const LIVE_SCRIPT: &str = r##"(function () {
  var LIVE_DELAY_MS = 2500;
  if (!window.EventSource) return;
  var live = document.getElementById("live");
  var say = function (t) { if (live) live.textContent = t; };
  var set = function (id, t) { var e = document.getElementById(id); if (e) e.textContent = t; };
  var cell = function (tr, t) { var td = document.createElement("td"); td.textContent = t; tr.appendChild(td); return td; };
  var listen = function () {
  var es = new EventSource("events");
  es.addEventListener("fleet", function (e) {
    var f = JSON.parse(e.data);
    document.querySelectorAll("g.state[data-state]").forEach(function (g) {
      var s = g.getAttribute("data-state"), n = f.counts[s] || 0;
      g.setAttribute("data-count", n);
      g.classList.toggle("empty", n === 0);
      set("count-" + s, n);
    });
    document.querySelectorAll("#counts tr[data-state]").forEach(function (tr) {
      var td = tr.querySelector("td.count");
      if (td) td.textContent = f.counts[tr.getAttribute("data-state")] || 0;
    });
    set("total", f.total + " machines");
    set("heartbeating", f.heartbeating);
    set("silent", f.silent);
    var body = document.querySelector("#progress tbody");
    if (body) {
      body.replaceChildren();
      f.under_way.forEach(function (u) {
        var tr = document.createElement("tr");
        tr.setAttribute("data-machine", u.machine_id);
        var a = document.createElement("a");
        a.href = "machines/" + encodeURIComponent(u.machine_id);
        a.textContent = u.provider_id || u.machine_id;
        cell(tr, "").appendChild(a);
        cell(tr, u.state);
        cell(tr, u.phase || "not reported yet");
        var td = cell(tr, "");
        if (u.percent !== null && u.percent !== undefined) {
          var p = document.createElement("progress");
          p.max = 100;
          p.value = u.percent;
          td.appendChild(p);
          td.appendChild(document.createTextNode(" " + u.percent + " %"));
        }
        cell(tr, u.reported_at || "");
        body.appendChild(tr);
      });
      var none = document.getElementById("progress-none");
      if (none) none.hidden = f.under_way.length > 0;
    }
    say("live: updated " + f.at);
  });
  es.addEventListener("trouble", function (e) { say("live: the fleet could not be read (" + e.data + ")"); });
  es.onerror = function () { say("live: reconnecting"); };
  };
  setTimeout(listen, LIVE_DELAY_MS);
  var all = document.getElementById("check-all");
  if (all) {
    all.hidden = false;
    all.addEventListener("change", function () {
      document.querySelectorAll("#machine-list input[name=machine]").forEach(function (c) { c.checked = all.checked; });
    });
  }
})();"##;

/// The banner while the brake holds (with its release form), or while an
/// operator's release lasts.
fn brake_banner(admin: &Admin, br: &BrakeState, csrf: &str) -> Markup {
    html! {
        @if br.engaged {
            div #brake .error {
                strong { "Recovery brake engaged" }
                @if let Some(t) = br.engaged_since { " since " (rfc3339(t)) }
                ": " (br.reason.as_deref().unwrap_or("")) ". No machine is power-cycled for silence \
                until the silent machines fall back to " (br.limit) " (agents are still restarted over \
                SSH; operators' reboots go ahead)."
                form method="post" action="brake/release" {
                    (csrf_field(csrf))
                    label { "reason " input name="reason" size="30"; }
                    " "
                    label { "for " input name="for" size="6" value=(humantime::format_duration(admin.brake_release)); }
                    " "
                    button type="submit" { "Release the brake" }
                }
            }
        } @else if let Some(until) = br.released_until {
            div #brake .notice {
                "Recovery brake released by " (br.released_by.as_deref().unwrap_or("")) " until "
                (rfc3339(until)) ": power actions for silence go ahead (" (br.silent) " silent, limit "
                (br.limit) ")."
            }
        }
    }
}

fn sessions_section(sessions: &[SessionView], st: &Status) -> Markup {
    html! {
        section #sessions {
            h2 { "Sessions" }
            table #session-list {
                tr { th { "session" } th { "component" } th { "runtime" } th { "since" } th { "leases" } th { "duties" } }
                @for s in sessions {
                    tr data-session=(s.session_id) {
                        td { (s.session_id) @if st.session == Some(s.session_id) { " (this process)" } }
                        td { (s.component) }
                        td { (s.runtime_info) }
                        td { (ago(s.created_at)) }
                        td {
                            @if s.leases.is_empty() { "none" }
                            @for (i, (p, n)) in s.leases.iter().enumerate() {
                                @if i > 0 { ", " }
                                (n) " " (p)
                            }
                        }
                        td { @if s.duties.is_empty() { "none" } @else { (s.duties.join(", ")) } }
                    }
                }
                @if sessions.is_empty() {
                    tr { td colspan="6" { "no session alive" } }
                }
            }
        }
    }
}

/// This process's control loops, each the same way: whether it works,
/// what runs, what ended, the last failure and its cause.
fn loops_section(loops: &[crate::control::LoopStatus]) -> Markup {
    html! {
        section #loops {
            h2 { "Control loops (this process)" }
            table #loop-list {
                tr {
                    th { "loop" } th { "kind" } th { "state" } th { "running" } th { "ok" }
                    th { "failed" } th { "given back" } th { "last failure" }
                }
                @for l in loops {
                    tr data-loop=(l.name) {
                        td { (l.name) }
                        td { (l.kind.as_str()) }
                        td {
                            @match (l.active, l.duty) {
                                (false, _) if l.session.is_none() => "waiting for a session",
                                (false, _) => "draining",
                                (true, Some(Holder::Other(id))) => { "standing by (session " (id) " holds its duty)" },
                                (true, _) => "working",
                            }
                        }
                        td { (l.running) " of " (l.parallelism) }
                        td.count { (l.done) }
                        td.count { (l.failed) }
                        td.count { (l.given_back) }
                        td {
                            @match &l.last_error {
                                Some((at, e)) => { (ago(*at)) ": " (e) },
                                None => "none",
                            }
                        }
                    }
                }
                @if loops.is_empty() {
                    tr { td colspan="8" { "no loop runs in this process" } }
                }
            }
        }
    }
}

/// Agents nobody hears: told an endpoint no shepherd serves.
fn endpoints_section(endpoints: &[Endpoint]) -> Markup {
    let unheard: Vec<&Endpoint> = endpoints
        .iter()
        .filter(|e| !e.served && e.agents > 0)
        .collect();
    html! {
        section #endpoints {
            h2 { "Callback endpoints" }
            table #endpoint-list {
                tr { th { "endpoint" } th { "served" } th { "since" } th { "agents told it" } }
                @for e in endpoints {
                    tr.unserved[!e.served && e.agents > 0] data-endpoint=(e.endpoint) {
                        td { (e.endpoint) }
                        td { @if e.served { "served" } @else { "NOT SERVED" } }
                        td { (ago(if e.served { e.serving_since } else { e.served_until })) }
                        td { (e.agents) }
                    }
                }
            }
            @if !unheard.is_empty() {
                p.error #unserved {
                    @for (i, e) in unheard.iter().enumerate() {
                        @if i > 0 { "; " }
                        (e.agents) " agents call " (e.endpoint)
                    }
                    ", which no shepherd serves: nobody hears them; they are not judged silent, and a \
                    shepherd re-homes them over SSH after recoverer.rehome_after."
                }
            }
        }
    }
}

fn provisioner_section(st: &Status) -> Markup {
    html! {
        section #provisioner {
            h2 { "Provisioner" }
            @match st.loop_named("provisioner") {
                None => p { "This process does not run the Provisioner." },
                Some(p) => {
                    @match (p.duty, p.counters::<crate::provisioner::ProvisionerCounters>()) {
                        (Some(Holder::Other(id)), _) => p {
                            "Session " (id) " holds the provisioning duty: its admin page shows its discrepancies."
                        },
                        (None, _) | (_, None) => p { "No round yet." },
                        (Some(Holder::Us), Some(c)) => {
                            p {
                                (p.done + p.failed) " rounds (" (p.failed) " failed); " (c.created)
                                " machines created, " (c.adopted) " adopted, " (c.managed) " managed."
                            }
                            @if c.missing_in_provider.is_empty() {
                                p #discrepancies {
                                    "No discrepancies: every machine in the BMDB is listed by the provider."
                                }
                            } @else {
                                p { "In the BMDB, no longer listed by the provider (kept, not deleted):" }
                                ul #discrepancies {
                                    @for id in &c.missing_in_provider { li { (id) } }
                                }
                            }
                        },
                    }
                },
            }
        }
    }
}

fn budget_section(admin: &Admin) -> Markup {
    html! {
        section #budget {
            h2 { "Equinix API requests" }
            @match &admin.equinix {
                None => p { "This process does not call the Equinix API." },
                Some(budget) => {
                    @let used = budget.metrics.last_hour();
                    @let cap = budget.per_hour();
                    @let pct = if cap == 0 { 0.0 } else { 100.0 * used.requests as f64 / cap as f64 };
                    @let pct_text = format!("{pct:.1}");
                    p #budget-use {
                        (used.requests) " requests in the last hour, " (pct_text) "% of this process's budget of "
                        (cap) " (one request every " (humantime::format_duration(budget.interval)) " on each of "
                        (budget.parallelism) " slots); " (used.throttled) " answered 429."
                    }
                    svg width="400" height="14" role="img" aria-label={ (pct_text) "% of the budget" } {
                        rect width="400" height="14" fill="#eee" {}
                        rect width=(format!("{:.0}", pct.min(100.0) * 4.0)) height="14"
                            fill=(if pct > 80.0 { "#c33" } else { "#4a8" }) {}
                    }
                },
            }
        }
    }
}
