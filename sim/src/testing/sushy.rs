//! OpenStack's Redfish emulator (sushy-tools) as a process: BMCs for tests,
//! with its fake driver or its libvirt driver.

use super::Sshd;
use super::sshd::spawn_listening;

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
        let driver = format!(
            "SUSHY_EMULATOR_FAKE_DRIVER = True\nSUSHY_EMULATOR_FAKE_SYSTEMS = [{}]\n{extra}",
            fake.join(", ")
        );
        Self::launch(systems, user, password, &driver)
    }

    /// With its libvirt driver, in front of the host's libvirt
    /// (`qemu:///system`): `domains` are libvirt domains' names, defined
    /// by the caller (`bmc(i)` names the system `uuid(i)`: set its
    /// `system` to the domain's UUID when it has another).
    pub fn start_libvirt(domains: &[&str], user: &str, password: &str) -> Sushy {
        Self::launch(
            domains,
            user,
            password,
            "SUSHY_EMULATOR_LIBVIRT_URI = 'qemu:///system'\n",
        )
    }

    fn launch(systems: &[&str], user: &str, password: &str, driver: &str) -> Sushy {
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
        let conf = dir.path().join("emulator.conf");
        std::fs::write(
            &conf,
            format!(
                "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n\
                 SUSHY_EMULATOR_LISTEN_PORT = {port}\n\
                 SUSHY_EMULATOR_AUTH_FILE = '{auth}'\n\
                 SUSHY_EMULATOR_STATE_DIR = '{state}'\n{driver}\n",
                auth = htpasswd.display(),
                state = dir.path().join("state").display(),
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
        self.get(&format!("/redfish/v1/Systems/{}", Self::uuid(i)))
            .await
    }

    /// The resource at `path` as the emulator shows it (JSON).
    pub async fn get(&self, path: &str) -> serde_json::Value {
        let mut r = awc::Client::default()
            .get(format!("{}{path}", self.url))
            .basic_auth(&self.user, &self.password)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}: {:?}", r.status());
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
            secure_boot: None,
            console: None,
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
