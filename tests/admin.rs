//! The admin server: JSON endpoints, Prometheus metrics, the token, and the
//! HTML pages as a browser renders them (headless Chromium).

use serde_json::json;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use shepherd::admin::{self, Admin};
use shepherd::bmdb::machines::{self, NewProvidedMachine};
use shepherd::bmdb::{Backoff, Bmdb, Process, Provider};
use shepherd::equinix::{ApiMetrics, Operation};
use shepherd::secret::Secret;
use shepherd_sim::testing::TestDb;
use uuid::Uuid;

struct Fleet {
    _db: TestDb,
    bmdb: Bmdb,
    pending: Uuid,
    started: Uuid,
    backed_off: Uuid,
    leased: Uuid,
    _session: shepherd::bmdb::Session,
}

async fn fleet() -> Fleet {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let mut ids = Vec::new();
    for name in ["pending", "started", "backed-off", "leased"] {
        let m = NewProvidedMachine {
            provider: Provider::Equinix,
            provider_id: format!("device-{name}"),
            reservation_id: Some(format!("reservation-{name}")),
            ip_address: Some("127.0.0.1".into()),
            location: Some("sv".into()),
            status: Some(shepherd::bmdb::ProviderStatus::Running),
        };
        ids.push(
            bmdb.transact(async |tx| machines::create_provided(tx, &m).await)
                .await
                .unwrap(),
        );
    }
    let session = bmdb
        .start_session("admin-test", Some(Duration::from_secs(60)))
        .await
        .unwrap();
    let pick = |id: Uuid| async move |_tx: &mut shepherd::bmdb::Tx<'_>| Ok(Some((id, ())));
    let mut w = session
        .lease(Process::ShepherdAgentStart, pick(ids[1]))
        .await
        .unwrap()
        .unwrap();
    let started = ids[1];
    w.finish(async |tx| machines::set_agent_started(tx, started, &[0xab; 32], None).await)
        .await
        .unwrap();
    let mut w = session
        .lease(Process::ShepherdAgentStart, pick(ids[2]))
        .await
        .unwrap()
        .unwrap();
    w.fail(
        &Backoff::constant(Duration::from_secs(600)),
        "connect to <127.0.0.2>: refused & gone",
    )
    .await
    .unwrap();
    let w = session
        .lease(Process::ShepherdAgentStart, pick(ids[3]))
        .await
        .unwrap()
        .unwrap();
    std::mem::forget(w); // held for the test's duration
    Fleet {
        _db: db,
        bmdb,
        pending: ids[0],
        started: ids[1],
        backed_off: ids[2],
        leased: ids[3],
        _session: session,
    }
}

fn metrics() -> ApiMetrics {
    let m = ApiMetrics::default();
    m.record(Operation::ListDevices, "200", Duration::from_millis(12));
    m.record(Operation::ListDevices, "200", Duration::from_millis(30));
    m.record(Operation::CreateDevice, "503", Duration::from_millis(4));
    m
}

fn serve(f: &Fleet, token: Option<&str>) -> SocketAddr {
    let a = Admin {
        registry: {
            let mut r = prometheus_client::registry::Registry::default();
            metrics().register(&mut r);
            std::sync::Arc::new(r)
        },
        heartbeat_stale_after: Duration::from_secs(600),
        tokens: token
            .map(|t| ("admin".to_string(), Secret::inline(t)))
            .into_iter()
            .collect(),
        ..Admin::new(f.bmdb.clone())
    };
    admin::serve(a, "127.0.0.1:0".parse().unwrap()).unwrap()
}

