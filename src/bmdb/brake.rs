//! The brake on power actions for silence.
//!
//! When many machines go silent at once it is far likelier that the network
//! or shepherd itself failed than the machines (Kubernetes' node lifecycle
//! controller stops evicting for the same reason). The Recoverer therefore
//! takes a power action for silence only through [`take_power_action`],
//! which locks the brake's one row (so the budget holds across every
//! shepherd on the BMDB), and is refused while the brake holds:
//!
//! - more machines are silent now than the limit, or
//! - the limit's worth of power actions for silence were taken within the
//!   window.
//!
//! The limit is the larger of a count and a share of the machines whose
//! agent started. An operator's release lets power actions go ahead until
//! it expires; operator-requested reboots are never braked. The brake lets
//! go by itself when the silent machines fall back under the limit.

use std::time::{Duration, SystemTime};

use uuid::Uuid;

use super::selectors::{self, RecoveryThresholds};
use super::{BmdbError, Provider, Tx};

/// When the brake holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BrakeSettings {
    /// Silent machines (or power actions in the window) tolerated whatever
    /// the fleet's size.
    pub max_silent: u32,
    /// ...or this share of the machines whose agent started, if larger.
    pub max_silent_share: f64,
    /// The window power actions for silence are counted over.
    pub window: Duration,
}

impl From<&crate::config::RecovererConfig> for BrakeSettings {
    fn from(c: &crate::config::RecovererConfig) -> Self {
        BrakeSettings {
            max_silent: c.brake_max_silent,
            max_silent_share: c.brake_max_silent_share,
            window: c.brake_window,
        }
    }
}

impl Default for BrakeSettings {
    fn default() -> Self {
        BrakeSettings {
            max_silent: 3,
            max_silent_share: 0.1,
            window: Duration::from_secs(10 * 60),
        }
    }
}

/// The brake as it stands.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BrakeState {
    /// Power actions for silence are refused.
    pub engaged: bool,
    /// Why, when engaged.
    pub reason: Option<String>,
    /// Machines judged silent now.
    pub silent: i64,
    /// Machines whose agent started (held ones excepted).
    pub fleet: i64,
    /// The most silent machines (and power actions in the window) allowed.
    pub limit: i64,
    /// Power actions for silence within the window.
    pub power_actions_in_window: i64,
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Since when it holds (first seen engaged by a Recoverer).
    #[serde(with = "humantime_serde")]
    pub engaged_since: Option<SystemTime>,
    /// An operator's release, until when and by whom.
    #[serde(with = "humantime_serde")]
    pub released_until: Option<SystemTime>,
    pub released_by: Option<String>,
}

const READ: &str = "SELECT engaged_since, released_until, released_by, released_until > now() \
     FROM recovery_brake WHERE recovery_brake_id = 1";
const READ_LOCKED: &str = "SELECT engaged_since, released_until, released_by, released_until > now() \
     FROM recovery_brake WHERE recovery_brake_id = 1 FOR UPDATE";
/// The provider's machines whose agent started, held ones excepted: their
/// tally (migration V26), not a count of every agent.
const FLEET: &str = "SELECT machine_tally_count('agents/' || $1::provider)";
const IN_WINDOW: &str = "SELECT count(*) FROM recovery_power_action \
     WHERE NOT requested AND \"timestamp\" > now() - make_interval(secs => $1)";
const RECORD: &str = "INSERT INTO recovery_power_action (machine_id, requested) VALUES ($1, $2)";
const MARK: &str = "UPDATE recovery_brake SET \
       engaged_since = CASE WHEN $1 THEN COALESCE(engaged_since, now()) END, \
       engaged_reason = CASE WHEN $1 THEN $2 END \
     WHERE recovery_brake_id = 1 \
       AND (engaged_since IS NULL) = $1";
const RELEASE: &str = "UPDATE recovery_brake SET released_until = now() + make_interval(secs => $1), \
       released_by = $2 WHERE recovery_brake_id = 1";

/// What the Recoverer judges by: the provider, the thresholds, the
/// endpoint assumed for agents whose endpoint was not recorded.
#[derive(Debug, Clone)]
pub struct Judge {
    pub provider: Provider,
    pub thresholds: RecoveryThresholds,
    pub own_endpoint: Option<String>,
    pub brake: BrakeSettings,
}

