//! Which machines need a process: the selectors of shared/CONTRACTS.md §2.
//!
//! Both read `machine_summary`, a trigger-maintained row per machine, through
//! partial indexes whose ranges hold only due machines. They lock the chosen summary rows
//! `FOR NO KEY UPDATE SKIP LOCKED`, so concurrent leasers spread over
//! different machines instead of colliding on the first one.
//!
//! Locking the summary row is what makes a stale snapshot safe under READ
//! COMMITTED: every fact the selectors read (agent started, heartbeat,
//! backoffs, installation, provider, a shepherd lease) is a column of that
//! row, kept by triggers, so if it changed after the selector's snapshot,
//! PostgreSQL re-evaluates the conditions on the newest version before
//! locking it and skips it if it no longer qualifies.
//!
//! Cost: O(log N + candidates inspected). Inspected-but-rejected candidates
//! are only those due but leased right now (bounded by parallelism), or, for
//! recovery, due but backed off (index-only checks).

use std::net::IpAddr;
use std::time::Duration;

use tokio_postgres::Row;
use uuid::Uuid;

use super::{BmdbError, Provider, ProviderStatus, Tx};

/// A machine as its provider knows it (`machine_provided`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvidedMachine {
    pub machine_id: Uuid,
    pub provider: Provider,
    pub provider_id: String,
    pub reservation_id: Option<String>,
    pub ip_address: Option<String>,
    pub location: Option<String>,
    pub status: Option<ProviderStatus>,
}

impl ProvidedMachine {
    pub(crate) fn from_row(r: &Row) -> Self {
        ProvidedMachine {
            machine_id: r.get("machine_id"),
            provider: r.get("provider"),
            provider_id: r.get("provider_id"),
            reservation_id: r.get("provider_reservation_id"),
            ip_address: r.get("provider_ip_address"),
            location: r.get("provider_location"),
            status: r.get("provider_status"),
        }
    }

    /// The address to reach the machine at, if it has a valid one.
    pub fn address(&self) -> Option<IpAddr> {
        self.ip_address.as_deref().and_then(|a| a.parse().ok())
    }
}

/// The `machine_provided` columns `ProvidedMachine::from_row` reads, from
/// alias `p`.
macro_rules! provided_columns {
    () => {
        "p.machine_id, p.provider, p.provider_id, p.provider_reservation_id, \
         p.provider_ip_address, p.provider_location, p.provider_status"
    };
}
pub(crate) use provided_columns;

/// A selector over `machine_summary s`: the given conditions, no conflicting
/// work (the three shepherd processes exclude each other), not held by an
/// operator (`machine_hold`), ordered by the
/// index key, locking the chosen summary rows so that concurrent leasers
/// skip them.
macro_rules! summary_selector {
    ($conditions:expr, $order:literal) => {
        concat!(
            "SELECT ",
            provided_columns!(),
            " FROM machine_summary s \
               JOIN machine_provided p ON p.machine_id = s.machine_id \
              WHERE s.provider = $1 AND NOT s.shepherd_work AND NOT s.held AND ",
            $conditions,
            " ORDER BY ",
            $order,
            " LIMIT $2 FOR NO KEY UPDATE OF s SKIP LOCKED"
        )
    };
}

/// A machine whose switch ports shepherd moves is reached, and booted
/// into a live agent, only once every NIC port is read back on the
/// provisioning network; it boots its disk only once on its tenant's
/// network (or on provisioning, when no device holds it).
macro_rules! network_ready {
    () => {
        " AND (s.network IS NULL OR CASE WHEN s.boot_request = 'disk' THEN s.network = 'tenant' \
              OR (s.network = 'provisioning' AND NOT EXISTS (SELECT 1 FROM device d \
                  WHERE d.machine_id = s.machine_id AND d.deleted_at IS NULL \
                    AND d.deleting_at IS NULL)) \
              ELSE s.network = 'provisioning' END)"
    };
}

const NEEDS_AGENT_START: &str = summary_selector!(
    concat!(
        "s.agent_started_at IS NULL AND NOT s.installation_fulfilled \
         AND s.agent_start_not_before <= now() \
         AND NOT (s.bmc_boot AND (p.provider_ip_address IS NULL OR s.boot_request IS NOT NULL))",
        network_ready!()
    ),
    "s.agent_start_not_before"
);

