//! Simulated BMCs for the demo's owned hardware (`shepherd demo --provider
//! static`): a Redfish service per simulated machine, on the machine's own
//! loopback address, with one ComputerSystem (`/redfish/v1/Systems/1`), a
//! session service and basic authentication. A restart turns the system
//! off, tells the machine (its resident agent dies, as on real hardware),
//! and turns it on again after a moment. Below the system, as real BMCs
//! keep them: its firmware with updates as tasks (`firmware.rs`), its BIOS
//! settings pending until a reset (`bios.rs`), its RAID controller's
//! volumes (`storage.rs`); what waits for a reset is done at a restart.
//! The tests use OpenStack's emulator (sushy-tools) too; this one needs no
//! Python, and scales to a fleet. A rack's IPMI BMCs are `ipmi.rs`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Value, json};

/// Answers 401 unless the request carries this BMC's credentials.
macro_rules! authorize {
    ($req:expr, $st:expr) => {
        if !super::authorized(&$req, &$st) {
            return super::unauthorized();
        }
    };
}

mod bios;
pub mod firmware;
pub mod ipmi;
mod storage;

pub use bios::{ATTRIBUTES as BIOS_ATTRIBUTES, REGISTRY as BIOS_REGISTRY};
pub use firmware::{FirmwareOptions, image as firmware_image};

/// Called with a machine's address when its BMC restarts or stops it.
pub type OnPowerOff = Arc<dyn Fn(IpAddr) + Send + Sync>;

/// What a system boots when it comes on: the network (a boot override to
/// `Pxe`), or its disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootFrom {
    Network,
    Disk,
}

/// Called with a machine's address when its system comes on (a reset's
/// `On`, or the end of a restart), and what it boots.
pub type OnPowerOn = Arc<dyn Fn(IpAddr, BootFrom) + Send + Sync>;

/// How a rack's BMCs behave beyond [`BmcSim::start_with`]'s.
#[derive(Clone)]
pub struct RackBmcs {
    /// Added to every request, as a real BMC's slowness.
    pub latency: Duration,
    /// Systems start off (a rack just powered), not on.
    pub off: bool,
    pub on_power_on: OnPowerOn,
    /// The BMCs listen on addresses of a network namespace the test made
    /// (not loopback).
    pub in_namespace: bool,
}

struct System {
    on: bool,
    /// `Boot.BootSourceOverrideTarget` and `…Enabled`.
    override_target: String,
    override_enabled: String,
    /// Counts resets, so that a power on a later reset overtook is not
    /// reported.
    resets: u64,
    /// Off until then, after a restart.
    back_at: Option<Instant>,
    firmware: firmware::Firmware,
    bios: bios::Bios,
    storage: storage::Storage,
}

impl System {
    fn new(ip: IpAddr) -> System {
        System {
            on: true,
            override_target: "None".into(),
            override_enabled: "Disabled".into(),
            resets: 0,
            back_at: None,
            firmware: firmware::Firmware::new(ip),
            bios: bios::Bios::default(),
            storage: storage::Storage::default(),
        }
    }
}

struct State {
    user: String,
    password: String,
    restart_delay: Duration,
    systems: Mutex<HashMap<IpAddr, System>>,
    sessions: Mutex<HashMap<String, IpAddr>>,
    on_power_off: OnPowerOff,
    /// Firmware updates of every system, in the order asked.
    tasks: Mutex<Vec<firmware::Task>>,
    firmware: FirmwareOptions,
    /// What was asked of each system, to be read back: restarts, and
    /// updates refused because one ran (503).
    counts: Mutex<HashMap<IpAddr, Counts>>,
    rack: Option<RackBmcs>,
}

/// What a simulated BMC was asked, for a test or a benchmark to check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Restarts of its system (a reset that turned it off and on).
    pub restarts: u32,
    /// Updates started (tasks made).
    pub updates: u32,
    /// Updates refused with 503 because one ran.
    pub busy: u32,
}

