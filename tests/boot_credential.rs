//! One boot's credential (CONTRACTS.md §5) over the callback's real TLS,
//! against PostgreSQL: a live agent (the real `takeover-agent --live`, as
//! the boot image starts it) enrolls its fresh key with its boot's
//! credential and heartbeats; a second agent with a credential already used,
//! one after its expiry, one with another machine's, and one with a boot a
//! newer boot voided are refused; and an enrolled agent naming another
//! machine in its heartbeat is UNAUTHENTICATED.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use prost::Message;
use shepherd::bmdb::Bmdb;
use shepherd::bmdb::boot::{self, IssuedBoot};
use shepherd::callback::{Callback, CertFiles, HEARTBEAT_PATHS, ServerIdentity};
use shepherd_agent::api::{HeartbeatRequest, HeartbeatResponseRaw};
use shepherd_agent::callback as client;
use shepherd_proto::boot::{BootData, EnrollRequest, EnrollResponse};
use shepherd_proto::callback::ENROLL_PATH;
use shepherd_sim::testing::TestDb;
use tonic::Code;
use uuid::Uuid;

struct Rig {
    bmdb: Bmdb,
    callback: Callback,
    dir: tempfile::TempDir,
}

impl Rig {
    async fn new() -> (Rig, TestDb) {
        let db = TestDb::new().await;
        let bmdb = db.bmdb().await;
        let dir = tempfile::tempdir().unwrap();
        let identity = ServerIdentity::load_or_generate(
            &CertFiles::in_dir(dir.path()),
            &["127.0.0.1".to_string()],
        )
        .unwrap();
        let callback = Callback::start(
            bmdb.clone(),
            &identity,
            "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
            100,
            4,
        )
        .await
        .unwrap();
        (
            Rig {
                bmdb,
                callback,
                dir,
            },
            db,
        )
    }

    async fn machine(&self) -> Uuid {
        shepherd_sim::testing::machine(&self.bmdb, None).await
    }

    async fn issue(&self, machine: Uuid, ttl: Duration) -> IssuedBoot {
        self.bmdb
            .transact(async |tx| boot::issue(tx, machine, ttl).await)
            .await
            .unwrap()
    }

    fn endpoint(&self) -> String {
        self.callback.addr.to_string()
    }

    fn boot_data(&self, machine: Uuid, issued: &IssuedBoot) -> BootData {
        BootData {
            machine_id: machine.to_string(),
            bmaas_endpoint: self.endpoint(),
            ca_certificate: self.callback.ca_der.clone(),
            credential: issued.credential.clone(),
        }
    }

    /// One call of `path` as the agent with the key of `seed`.
    async fn call<Req, Resp>(
        &self,
        seed: [u8; 32],
        path: &'static str,
        req: Req,
    ) -> Result<Resp, tonic::Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let channel = client::connect(
            self.callback.addr,
            "127.0.0.1",
            &self.callback.ca_der,
            &seed,
        )
        .await
        .map_err(tonic::Status::unavailable)?;
        client::call(channel, path, req).await
    }

    /// Enrolls the key of `seed` as the library does it.
    async fn enroll(
        &self,
        seed: [u8; 32],
        data: &BootData,
    ) -> Result<EnrollResponse, tonic::Status> {
        let req = EnrollRequest {
            machine_id: data.machine_id.clone(),
            credential: data.credential.clone(),
            bmaas_endpoint: data.bmaas_endpoint.clone(),
        };
        self.call(seed, ENROLL_PATH, req).await
    }

    async fn heartbeat(
        &self,
        seed: [u8; 32],
        machine: Uuid,
    ) -> Result<HeartbeatResponseRaw, tonic::Status> {
        let req = HeartbeatRequest {
            machine_id: machine.to_string(),
            ..Default::default()
        };
        self.call(seed, HEARTBEAT_PATHS[1], req).await
    }

    async fn agent_key(&self, machine: Uuid) -> Option<Vec<u8>> {
        self.bmdb
            .transact(async |tx| {
                Ok(tx
                    .query_opt(
                        "SELECT agent_public_key FROM machine_agent_started WHERE machine_id = $1",
                        &[&machine],
                    )
                    .await?
                    .map(|r| r.get::<_, Vec<u8>>(0)))
            })
            .await
            .unwrap()
    }

    async fn count(&self, sql: &'static str, machine: Uuid) -> i64 {
        self.bmdb
            .transact(async |tx| Ok(tx.query_one(sql, &[&machine]).await?.get::<_, i64>(0)))
            .await
            .unwrap()
    }

    /// The real agent, as the boot image's init starts it, from a copy of
    /// its own (the files beside it are its settings).
    fn live_agent(&self, name: &str, data: &BootData) -> std::process::Child {
        shepherd_sim::testing::live_agent(&self.dir.path().join(name), &data.encode_to_vec())
    }
}

fn key_of(seed: [u8; 32]) -> Vec<u8> {
    ed25519_dalek::SigningKey::from_bytes(&seed)
        .verifying_key()
        .to_bytes()
        .to_vec()
}

