//! EquinixClient benchmark against the simulator on loopback.
//!
//!     cargo bench --bench equinix
//!
//! 1. Saturation: 32 callers keep the client busy for SHEPHERD_BENCH_SECONDS
//!    (default 5) per interval; achieved calls/s against the allowed
//!    1/interval, and the smallest gap the simulator saw between two
//!    requests (never below the interval: never above the rate).
//! 2. Overhead: sequential calls at zero interval; the client's time per
//!    call minus the simulator's own handling time.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use shepherd::equinix::{ApiMetrics, ClientSettings, EquinixApi};
use shepherd::secret::Secret;
use shepherd_sim::equinix::{SimConfig, Simulator};

fn settings(sim: &Simulator, interval: Duration) -> ClientSettings {
    ClientSettings {
        api_url: sim.api_url(),
        project_id: sim.project_id().to_string(),
        api_key: Secret::inline(sim.token()),
        api_interval: interval,
        parallelism: 1,
        request_timeout: Duration::from_secs(5),
        call_deadline: Duration::from_secs(60),
        retry_initial: Duration::from_millis(10),
        retry_max: Duration::from_millis(100),
        per_page: 100,
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let seconds: u64 = std::env::var("SHEPHERD_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    actix_rt::System::new().block_on(async move {
        let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let sim = Simulator::start(
            SimConfig {
                reservations: 10,
                ..SimConfig::default()
            },
            listen,
        )
        .await
        .unwrap();
        let id = sim.reservation_ids()[0].clone();

        println!();
        println!(
            "EquinixClient under saturation (32 callers, {seconds}s per row, get_reservation)"
        );
        println!(
            "{:>10} {:>10} {:>11} {:>7} {:>14}",
            "interval", "allowed/s", "achieved/s", "ratio", "min gap ms"
        );
        for ms in [50u64, 20, 10] {
            let interval = Duration::from_millis(ms);
            let api = EquinixApi::start(settings(&sim, interval), ApiMetrics::default()).unwrap();
            sim.reset_stats();
            let stop = Instant::now() + Duration::from_secs(seconds);
            let callers: Vec<_> = (0..32)
                .map(|_| {
                    let (api, id) = (api.clone(), id.clone());
                    actix_rt::spawn(async move {
                        while Instant::now() < stop {
                            api.get_reservation(&id).await.unwrap();
                        }
                    })
                })
                .collect();
            for c in callers {
                c.await.unwrap();
            }
            let log = sim.stats().log;
            let mut starts: Vec<u64> = log.iter().map(|e| e.start_us).collect();
            starts.sort();
            let span = (starts[starts.len() - 1] - starts[0]) as f64 / 1e6;
            let achieved = (starts.len() - 1) as f64 / span;
            let allowed = 1000.0 / ms as f64;
            let min_gap = starts.windows(2).map(|w| w[1] - w[0]).min().unwrap() as f64 / 1000.0;
            println!(
                "{:>8}ms {:>10.1} {:>11.2} {:>7.3} {:>14.3}",
                ms,
                allowed,
                achieved,
                achieved / allowed,
                min_gap
            );
        }

        let api = EquinixApi::start(settings(&sim, Duration::ZERO), ApiMetrics::default()).unwrap();
        for _ in 0..200 {
            api.get_reservation(&id).await.unwrap();
        }
        sim.reset_stats();
        let n = 3000;
        let mut client_us = Vec::with_capacity(n);
        let t = Instant::now();
        for _ in 0..n {
            let t = Instant::now();
            api.get_reservation(&id).await.unwrap();
            client_us.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let total = t.elapsed();
        let mut server_us: Vec<f64> = sim
            .stats()
            .log
            .iter()
            .map(|e| (e.end_us - e.start_us) as f64)
            .collect();
        client_us.sort_by(f64::total_cmp);
        server_us.sort_by(f64::total_cmp);
        let (c50, s50) = (percentile(&client_us, 0.5), percentile(&server_us, 0.5));
        let (c99, s99) = (percentile(&client_us, 0.99), percentile(&server_us, 0.99));
        println!();
        println!("EquinixClient overhead at zero interval ({n} sequential calls)");
        println!("{:>22} {:>10} {:>10}", "", "p50 µs", "p99 µs");
        println!("{:>22} {:>10.0} {:>10.0}", "client call", c50, c99);
        println!("{:>22} {:>10.0} {:>10.0}", "simulator handling", s50, s99);
        println!("{:>22} {:>10.0} {:>10}", "client overhead", c50 - s50, "");
        println!("{:>22} {:>10.0}", "calls/s", n as f64 / total.as_secs_f64());
        println!();
        println!("Target: achieved >= 95% of allowed at 50 ms, min gap never below the interval.");
        sim.stop().await;
    });
}
