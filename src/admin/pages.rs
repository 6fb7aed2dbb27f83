//! The server-rendered pages: the fleet (filters, search, paging, a chart of
//! the last hours, sessions, duties, the provisioner's discrepancies, the
//! Equinix request budget) and a page per machine with its history, its
//! audit and the operators' buttons. Plain HTML and SVG: no JavaScript.
//!
//! Long on purpose: HTML written out for the fleet page and the
//! machine page, each section beside the query it shows.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};

use super::auth;
use super::handlers::{
    ActionBody, Listing, ReleaseBody, load_detail, release_brake, run_action, status,
};
use super::html::{REFRESH_SECONDS, back_to_machine, error_page, esc, page};
use super::install_pages::{fleet_rollout_form, machine_section};
use super::request::{Page, Query, internal};
use super::state::{Admin, Operator};
use super::text::{hex, rfc3339};
use crate::bmdb::ProviderStatus;
use crate::bmdb::actions::Action;
use crate::bmdb::duty::Holder;
use crate::bmdb::machines::{self, Heartbeat, MachineState};
use crate::bmdb::overview::{self, Activity};

/// Machines per page of the fleet.
const PAGE_SIZE: i64 = 100;
/// The chart: buckets of this long…
const CHART_BUCKET: Duration = Duration::from_secs(600);
/// …this many (six hours).
const CHART_BUCKETS: u32 = 36;

/// This process's control loops, each the same way: whether it works,
/// what runs, what ended, the last failure and its cause.
fn loops_section(loops: &[crate::control::LoopStatus]) -> String {
    let mut b = String::from(
        "<section id=\"loops\"><h2>Control loops (this process)</h2><table id=\"loop-list\">\
         <tr><th>loop</th><th>kind</th><th>state</th><th>running</th><th>ok</th><th>failed</th>\
         <th>given back</th><th>last failure</th></tr>",
    );
    for l in loops {
        let state = match (l.active, l.duty) {
            (false, _) if l.session.is_none() => "waiting for a session".to_string(),
            (false, _) => "draining".to_string(),
            (true, Some(Holder::Other(id))) => format!("standing by (session {id} holds its duty)"),
            (true, _) => "working".to_string(),
        };
        let _ = write!(
            b,
            "<tr data-loop=\"{name}\"><td>{name}</td><td>{kind}</td><td>{state}</td><td>{run} of {par}</td>\
             <td class=\"count\">{ok}</td><td class=\"count\">{failed}</td><td class=\"count\">{back}</td><td>{last}</td></tr>",
            name = esc(l.name),
            kind = l.kind.as_str(),
            state = esc(&state),
            run = l.running,
            par = l.parallelism,
            ok = l.done,
            failed = l.failed,
            back = l.given_back,
            last = match &l.last_error {
                Some((at, e)) => format!("{}: {}", ago(*at), esc(e)),
                None => "none".into(),
            },
        );
    }
    if loops.is_empty() {
        b.push_str("<tr><td colspan=\"8\">no loop runs in this process</td></tr>");
    }
    b.push_str("</table></section>");
    b
}

fn ago(t: SystemTime) -> String {
    match SystemTime::now().duration_since(t) {
        Ok(d) => format!(
            "{} ago",
            humantime::format_duration(Duration::from_secs(d.as_secs()))
        ),
        Err(_) => "just now".into(),
    }
}

fn option<T: PartialEq + Copy>(value: T, label: &str, selected: Option<T>) -> String {
    format!(
        "<option value=\"{l}\"{s}>{l}</option>",
        l = esc(label),
        s = if selected == Some(value) {
            " selected"
        } else {
            ""
        }
    )
}

/// The query string of a fleet page with `offset` (its filters and page
/// size kept).
fn page_query(q: &Page, offset: i64) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in [
        ("state", &q.state),
        ("provider_status", &q.provider_status),
        ("heartbeat", &q.heartbeat),
        ("q", &q.q),
    ] {
        if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
            s.append_pair(k, v);
        }
    }
    if let Some(limit) = q.limit {
        s.append_pair("limit", &limit.to_string());
    }
    if offset > 0 {
        s.append_pair("offset", &offset.to_string());
    }
    format!("?{}", s.finish())
}

/// What the brake's release form's CSRF token is bound to.
const BRAKE_FORM: &str = "recovery-brake";

