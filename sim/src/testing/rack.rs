//! A simulated owned rack (`fleet-sim --provider static`) under one
//! `shepherd run` serving HTTPS, a Metal plan and operating system
//! configured: what the Metal API's benches drive.

use std::net::Ipv4Addr;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

use super::admin::Admin;
use super::boot::{gpt_image, https_client};
use super::db::TestDb;
use super::processes::{FleetSimProcess, ShepherdProcess, bin, loopback_env};

pub struct OwnedRack {
    /// When shepherd was started (the fleet was up before).
    pub started: std::time::Instant,
    pub admin: Admin,
    pub shepherd: ShepherdProcess,
    pub fleet: FleetSimProcess,
    pub dir: tempfile::TempDir,
    pub db: TestDb,
}

impl OwnedRack {
    /// The Metal API's plan and operating system the rack offers.
    pub const PLAN: &str = "c3.small.x86";
    pub const OPERATING_SYSTEM: &str = "debian_12";

    /// `n` machines from `first`, whose agents call every `interval`, in
    /// the metro `sv`; the operating system an image of `image_len`
    /// bytes; `env`: further overrides of shepherd's configuration.
    pub async fn start(
        n: usize,
        first: Ipv4Addr,
        interval: &str,
        image_len: u64,
        env: &[(&'static str, String)],
    ) -> OwnedRack {
        let db = TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        let fleet = FleetSimProcess::start(
            &bin("fleet-sim"),
            dir.path(),
            n,
            first,
            &[
                "--agent-interval",
                interval,
                "--provider",
                "static",
                "--location",
                "sv",
            ],
        );
        let images = dir.path().join("images");
        std::fs::create_dir(&images).unwrap();
        gpt_image(&images.join("os.img"), image_len);
        let config = dir.path().join("shepherd.toml");
        let mut text = std::fs::read_to_string(&fleet.config).unwrap();
        text.push_str(&format!(
            "\n[admin.tls]\nenabled = true\n\n[[metal.plans]]\nslug = \"{}\"\ncpus_min = 8\n\n\
             [[metal.operating_systems]]\nslug = \"{}\"\nname = \"Debian 12\"\nimage = \"os.img\"\n",
            Self::PLAN,
            Self::OPERATING_SYSTEM,
        ));
        std::fs::write(&config, text).unwrap();
        let (mut all, listen) = loopback_env(db.url(), &images);
        all.push(("SHEPHERD__LOG__LEVEL", "warn".into()));
        all.extend(env.iter().cloned());
        let started = std::time::Instant::now();
        let shepherd = ShepherdProcess::start(
            &bin("shepherd"),
            &config,
            dir.path().join("shepherd.log"),
            &all,
        );
        // The admin API's certificate is signed by the fleet's CA, which
        // shepherd writes once it started.
        let ca = dir.path().join("fleet/ssh/fleet-ca.pem");
        while !ca.exists() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let der = CertificateDer::from_pem_file(&ca).unwrap();
        let admin = Admin {
            client: https_client(der.as_ref(), Duration::from_secs(60)),
            base: format!("https://{listen}"),
            config,
            env: all,
        };
        OwnedRack {
            started,
            admin,
            shepherd,
            fleet,
            dir,
            db,
        }
    }

    /// Deprovisions every machine (`discard`): each erased and
    /// `available` once its agent answered. A 503 (the BMDB busy past
    /// `admin.database_timeout`) is asked again after a second, as an
    /// operator's script would: how many were.
    pub async fn deprovision_all(&self) -> usize {
        let mut busy = 0;
        for m in self.admin.machines().await {
            let id = m["machine_id"].as_str().unwrap();
            loop {
                let (s, body) = self
                    .admin
                    .call(
                        "POST",
                        &format!("/api/v1/machines/{id}/deprovision"),
                        None,
                        Some(serde_json::json!({"mode": "discard"})),
                    )
                    .await;
                if s == 503 && busy < 10_000 {
                    busy += 1;
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    continue;
                }
                assert_eq!(s, 200, "{id}: {body}");
                break;
            }
        }
        busy
    }

    /// A project and a token for it (the command line, as an operator
    /// makes them).
    pub fn project(&self, name: &str) -> (uuid::Uuid, String) {
        let project: uuid::Uuid = self
            .admin
            .cli(&["projects", "create", name])
            .trim()
            .parse()
            .unwrap();
        let token = self
            .admin
            .cli(&["tokens", "create", "--project", &project.to_string()])
            .lines()
            .last()
            .unwrap()
            .to_string();
        (project, token)
    }
}
