//! The agent callback over real TLS (CONTRACTS.md §4): what it answers and
//! what it writes, for good and bad callers, and through a database outage.

use std::net::SocketAddr;
use std::time::Duration;

use prost::Message;
use shepherd::bmdb::Bmdb;
use shepherd::bmdb::machines;
use shepherd::callback::Callback;
use shepherd::callback::{CertFiles, HEARTBEAT_PATHS, ServerIdentity};
use shepherd_agent::api::{
    AgentHardwareReport, BlockDevice, Cpu, HeartbeatRequest, HeartbeatResponseRaw,
    NetworkInterface, Node, OsInstallationReport, OsInstallationRequest, cpu,
    os_installation_report,
};
use shepherd_agent::callback as client;
use shepherd_sim::testing::{OwnPostgres, TestDb};
use tonic::Code;
use uuid::Uuid;

const SERVER_NAME: &str = "bmaas.test";

struct Rig {
    bmdb: Bmdb,
    callback: Callback,
    _dir: tempfile::TempDir,
}

impl Rig {
    async fn new(bmdb: Bmdb) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let identity = ServerIdentity::load_or_generate(
            &CertFiles::in_dir(dir.path()),
            &[SERVER_NAME.to_string(), "127.0.0.1".to_string()],
        )
        .unwrap();
        let callback = Callback::start(
            bmdb.clone(),
            &identity,
            "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
            1000,
            4,
        )
        .await
        .unwrap();
        Rig {
            bmdb,
            callback,
            _dir: dir,
        }
    }

    /// A machine whose agent started with the key of `seed`.
    async fn machine(&self, seed: [u8; 32]) -> Uuid {
        shepherd_sim::testing::machine(&self.bmdb, Some(seed)).await
    }

    async fn heartbeat(
        &self,
        seed: [u8; 32],
        path: &'static str,
        req: HeartbeatRequest,
    ) -> Result<HeartbeatResponseRaw, tonic::Status> {
        let channel = client::connect(
            self.callback.addr,
            SERVER_NAME,
            &self.callback.ca_der,
            &seed,
        )
        .await
        .map_err(tonic::Status::unavailable)?;
        client::call(channel, path, req).await
    }

    async fn rows(&self, sql: &'static str, id: Uuid) -> i64 {
        self.bmdb
            .transact(async |tx| Ok(tx.query_one(sql, &[&id]).await?.get::<_, i64>(0)))
            .await
            .unwrap()
    }
}

const HEARTBEATS: &str = "SELECT count(*) FROM machine_agent_heartbeat WHERE machine_id = $1";

fn plain(id: Uuid) -> HeartbeatRequest {
    HeartbeatRequest {
        machine_id: id.to_string(),
        ..Default::default()
    }
}

#[actix_rt::test]
async fn an_authenticated_heartbeat_is_written_under_both_paths() {
    let db = TestDb::new().await;
    let rig = Rig::new(db.bmdb().await).await;
    let seed = [1u8; 32];
    let id = rig.machine(seed).await;
    for path in HEARTBEAT_PATHS {
        let r = rig.heartbeat(seed, path, plain(id)).await.unwrap();
        assert_eq!(r.installation_request, None);
    }
    assert_eq!(rig.rows(HEARTBEATS, id).await, 1);
    // Any usual spelling of the UUID.
    let mut upper = plain(id);
    upper.machine_id = id.to_string().to_uppercase();
    rig.heartbeat(seed, HEARTBEAT_PATHS[1], upper)
        .await
        .unwrap();
}

