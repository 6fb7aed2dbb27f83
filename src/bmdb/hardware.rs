//! What a machine's BMC says against what its agent reported: the wrong
//! machine behind a BMC (a cabling or labelling fault) shows as a BMC whose
//! system's serial number or memory is not the reporting machine's. A
//! difference blocks installations until an operator accepts it
//! (`accept-hardware`); an acceptance holds for the differences accepted,
//! not for new ones.

use std::time::SystemTime;

use shepherd_proto::summary::HardwareSummary;
use uuid::Uuid;

use super::{BmdbError, Tx};

/// What a BMC says of its system: the one shape of these facts, from the
/// Redfish read (`redfish::SystemInfo::facts`) to the BMDB's row
/// ([`BmcFacts`]) and the API's answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SystemFacts {
    /// `On`, `Off`, `PoweringOn`, `PoweringOff`, `Paused`.
    pub power_state: Option<String>,
    pub manufacturer: Option<String>,
    pub model: Option<String>,
    pub serial_number: Option<String>,
    pub bios_version: Option<String>,
    pub processor_count: Option<i32>,
    pub processor_model: Option<String>,
    pub memory_gib: Option<f64>,
    /// `Status.Health`: `OK`, `Warning`, `Critical`.
    pub health: Option<String>,
    /// Secure Boot, from the system's `SecureBoot` resource (None: not
    /// read: an IPMI BMC, or none offered).
    pub secure_boot: Option<SecureBootFacts>,
}

/// Redfish's `SecureBoot` of a ComputerSystem.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SecureBootFacts {
    /// `SecureBootEnable`: whether it is on at the next boot.
    pub enable: Option<bool>,
    /// `SecureBootCurrentBoot`: `Enabled`, `Disabled` (this boot).
    pub current_boot: Option<String>,
    /// `SecureBootMode`: `SetupMode`, `UserMode`, `AuditMode`,
    /// `DeployedMode`.
    pub mode: Option<String>,
}

impl std::fmt::Display for SecureBootFacts {
    /// `on (this boot: Enabled, DeployedMode)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.enable {
            Some(true) => "on",
            Some(false) => "off",
            None => "unknown",
        })?;
        let more: Vec<String> = [
            self.current_boot
                .as_ref()
                .map(|c| format!("this boot: {c}")),
            self.mode.clone(),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !more.is_empty() {
            write!(f, " ({})", more.join(", "))?;
        }
        Ok(())
    }
}

/// A machine's out-of-band facts, from its BMC's Redfish ComputerSystem
/// (`machine_bmc_facts`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BmcFacts {
    pub bmc_url: String,
    pub system_path: Option<String>,
    pub system: SystemFacts,
    /// Why the last read failed; the facts are from the read before.
    pub read_error: Option<String>,
    /// When they last changed (set by the BMDB; ignored when writing).
    pub changed_at: Option<SystemTime>,
}

impl BmcFacts {
    /// `ipmi` or `redfish`, by the URL's scheme (CONTRACTS.md §6).
    pub fn protocol(&self) -> &'static str {
        if self.bmc_url.starts_with("ipmi://") {
            "ipmi"
        } else {
            "redfish"
        }
    }

    /// Label and value of each fact that is known, for the pages and the
    /// command line.
    pub fn lines(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            ("BMC", self.bmc_url.clone()),
            ("protocol", self.protocol().to_string()),
        ];
        let mut add = |k: &'static str, v: Option<String>| {
            if let Some(v) = v {
                out.push((k, v));
            }
        };
        add("system", self.system_path.clone());
        let s = &self.system;
        add("power", s.power_state.clone());
        add("health", s.health.clone());
        let product = [&s.manufacturer, &s.model]
            .iter()
            .filter_map(|v| v.as_deref())
            .collect::<Vec<_>>()
            .join(" ");
        add("product", Some(product).filter(|p| !p.is_empty()));
        add("serial", s.serial_number.clone());
        add("BIOS", s.bios_version.clone());
        let cpus = match (s.processor_count, &s.processor_model) {
            (Some(n), Some(m)) => Some(format!("{n} × {m}")),
            (Some(n), None) => Some(n.to_string()),
            (None, Some(m)) => Some(m.clone()),
            (None, None) => None,
        };
        add("processors", cpus);
        add("memory", s.memory_gib.map(|g| format!("{g} GiB")));
        add("Secure Boot", s.secure_boot.as_ref().map(|b| b.to_string()));
        add("read error", self.read_error.clone());
        out
    }
}

