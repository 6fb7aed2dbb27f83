//! What operators plug into their monitoring, checked by Prometheus' own
//! tools: `promtool` checks the alert rules and runs their unit tests; a
//! real Prometheus scrapes a running shepherd (the demo), loads the rules,
//! and answers every query of the Grafana dashboard.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shepherd_sim::testing::Sshd;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn rules() -> PathBuf {
    Path::new(ROOT).join("config/prometheus/shepherd.rules.yml")
}

/// The alerts the rules file names, in its order.
fn alerts() -> Vec<String> {
    std::fs::read_to_string(rules())
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::to_string)
        .collect()
}

fn dashboard() -> serde_json::Value {
    let text = std::fs::read_to_string(Path::new(ROOT).join("config/grafana/shepherd.json"))
        .expect("config/grafana/shepherd.json");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

fn promtool(args: &[&str]) -> String {
    let out = std::process::Command::new("promtool")
        .args(args)
        .current_dir(Path::new(ROOT).join("config/prometheus"))
        .output()
        .expect("promtool (Debian's prometheus package; scripts/test installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let check = promtool(&["check", "rules", "shepherd.rules.yml"]);
    let alerts = alerts();
    assert!(
        check.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{check}"
    );
    let test = promtool(&["test", "rules", "shepherd.rules.test.yml"]);
    assert!(test.contains("SUCCESS"), "{test}");
    println!("{check}{test}");
    // Every alert has a unit test.
    let tests =
        std::fs::read_to_string(Path::new(ROOT).join("config/prometheus/shepherd.rules.test.yml"))
            .unwrap();
    for alert in &alerts {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "alert {alert} has no unit test"
        );
    }
}

/// The dashboard's queries, with Grafana's variables as a query would
/// have them: (panel title, expression).
fn dashboard_queries(d: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("every target has an expression");
            let expr = expr
                .replace("$__rate_interval", "1m")
                .replace("$instance", ".*");
            out.push((p["title"].as_str().unwrap().to_string(), expr));
        }
    }
    out
}

/// The metric names an expression reads.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("shepherd_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        names.insert(expr[start..end].to_string());
        i = end;
    }
    names
}

