//! `[[baselines]]`: what should be below a machine's operating system,
//! declared per group of machines (a plan, a vendor, a model). Each
//! baseline names its machines by what is known of them; a machine gets
//! the first baseline it matches, and differs from it by its drift
//! (`crate::baselines`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::loops::{LeaseSettings, ServicerLease};

/// One baseline: the machines it is for, and what they should run.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BaselineConfig {
    /// e.g. `r650-2026-11` (a slug).
    pub name: String,
    /// For machines of this plan (a `metal.plans` slug)…
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// …whose BMC says this `Manufacturer`…
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manufacturer: Option<String>,
    /// …and this `Model` (every key given must match; none: every machine).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Firmware: each component at its version.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<ComponentConfig>,
    /// BIOS attributes, by the names the BMC's `Bios` resource uses.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub bios: BTreeMap<String, serde_json::Value>,
    /// The RAID layout: exactly these volumes (none: no opinion; an empty
    /// list: no volumes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raid: Option<Vec<VolumeConfig>>,
    /// Secure Boot at the next boot, as the BMC's `SecureBootEnable` says
    /// (none: no opinion).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
}

/// A firmware component at a version.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ComponentConfig {
    /// As the firmware read names it: `bios`, `bmc`, `nic:<Id>`,
    /// `inventory:<Id>`.
    pub component: String,
    /// The version it should run, as its BMC reports it.
    pub version: String,
    /// The update image that brings it there: a file under
    /// `installations.images_dir`.
    pub image: String,
}

/// A volume of the RAID layout.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct VolumeConfig {
    /// Redfish's `RAIDType`: `RAID0`, `RAID1`, `RAID5`, `RAID6`, `RAID10`, …
    pub raid_type: String,
    /// How many drives it is made of.
    pub drives: u32,
}

/// Redfish's `RAIDType` values (DSP8010 `Volume`).
pub const RAID_TYPES: &[&str] = &[
    "RAID0",
    "RAID1",
    "RAID3",
    "RAID4",
    "RAID5",
    "RAID6",
    "RAID10",
    "RAID01",
    "RAID6TP",
    "RAID1E",
    "RAID50",
    "RAID60",
    "RAID00",
    "RAID10E",
    "RAID1Triple",
    "RAID10Triple",
];

/// The fewest drives a volume of `raid_type` is made of.
fn fewest_drives(raid_type: &str) -> u32 {
    match raid_type {
        "RAID0" => 1,
        "RAID1" | "RAID1E" => 2,
        "RAID3" | "RAID4" | "RAID5" | "RAID1Triple" => 3,
        "RAID6" | "RAID10" | "RAID01" | "RAID00" | "RAID10E" => 4,
        "RAID6TP" => 5,
        "RAID50" | "RAID10Triple" => 6,
        "RAID60" => 8,
        _ => 1,
    }
}

impl BaselineConfig {
    /// Whether it is for a machine of `plan`, whose BMC says
    /// `manufacturer` and `model`.
    pub fn selects(
        &self,
        plan: Option<&str>,
        manufacturer: Option<&str>,
        model: Option<&str>,
    ) -> bool {
        let fits = |want: &Option<String>, have: Option<&str>| {
            want.as_deref().is_none_or(|w| have == Some(w))
        };
        fits(&self.plan, plan) && fits(&self.manufacturer, manufacturer) && fits(&self.model, model)
    }

    /// Who it is for, for people: `plan=… manufacturer=… model=…`, or
    /// `every machine`.
    pub fn selection(&self) -> String {
        let parts: Vec<String> = [
            ("plan", &self.plan),
            ("manufacturer", &self.manufacturer),
            ("model", &self.model),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}")))
        .collect();
        if parts.is_empty() {
            "every machine".into()
        } else {
            parts.join(" ")
        }
    }
}

/// The Servicer: brings machines to their baseline through their BMC
/// while they are free (asked by an operator's `service`, or a rollout of
/// a baseline).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServicingConfig {
    pub enabled: bool,
    /// Machines serviced at once (each BMC takes one update at a time),
    /// how often to look when idle, the backoff after shepherd's own
    /// faults (a BMC that does not answer, the database).
    #[serde(flatten)]
    pub lease: LeaseSettings<ServicerLease>,
    /// How long one firmware update's task may run on its BMC.
    #[serde(with = "humantime_serde")]
    pub task_timeout: std::time::Duration,
    /// How often a task, or the BMC after the restart, is read.
    #[serde(with = "humantime_serde")]
    pub poll: std::time::Duration,
    /// After the restart, how long the BMC may take to show what was
    /// applied (updates run at the reset, then the BMC reads them anew).
    #[serde(with = "humantime_serde")]
    pub verify_timeout: std::time::Duration,
    /// How long a BMC that fetches its image may use the grant it is given.
    #[serde(with = "humantime_serde")]
    pub grant_ttl: std::time::Duration,
}

