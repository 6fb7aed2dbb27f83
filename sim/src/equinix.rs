//! A simulator of the Equinix Metal API subset shepherd uses, for tests,
//! benchmarks and the demo. Same paths (under `/metal/v1`), auth header,
//! pagination and JSON shapes as the real API; state in memory.
//!
//! Long on purpose: the simulator serves every route of the API subset
//! shepherd uses, with its faults, over one shared state.
//!
//! - A project with N hardware reservations generated from a seed.
//! - Devices go queued → provisioning → active over `provisioning_delay`;
//!   a reboot takes them through powering_off and powering_on.
//! - Device addresses: one fixed address, or consecutive ones from a base
//!   (127.0.1.1, 127.0.1.2, …).
//! - Faults: added latency, a 5xx rate, 429 with Retry-After, and lost
//!   responses (the mutation happens, then a 500 or a broken body).
//! - Side endpoints under `/_sim/`: request counts per operation, peak
//!   requests in flight, a timestamped request log, fault settings, and
//!   levers for tests (take a reservation as another user, change a device).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use actix_web::body::BoxBody;
use actix_web::dev::{ServerHandle, ServiceRequest, ServiceResponse};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::{Next, from_fn};
use actix_web::web::{self, Bytes, Data, Json, Path, Query};
use actix_web::{App, HttpResponse, HttpServer};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use shepherd::equinix::metrics::Operation;
use shepherd::equinix::model::*;

pub const BASE_PATH: &str = "/metal/v1";

/// How devices get their public IPv4 address.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Addressing {
    /// Every device gets this address.
    Fixed(IpAddr),
    /// The n-th device created gets base + n (n from 0).
    Sequential(Ipv4Addr),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Faults {
    /// Added to every API request.
    #[serde(with = "humantime_serde")]
    pub latency: Duration,
    /// Share of API requests answered 503 without doing anything.
    pub error_rate: f64,
    /// Share of API requests answered 429 with `Retry-After`.
    pub rate_limit_rate: f64,
    /// `Retry-After` of those, whole seconds.
    pub retry_after_secs: u64,
    /// Share of mutations that happen but whose response is lost: half of
    /// them a 500, half a body that breaks off.
    pub lost_rate: f64,
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub project_id: String,
    pub token: String,
    pub reservations: usize,
    pub seed: u64,
    pub provisioning_delay: Duration,
    pub reboot_delay: Duration,
    pub addressing: Addressing,
    pub metro: String,
    pub plan: String,
    pub faults: Faults,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            project_id: "6b4d2a9e-6f1a-4c1e-9b9a-3d1f5e7c0a01".into(),
            token: "sim-token".into(),
            reservations: 10,
            seed: 1,
            provisioning_delay: Duration::from_millis(300),
            reboot_delay: Duration::from_millis(300),
            addressing: Addressing::Fixed(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            metro: "sv".into(),
            plan: "c3.small.x86".into(),
            faults: Faults::default(),
        }
    }
}

struct SimDevice {
    device: Device,
    created: Instant,
    /// Set on reboot.
    rebooted: Option<Instant>,
    /// Set by a test: overrides the computed state.
    forced_state: Option<DeviceState>,
}

struct SimReservation {
    reservation: HardwareReservation,
    device: Option<String>,
}

/// One request, as the simulator saw it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LogEntry {
    /// Microseconds since the simulator started.
    pub start_us: u64,
    pub end_us: u64,
    pub method: String,
    pub path: String,
    pub operation: Option<String>,
    pub status: u16,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Stats {
    /// API requests per operation (side endpoints not counted).
    pub requests: BTreeMap<String, u64>,
    /// API requests per status code.
    pub statuses: BTreeMap<u16, u64>,
    pub in_flight: u64,
    pub peak_in_flight: u64,
    pub devices: u64,
    /// Reboots per device ID.
    pub reboots: BTreeMap<String, u64>,
    pub log: Vec<LogEntry>,
}

