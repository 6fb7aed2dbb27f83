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

/// The listing's columns, over `machine_summary s` and `machine_provided p`.
/// The state is derived anew for the rows shown (`machine_state`), so a
/// backoff that ran out a moment ago shows as over.
macro_rules! listed_columns {
    () => {
        "s.machine_id, s.provider, s.provider_id, s.address, p.provider_status, \
         machine_state(s) AS state, s.agent_heartbeat_at"
    };
}

/// The listing's tables: `machine_summary s` with `machine_provided p`.
macro_rules! listed_tables {
    () => {
        "machine_summary s LEFT JOIN machine_provided p ON p.machine_id = s.machine_id"
    };
}

/// The listing's rows.
macro_rules! listed_from {
    () => {
        concat!("SELECT ", listed_columns!(), " FROM ", listed_tables!())
    };
}

/// One machine's listing row ($1).
macro_rules! fleet_one {
    () => {
        concat!(listed_from!(), " WHERE s.machine_id = $1")
    };
}

const LISTED_FROM: &str = listed_from!();

/// A page's end, never past the largest bigint whatever offset is asked.
const PAGE_END: &str = "$1::bigint + LEAST($2::bigint, 9223372036854775807 - $1::bigint)";

/// The whole fleet in provider ID order ($1 limit, $2 offset, the filters
/// from $3): a walk of `machine_summary_listing` that stops at the page's
/// end, or a read of a rare filter's index and a sort of what it found.
fn fleet_all(conditions: &[String]) -> String {
    format!(
        "{LISTED_FROM} WHERE {} ORDER BY s.provider_id, s.machine_id LIMIT $1 OFFSET $2",
        and(conditions)
    )
}

/// In state $3 as kept by the summary's trigger, still true…
const KEPT_STATE: &str = "s.state = $3 AND (s.state_until IS NULL OR s.state_until > now())";
/// …or derived anew where a backoff ran out since it was kept (few: the
/// fleet-tally round settles them).
const SETTLED_STATE: &str = "s.state_until <= now() AND machine_state(s) = $3";

/// The machines in one state ($3; $1 limit, $2 offset, the filters from
/// $4): those whose kept state holds, from `machine_summary_listing_state`,
/// merged with those whose backoff ran out since it was kept, in order.
/// Each side stops at the page's end (a walk of its index, not a sort of
/// every machine in the state).
fn fleet_in_state(conditions: &[String]) -> String {
    let c = and(conditions);
    format!(
        "SELECT * FROM (({LISTED_FROM} WHERE {KEPT_STATE} AND {c} \
           ORDER BY s.provider_id, s.machine_id LIMIT {PAGE_END}) \
         UNION ALL ({LISTED_FROM} WHERE {SETTLED_STATE} AND {c} \
           ORDER BY s.provider_id, s.machine_id LIMIT {PAGE_END})) f \
         ORDER BY provider_id, machine_id LIMIT $1 OFFSET $2"
    )
}

/// Machines a filter with more than a state matches, numbered as the page
/// is ($1 the cap, $2 no offset, the state at $3 when `in_state`, the
/// filters after), counted up to [`MATCHING_CAP`] (one more, to tell the
/// cap was passed).
fn matching(conditions: &[String], in_state: bool) -> String {
    let state = if in_state {
        format!("(({KEPT_STATE}) OR ({SETTLED_STATE})) AND ")
    } else {
        String::new()
    };
    format!(
        "SELECT count(*) FROM (SELECT 1 FROM {} \
          WHERE {state}{} LIMIT $1::bigint + 1 OFFSET $2::bigint) c",
        listed_tables!(),
        and(conditions)
    )
}

/// Conditions joined by AND (none: true).
fn and(conditions: &[String]) -> String {
    if conditions.is_empty() {
        "true".into()
    } else {
        conditions.join(" AND ")
    }
}

/// A filtered listing counts its matches up to this; past it the fleet
/// page says "more than".
pub const MATCHING_CAP: i64 = 10_000;

/// Machines per key (a state's name, or `agents`): the tally, its pending
/// deltas, and the rows whose kept state a backoff's end made stale.
const TALLY: &str = "SELECT key, sum(n)::bigint FROM ( \
       SELECT key, n FROM machine_tally \
       UNION ALL SELECT key, n FROM machine_tally_delta \
       UNION ALL SELECT state, -1 FROM machine_summary WHERE state_until <= now() \
       UNION ALL SELECT machine_state(s), 1 FROM machine_summary s WHERE state_until <= now()) t \
     GROUP BY key";