/// To boot into the agent through the BMC: tagged `machine_bmc_boot`, and
/// either a boot asked for, or no agent, no address to log in at and not
/// installed (a blank machine listed by its BMC only).
const NEEDS_BMC_BOOT: &str = summary_selector!(
    concat!(
        "s.bmc_boot AND s.agent_start_not_before <= now() \
         AND (s.boot_request IS NOT NULL \
              OR (s.agent_started_at IS NULL AND NOT s.installation_fulfilled \
                  AND p.provider_ip_address IS NULL))",
        network_ready!()
    ),
    "s.agent_start_not_before"
);

/// Needs a boot through the BMC (see `NEEDS_BMC_BOOT`): provided by
/// `provider`, no conflicting work, not held, no live `ShepherdAgentStart`
/// backoff. Longest-waiting first.
pub async fn needs_bmc_boot(
    tx: &mut Tx<'_>,
    provider: Provider,
    limit: i64,
) -> Result<Vec<ProvidedMachine>, BmdbError> {
    let rows = tx.query(NEEDS_BMC_BOOT, &[&provider, &limit]).await?;
    Ok(rows.iter().map(ProvidedMachine::from_row).collect())
}

/// The machine's agent was given an endpoint served without a break for
/// the threshold `$t` plus the agents' allowance `$grace` (`$own`: the
/// endpoint assumed for agents taken over before endpoints were
/// recorded). The three are parameter numbers, as literals. A scalar
/// subquery (one row at most: both joins are on a key), not `EXISTS`: the
/// planner would turn `EXISTS` into a semi-join over every started agent
/// (its estimate for the `COALESCE` join is far off), where this reads
/// one row for each machine the heartbeat index already narrowed to.
macro_rules! judgeable {
    ($t:literal, $own:literal, $grace:literal) => {
        concat!(
            " AND (SELECT true FROM machine_agent_started a \
                 JOIN callback_endpoint c ON c.endpoint = COALESCE(a.agent_endpoint, ",
            $own,
            ") WHERE a.machine_id = s.machine_id AND c.served_until > now() \
                  AND c.serving_since <= now() - make_interval(secs => ",
            $t,
            " + ",
            $grace,
            "))",
            // On the provisioning network that long too: a machine parked
            // on the idle VLAN, or on its tenant's, cannot be heard.
            " AND (s.network IS NULL OR (s.network = 'provisioning' \
                   AND s.network_since <= now() - make_interval(secs => ",
            $t,
            " + ",
            $grace,
            ")))"
        )
    };
}

/// Silent: the last heartbeat older than the threshold, or none that long
/// after the start; judgeable (see above). Never while it is serviced: its
/// restart is the Servicer's, and its agent is judged after.
macro_rules! stale {
    ($t:literal, $own:literal, $grace:literal) => {
        concat!(
            "s.agent_started_at IS NOT NULL AND s.agent_heartbeat_at IS NOT NULL \
             AND NOT s.installation_fulfilled AND s.service IS DISTINCT FROM 'servicing' \
             AND s.agent_heartbeat_at < now() - make_interval(secs => ",
            $t,
            ")",
            judgeable!($t, $own, $grace)
        )
    };
}
macro_rules! silent {
    ($t:literal, $own:literal, $grace:literal) => {
        concat!(
            "s.agent_started_at IS NOT NULL AND s.agent_heartbeat_at IS NULL \
             AND NOT s.installation_fulfilled AND s.service IS DISTINCT FROM 'servicing' \
             AND s.agent_started_at < now() - make_interval(secs => ",
            $t,
            ")",
            judgeable!($t, $own, $grace)
        )
    };
}

const NEEDS_RECOVERY_STALE: &str = summary_selector!(
    concat!(
        stale!("$3", "$4", "$5"),
        " AND s.recovery_not_before <= now() AND s.boot_request IS NULL"
    ),
    "s.agent_heartbeat_at"
);

const NEEDS_RECOVERY_SILENT: &str = summary_selector!(
    concat!(
        silent!("$3", "$4", "$5"),
        " AND s.recovery_not_before <= now() AND s.boot_request IS NULL"
    ),
    "s.agent_started_at"
);

/// Machines judged silent now (leased, backed off or not), held ones
/// excepted: what the brake counts. `$1`: provider.
const COUNT_STALE: &str = concat!(
    "SELECT count(*) FROM machine_summary s WHERE s.provider = $1 AND NOT s.held AND ",
    stale!("$2", "$3", "$4")
);
const COUNT_SILENT: &str = concat!(
    "SELECT count(*) FROM machine_summary s WHERE s.provider = $1 AND NOT s.held AND ",
    silent!("$2", "$3", "$4")
);

