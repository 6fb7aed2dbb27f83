//! The installation deadline (`installations::fail_stalled`): a generation
//! on which nothing moved for the deadline is failed with its cause, once;
//! never while the callback was not served that long (shepherd's own
//! outage), never one that moves; an agent answering after all is
//! believed.

use std::time::Duration;

use shepherd::bmdb::installations::{self, fail_stalled};
use shepherd::bmdb::{Bmdb, lifecycle};
use shepherd_sim::testing::{TEST_ENDPOINT, TestDb, served_since};
use uuid::Uuid;

const HOUR: Duration = Duration::from_secs(3600);
const GRACE: Duration = Duration::from_secs(60);

/// Asks generation `generation` of `kind` (install or erase) of `id`,
/// `ago` before now.
async fn ask(bmdb: &Bmdb, id: Uuid, generation: i32, kind: &str, ago: &str) {
    let raw = vec![8u8, generation as u8];
    bmdb.transact(async |tx| {
        tx.execute(
            "INSERT INTO machine_installation (machine_id, generation, image_url, image_digest, \
                 requested_at, requested_by, kind, erase_mode) \
             VALUES ($1, $2, 'https://images.test/os.img', 'sha256:00', now() - $4::text::interval, 'test', $3, \
                     CASE WHEN $3 = 'erase' THEN 'overwrite' END)",
            &[&id, &generation, &kind, &ago],
        )
        .await?;
        tx.execute(
            "INSERT INTO machine_os_installation_request VALUES ($1, $2, $3)",
            &[&id, &generation, &raw],
        )
        .await
    })
    .await
    .unwrap();
}

/// The agent's progress on `generation`: last moved `moved_ago` ago,
/// heard now.
async fn progress(
    bmdb: &Bmdb,
    id: Uuid,
    generation: i64,
    phase: i32,
    written: i64,
    moved_ago: &str,
) {
    bmdb.transact(async |tx| {
        tx.execute(
            "INSERT INTO machine_installation_progress \
                 (machine_id, generation, progress_raw, progress_at, phase, bytes_written) \
             VALUES ($1, $2, '\\x', now() - $5::text::interval, $3, $4)",
            &[&id, &generation, &phase, &written, &moved_ago],
        )
        .await?;
        // Heard again since, standing still.
        tx.execute(
            "UPDATE machine_installation_progress SET progress_at = now() WHERE machine_id = $1",
            &[&id],
        )
        .await
    })
    .await
    .unwrap();
}

async fn state(bmdb: &Bmdb, id: Uuid) -> String {
    bmdb.transact(async |tx| lifecycle::state_of(tx, id).await)
        .await
        .unwrap()
        .unwrap()
        .as_str()
        .to_string()
}

/// The installation history's events for `id`, in order, with details.
async fn history(bmdb: &Bmdb, id: Uuid) -> Vec<(String, Option<String>)> {
    shepherd_sim::testing::installation_history(bmdb, id).await
}

async fn fail(bmdb: &Bmdb) -> Vec<installations::TimedOut> {
    bmdb.transact(async |tx| fail_stalled(tx, HOUR, GRACE).await)
        .await
        .unwrap()
}

