//! What is below a machine's operating system, as its BMC lists it
//! (`redfish::firmware`): the firmware it runs, with every version each
//! component was seen at, its BIOS settings and its storage (controllers,
//! drives, volumes). What the machine page, the API and `/metrics` show,
//! and what a declared baseline will be compared with.

use std::collections::HashMap;
use std::time::SystemTime;

use uuid::Uuid;

use super::{BmdbError, Tx};

/// One firmware component of a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component {
    /// `bios` (the system's), `bmc` (its manager's own), `nic:<Id>` (a
    /// network adapter's), `inventory:<Id>` (a member of the BMC's
    /// firmware inventory).
    pub component: String,
    /// What the BMC calls it, when it says.
    pub name: Option<String>,
    pub version: String,
    /// Whether the BMC says it can update it, when it says.
    pub updateable: Option<bool>,
}

/// The system's BIOS settings, as its BMC lists them (its `Bios`
/// resource).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bios {
    /// `AttributeRegistry`: the registry that names the attributes.
    pub registry: Option<String>,
    /// `Attributes`, by name.
    pub attributes: serde_json::Map<String, serde_json::Value>,
}

/// A storage resource (a controller, or a group of them) with its drives
/// and volumes.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Storage {
    pub id: String,
    pub name: Option<String>,
    /// Whether it offers a `Volumes` collection: volumes (RAID) made
    /// through the BMC.
    pub volumes_offered: bool,
    pub drives: Vec<Drive>,
    pub volumes: Vec<Volume>,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Drive {
    pub id: String,
    pub name: Option<String>,
    pub capacity_bytes: Option<i64>,
    /// `HDD`, `SSD`.
    pub media_type: Option<String>,
    /// `SAS`, `SATA`, `NVMe`.
    pub protocol: Option<String>,
    pub serial_number: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Volume {
    pub id: String,
    pub name: Option<String>,
    /// `RAIDType` (`RAID1`, …), else the older `VolumeType` (`Mirrored`).
    pub raid_type: Option<String>,
    pub capacity_bytes: Option<i64>,
    /// The drives it is made of, by their `Id`.
    pub drives: Vec<String>,
}

/// One read of a machine's firmware: its components, and its BIOS
/// settings and storage where the BMC offers them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    pub components: Vec<Component>,
    pub bios: Option<Bios>,
    pub storage: Option<Vec<Storage>>,
    /// The parts the BMC answered with an error (what, and the error):
    /// left out of this reading, and what the read before found of them
    /// kept.
    pub partial: Vec<String>,
}

/// A component as recorded: since when it runs this version.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub component: Component,
    pub since: SystemTime,
}

/// A version seen: the component's first (`previous` None), or a change.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub component: String,
    pub previous: Option<String>,
    pub version: String,
    pub seen_at: SystemTime,
}

/// A machine's firmware: its components, their versions over time, and
/// the last read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Firmware {
    pub components: Vec<Recorded>,
    /// Newest first.
    pub history: Vec<Seen>,
    pub read_at: Option<SystemTime>,
    /// Why the last read failed (the components are from the read before).
    pub read_error: Option<String>,
    /// Its BIOS settings, and when they last changed.
    pub bios: Option<(Bios, SystemTime)>,
    /// Its storage, and when it last changed.
    pub storage: Option<(Vec<Storage>, SystemTime)>,
}

