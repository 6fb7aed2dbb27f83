//! What the Metal API offers, from the configuration: plans (a machine
//! belongs to the first whose minimums its hardware report meets), the
//! operating systems (images shepherd serves), and the metros (each
//! machine's inventory `location`, else `metal.metro`).

use shepherd_proto::summary::HardwareSummary;
use uuid::Uuid;

use crate::config::{MetalConfig, OperatingSystemConfig, PlanConfig};

/// Names made stable across shepherds and restarts: UUIDs of version 5
/// under shepherd's own namespace.
pub fn stable_id(kind: &str, name: &str) -> Uuid {
    const NAMESPACE: Uuid = Uuid::from_u128(0x5f0e_1b6a_4d2c_4c4e_9a51_3e7f_0c2d_8b41);
    Uuid::new_v5(&NAMESPACE, format!("{kind}:{name}").as_bytes())
}

#[derive(Debug, Clone)]
pub struct Catalog {
    pub plans: Vec<PlanConfig>,
    pub operating_systems: Vec<OperatingSystemConfig>,
    pub default_metro: String,
    pub max_devices_per_project: Option<u32>,
    /// How deleted devices' disks are erased (`metal.erase_mode`).
    pub erase_mode: String,
    /// The VLANs virtual networks are made of (`network.tenant_vlans`).
    pub tenant_vlans: std::ops::RangeInclusive<u16>,
}

impl Catalog {
    pub fn new(cfg: &MetalConfig) -> Catalog {
        Catalog {
            plans: cfg.plans.clone(),
            operating_systems: cfg.operating_systems.clone(),
            default_metro: cfg.metro.clone(),
            max_devices_per_project: cfg.max_devices_per_project,
            erase_mode: cfg.erase_mode.clone(),
            tenant_vlans: 1000..=3999,
        }
    }

    /// With the VLANs virtual networks are made of.
    pub fn with_tenant_vlans(mut self, range: std::ops::RangeInclusive<u16>) -> Catalog {
        self.tenant_vlans = range;
        self
    }

    pub fn plan(&self, slug: &str) -> Option<&PlanConfig> {
        self.plans.iter().find(|p| p.slug == slug)
    }

    /// A plan by its slug or its ID.
    pub fn plan_by(&self, slug_or_id: &str) -> Option<&PlanConfig> {
        self.plans
            .iter()
            .find(|p| p.slug == slug_or_id || stable_id("plan", &p.slug).to_string() == slug_or_id)
    }

    pub fn operating_system(&self, slug: &str) -> Option<&OperatingSystemConfig> {
        self.operating_systems.iter().find(|o| o.slug == slug)
    }

    /// The plan a machine with this report (and a BMC saying
    /// `SecureBootEnable` so, when it does) belongs to: the first it meets.
    pub fn plan_of(
        &self,
        report: &HardwareSummary,
        bmc_secure_boot: Option<bool>,
    ) -> Option<&PlanConfig> {
        crate::config::metal::plan_of(&self.plans, report, bmc_secure_boot)
    }

    /// The plan of a machine by its raw report (none without one).
    pub fn plan_of_raw(
        &self,
        raw: Option<&[u8]>,
        bmc_secure_boot: Option<bool>,
    ) -> Option<&PlanConfig> {
        crate::config::metal::plan_of_raw(&self.plans, raw, bmc_secure_boot)
    }

