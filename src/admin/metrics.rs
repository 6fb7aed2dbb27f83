//! The `/metrics` scrape: the process's own series (its registry) and the
//! fleet's, read from the BMDB and the supervisor at each scrape.

use prometheus_client::registry::{Registry, Unit};

use actix_web::{HttpResponse, web};

use super::api;
use super::handlers::status;
use super::request::internal;
use super::scrape::{Labels, Scrape, labels};
use super::state::Admin;
use crate::bmdb::Process;
use crate::bmdb::machines::{self, MachineState};
use crate::control::{LoopKind, LoopStatus};

/// The series read from the BMDB.
pub fn fleet_samples(
    p: &mut Scrape,
    sessions: i64,
    backoffs: &[(Process, i64)],
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
        Process::SHEPHERD
            .into_iter()
            .filter(|p| !backoffs.iter().any(|(b, _)| b == p))
            .map(|p| (labels(&[("process", p.as_str())]), 0))
            .chain(
                backoffs
                    .iter()
                    .map(|(process, n)| (labels(&[("process", process.as_str())]), *n)),
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

/// The tenants' series: projects, tokens, devices per Metal state.
fn tenant_samples(p: &mut Scrape, t: &crate::bmdb::devices::TenantCounts) {
    p.gauge(
        "shepherd_projects",
        "Tenants' projects (the Metal API's)",
        t.projects,
    );
    p.gauges(
        "shepherd_api_tokens",
        "Projects' API tokens, live or revoked",
        [
            (labels(&[("status", "live")]), t.tokens_live),
            (labels(&[("status", "revoked")]), t.tokens_revoked),
        ],
    );
    p.gauges(
        "shepherd_devices",
        "Tenants' devices per Metal API state, as the devices round last saw them",
        crate::bmdb::devices::METAL_STATES.iter().map(|s| {
            let n = t
                .devices
                .iter()
                .find(|(d, _)| d == s)
                .map_or(0, |(_, n)| *n);
            (labels(&[("state", s)]), n)
        }),
    );
}

/// A lease loop's labels on the lease series: `process`, and `loop` when
/// it works under another loop's process (the Enroller beside the
/// Initializer's takeovers).
fn lease_labels(l: &LoopStatus) -> Labels {
    let process = l.process.unwrap_or("");
    if l.shares_process {
        labels(&[("process", process), ("loop", l.name)])
    } else {
        labels(&[("process", process)])
    }
}

/// A counter family over `loops`: one series per loop (labelled by
/// `labels_of`) and per (label value, count) that `values` gives.
fn loop_counters<'a>(
    p: &mut Scrape,
    loops: impl Iterator<Item = &'a LoopStatus>,
    labels_of: fn(&LoopStatus) -> Labels,
    (name, help, label): (&str, &str, &'static str),
    values: impl Fn(&LoopStatus) -> Vec<(&'static str, u64)>,
) {
    let mut series = Vec::new();
    for l in loops {
        for (value, n) in values(l) {
            let mut labels = labels_of(l);
            labels.push((label, value.to_string()));
            series.push((labels, n));
        }
    }
    p.counters(name, help, series);
}

fn loop_label(l: &LoopStatus) -> Labels {
    labels(&[("loop", l.name), ("kind", l.kind.as_str())])
}

/// Every registered loop's series, the same for each (as
/// controller-runtime exports its reconcile counts for every
/// controller), then the lease loops' lease series.
pub fn loop_samples(p: &mut Scrape, loops: &[LoopStatus]) {
    loop_counters(
        p,
        loops.iter(),
        loop_label,
        (
            "shepherd_loop_runs",
            "Work (a lease loop: one machine's; a round loop: a round) ended by each control loop, by result: ok, failed, or given back (cancelled, or cut short by a lost session) (this process)",
            "result",
        ),
        |l| {
            vec![
                ("ok", l.done),
                ("failed", l.failed),
                ("given-back", l.given_back),
            ]
        },
    );
    for (name, help, value) in [
        (
            "shepherd_loop_active_workers",
            "Work running now, per control loop (a round under way is 1)",
            (|l: &LoopStatus| l.running as i64) as fn(&LoopStatus) -> i64,
        ),
        (
            "shepherd_loop_max_workers",
            "Work allowed at once, per control loop",
            |l: &LoopStatus| l.parallelism as i64,
        ),
        (
            "shepherd_loop_up",
            "Whether a control loop takes work now (it has a session and is not draining)",
            |l: &LoopStatus| l.active as i64,
        ),
        (
            "shepherd_loop_last_failure_timestamp_seconds",
            "When a control loop last failed (Unix time; 0: not since this process started); its cause is on the fleet page and in /api/v1/loops",
            |l: &LoopStatus| {
                l.last_error
                    .as_ref()
                    .and_then(|(at, _)| at.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_secs() as i64)
                    .unwrap_or(0)
            },
        ),
    ] {
        p.gauges(name, help, loops.iter().map(|l| (loop_label(l), value(l))));
    }

    p.histograms(
        "shepherd_loop_duration",
        "How long each control loop's work took (a lease loop: one machine's, from its worker's start to its end; a round loop: a round) (this process)",
        Unit::Seconds,
        loops.iter().map(|l| (loop_label(l), l.durations.clone())),
    );

    let leases = || loops.iter().filter(|l| l.kind == LoopKind::Lease);
    loop_counters(
        p,
        leases(),
        lease_labels,
        (
            "shepherd_leases",
            "Work leases by process and how they ended (this process)",
            "event",
        ),
        |l| {
            vec![
                ("started", l.leased),
                ("finished", l.done),
                ("failed", l.failed),
                ("canceled", l.given_back),
            ]
        },
    );
    loop_counters(
        p,
        leases(),
        lease_labels,
        (
            "shepherd_lease_selections",
            "Lease attempts of a control loop by outcome: a machine leased, nothing to lease, or a pick lost to another leaser (this process)",
            "result",
        ),
        |l| {
            vec![
                ("leased", l.leased),
                ("nothing", l.idle_polls),
                ("lost", l.conflicts),
            ]
        },
    );
}

/// OpenMetrics text for Prometheus.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses(
        (status = 200, description = "the series", body = String, content_type = "application/openmetrics-text"),
        (status = 500, description = "encoding failed", body = api::ErrorBody)))]