/// Records one read of `machine_id`'s firmware. A list replaces the one
/// before (a component gone from it is removed, unless the reading is
/// partial) and each version not seen before gets a history row; a failed
/// read keeps the components and records its cause, a partial one the
/// parts it left out. Ok(the versions seen for the first time).
pub async fn record(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    read: &Result<Reading, String>,
) -> Result<Vec<Seen>, BmdbError> {
    let error = match read {
        Err(e) => Some(e.clone()),
        Ok(r) if !r.partial.is_empty() => Some(format!("partly read: {}", r.partial.join("; "))),
        Ok(_) => None,
    };
    tx.execute(
        "INSERT INTO machine_firmware_read (machine_id, read_at, read_error) VALUES ($1, now(), $2) \
         ON CONFLICT (machine_id) DO UPDATE SET read_at = now(), read_error = $2",
        &[&machine_id, &error],
    )
    .await?;
    let Ok(Reading {
        components,
        bios,
        storage,
        partial,
    }) = read
    else {
        return Ok(Vec::new());
    };
    if let Some(s) = storage {
        let storage = serde_json::to_value(s).expect("storage serializes");
        tx.execute(
            "INSERT INTO machine_storage (machine_id, storage) VALUES ($1, $2) \
             ON CONFLICT (machine_id) DO UPDATE SET storage = $2, changed_at = now() \
             WHERE machine_storage.storage <> $2",
            &[&machine_id, &storage],
        )
        .await?;
    }
    if let Some(b) = bios {
        let attributes = serde_json::Value::Object(b.attributes.clone());
        tx.execute(
            "INSERT INTO machine_bios (machine_id, registry, attributes) VALUES ($1, $2, $3) \
             ON CONFLICT (machine_id) DO UPDATE SET registry = $2, attributes = $3, changed_at = now() \
             WHERE machine_bios.registry IS DISTINCT FROM $2 OR machine_bios.attributes <> $3",
            &[&machine_id, &b.registry, &attributes],
        )
        .await?;
    }
    let before: HashMap<String, String> = tx
        .query(
            "SELECT component, version FROM machine_firmware WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut seen = Vec::new();
    for c in components {
        let previous = before.get(&c.component);
        if previous == Some(&c.version) {
            tx.execute(
                "UPDATE machine_firmware SET name = $3, updateable = $4 \
                 WHERE machine_id = $1 AND component = $2",
                &[&machine_id, &c.component, &c.name, &c.updateable],
            )
            .await?;
            continue;
        }
        let at: SystemTime = tx
            .query_one(
                "WITH h AS (INSERT INTO machine_firmware_history (machine_id, component, version, previous) \
                 VALUES ($1, $2, $3, $4) RETURNING seen_at) \
                 INSERT INTO machine_firmware (machine_id, component, name, version, updateable, since) \
                 SELECT $1, $2, $5, $3, $6, seen_at FROM h \
                 ON CONFLICT (machine_id, component) DO UPDATE \
                 SET name = $5, version = $3, updateable = $6, since = EXCLUDED.since \
                 RETURNING since",
                &[
                    &machine_id,
                    &c.component,
                    &c.version,
                    &previous,
                    &c.name,
                    &c.updateable,
                ],
            )
            .await?
            .get(0);
        seen.push(Seen {
            component: c.component.clone(),
            previous: previous.cloned(),
            version: c.version.clone(),
            seen_at: at,
        });
    }
    if !partial.is_empty() {
        // A part left out: its components are not gone.
        return Ok(seen);
    }
    let listed: Vec<&str> = components.iter().map(|c| c.component.as_str()).collect();
    tx.execute(
        "DELETE FROM machine_firmware WHERE machine_id = $1 AND component <> ALL($2)",
        &[&machine_id, &listed],
    )
    .await?;
    Ok(seen)
}

/// When each of `machine_ids` last had its firmware read, and the BIOS
/// version then recorded: the Updater reads again what is due.
pub async fn last_reads(
    tx: &mut Tx<'_>,
    machine_ids: &[Uuid],
) -> Result<HashMap<Uuid, (SystemTime, Option<String>)>, BmdbError> {
    Ok(tx
        .query(
            "SELECT r.machine_id, r.read_at, f.version FROM machine_firmware_read r \
             LEFT JOIN machine_firmware f ON f.machine_id = r.machine_id AND f.component = 'bios' \
             WHERE r.machine_id = ANY($1)",
            &[&machine_ids],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect())
}

/// BIOS settings from `machine_bios`' `registry` and `attributes`.
fn bios_of(registry: Option<String>, attributes: serde_json::Value) -> Bios {
    Bios {
        registry,
        attributes: match attributes {
            serde_json::Value::Object(m) => m,
            _ => serde_json::Map::new(),
        },
    }
}

/// `machine_id`'s firmware as recorded (its last 50 versions seen).
pub async fn of_machine(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Firmware, BmdbError> {
    let components = tx
        .query(
            "SELECT component, name, version, updateable, since FROM machine_firmware \
             WHERE machine_id = $1 ORDER BY component",
            &[&machine_id],
        )
        .await?
        .iter()
        .map(|r| Recorded {
            component: Component {
                component: r.get(0),
                name: r.get(1),
                version: r.get(2),
                updateable: r.get(3),
            },
            since: r.get(4),
        })
        .collect();
    let history = tx
        .query(
            "SELECT component, previous, version, seen_at FROM machine_firmware_history \
             WHERE machine_id = $1 ORDER BY seen_at DESC, component LIMIT 50",
            &[&machine_id],
        )
        .await?
        .iter()
        .map(|r| Seen {
            component: r.get(0),
            previous: r.get(1),
            version: r.get(2),
            seen_at: r.get(3),
        })
        .collect();
    let read = tx
        .query_opt(
            "SELECT read_at, read_error FROM machine_firmware_read WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?;
    let bios = tx
        .query_opt(
            "SELECT registry, attributes, changed_at FROM machine_bios WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?
        .map(|r| (bios_of(r.get(0), r.get(1)), r.get(2)));
    let storage = tx
        .query_opt(
            "SELECT storage, changed_at FROM machine_storage WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?
        .and_then(|r| {
            let s: Vec<Storage> = serde_json::from_value(r.get(0)).ok()?;
            Some((s, r.get(1)))
        });
    Ok(Firmware {
        components,
        history,
        read_at: read.as_ref().map(|r| r.get(0)),
        read_error: read.as_ref().and_then(|r| r.get(1)),
        bios,
        storage,
    })
}

/// Machines per component and version, the fleet's firmware at a glance
/// (`/metrics`' `shepherd_machines_by_firmware`, the fleet page).
pub async fn versions(tx: &mut Tx<'_>) -> Result<Vec<(String, String, i64)>, BmdbError> {
    Ok(tx
        .query(
            "SELECT component, version, count(*) FROM machine_firmware \
             GROUP BY component, version ORDER BY component, version",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// What is known below one machine's operating system, and what a
/// baseline is chosen by: the BMC's facts, the agent's report (for its
/// plan), the last firmware read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Below {
    pub machine_id: Uuid,
    pub manufacturer: Option<String>,
    pub model: Option<String>,
    /// The agent's hardware report, as it sent it.
    pub hardware_report: Option<Vec<u8>>,
    /// `SecureBootEnable` as its BMC says.
    pub bmc_secure_boot: Option<bool>,
    pub components: Vec<Component>,
    pub bios: Option<Bios>,
    pub storage: Option<Vec<Storage>>,
    /// None: its firmware was never read.
    pub read_at: Option<SystemTime>,
}

/// What is known below the operating system of every machine whose BMC
/// is read (Redfish's: `machine_bmc_facts`), or of these; their agents'
/// reports only when `reports` (a plan is computed from them: fleet-wide,
/// they are the bulk of the read).
pub async fn below(
    tx: &mut Tx<'_>,
    only: Option<&[Uuid]>,
    reports: bool,
) -> Result<Vec<Below>, BmdbError> {
    let rows = tx
        .query(
            "SELECT f.machine_id, f.manufacturer, f.model, \
                    CASE WHEN $2 THEN hr.hardware_report_raw END, \
                    f.secure_boot_enable, r.read_at, b.registry, b.attributes, s.storage \
               FROM machine_bmc_facts f \
               LEFT JOIN machine_hardware_report hr ON hr.machine_id = f.machine_id \
               LEFT JOIN machine_firmware_read r ON r.machine_id = f.machine_id \
               LEFT JOIN machine_bios b ON b.machine_id = f.machine_id \
               LEFT JOIN machine_storage s ON s.machine_id = f.machine_id \
              WHERE $1::uuid[] IS NULL OR f.machine_id = ANY($1) \
              ORDER BY f.machine_id",
            &[&only, &reports],
        )
        .await?;
    let mut components: HashMap<Uuid, Vec<Component>> = HashMap::new();
    for r in tx
        .query(
            "SELECT machine_id, component, name, version, updateable FROM machine_firmware \
              WHERE $1::uuid[] IS NULL OR machine_id = ANY($1) ORDER BY machine_id, component",
            &[&only],
        )
        .await?
    {
        components.entry(r.get(0)).or_default().push(Component {
            component: r.get(1),
            name: r.get(2),
            version: r.get(3),
            updateable: r.get(4),
        });
    }
    Ok(rows
        .iter()
        .map(|r| {
            let machine_id: Uuid = r.get(0);
            let bios = r
                .get::<_, Option<serde_json::Value>>(7)
                .map(|a| bios_of(r.get(6), a));
            Below {
                machine_id,
                manufacturer: r.get(1),
                model: r.get(2),
                hardware_report: r.get(3),
                bmc_secure_boot: r.get(4),
                read_at: r.get(5),
                bios,
                storage: r
                    .get::<_, Option<serde_json::Value>>(8)
                    .and_then(|s| serde_json::from_value(s).ok()),
                components: components.remove(&machine_id).unwrap_or_default(),
            }
        })
        .collect())
}