/// Agents started whose heartbeat is older than $1 seconds, or absent:
/// a range of `machine_summary_agent_heartbeat` (the silent few).
const SILENT: &str = "SELECT count(*) FROM machine_summary \
     WHERE agent_started_at IS NOT NULL \
       AND (agent_heartbeat_at IS NULL OR agent_heartbeat_at <= now() - make_interval(secs => $1))";

/// Settles the rows whose backoff ran out (their state is derived anew by
/// the summary's trigger), a thousand at most, skipping rows others hold.
const SETTLE_STATES: &str = "UPDATE machine_summary SET state_until = NULL \
     WHERE machine_id IN (SELECT machine_id FROM machine_summary WHERE state_until <= now() \
                          ORDER BY state_until LIMIT 1000 FOR UPDATE SKIP LOCKED)";
/// Folds the pending deltas into the tally, by one shepherd at a time
/// (the others skip: the lock is tried, not waited for).
const FOLD_LOCK: &str = "SELECT pg_try_advisory_xact_lock(hashtext('machine_tally'))";
const FOLD_TALLY: &str = "WITH d AS (DELETE FROM machine_tally_delta RETURNING key, n), \
          f AS (INSERT INTO machine_tally (key, n) SELECT key, sum(n) FROM d GROUP BY key ORDER BY key \
                ON CONFLICT (key) DO UPDATE SET n = machine_tally.n + EXCLUDED.n) \
     SELECT count(*) FROM d";

/// A page of the fleet, in provider ID order, with the number of machines
/// the filter matches: exact from the tally when the filter is a state or
/// nothing, else counted up to [`MATCHING_CAP`] (see [`Matching`]).
pub async fn fleet_page(
    tx: &mut Tx<'_>,
    filter: &FleetFilter,
    limit: i64,
    offset: i64,
) -> Result<(Vec<MachineSummary>, Matching), BmdbError> {
    page_of(tx, filter, limit, offset, None).await
}

/// [`fleet_page`], with the tally when the caller read it already.
async fn page_of(
    tx: &mut Tx<'_>,
    filter: &FleetFilter,
    limit: i64,
    offset: i64,
    known: Option<&Tally>,
) -> Result<(Vec<MachineSummary>, Matching), BmdbError> {
    let in_state = filter.state.is_some();
    let (sql, first) = if in_state {
        (fleet_in_state as fn(&[String]) -> String, 4)
    } else {
        (fleet_all as fn(&[String]) -> String, 3)
    };
    // The filters once, for the page and for its count, numbered alike:
    // after the state, if one is asked.
    let (conditions, values) = filter.conditions(first);
    let mut tail: Vec<SqlValue> = Vec::new();
    if let Some(s) = filter.state {
        tail.push(Box::new(s.as_str()));
    }
    tail.extend(values);
    let rows = tx
        .query(
            interned(sql(&conditions)),
            &params(&[&limit, &offset], &tail),
        )
        .await?;
    let page: Vec<MachineSummary> = rows.iter().map(MachineSummary::from_row).collect();
    let matching = if conditions.is_empty() {
        let tally = match known {
            Some(t) => t,
            None => &tally(tx).await?,
        };
        Matching::exact(match filter.state {
            Some(s) => tally.state(s),
            None => tally.machines(),
        })
    } else {
        let count = matching(&conditions, in_state);
        let n: i64 = tx
            .query_one(interned(count), &params(&[&MATCHING_CAP, &0i64], &tail))
            .await?
            .get(0);
        Matching {
            count: n.min(MATCHING_CAP),
            more: n > MATCHING_CAP,
        }
    };
    Ok((page, matching))
}

/// Machines by ID, in the listing's order (absent IDs left out): a
/// selection as the bulk actions' confirmation lists it.
pub async fn summaries(tx: &mut Tx<'_>, ids: &[Uuid]) -> Result<Vec<MachineSummary>, BmdbError> {
    const SQL: &str = concat!(
        listed_from!(),
        " WHERE s.machine_id = ANY($1) ORDER BY s.provider_id, s.machine_id"
    );
    Ok(tx
        .query(SQL, &[&ids])
        .await?
        .iter()
        .map(MachineSummary::from_row)
        .collect())
}

/// How many machines a listing's filter matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Matching {
    pub count: i64,
    /// More than `count` match: the count stopped at [`MATCHING_CAP`].
    pub more: bool,
}

impl Matching {
    pub fn exact(count: i64) -> Self {
        Matching { count, more: false }
    }
}

