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
//!
//! Here: the command line and the takeover's exchange on stdin and stdout
//! (its fault modes stay in this file, where tests/house.rs looks for
//! them). Beside it: `program/resident.rs` (staying as the resident agent:
//! the unit, detaching, the previous agent, `--live`, `--resident`) and
//! `program/by_hand.rs` (`--install`).

mod by_hand;
mod resident;

use std::io::{Read, Write};
use std::path::PathBuf;

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

/// What `--help` prints.
const USAGE: &str = "\
Usage: takeover-agent                      (started by shepherd over SSH)
       takeover-agent --resident           (started by its systemd unit)
       takeover-agent --live FILE          (in shepherd's boot image)
       takeover-agent --install URL DIGEST DISK [CA.der] [--key FILE] [--manifest URL SHA256] [--swarm URL]
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
            std::process::exit(by_hand::install_by_hand(std::env::args().skip(2).collect()))
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
        "hang" => std::thread::sleep(std::time::Duration::from_secs(3600)),
        #[cfg(feature = "faults")]
        "crash" => {
            eprintln!("takeover-agent: simulated crash");
            std::process::exit(3);
        }
        #[cfg(feature = "faults")]
        m if m.starts_with("slow:") => {
            let secs: f64 = m[5..].parse().unwrap_or(1.0);
            std::thread::sleep(std::time::Duration::from_secs_f64(secs));
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