const LOG_CAPACITY: usize = 200_000;

struct State {
    cfg: SimConfig,
    started: Instant,
    reservations: Vec<SimReservation>,
    devices: Vec<SimDevice>,
    /// Positions by ID: a fleet's listing looks every device up.
    device_index: HashMap<String, usize>,
    reservation_index: HashMap<String, usize>,
    next_address: u32,
    ssh_keys: Vec<SshKey>,
    stats: Stats,
    rng: rand::rngs::StdRng,
}

type Shared = Arc<Mutex<State>>;

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

fn uuid_from(rng: &mut impl Rng) -> String {
    uuid::Builder::from_random_bytes(rng.random())
        .into_uuid()
        .to_string()
}

impl State {
    fn new(cfg: SimConfig) -> State {
        let mut seeded = rand::rngs::StdRng::seed_from_u64(cfg.seed);
        let reservations: Vec<SimReservation> = (0..cfg.reservations)
            .map(|i| {
                let id = uuid_from(&mut seeded);
                SimReservation {
                    reservation: HardwareReservation {
                        short_id: Some(id[..8].to_string()),
                        href: Some(format!("{BASE_PATH}/hardware-reservations/{id}")),
                        id,
                        provisionable: true,
                        spare: Some(false),
                        need_of_service: Some(false),
                        plan: Some(Plan {
                            id: None,
                            slug: Some(cfg.plan.clone()),
                            name: Some(cfg.plan.clone()),
                        }),
                        facility: Some(Facility {
                            id: None,
                            code: format!("{}{}", cfg.metro, 1 + i % 3),
                            name: None,
                        }),
                        device: None,
                        created_at: Some(now_rfc3339()),
                    },
                    device: None,
                }
            })
            .collect();
        let rng = rand::rngs::StdRng::seed_from_u64(cfg.seed.wrapping_add(1));
        let reservation_index = reservations
            .iter()
            .enumerate()
            .map(|(i, r)| (r.reservation.id.clone(), i))
            .collect();
        State {
            cfg,
            started: Instant::now(),
            reservations,
            devices: Vec::new(),
            device_index: HashMap::new(),
            reservation_index,
            next_address: 0,
            ssh_keys: Vec::new(),
            stats: Stats::default(),
            rng,
        }
    }

    fn device_state(&self, d: &SimDevice) -> DeviceState {
        if let Some(s) = d.forced_state {
            return s;
        }
        let delay = self.cfg.provisioning_delay;
        let age = d.created.elapsed();
        if age < delay / 3 {
            return DeviceState::Queued;
        }
        if age < delay {
            return DeviceState::Provisioning;
        }
        if let Some(r) = d.rebooted {
            let since = r.elapsed();
            if since < self.cfg.reboot_delay / 2 {
                return DeviceState::PoweringOff;
            }
            if since < self.cfg.reboot_delay {
                return DeviceState::PoweringOn;
            }
        }
        DeviceState::Active
    }

    /// Zeroes the counters and the log (the device count stays true).
    fn reset_stats(&mut self) {
        self.stats = Stats {
            devices: self.devices.len() as u64,
            ..Stats::default()
        };
    }

    /// Another user of the project takes free reservation `id`. Err: the
    /// response the API would give.
    fn steal(&mut self, id: &str) -> Result<Device, HttpResponse> {
        let ri = self.find_reservation(id).ok_or_else(not_found)?;
        if self.reservations[ri].device.is_some() {
            return Err(errors(
                StatusCode::UNPROCESSABLE_ENTITY,
                &["already in use"],
            ));
        }
        Ok(self.new_device(
            ri,
            "someone-else".into(),
            vec!["not-shepherd".into()],
            "ubuntu_22_04".into(),
        ))
    }

    fn render(&self, d: &SimDevice) -> Device {
        let mut out = d.device.clone();
        out.state = self.device_state(d);
        out
    }

    fn find_device(&self, id: &str) -> Option<usize> {
        self.device_index.get(id).copied()
    }