#[actix_rt::test]
async fn bad_callers_get_the_contracts_codes_and_write_nothing() {
    let db = TestDb::new().await;
    let rig = Rig::new(db.bmdb().await).await;
    let (seed, other) = ([2u8; 32], [3u8; 32]);
    let id = rig.machine(seed).await;
    let path = HEARTBEAT_PATHS[0];

    let wrong_key = rig.heartbeat(other, path, plain(id)).await.unwrap_err();
    assert_eq!(wrong_key.code(), Code::Unauthenticated, "{wrong_key:?}");
    let unknown = rig
        .heartbeat(seed, path, plain(Uuid::new_v4()))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::Unauthenticated);
    assert_eq!(
        unknown.message(),
        wrong_key.message(),
        "the same message for an unknown machine and a wrong key"
    );
    let mut malformed = plain(id);
    malformed.machine_id = "not-a-uuid".into();
    let e = rig.heartbeat(seed, path, malformed).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let mut no_result = plain(id);
    no_result.installation_report = Some(OsInstallationReport {
        generation: 1,
        result: None,
    });
    let e = rig.heartbeat(seed, path, no_result).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let mut huge = plain(id);
    huge.installation_report = Some(OsInstallationReport {
        generation: i64::from(i32::MAX) + 1,
        result: Some(os_installation_report::Result::Success(
            os_installation_report::Success {},
        )),
    });
    let e = rig.heartbeat(seed, path, huge).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // No client certificate at all: refused.
    let cfg = {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from(
                rig.callback.ca_der.clone(),
            ))
            .unwrap();
        let mut c = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        c.alpn_protocols = vec![b"h2".to_vec()];
        std::sync::Arc::new(c)
    };
    let channel = client::connect_with(rig.callback.addr, SERVER_NAME, cfg).await;
    if let Ok(channel) = channel {
        let r = client::call::<_, HeartbeatResponseRaw>(channel, path, plain(id)).await;
        assert!(
            r.is_err(),
            "a call without a client certificate went through"
        );
    }
    assert_eq!(rig.rows(HEARTBEATS, id).await, 0, "nothing written");
    // Counted by reason, for /metrics: two unauthenticated (another key, an
    // unknown machine), three malformed, none accepted.
    let m = &rig.callback.metrics;
    use shepherd::callback::Outcome;
    assert_eq!(m.get(Outcome::Unauthenticated), 2);
    assert_eq!(m.get(Outcome::Invalid), 3);
    assert_eq!(m.get(Outcome::Accepted), 0);
    // Only the two well-formed ones reached the writer, one batch each.
    assert_eq!(m.batch_size.count(), 2);
    assert_eq!(m.write_seconds.count(), 2);
}

#[actix_rt::test]
async fn reports_are_stored_as_sent_and_requests_answered_until_reported() {
    let db = TestDb::new().await;
    let rig = Rig::new(db.bmdb().await).await;
    let seed = [4u8; 32];
    let id = rig.machine(seed).await;
    let path = HEARTBEAT_PATHS[1];

    let report = AgentHardwareReport {
        report: Some(Node {
            manufacturer: "Simulated".into(),
            product: "Box 9000".into(),
            serial_number: "SN-1".into(),
            memory_installed_bytes: 64 << 30,
            memory_usable_ratio: 0.97,
            cpu: vec![Cpu {
                architecture: Some(cpu::Architecture::X8664(cpu::X8664 {
                    family: 6,
                    model: 85,
                    stepping: 4,
                })),
                cores: 16,
                hardware_threads: 32,
                vendor: "GenuineIntel".into(),
                model: "Xeon".into(),
            }],
            block_device: vec![BlockDevice {
                device_model: "NVMe 1".into(),
                capacity_bytes: 1 << 40,
                protocol: 3,
                media_errors: Some(0),
                ..Default::default()
            }],
            network_interface: vec![NetworkInterface {
                mac: vec![2, 0, 0, 0, 0, 1],
                driver: "ixgbe".into(),
                link_up: true,
                current_speed_bytes: 1_250_000_000,
                ..Default::default()
            }],
            efi_support: 4,
            bmc_lan: Some(shepherd_proto::api::BmcLan {
                channel: 1,
                ipv4_address: "10.0.0.41".into(),
                address_source: "dhcp".into(),
                mac: vec![2, 0, 0, 0, 0, 0x41],
            }),
            secure_boot: Some(shepherd_proto::api::SecureBoot {
                state: shepherd_proto::api::secure_boot::State::On as i32,
                setup_mode: false,
                lockdown: "integrity".into(),
            }),
        }),
        warning: vec!["no IPMI".into()],
    };
    let mut req = plain(id);
    req.hardware_report = Some(report.clone());
    rig.heartbeat(seed, path, req).await.unwrap();
    let stored: Vec<u8> = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT hardware_report_raw FROM machine_hardware_report WHERE machine_id = $1",
                    &[&id],
                )
                .await?
                .get(0))
        })
        .await
        .unwrap();
    assert_eq!(stored, report.encode_to_vec(), "stored exactly as sent");
    assert_eq!(
        AgentHardwareReport::decode(stored.as_slice()).unwrap(),
        report
    );
    // The BMC's address, read in-band by the agent, as operators see it.
    let summary = shepherd_proto::summary::summarize(&stored).unwrap();
    let lan = summary.bmc_lan.expect("the BMC's LAN channel");
    assert_eq!(
        (lan.ipv4_address.as_str(), lan.mac.as_str()),
        ("10.0.0.41", "02:00:00:00:00:41")
    );
    // How the agent's system booted, as operators see it.
    let sb = summary
        .secure_boot
        .expect("Secure Boot as the agent read it");
    assert_eq!(sb.to_string(), "on, kernel locked down (integrity)");

    // A pending request, with fields shepherd does not know: returned byte
    // for byte.
    let mut request = OsInstallationRequest {
        generation: 7,
        r#type: None,
    }
    .encode_to_vec();
    request.extend_from_slice(&[0x12, 0x03, 0x0a, 0x01, 0x41]); // metropolis { field 1: "A" }
    rig.bmdb
        .transact(async |tx| {
            tx.execute(
                "INSERT INTO machine_os_installation_request VALUES ($1, 7, $2)",
                &[&id, &request],
            )
            .await
        })
        .await
        .unwrap();
    let r = rig.heartbeat(seed, path, plain(id)).await.unwrap();
    assert_eq!(r.installation_request.as_deref(), Some(request.as_slice()));

    // An older generation's report does not answer it...
    let mut old = plain(id);
    old.installation_report = Some(OsInstallationReport {
        generation: 6,
        result: Some(os_installation_report::Result::Error(
            os_installation_report::Error {
                error: "disk on fire".into(),
            },
        )),
    });
    let r = rig.heartbeat(seed, path, old.clone()).await.unwrap();
    assert_eq!(r.installation_request.as_deref(), Some(request.as_slice()));
    // ...its own generation's does, at once, and the report is upserted.
    let mut done = plain(id);
    done.installation_report = Some(OsInstallationReport {
        generation: 7,
        result: Some(os_installation_report::Result::Success(
            os_installation_report::Success {},
        )),
    });
    let r = rig.heartbeat(seed, path, done.clone()).await.unwrap();
    assert_eq!(r.installation_request, None);
    let (generation, result, raw): (i32, String, Vec<u8>) = rig
        .bmdb
        .transact(async |tx| {
            let r = tx
                .query_one(
                    "SELECT generation, os_installation_result::text, os_installation_report_raw \
                     FROM machine_os_installation_report WHERE machine_id = $1",
                    &[&id],
                )
                .await?;
            Ok((r.get(0), r.get(1), r.get(2)))
        })
        .await
        .unwrap();
    assert_eq!((generation, result.as_str()), (7, "Success"));
    assert_eq!(raw, done.installation_report.unwrap().encode_to_vec());
    let r = rig.heartbeat(seed, path, plain(id)).await.unwrap();
    assert_eq!(
        r.installation_request, None,
        "answered requests stay answered"
    );
}

