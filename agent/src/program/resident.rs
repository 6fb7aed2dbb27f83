//! The resident agent as a process: after the takeover it stays (as a
//! systemd unit, detached with its PID and log beside its executable, or
//! handed off to a simulated machine), stops the agent a previous takeover
//! left, enrolls the boot image's agent (`--live`), and runs the heartbeat
//! loop ([`crate::resident`] does the calling) on this host's settings,
//! files beside the executable.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::api::AgentHardwareReport;
use crate::install::disk::Disk;
use crate::resident::{Host, Resident};

use crate::api::TakeoverInit;

fn sidecar(exe: &Path, name: &str) -> Option<String> {
    let dir = exe.parent()?;
    std::fs::read_to_string(dir.join(name))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Detaches and heartbeats, if the init asks for a resident agent.
/// With `TAKEOVER_AGENT_RESIDENT=handoff` (a simulated machine, which
/// runs its resident agents in-process) it writes what the resident
/// agent needs to `<executable>.handoff` (0600) instead.
pub fn stay(init: TakeoverInit, seed: [u8; 32], exe: Option<PathBuf>) {
    let _ = std::io::stdout().flush();
    let Some(exe) = exe else { return };
    let how = std::env::var("TAKEOVER_AGENT_RESIDENT").unwrap_or_default();
    if init.bmaas_endpoint.is_empty() || init.ca_certificate.is_empty() || how == "0" {
        return;
    }
    let resident = Resident {
        machine_id: init.machine_id,
        endpoint: init.bmaas_endpoint,
        ca_certificate: init.ca_certificate,
        seed,
    };
    if how == "handoff" {
        let path = with_suffix(&exe, ".handoff");
        if let Err(e) = crate::resident::write_handoff(&path, &resident) {
            eprintln!("takeover-agent: cannot write {}: {e}", path.display());
            std::process::exit(4);
        }
        return;
    }
    // One agent per machine: the one this takeover replaces goes.
    stop_previous(&exe);
    if let Some(unit) = systemd_unit(&exe) {
        match install_unit(&exe, &unit, &resident) {
            Ok(()) => return,
            Err(e) => eprintln!(
                "takeover-agent: cannot run as the systemd unit {unit} ({e}); detaching instead"
            ),
        }
    }
    // SAFETY: still single-threaded; the child only sets up and runs.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Parent { .. }) => return,
        Ok(nix::unistd::ForkResult::Child) => {}
        Err(e) => {
            eprintln!("takeover-agent: cannot detach: {e}");
            return;
        }
    }
    let _ = nix::unistd::setsid();
    let log_path = with_suffix(&exe, ".log");
    detach_stdio(&log_path);
    let _ = std::fs::write(
        with_suffix(&exe, ".pid"),
        format!("{}\n", std::process::id()),
    );
    heartbeat(resident, exe);
}

/// How long each NIC is listened on for LLDP: a switch sends every 30 s.
const LLDP_LISTEN: Duration = Duration::from_secs(65);

fn heartbeat(resident: Resident, exe: PathBuf) -> ! {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    // Read now: by the time a reboot is asked for, the files beside the
    // agent may be the installed image's.
    let reboot_off = std::env::var("TAKEOVER_AGENT_REBOOT").is_ok_and(|v| v == "0")
        || sidecar(&exe, "takeover-agent.reboot").as_deref() == Some("off");
    // Which switch port each NIC is on, from the switches' LLDP frames
    // (sent every 30 s by default): the report is sent again once heard.
    crate::lldp::learn_in_background(crate::lldp::physical_interfaces(), LLDP_LISTEN, |line| {
        eprintln!(
            "{} takeover-agent: {line}",
            humantime::format_rfc3339_millis(std::time::SystemTime::now())
        )
    });
    rt.block_on(crate::resident::run(resident, ThisHost { exe, reboot_off }));
    std::process::exit(0);
}