pub async fn metrics(admin: web::Data<Admin>) -> HttpResponse {
    let db = admin
        .bmdb
        .snapshot(async |tx| {
            let sessions = crate::bmdb::overview::sessions_alive(tx).await?;
            let backoffs = crate::bmdb::overview::active_backoffs(tx).await?;
            let counts = machines::fleet_counts(tx).await?;
            let agents = machines::agent_counts(tx, admin.heartbeat_stale_after).await?;
            let brake = match &admin.judge {
                Some(j) => Some(crate::bmdb::brake::state(tx, j).await?),
                None => None,
            };
            let endpoints = crate::bmdb::callback::endpoints(tx).await?;
            let oldest_boot = crate::bmdb::bmc_boot::oldest_request_age(tx).await?;
            let tenants = crate::bmdb::devices::tenant_counts(tx).await?;
            let secure_boot = crate::bmdb::hardware::secure_boot_counts(tx).await?;
            let firmware = crate::bmdb::firmware::versions(tx).await?;
            let below = if admin.baselines.is_empty() {
                Vec::new()
            } else {
                crate::bmdb::firmware::below(tx, None, admin.baselines.needs_reports()).await?
            };
            let switches = crate::bmdb::switches::switches(tx).await?;
            Ok((
                sessions,
                backoffs,
                counts,
                agents,
                brake,
                (
                    endpoints,
                    oldest_boot,
                    tenants,
                    secure_boot,
                    firmware,
                    below,
                    switches,
                ),
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
    p.counter(
        "shepherd_bmdb_statements",
        "BMDB statements this process ran, BEGIN and COMMIT aside",
        tx.statements,
    );
    loop_samples(&mut p, &st.loops);
    match db {
        Ok((
            sessions,
            backoffs,
            counts,
            (heartbeating, silent),
            brake,
            (endpoints, oldest_boot, tenants, secure_boot, firmware, below, switches),
        )) => {
            tenant_samples(&mut p, &tenants);
            super::network::switch_samples(&mut p, &switches);
            let survey = admin.baselines.survey(&below);
            p.gauges(
                "shepherd_baseline_machines",
                "Machines each baseline selects, by how they stand against it: conforming, drifting, unread (their firmware never read)",
                survey.baselines.iter().flat_map(|b| {
                    [
                        ("conforming", b.conforming),
                        ("drifting", b.drifting),
                        ("unread", b.unread),
                    ]
                    .map(|(c, n)| {
                        (
                            labels(&[("baseline", &b.baseline), ("conformance", c)]),
                            n as i64,
                        )
                    })
                }),
            );
            p.gauges(
                "shepherd_machines_by_firmware",
                "Machines per firmware component and version, as their BMCs list them (bios, bmc, nic:<Id>, inventory:<Id>)",
                firmware.iter().map(|(component, version, n)| {
                    (
                        labels(&[("component", component), ("version", version)]),
                        *n,
                    )
                }),
            );
            p.gauges(
                "shepherd_machines_secure_boot",
                "Machines whose BMC was read, by Secure Boot as the BMC says (on, off; unknown: an IPMI BMC, or none offered)",
                secure_boot
                    .iter()
                    .map(|(state, n)| (labels(&[("state", state)]), *n)),
            );
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
    if let Some(prov) = st
        .loop_named("provisioner")
        .and_then(|l| l.counters::<crate::provisioner::ProvisionerCounters>())
    {
        p.gauge(
            "shepherd_provisioner_discrepancies",
            "Machines in the BMDB the provider no longer lists",
            prov.missing_in_provider.len() as i64,
        );
        p.counters(
            "shepherd_provisioner_machines",
            "Machines created or adopted by the provisioner",
            [
                (labels(&[("how", "created")]), prov.created),
                (labels(&[("how", "adopted")]), prov.adopted),
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
