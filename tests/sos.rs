//! Machines' consoles over shepherd's SSH, as Equinix Metal's SOS was,
//! driven by OpenSSH's own client against `shepherd run`:
//!
//! - the console is a BMC's SSH console: an OpenSSH server whose forced
//!   command prints a line and then echoes what it is typed (as a serial
//!   line with a shell on it does);
//! - two operators on one console: the first holds the keyboard, the
//!   second reads what the first types and types nowhere, then takes the
//!   keyboard when the first leaves with Ctrl-];
//! - a tenant reaches its own device with its project's key, is shown
//!   nothing of the BMC, and reaches no other machine; an unknown key
//!   reaches nothing;
//! - every connection is audited (who, the key, the keyboard, the bytes,
//!   why it ended) and shown on the machine page; no password or private
//!   key is shown to anyone or logged.
//!
//! Needs sshd and ssh (scripts/test installs them).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shepherd::bmdb::Bmdb;
use shepherd::ssh::SshIdentity;
use shepherd_sim::testing::{ShepherdProcess, Sshd, TestDb};
use uuid::Uuid;

const SHEPHERD: &str = env!("CARGO_BIN_EXE_shepherd");
const BMC_PASSWORD: &str = "bmc-pw-505-c0ns";

/// OpenSSH's client on the console server, its output gathered as it
/// comes.
struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Arc<Mutex<Vec<u8>>>,
    name: &'static str,
}