fn req_operator(req: &HttpRequest) -> Option<Operator> {
    req.extensions().get::<Operator>().cloned()
}

/// The brake's release, as the fleet page's form posts it.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BrakeForm {
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

impl auth::Form for ActionForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// `POST /brake/release` from the fleet page's banner: checks the origin
/// and the CSRF token, releases, and sends the browser back to the page.
pub(super) async fn brake_form(
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

pub(super) async fn fleet_page(
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
                Listing::read(tx, &admin, &filter, (limit, offset)).await?,
                overview::activity(tx, CHART_BUCKET, CHART_BUCKETS).await?,
                overview::sessions(tx).await?,
                match &admin.judge {
                    Some(j) => Some(crate::bmdb::brake::state(tx, j).await?),
                    None => None,
                },
                crate::bmdb::callback::endpoints(tx).await?,
                crate::bmdb::firmware::versions(tx).await?,
            ))
        })
        .await;
    let (listing, activity, sessions, brake, endpoints, firmware) = match r {
        Ok(v) => v,
        Err(e) => return internal(e),
    };
    let Listing {
        machines: list,
        tenants,
        matching,
        counts,
        heartbeating,
        silent,
    } = listing;
    let st = status(&admin).await;
    let total: i64 = counts.iter().map(|(_, n)| n).sum();
    let mut b = String::new();
    if let Some(br) = brake.as_ref().filter(|br| br.engaged) {
        let operator = req_operator(&req);
        let _ = write!(
            b,
            "<div id=\"brake\" class=\"error\"><strong>Recovery brake engaged</strong>{since}: {reason}. \
             No machine is power-cycled for silence until the silent machines fall back to {limit} \
             (agents are still restarted over SSH; operators' reboots go ahead).\
             <form method=\"post\" action=\"brake/release\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <label>reason <input name=\"reason\" size=\"30\"></label> \
             <label>for <input name=\"for\" size=\"6\" value=\"{dflt}\"></label> \
             <button type=\"submit\">Release the brake</button></form></div>",
            since = br
                .engaged_since
                .map(|t| format!(" since {}", rfc3339(t)))
                .unwrap_or_default(),
            reason = esc(br.reason.as_deref().unwrap_or("")),
            limit = br.limit,
            csrf = operator
                .map(|o| admin.csrf.token(&o, BRAKE_FORM))
                .unwrap_or_default(),
            dflt = humantime::format_duration(admin.brake_release),
        );
    } else if let Some(br) = brake.as_ref().filter(|br| br.released_until.is_some()) {
        let _ = write!(
            b,
            "<div id=\"brake\" class=\"notice\">Recovery brake released by {} until {}: power actions for silence go ahead ({} silent, limit {}).</div>",
            esc(br.released_by.as_deref().unwrap_or("")),
            br.released_until.map(rfc3339).unwrap_or_default(),
            br.silent,
            br.limit
        );
    }
    let _ = write!(
        b,
        "<nav><a href=\"#machines\">machines</a><a href=\"#activity\">activity</a>\
         <a href=\"#sessions\">sessions</a><a href=\"#loops\">loops</a><a href=\"#provisioner\">provisioner</a>\
         <a href=\"#budget\">Equinix requests</a><a href=\"rollouts\">rollouts</a>\
         <a href=\"metrics\">metrics</a></nav>\
         <div class=\"row\"><div><p id=\"total\">{total} machines</p>\
         <p id=\"agents\">agents: <span id=\"heartbeating\">{heartbeating}</span> heartbeating, \
         <span id=\"silent\">{silent}</span> silent (no heartbeat within {})</p>\
         <table id=\"counts\"><tr><th>state</th><th>machines</th></tr>",
        humantime::format_duration(admin.heartbeat_stale_after)
    );
    for s in MachineState::ALL {
        let n = counts
            .iter()
            .find(|(c, _)| *c == s)
            .map(|(_, n)| *n)
            .unwrap_or(0);
        let _ = write!(
            b,
            "<tr data-state=\"{s}\"><td><a href=\"?state={s}\">{s}</a></td><td class=\"count\">{n}</td></tr>"
        );
    }
    b.push_str("</table></div>");
    let _ = write!(
        b,
        "<section id=\"activity\"><h2>Activity, last {}</h2>{}</section></div>",
        humantime::format_duration(CHART_BUCKET * CHART_BUCKETS),
        chart(&activity)
    );

    // The machines go last (they are long); the overview stays on top.
    let machines_html = machines_section(&q, &filter, &list, &tenants, matching, offset, limit)
        + &fleet_rollout_form(
            &admin,
            req_operator(&req).as_ref(),
            &[
                ("state", q.state.as_deref()),
                ("provider_status", q.provider_status.as_deref()),
                ("heartbeat", q.heartbeat.as_deref()),
                ("q", q.q.as_deref()),
            ],
            matching,
        );

    b.push_str(
        "<section id=\"sessions\"><h2>Sessions</h2><table id=\"session-list\"><tr><th>session</th>\
         <th>component</th><th>runtime</th><th>since</th><th>leases</th><th>duties</th></tr>",
    );
    for s in &sessions {
        let leases: Vec<String> = s.leases.iter().map(|(p, n)| format!("{n} {p}")).collect();
        let _ = write!(
            b,
            "<tr data-session=\"{id}\"><td>{id}{me}</td><td>{c}</td><td>{ri}</td><td>{since}</td><td>{l}</td><td>{d}</td></tr>",
            id = s.session_id,
            me = if st.session == Some(s.session_id) {
                " (this process)"
            } else {
                ""
            },
            c = esc(&s.component),
            ri = esc(&s.runtime_info),
            since = ago(s.created_at),
            l = if leases.is_empty() {
                "none".into()
            } else {
                leases.join(", ")
            },
            d = if s.duties.is_empty() {
                "none".into()
            } else {
                esc(&s.duties.join(", "))
            },
        );
    }
    if sessions.is_empty() {
        b.push_str("<tr><td colspan=\"6\">no session alive</td></tr>");
    }
    b.push_str("</table></section>");
    b.push_str(&loops_section(&st.loops));

    // Agents nobody hears: told an endpoint no shepherd serves.
    b.push_str(
        "<section id=\"endpoints\"><h2>Callback endpoints</h2><table id=\"endpoint-list\">\
         <tr><th>endpoint</th><th>served</th><th>since</th><th>agents told it</th></tr>",
    );
    for e in &endpoints {
        let _ = write!(
            b,
            "<tr class=\"{class}\" data-endpoint=\"{ep}\"><td>{ep}</td><td>{served}</td><td>{since}</td><td>{n}</td></tr>",
            class = if e.served || e.agents == 0 {
                ""
            } else {
                "unserved"
            },
            ep = esc(&e.endpoint),
            served = if e.served { "served" } else { "NOT SERVED" },
            since = if e.served {
                ago(e.serving_since)
            } else {
                ago(e.served_until)
            },
            n = e.agents,
        );
    }
    b.push_str("</table>");
    let unheard: Vec<String> = endpoints
        .iter()
        .filter(|e| !e.served && e.agents > 0)
        .map(|e| format!("{} agents call {}", e.agents, esc(&e.endpoint)))
        .collect();
    if !unheard.is_empty() {
        let _ = write!(
            b,
            "<p class=\"error\" id=\"unserved\">{}, which no shepherd serves: nobody hears them; \
             they are not judged silent, and a shepherd re-homes them over SSH after recoverer.rehome_after.</p>",
            unheard.join("; ")
        );
    }
    b.push_str("</section>");
    b.push_str(&super::firmware::fleet_section(&firmware));

    b.push_str("<div class=\"row\"><section id=\"provisioner\"><h2>Provisioner</h2>");
    match st.loop_named("provisioner") {
        None => b.push_str("<p>This process does not run the Provisioner.</p>"),
        Some(p) => match (
            p.duty,
            p.counters::<crate::provisioner::ProvisionerCounters>(),
        ) {
            (Some(Holder::Other(id)), _) => {
                let _ = write!(
                    b,
                    "<p>Session {id} holds the provisioning duty: its admin page shows its discrepancies.</p>"
                );
            }
            (None, _) | (_, None) => b.push_str("<p>No round yet.</p>"),
            (Some(Holder::Us), Some(c)) => {
                let _ = write!(
                    b,
                    "<p>{} rounds ({} failed); {} machines created, {} adopted, {} managed.</p>",
                    p.done + p.failed,
                    p.failed,
                    c.created,
                    c.adopted,
                    c.managed
                );
                if c.missing_in_provider.is_empty() {
                    b.push_str("<p id=\"discrepancies\">No discrepancies: every machine in the BMDB is listed by the provider.</p>");
                } else {
                    let _ = write!(
                        b,
                        "<p>In the BMDB, no longer listed by the provider (kept, not deleted):</p><ul id=\"discrepancies\">"
                    );
                    for id in &c.missing_in_provider {
                        let _ = write!(b, "<li>{}</li>", esc(id));
                    }
                    b.push_str("</ul>");
                }
            }
        },
    }
    b.push_str("</section><section id=\"budget\"><h2>Equinix API requests</h2>");
    match &admin.equinix {
        None => b.push_str("<p>This process does not call the Equinix API.</p>"),
        Some(budget) => {
            let used = budget.metrics.last_hour();
            let cap = budget.per_hour();
            let pct = if cap == 0 {
                0.0
            } else {
                100.0 * used.requests as f64 / cap as f64
            };
            let _ = write!(
                b,
                "<p id=\"budget-use\">{} requests in the last hour, {pct:.1}% of this process's budget of {cap} \
                 (one request every {} on each of {} slots); {} answered 429.</p>\
                 <svg width=\"400\" height=\"14\" role=\"img\" aria-label=\"{pct:.1}% of the budget\">\
                 <rect width=\"400\" height=\"14\" fill=\"#eee\"/><rect width=\"{:.0}\" height=\"14\" fill=\"{}\"/></svg>",
                used.requests,
                humantime::format_duration(budget.interval),
                budget.parallelism,
                used.throttled,
                (pct.min(100.0) * 4.0),
                if pct > 80.0 { "#c33" } else { "#4a8" },
            );
        }
    }
    let _ = write!(
        b,
        "</section></div>{machines_html}<p class=\"muted\">Rendered {}; reloads every {REFRESH_SECONDS} s.</p>",
        rfc3339(SystemTime::now())
    );
    page("shepherd: fleet", &b, true)
}

