//! The Initializer end to end: real PostgreSQL, OpenSSH's sshd on loopback,
//! the takeover-agent binary as the payload.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use actix::prelude::*;
use shepherd::bmdb::machines::{self, NewProvidedMachine};
use shepherd::bmdb::{Backoff, Bmdb, BmdbSession, GetSession, HistoryEvent, Process, Provider};
use shepherd::control::{GetStatus, SetSession, WorkMailbox};
use shepherd::initializer::Initializer;
use shepherd::ssh::{HostKeyPolicy, SshIdentity, SshSettings};
use shepherd::takeover::TakeoverSettings;
use shepherd_sim::testing::{Sshd, TestDb};
use uuid::Uuid;

struct Rig {
    /// Owns the database: dropping it drops the database.
    _db: TestDb,
    bmdb: Bmdb,
    sshd: Sshd,
    identity: SshIdentity,
    _key_dir: tempfile::TempDir,
}

impl Rig {
    async fn new() -> Rig {
        let db = TestDb::new().await;
        let bmdb = db.bmdb().await;
        let key_dir = tempfile::tempdir().unwrap();
        let identity = SshIdentity::load_or_generate(&key_dir.path().join("id_ed25519")).unwrap();
        let port = Sshd::free_port();
        let sshd = Sshd::start(
            SocketAddr::new([127, 0, 0, 1].into(), port),
            &[identity.public_key()],
        );
        Rig {
            _db: db,
            bmdb,
            sshd,
            identity,
            _key_dir: key_dir,
        }
    }

    fn port(&self) -> u16 {
        self.sshd.addr.port()
    }

    fn settings(&self, exchange_timeout: Duration) -> TakeoverSettings {
        TakeoverSettings {
            ssh: SshSettings {
                user: "root".into(),
                connect_timeout: Duration::from_secs(5),
                host_keys: HostKeyPolicy::AcceptNew,
                known_hosts_file: None,
                max_stdout: 1 << 20,
                max_stderr: 64 << 10,
                upload_by_exec: false,
            },
            port: self.port(),
            exchange_timeout,
            identity: self.identity.clone(),
            agent: std::fs::read(shepherd_sim::bin("takeover-agent"))
                .unwrap()
                .into(),
            agent_path: format!("{}/agent-{{machine_id}}", self.sshd.dir().display()),
            endpoint: "bmaas.test:443".into(),
            ca_certificate: Some(vec![0x30, 0x82, 0x01]),
        }
    }

    /// Where machine `mid`'s agent lives; `.mode` and `.runs` sit beside it.
    fn agent_file(&self, mid: Uuid, suffix: &str) -> PathBuf {
        self.sshd.dir().join(format!("agent-{mid}{suffix}"))
    }

    fn set_mode(&self, mid: Uuid, mode: &str) {
        std::fs::write(self.agent_file(mid, ".mode"), mode).unwrap();
    }