#[actix_rt::test]
async fn a_key_removed_by_another_process_stops_being_accepted() {
    let db = TestDb::new().await;
    let rig = Rig::new(db.bmdb().await).await;
    let seed = [5u8; 32];
    let id = rig.machine(seed).await;
    let path = HEARTBEAT_PATHS[0];
    rig.heartbeat(seed, path, plain(id)).await.unwrap();
    // Another shepherd's Recoverer drops the tag.
    let other = db.bmdb().await;
    other
        .transact(async |tx| {
            tx.execute(
                "DELETE FROM machine_agent_started WHERE machine_id = $1",
                &[&id],
            )
            .await
        })
        .await
        .unwrap();
    let e = rig.heartbeat(seed, path, plain(id)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
}

#[actix_rt::test]
async fn many_agents_at_once_are_written_in_batches() {
    let db = TestDb::new().await;
    let rig = Rig::new(db.bmdb().await).await;
    let mut agents = Vec::new();
    for i in 0..200u32 {
        let mut seed = [0u8; 32];
        seed[..4].copy_from_slice(&i.to_le_bytes());
        seed[31] = 9;
        agents.push((seed, rig.machine(seed).await));
    }
    let calls = agents.iter().map(|(seed, id)| {
        let rig = &rig;
        async move { rig.heartbeat(*seed, HEARTBEAT_PATHS[1], plain(*id)).await }
    });
    for r in futures::future::join_all(calls).await {
        r.unwrap();
    }
    let stats = rig
        .callback
        .writer
        .send(shepherd::callback::GetWriterStats)
        .await
        .unwrap();
    assert_eq!(stats.accepted, 200);
    assert!(stats.batches < 200, "{stats:?}");
    let n: i64 = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one("SELECT count(*) FROM machine_agent_heartbeat", &[])
                .await?
                .get(0))
        })
        .await
        .unwrap();
    assert_eq!(n, 200);
}

