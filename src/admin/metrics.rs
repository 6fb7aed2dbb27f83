//! The `/metrics` scrape: the process's own series (its registry) and the
//! fleet's, read from the BMDB and the supervisor at each scrape.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use actix_web::{HttpResponse, web};

use super::api;
use super::handlers::status;
use super::request::internal;
use super::state::Admin;
use crate::bmdb::machines::{self, MachineState};
use crate::control::MailboxStatus;

pub type Labels = Vec<(&'static str, String)>;

/// Series read at scrape time, registered into a registry of the scrape's.
pub struct Scrape(Registry);

impl Scrape {
    fn gauge(&mut self, name: &str, help: &str, value: i64) {
        let g: Gauge = Gauge::default();
        g.set(value);
        self.0.register(name, help, g);
    }

    fn gauges(&mut self, name: &str, help: &str, values: impl IntoIterator<Item = (Labels, i64)>) {
        let f: Family<Labels, Gauge> = Family::default();
        for (l, v) in values {
            f.get_or_create(&l).set(v);
        }
        self.0.register(name, help, f);
    }

    /// Counters kept elsewhere (a mailbox's tallies), as of now. `name`
    /// without `_total`.
    fn counters(
        &mut self,
        name: &str,
        help: &str,
        values: impl IntoIterator<Item = (Labels, u64)>,
    ) {
        let f: Family<Labels, Counter> = Family::default();
        for (l, v) in values {
            f.get_or_create(&l).inc_by(v);
        }
        self.0.register(name, help, f);
    }
}

/// The series read from the BMDB.
pub fn fleet_samples(
    p: &mut Scrape,
    sessions: i64,
    backoffs: &[(String, i64)],
    counts: &[(MachineState, i64)],
    heartbeating: i64,
    silent: i64,
    brake: Option<&crate::bmdb::brake::BrakeState>,
) {
    p.gauge(
        "shepherd_bmdb_sessions",
        "BMDB sessions alive (all shepherd processes)",
        sessions,
    );
    p.gauges(
        "shepherd_active_backoffs",
        "Machines backed off now, per process",
        // The processes that back off, at 0 when none is.
        ["ShepherdAgentStart", "ShepherdRecovery"]
            .into_iter()
            .filter(|p| !backoffs.iter().any(|(b, _)| b == p))
            .map(|p| (labels(&[("process", p)]), 0))
            .chain(
                backoffs
                    .iter()
                    .map(|(process, n)| (labels(&[("process", process)]), *n)),
            ),
    );
    p.gauges(
        "shepherd_agents",
        "Machines with a started agent, heartbeating or silent",
        [
            (labels(&[("state", "heartbeating")]), heartbeating),
            (labels(&[("state", "silent")]), silent),
        ],
    );
    p.gauges(
        "shepherd_machines",
        "Machines per state",
        MachineState::ALL.iter().map(|s| {
            let n = counts
                .iter()
                .find(|(c, _)| c == s)
                .map(|(_, n)| *n)
                .unwrap_or(0);
            (labels(&[("state", s.as_str())]), n)
        }),
    );
    if let Some(b) = brake {
        p.gauge(
            "shepherd_recovery_brake_engaged",
            "Whether the recovery brake holds: no power action for silence until it lets go or an operator releases it",
            b.engaged as i64,
        );
        p.gauge(
            "shepherd_silent_machines",
            "Machines judged silent now (their callback endpoint served for the whole threshold), held ones excepted",
            b.silent,
        );
        p.gauge(
            "shepherd_recovery_brake_limit",
            "The most silent machines, and power actions for silence in the window, before the brake holds",
            b.limit,
        );
        p.gauge(
            "shepherd_recovery_power_actions_in_window",
            "Power actions for silence within the brake's window (all shepherds)",
            b.power_actions_in_window,
        );
    }
}

pub fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// A mailbox's labels: `process`, and `loop` when a second loop works
/// under the same process (`"ShepherdAgentStart/enroller"`: the Enroller
/// beside the Initializer's takeovers).
fn loop_labels(name: &str) -> Labels {
    match name.split_once('/') {
        Some((process, lp)) => labels(&[("process", process), ("loop", lp)]),
        None => labels(&[("process", name)]),
    }
}

/// A counter family over the mailboxes: one series per process and per
/// (label value, count) that `values` gives for its status.
pub fn mailbox_counters(
    p: &mut Scrape,
    mailboxes: &[(&str, &Option<MailboxStatus>)],
    (name, help, label): (&str, &str, &'static str),
    values: impl Fn(&MailboxStatus) -> Vec<(&'static str, u64)>,
) {
    let mut series = Vec::new();
    for (process, m) in mailboxes {
        if let Some(m) = m {
            for (value, n) in values(m) {
                let mut l = loop_labels(process);
                l.push((label, value.to_string()));
                series.push((l, n));
            }
        }
    }
    p.counters(name, help, series);
}

pub fn mailbox_samples(p: &mut Scrape, mailboxes: &[(&str, &Option<MailboxStatus>)]) {
    mailbox_counters(
        p,
        mailboxes,
        (
            "shepherd_leases",
            "Work leases by process and how they ended (this process)",
            "event",
        ),
        |m| {
            vec![
                ("started", m.leased),
                ("finished", m.finished),
                ("failed", m.failed),
                ("canceled", m.aborted),
            ]
        },
    );
    mailbox_counters(
        p,
        mailboxes,
        (
            "shepherd_lease_selections",
            "Lease attempts of a control loop by outcome: a machine leased, nothing to lease, or a pick lost to another leaser (this process)",
            "result",
        ),
        |m| {
            vec![
                ("leased", m.leased),
                ("nothing", m.idle_polls),
                ("lost", m.conflicts),
            ]
        },
    );
    for (name, help, value) in [
        (
            "shepherd_mailbox_running",
            "Workers running now, per control loop",
            (|m: &MailboxStatus| m.running) as fn(&MailboxStatus) -> usize,
        ),
        (
            "shepherd_mailbox_parallelism",
            "Workers allowed at once, per control loop",
            |m: &MailboxStatus| m.parallelism,
        ),
    ] {
        let values = mailboxes
            .iter()
            .filter_map(|(process, m)| m.as_ref().map(|m| (loop_labels(process), value(m) as i64)));
        p.gauges(name, help, values);
    }
}

pub const SESSIONS_ALIVE: &str = "SELECT count(*) FROM sessions WHERE session_deadline > now()";
pub const ACTIVE_BACKOFFS: &str =
    "SELECT process::text, count(*) FROM work_backoff WHERE until > now() GROUP BY process";

/// OpenMetrics text for Prometheus.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses(
        (status = 200, description = "the series", body = String, content_type = "application/openmetrics-text"),
        (status = 401, description = "a bearer token is required", body = api::ErrorBody),
        (status = 500, description = "encoding failed", body = api::ErrorBody)))]
