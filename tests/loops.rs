//! The registry of control loops: a loop of an embedding application's
//! own is one registration, and gets what every loop gets (a session, its
//! rounds, its status in the API and on the fleet page, its series in
//! `/metrics`, its last failure's cause, the drain) without a line
//! anywhere else.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use shepherd::bmdb::{BmdbError, Session};
use shepherd::control::{Registration, Round};
use shepherd::fault::{Blame, Whose};
use shepherd_sim::testing::TestDb;

/// A toy round loop: every third round fails; the rounds it ran and the
/// sessions it ran under are counted where the test sees them.
struct Toy {
    rounds: Rc<Cell<u64>>,
    sessions: Rc<std::cell::RefCell<Vec<uuid::Uuid>>>,
}

#[derive(Debug, Clone, Default)]
struct ToyCounters {
    ok: u64,
}

/// Why a toy round failed: the BMDB's cause, or its own on purpose.
#[derive(Debug, thiserror::Error)]
enum ToyError {
    #[error(transparent)]
    Bmdb(#[from] BmdbError),
    #[error("toy round {0} failed on purpose")]
    OnPurpose(u64),
}

impl Blame for ToyError {
    fn whose(&self) -> Whose {
        match self {
            ToyError::Bmdb(e) => e.whose(),
            ToyError::OnPurpose(_) => Whose::Machine,
        }
    }
}

impl Round for Toy {
    type Outcome = ();
    type Counters = ToyCounters;
    type Error = ToyError;
    const NAME: &'static str = "toy";

    fn interval(&self) -> Duration {
        Duration::from_millis(100)
    }

    async fn round(&self, session: &Session, _: &ToyCounters) -> Result<(), ToyError> {
        let n = self.rounds.get() + 1;
        self.rounds.set(n);
        self.sessions.borrow_mut().push(session.id());
        // Under the session, as any loop's work.
        session
            .transact(async |tx| tx.query_one("SELECT 1", &[]).await.map(|_| ()))
            .await?;
        if n.is_multiple_of(3) {
            return Err(ToyError::OnPurpose(n));
        }
        Ok(())
    }

    fn tally(&self, c: &mut ToyCounters, _: ()) {
        c.ok += 1;
    }
}

async fn get(url: &str) -> (u16, String) {
    let mut r = awc::Client::default()
        .get(url)
        .send()
        .await
        .expect("the admin server answers");
    let body = r.body().limit(1 << 22).await.unwrap();
    (
        r.status().as_u16(),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

async fn until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_rt::test]
async fn a_loop_registered_once_gets_a_session_status_metrics_and_the_drain() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = shepherd::Config::load_with_env(
        None,
        [
            ("SHEPHERD__BMDB__URL".to_string(), db.url()),
            ("SHEPHERD__PROVIDER__KIND".to_string(), "static".to_string()),
            (
                "SHEPHERD__SSH__KEY_FILE".to_string(),
                dir.path().join("id").display().to_string(),
            ),
            ("SHEPHERD__BMAAS__ENABLED".to_string(), "false".to_string()),
        ],
    )
    .unwrap();
    cfg.bmdb.session_interval = Duration::from_secs(2);

    let rounds = Rc::new(Cell::new(0));
    let sessions = Rc::new(std::cell::RefCell::new(Vec::new()));
    let (r, s) = (rounds.clone(), sessions.clone());
    // The whole of what adding a loop takes: one registration.
    let toy = Registration::round(move || Toy {
        rounds: r.clone(),
        sessions: s.clone(),
    });
    let running = shepherd::supervisor::start_with(cfg, vec![toy])
        .await
        .unwrap();
    let addr =
        shepherd::admin::serve(running.admin.clone(), "127.0.0.1:0".parse().unwrap()).unwrap();
    let base = format!("http://{addr}");

    // It runs under the session the Supervisor opened.
    until("four toy rounds", || rounds.get() >= 4).await;
    let (st, body) = get(&format!("{base}/readyz")).await;
    assert_eq!(st, 200, "{body}");
    let ready: serde_json::Value = serde_json::from_str(&body).unwrap();
    let session = ready["session"].as_str().unwrap().to_string();
    assert!(
        sessions.borrow().iter().all(|s| s.to_string() == session),
        "every round ran under this process's session {session}"
    );

    // Its status, beside shepherd's own loops, as every loop's.
    let (st, body) = get(&format!("{base}/api/v1/loops")).await;
    assert_eq!(st, 200, "{body}");
    let loops: serde_json::Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = loops["loops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    for expected in [
        "provisioner",
        "recoverer",
        "brake-watch",
        "updater",
        "rollouts",
        "deadlines",
        "fleet-tally",
        "toy",
    ] {
        assert!(names.contains(&expected), "{expected} in {names:?}");
    }
    let toy = loops["loops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "toy")
        .unwrap();
    assert_eq!(toy["kind"], "round");
    assert_eq!(toy["active"], true);
    assert!(toy["ok"].as_u64().unwrap() >= 2, "{toy}");
    assert!(toy["failed"].as_u64().unwrap() >= 1, "{toy}");
    assert!(
        toy["last_error"]
            .as_str()
            .unwrap()
            .contains("failed on purpose"),
        "{toy}"
    );
    assert!(toy["last_error_at"].is_string(), "{toy}");

    // Its series, the same families as every loop's.
    let (st, metrics) = get(&format!("{base}/metrics")).await;
    assert_eq!(st, 200);
    for family in [
        "shepherd_loop_runs_total{loop=\"toy\",kind=\"round\",result=\"ok\"}",
        "shepherd_loop_runs_total{loop=\"toy\",kind=\"round\",result=\"failed\"}",
        "shepherd_loop_up{loop=\"toy\",kind=\"round\"} 1",
        "shepherd_loop_last_failure_timestamp_seconds{loop=\"toy\",kind=\"round\"}",
        "shepherd_loop_runs_total{loop=\"recoverer\",kind=\"lease\",result=\"ok\"}",
    ] {
        assert!(metrics.contains(family), "{family} in\n{metrics}");
    }
    // How long its rounds took: a histogram counting every round, ok or
    // failed, read as Prometheus would.
    let sample = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in\n{metrics}"))
    };
    let count = sample("shepherd_loop_duration_seconds_count{loop=\"toy\",kind=\"round\"}");
    assert!(count >= 3.0, "{count} rounds timed");
    assert_eq!(
        sample("shepherd_loop_duration_seconds_bucket{le=\"+Inf\",loop=\"toy\",kind=\"round\"}"),
        count
    );
    assert!(sample("shepherd_loop_duration_seconds_sum{loop=\"toy\",kind=\"round\"}") >= 0.0);

    // And a row on the fleet page.
    let (st, page) = get(&format!("{base}/")).await;
    assert_eq!(st, 200);
    assert!(page.contains("data-loop=\"toy\""), "{page}");

    // The drain stops it with the others: no round after the shutdown.
    running.shutdown().await;
    let after = rounds.get();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rounds.get(), after, "a drained loop runs no more rounds");
    assert_eq!(
        shepherd_sim::testing::count(&db.bmdb().await, "SELECT count(*) FROM sessions").await,
        0,
        "the session is closed"
    );
}
