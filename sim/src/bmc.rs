//! Simulated BMCs for the demo's owned hardware (`shepherd demo --provider
//! static`): a Redfish service per simulated machine, on the machine's own
//! loopback address, with one ComputerSystem (`/redfish/v1/Systems/1`), a
//! session service and basic authentication. A restart turns the system
//! off, tells the machine (its resident agent dies, as on real hardware),
//! and turns it on again after a moment. The tests use OpenStack's
//! emulator (sushy-tools) instead; this one needs no Python.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Value, json};

/// Called with a machine's address when its BMC restarts or stops it.
pub type OnPowerOff = Arc<dyn Fn(IpAddr) + Send + Sync>;

struct System {
    on: bool,
    /// Off until then, after a restart.
    back_at: Option<Instant>,
}

struct State {
    user: String,
    password: String,
    restart_delay: Duration,
    systems: Mutex<HashMap<IpAddr, System>>,
    sessions: Mutex<HashMap<String, IpAddr>>,
    on_power_off: OnPowerOff,
}

/// The running BMCs.
pub struct BmcSim {
    pub port: u16,
    pub user: String,
    pub password: String,
    handle: actix_web::dev::ServerHandle,
}

impl BmcSim {
    /// A BMC on a free port of each simulated machine's address, which a
    /// restart or a power-off of its system takes down (its resident agent
    /// dies, as on real hardware); back after a second from a restart.
    pub fn for_machines(machines: &crate::machine::MachineSim) -> std::io::Result<BmcSim> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let agents = machines.agents.clone();
        BmcSim::start(
            &machines.addresses,
            port,
            Duration::from_secs(1),
            Arc::new(move |ip| agents.power_off(ip)),
        )
    }

    /// A BMC on `port` of each of `addresses` (loopback only).
    pub fn start(
        addresses: &[IpAddr],
        port: u16,
        restart_delay: Duration,
        on_power_off: OnPowerOff,
    ) -> std::io::Result<BmcSim> {
        if let Some(a) = addresses.iter().find(|a| !a.is_loopback()) {
            return Err(std::io::Error::other(format!(
                "simulated BMCs live on loopback, not {a}"
            )));
        }
        let password = format!("{:032x}", rand::random::<u128>());
        let state = Arc::new(State {
            user: "admin".into(),
            password: password.clone(),
            restart_delay,
            systems: Mutex::new(
                addresses
                    .iter()
                    .map(|a| {
                        (
                            *a,
                            System {
                                on: true,
                                back_at: None,
                            },
                        )
                    })
                    .collect(),
            ),
            sessions: Mutex::new(HashMap::new()),
            on_power_off,
        });
        let data = web::Data::from(state);
        let mut server = actix_web::HttpServer::new(move || {
            actix_web::App::new()
                .app_data(data.clone())
                .route("/redfish/v1", web::get().to(root))
                .route("/redfish/v1/", web::get().to(root))
                .route(
                    "/redfish/v1/SessionService/Sessions",
                    web::post().to(create_session),
                )
                .route("/redfish/v1/Systems", web::get().to(systems))
                .route("/redfish/v1/Systems/1", web::get().to(system))
                .route(
                    "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
                    web::post().to(reset),
                )
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
        })
    }

    /// The BMC URL of the machine at `ip`.
    pub fn url(&self, ip: IpAddr) -> String {
        format!("http://{}", SocketAddr::new(ip, self.port))
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
    let power_state = {
        let mut systems = st.systems.lock().unwrap();
        let Some(s) = systems.get_mut(&ip) else {
            return HttpResponse::NotFound()
                .json(error("Base.1.0.ResourceMissingAtURI", "no system"));
        };
        power(s)
    };
    let last = match ip {
        IpAddr::V4(v4) => v4.octets()[3],
        IpAddr::V6(v6) => v6.octets()[15],
    };
    HttpResponse::Ok().json(json!({
        "@odata.id": "/redfish/v1/Systems/1",
        "Id": "1",
        "Name": "System",
        "Manufacturer": "Shepherd Simulated Metal",
        "Model": "s1.small.x86",
        "SerialNumber": format!("SIM-{ip}"),
        "BiosVersion": format!("1.4.{last}"),
        "PowerState": power_state,
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
        was_on && !s.on
    };
    if powered_off {
        (st.on_power_off)(ip);
    }
    HttpResponse::NoContent().finish()
}
