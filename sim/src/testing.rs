//! Test support: every test gets its own freshly migrated database.
//!
//! The server is `SHEPHERD_TEST_DATABASE_URL` if set, else PostgreSQL on
//! 127.0.0.1:5432 if it answers (unless `SHEPHERD_TEST_EMBEDDED` is set),
//! else an embedded server (the same code the
//! service uses without `bmdb.url`), started once per test binary in the
//! temporary directory and stopped when the binary exits. Databases are dropped when
//! their [`TestDb`] is.

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

/// A private OpenSSH sshd on a loopback address, for takeover tests: its own
/// host key, authorized keys and config in a temporary directory; stopped on
/// drop (and, via PR_SET_PDEATHSIG, if the test process dies).
pub struct Sshd {
    pub addr: std::net::SocketAddr,
    /// The host key, OpenSSH public format.
    pub host_key: String,
    dir: tempfile::TempDir,
    child: std::process::Child,
}

const SSHD: &str = "/usr/sbin/sshd";

impl Sshd {
    /// A free TCP port on 127.0.0.1.
    /// A port free on 127.0.0.1 now, for a server a test starts. Chosen
    /// below the kernel's ephemeral range (32768 and up), where outgoing
    /// connections take their ports, so that none of the test's own
    /// connections takes it before the server binds it.
    pub fn free_port() -> u16 {
        for _ in 0..200 {
            let port = rand::random_range(20_000..32_000);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// Starts sshd on `addr`, letting in `authorized_keys` as any user.
    pub fn start(addr: std::net::SocketAddr, authorized_keys: &[&str]) -> Sshd {
        assert!(
            std::path::Path::new(SSHD).exists(),
            "OpenSSH's sshd is not installed: apt-get install openssh-server (scripts/test does this)"
        );
        assert!(addr.ip().is_loopback(), "test sshd on loopback only");
        let dir = tempfile::Builder::new()
            .prefix("shepherd-sshd-")
            .tempdir()
            .unwrap();
        let host_key_path = dir.path().join("host_ed25519");
        let host = shepherd::ssh::SshIdentity::load_or_generate(&host_key_path).unwrap();
        let authorized = dir.path().join("authorized_keys");
        std::fs::write(&authorized, authorized_keys.join("\n") + "\n").unwrap();
        // Agents run here run on the test's own host: never as a systemd
        // unit of it.
        std::fs::write(dir.path().join("takeover-agent.unit"), "off\n").unwrap();
        let config = dir.path().join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "ListenAddress {addr}\n\
                 HostKey {hk}\n\
                 PidFile {pid}\n\
                 AuthorizedKeysFile {ak}\n\
                 PermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n\
                 PubkeyAuthentication yes\n\
                 UsePAM no\n\
                 StrictModes no\n\
                 UseDNS no\n\
                 PrintMotd no\n\
                 MaxStartups 500\n\
                 MaxSessions 100\n\
                 LoginGraceTime 30\n\
                 Subsystem sftp internal-sftp\n\
                 LogLevel ERROR\n",
                hk = host_key_path.display(),
                pid = dir.path().join("sshd.pid").display(),
                ak = authorized.display(),
            ),
        )
        .unwrap();
        // Privilege separation wants this directory.
        let _ = std::fs::create_dir_all("/run/sshd");
        let log = std::fs::File::create(dir.path().join("sshd.log")).unwrap();
        let mut cmd = std::process::Command::new(SSHD);
        cmd.args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(std::process::Stdio::null())
            .stderr(log);
        let child = spawn_listening(cmd, addr, "sshd", &dir.path().join("sshd.log"));
        Sshd {
            addr,
            host_key: host.public_key().to_string(),
            dir,
            child,
        }
    }

