//! The Equinix Metal API objects shepherd uses (shared/CONTRACTS.md §3),
//! named as in the OpenAPI description. Unknown fields are ignored; only what
//! shepherd relies on is required. The simulator serializes the same types.

use serde::{Deserialize, Serialize};

/// `{"href": "…"}`: a reference to another object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Href {
    pub href: String,
}

/// Pagination metadata of a list response.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<Href>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<Href>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Href>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Href>,
    #[serde(rename = "self", default, skip_serializing_if = "Option::is_none")]
    pub self_: Option<Href>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_page: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_page: Option<i64>,
}

/// The error body of 4xx and 5xx responses: `error` or `errors`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

impl ErrorBody {
    pub fn message(&self) -> String {
        let mut parts: Vec<&str> = self.error.iter().map(String::as_str).collect();
        parts.extend(self.errors.iter().map(String::as_str));
        parts.join("; ")
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IpAssignment {
    pub address: String,
    /// 4 or 6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_family: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub management: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netmask: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub href: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// The device the address is assigned to (Equinix's SDKs require it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assigned_to: Option<Href>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metro {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub code: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub country: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facility {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub code: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slug: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatingSystem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slug: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A device's reference to its hardware reservation: an href, or the whole
/// object when included.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReservationRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub href: Option<String>,
}

/// Device states (the OpenAPI enum); anything else reads as `Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceState {
    Queued,
    Provisioning,
    Deprovisioning,
    Reinstalling,
    Active,
    Inactive,
    Failed,
    PoweringOn,
    PoweringOff,
    Deleted,
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub href: Option<String>,
    #[serde(default)]
    pub hostname: String,
    pub state: DeviceState,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub ip_addresses: Vec<IpAssignment>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metro: Option<Metro>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facility: Option<Facility>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_system: Option<OperatingSystem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_reservation: Option<ReservationRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locked: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_instance: Option<bool>,
}

impl Device {
    /// The first public address, IPv4 before IPv6 (CONTRACTS.md §3).
    pub fn public_address(&self) -> Option<std::net::IpAddr> {
        let public = || {
            self.ip_addresses
                .iter()
                .filter(|a| a.public.unwrap_or(false))
                .filter_map(|a| a.address.parse::<std::net::IpAddr>().ok())
        };
        public()
            .find(|a| a.is_ipv4())
            .or_else(|| public().find(|a| a.is_ipv6()))
    }

    /// The hardware reservation this device was created from, if any.
    pub fn reservation_id(&self) -> Option<&str> {
        let r = self.hardware_reservation.as_ref()?;
        r.id.as_deref()
            .or_else(|| r.href.as_deref().and_then(|h| h.rsplit('/').next()))
    }

    /// Metro code, or facility code when no metro is given.
    pub fn location(&self) -> Option<&str> {
        self.metro
            .as_ref()
            .map(|m| m.code.as_str())
            .or_else(|| self.facility.as_ref().map(|f| f.code.as_str()))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HardwareReservation {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub href: Option<String>,
    #[serde(default)]
    pub provisionable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spare: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub need_of_service: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facility: Option<Facility>,
    /// The device occupying the reservation. Without `include=device` the
    /// real API may give only an href, which reads as a device without state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceOrHref>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
}

/// A full device, or just its href.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DeviceOrHref {
    Device(Box<Device>),
    Href(Href),
}

impl HardwareReservation {
    /// The occupying device, when the response included it.
    pub fn device(&self) -> Option<&Device> {
        match &self.device {
            Some(DeviceOrHref::Device(d)) => Some(d),
            _ => None,
        }
    }

    /// Whether a device occupies the reservation (included or referenced).
    pub fn is_occupied(&self) -> bool {
        self.device.is_some()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshKey {
    pub id: String,
    pub label: String,
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub href: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity: Option<Href>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceList {
    #[serde(default)]
    pub devices: Vec<Device>,
    #[serde(default)]
    pub meta: Meta,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HardwareReservationList {
    #[serde(default)]
    pub hardware_reservations: Vec<HardwareReservation>,
    #[serde(default)]
    pub meta: Meta,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SshKeyList {
    #[serde(default)]
    pub ssh_keys: Vec<SshKey>,
    /// Not in the OpenAPI description, but honoured when a server pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
}

/// `POST /projects/{id}/devices` body (DeviceCreateInMetroInput /
/// DeviceCreateInFacilityInput).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceCreateRequest {
    pub hostname: String,
    pub plan: String,
    pub operating_system: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metro: Option<String>,
    /// Deprecated by the API in favour of metro, still accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facility: Option<Vec<String>>,
    pub hardware_reservation_id: String,
    #[serde(default)]
    pub project_ssh_keys: Vec<String>,
    #[serde(default)]
    pub tags: Vec<String>,
}

/// `POST /projects/{id}/ssh-keys` (SSHKeyCreateInput) and
/// `PUT /ssh-keys/{id}` (SSHKeyInput).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshKeyInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
}

/// `POST /devices/{id}/actions` (DeviceActionInput).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAction {
    #[serde(rename = "type")]
    pub kind: String,
}