impl std::fmt::Display for Matching {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.more {
            write!(f, "more than {}", self.count)
        } else {
            write!(f, "{}", self.count)
        }
    }
}

/// The fleet's tally: machines per state, and with a started agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Every state with a machine in it, in `MachineState::ALL`'s order.
    pub states: Vec<(MachineState, i64)>,
    /// Machines with a started agent.
    pub agents: i64,
}

impl Tally {
    pub fn state(&self, state: MachineState) -> i64 {
        self.states
            .iter()
            .find(|(s, _)| *s == state)
            .map_or(0, |(_, n)| *n)
    }

    pub fn machines(&self) -> i64 {
        self.states.iter().map(|(_, n)| n).sum()
    }
}

/// The tally as it stands, read in a few dozen rows whatever the fleet's
/// size (see `migrations/V24__fleet_tally.sql`).
pub async fn tally(tx: &mut Tx<'_>) -> Result<Tally, BmdbError> {
    let mut tally = Tally::default();
    for r in tx.query(TALLY, &[]).await? {
        let key: String = r.get(0);
        let n: i64 = r.get(1);
        if key == "agents" {
            tally.agents = n;
        } else if let Some(s) = MachineState::parse(&key).filter(|_| n > 0) {
            tally.states.push((s, n));
        }
    }
    tally
        .states
        .sort_by_key(|(s, _)| MachineState::ALL.iter().position(|x| x == s));
    Ok(tally)
}

/// Machines with a started agent: (heartbeating within `fresh`, silent).
pub async fn agent_counts(
    tx: &mut Tx<'_>,
    fresh: std::time::Duration,
) -> Result<(i64, i64), BmdbError> {
    let agents = tally(tx).await?.agents;
    let silent = silent(tx, fresh).await?;
    Ok((agents - silent, silent))
}

/// Agents started whose heartbeat is older than `fresh`, or absent.
async fn silent(tx: &mut Tx<'_>, fresh: std::time::Duration) -> Result<i64, BmdbError> {
    Ok(tx.query_one(SILENT, &[&fresh.as_secs_f64()]).await?.get(0))
}

/// Machines per state, the states with none left out.
pub async fn fleet_counts(tx: &mut Tx<'_>) -> Result<Vec<(MachineState, i64)>, BmdbError> {
    Ok(tally(tx).await?.states)
}

/// What one settling did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// Summary rows whose backoff had run out, their state derived anew.
    pub states: u64,
    /// Deltas folded into the tally (0 when another shepherd folds now).
    pub folded: u64,
}

/// Keeps the fleet's reads flat: settles the states a backoff's end made
/// stale, and folds the tally's deltas. Any shepherd may run it; it waits
/// on no one (rows others hold are left for the next time).
pub async fn settle(tx: &mut Tx<'_>) -> Result<Settled, BmdbError> {
    let states = tx.execute(SETTLE_STATES, &[]).await?;
    let locked: bool = tx.query_one(FOLD_LOCK, &[]).await?.get(0);
    let folded = if locked {
        let n: i64 = tx.query_one(FOLD_TALLY, &[]).await?.get(0);
        n as u64
    } else {
        0
    };
    Ok(Settled { states, folded })
}

/// A page of the fleet as the API and the fleet page show it: the rows,
/// their tenants, what the filter matches, the tally and the agents.
pub struct Listing {
    pub machines: Vec<MachineSummary>,
    /// The machines' projects and devices (those that have any).
    pub tenants: Tenants,
    pub matching: Matching,
    pub counts: Vec<(MachineState, i64)>,
    pub heartbeating: i64,
    pub silent: i64,
}

impl Listing {
    /// Read in a [`crate::bmdb::Bmdb::snapshot`]; a heartbeat older than
    /// `stale_after` is silent.
    pub async fn read(
        tx: &mut Tx<'_>,
        filter: &FleetFilter,
        (limit, offset): (i64, i64),
        stale_after: std::time::Duration,
    ) -> Result<Listing, BmdbError> {
        let tally = tally(tx).await?;
        let (machines, matching) = page_of(tx, filter, limit, offset, Some(&tally)).await?;
        let ids: Vec<Uuid> = machines.iter().map(|m| m.machine_id).collect();
        let tenants = tenants_of(tx, &ids).await?;
        let silent = silent(tx, stale_after).await?;
        Ok(Listing {
            machines,
            tenants,
            matching,
            heartbeating: tally.agents - silent,
            silent,
            counts: tally.states,
        })
    }
}