/// Agents told an endpoint no shepherd has served for `$4` seconds (not
/// `$3`, the leaser's own), started at least that long ago and not heard
/// from since; with that endpoint. Longest unserved first.
const NEEDS_REHOME: &str = concat!(
    "SELECT ",
    provided_columns!(),
    ", a.agent_endpoint FROM machine_summary s \
       JOIN machine_provided p ON p.machine_id = s.machine_id \
       JOIN machine_agent_started a ON a.machine_id = s.machine_id \
       JOIN callback_endpoint c ON c.endpoint = a.agent_endpoint \
      WHERE s.provider = $1 AND NOT s.shepherd_work AND NOT s.held \
        AND NOT s.installation_fulfilled AND s.recovery_not_before <= now() \
        AND s.boot_request IS NULL AND a.agent_endpoint <> $3 \
        AND c.served_until < now() - make_interval(secs => $4) \
        AND s.agent_started_at < now() - make_interval(secs => $4) \
        AND (s.agent_heartbeat_at IS NULL OR s.agent_heartbeat_at < now() - make_interval(secs => $4)) \
      ORDER BY c.served_until, s.machine_id LIMIT $2 FOR NO KEY UPDATE OF s SKIP LOCKED"
);

/// Whether any endpoint but `$1` has gone unserved for `$2` seconds.
const ANY_UNSERVED: &str = "SELECT EXISTS (SELECT 1 FROM callback_endpoint \
     WHERE endpoint <> $1 AND served_until < now() - make_interval(secs => $2))";

const NEEDS_REBOOT: &str = summary_selector!(
    "s.reboot_requested AND s.recovery_not_before <= now() AND s.boot_request IS NULL",
    "s.machine_id"
);

/// To be serviced (`machine_service` asked, or its restart over: its boot
/// request gone), no live `ShepherdAgentStart` backoff.
const NEEDS_SERVICE: &str = summary_selector!(
    "s.service = 'servicing' AND s.agent_start_not_before <= now() AND s.boot_request IS NULL",
    "s.agent_start_not_before"
);

/// Needs the Servicer: provided by `provider`, its servicing asked or its
/// restart over, no conflicting work, not held, no live
/// `ShepherdAgentStart` backoff.
pub async fn needs_service(
    tx: &mut Tx<'_>,
    provider: Provider,
    limit: i64,
) -> Result<Vec<ProvidedMachine>, BmdbError> {
    let rows = tx.query(NEEDS_SERVICE, &[&provider, &limit]).await?;
    Ok(rows.iter().map(ProvidedMachine::from_row).collect())
}

/// Reboot requested: an operator asked to reboot the machine
/// (`machine_reboot_request`), whatever its agent does; provided by
/// `provider`, no conflicting work, no live `ShepherdRecovery` backoff.
pub async fn reboot_requested(
    tx: &mut Tx<'_>,
    provider: Provider,
    limit: i64,
) -> Result<Vec<ProvidedMachine>, BmdbError> {
    let rows = tx.query(NEEDS_REBOOT, &[&provider, &limit]).await?;
    Ok(rows.iter().map(ProvidedMachine::from_row).collect())
}

/// Needs agent start: provided by `provider`, no `machine_agent_started`,
/// no conflicting work, no live `ShepherdAgentStart` backoff, installation
/// not fulfilled. Longest-waiting first.
pub async fn needs_agent_start(
    tx: &mut Tx<'_>,
    provider: Provider,
    limit: i64,
) -> Result<Vec<ProvidedMachine>, BmdbError> {
    let rows = tx.query(NEEDS_AGENT_START, &[&provider, &limit]).await?;
    Ok(rows.iter().map(ProvidedMachine::from_row).collect())
}

/// When an agent counts as gone quiet.
#[derive(Debug, Clone, Copy)]
pub struct RecoveryThresholds {
    /// No heartbeat at all this long after the agent started.
    pub silent_after_start: Duration,
    /// The last heartbeat is older than this.
    pub heartbeat_stale_after: Duration,
    /// Beyond the threshold, how long the agent's callback endpoint must
    /// have been served before its silence counts: the agents' longest
    /// wait between two attempts, plus a call's timeout.
    pub callback_grace: Duration,
}

