//! The JSON API's answers as types. The handlers serialize these, and the
//! OpenAPI description (`/api/v1/openapi.json`, [`super::openapi`]) is
//! derived from the same types, so the two cannot drift apart.
//!
//! Long on purpose: one type per answer of the API, a list by nature.

use std::borrow::Cow;

use serde::Serialize;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};
use uuid::Uuid;

use crate::bmdb::actions::Audit;
use crate::bmdb::installations::{Installation, Kind};
use crate::bmdb::machines::{Heartbeat, MachineDetail, MachineState, MachineSummary};
use crate::bmdb::rollouts::{Member, Rollout};
use crate::bmdb::{Process, ProviderStatus};

use super::consoles::{ConsoleBody, ConsoleSessionBody};
use super::text::{hex, rfc3339};

/// Every error: what was wrong, naming the field or the path's part.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: String,
}

/// `/readyz`.
#[derive(Serialize, ToSchema)]
pub struct Readiness {
    /// `ok`, or why the BMDB did not answer.
    pub database: String,
    /// This process's BMDB session, if it holds one.
    pub session: Option<Uuid>,
    /// The recovery brake (null when this process does not run the
    /// Recoverer).
    pub recovery_brake: Option<ReadyBrake>,
}

/// `/api/v1/loops`: this process's session and its control loops.
#[derive(Serialize, ToSchema)]
pub struct Loops {
    /// This process's BMDB session, if it holds one.
    pub session: Option<Uuid>,
    pub loops: Vec<LoopBody>,
}

/// A control loop, as every loop tells it.
#[derive(Serialize, ToSchema)]
pub struct LoopBody {
    /// Its registration's name: `initializer`, `provisioner`, ….
    pub name: String,
    /// `lease` (work on one leased machine at a time) or `round` (work
    /// over the fleet on a timer).
    pub kind: String,
    /// A lease loop's BMDB process (`ShepherdAgentStart`).
    pub process: Option<String>,
    /// Whether it takes work now (a session, not draining).
    pub active: bool,
    /// Work running now, and allowed at once.
    pub running: u64,
    pub parallelism: u64,
    /// Work (a machine's, or a round) that ended well, failed, or was
    /// given back (cancelled, or cut short by a lost session).
    pub ok: u64,
    pub failed: u64,
    pub given_back: u64,
    /// A lease loop's leases taken.
    pub leased: u64,
    /// A round loop's fleet duty: `us`, or the session holding it.
    pub duty: Option<String>,
    /// The last failure's cause, and when.
    pub last_error: Option<String>,
    pub last_error_at: Option<String>,
}

impl From<&crate::control::LoopStatus> for LoopBody {
    fn from(l: &crate::control::LoopStatus) -> Self {
        use crate::bmdb::duty::Holder;
        LoopBody {
            name: l.name.to_string(),
            kind: l.kind.as_str().to_string(),
            process: l.process.map(str::to_string),
            active: l.active,
            running: l.running as u64,
            parallelism: l.parallelism as u64,
            ok: l.done,
            failed: l.failed,
            given_back: l.given_back,
            leased: l.leased,
            duty: l.duty.map(|d| match d {
                Holder::Us => "us".to_string(),
                Holder::Other(id) => id.to_string(),
            }),
            last_error: l.last_error.as_ref().map(|(_, e)| e.clone()),
            last_error_at: l.last_error.as_ref().map(|(at, _)| rfc3339(*at)),
        }
    }
}

/// The brake as `/readyz` shows it, or why it could not be read.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum ReadyBrake {
    State {
        engaged: bool,
        reason: Option<String>,
        silent: i64,
        limit: i64,
    },
    Unreadable {
        error: String,
    },
}

/// A machine as the fleet listing shows it.
#[derive(Serialize, ToSchema)]
pub struct Machine {
    pub machine_id: Uuid,
    /// `Equinix`, `Lumen` or `None` (owned hardware).
    pub provider: Option<String>,
    pub provider_id: Option<String>,
    pub address: Option<String>,
    /// The provider's status (`Running`, `Provisioning`, …).
    pub provider_status: Option<String>,
    #[schema(example = "agent-started")]
    pub state: String,
    /// When its agent last called (RFC 3339).
    pub agent_heartbeat: Option<String>,
    /// The tenant's project it is assigned to or runs a device of.
    pub project: Option<String>,
    /// The tenant's device on it (the Metal API's).
    pub device: Option<Uuid>,
}