/// `--live FILE`: the agent of shepherd's boot image (CONTRACTS.md §5).
/// FILE is the boot's data (`shepherd.boot.v1.BootData`): it makes a
/// key, enrolls it with the boot's credential (retrying while shepherd
/// cannot be reached; a refusal ends it, exit 3), then heartbeats as
/// the resident agent does, in the foreground. The enrolled key is kept
/// beside FILE (FILE.key, 0600; the boot image's files live in memory
/// only): an agent started again in the same boot (the boot image's init
/// restarts one that died) heartbeats with it instead of enrolling, since
/// a boot's credential enrolls once. Whatever the dead agent was doing is
/// not resumed: shepherd asks the unanswered generation again, and its
/// record (beside the executable) makes an erasure run again from the
/// start and an installation cut short wiped and failed.
pub fn live(path: &Path, exe: Option<PathBuf>) -> i32 {
    use prost::Message as _;
    let Some(exe) = exe else {
        eprintln!("takeover-agent: cannot tell where this executable is");
        return 1;
    };
    let data = match std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|b| {
            shepherd_proto::boot::BootData::decode(b.as_slice()).map_err(|e| e.to_string())
        }) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("takeover-agent: {}: not a boot's data: {e}", path.display());
            return 2;
        }
    };
    let key_file = with_suffix(path, ".key");
    let enrolled = enrolled_seed(&key_file);
    let resident = Resident {
        machine_id: data.machine_id.clone(),
        endpoint: data.bmaas_endpoint.clone(),
        ca_certificate: data.ca_certificate.clone(),
        seed: enrolled.unwrap_or_else(rand::random),
    };
    if enrolled.is_some() {
        eprintln!(
            "takeover-agent: started again in the same boot: heartbeating as machine {} with the key enrolled before",
            data.machine_id
        );
        heartbeat(resident, exe);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    if let Err(e) = rt.block_on(crate::callback::enroll(&data, &resident.seed, |line| {
        eprintln!("takeover-agent: {line}")
    })) {
        eprintln!("takeover-agent: {e}");
        return 3;
    }
    eprintln!(
        "takeover-agent: enrolled as machine {} with {}",
        data.machine_id, data.bmaas_endpoint
    );
    if let Err(e) = crate::files::write_private(&key_file, &resident.seed) {
        eprintln!(
            "takeover-agent: cannot keep the enrolled key in {}: {e} (an agent started again in this boot cannot heartbeat)",
            key_file.display()
        );
    }
    drop(rt);
    heartbeat(resident, exe)
}

/// The key a live agent of this boot enrolled before, if one did.
fn enrolled_seed(file: &Path) -> Option<[u8; 32]> {
    std::fs::read(file).ok()?.try_into().ok()
}

/// `--resident`: the unit's agent, from the state its takeover left.
pub fn from_state(exe: Option<PathBuf>) {
    let Some(exe) = exe else {
        eprintln!("takeover-agent: cannot tell where this executable is");
        std::process::exit(1);
    };
    let state = with_suffix(&exe, ".state");
    let resident = match crate::resident::read_state(&state) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("takeover-agent: {}: {e}", state.display());
            // Nothing to do until a takeover writes it: not a failure
            // for systemd to restart.
            std::process::exit(0);
        }
    };
    let _ = std::fs::write(
        with_suffix(&exe, ".pid"),
        format!("{}\n", std::process::id()),
    );
    heartbeat(resident, exe);
}

/// The agent a previous takeover left running (its PID file), if it is
/// still this program: asked to stop, then killed.
fn stop_previous(exe: &Path) {
    let pid_file = with_suffix(exe, ".pid");
    let Some(pid) = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
    else {
        return;
    };
    if pid == std::process::id() as i32 {
        return;
    }
    // The PID may have been reused: only a process running this path
    // (replaced by the upload, so possibly " (deleted)") is ours.
    let ours = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| {
            let p = p.to_string_lossy().into_owned();
            p.trim_end_matches(" (deleted)") == exe.to_string_lossy()
        })
        .unwrap_or(false);
    if !ours {
        return;
    }
    let pid = nix::unistd::Pid::from_raw(pid);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(50));
        if nix::sys::signal::kill(pid, None).is_err() {
            eprintln!("takeover-agent: stopped the previous agent ({pid})");
            return;
        }
    }
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    eprintln!("takeover-agent: killed the previous agent ({pid})");
}

/// The unit to run as, where the host runs systemd and we are root
/// (`TAKEOVER_AGENT_UNIT=0`, or a `takeover-agent.unit` file saying
/// `off` beside the executable, turns it off; another word names the
/// unit).
fn systemd_unit(exe: &Path) -> Option<String> {
    let setting = std::env::var("TAKEOVER_AGENT_UNIT")
        .ok()
        .or_else(|| sidecar(exe, "takeover-agent.unit"));
    let name = match setting.as_deref() {
        Some("0" | "off" | "no") => return None,
        Some(n)
            if !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_@.".contains(c)) =>
        {
            n.trim_end_matches(".service").to_string()
        }
        _ => "shepherd-agent".to_string(),
    };
    let booted = Path::new("/run/systemd/system").is_dir();
    (booted && nix::unistd::Uid::effective().is_root()).then(|| format!("{name}.service"))
}

