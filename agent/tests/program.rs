//! `takeover-agent` as a person at a terminal meets it: usage, usage
//! errors, and a terminal where shepherd's protobuf belongs.

use std::process::{Command, Stdio};

const AGENT: &str = env!("CARGO_BIN_EXE_takeover-agent");

#[test]
fn help_prints_the_usage_and_a_wrong_argument_is_a_usage_error() {
    let out = Command::new(AGENT).arg("--help").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("text, not protobuf");
    assert!(text.starts_with("Usage: takeover-agent"), "{text}");
    assert!(text.contains("--install URL DIGEST DISK"), "{text}");

    let out = Command::new(AGENT).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("takeover-agent "));

    let out = Command::new(AGENT)
        .arg("--frobnicate")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "nothing on stdout: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown argument \"--frobnicate\""), "{err}");
}

#[test]
fn a_terminal_on_stdin_is_refused_with_a_readable_message() {
    // util-linux's script(1) gives the agent a pseudo-terminal as stdin.
    let out = Command::new("script")
        .args(["-qec", AGENT, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("script (util-linux)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(text.contains("stdin is a terminal"), "{text}");
}