/// The fleet page's machines: the filter form, paging and the table.
fn machines_section(
    q: &Page,
    filter: &machines::FleetFilter,
    list: &[machines::MachineSummary],
    tenants: &machines::Tenants,
    matching: i64,
    offset: i64,
    limit: i64,
) -> String {
    let mut b = String::new();
    // Filters: a plain GET form.
    b.push_str("<section id=\"machines\"><h2>Machines</h2><form class=\"filters\" method=\"get\" action=\"\">");
    b.push_str("<label>state <select name=\"state\"><option value=\"\">any</option>");
    for s in MachineState::ALL {
        b.push_str(&option(s, s.as_str(), filter.state));
    }
    b.push_str("</select></label><label>provider status <select name=\"provider_status\"><option value=\"\">any</option>");
    for s in ProviderStatus::ALL {
        b.push_str(&option(s, &s.to_string(), filter.provider_status));
    }
    b.push_str("</select></label><label>heartbeat <select name=\"heartbeat\"><option value=\"\">any</option>");
    for h in Heartbeat::ALL {
        b.push_str(&option(h, h.as_str(), filter.heartbeat));
    }
    let _ = write!(
        b,
        "</select></label><label>search <input type=\"search\" name=\"q\" value=\"{}\" \
         placeholder=\"machine ID, provider ID, address\" size=\"32\"></label>\
         <button type=\"submit\">Show</button> <a href=\"./\">clear</a></form>",
        esc(q.q.as_deref().unwrap_or(""))
    );
    let shown_to = offset + list.len() as i64;
    if list.is_empty() {
        let _ = write!(
            b,
            "<p id=\"matching\">no machines match{}</p>",
            if offset > 0 { " on this page" } else { "" }
        );
    } else {
        let _ = write!(
            b,
            "<p id=\"matching\"><span id=\"match-count\">{matching}</span> matching; showing {} to {shown_to}</p>",
            offset + 1
        );
    }
    b.push_str("<p class=\"paging\">");
    if offset > 0 {
        let _ = write!(
            b,
            "<a rel=\"prev\" href=\"{}\">previous</a> ",
            esc(&page_query(q, (offset - limit).max(0)))
        );
    }
    if shown_to < matching {
        let _ = write!(
            b,
            "<a rel=\"next\" href=\"{}\">next</a>",
            esc(&page_query(q, shown_to))
        );
    }
    b.push_str(
        "</p><table id=\"machine-list\"><tr><th>machine</th><th>provider ID</th><th>address</th>\
         <th>provider status</th><th>state</th><th>last heartbeat</th><th>tenant</th></tr>",
    );
    for m in list {
        let _ = write!(
            b,
            "<tr class=\"machine{held}\" data-machine=\"{id}\"><td><a href=\"machines/{id}\">{id}</a></td>\
             <td>{pid}</td><td>{addr}</td><td>{ps}</td><td class=\"state\">{st}</td><td>{hb}</td>\
             <td class=\"tenant\">{tenant}</td></tr>",
            held = if m.state == MachineState::Held {
                " held"
            } else {
                ""
            },
            id = m.machine_id,
            pid = esc(m.provider_id.as_deref().unwrap_or("-")),
            addr = esc(m.address.as_deref().unwrap_or("-")),
            ps = m
                .provider_status
                .map(|s| s.to_string())
                .unwrap_or_else(|| "-".into()),
            st = m.state,
            hb = m.agent_heartbeat.map(ago).unwrap_or_else(|| "-".into()),
            tenant = match tenants.get(&m.machine_id) {
                None => "-".to_string(),
                Some(t) => {
                    let p = esc(t.project.as_deref().unwrap_or("shared pool"));
                    match &t.device {
                        Some((_, host)) => format!("{p}: {}", esc(host)),
                        None => p,
                    }
                }
            },
        );
    }
    b.push_str("</table></section>");
    b
}

