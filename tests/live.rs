//! The fleet page's live updates (`GET /events`), read as a browser's
//! EventSource reads them: a stream of `fleet` events whose counts are the
//! tally's, and whose installations under way move as the agent reports
//! progress, with no reload; the fleet page carries the section they
//! redraw and the script, and reloads by itself only without scripts.

use std::time::{Duration, Instant};

use futures::StreamExt;
use prost::Message;
use shepherd::admin::{self, Admin};
use shepherd::bmdb::installations::{self, Asked, Asker};
use shepherd::bmdb::machines::{self, NewProvidedMachine};
use shepherd::bmdb::{Bmdb, Provider, ProviderStatus};
use shepherd_proto::api::{ImageInstallation, InstallationProgress, installation_progress::Phase};
use shepherd_sim::testing::TestDb;
use uuid::Uuid;

async fn provided(bmdb: &Bmdb, name: &str) -> Uuid {
    let m = NewProvidedMachine {
        provider: Provider::Equinix,
        provider_id: name.into(),
        reservation_id: None,
        ip_address: Some("127.0.0.1".into()),
        location: Some("sv".into()),
        status: Some(ProviderStatus::Running),
    };
    bmdb.transact(async |tx| machines::create_provided(tx, &m).await)
        .await
        .unwrap()
}

/// A machine installing: its agent started, an installation asked (no
/// progress reported yet). Its ID and the installation's generation.
async fn installing(bmdb: &Bmdb, name: &str) -> (Uuid, i32) {
    let id = provided(bmdb, name).await;
    let asked = bmdb
        .transact(async |tx| {
            machines::set_agent_started(tx, id, &[7; 32], None).await?;
            let image = ImageInstallation {
                url: "https://images.example/os.img".into(),
                digest: format!("sha256:{}", "ab".repeat(32)),
                ..Default::default()
            };
            let asker = Asker {
                actor: "live-test",
                action_id: Uuid::new_v4(),
                rollout_id: None,
                reason: None,
            };
            installations::ask(tx, id, &image, &asker).await
        })
        .await
        .unwrap();
    let Asked::Done { generation, .. } = asked else {
        panic!("not asked: {asked:?}");
    };
    (id, generation)
}

/// The agent reports a quarter of the image written.
async fn quarter_written(bmdb: &Bmdb, id: Uuid, generation: i32) {
    let report = InstallationProgress {
        generation: i64::from(generation),
        phase: Phase::Writing as i32,
        bytes_fetched: 256 << 20,
        bytes_total: 1 << 30,
        ..Default::default()
    };
    bmdb.transact(async |tx| {
        tx.execute(
            "INSERT INTO machine_installation_progress (machine_id, generation, progress_raw, progress_at) \
             VALUES ($1, $2, $3, now())",
            &[&id, &i64::from(generation), &report.encode_to_vec()],
        )
        .await
    })
    .await
    .unwrap();
}

/// The events' frames as they come: `(event, data)`.
struct Events {
    body: std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<actix_web::web::Bytes, awc::error::PayloadError>>>,
    >,
    pending: String,
}

