//! A baseline rolled out over a fleet of owned machines: `shepherd run`
//! (a process of its own) over an inventory of N hosts whose BMCs are
//! simulated (`shepherd_sim::bmc`, in this process, each on an address of
//! its own), their firmware updates taking `task time` and failing on 2%
//! of the machines (the same ones every run), 5% of the machines a
//! tenant's (installed). Two rollouts of one baseline (a BIOS firmware
//! update, two BIOS settings, a RAID1 volume), each `max_parallel` at a
//! time: the first stops after a few failures, as its policy says; the
//! second (many failures allowed) takes the rest, skipping what failed.
//!
//!     cargo bench --bench servicing
//!
//! SHEPHERD_BENCH_MACHINES (default 1000), SHEPHERD_BENCH_PARALLEL
//! (default 64), SHEPHERD_BENCH_TASK_MS (default 2000). Prints, per
//! rollout: wall time, machines done / failed / skipped / never asked;
//! then over both: restarts per serviced machine (at most 1), updates per
//! machine (at most 1: none updated twice), updates a BMC refused because
//! one ran (0: never two at once), tenants' BMCs touched (0), shepherd's
//! peak RSS, and its BMDB transactions per serviced machine (its own
//! count, every loop's included).

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shepherd_sim::bmc::{BmcSim, FirmwareOptions, firmware_image};
use shepherd_sim::testing::{ShepherdProcess, Sshd, TestDb};

const SHEPHERD: &str = env!("CARGO_BIN_EXE_shepherd");
const TOKEN: &str = "servicing-bench-token-7a31";

