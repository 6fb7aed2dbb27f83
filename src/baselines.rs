//! Baselines (`[[baselines]]`): what should be below machines' operating
//! systems, and how far each machine is from it (its drift). A machine
//! gets the first baseline that selects it (by its plan, its BMC's
//! manufacturer and model) and is compared with it on what its BMC last
//! listed (`bmdb::firmware`): each component's version, each BIOS
//! attribute, the RAID layout, Secure Boot. The API, the pages and `/metrics` show
//! what this finds; nothing here changes a machine.

use std::collections::BTreeMap;

use uuid::Uuid;

use crate::bmdb::firmware::Below;
use crate::bmdb::servicing;
use crate::config::{BaselineConfig, PlanConfig, VolumeConfig};

/// What a difference is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Part {
    /// A firmware component's version.
    Component,
    /// A BIOS attribute.
    Bios,
    /// The RAID layout.
    Raid,
    /// Secure Boot (`SecureBootEnable`).
    #[serde(rename = "secure-boot")]
    SecureBoot,
}

/// One way a machine differs from its baseline.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Difference {
    pub part: Part,
    /// The component (`bios`, `nic:<Id>`…), the attribute's name, or
    /// `volumes`.
    pub item: String,
    pub desired: String,
    /// What its BMC listed (None: not listed at all).
    pub actual: Option<String>,
}

impl Part {
    /// Its name in the API, the pages and the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Part::Component => "component",
            Part::Bios => "bios",
            Part::Raid => "raid",
            Part::SecureBoot => "secure-boot",
        }
    }
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let part = match self.part {
            Part::Component => "firmware",
            Part::Bios => "BIOS",
            Part::Raid => "RAID",
            Part::SecureBoot => "Secure Boot",
        };
        write!(
            f,
            "{part} {}: {} (wants {})",
            self.item,
            self.actual.as_deref().unwrap_or("not listed"),
            self.desired
        )
    }
}

/// How a machine stands against its baseline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conformance {
    /// No baseline selects it.
    Unbound,
    /// Its firmware was never read: nothing to compare.
    Unread { baseline: String },
    /// As its baseline says.
    Conforming { baseline: String },
    /// Differs from its baseline.
    Drifting {
        baseline: String,
        differences: Vec<Difference>,
    },
}

impl Conformance {
    /// `unbound`, `unread`, `conforming` or `drifting`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Conformance::Unbound => "unbound",
            Conformance::Unread { .. } => "unread",
            Conformance::Conforming { .. } => "conforming",
            Conformance::Drifting { .. } => "drifting",
        }
    }

    pub fn baseline(&self) -> Option<&str> {
        match self {
            Conformance::Unbound => None,
            Conformance::Unread { baseline }
            | Conformance::Conforming { baseline }
            | Conformance::Drifting { baseline, .. } => Some(baseline),
        }
    }

    pub fn differences(&self) -> &[Difference] {
        match self {
            Conformance::Drifting { differences, .. } => differences,
            _ => &[],
        }
    }
}

/// The declared baselines, with the plans they may name.
#[derive(Debug, Clone, Default)]
pub struct Baselines {
    pub baselines: Vec<BaselineConfig>,
    pub plans: Vec<PlanConfig>,
}