impl State {
    fn count(&self, ip: IpAddr, f: impl FnOnce(&mut Counts)) {
        f(self.counts.lock().unwrap().entry(ip).or_default());
    }
}

impl State {
    /// `f` on the system at `ip` (the BMC's own address).
    fn with_system<R>(&self, ip: IpAddr, f: impl FnOnce(&mut System) -> R) -> R {
        let mut systems = self.systems.lock().unwrap();
        f(systems.entry(ip).or_insert_with(|| System::new(ip)))
    }
}

/// The running BMCs.
pub struct BmcSim {
    pub port: u16,
    pub user: String,
    pub password: String,
    handle: actix_web::dev::ServerHandle,
    state: Arc<State>,
}

impl BmcSim {
    /// A BMC on a free port of each simulated machine's address, which a
    /// restart or a power-off of its system takes down (its resident agent
    /// dies, as on real hardware); back after a second from a restart.
    pub fn for_machines(machines: &crate::machine::MachineSim) -> std::io::Result<BmcSim> {
        BmcSim::for_machines_with(machines, FirmwareOptions::default())
    }

    /// As `for_machines`, their firmware updates as `firmware` says.
    pub fn for_machines_with(
        machines: &crate::machine::MachineSim,
        firmware: FirmwareOptions,
    ) -> std::io::Result<BmcSim> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let agents = machines.agents.clone();
        BmcSim::start_with(
            &machines.addresses,
            port,
            Duration::from_secs(1),
            Arc::new(move |ip| agents.power_off(ip)),
            firmware,
        )
    }

    /// A BMC on `port` of each of `addresses` (loopback only).
    pub fn start(
        addresses: &[IpAddr],
        port: u16,
        restart_delay: Duration,
        on_power_off: OnPowerOff,
    ) -> std::io::Result<BmcSim> {
        BmcSim::start_with(
            addresses,
            port,
            restart_delay,
            on_power_off,
            FirmwareOptions::default(),
        )
    }

    /// As `start`, its firmware updates as `firmware` says.
    pub fn start_with(
        addresses: &[IpAddr],
        port: u16,
        restart_delay: Duration,
        on_power_off: OnPowerOff,
        firmware: FirmwareOptions,
    ) -> std::io::Result<BmcSim> {
        Self::start_all(addresses, port, restart_delay, on_power_off, firmware, None)
    }

    /// BMCs of a rack booted through them: as [`BmcSim::start_with`],
    /// slowed, their systems' power ons told to `rack.on_power_on`.
    pub fn start_rack(
        addresses: &[IpAddr],
        port: u16,
        restart_delay: Duration,
        on_power_off: OnPowerOff,
        rack: RackBmcs,
    ) -> std::io::Result<BmcSim> {
        Self::start_all(
            addresses,
            port,
            restart_delay,
            on_power_off,
            FirmwareOptions::default(),
            Some(rack),
        )
    }

    fn start_all(
        addresses: &[IpAddr],
        port: u16,
        restart_delay: Duration,
        on_power_off: OnPowerOff,
        firmware: FirmwareOptions,
        rack: Option<RackBmcs>,
    ) -> std::io::Result<BmcSim> {
        let in_namespace = rack.as_ref().is_some_and(|r| r.in_namespace);
        if let Some(a) = addresses.iter().find(|a| !a.is_loopback() && !in_namespace) {
            return Err(std::io::Error::other(format!(
                "simulated BMCs live on loopback, not {a}"
            )));
        }
        let off = rack.as_ref().is_some_and(|r| r.off);
        let latency = rack.as_ref().map_or(Duration::ZERO, |r| r.latency);
        let password = format!("{:032x}", rand::random::<u128>());
        let state = Arc::new(State {
            user: "admin".into(),
            password: password.clone(),
            restart_delay,
            systems: Mutex::new(
                addresses
                    .iter()
                    .map(|a| {
                        let mut s = System::new(*a);
                        s.on = !off;
                        (*a, s)
                    })
                    .collect(),
            ),
            sessions: Mutex::new(HashMap::new()),
            on_power_off,
            tasks: Mutex::new(Vec::new()),
            firmware,
            counts: Mutex::new(HashMap::new()),
            rack,
        });
        let data = web::Data::from(state.clone());
        let mut server = actix_web::HttpServer::new(move || {
            actix_web::App::new()
                .wrap_fn(move |req, srv| {
                    use actix_web::dev::Service as _;
                    let answer = srv.call(req);
                    async move {
                        if !latency.is_zero() {
                            tokio::time::sleep(latency).await;
                        }
                        answer.await
                    }
                })
                .app_data(data.clone())
                // Images pushed in the request.
                .app_data(web::PayloadConfig::new(64 << 20))
                .route("/redfish/v1", web::get().to(root))
                .route("/redfish/v1/", web::get().to(root))
                .route(
                    "/redfish/v1/SessionService/Sessions",
                    web::post().to(create_session),
                )
                .route("/redfish/v1/Systems", web::get().to(systems))
                .route("/redfish/v1/Systems/1", web::get().to(system))
                .route("/redfish/v1/Systems/1", web::patch().to(patch_system))
                .route(
                    "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
                    web::post().to(reset),
                )
                .configure(firmware::routes)
                .configure(bios::routes)
                .configure(storage::routes)
                .default_service(web::to(|| async {
                    HttpResponse::NotFound()
                        .json(error("Base.1.0.ResourceMissingAtURI", "no such resource"))
                }))
        })
        .workers(1)
        .disable_signals();
        for a in addresses {
            server = server.bind(SocketAddr::new(*a, port))?;
        }
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        Ok(BmcSim {
            port,
            user: "admin".into(),
            password,
            handle,
            state,
        })
    }

    /// The BMC URL of the machine at `ip`.
    pub fn url(&self, ip: IpAddr) -> String {
        format!("http://{}", SocketAddr::new(ip, self.port))
    }

    /// What each system's BMC was asked so far, by address.
    pub fn counts(&self) -> HashMap<IpAddr, Counts> {
        self.state.counts.lock().unwrap().clone()
    }

    pub async fn stop(&self) {
        self.handle.stop(true).await;
    }
}