fn env(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Admin {
    base: String,
}

impl Admin {
    async fn call(&self, post: Option<Value>, path: &str) -> Value {
        let c = awc::Client::builder()
            .timeout(Duration::from_secs(60))
            .finish();
        let url = format!("{}/{path}", self.base);
        let auth = ("Authorization", format!("Bearer {TOKEN}"));
        let mut r = match post {
            Some(b) => c.post(url).insert_header(auth).send_json(&b).await,
            None => c.get(url).insert_header(auth).send().await,
        }
        .unwrap();
        r.json().limit(64 << 20).await.unwrap_or(Value::Null)
    }

    /// `shepherd_bmdb_transactions_total{outcome="committed"}`.
    async fn transactions(&self) -> f64 {
        let mut r = awc::Client::default()
            .get(format!("{}/metrics", self.base))
            .insert_header(("Authorization", format!("Bearer {TOKEN}")))
            .send()
            .await
            .unwrap();
        let body = r.body().limit(64 << 20).await.unwrap_or_default();
        String::from_utf8_lossy(&body)
            .lines()
            .filter(|l| {
                l.starts_with("shepherd_bmdb_transactions_total") && l.contains("committed")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Runs a rollout of the baseline to its end: (its detail, seconds).
    async fn rollout(&self, parallel: u64, failures: u64) -> (Value, f64) {
        let started = Instant::now();
        let v = self
            .call(
                Some(json!({"baseline": "bench", "max_parallel": parallel,
                            "max_failures": failures})),
                "api/v1/rollouts",
            )
            .await;
        let id = v["rollout"]["rollout_id"]
            .as_str()
            .unwrap_or_else(|| panic!("the rollout was not made: {v}"))
            .to_string();
        loop {
            let r = self.call(None, &format!("api/v1/rollouts/{id}")).await;
            if r["rollout"]["state"] != "running" {
                return (r, started.elapsed().as_secs_f64());
            }
            assert!(
                started.elapsed() < Duration::from_secs(1800),
                "the rollout ran 30 min: {}",
                r["rollout"]
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

fn main() {
    let n = env("SHEPHERD_BENCH_MACHINES", 1000) as usize;
    let parallel = env("SHEPHERD_BENCH_PARALLEL", 64);
    let task = Duration::from_millis(env("SHEPHERD_BENCH_TASK_MS", 2000));
    actix_rt::System::new().block_on(async move {
        let db = TestDb::new().await;
        let bmdb = db.bmdb().await;
        let dir = tempfile::tempdir().unwrap();
        let addresses: Vec<IpAddr> = (0..n)
            .map(|i| IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 0, 80, 1)) + i as u32)))
            .collect();
        let sim = BmcSim::start_with(
            &addresses,
            Sshd::free_port(),
            Duration::from_millis(500),
            std::sync::Arc::new(|_| {}),
            FirmwareOptions::failing_share(task, 0.02),
        )
        .unwrap();
        let images = dir.path().join("images");
        std::fs::create_dir(&images).unwrap();
        std::fs::write(images.join("bios-2.0.bin"), firmware_image("BIOS", "2.0")).unwrap();
        let admin_port = Sshd::free_port();
        let mut config = format!(
            r#"
[bmdb]
url = "{url}"

[ssh]
key_file = "{dir}/id_ed25519"

[bmaas]
listen = "127.0.0.1:{callback}"

[admin]
listen = "127.0.0.1:{admin_port}"
token = "{TOKEN}"

[installations]
images_dir = "{images}"
images_listen = "127.0.0.1:{images_port}"
rollout_interval = "1s"

[recoverer]
enabled = false

[provisioner]
chunk_size = {n}

[updater]
interval = "5s"
firmware_interval = "1h"

[redfish]
max_concurrent = 64

[servicing]
parallelism = {parallel}
poll_interval = "500ms"
poll = "500ms"

[log]
level = "warn"

[provider]
kind = "static"

[[baselines]]
name = "bench"
components = [{{ component = "bios", version = "2.0", image = "bios-2.0.bin" }}]
bios = {{ ProcVirtualization = "Enabled", SriovGlobalEnable = "Enabled" }}
raid = [{{ raid_type = "RAID1", drives = 2 }}]
"#,
            url = db.url(),
            dir = dir.path().display(),
            callback = Sshd::free_port(),
            images = images.display(),
            images_port = Sshd::free_port(),
        );
        for (i, a) in addresses.iter().enumerate() {
            config.push_str(&format!(
                "[[provider.inventory.machines]]\nid = \"node-{i}\"\naddress = \"{a}\"\n\
                 bmc = {{ url = \"{}\", username = \"{}\", password = \"{}\" }}\n",
                sim.url(*a),
                sim.user,
                sim.password
            ));
        }
        let path = dir.path().join("shepherd.toml");
        std::fs::write(&path, config).unwrap();
        let mut shepherd = ShepherdProcess::start(
            Path::new(SHEPHERD),
            &path,
            dir.path().join("shepherd.log"),
            &[],
        );
        let admin = Admin {
            base: format!("http://127.0.0.1:{admin_port}"),
        };

        // Listed, their BMCs read; taken over (their agents' rows, as a
        // takeover writes them); 5% installed: tenants' machines.
        let count = async |q: &'static str| -> i64 {
            bmdb.transact(async |tx| Ok(tx.query_one(q, &[]).await?.get(0)))
                .await
                .unwrap_or(0)
        };
        let t0 = Instant::now();
        while count("SELECT count(*) FROM machine_firmware_read").await < n as i64 {
            shepherd.assert_running();
            assert!(t0.elapsed() < Duration::from_secs(600), "BMCs not read in 10 min");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!("  {n} BMCs read in {:.1} s", t0.elapsed().as_secs_f64());
        let tenants = n / 20;
        let tenant_ids: Vec<String> = (0..tenants).map(|i| format!("node-{}", i * 20 + 7)).collect();
        bmdb.transact(async |tx| {
            tx.execute(
                "INSERT INTO machine_agent_started SELECT machine_id, now(), '\\x0101' FROM machines",
                &[],
            )
            .await?;
            tx.execute(
                "WITH t AS (SELECT machine_id FROM machine_provided WHERE provider_id = ANY($1)), \
                 i AS (INSERT INTO machine_installation (machine_id, generation, image_url, \
                        image_digest, requested_at, requested_by, kind) \
                       SELECT machine_id, 1, '', '', now(), 'bench', 'install' FROM t), \
                 r AS (INSERT INTO machine_os_installation_request \
                       SELECT machine_id, 1, '\\x08011234' FROM t) \
                 INSERT INTO machine_os_installation_report (machine_id, generation, \
                        os_installation_result, os_installation_report_raw) \
                 SELECT machine_id, 1, 'Success', '\\x0801' FROM t",
                &[&tenant_ids],
            )
            .await?;
            Ok(())
        })
        .await
        .unwrap();

        let before = admin.transactions().await;
        let (first, first_s) = admin.rollout(parallel, 3).await;
        let (second, second_s) = admin.rollout(parallel, n as u64).await;
        let after = admin.transactions().await;
        let rss = shepherd.peak_rss_mb();
        shepherd.assert_running();

        let counts = sim.counts();
        let tenant_addresses: Vec<IpAddr> = (0..tenants).map(|i| addresses[i * 20 + 7]).collect();
        let restarted: Vec<u32> = counts.values().map(|c| c.restarts).filter(|r| *r > 0).collect();
        let serviced: i64 = count(
            "SELECT count(*) FROM service_history WHERE phase = 'done' AND restarts > 0",
        )
        .await;
        let failed: i64 = count("SELECT count(*) FROM service_history WHERE phase = 'failed'").await;
        let max_updates = counts.values().map(|c| c.updates).max().unwrap_or(0);
        let busy: u32 = counts.values().map(|c| c.busy).sum();
        let touched = tenant_addresses
            .iter()
            .filter(|a| counts.get(a).is_some_and(|c| c.updates + c.restarts > 0))
            .count();
        let row = |name: &str, r: &Value, s: f64| {
            let c = &r["rollout"]["counts"];
            println!(
                "| {name} | {} | {:.1} | {} | {} | {} | {} | {} |",
                r["rollout"]["max_failures"],
                s,
                c["done"],
                c["failed"],
                c["skipped"],
                c["waiting"],
                r["rollout"]["state"]
            );
        };
        println!("\nservicing: {n} machines ({tenants} a tenant's), update tasks of {} ms, 2% failing, {parallel} at a time\n", task.as_millis());
        println!("| rollout | max_failures | wall s | done | failed | skipped | never asked | ended |");
        println!("|---|---|---|---|---|---|---|---|");
        row("first", &first, first_s);
        row("second", &second, second_s);
        println!();
        println!("| figure | value |");
        println!("|---|---|");
        println!("| machines serviced (restarted, checked) | {serviced} |");
        println!("| servicings failed (BMC's task) | {failed} |");
        println!(
            "| restarts per restarted machine (max) | {} |",
            restarted.iter().max().unwrap_or(&0)
        );
        println!("| update tasks per machine (max) | {max_updates} |");
        println!("| updates refused busy (two at once) | {busy} |");
        println!("| tenants' BMCs touched | {touched} |");
        println!("| shepherd peak RSS MB | {rss:.0} |");
        println!(
            "| BMDB transactions per serviced machine | {:.1} |",
            (after - before) / serviced.max(1) as f64
        );
        shepherd.terminate(Duration::from_secs(30));
        assert!(restarted.iter().all(|r| *r <= 1), "a machine restarted twice");
        assert!(max_updates <= 1, "a machine updated twice");
        assert_eq!(busy, 0, "a BMC asked for two updates at once");
        assert_eq!(touched, 0, "a tenant's machine touched");
        assert_eq!(first["rollout"]["state"], "stopped", "{}", first["rollout"]);
        assert_eq!(second["rollout"]["state"], "done", "{}", second["rollout"]);
    });
}