impl From<&MachineSummary> for Machine {
    fn from(m: &MachineSummary) -> Self {
        Machine {
            machine_id: m.machine_id,
            provider: m.provider.map(|p| p.to_string()),
            provider_id: m.provider_id.clone(),
            address: m.address.clone(),
            provider_status: m.provider_status.map(|s| s.to_string()),
            state: m.state.as_str().to_string(),
            agent_heartbeat: m.agent_heartbeat.map(rfc3339),
            project: None,
            device: None,
        }
    }
}

/// `GET /api/v1/machines`: a page of the fleet.
#[derive(Serialize, ToSchema)]
pub struct MachineList {
    pub machines: Vec<Machine>,
    /// Machines the filter matches (all pages). Exact for a filter of a
    /// state or none; a filter with more stops counting at 10,000.
    pub matching: i64,
    /// More than `matching` machines match (the count stopped).
    pub matching_more: bool,
    /// Machines per state, the whole fleet.
    pub counts: std::collections::BTreeMap<String, i64>,
    pub agents: AgentCounts,
    pub limit: i64,
    pub offset: i64,
}

#[derive(Serialize, ToSchema)]
pub struct AgentCounts {
    pub heartbeating: i64,
    pub silent: i64,
}

impl MachineList {
    pub fn counts(counts: &[(MachineState, i64)]) -> std::collections::BTreeMap<String, i64> {
        counts
            .iter()
            .map(|(s, n)| (s.as_str().to_string(), *n))
            .collect()
    }
}

/// An operator's action, as audited.
#[derive(Serialize, ToSchema)]
pub struct Action {
    pub id: Uuid,
    /// Null for fleet-wide actions (a brake release).
    pub machine_id: Option<Uuid>,
    #[schema(example = "hold")]
    pub action: String,
    /// Who: a token's name, `cli`, or `anonymous`.
    pub actor: String,
    pub timestamp: String,
    pub reason: Option<String>,
    /// What it did.
    pub detail: String,
}

impl From<&Audit> for Action {
    fn from(a: &Audit) -> Self {
        Action {
            id: a.id,
            machine_id: a.machine_id,
            action: a.action.clone(),
            actor: a.actor.clone(),
            timestamp: rfc3339(a.timestamp),
            reason: a.reason.clone(),
            detail: a.detail.clone(),
        }
    }
}

/// The answer to an action: its audit row.
#[derive(Serialize, ToSchema)]
pub struct ActionDone {
    pub action: Action,
}

/// `GET /api/v1/machines/{id}`.
#[derive(Serialize, ToSchema)]
pub struct MachineDetailBody {
    pub machine: Machine,
    pub created_at: String,
    pub tags: Tags,
    pub leases: Vec<Lease>,
    pub backoffs: Vec<Backoff>,
    pub history: Vec<HistoryEvent>,
    pub hold: Option<Hold>,
    pub reboot_requested: Option<RebootRequest>,
    /// A boot into the live agent through the BMC, asked for and not yet
    /// done.
    pub boot_requested: Option<BootRequest>,
    /// What the BMC says against what the agent reported (once both are
    /// known).
    pub hardware_check: Option<HardwareCheckBody>,
    pub operator_actions: Vec<Action>,
    pub installation: Option<InstallationBody>,
    /// Its tenant: the project it is assigned to, the device on it
    /// (the Metal API's, docs/src/tenants.md).
    pub tenancy: Option<TenancyBody>,
    /// Its firmware as its BMC lists it (absent: never read; a Redfish
    /// BMC's only).
    pub firmware: Option<FirmwareBody>,
    /// How it stands against the baseline that selects it (absent: none
    /// does, or its BMC is not read).
    pub baseline: Option<ConformanceBody>,
    /// Its last servicing to its baseline (absent: never serviced):
    /// `service_id`, `baseline`, `phase` (asked, restarting, done,
    /// failed), `applied`, `restarts`, `error`, and when.
    #[schema(value_type = Option<Object>)]
    pub servicing: Option<crate::bmdb::servicing::Service>,
    /// Its serial console during the last boots shepherd made through its
    /// BMC, newest first (empty: none read).
    pub console: Vec<ConsoleBody>,
    /// Who was on its console over shepherd's SSH, newest first (ten at
    /// most).
    pub console_sessions: Vec<ConsoleSessionBody>,
    /// The switch ports its NICs and BMC are cabled to: the network
    /// wanted on each, what the switch answered when read back, when
    /// shepherd last changed it, and the last failure.
    pub ports: Vec<super::network::PortBody>,
    /// Everything that happened to it, newest first (200 at most): work,
    /// operators' actions, installations and erasures, servicings, power
    /// cycles, console captures and connections.
    pub timeline: Vec<super::timeline::MomentBody>,
}

