//! IPMI BMCs (`ipmi://`, CONTRACTS.md §6) against VirtualBMC (PyPI
//! `virtualbmc`, the emulator Ironic's and Metal3's CI drive with
//! ipmitool) in front of a small libvirt domain under QEMU: power state,
//! on, off then on, the boot device (what VirtualBMC writes into the
//! domain), and a boot from the network as the inventory provider asks it.
//! The password is never on a command line or in an environment while
//! ipmitool runs, and never in an error.
//!
//! Needs root, libvirtd, qemu-system-x86, ipmitool and virtualbmc
//! (scripts/test installs them and starts libvirtd); skipped, saying so,
//! without them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use shepherd::bmc::BmcErrorKind;
use shepherd::config::{BmcConfig, BmcTls, BootMethod, Firmware, IpmiConfig, RedfishConfig};
use shepherd::ipmi::{self, Ipmis};
use shepherd::secret::Secret;
use shepherd_sim::testing::succeed;

/// At most 20 bytes, as IPMI 2.0 takes.
const PASSWORD: &str = "ipmi-test-Pw-7f3c9a";

fn usable() -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: the IPMI tests need root (libvirt, VirtualBMC)");
        return false;
    }
    for (what, cmd) in [
        ("ipmitool", "ipmitool -V"),
        ("vbmcd (PyPI virtualbmc)", "command -v vbmcd"),
        ("libvirtd", "virsh -q list"),
        ("qemu-system-x86_64", "command -v qemu-system-x86_64"),
    ] {
        let ok = Command::new("sh")
            .args(["-c", cmd])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !ok {
            eprintln!("SKIPPED: the IPMI tests need {what} (scripts/test installs it)");
            return false;
        }
    }
    true
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A libvirt domain with a VirtualBMC in front of it.
struct Rig {
    domain: String,
    vbmcd: Child,
    dir: tempfile::TempDir,
    port: u16,
}