/// Writes the state and the unit, and (re)starts it: the agent then
/// survives reboots and a restart replaces the previous one.
fn install_unit(exe: &Path, unit: &str, resident: &Resident) -> std::io::Result<()> {
    crate::resident::write_state(&with_suffix(exe, ".state"), resident)?;
    let text = format!(
        "# Written by shepherd's agent at its takeover; rewritten by the next.\n\
         [Unit]\n\
         Description=shepherd agent (heartbeats to the fleet's shepherd)\n\
         Wants=network-online.target\n\
         After=network-online.target\n\n\
         [Service]\n\
         ExecStart={} --resident\n\
         Restart=on-failure\n\
         RestartSec=5\n\n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        exe.display()
    );
    let path = Path::new("/etc/systemd/system").join(unit);
    let tmp = path.with_extension("service.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    for args in [
        vec!["daemon-reload"],
        vec!["enable", unit],
        vec!["restart", unit],
    ] {
        let status = std::process::Command::new("systemctl")
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()?;
        if !status.success() {
            return Err(std::io::Error::other(format!(
                "systemctl {} exited with {status}",
                args.join(" ")
            )));
        }
    }
    eprintln!("takeover-agent: running as the systemd unit {unit}");
    Ok(())
}

fn with_suffix(exe: &Path, suffix: &str) -> PathBuf {
    let mut p = exe.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// stdin from /dev/null, stdout and stderr to the log: the SSH session
/// sees its pipes close.
fn detach_stdio(log: &Path) {
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = nix::unistd::dup2_stdin(&null);
    }
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .or_else(|_| std::fs::OpenOptions::new().write(true).open("/dev/null"));
    if let Ok(out) = out {
        let _ = nix::unistd::dup2_stdout(&out);
        let _ = nix::unistd::dup2_stderr(&out);
    }
}

/// The host this process runs on; its settings are files beside the
/// executable, read each round.
struct ThisHost {
    exe: PathBuf,
    /// Rebooting is turned off (tests on a developer's machine).
    reboot_off: bool,
}

impl Host for ThisHost {
    fn interval(&self) -> Duration {
        sidecar(&self.exe, "takeover-agent.interval")
            .and_then(|s| humantime::parse_duration(&s).ok())
            .unwrap_or(Duration::from_secs(30))
    }

    /// An agent whose executable was removed exits.
    fn alive(&self) -> bool {
        self.exe.exists()
    }

    /// The machine's disks, or those a `takeover-agent.disks` file
    /// beside the executable lists (a device path per line; `PATH
    /// SIZE` for a file standing for a disk of SIZE bytes).
    fn disks(&self) -> Vec<Disk> {
        let Some(list) = sidecar(&self.exe, "takeover-agent.disks") else {
            return crate::install::disk::list();
        };
        list.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(|l| {
                let r = match l.split_once(' ') {
                    Some((p, size)) => size
                        .trim()
                        .parse()
                        .map_err(|e| std::io::Error::other(format!("size {size:?}: {e}")))
                        .and_then(|n| Disk::file(p, n)),
                    None => Disk::probe(Path::new(l)),
                };
                r.map_err(|e| self.log(format_args!("takeover-agent.disks: {l}: {e}")))
                    .ok()
            })
            .collect()
    }

    fn install_record(&self) -> Option<PathBuf> {
        Some(with_suffix(&self.exe, ".installation"))
    }

    /// The kernel's reboot call; a
    /// `takeover-agent.reboot` file saying `off` beside the executable
    /// when the agent started (or `TAKEOVER_AGENT_REBOOT=0`) turns it
    /// into a log line, for tests on a developer's machine.
    fn reboot(&self) -> Result<(), String> {
        if self.reboot_off {
            self.log(format_args!("rebooting is turned off here: not rebooting"));
            return Ok(());
        }
        // The installer flushed (and, after writing this system's own
        // disk, wrote its guarded regions last): nothing more to sync.
        nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_AUTOBOOT)
            .map(|_| ())
            .map_err(|e| format!("reboot(2): {e}"))
    }

    fn logger(&self) -> crate::resident::Logger {
        std::sync::Arc::new(|line: std::fmt::Arguments<'_>| {
            eprintln!(
                "{} takeover-agent: {line}",
                humantime::format_rfc3339_millis(std::time::SystemTime::now())
            )
        })
    }

    fn hardware_report(&self) -> AgentHardwareReport {
        crate::hardware::report()
    }

    fn log(&self, line: std::fmt::Arguments<'_>) {
        eprintln!(
            "{} takeover-agent: {line}",
            humantime::format_rfc3339_millis(std::time::SystemTime::now())
        );
    }

    fn refused_limit(&self) -> Duration {
        sidecar(&self.exe, "takeover-agent.refused-limit")
            .and_then(|s| humantime::parse_duration(&s).ok())
            .unwrap_or(crate::resident::REFUSED_LIMIT)
    }
}