/// A machine against its baseline (`[[baselines]]`).
#[derive(Serialize, ToSchema)]
pub struct ConformanceBody {
    /// The baseline's name.
    pub name: String,
    /// `conforming`, `drifting`, or `unread` (its firmware never read).
    pub conformance: String,
    /// How it differs: `part` (`component`, `bios`, `raid`), `item`,
    /// `desired`, `actual` (absent: not listed by its BMC).
    #[schema(value_type = Vec<Object>)]
    pub differences: Vec<crate::baselines::Difference>,
}

impl ConformanceBody {
    /// None when no baseline selects the machine.
    pub fn of(c: &crate::baselines::Conformance) -> Option<ConformanceBody> {
        Some(ConformanceBody {
            name: c.baseline()?.to_string(),
            conformance: c.as_str().to_string(),
            differences: c.differences().to_vec(),
        })
    }
}

/// A machine's firmware, as its BMC lists it.
#[derive(Serialize, ToSchema)]
pub struct FirmwareBody {
    pub read_at: Option<String>,
    /// Why the last read failed (the components are from the read before).
    pub read_error: Option<String>,
    pub components: Vec<FirmwareComponent>,
    /// The versions seen, newest first (the last 50).
    pub history: Vec<FirmwareSeen>,
    /// The system's BIOS settings (absent: its BMC offers none).
    pub bios: Option<BiosBody>,
    /// The system's storage (absent: its BMC offers none).
    pub storage: Option<StorageBody>,
}

/// A system's storage, as its BMC lists it.
#[derive(Serialize, ToSchema)]
pub struct StorageBody {
    /// Each storage resource: `id`, `name`, `volumes_offered` (whether
    /// volumes can be made through the BMC), `drives[]` (`id`, `name`,
    /// `capacity_bytes`, `media_type`, `protocol`, `serial_number`),
    /// `volumes[]` (`id`, `name`, `raid_type`, `capacity_bytes`,
    /// `drives`: the drives' ids).
    #[schema(value_type = Vec<Object>)]
    pub controllers: Vec<crate::bmdb::firmware::Storage>,
    /// When it last changed.
    pub changed_at: String,
}

/// A system's BIOS settings, as its BMC lists them.
#[derive(Serialize, ToSchema)]
pub struct BiosBody {
    /// `AttributeRegistry`: the registry naming the attributes.
    pub registry: Option<String>,
    /// `Attributes`, by name.
    #[schema(value_type = Object)]
    pub attributes: serde_json::Map<String, serde_json::Value>,
    /// When they last changed.
    pub changed_at: String,
}

#[derive(Serialize, ToSchema)]
pub struct FirmwareComponent {
    /// `bios`, `bmc`, `nic:<Id>`, `inventory:<Id>`.
    pub component: String,
    pub name: Option<String>,
    pub version: String,
    pub updateable: Option<bool>,
    /// When this version was first seen.
    pub since: String,
}

#[derive(Serialize, ToSchema)]
pub struct FirmwareSeen {
    pub component: String,
    /// Absent: the component's first version seen.
    pub previous: Option<String>,
    pub version: String,
    pub seen_at: String,
}

impl From<&crate::bmdb::firmware::Firmware> for FirmwareBody {
    fn from(f: &crate::bmdb::firmware::Firmware) -> Self {
        FirmwareBody {
            read_at: f.read_at.map(rfc3339),
            read_error: f.read_error.clone(),
            components: f
                .components
                .iter()
                .map(|r| FirmwareComponent {
                    component: r.component.component.clone(),
                    name: r.component.name.clone(),
                    version: r.component.version.clone(),
                    updateable: r.component.updateable,
                    since: rfc3339(r.since),
                })
                .collect(),
            history: f
                .history
                .iter()
                .map(|s| FirmwareSeen {
                    component: s.component.clone(),
                    previous: s.previous.clone(),
                    version: s.version.clone(),
                    seen_at: rfc3339(s.seen_at),
                })
                .collect(),
            storage: f.storage.as_ref().map(|(s, at)| StorageBody {
                controllers: s.clone(),
                changed_at: rfc3339(*at),
            }),
            bios: f.bios.as_ref().map(|(b, at)| BiosBody {
                registry: b.registry.clone(),
                attributes: b.attributes.clone(),
                changed_at: rfc3339(*at),
            }),
        }
    }
}

/// A machine's tenant.
#[derive(Serialize, ToSchema)]
pub struct TenancyBody {
    /// The project it is assigned to (absent: the shared pool).
    pub assigned_to: Option<ProjectRef>,
    pub device: Option<DeviceRef>,
}

#[derive(Serialize, ToSchema)]
pub struct ProjectRef {
    pub id: Uuid,
    pub name: String,
}

