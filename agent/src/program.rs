//! `takeover-agent` (its `main` is [`main`]): a stand-in for the real agent, for tests, benchmarks
//! and the demo. Reads a `TakeoverInit` from stdin and replies a
//! `TakeoverResponse` success echoing it, with a fresh ed25519 public key.
//!
//! Built with the `faults` feature (the tests' and benchmarks' builds
//! only: a release build has none of this), it can be told to misbehave, by `--mode MODE`, `TAKEOVER_AGENT_MODE`, or a
//! file next to the executable named `<executable>.mode` (which is how a
//! test reaches an agent started over SSH), or `takeover-agent.mode` in the
//! executable's directory (for every agent there): `ok`, `error`, `garbage`,
//! `wrong-echo`, `short-key`, `nothing`, `huge`, `hang`, `crash` (non-zero
//! exit), `slow:SECONDS` (then ok), and every run appends the machine ID
//! to `<executable>.runs` (what the tests count). What ships keeps no
//! tally: beside its executable, only its state (`.state`), and when it
//! detaches rather than running as a systemd unit, its PID (`.pid`, how
//! the next takeover stops it) and its log (`.log`, its only output).
//!
//! After a successful takeover it stays as the resident agent (unless
//! `TAKEOVER_AGENT_RESIDENT=0`, or the init names no endpoint or CA): it
//! detaches (closing stdout and stderr, so the SSH exec ends), writes its
//! PID to `<executable>.pid` and its log to `<executable>.log`, and calls
//! `Heartbeat` on the endpoint every interval (30 s; `takeover-agent.interval`
//! beside it, e.g. `500ms`, for tests), over TLS verified with the CA it was
//! given, authenticated by a self-signed certificate of its key; its
//! hardware report goes with the first heartbeat; an installation request
//! is carried out ([`crate::install`]: the image written to the disk the
//! hints choose, on the disks a `takeover-agent.disks` file beside it lists
//! if there is one) and answered with a report of its generation; a
//! `takeover-agent.reboot` file saying `off` keeps it from rebooting
//! afterwards. It backs off
//! while the server is unreachable, and exits once its executable is gone.
//! With `TAKEOVER_AGENT_RESIDENT=handoff` it hands its key and endpoint to
//! the simulated machine that ran it (a `<executable>.handoff` file), which
//! runs the same heartbeat loop in-process.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use prost::Message;

use crate::api::{
    TakeoverError, TakeoverInit, TakeoverResponse, TakeoverSuccess, takeover_response,
};

/// The takeover's mode: always `ok`, but in a build with the test fault
/// modes.
#[cfg(not(feature = "faults"))]
fn mode(_: &Option<PathBuf>) -> String {
    "ok".into()
}

#[cfg(feature = "faults")]
fn mode(exe: &Option<PathBuf>) -> String {
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--mode" {
            if let Some(m) = args.next() {
                return m;
            }
        } else if let Some(m) = a.strip_prefix("--mode=") {
            return m.to_string();
        }
    }
    if let Ok(m) = std::env::var("TAKEOVER_AGENT_MODE") {
        return m;
    }
    if let Some(exe) = exe {
        let mut sidecar = exe.clone().into_os_string();
        sidecar.push(".mode");
        if let Ok(m) = std::fs::read_to_string(sidecar) {
            return m.trim().to_string();
        }
        // One mode for every agent in the directory.
        if let Some(dir) = exe.parent() {
            if let Ok(m) = std::fs::read_to_string(dir.join("takeover-agent.mode")) {
                return m.trim().to_string();
            }
        }
    }
    "ok".into()
}

fn respond(r: takeover_response::Result) {
    let bytes = TakeoverResponse { result: Some(r) }.encode_to_vec();
    std::io::stdout().write_all(&bytes).unwrap();
}

fn public_key(seed: &[u8; 32]) -> Vec<u8> {
    ed25519_dalek::SigningKey::from_bytes(seed)
        .verifying_key()
        .to_bytes()
        .to_vec()
}

#[cfg(feature = "faults")]
fn fresh_key() -> Vec<u8> {
    public_key(&rand::random())
}

