//! A real switch for tests (root only): Open vSwitch in user space
//! (`datapath_type=netdev`, no kernel module) in a network namespace of
//! its own, managed over SSH by an sshd in that namespace, as a switch's
//! management plane is. Machines' NICs are namespaces of their own joined
//! to the switch's ports by veth pairs, so isolation is shown by traffic.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::netns::Netns;
use super::processes::succeed;

/// Whether Open vSwitch's programs are installed.
pub fn ovs_usable() -> bool {
    Path::new("/usr/sbin/ovs-vswitchd").exists() && Path::new("/usr/bin/ovs-vsctl").exists()
}

/// An OVS switch: its namespace, its OVSDB, its sshd.
pub struct OvsSwitch {
    pub name: String,
    pub ns: Netns,
    /// Its OVSDB's socket (`ovs-vsctl --db=unix:…`).
    pub db: PathBuf,
    pub bridge: String,
    /// Where shepherd reaches its sshd (a loopback port forwarded into
    /// the namespace).
    pub ssh: SocketAddr,
    /// The key shepherd logs in with (OpenSSH private key text), and the
    /// switch's host key (public).
    pub client_key: String,
    pub host_key: String,
    dir: tempfile::TempDir,
    sshd: Option<Child>,
    next_port: std::cell::Cell<u32>,
}

/// A machine's NIC on a switch port: a namespace with `eth0` at `ip`.
pub struct Nic {
    pub ns: Netns,
    pub port: String,
    pub ip: Ipv4Addr,
}

impl OvsSwitch {
    /// Starts OVS (ovsdb-server and ovs-vswitchd) with one bridge in a new
    /// namespace, and an sshd there.
    pub fn start(name: &str) -> OvsSwitch {
        assert!(
            ovs_usable(),
            "Open vSwitch is not installed: apt-get install openvswitch-switch (scripts/test does this)"
        );
        let dir = tempfile::Builder::new()
            .prefix("shepherd-ovs-")
            .tempdir()
            .unwrap();
        let o = dir.path();
        let ns = Netns::new("sw");
        let env = |c: &mut Command| {
            c.env("OVS_RUNDIR", o)
                .env("OVS_DBDIR", o)
                .env("OVS_LOGDIR", o)
                .env("OVS_SYSCONFDIR", o);
        };
        let conf = o.join("conf.db");
        succeed(
            Command::new("ovsdb-tool")
                .arg("create")
                .arg(&conf)
                .arg("/usr/share/openvswitch/vswitch.ovsschema"),
        );
        let db = o.join("db.sock");
        let mut c = ns.cmd(&["ovsdb-server"]);
        c.arg(&conf)
            .arg(format!("--remote=punix:{}", db.display()))
            .args(["--pidfile", "--log-file", "--no-chdir", "--detach"])
            .arg(format!("--unixctl={}", o.join("ovsdb.ctl").display()));
        env(&mut c);
        succeed(&mut c);
        let vsctl = |args: &[&str]| {
            let mut c = Command::new("ovs-vsctl");
            c.arg(format!("--db=unix:{}", db.display())).args(args);
            succeed(&mut c)
        };
        vsctl(&["--no-wait", "init"]);
        let mut c = ns.cmd(&["ovs-vswitchd"]);
        c.arg(format!("unix:{}", db.display()))
            .args(["--pidfile", "--log-file", "--no-chdir", "--detach"])
            .arg(format!("--unixctl={}", o.join("vswitchd.ctl").display()));
        env(&mut c);
        succeed(&mut c);
        let bridge = "br0".to_string();
        vsctl(&[
            "add-br",
            &bridge,
            "--",
            "set",
            "bridge",
            &bridge,
            "datapath_type=netdev",
        ]);
        // The key shepherd logs in with.
        let client =
            shepherd::ssh::SshIdentity::load_or_generate(&o.join("client_ed25519")).unwrap();
        let client_key = std::fs::read_to_string(o.join("client_ed25519")).unwrap();
        let host = shepherd::ssh::SshIdentity::load_or_generate(&o.join("host_ed25519")).unwrap();
        std::fs::write(
            o.join("authorized_keys"),
            format!("{}\n", client.public_key()),
        )
        .unwrap();
        let port = 22;
        std::fs::write(
            o.join("sshd_config"),
            format!(
                "ListenAddress 127.0.0.1:{port}\n\
                 HostKey {hk}\n\
                 PidFile {pid}\n\
                 AuthorizedKeysFile {ak}\n\
                 PermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n\
                 UsePAM no\n\
                 StrictModes no\n\
                 UseDNS no\n\
                 LogLevel VERBOSE\n",
                hk = o.join("host_ed25519").display(),
                pid = o.join("sshd.pid").display(),
                ak = o.join("authorized_keys").display(),
            ),
        )
        .unwrap();
        let mut sw = OvsSwitch {
            name: name.to_string(),
            ssh: ns.forward(SocketAddr::from(([127, 0, 0, 1], port))),
            ns,
            db,
            bridge,
            client_key,
            host_key: host.public_key().to_string(),
            dir,
            sshd: None,
            next_port: std::cell::Cell::new(1),
        };
        sw.start_sshd();
        sw
    }