/// A tenant's device on the machine.
#[derive(Serialize, ToSchema)]
pub struct DeviceRef {
    pub id: Uuid,
    pub project: ProjectRef,
    pub hostname: String,
    /// The Metal API's state (`active`, `provisioning`, …).
    pub state: String,
}

/// The machine's tags in the BMDB.
#[derive(Serialize, ToSchema)]
pub struct Tags {
    pub provided: Option<Provided>,
    pub agent_started: Option<AgentStarted>,
    pub agent_heartbeat: Option<String>,
    /// The agent's hardware report, summarized (or `{"error": …}` when it
    /// cannot be read).
    #[schema(value_type = Option<Object>)]
    pub hardware_report: Option<serde_json::Value>,
    /// The generation of the installation asked for.
    pub installation_request: Option<i32>,
    pub installation_report: Option<InstallationReport>,
    /// Its SSH host key, as recorded at the first takeover.
    pub ssh_host_key: Option<String>,
    pub bmc: Option<Bmc>,
    /// Booted through its BMC (inventory `boot = "virtual-media"` or
    /// `"network"`).
    pub bmc_boot: bool,
    /// How it is booted into the agent: `ssh` (a takeover),
    /// `virtual-media` or `network`.
    pub boot: String,
    /// `boot = "network"`: the provisioning NICs answered for it.
    pub boot_macs: Vec<String>,
    /// It enlisted itself by booting the provisioning network
    /// (`netboot.discover`); `accepted_at` unset: still `discovered`.
    pub discovered: Option<Discovered>,
}