async fn get(url: String, token: Option<&str>) -> (u16, String) {
    let mut req = awc::Client::default().get(url);
    if let Some(t) = token {
        req = req.insert_header(("Authorization", format!("Bearer {t}")));
    }
    let mut r = req.send().await.unwrap();
    let body = r.body().limit(16 << 20).await.unwrap();
    (
        r.status().as_u16(),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

async fn json(url: String) -> serde_json::Value {
    let (status, body) = get(url, None).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[actix_rt::test]
async fn the_json_api_shows_the_fleet() {
    let f = fleet().await;
    let a = serve(&f, None);
    assert_eq!(
        get(format!("http://{a}/healthz"), None).await,
        (200, "ok\n".into())
    );
    let ready = json(format!("http://{a}/readyz")).await;
    assert_eq!(ready["database"], "ok");

    let all = json(format!("http://{a}/api/v1/machines")).await;
    let states: Vec<(String, String)> = all["machines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["provider_id"].as_str().unwrap().to_string(),
                m["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        states,
        vec![
            ("device-backed-off".into(), "backoff".into()),
            ("device-leased".into(), "leased".into()),
            ("device-pending".into(), "pending".into()),
            ("device-started".into(), "agent-started".into()),
        ]
    );
    assert_eq!(all["counts"]["pending"], 1);
    assert_eq!(all["counts"]["agent-started"], 1);
    // The one started agent has not called yet: silent.
    assert_eq!(all["agents"]["heartbeating"], 0);
    assert_eq!(all["agents"]["silent"], 1);
    let started = f.started;
    f.bmdb
        .transact(async |tx| {
            tx.execute(
                "INSERT INTO machine_agent_heartbeat VALUES ($1, now())",
                &[&started],
            )
            .await
        })
        .await
        .unwrap();
    let all = json(format!("http://{a}/api/v1/machines")).await;
    assert_eq!(all["agents"]["heartbeating"], 1);
    assert_eq!(all["agents"]["silent"], 0);
    let dom = rendered(format!("http://{a}/")).await;
    assert!(
        dom.contains(
            "<span id=\"heartbeating\">1</span> heartbeating, <span id=\"silent\">0</span> silent"
        ),
        "{dom}"
    );
    let pending = json(format!("http://{a}/api/v1/machines?state=pending")).await;
    assert_eq!(pending["machines"].as_array().unwrap().len(), 1);
    assert_eq!(pending["machines"][0]["machine_id"], f.pending.to_string());
    let page = json(format!("http://{a}/api/v1/machines?limit=2&offset=2")).await;
    assert_eq!(page["machines"][0]["provider_id"], "device-pending");
    assert_eq!(
        get(format!("http://{a}/api/v1/machines?state=bogus"), None)
            .await
            .0,
        400
    );

    let one = json(format!("http://{a}/api/v1/machines/{}", f.backed_off)).await;
    assert_eq!(one["machine"]["state"], "backoff");
    assert_eq!(
        one["tags"]["provided"]["reservation_id"],
        "reservation-backed-off"
    );
    assert_eq!(one["backoffs"][0]["process"], "ShepherdAgentStart");
    assert_eq!(one["backoffs"][0]["last_interval_seconds"], 600);
    let events: Vec<&str> = one["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["event"].as_str().unwrap())
        .collect();
    assert_eq!(events, ["Started", "Failed"]);
    assert_eq!(
        one["history"][1]["cause"],
        "connect to <127.0.0.2>: refused & gone"
    );
    // Its timeline: the same work, newest first, the failure marked.
    let timeline: Vec<(&str, &str, bool)> = one["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["kind"].as_str().unwrap(),
                m["what"].as_str().unwrap(),
                m["failed"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        timeline,
        [
            ("work", "ShepherdAgentStart Failed", true),
            ("work", "ShepherdAgentStart Started", false)
        ]
    );
    assert_eq!(
        one["timeline"][0]["detail"],
        "connect to <127.0.0.2>: refused & gone"
    );
    // The filters beyond the state: location (all four at "sv"), project
    // (none assigned), BMC (none read), boot path (all over SSH); a bad
    // value is a 400 naming the field.
    let count = async |q: &str| {
        json(format!("http://{a}/api/v1/machines?{q}")).await["machines"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(count("location=sv").await, 4);
    assert_eq!(count("location=elsewhere").await, 0);
    assert_eq!(count(&format!("project={}", Uuid::new_v4())).await, 0);
    assert_eq!(count("bmc=none&boot=ssh").await, 4);
    assert_eq!(count("bmc=ipmi").await, 0);
    assert_eq!(count("plan=c3.small.x86").await, 0);
    for (q, named) in [
        ("project=acme", "project"),
        ("bmc=serial", "bmc"),
        ("boot=floppy", "boot"),
    ] {
        let (status, body) = get(format!("http://{a}/api/v1/machines?{q}"), None).await;
        assert_eq!(status, 400, "{q}: {body}");
        assert!(body.contains(named), "{q}: {body}");
    }
    let started = json(format!("http://{a}/api/v1/machines/{}", f.started)).await;
    assert_eq!(
        started["tags"]["agent_started"]["public_key"],
        "ab".repeat(32)
    );
    let leased = json(format!("http://{a}/api/v1/machines/{}", f.leased)).await;
    assert_eq!(leased["leases"][0]["component"], "admin-test");
    assert_eq!(
        get(
            format!("http://{a}/api/v1/machines/{}", Uuid::new_v4()),
            None
        )
        .await
        .0,
        404
    );
    assert_eq!(
        get(format!("http://{a}/api/v1/machines/not-an-id"), None)
            .await
            .0,
        400
    );
}

/// The exposition as the Prometheus project's own OpenMetrics parser (its
/// Python client) reads it: family → (type, samples).
fn openmetrics(body: &str) -> serde_json::Value {
    use std::io::Write;
    let mut child = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/sdk/openmetrics_check.py"
        ))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs the Prometheus client's OpenMetrics parser");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}\n{body}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[actix_rt::test]
async fn metrics_are_openmetrics_the_reference_parser_reads() {
    let f = fleet().await;
    let a = serve(&f, None);
    let r = awc::Client::default()
        .get(format!("http://{a}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers().get("content-type").unwrap(),
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let (status, body) = get(format!("http://{a}/metrics"), None).await;
    assert_eq!(status, 200);
    assert!(body.ends_with("# EOF\n"), "{body}");
    let families = openmetrics(&body);
    let family = |name: &str| &families[name];
    assert_eq!(family("shepherd_equinix_requests")["type"], "counter");
    assert_eq!(family("shepherd_machines")["type"], "gauge");
    let latency = family("shepherd_equinix_request_duration_seconds");
    assert_eq!(latency["type"], "histogram");
    assert_eq!(latency["unit"], "seconds");
    let sample = |fam: &str, name: &str, labels: serde_json::Value| -> f64 {
        family(fam)["samples"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| {
                s[0] == name
                    && labels
                        .as_object()
                        .unwrap()
                        .iter()
                        .all(|(k, v)| &s[1][k] == v)
            })
            .unwrap_or_else(|| panic!("no {name} {labels} in:\n{body}"))[2]
            .as_f64()
            .unwrap()
    };
    assert_eq!(
        sample(
            "shepherd_equinix_requests",
            "shepherd_equinix_requests_total",
            json!({"operation": "list_devices", "status": "200"})
        ),
        2.0
    );
    assert_eq!(
        sample(
            "shepherd_equinix_request_duration_seconds",
            "shepherd_equinix_request_duration_seconds_bucket",
            json!({"operation": "list_devices", "status": "200", "le": "0.025"})
        ),
        1.0
    );
    assert_eq!(
        sample(
            "shepherd_machines",
            "shepherd_machines",
            json!({"state": "pending"})
        ),
        1.0
    );
}

#[actix_rt::test]
async fn metrics_parse_as_prometheus_text() {
    let f = fleet().await;
    let a = serve(&f, None);
    let (status, body) = get(format!("http://{a}/metrics"), None).await;
    assert_eq!(status, 200);
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap();
    let value = |name: &str, labels: &[(&str, &str)]| -> f64 {
        let s = scrape
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .unwrap_or_else(|| panic!("no {name} {labels:?} in:\n{body}"));
        match s.value {
            prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => panic!("{name} is not a number"),
        }
    };
    assert_eq!(value("shepherd_machines", &[("state", "pending")]), 1.0);
    assert_eq!(value("shepherd_machines", &[("state", "leased")]), 1.0);
    assert_eq!(value("shepherd_machines", &[("state", "installed")]), 0.0);
    assert_eq!(value("shepherd_bmdb_sessions", &[]), 1.0);
    assert_eq!(
        value(
            "shepherd_active_backoffs",
            &[("process", "ShepherdAgentStart")]
        ),
        1.0
    );
    assert_eq!(
        value(
            "shepherd_equinix_requests_total",
            &[("operation", "list_devices"), ("status", "200")]
        ),
        2.0
    );
    assert_eq!(
        value(
            "shepherd_equinix_requests_total",
            &[("operation", "create_device"), ("status", "503")]
        ),
        1.0
    );
    let histogram = scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == "shepherd_equinix_request_duration_seconds"
                && s.labels.get("operation") == Some("list_devices")
        })
        .expect("the latency histogram");
    match &histogram.value {
        prometheus_parse::Value::Histogram(buckets) => {
            let le_25ms = buckets
                .iter()
                .find(|b| (b.less_than - 0.025).abs() < 1e-9)
                .unwrap();
            assert_eq!(le_25ms.count, 1.0);
        }
        v => panic!("not a histogram: {v:?}"),
    }
}

#[actix_rt::test]
async fn the_token_is_enforced() {
    let f = fleet().await;
    let token = "s3cret-admin-token";
    let a = serve(&f, Some(token));
    assert_eq!(get(format!("http://{a}/healthz"), None).await.0, 200);
    for path in ["/readyz", "/metrics", "/api/v1/machines", "/"] {
        assert_eq!(
            get(format!("http://{a}{path}"), None).await.0,
            401,
            "{path} without a token"
        );
        assert_eq!(
            get(format!("http://{a}{path}"), Some("wrong")).await.0,
            401,
            "{path} with a wrong token"
        );
        assert_eq!(
            get(format!("http://{a}{path}"), Some(token)).await.0,
            200,
            "{path} with the token"
        );
    }
    let (_, body) = get(format!("http://{a}/api/v1/machines"), Some("wrong")).await;
    assert!(!body.contains(token));
    // A browser is shown the login form, posting to /login from any page.
    let mut r = awc::Client::default()
        .get(format!("http://{a}/machines/{}", f.pending))
        .insert_header(("Accept", "text/html"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let body = String::from_utf8_lossy(&r.body().await.unwrap()).into_owned();
    assert!(body.contains("action=\"../login\""), "{body}");
    // Logging in: a wrong token is refused, the right one sets the cookie,
    // which then opens the pages.
    let login = |t: &'static str| async move {
        let client = awc::Client::builder().disable_redirects().finish();
        let r = client
            .post(format!("http://{a}/login"))
            .send_form(&[("token", t)])
            .await
            .unwrap();
        let cookie = r
            .headers()
            .get("set-cookie")
            .map(|v| v.to_str().unwrap().to_string());
        (r.status().as_u16(), cookie)
    };
    assert_eq!(login("wrong").await, (401, None));
    let (status, cookie) = login("s3cret-admin-token").await;
    assert_eq!(status, 303);
    let cookie = cookie.unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_string();
    let r = awc::Client::default()
        .get(format!("http://{a}/"))
        .insert_header(("Cookie", pair))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

#[actix_rt::test]
async fn a_wrong_method_is_405_with_allow_and_errors_are_json() {
    let f = fleet().await;
    let a = serve(&f, None);
    let client = awc::Client::default();
    for path in ["/healthz", "/metrics", "/api/v1/machines", "/"] {
        let mut r = client
            .post(format!("http://{a}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 405, "POST {path}");
        assert_eq!(
            r.headers().get("allow").and_then(|v| v.to_str().ok()),
            Some("GET, HEAD"),
            "POST {path}"
        );
        let body: serde_json::Value = serde_json::from_slice(&r.body().await.unwrap()).unwrap();
        assert!(body["error"].as_str().unwrap().contains("POST"), "{body}");
    }
    let r = client
        .head(format!("http://{a}/api/v1/machines"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // A query that does not parse: 400, JSON, naming the field.
    let (status, body) = get(format!("http://{a}/api/v1/machines?limit=lots"), None).await;
    assert_eq!(status, 400, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("a JSON error body");
    assert!(v["error"].as_str().unwrap().contains("limit"), "{v}");
}

/// The page as headless Chromium renders it (its DOM, serialized).
async fn rendered(url: String) -> String {
    tokio::task::spawn_blocking(move || {
        let profile = tempfile::tempdir().unwrap();
        let out = Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--virtual-time-budget=2000",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("--dump-dom")
            .arg(&url)
            .output()
            .expect("Debian's chromium is installed (scripts/test installs it)");
        assert!(
            out.status.success(),
            "chromium: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
    .await
    .unwrap()
}

/// A state's count in the fleet page's table of counts.
fn count_cell(dom: &str, state: &str) -> String {
    let table = dom
        .split("<table id=\"counts\"")
        .nth(1)
        .expect("the counts");
    let row = table
        .split(&format!("data-state=\"{state}\""))
        .nth(1)
        .expect("a row per state");
    let cell = row.split("class=\"count\">").nth(1).unwrap();
    cell.split('<').next().unwrap().to_string()
}

#[actix_rt::test]
async fn the_pages_render_in_a_browser() {
    let f = fleet().await;
    let a = serve(&f, None);
    let dom = rendered(format!("http://{a}/")).await;
    assert!(dom.contains("<p id=\"total\">4 machines</p>"), "{dom}");
    for (state, n) in [
        ("pending", "1"),
        ("backoff", "1"),
        ("leased", "1"),
        ("agent-started", "1"),
        ("installed", "0"),
    ] {
        assert_eq!(count_cell(&dom, state), n, "{state}");
        // The drawn life cycle says the same, and links to the filter.
        let drawn = dom
            .split(&format!("<a href=\"?state={state}\"><g class=\"state"))
            .nth(1)
            .unwrap_or_else(|| panic!("{state} drawn: {dom}"));
        assert!(
            drawn.contains(&format!("data-count=\"{n}\"")),
            "{state}: {}",
            &drawn[..200.min(drawn.len())]
        );
    }
    assert_eq!(dom.matches("<tr class=\"machine\"").count(), 4);
    assert!(dom.contains(&format!("href=\"machines/{}\"", f.started)));

    // Paging: two pages of two, linked both ways, together the fleet.
    let first = rendered(format!("http://{a}/?limit=2")).await;
    assert!(first.contains("showing 1 to 2"), "{first}");
    assert!(
        first.contains("rel=\"next\" href=\"?limit=2&amp;offset=2\""),
        "{first}"
    );
    let second = rendered(format!("http://{a}/?limit=2&offset=2")).await;
    assert!(second.contains("showing 3 to 4"), "{second}");
    assert!(
        second.contains("rel=\"prev\" href=\"?limit=2\""),
        "{second}"
    );
    assert!(!second.contains("rel=\"next\""), "{second}");
    let mut ids: Vec<&str> = [&first, &second]
        .iter()
        .flat_map(|d| d.split("data-machine=\"").skip(1))
        .map(|s| s.split('"').next().unwrap())
        .collect();
    ids.sort();
    let mut all = [f.pending, f.started, f.backed_off, f.leased].map(|u| u.to_string());
    all.sort();
    assert_eq!(ids, all);

    let dom = rendered(format!("http://{a}/machines/{}", f.backed_off)).await;
    assert!(dom.contains("<td id=\"state\">backoff</td>"), "{dom}");
    assert_eq!(dom.matches("<tr class=\"event").count(), 2, "{dom}");
    assert_eq!(dom.matches("<tr class=\"event work failed\">").count(), 1);
    // The cause is text, not markup.
    assert!(
        dom.contains("connect to &lt;127.0.0.2&gt;: refused &amp; gone"),
        "{dom}"
    );
}

/// Serves one page, on another origin, whose form posts `action` (the
/// cross-site attacker's page).
fn evil_page(action: String) -> SocketAddr {
    let html = format!(
        "<!doctype html><html><body><form method=\"post\" action=\"{action}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"00\"><button id=\"go\" type=\"submit\">win</button>\
         </form></body></html>"
    );
    let server = actix_web::HttpServer::new(move || {
        let html = html.clone();
        actix_web::App::new().default_service(actix_web::web::to(move || {
            let html = html.clone();
            async move {
                actix_web::HttpResponse::Ok()
                    .content_type("text/html")
                    .body(html)
            }
        }))
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")
    .unwrap();
    let addr = server.addrs()[0];
    actix_rt::spawn(server.run());
    addr
}

#[actix_rt::test]
async fn an_operator_logs_in_filters_searches_and_holds_a_machine_in_a_browser() {
    let f = fleet().await;
    let token = "browser-admin-token-0123";
    let a = serve(&f, Some(token));
    let evil = evil_page(format!("http://{a}/machines/{}/release", f.pending));
    let seen = shepherd_sim::testing::browse(vec![
        "walk".into(),
        format!("http://{a}"),
        token.into(),
        f.pending.to_string(),
        f.backed_off.to_string(),
        "device-started".into(),
        format!("http://{evil}/"),
    ])
    .await;
    assert_eq!(seen["login_form"], true, "{seen}");
    assert_eq!(seen["after_login_title"], "shepherd: fleet", "{seen}");
    assert_eq!(seen["state_backoff"], json!([f.backed_off.to_string()]));
    let mut no_agent = vec![
        f.pending.to_string(),
        f.backed_off.to_string(),
        f.leased.to_string(),
    ];
    no_agent.sort();
    assert_eq!(seen["heartbeat_no_agent"], json!(no_agent));
    assert_eq!(seen["search_provider_id"], json!([f.started.to_string()]));
    assert_eq!(
        seen["search_machine_prefix"],
        json!([f.pending.to_string()])
    );
    // The chart counts the history: one takeover, one failure.
    assert_eq!(
        seen["chart"],
        json!({"takeovers": "1", "failures": "1", "recoveries": "0"})
    );
    // A click on the drawn life cycle's backoff state filters the fleet.
    assert_eq!(seen["drawn_count"], "1", "{seen}");
    assert!(
        seen["drawn_state_url"]
            .as_str()
            .unwrap()
            .ends_with("/?state=backoff"),
        "{seen}"
    );
    assert_eq!(seen["drawn_state_rows"], json!([f.backed_off.to_string()]));
    // The bulk hold: reviewed (both listed, the button says how many),
    // confirmed, done on each, both held, audited with the reason.
    let mut chosen = vec![f.backed_off.to_string(), f.leased.to_string()];
    chosen.sort();
    assert_eq!(seen["bulk_chosen"], json!(chosen), "{seen}");
    assert_eq!(seen["bulk_title"], "shepherd: Hold machines?", "{seen}");
    assert_eq!(seen["bulk_listed"], json!(chosen), "{seen}");
    assert_eq!(seen["bulk_button"], "Confirm: Hold 2 machines", "{seen}");
    assert_eq!(
        seen["bulk_done"], "Hold: done on 2 of 2 machines.",
        "{seen}"
    );
    for m in &chosen {
        assert_eq!(seen["bulk_outcomes"][m], "done", "{seen}");
    }
    // The backed-off one shows held; the leased one shows its lease until
    // the lease ends (its hold is audited below all the same).
    assert_eq!(
        seen["held_after_bulk"],
        json!([f.backed_off.to_string()]),
        "{seen}"
    );
    for m in [f.backed_off, f.leased] {
        assert_eq!(
            audit_of(&f.bmdb, m).await,
            vec![("admin".into(), "hold".into(), Some("power work".into()))]
        );
    }
    // The button worked: the page shows the audit entry.
    assert!(
        seen["after_hold_url"]
            .as_str()
            .unwrap()
            .ends_with("#history"),
        "{seen}"
    );
    assert!(
        seen["notice"]
            .as_str()
            .unwrap()
            .starts_with("hold by admin: held"),
        "{seen}"
    );
    assert_eq!(seen["state"], "held");
    let rows = seen["operator_rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{seen}");
    let row = rows[0].as_str().unwrap();
    assert!(
        row.contains("operator admin") && row.contains("hold") && row.contains("reason: rack move"),
        "{row}"
    );
    assert!(
        seen["buttons"]
            .as_array()
            .unwrap()
            .contains(&json!("button-release")),
        "{seen}"
    );
    // The other site's post was refused; the machine is still held.
    assert!(
        seen["cross_site_body"]
            .as_str()
            .unwrap()
            .contains("cross-site request is refused"),
        "{seen}"
    );
    assert_eq!(seen["state_after_cross_site"], "held");
    assert_eq!(
        audit_of(&f.bmdb, f.pending).await,
        vec![("admin".into(), "hold".into(), Some("rack move".into()))]
    );
}

/// A machine's operators' actions: (actor, action, reason).
async fn audit_of(bmdb: &shepherd::bmdb::Bmdb, m: Uuid) -> Vec<(String, String, Option<String>)> {
    bmdb.transact(async |tx| shepherd::bmdb::actions::audit(tx, m).await)
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.actor, a.action, a.reason))
        .collect()
}

/// Form posts as a browser (or a forger) would send them.
async fn form_post(
    a: SocketAddr,
    path: &str,
    headers: &[(&str, String)],
    form: &[(&str, &str)],
) -> (u16, String) {
    let client = awc::Client::builder().disable_redirects().finish();
    let mut req = client.post(format!("http://{a}{path}"));
    for (k, v) in headers {
        req = req.insert_header((*k, v.clone()));
    }
    let mut r = req.send_form(&form).await.unwrap();
    let body = r.body().await.unwrap();
    (
        r.status().as_u16(),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[actix_rt::test]
async fn forms_are_refused_across_sites_and_without_a_valid_csrf_token() {
    let f = fleet().await;
    let token = "forms-admin-token-0123";
    let a = serve(&f, Some(token));
    let bearer = ("Authorization", format!("Bearer {token}"));
    // The CSRF token as the page gives it.
    let (_, page) = get(format!("http://{a}/machines/{}", f.pending), Some(token)).await;
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("the page's forms carry a CSRF token")
        .to_string();
    let path = format!("/machines/{}/hold", f.pending);
    for (what, headers, csrf, want) in [
        ("no token", vec![], csrf.as_str(), 401),
        (
            "another origin",
            vec![bearer.clone(), ("Origin", "http://127.0.0.1:1".into())],
            csrf.as_str(),
            403,
        ),
        (
            "a cross-site fetch",
            vec![bearer.clone(), ("Sec-Fetch-Site", "cross-site".into())],
            csrf.as_str(),
            403,
        ),
        ("a forged CSRF token", vec![bearer.clone()], "abcd", 403),
        (
            "a CSRF token changed by one digit",
            vec![bearer.clone()],
            &one_digit_changed(&csrf),
            403,
        ),
    ] {
        let (status, body) =
            form_post(a, &path, &headers, &[("csrf", csrf), ("reason", "x")]).await;
        assert_eq!(status, want, "{what}: {body}");
    }
    assert_eq!(
        shepherd_sim::testing::count(&f.bmdb, "SELECT count(*) FROM operator_action").await,
        0
    );
    // The page's own post, same origin: done, and back to the page.
    let (status, body) = form_post(
        a,
        &path,
        &[
            bearer.clone(),
            ("Origin", format!("http://{a}")),
            ("Sec-Fetch-Site", "same-origin".into()),
        ],
        &[("csrf", &csrf), ("reason", "x")],
    )
    .await;
    assert_eq!(status, 303, "{body}");
    assert_eq!(
        shepherd_sim::testing::count(&f.bmdb, "SELECT count(*) FROM machine_hold").await,
        1
    );
}

/// A token of the right shape that is not the page's.
fn one_digit_changed(csrf: &str) -> String {
    let mut s: Vec<char> = csrf.chars().collect();
    s[0] = if s[0] == '0' { '1' } else { '0' };
    s.into_iter().collect()
}

#[actix_rt::test]
async fn actions_through_the_json_api_are_audited_by_token_name_and_refused_without_one() {
    let f = fleet().await;
    let a = serve(&f, Some("api-admin-token-0123"));
    let post = |path: String, token: Option<&'static str>, body: Option<serde_json::Value>| async move {
        let client = awc::Client::builder().disable_redirects().finish();
        let mut req = client.post(format!("http://{a}{path}"));
        if let Some(t) = token {
            req = req.insert_header(("Authorization", format!("Bearer {t}")));
        }
        let mut r = match body {
            Some(b) => req.send_json(&b).await.unwrap(),
            None => req.send().await.unwrap(),
        };
        let body = r.body().await.unwrap();
        (
            r.status().as_u16(),
            serde_json::from_slice::<serde_json::Value>(&body).unwrap_or(json!(null)),
        )
    };
    let tok = Some("api-admin-token-0123");
    let hold = format!("/api/v1/machines/{}/hold", f.pending);
    assert_eq!(post(hold.clone(), None, Some(json!({}))).await.0, 401);
    // A body of another type is refused; no body at all needs no type.
    let mut r = awc::Client::default()
        .post(format!("http://{a}{hold}"))
        .insert_header(("Authorization", "Bearer api-admin-token-0123"))
        .insert_header(("Content-Type", "text/plain"))
        .send_body(r#"{"reason": "typed as text"}"#)
        .await
        .unwrap();
    let body = r.body().await.unwrap();
    assert_eq!(r.status().as_u16(), 415, "no JSON type: {body:?}");
    let retry = format!("/api/v1/machines/{}/retry", f.pending);
    let (st, v) = post(retry, tok, None).await;
    assert!(
        st == 200 || st == 409,
        "an empty POST without a type is taken: {st} {v}"
    );
    let (st, v) = post(hold.clone(), tok, Some(json!({"reasons": "typo"}))).await;
    assert_eq!(st, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("reasons"), "{v}");
    let (st, v) = post(
        format!("/api/v1/machines/{}/explode", f.pending),
        tok,
        Some(json!({})),
    )
    .await;
    assert_eq!(st, 404, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("not an action"),
        "{v}"
    );
    let (st, v) = post(
        format!("/api/v1/machines/{}/hold", uuid::Uuid::new_v4()),
        tok,
        Some(json!({})),
    )
    .await;
    assert_eq!(st, 404, "{v}");
    let (st, v) = post(hold.clone(), tok, Some(json!({"reason": "x".repeat(1001)}))).await;
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .starts_with("reason: 1001 characters"),
        "{v}"
    );
    let (st, v) = post(hold.clone(), tok, Some(json!({"reason": "bios update"}))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["action"]["actor"], "admin");
    assert_eq!(v["action"]["action"], "hold");
    let (st, v) = post(
        format!("/api/v1/machines/{}/retry", f.backed_off),
        tok,
        Some(json!({"process": "ShepherdAgentStart"})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = post(
        format!("/api/v1/machines/{}/retry", f.backed_off),
        tok,
        Some(json!({})),
    )
    .await;
    assert_eq!(st, 409, "nothing left to retry: {v}");
    let (st, v) = post(
        format!("/api/v1/machines/{}/retakeover", f.leased),
        tok,
        Some(json!({})),
    )
    .await;
    assert_eq!(st, 409, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("leased for ShepherdAgentStart"),
        "{v}"
    );
    let (_, body) = get(format!("http://{a}/api/v1/machines/{}", f.pending), tok).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["hold"]["by"], "admin", "{v}");
    assert_eq!(v["operator_actions"][0]["reason"], "bios update", "{v}");
    assert_eq!(v["machine"]["state"], "held");
    // GET on an action is 405, naming POST.
    let (st, _) = get(format!("http://{a}{hold}"), tok).await;
    assert_eq!(st, 405);
}

#[actix_rt::test]
async fn small_defects_found_from_outside_stay_fixed() {
    let f = fleet().await;
    let token = "s3cret-admin-token";
    let a = serve(&f, Some(token));
    let client = awc::Client::default();
    // The bearer scheme is case-insensitive (RFC 7235).
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let r = client
            .get(format!("http://{a}/api/v1/machines"))
            .insert_header(("Authorization", format!("{scheme} {token}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{scheme}");
    }
    // The largest offset, with and without a state (found by schemathesis:
    // the page's end overflowed a bigint): an empty page, not a 500.
    for filter in ["", "state=pending&"] {
        let (status, body) = get(
            format!(
                "http://{a}/api/v1/machines?{filter}limit=1&offset={}",
                i64::MAX
            ),
            Some(token),
        )
        .await;
        assert_eq!(status, 200, "{filter}: {body}");
        let page: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(page["machines"], serde_json::json!([]), "{body}");
    }
    // Every answer carries nosniff: pages, JSON, errors, health, 404s.
    for (path, tok) in [
        ("/healthz", None),
        ("/api/v1/machines", Some(token)),
        ("/api/v1/machines", None),
        ("/api/v1/machines/nope", Some(token)),
        ("/metrics", Some(token)),
        ("/", Some(token)),
        ("/login", None),
    ] {
        let mut req = client.get(format!("http://{a}{path}"));
        if let Some(t) = tok {
            req = req.insert_header(("Authorization", format!("Bearer {t}")));
        }
        let r = req.send().await.unwrap();
        assert_eq!(
            r.headers()
                .get("x-content-type-options")
                .and_then(|v| v.to_str().ok()),
            Some("nosniff"),
            "{path}"
        );
    }
    // Errors do not echo markup from the request.
    for path in [
        "/api/v1/machines/%3Cscript%3Ealert(1)%3C%2Fscript%3E",
        "/api/v1/machines?%3Cscript%3E=1",
        "/api/v1/machines?state=%3Cscript%3E",
    ] {
        let (status, body) = get(format!("http://{a}{path}"), Some(token)).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(!body.contains('<') && !body.contains('>'), "{path}: {body}");
        serde_json::from_str::<serde_json::Value>(&body).expect("JSON");
    }
    // Paging out of range is a 400 naming the field, not clamped.
    for (q, field) in [
        ("limit=0", "limit"),
        ("limit=-1", "limit"),
        ("limit=1001", "limit"),
        ("offset=-5", "offset"),
    ] {
        let (status, body) = get(format!("http://{a}/api/v1/machines?{q}"), Some(token)).await;
        assert_eq!(status, 400, "{q}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(v["error"].as_str().unwrap().starts_with(field), "{q}: {v}");
    }
    let (status, _) = get(
        format!("http://{a}/api/v1/machines?limit=1000&offset=0"),
        Some(token),
    )
    .await;
    assert_eq!(status, 200);
    // Help texts end in one period (the library adds it).
    let (_, body) = get(format!("http://{a}/metrics"), Some(token)).await;
    let helps: Vec<&str> = body.lines().filter(|l| l.starts_with("# HELP")).collect();
    assert!(!helps.is_empty());
    for h in helps {
        assert!(!h.ends_with(".."), "{h}");
    }
}

/// Markup tried through every field an operator, a tenant or a machine's
/// provider sets that the pages show: a host's ID and address, a failure's
/// cause, a hold's reason, a project's name, a search. The browser runs
/// nothing of it: the title stays, no element it names appears, and the
/// text reads as typed.
#[actix_rt::test]
async fn markup_in_any_field_is_shown_as_text_and_runs_nowhere() {
    const SCRIPT: &str = "<script>document.title='PWNED'</script>";
    const IMG: &str = "\"><img src=x id=pwned onerror=\"document.title='PWNED'\">";
    const SVG: &str = "<svg id=pwned2 onload=\"document.title='PWNED'\"></svg>";
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let m = NewProvidedMachine {
        provider: Provider::Equinix,
        provider_id: format!("host{SCRIPT}"),
        reservation_id: None,
        ip_address: Some(IMG.into()),
        location: Some(SVG.into()),
        status: None,
    };
    let id = bmdb
        .transact(async |tx| machines::create_provided(tx, &m).await)
        .await
        .unwrap();
    let session = bmdb
        .start_session(&format!("session{SVG}"), Some(Duration::from_secs(60)))
        .await
        .unwrap();
    let pick = |id: Uuid| async move |_tx: &mut shepherd::bmdb::Tx<'_>| Ok(Some((id, ())));
    let mut w = session
        .lease(Process::ShepherdAgentStart, pick(id))
        .await
        .unwrap()
        .unwrap();
    w.fail(
        &Backoff::constant(Duration::from_secs(600)),
        &format!("cause{IMG}{SCRIPT}"),
    )
    .await
    .unwrap();
    bmdb.transact(async |tx| {
        let p: Uuid = tx
            .query_one(
                "INSERT INTO project (name, created_by) VALUES ($1, 'test') RETURNING project_id",
                &[&format!("project{IMG}")],
            )
            .await?
            .get(0);
        tx.execute(
            "INSERT INTO machine_project VALUES ($1, $2, now(), 'test')",
            &[&id, &p],
        )
        .await
    })
    .await
    .unwrap();
    let f = Fleet {
        _db: db,
        bmdb: bmdb.clone(),
        pending: id,
        started: id,
        backed_off: id,
        leased: id,
        _session: session,
    };
    let a = serve(&f, None);
    let mut r = awc::Client::default()
        .post(format!("http://{a}/api/v1/machines/{id}/hold"))
        .send_json(&json!({ "reason": format!("reason{SCRIPT}{IMG}") }))
        .await
        .unwrap();
    let body = r.body().await.unwrap();
    assert_eq!(r.status(), 200, "{body:?}");
    let q: String = form_urlencoded::byte_serialize(SCRIPT.as_bytes()).collect();
    for url in [
        format!("http://{a}/"),
        format!("http://{a}/?q={q}"),
        format!("http://{a}/machines/{id}"),
        format!("http://{a}/rollouts"),
        format!("http://{a}/firmware"),
    ] {
        let dom = rendered(url.clone()).await;
        assert!(dom.contains("<title>shepherd"), "{url}: {dom}");
        assert!(!dom.contains("PWNED</title>"), "{url} ran a script");
        for element in ["id=\"pwned\"", "id=\"pwned2\"", "<script>document"] {
            assert!(!dom.contains(element), "{url}: {element} became markup");
        }
        // No script element but shepherd's own (the fleet page's live
        // updates, a constant of the crate).
        for script in dom.split("<script").skip(1) {
            assert!(
                script.starts_with(">(function () {")
                    && script.contains("new EventSource(\"events\")"),
                "{url}: a script element: {script}"
            );
        }
    }
    // Shown as typed, escaped.
    let machine = rendered(format!("http://{a}/machines/{id}")).await;
    for shown in [
        "host&lt;script&gt;document.title='PWNED'&lt;/script&gt;",
        "reason&lt;script&gt;",
        "cause\"&gt;&lt;img src=x id=pwned",
        "project\"&gt;&lt;img",
    ] {
        assert!(machine.contains(shown), "{shown} in {machine}");
    }
}