#[actix_rt::test]
async fn what_did_not_move_for_the_deadline_is_failed_with_its_cause_once() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let seed = |n| Some([n; 32]);
    // No agent ever took it (its boots kept failing).
    let untaken = shepherd_sim::testing::machine(&bmdb, seed(1)).await;
    ask(&bmdb, untaken, 1, "install", "2 hours").await;
    // An erasure whose agent still heartbeats, its progress standing still.
    let stuck = shepherd_sim::testing::machine(&bmdb, seed(2)).await;
    ask(&bmdb, stuck, 3, "erase", "3 hours").await;
    progress(&bmdb, stuck, 3, 7, 600 << 20, "2 hours").await;
    // An erasure that moved a minute ago, asked long before.
    let moving = shepherd_sim::testing::machine(&bmdb, seed(3)).await;
    ask(&bmdb, moving, 1, "erase", "5 hours").await;
    progress(&bmdb, moving, 1, 7, 900 << 30, "1 minute").await;
    // Stalled, but held by an operator: left alone.
    let held = shepherd_sim::testing::machine(&bmdb, seed(4)).await;
    ask(&bmdb, held, 1, "install", "2 hours").await;
    bmdb.transact(async |tx| {
        tx.execute(
            "INSERT INTO machine_hold (machine_id, held_at, held_by, reason) VALUES ($1, now(), 'test', 'test')",
            &[&held],
        )
        .await
    })
    .await
    .unwrap();

    // What each has in hand, in the words the Recoverer's history uses.
    let in_hand = async |id| {
        bmdb.transact(async |tx| installations::in_hand(tx, id).await)
            .await
            .unwrap()
    };
    assert_eq!(
        in_hand(untaken).await.as_deref(),
        Some("installing (generation 1): no progress reported yet")
    );
    let stuck_words = in_hand(stuck).await.unwrap();
    assert!(
        stuck_words.starts_with("erasing (generation 3): erasing, 600 MB written at "),
        "{stuck_words}"
    );

    // The callback was served for 30 minutes only (every shepherd was
    // restarted, or the database was away): nobody is judged.
    served_since(&bmdb, TEST_ENDPOINT, Duration::from_secs(30 * 60)).await;
    assert!(fail(&bmdb).await.is_empty(), "judged while nobody listened");
    assert_eq!(state(&bmdb, untaken).await, "installing");
    assert_eq!(state(&bmdb, stuck).await, "cleaning");

    served_since(&bmdb, TEST_ENDPOINT, 2 * HOUR).await;
    let mut failed = fail(&bmdb).await;
    failed.sort_by_key(|t| t.generation);
    let ids: Vec<(Uuid, i32)> = failed
        .iter()
        .map(|t| (t.machine_id, t.generation))
        .collect();
    assert_eq!(ids, vec![(untaken, 1), (stuck, 3)], "{failed:?}");
    assert_eq!(state(&bmdb, untaken).await, "install-failed");
    assert_eq!(state(&bmdb, stuck).await, "clean-failed", "never available");
    assert_eq!(state(&bmdb, moving).await, "cleaning");
    assert_eq!(
        state(&bmdb, held).await,
        "held",
        "and its generation unanswered (not in the list above)"
    );
    let untaken_cause = &failed[0].cause;
    assert!(
        untaken_cause.contains("the installation did not move for 1h")
            && untaken_cause.contains("no agent began it"),
        "{untaken_cause}"
    );
    let stuck_cause = &failed[1].cause;
    assert!(
        stuck_cause.contains("the erasure did not move for 1h")
            && stuck_cause.contains("erasing, 629145600 bytes written"),
        "{stuck_cause}"
    );
    // The report says it as an agent's would; the history says timed-out.
    let error: Vec<u8> = bmdb
        .transact(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT os_installation_report_raw FROM machine_os_installation_report WHERE machine_id = $1",
                    &[&stuck],
                )
                .await?
                .get(0))
        })
        .await
        .unwrap();
    assert_eq!(
        installations::report_error(&error).as_deref(),
        Some(stuck_cause.as_str())
    );
    let h = history(&bmdb, stuck).await;
    assert!(
        h.contains(&("timed-out".to_string(), Some(stuck_cause.clone()))),
        "{h:?}"
    );
    assert_eq!(
        h.iter().filter(|(e, _)| e == "erase-failed").count(),
        1,
        "{h:?}"
    );

    // A live agent booted on it afterwards (a recovery boot): still
    // install-failed, since nothing erased what was half written.
    bmdb.transact(async |tx| {
        let b = shepherd::bmdb::boot::issue(tx, untaken, Duration::from_secs(60)).await?;
        shepherd::bmdb::boot::enroll(tx, untaken, &b.credential, &[11; 32], "cb:1").await?;
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(state(&bmdb, untaken).await, "install-failed");

    // Once: a second look (or another shepherd's) fails nothing more.
    assert!(fail(&bmdb).await.is_empty());
    assert_eq!(
        history(&bmdb, stuck)
            .await
            .iter()
            .filter(|(e, _)| e == "timed-out")
            .count(),
        1
    );

    // The agent answers after all: the truth replaces shepherd's verdict.
    bmdb.transact(async |tx| {
        tx.execute(
            "UPDATE machine_os_installation_report SET os_installation_result = 'Success', \
                 os_installation_report_raw = '\\x0803' WHERE machine_id = $1",
            &[&stuck],
        )
        .await
    })
    .await
    .unwrap();
    assert_eq!(state(&bmdb, stuck).await, "available");
}

#[test]
fn the_cause_says_what_was_last_seen() {
    assert_eq!(
        installations::stalled_cause(
            installations::Kind::Install,
            Duration::from_secs(5400),
            None,
            None,
            "2026-11-27 01:00:00 UTC",
            Some("ShepherdAgentStart: booting into the agent through the BMC: HTTP 500")
        ),
        "shepherd: the installation did not move for 1h 30m (installations.deadline): \
         no agent began it (asked at 2026-11-27 01:00:00 UTC); the last failure on the machine: \
         ShepherdAgentStart: booting into the agent through the BMC: HTTP 500"
    );
}

/// A report sent again (its answer lost, the database away) is recorded
/// once: its history once, and the restart from the disk that a machine
/// booted through its BMC gets after an installation asked once, not
/// again after the Enroller did it.
#[actix_rt::test]
async fn a_report_sent_again_asks_no_second_restart_from_the_disk() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let id = shepherd_sim::testing::machine(&bmdb, Some([7; 32])).await;
    ask(&bmdb, id, 2, "install", "5 minutes").await;
    let report = async || {
        bmdb.transact(async |tx| {
            tx.execute(
                "UPDATE machine_installation SET reboot_by_bmc = true WHERE machine_id = $1",
                &[&id],
            )
            .await?;
            tx.execute(
                "INSERT INTO machine_os_installation_report VALUES ($1, 2, 'Success', '\\x0802') \
                 ON CONFLICT (machine_id) DO UPDATE SET generation = EXCLUDED.generation, \
                     os_installation_result = EXCLUDED.os_installation_result, \
                     os_installation_report_raw = EXCLUDED.os_installation_report_raw",
                &[&id],
            )
            .await
        })
        .await
        .unwrap();
    };
    let disk_boots = async || -> i64 {
        bmdb.transact(async |tx| {
            Ok(tx
                .query_one(
                    "SELECT count(*) FROM machine_boot_request WHERE machine_id = $1 AND cause = 'disk'",
                    &[&id],
                )
                .await?
                .get(0))
        })
        .await
        .unwrap()
    };
    report().await;
    assert_eq!(disk_boots().await, 1, "the restart from the disk is asked");
    // The Enroller restarts it from its disk and ends the request.
    bmdb.transact(async |tx| {
        tx.execute(
            "DELETE FROM machine_boot_request WHERE machine_id = $1",
            &[&id],
        )
        .await
    })
    .await
    .unwrap();
    report().await;
    assert_eq!(
        disk_boots().await,
        0,
        "no second restart for the same report"
    );
    let h = history(&bmdb, id).await;
    assert_eq!(
        h.iter().filter(|(e, _)| e == "installed").count(),
        1,
        "{h:?}"
    );
    assert_eq!(state(&bmdb, id).await, "installed");
}