/// How a machine enlisted itself.
#[derive(Serialize, ToSchema)]
pub struct Discovered {
    /// The provisioning NIC it booted from.
    pub mac: String,
    /// `bios` or `uefi`, as its PXE client said.
    pub firmware: String,
    pub discovered_at: String,
    /// Its latest discovery boot, and how many it was given.
    pub last_boot_at: String,
    pub boots: i32,
    pub accepted_at: Option<String>,
    pub accepted_by: Option<String>,
    /// Accepted, its disks' erasure not asked yet: it waits for its BMC to
    /// be read and to agree with its agent (`erase_refused`: why not yet).
    pub erase_pending: bool,
    pub erase_refused: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct Provided {
    pub provider: String,
    pub provider_id: String,
    pub reservation_id: Option<String>,
    pub address: Option<String>,
    pub location: Option<String>,
    pub status: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct AgentStarted {
    pub at: String,
    /// The agent's Ed25519 public key, hex.
    pub public_key: String,
}

#[derive(Serialize, ToSchema)]
pub struct InstallationReport {
    pub generation: i32,
    /// `Success` or `Error`.
    pub result: String,
}

/// What the machine's BMC says.
#[derive(Serialize, ToSchema)]
pub struct Bmc {
    pub bmc_url: String,
    /// `redfish` or `ipmi`, by the URL's scheme.
    pub protocol: String,
    pub system: Option<String>,
    pub power_state: Option<String>,
    pub manufacturer: Option<String>,
    pub model: Option<String>,
    pub serial_number: Option<String>,
    pub bios_version: Option<String>,
    pub processor_count: Option<i64>,
    pub processor_model: Option<String>,
    pub memory_gib: Option<f64>,
    pub health: Option<String>,
    /// Redfish `SecureBoot.SecureBootEnable`: on at the next boot (null:
    /// not read: an IPMI BMC, or none offered).
    pub secure_boot_enable: Option<bool>,
    /// `SecureBootCurrentBoot`: `Enabled` or `Disabled`.
    pub secure_boot_current_boot: Option<String>,
    /// `SecureBootMode`: `SetupMode`, `UserMode`, `AuditMode`,
    /// `DeployedMode`.
    pub secure_boot_mode: Option<String>,
    pub read_error: Option<String>,
    pub changed_at: Option<String>,
}

/// The BMDB's facts as the API shows them (flat, as since V6).
impl From<&crate::bmdb::hardware::BmcFacts> for Bmc {
    fn from(f: &crate::bmdb::hardware::BmcFacts) -> Self {
        let s = f.system.clone();
        Bmc {
            bmc_url: f.bmc_url.clone(),
            protocol: f.protocol().to_string(),
            system: f.system_path.clone(),
            power_state: s.power_state,
            manufacturer: s.manufacturer,
            model: s.model,
            serial_number: s.serial_number,
            bios_version: s.bios_version,
            processor_count: s.processor_count.map(i64::from),
            processor_model: s.processor_model,
            memory_gib: s.memory_gib,
            health: s.health,
            secure_boot_enable: s.secure_boot.as_ref().and_then(|b| b.enable),
            secure_boot_current_boot: s.secure_boot.as_ref().and_then(|b| b.current_boot.clone()),
            secure_boot_mode: s.secure_boot.as_ref().and_then(|b| b.mode.clone()),
            read_error: f.read_error.clone(),
            changed_at: f.changed_at.map(rfc3339),
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct Lease {
    pub process: String,
    pub session_id: Uuid,
    pub component: String,
}

#[derive(Serialize, ToSchema)]
pub struct Backoff {
    pub process: String,
    pub until: String,
    pub cause: String,
    pub last_interval_seconds: Option<i64>,
}

#[derive(Serialize, ToSchema)]
pub struct HistoryEvent {
    pub process: String,
    /// `Started`, `Finished`, `Failed` or `Canceled`.
    pub event: String,
    pub timestamp: String,
    pub cause: Option<String>,
    pub detail: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct Hold {
    pub by: String,
    pub since: String,
    pub reason: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct HardwareCheckBody {
    /// Each fact told differently (serial number, memory), in words.
    pub differences: Vec<String>,
    /// Who accepted these differences, and when.
    pub accepted_by: Option<String>,
    pub accepted_at: Option<String>,
    /// Installations wait for an operator's acceptance.
    pub blocks_installation: bool,
}

#[derive(Serialize, ToSchema)]
pub struct BootRequest {
    /// `enroll`, `inspect`, `recovery` or `install`.
    pub cause: String,
    pub by: String,
    pub at: String,
    pub reason: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct RebootRequest {
    pub by: String,
    pub at: String,
}

impl From<&MachineDetail> for MachineDetailBody {
    fn from(d: &MachineDetail) -> Self {
        let mut machine = Machine::from(&d.summary);
        if let Some(t) = &d.tenancy {
            machine.project = t
                .device
                .as_ref()
                .map(|x| x.project.1.clone())
                .or_else(|| t.assigned_to.as_ref().map(|(_, n)| n.clone()));
            machine.device = t.device.as_ref().map(|x| x.id);
        }
        MachineDetailBody {
            machine,
            created_at: rfc3339(d.created_at),
            tags: Tags {
                provided: d.provided.as_ref().map(|p| Provided {
                    provider: p.provider.to_string(),
                    provider_id: p.provider_id.clone(),
                    reservation_id: p.reservation_id.clone(),
                    address: p.ip_address.clone(),
                    location: p.location.clone(),
                    status: p.status.map(|s| s.to_string()),
                }),
                agent_started: d.agent_started.as_ref().map(|(at, key)| AgentStarted {
                    at: rfc3339(*at),
                    public_key: hex(key),
                }),
                agent_heartbeat: d.agent_heartbeat.map(rfc3339),
                hardware_report: d.hardware_report.as_deref().map(|raw| {
                    match shepherd_proto::summary::summarize(raw) {
                        Ok(h) => serde_json::to_value(h).unwrap_or_default(),
                        Err(e) => serde_json::json!({ "error": e }),
                    }
                }),
                installation_request: d.installation_request,
                installation_report: d.installation_report.map(|(g, r)| InstallationReport {
                    generation: g,
                    result: r.to_string(),
                }),
                ssh_host_key: d.ssh_host_key.clone(),
                bmc: d.bmc.as_ref().map(Bmc::from),
                bmc_boot: d.bmc_boot,
                boot: d.boot_via.clone().unwrap_or_else(|| {
                    if d.discovery.is_some() {
                        "network".into()
                    } else {
                        "ssh".into()
                    }
                }),
                boot_macs: d.boot_macs.iter().map(|m| m.to_string()).collect(),
                discovered: d.discovery.as_ref().map(|x| Discovered {
                    mac: x.mac.clone(),
                    firmware: x.firmware.clone(),
                    discovered_at: rfc3339(x.discovered_at),
                    last_boot_at: rfc3339(x.last_boot_at),
                    boots: x.boots,
                    accepted_at: x.accepted_at.map(rfc3339),
                    accepted_by: x.accepted_by.clone(),
                    erase_pending: x.erase_pending,
                    erase_refused: x.erase_refused.clone(),
                }),
            },
            leases: d
                .leases
                .iter()
                .map(|l| Lease {
                    process: l.process.to_string(),
                    session_id: l.session_id,
                    component: l.component.clone(),
                })
                .collect(),
            backoffs: d
                .backoffs
                .iter()
                .map(|(p, b)| Backoff {
                    process: p.to_string(),
                    until: rfc3339(b.until),
                    cause: b.cause.clone(),
                    last_interval_seconds: b.last_interval_seconds,
                })
                .collect(),
            history: d
                .history
                .iter()
                .map(|h| HistoryEvent {
                    process: h.process.to_string(),
                    event: h.event.to_string(),
                    timestamp: rfc3339(h.timestamp),
                    cause: h.failed_cause.clone(),
                    detail: h.detail.clone(),
                })
                .collect(),
            hold: d.hold.as_ref().map(|h| Hold {
                by: h.by.clone(),
                since: rfc3339(h.since),
                reason: h.reason.clone(),
            }),
            reboot_requested: d.reboot_request.as_ref().map(|(by, at)| RebootRequest {
                by: by.clone(),
                at: rfc3339(*at),
            }),
            boot_requested: d.boot_request.as_ref().map(|r| BootRequest {
                cause: r.cause.to_string(),
                by: r.requested_by.clone(),
                at: rfc3339(r.requested_at),
                reason: r.reason.clone(),
            }),
            hardware_check: d.hardware_check.as_ref().map(|c| HardwareCheckBody {
                differences: c.differences.clone(),
                accepted_by: c.accepted.as_ref().map(|(by, _)| by.clone()),
                accepted_at: c.accepted.as_ref().map(|(_, at)| rfc3339(*at)),
                blocks_installation: c.blocks(),
            }),
            operator_actions: d.actions.iter().map(Action::from).collect(),
            installation: d.installation.as_ref().map(InstallationBody::from),
            tenancy: d.tenancy.as_ref().map(|t| TenancyBody {
                assigned_to: t.assigned_to.as_ref().map(|(id, name)| ProjectRef {
                    id: *id,
                    name: name.clone(),
                }),
                device: t.device.as_ref().map(|d| DeviceRef {
                    id: d.id,
                    project: ProjectRef {
                        id: d.project.0,
                        name: d.project.1.clone(),
                    },
                    hostname: d.hostname.clone(),
                    state: d.state.to_string(),
                }),
            }),
            firmware: d.firmware.read_at.map(|_| FirmwareBody::from(&d.firmware)),
            baseline: None,
            servicing: d.service.clone(),
            console: d.consoles.iter().map(ConsoleBody::from).collect(),
            console_sessions: d
                .console_sessions
                .iter()
                .map(ConsoleSessionBody::from)
                .collect(),
            ports: d.ports.iter().map(Into::into).collect(),
            timeline: d.timeline.iter().map(Into::into).collect(),
        }
    }
}

/// A machine's installation, with the agent's latest progress.
#[derive(Serialize, ToSchema)]
pub struct InstallationBody {
    pub generation: i32,
    pub image_url: String,
    pub image_digest: String,
    pub requested_by: String,
    pub requested_at: String,
    pub rollout_id: Option<Uuid>,
    /// `installing`, `installed` or `install-failed`; for an erasure
    /// (deprovisioning) `cleaning`, `available` or `clean-failed`.
    pub state: String,
    /// `erase`: a deprovisioning, no image.
    pub kind: Kind,
    /// An erasure's mode: `metadata`, `discard`, `secure`, `overwrite`.
    pub erase_mode: Option<String>,
    /// The first-boot data: the volume, each file's name, size and
    /// SHA-256 (never its content).
    pub first_boot: Option<String>,
    pub progress: Option<Progress>,
    /// `Success` or `Error`, once reported.
    pub result: Option<String>,
    pub error: Option<String>,
    pub history: Vec<InstallationEvent>,
}

#[derive(Serialize, ToSchema)]
pub struct Progress {
    /// `preparing`, `writing`, `verifying`, `first-boot`, `done`, `failed`,
    /// `rebooting`; `erasing` for an erasure.
    pub phase: String,
    /// An erasure fetches nothing: 0.
    pub bytes_fetched: i64,
    /// Written to the disks; for an erasure, written or discarded.
    pub bytes_written: i64,
    pub bytes_total: i64,
    /// Of the bytes fetched; for an erasure, of those written or
    /// discarded.
    pub rate_bytes_per_second: i64,
    pub disk: String,
    pub resumes: i32,
    /// Of `bytes_fetched`, those from other machines installing the same
    /// image (`installations.peers`) rather than the image server.
    pub bytes_from_peers: i64,
    /// Chunks a source sent wrong, refused and fetched again.
    pub chunks_refused: i32,
    pub at: String,
}

#[derive(Serialize, ToSchema)]
pub struct InstallationEvent {
    pub generation: i32,
    /// `requested`, `installed`, `failed`, `erase-requested`, `erased`,
    /// `erase-failed`; `restarted` (its agent began it again from the
    /// start: the detail says how far it had come); `timed-out` (shepherd
    /// failed it when nothing moved for `installations.deadline`: the
    /// detail is the cause).
    pub event: String,
    pub timestamp: String,
    pub detail: Option<String>,
}

impl From<&Installation> for InstallationBody {
    fn from(i: &Installation) -> Self {
        InstallationBody {
            generation: i.generation,
            image_url: i.image_url.clone(),
            image_digest: i.image_digest.clone(),
            requested_by: i.requested_by.clone(),
            requested_at: rfc3339(i.requested_at),
            rollout_id: i.rollout_id,
            state: i.state.clone(),
            kind: i.kind,
            erase_mode: i.erase_mode.clone(),
            first_boot: i.first_boot.clone(),
            progress: i.progress.as_ref().map(|(p, at)| Progress {
                phase: phase_name(p.phase).to_string(),
                bytes_fetched: p.bytes_fetched,
                bytes_written: p.bytes_written,
                bytes_total: p.bytes_total,
                rate_bytes_per_second: p.rate_bytes_per_second,
                disk: p.disk.clone(),
                resumes: p.resumes,
                bytes_from_peers: p.bytes_from_peers,
                chunks_refused: p.chunks_refused,
                at: rfc3339(*at),
            }),
            result: i.result.as_ref().map(|(r, _)| r.to_string()),
            error: i.result.as_ref().and_then(|(_, e)| e.clone()),
            history: i
                .history
                .iter()
                .map(|h| InstallationEvent {
                    generation: h.generation,
                    event: h.event.clone(),
                    timestamp: rfc3339(h.timestamp),
                    detail: h.detail.clone(),
                })
                .collect(),
        }
    }
}

/// The answer to an install: the generation asked for and the audit row.
#[derive(Serialize, ToSchema)]
pub struct InstallAsked {
    pub generation: i32,
    pub action: Action,
}

/// A rollout: an image over a set of machines, a few at a time.
#[derive(Serialize, ToSchema)]
#[schema(as = Rollout)]
pub struct RolloutView {
    pub rollout_id: Uuid,
    /// The image every machine installs; null for a deprovisioning or a
    /// servicing.
    pub image_url: Option<String>,
    /// `install`, `erase` (a deprovisioning: no image), or `service` (to
    /// `baseline`).
    pub kind: String,
    /// A servicing's baseline (`[[baselines]]` name).
    pub baseline: Option<String>,
    /// A deprovisioning's erase mode: `metadata`, `discard`, `secure`,
    /// `overwrite`.
    pub erase_mode: Option<String>,
    pub max_parallel: i32,
    pub max_failures: i32,
    /// How the machines were chosen.
    pub selection: String,
    pub created_at: String,
    pub created_by: String,
    /// `running`, `done`, `stopped` or `canceled`.
    pub state: String,
    pub ended_at: Option<String>,
    pub end_reason: Option<String>,
    pub counts: RolloutCounts,
}

#[derive(Serialize, ToSchema)]
pub struct RolloutCounts {
    pub waiting: i64,
    pub running: i64,
    pub done: i64,
    pub failed: i64,
    pub skipped: i64,
}

impl From<&Rollout> for RolloutView {
    fn from(r: &Rollout) -> Self {
        RolloutView {
            rollout_id: r.id,
            image_url: (r.erasure.is_none() && r.baseline.is_none()).then(|| r.image_url.clone()),
            kind: match (&r.baseline, &r.erasure) {
                (Some(_), _) => "service",
                (None, Some(_)) => "erase",
                (None, None) => "install",
            }
            .to_string(),
            baseline: r.baseline.clone(),
            erase_mode: r
                .erasure
                .as_ref()
                .map(|e| shepherd_proto::names::erase_mode_name_of(e.mode).to_string()),
            max_parallel: r.max_parallel,
            max_failures: r.max_failures,
            selection: r.selection.clone(),
            created_at: rfc3339(r.created_at),
            created_by: r.created_by.clone(),
            state: r.state.clone(),
            ended_at: r.ended_at.map(rfc3339),
            end_reason: r.end_reason.clone(),
            counts: RolloutCounts {
                waiting: r.counts.waiting,
                running: r.counts.running,
                done: r.counts.done,
                failed: r.counts.failed,
                skipped: r.counts.skipped,
            },
        }
    }
}

/// A machine of a rollout.
#[derive(Serialize, ToSchema)]
pub struct RolloutMachine {
    pub machine_id: Uuid,
    pub position: i32,
    /// `waiting`, `running`, `done`, `failed` or `skipped`.
    pub state: String,
    pub generation: Option<i32>,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    pub error: Option<String>,
}

impl From<&Member> for RolloutMachine {
    fn from(m: &Member) -> Self {
        RolloutMachine {
            machine_id: m.machine_id,
            position: m.position,
            state: m.state.clone(),
            generation: m.generation,
            started_at: m.started_at.map(rfc3339),
            ended_at: m.ended_at.map(rfc3339),
            error: m.error.clone(),
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct RolloutOne {
    pub rollout: RolloutView,
}

#[derive(Serialize, ToSchema)]
pub struct RolloutList {
    pub rollouts: Vec<RolloutView>,
}

#[derive(Serialize, ToSchema)]
pub struct RolloutDetail {
    pub rollout: RolloutView,
    pub machines: Vec<RolloutMachine>,
}

#[derive(Serialize, ToSchema)]
pub struct ImageList {
    pub images: Vec<Image>,
}

#[derive(Serialize, ToSchema)]
pub struct Image {
    pub name: String,
    pub size_bytes: u64,
}

/// The recovery brake.
#[derive(Serialize, ToSchema)]
pub struct Brake {
    pub engaged: bool,
    pub reason: Option<String>,
    pub silent: i64,
    pub fleet: i64,
    pub limit: i64,
    pub power_actions_in_window: i64,
    pub window_seconds: u64,
    pub engaged_since: Option<String>,
    pub released_until: Option<String>,
    pub released_by: Option<String>,
}

impl From<&crate::bmdb::brake::BrakeState> for Brake {
    fn from(b: &crate::bmdb::brake::BrakeState) -> Self {
        Brake {
            engaged: b.engaged,
            reason: b.reason.clone(),
            silent: b.silent,
            fleet: b.fleet,
            limit: b.limit,
            power_actions_in_window: b.power_actions_in_window,
            window_seconds: b.window.as_secs(),
            engaged_since: b.engaged_since.map(rfc3339),
            released_until: b.released_until.map(rfc3339),
            released_by: b.released_by.clone(),
        }
    }
}

/// `GET /api/v1/brake`.
#[derive(Serialize, ToSchema)]
pub struct BrakeBody {
    pub brake: Brake,
    /// The agent callback endpoints shepherds serve: silence is judged
    /// only on machines whose endpoint was served for the whole threshold.
    pub callback_endpoints: Vec<CallbackEndpoint>,
    /// The last fleet-wide actions.
    pub operator_actions: Vec<Action>,
}

#[derive(Serialize, ToSchema)]
pub struct CallbackEndpoint {
    pub endpoint: String,
    pub served: bool,
    pub serving_since: String,
    pub served_until: String,
    /// Agents told this endpoint at their takeover: while it is not
    /// served, nobody hears them (they are re-homed after
    /// `recoverer.rehome_after`).
    pub agents: i64,
}

pub use shepherd_proto::names::phase_name;

// ---- values the API takes, for the OpenAPI description ----

/// A string schema whose values are `values` (and the empty string, "no
/// filter", when `empty` is set).
fn names(values: impl IntoIterator<Item = String>, empty: bool, what: &str) -> RefOr<Schema> {
    let mut all: Vec<String> = values.into_iter().collect();
    if empty {
        all.push(String::new());
    }
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(all))
        .description(Some(what))
        .into()
}

macro_rules! name_schema {
    ($name:ident, $values:expr, $empty:expr, $what:literal) => {
        #[doc = $what]
        pub struct $name;
        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                names($values, $empty, $what)
            }
        }
        impl ToSchema for $name {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }
        }
    };
}

name_schema!(
    MachineStateName,
    MachineState::ALL.iter().map(|s| s.as_str().to_string()),
    true,
    "A machine's state (empty: any)"
);
name_schema!(
    ProviderStatusName,
    ProviderStatus::ALL.iter().map(|s| s.to_string()),
    true,
    "A provider status (empty: any)"
);
name_schema!(
    HeartbeatName,
    Heartbeat::ALL.iter().map(|h| h.as_str().to_string()),
    true,
    "Whether the agent calls (empty: any)"
);
name_schema!(
    BmcName,
    crate::bmdb::machines::BmcKind::ALL
        .iter()
        .map(|b| b.as_str().to_string()),
    true,
    "A BMC's protocol as last read, or none (empty: any)"
);
name_schema!(
    BootName,
    crate::config::BootMethod::ALL
        .iter()
        .map(|b| b.as_str().to_string()),
    true,
    "How shepherd reaches a machine first (empty: any)"
);
name_schema!(
    ProcessName,
    Process::ALL.iter().map(|p| p.to_string()),
    true,
    "A process whose backoff to clear (empty: every one)"
);
name_schema!(
    ActionName,
    crate::bmdb::actions::Action::ACTIONS
        .iter()
        .map(|a| a.as_str().to_string()),
    false,
    "An operator's action"
);

/// An empty JSON object.
#[derive(serde::Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}