impl Client {
    fn connect(name: &'static str, port: u16, key: &Path, user: &str) -> Client {
        let mut child = Command::new("ssh")
            .args(["-p", &port.to_string(), "-i"])
            .arg(key)
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "BatchMode=yes",
                "-o",
                "LogLevel=ERROR",
                "-T",
                "-e",
                "none",
            ])
            .arg(format!("{user}@127.0.0.1"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("OpenSSH's ssh");
        let out = Arc::new(Mutex::new(Vec::new()));
        for mut stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let out = out.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    out.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            });
        }
        Client {
            stdin: child.stdin.take(),
            child,
            out,
            name,
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    fn type_(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("still connected");
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    /// Waits until its output holds `what`.
    async fn sees(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.text().contains(what) {
            assert!(
                Instant::now() < deadline,
                "{} never saw {what:?}; it saw: {:?}",
                self.name,
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for ssh to exit: its status.
    async fn exits(&mut self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit: {:?}",
                self.name,
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn key(dir: &Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(name);
    let id = SshIdentity::load_or_generate(&path).unwrap();
    (path, id.public_key().to_string())
}

async fn one<T: tokio_postgres::types::FromSqlOwned>(bmdb: &Bmdb, sql: &'static str) -> Option<T> {
    bmdb.transact(async |tx| Ok(tx.query_opt(sql, &[]).await?.map(|r| r.get(0))))
        .await
        .unwrap()
}

#[actix_rt::test]
async fn operators_and_tenants_reach_consoles_over_ssh_one_keyboard_at_a_time() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let dir = tempfile::tempdir().unwrap();

    // The machine's serial line, behind its BMC's SSH.
    let (bmc_key, bmc_public) = key(dir.path(), "bmc_console_ed25519");
    let bmc_private = std::fs::read_to_string(&bmc_key).unwrap();
    let bmc = Sshd::start(
        format!("127.0.0.1:{}", Sshd::free_port()).parse().unwrap(),
        &[&format!(
            "command=\"echo serial: rack1-u2 ready; exec cat\",no-pty {bmc_public}"
        )],
    );
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .unwrap()
        .unwrap()
        .name;

    // Operators' keys; a tenant's; a stranger's.
    let (alice, alice_public) = key(dir.path(), "alice");
    let (bob, bob_public) = key(dir.path(), "bob");
    let (tenant, tenant_public) = key(dir.path(), "tenant");
    let (stranger, _) = key(dir.path(), "stranger");
    let operators = dir.path().join("operators");
    std::fs::write(
        &operators,
        format!(
            "# the console's operators\n{} alice\n{} bob\n",
            alice_public
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" "),
            bob_public
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
        ),
    )
    .unwrap();

    let port = Sshd::free_port();
    let config = format!(
        "[provider]\nkind = \"static\"\n\n[[provider.inventory.machines]]\nid = \"rack1-u2\"\n\
         address = \"127.0.0.1\"\n\
         bmc = {{ url = \"https://127.0.0.1:9\", username = \"admin\", password = \"{BMC_PASSWORD}\", \
         console = {{ via = \"ssh\", address = \"{addr}\", username = \"{user}\", command = \"console com2\", \
         key_file = \"{key}\", host_key = \"{host_key}\" }} }}\n\
         \n[console]\nlisten = \"127.0.0.1:{port}\"\nhost_key_file = \"{host}\"\noperator_keys = \"{operators}\"\n",
        addr = bmc.addr,
        key = bmc_key.display(),
        host_key = bmc.host_key.trim(),
        host = dir.path().join("console_host").display(),
        operators = operators.display(),
    );
    let path = dir.path().join("shepherd.toml");
    std::fs::write(&path, config).unwrap();
    let admin = format!("127.0.0.1:{}", Sshd::free_port());
    let env: Vec<(&str, String)> = vec![
        ("SHEPHERD__BMDB__URL", db.url()),
        ("SHEPHERD__ADMIN__LISTEN", admin.clone()),
        (
            "SHEPHERD__BMAAS__LISTEN",
            format!("127.0.0.1:{}", Sshd::free_port()),
        ),
        ("SHEPHERD__PROVISIONER__INTERVAL", "1s".into()),
        // Nothing answers a takeover: the machine waits, untouched.
        ("SHEPHERD__SSH__PORT", Sshd::free_port().to_string()),
        (
            "SHEPHERD__SSH__KEY_FILE",
            dir.path().join("id_ed25519").display().to_string(),
        ),
        (
            "SHEPHERD__LOG__LEVEL",
            "info,shepherd=debug,tokio_postgres=warn".into(),
        ),
        // Connections told alive every second: a killed shepherd's are
        // ended within seconds (below).
        ("SHEPHERD__CONSOLE__KEEP_ALIVE", "1s".into()),
    ];
    let start =
        |log: &str| ShepherdProcess::start(Path::new(SHEPHERD), &path, dir.path().join(log), &env);
    let mut shepherd = start("shepherd.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    let machine: Uuid = loop {
        if let Some(m) = one(
            &bmdb,
            "SELECT machine_id FROM machine_summary WHERE provider_id = 'rack1-u2'",
        )
        .await
        {
            break m;
        }
        shepherd.assert_running();
        assert!(Instant::now() < deadline, "{}", shepherd.log_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // Alice first, by the machine's ID: the keyboard is hers.
    let mut a = Client::connect("alice", port, &alice, &machine.to_string());
    a.sees("the keyboard is yours").await;
    a.sees("serial: rack1-u2 ready").await;
    assert!(
        a.text().contains(&format!("ssh {user}@{}", bmc.addr)),
        "{}",
        a.text()
    );
    // Bob, by its provider's ID: he reads.
    let mut b = Client::connect("bob", port, &bob, "rack1-u2");
    b.sees("read-only: operator alice holds the keyboard").await;
    a.type_(b"hello from alice\n");
    a.sees("hello from alice").await;
    b.sees("hello from alice").await;
    b.type_(b"bob was here\n");
    b.sees("your keys go nowhere: operator alice holds the keyboard")
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!a.text().contains("bob was here"), "{}", a.text());

    // Alice leaves with Ctrl-]: Bob has the keyboard.
    a.type_(&[0x1d]);
    a.sees("left the console").await;
    assert_eq!(a.exits().await, 0, "{}", a.text());
    b.sees("the keyboard is yours now").await;
    b.type_(b"bob types now\n");
    b.sees("bob types now").await;

    // A tenant whose project has the machine as its device.
    let (tenant_line, fingerprint) =
        shepherd::bmdb::tenants::parse_public_key(&tenant_public).unwrap();
    let device = Uuid::new_v4();
    bmdb.transact(async |tx| {
        let project: Uuid = tx
            .query_one(
                "INSERT INTO project (name, created_by) VALUES ('acme', 'test') RETURNING project_id",
                &[],
            )
            .await?
            .get(0);
        shepherd::bmdb::tenants::add_key(tx, project, "laptop", &tenant_line, &fingerprint)
            .await?
            .unwrap();
        tx.execute(
            "INSERT INTO device (device_id, project_id, machine_id, hostname, plan, metro, \
               operating_system, created_at, created_by, updated_at) \
             VALUES ($1, $2, $3, 'web-1', 'c3.small.x86', 'sv', 'debian_12', now(), 'test', now())",
            &[&device, &project, &machine],
        )
        .await?;
        Ok(())
    })
    .await
    .unwrap();
    let t = Client::connect("tenant", port, &tenant, &device.to_string());
    t.sees("read-only: another connection holds the keyboard")
        .await;
    t.sees("bob types now").await;
    assert!(!t.text().contains(&bmc.addr.to_string()), "{}", t.text());
    assert!(!t.text().contains("operator"), "{}", t.text());
    // Not as the machine, not with a stranger's key.
    for (name, key, as_) in [
        ("tenant as the machine", &tenant, machine.to_string()),
        ("stranger", &stranger, device.to_string()),
        (
            "stranger as an operator would",
            &stranger,
            machine.to_string(),
        ),
    ] {
        let mut c = Client::connect("refused", port, key, &as_);
        assert_eq!(c.exits().await, 255, "{name}: {}", c.text());
        assert!(
            c.text().contains("Permission denied"),
            "{name}: {}",
            c.text()
        );
    }

    // The tenant leaves; Bob goes away without a word.
    let mut t = t;
    t.type_(&[0x1d]);
    assert_eq!(t.exits().await, 0);
    drop(b);

    // The audit: who, with which key, whether they typed, why it ended.
    let deadline = Instant::now() + Duration::from_secs(20);
    let sessions = loop {
        let s = bmdb
            .transact(async |tx| shepherd::bmdb::console_sessions::recent(tx, machine, 10).await)
            .await
            .unwrap();
        if s.len() == 3 && s.iter().all(|s| s.ended_at.is_some()) {
            break s;
        }
        assert!(Instant::now() < deadline, "{s:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let by = |who: &str| sessions.iter().find(|s| s.who.starts_with(who)).unwrap();
    let (sa, sb, st) = (
        by("operator alice"),
        by("operator bob"),
        by("tenant project"),
    );
    assert!(sa.wrote && sb.wrote && !st.wrote, "{sessions:?}");
    assert_eq!(sa.end_reason.as_deref(), Some("left"));
    assert_eq!(sb.end_reason.as_deref(), Some("disconnected"));
    assert_eq!(st.end_reason.as_deref(), Some("left"));
    assert_eq!(sa.bytes_typed, "hello from alice\n".len() as i64);
    assert_eq!(sb.bytes_typed, "bob types now\n".len() as i64);
    assert_eq!(st.bytes_typed, 0);
    assert!(st.who.ends_with("key laptop"), "{}", st.who);
    assert_eq!(st.key_fingerprint, fingerprint);
    assert!(sa.bytes_shown > 0 && st.bytes_shown > 0, "{sessions:?}");

    // The machine page shows them.
    let page = shepherd_sim::testing::page(&format!("http://{admin}/machines/{machine}")).await;
    let audit = page
        .split("<table id=\"console-sessions\">")
        .nth(1)
        .unwrap_or_else(|| panic!("the console's audit on the page: {page}"));
    for who in ["operator alice", "operator bob", "tenant project"] {
        assert!(audit.contains(who), "{who}: {audit}");
    }
    // The timeline holds the connections too.
    let timeline = page
        .split("<table id=\"history\">")
        .nth(1)
        .unwrap_or_else(|| panic!("the timeline: {page}"));
    assert!(
        timeline.contains("operator alice on the console over SSH")
            && timeline.contains("held the keyboard; left"),
        "{timeline}"
    );
    println!("what alice's terminal showed:\n{}", a.text());
    println!("what the tenant's terminal showed:\n{}", t.text());
    // SHEPHERD_SCREENSHOTS=DIR: the machine page as a browser shows it.
    if let Some(shots) = std::env::var_os("SHEPHERD_SCREENSHOTS") {
        shepherd_sim::testing::screenshot(
            &format!("http://{admin}/machines/{machine}"),
            &Path::new(&shots).join("machine-console-sessions.png"),
            1280,
            1600,
        );
    }

    // No password and no private key shown to anyone, nor logged.
    shepherd.terminate(Duration::from_secs(20));
    let log = std::fs::read_to_string(dir.path().join("shepherd.log")).unwrap();
    assert!(log.contains("console login"), "{log}");
    let secret_line = bmc_private
        .lines()
        .nth(1)
        .expect("the private key's first line of key material");
    for (what, text) in [("alice", a.text()), ("tenant", t.text()), ("log", log)] {
        assert!(
            !text.contains(BMC_PASSWORD),
            "{what} shows the BMC password"
        );
        assert!(
            !text.contains(secret_line),
            "{what} shows the console's private key"
        );
    }

    // A shepherd killed with someone on a console cannot end the
    // connection: the next shepherd's console server ends it once no one
    // has told it alive for four seconds.
    let mut shepherd = start("shepherd-killed.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        shepherd.assert_running();
        assert!(Instant::now() < deadline, "{}", shepherd.log_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut a = Client::connect("alice", port, &alice, &machine.to_string());
    a.sees("the keyboard is yours").await;
    shepherd.kill();
    let _ = a.exits().await;
    let open = |s: &[shepherd::bmdb::console_sessions::ConsoleSession]| {
        s.iter().filter(|s| s.ended_at.is_none()).count()
    };
    let recent = async || {
        bmdb.transact(async |tx| shepherd::bmdb::console_sessions::recent(tx, machine, 10).await)
            .await
            .unwrap()
    };
    let s = recent().await;
    assert_eq!(
        (s.len(), open(&s)),
        (4, 1),
        "the killed one's connection stays open: {s:?}"
    );
    let mut next = start("shepherd-next.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    let ended = loop {
        let s = recent().await;
        if open(&s) == 0 {
            break s;
        }
        next.assert_running();
        assert!(
            Instant::now() < deadline,
            "never ended: {s:?}\n{}",
            next.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let killed = &ended[0];
    assert!(killed.who.starts_with("operator alice"), "{ended:?}");
    assert_eq!(
        killed.end_reason.as_deref(),
        Some("its shepherd stopped without ending it (no word from it since)")
    );
    next.terminate(Duration::from_secs(20));
}