#[actix_rt::test]
async fn a_database_outage_answers_unavailable_and_the_server_recovers() {
    let mut own = OwnPostgres::start().await;
    let bmdb = own.bmdb().await;
    bmdb.migrate().await.unwrap();
    let rig = Rig::new(bmdb).await;
    let seed = [6u8; 32];
    let id = rig.machine(seed).await;
    let path = HEARTBEAT_PATHS[1];
    rig.heartbeat(seed, path, plain(id)).await.unwrap();
    own.stop();
    let e = rig.heartbeat(seed, path, plain(id)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    own.start_again().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match rig.heartbeat(seed, path, plain(id)).await {
            Ok(_) => break,
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "{e:?}");
                assert!(std::time::Instant::now() < deadline, "not back: {e:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert_eq!(rig.rows(HEARTBEATS, id).await, 1);
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
    }
}

async fn until(what: &str, timeout: Duration, mut f: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !f().await {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The real agent, started over SSH (OpenSSH's sshd) against this callback:
/// a second takeover stops the agent the first left, and an agent whose key
/// is refused for longer than its limit exits.
#[actix_rt::test]
async fn a_new_takeover_stops_the_old_agent_and_a_refused_agent_exits() {
    use shepherd::ssh::{HostKeyPolicy, SshIdentity, SshSettings};
    use shepherd_sim::testing::Sshd;
    let db = TestDb::new().await;
    let rig = Rig::new(db.bmdb().await).await;
    let keys = tempfile::tempdir().unwrap();
    let identity = SshIdentity::load_or_generate(&keys.path().join("id_ed25519")).unwrap();
    let sshd = Sshd::start(
        SocketAddr::new([127, 0, 0, 1].into(), Sshd::free_port()),
        &[identity.public_key()],
    );
    std::fs::write(sshd.dir().join("takeover-agent.interval"), "200ms").unwrap();
    std::fs::write(sshd.dir().join("takeover-agent.refused-limit"), "2s").unwrap();
    let settings = shepherd::takeover::TakeoverSettings {
        ssh: SshSettings {
            user: "root".into(),
            connect_timeout: Duration::from_secs(5),
            host_keys: HostKeyPolicy::InsecureIgnore,
            known_hosts_file: None,
            max_stdout: 1 << 20,
            max_stderr: 64 << 10,
            upload_by_exec: false,
        },
        port: sshd.addr.port(),
        exchange_timeout: Duration::from_secs(30),
        identity,
        agent: std::fs::read(shepherd_sim::bin("takeover-agent"))
            .unwrap()
            .into(),
        agent_path: format!("{}/agent-{{machine_id}}", sshd.dir().display()),
        endpoint: rig.callback.addr.to_string(),
        ca_certificate: Some(rig.callback.ca_der.clone()),
    };
    let mid = rig.machine(rand::random()).await;
    let pid_file = sshd.dir().join(format!("agent-{mid}.pid"));
    let log_file = sshd.dir().join(format!("agent-{mid}.log"));
    let take_over = async || {
        shepherd::takeover::take_over(&settings, mid, [127, 0, 0, 1].into(), None)
            .await
            .unwrap_or_else(|f| panic!("takeover: {}", f.cause))
    };
    let record = async |key: [u8; 32]| {
        rig.bmdb
            .transact(async |tx| machines::set_agent_started(tx, mid, &key, None).await)
            .await
            .unwrap()
    };
    // The detached agent writes its PID file a moment after the takeover
    // answered.
    let pid = || -> Option<i32> {
        std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|p| p.trim().parse().ok())
    };
    let first = take_over().await;
    record(first.agent_key).await;
    until(
        "the first agent heartbeats",
        Duration::from_secs(30),
        async || rig.rows(HEARTBEATS, mid).await == 1,
    )
    .await;
    let old = pid().expect("the first agent's PID file");
    assert!(!gone(old));

    // Taken over again: the new agent stops the old one.
    let second = take_over().await;
    until(
        "the old agent stopped",
        Duration::from_secs(10),
        async || gone(old),
    )
    .await;
    until(
        "the new agent's PID file",
        Duration::from_secs(10),
        async || pid().is_some_and(|p| p != old),
    )
    .await;
    let new = pid().unwrap();
    assert_ne!(new, old);
    assert!(!gone(new), "the new agent runs");
    // Its key is never recorded: refused for 2 s, it exits.
    assert_ne!(second.agent_key, first.agent_key);
    until(
        "the refused agent exits",
        Duration::from_secs(20),
        async || gone(new),
    )
    .await;
    let log = std::fs::read_to_string(&log_file).unwrap();
    assert!(log.contains("refused as unauthenticated for 2s"), "{log}");
    // The log's lines carry their time, and name causes, not "transport error".
    let line = log
        .lines()
        .find(|l| l.contains("heartbeat refused"))
        .unwrap();
    assert!(
        line.len() > 24 && line.as_bytes()[4] == b'-' && line.contains('T') && line.contains('Z'),
        "{line}"
    );
    assert!(!log.contains("transport error"), "{log}");
}

/// An erasure its agent began again from the start (a new agent after the
/// machine was lost, or the agent restarted) is history in words, and the
/// machine is never `available` until the erasure's report; that report,
/// sent again because its answer was lost, and again through a database
/// restart, is recorded once.
#[actix_rt::test]
async fn an_erasure_begun_again_is_history_and_its_report_lands_once() {
    let mut own = OwnPostgres::start().await;
    let bmdb = own.bmdb().await;
    bmdb.migrate().await.unwrap();
    let rig = Rig::new(bmdb).await;
    let seed = [9u8; 32];
    let id = rig.machine(seed).await;
    let path = HEARTBEAT_PATHS[1];
    rig.bmdb
        .transact(async |tx| {
            tx.execute(
                "INSERT INTO machine_installation (machine_id, generation, image_url, image_digest, \
                     requested_at, requested_by, kind, erase_mode) \
                 VALUES ($1, 4, '', '', now(), 'test', 'erase', 'overwrite')",
                &[&id],
            )
            .await?;
            tx.execute(
                "INSERT INTO machine_os_installation_request VALUES ($1, 4, '\\x0804')",
                &[&id],
            )
            .await
        })
        .await
        .unwrap();
    let state = async || -> String {
        rig.bmdb
            .transact(async |tx| shepherd::bmdb::lifecycle::state_of(tx, id).await)
            .await
            .unwrap()
            .unwrap()
            .as_str()
            .to_string()
    };
    let events = async || shepherd_sim::testing::installation_history(&rig.bmdb, id).await;
    let erasing = |written: i64| {
        let mut req = plain(id);
        req.installation_progress = Some(shepherd_agent::api::InstallationProgress {
            generation: 4,
            phase: shepherd_agent::api::installation_progress::Phase::Erasing as i32,
            bytes_written: written,
            bytes_total: 2 << 30,
            ..Default::default()
        });
        req
    };
    rig.heartbeat(seed, path, erasing(100 << 20)).await.unwrap();
    rig.heartbeat(seed, path, erasing(600 << 20)).await.unwrap();
    // The same heartbeat again (its answer was lost): nothing new.
    rig.heartbeat(seed, path, erasing(600 << 20)).await.unwrap();
    assert!(events().await.is_empty(), "{:?}", events().await);
    // Begun again from the start.
    rig.heartbeat(seed, path, erasing(8 << 20)).await.unwrap();
    let h = events().await;
    assert_eq!(h.len(), 1, "{h:?}");
    assert_eq!(h[0].0, "restarted");
    let detail = h[0].1.as_deref().unwrap();
    assert!(
        detail
            .starts_with("begun again from the start: it had reached erasing, 600 MB written, at "),
        "{detail}"
    );
    assert_eq!(
        state().await,
        "cleaning",
        "never available before its report"
    );

    // The report, its answer lost: sent again, recorded once.
    let mut done = erasing(2 << 30);
    done.installation_report = Some(OsInstallationReport {
        generation: 4,
        result: Some(os_installation_report::Result::Success(
            os_installation_report::Success {},
        )),
    });
    rig.heartbeat(seed, path, done.clone()).await.unwrap();
    rig.heartbeat(seed, path, done.clone()).await.unwrap();
    assert_eq!(state().await, "available");
    // Through a database restart: refused while it is away, then sent
    // again until answered, and still once.
    own.stop();
    let e = rig.heartbeat(seed, path, done.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    own.start_again().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while let Err(e) = rig.heartbeat(seed, path, done.clone()).await {
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
        assert!(std::time::Instant::now() < deadline, "not back: {e:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let h = events().await;
    let names: Vec<&str> = h.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(names, ["restarted", "erased"], "{h:?}");
    assert_eq!(state().await, "available");
}