    /// A directory the test owns, for agents and their sidecar files.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// What sshd logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// Starts `cmd` (stopped with the test process, by PR_SET_PDEATHSIG) and
/// waits until it accepts connections on `addr`; if it exits first, panics
/// with what it wrote to `log`.
fn spawn_listening(
    mut cmd: std::process::Command,
    addr: std::net::SocketAddr,
    what: &str,
    log: &std::path::Path,
) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                .map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("starting {what}: {e}"));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("{what} exited ({status}): {log}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what} did not come up on {addr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// OpenStack's Redfish emulator, sushy-tools, run as a process with its
/// fake driver (no libvirt): `systems` fake ComputerSystems (name, powered
/// on; state kept in the instance's own directory, the driver's default is
/// shared by every emulator of the user), basic authentication for one user (a bcrypt htpasswd file, as it
/// wants), on a free port of 127.0.0.1. Stopped on drop.
pub struct Sushy {
    pub url: String,
    pub user: String,
    pub password: String,
    /// The systems' names; their IDs are their UUIDs (`uuid(i)`).
    pub systems: Vec<String>,
    dir: tempfile::TempDir,
    child: std::process::Child,
}

impl Sushy {
    /// The UUID (and Redfish Id) of system `i`.
    pub fn uuid(i: usize) -> String {
        format!("5e1f0000-0000-4000-8000-{i:012}")
    }

    pub fn start(systems: &[&str], user: &str, password: &str) -> Sushy {
        Self::start_with(systems, user, password, "")
    }

    /// With more lines of emulator configuration (Python).
    pub fn start_with(systems: &[&str], user: &str, password: &str, extra: &str) -> Sushy {
        let dir = tempfile::Builder::new()
            .prefix("shepherd-sushy-")
            .tempdir()
            .unwrap();
        let port = Sshd::free_port();
        let htpasswd = dir.path().join("htpasswd");
        let hashed = std::process::Command::new("python3")
            .args([
                "-c",
                "import bcrypt, sys; print(sys.argv[1] + ':' + bcrypt.hashpw(sys.argv[2].encode(), bcrypt.gensalt(rounds=4)).decode())",
                user,
                password,
            ])
            .output()
            .expect("python3 with bcrypt (installed with sushy-tools by scripts/test)");
        assert!(
            hashed.status.success(),
            "bcrypt: {}",
            String::from_utf8_lossy(&hashed.stderr)
        );
        std::fs::write(&htpasswd, &hashed.stdout).unwrap();
        let fake: Vec<String> = systems
            .iter()
            .enumerate()
            .map(|(i, name)| {
                format!(
                    "{{'uuid': '{}', 'name': '{name}', 'power_state': 'On', 'nics': [{{'mac': '02:00:00:00:{:02x}:{:02x}', 'ip': '127.0.0.1'}}]}}",
                    Self::uuid(i),
                    i / 256,
                    i % 256
                )
            })
            .collect();
        let conf = dir.path().join("emulator.conf");
        std::fs::write(
            &conf,
            format!(
                "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n\
                 SUSHY_EMULATOR_LISTEN_PORT = {port}\n\
                 SUSHY_EMULATOR_AUTH_FILE = '{auth}'\n\
                 SUSHY_EMULATOR_STATE_DIR = '{state}'\n\
                 SUSHY_EMULATOR_FAKE_DRIVER = True\n\
                 SUSHY_EMULATOR_FAKE_SYSTEMS = [{fake}]\n{extra}\n",
                auth = htpasswd.display(),
                state = dir.path().join("state").display(),
                fake = fake.join(", "),
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("emulator.log")).unwrap();
        let mut cmd = std::process::Command::new("python3");
        cmd.args(["-m", "sushy_tools.emulator.main", "--config"])
            .arg(&conf)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let child = spawn_listening(
            cmd,
            addr,
            "sushy-tools (python3 -m sushy_tools.emulator.main; scripts/test installs it)",
            &dir.path().join("emulator.log"),
        );
        Sushy {
            url: format!("http://{addr}"),
            user: user.into(),
            password: password.into(),
            systems: systems.iter().map(|s| s.to_string()).collect(),
            dir,
            child,
        }
    }

    /// What the emulator logged (its request log included).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("emulator.log")).unwrap_or_default()
    }

    /// System `i` as the emulator shows it (JSON), read with its own
    /// credentials.
    pub async fn system(&self, i: usize) -> serde_json::Value {
        let mut r = awc::Client::default()
            .get(format!("{}/redfish/v1/Systems/{}", self.url, Self::uuid(i)))
            .basic_auth(&self.user, &self.password)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{:?}", r.status());
        r.json().limit(1 << 20).await.unwrap()
    }

    /// The BMC settings of system `i` for an inventory host.
    pub fn bmc(&self, i: usize) -> shepherd::config::BmcConfig {
        shepherd::config::BmcConfig {
            url: self.url.clone(),
            username: self.user.clone(),
            password: shepherd::secret::Secret::inline(self.password.clone()),
            system: Some(Self::uuid(i)),
            tls: shepherd::config::BmcTls::Verify,
        }
    }
}

impl Drop for Sushy {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// Runs pgbench (the server's own, found like the embedded server's
/// binaries) with `script` and `clients` clients for `seconds` against
/// `cfg`'s database, `-D` variables `vars`: its transactions per second, or
/// None (with the reason on stderr) if it could not run.
pub fn pgbench(
    cfg: &tokio_postgres::Config,
    script: &str,
    clients: usize,
    seconds: u64,
    vars: &[(&str, String)],
) -> Option<f64> {
    use tokio_postgres::config::Host;
    let bin = shepherd::bmdb::embedded::find_bin_dir(None)
        .ok()?
        .join("pgbench");
    let file = std::env::temp_dir().join(format!(
        "shepherd-bench-{}-{}.sql",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&file, script).ok()?;
    let host = match &cfg.get_hosts()[0] {
        Host::Tcp(h) => h.clone(),
        Host::Unix(p) => p.display().to_string(),
    };
    let mut cmd = std::process::Command::new(bin);
    cmd.args(["-n", "-M", "prepared", "-j", "2", "-c"])
        .arg(clients.to_string())
        .arg("-T")
        .arg(seconds.to_string())
        .arg("-f")
        .arg(&file);
    for (k, v) in vars {
        cmd.arg("-D").arg(format!("{k}={v}"));
    }
    let out = cmd
        .args([
            "-h",
            &host,
            "-p",
            &cfg.get_ports().first().copied().unwrap_or(5432).to_string(),
        ])
        .args([
            "-U",
            cfg.get_user().unwrap_or("postgres"),
            cfg.get_dbname().unwrap(),
        ])
        .output()
        .ok()?;
    let _ = std::fs::remove_file(&file);
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || text.contains("actually processed: 0") {
        eprintln!(
            "pgbench did not run: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    text.lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| {
            l.trim_start_matches("tps = ")
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
}

/// This process's peak resident set size, MB.
pub fn peak_rss_mb() -> f64 {
    shepherd::telemetry::peak_rss_mb()
}

/// `fleet-sim` as a process, for the fleet tests and the fleet bench: it
/// writes the shepherd configuration for its fleet to `config`.
pub struct FleetSimProcess {
    pub config: std::path::PathBuf,
    pub api: std::net::SocketAddr,
    pub control: std::net::SocketAddr,
    child: std::process::Child,
}

impl FleetSimProcess {
    /// Starts `exe` (the fleet-sim binary) with `machines` from `first`,
    /// its state under `dir`, and `extra` arguments; returns once the
    /// fleet is up.
    pub fn start(
        exe: &std::path::Path,
        dir: &std::path::Path,
        machines: usize,
        first: std::net::Ipv4Addr,
        extra: &[&str],
    ) -> FleetSimProcess {
        let api = std::net::SocketAddr::from(([127, 0, 0, 1], Sshd::free_port()));
        let control = std::net::SocketAddr::from(([127, 0, 0, 1], Sshd::free_port()));
        let config = dir.join("fleet.toml");
        let mut child = std::process::Command::new(exe)
            .args(["--machines", &machines.to_string()])
            .args(["--first-address", &first.to_string()])
            .args(["--api-listen", &api.to_string()])
            .args(["--control-listen", &control.to_string()])
            .arg("--dir")
            .arg(dir.join("fleet"))
            .arg("--config-out")
            .arg(&config)
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("fleet-sim.log")).unwrap())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while !config.exists() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "fleet-sim exited ({status}): {}",
                    std::fs::read_to_string(dir.join("fleet-sim.log")).unwrap_or_default()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "fleet-sim did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        FleetSimProcess {
            config,
            api,
            control,
            child,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn get(url: String) -> serde_json::Value {
        let mut r = awc::Client::default().get(&url).send().await.unwrap();
        assert!(r.status().is_success(), "{url}: {}", r.status());
        let body = r.body().limit(64 << 20).await.unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    /// `GET /fleet`: what each machine ran.
    pub async fn report(&self) -> serde_json::Value {
        Self::get(format!("http://{}/fleet", self.control)).await
    }

    /// The Equinix simulator's request counts.
    pub async fn api_stats(&self) -> serde_json::Value {
        Self::get(format!("http://{}/_sim/stats", self.api)).await
    }
}

impl Drop for FleetSimProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `shepherd run` as a process on a configuration file, with environment
/// overrides; its log (stderr) in a file.
pub struct ShepherdProcess {
    pub child: std::process::Child,
    pub log: std::path::PathBuf,
}

impl ShepherdProcess {
    pub fn start(
        exe: &std::path::Path,
        config: &std::path::Path,
        log: std::path::PathBuf,
        env: &[(&str, String)],
    ) -> ShepherdProcess {
        let child = std::process::Command::new(exe)
            .arg("--config")
            .arg(config)
            .arg("run")
            .env_remove("RUST_LOG")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        ShepherdProcess { child, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lines of the log that contain `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// The log's last 40 lines.
    pub fn log_tail(&self) -> String {
        let t = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Panics with the log if the process has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("shepherd exited ({status}):\n{}", self.log_tail());
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits up to `timeout` for the exit; its code.
    pub fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let started = std::time::Instant::now();
        while started.elapsed() < timeout {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
        None
    }
}

impl Drop for ShepherdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A stripped copy of `binary` in the temporary directory (an unstripped
/// copy where `strip` is missing): the agent as one would ship it, for the
/// benches that upload it thousands of times.
pub fn stripped_copy(binary: &std::path::Path) -> std::path::PathBuf {
    let name = binary.file_name().unwrap().to_string_lossy();
    let out = std::env::temp_dir().join(format!("shepherd-bench-{name}-{}", std::process::id()));
    let stripped = std::process::Command::new("strip")
        .arg("-o")
        .arg(&out)
        .arg(binary)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        std::fs::copy(binary, &out).unwrap();
    }
    out
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

/// Runs `tests/browser/admin_pages.py` (headless Chromium through
/// chromedriver) with `args`: what it saw, as JSON.
pub async fn browse(args: Vec<String>) -> serde_json::Value {
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../tests/browser/admin_pages.py"
            ))
            .args(&args)
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "admin_pages.py {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    })
    .await
    .unwrap()
}

/// A binary of the workspace, built by the profile of the running test or
/// benchmark: `shepherd`, `takeover-agent` (with its test fault modes),
/// `fleet-sim`, `equinix-sim`, `shepherd-demo`. `cargo test --workspace`
/// (scripts/test) builds them all before any test runs; a test or
/// benchmark run alone builds them here once, if one is missing.
pub fn bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the running test's path");
    let mut dir = exe.parent().expect("a directory").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    if !path.exists() {
        static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
        BUILT.get_or_init(|| build_bins(&dir));
    }
    assert!(
        path.exists(),
        "{} is missing: cargo build --workspace --bins --features shepherd-agent/faults",
        path.display()
    );
    path
}

/// Builds the workspace's binaries into `dir` (a target directory's
/// profile directory) with the agent's test fault modes.
fn build_bins(dir: &std::path::Path) {
    let profile = match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        // Benchmarks: the bench profile writes to release/ as well.
        Some("release") if !cfg!(debug_assertions) => "bench",
        Some(other) => other,
        None => "dev",
    };
    let target = dir.parent().expect("a target directory");
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    eprintln!(
        "building the workspace's binaries ({profile}) into {}",
        dir.display()
    );
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--workspace", "--bins"])
        .args(["--features", "shepherd-agent/faults", "--profile", profile])
        .arg("--manifest-path")
        .arg(manifest)
        .arg("--target-dir")
        .arg(target)
        .status()
        .expect("cargo");
    assert!(status.success(), "building the workspace's binaries failed");
}

/// Where a stand-in boot image holds its slot, and the slot's length (as
/// `scripts/boot-image` makes it).
pub const BOOT_SLOT_AT: u64 = 1 << 20;
pub const BOOT_SLOT_LEN: u64 = 16384;

/// A stand-in for `scripts/boot-image`'s output in `dir`: 3 MiB of bytes
/// with the placeholder slot at 1 MiB, and its `.slot` file. Its path and
/// bytes.
pub fn boot_image_stand_in(dir: &std::path::Path) -> (std::path::PathBuf, Vec<u8>) {
    let mut bytes: Vec<u8> = (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    let mut slot = b"070701".to_vec();
    slot.extend_from_slice(b"SHEPHERD-BOOT-DATA-SLOT-PLACEHOLDER\n");
    slot.resize(BOOT_SLOT_LEN as usize, 0);
    let at = BOOT_SLOT_AT as usize;
    bytes[at..at + BOOT_SLOT_LEN as usize].copy_from_slice(&slot);
    let path = dir.join("shepherd-boot.iso");
    std::fs::write(&path, &bytes).unwrap();
    std::fs::write(
        dir.join("shepherd-boot.iso.slot"),
        format!("offset {BOOT_SLOT_AT}\nlength {BOOT_SLOT_LEN}\nkernel test\n"),
    )
    .unwrap();
    (path, bytes)
}

/// The boot data file (`shepherd/boot-data`, encoded `BootData`) a boot's
/// slot holds, as GNU cpio extracts it (the boot image's kernel reads the
/// same newc archive).
pub fn boot_data_file(slot: &[u8]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("cpio")
        .args(["-idm", "--quiet"])
        .current_dir(dir.path())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("GNU cpio");
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(slot).unwrap();
    assert!(child.wait().unwrap().success(), "cpio read the slot");
    std::fs::read(dir.path().join("shepherd/boot-data")).unwrap()
}

/// The real live agent (`takeover-agent --live`), as the boot image's init
/// starts it, from a copy of its own in `dir` (the files beside it are its
/// settings: heartbeats every second, no disks) with `boot_data` (an
/// encoded `BootData`); its output piped.
pub fn live_agent(dir: &std::path::Path, boot_data: &[u8]) -> std::process::Child {
    std::fs::create_dir_all(dir).unwrap();
    let exe = dir.join("takeover-agent");
    std::fs::copy(bin("takeover-agent"), &exe).unwrap();
    std::fs::write(dir.join("takeover-agent.interval"), "1s").unwrap();
    std::fs::write(dir.join("takeover-agent.disks"), "").unwrap();
    let file = dir.join("boot-data");
    std::fs::write(&file, boot_data).unwrap();
    std::process::Command::new(&exe)
        .arg("--live")
        .arg(&file)
        .env("TAKEOVER_AGENT_REBOOT", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// GETs (or HEADs) `url` as a BMC fetches a boot image: trusting the
/// fleet's CA (`ca_der`), no client certificate, one `range` if given.
/// (status, body, Content-Length).
pub async fn fetch_as_bmc(
    ca_der: &[u8],
    url: &str,
    range: Option<&str>,
    head: bool,
) -> (u16, Vec<u8>, Option<String>) {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(ca_der.to_vec()))
        .unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let client = awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(std::sync::Arc::new(tls)))
        .timeout(Duration::from_secs(20))
        .finish();
    let mut req = if head {
        client.head(url)
    } else {
        client.get(url)
    };
    if let Some(r) = range {
        req = req.insert_header(("Range", r));
    }
    let mut r = req.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let len = r
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = r.body().limit(16 << 20).await.unwrap();
    (r.status().as_u16(), body.to_vec(), len)
}
