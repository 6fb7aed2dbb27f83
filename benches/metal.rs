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

use serde_json::json;
use shepherd_sim::testing::OwnedRack;

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
    let mut rack = OwnedRack::start(n, Ipv4Addr::new(127, 0, 81, 1), "2s", 16 << 20, &[]).await;
    // The machines taken over, erased once, available.
    let ten = Duration::from_secs(600);
    let b = &rack.admin;
    b.wait(&mut rack.shepherd, "agent-started", n, ten).await;
    rack.deprovision_all().await;
    b.wait(&mut rack.shepherd, "available", n, ten).await;
    let (project, token) = rack.project("bench");

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
                let body = json!({"metro": "sv", "plan": OwnedRack::PLAN,
                    "operating_system": OwnedRack::OPERATING_SYSTEM, "hostname": format!("bench-{i}")});
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
    let body = json!({"metro": "sv", "plan": OwnedRack::PLAN, "operating_system": OwnedRack::OPERATING_SYSTEM});
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
}