    /// Starts its sshd (again), returning once it answers.
    pub fn start_sshd(&mut self) {
        let _ = std::fs::create_dir_all("/run/sshd");
        let o = self.dir.path();
        let log = std::fs::File::create(o.join("sshd.log")).unwrap();
        let mut c = self.ns.cmd(&["/usr/sbin/sshd", "-D", "-e", "-f"]);
        c.arg(o.join("sshd_config"))
            .stdin(Stdio::null())
            .stderr(log);
        let child = c.spawn().unwrap();
        self.sshd = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = self
                .ns
                .cmd(&["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/22"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the switch's sshd did not start: {}",
                self.sshd_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops its sshd (the switch keeps switching).
    pub fn stop_sshd(&mut self) {
        if let Some(mut c) = self.sshd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn sshd_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    /// `ovs-vsctl` on the switch (by the test, not through shepherd).
    pub fn vsctl(&self, args: &[&str]) -> String {
        let out = succeed(
            Command::new("ovs-vsctl")
                .arg(format!("--db=unix:{}", self.db.display()))
                .args(args),
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A port's `tag`, as the switch holds it.
    pub fn tag(&self, port: &str) -> String {
        self.vsctl(&["get", "Port", port, "tag"])
    }

    /// A new machine NIC: a namespace whose `eth0` (at `ip`/16, checksum
    /// offload off so that TCP through the user-space switch works) is
    /// joined to a new port of the bridge on `vlan`.
    pub fn nic(&self, ip: Ipv4Addr, vlan: u16) -> Nic {
        let n = self.next_port.get();
        self.next_port.set(n + 1);
        let port = format!("p{n}");
        let ns = Netns::new("m");
        succeed(Command::new("ip").args([
            "-n", &ns.0, "link", "add", "eth0", "type", "veth", "peer", "name", &port, "netns",
            &self.ns.0,
        ]));
        succeed(Command::new("ip").args([
            "-n",
            &ns.0,
            "addr",
            "add",
            &format!("{ip}/16"),
            "dev",
            "eth0",
        ]));
        succeed(Command::new("ip").args(["-n", &ns.0, "link", "set", "eth0", "up"]));
        succeed(Command::new("ip").args(["-n", &self.ns.0, "link", "set", &port, "up"]));
        succeed(&mut ns.cmd(&["ethtool", "-K", "eth0", "tx", "off"]));
        self.vsctl(&["add-port", &self.bridge, &port, &format!("tag={vlan}")]);
        Nic { ns, port, ip }
    }

    /// A cable between this switch's port `port` and `other`'s port
    /// `other_port` (a veth pair across the two namespaces, checksum
    /// offload off), both ends on `vlan` until someone makes them trunks.
    pub fn cable_to(&self, port: &str, other: &OvsSwitch, other_port: &str, vlan: u16) {
        succeed(Command::new("ip").args([
            "-n",
            &self.ns.0,
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            other_port,
            "netns",
            &other.ns.0,
        ]));
        for (sw, p) in [(self, port), (other, other_port)] {
            succeed(Command::new("ip").args(["-n", &sw.ns.0, "link", "set", "dev", p, "up"]));
            succeed(&mut sw.ns.cmd(&["ethtool", "-K", p, "tx", "off"]));
            sw.vsctl(&["add-port", &sw.bridge, p, &format!("tag={vlan}")]);
        }
    }

    /// A port's VLANs as the switch holds them: its mode, untagged VLAN
    /// and trunks (`ovs-vsctl get`), e.g. `trunk [] [10, 1000]`.
    pub fn vlans(&self, port: &str) -> String {
        let get = |col: &str| self.vsctl(&["get", "Port", port, col]);
        format!("{} {} {}", get("vlan_mode"), get("tag"), get("trunks"))
    }

    /// `count` new ports on `vlan` that no machine's traffic needs: OVS
    /// internal ports (a tap device each, in the switch's namespace),
    /// made in one transaction. Their names.
    pub fn internal_ports(&self, count: usize, vlan: u16) -> Vec<String> {
        let first = self.next_port.get();
        self.next_port.set(first + count as u32);
        let names: Vec<String> = (first..first + count as u32)
            .map(|n| format!("p{n}"))
            .collect();
        let mut args: Vec<String> = Vec::new();
        for name in &names {
            args.extend(
                [
                    "--",
                    "add-port",
                    &self.bridge,
                    name,
                    &format!("tag={vlan}"),
                    "--",
                    "set",
                    "Interface",
                    name,
                    "type=internal",
                ]
                .map(str::to_string),
            );
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.vsctl(&args);
        names
    }

    /// Where a process in `from` (shepherd in its namespace) reaches this
    /// switch's sshd: a port on `from`'s loopback.
    pub fn ssh_from(&self, from: &Netns) -> SocketAddr {
        self.ns
            .forward_from(from, SocketAddr::from(([127, 0, 0, 1], 22)))
    }

    /// lldpd on the switch's side of `nic`'s port, sending LLDP every
    /// second as switch `self.name` port `port_id` (a name of the
    /// switch's own, as a vendor's CLI names its ports); stopped on drop.
    pub fn lldp(&self, nic: &Nic, port_id: &str) -> Lldpd {
        let dir = tempfile::Builder::new()
            .prefix("shepherd-lldpd-")
            .tempdir()
            .unwrap();
        // lldpd's helper runs as _lldpd: it must reach its socket.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let conf = dir.path().join("lldpd.conf");
        std::fs::write(
            &conf,
            format!(
                "configure system hostname {n}\nconfigure system chassisid {n}\n\
                 configure lldp tx-interval 1\n\
                 configure ports {p} lldp portidsubtype local {port_id} description \"{n}:{port_id}\"\n",
                n = self.name,
                p = nic.port
            ),
        )
        .unwrap();
        let mut c = self.ns.cmd(&["lldpd", "-d", "-I", &nic.port, "-u"]);
        c.arg(dir.path().join("lldpd.socket"))
            .arg("-O")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("lldpd.log")).unwrap());
        Lldpd {
            child: c.spawn().unwrap(),
            _dir: dir,
        }
    }

    /// Every `tag` the switch's database recorded for `port`, in order,
    /// with when (its transaction log, `ovsdb-tool show-log`: the
    /// switch's own account, not shepherd's). An empty tag is `None`.
    pub fn tag_log(&self, port: &str) -> Vec<(std::time::SystemTime, Option<u16>)> {
        let out = succeed(
            Command::new("ovsdb-tool")
                .env("TZ", "UTC")
                .args(["-mm", "show-log"])
                .arg(self.dir.path().join("conf.db")),
        );
        parse_tag_log(&String::from_utf8_lossy(&out.stdout), port)
    }

    /// The switch's own log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ovs-vswitchd.log")).unwrap_or_default()
    }
}

impl Nic {
    /// Whether a TCP connection from this NIC reaches `to`:`port` (a
    /// server there accepting), tried until `within`. Waits without
    /// holding the caller's runtime.
    pub async fn reaches(&self, to: Ipv4Addr, port: u16, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let script = format!("timeout 1 bash -c 'exec 3<>/dev/tcp/{to}/{port}'");
            let mut c = tokio::process::Command::from(self.ns.cmd(&["bash", "-c", &script]));
            c.stderr(Stdio::null());
            let ok = c.status().await.is_ok_and(|s| s.success());
            if ok || Instant::now() >= deadline {
                return ok;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether ARP from this NIC resolves `to`: a ping, then its
    /// neighbour entry read.
    pub async fn resolves(&self, to: Ipv4Addr) -> bool {
        let mut ping = tokio::process::Command::from(self.ns.cmd(&[
            "ping",
            "-c",
            "1",
            "-W",
            "1",
            &to.to_string(),
        ]));
        let _ = ping
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
        let out =
            tokio::process::Command::from(self.ns.cmd(&["ip", "neigh", "show", &to.to_string()]))
                .output()
                .await
                .unwrap();
        String::from_utf8_lossy(&out.stdout).contains("lladdr")
    }

    /// A TCP server on this NIC's `port` that accepts and closes, until
    /// dropped.
    pub fn listen(&self, port: u16) -> Child {
        use std::os::unix::process::CommandExt;
        let mut c = self.ns.cmd(&[
            "python3",
            "-c",
            &format!(
                "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
                 s.bind(('0.0.0.0',{port}))\ns.listen(64)\nwhile True:\n    c,_=s.accept()\n    c.close()\n"
            ),
        ]);
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            c.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                    .map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        c.stdin(Stdio::null()).spawn().unwrap()
    }
}

/// lldpd on a switch port.
pub struct Lldpd {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Lldpd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Nic {
    /// Runs `f` on a thread of its own inside this NIC's namespace (a raw
    /// socket there sees the NIC's frames).
    pub fn inside<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/var/run/netns/{}", self.ns.0);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap();
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            f()
        })
        .join()
        .unwrap()
    }
}

impl Drop for OvsSwitch {
    fn drop(&mut self) {
        self.stop_sshd();
        let o = self.dir.path();
        for ctl in ["vswitchd.ctl", "ovsdb.ctl"] {
            let _ = Command::new("ovs-appctl")
                .arg("-t")
                .arg(o.join(ctl))
                .arg("exit")
                .output();
        }
    }
}

/// `ovsdb-tool -mm show-log`'s records read into `port`'s tags.
fn parse_tag_log(log: &str, port: &str) -> Vec<(std::time::SystemTime, Option<u16>)> {
    let mut out = Vec::new();
    let (mut at, mut in_port) = (None, false);
    for line in log.lines() {
        if let Some(rest) = line.strip_prefix("record ") {
            // `record 4: 2026-12-07 19:44:54.960 "comment"`
            at = rest
                .split_once(": ")
                .and_then(|(_, r)| r.get(..23))
                .and_then(|t| humantime::parse_rfc3339_weak(t).ok());
            in_port = false;
        } else if let Some(rest) = line.strip_prefix("  table ") {
            in_port = rest.starts_with("Port ") && rest.contains(&format!("row \"{port}\""));
        } else if let Some(v) = line.strip_prefix("    tag=") {
            if let (true, Some(t)) = (in_port, at) {
                out.push((t, v.trim().parse().ok()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_switch_s_log_gives_each_tag_and_when() {
        let log = "record 3: 2026-12-07 19:44:53.839 \"add-port\"\n  table Port insert row \"p1\" (e0df151e):\n    name=p1\n    tag=999\n  table Port insert row \"p2\" (e0df151f):\n    tag=7\n\
                   record 4: 2026-12-07 19:44:54.960 \"set\"\n  table Port row \"p1\" (e0df151e) diff:\n    tag=10\n\
                   record 5: 2026-12-07 19:44:55.001 \"clear\"\n  table Port row \"p1\" (e0df151e) diff:\n    tag=[]\n";
        let tags = super::parse_tag_log(log, "p1");
        let v: Vec<Option<u16>> = tags.iter().map(|t| t.1).collect();
        assert_eq!(v, [Some(999), Some(10), None]);
        let ms = |i: usize| {
            tags[i]
                .0
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis()
        };
        assert_eq!(ms(1) - ms(0), 1121);
    }
}