const BMC_FACTS: &str = "SELECT bmc_url, system_path, power_state, manufacturer, model, serial_number, \
     bios_version, processor_count, processor_model, memory_gib, health, read_error, changed_at, \
     secure_boot_enable, secure_boot_current_boot, secure_boot_mode \
     FROM machine_bmc_facts WHERE machine_id = $1";

pub async fn bmc_facts(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Option<BmcFacts>, BmdbError> {
    Ok(tx
        .query_opt(BMC_FACTS, &[&machine_id])
        .await?
        .map(|r| BmcFacts {
            bmc_url: r.get(0),
            system_path: r.get(1),
            system: SystemFacts {
                power_state: r.get(2),
                manufacturer: r.get(3),
                model: r.get(4),
                serial_number: r.get(5),
                bios_version: r.get(6),
                processor_count: r.get(7),
                processor_model: r.get(8),
                memory_gib: r.get(9),
                health: r.get(10),
                secure_boot: secure_boot_of(r.get(13), r.get(14), r.get(15)),
            },
            read_error: r.get(11),
            changed_at: r.get(12),
        }))
}

/// Machines whose BMC was read, by Secure Boot as it says: `on`, `off`,
/// `unknown` (each present, 0 when none).
pub async fn secure_boot_counts(tx: &mut Tx<'_>) -> Result<[(&'static str, i64); 3], BmdbError> {
    let r = tx
        .query_one(
            "SELECT count(*) FILTER (WHERE secure_boot_enable), \
                    count(*) FILTER (WHERE NOT secure_boot_enable), \
                    count(*) FILTER (WHERE secure_boot_enable IS NULL) \
               FROM machine_bmc_facts",
            &[],
        )
        .await?;
    Ok([("on", r.get(0)), ("off", r.get(1)), ("unknown", r.get(2))])
}

/// The Secure Boot facts of a row's three columns (None: none read).
pub fn secure_boot_of(
    enable: Option<bool>,
    current_boot: Option<String>,
    mode: Option<String>,
) -> Option<SecureBootFacts> {
    (enable.is_some() || current_boot.is_some() || mode.is_some()).then_some(SecureBootFacts {
        enable,
        current_boot,
        mode,
    })
}

/// Placeholders firmware puts where a serial number should be.
fn no_serial(s: &str) -> bool {
    let s = s.trim().to_ascii_lowercase();
    s.is_empty()
        || s.chars().all(|c| c == '0' || c == ' ')
        || [
            "not specified",
            "to be filled by o.e.m.",
            "default string",
            "system serial number",
            "none",
            "n/a",
        ]
        .contains(&s.as_str())
}

const GIB: f64 = (1u64 << 30) as f64;

/// Each fact both sides know and tell differently, in words.
pub fn differences(bmc: &BmcFacts, report: &HardwareSummary) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(b) = bmc.system.serial_number.as_deref() {
        let a = report.serial_number.as_str();
        if !no_serial(b) && !no_serial(a) && !b.trim().eq_ignore_ascii_case(a.trim()) {
            out.push(format!(
                "serial number: the BMC says {:?}, the agent reports {:?}",
                b.trim(),
                a.trim()
            ));
        }
    }
    if let Some(b) = bmc.system.memory_gib.filter(|g| *g > 0.0) {
        let a = report.memory_bytes as f64 / GIB;
        // The BMC counts what is installed, some in whole GiB rounded
        // down; the agent what it sees, a little less (firmware's
        // reservations): a tenth, and a GiB, either way.
        if a > 0.0 && (a > b * 1.1 + 1.0 || a < b * 0.9 - 1.0) {
            out.push(format!(
                "memory: the BMC says {b} GiB, the agent reports {a:.1} GiB"
            ));
        }
    }
    // Secure Boot as the BMC says the running system booted, against how
    // the agent's system booted (both known).
    let bmc_booted = bmc
        .system
        .secure_boot
        .as_ref()
        .and_then(|b| b.current_boot.as_deref())
        .and_then(|c| match c {
            "Enabled" => Some("on"),
            "Disabled" => Some("off"),
            _ => None,
        });
    let agent_booted = report
        .secure_boot
        .as_ref()
        .map(|s| s.state)
        .filter(|s| *s != "unknown");
    if let (Some(b), Some(a)) = (bmc_booted, agent_booted)
        && a != b
    {
        out.push(format!(
            "Secure Boot: the BMC says this boot has it {b}, the agent booted with it {a}"
        ));
    }
    out
}