/// `takeover-agent --install URL DIGEST DISK [CA.der] [--key FILE]`:
/// installs an image by hand, as an installation request would, onto DISK
/// (a block device, or a file standing for one), and prints one JSON line:
/// the outcome, the seconds it took, the seconds to the first byte on the
/// disk, the bytes fetched and written, and the process's peak resident
/// memory. For an operator at a machine's console, and for the
/// installation benchmark. The key shepherd's image server asks for is
/// FILE's first 32 bytes (the resident agent's state file, or a bare
/// ed25519 seed); without `--key`, the resident's own state file beside
/// this executable, if there is one.
fn install_by_hand(args: Vec<String>) -> i32 {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    let mut key_file = None;
    let mut positional = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--key" => match it.next() {
                Some(f) => key_file = Some(std::path::PathBuf::from(f)),
                None => {
                    eprintln!("takeover-agent: --key needs a file");
                    return 2;
                }
            },
            s if s.starts_with("--") => {
                eprintln!("takeover-agent: unknown option {s} for --install");
                return 2;
            }
            _ => positional.push(a),
        }
    }
    let [url, digest, disk, rest @ ..] = positional.as_slice() else {
        eprintln!("usage: takeover-agent --install URL DIGEST DISK [CA.der] [--key FILE]");
        return 2;
    };
    let ca = match rest.first() {
        Some(p) => match std::fs::read(p) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("takeover-agent: {p}: {e}");
                return 2;
            }
        },
        None => Vec::new(),
    };
    let own_state = std::env::current_exe()
        .ok()
        .map(|exe| {
            let mut p = exe.into_os_string();
            p.push(".state");
            std::path::PathBuf::from(p)
        })
        .filter(|p| p.exists());
    let agent_key = match key_file.as_ref().or(own_state.as_ref()) {
        None => None,
        Some(f) => match std::fs::read(f) {
            Ok(b) if b.len() >= 32 => Some(crate::install::fetch::AgentKey(
                b[..32].try_into().expect("32 bytes"),
            )),
            Ok(_) => {
                eprintln!(
                    "takeover-agent: {}: shorter than a key (32 bytes)",
                    f.display()
                );
                return 2;
            }
            Err(e) => {
                eprintln!("takeover-agent: {}: {e}", f.display());
                return 2;
            }
        },
    };
    let path = std::path::Path::new(disk);
    let target = match std::fs::metadata(path) {
        Ok(m) if m.is_file() => crate::install::disk::Disk::file(path, m.len()),
        _ => crate::install::disk::Disk::probe(path),
    };
    let target = match target {
        Ok(d) => d,
        Err(e) => {
            eprintln!("takeover-agent: {disk}: {e}");
            return 2;
        }
    };
    let req = crate::api::ImageInstallation {
        url: url.clone(),
        digest: digest.clone(),
        ca_certificate: ca,
        allow_boot_disk: true,
        ..Default::default()
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("takeover-agent: {e}");
            return 1;
        }
    };
    let counters = Arc::new(crate::install::Counters::default());
    let started = std::time::Instant::now();
    let first = Arc::new(std::sync::Mutex::new(None::<f64>));
    let watch = {
        let (c, first) = (counters.clone(), first.clone());
        std::thread::spawn(move || {
            while c.written.load(Ordering::Relaxed) == 0 && started.elapsed().as_secs() < 3600 {
                std::thread::sleep(Duration::from_millis(2));
            }
            *first.lock().unwrap() = Some(started.elapsed().as_secs_f64());
        })
    };
    let log = |l: std::fmt::Arguments<'_>| eprintln!("takeover-agent: {l}");
    let r = rt.block_on(crate::install::install(
        &req,
        vec![target],
        counters.clone(),
        &crate::install::Limits {
            agent_key,
            ..Default::default()
        },
        &log,
    ));
    let seconds = started.elapsed().as_secs_f64();
    if r.is_err() {
        counters.written.store(1, Ordering::Relaxed);
    }
    let _ = watch.join();
    let peak_kb: u64 = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0);
    let first = first.lock().unwrap().unwrap_or(seconds);
    match r {
        Ok(i) => {
            println!(
                "{{\"ok\":true,\"seconds\":{seconds:.3},\"first_byte_seconds\":{first:.3},\"fetched\":{},\"written\":{},\"peak_rss_kb\":{peak_kb},\"digest\":\"{}\"}}",
                i.fetched, i.written, i.digest
            );
            0
        }
        Err(f) => {
            println!(
                "{{\"ok\":false,\"seconds\":{seconds:.3},\"peak_rss_kb\":{peak_kb},\"error\":{:?}}}",
                f.error
            );
            1
        }
    }
}