impl Baselines {
    pub fn new(baselines: &[BaselineConfig], plans: &[PlanConfig]) -> Baselines {
        Baselines {
            baselines: baselines.to_vec(),
            plans: plans.to_vec(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.baselines.is_empty()
    }

    /// Whether a baseline selects by plan: then the agents' reports are
    /// read with the rest (`bmdb::firmware::below`).
    pub fn needs_reports(&self) -> bool {
        self.baselines.iter().any(|b| b.plan.is_some())
    }

    /// The baseline named `name`.
    pub fn named(&self, name: &str) -> Option<&BaselineConfig> {
        self.baselines.iter().find(|b| b.name == name)
    }

    /// Of `ids` (None: every machine whose BMC is read), in their order,
    /// those baseline `name` selects (it is their first match); only
    /// those that differ from it when `drifting`. A rollout's machines.
    pub async fn selected(
        &self,
        tx: &mut crate::bmdb::Tx<'_>,
        name: &str,
        ids: Option<&[Uuid]>,
        drifting: bool,
    ) -> Result<Vec<Uuid>, crate::bmdb::BmdbError> {
        let below = crate::bmdb::firmware::below(tx, ids, self.needs_reports()).await?;
        let keep: std::collections::HashSet<Uuid> = below
            .iter()
            .filter(|m| {
                let c = self.conformance(m);
                c.baseline() == Some(name)
                    && (!drifting || matches!(c, Conformance::Drifting { .. }))
            })
            .map(|m| m.machine_id)
            .collect();
        Ok(match ids {
            Some(ids) => ids.iter().copied().filter(|i| keep.contains(i)).collect(),
            None => below
                .iter()
                .map(|m| m.machine_id)
                .filter(|i| keep.contains(i))
                .collect(),
        })
    }

    /// Asks for machine `machine_id`'s servicing to the first baseline
    /// that selects it (`ask.baseline` is that one's, whatever it was):
    /// refused where `bmdb::servicing` refuses it, the life cycle first,
    /// and when no baseline selects it. The API's and the CLI's one way.
    pub async fn ask_service(
        &self,
        tx: &mut crate::bmdb::Tx<'_>,
        machine_id: Uuid,
        ask: &servicing::Ask<'_>,
    ) -> Result<servicing::Asked, crate::bmdb::BmdbError> {
        let below =
            crate::bmdb::firmware::below(tx, Some(&[machine_id]), self.needs_reports()).await?;
        let Some(baseline) = below.first().and_then(|m| self.for_machine(m)) else {
            return Ok(
                match servicing::standing(tx, machine_id, ask.forced).await? {
                    servicing::Standing::Refused(why) => servicing::Asked::Refused(why),
                    servicing::Standing::NotFound => servicing::Asked::NotFound,
                    servicing::Standing::Askable { .. } => servicing::Asked::Refused(format!(
                        "machine {machine_id}: no baseline selects it (none is declared for its \
                     plan, its BMC's manufacturer and model, or its BMC has not been read): \
                     nothing to service it to"
                    )),
                },
            );
        };
        let ask = servicing::Ask {
            baseline: &baseline.name,
            ..ask.clone()
        };
        servicing::ask(tx, machine_id, &ask).await
    }

    /// The baseline for `m`: the first that selects it.
    pub fn for_machine(&self, m: &Below) -> Option<&BaselineConfig> {
        let mut plan: Option<Option<String>> = None;
        self.baselines.iter().find(|b| {
            let plan = if b.plan.is_some() {
                plan.get_or_insert_with(|| self.plan_of(m)).as_deref()
            } else {
                None
            };
            b.selects(plan, m.manufacturer.as_deref(), m.model.as_deref())
        })
    }

    fn plan_of(&self, m: &Below) -> Option<String> {
        let report = shepherd_proto::summary::summarize(m.hardware_report.as_deref()?).ok()?;
        crate::config::metal::plan_of(&self.plans, &report, m.bmc_secure_boot)
            .map(|p| p.slug.clone())
    }

    /// How `m` stands against its baseline.
    pub fn conformance(&self, m: &Below) -> Conformance {
        let Some(b) = self.for_machine(m) else {
            return Conformance::Unbound;
        };
        let baseline = b.name.clone();
        if m.read_at.is_none() {
            return Conformance::Unread { baseline };
        }
        let differences = differences(b, m);
        if differences.is_empty() {
            Conformance::Conforming { baseline }
        } else {
            Conformance::Drifting {
                baseline,
                differences,
            }
        }
    }

    /// Every baseline with how many machines it selects and how they
    /// stand, and each machine's standing.
    pub fn survey(&self, fleet: &[Below]) -> Survey {
        let mut s = Survey {
            baselines: self
                .baselines
                .iter()
                .map(|b| Standing {
                    baseline: b.name.clone(),
                    ..Standing::default()
                })
                .collect(),
            machines: Vec::with_capacity(fleet.len()),
            components: BTreeMap::new(),
        };
        for m in fleet {
            let c = self.conformance(m);
            let at = c
                .baseline()
                .and_then(|n| self.baselines.iter().position(|b| b.name == n));
            if let Some(i) = at {
                let st = &mut s.baselines[i];
                st.machines += 1;
                match &c {
                    Conformance::Unread { .. } => st.unread += 1,
                    Conformance::Conforming { .. } => st.conforming += 1,
                    Conformance::Drifting { .. } => st.drifting += 1,
                    Conformance::Unbound => {}
                }
                for want in &self.baselines[i].components {
                    let have = m.components.iter().find(|h| h.component == want.component);
                    let e = s.components.entry(want.component.clone()).or_default();
                    e.desired.insert(want.version.clone());
                    if have.is_some_and(|h| h.version == want.version) {
                        e.at_desired += 1;
                    } else if m.read_at.is_some() {
                        e.elsewhere += 1;
                    }
                }
            }
            s.machines.push((m.machine_id, c));
        }
        s
    }
}

/// How one baseline's machines stand.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Standing {
    pub baseline: String,
    /// Machines it selects.
    pub machines: u64,
    pub conforming: u64,
    pub drifting: u64,
    /// Selected, their firmware never read.
    pub unread: u64,
}

/// Per component a baseline names: the versions wanted, and how many of
/// the machines it is wanted on run it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComponentStanding {
    pub desired: std::collections::BTreeSet<String>,
    pub at_desired: u64,
    /// Read, and at another version (or not listed).
    pub elsewhere: u64,
}