/// A machine's BMC facts checked against its agent's report.
#[derive(Debug, Clone, PartialEq)]
pub struct HardwareCheck {
    pub differences: Vec<String>,
    /// Who accepted these very differences, and when.
    pub accepted: Option<(String, SystemTime)>,
}

impl HardwareCheck {
    /// Differences nobody accepted: installations wait.
    pub fn blocks(&self) -> bool {
        !self.differences.is_empty() && self.accepted.is_none()
    }

    fn text(&self) -> String {
        self.differences.join("; ")
    }
}

/// The declared cabling against what the switches' LLDP frames told the
/// agent: a NIC declared (by its MAC) on one switch port that hears
/// another is a difference, as a BMC's word against the agent's is.
async fn cabling(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    report: &HardwareSummary,
) -> Result<Vec<String>, BmdbError> {
    let declared = tx
        .query(
            "SELECT switch_name, port_name, mac FROM switch_port \
              WHERE machine_id = $1 AND role = 'nic' AND mac IS NOT NULL ORDER BY switch_name, port_name",
            &[&machine_id],
        )
        .await?;
    let mut out = Vec::new();
    for r in &declared {
        let (switch, port, mac): (String, String, String) = (r.get(0), r.get(1), r.get(2));
        let heard = report
            .nics
            .iter()
            .find(|n| n.mac.eq_ignore_ascii_case(&mac))
            .and_then(|n| n.lldp.as_ref());
        if let Some(l) = heard.filter(|l| !l.names(&switch, &port)) {
            out.push(format!(
                "cabling: NIC {mac} is declared on {switch} port {port}; its switch says {l}"
            ));
        }
    }
    Ok(out)
}

/// Whether a machine booted through its BMC (`machine_bmc_boot`) has had
/// its BMC read: until then nothing can be checked.
pub async fn bmc_unread(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<bool, BmdbError> {
    Ok(tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM machine_bmc_boot WHERE machine_id = $1) \
                AND NOT EXISTS (SELECT 1 FROM machine_bmc_facts WHERE machine_id = $1)",
            &[&machine_id],
        )
        .await?
        .get(0))
}

