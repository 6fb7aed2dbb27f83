//! The `shepherd` binary as an operator runs it.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use shepherd_sim::testing::TestDb;

const SECRET: &str = "hunter2-do-not-print";

fn shepherd() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shepherd"));
    for (k, _) in std::env::vars() {
        if k.starts_with("SHEPHERD") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

fn config_file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

fn check_config(text: &str, env: &[(&str, &str)]) -> Output {
    let f = config_file(text);
    let mut cmd = shepherd();
    cmd.arg("--config").arg(f.path()).arg("check-config");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Exit 2, an error naming `key`, and no secret anywhere.
fn assert_rejected(o: &Output, key: &str) {
    let (out, err) = (stdout(o), stderr(o));
    assert_eq!(o.status.code(), Some(2), "stdout: {out}\nstderr: {err}");
    assert!(err.contains(key), "error does not name {key}: {err}");
    assert!(
        !err.contains(SECRET) && !out.contains(SECRET),
        "secret printed: {err}{out}"
    );
}

#[test]
fn help_lists_the_subcommands() {
    let o = shepherd().arg("--help").output().unwrap();
    assert!(o.status.success());
    for c in ["run", "migrate", "check-config"] {
        assert!(stdout(&o).contains(c), "{c} missing from --help");
    }
}

#[test]
fn the_manual_pages_and_completions_come_from_the_command_line() {
    // Even with a configuration that would not load: they need none.
    let bad = config_file("[bmdb]\npool_size = \"many\"\n");
    let o = shepherd()
        .arg("--config")
        .arg(bad.path())
        .arg("man")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let page = stdout(&o);
    assert!(page.contains(".TH shepherd 1"), "{page}");
    assert!(page.contains("check\\-config"), "{page}");
    let dir = tempfile::tempdir().unwrap();
    let o = shepherd()
        .args(["man", "--out-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let install = std::fs::read_to_string(dir.path().join("shepherd-machines-install.1")).unwrap();
    assert!(install.contains("allow\\-boot\\-disk"), "{install}");
    for (shell, needle) in [
        ("bash", "complete -F _shepherd"),
        ("zsh", "#compdef shepherd"),
        ("fish", "complete -c shepherd"),
    ] {
        let o = shepherd().args(["completions", shell]).output().unwrap();
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        let script = stdout(&o);
        assert!(script.contains(needle), "{shell}: {script}");
        assert!(
            script.contains("retakeover"),
            "{shell} completes the subcommands"
        );
    }
    let o = shepherd().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("tcsh"), "{}", stderr(&o));
}

#[test]
fn defaults_are_a_valid_configuration() {
    let o = shepherd().arg("check-config").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("data_dir = \"var/bmdb\""),
        "{}",
        stdout(&o)
    );
}

#[test]
fn a_missing_file_is_named() {
    let o = shepherd()
        .args(["--config", "/nonexistent/shepherd.toml", "check-config"])
        .output()
        .unwrap();
    assert_rejected(&o, "/nonexistent/shepherd.toml");
}

#[test]
fn unknown_keys_are_errors() {
    assert_rejected(&check_config("[bmdb]\npool_sise = 3\n", &[]), "pool_sise");
    assert_rejected(&check_config("[bmbd]\nurl = \"x\"\n", &[]), "bmbd");
    assert_rejected(
        &check_config("", &[("SHEPHERD__BMDB__POOL_SISE", "3")]),
        "pool_sise",
    );
}

#[test]
fn ill_typed_keys_are_named() {
    assert_rejected(
        &check_config("[bmdb]\npool_size = \"many\"\n", &[]),
        "bmdb.pool_size",
    );
    assert_rejected(
        &check_config("", &[("SHEPHERD__BMDB__SESSION_INTERVAL", "soon")]),
        "bmdb.session_interval",
    );
    assert_rejected(
        &check_config("[bmdb]\nsession_interval = \"1500ms\"\n", &[]),
        "bmdb.session_interval",
    );
    assert_rejected(
        &check_config("[bmdb]\nisolation = \"snapshot\"\n", &[]),
        "bmdb.isolation",
    );
    assert_rejected(&check_config("[log]\nlevel = \"[[\"\n", &[]), "log.level");
    assert_rejected(
        &check_config("", &[("SHEPHERD__ADMIN__DATABASE_CONNECTIONS", "65")]),
        "admin.database_connections",
    );
    assert_rejected(
        &check_config("[bmdb]\nurl = \"nope://\"\n", &[]),
        "bmdb.url",
    );
    assert_rejected(
        &check_config("[equinix]\nper_page = 5000\n", &[]),
        "equinix.per_page",
    );
    assert_rejected(
        &check_config("[equinix]\napi_url = \"ftp://x\"\n", &[]),
        "equinix.api_url",
    );
    assert_rejected(
        &check_config("", &[("SHEPHERD__EQUINIX__API_INTERVAL", "often")]),
        "equinix.api_interval",
    );
    // The admin server beyond loopback needs a token.
    assert_rejected(
        &check_config("[admin]\nlisten = \"0.0.0.0:9090\"\n", &[]),
        "admin.token",
    );
    // Named tokens: a name the audit could not use, a short token, the
    // same token under two names, a missing secret.
    assert_rejected(
        &check_config(
            "[admin]\ntokens = { \"al ice\" = \"0123456789abcdef\" }\n",
            &[],
        ),
        "admin.tokens.al ice",
    );
    assert_rejected(
        &check_config("[admin]\ntokens = { cli = \"0123456789abcdef\" }\n", &[]),
        "admin.tokens.cli",
    );
    assert_rejected(
        &check_config("[admin]\ntokens = { bob = \"short\" }\n", &[]),
        "admin.tokens.bob",
    );
    assert_rejected(
        &check_config(
            "[admin]\ntokens = { alice = \"0123456789abcdef\", bob = \"0123456789abcdef\" }\n",
            &[],
        ),
        "admin.tokens.bob",
    );
    assert_rejected(
        &check_config(
            "[admin]\ntokens = { carol = { env = \"SHEPHERD_TEST_UNSET_VAR\" } }\n",
            &[],
        ),
        "admin.tokens.carol",
    );
    // Beyond loopback: HTTPS, and a token (named tokens are enough).
    assert_rejected(
        &check_config(
            "[admin]\nlisten = \"0.0.0.0:9090\"\ntokens = { alice = { env = \"ALICE_TOKEN\" } }\n",
            &[("ALICE_TOKEN", "alice-0123456789abcdef")],
        ),
        "admin.tls.enabled",
    );
    let o = check_config(
        "[admin]\nlisten = \"0.0.0.0:9090\"\ntokens = { alice = { env = \"ALICE_TOKEN\" } }\n\
         [admin.tls]\nenabled = true\n",
        &[("ALICE_TOKEN", "alice-0123456789abcdef")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains("alice-0123456789abcdef"));
}

#[test]
fn missing_secrets_are_named() {
    let o = check_config(
        "[bmdb]\npassword = { env = \"SHEPHERD_TEST_UNSET_VAR\" }\n",
        &[],
    );
    assert_rejected(&o, "bmdb.password");
    assert!(stderr(&o).contains("SHEPHERD_TEST_UNSET_VAR"));
    let o = check_config("[bmdb]\npassword = { file = \"/nonexistent/pw\" }\n", &[]);
    assert_rejected(&o, "bmdb.password");
    let o = check_config(
        "[equinix]\napi_key = { env = \"SHEPHERD_TEST_UNSET_VAR\" }\n",
        &[],
    );
    assert_rejected(&o, "equinix.api_key");
}

#[test]
fn secrets_are_never_printed() {
    // Valid: redacted in the effective configuration.
    let text = format!(
        "[bmdb]\nurl = \"postgres://bob:{SECRET}@127.0.0.1/bmdb\"\npassword = \"{SECRET}\"\n\
         [equinix]\napi_key = \"{SECRET}\"\n"
    );
    let o = check_config(&text, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains(SECRET), "{}", stdout(&o));
    assert!(stdout(&o).contains("<redacted>"));
    // From the environment, and from a file.
    let o = check_config("[bmdb]\npassword = { env = \"PW\" }\n", &[("PW", SECRET)]);
    assert!(o.status.success() && !stdout(&o).contains(SECRET));
    assert!(stdout(&o).contains("env = \"PW\""));
    let pw = config_file(SECRET);
    let o = check_config(
        &format!("[bmdb]\npassword = {{ file = {:?} }}\n", pw.path()),
        &[],
    );
    assert!(
        o.status.success() && !stdout(&o).contains(SECRET),
        "{}",
        stderr(&o)
    );
    // Invalid: the error names the key, not the value.
    assert_rejected(
        &check_config(&format!("[bmdb]\npassword = [\"{SECRET}\"]\n"), &[]),
        "bmdb.password",
    );
    assert_rejected(
        &check_config(&format!("[bmdb]\npassword = \"{SECRET}\n"), &[]),
        "line 2",
    );
    assert_rejected(
        &check_config("", &[("SHEPHERD__BMDB__PASSWORD__VALUE", SECRET)]),
        "bmdb.password",
    );
    assert_rejected(
        &check_config(&format!("[bmdb]\npool_size = \"{SECRET}\"\n"), &[]),
        "bmdb.pool_size",
    );
}

#[actix_rt::test]
async fn migrate_applies_then_reports_up_to_date() {
    let db = TestDb::new_unmigrated().await;
    let run = || {
        shepherd()
            .arg("migrate")
            .env("SHEPHERD__BMDB__URL", db.url())
            .output()
            .unwrap()
    };
    let first = run();
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        stdout(&first).contains("applied V1__bmdb"),
        "{}",
        stdout(&first)
    );
    assert!(stdout(&first).contains("applied V2__machine_summary"));
    let second = run();
    assert!(second.status.success(), "{}", stderr(&second));
    // The latest migration's version: one file per version.
    let latest = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .unwrap()
        .count();
    assert!(
        stdout(&second).contains(&format!("up to date (version {latest})")),
        "{}",
        stdout(&second)
    );
}

#[actix_rt::test]
async fn an_unreachable_database_is_a_clear_error() {
    let o = shepherd()
        .arg("migrate")
        .env(
            "SHEPHERD__BMDB__URL",
            "host=127.0.0.1 port=1 user=postgres dbname=nowhere",
        )
        .env("SHEPHERD__BMDB__CONNECT_TIMEOUT", "2s")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("cannot connect to PostgreSQL at 127.0.0.1:1"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn log_lines_carry_their_priority_when_stderr_is_the_journal() {
    use std::os::unix::fs::MetadataExt;
    // journald's stream as systemd announces it: JOURNAL_STREAM names the
    // device and inode of stderr. A file stands for the socket here.
    let run = |journal: bool| {
        let log = tempfile::NamedTempFile::new().unwrap();
        let meta = std::fs::metadata(log.path()).unwrap();
        let mut cmd = shepherd();
        cmd.arg("migrate")
            .env(
                "SHEPHERD__BMDB__URL",
                "host=127.0.0.1 port=1 user=postgres dbname=nowhere",
            )
            .env("SHEPHERD__BMDB__CONNECT_TIMEOUT", "2s")
            .stderr(log.reopen().unwrap());
        if journal {
            cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()));
        } else {
            // Another file's: not this stream.
            cmd.env(
                "JOURNAL_STREAM",
                format!("{}:{}", meta.dev(), meta.ino() + 1),
            );
        }
        assert_eq!(cmd.status().unwrap().code(), Some(1));
        std::fs::read_to_string(log.path()).unwrap()
    };
    let journal = run(true);
    let error = journal.lines().find(|l| l.contains(" ERROR ")).unwrap();
    assert!(error.starts_with("<3>"), "{journal}");
    let plain = run(false);
    assert!(!plain.contains("<3>"), "{plain}");
    assert!(plain.contains(" ERROR "), "{plain}");
}

#[actix_rt::test]
async fn run_holds_a_session_and_stops_cleanly_on_sigterm() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let dir = tempfile::tempdir().unwrap();
    let mut child = shepherd()
        .arg("run")
        .current_dir(dir.path())
        .env("SHEPHERD__BMDB__URL", db.url())
        .env("SHEPHERD__BMAAS__LISTEN", "127.0.0.1:0")
        .env("SHEPHERD__ADMIN__LISTEN", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sessions = async || {
        bmdb.transact(async |tx| {
            Ok(tx
                .query_one("SELECT count(*) FROM sessions", &[])
                .await?
                .get::<_, i64>(0))
        })
        .await
        .unwrap()
    };
    wait_while_running(
        &mut child,
        20,
        || "no session opened".into(),
        async || sessions().await == 1,
    )
    .await;
    sigterm(&child);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "shepherd run did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        sessions().await,
        0,
        "the session row was not deleted on an orderly stop"
    );
}

#[test]
fn check_config_warns_about_bad_inventory_file_entries_and_rejects_a_broken_file() {
    let dir = tempfile::tempdir().unwrap();
    let inv = dir.path().join("inventory.toml");
    std::fs::write(
        &inv,
        "[[machines]]\nid = \"ok\"\naddress = \"192.0.2.1\"\n\n[[machines]]\nid = \"bad\"\naddress = \"nowhere\"\n",
    )
    .unwrap();
    let text = format!("[provider.inventory]\nfile = \"{}\"\n", inv.display());
    let o = check_config(&text, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!(
            "warning: {}:5: host bad: address \"nowhere\" is not an IP address; skipped",
            inv.display()
        )),
        "{}",
        stderr(&o)
    );
    // A file that is not TOML at all: exit 2, naming the key and the line.
    std::fs::write(&inv, "[[machines]]\nid = \"ok\"\naddress = 192.0.2.1\n").unwrap();
    let o = check_config(&text, &[]);
    assert_rejected(&o, "provider.inventory.file");
    assert!(stderr(&o).contains("line 3"), "{}", stderr(&o));
}