/// Takeovers, failures and recoveries per bucket, as SVG: one row of bars
/// per series, each on its own scale (forty recoveries stay visible beside
/// two thousand takeovers), with hour marks below.
fn chart(activity: &[Activity]) -> String {
    const W: f64 = 640.0;
    const LEFT: f64 = 96.0;
    const ROW: f64 = 44.0;
    const GAP: f64 = 12.0;
    type Series = (&'static str, &'static str, fn(&Activity) -> i64);
    let series: [Series; 3] = [
        ("takeovers", "#2a7", |a| a.takeovers),
        ("failures", "#c33", |a| a.failures),
        ("recoveries", "#36c", |a| a.recoveries),
    ];
    let rows_h = series.len() as f64 * (ROW + GAP);
    let h = rows_h + 16.0;
    let n = activity.len().max(1) as f64;
    let step = (W - LEFT) / n;
    let x = |i: usize| LEFT + step * i as f64;
    let mut s = format!(
        "<svg class=\"chart\" id=\"chart\" width=\"{W}\" height=\"{h}\" viewBox=\"0 0 {W} {h}\" role=\"img\" \
         aria-label=\"takeovers, failures and recoveries per {} over the last {}\">",
        humantime::format_duration(CHART_BUCKET),
        humantime::format_duration(CHART_BUCKET * activity.len() as u32)
    );
    // A mark on every whole hour.
    for (i, a) in activity.iter().enumerate() {
        let t = humantime::format_rfc3339_seconds(a.start).to_string();
        if &t[14..19] == "00:00" {
            let _ = write!(
                s,
                "<line x1=\"{x:.1}\" y1=\"{GAP}\" x2=\"{x:.1}\" y2=\"{b:.0}\" stroke=\"#eee\"/>\
                 <text x=\"{x:.1}\" y=\"{ty:.0}\" text-anchor=\"middle\">{}</text>",
                &t[11..16],
                x = x(i),
                b = rows_h,
                ty = rows_h + 12.0,
            );
        }
    }
    for (k, (name, color, value)) in series.iter().enumerate() {
        let top = k as f64 * (ROW + GAP) + GAP;
        let base = top + ROW;
        let total: i64 = activity.iter().map(value).sum();
        let max = activity.iter().map(value).max().unwrap_or(0);
        let _ = write!(
            s,
            "<g class=\"series\" data-series=\"{name}\" data-total=\"{total}\">\
             <text x=\"0\" y=\"{ty:.0}\">{name}</text><text x=\"0\" y=\"{ty2:.0}\" class=\"total\">{total} in all</text>\
             <text x=\"{mx:.0}\" y=\"{top2:.0}\" text-anchor=\"end\">{max}</text>\
             <line x1=\"{LEFT}\" y1=\"{base}\" x2=\"{W}\" y2=\"{base}\" stroke=\"#bbb\"/>",
            ty = top + 14.0,
            ty2 = top + 30.0,
            mx = LEFT - 4.0,
            top2 = top + 10.0,
        );
        for (i, a) in activity.iter().enumerate() {
            let v = value(a);
            if v == 0 {
                continue;
            }
            let bar = (ROW * v as f64 / max.max(1) as f64).max(1.0);
            let _ = write!(
                s,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bar:.1}\" fill=\"{color}\">\
                 <title>{v} {name} from {}</title></rect>",
                x(i) + 0.5,
                base - bar,
                (step - 1.0).max(1.0),
                &humantime::format_rfc3339_seconds(a.start).to_string()[11..16],
            );
        }
        s.push_str("</g>");
    }
    s.push_str("</svg>");
    s
}

