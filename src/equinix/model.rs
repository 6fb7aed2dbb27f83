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
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    pub first: Option<Href>,
    pub last: Option<Href>,
    pub next: Option<Href>,
    pub previous: Option<Href>,
    #[serde(rename = "self")]
    pub self_: Option<Href>,
    pub total: Option<i64>,
    pub current_page: Option<i64>,
    pub last_page: Option<i64>,
}

/// The error body of 4xx and 5xx responses: `error` or `errors`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
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

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IpAssignment {
    pub address: String,
    /// 4 or 6.
    pub address_family: Option<i64>,
    pub public: Option<bool>,
    pub management: Option<bool>,
    pub cidr: Option<i64>,
    pub gateway: Option<String>,
    pub netmask: Option<String>,
    pub id: Option<String>,
    pub href: Option<String>,
    pub enabled: Option<bool>,
    /// The device the address is assigned to (Equinix's SDKs require it).
    pub assigned_to: Option<Href>,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metro {
    pub id: Option<String>,
    pub code: String,
    pub name: Option<String>,
    pub country: Option<String>,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facility {
    pub id: Option<String>,
    pub code: String,
    pub name: Option<String>,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub id: Option<String>,
    pub slug: Option<String>,
    pub name: Option<String>,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatingSystem {
    pub id: Option<String>,
    pub slug: Option<String>,
    pub name: Option<String>,
}

/// A device's reference to its hardware reservation: an href, or the whole
/// object when included.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReservationRef {
    pub id: Option<String>,
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

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub id: String,
    pub short_id: Option<String>,
    pub href: Option<String>,
    #[serde(default)]
    pub hostname: String,
    pub state: DeviceState,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub ip_addresses: Vec<IpAssignment>,
    pub metro: Option<Metro>,
    pub facility: Option<Facility>,
    pub plan: Option<Plan>,
    pub operating_system: Option<OperatingSystem>,
    pub hardware_reservation: Option<ReservationRef>,
    pub created_at: Option<String>,
    pub updated_at: Option<String>,
    pub locked: Option<bool>,
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

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HardwareReservation {
    pub id: String,
    pub short_id: Option<String>,
    pub href: Option<String>,
    #[serde(default)]
    pub provisionable: bool,
    pub spare: Option<bool>,
    pub need_of_service: Option<bool>,
    pub plan: Option<Plan>,
    pub facility: Option<Facility>,
    /// The device occupying the reservation. Without `include=device` the
    /// real API may give only an href, which reads as a device without state.
    pub device: Option<DeviceOrHref>,
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

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshKey {
    pub id: String,
    pub label: String,
    pub key: String,
    pub fingerprint: Option<String>,
    pub href: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    pub created_at: Option<String>,
    pub updated_at: Option<String>,
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

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SshKeyList {
    #[serde(default)]
    pub ssh_keys: Vec<SshKey>,
    /// Not in the OpenAPI description, but honoured when a server pages.
    pub meta: Option<Meta>,
}

/// `POST /projects/{id}/devices` body (DeviceCreateInMetroInput /
/// DeviceCreateInFacilityInput).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceCreateRequest {
    pub hostname: String,
    pub plan: String,
    pub operating_system: String,
    pub metro: Option<String>,
    /// Deprecated by the API in favour of metro, still accepted.
    pub facility: Option<Vec<String>>,
    pub hardware_reservation_id: String,
    #[serde(default)]
    pub project_ssh_keys: Vec<String>,
    #[serde(default)]
    pub tags: Vec<String>,
}

/// `POST /projects/{id}/ssh-keys` (SSHKeyCreateInput) and
/// `PUT /ssh-keys/{id}` (SSHKeyInput).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshKeyInput {
    pub label: Option<String>,
    pub key: Option<String>,
    pub tags: Option<Vec<String>>,
}

/// `POST /devices/{id}/actions` (DeviceActionInput).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAction {
    #[serde(rename = "type")]
    pub kind: String,
}