impl Events {
    async fn next(&mut self) -> (String, String) {
        loop {
            if let Some(end) = self.pending.find("\n\n") {
                let frame: String = self.pending.drain(..end + 2).collect();
                let (mut event, mut data) = (String::from("message"), String::new());
                for line in frame.lines() {
                    if let Some(e) = line.strip_prefix("event: ") {
                        event = e.to_string();
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push_str(d);
                    }
                }
                if data.is_empty() {
                    continue; // the retry hint
                }
                return (event, data);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.body.next())
                .await
                .expect("a frame within 10 s")
                .expect("the stream goes on")
                .unwrap();
            self.pending.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

#[actix_rt::test]
async fn the_fleet_streams_its_counts_and_progress_without_a_reload() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let (installing, generation) = installing(&bmdb, "rack1-u3").await;
    provided(&bmdb, "rack1-u4").await;
    let addr = admin::serve(Admin::new(bmdb.clone()), "127.0.0.1:0".parse().unwrap()).unwrap();

    // The page: the section the events redraw, the script, and a reload
    // for browsers without scripts only.
    let page = awc::Client::default()
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap()
        .body()
        .limit(8 << 20)
        .await
        .unwrap();
    let page = String::from_utf8_lossy(&page);
    let progress = page
        .split("<section id=\"progress\">")
        .nth(1)
        .unwrap_or_else(|| panic!("the progress section: {page}"));
    assert!(
        progress.contains("rack1-u3") && progress.contains("not reported yet"),
        "{progress}"
    );
    assert!(page.contains("new EventSource(\"events\")"), "{page}");
    assert!(
        page.contains("<noscript><meta http-equiv=\"refresh\""),
        "reloads without scripts only: {page}"
    );

    // The stream, as EventSource reads it.
    let response = awc::Client::default()
        .get(format!("http://{addr}/events"))
        .insert_header(("Accept", "text/event-stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers().get("content-type").unwrap(),
        "text/event-stream"
    );
    let mut events = Events {
        body: Box::pin(response),
        pending: String::new(),
    };
    let (event, data) = events.next().await;
    assert_eq!(event, "fleet");
    let f: serde_json::Value = serde_json::from_str(&data).unwrap();
    assert_eq!(f["counts"]["installing"], 1, "{f}");
    assert_eq!(f["counts"]["pending"], 1, "{f}");
    assert_eq!(f["total"], 2, "{f}");
    assert_eq!(f["under_way"][0]["provider_id"], "rack1-u3", "{f}");
    assert!(f["under_way"][0]["percent"].is_null(), "{f}");

    // The agent reports a quarter written: the next frames show it.
    quarter_written(&bmdb, installing, generation).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (event, data) = events.next().await;
        assert_eq!(event, "fleet", "{data}");
        let f: serde_json::Value = serde_json::from_str(&data).unwrap();
        let u = &f["under_way"][0];
        if u["percent"] == 25.0 {
            assert_eq!(u["phase"], "writing", "{f}");
            assert!(u["reported_at"].is_string(), "{f}");
            break;
        }
        assert!(Instant::now() < deadline, "never moved: {f}");
    }
}

/// In a real browser: the fleet page's progress bar appears as the agent
/// reports, on the page as loaded (no reload); the machine's console view
/// shows what the last boot printed, and its link downloads all of it.
#[actix_rt::test]
async fn a_browser_sees_progress_without_a_reload_and_opens_a_console() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let (id, generation) = installing(&bmdb, "rack2-u7").await;
    let printed = "UEFI firmware starting\r\nBooting from virtual media\r\n\x1b[1mKernel panic - not syncing: \
                   VFS: Unable to mount root fs\x1b[0m\r\n";
    bmdb.transact(async |tx| {
        let capture = Uuid::new_v4();
        shepherd::bmdb::console::begin(tx, capture, id, "enroll", "sol ipmi://127.0.0.1:6230", 5)
            .await?;
        shepherd::bmdb::console::write(
            tx,
            capture,
            printed.as_bytes(),
            printed.len() as u64,
            None,
            true,
        )
        .await?;
        Ok(())
    })
    .await
    .unwrap();
    let addr = admin::serve(Admin::new(bmdb.clone()), "127.0.0.1:0".parse().unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let shots = std::env::var_os("SHEPHERD_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.path().to_path_buf());
    let ready = dir.path().join("loaded");

    // The agent reports once the browser has the page.
    let (seen, ()) = tokio::join!(
        shepherd_sim::testing::browse(vec![
            "live".into(),
            format!("http://{addr}"),
            id.to_string(),
            ready.display().to_string(),
            shots.join("fleet-live.png").display().to_string(),
        ]),
        async {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !ready.exists() {
                assert!(
                    Instant::now() < deadline,
                    "the browser never loaded the page"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            quarter_written(&bmdb, id, generation).await;
        }
    );
    assert!(
        seen["before"]
            .as_str()
            .unwrap()
            .contains("not reported yet"),
        "{seen}"
    );
    assert_eq!(seen["bars_before"], 0, "{seen}");
    assert_eq!(seen["value"], "25", "{seen}");
    assert!(
        seen["after"].as_str().unwrap().contains("writing"),
        "{seen}"
    );
    assert_eq!(seen["same_page"], true, "drawn without a reload: {seen}");
    assert!(
        seen["live"].as_str().unwrap().starts_with("live: updated"),
        "{seen}"
    );

    let seen = shepherd_sim::testing::browse(vec![
        "console".into(),
        format!("http://{addr}"),
        id.to_string(),
        shots.join("machine-console.png").display().to_string(),
    ])
    .await;
    assert_eq!(seen["captures"], 1, "{seen}");
    let tail = seen["tail"].as_str().unwrap();
    assert!(
        tail.contains("Booting from virtual media")
            && tail.contains("Kernel panic - not syncing: VFS: Unable to mount root fs")
            && !tail.contains('\x1b'),
        "{seen}"
    );
    let download = &seen["download"];
    assert_eq!(download["status"], 200, "{seen}");
    assert_eq!(download["type"], "text/plain; charset=utf-8", "{seen}");
    assert!(
        download["disposition"]
            .as_str()
            .unwrap()
            .starts_with("attachment; filename=\"console-"),
        "{seen}"
    );
    let text = download["text"].as_str().unwrap();
    assert!(
        text.starts_with("UEFI firmware starting") && text.contains("Unable to mount root fs"),
        "{seen}"
    );
}
