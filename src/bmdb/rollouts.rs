//! Rollouts: one image over a set of machines, at most `max_parallel`
//! installing at once, stopped as soon as more than `max_failures` failed,
//! cancellable. A rollout is rows (`rollout`, `rollout_machine`), and
//! [`advance`] moves one on in one transaction holding the rollout's row,
//! so any number of shepherd processes may drive the same rollouts: one
//! moves it at a time, the others skip it.

use std::time::{Duration, SystemTime};

use prost::Message as _;
use shepherd_proto::api::{DiskErasure, ImageInstallation};
use uuid::Uuid;

use super::installations::{self, Asked, Asker};
use super::{BmdbError, InstallationResult, Tx, servicing};

/// A machine installing longer than its deadline plus this, without a
/// report, has failed (its agent died, say).
pub const REPORT_GRACE: Duration = Duration::from_secs(10 * 60);
/// The agents' own default deadline, when the image names none.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(2 * 3600);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Counts {
    pub waiting: i64,
    pub running: i64,
    pub done: i64,
    pub failed: i64,
    pub skipped: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rollout {
    pub id: Uuid,
    /// For people: the image's URL, or what a deprovisioning erases.
    pub image_url: String,
    /// A deprovisioning's erasure (None: an installation of the image).
    pub erasure: Option<DiskErasure>,
    /// A servicing to this baseline (then neither image nor erasure).
    pub baseline: Option<String>,
    pub max_parallel: i32,
    pub max_failures: i32,
    pub selection: String,
    pub created_at: SystemTime,
    pub created_by: String,
    /// `running`, `done`, `stopped` or `canceled`.
    pub state: String,
    pub ended_at: Option<SystemTime>,
    pub end_reason: Option<String>,
    pub counts: Counts,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub machine_id: Uuid,
    pub position: i32,
    pub state: String,
    pub generation: Option<i32>,
    pub started_at: Option<SystemTime>,
    pub ended_at: Option<SystemTime>,
    pub error: Option<String>,
}

macro_rules! rollout_query {
    ($tail:literal) => {
        concat!(
            "SELECT r.rollout_id, r.image_url, r.max_parallel, r.max_failures, r.selection, \
     r.created_at, r.created_by, r.state, r.ended_at, r.end_reason, \
     count(*) FILTER (WHERE m.state = 'waiting'), count(*) FILTER (WHERE m.state = 'running'), \
     count(*) FILTER (WHERE m.state = 'done'), count(*) FILTER (WHERE m.state = 'failed'), \
     count(*) FILTER (WHERE m.state = 'skipped'), r.erasure_raw, r.baseline \
             FROM rollout r LEFT JOIN rollout_machine m ON m.rollout_id = r.rollout_id ",
            $tail
        )
    };
}
const GET: &str = rollout_query!("WHERE r.rollout_id = $1 GROUP BY r.rollout_id");
const LIST: &str = rollout_query!("GROUP BY r.rollout_id ORDER BY r.created_at DESC LIMIT $1");

fn rollout_from(r: &tokio_postgres::Row) -> Rollout {
    Rollout {
        id: r.get(0),
        image_url: r.get(1),
        erasure: r
            .get::<_, Option<Vec<u8>>>(15)
            .and_then(|b| DiskErasure::decode(b.as_slice()).ok()),
        baseline: r.get(16),
        max_parallel: r.get(2),
        max_failures: r.get(3),
        selection: r.get(4),
        created_at: r.get(5),
        created_by: r.get(6),
        state: r.get(7),
        ended_at: r.get(8),
        end_reason: r.get(9),
        counts: Counts {
            waiting: r.get(10),
            running: r.get(11),
            done: r.get(12),
            failed: r.get(13),
            skipped: r.get(14),
        },
    }
}

/// What a new rollout is.
#[derive(Debug, Clone)]
pub struct NewRollout<'a> {
    pub id: Uuid,
    pub image: &'a ImageInstallation,
    /// Deprovision instead (the image is then not used): erase the
    /// machines' disks as this says.
    pub erasure: Option<&'a DiskErasure>,
    /// Service instead (neither image nor erasure used): bring the
    /// machines to this baseline.
    pub baseline: Option<&'a str>,
    pub max_parallel: i32,
    pub max_failures: i32,
    /// How the machines were chosen, for people.
    pub selection: &'a str,
    /// In the order they are to be installed.
    pub machines: &'a [Uuid],
    pub created_by: &'a str,
}

