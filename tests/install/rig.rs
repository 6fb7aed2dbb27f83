//! The installation tests' rig: `fleet-sim` machines (their agents run
//! the real installer onto a file standing for each machine's disk), one
//! `shepherd run` serving an image from a directory over TLS, the JSON
//! API as an operator calls it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use shepherd::bmdb::Bmdb;
use shepherd_sim::testing::{FleetSimProcess, ShepherdProcess, TestDb, gpt_image};

pub const SHEPHERD: &str = env!("CARGO_BIN_EXE_shepherd");

pub struct Rig {
    _db: TestDb,
    pub bmdb: Bmdb,
    pub dir: tempfile::TempDir,
    _fleet: FleetSimProcess,
    pub shepherd: ShepherdProcess,
    pub admin: String,
    /// The image as it is written (decompressed).
    pub image: Vec<u8>,
}

/// Bytes that compress some: runs of pseudo-random bytes and zeros.
fn image(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for (i, chunk) in v.chunks_mut(32 << 10).enumerate() {
        if i % 4 != 3 {
            for b in chunk {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = (x >> 32) as u8 & 0x1f;
            }
        }
    }
    v
}

fn zstd(data: &[u8], out: &Path) {
    let raw = out.with_extension("raw");
    std::fs::write(&raw, data).unwrap();
    let status = std::process::Command::new("zstd")
        .args(["-q", "-f", "-o"])
        .arg(out)
        .arg(&raw)
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::remove_file(raw).unwrap();
}

impl Rig {
    pub async fn new(machines: usize, first: Ipv4Addr) -> Rig {
        Rig::with(machines, first, 12 << 20, &[]).await
    }

    /// `machines` machines from `first` on, `debian.img.zst` an image of
    /// `image_len` bytes (compressed), shepherd's environment `vars` more.
    pub async fn with(
        machines: usize,
        first: Ipv4Addr,
        image_len: usize,
        more: &[(&str, String)],
    ) -> Rig {
        let db = TestDb::new().await;
        let bmdb = db.bmdb().await;
        let dir = tempfile::tempdir().unwrap();
        let fleet = FleetSimProcess::start(
            &shepherd_sim::bin("fleet-sim"),
            dir.path(),
            machines,
            first,
            &["--agent-interval", "1s"],
        );
        let images = dir.path().join("images");
        std::fs::create_dir(&images).unwrap();
        let image = image(image_len);
        zstd(&image, &images.join("debian.img.zst"));
        // An image with a partition table (for first-boot data), hashed
        // at start as every served image.
        gpt_image(&images.join("gpt.img"), 16 << 20);
        let (mut vars, admin) = shepherd_sim::testing::loopback_env(db.url(), &images);
        vars.extend([
            ("SHEPHERD__BMDB__SESSION_INTERVAL", "2s".into()),
            ("SHEPHERD__INSTALLATIONS__ROLLOUT_INTERVAL", "500ms".into()),
            ("SHEPHERD__LOG__LEVEL", "info,tokio_postgres=warn".into()),
        ]);
        vars.extend(more.iter().cloned());
        let shepherd = ShepherdProcess::start(
            Path::new(SHEPHERD),
            &fleet.config,
            dir.path().join("shepherd.log"),
            &vars,
        );
        let mut rig = Rig {
            _db: db,
            bmdb,
            dir,
            _fleet: fleet,
            shepherd,
            admin: format!("http://{admin}"),
            image,
        };
        rig.wait_heartbeating(machines as i64).await;
        rig
    }

    pub async fn wait_heartbeating(&mut self, want: i64) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let n = shepherd_sim::testing::count(
                &self.bmdb,
                "SELECT count(*) FROM machine_agent_heartbeat",
            )
            .await;
            if n >= want {
                return;
            }
            self.shepherd.assert_running();
            assert!(
                Instant::now() < deadline,
                "{n} of {want} machines heartbeating: {}",
                self.shepherd.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Machines with their addresses, in provider ID order.
    pub async fn machines(&self) -> Vec<(uuid::Uuid, String)> {
        shepherd_sim::testing::pairs(
            &self.bmdb,
            "SELECT machine_id, provider_ip_address FROM machine_provided ORDER BY provider_id",
        )
        .await
    }

    /// The file standing for the machine's disk.
    pub fn disk(&self, ip: &str) -> PathBuf {
        self.dir
            .path()
            .join("fleet/machines")
            .join(ip)
            .join("disk0")
    }

    pub async fn get(&self, path: &str) -> Value {
        let url = format!("{}{path}", self.admin);
        let mut r = awc::Client::default().get(&url).send().await.unwrap();
        assert!(r.status().is_success(), "{url}: {}", r.status());
        serde_json::from_slice(&r.body().limit(16 << 20).await.unwrap()).unwrap()
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let url = format!("{}{path}", self.admin);
        let mut r = awc::Client::default()
            .post(&url)
            .send_json(&body)
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body = r.body().limit(16 << 20).await.unwrap();
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// [`Self::post`] an installation, asked again while the served
    /// image's digest is still being computed (503), as a client does.
    pub async fn post_install(&self, path: &str, body: Value) -> (u16, Value) {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, answer) = self.post(path, body.clone()).await;
            if status != 503 || Instant::now() > until {
                return (status, answer);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn disk_holds_image(&self, ip: &str) -> bool {
        use std::os::unix::fs::FileExt;
        let Ok(f) = std::fs::File::open(self.disk(ip)) else {
            return false;
        };
        let mut b = vec![0u8; self.image.len()];
        f.read_exact_at(&mut b, 0).is_ok() && b == self.image
    }
}

impl Rig {
    /// The machine's API detail once its state is one of `states`.
    pub async fn wait_state(&mut self, id: uuid::Uuid, states: &[&str]) -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let d = self.get(&format!("/api/v1/machines/{id}")).await;
            if states.contains(&d["machine"]["state"].as_str().unwrap_or("")) {
                return d;
            }
            self.shepherd.assert_running();
            assert!(
                Instant::now() < deadline,
                "not {states:?}: {d:#}\n{}",
                self.shepherd.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