impl Judge {
    /// How a shepherd with this Recoverer configuration judges silence,
    /// with `endpoint` (its own callback's) for agents whose endpoint was
    /// not recorded.
    pub fn new(
        cfg: &crate::config::RecovererConfig,
        provider: Provider,
        endpoint: Option<String>,
    ) -> Judge {
        Judge {
            provider,
            thresholds: cfg.into(),
            own_endpoint: endpoint,
            brake: cfg.into(),
        }
    }
}

async fn evaluate(tx: &mut Tx<'_>, judge: &Judge, lock: bool) -> Result<BrakeState, BmdbError> {
    let row = tx
        .query_one(if lock { READ_LOCKED } else { READ }, &[])
        .await?;
    let engaged_since: Option<SystemTime> = row.get(0);
    let released_until: Option<SystemTime> = row.get(1);
    let released_by: Option<String> = row.get(2);
    let released: bool = row.get::<_, Option<bool>>(3).unwrap_or(false);
    let fleet: i64 = tx.query_one(FLEET, &[&judge.provider]).await?.get(0);
    let silent = selectors::silent_count(
        tx,
        judge.provider,
        judge.thresholds,
        judge.own_endpoint.as_deref(),
    )
    .await?;
    let window = judge.brake.window;
    let power_actions_in_window: i64 = tx
        .query_one(IN_WINDOW, &[&window.as_secs_f64()])
        .await?
        .get(0);
    let share = (judge.brake.max_silent_share * fleet as f64).ceil() as i64;
    let limit = share.max(judge.brake.max_silent as i64);
    let reason = if silent > limit {
        Some(format!(
            "{silent} of {fleet} machines are silent (more than {limit}): more likely the network or shepherd than the machines"
        ))
    } else if power_actions_in_window >= limit {
        Some(format!(
            "{power_actions_in_window} power actions for silence in the last {} (the limit, {limit})",
            humantime::format_duration(window)
        ))
    } else {
        None
    };
    Ok(BrakeState {
        engaged: reason.is_some() && !released,
        reason,
        silent,
        fleet,
        limit,
        power_actions_in_window,
        window,
        engaged_since,
        released_until: released_until.filter(|_| released),
        released_by: released_by.filter(|_| released),
    })
}

/// The brake as it stands (for the pages, the API, `/metrics`).
pub async fn state(tx: &mut Tx<'_>, judge: &Judge) -> Result<BrakeState, BmdbError> {
    evaluate(tx, judge, false).await
}

/// Evaluates the brake and records whether it holds (`engaged_since`), so
/// that every reader sees since when. Returns the state and whether this
/// call changed it (to log the change once).
pub async fn watch(tx: &mut Tx<'_>, judge: &Judge) -> Result<(BrakeState, bool), BmdbError> {
    let mut st = evaluate(tx, judge, true).await?;
    let changed = tx.execute(MARK, &[&st.engaged, &st.reason]).await? > 0;
    if changed && st.engaged {
        st.engaged_since = Some(SystemTime::now());
    } else if !st.engaged {
        st.engaged_since = None;
    }
    Ok((st, changed))
}

/// Asks to power-cycle `machine_id`. An operator's request (`requested`)
/// always goes ahead; one for silence goes ahead only while the brake does
/// not hold. Either is recorded in the window when it goes ahead, in this
/// transaction, under the brake's lock: the budget holds across shepherds.
pub async fn take_power_action(
    tx: &mut Tx<'_>,
    judge: &Judge,
    machine_id: Uuid,
    requested: bool,
) -> Result<Result<(), BrakeState>, BmdbError> {
    if !requested {
        let (st, _) = watch(tx, judge).await?;
        if st.engaged {
            return Ok(Err(st));
        }
    }
    tx.execute(RECORD, &[&machine_id, &requested]).await?;
    Ok(Ok(()))
}

/// An operator's release: power actions for silence go ahead for `for_`
/// whatever the brake says. Audited in `operator_action` (no machine).
pub async fn release(
    tx: &mut Tx<'_>,
    request_id: Uuid,
    actor: &str,
    reason: Option<&str>,
    for_: Duration,
) -> Result<super::actions::Audit, BmdbError> {
    if let Some(a) = super::actions::fleet_audit(tx, request_id).await? {
        return Ok(a);
    }
    tx.execute(RELEASE, &[&for_.as_secs_f64(), &actor]).await?;
    let detail = format!(
        "released the recovery brake for {}: power actions for silence go ahead",
        humantime::format_duration(for_)
    );
    super::actions::record_fleet_action(tx, request_id, "release-brake", actor, reason, &detail)
        .await
}