#[test]
fn bmc_settings_are_checked_and_their_password_never_printed() {
    let host = |bmc: &str| {
        format!(
            "[provider.inventory]\nmachines = [{{ id = \"node-1\", address = \"192.0.2.1\", bmc = {{ {bmc} }} }}]\n"
        )
    };
    let key = "provider.inventory.machines[0].bmc";
    // Good: inline and env passwords, the three TLS settings.
    for bmc in [
        format!("url = \"https://10.0.0.5\", username = \"admin\", password = \"{SECRET}\""),
        "url = \"https://bmc.example:8443/\", username = \"admin\", password = { env = \"BMC_PW\" }, tls = \"insecure\", system = \"1\"".to_string(),
    ] {
        let o = check_config(&host(&bmc), &[("BMC_PW", SECRET)]);
        assert_eq!(o.status.code(), Some(0), "{bmc}: {}", stderr(&o));
        assert!(!stdout(&o).contains(SECRET), "{}", stdout(&o));
        assert!(stdout(&o).contains("bmc"), "{}", stdout(&o));
    }
    // Bad: each names its key.
    for (bmc, want) in [
        (
            "url = \"10.0.0.5\", username = \"admin\", password = \"x\"",
            format!("{key}.url"),
        ),
        (
            "url = \"https://10.0.0.5/redfish/v1\", username = \"admin\", password = \"x\"",
            format!("{key}.url"),
        ),
        (
            "url = \"https://10.0.0.5\", username = \"\", password = \"x\"",
            format!("{key}.username"),
        ),
        (
            "url = \"https://10.0.0.5\", username = \"admin\", password = { env = \"NO_SUCH_BMC_PW\" }",
            format!("{key}.password"),
        ),
        (
            "url = \"https://10.0.0.5\", username = \"admin\", password = \"x\", tls = { ca_file = \"/nonexistent/ca.pem\" }",
            format!("{key}.tls.ca_file"),
        ),
        (
            "url = \"https://10.0.0.5\", username = \"admin\", password = \"x\", tls = \"sometimes\"",
            "tls".to_string(),
        ),
        (
            "url = \"https://10.0.0.5\", username = \"admin\"",
            "password".to_string(),
        ),
    ] {
        let o = check_config(&host(bmc), &[]);
        assert_rejected(&o, &want);
    }
    // In an inventory file, a bad BMC skips that host with a warning.
    let dir = tempfile::tempdir().unwrap();
    let inv = dir.path().join("inventory.toml");
    std::fs::write(
        &inv,
        format!(
            "[[machines]]\nid = \"ok\"\naddress = \"192.0.2.1\"\nbmc = {{ url = \"https://10.0.0.5\", username = \"admin\", password = \"{SECRET}\" }}\n\n\
             [[machines]]\nid = \"bad\"\naddress = \"192.0.2.2\"\nbmc = {{ url = \"ftp://10.0.0.6\", username = \"admin\", password = \"{SECRET}\" }}\n"
        ),
    )
    .unwrap();
    let o = check_config(
        &format!("[provider.inventory]\nfile = \"{}\"\n", inv.display()),
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("host bad: bmc.url") && stderr(&o).contains("skipped"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains(SECRET), "{}", stderr(&o));
}

#[test]
fn ssh_key_prints_the_public_key_made_once_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("ssh/shepherd_ed25519");
    let run = || {
        shepherd()
            .arg("ssh-key")
            .env("SHEPHERD__SSH__KEY_FILE", &key)
            .output()
            .unwrap()
    };
    let first = run();
    assert!(first.status.success(), "{}", stderr(&first));
    let line = stdout(&first);
    assert!(line.starts_with("ssh-ed25519 "), "{line}");
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(stderr(&first).contains("generated a new SSH key"));
    // The private key is the owner's alone, and never printed.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let private = std::fs::read_to_string(&key).unwrap();
    assert!(private.contains("OPENSSH PRIVATE KEY"));
    assert!(!line.contains("PRIVATE"));
    // The same key the next time, and no word of a new one.
    let second = run();
    assert!(second.status.success());
    assert_eq!(stdout(&second), line);
    assert!(stderr(&second).is_empty(), "{}", stderr(&second));
    // The key is the one `shepherd run` would use: its public half matches.
    let id = shepherd::ssh::SshIdentity::load_or_generate(&key).unwrap();
    assert_eq!(line.trim(), id.public_key());
}