impl From<&crate::config::RecovererConfig> for RecoveryThresholds {
    fn from(c: &crate::config::RecovererConfig) -> Self {
        RecoveryThresholds {
            silent_after_start: c.silent_after_start,
            heartbeat_stale_after: c.heartbeat_stale_after,
            callback_grace: c.callback_grace,
        }
    }
}

impl Default for RecoveryThresholds {
    fn default() -> Self {
        RecoveryThresholds {
            silent_after_start: Duration::from_secs(30 * 60),
            heartbeat_stale_after: Duration::from_secs(10 * 60),
            callback_grace: Duration::from_secs(60),
        }
    }
}

impl RecoveryThresholds {
    /// The shorter of the two thresholds, plus the grace: no silence can be
    /// judged before some endpoint was served this long.
    pub fn shortest_judgement(&self) -> Duration {
        self.silent_after_start.min(self.heartbeat_stale_after) + self.callback_grace
    }
}

/// Needs recovery: provided by `provider`, agent started, no conflicting
/// work, no live `ShepherdRecovery` backoff, installation not fulfilled,
/// either no heartbeat `silent_after_start` after start or the last
/// heartbeat older than `heartbeat_stale_after`, and the agent's callback
/// endpoint (`own_endpoint` for agents whose endpoint was not recorded)
/// served without a break for that threshold plus `callback_grace`: an
/// agent nobody could hear is not silent. Stalest first.
pub async fn needs_recovery(
    tx: &mut Tx<'_>,
    provider: Provider,
    limit: i64,
    thresholds: RecoveryThresholds,
    own_endpoint: Option<&str>,
) -> Result<Vec<ProvidedMachine>, BmdbError> {
    // Nothing is judgeable while no endpoint was served long enough: a
    // restarted fleet skips the scan of every stale machine.
    if super::callback::judgeable(tx, thresholds.shortest_judgement())
        .await?
        .is_empty()
    {
        return Ok(Vec::new());
    }
    let grace = thresholds.callback_grace.as_secs_f64();
    let stale = thresholds.heartbeat_stale_after.as_secs_f64();
    let mut out: Vec<ProvidedMachine> = tx
        .query(
            NEEDS_RECOVERY_STALE,
            &[&provider, &limit, &stale, &own_endpoint, &grace],
        )
        .await?
        .iter()
        .map(ProvidedMachine::from_row)
        .collect();
    let missing = limit - out.len() as i64;
    if missing > 0 {
        let silent = thresholds.silent_after_start.as_secs_f64();
        let rows = tx
            .query(
                NEEDS_RECOVERY_SILENT,
                &[&provider, &missing, &silent, &own_endpoint, &grace],
            )
            .await?;
        out.extend(rows.iter().map(ProvidedMachine::from_row));
    }
    Ok(out)
}

/// Machines whose agent was told an endpoint that no shepherd has served
/// for `after` (its shepherd is gone, with its own endpoint): the
/// Recoverer restarts their agents with `own_endpoint`. Each with the
/// endpoint it was told. Nothing is scanned while every endpoint is
/// served.
pub async fn needs_rehome(
    tx: &mut Tx<'_>,
    provider: Provider,
    limit: i64,
    own_endpoint: &str,
    after: std::time::Duration,
) -> Result<Vec<(ProvidedMachine, String)>, BmdbError> {
    let after = after.as_secs_f64();
    let any: bool = tx
        .query_one(ANY_UNSERVED, &[&own_endpoint, &after])
        .await?
        .get(0);
    if !any {
        return Ok(Vec::new());
    }
    Ok(tx
        .query(NEEDS_REHOME, &[&provider, &limit, &own_endpoint, &after])
        .await?
        .iter()
        .map(|r| (ProvidedMachine::from_row(r), r.get(7)))
        .collect())
}

/// How many machines of `provider` are judged silent now, by the rules of
/// [`needs_recovery`] (leased or backed off included, held ones not).
pub async fn silent_count(
    tx: &mut Tx<'_>,
    provider: Provider,
    thresholds: RecoveryThresholds,
    own_endpoint: Option<&str>,
) -> Result<i64, BmdbError> {
    let grace = thresholds.callback_grace.as_secs_f64();
    let mut n = 0;
    for (sql, t) in [
        (COUNT_STALE, thresholds.heartbeat_stale_after),
        (COUNT_SILENT, thresholds.silent_after_start),
    ] {
        let row = tx
            .query_one(sql, &[&provider, &t.as_secs_f64(), &own_endpoint, &grace])
            .await?;
        n += row.get::<_, i64>(0);
    }
    Ok(n)
}