    fn find_reservation(&self, id: &str) -> Option<usize> {
        self.reservation_index.get(id).copied()
    }

    fn render_reservation(&self, r: &SimReservation, include_device: bool) -> HardwareReservation {
        let mut out = r.reservation.clone();
        out.device = r.device.as_ref().map(|id| {
            let full = self
                .find_device(id)
                .filter(|_| include_device)
                .map(|i| self.render(&self.devices[i]));
            match full {
                Some(d) => DeviceOrHref::Device(Box::new(d)),
                None => DeviceOrHref::Href(Href {
                    href: format!("{BASE_PATH}/devices/{id}"),
                }),
            }
        });
        out
    }

    fn next_address(&mut self) -> IpAddr {
        match &self.cfg.addressing {
            Addressing::Fixed(a) => *a,
            Addressing::Sequential(base) => {
                let n = self.next_address;
                self.next_address += 1;
                IpAddr::V4(Ipv4Addr::from(u32::from(*base).wrapping_add(n)))
            }
        }
    }

    fn create_device(&mut self, req: &DeviceCreateRequest) -> Result<Device, HttpResponse> {
        let mut missing = Vec::new();
        if req.hostname.trim().is_empty() {
            missing.push("hostname can't be blank");
        }
        if req.plan.trim().is_empty() {
            missing.push("plan can't be blank");
        }
        if req.operating_system.trim().is_empty() {
            missing.push("operating_system can't be blank");
        }
        if req.metro.is_none() && req.facility.as_ref().is_none_or(|f| f.is_empty()) {
            missing.push("metro or facility must be provided");
        }
        if !missing.is_empty() {
            return Err(errors(StatusCode::UNPROCESSABLE_ENTITY, &missing));
        }
        let Some(ri) = self.find_reservation(&req.hardware_reservation_id) else {
            return Err(errors(
                StatusCode::UNPROCESSABLE_ENTITY,
                &["hardware reservation not found"],
            ));
        };
        if self.reservations[ri].device.is_some() {
            return Err(errors(
                StatusCode::UNPROCESSABLE_ENTITY,
                &["hardware reservation is already in use by another device"],
            ));
        }
        if !self.reservations[ri].reservation.provisionable {
            return Err(errors(
                StatusCode::UNPROCESSABLE_ENTITY,
                &["hardware reservation is not provisionable"],
            ));
        }
        let device = self.new_device(
            ri,
            req.hostname.clone(),
            req.tags.clone(),
            req.operating_system.clone(),
        );
        Ok(device)
    }

    fn new_device(&mut self, ri: usize, hostname: String, tags: Vec<String>, os: String) -> Device {
        let id = uuid_from(&mut self.rng);
        let address = self.next_address();
        let rid = self.reservations[ri].reservation.id.clone();
        let facility = self.reservations[ri].reservation.facility.clone();
        let now = now_rfc3339();
        let device = Device {
            short_id: Some(id[..8].to_string()),
            href: Some(format!("{BASE_PATH}/devices/{id}")),
            hostname,
            state: DeviceState::Queued,
            tags,
            ip_addresses: vec![
                ip(&mut self.rng, &id, &address.to_string(), 4, true, 31),
                ip(&mut self.rng, &id, "::1", 6, true, 127),
            ],
            metro: Some(Metro {
                id: None,
                code: self.cfg.metro.clone(),
                name: Some(format!("Simulated {}", self.cfg.metro)),
                country: Some("US".into()),
            }),
            facility,
            plan: Some(Plan {
                id: None,
                slug: Some(self.cfg.plan.clone()),
                name: Some(self.cfg.plan.clone()),
            }),
            operating_system: Some(OperatingSystem {
                id: None,
                slug: Some(os.clone()),
                name: Some(os),
            }),
            hardware_reservation: Some(ReservationRef {
                id: Some(rid.clone()),
                href: Some(format!("{BASE_PATH}/hardware-reservations/{rid}")),
            }),
            created_at: Some(now.clone()),
            updated_at: Some(now),
            locked: Some(false),
            spot_instance: Some(false),
            id: id.clone(),
        };
        self.reservations[ri].device = Some(id.clone());
        self.device_index.insert(id, self.devices.len());
        self.devices.push(SimDevice {
            device: device.clone(),
            created: Instant::now(),
            rebooted: None,
            forced_state: None,
        });
        self.stats.devices = self.devices.len() as u64;
        device
    }
}