#[test]
fn ssh_key_names_the_key_file_it_cannot_write() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, "not a directory").unwrap();
    let out = shepherd()
        .arg("ssh-key")
        .env("SHEPHERD__SSH__KEY_FILE", blocker.join("key"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("ssh.key_file"), "{}", stderr(&out));
    assert!(stdout(&out).is_empty());
}

/// The packaged unit, with ExecStart at this build's binary.
fn unit_file(dir: &std::path::Path) -> std::path::PathBuf {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/shepherd.service"
    ))
    .unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/shepherd "));
    let path = dir.join("shepherd.service");
    std::fs::write(
        &path,
        unit.replace("/usr/bin/shepherd", env!("CARGO_BIN_EXE_shepherd")),
    )
    .unwrap();
    path
}

#[test]
fn the_systemd_unit_verifies_and_is_sandboxed() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("systemd-analyze is not installed; the unit is not checked here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_file(dir.path());
    // Every directive understood, the program there: no word at all.
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .unwrap();
    assert!(verify.status.success(), "{}", stderr(&verify));
    assert!(
        stderr(&verify).trim().is_empty() && stdout(&verify).trim().is_empty(),
        "{}{}",
        stdout(&verify),
        stderr(&verify)
    );
    // systemd's own rating of the sandbox: "OK" or better (0 is best, 10
    // is unprotected).
    let security = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&unit)
        .output()
        .unwrap();
    let text = stdout(&security) + &stderr(&security);
    let exposure: f64 = text
        .split("Overall exposure level for shepherd.service:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in: {text}"));
    assert!(exposure <= 2.0, "exposure {exposure}:\n{text}");
}

