//! The admin HTTP server: health, readiness, Prometheus metrics, a JSON API
//! over the fleet, and server-rendered pages (the fleet by state, a page per
//! machine with its history).
//!
//! Mount it in any actix-web application with `App::configure(routes)` and
//! an [`Admin`] in the app data; `shepherd run` serves it on `admin.listen`.
//! With `admin.token` set, every route but `/healthz` wants
//! `Authorization: Bearer <token>`; the token is required when the server
//! listens beyond loopback.

use std::fmt::Write as _;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::time::SystemTime;

use actix::Addr;
use actix_web::body::BoxBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::{Next, from_fn};
use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use crate::bmdb::Bmdb;
use crate::bmdb::machines::{self, MachineDetail, MachineState, MachineSummary};
use crate::control::MailboxStatus;
use crate::secret::Secret;
use crate::supervisor::{GetSupervisorStatus, Supervisor, SupervisorStatus};

/// What the admin routes read from.
#[derive(Clone)]
pub struct Admin {
    pub bmdb: Bmdb,
    pub supervisor: Option<Addr<Supervisor>>,
    /// The process's metric series (Equinix API requests, heartbeats);
    /// `/metrics` adds the fleet's, read from the BMDB at each scrape.
    pub registry: std::sync::Arc<Registry>,
    /// An agent silent this long counts as silent (the Recoverer's
    /// `heartbeat_stale_after`).
    pub heartbeat_stale_after: std::time::Duration,
    pub token: Option<Secret>,
}

/// The admin routes, for `App::configure`. Needs `web::Data<Admin>`.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(read_only("/healthz", healthz)).service(
        web::scope("")
            .wrap(from_fn(require_token))
            // Malformed paths answer JSON like the rest (queries: `Query`).
            .app_data(web::PathConfig::default().error_handler(|e, _| json_error(e)))
            .service(read_only("/readyz", readyz))
            .service(read_only("/metrics", metrics))
            .service(read_only("/api/v1/machines", api_machines))
            .service(read_only("/api/v1/machines/{id}", api_machine))
            .service(read_only("/", fleet_page))
            .service(read_only("/machines/{id}", machine_page)),
    );
}

/// A resource that answers GET (and HEAD); any other method is 405 with
/// `Allow`.
fn read_only<F, Args>(path: &str, handler: F) -> actix_web::Resource
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
            HttpResponse::MethodNotAllowed()
                .insert_header(("Allow", "GET, HEAD"))
                .json(json!({ "error": format!("{} is not allowed here; use GET", req.method()) }))
        }))
}

/// A query string, deserialized; a bad one is a JSON 400 naming the field
/// (`limit: invalid digit found in string`).
struct Query<T>(T);

impl<T: serde::de::DeserializeOwned> actix_web::FromRequest for Query<T> {
    type Error = actix_web::Error;
    type Future = std::future::Ready<Result<Self, actix_web::Error>>;

    fn from_request(req: &actix_web::HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(
            req.query_string().as_bytes(),
        ));
        std::future::ready(
            serde_path_to_error::deserialize(de)
                .map(Query)
                .map_err(|e| json_error(format!("query {}: {}", e.path(), e.inner()))),
        )
    }
}

fn json_error(e: impl std::fmt::Display + std::fmt::Debug + 'static) -> actix_web::Error {
    let body = HttpResponse::BadRequest().json(json!({ "error": e.to_string() }));
    actix_web::error::InternalError::from_response(e, body).into()
}

