//! `GET /events`: the fleet as it changes, as server-sent events, for the
//! fleet page to redraw without a reload: every `LIVE_EVERY`, an event
//! `fleet` whose data is a [`Frame`] (JSON): the machines per state, the
//! agents heartbeating and silent, and the installations and erasures
//! under way with their progress. Each connection reads its own frames
//! (the tally, a range of the heartbeat index and one of the kept states':
//! a few milliseconds at a million machines), only while it is open.

use std::time::{Duration, SystemTime};

use actix_web::{HttpResponse, web};
use serde::Serialize;
use uuid::Uuid;

use super::state::Admin;
use super::text::rfc3339;
use crate::bmdb::installations::{self, UnderWay};
use crate::bmdb::machines;

/// How often a connection is sent the fleet.
pub const LIVE_EVERY: Duration = Duration::from_secs(2);

/// Installations and erasures listed at most.
pub const UNDER_WAY_SHOWN: i64 = 50;

/// One event's data.
#[derive(Serialize)]
pub struct Frame {
    pub total: i64,
    /// Machines per state (the states with none left out).
    pub counts: std::collections::BTreeMap<String, i64>,
    pub heartbeating: i64,
    pub silent: i64,
    pub under_way: Vec<Progress>,
    pub at: String,
}

/// An installation or erasure under way.
#[derive(Serialize)]
pub struct Progress {
    pub machine_id: Uuid,
    pub provider_id: Option<String>,
    /// `installing` or `cleaning`.
    pub state: String,
    /// The agent's phase (`writing`, `erasing`, …), once it reported.
    pub phase: Option<String>,
    /// How far, once the agent knows the total.
    pub percent: Option<f64>,
    /// When the agent last reported.
    pub reported_at: Option<String>,
}

impl From<&UnderWay> for Progress {
    fn from(u: &UnderWay) -> Self {
        Progress {
            machine_id: u.machine_id,
            provider_id: u.provider_id.clone(),
            state: u.state.clone(),
            phase: u.phase(),
            percent: u.percent().map(|p| (p * 10.0).round() / 10.0),
            reported_at: u.progress.as_ref().map(|(_, at)| rfc3339(*at)),
        }
    }
}

/// The fleet now, and the installations and erasures under way.
pub async fn read(admin: &Admin) -> Result<Frame, crate::bmdb::BmdbError> {
    let stale = admin.heartbeat_stale_after;
    let (tally, (heartbeating, silent), under) = admin
        .bmdb
        .snapshot(async |tx| {
            Ok((
                machines::tally(tx).await?,
                machines::agent_counts(tx, stale).await?,
                installations::under_way(tx, UNDER_WAY_SHOWN).await?,
            ))
        })
        .await?;
    Ok(Frame {
        total: tally.states.iter().map(|(_, n)| n).sum(),
        counts: tally
            .states
            .iter()
            .map(|(s, n)| (s.to_string(), *n))
            .collect(),
        heartbeating,
        silent,
        under_way: under.iter().map(Progress::from).collect(),
        at: rfc3339(SystemTime::now()),
    })
}

/// `GET /events`: the stream (see the module's note). A read that fails
/// is sent as an event `trouble` naming the cause; the stream goes on.
pub async fn events(admin: web::Data<Admin>) -> HttpResponse {
    let stream = futures::stream::unfold((admin, true), |(admin, first)| async move {
        let mut out = String::new();
        if first {
            out.push_str(&format!("retry: {}\n\n", LIVE_EVERY.as_millis() * 2));
        } else {
            actix_rt::time::sleep(LIVE_EVERY).await;
        }
        match read(&admin).await {
            Ok(frame) => {
                let json = serde_json::to_string(&frame).unwrap_or_default();
                out.push_str(&format!("event: fleet\ndata: {json}\n\n"));
            }
            Err(e) => {
                let why = e.to_string().replace('\n', " ");
                out.push_str(&format!("event: trouble\ndata: {why}\n\n"));
            }
        }
        Some((
            Ok::<_, actix_web::Error>(web::Bytes::from(out)),
            (admin, false),
        ))
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(stream)
}
