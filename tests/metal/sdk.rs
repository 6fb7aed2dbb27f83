//! Equinix's own Python SDK drives a tenant's device from creation to
//! deletion (`tests/sdk/metal_tenant_check.py`), once through Prism's
//! validating proxy (Stoplight's; every request and answer checked
//! against the shared OpenAPI description, no violation allowed), once
//! straight to shepherd over HTTPS. `scripts/test` installs both.

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use shepherd_sim::testing::Sshd;

use super::Rig;

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICfsPiOD+ZsHgx4BT9aQS60rgpppknEo+hr/1F2lB0mX tenant";

/// The Metal API's description: `SHEPHERD_EQUINIX_OPENAPI`, else the
/// shared one beside the checkout.
fn spec() -> PathBuf {
    let dir = match std::env::var_os("SHEPHERD_EQUINIX_OPENAPI") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/equinix-metal-openapi"),
    };
    dir.join("openapi3.yaml")
}

/// Prism: `SHEPHERD_PRISM`, else `prism` on the PATH.
fn prism() -> PathBuf {
    std::env::var_os("SHEPHERD_PRISM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("prism"))
}

struct Prism {
    child: std::process::Child,
    log: PathBuf,
    url: String,
}

impl Drop for Prism {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prism {
    /// A validating proxy in front of `upstream`, trusting `ca`.
    fn start(upstream: &str, ca: &Path, log: PathBuf) -> Prism {
        let port = Sshd::free_port();
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(prism())
            .arg("proxy")
            .arg(spec())
            .arg(upstream)
            .args(["-p", &port.to_string(), "-h", "127.0.0.1"])
            .env("NODE_EXTRA_CA_CERTS", ca)
            .env("NO_COLOR", "1")
            .env("FORCE_COLOR", "0")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (Stoplight's Prism; scripts/test installs it and sets SHEPHERD_PRISM)",
                    prism().display()
                )
            });
        let mut p = Prism {
            child,
            log,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while !p.text().contains("Prism is listening") {
            if let Some(status) = p.child.try_wait().unwrap() {
                panic!("prism exited ({status}): {}", p.text());
            }
            assert!(
                Instant::now() < deadline,
                "prism did not start: {}",
                p.text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Prism's violation lines (request and response, errors and
    /// warnings).
    fn violations(&self) -> Vec<String> {
        BufReader::new(std::fs::File::open(&self.log).unwrap())
            .lines()
            .map_while(Result::ok)
            .filter(|l| l.contains("Violation:"))
            .collect()
    }

    /// Requests Prism proxied.
    fn proxied(&self) -> usize {
        self.text().matches("Forwarding \"").count()
    }
}

fn tenant_check(
    url: &str,
    project: uuid::Uuid,
    token: &str,
    ca: Option<&Path>,
) -> serde_json::Value {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/sdk/metal_tenant_check.py"
    );
    let mut cmd = Command::new("python3");
    cmd.arg(script)
        .arg(url)
        .arg(project.to_string())
        .arg(token)
        .arg(KEY);
    if let Some(ca) = ca {
        cmd.arg(ca);
    }
    let out = cmd
        .output()
        .expect("python3 with Equinix's SDK (scripts/test installs it)");
    assert!(
        out.status.success(),
        "the SDK's tenant check failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[actix_rt::test]
async fn the_official_sdk_runs_a_device_s_life_through_prism_without_a_violation() {
    let mut rig = Rig::new(1, Ipv4Addr::new(127, 0, 74, 1)).await;
    let (_, ip) = rig.machines().await[0].clone();
    let p = rig.project("sdk-tenant", &[]);
    let (_, token) = rig.token(p, false);
    let ca = rig.dir.path().join("fleet/ssh/fleet-ca.pem");

    // Through Prism: every exchange checked against the description.
    let prism = Prism::start(
        &format!("{}/metal/v1", rig.base),
        &ca,
        rig.dir.path().join("prism.log"),
    );
    let life = tenant_check(&prism.url, p, &token, None);
    let states: Vec<&str> = life["states"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s.as_str())
        .collect();
    for s in ["active", "reinstalling", "deprovisioning"] {
        assert!(states.contains(&s), "{s} not seen: {life}");
    }
    let violations = prism.violations();
    assert!(
        violations.is_empty(),
        "{} violations of the OpenAPI description:\n{}",
        violations.len(),
        violations.join("\n")
    );
    assert!(prism.proxied() > 20, "{}", prism.text());
    // The check sees a violation when there is one: a request without
    // the token the description requires.
    let _ = awc::Client::default()
        .get(format!("{}/projects", prism.url))
        .send()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while prism.violations().is_empty() {
        assert!(
            Instant::now() < deadline,
            "prism reports no violation: {}",
            prism.text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(prism);
    // The machine is erased and available for the next tenant.
    rig.wait_available(1).await;
    let disk = rig.disk(&ip);
    assert!(
        !super::lifecycle::holds_image(&rig, &disk),
        "the tenant's image is still on the machine's disk"
    );

    // Straight to shepherd over HTTPS, the SDK trusting the fleet's CA.
    let (_, token2) = rig.token(p, false);
    // The key is the project's already: the check adds it again, refused.
    let (s, keys) = rig.get(&format!("/projects/{p}/ssh-keys"), &token2).await;
    assert_eq!(s, 200);
    for k in keys["ssh_keys"].as_array().unwrap() {
        let id = k["id"].as_str().unwrap();
        let (s, _) = rig
            .call("DELETE", &format!("/ssh-keys/{id}"), Some(&token2), None)
            .await;
        assert_eq!(s, 204);
    }
    let life = tenant_check(&format!("{}/metal/v1", rig.base), p, &token2, Some(&ca));
    assert_eq!(
        life["done"].as_array().unwrap().last().unwrap(),
        "delete",
        "{life}"
    );
}