/// What `--help` prints.
const USAGE: &str = "\
Usage: takeover-agent                      (started by shepherd over SSH)
       takeover-agent --resident           (started by its systemd unit)
       takeover-agent --live FILE          (in shepherd's boot image)
       takeover-agent --install URL DIGEST DISK [CA.der] [--key FILE]
       takeover-agent --help | --version

shepherd's agent. Started over SSH, it reads a TakeoverInit (protobuf) on
stdin, answers a TakeoverResponse with a fresh ed25519 key on stdout, and
stays as the resident agent: heartbeats, the hardware report and
installations through shepherd's agent callback (gRPC over TLS).
--live enrolls a fresh key with the credential of one boot of the boot
image (FILE, the boot's data) and stays as the resident agent.
--install writes an image onto DISK by hand, as an installation request
would, and prints one JSON line with the outcome. shepherd's image server
serves only agents it knows: --key FILE is the agent's key (the resident
agent's .state file; by default the one beside this program).
";

/// Checks the arguments of a takeover (none; `--mode MODE` in a build
/// with the test fault modes): a usage error exits 2 naming it.
fn check_takeover_args() {
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let known = cfg!(feature = "faults")
            && (a.starts_with("--mode=") || (a == "--mode" && args.next().is_some()));
        if !known {
            eprintln!("takeover-agent: unknown argument {a:?}\n\n{USAGE}");
            std::process::exit(2);
        }
    }
}

/// The agent program: the takeover on stdin, then the resident agent.
pub fn main() {
    let exe = std::env::current_exe().ok();
    match std::env::args().nth(1).as_deref() {
        Some("--help" | "-h") => {
            print!("{USAGE}");
            return;
        }
        Some("--version" | "-V") => {
            println!("takeover-agent {}", env!("CARGO_PKG_VERSION"));
            return;
        }
        // Started by its systemd unit (at boot, or by a takeover).
        Some("--resident") => {
            resident::from_state(exe);
            return;
        }
        Some("--live") => match std::env::args().nth(2) {
            Some(file) => std::process::exit(resident::live(std::path::Path::new(&file), exe)),
            None => {
                eprintln!("usage: takeover-agent --live FILE");
                std::process::exit(2);
            }
        },
        Some("--install") => {
            std::process::exit(install_by_hand(std::env::args().skip(2).collect()))
        }
        _ => check_takeover_args(),
    }
    {
        use std::io::IsTerminal as _;
        if std::io::stdin().is_terminal() {
            eprintln!(
                "takeover-agent: stdin is a terminal; shepherd sends a TakeoverInit (protobuf) \
                 there over SSH. See takeover-agent --help."
            );
            std::process::exit(2);
        }
    }
    let mode = mode(&exe);
    let mut input = Vec::new();
    std::io::stdin()
        .take(1 << 20)
        .read_to_end(&mut input)
        .unwrap();
    let init = match TakeoverInit::decode(input.as_slice()) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("takeover-agent: stdin is not a TakeoverInit: {e}");
            respond(takeover_response::Result::Error(TakeoverError {
                message: format!("bad init: {e}"),
            }));
            std::process::exit(1);
        }
    };
    // The tests count what each machine ran: only their builds keep a
    // tally beside the executable.
    #[cfg(feature = "faults")]
    if let Some(exe) = &exe {
        let mut runs = exe.clone().into_os_string();
        runs.push(".runs");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(runs)
        {
            let _ = writeln!(f, "{}", init.machine_id);
        }
    }
    eprintln!("takeover-agent: machine {} mode {mode}", init.machine_id);
    let success = |init: TakeoverInit, key: Vec<u8>| {
        takeover_response::Result::Success(TakeoverSuccess {
            init_message: Some(init),
            key,
            warning: vec![],
        })
    };
    match mode.as_str() {
        "ok" => {
            let seed: [u8; 32] = rand::random();
            respond(success(init.clone(), public_key(&seed)));
            resident::stay(init, seed, exe);
        }
        #[cfg(feature = "faults")]
        "error" => respond(takeover_response::Result::Error(TakeoverError {
            message: "simulated failure: no disks found".into(),
        })),
        #[cfg(feature = "faults")]
        "garbage" => std::io::stdout()
            .write_all(b"\xff\xfe this is not protobuf \x00\x01")
            .unwrap(),
        #[cfg(feature = "faults")]
        "wrong-echo" => {
            let mut other = init;
            other.machine_id = uuid::Uuid::new_v4().to_string();
            respond(success(other, fresh_key()));
        }
        #[cfg(feature = "faults")]
        "short-key" => {
            let mut key = fresh_key();
            key.pop();
            respond(success(init, key));
        }
        #[cfg(feature = "faults")]
        "nothing" => {}
        #[cfg(feature = "faults")]
        "huge" => {
            let chunk = vec![0x5a; 1 << 20];
            let mut out = std::io::stdout().lock();
            for _ in 0..64 {
                if out.write_all(&chunk).is_err() {
                    break;
                }
            }
        }
        #[cfg(feature = "faults")]
        "hang" => std::thread::sleep(Duration::from_secs(3600)),
        #[cfg(feature = "faults")]
        "crash" => {
            eprintln!("takeover-agent: simulated crash");
            std::process::exit(3);
        }
        #[cfg(feature = "faults")]
        m if m.starts_with("slow:") => {
            let secs: f64 = m[5..].parse().unwrap_or(1.0);
            std::thread::sleep(Duration::from_secs_f64(secs));
            let seed: [u8; 32] = rand::random();
            respond(success(init.clone(), public_key(&seed)));
            resident::stay(init, seed, exe);
        }
        other => {
            eprintln!("takeover-agent: unknown mode {other}");
            std::process::exit(2);
        }
    }
}