/// The families a /metrics text declares, with the sample names each
/// stands for (`_total`, `_bucket`, …).
fn exposed(metrics: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for l in metrics.lines() {
        let Some(rest) = l.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut it = rest.split_whitespace();
        let (Some(name), Some(kind)) = (it.next(), it.next()) else {
            continue;
        };
        out.insert(name.to_string());
        match kind {
            "counter" => {
                out.insert(format!("{name}_total"));
            }
            "histogram" => {
                for s in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{s}"));
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
fn the_dashboard_is_a_grafana_dashboard_over_shepherds_series() {
    let d = dashboard();
    assert_eq!(d["uid"], "shepherd-fleet");
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36);
    let panels = d["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "duplicate panel id {}",
            p["id"]
        );
        let g = &p["gridPos"];
        let (x, w) = (g["x"].as_u64().unwrap(), g["w"].as_u64().unwrap());
        assert!(x + w <= 24, "{} is wider than the grid", p["title"]);
        if p["type"] != "row" {
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
            assert!(
                !p["targets"].as_array().unwrap().is_empty(),
                "{} has no query",
                p["title"]
            );
        }
    }
    assert!(dashboard_queries(&d).len() >= 25);
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn get_json(url: &str) -> Option<serde_json::Value> {
    let mut r = awc::Client::default()
        .get(url)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .ok()?;
    r.json::<serde_json::Value>().limit(16 << 20).await.ok()
}

async fn query(prometheus: &str, expr: &str) -> serde_json::Value {
    let url = format!("{prometheus}/api/v1/query?query={}", url_escape(expr));
    get_json(&url).await.unwrap_or(serde_json::Value::Null)
}

fn url_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[actix_rt::test]
async fn prometheus_scrapes_a_demo_loads_the_rules_and_answers_every_dashboard_query() {
    let dir = tempfile::tempdir().unwrap();
    let admin = format!("127.0.0.1:{}", Sshd::free_port());
    let _demo = Child(
        std::process::Command::new(shepherd_sim::bin("shepherd-demo"))
            .args([
                "--machines",
                "4",
                "--keep-running",
                "--admin-listen",
                &admin,
            ])
            .current_dir(dir.path())
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(dir.path().join("demo.out")).unwrap())
            .stderr(std::fs::File::create(dir.path().join("demo.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    // The demo's /metrics once its fleet heartbeats.
    let started = Instant::now();
    let metrics = loop {
        if let Ok(mut r) = awc::Client::default()
            .get(format!("http://{admin}/metrics"))
            .send()
            .await
        {
            let body = r.body().limit(16 << 20).await.unwrap_or_default();
            let text = String::from_utf8_lossy(&body).into_owned();
            if text.contains("shepherd_agents{state=\"heartbeating\"} 4") {
                break text;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the demo did not come up:\n{}",
            std::fs::read_to_string(dir.path().join("demo.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };

    // Every series the dashboard and the rules read is one shepherd serves.
    let serves = exposed(&metrics);
    let d = dashboard();
    let queries = dashboard_queries(&d);
    let rules_text = std::fs::read_to_string(rules()).unwrap();
    let mut read: BTreeSet<String> = metric_names(&rules_text);
    for (_, q) in &queries {
        read.extend(metric_names(q));
    }
    let unknown: Vec<_> = read.iter().filter(|n| !serves.contains(*n)).collect();
    assert!(
        unknown.is_empty(),
        "read but not served: {unknown:?}\n{metrics}"
    );

    // A real Prometheus scraping it every second, with the rules.
    let web = format!("127.0.0.1:{}", Sshd::free_port());
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: shepherd\n    static_configs:\n      - targets: ['{admin}']\n",
            rules().display()
        ),
    )
    .unwrap();
    let _prometheus = Child(
        std::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus (Debian's prometheus package; scripts/test installs it)"),
    );
    let prometheus = format!("http://{web}");
    let log = || std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
    // A few scrapes, so that rates over a minute have two samples.
    let started = Instant::now();
    loop {
        let r = query(&prometheus, "count_over_time(shepherd_session_up[1m])").await;
        if r["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(|n| n >= 5.0)
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "Prometheus did not scrape the demo: {r}\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The rules loaded, each evaluated without error.
    let rules = get_json(&format!("{prometheus}/api/v1/rules"))
        .await
        .unwrap();
    let groups = rules["data"]["groups"].as_array().unwrap();
    let loaded: Vec<&serde_json::Value> = groups
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    assert_eq!(loaded.len(), alerts().len(), "{rules}");
    for r in &loaded {
        assert_eq!(r["health"], "ok", "{r}");
    }
    // A healthy demo fires nothing.
    let firing: Vec<_> = loaded
        .iter()
        .filter(|r| r["state"] == "firing")
        .map(|r| r["name"].clone())
        .collect();
    assert!(
        firing.is_empty(),
        "alerts firing on a healthy demo: {firing:?}"
    );

    // Every query of the dashboard runs; those that a running fleet must
    // fill have data.
    let must_have_data = [
        "Shepherds with a live session",
        "BMDB sessions alive",
        "BMDB answering",
        "Recovery brake",
        "Machines per state",
        "Agents",
        "Leases ended",
        "Workers",
        "Heartbeats",
        "Transactions",
        "Requests",
        "Request budget used",
    ];
    let mut empty = Vec::new();
    for (title, expr) in &queries {
        let r = query(&prometheus, expr).await;
        assert_eq!(r["status"], "success", "{title}: {expr}: {r}");
        if r["data"]["result"].as_array().is_none_or(|a| a.is_empty()) {
            empty.push(title.clone());
        }
    }
    for t in must_have_data {
        assert!(queries.iter().any(|(q, _)| q == t), "no panel {t}");
        assert!(
            !empty.contains(&t.to_string()),
            "{t} has no data: {empty:?}"
        );
    }
    println!(
        "{} dashboard queries answered by Prometheus; without data on a healthy demo: {empty:?}",
        queries.len()
    );
}