fn error(id: &str, message: &str) -> Value {
    json!({"error": {"code": id, "message": message,
        "@Message.ExtendedInfo": [{"MessageId": id, "Message": message}]}})
}

fn machine(req: &HttpRequest) -> IpAddr {
    req.app_config().local_addr().ip()
}

/// Basic credentials or a session token of this BMC.
fn authorized(req: &HttpRequest, st: &State) -> bool {
    let h = req.headers();
    if let Some(t) = h.get("X-Auth-Token").and_then(|v| v.to_str().ok()) {
        return st.sessions.lock().unwrap().get(t) == Some(&machine(req));
    }
    let Some(basic) = h
        .get("Authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
    else {
        return false;
    };
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(basic)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .is_some_and(|c| c == format!("{}:{}", st.user, st.password))
}

fn unauthorized() -> HttpResponse {
    HttpResponse::Unauthorized()
        .insert_header(("WWW-Authenticate", "Basic realm=\"BMC\""))
        .json(error(
            "Base.1.0.NoValidSession",
            "Incorrect username or password",
        ))
}

async fn root() -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "@odata.id": "/redfish/v1/",
        "Id": "RootService",
        "RedfishVersion": "1.15.0",
        "Systems": {"@odata.id": "/redfish/v1/Systems"},
        "Managers": {"@odata.id": "/redfish/v1/Managers"},
        "UpdateService": {"@odata.id": "/redfish/v1/UpdateService"},
        "TaskService": {"@odata.id": "/redfish/v1/TaskService"},
        "SessionService": {"@odata.id": "/redfish/v1/SessionService"},
        "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}},
    }))
}

