//! OpenIPMI's BMC emulator `ipmi_sim` (Debian's `openipmi`) as a process,
//! serving IPMI over LAN on a loopback UDP port with Serial-over-LAN: its
//! SOL is a QEMU guest's serial port (QEMU listens, ipmi_sim connects).
//! Chassis power starts and stops the guest (`chassis_control`), a QEMU
//! under TCG with SeaBIOS, no disk and no NIC: it prints its banner, tries
//! to boot, and says it has no bootable device, as a machine whose boot
//! failed does. VirtualBMC has no SOL; this is the emulator that does.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// At most 20 bytes, as IPMI 2.0 takes.
pub const IPMI_SIM_PASSWORD: &str = "sol-test-Pw-42c9d1";
pub const IPMI_SIM_USER: &str = "admin";

pub struct IpmiSim {
    /// The BMC's UDP port on 127.0.0.1.
    pub port: u16,
    /// The guest's serial port (QEMU listens on it) on 127.0.0.1.
    pub serial_port: u16,
    dir: tempfile::TempDir,
    child: Child,
}

/// Whether ipmi_sim, ipmitool and QEMU are here (scripts/test installs
/// them); says why not.
pub fn ipmi_sim_usable() -> Result<(), String> {
    for (what, cmd) in [
        ("ipmi_sim (Debian's openipmi)", "command -v ipmi_sim"),
        ("ipmitool", "command -v ipmitool"),
        ("qemu-system-x86_64", "command -v qemu-system-x86_64"),
    ] {
        let ok = Command::new("sh")
            .args(["-c", cmd])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !ok {
            return Err(format!(
                "{what} is not installed (scripts/test installs it)"
            ));
        }
    }
    Ok(())
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl IpmiSim {
    /// Starts ipmi_sim with its guest powered off.
    pub fn start() -> IpmiSim {
        let dir = tempfile::Builder::new()
            .prefix("shepherd-ipmi-sim-")
            .tempdir()
            .unwrap();
        let port = free_udp_port();
        let serial_port = super::Sshd::free_port();
        let d = dir.path();
        // chassis_control: "get power" prints power:0|1; "set power 1"
        // starts the guest (its serial waits for ipmi_sim to connect, so
        // nothing it prints is lost), "set power 0" stops it.
        let chassis = d.join("chassis.sh");
        std::fs::write(
            &chassis,
            format!(
                "#!/bin/sh\n\
                 D={d}\n\
                 mc=$1; op=$2; shift 2\n\
                 running() {{ [ -f $D/qemu.pid ] && kill -0 $(cat $D/qemu.pid) 2>/dev/null; }}\n\
                 case $op in\n\
                 get) for p in \"$@\"; do case $p in\n\
                   power) if running; then echo power:1; else echo power:0; fi;;\n\
                   boot) echo boot:default;;\n\
                   *) echo \"Invalid parameter: $p\"; exit 1;; esac; done;;\n\
                 set) while [ $# -gt 0 ]; do p=$1; v=$2; shift 2; case $p in\n\
                   power) if [ \"$v\" = 1 ]; then running || {{ \
                     setsid qemu-system-x86_64 -accel tcg -m 64 -nic none -nographic \
                     -chardev socket,id=s0,host=127.0.0.1,port={serial_port},server=on,wait=on \
                     -serial chardev:s0 -monitor none -no-reboot \
                     </dev/null >$D/qemu.log 2>&1 & echo $! > $D/qemu.pid; }}; \
                     else running && kill $(cat $D/qemu.pid); rm -f $D/qemu.pid; fi;;\n\
                   reset|boot|shutdown) ;;\n\
                   identify) shift;;\n\
                   *) echo \"Invalid parameter: $p\"; exit 1;; esac; done;;\n\
                 check) exit 1;;\n\
                 *) echo \"Unknown operation: $op\"; exit 1;;\n\
                 esac\n\
                 exit 0\n",
                d = d.display(),
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&chassis, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(
            d.join("lan.conf"),
            format!(
                "name \"shepherd-sol\"\n\
                 set_working_mc 0x20\n\
                 startlan 1\n\
                   addr 127.0.0.1 {port}\n\
                   priv_limit admin\n\
                   allowed_auths_callback none md2 md5 straight\n\
                   allowed_auths_user none md2 md5 straight\n\
                   allowed_auths_operator none md2 md5 straight\n\
                   allowed_auths_admin none md2 md5 straight\n\
                   guid a123456789abcdefa123456789abcdef\n\
                 endlan\n\
                 user 2 true \"{IPMI_SIM_USER}\" \"{IPMI_SIM_PASSWORD}\" admin 10 none md2 md5 straight\n\
                 sol \"tcp:127.0.0.1:{serial_port}\" 115200\n\
                 chassis_control \"{} 0x20\"\n",
                chassis.display()
            ),
        )
        .unwrap();
        std::fs::write(
            d.join("sim.emu"),
            "mc_setbmc 0x20\n\
             mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02\n\
             sel_enable 0x20 50 0x0a\n\
             mc_enable 0x20\n",
        )
        .unwrap();
        std::fs::create_dir_all(d.join("state")).unwrap();
        let child = Self::spawn(d);
        let sim = IpmiSim {
            port,
            serial_port,
            dir,
            child,
        };
        sim.wait_until_it_answers();
        sim
    }

    /// ipmi_sim on the configuration in `d`.
    fn spawn(d: &Path) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("ipmi_sim.log"))
            .unwrap();
        let mut cmd = Command::new("ipmi_sim");
        cmd.arg("-c")
            .arg(d.join("lan.conf"))
            .arg("-f")
            .arg(d.join("sim.emu"))
            .arg("-s")
            .arg(d.join("state"))
            .args(["-n", "-p"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                    .map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        cmd.spawn().expect("starting ipmi_sim")
    }

    /// Kills the BMC (SIGKILL: it answers nothing more, frees nothing).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the BMC again on the same port and configuration, once it
    /// answers.
    pub fn restart(&mut self) {
        self.kill();
        self.child = Self::spawn(self.dir.path());
        self.wait_until_it_answers();
    }

    /// The BMC's URL, as an inventory host names it.
    pub fn url(&self) -> String {
        format!("ipmi://127.0.0.1:{}", self.port)
    }

    /// ipmitool against it (suite 3: ipmi_sim has no SHA-256 suites).
    pub fn ipmitool(&self, args: &[&str]) -> std::process::Output {
        Command::new("ipmitool")
            .args(["-I", "lanplus", "-H", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .args(["-U", IPMI_SIM_USER, "-C", "3", "-E"])
            .env("IPMI_PASSWORD", IPMI_SIM_PASSWORD)
            .args(args)
            .output()
            .unwrap()
    }

    fn wait_until_it_answers(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = self.ipmitool(&["chassis", "power", "status"]);
            if out.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "ipmi_sim did not answer: {} {}",
                String::from_utf8_lossy(&out.stderr),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Powers the guest on, as a BMC does (it then waits for ipmi_sim to
    /// reach its serial port before it runs: up to ten seconds).
    pub fn power_on(&self) {
        let out = self.ipmitool(&["chassis", "power", "on"]);
        assert!(
            out.status.success(),
            "power on: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// What ipmi_sim logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ipmi_sim.log")).unwrap_or_default()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn qemu_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.dir.path().join("qemu.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for IpmiSim {
    fn drop(&mut self) {
        if let Some(pid) = self.qemu_pid() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
