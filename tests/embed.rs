//! The embedding example builds and serves its routes and shepherd's.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use shepherd_sim::testing::{Sshd, TestDb};

fn example() -> std::path::PathBuf {
    // target/debug/deps/embed-… → target/debug/examples/embed
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join("embed")
}

async fn get(url: &str) -> Option<(u16, String)> {
    let mut r = awc::Client::default().get(url).send().await.ok()?;
    let body = r.body().await.ok()?;
    Some((
        r.status().as_u16(),
        String::from_utf8_lossy(&body).into_owned(),
    ))
}

#[actix_rt::test]
async fn the_embedding_example_serves_its_routes_and_shepherds() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("shepherd.toml");
    std::fs::write(
        &config,
        format!(
            "[bmdb]\nurl = \"{}\"\nsession_interval = \"2s\"\n[provider]\nkind = \"static\"\n\
             [ssh]\nkey_file = \"{}/id\"\n[bmaas]\nlisten = \"127.0.0.1:0\"\n\
             [log]\nlevel = \"warn\"\n",
            db.url(),
            dir.path().display()
        ),
    )
    .unwrap();
    let port = Sshd::free_port();
    let mut child = Command::new(example())
        .env("SHEPHERD_CONFIG", &config)
        .env("EMBED_LISTEN", format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the example is built by cargo test");
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some((200, body)) = get(&format!("{base}/shepherd/readyz")).await {
            assert!(body.contains("\"database\":\"ok\""), "{body}");
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "the example exited");
        assert!(
            Instant::now() < deadline,
            "shepherd never became ready in the example"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        get(&format!("{base}/")).await,
        Some((200, "my admin application\n".into()))
    );
    assert_eq!(
        get(&format!("{base}/shepherd/healthz")).await,
        Some((200, "ok\n".into()))
    );
    let (status, body) = get(&format!("{base}/shepherd/api/v1/machines"))
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("\"machines\":[]"), "{body}");
    let (status, page) = get(&format!("{base}/shepherd/")).await.unwrap();
    assert_eq!(status, 200);
    assert!(page.contains("0 machines"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the example did not stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success());
    let sessions = db
        .bmdb()
        .await
        .transact(async |tx| {
            Ok(tx
                .query_one("SELECT count(*) FROM sessions", &[])
                .await?
                .get::<_, i64>(0))
        })
        .await
        .unwrap();
    assert_eq!(sessions, 0, "shepherd's session was not closed on shutdown");
}