async fn require_token(
    req: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let admin = req.app_data::<web::Data<Admin>>().cloned();
    if let Some(token) = admin.as_ref().and_then(|a| a.token.clone()) {
        let given = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        // Constant-time enough for a token compare: no early exit on length.
        let ok = given.is_some_and(|g| {
            let (a, b) = (g.as_bytes(), token.expose().as_bytes());
            a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
        });
        if !ok {
            let (r, _) = req.into_parts();
            return Ok(ServiceResponse::new(
                r,
                HttpResponse::Unauthorized()
                    .insert_header(("WWW-Authenticate", "Bearer"))
                    .json(json!({"error": "a bearer token is required"})),
            ));
        }
    }
    next.call(req).await
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

async fn status(admin: &Admin) -> SupervisorStatus {
    match &admin.supervisor {
        Some(s) => s.send(GetSupervisorStatus).await.unwrap_or_default(),
        None => SupervisorStatus::default(),
    }
}

async fn readyz(admin: web::Data<Admin>) -> HttpResponse {
    let db = admin
        .bmdb
        .transact(async |tx| tx.query_one("SELECT 1", &[]).await.map(|_| ()))
        .await;
    let st = status(&admin).await;
    let session_ok = admin.supervisor.is_none() || st.session.is_some();
    let body = json!({
        "database": match &db { Ok(()) => "ok".to_string(), Err(e) => e.to_string() },
        "session": st.session.map(|s| s.to_string()),
    });
    if db.is_ok() && session_ok {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn summary_json(m: &MachineSummary) -> serde_json::Value {
    json!({
        "machine_id": m.machine_id,
        "provider": m.provider.map(|p| p.to_string()),
        "provider_id": m.provider_id,
        "address": m.address,
        "provider_status": m.provider_status.map(|s| s.to_string()),
        "state": m.state.as_str(),
    })
}

fn detail_json(d: &MachineDetail) -> serde_json::Value {
    json!({
        "machine": summary_json(&d.summary),
        "created_at": rfc3339(d.created_at),
        "tags": {
            "provided": d.provided.as_ref().map(|p| json!({
                "provider": p.provider.to_string(),
                "provider_id": p.provider_id,
                "reservation_id": p.reservation_id,
                "address": p.ip_address,
                "location": p.location,
                "status": p.status.map(|s| s.to_string()),
            })),
            "agent_started": d.agent_started.as_ref().map(|(at, key)| json!({"at": rfc3339(*at), "public_key": hex(key)})),
            "agent_heartbeat": d.agent_heartbeat.map(rfc3339),
            "hardware_report": d.hardware_report.as_deref().map(|raw| match crate::hardware::summarize(raw) {
                Ok(h) => json!(h),
                Err(e) => json!({ "error": e }),
            }),
            "installation_request": d.installation_request,
            "installation_report": d.installation_report.map(|(g, r)| json!({"generation": g, "result": r.to_string()})),
            "ssh_host_key": d.ssh_host_key,
            "bmc": d.bmc.as_ref().map(|f| json!({
                "bmc_url": f.bmc_url,
                "system": f.system_path,
                "power_state": f.power_state,
                "manufacturer": f.manufacturer,
                "model": f.model,
                "serial_number": f.serial_number,
                "bios_version": f.bios_version,
                "processor_count": f.processor_count,
                "processor_model": f.processor_model,
                "memory_gib": f.memory_gib,
                "health": f.health,
                "read_error": f.read_error,
                "changed_at": f.changed_at.map(rfc3339),
            })),
        },
        "leases": d.leases.iter().map(|l| json!({
            "process": l.process.to_string(), "session_id": l.session_id, "component": l.component,
        })).collect::<Vec<_>>(),
        "backoffs": d.backoffs.iter().map(|(p, b)| json!({
            "process": p.to_string(), "until": rfc3339(b.until), "cause": b.cause,
            "last_interval_seconds": b.last_interval_seconds,
        })).collect::<Vec<_>>(),
        "history": d.history.iter().map(|h| json!({
            "process": h.process.to_string(), "event": h.event.to_string(),
            "timestamp": rfc3339(h.timestamp), "cause": h.failed_cause,
        })).collect::<Vec<_>>(),
    })
}

#[derive(Deserialize)]
struct Page {
    state: Option<String>,
    limit: Option<i64>,
    offset: Option<i64>,
}

fn bad_request(msg: String) -> HttpResponse {
    HttpResponse::BadRequest().json(json!({ "error": msg }))
}

fn parse_state(s: &Option<String>) -> Result<Option<MachineState>, HttpResponse> {
    match s.as_deref() {
        None | Some("") => Ok(None),
        Some(s) => MachineState::parse(s).map(Some).ok_or_else(|| {
            let all: Vec<&str> = MachineState::ALL.iter().map(|m| m.as_str()).collect();
            bad_request(format!("state must be one of {}", all.join(", ")))
        }),
    }
}

fn internal(e: impl std::fmt::Display) -> HttpResponse {
    HttpResponse::InternalServerError().json(json!({ "error": e.to_string() }))
}

async fn api_machines(admin: web::Data<Admin>, Query(q): Query<Page>) -> HttpResponse {
    let state = match parse_state(&q.state) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let offset = q.offset.unwrap_or(0).max(0);
    let r = admin
        .bmdb
        .transact(async |tx| {
            Ok((
                machines::fleet(tx, state, limit, offset).await?,
                machines::fleet_counts(tx).await?,
                machines::agent_counts(tx, admin.heartbeat_stale_after).await?,
            ))
        })
        .await;
    match r {
        Ok((list, counts, (heartbeating, silent))) => HttpResponse::Ok().json(json!({
            "machines": list.iter().map(summary_json).collect::<Vec<_>>(),
            "counts": counts.iter().map(|(s, n)| (s.as_str().to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "agents": { "heartbeating": heartbeating, "silent": silent },
            "limit": limit,
            "offset": offset,
        })),
        Err(e) => internal(e),
    }
}

async fn load_detail(admin: &Admin, id: &str) -> Result<MachineDetail, HttpResponse> {
    let id: uuid::Uuid = id
        .parse()
        .map_err(|_| bad_request(format!("{id} is not a machine ID")))?;
    match admin
        .bmdb
        .transact(async |tx| machines::detail(tx, id).await)
        .await
    {
        Ok(Some(d)) => Ok(d),
        Ok(None) => Err(HttpResponse::NotFound()
            .json(json!({ "error": format!("machine {id} is not in the BMDB") }))),
        Err(e) => Err(internal(e)),
    }
}

async fn api_machine(admin: web::Data<Admin>, id: web::Path<String>) -> HttpResponse {
    match load_detail(&admin, &id).await {
        Ok(d) => HttpResponse::Ok().json(detail_json(&d)),
        Err(r) => r,
    }
}

// ---- metrics ----

type Labels = Vec<(&'static str, String)>;

/// Series read at scrape time, registered into a registry of the scrape's.
struct Scrape(Registry);

impl Scrape {
    fn gauge(&mut self, name: &str, help: &str, value: i64) {
        let g: Gauge = Gauge::default();
        g.set(value);
        self.0.register(name, help, g);
    }

    fn gauges(&mut self, name: &str, help: &str, values: impl IntoIterator<Item = (Labels, i64)>) {
        let f: Family<Labels, Gauge> = Family::default();
        for (l, v) in values {
            f.get_or_create(&l).set(v);
        }
        self.0.register(name, help, f);
    }

    /// Counters kept elsewhere (a mailbox's tallies), as of now. `name`
    /// without `_total`.
    fn counters(
        &mut self,
        name: &str,
        help: &str,
        values: impl IntoIterator<Item = (Labels, u64)>,
    ) {
        let f: Family<Labels, Counter> = Family::default();
        for (l, v) in values {
            f.get_or_create(&l).inc_by(v);
        }
        self.0.register(name, help, f);
    }
}

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// A counter family over the mailboxes: one series per process and per
/// (label value, count) that `values` gives for its status.
fn mailbox_counters(
    p: &mut Scrape,
    mailboxes: &[(&str, &Option<MailboxStatus>)],
    (name, help, label): (&str, &str, &'static str),
    values: impl Fn(&MailboxStatus) -> Vec<(&'static str, u64)>,
) {
    let mut series = Vec::new();
    for (process, m) in mailboxes {
        if let Some(m) = m {
            for (value, n) in values(m) {
                series.push((labels(&[("process", process), (label, value)]), n));
            }
        }
    }
    p.counters(name, help, series);
}

fn mailbox_samples(p: &mut Scrape, mailboxes: &[(&str, &Option<MailboxStatus>)]) {
    mailbox_counters(
        p,
        mailboxes,
        (
            "shepherd_leases",
            "Work leases by process and how they ended (this process).",
            "event",
        ),
        |m| {
            vec![
                ("started", m.leased),
                ("finished", m.finished),
                ("failed", m.failed),
                ("canceled", m.aborted),
            ]
        },
    );
    mailbox_counters(
        p,
        mailboxes,
        (
            "shepherd_lease_selections",
            "Lease attempts of a control loop by outcome: a machine leased, nothing to lease, or a pick lost to another leaser (this process).",
            "result",
        ),
        |m| {
            vec![
                ("leased", m.leased),
                ("nothing", m.idle_polls),
                ("lost", m.conflicts),
            ]
        },
    );
    for (name, help, value) in [
        (
            "shepherd_mailbox_running",
            "Workers running now, per control loop.",
            (|m: &MailboxStatus| m.running) as fn(&MailboxStatus) -> usize,
        ),
        (
            "shepherd_mailbox_parallelism",
            "Workers allowed at once, per control loop.",
            |m: &MailboxStatus| m.parallelism,
        ),
    ] {
        let values = mailboxes.iter().filter_map(|(process, m)| {
            m.as_ref()
                .map(|m| (labels(&[("process", process)]), value(m) as i64))
        });
        p.gauges(name, help, values);
    }
}

const SESSIONS_ALIVE: &str = "SELECT count(*) FROM sessions WHERE session_deadline > now()";
const ACTIVE_BACKOFFS: &str =
    "SELECT process::text, count(*) FROM work_backoff WHERE until > now() GROUP BY process";

async fn metrics(admin: web::Data<Admin>) -> HttpResponse {
    let db = admin
        .bmdb
        .transact(async |tx| {
            let sessions: i64 = tx.query_one(SESSIONS_ALIVE, &[]).await?.get(0);
            let backoffs: Vec<(String, i64)> = tx
                .query(ACTIVE_BACKOFFS, &[])
                .await?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            let counts = machines::fleet_counts(tx).await?;
            let agents = machines::agent_counts(tx, admin.heartbeat_stale_after).await?;
            Ok((sessions, backoffs, counts, agents))
        })
        .await;
    let (sessions, backoffs, counts, (heartbeating, silent)) = match db {
        Ok(v) => v,
        Err(e) => {
            return HttpResponse::ServiceUnavailable().body(format!("BMDB unreachable: {e}\n"));
        }
    };
    let st = status(&admin).await;
    let mut p = Scrape(Registry::default());
    p.gauge(
        "shepherd_bmdb_sessions",
        "BMDB sessions alive (all shepherd processes).",
        sessions,
    );
    p.gauge(
        "shepherd_session_up",
        "Whether this process holds a live session.",
        st.session.is_some() as i64,
    );
    mailbox_samples(
        &mut p,
        &[
            ("ShepherdAgentStart", &st.initializer),
            ("ShepherdRecovery", &st.recoverer),
        ],
    );
    p.gauges(
        "shepherd_active_backoffs",
        "Machines backed off now, per process.",
        backoffs
            .iter()
            .map(|(process, n)| (labels(&[("process", process)]), *n)),
    );
    p.gauges(
        "shepherd_agents",
        "Machines with a started agent, heartbeating or silent.",
        [
            (labels(&[("state", "heartbeating")]), heartbeating),
            (labels(&[("state", "silent")]), silent),
        ],
    );
    p.gauges(
        "shepherd_machines",
        "Machines per state.",
        MachineState::ALL.iter().map(|s| {
            let n = counts
                .iter()
                .find(|(c, _)| c == s)
                .map(|(_, n)| *n)
                .unwrap_or(0);
            (labels(&[("state", s.as_str())]), n)
        }),
    );
    if let Some(prov) = &st.provisioner {
        p.gauge(
            "shepherd_provisioner_discrepancies",
            "Machines in the BMDB the provider no longer lists.",
            prov.missing_in_provider.len() as i64,
        );
        p.counters(
            "shepherd_provisioner_machines",
            "Machines created or adopted by the provisioner.",
            [
                (labels(&[("how", "created")]), prov.created),
                (labels(&[("how", "adopted")]), prov.adopted),
            ],
        );
    }
    let mut body = String::new();
    let encoded = prometheus_client::encoding::text::encode_registry(&mut body, &admin.registry)
        .and_then(|()| prometheus_client::encoding::text::encode_registry(&mut body, &p.0))
        .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut body));
    if let Err(e) = encoded {
        return internal(format!("encoding metrics: {e}"));
    }
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(body)
}

// ---- pages ----

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn page(title: &str, body: &str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(format!(
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font:14px system-ui,sans-serif;margin:2em}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:left}}th{{background:#f4f4f4}}\
         .failed{{color:#a00}}</style></head><body><h1>{t}</h1>{body}</body></html>",
            t = esc(title)
        ))
}

async fn fleet_page(admin: web::Data<Admin>, Query(q): Query<Page>) -> HttpResponse {
    let state = match parse_state(&q.state) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let r = admin
        .bmdb
        .transact(async |tx| {
            Ok((
                machines::fleet(tx, state, 500, 0).await?,
                machines::fleet_counts(tx).await?,
                machines::agent_counts(tx, admin.heartbeat_stale_after).await?,
            ))
        })
        .await;
    let (list, counts, (heartbeating, silent)) = match r {
        Ok(v) => v,
        Err(e) => return internal(e),
    };
    let total: i64 = counts.iter().map(|(_, n)| n).sum();
    let mut b = String::new();
    let _ = write!(
        b,
        "<p id=\"total\">{total} machines</p>\
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
    b.push_str("</table><h2>Machines</h2><table id=\"machines\"><tr><th>machine</th><th>provider ID</th><th>address</th><th>provider status</th><th>state</th></tr>");
    for m in &list {
        let _ = write!(
            b,
            "<tr class=\"machine\"><td><a href=\"machines/{id}\">{id}</a></td><td>{pid}</td><td>{addr}</td><td>{ps}</td><td>{st}</td></tr>",
            id = m.machine_id,
            pid = esc(m.provider_id.as_deref().unwrap_or("-")),
            addr = esc(m.address.as_deref().unwrap_or("-")),
            ps = m
                .provider_status
                .map(|s| s.to_string())
                .unwrap_or_else(|| "-".into()),
            st = m.state,
        );
    }
    b.push_str("</table>");
    page("shepherd: fleet", &b)
}

async fn machine_page(admin: web::Data<Admin>, id: web::Path<String>) -> HttpResponse {
    let d = match load_detail(&admin, &id).await {
        Ok(d) => d,
        Err(r) => return r,
    };
    let mut b = String::new();
    let s = &d.summary;
    let _ = write!(
        b,
        "<p><a href=\"../\">fleet</a></p><table id=\"machine\"><tr><th>state</th><td id=\"state\">{}</td></tr>\
         <tr><th>provider ID</th><td>{}</td></tr><tr><th>address</th><td>{}</td></tr>\
         <tr><th>created</th><td>{}</td></tr><tr><th>agent started</th><td>{}</td></tr>\
         <tr><th>agent heartbeat</th><td>{}</td></tr><tr><th>SSH host key</th><td>{}</td></tr></table>",
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
    b.push_str("<h2>Hardware</h2>");
    match d.hardware_report.as_deref().map(crate::hardware::summarize) {
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
                crate::hardware::bytes(h.memory_bytes),
                esc(&h.efi)
            );
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
                    crate::hardware::bytes(x.capacity_bytes)
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
    b.push_str("<h2>Leases</h2><ul id=\"leases\">");
    for l in &d.leases {
        let _ = write!(b, "<li>{} by {}</li>", l.process, esc(&l.component));
    }
    b.push_str("</ul><h2>Backoffs</h2><ul id=\"backoffs\">");
    for (p, bo) in &d.backoffs {
        let _ = write!(
            b,
            "<li>{p} until {}: {}</li>",
            rfc3339(bo.until),
            esc(&bo.cause)
        );
    }
    b.push_str("</ul><h2>History</h2><table id=\"history\"><tr><th>time</th><th>process</th><th>event</th><th>cause</th></tr>");
    for h in &d.history {
        let class = if h.failed_cause.is_some() {
            " failed"
        } else {
            ""
        };
        let _ = write!(
            b,
            "<tr class=\"event{class}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            rfc3339(h.timestamp),
            h.process,
            h.event,
            esc(h.failed_cause.as_deref().unwrap_or(""))
        );
    }
    b.push_str("</table>");
    page(&format!("shepherd: machine {}", s.machine_id), &b)
}

/// Serves the admin routes on `listen` until the system stops. Returns the
/// bound address (for port 0).
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
