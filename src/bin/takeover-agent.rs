//! `takeover-agent`: a stand-in for the real agent, for tests, benchmarks
//! and the demo. Reads a `TakeoverInit` from stdin and replies a
//! `TakeoverResponse` success echoing it, with a fresh ed25519 public key.
//!
//! It can be told to misbehave, by `--mode MODE`, `TAKEOVER_AGENT_MODE`, or a
//! file next to the executable named `<executable>.mode` (which is how a
//! test reaches an agent started over SSH), or `takeover-agent.mode` in the
//! executable's directory (for every agent there): `ok`, `error`, `garbage`,
//! `wrong-echo`, `short-key`, `nothing`, `huge`, `hang`, `crash` (non-zero
//! exit), `slow:SECONDS` (then ok). Every run appends the machine ID to
//! `<executable>.runs`.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use prost::Message;

/// The protocol types, generated from proto/agent.proto. Included directly
/// rather than through the shepherd library, so the agent stays small: it is
/// the payload every takeover uploads.
#[allow(dead_code)] // the callback messages: used by the resident agent to come
mod api {
    include!(concat!(env!("OUT_DIR"), "/cloud.agent.api.rs"));
}
use api::{TakeoverError, TakeoverInit, TakeoverResponse, TakeoverSuccess, takeover_response};

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

fn fresh_key() -> Vec<u8> {
    let secret: [u8; 32] = rand::random();
    ed25519_dalek::SigningKey::from_bytes(&secret)
        .verifying_key()
        .to_bytes()
        .to_vec()
}

fn main() {
    let exe = std::env::current_exe().ok();
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
        "ok" => respond(success(init, fresh_key())),
        "error" => respond(takeover_response::Result::Error(TakeoverError {
            message: "simulated failure: no disks found".into(),
        })),
        "garbage" => std::io::stdout()
            .write_all(b"\xff\xfe this is not protobuf \x00\x01")
            .unwrap(),
        "wrong-echo" => {
            let mut other = init;
            other.machine_id = uuid::Uuid::new_v4().to_string();
            respond(success(other, fresh_key()));
        }
        "short-key" => {
            let mut key = fresh_key();
            key.pop();
            respond(success(init, key));
        }
        "nothing" => {}
        "huge" => {
            let chunk = vec![0x5a; 1 << 20];
            let mut out = std::io::stdout().lock();
            for _ in 0..64 {
                if out.write_all(&chunk).is_err() {
                    break;
                }
            }
        }
        "hang" => std::thread::sleep(Duration::from_secs(3600)),
        "crash" => {
            eprintln!("takeover-agent: simulated crash");
            std::process::exit(3);
        }
        m if m.starts_with("slow:") => {
            let secs: f64 = m[5..].parse().unwrap_or(1.0);
            std::thread::sleep(Duration::from_secs_f64(secs));
            respond(success(init, fresh_key()));
        }
        other => {
            eprintln!("takeover-agent: unknown mode {other}");
            std::process::exit(2);
        }
    }
}
