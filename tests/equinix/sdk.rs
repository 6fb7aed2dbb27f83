//! The simulator read by Equinix's own Python SDK (`equinix` on PyPI,
//! `equinix.services.metalv1`): its pydantic models are stricter than the
//! OpenAPI description (CONTRACTS.md §3). `tests/sdk/metal_sdk_check.py`
//! drives every operation shepherd uses and prints a verdict per response
//! shape; every one must pass. `scripts/test` installs the SDK.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use shepherd_sim::equinix::{SimConfig, Simulator};

#[actix_rt::test]
async fn every_response_shape_satisfies_the_official_python_sdk() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/metal_sdk_check.py");
    let sdk = Command::new("python3")
        .args(["-c", "import equinix.services.metalv1"])
        .output()
        .expect("python3 is needed to run Equinix's Python SDK");
    assert!(
        sdk.status.success(),
        "Equinix's Python SDK is not installed (pip install 'equinix==0.19.0'; scripts/test does): {}",
        String::from_utf8_lossy(&sdk.stderr)
    );
    let sim = Simulator::start(
        SimConfig {
            reservations: 7,
            provisioning_delay: Duration::from_millis(300),
            reboot_delay: Duration::from_millis(500),
            ..SimConfig::default()
        },
        "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
    )
    .await
    .unwrap();
    let (url, project, token) = (
        sim.api_url(),
        sim.project_id().to_string(),
        sim.token().to_string(),
    );
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .args([&url, &project, &token])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the SDK rejected responses:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("14 of 14 response shapes accepted"),
        "{stdout}"
    );
    sim.stop().await;
}
