//! The Metal API's catalog (CONTRACTS.md §7): the plans machines are
//! sorted into by their hardware report, the operating systems a device
//! may ask for (images shepherd serves), and the metro of machines whose
//! inventory entry names none.

use serde::{Deserialize, Serialize};
use shepherd_proto::summary::HardwareSummary;

use super::ConfigError;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetalConfig {
    /// Serve the Metal API's device subset at `/metal/v1` on the admin
    /// server's listener.
    pub enabled: bool,
    /// How often the devices round looks at devices: ends deleted ones
    /// whose machine is erased, writes state changes as events.
    #[serde(with = "humantime_serde")]
    pub interval: std::time::Duration,
    /// How a deleted device's disks are erased before its machine is
    /// available to the next tenant: `overwrite` (every block, any disk),
    /// `secure` (the disk's own erase), `discard`; `metadata` leaves the
    /// data blocks and is refused here.
    pub erase_mode: String,
    /// The metro of machines whose inventory entry has no `location`.
    pub metro: String,
    /// Devices a new project may hold at once (none: no limit); each
    /// project's own is set with `shepherd projects create --max-devices`.
    pub max_devices_per_project: Option<u32>,
    /// Hardware classes, in order: a machine belongs to the first it meets.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plans: Vec<PlanConfig>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub operating_systems: Vec<OperatingSystemConfig>,
}

impl Default for MetalConfig {
    fn default() -> Self {
        MetalConfig {
            enabled: true,
            interval: std::time::Duration::from_secs(2),
            erase_mode: "overwrite".into(),
            metro: "local".into(),
            max_devices_per_project: None,
            plans: Vec::new(),
            operating_systems: Vec::new(),
        }
    }
}

/// A plan: minimums over the hardware report.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PlanConfig {
    /// e.g. `c3.small.x86`.
    pub slug: String,
    /// Shown to tenants (default: the slug).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// CPU threads at least.
    pub cpus_min: u32,
    pub memory_gib_min: f64,
    /// Disks at least, each of `disk_gib_min` at least.
    pub disks_min: u32,
    pub disk_gib_min: f64,
    /// Secure Boot for the tenant's system: `true` or `false` takes only
    /// machines whose BMC can set it (Redfish's `SecureBoot`), or whose
    /// agent booted that way, and sets it through the BMC before the
    /// machine starts the tenant's system; unset: as the host's
    /// configuration says. A machine whose BMC and agent disagree on it
    /// is never given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
}

impl PlanConfig {
    /// Whether a machine can run the tenant's system with Secure Boot as
    /// the plan asks: its BMC can set it (it reads `SecureBootEnable`), or
    /// its agent booted that way.
    fn secure_boot_fits(&self, r: &HardwareSummary, bmc_secure_boot: Option<bool>) -> bool {
        match self.secure_boot {
            None => true,
            Some(want) => {
                bmc_secure_boot.is_some()
                    || r.secure_boot.as_ref().map(|s| s.state)
                        == Some(if want { "on" } else { "off" })
            }
        }
    }

    /// Whether a machine (its report, its BMC's `SecureBootEnable`) meets
    /// the plan: its minimums, and its Secure Boot.
    pub fn meets(&self, r: &HardwareSummary, bmc_secure_boot: Option<bool>) -> bool {
        const GIB: f64 = (1u64 << 30) as f64;
        let threads: i64 = r
            .cpus
            .iter()
            .map(|c| i64::from(c.threads.max(c.cores)))
            .sum();
        let memory_gib = r.memory_bytes as f64 / GIB;
        let disks = r
            .disks
            .iter()
            .filter(|d| d.capacity_bytes as f64 / GIB >= self.disk_gib_min)
            .count();
        threads >= i64::from(self.cpus_min)
            && memory_gib + 1e-9 >= self.memory_gib_min
            && disks >= self.disks_min as usize
            && self.secure_boot_fits(r, bmc_secure_boot)
    }
}

