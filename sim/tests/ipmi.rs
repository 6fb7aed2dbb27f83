//! The rack's simulated IPMI BMC driven by its real client, Debian's
//! `ipmitool -I lanplus`, as shepherd runs it: a session in cipher suite
//! 17 and in 3, the power read and switched, a one-time PXE boot taken
//! by the next power on, the FRU's product area read, and a wrong
//! password refused.

use std::net::IpAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shepherd_sim::bmc::BootFrom;
use shepherd_sim::bmc::ipmi::IpmiSim;

const BMC: &str = "127.0.67.1";

/// One ipmitool command, as shepherd runs it (the password on stdin);
/// whether it succeeded, and what it printed.
async fn ipmitool(sim: &IpmiSim, suite: u8, password: &str, args: &[&str]) -> (bool, String) {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new("ipmitool")
        .args(["-I", "lanplus", "-H", BMC, "-p", &sim.port.to_string()])
        .args(["-U", &sim.user, "-C", &suite.to_string()])
        .args(["-R", "2", "-N", "1", "-f", "/dev/stdin"])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("ipmitool runs (Debian's ipmitool package)");
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(format!("{password}\n").as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[actix_rt::test]
async fn ipmitool_switches_the_power_sets_a_pxe_boot_and_reads_the_fru() {
    if Command::new("ipmitool").arg("-V").output().is_err() {
        eprintln!("SKIPPED: no ipmitool (scripts/test installs it)");
        return;
    }
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let ip: IpAddr = BMC.parse().unwrap();
    let ons = Arc::new(Mutex::new(Vec::new()));
    let offs = Arc::new(Mutex::new(0));
    let (on_seen, off_seen) = (ons.clone(), offs.clone());
    let sim = IpmiSim::start(
        &[ip],
        port,
        Duration::from_millis(50),
        Duration::from_millis(300),
        Arc::new(move |ip, from| on_seen.lock().unwrap().push((ip, from))),
        Arc::new(move |_| *off_seen.lock().unwrap() += 1),
    )
    .unwrap();
    assert_eq!(sim.url(ip), format!("ipmi://{BMC}:{port}"));
    let pw = sim.password.clone();
    let run = |suite: u8, password: String, args: &'static [&'static str]| {
        let sim = &sim;
        async move { ipmitool(sim, suite, &password, args).await }
    };

    for suite in [17, 3] {
        let (ok, out) = run(suite, pw.clone(), &["chassis", "power", "status"]).await;
        assert!(ok, "suite {suite}: {out}");
        assert!(out.contains("Chassis Power is off"), "suite {suite}: {out}");
    }
    let (ok, out) = run(
        17,
        pw.clone(),
        &["chassis", "bootdev", "pxe", "options=efiboot"],
    )
    .await;
    assert!(ok, "{out}");
    let (ok, out) = run(17, pw.clone(), &["chassis", "power", "on"]).await;
    assert!(ok, "{out}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (ok, out) = run(3, pw.clone(), &["chassis", "power", "status"]).await;
    assert!(ok && out.contains("Chassis Power is on"), "{out}");
    assert_eq!(*ons.lock().unwrap(), vec![(ip, BootFrom::Network)]);

    // The PXE boot was once: a power cycle boots the disk.
    let (ok, out) = run(17, pw.clone(), &["chassis", "power", "cycle"]).await;
    assert!(ok, "{out}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(*offs.lock().unwrap(), 1);
    assert_eq!(
        *ons.lock().unwrap(),
        vec![(ip, BootFrom::Network), (ip, BootFrom::Disk)]
    );

    let (ok, out) = run(17, pw.clone(), &["fru", "print", "0"]).await;
    assert!(ok, "{out}");
    assert!(out.contains("Shepherd Simulated Metal"), "{out}");
    assert!(out.contains(&format!("SIM-{BMC}")), "{out}");

    let (ok, out) = run(17, pw.clone(), &["chassis", "power", "off"]).await;
    assert!(ok, "{out}");
    assert_eq!(*offs.lock().unwrap(), 2);

    // A wrong password sets up no session, in either suite.
    for suite in [17, 3] {
        let (ok, out) = run(
            suite,
            "not-the-password".into(),
            &["chassis", "power", "status"],
        )
        .await;
        assert!(!ok, "suite {suite}: {out}");
    }
}