/// The resident agent: heartbeats after the takeover
/// (`crate::resident` does the calling).
mod resident {
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

    fn heartbeat(resident: Resident, exe: PathBuf) -> ! {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        // Read now: by the time a reboot is asked for, the files beside the
        // agent may be the installed image's.
        let reboot_off = std::env::var("TAKEOVER_AGENT_REBOOT").is_ok_and(|v| v == "0")
            || sidecar(&exe, "takeover-agent.reboot").as_deref() == Some("off");
        rt.block_on(crate::resident::run(resident, ThisHost { exe, reboot_off }));
        std::process::exit(0);
    }

    /// `--live FILE`: the agent of shepherd's boot image (CONTRACTS.md §5).
    /// FILE is the boot's data (`shepherd.boot.v1.BootData`): it makes a
    /// key, enrolls it with the boot's credential (retrying while shepherd
    /// cannot be reached; a refusal ends it, exit 3), then heartbeats as
    /// the resident agent does, in the foreground.
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
        let resident = Resident {
            machine_id: data.machine_id.clone(),
            endpoint: data.bmaas_endpoint.clone(),
            ca_certificate: data.ca_certificate.clone(),
            seed: rand::random(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        if let Err(e) = rt.block_on(enroll(&data, &resident.seed)) {
            eprintln!("takeover-agent: {e}");
            return 3;
        }
        eprintln!(
            "takeover-agent: enrolled as machine {} with {}",
            data.machine_id, data.bmaas_endpoint
        );
        drop(rt);
        heartbeat(resident, exe)
    }

    /// Presents the boot's credential with the key of `seed` until shepherd
    /// answers; Err only when it refuses.
    async fn enroll(data: &shepherd_proto::boot::BootData, seed: &[u8; 32]) -> Result<(), String> {
        let host = crate::callback::endpoint_host(&data.bmaas_endpoint)
            .ok_or_else(|| format!("{:?} is not host:port", data.bmaas_endpoint))?
            .to_string();
        /// How one try ended badly.
        enum Failed {
            /// Shepherd said no: another try would be refused too.
            Refused(String),
            /// Not reached, or not able to answer now.
            Again(String),
        }
        let mut pause = Duration::from_secs(1);
        loop {
            let tried = async {
                let addr = tokio::net::lookup_host(data.bmaas_endpoint.as_str())
                    .await
                    .map_err(|e| {
                        Failed::Again(format!("cannot resolve {}: {e}", data.bmaas_endpoint))
                    })?
                    .next()
                    .ok_or_else(|| {
                        Failed::Again(format!("{} resolves to no address", data.bmaas_endpoint))
                    })?;
                let channel = crate::callback::connect(addr, &host, &data.ca_certificate, seed)
                    .await
                    .map_err(Failed::Again)?;
                crate::callback::call::<_, shepherd_proto::boot::EnrollResponse>(
                    channel,
                    shepherd_proto::callback::ENROLL_PATH,
                    shepherd_proto::boot::EnrollRequest {
                        machine_id: data.machine_id.clone(),
                        credential: data.credential.clone(),
                        bmaas_endpoint: data.bmaas_endpoint.clone(),
                    },
                )
                .await
                .map_err(|s| match s.code() {
                    tonic::Code::Unauthenticated | tonic::Code::InvalidArgument => {
                        Failed::Refused(s.message().to_string())
                    }
                    _ => Failed::Again(s.message().to_string()),
                })
            }
            .await;
            match tried {
                Ok(_) => return Ok(()),
                Err(Failed::Refused(why)) => {
                    return Err(format!("shepherd refused the enrollment: {why}"));
                }
                Err(Failed::Again(e)) => eprintln!(
                    "takeover-agent: enrolling: {e}; again in {}",
                    humantime::format_duration(pause)
                ),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(30));
        }
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
}