    /// A machine's metro: its inventory location, else the default.
    pub fn metro_of(&self, location: Option<&str>) -> String {
        match location.map(str::trim).filter(|l| !l.is_empty()) {
            Some(l) => l.to_string(),
            None => self.default_metro.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shepherd_proto::summary::{CpuSummary, DiskSummary};

    fn report(threads: i32, memory_gib: i64, disks: &[i64]) -> HardwareSummary {
        HardwareSummary {
            manufacturer: String::new(),
            product: String::new(),
            serial_number: String::new(),
            memory_bytes: memory_gib << 30,
            memory_usable_ratio: 1.0,
            cpus: vec![CpuSummary {
                vendor: "x".into(),
                model: "y".into(),
                cores: threads / 2,
                threads,
            }],
            disks: disks
                .iter()
                .map(|g| DiskSummary {
                    model: String::new(),
                    serial_number: String::new(),
                    wwn: String::new(),
                    capacity_bytes: g << 30,
                    protocol: String::new(),
                    rotational: false,
                })
                .collect(),
            nics: Vec::new(),
            efi: String::new(),
            bmc_lan: None,
            secure_boot: None,
            warnings: Vec::new(),
        }
    }

    fn plan(slug: &str, cpus: u32, mem: f64, disks: u32, disk_gib: f64) -> PlanConfig {
        PlanConfig {
            slug: slug.into(),
            cpus_min: cpus,
            memory_gib_min: mem,
            disks_min: disks,
            disk_gib_min: disk_gib,
            ..Default::default()
        }
    }

    #[test]
    fn a_machine_belongs_to_the_first_plan_it_meets() {
        let c = Catalog {
            plans: vec![
                plan("big", 32, 128.0, 2, 400.0),
                plan("small", 8, 16.0, 1, 100.0),
                plan("any", 0, 0.0, 0, 0.0),
            ],
            operating_systems: Vec::new(),
            default_metro: "sv".into(),
            max_devices_per_project: None,
            erase_mode: "overwrite".into(),
            tenant_vlans: 1000..=3999,
        };
        let slug = |r: &HardwareSummary| c.plan_of(r, None).map(|p| p.slug.clone());
        assert_eq!(slug(&report(64, 256, &[480, 480])).as_deref(), Some("big"));
        // One disk too small for big: small.
        assert_eq!(
            slug(&report(64, 256, &[480, 200])).as_deref(),
            Some("small")
        );
        assert_eq!(slug(&report(4, 8, &[])).as_deref(), Some("any"));
        assert_eq!(c.metro_of(Some(" da ")), "da");
        assert_eq!(c.metro_of(None), "sv");
        assert_eq!(stable_id("plan", "big"), stable_id("plan", "big"));
        assert_ne!(stable_id("plan", "big"), stable_id("metro", "big"));
    }

    #[test]
    fn a_plan_asking_for_secure_boot_takes_machines_that_can_have_it() {
        let c = Catalog {
            plans: vec![
                PlanConfig {
                    secure_boot: Some(true),
                    ..plan("secure", 8, 16.0, 1, 100.0)
                },
                plan("small", 8, 16.0, 1, 100.0),
            ],
            operating_systems: Vec::new(),
            default_metro: "sv".into(),
            max_devices_per_project: None,
            erase_mode: "overwrite".into(),
            tenant_vlans: 1000..=3999,
        };
        let booted = |state: &'static str| {
            let mut r = report(16, 32, &[200]);
            r.secure_boot = Some(shepherd_proto::summary::SecureBootSummary {
                state,
                setup_mode: false,
                lockdown: String::new(),
            });
            r
        };
        let slug =
            |r: &HardwareSummary, bmc: Option<bool>| c.plan_of(r, bmc).map(|p| p.slug.clone());
        // Its agent booted with it on: the plan's, whatever the BMC.
        assert_eq!(slug(&booted("on"), None).as_deref(), Some("secure"));
        // Off, or not said, and nothing to set it with: not the plan's.
        assert_eq!(slug(&booted("off"), None).as_deref(), Some("small"));
        assert_eq!(
            slug(&report(16, 32, &[200]), None).as_deref(),
            Some("small")
        );
        // A BMC that can set it (either way now): the plan's.
        assert_eq!(slug(&booted("off"), Some(false)).as_deref(), Some("secure"));
        assert_eq!(
            slug(&report(16, 32, &[200]), Some(true)).as_deref(),
            Some("secure")
        );
        // Too small for the plan: its Secure Boot does not make it fit.
        assert_eq!(slug(&report(4, 8, &[]), Some(true)), None);
    }
}
