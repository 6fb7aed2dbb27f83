//! Test databases: a fresh migrated database per test on a shared server
//! (external or embedded), a PostgreSQL of the test's own, and helpers
//! that seed and read the BMDB.

use std::sync::OnceLock;
use std::time::Duration;

use shepherd::bmdb::{Bmdb, BmdbOptions, EmbeddedPostgres};
use shepherd::config::{EmbeddedConfig, Isolation};

enum Server {
    External(tokio_postgres::Config),
    Embedded(EmbeddedPostgres),
}

impl Server {
    fn config_for(&self, db: &str) -> tokio_postgres::Config {
        match self {
            Server::External(c) => {
                let mut c = c.clone();
                c.dbname(db);
                c
            }
            Server::Embedded(e) => e.config_for(db),
        }
    }
}

static SERVER: OnceLock<Server> = OnceLock::new();

const DATA_DIR_PREFIX: &str = "bmdb-test-";

/// Removes the data directories of embedded test servers whose test binary
/// is gone (their server shut down with it).
fn sweep_stale_data_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DATA_DIR_PREFIX))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        if !alive {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn external_config() -> Option<tokio_postgres::Config> {
    if std::env::var_os("SHEPHERD_TEST_EMBEDDED").is_some() {
        return None;
    }
    if let Ok(url) = std::env::var("SHEPHERD_TEST_DATABASE_URL") {
        return Some(
            url.parse()
                .expect("SHEPHERD_TEST_DATABASE_URL is not a PostgreSQL URL"),
        );
    }
    let addr = "127.0.0.1:5432".parse().unwrap();
    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    Some(
        "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
            .parse()
            .unwrap(),
    )
}

/// Runs `f` on a fresh current-thread runtime on its own thread: usable from
/// any context, including `Drop`.
fn block_on_side<T: Send + 'static>(f: impl std::future::Future<Output = T> + Send + 'static) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    })
    .join()
    .expect("test support thread panicked")
}

fn server() -> &'static Server {
    SERVER.get_or_init(|| {
        if let Some(c) = external_config() {
            return Server::External(c);
        }
        sweep_stale_data_dirs();
        let dir = std::env::temp_dir().join(format!("{DATA_DIR_PREFIX}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cfg = EmbeddedConfig {
            data_dir: dir,
            fsync: false,
            ..EmbeddedConfig::default()
        };
        let server = block_on_side(async move { EmbeddedPostgres::start(&cfg).await })
            .expect("no PostgreSQL at 127.0.0.1:5432 and the embedded one did not start");
        Server::Embedded(server)
    })
}

/// A machine of no provider (as an inventory host is), with an agent
/// started with the key of `seed` when one is given; its ID.
pub async fn machine(bmdb: &Bmdb, agent_seed: Option<[u8; 32]>) -> uuid::Uuid {
    use shepherd::bmdb::machines::{NewProvidedMachine, create_provided, set_agent_started};
    let m = NewProvidedMachine {
        provider: shepherd::bmdb::Provider::None,
        provider_id: format!("host-{}", uuid::Uuid::new_v4()),
        reservation_id: None,
        ip_address: Some("192.0.2.1".into()),
        location: None,
        status: None,
    };
    let key = agent_seed.map(|s| {
        ed25519_dalek::SigningKey::from_bytes(&s)
            .verifying_key()
            .to_bytes()
    });
    bmdb.transact(async |tx| {
        let id = create_provided(tx, &m).await?;
        if let Some(key) = &key {
            set_agent_started(tx, id, key, None).await?;
        }
        Ok(id)
    })
    .await
    .expect("a machine in the BMDB")
}

/// A machine whose agent holds the key of `seed`, asked to install the
/// served image `name` (so that the image server grants it the image, its
/// manifest and its swarm); its ID.
pub async fn asked_machine(bmdb: &Bmdb, seed: [u8; 32], name: &str) -> uuid::Uuid {
    use shepherd::bmdb::installations::{Asker, ask};
    let id = machine(bmdb, Some(seed)).await;
    let image = shepherd_proto::api::ImageInstallation {
        url: format!("https://127.0.0.1:7831/images/{name}"),
        digest: format!("sha256:{}", "0".repeat(64)),
        ..Default::default()
    };
    let asker = Asker {
        actor: "test",
        action_id: uuid::Uuid::new_v4(),
        rollout_id: None,
        reason: None,
    };
    bmdb.transact(async |tx| ask(tx, id, &image, &asker).await)
        .await
        .expect("an installation asked");
    id
}

