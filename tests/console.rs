//! Serial consoles read through BMCs, against real implementations:
//!
//! - IPMI Serial-over-LAN from OpenIPMI's `ipmi_sim` (VirtualBMC has no
//!   SOL), whose SOL is a QEMU guest's serial port and whose chassis power
//!   starts that guest: SeaBIOS, no disk, so it prints its banner and says
//!   it has no bootable device. The password is on no command line and in
//!   no environment while ipmitool reads the console.
//! - Leaving a SOL console types nothing on the machine (its serial line,
//!   this test's, receives a half-typed line and nothing after it), the
//!   payload is free for the next viewer at once, and a viewer hears
//!   within seconds that the BMC was killed, and again when it is back.
//! - A BMC's SSH console: an OpenSSH server whose forced command attaches
//!   to a guest's serial port (as iDRAC's `console com2` does), read by
//!   `shepherd run` during a boot it makes through a Redfish BMC
//!   (sushy-tools): the boot fails (no agent calls back), and its cause,
//!   the machine page and the API show what the guest printed.
//!
//! Needs ipmi_sim, ipmitool, QEMU, sshd and socat (scripts/test installs
//! them).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shepherd::bmdb::Bmdb;
use shepherd::config::{BmcConfig, BmcTls, ConsoleSettings, IpmiConfig};
use shepherd::console::{ConsoleSource, Consoles, ToViewer};
use shepherd::secret::Secret;
use shepherd_sim::testing::{
    IPMI_SIM_PASSWORD, IPMI_SIM_USER, IpmiSim, ShepherdProcess, Sshd, Sushy, TestDb,
    ipmi_sim_usable,
};
use tokio::sync::mpsc;
use uuid::Uuid;

const SHEPHERD: &str = env!("CARGO_BIN_EXE_shepherd");

/// What SeaBIOS prints when nothing boots.
const NO_BOOT: &str = "No bootable device";

fn every_process_text() -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        for f in ["cmdline", "environ"] {
            if let Ok(b) = std::fs::read(e.path().join(f)) {
                out.push((pid, String::from_utf8_lossy(&b).replace('\0', " ")));
            }
        }
    }
    out
}

async fn settings() -> ConsoleSettings {
    ConsoleSettings {
        write_every: Duration::from_millis(300),
        reopen_after: Duration::from_secs(1),
        ..ConsoleSettings::default()
    }
}

/// ipmi_sim's BMC, as an inventory host names it.
fn sol_bmc(sim: &IpmiSim) -> BmcConfig {
    BmcConfig {
        url: sim.url(),
        username: IPMI_SIM_USER.into(),
        password: Secret::inline(IPMI_SIM_PASSWORD),
        system: None,
        tls: BmcTls::Verify,
        secure_boot: None,
        console: None,
    }
}

async fn captures(bmdb: &Bmdb, machine: Uuid) -> Vec<shepherd::bmdb::console::ConsoleCapture> {
    bmdb.transact(async |tx| shepherd::bmdb::console::latest(tx, machine, 10).await)
        .await
        .unwrap()
}