impl Default for ServicingConfig {
    fn default() -> Self {
        ServicingConfig {
            enabled: true,
            lease: LeaseSettings::default(),
            task_timeout: std::time::Duration::from_secs(60 * 60),
            poll: std::time::Duration::from_secs(5),
            verify_timeout: std::time::Duration::from_secs(20 * 60),
            grant_ttl: std::time::Duration::from_secs(2 * 3600),
        }
    }
}

impl ServicingConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.lease.validate()?;
        for (k, v) in [
            ("servicing.task_timeout", self.task_timeout),
            ("servicing.poll", self.poll),
            ("servicing.verify_timeout", self.verify_timeout),
            ("servicing.grant_ttl", self.grant_ttl),
        ] {
            ConfigError::positive(k, v)?;
        }
        if self.grant_ttl <= self.task_timeout {
            return Err(ConfigError::key(
                "servicing.grant_ttl",
                format!(
                    "must be longer than servicing.task_timeout ({}): the BMC fetches its image during the task",
                    humantime::format_duration(self.task_timeout)
                ),
            ));
        }
        Ok(())
    }
}

/// Checks `[[baselines]]` against the plans they name.
pub(super) fn validate(
    baselines: &[BaselineConfig],
    plans: &[super::PlanConfig],
) -> Result<(), ConfigError> {
    for (i, b) in baselines.iter().enumerate() {
        let key = |k: &str| format!("baselines[{i}].{k}");
        super::metal::check_slug(&key("name"), &b.name)?;
        if baselines[..i].iter().any(|o| o.name == b.name) {
            return Err(ConfigError::key(
                key("name"),
                format!("{:?} is the name of an earlier baseline", b.name),
            ));
        }
        if let Some(p) = &b.plan
            && !plans.iter().any(|q| &q.slug == p)
        {
            return Err(ConfigError::key(
                key("plan"),
                format!("{p:?} is not a metal.plans slug"),
            ));
        }
        for (k, v) in [("manufacturer", &b.manufacturer), ("model", &b.model)] {
            if v.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(ConfigError::key(
                    key(k),
                    "must not be empty (leave it out to match any)",
                ));
            }
        }
        if b.components.is_empty()
            && b.bios.is_empty()
            && b.raid.is_none()
            && b.secure_boot.is_none()
        {
            return Err(ConfigError::key(
                key("components"),
                "a baseline declares components, bios, raid or secure_boot",
            ));
        }
        for (j, c) in b.components.iter().enumerate() {
            let key = |k: &str| format!("baselines[{i}].components[{j}].{k}");
            let known = c.component == "bios"
                || c.component == "bmc"
                || ["nic:", "inventory:"]
                    .iter()
                    .any(|p| c.component.strip_prefix(p).is_some_and(|id| !id.is_empty()));
            if !known {
                return Err(ConfigError::key(
                    key("component"),
                    format!(
                        "{:?} is not bios, bmc, nic:<Id> or inventory:<Id>",
                        c.component
                    ),
                ));
            }
            if b.components[..j].iter().any(|o| o.component == c.component) {
                return Err(ConfigError::key(
                    key("component"),
                    format!("{:?} is declared twice", c.component),
                ));
            }
            if c.version.trim().is_empty() {
                return Err(ConfigError::key(key("version"), "must not be empty"));
            }
            if !super::metal::is_file_name(&c.image) {
                return Err(ConfigError::key(
                    key("image"),
                    "must be the name of a file under installations.images_dir",
                ));
            }
        }
        for (name, v) in &b.bios {
            let simple = matches!(
                v,
                serde_json::Value::String(_)
                    | serde_json::Value::Number(_)
                    | serde_json::Value::Bool(_)
            );
            if name.trim().is_empty() || !simple {
                return Err(ConfigError::key(
                    format!("baselines[{i}].bios.{name}"),
                    "must be a string, a number or a boolean",
                ));
            }
        }
        for (j, v) in b.raid.iter().flatten().enumerate() {
            let key = |k: &str| format!("baselines[{i}].raid[{j}].{k}");
            if !RAID_TYPES.contains(&v.raid_type.as_str()) {
                return Err(ConfigError::key(
                    key("raid_type"),
                    format!("{:?} is not one of {}", v.raid_type, RAID_TYPES.join(", ")),
                ));
            }
            let fewest = fewest_drives(&v.raid_type);
            if v.drives < fewest || v.drives > 256 {
                return Err(ConfigError::key(
                    key("drives"),
                    format!("a {} volume is made of {fewest} to 256 drives", v.raid_type),
                ));
            }
        }
    }
    Ok(())
}