/// The plan a machine with this report (and a BMC saying
/// `SecureBootEnable` so, when it does) belongs to: the first it meets.
pub fn plan_of<'a>(
    plans: &'a [PlanConfig],
    report: &HardwareSummary,
    bmc_secure_boot: Option<bool>,
) -> Option<&'a PlanConfig> {
    plans.iter().find(|p| p.meets(report, bmc_secure_boot))
}

/// [`plan_of`] by the agent's raw report (none without one, or with one
/// that does not decode).
pub fn plan_of_raw<'a>(
    plans: &'a [PlanConfig],
    raw: Option<&[u8]>,
    bmc_secure_boot: Option<bool>,
) -> Option<&'a PlanConfig> {
    let report = shepherd_proto::summary::summarize(raw?).ok()?;
    plan_of(plans, &report, bmc_secure_boot)
}

/// An operating system: an image shepherd serves, by a slug.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct OperatingSystemConfig {
    /// e.g. `debian_12`.
    pub slug: String,
    pub name: String,
    /// The file under `installations.images_dir` installed.
    pub image: String,
    /// e.g. `debian` (default: the slug's part before `_`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub distro: Option<String>,
    /// e.g. `12` (default: the slug's part after `_`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// A slug: 1 to 64 of a-z, 0-9, `.`, `_`, `-`.
pub(super) fn check_slug(key: &str, slug: &str) -> Result<(), ConfigError> {
    let ok = !slug.is_empty()
        && slug.len() <= 64
        && slug
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::key(
            key,
            format!("{slug:?} is not a slug (1 to 64 of a-z, 0-9, '.', '_', '-')"),
        ))
    }
}

/// A file's name, no path: what a file under `installations.images_dir`
/// is named by.
pub(super) fn is_file_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && name != "." && name != ".." && !name.contains('\0')
}

impl MetalConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        check_slug("metal.metro", &self.metro)?;
        match shepherd_proto::names::parse_erase_mode(&self.erase_mode) {
            Err(e) => return Err(ConfigError::key("metal.erase_mode", e)),
            Ok(shepherd_proto::api::disk_erasure::Mode::Metadata) => {
                return Err(ConfigError::key(
                    "metal.erase_mode",
                    "metadata leaves a tenant's data blocks for the next one: use overwrite, secure or discard",
                ));
            }
            Ok(_) => {}
        }
        if self.interval < std::time::Duration::from_millis(100)
            || self.interval > std::time::Duration::from_secs(3600)
        {
            return Err(ConfigError::key(
                "metal.interval",
                "must be within 100ms and 1h",
            ));
        }
        if self.max_devices_per_project.is_some_and(|m| m > 1_000_000) {
            return Err(ConfigError::key(
                "metal.max_devices_per_project",
                "must be at most 1000000",
            ));
        }
        for (i, p) in self.plans.iter().enumerate() {
            let key = |k: &str| format!("metal.plans[{i}].{k}");
            check_slug(&key("slug"), &p.slug)?;
            if self.plans[..i].iter().any(|q| q.slug == p.slug) {
                return Err(ConfigError::key(
                    key("slug"),
                    format!("{:?} is the slug of an earlier plan", p.slug),
                ));
            }
            for (k, v) in [
                ("memory_gib_min", p.memory_gib_min),
                ("disk_gib_min", p.disk_gib_min),
            ] {
                ConfigError::within(key(k), v, 0.0..=1e6)?;
            }
        }
        for (i, o) in self.operating_systems.iter().enumerate() {
            let key = |k: &str| format!("metal.operating_systems[{i}].{k}");
            check_slug(&key("slug"), &o.slug)?;
            if self.operating_systems[..i].iter().any(|q| q.slug == o.slug) {
                return Err(ConfigError::key(
                    key("slug"),
                    format!("{:?} is the slug of an earlier operating system", o.slug),
                ));
            }
            if o.name.trim().is_empty() {
                return Err(ConfigError::key(key("name"), "must not be empty"));
            }
            if !is_file_name(&o.image) {
                return Err(ConfigError::key(
                    key("image"),
                    "must be the name of a file under installations.images_dir",
                ));
            }
        }
        Ok(())
    }
}