/// A shepherd started right after another ended, on the same embedded
/// BMDB: the server it finds running is shutting down with its owner, and
/// the new one starts its own instead of waiting for it in vain.
#[actix_rt::test]
async fn an_embedded_bmdb_shutting_down_with_its_owner_is_replaced_not_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("bmdb");
    let log = dir.path().join("run.log");
    let env = |c: &mut std::process::Command| {
        c.current_dir(dir.path())
            .env("SHEPHERD__BMDB__EMBEDDED__DATA_DIR", &data)
            .env("SHEPHERD__BMDB__EMBEDDED__START_TIMEOUT", "20s")
            .env("SHEPHERD__BMAAS__LISTEN", "127.0.0.1:0")
            .env("SHEPHERD__ADMIN__LISTEN", "127.0.0.1:0");
    };
    let mut run = shepherd();
    env(run.arg("run"));
    let mut child = run
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_while_running(
        &mut child,
        90,
        || {
            format!(
                "shepherd run never opened its session: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        },
        async || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("BMDB session")
        },
    )
    .await;
    sigterm(&child);
    assert!(child.wait().unwrap().success());
    // At once: its server is still shutting down.
    let started = std::time::Instant::now();
    let mut migrate = shepherd();
    env(migrate.arg("migrate"));
    let o = migrate.output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("up to date"), "{}", stdout(&o));
    println!(
        "the next shepherd had its BMDB after {:?}",
        started.elapsed()
    );
    // Its own server, started by it, ended with it.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while data.join("postmaster.pid").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the embedded server outlived its owner"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits up to `secs` for `ready`, `child` running all the while.
async fn wait_while_running(
    child: &mut std::process::Child,
    secs: u64,
    what: impl Fn() -> String,
    mut ready: impl AsyncFnMut() -> bool,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !ready().await {
        assert!(std::time::Instant::now() < deadline, "{}", what());
        assert!(
            child.try_wait().unwrap().is_none(),
            "shepherd run exited early"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn sigterm(child: &std::process::Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}