async fn create_session(
    req: HttpRequest,
    st: web::Data<State>,
    body: web::Json<Value>,
) -> HttpResponse {
    if body["UserName"] != st.user.as_str() || body["Password"] != st.password.as_str() {
        return unauthorized();
    }
    let token = format!("{:032x}", rand::random::<u128>());
    let id = format!("{:08x}", rand::random::<u32>());
    st.sessions
        .lock()
        .unwrap()
        .insert(token.clone(), machine(&req));
    HttpResponse::Created()
        .insert_header(("X-Auth-Token", token))
        .insert_header((
            "Location",
            format!("/redfish/v1/SessionService/Sessions/{id}"),
        ))
        .json(json!({"@odata.id": format!("/redfish/v1/SessionService/Sessions/{id}"), "Id": id, "UserName": st.user}))
}

async fn systems(req: HttpRequest, st: web::Data<State>) -> HttpResponse {
    if !authorized(&req, &st) {
        return unauthorized();
    }
    HttpResponse::Ok().json(json!({
        "@odata.id": "/redfish/v1/Systems",
        "Members@odata.count": 1,
        "Members": [{"@odata.id": "/redfish/v1/Systems/1"}],
    }))
}

fn power(s: &mut System) -> &'static str {
    if let Some(at) = s.back_at {
        if Instant::now() >= at {
            s.on = true;
            s.back_at = None;
        }
    }
    if s.on { "On" } else { "Off" }
}