#[actix_rt::test]
async fn sol_reads_what_a_guest_prints_through_ipmi_sim() {
    ipmi_sim_usable().expect("the console tests' tools");
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let machine = shepherd_sim::testing::machine(&bmdb, None).await;
    let sim = IpmiSim::start();
    let bmc = sol_bmc(&sim);
    // An ipmi:// BMC's console is its SOL unless it says otherwise.
    let source = ConsoleSource::of(&bmc).expect("SOL by default");
    assert!(source.describe().starts_with("sol ipmi://127.0.0.1:"));
    let consoles = Consoles::new(settings().await, IpmiConfig::default(), bmdb.clone());
    let capture = consoles
        .capture(machine, &source, "enroll")
        .await
        .expect("the capture is recorded");

    // The guest is powered on after the console is read, as a boot is.
    sim.power_on();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut password_seen = Vec::new();
    loop {
        for (pid, text) in every_process_text() {
            if text.contains(IPMI_SIM_PASSWORD) && !text.contains("IPMI_PASSWORD=") {
                password_seen.push((pid, text));
            }
        }
        let lines = capture.last_lines(20).await;
        if lines.iter().any(|l| l.contains(NO_BOOT)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the guest's console over SOL: {lines:?}; ipmi_sim: {}",
            sim.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // ipmitool reads its password from a pipe: no process shows it (but
    // ipmi_sim's own config, which is the BMC's, and this test's ipmitool
    // calls, which pass it in their environment, IPMI_PASSWORD).
    let ipmitools: Vec<_> = password_seen
        .iter()
        .filter(|(_, t)| t.contains("ipmitool") && t.contains("sol"))
        .collect();
    assert!(ipmitools.is_empty(), "{ipmitools:?}");

    let lines = capture.end().await;
    assert!(lines.iter().any(|l| l.contains(NO_BOOT)), "{lines:?}");
    let kept = captures(&bmdb, machine).await;
    assert_eq!(kept.len(), 1);
    let c = &kept[0];
    assert_eq!(c.cause, "enroll");
    assert!(c.ended_at.is_some());
    assert!(c.error.is_none(), "{:?}", c.error);
    let text = shepherd::console::text(&c.tail);
    println!(
        "the guest printed, over SOL ({} bytes):\n{text}",
        c.bytes_seen
    );
    assert!(text.contains("SeaBIOS"), "{text}");
    assert!(text.contains(NO_BOOT), "{text}");
    assert!(!text.contains("SOL Session operational"), "{text}");
    assert!(c.bytes_seen as usize >= c.tail.len());

    // A second capture: the SOL payload was given back (ipmitool's input
    // closed, so it deactivated it), so it is activated again at once; the
    // oldest captures beyond `kept` go.
    let again = consoles.capture(machine, &source, "inspect").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    again.end().await;
    let kept = captures(&bmdb, machine).await;
    assert_eq!(kept.len(), 2);
    assert_eq!(kept[0].cause, "inspect");
    assert!(
        kept[0].error.is_none(),
        "the payload was free again: {:?}",
        kept[0].error
    );
}

/// The machine's end of the serial line ipmi_sim serves over SOL (it
/// connects to it, and again after a restart): what reached the machine,
/// and what it prints.
struct SerialLine {
    got: Arc<Mutex<Vec<u8>>>,
    to_machine: Arc<Mutex<Option<std::net::TcpStream>>>,
}

impl SerialLine {
    fn listen(port: u16) -> SerialLine {
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let line = SerialLine {
            got: Arc::default(),
            to_machine: Arc::default(),
        };
        let (got, to) = (line.got.clone(), line.to_machine.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                *to.lock().unwrap() = Some(conn.try_clone().unwrap());
                let got = got.clone();
                std::thread::spawn(move || {
                    use std::io::Read as _;
                    let mut conn = conn;
                    let mut buf = [0u8; 1024];
                    while let Ok(n @ 1..) = conn.read(&mut buf) {
                        got.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                });
            }
        });
        line
    }

    fn connected(&self) -> bool {
        self.to_machine.lock().unwrap().is_some()
    }

    /// The machine prints `text` on its console.
    fn print(&self, text: &str) {
        use std::io::Write as _;
        if let Some(c) = self.to_machine.lock().unwrap().as_mut() {
            let _ = c.write_all(text.as_bytes());
        }
    }

    fn received(&self) -> String {
        String::from_utf8_lossy(&self.got.lock().unwrap()).into_owned()
    }
}

/// What a viewer was sent, until `done` holds of it (the machine printing
/// `print` every half second meanwhile) or `within` passes; how long it
/// took.
async fn viewer_until(
    rx: &mut mpsc::Receiver<ToViewer>,
    seen: &mut Vec<ToViewer>,
    line: &SerialLine,
    print: Option<&str>,
    within: Duration,
    done: impl Fn(&[ToViewer]) -> bool,
) -> Duration {
    let start = Instant::now();
    while !done(seen) {
        assert!(start.elapsed() < within, "the viewer was sent {seen:?}");
        if let Some(p) = print {
            line.print(p);
        }
        if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {
            seen.push(m);
        }
    }
    start.elapsed()
}

fn printed(seen: &[ToViewer], text: &str) -> bool {
    let all: Vec<u8> = seen
        .iter()
        .filter_map(|m| match m {
            ToViewer::Printed(b) => Some(b.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    String::from_utf8_lossy(&all).contains(text)
}

#[actix_rt::test]
async fn leaving_types_nothing_and_viewers_hear_when_the_bmc_goes_and_comes_back() {
    ipmi_sim_usable().expect("the console tests' tools");
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let machine = shepherd_sim::testing::machine(&bmdb, None).await;
    let mut sim = IpmiSim::start();
    let line = SerialLine::listen(sim.serial_port);
    let bmc = sol_bmc(&sim);
    let source = ConsoleSource::of(&bmc).unwrap();
    let consoles = Consoles::new(settings().await, IpmiConfig::default(), bmdb.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while !line.connected() {
        assert!(
            Instant::now() < deadline,
            "ipmi_sim reached the serial line"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Bob types half a line, then leaves (Ctrl-] on shepherd's SSH).
    let (tx, mut rx) = mpsc::channel(256);
    let (link, attached) = consoles
        .attach(machine, &source, Uuid::new_v4(), "bob", tx)
        .await
        .unwrap();
    assert!(attached.keyboard.is_theirs());
    let mut seen = Vec::new();
    let within = Duration::from_secs(30);
    viewer_until(&mut rx, &mut seen, &line, Some("login: "), within, |s| {
        printed(s, "login: ")
    })
    .await;
    link.type_keys(b"bob-unfinished-rm -rf /tmp/x".to_vec());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !line.received().contains("bob-unfinished-rm -rf /tmp/x") {
        assert!(
            Instant::now() < deadline,
            "the keys reached the machine: {:?}",
            line.received()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(link);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = line.received();
    let after = got.split("bob-unfinished-rm -rf /tmp/x").nth(1).unwrap();
    assert_eq!(after, "", "leaving typed on the machine: {got:?}");

    // Alice comes next: the payload was given back, so her console opens
    // at once; then the BMC dies, and comes back five seconds later.
    let (tx, mut rx) = mpsc::channel(256);
    let (_link, _) = consoles
        .attach(machine, &source, Uuid::new_v4(), "alice", tx)
        .await
        .unwrap();
    let mut seen = Vec::new();
    let opened = viewer_until(&mut rx, &mut seen, &line, Some("alice? "), within, |s| {
        printed(s, "alice? ")
    })
    .await;
    assert!(
        !seen.iter().any(|m| matches!(m, ToViewer::Interrupted(_))),
        "the payload was free: {seen:?}"
    );
    sim.kill();
    let told = viewer_until(&mut rx, &mut seen, &line, None, within, |s| {
        s.iter().any(|m| matches!(m, ToViewer::Interrupted(_)))
    })
    .await;
    let why = seen.iter().find_map(|m| match m {
        ToViewer::Interrupted(w) => Some(w.clone()),
        _ => None,
    });
    let why = why.unwrap();
    assert!(why.contains("stopped answering"), "{why}");
    assert!(!why.contains(IPMI_SIM_PASSWORD), "{why}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    sim.restart();
    let back = viewer_until(&mut rx, &mut seen, &line, Some("back? "), within * 2, |s| {
        s.contains(&ToViewer::Resumed) && printed(s, "back? ")
    })
    .await;
    println!(
        "SOL through ipmi_sim: opened in {:.1} s; the BMC killed, viewers told in {:.1} s ({why}); \
         restarted after 5 s, the console back {:.1} s after the BMC answered",
        opened.as_secs_f64(),
        told.as_secs_f64(),
        back.as_secs_f64(),
    );
}

/// A QEMU guest (SeaBIOS, no disk, no NIC) whose serial port listens on
/// `port` and waits for its first client before it runs.
fn guest(port: u16, dir: &Path) -> Child {
    Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-m", "64", "-nic", "none", "-nographic"])
        .arg("-chardev")
        .arg(format!(
            "socket,id=s0,host=127.0.0.1,port={port},server=on,wait=on"
        ))
        .args(["-serial", "chardev:s0", "-monitor", "none", "-no-reboot"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("qemu.log")).unwrap())
        .stderr(std::fs::File::create(dir.join("qemu.err")).unwrap())
        .spawn()
        .expect("qemu-system-x86_64")
}

#[actix_rt::test]
async fn a_failed_boot_shows_what_its_console_printed_over_the_bmc_s_ssh() {
    ipmi_sim_usable().expect("the console tests' tools");
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let dir = tempfile::tempdir().unwrap();

    // The guest, and the BMC's SSH whose console command attaches to it.
    let serial = Sshd::free_port();
    let mut qemu = guest(serial, dir.path());
    let key_file = dir.path().join("console_ed25519");
    let key = shepherd::ssh::SshIdentity::load_or_generate(&key_file).unwrap();
    let forced = format!(
        "command=\"socat - TCP:127.0.0.1:{serial}\",no-pty {}",
        key.public_key()
    );
    let sshd = Sshd::start(
        format!("127.0.0.1:{}", Sshd::free_port()).parse().unwrap(),
        &[&forced],
    );
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .unwrap()
        .unwrap()
        .name;

    // shepherd, booting the host through its Redfish BMC (sushy-tools).
    const PASSWORD: &str = "bmc-pw-c0n501e";
    let sushy = Sushy::start(&["rack1-u1"], "admin", PASSWORD);
    let images = dir.path().join("images");
    std::fs::create_dir(&images).unwrap();
    let (boot_image, _) = shepherd_sim::testing::boot_image_stand_in(dir.path());
    let config = format!(
        "[provider]\nkind = \"static\"\n\n[[provider.inventory.machines]]\nid = \"rack1-u1\"\n\
         boot = \"virtual-media\"\n\
         bmc = {{ url = \"{url}\", username = \"admin\", password = \"{PASSWORD}\", system = \"{system}\", \
         console = {{ via = \"ssh\", address = \"{addr}\", username = \"{user}\", command = \"console com2\", \
         key_file = \"{key}\", host_key = \"{host_key}\" }} }}\n",
        url = sushy.url,
        system = Sushy::uuid(0),
        addr = sshd.addr,
        key = key_file.display(),
        host_key = sshd.host_key.trim(),
    );
    let path = dir.path().join("shepherd.toml");
    std::fs::write(&path, config).unwrap();
    let admin = format!("127.0.0.1:{}", Sshd::free_port());
    let callback = format!("127.0.0.1:{}", Sshd::free_port());
    let env: Vec<(&str, String)> = vec![
        ("SHEPHERD__BMDB__URL", db.url()),
        ("SHEPHERD__ADMIN__LISTEN", admin.clone()),
        ("SHEPHERD__BMAAS__LISTEN", callback.clone()),
        ("SHEPHERD__BMAAS__ENDPOINT", callback),
        ("SHEPHERD__PROVISIONER__INTERVAL", "1s".into()),
        (
            "SHEPHERD__INSTALLATIONS__IMAGES_DIR",
            images.display().to_string(),
        ),
        (
            "SHEPHERD__INSTALLATIONS__IMAGES_LISTEN",
            format!("127.0.0.1:{}", Sshd::free_port()),
        ),
        (
            "SHEPHERD__INSTALLATIONS__BOOT_IMAGE",
            boot_image.display().to_string(),
        ),
        // Long enough for SeaBIOS under TCG to give up on booting.
        ("SHEPHERD__ENROLLER__CALLBACK_TIMEOUT", "25s".into()),
        ("SHEPHERD__ENROLLER__BACKOFF_INITIAL", "1h".into()),
        ("SHEPHERD__ENROLLER__BACKOFF_MAX", "2h".into()),
        ("SHEPHERD__CONSOLE__WRITE_EVERY", "500ms".into()),
        (
            "SHEPHERD__SSH__KEY_FILE",
            dir.path().join("id_ed25519").display().to_string(),
        ),
        ("SHEPHERD__LOG__LEVEL", "info,tokio_postgres=warn".into()),
    ];
    let mut shepherd = ShepherdProcess::start(
        Path::new(SHEPHERD),
        &path,
        dir.path().join("shepherd.log"),
        &env,
    );

    // The boot fails: no agent calls back. Its cause quotes the console.
    let deadline = Instant::now() + Duration::from_secs(180);
    let (machine, cause) = loop {
        let row = bmdb
            .transact(async |tx| {
                Ok(tx
                    .query_opt(
                        "SELECT b.machine_id, b.cause FROM work_backoff b \
                           JOIN machine_provided p ON p.machine_id = b.machine_id \
                          WHERE p.provider_id = 'rack1-u1'",
                        &[],
                    )
                    .await?
                    .map(|r| (r.get::<_, Uuid>(0), r.get::<_, String>(1))))
            })
            .await
            .unwrap();
        if let Some(r) = row {
            break r;
        }
        shepherd.assert_running();
        assert!(Instant::now() < deadline, "{}", shepherd.log_tail());
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    println!("the boot's failure: {cause}");
    assert!(cause.contains("did not call back"), "{cause}");
    assert!(
        cause.contains("its console's last lines:") && cause.contains(NO_BOOT),
        "{cause}"
    );

    // The machine page shows it next to the failure, and so does the API.
    let page = shepherd_sim::testing::page(&format!("http://{admin}/machines/{machine}")).await;
    let console = page
        .split("<section id=\"console\">")
        .nth(1)
        .unwrap_or_else(|| panic!("a console section: {page}"));
    let console = console.split("</section>").next().unwrap();
    assert!(console.contains(NO_BOOT), "{console}");
    assert!(console.contains("SeaBIOS"), "{console}");
    assert!(console.contains("ssh "), "{console}");
    let api: serde_json::Value = awc::Client::default()
        .get(format!("http://{admin}/api/v1/machines/{machine}"))
        .send()
        .await
        .unwrap()
        .json()
        .limit(4 << 20)
        .await
        .unwrap();
    let c = &api["console"][0];
    assert_eq!(c["cause"], "enroll", "{c}");
    assert!(c["ended_at"].is_string(), "{c}");
    assert!(
        c["last_lines"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().contains(NO_BOOT)),
        "{c}"
    );
    // SHEPHERD_SCREENSHOTS=DIR: the fleet and the machine page as a
    // browser shows them, for people.
    if let Some(dir) = std::env::var_os("SHEPHERD_SCREENSHOTS") {
        for (url, png) in [
            (format!("http://{admin}/"), "fleet.png"),
            (format!("http://{admin}/machines/{machine}"), "machine.png"),
        ] {
            shepherd_sim::testing::screenshot(&url, &Path::new(&dir).join(png), 1280, 1800);
        }
    }
    // No key or password in what shepherd shows or logs.
    let log = std::fs::read_to_string(dir.path().join("shepherd.log")).unwrap();
    for text in [&log, &page.to_string(), &api.to_string()] {
        assert!(!text.contains(PASSWORD));
        assert!(!text.contains("PRIVATE KEY"));
    }
    drop(shepherd);
    let _ = qemu.kill();
    let _ = qemu.wait();
}