fn ip(
    rng: &mut impl Rng,
    device: &str,
    address: &str,
    family: i64,
    public: bool,
    cidr: i64,
) -> IpAssignment {
    let id = uuid_from(rng);
    IpAssignment {
        address: address.to_string(),
        address_family: Some(family),
        public: Some(public),
        management: Some(true),
        cidr: Some(cidr),
        gateway: None,
        netmask: None,
        href: Some(format!("{BASE_PATH}/ips/{id}")),
        id: Some(id),
        enabled: Some(true),
        assigned_to: Some(Href {
            href: format!("{BASE_PATH}/devices/{device}"),
        }),
    }
}

fn errors(status: StatusCode, messages: &[&str]) -> HttpResponse {
    HttpResponse::build(status).json(ErrorBody {
        error: None,
        errors: messages.iter().map(|m| m.to_string()).collect(),
    })
}

/// A JSON request body, or the 422 the API answers for a malformed one.
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, HttpResponse> {
    serde_json::from_slice(body).map_err(|e| {
        errors(
            StatusCode::UNPROCESSABLE_ENTITY,
            &[&format!("invalid request: {e}")],
        )
    })
}

fn not_found() -> HttpResponse {
    errors(StatusCode::NOT_FOUND, &["Not found"])
}

#[derive(Deserialize)]
struct PageQuery {
    page: Option<i64>,
    per_page: Option<i64>,
    include: Option<String>,
}

/// One page of `items`, each rendered (only the page's: rendering all of
/// a 100,000-machine fleet for each page made a listing quadratic), and
/// its `meta`, or 422 for an out-of-range page size.
fn paginate<S, T>(
    items: &[S],
    q: &PageQuery,
    path: &str,
    render: impl Fn(&S) -> T,
) -> Result<(Vec<T>, Meta), HttpResponse> {
    let per_page = q.per_page.unwrap_or(10);
    let page = q.page.unwrap_or(1);
    if !(1..=1000).contains(&per_page) || !(1..=100_000).contains(&page) {
        return Err(errors(
            StatusCode::UNPROCESSABLE_ENTITY,
            &["invalid page or per_page"],
        ));
    }
    let total = items.len() as i64;
    let last_page = ((total + per_page - 1) / per_page).max(1);
    let start = ((page - 1) * per_page).min(total) as usize;
    let end = (page * per_page).min(total) as usize;
    let href = |p: i64| Href {
        href: format!("{BASE_PATH}{path}?page={p}&per_page={per_page}"),
    };
    let meta = Meta {
        first: Some(href(1)),
        last: Some(href(last_page)),
        next: (page < last_page).then(|| href(page + 1)),
        previous: (page > 1).then(|| href(page - 1)),
        self_: Some(href(page)),
        total: Some(total),
        current_page: Some(page),
        last_page: Some(last_page),
    };
    Ok((items[start..end].iter().map(render).collect(), meta))
}

fn check_project(st: &State, pid: &str) -> Result<(), HttpResponse> {
    if pid == st.cfg.project_id {
        Ok(())
    } else {
        Err(not_found())
    }
}

async fn list_devices(s: Data<Shared>, pid: Path<String>, q: Query<PageQuery>) -> HttpResponse {
    let st = s.lock().unwrap();
    if let Err(r) = check_project(&st, &pid) {
        return r;
    }
    match paginate(&st.devices, &q, &format!("/projects/{pid}/devices"), |d| {
        st.render(d)
    }) {
        Ok((devices, meta)) => HttpResponse::Ok().json(DeviceList { devices, meta }),
        Err(r) => r,
    }
}