/// Creates a rollout (or, asked again with the same ID, finds it).
pub async fn create(tx: &mut Tx<'_>, new: &NewRollout<'_>) -> Result<Rollout, BmdbError> {
    let inserted = tx
        .execute(
            "INSERT INTO rollout (rollout_id, image_raw, image_url, max_parallel, max_failures, \
                 selection, created_at, created_by, state, erasure_raw, baseline) \
             VALUES ($1, $2, $3, $4, $5, $6, now(), $7, 'running', $8, $9) ON CONFLICT DO NOTHING",
            &[
                &new.id,
                &new.image.encode_to_vec(),
                &match (new.baseline, new.erasure) {
                    (Some(b), _) => format!("service: baseline {b}"),
                    (None, Some(e)) => format!(
                        "deprovision: erase ({})",
                        installations::erase_mode_name(e.mode)
                    ),
                    (None, None) => new.image.url.clone(),
                },
                &new.max_parallel,
                &new.max_failures,
                &new.selection,
                &new.created_by,
                &new.erasure.map(|e| e.encode_to_vec()),
                &new.baseline,
            ],
        )
        .await?;
    if inserted == 1 {
        let positions: Vec<i32> = (0..new.machines.len() as i32).collect();
        tx.execute(
            "INSERT INTO rollout_machine (rollout_id, machine_id, position, state) \
             SELECT $1, m, p, 'waiting' FROM unnest($2::uuid[], $3::int4[]) AS u(m, p)",
            &[&new.id, &new.machines, &positions],
        )
        .await?;
        if new.machines.is_empty() {
            tx.execute(
                "UPDATE rollout SET state = 'done', ended_at = now(), \
                 end_reason = 'no machine matched' WHERE rollout_id = $1",
                &[&new.id],
            )
            .await?;
        }
    }
    Ok(get(tx, new.id)
        .await?
        .expect("the rollout was just written"))
}

pub async fn get(tx: &mut Tx<'_>, id: Uuid) -> Result<Option<Rollout>, BmdbError> {
    Ok(tx.query_opt(GET, &[&id]).await?.as_ref().map(rollout_from))
}

/// The latest rollouts, newest first.
pub async fn list(tx: &mut Tx<'_>, limit: i64) -> Result<Vec<Rollout>, BmdbError> {
    Ok(tx
        .query(LIST, &[&limit])
        .await?
        .iter()
        .map(rollout_from)
        .collect())
}

/// A rollout's machines in their order.
pub async fn members(tx: &mut Tx<'_>, id: Uuid) -> Result<Vec<Member>, BmdbError> {
    Ok(tx
        .query(
            "SELECT machine_id, position, state, generation, started_at, ended_at, error \
             FROM rollout_machine WHERE rollout_id = $1 ORDER BY position",
            &[&id],
        )
        .await?
        .iter()
        .map(|r| Member {
            machine_id: r.get(0),
            position: r.get(1),
            state: r.get(2),
            generation: r.get(3),
            started_at: r.get(4),
            ended_at: r.get(5),
            error: r.get(6),
        })
        .collect())
}