impl Rig {
    fn start() -> Option<Rig> {
        if !usable() {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let domain = format!(
            "shepherd-ipmi-{}-{}",
            std::process::id(),
            rand::random::<u16>()
        );
        let xml = format!(
            "<domain type='qemu'><name>{domain}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
             <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>\
             <devices><serial type='file'><source path='{}'/><target port='0'/></serial></devices></domain>",
            dir.path().join("console.log").display()
        );
        let xml_path = dir.path().join("domain.xml");
        std::fs::write(&xml_path, xml).unwrap();
        succeed(Command::new("virsh").args(["-q", "define", xml_path.to_str().unwrap()]));
        // vbmcd with a configuration of this test's; the BMC's settings
        // written as a file (mode 0600), so its password is on no command
        // line here either.
        let port = free_udp_port();
        let control = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let conf = dir.path().join("virtualbmc.conf");
        let bmcs = dir.path().join("vbmc");
        std::fs::create_dir_all(bmcs.join(&domain)).unwrap();
        std::fs::write(
            &conf,
            format!(
                "[default]\nconfig_dir = {}\npid_file = {}\nserver_port = {control}\n[log]\nlogfile = {}\ndebug = true\n[ipmi]\nsession_timeout = 1\n",
                bmcs.display(),
                dir.path().join("vbmcd.pid").display(),
                dir.path().join("vbmcd.log").display()
            ),
        )
        .unwrap();
        let bmc_conf = bmcs.join(&domain).join("config");
        std::fs::write(
            &bmc_conf,
            format!(
                "[VirtualBMC]\nusername = admin\npassword = {PASSWORD}\naddress = 127.0.0.1\nport = {port}\n\
                 domain_name = {domain}\nlibvirt_uri = qemu:///system\nactive = True\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(
            &bmc_conf,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let vbmcd = Command::new("vbmcd")
            .arg("--foreground")
            .env("VIRTUALBMC_CONFIG", &conf)
            .stdout(std::fs::File::create(dir.path().join("vbmcd.out")).unwrap())
            .stderr(std::fs::File::create(dir.path().join("vbmcd.err")).unwrap())
            .spawn()
            .unwrap();
        let rig = Rig {
            domain,
            vbmcd,
            dir,
            port,
        };
        rig.wait_for_bmc();
        Some(rig)
    }

    fn bmc(&self, password: &str) -> BmcConfig {
        let mut b = BmcConfig {
            url: format!("ipmi://127.0.0.1:{}", self.port),
            username: "admin".into(),
            password: Secret::inline(password),
            system: None,
            tls: BmcTls::Verify,
            secure_boot: None,
            console: None,
        };
        b.validate().unwrap();
        b
    }

    /// ipmitool answers through the BMC (vbmcd starts it in a moment).
    fn wait_for_bmc(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = Command::new("ipmitool")
                .args([
                    "-I",
                    "lanplus",
                    "-H",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                ])
                .args([
                    "-U", "admin", "-E", "-R", "1", "-N", "1", "chassis", "power", "status",
                ])
                .env("IPMI_PASSWORD", PASSWORD)
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "VirtualBMC did not answer: {}",
                std::fs::read_to_string(self.dir.path().join("vbmcd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn state(&self) -> String {
        let o = Command::new("virsh")
            .args(["-q", "domstate", &self.domain])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// The boot device VirtualBMC wrote into the domain's (persistent)
    /// definition.
    fn boot_dev(&self) -> String {
        let o = Command::new("virsh")
            .args(["-q", "dumpxml", "--inactive", &self.domain])
            .output()
            .unwrap();
        let xml = String::from_utf8_lossy(&o.stdout).to_string();
        xml.split("<boot dev='")
            .nth(1)
            .and_then(|r| r.split('\'').next())
            .unwrap_or("")
            .to_string()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.vbmcd.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.vbmcd.wait();
        let _ = Command::new("virsh")
            .args(["-q", "destroy", &self.domain])
            .output();
        let _ = Command::new("virsh")
            .args(["-q", "undefine", &self.domain])
            .output();
    }
}

fn ipmis() -> Ipmis {
    Ipmis::new(&IpmiConfig::default())
}

#[actix_rt::test]
async fn power_and_the_boot_device_through_virtualbmc() {
    let Some(rig) = Rig::start() else { return };
    let ipmis = ipmis();
    let bmc = rig.bmc(PASSWORD);
    // Off, as defined. VirtualBMC speaks cipher suite 3 only: the client
    // asks 17 first, then 3, and keeps what worked.
    let facts = ipmis.ask("node-1", &bmc, ipmi::ReadFacts).await.unwrap();
    assert_eq!(facts.power_state.as_deref(), Some("Off"));
    // VirtualBMC has no FRU: no product facts, no error.
    assert_eq!(facts.serial_number, None);

    // PXE once (the EFI flag for a UEFI machine), then on.
    let set = ipmi::SetBootDevice {
        device: ipmi::BootDevice::Pxe,
        efi: true,
    };
    ipmis.ask("node-1", &bmc, set).await.unwrap();
    assert_eq!(rig.boot_dev(), "network");
    let restart = ipmi::Restart {
        power_timeout: Duration::from_secs(60),
    };
    let how = ipmis.ask("node-1", &bmc, restart).await.unwrap();
    assert_eq!(how, "power on");
    assert_eq!(rig.state(), "running");
    let facts = ipmis.ask("node-1", &bmc, ipmi::ReadFacts).await.unwrap();
    assert_eq!(facts.power_state.as_deref(), Some("On"));

    // Running: a restart is off, then on (VirtualBMC applies a boot device
    // only at a real power-on, and has no power cycle).
    let set = ipmi::SetBootDevice {
        device: ipmi::BootDevice::Disk,
        efi: false,
    };
    ipmis.ask("node-1", &bmc, set).await.unwrap();
    assert_eq!(rig.boot_dev(), "hd");
    let restart = ipmi::Restart {
        power_timeout: Duration::from_secs(60),
    };
    let how = ipmis.ask("node-1", &bmc, restart).await.unwrap();
    assert_eq!(how, "power off, then power on");
    assert_eq!(rig.state(), "running");
}

#[actix_rt::test]
async fn a_network_boot_through_an_ipmi_bmc_as_the_inventory_asks_it() {
    let Some(rig) = Rig::start() else { return };
    let bmcs =
        shepherd::provider::bmc::Bmcs::new(&RedfishConfig::default(), &IpmiConfig::default());
    let bmc = rig.bmc(PASSWORD);
    let how = bmcs
        .boot_agent(
            "rack2-u3",
            &bmc,
            BootMethod::Network,
            Firmware::Bios,
            "unused",
            None,
        )
        .await
        .unwrap();
    assert_eq!(how, "power on with boot device pxe once");
    assert_eq!(rig.boot_dev(), "network");
    assert_eq!(rig.state(), "running");
    // The agent called back: the boot device goes back to the disk.
    let ejected = bmcs
        .end_agent_boot("rack2-u3", &bmc, BootMethod::Network, Firmware::Bios)
        .await
        .unwrap();
    assert!(!ejected);
    assert_eq!(rig.boot_dev(), "hd");
    // Installed: restarted from the disk, off then on.
    let how = bmcs
        .boot_from_disk("rack2-u3", &bmc, BootMethod::Network, Firmware::Uefi, None)
        .await
        .unwrap();
    assert_eq!(how, "boot device disk, power off, then power on");
    let system = bmcs.system("rack2-u3", &bmc).await.unwrap();
    assert_eq!(system.power(), "On");
    // Virtual media is not IPMI's: refused, naming why.
    let e = bmcs
        .boot_agent(
            "rack2-u3",
            &bmc,
            BootMethod::VirtualMedia,
            Firmware::Uefi,
            "http://x/y.iso",
            None,
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("IPMI has no virtual media"), "{e}");
}

/// Every process's command line and environment, as `ps e` shows them.
fn every_process_text() -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let read = |f: &str| {
            std::fs::read(Path::new("/proc").join(pid.to_string()).join(f)).unwrap_or_default()
        };
        let mut text = read("cmdline");
        text.push(b' ');
        text.extend(read("environ"));
        out.push((pid, String::from_utf8_lossy(&text).replace('\0', " ")));
    }
    out
}

#[actix_rt::test]
async fn the_password_is_on_no_command_line_no_environment_and_in_no_error() {
    let Some(rig) = Rig::start() else { return };
    // A BMC that does not answer: ipmitool retries for seconds, while every
    // process is looked at.
    let dead_port = free_udp_port();
    let mut dead = rig.bmc(PASSWORD);
    dead.url = format!("ipmi://127.0.0.1:{dead_port}");
    let ipmis = std::rc::Rc::new(ipmis());
    let asked = {
        let ipmis = ipmis.clone();
        let dead = dead.clone();
        actix_rt::spawn(async move { ipmis.ask("node-9", &dead, ipmi::ReadFacts).await })
    };
    let started = Instant::now();
    let mut saw_ipmitool = false;
    while !asked.is_finished() && started.elapsed() < Duration::from_secs(30) {
        for (pid, text) in every_process_text() {
            if text.contains("ipmitool") && text.contains(&dead_port.to_string()) {
                saw_ipmitool = true;
                assert!(text.contains("-f /dev/stdin"), "{text}");
            }
            assert!(
                !text.contains(PASSWORD),
                "process {pid} shows the password: {text}"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(saw_ipmitool, "ipmitool was never seen running");
    let e = asked.await.unwrap().unwrap_err();
    assert!(
        matches!(
            e.kind,
            BmcErrorKind::Unreachable(_) | BmcErrorKind::Credentials(_)
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains(&format!("ipmi://127.0.0.1:{dead_port}")),
        "{e}"
    );
    assert!(!e.to_string().contains(PASSWORD), "{e}");

    // A wrong password: refused quickly, said so, not echoed.
    let wrong = rig.bmc("not-the-password-1");
    let t = Instant::now();
    let e = ipmis
        .ask("node-1", &wrong, ipmi::ReadFacts)
        .await
        .unwrap_err();
    assert!(matches!(e.kind, BmcErrorKind::Credentials(_)), "{e}");
    assert!(!e.to_string().contains("not-the-password-1"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    let _: PathBuf = rig.dir.path().to_path_buf();
}
