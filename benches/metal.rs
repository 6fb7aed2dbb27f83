//! The Metal API's figures, one run against a simulated owned fleet
//! (`fleet-sim --provider static`) and one `shepherd run` serving HTTPS:
//!
//! 1. token-authenticated reads (`GET /projects/{id}`, every one looking
//!    its token up in the BMDB by SHA-256), 8 clients for 5 s: answers per
//!    second, latency p50 and p99;
//! 2. creates, 8 in flight, until every machine holds a device: creates
//!    per second, latency p50 and p99 (each claims a machine and asks its
//!    installation in one transaction), and the no-capacity answer after;
//! 3. a project's device list (every device in one page): latency p50;
//! 4. the time from the first create to every device `active` (the
//!    simulated machines install a 16 MiB image).
//!
//!     cargo bench --bench metal
//!
//! SHEPHERD_BENCH_MACHINES (default 60) sizes the fleet. Needs PostgreSQL
//! at 127.0.0.1:5432 (or its server binaries) and sfdisk.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shepherd_sim::testing::{FleetSimProcess, ShepherdProcess, Sshd, TestDb};

struct Bench {
    shepherd: ShepherdProcess,
    client: awc::Client,
    base: String,
    config: std::path::PathBuf,
    env: Vec<(&'static str, String)>,
}

impl Bench {
    fn cli(&self, args: &[&str]) -> String {
        let out = std::process::Command::new(shepherd_sim::bin("shepherd"))
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let mut req = self.client.request(
            awc::http::Method::from_bytes(method.as_bytes()).unwrap(),
            &url,
        );
        if let Some(t) = token {
            req = req.insert_header(("X-Auth-Token", t));
        }
        let mut r = match body {
            Some(b) => req.send_json(&b).await,
            None => req.send().await,
        }
        .unwrap_or_else(|e| panic!("{url}: {e}"));
        let status = r.status().as_u16();
        let bytes = r.body().limit(64 << 20).await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn count(&self, state: &str) -> usize {
        let (_, b) = self
            .call(
                "GET",
                &format!("/api/v1/machines?state={state}&limit=1000"),
                None,
                None,
            )
            .await;
        b["machines"].as_array().map_or(0, Vec::len)
    }

    async fn wait(&mut self, state: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(600);
        while self.count(state).await < n {
            self.shepherd.assert_running();
            assert!(
                Instant::now() < deadline,
                "{state}: {}",
                self.shepherd.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

fn main() {
    let machines: usize = std::env::var("SHEPHERD_BENCH_MACHINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    actix_rt::System::new().block_on(run(machines));
}

async fn run(n: usize) {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let fleet = FleetSimProcess::start(
        &shepherd_sim::bin("fleet-sim"),
        dir.path(),
        n,
        Ipv4Addr::new(127, 0, 81, 1),
        &[
            "--agent-interval",
            "2s",
            "--provider",
            "static",
            "--location",
            "sv",
        ],
    );
    let images = dir.path().join("images");
    std::fs::create_dir(&images).unwrap();
    shepherd_sim::testing::gpt_image(&images.join("os.img"), 16 << 20);
    let config = dir.path().join("shepherd.toml");
    let mut text = std::fs::read_to_string(&fleet.config).unwrap();
    text.push_str(
        "\n[admin.tls]\nenabled = true\n\n[[metal.plans]]\nslug = \"c3.small.x86\"\ncpus_min = 8\n\n\
         [[metal.operating_systems]]\nslug = \"debian_12\"\nname = \"Debian 12\"\nimage = \"os.img\"\n",
    );
    std::fs::write(&config, text).unwrap();
    let admin = format!("127.0.0.1:{}", Sshd::free_port());
    let callback = format!("127.0.0.1:{}", Sshd::free_port());
    let env: Vec<(&'static str, String)> = vec![
        ("SHEPHERD__BMDB__URL", db.url()),
        ("SHEPHERD__ADMIN__LISTEN", admin.clone()),
        ("SHEPHERD__BMAAS__LISTEN", callback.clone()),
        ("SHEPHERD__BMAAS__ENDPOINT", callback),
        (
            "SHEPHERD__INSTALLATIONS__IMAGES_DIR",
            images.display().to_string(),
        ),
        (
            "SHEPHERD__INSTALLATIONS__IMAGES_LISTEN",
            format!("127.0.0.1:{}", Sshd::free_port()),
        ),
        ("SHEPHERD__LOG__LEVEL", "warn".into()),
    ];
    let shepherd = ShepherdProcess::start(
        &shepherd_sim::bin("shepherd"),
        &config,
        dir.path().join("shepherd.log"),
        &env,
    );
    let ca = dir.path().join("fleet/ssh/fleet-ca.pem");
    while !ca.exists() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let der = pem::parse(std::fs::read(&ca).unwrap())
        .unwrap()
        .into_contents();
    let mut b = Bench {
        shepherd,
        client: shepherd_sim::testing::https_client(&der, Duration::from_secs(60)),
        base: format!("https://{admin}"),
        config,
        env,
    };
    // The machines taken over, erased once, available.
    b.wait("agent-started", n).await;
    let (_, list) = b
        .call("GET", "/api/v1/machines?limit=1000", None, None)
        .await;
    for m in list["machines"].as_array().unwrap() {
        let id = m["machine_id"].as_str().unwrap();
        let (s, body) = b
            .call(
                "POST",
                &format!("/api/v1/machines/{id}/deprovision"),
                None,
                Some(json!({"mode": "discard"})),
            )
            .await;
        assert_eq!(s, 200, "{body}");
    }
    b.wait("available", n).await;
    let project: uuid::Uuid = b
        .cli(&["projects", "create", "bench"])
        .trim()
        .parse()
        .unwrap();
    let token = b
        .cli(&["tokens", "create", "--project", &project.to_string()])
        .lines()
        .last()
        .unwrap()
        .to_string();

    // 1. Reads, 8 clients for 5 s.
    let path = format!("/metal/v1/projects/{project}");
    let until = Instant::now() + Duration::from_secs(5);
    let clients = (0..8).map(|_| {
        let (b, path, token) = (&b, &path, &token);
        async move {
            let mut lat = Vec::new();
            while Instant::now() < until {
                let t = Instant::now();
                let (s, _) = b.call("GET", path, Some(token), None).await;
                assert_eq!(s, 200);
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            lat
        }
    });
    let started = Instant::now();
    let mut reads: Vec<f64> = futures::future::join_all(clients).await.concat();
    let read_rate = reads.len() as f64 / started.elapsed().as_secs_f64();
    let (r50, r99) = (quantile(&mut reads, 0.5), quantile(&mut reads, 0.99));

    // 2. Creates, 8 in flight, until no machine is left.
    let create_path = format!("/metal/v1/projects/{project}/devices");
    let next = std::cell::Cell::new(0usize);
    let started = Instant::now();
    let workers = (0..8).map(|_| {
        let (b, create_path, token, next) = (&b, &create_path, &token, &next);
        async move {
            let mut lat = Vec::new();
            loop {
                let i = next.get();
                if i >= n {
                    return lat;
                }
                next.set(i + 1);
                let t = Instant::now();
                let body = json!({"metro": "sv", "plan": "c3.small.x86",
                    "operating_system": "debian_12", "hostname": format!("bench-{i}")});
                let (s, d) = b.call("POST", create_path, Some(token), Some(body)).await;
                assert_eq!(s, 201, "{d}");
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }
    });
    let mut creates: Vec<f64> = futures::future::join_all(workers).await.concat();
    let create_secs = started.elapsed().as_secs_f64();
    let (c50, c99) = (quantile(&mut creates, 0.5), quantile(&mut creates, 0.99));
    let t = Instant::now();
    let body = json!({"metro": "sv", "plan": "c3.small.x86", "operating_system": "debian_12"});
    let (s, _) = b.call("POST", &create_path, Some(&token), Some(body)).await;
    assert_eq!(s, 422, "no capacity");
    let none_ms = t.elapsed().as_secs_f64() * 1000.0;

    // 3. The list, every device in one page.
    let mut lists = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let (s, l) = b
            .call(
                "GET",
                &format!("{create_path}?per_page=1000"),
                Some(&token),
                None,
            )
            .await;
        assert_eq!((s, l["meta"]["total"].as_u64()), (200, Some(n as u64)));
        lists.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let l50 = quantile(&mut lists, 0.5);

    // 4. Every device active.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let (_, l) = b
            .call(
                "GET",
                &format!("{create_path}?per_page=1000"),
                Some(&token),
                None,
            )
            .await;
        let active = l["devices"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["state"] == "active")
            .count();
        if active == n {
            break;
        }
        assert!(Instant::now() < deadline, "{active} of {n} active");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let all_active = started.elapsed().as_secs_f64();

    println!("Metal API, {n} simulated owned machines, HTTPS, 2 cores");
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| token-authenticated reads, 8 clients | {read_rate:.0}/s (p50 {r50:.1} ms, p99 {r99:.1} ms) |"
    );
    println!(
        "| creates, 8 in flight | {:.1}/s (p50 {c50:.1} ms, p99 {c99:.1} ms) |",
        n as f64 / create_secs
    );
    println!("| no-capacity answer | {none_ms:.1} ms |");
    println!("| device list, {n} devices in one page | p50 {l50:.1} ms |");
    println!("| first create to every device active | {all_active:.1} s |");
    drop(fleet);
}
