//! The fleet's filters: which machines a listing shows (state, provider
//! status, heartbeat, text, location, project, BMC, boot path, plan), and
//! the SQL each asks, only for the filters given.

use uuid::Uuid;

use crate::bmdb::ProviderStatus;
use crate::bmdb::lifecycle::MachineState;

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

/// A machine's BMC as the fleet page filters it: the protocol its URL
/// names, as the Updater last read it, or none known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BmcKind {
    Redfish,
    Ipmi,
    /// No BMC read: none in the inventory, or not read yet.
    None,
}

impl BmcKind {
    pub const ALL: [BmcKind; 3] = [BmcKind::Redfish, BmcKind::Ipmi, BmcKind::None];

    pub fn as_str(self) -> &'static str {
        match self {
            BmcKind::Redfish => crate::config::BmcProtocol::Redfish.as_str(),
            BmcKind::Ipmi => crate::config::BmcProtocol::Ipmi.as_str(),
            BmcKind::None => "none",
        }
    }

    pub fn parse(s: &str) -> Option<BmcKind> {
        Self::ALL.into_iter().find(|b| b.as_str() == s)
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
    /// The provider's location (an inventory host's `location`), exactly.
    pub location: Option<String>,
    /// The project it is assigned to, or whose device it holds.
    pub project: Option<Uuid>,
    pub bmc: Option<BmcKind>,
    /// How shepherd reaches it first: booted by its BMC (virtual media,
    /// the network), else over SSH.
    pub boot: Option<crate::config::BootMethod>,
    /// Its plan's slug, as labeled (`crate::plan_labels`).
    pub plan: Option<String>,
}

impl FleetFilter {
    /// The search text as a LIKE pattern's part (its wildcards escaped,
    /// lower case), when there is one.
    fn search_pattern(&self) -> Option<String> {
        self.search
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.replace('\\', "\\\\")
                    .replace('%', "\\%")
                    .replace('_', "\\_")
                    .to_lowercase()
            })
    }

    /// Its filters but the state, as SQL over `machine_summary s` and
    /// `machine_provided p`, with their values numbered from `$first`:
    /// only the filters given, each a condition of its own, so that the
    /// planner sees what is asked (a rare plan or rack is read from its
    /// index, an anti-join stays one) instead of a condition that holds
    /// for every machine when a value is absent.
    pub(super) fn conditions(&self, first: usize) -> (Vec<String>, Vec<SqlValue>) {
        let mut sql = Vec::new();
        let mut values: Vec<SqlValue> = Vec::new();
        let bind = |values: &mut Vec<SqlValue>, v: SqlValue| {
            values.push(v);
            format!("${}", first + values.len() - 1)
        };
        if let Some(st) = self.provider_status {
            let n = bind(&mut values, Box::new(st));
            sql.push(format!("p.provider_status = {n}"));
        }
        if let Some(h) = self.heartbeat {
            let stale = self.stale_after.as_secs_f64();
            sql.push(match h {
                Heartbeat::Heartbeating => {
                    let n = bind(&mut values, Box::new(stale));
                    format!("s.agent_heartbeat_at > now() - make_interval(secs => {n})")
                }
                Heartbeat::Silent => {
                    let n = bind(&mut values, Box::new(stale));
                    format!(
                        "s.agent_started_at IS NOT NULL AND (s.agent_heartbeat_at IS NULL \
                         OR s.agent_heartbeat_at <= now() - make_interval(secs => {n}))"
                    )
                }
                Heartbeat::NoAgent => "s.agent_started_at IS NULL".into(),
            });
        }
        if let Some(q) = self.search_pattern() {
            let n = bind(&mut values, Box::new(q));
            sql.push(format!(
                "(s.machine_id::text LIKE {n} || '%' \
                  OR s.provider_id ILIKE '%' || {n} || '%' ESCAPE '\\' \
                  OR s.address LIKE {n} || '%' ESCAPE '\\')"
            ));
        }
        if let Some(l) = &self.location {
            let n = bind(&mut values, Box::new(l.clone()));
            sql.push(format!("p.provider_location = {n}"));
        }
        if let Some(pr) = self.project {
            let n = bind(&mut values, Box::new(pr));
            sql.push(format!(
                "s.machine_id IN (SELECT machine_id FROM machine_project WHERE project_id = {n} \
                  UNION ALL SELECT machine_id FROM device \
                             WHERE project_id = {n} AND deleted_at IS NULL)"
            ));
        }
        if let Some(b) = self.bmc {
            let facts = "SELECT 1 FROM machine_bmc_facts f WHERE f.machine_id = s.machine_id";
            sql.push(match b {
                BmcKind::None => format!("NOT EXISTS ({facts})"),
                BmcKind::Ipmi => format!("EXISTS ({facts} AND f.bmc_url LIKE 'ipmi://%')"),
                BmcKind::Redfish => format!("EXISTS ({facts} AND f.bmc_url NOT LIKE 'ipmi://%')"),
            });
        }
        if let Some(b) = self.boot {
            let boots = "SELECT 1 FROM machine_bmc_boot b WHERE b.machine_id = s.machine_id";
            sql.push(match b {
                crate::config::BootMethod::Ssh => format!("NOT EXISTS ({boots})"),
                other => {
                    let n = bind(&mut values, Box::new(other.as_str()));
                    format!("EXISTS ({boots} AND b.via = {n})")
                }
            });
        }
        if let Some(plan) = &self.plan {
            let n = bind(&mut values, Box::new(plan.clone()));
            sql.push(format!(
                "EXISTS (SELECT 1 FROM machine_plan mpl WHERE mpl.machine_id = s.machine_id AND mpl.plan = {n})"
            ));
        }
        (sql, values)
    }
}

/// A query's value, owned (the filters' values and the paging's).
pub(super) type SqlValue = Box<dyn tokio_postgres::types::ToSql + Sync + Send>;

/// A query's parameters: `head`, then `tail`'s values.
pub(super) fn params<'a>(
    head: &[&'a (dyn tokio_postgres::types::ToSql + Sync)],
    tail: &'a [SqlValue],
) -> Vec<&'a (dyn tokio_postgres::types::ToSql + Sync)> {
    let mut p = head.to_vec();
    p.extend(
        tail.iter()
            .map(|v| v.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync)),
    );
    p
}

/// A listing's SQL as the connection's statement cache keys it: each text
/// kept once for the process. The texts are bounded: they differ only by
/// which filters are given and their kind (their values are parameters),
/// a few thousand at most, and an operator's pages use a handful.
pub(super) fn interned(sql: String) -> &'static str {
    static TEXTS: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<&'static str>>> =
        std::sync::OnceLock::new();
    let mut texts = TEXTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(t) = texts.get(sql.as_str()) {
        return t;
    }
    let t: &'static str = Box::leak(sql.into_boxed_str());
    texts.insert(t);
    t
}
