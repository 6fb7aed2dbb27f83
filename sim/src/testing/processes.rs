//! The workspace's binaries as processes (fleet-sim, `shepherd run`),
//! pgbench, a tool run to success, an agent's install by hand, and this
//! process's memory use. Where the binaries come from: `builds`.

use std::time::Duration;

use super::Sshd;
use super::builds::bin;

/// Runs `cmd` to its end; its output, or a panic naming the command and
/// its stderr when it failed.
pub fn succeed(cmd: &mut std::process::Command) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} did not run: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs pgbench (the server's own, found like the embedded server's
/// binaries) with `script` and `clients` clients for `seconds` against
/// `cfg`'s database, `-D` variables `vars`: its transactions per second, or
/// None (with the reason on stderr) if it could not run.
pub fn pgbench(
    cfg: &tokio_postgres::Config,
    script: &str,
    clients: usize,
    seconds: u64,
    vars: &[(&str, String)],
) -> Option<f64> {
    use tokio_postgres::config::Host;
    let bin = shepherd::bmdb::embedded::find_bin_dir(None)
        .ok()?
        .join("pgbench");
    let file = std::env::temp_dir().join(format!(
        "shepherd-bench-{}-{}.sql",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&file, script).ok()?;
    let host = match &cfg.get_hosts()[0] {
        Host::Tcp(h) => h.clone(),
        Host::Unix(p) => p.display().to_string(),
    };
    let mut cmd = std::process::Command::new(bin);
    cmd.args(["-n", "-M", "prepared", "-j", "2", "-c"])
        .arg(clients.to_string())
        .arg("-T")
        .arg(seconds.to_string())
        .arg("-f")
        .arg(&file);
    for (k, v) in vars {
        cmd.arg("-D").arg(format!("{k}={v}"));
    }
    let out = cmd
        .args([
            "-h",
            &host,
            "-p",
            &cfg.get_ports().first().copied().unwrap_or(5432).to_string(),
        ])
        .args([
            "-U",
            cfg.get_user().unwrap_or("postgres"),
            cfg.get_dbname().unwrap(),
        ])
        .output()
        .ok()?;
    let _ = std::fs::remove_file(&file);
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || text.contains("actually processed: 0") {
        eprintln!(
            "pgbench did not run: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    text.lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| {
            l.trim_start_matches("tps = ")
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
}

/// CPU seconds (user + system) of a process so far.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th of the whole line.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    ticks / hz
}

/// This process's peak resident set size, MB.
pub fn peak_rss_mb() -> f64 {
    shepherd::telemetry::peak_rss_mb()
}

/// `fleet-sim` as a process, for the fleet tests and the fleet bench: it
/// writes the shepherd configuration for its fleet to `config`.
pub struct FleetSimProcess {
    pub config: std::path::PathBuf,
    pub api: std::net::SocketAddr,
    pub control: std::net::SocketAddr,
    child: std::process::Child,
}

impl FleetSimProcess {
    /// Starts `exe` (the fleet-sim binary) with `machines` from `first`,
    /// its state under `dir`, and `extra` arguments; returns once the
    /// fleet is up.
    pub fn start(
        exe: &std::path::Path,
        dir: &std::path::Path,
        machines: usize,
        first: std::net::Ipv4Addr,
        extra: &[&str],
    ) -> FleetSimProcess {
        let control = std::net::SocketAddr::from(([127, 0, 0, 1], Sshd::free_port()));
        Self::start_by(
            std::process::Command::new(exe),
            control,
            dir,
            machines,
            first,
            extra,
        )
    }

    /// [`FleetSimProcess::start`] with `command` as the fleet-sim
    /// executable (`ip netns exec NS fleet-sim`, say), its control API on
    /// `control`.
    pub fn start_by(
        mut command: std::process::Command,
        control: std::net::SocketAddr,
        dir: &std::path::Path,
        machines: usize,
        first: std::net::Ipv4Addr,
        extra: &[&str],
    ) -> FleetSimProcess {
        let api = std::net::SocketAddr::from(([127, 0, 0, 1], Sshd::free_port()));
        let config = dir.join("fleet.toml");
        let mut child = command
            .args(["--machines", &machines.to_string()])
            .args(["--first-address", &first.to_string()])
            .args(["--api-listen", &api.to_string()])
            .args(["--control-listen", &control.to_string()])
            .arg("--dir")
            .arg(dir.join("fleet"))
            .arg("--config-out")
            .arg(&config)
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("fleet-sim.log")).unwrap())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while !config.exists() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "fleet-sim exited ({status}): {}",
                    std::fs::read_to_string(dir.join("fleet-sim.log")).unwrap_or_default()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "fleet-sim did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        FleetSimProcess {
            config,
            api,
            control,
            child,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn get(url: String) -> serde_json::Value {
        let mut r = awc::Client::default().get(&url).send().await.unwrap();
        assert!(r.status().is_success(), "{url}: {}", r.status());
        let body = r.body().limit(64 << 20).await.unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    /// `GET /fleet`: what each machine ran.
    pub async fn report(&self) -> serde_json::Value {
        Self::get(format!("http://{}/fleet", self.control)).await
    }

    /// The Equinix simulator's request counts.
    pub async fn api_stats(&self) -> serde_json::Value {
        Self::get(format!("http://{}/_sim/stats", self.api)).await
    }
}

impl Drop for FleetSimProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A rented fleet in one fleet-sim process, or in several when it is
/// larger than `per_process` (a process serves a listening socket per
/// machine, within its open files): the first serves the Equinix API and
/// the first share and writes the configuration; the others serve the
/// rest of the machines (`--serve`, `--no-api`) on its SSH port with its
/// key.
pub struct FleetShares(Vec<FleetSimProcess>);

impl FleetShares {
    /// `machines` from `first`, state under `dir`, `extra` arguments for
    /// every process.
    pub fn start(
        dir: &std::path::Path,
        machines: usize,
        first: std::net::Ipv4Addr,
        per_process: usize,
        extra: &[&str],
    ) -> FleetShares {
        let exe = bin("fleet-sim");
        let share = |k: usize| {
            format!(
                "{}..{}",
                k * per_process,
                ((k + 1) * per_process).min(machines)
            )
        };
        let shares = machines.div_ceil(per_process);
        let mut args: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        if shares > 1 {
            args.extend(["--serve".to_string(), share(0)]);
        }
        fn strs(a: &[String]) -> Vec<&str> {
            a.iter().map(String::as_str).collect()
        }
        let main = FleetSimProcess::start(&exe, dir, machines, first, &strs(&args));
        let config = std::fs::read_to_string(&main.config).unwrap();
        let port = config
            .split("[ssh]")
            .nth(1)
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("port = ")))
            .expect("the fleet's configuration names its SSH port")
            .trim()
            .to_string();
        let key = dir.join("fleet/ssh/shepherd_ed25519").display().to_string();
        let mut all = vec![main];
        for k in 1..shares {
            let sub = dir.join(format!("share-{k}"));
            std::fs::create_dir_all(&sub).unwrap();
            let mut a: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
            a.extend(
                [
                    "--serve",
                    &share(k),
                    "--no-api",
                    "--ssh-port",
                    &port,
                    "--ssh-key",
                    &key,
                ]
                .map(String::from),
            );
            all.push(FleetSimProcess::start(
                &exe,
                &sub,
                machines,
                first,
                &strs(&a),
            ));
        }
        FleetShares(all)
    }

    /// The process serving the Equinix API, and the fleet's configuration.
    pub fn api(&self) -> &FleetSimProcess {
        &self.0[0]
    }

    /// Every process, the API's first.
    pub fn shares(&self) -> &[FleetSimProcess] {
        &self.0
    }

    /// The processes' CPU seconds, together.
    pub fn cpu_seconds(&self) -> f64 {
        self.0.iter().map(|p| cpu_seconds(p.pid())).sum()
    }
}

/// The overrides a `shepherd run` under test takes on loopback: the BMDB
/// at `bmdb_url`, served images from `images`, and a free port each for
/// the admin server, the agents' callback and the image server. Returns
/// them and the admin server's address.
pub fn loopback_env(
    bmdb_url: String,
    images: &std::path::Path,
) -> (Vec<(&'static str, String)>, String) {
    let free = || format!("127.0.0.1:{}", super::sshd::Sshd::free_port());
    let (admin, callback) = (free(), free());
    let env = vec![
        ("SHEPHERD__BMDB__URL", bmdb_url),
        ("SHEPHERD__ADMIN__LISTEN", admin.clone()),
        ("SHEPHERD__BMAAS__LISTEN", callback.clone()),
        ("SHEPHERD__BMAAS__ENDPOINT", callback),
        (
            "SHEPHERD__INSTALLATIONS__IMAGES_DIR",
            images.display().to_string(),
        ),
        ("SHEPHERD__INSTALLATIONS__IMAGES_LISTEN", free()),
    ];
    (env, admin)
}

/// `shepherd run` as a process on a configuration file, with environment
/// overrides; its log (stderr) in a file.
pub struct ShepherdProcess {
    pub child: std::process::Child,
    pub log: std::path::PathBuf,
    /// Run under a wrapper in a process group of its own: signals go to
    /// the group (a profiler's script does not pass them on).
    grouped: bool,
}

impl ShepherdProcess {
    /// `SHEPHERD_BENCH_WRAP` (a command and its arguments, split at
    /// white space: `heaptrack -o /tmp/shepherd`) runs `exe` under it, to
    /// profile a benchmark's shepherds.
    pub fn start(
        exe: &std::path::Path,
        config: &std::path::Path,
        log: std::path::PathBuf,
        env: &[(&str, String)],
    ) -> ShepherdProcess {
        let wrap = std::env::var("SHEPHERD_BENCH_WRAP").unwrap_or_default();
        let mut words = wrap.split_whitespace();
        let (command, grouped) = match words.next() {
            Some(w) => {
                use std::os::unix::process::CommandExt as _;
                let mut c = std::process::Command::new(w);
                c.args(words).arg(exe).process_group(0);
                (c, true)
            }
            None => (std::process::Command::new(exe), false),
        };
        let mut p = Self::start_by(command, config, log, env);
        p.grouped = grouped;
        p
    }

    /// [`ShepherdProcess::start`] with `command` as the shepherd
    /// executable (`ip netns exec NS shepherd`, say).
    pub fn start_by(
        mut command: std::process::Command,
        config: &std::path::Path,
        log: std::path::PathBuf,
        env: &[(&str, String)],
    ) -> ShepherdProcess {
        let child = command
            .arg("--config")
            .arg(config)
            .arg("run")
            .env_remove("RUST_LOG")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        ShepherdProcess {
            child,
            log,
            grouped: false,
        }
    }

    /// Sends `signal` to the process (to its group, when wrapped).
    fn send(&self, signal: nix::sys::signal::Signal) {
        let pid = self.child.id() as i32;
        let pid = nix::unistd::Pid::from_raw(if self.grouped { -pid } else { pid });
        let _ = nix::sys::signal::kill(pid, signal);
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its peak resident set size so far, MB (`VmHWM`).
    pub fn peak_rss_mb(&self) -> f64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    }

    /// Lines of the log that contain `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// The log's last 40 lines.
    pub fn log_tail(&self) -> String {
        let t = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Asks `f` every `every` until it answers Ok (its value); Err is
    /// what it saw. Panics once the process exited, or after `limit` with
    /// what `f` saw last and the log's tail.
    pub async fn until<T>(
        &mut self,
        limit: Duration,
        every: Duration,
        mut f: impl AsyncFnMut() -> Result<T, String>,
    ) -> T {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let seen = match f().await {
                Ok(v) => return v,
                Err(seen) => seen,
            };
            self.assert_running();
            assert!(
                std::time::Instant::now() < deadline,
                "after {}: {seen}\n{}",
                humantime::format_duration(limit),
                self.log_tail()
            );
            tokio::time::sleep(every).await;
        }
    }

    /// Panics with the log if the process has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("shepherd exited ({status}):\n{}", self.log_tail());
        }
    }

    pub fn kill(&mut self) {
        if self.grouped {
            self.send(nix::sys::signal::Signal::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits up to `timeout` for the exit; its code.
    pub fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        self.send(nix::sys::signal::Signal::SIGTERM);
        let started = std::time::Instant::now();
        while started.elapsed() < timeout {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
        None
    }
}

impl Drop for ShepherdProcess {
    fn drop(&mut self) {
        if self.grouped {
            self.send(nix::sys::signal::Signal::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The one JSON line `takeover-agent --install` printed, asserted
/// successful (the agent's error and its log otherwise).
pub fn installed_by_hand(out: &std::process::Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "the agent printed {text:?} ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(
        v["ok"],
        true,
        "{v}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    v
}
