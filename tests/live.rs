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
    let installing = provided(&bmdb, "rack1-u3").await;
    provided(&bmdb, "rack1-u4").await;
    // rack1-u3 installs: its agent started, an installation asked.
    let generation = bmdb
        .transact(async |tx| {
            machines::set_agent_started(tx, installing, &[7; 32], None).await?;
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
            installations::ask(tx, installing, &image, &asker).await
        })
        .await
        .unwrap();
    let Asked::Done { generation, .. } = generation else {
        panic!("not asked: {generation:?}");
    };
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
            &[&installing, &i64::from(generation), &report.encode_to_vec()],
        )
        .await
    })
    .await
    .unwrap();
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