async fn system(req: HttpRequest, st: web::Data<State>) -> HttpResponse {
    if !authorized(&req, &st) {
        return unauthorized();
    }
    let ip = machine(&req);
    let (power_state, bios_version, boot) = {
        let mut systems = st.systems.lock().unwrap();
        let Some(s) = systems.get_mut(&ip) else {
            return HttpResponse::NotFound()
                .json(error("Base.1.0.ResourceMissingAtURI", "no system"));
        };
        let boot = json!({
            "BootSourceOverrideTarget": s.override_target,
            "BootSourceOverrideEnabled": s.override_enabled,
            "BootSourceOverrideTarget@Redfish.AllowableValues": OVERRIDE_TARGETS,
        });
        (power(s), s.firmware.version("BIOS").to_string(), boot)
    };
    HttpResponse::Ok().json(json!({
        "@odata.id": "/redfish/v1/Systems/1",
        "Id": "1",
        "Name": "System",
        "Manufacturer": "Shepherd Simulated Metal",
        "Model": "s1.small.x86",
        "SerialNumber": format!("SIM-{ip}"),
        "BiosVersion": bios_version,
        "Bios": {"@odata.id": "/redfish/v1/Systems/1/Bios"},
        "Storage": {"@odata.id": "/redfish/v1/Systems/1/Storage"},
        "Links": {"ManagedBy": [{"@odata.id": "/redfish/v1/Managers/1"}]},
        "PowerState": power_state,
        "Boot": boot,
        "ProcessorSummary": {"Count": 1, "Model": "Simulated Xeon E-2278G"},
        "MemorySummary": {"TotalSystemMemoryGiB": 32},
        "Status": {"State": "Enabled", "Health": "OK"},
        "Actions": {"#ComputerSystem.Reset": {
            "target": "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
            "ResetType@Redfish.AllowableValues":
                ["On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "PowerCycle"],
        }},
    }))
}

async fn reset(req: HttpRequest, st: web::Data<State>, body: web::Json<Value>) -> HttpResponse {
    if !authorized(&req, &st) {
        return unauthorized();
    }
    let ip = machine(&req);
    let kind = body["ResetType"].as_str().unwrap_or("");
    let powered_off = {
        let mut systems = st.systems.lock().unwrap();
        let Some(s) = systems.get_mut(&ip) else {
            return HttpResponse::NotFound()
                .json(error("Base.1.0.ResourceMissingAtURI", "no system"));
        };
        let was_on = power(s) == "On";
        s.resets += 1;
        let restarts = matches!(kind, "GracefulRestart" | "ForceRestart" | "PowerCycle")
            || (matches!(kind, "On" | "ForceOn") && !was_on);
        if restarts {
            st.count(ip, |c| c.restarts += 1);
            // What waits for a reset is done now: staged firmware runs,
            // pending BIOS settings and volumes take effect.
            s.firmware.activate(ip, &mut st.tasks.lock().unwrap());
            s.bios.apply();
            s.storage.apply();
        }
        match kind {
            "GracefulRestart" | "ForceRestart" | "PowerCycle" => {
                s.on = false;
                s.back_at = Some(Instant::now() + st.restart_delay);
            }
            "ForceOff" | "GracefulShutdown" => {
                s.on = false;
                s.back_at = None;
            }
            "On" | "ForceOn" => {
                s.on = true;
                s.back_at = None;
            }
            other => {
                return HttpResponse::BadRequest().json(error(
                    "Base.1.0.ActionParameterNotSupported",
                    &format!("ResetType {other:?} is not supported"),
                ));
            }
        }
        let comes_on = match kind {
            "GracefulRestart" | "ForceRestart" | "PowerCycle" => Some(st.restart_delay),
            "On" | "ForceOn" if !was_on => Some(Duration::ZERO),
            _ => None,
        };
        if let (Some(after), Some(rack)) = (comes_on, &st.rack) {
            let (reset, st, hook) = (s.resets, st.clone(), rack.on_power_on.clone());
            actix_rt::spawn(async move {
                tokio::time::sleep(after).await;
                let from = {
                    let mut systems = st.systems.lock().unwrap();
                    let Some(s) = systems.get_mut(&ip).filter(|s| s.resets == reset) else {
                        return;
                    };
                    s.on = true;
                    s.back_at = None;
                    s.boots()
                };
                hook(ip, from);
            });
        }
        was_on && !s.on
    };
    if powered_off {
        (st.on_power_off)(ip);
    }
    HttpResponse::NoContent().finish()
}

/// What `Boot.BootSourceOverrideTarget` may be set to.
const OVERRIDE_TARGETS: [&str; 4] = ["None", "Pxe", "Hdd", "Cd"];

impl System {
    /// What the system boots as it comes on; a `Once` override is used up.
    fn boots(&mut self) -> BootFrom {
        let from = match (
            self.override_enabled.as_str(),
            self.override_target.as_str(),
        ) {
            ("Once" | "Continuous", "Pxe") => BootFrom::Network,
            _ => BootFrom::Disk,
        };
        if self.override_enabled == "Once" {
            self.override_enabled = "Disabled".into();
        }
        from
    }
}

/// `PATCH /redfish/v1/Systems/1`: the boot override (`Boot`'s
/// `BootSourceOverrideTarget`, `…Enabled`; `…Mode` is taken and ignored).
async fn patch_system(
    req: HttpRequest,
    st: web::Data<State>,
    body: web::Json<Value>,
) -> HttpResponse {
    if !authorized(&req, &st) {
        return unauthorized();
    }
    let ip = machine(&req);
    let boot = &body["Boot"];
    let target = boot["BootSourceOverrideTarget"].as_str();
    let enabled = boot["BootSourceOverrideEnabled"].as_str();
    if target.is_none() && enabled.is_none() {
        return HttpResponse::BadRequest().json(error(
            "Base.1.0.PropertyUnknown",
            "only Boot.BootSourceOverrideTarget and BootSourceOverrideEnabled may be set",
        ));
    }
    if let Some(t) = target.filter(|t| !OVERRIDE_TARGETS.contains(t)) {
        return HttpResponse::BadRequest().json(error(
            "Base.1.0.PropertyValueNotInList",
            &format!("BootSourceOverrideTarget {t:?} is not one of {OVERRIDE_TARGETS:?}"),
        ));
    }
    if let Some(e) = enabled.filter(|e| !["Disabled", "Once", "Continuous"].contains(e)) {
        return HttpResponse::BadRequest().json(error(
            "Base.1.0.PropertyValueNotInList",
            &format!("BootSourceOverrideEnabled {e:?} is not Disabled, Once or Continuous"),
        ));
    }
    st.with_system(ip, |s| {
        if let Some(t) = target {
            s.override_target = t.to_string();
        }
        if let Some(e) = enabled {
            s.override_enabled = e.to_string();
        }
    });
    HttpResponse::NoContent().finish()
}
