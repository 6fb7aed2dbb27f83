//! The fleet listing: one summary row a machine (its state, provider
//! record, agent and backoffs), filtered, paged and counted.

use super::*;

/// One row of the fleet listing.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineSummary {
    pub machine_id: Uuid,
    pub provider: Option<Provider>,
    pub provider_id: Option<String>,
    pub address: Option<String>,
    pub provider_status: Option<ProviderStatus>,
    pub state: MachineState,
    pub agent_heartbeat: Option<SystemTime>,
}

impl MachineSummary {
    pub(super) fn from_row(r: &tokio_postgres::Row) -> Self {
        MachineSummary {
            machine_id: r.get(0),
            provider: r.get(1),
            provider_id: r.get(2),
            address: r.get(3),
            provider_status: r.get(4),
            state: MachineState::parse(r.get(5)).unwrap_or(MachineState::Unprovided),
            agent_heartbeat: r.get(6),
        }
    }
}

macro_rules! fleet_query {
    ($filter:literal) => {
        concat!(
            "SELECT *, count(*) OVER () FROM (SELECT m.machine_id, p.provider, p.provider_id, \
                    p.provider_ip_address, p.provider_status, ",
            state_column!(),
            ", s.agent_heartbeat_at, s.agent_started_at \
             FROM machines m \
             JOIN machine_summary s ON s.machine_id = m.machine_id \
             LEFT JOIN machine_provided p ON p.machine_id = m.machine_id) f ",
            $filter,
            " ORDER BY provider_id NULLS LAST, machine_id LIMIT $1 OFFSET $2"
        )
    };
}
const FLEET_FILTERED: &str = fleet_query!(
    "WHERE ($3::text IS NULL OR state = $3) \
       AND ($4::provider_status IS NULL OR provider_status = $4) \
       AND ($5::text IS NULL OR CASE $5 \
             WHEN 'heartbeating' THEN agent_heartbeat_at > now() - make_interval(secs => $6) \
             WHEN 'silent' THEN agent_started_at IS NOT NULL AND (agent_heartbeat_at IS NULL \
                  OR agent_heartbeat_at <= now() - make_interval(secs => $6)) \
             ELSE agent_started_at IS NULL END) \
       AND ($7::text IS NULL OR machine_id::text LIKE $7 || '%' \
             OR provider_id ILIKE '%' || $7 || '%' ESCAPE '\\' \
             OR provider_ip_address LIKE $7 || '%' ESCAPE '\\')"
);
const FLEET_COUNTS: &str = concat!(
    "SELECT state, count(*) FROM (SELECT ",
    state_column!(),
    " FROM machine_summary s LEFT JOIN machine_provided p ON p.machine_id = s.machine_id) f GROUP BY state"
);

/// Whether a machine's agent heartbeats, as the fleet page filters it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heartbeat {
    /// A heartbeat within the staleness threshold.
    Heartbeating,
    /// An agent started, with no heartbeat within it.
    Silent,
    /// No agent started.
    NoAgent,
}

impl Heartbeat {
    pub const ALL: [Heartbeat; 3] = [
        Heartbeat::Heartbeating,
        Heartbeat::Silent,
        Heartbeat::NoAgent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Heartbeat::Heartbeating => "heartbeating",
            Heartbeat::Silent => "silent",
            Heartbeat::NoAgent => "no-agent",
        }
    }

    pub fn parse(s: &str) -> Option<Heartbeat> {
        Self::ALL.into_iter().find(|h| h.as_str() == s)
    }
}

/// Which machines a fleet listing shows. Default: all.
#[derive(Debug, Clone, Default)]
pub struct FleetFilter {
    pub state: Option<MachineState>,
    pub provider_status: Option<ProviderStatus>,
    pub heartbeat: Option<Heartbeat>,
    /// A heartbeat older than this is silent.
    pub stale_after: std::time::Duration,
    /// A machine ID's prefix, part of a provider ID (any case), or an
    /// address's prefix.
    pub search: Option<String>,
}

/// A page of the fleet, in provider ID order, with the number of machines
/// the filter matches.
pub async fn fleet_page(
    tx: &mut Tx<'_>,
    filter: &FleetFilter,
    limit: i64,
    offset: i64,
) -> Result<(Vec<MachineSummary>, i64), BmdbError> {
    let search = filter
        .search
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_")
                .to_lowercase()
        });
    let rows = tx
        .query(
            FLEET_FILTERED,
            &[
                &limit,
                &offset,
                &filter.state.map(|s| s.as_str()),
                &filter.provider_status,
                &filter.heartbeat.map(|h| h.as_str()),
                &filter.stale_after.as_secs_f64(),
                &search,
            ],
        )
        .await?;
    let total = rows.first().map(|r| r.get(8)).unwrap_or(0);
    Ok((rows.iter().map(MachineSummary::from_row).collect(), total))
}

/// Machines per state.
const AGENT_COUNTS: &str = "SELECT \
       count(*) FILTER (WHERE h.agent_heartbeat_at > now() - make_interval(secs => $1)), \
       count(*) FILTER (WHERE h.agent_heartbeat_at IS NULL \
                          OR h.agent_heartbeat_at <= now() - make_interval(secs => $1)) \
     FROM machine_agent_started a LEFT JOIN machine_agent_heartbeat h ON h.machine_id = a.machine_id";

/// Machines with a started agent: (heartbeating within `fresh`, silent).
pub async fn agent_counts(
    tx: &mut Tx<'_>,
    fresh: std::time::Duration,
) -> Result<(i64, i64), BmdbError> {
    let r = tx.query_one(AGENT_COUNTS, &[&fresh.as_secs_f64()]).await?;
    Ok((r.get(0), r.get(1)))
}

pub async fn fleet_counts(tx: &mut Tx<'_>) -> Result<Vec<(MachineState, i64)>, BmdbError> {
    let rows = tx.query(FLEET_COUNTS, &[]).await?;
    let mut out: Vec<(MachineState, i64)> = rows
        .iter()
        .filter_map(|r| Some((MachineState::parse(r.get(0))?, r.get(1))))
        .collect();
    out.sort_by_key(|(s, _)| MachineState::ALL.iter().position(|x| x == s));
    Ok(out)
}
