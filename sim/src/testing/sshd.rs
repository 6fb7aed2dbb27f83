//! A private OpenSSH sshd for takeover tests, free ports, and starting a
//! server process and waiting until it listens.

use std::time::Duration;

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
pub(super) fn spawn_listening(
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