    fn runs(&self, mid: Uuid) -> usize {
        std::fs::read_to_string(self.agent_file(mid, ".runs"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    async fn machines(&self, n: usize, address: &str) -> Vec<Uuid> {
        let mut ids = Vec::new();
        for i in 0..n {
            let m = NewProvidedMachine {
                provider: Provider::Equinix,
                provider_id: format!("device-{}-{i}", Uuid::new_v4()),
                reservation_id: None,
                ip_address: Some(address.to_string()),
                location: None,
                status: None,
            };
            ids.push(
                self.bmdb
                    .transact(async |tx| machines::create_provided(tx, &m).await)
                    .await
                    .unwrap(),
            );
        }
        ids
    }

    /// A mailbox running the Initializer under a fresh heartbeated session.
    async fn initializer(
        &self,
        settings: TakeoverSettings,
        parallelism: usize,
    ) -> (Addr<WorkMailbox<Initializer>>, Addr<BmdbSession>) {
        let backoff =
            Backoff::exponential(Duration::from_secs(300), Duration::from_secs(4 * 3600), 1.2);
        let mailbox = WorkMailbox::new(
            "initializer",
            Initializer::new(Provider::Equinix, std::rc::Rc::new(settings), None),
            backoff,
            parallelism,
            Duration::from_millis(50),
        )
        .start();
        let session_actor = BmdbSession::open(&self.bmdb, "initializer").await.unwrap();
        let session = session_actor.send(GetSession).await.unwrap();
        mailbox.send(SetSession(Some(session))).await.unwrap();
        (mailbox, session_actor)
    }

    async fn count(&self, sql: &'static str) -> i64 {
        shepherd_sim::testing::count(&self.bmdb, sql).await
    }

    async fn wait_for(&self, what: &str, sql: &'static str, want: i64, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let n = self.count(sql).await;
            if n == want {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: {n}, want {want}\nsshd: {}",
                self.sshd.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn history(&self, mid: Uuid) -> Vec<(HistoryEvent, Option<String>)> {
        self.bmdb
            .transact(async |tx| machines::history(tx, mid).await)
            .await
            .unwrap()
            .into_iter()
            .map(|h| (h.event, h.failed_cause))
            .collect()
    }
}

#[actix_rt::test]
async fn fifty_machines_get_their_agents() {
    let rig = Rig::new().await;
    let ids = rig.machines(50, "127.0.0.1").await;
    let (mailbox, _session) = rig
        .initializer(rig.settings(Duration::from_secs(30)), 8)
        .await;
    rig.wait_for(
        "50 agents started",
        "SELECT count(*) FROM machine_agent_started",
        50,
        Duration::from_secs(120),
    )
    .await;
    rig.wait_for(
        "no work left",
        "SELECT count(*) FROM work",
        0,
        Duration::from_secs(10),
    )
    .await;

    let keys: Vec<Vec<u8>> = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query("SELECT agent_public_key FROM machine_agent_started", &[])
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect())
        })
        .await
        .unwrap();
    assert!(keys.iter().all(|k| k.len() == 32));
    assert_eq!(
        keys.iter().collect::<BTreeSet<_>>().len(),
        50,
        "agent keys are not distinct"
    );
    for mid in &ids {
        assert_eq!(
            rig.history(*mid).await,
            vec![
                (HistoryEvent::Started, None),
                (HistoryEvent::Finished, None)
            ]
        );
        assert_eq!(rig.runs(*mid), 1);
    }
    // accept-new recorded every machine's host key: sshd's.
    let recorded: Vec<String> = rig
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query("SELECT host_key FROM machine_ssh_host_key", &[])
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect())
        })
        .await
        .unwrap();
    assert_eq!(recorded.len(), 50);
    let sshd_key = rig
        .sshd
        .host_key
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        recorded.iter().all(|k| k.starts_with(&sshd_key)),
        "{:?} vs {sshd_key}",
        recorded[0]
    );
    let status = mailbox.send(GetStatus).await.unwrap();
    assert_eq!((status.finished, status.failed, status.running), (50, 0, 0));
}

#[actix_rt::test]
async fn two_initializers_take_each_machine_over_exactly_once() {
    let rig = Rig::new().await;
    let ids = rig.machines(50, "127.0.0.1").await;
    let (a, _sa) = rig
        .initializer(rig.settings(Duration::from_secs(30)), 6)
        .await;
    let (b, _sb) = rig
        .initializer(rig.settings(Duration::from_secs(30)), 6)
        .await;
    rig.wait_for(
        "50 agents started",
        "SELECT count(*) FROM machine_agent_started",
        50,
        Duration::from_secs(120),
    )
    .await;
    rig.wait_for(
        "no work left",
        "SELECT count(*) FROM work",
        0,
        Duration::from_secs(10),
    )
    .await;
    for mid in &ids {
        assert_eq!(
            rig.runs(*mid),
            1,
            "machine {mid} was taken over more than once"
        );
    }
    let (sa, sb) = (
        a.send(GetStatus).await.unwrap(),
        b.send(GetStatus).await.unwrap(),
    );
    assert_eq!(sa.finished + sb.finished, 50);
    assert!(
        sa.finished > 0 && sb.finished > 0,
        "one initializer did everything: {sa:?} {sb:?}"
    );
    assert_eq!(
        rig.count("SELECT count(*) FROM work_history WHERE event = 'Started'")
            .await,
        50
    );
}