/// A PostgreSQL server of the test's own (the embedded server's code: unix
/// socket, fsync off), for fault tests that stop and start it under a
/// running shepherd. Stopped and removed on drop.
pub struct OwnPostgres {
    cfg: EmbeddedConfig,
    server: Option<EmbeddedPostgres>,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl OwnPostgres {
    pub async fn start() -> OwnPostgres {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temporary directory");
        // The server may run as `postgres` (we are root): let it in.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let cfg = EmbeddedConfig {
            data_dir: dir.path().join("data"),
            fsync: false,
            ..EmbeddedConfig::default()
        };
        let server = EmbeddedPostgres::start(&cfg)
            .await
            .expect("start a PostgreSQL of the test's own");
        OwnPostgres {
            socket: server.socket_dir().to_path_buf(),
            cfg,
            server: Some(server),
            _dir: dir,
        }
    }

    /// The shepherd database on it, as a key/value connection string.
    pub fn url(&self) -> String {
        format!(
            "host={} port=5432 user=postgres dbname={}",
            self.socket.display(),
            shepherd::bmdb::embedded::EMBEDDED_DATABASE
        )
    }

    /// A pool on it (retrying through restarts like shepherd's own).
    pub async fn bmdb(&self) -> Bmdb {
        Bmdb::connect(
            self.url().parse().unwrap(),
            4,
            Duration::from_secs(2),
            Duration::from_secs(30),
            TestDb::options(Isolation::ReadCommitted),
        )
        .await
        .expect("connect to the test's own PostgreSQL")
    }

    /// Fast shutdown (clients are disconnected), as a restart begins.
    pub fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.stop();
        }
    }

    /// Starts it again on the same data and socket.
    pub async fn start_again(&mut self) {
        assert!(self.server.is_none(), "already running");
        let server = EmbeddedPostgres::start(&self.cfg)
            .await
            .expect("restart the test's own PostgreSQL");
        self.server = Some(server);
    }
}

/// A database of one's own, migrated, dropped on drop.
pub struct TestDb {
    name: String,
    pub config: tokio_postgres::Config,
}

impl TestDb {
    pub async fn new() -> TestDb {
        let db = Self::new_unmigrated().await;
        db.bmdb()
            .await
            .migrate()
            .await
            .expect("migrate test database");
        db
    }

    /// An empty database, not migrated.
    pub async fn new_unmigrated() -> TestDb {
        let server = server();
        let name = format!("shepherd_test_{}", uuid::Uuid::new_v4().simple());
        let admin = server.config_for("postgres");
        let create = format!("CREATE DATABASE {name}");
        block_on_side(async move {
            let (client, conn) = admin
                .connect(tokio_postgres::NoTls)
                .await
                .expect("connect to test server");
            tokio::spawn(conn);
            client
                .batch_execute(&create)
                .await
                .expect("create test database");
        });
        let config = server.config_for(&name);
        TestDb { name, config }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A pool on this database with test-friendly options.
    pub async fn bmdb(&self) -> Bmdb {
        self.bmdb_with(Self::options(Isolation::ReadCommitted), 16)
            .await
    }

    pub fn options(isolation: Isolation) -> BmdbOptions {
        BmdbOptions {
            isolation,
            max_attempts: 50,
            session_interval: Duration::from_secs(10),
            session_gc_grace: Duration::from_secs(0),
            failover_window: Duration::from_secs(5),
        }
    }

    pub async fn bmdb_with(&self, options: BmdbOptions, pool_size: u32) -> Bmdb {
        Self::pool(self.config.clone(), options, pool_size).await
    }

    /// A pool on `config` as every test makes one.
    async fn pool(config: tokio_postgres::Config, options: BmdbOptions, pool_size: u32) -> Bmdb {
        Bmdb::connect(
            config,
            pool_size,
            Duration::from_secs(5),
            Duration::from_secs(30),
            options,
        )
        .await
        .expect("connect to the test database")
    }

    /// This database through PostgreSQL's unix socket, as a key/value
    /// connection string: how a process in a network namespace reaches it
    /// (127.0.0.1 there is the namespace's own). None: no socket found.
    pub fn socket_url(&self) -> Option<String> {
        use tokio_postgres::config::Host;
        match &self.config.get_hosts()[0] {
            Host::Unix(_) => Some(self.url()),
            Host::Tcp(_) => {
                let port = self.config.get_ports().first().copied().unwrap_or(5432);
                ["/var/run/postgresql", "/run/postgresql", "/tmp"]
                    .into_iter()
                    .find(|d| std::path::Path::new(&format!("{d}/.s.PGSQL.{port}")).exists())
                    .map(|d| {
                        format!(
                            "host={d} port={port} user={} dbname={}",
                            self.config.get_user().unwrap_or("postgres"),
                            self.name
                        )
                    })
            }
        }
    }

    /// This database as a key/value connection string.
    pub fn url(&self) -> String {
        use tokio_postgres::config::Host;
        let host = match &self.config.get_hosts()[0] {
            Host::Tcp(h) => h.clone(),
            Host::Unix(p) => p.display().to_string(),
        };
        format!(
            "host={host} port={} user={} dbname={}",
            self.config.get_ports().first().copied().unwrap_or(5432),
            self.config.get_user().unwrap_or("postgres"),
            self.name
        )
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin = server().config_for("postgres");
        let drop_sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        block_on_side(async move {
            if let Ok((client, conn)) = admin.connect(tokio_postgres::NoTls).await {
                tokio::spawn(conn);
                let _ = client.batch_execute(&drop_sql).await;
            }
        });
    }
}

impl TestDb {
    /// A pool with the test options on the database at `url` (a cluster's
    /// several hosts, say), which the caller made and drops.
    pub async fn connect_url(url: &str) -> Bmdb {
        let config = url.parse().expect("a PostgreSQL connection string");
        Self::pool(config, Self::options(Isolation::ReadCommitted), 4).await
    }

