//! The simulated floor's binaries as processes: what the demo, the fleet
//! tests and the benchmarks start. (Being this package's integration
//! tests, they also make `cargo test --workspace` build the binaries
//! before any test runs; `shepherd_sim::bin` finds them there.)

use std::net::Ipv4Addr;
use std::process::Command;

use shepherd_sim::testing::FleetSimProcess;

#[actix_rt::test]
async fn fleet_sim_serves_a_fleet_and_writes_its_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = FleetSimProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_fleet-sim")),
        dir.path(),
        3,
        Ipv4Addr::new(127, 0, 9, 1),
        &[],
    );
    let config = std::fs::read_to_string(&fleet.config).unwrap();
    assert!(
        config.contains(&format!("http://{}", fleet.api)),
        "the configuration names the simulated API:\n{config}"
    );
    let report = fleet.report().await;
    assert!(report.is_object(), "{report}");
    let stats = fleet.api_stats().await;
    assert!(stats.is_object(), "{stats}");
}

#[test]
fn every_binary_of_the_floor_says_how_it_is_used() {
    for (exe, option) in [
        (env!("CARGO_BIN_EXE_shepherd-demo"), "--machines"),
        (env!("CARGO_BIN_EXE_equinix-sim"), "--reservations"),
        (env!("CARGO_BIN_EXE_fleet-sim"), "--machines"),
    ] {
        let out = Command::new(exe).arg("--help").output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{exe}: {out:?}");
        assert!(text.contains(option), "{exe} --help:\n{text}");
    }
    // A wrong option is a usage error, not a run.
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd-demo"))
        .arg("--machnes")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