/// The rollouts still running.
pub async fn running(tx: &mut Tx<'_>) -> Result<Vec<Uuid>, BmdbError> {
    Ok(tx
        .query(
            "SELECT rollout_id FROM rollout WHERE state = 'running' ORDER BY created_at",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// What one [`advance`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Advanced {
    /// Machines asked to install now.
    pub started: Vec<Uuid>,
    /// Machines whose installation ended: (machine, succeeded).
    pub ended: Vec<(Uuid, bool)>,
    /// The rollout's state when it changed (`done`, `stopped`).
    pub finished: Option<String>,
}

/// Moves rollout `id` on: settles its running machines from their reports,
/// stops it when too many failed, asks the next machines up to its
/// parallelism, ends it when none is left. Does nothing when another
/// transaction holds it or it is not running.
pub async fn advance(tx: &mut Tx<'_>, id: Uuid) -> Result<Advanced, BmdbError> {
    let mut out = Advanced::default();
    let Some(r) = tx
        .query_opt(
            "SELECT state, max_parallel, max_failures, image_raw, created_by, erasure_raw, baseline \
             FROM rollout \
             WHERE rollout_id = $1 FOR UPDATE SKIP LOCKED",
            &[&id],
        )
        .await?
    else {
        return Ok(out);
    };
    let state: String = r.get(0);
    if state != "running" {
        return Ok(out);
    }
    let (max_parallel, max_failures): (i32, i32) = (r.get(1), r.get(2));
    let image = ImageInstallation::decode(r.get::<_, Vec<u8>>(3).as_slice())
        .map_err(|e| BmdbError::Invalid(format!("rollout {id}: its image does not decode: {e}")))?;
    let created_by: String = r.get(4);
    let erasure = match r.get::<_, Option<Vec<u8>>>(5) {
        Some(raw) => Some(DiskErasure::decode(raw.as_slice()).map_err(|e| {
            BmdbError::Invalid(format!("rollout {id}: its erasure does not decode: {e}"))
        })?),
        None => None,
    };
    let baseline: Option<String> = r.get(6);
    let asked_deadline = erasure
        .as_ref()
        .map_or(image.deadline_seconds, |e| e.deadline_seconds);
    let deadline = if asked_deadline > 0 {
        Duration::from_secs(asked_deadline as u64)
    } else {
        DEFAULT_DEADLINE
    };
    // Settle the running ones: a servicing's from its servicing (one
    // query for them all), an installation's from its report.
    let mut still_running = 0;
    if baseline.is_some() {
        for (machine, r) in servicing::settled(tx, id).await? {
            match r {
                None => still_running += 1,
                Some(r) => {
                    settle(tx, id, machine, &r).await?;
                    out.ended.push((machine, r.is_ok()));
                }
            }
        }
    }
    let running = if baseline.is_some() {
        Vec::new()
    } else {
        tx.query(
            "SELECT m.machine_id, m.generation, rq.generation, rp.generation, \
                    rp.os_installation_result, rp.os_installation_report_raw, \
                    now() - m.started_at > make_interval(secs => $2) \
             FROM rollout_machine m \
             LEFT JOIN machine_os_installation_request rq ON rq.machine_id = m.machine_id \
             LEFT JOIN machine_os_installation_report rp ON rp.machine_id = m.machine_id \
             WHERE m.rollout_id = $1 AND m.state = 'running'",
            &[&id, &(deadline + REPORT_GRACE).as_secs_f64()],
        )
        .await?
    };
    for row in &running {
        let machine: Uuid = row.get(0);
        let ours: Option<i32> = row.get(1);
        let (asked, reported): (Option<i32>, Option<i32>) = (row.get(2), row.get(3));
        let result: Option<InstallationResult> = row.get(4);
        let raw: Option<Vec<u8>> = row.get(5);
        let overdue: bool = row.get::<_, Option<bool>>(6).unwrap_or(false);
        let ended = if asked != ours {
            Some(Err(match asked {
                Some(g) => format!("superseded: the machine was asked for generation {g}"),
                None => "the machine's installation request was removed".to_string(),
            }))
        } else if reported == ours {
            Some(match result {
                Some(InstallationResult::Success) => Ok(()),
                _ => Err(raw
                    .as_deref()
                    .and_then(installations::report_error)
                    .unwrap_or_else(|| "the agent reported an error".into())),
            })
        } else if overdue {
            Some(Err(format!(
                "no report within {} of the request",
                humantime::format_duration(deadline + REPORT_GRACE)
            )))
        } else {
            None
        };
        match ended {
            None => still_running += 1,
            Some(r) => {
                settle(tx, id, machine, &r).await?;
                out.ended.push((machine, r.is_ok()));
            }
        }
    }
    let failed: i64 = tx
        .query_one(
            "SELECT count(*) FROM rollout_machine WHERE rollout_id = $1 AND state = 'failed'",
            &[&id],
        )
        .await?
        .get(0);
    if failed > i64::from(max_failures) {
        let reason = format!(
            "{failed} machines failed, more than the {max_failures} allowed; the machines still waiting were not asked"
        );
        tx.execute(
            "UPDATE rollout SET state = 'stopped', ended_at = now(), end_reason = $2 \
             WHERE rollout_id = $1",
            &[&id, &reason],
        )
        .await?;
        out.finished = Some("stopped".into());
        return Ok(out);
    }
    // Start the next ones.
    let free = (i64::from(max_parallel) - still_running).max(0);
    let mut started = 0;
    while started < free {
        let next = tx
            .query(
                "SELECT machine_id FROM rollout_machine WHERE rollout_id = $1 AND state = 'waiting' \
                 ORDER BY position LIMIT $2",
                &[&id, &(free - started)],
            )
            .await?;
        if next.is_empty() {
            break;
        }
        for row in next {
            let machine: Uuid = row.get(0);
            let actor = format!("rollout {id} ({created_by})");
            let asker = Asker {
                actor: &actor,
                action_id: Uuid::new_v4(),
                rollout_id: Some(id),
                reason: None,
            };
            // (whether asked, the generation asked, why not)
            let asked: (bool, Option<i32>, Option<String>) = match (&baseline, &erasure) {
                (Some(b), _) => {
                    let ask = servicing::Ask {
                        action_id: asker.action_id,
                        actor: &actor,
                        reason: None,
                        baseline: b,
                        forced: false,
                        rollout_id: Some(id),
                    };
                    match servicing::ask(tx, machine, &ask).await? {
                        servicing::Asked::Done { .. } => (true, None, None),
                        servicing::Asked::Refused(why) => (false, None, Some(why)),
                        servicing::Asked::NotFound => (false, None, None),
                    }
                }
                (None, e) => match match e {
                    Some(e) => installations::deprovision(tx, machine, e, &asker).await?,
                    None => installations::ask(tx, machine, &image, &asker).await?,
                } {
                    Asked::Done { generation, .. } => (true, Some(generation), None),
                    Asked::Refused(why) => (false, None, Some(why)),
                    Asked::NotFound => (false, None, None),
                },
            };
            let (state, generation, error) = match asked {
                (true, generation, _) => {
                    started += 1;
                    out.started.push(machine);
                    ("running", generation, None)
                }
                (false, _, why) => (
                    "skipped",
                    None,
                    Some(why.unwrap_or_else(|| "the machine is gone".to_string())),
                ),
            };
            tx.execute(
                "UPDATE rollout_machine SET state = $3, generation = $4, error = $5, \
                     started_at = CASE WHEN $3 = 'running' THEN now() END, \
                     ended_at = CASE WHEN $3 = 'running' THEN NULL ELSE now() END \
                 WHERE rollout_id = $1 AND machine_id = $2",
                &[&id, &machine, &state, &generation, &error],
            )
            .await?;
        }
    }
    if still_running + started == 0 {
        tx.execute(
            "UPDATE rollout SET state = 'done', ended_at = now(), \
             end_reason = 'every machine was asked and answered' WHERE rollout_id = $1",
            &[&id],
        )
        .await?;
        out.finished = Some("done".into());
    }
    Ok(out)
}

/// Records how rollout `id`'s machine ended.
async fn settle(
    tx: &mut Tx<'_>,
    id: Uuid,
    machine: Uuid,
    r: &Result<(), String>,
) -> Result<(), BmdbError> {
    let (state, error) = match r {
        Ok(()) => ("done", None),
        Err(e) => ("failed", Some(e.clone())),
    };
    tx.execute(
        "UPDATE rollout_machine SET state = $3, error = $4, ended_at = now() \
         WHERE rollout_id = $1 AND machine_id = $2",
        &[&id, &machine, &state, &error],
    )
    .await?;
    Ok(())
}

/// Cancels a running rollout: the waiting machines are skipped; those
/// installing finish (an image half written is worse than one written).
/// None when there is no such rollout; the rollout as it ends up.
pub async fn cancel(tx: &mut Tx<'_>, id: Uuid, by: &str) -> Result<Option<Rollout>, BmdbError> {
    let Some(r) = tx
        .query_opt(
            "SELECT state FROM rollout WHERE rollout_id = $1 FOR UPDATE",
            &[&id],
        )
        .await?
    else {
        return Ok(None);
    };
    if r.get::<_, String>(0) == "running" {
        tx.execute(
            "UPDATE rollout_machine SET state = 'skipped', ended_at = now(), error = $2 \
             WHERE rollout_id = $1 AND state = 'waiting'",
            &[&id, &format!("the rollout was canceled by {by}")],
        )
        .await?;
        tx.execute(
            "UPDATE rollout SET state = 'canceled', ended_at = now(), end_reason = $2 \
             WHERE rollout_id = $1",
            &[&id, &format!("canceled by {by}")],
        )
        .await?;
    }
    get(tx, id).await
}