pub async fn metrics(admin: web::Data<Admin>) -> HttpResponse {
    let db = admin
        .bmdb
        .snapshot(async |tx| {
            let sessions: i64 = tx.query_one(SESSIONS_ALIVE, &[]).await?.get(0);
            let backoffs: Vec<(String, i64)> = tx
                .query(ACTIVE_BACKOFFS, &[])
                .await?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            let counts = machines::fleet_counts(tx).await?;
            let agents = machines::agent_counts(tx, admin.heartbeat_stale_after).await?;
            let brake = match &admin.judge {
                Some(j) => Some(crate::bmdb::brake::state(tx, j).await?),
                None => None,
            };
            let endpoints = crate::bmdb::callback::endpoints(tx).await?;
            let oldest_boot = crate::bmdb::bmc_boot::oldest_request_age(tx).await?;
            Ok((
                sessions,
                backoffs,
                counts,
                agents,
                brake,
                (endpoints, oldest_boot),
            ))
        })
        .await;
    let st = status(&admin).await;
    let mut p = Scrape(Registry::default());
    // What this process knows by itself is served while the BMDB is away
    // (a restart, a failover): that is when it is looked at.
    p.gauge(
        "shepherd_bmdb_up",
        "Whether the BMDB answered this scrape's queries",
        db.is_ok() as i64,
    );
    p.gauge(
        "shepherd_session_up",
        "Whether this process holds a live session",
        st.session.is_some() as i64,
    );
    p.counters(
        "shepherd_sessions",
        "BMDB sessions this process opened, and lost (ended other than by its own shutdown)",
        [
            (labels(&[("event", "opened")]), st.sessions_opened),
            (labels(&[("event", "lost")]), st.sessions_lost),
        ],
    );
    let tx = admin.bmdb.counters();
    p.counters(
        "shepherd_bmdb_transactions",
        "BMDB transactions of this process by outcome: committed, run again after a conflict or a lost connection, commit outcome unknown (connection lost during COMMIT), failed",
        [
            ("committed", tx.committed),
            ("retried-conflict", tx.retried_conflict),
            ("retried-connection", tx.retried_connection),
            ("commit-unknown", tx.commit_unknown),
            ("failed", tx.failed),
        ]
        .map(|(o, n)| (labels(&[("outcome", o)]), n)),
    );
    mailbox_samples(
        &mut p,
        &[
            ("ShepherdAgentStart", &st.initializer),
            ("ShepherdAgentStart/enroller", &st.enroller),
            ("ShepherdRecovery", &st.recoverer),
        ],
    );
    match db {
        Ok((
            sessions,
            backoffs,
            counts,
            (heartbeating, silent),
            brake,
            (endpoints, oldest_boot),
        )) => {
            p.gauge(
                "shepherd_boot_request_oldest_seconds",
                "How long the oldest boot into the live agent through a BMC has been asked for and not done (held machines excepted; 0 when none is): machines stuck enrolling",
                oldest_boot.as_secs() as i64,
            );
            p.gauges(
                "shepherd_callback_endpoint_agents",
                "Agents told each callback endpoint at their takeover, by whether a shepherd serves it now (agents of an endpoint nobody serves are not heard, and are re-homed after recoverer.rehome_after)",
                endpoints.iter().map(|e| {
                    (
                        labels(&[
                            ("endpoint", e.endpoint.as_str()),
                            ("served", if e.served { "true" } else { "false" }),
                        ]),
                        e.agents,
                    )
                }),
            );
            fleet_samples(
                &mut p,
                sessions,
                &backoffs,
                &counts,
                heartbeating,
                silent,
                brake.as_ref(),
            );
        }
        Err(e) => {
            tracing::debug!(error = %e, "/metrics: the BMDB did not answer; serving this process's own series")
        }
    }
    if let Some(budget) = &admin.equinix {
        let used = budget.metrics.last_hour();
        p.gauge(
            "shepherd_equinix_requests_last_hour",
            "Equinix API requests this process made in the last 60 minutes",
            used.requests as i64,
        );
        p.gauge(
            "shepherd_equinix_throttled_last_hour",
            "Equinix API requests answered 429 (rate limited) in the last 60 minutes",
            used.throttled as i64,
        );
        p.gauge(
            "shepherd_equinix_budget_per_hour",
            "Equinix API requests an hour this process can make at most (its client's interval and parallelism)",
            budget.per_hour() as i64,
        );
    }
    if let Some(prov) = &st.provisioner {
        p.gauge(
            "shepherd_provisioner_discrepancies",
            "Machines in the BMDB the provider no longer lists",
            prov.counters.missing_in_provider.len() as i64,
        );
        p.counters(
            "shepherd_provisioner_machines",
            "Machines created or adopted by the provisioner",
            [
                (labels(&[("how", "created")]), prov.counters.created),
                (labels(&[("how", "adopted")]), prov.counters.adopted),
            ],
        );
    }
    let mut body = String::new();
    let encoded = prometheus_client::encoding::text::encode_registry(&mut body, &admin.registry)
        .and_then(|()| prometheus_client::encoding::text::encode_registry(&mut body, &p.0))
        .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut body));
    if let Err(e) = encoded {
        return internal(format!("encoding metrics: {e}"));
    }
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(body)
}
