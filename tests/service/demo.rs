//! One demo per checkout: a second `shepherd-demo` started where one keeps
//! running is refused before it touches anything, naming the first, whose
//! database and machines go on; once the first is gone, the next runs.

use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::run_demo;

#[actix_rt::test]
async fn a_second_demo_on_the_same_checkout_is_refused_and_the_first_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Command::new(shepherd_sim::bin("shepherd-demo"))
        .args(["--machines", "3", "--keep-running", "--timeout", "2m"])
        .args(["--admin-listen", "127.0.0.1:0"])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out = first.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    let admin = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("the first demo's progress: {seen:#?}"));
        if line.contains("all 3 machines taken over") {
            let url = line
                .rsplit("admin page ")
                .next()
                .unwrap()
                .trim()
                .to_string();
            break url;
        }
        seen.push(line);
    };

    // The second, from the same checkout: refused at once, naming the
    // first; nothing of the first's is touched.
    let bmdb_dir = dir.path().join("var/demo/bmdb");
    let before = std::fs::read_dir(&bmdb_dir).unwrap().count();
    let started = Instant::now();
    let second = Command::new(shepherd_sim::bin("shepherd-demo"))
        .args(["--machines", "3", "--admin-listen", "127.0.0.1:0"])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{stderr}");
    assert!(
        stderr.contains("another demo is running from this checkout")
            && stderr.contains(&format!("pid {}", first.id()))
            && stderr.contains(&admin),
        "{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "refused at once"
    );
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first demo runs on"
    );
    assert_eq!(std::fs::read_dir(&bmdb_dir).unwrap().count(), before);
    // Its BMDB answers as before: its three machines, taken over.
    let body: serde_json::Value = awc::Client::default()
        .get(format!("{admin}api/v1/machines?limit=10"))
        .send()
        .await
        .unwrap()
        .json()
        .limit(1 << 20)
        .await
        .unwrap();
    assert_eq!(body["machines"].as_array().map(Vec::len), Some(3), "{body}");
    assert_eq!(body["counts"]["agent-started"], 3, "{body}");
    assert!(bmdb_dir.join("PG_VERSION").exists() || std::fs::read_link(&bmdb_dir).is_ok());

    // Killed, it leaves no lock behind: the next demo runs.
    first.kill().unwrap();
    first.wait().unwrap();
    let stdout = run_demo(dir.path(), &["--machines", "2", "--timeout", "2m"]).await;
    assert!(stdout.contains("all 2 machines taken over"), "{stdout}");
}