/// The fleet against its baselines.
#[derive(Debug, Clone, Default)]
pub struct Survey {
    pub baselines: Vec<Standing>,
    pub machines: Vec<(Uuid, Conformance)>,
    pub components: BTreeMap<String, ComponentStanding>,
}

/// A JSON value as a person reads it: a string without its quotes.
pub fn shown(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// Whether a listed BIOS value is the one wanted: equal, or the same
/// number, or the same word written as the BMC writes its booleans.
fn same_value(want: &serde_json::Value, have: &serde_json::Value) -> bool {
    match (want, have) {
        (serde_json::Value::Number(a), serde_json::Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

/// A RAID layout as a person reads it: `RAID1 of 2 drives, RAID5 of 3
/// drives`, or `none`.
fn layout(volumes: &[(String, usize)]) -> String {
    if volumes.is_empty() {
        return "none".into();
    }
    volumes
        .iter()
        .map(|(t, n)| format!("{t} of {n} drives"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How `m` differs from `b`, on what its BMC last listed.
pub fn differences(b: &BaselineConfig, m: &Below) -> Vec<Difference> {
    let mut out = Vec::new();
    for want in &b.components {
        let have = m.components.iter().find(|c| c.component == want.component);
        if have.map(|c| &c.version) != Some(&want.version) {
            out.push(Difference {
                part: Part::Component,
                item: want.component.clone(),
                desired: want.version.clone(),
                actual: have.map(|c| c.version.clone()),
            });
        }
    }
    for (name, want) in &b.bios {
        let have = m.bios.as_ref().and_then(|bios| bios.attributes.get(name));
        if !have.is_some_and(|h| same_value(want, h)) {
            out.push(Difference {
                part: Part::Bios,
                item: name.clone(),
                desired: shown(want),
                actual: have.map(shown),
            });
        }
    }
    if let Some(raid) = &b.raid {
        out.extend(raid_difference(raid, m));
    }
    if let Some(want) = b.secure_boot
        && m.bmc_secure_boot != Some(want)
    {
        let on_off = |on: bool| if on { "on" } else { "off" }.to_string();
        out.push(Difference {
            part: Part::SecureBoot,
            item: "SecureBootEnable".into(),
            desired: on_off(want),
            actual: m.bmc_secure_boot.map(on_off),
        });
    }
    out
}

/// The RAID layout's difference: the volumes as listed against those
/// wanted, or a BMC that offers no volumes at all (RAID cannot be made
/// through it: said, never passed over).
fn raid_difference(raid: &[VolumeConfig], m: &Below) -> Option<Difference> {
    let mut want: Vec<(String, usize)> = raid
        .iter()
        .map(|v| (v.raid_type.clone(), v.drives as usize))
        .collect();
    want.sort();
    let desired = layout(&want);
    let storage = m.storage.as_deref().unwrap_or_default();
    let offered = storage.iter().any(|s| s.volumes_offered);
    if !offered {
        return Some(Difference {
            part: Part::Raid,
            item: "volumes".into(),
            desired,
            actual: Some("not offered by its BMC".into()),
        });
    }
    let mut have: Vec<(String, usize)> = storage
        .iter()
        .flat_map(|s| &s.volumes)
        .map(|v| {
            (
                v.raid_type.clone().unwrap_or_else(|| "?".into()),
                v.drives.len(),
            )
        })
        .collect();
    have.sort();
    (have != want).then(|| Difference {
        part: Part::Raid,
        item: "volumes".into(),
        desired,
        actual: Some(layout(&have)),
    })
}
