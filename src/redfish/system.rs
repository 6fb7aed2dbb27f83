//! A ComputerSystem as shepherd reads it ([`SystemInfo`]: power, reset,
//! facts, and where its other resources are), and the small readers of
//! Redfish JSON every request file shares ([`text`], [`members`]).

use serde_json::Value;

use crate::bmdb::hardware::SystemFacts;

/// A ComputerSystem as shepherd uses it: power, reset, and facts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SystemInfo {
    /// `@odata.id`.
    pub path: String,
    pub id: String,
    /// What it says of itself: power, product, serial, BIOS, processors,
    /// memory, health.
    pub facts: SystemFacts,
    /// The reset action's target, and the reset types it advertises (empty:
    /// it does not say).
    pub reset_target: Option<String>,
    pub reset_types: Vec<String>,
    /// The system's own `VirtualMedia` collection, if it has one.
    pub virtual_media: Option<String>,
    /// The managers (`Links.ManagedBy`), whose `VirtualMedia` serves when
    /// the system has none.
    pub managed_by: Vec<String>,
    /// Its chassis (`Links.Chassis`), whose `NetworkAdapters` carry the
    /// NICs' firmware.
    pub chassis: Vec<String>,
    /// `Boot.BootSourceOverrideMode` (`UEFI`, `Legacy`), when reported.
    pub boot_mode: Option<String>,
    /// Its `SecureBoot` resource, if it has one.
    pub secure_boot: Option<String>,
    /// Its `Bios` resource (the BIOS settings), if it has one.
    pub bios: Option<String>,
    /// Its `Storage` collection, if it has one.
    pub storage: Option<String>,
}

impl SystemInfo {
    /// Its power state (`On`, `Off`, …; empty when it does not say).
    pub fn power(&self) -> &str {
        self.facts.power_state.as_deref().unwrap_or("")
    }

    pub(super) fn from_json(v: &Value) -> SystemInfo {
        let s = text;
        let reset = &v["Actions"]["#ComputerSystem.Reset"];
        SystemInfo {
            path: s(&v["@odata.id"]).unwrap_or_default(),
            id: s(&v["Id"]).unwrap_or_default(),
            facts: SystemFacts {
                power_state: s(&v["PowerState"]),
                manufacturer: s(&v["Manufacturer"]),
                model: s(&v["Model"]),
                serial_number: s(&v["SerialNumber"]),
                bios_version: s(&v["BiosVersion"]),
                processor_count: v["ProcessorSummary"]["Count"]
                    .as_i64()
                    .and_then(|n| i32::try_from(n).ok()),
                processor_model: s(&v["ProcessorSummary"]["Model"]),
                memory_gib: v["MemorySummary"]["TotalSystemMemoryGiB"].as_f64(),
                health: s(&v["Status"]["Health"]),
                secure_boot: None,
            },
            reset_target: s(&reset["target"]),
            reset_types: reset["ResetType@Redfish.AllowableValues"]
                .as_array()
                .map(|a| a.iter().filter_map(s).collect())
                .unwrap_or_default(),
            virtual_media: s(&v["VirtualMedia"]["@odata.id"]),
            managed_by: v["Links"]["ManagedBy"]
                .as_array()
                .map(|a| a.iter().filter_map(|m| s(&m["@odata.id"])).collect())
                .unwrap_or_default(),
            chassis: v["Links"]["Chassis"]
                .as_array()
                .map(|a| a.iter().filter_map(|m| s(&m["@odata.id"])).collect())
                .unwrap_or_default(),
            boot_mode: s(&v["Boot"]["BootSourceOverrideMode"]),
            secure_boot: s(&v["SecureBoot"]["@odata.id"]),
            bios: s(&v["Bios"]["@odata.id"]),
            storage: s(&v["Storage"]["@odata.id"]),
        }
    }
}

/// A JSON string that says something (not empty), else None.
pub(super) fn text(v: &Value) -> Option<String> {
    v.as_str().filter(|s| !s.is_empty()).map(str::to_string)
}

/// A collection's members' `@odata.id`s.
pub(super) fn members(v: &Value) -> Vec<String> {
    v["Members"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|m| m["@odata.id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A `SecureBoot` resource's facts.
pub(super) fn secure_boot_facts(v: &Value) -> crate::bmdb::hardware::SecureBootFacts {
    let s = text;
    crate::bmdb::hardware::SecureBootFacts {
        enable: v["SecureBootEnable"].as_bool(),
        current_boot: s(&v["SecureBootCurrentBoot"]),
        mode: s(&v["SecureBootMode"]),
    }
}