pub(super) async fn machine_page(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
) -> HttpResponse {
    let d = attempt!(load_detail(&admin, &id).await);
    let operator = req.extensions().get::<Operator>().cloned();
    let mut b = String::new();
    let s = &d.summary;
    let mid = s.machine_id.to_string();
    if let Some(done) = req
        .query_string()
        .split('&')
        .find_map(|kv| kv.strip_prefix("done="))
    {
        if let Some(a) = d.actions.iter().find(|a| a.id.to_string() == done) {
            let _ = write!(
                b,
                "<p class=\"notice\" id=\"done\">{} by {}: {}</p>",
                esc(&a.action),
                esc(&a.actor),
                esc(&a.detail)
            );
        }
    }
    let _ = write!(
        b,
        "<p><a href=\"../\">fleet</a></p><table id=\"machine\"><tr><th>state</th><td id=\"state\">{}</td></tr>\
         <tr><th>provider ID</th><td>{}</td></tr><tr><th>address</th><td>{}</td></tr>\
         <tr><th>created</th><td>{}</td></tr><tr><th>agent started</th><td>{}</td></tr>\
         <tr><th>agent heartbeat</th><td>{}</td></tr><tr><th>SSH host key</th><td>{}</td></tr>",
        s.state,
        esc(s.provider_id.as_deref().unwrap_or("-")),
        esc(s.address.as_deref().unwrap_or("-")),
        rfc3339(d.created_at),
        d.agent_started
            .as_ref()
            .map(|(t, k)| format!("{} key {}", rfc3339(*t), hex(k)))
            .unwrap_or_else(|| "-".into()),
        d.agent_heartbeat.map(rfc3339).unwrap_or_else(|| "-".into()),
        esc(d.ssh_host_key.as_deref().unwrap_or("-")),
    );
    let _ = write!(
        b,
        "<tr><th>boots</th><td id=\"boots\">{}</td></tr>",
        esc(&d.boots())
    );
    if let Some(h) = &d.hold {
        let _ = write!(
            b,
            "<tr class=\"held\"><th>held</th><td id=\"hold\">by {} since {}{}</td></tr>",
            esc(&h.by),
            rfc3339(h.since),
            h.reason
                .as_deref()
                .map(|r| format!(": {}", esc(r)))
                .unwrap_or_default()
        );
    }
    if let Some((by, at)) = &d.reboot_request {
        let _ = write!(
            b,
            "<tr><th>reboot</th><td id=\"reboot-request\">requested by {} at {}</td></tr>",
            esc(by),
            rfc3339(*at)
        );
    }
    if let Some(c) = &d.hardware_check {
        let verdict = match (&c.accepted, c.differences.is_empty()) {
            (_, true) => "they agree".to_string(),
            (Some((by, at)), false) => format!(
                "{} (accepted by {} at {})",
                esc(&c.differences.join("; ")),
                esc(by),
                rfc3339(*at)
            ),
            (None, false) => format!(
                "<strong>{}</strong>: installations wait until an operator accepts it",
                esc(&c.differences.join("; "))
            ),
        };
        let _ = write!(
            b,
            "<tr><th>BMC vs agent</th><td id=\"hardware-check\">{verdict}</td></tr>"
        );
    }
    if let Some(r) = &d.boot_request {
        let _ = write!(
            b,
            "<tr><th>boot through the BMC</th><td id=\"boot-request\">{} asked by {} at {}{}</td></tr>",
            r.cause,
            esc(&r.requested_by),
            rfc3339(r.requested_at),
            r.reason
                .as_deref()
                .map(|x| format!(": {}", esc(x)))
                .unwrap_or_default()
        );
    }
    if let Some(t) = &d.tenancy {
        let _ = write!(
            b,
            "<tr><th>project</th><td id=\"project\">{}</td></tr>",
            t.assigned_to
                .as_ref()
                .map(|(id, name)| format!("{} ({id})", esc(name)))
                .unwrap_or_else(|| "the shared pool".into())
        );
        if let Some(dev) = &t.device {
            let _ = write!(
                b,
                "<tr><th>device</th><td id=\"device\">{} ({}) of project {}: {} \
                 <span class=\"muted\">(reclaim: <code>shepherd devices reclaim {}</code>)</span></td></tr>",
                esc(&dev.hostname),
                dev.id,
                esc(&dev.project.1),
                dev.state,
                dev.id
            );
        }
    }
    b.push_str("</table>");

    let accept_csrf = operator.as_ref().map(|op| admin.csrf.token(op, &mid));
    b.push_str(&super::discovery::section(
        &d,
        accept_csrf.as_deref().map(|c| (mid.as_str(), c)),
    ));

    // The buttons: one form per action, each with its CSRF token.
    if let Some(op) = &operator {
        let csrf = admin.csrf.token(op, &mid);
        let _ = write!(
            b,
            "<section class=\"actions\" id=\"actions\"><h2>Actions</h2><p class=\"muted\">As {}; each is recorded with its reason.</p>",
            esc(&op.0)
        );
        let allowed: Vec<&str> = crate::bmdb::lifecycle::Operation::ALL
            .iter()
            .filter(|o| o.allows(d.summary.state))
            .map(|o| o.as_str())
            .collect();
        let _ = write!(
            b,
            "<p id=\"allowed\">In state <b>{}</b>, the life cycle allows: {}.</p>",
            d.summary.state,
            if allowed.is_empty() {
                "nothing".to_string()
            } else {
                allowed.join(", ")
            }
        );
        for &action in Action::ACTIONS {
            let available = match action {
                Action::Install | Action::Deprovision | Action::Accept => false,
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
            let allowed = action.allows(d.summary.state);
            if !available || !allowed {
                continue;
            }
            let _ = write!(
                b,
                "<form method=\"post\" action=\"{mid}/{a}\" id=\"form-{a}\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">",
                a = action.as_str()
            );
            if action == Action::Retry {
                b.push_str("<select name=\"process\"><option value=\"\">every process</option>");
                for (p, _) in &d.backoffs {
                    let _ = write!(b, "<option>{p}</option>");
                }
                b.push_str("</select> ");
            }
            if action == Action::Retakeover {
                b.push_str("<label><input type=\"checkbox\" name=\"forget_host_key\" value=\"true\"> forget the SSH host key</label> ");
            }
            let _ = write!(
                b,
                "<input type=\"text\" name=\"reason\" placeholder=\"reason\" maxlength=\"{}\" size=\"24\"> \
                 <button type=\"submit\" id=\"button-{a}\">{label}</button></form>",
                crate::bmdb::actions::MAX_REASON,
                a = action.as_str(),
                label = action.label()
            );
        }
        b.push_str("</section>");
    }

    b.push_str(&machine_section(&admin, &d, operator.as_ref()));
    b.push_str("<h2>Hardware</h2>");
    match d
        .hardware_report
        .as_deref()
        .map(shepherd_proto::summary::summarize)
    {
        None => b.push_str("<p id=\"hardware\">no report yet</p>"),
        Some(Err(e)) => {
            let _ = write!(b, "<p id=\"hardware\">{}</p>", esc(&e));
        }
        Some(Ok(h)) => {
            let _ = write!(
                b,
                "<table id=\"hardware\"><tr><th>system</th><td>{} {} (serial {})</td></tr>\
                 <tr><th>memory</th><td>{}</td></tr><tr><th>EFI</th><td>{}</td></tr>",
                esc(&h.manufacturer),
                esc(&h.product),
                esc(&h.serial_number),
                shepherd_proto::summary::bytes(h.memory_bytes),
                esc(&h.efi)
            );
            if let Some(sb) = &h.secure_boot {
                let _ = write!(
                    b,
                    "<tr><th>Secure Boot</th><td id=\"secure-boot\">{}</td></tr>",
                    esc(&sb.to_string())
                );
            }
            if let Some(l) = &h.bmc_lan {
                let _ = write!(
                    b,
                    "<tr><th>BMC</th><td id=\"bmc-lan\">{}</td></tr>",
                    esc(&l.to_string())
                );
            }
            for c in &h.cpus {
                let _ = write!(
                    b,
                    "<tr><th>CPU</th><td>{} {}: {} cores, {} threads</td></tr>",
                    esc(&c.vendor),
                    esc(&c.model),
                    c.cores,
                    c.threads
                );
            }
            for x in &h.disks {
                let _ = write!(
                    b,
                    "<tr><th>disk</th><td>{} {} {}</td></tr>",
                    esc(&x.protocol),
                    esc(&x.model),
                    shepherd_proto::summary::bytes(x.capacity_bytes)
                );
            }
            for n in &h.nics {
                let _ = write!(
                    b,
                    "<tr><th>NIC</th><td>{} {} link {}</td></tr>",
                    esc(&n.mac),
                    esc(&n.driver),
                    if n.link_up { "up" } else { "down" }
                );
            }
            b.push_str("</table>");
        }
    }
    if let Some(f) = &d.bmc {
        b.push_str("<h2>BMC</h2><table id=\"bmc\">");
        for (k, v) in f.lines() {
            let _ = write!(b, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(&v));
        }
        b.push_str("</table>");
    }
    b.push_str(&super::firmware::machine_section(&d.firmware));
    b.push_str("<h2>Leases</h2><ul id=\"leases\">");
    for l in &d.leases {
        let _ = write!(b, "<li>{} by {}</li>", l.process, esc(&l.component));
    }
    if d.leases.is_empty() {
        b.push_str("<li class=\"muted\">none: no process works on it now</li>");
    }
    b.push_str("</ul><h2>Backoffs</h2><ul id=\"backoffs\">");
    if d.backoffs.is_empty() {
        b.push_str("<li class=\"muted\">none</li>");
    }
    for (p, bo) in &d.backoffs {
        let _ = write!(
            b,
            "<li>{p} until {}: {}</li>",
            rfc3339(bo.until),
            esc(&bo.cause)
        );
    }
    // History: the work history and the operators' actions, in time order.
    b.push_str("</ul><h2>History</h2><table id=\"history\"><tr><th>time</th><th>process</th><th>event</th><th>cause or detail</th></tr>");
    let mut rows: Vec<(SystemTime, String)> = d
        .history
        .iter()
        .map(|h| {
            let class = if h.failed_cause.is_some() {
                " failed"
            } else {
                ""
            };
            (
                h.timestamp,
                format!(
                    "<tr class=\"event{class}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    rfc3339(h.timestamp),
                    h.process,
                    h.event,
                    esc(h
                        .failed_cause
                        .as_deref()
                        .or(h.detail.as_deref())
                        .unwrap_or(""))
                ),
            )
        })
        .collect();
    for a in &d.actions {
        rows.push((
            a.timestamp,
            format!(
                "<tr class=\"event operator\" data-action=\"{id}\"><td>{t}</td><td>operator {who}</td><td>{what}</td><td>{detail}{why}</td></tr>",
                id = a.id,
                t = rfc3339(a.timestamp),
                who = esc(&a.actor),
                what = esc(&a.action),
                detail = esc(&a.detail),
                why = a
                    .reason
                    .as_deref()
                    .map(|r| format!(" (reason: {})", esc(r)))
                    .unwrap_or_default(),
            ),
        ));
    }
    // Stable: equal times keep history before actions.
    rows.sort_by_key(|(t, _)| *t);
    for (_, r) in rows {
        b.push_str(&r);
    }
    b.push_str("</table>");
    page(&format!("shepherd: machine {}", s.machine_id), &b, true)
}

/// A button's form, as posted.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ActionForm {
    csrf: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    process: String,
    #[serde(default)]
    forget_host_key: Option<String>,
}

/// `POST /machines/{id}/{action}` from the machine page's buttons: checks
/// the origin and the CSRF token, acts, and sends the browser back to the
/// machine page with the audit entry shown.
pub(super) async fn form_action(
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