#[actix_rt::test]
async fn every_misbehaviour_fails_with_a_named_cause_and_a_backoff() {
    let rig = Rig::new().await;
    let port = rig.port();
    // Another sshd that does not know shepherd's key, and one whose host key
    // differs from the one recorded for its machine.
    let other = SshIdentity::load_or_generate(&rig.sshd.dir().join("other_ed25519")).unwrap();
    let _refusing = Sshd::start(
        SocketAddr::new([127, 0, 0, 3].into(), port),
        &[other.public_key()],
    );
    let _changed = Sshd::start(
        SocketAddr::new([127, 0, 0, 4].into(), port),
        &[rig.identity.public_key()],
    );

    let modes = [
        // Every cause starts with the step that failed.
        (
            "error",
            "agent reply: agent reported an error: simulated failure",
        ),
        (
            "garbage",
            "agent reply: agent reply is not a TakeoverResponse",
        ),
        (
            "wrong-echo",
            "agent reply: agent did not echo the init message",
        ),
        (
            "short-key",
            "agent reply: agent reply has a 31-byte key, not 32",
        ),
        ("nothing", "agent reply: agent replied nothing"),
        ("hang", "run agent: timed out"),
        ("huge", "run agent: agent wrote more than 1048576 bytes"),
        ("crash", "run agent: agent exited with status 3"),
    ];
    let mut expect: BTreeMap<Uuid, String> = BTreeMap::new();
    for (mode, cause) in modes {
        let mid = rig.machines(1, "127.0.0.1").await[0];
        rig.set_mode(mid, mode);
        expect.insert(mid, cause.to_string());
    }
    let unreachable = rig.machines(1, "127.0.0.2").await[0];
    expect.insert(unreachable, format!("connect to 127.0.0.2:{port}"));
    let refused = rig.machines(1, "127.0.0.3").await[0];
    expect.insert(refused, "authenticate as root: refused".into());
    let changed = rig.machines(1, "127.0.0.4").await[0];
    expect.insert(changed, format!("host key of 127.0.0.4:{port} changed"));
    let recorded = rig.sshd.host_key.clone();
    rig.bmdb
        .transact(async |tx| machines::record_host_key(tx, changed, &recorded).await)
        .await
        .unwrap();
    let no_address = {
        let m = NewProvidedMachine {
            provider: Provider::Equinix,
            provider_id: "no-address".into(),
            reservation_id: None,
            ip_address: None,
            location: None,
            status: None,
        };
        rig.bmdb
            .transact(async |tx| machines::create_provided(tx, &m).await)
            .await
            .unwrap()
    };
    expect.insert(no_address, "the machine has no address".into());

    let n = expect.len() as i64;
    let (mailbox, _s) = rig
        .initializer(rig.settings(Duration::from_secs(4)), 16)
        .await;
    rig.wait_for(
        "every machine backed off",
        "SELECT count(*) FROM work_backoff",
        n,
        Duration::from_secs(60),
    )
    .await;
    rig.wait_for(
        "no work left",
        "SELECT count(*) FROM work",
        0,
        Duration::from_secs(10),
    )
    .await;
    for (mid, cause) in &expect {
        let h = rig.history(*mid).await;
        assert_eq!(h.len(), 2, "{mid}: {h:?}");
        assert_eq!(h[1].0, HistoryEvent::Failed);
        let got = h[1].1.clone().unwrap();
        assert!(
            got.starts_with(cause.as_str()),
            "machine {mid}: cause {got:?} does not start with {cause:?}"
        );
        let b = rig
            .bmdb
            .transact(async |tx| machines::backoff(tx, *mid, Process::ShepherdAgentStart).await)
            .await
            .unwrap()
            .expect("a backoff row");
        assert_eq!(b.last_interval_seconds, Some(300));
        assert_eq!(b.cause, got);
    }
    assert_eq!(
        rig.count("SELECT count(*) FROM machine_agent_started")
            .await,
        0
    );

    // Still healthy: a good machine added now is taken over.
    let good = rig.machines(1, "127.0.0.1").await[0];
    rig.wait_for(
        "the good machine",
        "SELECT count(*) FROM machine_agent_started",
        1,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        rig.history(good).await.last().unwrap().0,
        HistoryEvent::Finished
    );
    let status = mailbox.send(GetStatus).await.unwrap();
    assert_eq!((status.failed, status.finished), (n as u64, 1));
}

