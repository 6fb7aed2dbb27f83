//! Network namespaces a test makes (root only): one to hold a process,
//! and the two of a rack booting the network, joined by a veth pair.

use std::process::Command;

use super::processes::succeed;

/// A network namespace of this test's, deleted on drop.
pub struct Netns(pub String);

impl Netns {
    /// A new namespace named after `tag` and this process, its loopback up.
    pub fn new(tag: &str) -> Netns {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("sn{tag}{}-{n}", std::process::id() % 100_000);
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        succeed(Command::new("ip").args(["netns", "add", &name]));
        succeed(Command::new("ip").args(["-n", &name, "link", "set", "lo", "up"]));
        Netns(name)
    }

    /// `args` run inside the namespace.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0]).args(args);
        c
    }
}

impl Netns {
    /// A port on the host's loopback forwarded to `target` inside the
    /// namespace (TCP): a test's clients, in the host's namespace, reach a
    /// server that listens only in there. Lives as long as the process.
    pub fn forward(&self, target: std::net::SocketAddr) -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        self.forward_listener(listener, target)
    }

    /// A port on `from`'s loopback forwarded to `target` inside this
    /// namespace (TCP): a process in `from` (shepherd in its namespace)
    /// reaches a server that listens only in here (a switch's sshd).
    pub fn forward_from(&self, from: &Netns, target: std::net::SocketAddr) -> std::net::SocketAddr {
        let path = format!("/var/run/netns/{}", from.0);
        let listener = std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap();
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            std::net::TcpListener::bind("127.0.0.1:0").unwrap()
        })
        .join()
        .unwrap();
        self.forward_listener(listener, target)
    }

    fn forward_listener(
        &self,
        listener: std::net::TcpListener,
        target: std::net::SocketAddr,
    ) -> std::net::SocketAddr {
        let local = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let path = format!("/var/run/netns/{}", self.0);
        std::thread::spawn(move || {
            // The listener was made in the host's namespace (or
            // `from`'s) and stays there; the connections this thread
            // makes from now on are this namespace's.
            let file = std::fs::File::open(&path).unwrap();
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((mut inbound, _)) = listener.accept().await else {
                        continue;
                    };
                    tokio::spawn(async move {
                        if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        }
                    });
                }
            });
        });
        local
    }
}

impl Netns {
    /// busybox `udhcpc` on `interface` in this namespace, posing as a BIOS
    /// PXE ROM (vendor class, architecture, interface, UUID), `tries`
    /// discovers a second apart, `script` told the lease: its output
    /// (stdout, then stderr).
    pub fn udhcpc_as_pxe_rom(
        &self,
        interface: &str,
        script: &std::path::Path,
        tries: u32,
    ) -> std::process::Output {
        let tries = tries.to_string();
        let mut c = self.cmd(&[
            "timeout",
            "30",
            "busybox",
            "udhcpc",
            "-f",
            "-n",
            "-q",
            "-i",
            interface,
            "-t",
            &tries,
            "-T",
            "1",
            "-s",
            script.to_str().unwrap(),
            "-V",
            "PXEClient:Arch:00000:UNDI:002001",
            "-x",
            "93:0000",
            "-x",
            "94:010201",
            "-x",
            "97:005e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e",
        ]);
        c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// Whether this process may make network namespaces.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A rack's network: shepherd's namespace and the rack's, joined by the
/// provisioning link (a veth pair: `prov0` on shepherd's side with
/// [`RackNetwork::SERVER`], `rack0` on the rack's with 10.77.0.2). The
/// rack's namespace routes to itself the DHCP pool ([`RackNetwork::POOL`])
/// and the BMCs' addresses (from [`RackNetwork::FIRST_BMC`]), which
/// shepherd reaches through the link.
pub struct RackNetwork {
    pub server: Netns,
    pub rack: Netns,
}

impl RackNetwork {
    pub const SERVER: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 77, 0, 1);
    pub const RACK: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 77, 0, 2);
    pub const POOL: &str = "10.77.16.1-10.77.31.254";
    pub const FIRST_BMC: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 78, 0, 1);

    pub fn new() -> RackNetwork {
        let server = Netns::new("s");
        let rack = Netns::new("r");
        let (s, r) = (server.0.as_str(), rack.0.as_str());
        for args in [
            &[
                "-n", s, "link", "add", "prov0", "type", "veth", "peer", "name", "rack0", "netns",
                r,
            ][..],
            &["-n", s, "addr", "add", "10.77.0.1/16", "dev", "prov0"],
            &["-n", s, "link", "set", "prov0", "up"],
            &["-n", s, "route", "add", "10.78.0.0/16", "via", "10.77.0.2"],
            &["-n", r, "addr", "add", "10.77.0.2/16", "dev", "rack0"],
            &["-n", r, "link", "set", "rack0", "up"],
            &[
                "-n",
                r,
                "route",
                "add",
                "local",
                "10.77.16.0/20",
                "dev",
                "lo",
            ],
            &[
                "-n",
                r,
                "route",
                "add",
                "local",
                "10.78.0.0/16",
                "dev",
                "lo",
            ],
        ] {
            succeed(Command::new("ip").args(args));
        }
        RackNetwork { server, rack }
    }
}

impl Default for RackNetwork {
    fn default() -> Self {
        Self::new()
    }
}