/// The check of `machine_id`: None until both its BMC's facts and a
/// readable hardware report are stored.
pub async fn check(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Option<HardwareCheck>, BmdbError> {
    let Some(facts) = bmc_facts(tx, machine_id).await? else {
        return Ok(None);
    };
    let Some(raw) = tx
        .query_opt(
            "SELECT hardware_report_raw FROM machine_hardware_report WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?
        .map(|r| r.get::<_, Vec<u8>>(0))
    else {
        return Ok(None);
    };
    judge(tx, machine_id, &facts, &raw).await
}

/// The check of `machine_id` from its BMC's facts and its stored report
/// (`hardware_report_raw`), as read already: None when the report does
/// not read.
pub async fn judge(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    facts: &BmcFacts,
    raw: &[u8],
) -> Result<Option<HardwareCheck>, BmdbError> {
    let Ok(mut report) = shepherd_proto::summary::summarize(raw) else {
        return Ok(None);
    };
    // Secure Boot is one boot's: the BMC's word is compared with the
    // agent's only when the agent still heartbeat after the BMC's facts
    // were last as they are. A system booted since (a tenant's, Secure
    // Boot set as its plan asks) changes them, and is not the agent's.
    if report.secure_boot.is_some() && !agent_heartbeat_since_facts(tx, machine_id).await? {
        report.secure_boot = None;
    }
    let mut c = HardwareCheck {
        differences: differences(facts, &report),
        accepted: None,
    };
    c.differences
        .extend(cabling(tx, machine_id, &report).await?);
    if !c.differences.is_empty() {
        c.accepted = tx
            .query_opt(
                "SELECT accepted_by, accepted_at FROM machine_hardware_accepted \
                 WHERE machine_id = $1 AND differences = $2",
                &[&machine_id, &c.text()],
            )
            .await?
            .map(|r| (r.get(0), r.get(1)));
    }
    Ok(Some(c))
}

/// Whether the machine's agent heartbeat at or after its BMC's facts last
/// changed.
async fn agent_heartbeat_since_facts(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<bool, BmdbError> {
    Ok(tx
        .query_opt(
            "SELECT h.agent_heartbeat_at >= f.changed_at FROM machine_bmc_facts f \
             JOIN machine_agent_heartbeat h ON h.machine_id = f.machine_id WHERE f.machine_id = $1",
            &[&machine_id],
        )
        .await?
        .and_then(|r| r.get::<_, Option<bool>>(0))
        .unwrap_or(false))
}

/// Accepts the machine's differences as they are now; Ok(None) when there
/// is nothing to accept, else the differences accepted.
pub async fn accept(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    by: &str,
) -> Result<Option<String>, BmdbError> {
    let Some(c) = check(tx, machine_id).await? else {
        return Ok(None);
    };
    if c.differences.is_empty() {
        return Ok(None);
    }
    let text = c.text();
    tx.execute(
        "INSERT INTO machine_hardware_accepted (machine_id, differences, accepted_at, accepted_by) \
         VALUES ($1, $2, now(), $3) ON CONFLICT (machine_id) DO UPDATE \
         SET differences = $2, accepted_at = now(), accepted_by = $3",
        &[&machine_id, &text, &by],
    )
    .await?;
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(serial: Option<&str>, memory: Option<f64>) -> BmcFacts {
        BmcFacts {
            bmc_url: "https://10.0.0.5".into(),
            system_path: None,
            system: SystemFacts {
                serial_number: serial.map(String::from),
                memory_gib: memory,
                ..SystemFacts::default()
            },
            read_error: None,
            changed_at: None,
        }
    }

    fn report(serial: &str, memory_gib: f64) -> HardwareSummary {
        HardwareSummary {
            serial_number: serial.into(),
            memory_bytes: (memory_gib * GIB) as i64,
            ..Default::default()
        }
    }

    #[test]
    fn the_wrong_machine_behind_a_bmc_shows() {
        assert!(differences(&facts(Some("SER-1"), Some(16.0)), &report("ser-1 ", 15.6)).is_empty());
        // sushy-tools' libvirt driver says 1 for a 1.5 GiB guest.
        assert!(differences(&facts(None, Some(1.0)), &report("", 1.5)).is_empty());
        let d = differences(&facts(Some("SER-1"), Some(64.0)), &report("SER-2", 15.6));
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(
            d[0].contains("\"SER-1\"") && d[0].contains("\"SER-2\""),
            "{d:?}"
        );
        assert!(d[1].starts_with("memory: the BMC says 64 GiB"), "{d:?}");
        // Unknown on either side, or a firmware placeholder: nothing to say.
        assert!(differences(&facts(None, None), &report("SER-2", 8.0)).is_empty());
        assert!(
            differences(
                &facts(Some("To Be Filled By O.E.M."), None),
                &report("SER-2", 8.0)
            )
            .is_empty()
        );
        assert!(differences(&facts(Some("SER-1"), Some(8.0)), &report("", 0.0)).is_empty());
    }

    #[test]
    fn secure_boot_said_by_the_bmc_and_seen_by_the_agent_must_agree() {
        let with = |current: Option<&str>, agent: Option<&'static str>| {
            let mut f = facts(None, None);
            f.system.secure_boot = Some(SecureBootFacts {
                enable: Some(true),
                current_boot: current.map(String::from),
                mode: None,
            });
            let mut r = report("", 8.0);
            r.secure_boot = agent.map(|state| shepherd_proto::summary::SecureBootSummary {
                state,
                setup_mode: false,
                lockdown: String::new(),
            });
            differences(&f, &r)
        };
        assert!(with(Some("Enabled"), Some("on")).is_empty());
        assert!(with(Some("Disabled"), Some("off")).is_empty());
        let d = with(Some("Enabled"), Some("off"));
        assert_eq!(
            d,
            vec!["Secure Boot: the BMC says this boot has it on, the agent booted with it off"]
        );
        assert_eq!(with(Some("Disabled"), Some("on")).len(), 1);
        // Unknown on either side: nothing to say.
        assert!(with(None, Some("off")).is_empty());
        assert!(with(Some("Enabled"), None).is_empty());
        assert!(with(Some("Enabled"), Some("unknown")).is_empty());
    }
}