#[actix_rt::test]
async fn a_session_dying_mid_takeover_stops_the_worker_and_a_new_session_finishes_once() {
    let rig = Rig::new().await;
    let mid = rig.machines(1, "127.0.0.1").await[0];
    rig.set_mode(mid, "slow:3");
    let (mailbox, session_actor) = rig
        .initializer(rig.settings(Duration::from_secs(30)), 2)
        .await;
    // Wait for the agent to be running, then kill the session underneath.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while rig.runs(mid) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let session = session_actor.send(GetSession).await.unwrap();
    let sid = session.id();
    rig.bmdb
        .transact(async |tx| {
            tx.execute("UPDATE sessions SET session_deadline = now() - interval '1 second' WHERE session_id = $1", &[&sid])
                .await
        })
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = mailbox.send(GetStatus).await.unwrap();
        if s.aborted == 1 && s.running == 0 {
            assert_eq!(s.session, None);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker did not stop: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The dead session's lease goes with it.
    rig.bmdb
        .collect_expired_sessions(Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(rig.count("SELECT count(*) FROM work").await, 0);
    assert_eq!(
        rig.count("SELECT count(*) FROM machine_agent_started")
            .await,
        0
    );

    // A new session: taken over, once.
    rig.set_mode(mid, "ok");
    let fresh = BmdbSession::open(&rig.bmdb, "initializer").await.unwrap();
    mailbox
        .send(SetSession(Some(fresh.send(GetSession).await.unwrap())))
        .await
        .unwrap();
    rig.wait_for(
        "the takeover",
        "SELECT count(*) FROM machine_agent_started",
        1,
        Duration::from_secs(30),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // the slow first agent has long finished
    assert_eq!(
        rig.history(mid).await,
        vec![
            (HistoryEvent::Started, None),
            (HistoryEvent::Canceled, Some("session expired".into())),
            (HistoryEvent::Started, None),
            (HistoryEvent::Finished, None),
        ]
    );
    assert_eq!(
        rig.count("SELECT count(*) FROM machine_agent_started")
            .await,
        1
    );
}

#[actix_rt::test]
async fn upload_by_exec_works_where_sftp_is_not_wanted() {
    let rig = Rig::new().await;
    let ids = rig.machines(3, "127.0.0.1").await;
    let mut settings = rig.settings(Duration::from_secs(30));
    settings.ssh.upload_by_exec = true;
    let (_mailbox, _s) = rig.initializer(settings, 3).await;
    rig.wait_for(
        "3 agents started",
        "SELECT count(*) FROM machine_agent_started",
        3,
        Duration::from_secs(60),
    )
    .await;
    for mid in ids {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(rig.agent_file(mid, ""))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
    }
}

#[actix_rt::test]
async fn insecure_ignore_accepts_a_changed_key_and_records_nothing() {
    let rig = Rig::new().await;
    let mid = rig.machines(1, "127.0.0.1").await[0];
    let stale = SshIdentity::load_or_generate(&rig.sshd.dir().join("stale_ed25519")).unwrap();
    let stale_key = stale.public_key().to_string();
    rig.bmdb
        .transact(async |tx| machines::record_host_key(tx, mid, &stale_key).await)
        .await
        .unwrap();
    let mut settings = rig.settings(Duration::from_secs(30));
    settings.ssh.host_keys = HostKeyPolicy::InsecureIgnore;
    let (_mailbox, _s) = rig.initializer(settings, 1).await;
    rig.wait_for(
        "the takeover",
        "SELECT count(*) FROM machine_agent_started",
        1,
        Duration::from_secs(30),
    )
    .await;
    // The recorded key is neither checked nor replaced.
    let kept = rig
        .bmdb
        .transact(async |tx| machines::host_key(tx, mid).await)
        .await
        .unwrap();
    assert_eq!(kept.as_deref(), Some(stale_key.as_str()));
}

#[actix_rt::test]
async fn known_hosts_mode_accepts_listed_keys_only() {
    let rig = Rig::new().await;
    let listed = rig.machines(1, "127.0.0.1").await[0];
    let known_hosts = rig.sshd.dir().join("known_hosts");
    std::fs::write(
        &known_hosts,
        format!("[127.0.0.1]:{} {}\n", rig.port(), rig.sshd.host_key),
    )
    .unwrap();
    // Another sshd, with a key of its own that is not listed.
    let _unlisted_sshd = Sshd::start(
        SocketAddr::new([127, 0, 0, 4].into(), rig.port()),
        &[rig.identity.public_key()],
    );
    let unlisted = rig.machines(1, "127.0.0.4").await[0];
    let mut settings = rig.settings(Duration::from_secs(30));
    settings.ssh.host_keys = HostKeyPolicy::KnownHosts;
    settings.ssh.known_hosts_file = Some(known_hosts);
    let (_mailbox, _s) = rig.initializer(settings, 2).await;
    rig.wait_for(
        "the listed machine",
        "SELECT count(*) FROM machine_agent_started",
        1,
        Duration::from_secs(30),
    )
    .await;
    rig.wait_for(
        "the unlisted machine's failure",
        "SELECT count(*) FROM work_backoff",
        1,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        rig.history(listed).await.last().unwrap().0,
        HistoryEvent::Finished
    );
    let cause = rig
        .history(unlisted)
        .await
        .last()
        .unwrap()
        .1
        .clone()
        .unwrap();
    assert!(cause.contains("is not in the known hosts file"), "{cause}");
    // Nothing is learned in this mode.
    assert_eq!(
        rig.count("SELECT count(*) FROM machine_ssh_host_key").await,
        0
    );
}

#[actix_rt::test]
async fn simulated_machines_on_their_own_addresses_are_taken_over() {
    use shepherd_sim::machine::MachineSim;
    let rig = Rig::new().await;
    let port = Sshd::free_port();
    let key = russh::keys::PublicKey::from_openssh(rig.identity.public_key()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sim = MachineSim::start([127, 0, 1, 1].into(), 20, port, key, dir.path())
        .await
        .unwrap();
    let mut ids = Vec::new();
    for a in &sim.addresses {
        ids.push(rig.machines(1, &a.to_string()).await[0]);
    }
    let mut settings = rig.settings(Duration::from_secs(30));
    settings.port = port;
    settings.agent_path = "/root/agent".into();
    let (_mailbox, _s) = rig.initializer(settings, 8).await;
    rig.wait_for(
        "20 simulated machines",
        "SELECT count(*) FROM machine_agent_started",
        20,
        Duration::from_secs(60),
    )
    .await;
    // Each machine got its own copy of the agent, which ran there once,
    // started its resident part, and is gone from the machine's disk.
    let ran = sim.agents.runs();
    for a in &sim.addresses {
        assert_eq!(
            ran.get(a),
            Some(&shepherd_sim::machine::Runs {
                execs: 1,
                agents: 1
            }),
            "{a}"
        );
        let agent = dir.path().join(a.to_string()).join("root/agent");
        assert!(!agent.exists(), "{}", agent.display());
        let runs = std::fs::read_to_string(dir.path().join(a.to_string()).join("root/agent.runs"))
            .unwrap();
        assert_eq!(runs.lines().count(), 1);
    }
}