async fn create_device(s: Data<Shared>, pid: Path<String>, body: Bytes) -> HttpResponse {
    let req: DeviceCreateRequest = match parse(&body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let mut st = s.lock().unwrap();
    if let Err(r) = check_project(&st, &pid) {
        return r;
    }
    match st.create_device(&req) {
        Ok(d) => HttpResponse::Created().json(d),
        Err(r) => r,
    }
}

async fn get_device(s: Data<Shared>, id: Path<String>) -> HttpResponse {
    let st = s.lock().unwrap();
    match st.find_device(&id) {
        Some(i) => HttpResponse::Ok().json(st.render(&st.devices[i])),
        None => not_found(),
    }
}

async fn delete_device(s: Data<Shared>, id: Path<String>) -> HttpResponse {
    let mut st = s.lock().unwrap();
    let Some(i) = st.find_device(&id) else {
        return not_found();
    };
    st.devices.remove(i);
    st.device_index = st
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| (d.device.id.clone(), i))
        .collect();
    for r in &mut st.reservations {
        if r.device.as_deref() == Some(id.as_str()) {
            r.device = None;
        }
    }
    st.stats.devices = st.devices.len() as u64;
    HttpResponse::NoContent().finish()
}

async fn device_action(s: Data<Shared>, id: Path<String>, body: Bytes) -> HttpResponse {
    let action: DeviceAction = match parse(&body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let mut st = s.lock().unwrap();
    let Some(i) = st.find_device(&id) else {
        return not_found();
    };
    match action.kind.as_str() {
        "reboot" | "power_on" | "power_off" => {
            if action.kind == "reboot" {
                st.devices[i].rebooted = Some(Instant::now());
                st.devices[i].forced_state = None;
                *st.stats.reboots.entry(id.to_string()).or_default() += 1;
            }
            HttpResponse::Accepted().finish()
        }
        other => errors(
            StatusCode::UNPROCESSABLE_ENTITY,
            &[&format!("unsupported action {other}")],
        ),
    }
}

async fn list_reservations(
    s: Data<Shared>,
    pid: Path<String>,
    q: Query<PageQuery>,
) -> HttpResponse {
    let st = s.lock().unwrap();
    if let Err(r) = check_project(&st, &pid) {
        return r;
    }
    let include = q
        .include
        .as_deref()
        .is_some_and(|i| i.split(',').any(|x| x == "device"));
    match paginate(
        &st.reservations,
        &q,
        &format!("/projects/{pid}/hardware-reservations"),
        |r| st.render_reservation(r, include),
    ) {
        Ok((hardware_reservations, meta)) => HttpResponse::Ok().json(HardwareReservationList {
            hardware_reservations,
            meta,
        }),
        Err(r) => r,
    }
}

async fn get_reservation(s: Data<Shared>, id: Path<String>, q: Query<PageQuery>) -> HttpResponse {
    let st = s.lock().unwrap();
    let include = q
        .include
        .as_deref()
        .is_some_and(|i| i.split(',').any(|x| x == "device"));
    match st.find_reservation(&id) {
        Some(i) => HttpResponse::Ok().json(st.render_reservation(&st.reservations[i], include)),
        None => not_found(),
    }
}

async fn list_ssh_keys(s: Data<Shared>, pid: Path<String>) -> HttpResponse {
    let st = s.lock().unwrap();
    if let Err(r) = check_project(&st, &pid) {
        return r;
    }
    HttpResponse::Ok().json(SshKeyList {
        ssh_keys: st.ssh_keys.clone(),
        meta: None,
    })
}

fn fingerprint(key: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    let v = h.finish().to_be_bytes();
    v.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

async fn create_ssh_key(s: Data<Shared>, pid: Path<String>, body: Bytes) -> HttpResponse {
    let input: SshKeyInput = match parse(&body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let (Some(label), Some(key)) = (input.label, input.key) else {
        return errors(
            StatusCode::UNPROCESSABLE_ENTITY,
            &["label and key are required"],
        );
    };
    let mut st = s.lock().unwrap();
    if let Err(r) = check_project(&st, &pid) {
        return r;
    }
    let id = uuid_from(&mut st.rng);
    let now = now_rfc3339();
    let k = SshKey {
        href: Some(format!("{BASE_PATH}/ssh-keys/{id}")),
        fingerprint: Some(fingerprint(&key)),
        id,
        label,
        key,
        tags: input.tags.unwrap_or_default(),
        created_at: Some(now.clone()),
        updated_at: Some(now),
        entity: Some(Href {
            href: format!("{BASE_PATH}/projects/{pid}"),
        }),
    };
    st.ssh_keys.push(k.clone());
    HttpResponse::Created().json(k)
}

async fn update_ssh_key(s: Data<Shared>, id: Path<String>, body: Bytes) -> HttpResponse {
    let input: SshKeyInput = match parse(&body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let mut st = s.lock().unwrap();
    let Some(k) = st.ssh_keys.iter_mut().find(|k| k.id == *id) else {
        return not_found();
    };
    if let Some(l) = input.label {
        k.label = l;
    }
    if let Some(key) = input.key {
        k.fingerprint = Some(fingerprint(&key));
        k.key = key;
    }
    if let Some(t) = input.tags {
        k.tags = t;
    }
    k.updated_at = Some(now_rfc3339());
    HttpResponse::Ok().json(k.clone())
}

// ---- side endpoints ----

async fn stats(s: Data<Shared>) -> HttpResponse {
    HttpResponse::Ok().json(&s.lock().unwrap().stats)
}

async fn reset_stats(s: Data<Shared>) -> HttpResponse {
    s.lock().unwrap().reset_stats();
    HttpResponse::NoContent().finish()
}

async fn set_faults(s: Data<Shared>, f: Json<Faults>) -> HttpResponse {
    s.lock().unwrap().cfg.faults = f.into_inner();
    HttpResponse::NoContent().finish()
}

/// Another user of the project takes a free reservation.
async fn steal_reservation(s: Data<Shared>, id: Path<String>) -> HttpResponse {
    match s.lock().unwrap().steal(&id) {
        Ok(d) => HttpResponse::Created().json(d),
        Err(r) => r,
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DeviceChange {
    pub state: Option<DeviceState>,
    pub address: Option<String>,
}

/// A test changes a device behind shepherd's back.
async fn change_device(s: Data<Shared>, id: Path<String>, c: Json<DeviceChange>) -> HttpResponse {
    let mut st = s.lock().unwrap();
    let Some(i) = st.find_device(&id) else {
        return not_found();
    };
    let d = &mut st.devices[i];
    if let Some(state) = c.state {
        d.forced_state = Some(state);
    }
    if let Some(a) = &c.address {
        if let Some(first) = d.device.ip_addresses.first_mut() {
            first.address = a.clone();
        }
    }
    d.device.updated_at = Some(now_rfc3339());
    let out = st.render(&st.devices[i]);
    HttpResponse::Ok().json(out)
}

/// The API operation of a request, for counting.
pub fn operation(method: &Method, path: &str) -> Option<Operation> {
    let p = path.strip_prefix(BASE_PATH)?;
    let parts: Vec<&str> = p.trim_matches('/').split('/').collect();
    use Operation::*;
    Some(match (method.as_str(), parts.as_slice()) {
        ("GET", ["projects", _, "devices"]) => ListDevices,
        ("POST", ["projects", _, "devices"]) => CreateDevice,
        ("GET", ["devices", _]) => GetDevice,
        ("DELETE", ["devices", _]) => DeleteDevice,
        ("POST", ["devices", _, "actions"]) => RebootDevice,
        ("GET", ["projects", _, "hardware-reservations"]) => ListReservations,
        ("GET", ["hardware-reservations", _]) => GetReservation,
        ("GET", ["projects", _, "ssh-keys"]) => ListSshKeys,
        ("POST", ["projects", _, "ssh-keys"]) => CreateSshKey,
        ("PUT", ["ssh-keys", _]) => UpdateSshKey,
        _ => return None,
    })
}

fn is_mutation(m: &Method) -> bool {
    matches!(
        *m,
        Method::POST | Method::PUT | Method::DELETE | Method::PATCH
    )
}

/// What the fault dice decided for one request.
enum Fate {
    Normal,
    Unavailable,
    RateLimited(u64),
    Lost { broken_body: bool },
}

/// Auth, faults, counting and the log, around every API request.
async fn middleware(
    req: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let shared = req
        .app_data::<Data<Shared>>()
        .cloned()
        .expect("simulator state");
    let method = req.method().clone();
    let path = req.path().to_string();
    let op = operation(&method, &path);
    if !path.starts_with(BASE_PATH) {
        return next.call(req).await;
    }
    let (start_us, latency, fate, authorized) = {
        let mut st = shared.lock().unwrap();
        st.stats.in_flight += 1;
        st.stats.peak_in_flight = st.stats.peak_in_flight.max(st.stats.in_flight);
        let start_us = st.started.elapsed().as_micros() as u64;
        let token = req
            .headers()
            .get("X-Auth-Token")
            .and_then(|v| v.to_str().ok());
        let authorized = token == Some(st.cfg.token.as_str());
        let f = st.cfg.faults.clone();
        let roll: f64 = st.rng.random();
        let fate = if roll < f.error_rate {
            Fate::Unavailable
        } else if roll < f.error_rate + f.rate_limit_rate {
            Fate::RateLimited(f.retry_after_secs)
        } else if is_mutation(&method) && st.rng.random::<f64>() < f.lost_rate {
            Fate::Lost {
                broken_body: st.rng.random(),
            }
        } else {
            Fate::Normal
        };
        (start_us, f.latency, fate, authorized)
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let result = if !authorized {
        let (r, _) = req.into_parts();
        Ok(ServiceResponse::new(
            r,
            HttpResponse::Unauthorized().json(ErrorBody {
                error: Some("Invalid authentication token".into()),
                errors: vec![],
            }),
        ))
    } else {
        match fate {
            Fate::Unavailable => {
                let (r, _) = req.into_parts();
                Ok(ServiceResponse::new(
                    r,
                    errors(StatusCode::SERVICE_UNAVAILABLE, &["Service Unavailable"]),
                ))
            }
            Fate::RateLimited(secs) => {
                let (r, _) = req.into_parts();
                let mut resp = errors(StatusCode::TOO_MANY_REQUESTS, &["Too Many Requests"]);
                resp.headers_mut().insert(
                    actix_web::http::header::RETRY_AFTER,
                    actix_web::http::header::HeaderValue::from(secs),
                );
                Ok(ServiceResponse::new(r, resp))
            }
            Fate::Normal => next.call(req).await,
            Fate::Lost { broken_body } => {
                let done = next.call(req).await?;
                let status = done.status();
                let (r, _) = done.into_parts();
                let resp = if broken_body && status.is_success() {
                    // Headers may go out; the body never completes.
                    HttpResponse::build(status).streaming(futures::stream::once(async {
                        Err::<Bytes, _>(actix_web::error::ErrorInternalServerError(
                            "connection lost",
                        ))
                    }))
                } else {
                    errors(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &["Internal Server Error"],
                    )
                };
                Ok(ServiceResponse::new(r, resp))
            }
        }
    };
    let status = match &result {
        Ok(r) => r.status().as_u16(),
        Err(_) => 500,
    };
    let mut st = shared.lock().unwrap();
    st.stats.in_flight -= 1;
    let end_us = st.started.elapsed().as_micros() as u64;
    if let Some(op) = op {
        *st.stats
            .requests
            .entry(op.as_str().to_string())
            .or_default() += 1;
    }
    *st.stats.statuses.entry(status).or_default() += 1;
    if st.stats.log.len() < LOG_CAPACITY {
        st.stats.log.push(LogEntry {
            start_us,
            end_us,
            method: method.to_string(),
            path,
            operation: op.map(|o| o.as_str().to_string()),
            status,
        });
    }
    result
}

fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::scope(BASE_PATH)
            .route("/projects/{id}/devices", web::get().to(list_devices))
            .route("/projects/{id}/devices", web::post().to(create_device))
            .route("/devices/{id}", web::get().to(get_device))
            .route("/devices/{id}", web::delete().to(delete_device))
            .route("/devices/{id}/actions", web::post().to(device_action))
            .route(
                "/projects/{id}/hardware-reservations",
                web::get().to(list_reservations),
            )
            .route(
                "/hardware-reservations/{id}",
                web::get().to(get_reservation),
            )
            .route("/projects/{id}/ssh-keys", web::get().to(list_ssh_keys))
            .route("/projects/{id}/ssh-keys", web::post().to(create_ssh_key))
            .route("/ssh-keys/{id}", web::put().to(update_ssh_key))
            .default_service(web::to(|| async { not_found() })),
    )
    .service(
        web::scope("/_sim")
            .route("/stats", web::get().to(stats))
            .route("/stats", web::delete().to(reset_stats))
            .route("/faults", web::put().to(set_faults))
            .route(
                "/reservations/{id}/steal",
                web::post().to(steal_reservation),
            )
            .route("/devices/{id}", web::patch().to(change_device)),
    );
}

/// A running simulator.
pub struct Simulator {
    addr: SocketAddr,
    state: Shared,
    server: ServerHandle,
    project_id: String,
    token: String,
}

impl Simulator {
    /// Starts the simulator on `listen` (port 0: any free port) in the
    /// current actix system. Loopback addresses only.
    pub async fn start(cfg: SimConfig, listen: SocketAddr) -> std::io::Result<Simulator> {
        if !listen.ip().is_loopback() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "the simulator listens on loopback addresses only, not {}",
                    listen.ip()
                ),
            ));
        }
        let project_id = cfg.project_id.clone();
        let token = cfg.token.clone();
        let state: Shared = Arc::new(Mutex::new(State::new(cfg)));
        let data = Data::new(state.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::PayloadConfig::new(1 << 20))
                .wrap(from_fn(middleware))
                .configure(routes)
        })
        .workers(1)
        .disable_signals()
        .bind(listen)?;
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        Ok(Simulator {
            addr,
            state,
            server: handle,
            project_id,
            token,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The API base URL, for `equinix.api_url`.
    pub fn api_url(&self) -> String {
        format!("http://{}{BASE_PATH}", self.addr)
    }

    pub fn project_id(&self) -> &str {
        &self.project_id
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    pub fn stats(&self) -> Stats {
        self.state.lock().unwrap().stats.clone()
    }

    pub fn reset_stats(&self) {
        self.state.lock().unwrap().reset_stats();
    }

    pub fn set_faults(&self, f: Faults) {
        self.state.lock().unwrap().cfg.faults = f;
    }

    /// Every device, as the API would show it.
    pub fn devices(&self) -> Vec<Device> {
        let st = self.state.lock().unwrap();
        st.devices.iter().map(|d| st.render(d)).collect()
    }

    pub fn reservation_ids(&self) -> Vec<String> {
        self.state
            .lock()
            .unwrap()
            .reservations
            .iter()
            .map(|r| r.reservation.id.clone())
            .collect()
    }

    /// Another user takes reservation `id`; returns the device.
    pub fn steal_reservation(&self, id: &str) -> Option<Device> {
        self.state.lock().unwrap().steal(id).ok()
    }

    pub fn ssh_keys(&self) -> Vec<SshKey> {
        self.state.lock().unwrap().ssh_keys.clone()
    }

    pub async fn stop(&self) {
        self.server.stop(true).await;
    }
}
