//! A project's events, and the devices round's step: each change of a
//! device's state an event, deleted devices ended once their machine is
//! erased.

use std::time::SystemTime;

use uuid::Uuid;

use super::super::{BmdbError, Tx};
use super::actions::ask_erasure;
use super::*;

/// An event of a project (and device).
pub async fn event(
    tx: &mut Tx<'_>,
    project: Uuid,
    device: Option<Uuid>,
    kind: &str,
    body: &str,
) -> Result<(), BmdbError> {
    tx.execute(
        "INSERT INTO project_event (event_id, project_id, device_id, type, body, \"timestamp\") \
         VALUES ($1, $2, $3, $4, $5, clock_timestamp())",
        &[&Uuid::new_v4(), &project, &device, &kind, &body],
    )
    .await?;
    Ok(())
}

/// An event as the Metal API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: Uuid,
    pub project_id: Uuid,
    pub device_id: Option<Uuid>,
    pub kind: String,
    pub body: String,
    pub at: SystemTime,
}

/// Which events: a project's, a device's, or one.
#[derive(Debug, Clone, Copy)]
pub enum Events {
    Project(Uuid),
    Device(Uuid),
    One(Uuid),
    /// Every project's (an operator's view), or those of `Some` project.
    All(Option<Uuid>),
}

/// A page of events, newest first, and how many there are in all.
pub async fn events(
    tx: &mut Tx<'_>,
    which: Events,
    offset: i64,
    limit: i64,
) -> Result<(Vec<Event>, i64), BmdbError> {
    macro_rules! events_in {
        ($cond:literal) => {
            (
                concat!(
                    "SELECT event_id, project_id, device_id, type, body, \"timestamp\" \
                     FROM project_event WHERE ",
                    $cond,
                    " ORDER BY \"timestamp\" DESC, event_id OFFSET $2 LIMIT $3"
                ),
                concat!("SELECT count(*) FROM project_event WHERE ", $cond),
            )
        };
    }
    let ((list, count), id): ((&'static str, &'static str), Option<Uuid>) = match which {
        Events::Project(p) => (events_in!("project_id = $1"), Some(p)),
        Events::Device(d) => (events_in!("device_id = $1"), Some(d)),
        Events::One(e) => (events_in!("event_id = $1"), Some(e)),
        Events::All(p) => (events_in!("($1::uuid IS NULL OR project_id = $1)"), p),
    };
    let rows = tx.query(list, &[&id, &offset, &limit]).await?;
    // The count has no $2 and $3: its own parameters.
    let total: i64 = tx.query_one(count, &[&id]).await?.get(0);
    Ok((
        rows.iter()
            .map(|r| Event {
                id: r.get(0),
                project_id: r.get(1),
                device_id: r.get(2),
                kind: r.get(3),
                body: r.get(4),
                at: r.get(5),
            })
            .collect(),
        total,
    ))
}

/// What one pass of the devices round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Advanced {
    /// Devices whose state changed: device, from, to.
    pub changed: Vec<(Uuid, Option<String>, String)>,
    /// Deleted devices whose erasure was asked now.
    pub erasures_asked: Vec<Uuid>,
    /// Deleted devices whose machine was erased: gone.
    pub ended: Vec<Uuid>,
}

/// The devices round: asks the erasure of deleted devices that could not
/// be asked before, ends those whose erasure succeeded (their machine is
/// available again), and writes every change of a device's Metal state as
/// an event. Locks what it changes, so shepherds may run it side by side.
pub async fn advance(tx: &mut Tx<'_>) -> Result<Advanced, BmdbError> {
    let mut out = Advanced::default();
    let sql = concat!(
        device_select!(),
        "WHERE d.deleted_at IS NULL AND d.device_id IN (SELECT device_id FROM device \
           WHERE deleted_at IS NULL FOR UPDATE SKIP LOCKED)"
    );
    let rows = tx.query(sql, &[]).await?;
    for r in &rows {
        let d = device_from(r);
        let f = &d.facts;
        if f.deleting && f.erase_generation.is_none() {
            if ask_erasure(tx, d.id, d.machine_id, &d.deleted_by, &d.erase_mode)
                .await?
                .is_none()
            {
                out.erasures_asked.push(d.id);
            }
            continue;
        }
        let succeeded = |g: i32| f.report.as_ref() == Some(&(g, "Success".to_string()));
        let erased = f.deleting && f.erase_generation.is_some_and(succeeded);
        // An operator's erasure of the machine under a device (a
        // deprovisioning, not the device's delete) ends it too.
        let reclaimed = !f.deleting
            && f.install_generation.is_some_and(|asked| {
                f.installation
                    .as_ref()
                    .is_some_and(|(g, kind)| *g > asked && *kind == Kind::Erase && succeeded(*g))
            });
        if erased || reclaimed {
            tx.execute(
                "UPDATE device SET deleted_at = now(), last_state = 'deleted' WHERE device_id = $1",
                &[&d.id],
            )
            .await?;
            tx.execute("DELETE FROM device_port WHERE device_id = $1", &[&d.id])
                .await?;
            event(
                tx,
                d.project_id,
                Some(d.id),
                "instance.deprovisioned",
                &format!(
                    "{}: its machine's disks are erased; the device is gone",
                    d.hostname
                ),
            )
            .await?;
            out.ended.push(d.id);
            continue;
        }
        let state = d.state();
        if f.last_state.as_deref() != Some(state) {
            tx.execute(
                "UPDATE device SET last_state = $2 WHERE device_id = $1",
                &[&d.id, &state],
            )
            .await?;
            // The first look at a new device is no change to tell.
            if f.last_state.is_some() || state != "queued" {
                event(
                    tx,
                    d.project_id,
                    Some(d.id),
                    &format!("instance.{state}"),
                    &format!("{} is {state}", d.hostname),
                )
                .await?;
            }
            if state == "active" && f.reinstalling {
                tx.execute(
                    "UPDATE device SET reinstalling = false WHERE device_id = $1",
                    &[&d.id],
                )
                .await?;
            }
            out.changed
                .push((d.id, f.last_state.clone(), state.to_string()));
        }
    }
    Ok(out)
}