/// Waits for a refused live agent to exit: its code and what it said.
/// (Waits on the runtime: the callback server runs on this thread.)
async fn refused(mut child: std::process::Child) -> (i32, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            return (
                status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        if Instant::now() > deadline {
            panic!("the agent did not give up: {}", stop(child));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn stop(mut child: std::process::Child) -> String {
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[actix_rt::test]
async fn a_live_agent_enrolls_once_with_its_boots_credential_and_heartbeats() {
    let (rig, _db) = Rig::new().await;
    let (a, b) = (rig.machine().await, rig.machine().await);
    let issued = rig.issue(a, Duration::from_secs(600)).await;
    let data = rig.boot_data(a, &issued);
    let agent = rig.live_agent("first", &data);
    // It enrolls (its key becomes the machine's) and heartbeats.
    let deadline = Instant::now() + Duration::from_secs(30);
    while rig
        .count(
            "SELECT count(*) FROM machine_agent_heartbeat WHERE machine_id = $1",
            a,
        )
        .await
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "no heartbeat from the live agent"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let key = rig.agent_key(a).await.expect("the live agent's key");
    assert_eq!(key.len(), 32);
    assert_eq!(
        rig.count(
            "SELECT count(*) FROM machine_agent_started WHERE machine_id = $1 AND agent_endpoint IS NOT NULL",
            a
        )
        .await,
        1
    );
    assert_eq!(
        rig.count(
            "SELECT count(*) FROM machine_hardware_report WHERE machine_id = $1",
            a
        )
        .await,
        1,
        "the hardware report is stored"
    );
    // Its boot's copy of the image is served no more.
    assert!(
        rig.bmdb
            .transact(async |tx| boot::to_serve(tx, issued.boot_id).await)
            .await
            .unwrap()
            .is_none()
    );

    // A second agent with the same (used) credential is refused, and the
    // machine keeps the first one's key.
    let (code, said) = refused(rig.live_agent("second", &data)).await;
    assert_eq!(code, 3, "{said}");
    assert!(said.contains("used already"), "{said}");
    assert_eq!(rig.agent_key(a).await, Some(key.clone()));

    // A's credential presented for B: refused, B has no agent.
    let (code, said) = refused(rig.live_agent("other", &rig.boot_data(b, &issued))).await;
    assert_eq!(code, 3, "{said}");
    assert!(
        said.contains("no boot of this machine has this credential"),
        "{said}"
    );
    assert_eq!(rig.agent_key(b).await, None);
    let log = stop(agent);
    assert!(log.contains(&format!("enrolled as machine {a}")), "{log}");

    // Killed (SIGKILL, above) and started again in the same boot, as the
    // boot image's init does: it heartbeats with the key it enrolled,
    // which its boot's credential could not enroll again.
    let heard = async || -> f64 {
        rig.bmdb
            .transact(async |tx| {
                Ok(tx
                    .query_one(
                        "SELECT extract(epoch FROM agent_heartbeat_at)::float8 \
                         FROM machine_agent_heartbeat WHERE machine_id = $1",
                        &[&a],
                    )
                    .await?
                    .get(0))
            })
            .await
            .unwrap()
    };
    let before = heard().await;
    let again = rig.live_agent("first", &data);
    let deadline = Instant::now() + Duration::from_secs(30);
    while heard().await <= before {
        assert!(
            Instant::now() < deadline,
            "no heartbeat from the agent started again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(rig.agent_key(a).await, Some(key), "the same key");
    let log = stop(again);
    assert!(
        log.contains("started again in the same boot") && !log.contains("refused"),
        "{log}"
    );
}

#[actix_rt::test]
async fn expired_voided_and_foreign_credentials_are_refused() {
    let (rig, _db) = Rig::new().await;
    let (a, b) = (rig.machine().await, rig.machine().await);
    let seed: [u8; 32] = rand::random();

    // Expired.
    let old = rig.issue(a, Duration::from_millis(200)).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let e = rig.enroll(seed, &rig.boot_data(a, &old)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("expired"), "{}", e.message());

    // Voided by a newer boot of the machine.
    let first = rig.issue(a, Duration::from_secs(600)).await;
    let second = rig.issue(a, Duration::from_secs(600)).await;
    let e = rig
        .enroll(seed, &rig.boot_data(a, &first))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{}", e.message());
    assert_eq!(rig.agent_key(a).await, None);

    // Another machine's credential (B's boot, presented for A).
    let theirs = rig.issue(b, Duration::from_secs(600)).await;
    let e = rig
        .enroll(seed, &rig.boot_data(a, &theirs))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert_eq!(rig.agent_key(a).await, None);

    // The right one: enrolled; asked again by the same agent (its answer
    // lost), the same; by another key, refused.
    rig.enroll(seed, &rig.boot_data(a, &second)).await.unwrap();
    rig.enroll(seed, &rig.boot_data(a, &second)).await.unwrap();
    assert_eq!(rig.agent_key(a).await, Some(key_of(seed)));
    let e = rig
        .enroll(rand::random(), &rig.boot_data(a, &second))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert_eq!(rig.agent_key(a).await, Some(key_of(seed)));

    // The enrolled agent heartbeats as its machine, and naming another
    // machine is UNAUTHENTICATED.
    rig.heartbeat(seed, a).await.unwrap();
    let e = rig.heartbeat(seed, b).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    // B's own boot is still good for B.
    let b_seed: [u8; 32] = rand::random();
    rig.enroll(b_seed, &rig.boot_data(b, &theirs))
        .await
        .unwrap();
    assert_eq!(rig.agent_key(b).await, Some(key_of(b_seed)));
}