    /// Creates database `name` (dropping an older one) on the server at
    /// `url`.
    pub async fn create_database(url: &str, name: &str) {
        let config: tokio_postgres::Config = url.parse().expect("a PostgreSQL connection string");
        let (client, conn) = config
            .connect(tokio_postgres::NoTls)
            .await
            .expect("connect to create a database");
        tokio::spawn(conn);
        client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await
            .unwrap();
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
    }
}

/// The one number `sql` (a `SELECT count(*) …`) answers.
pub async fn count(bmdb: &Bmdb, sql: &'static str) -> i64 {
    bmdb.transact(async |tx| Ok(tx.query_one(sql, &[]).await?.get::<_, i64>(0)))
        .await
        .unwrap()
}

/// The endpoint the selector tests and benchmarks judge silence by.
pub const TEST_ENDPOINT: &str = "callback.test:7830";

/// Records `endpoint` as served without a break since `ago` and for a day
/// more, as a long-running shepherd's session heartbeats would have.
pub async fn served_since(bmdb: &Bmdb, endpoint: &str, ago: Duration) {
    let (endpoint, ago) = (endpoint.to_string(), ago.as_secs_f64());
    bmdb.transact(async |tx| {
        tx.execute(
            "INSERT INTO callback_endpoint (endpoint, serving_since, served_until) \
             VALUES ($1, now() - make_interval(secs => $2), now() + interval '1 day') \
             ON CONFLICT (endpoint) DO UPDATE SET serving_since = EXCLUDED.serving_since, \
               served_until = EXCLUDED.served_until",
            &[&endpoint, &ago],
        )
        .await
    })
    .await
    .unwrap();
}

/// The installation history of `machine_id` as the BMDB library reads it
/// back (`installations::installation`): each event with its detail, in
/// order.
pub async fn installation_history(
    bmdb: &Bmdb,
    machine_id: uuid::Uuid,
) -> Vec<(String, Option<String>)> {
    bmdb.transact(async |tx| shepherd::bmdb::installations::installation(tx, machine_id).await)
        .await
        .unwrap()
        .map(|i| i.history.into_iter().map(|h| (h.event, h.detail)).collect())
        .unwrap_or_default()
}

/// The rows of `sql`, two columns each, as pairs (a count by group).
pub async fn pairs<A, B>(bmdb: &Bmdb, sql: &'static str) -> Vec<(A, B)>
where
    A: for<'a> tokio_postgres::types::FromSql<'a>,
    B: for<'a> tokio_postgres::types::FromSql<'a>,
{
    bmdb.transact(async |tx| {
        Ok(tx
            .query(sql, &[])
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    })
    .await
    .unwrap()
}

/// [`TEST_ENDPOINT`] served for a day: every silent machine on it (or with
/// no recorded endpoint, judged by it) is judgeable.
pub async fn serve_test_endpoint(bmdb: &Bmdb) {
    served_since(bmdb, TEST_ENDPOINT, Duration::from_secs(86400)).await
}
