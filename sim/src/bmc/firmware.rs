//! A simulated BMC's firmware, as real ones do it:
//! - an `UpdateService` with a `FirmwareInventory` (`BIOS`, `BMC`,
//!   `NIC.1`), `SimpleUpdate` (the BMC fetches `ImageURI` itself, with the
//!   `Username` and `Password` given) and a `MultipartHttpPushUri` (the
//!   image in the request);
//! - each update a task (`/redfish/v1/TaskService/Tasks/{id}`, the
//!   `Location` of the 202) that runs a while, reports `PercentComplete`,
//!   fails on cue (`FirmwareOptions::fails`), and, done, waits for a reset
//!   (`Update.1.0.AwaitToActivate`): the new version runs from the next
//!   restart;
//! - one task at a time: an update asked while one runs is answered 503
//!   with `Retry-After`;
//! - the manager's `FirmwareVersion` (`/redfish/v1/Managers/1`).
//!
//! A simulated image is a file whose first line is
//! `shepherd-sim-firmware <inventory id> <version>` (`image`); anything
//! else fails its task, as a BMC refuses an image not meant for it.
//!
//! An update must name its `Targets` (answered 400 without, as
//! sushy-tools does), each a resource of this BMC: a `FirmwareInventory`
//! member, the system (for the BIOS), the manager (for the BMC). An image
//! for a component none of its targets stands for fails its task.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Value, json};

use super::{State, error, machine};

/// The components of a simulated machine's inventory, by `Id`.
pub const COMPONENTS: [&str; 3] = ["BIOS", "BMC", "NIC.1"];

/// A simulated firmware image for `component` (an inventory `Id`) at
/// `version`.
pub fn image(component: &str, version: &str) -> Vec<u8> {
    format!("shepherd-sim-firmware {component} {version}\n").into_bytes()
}

/// How the simulated firmware updates behave.
#[derive(Clone)]
pub struct FirmwareOptions {
    /// How long an update's task runs once it has its image.
    pub task_time: Duration,
    /// Whether an update of the machine at this address fails (its task
    /// ends in `Exception`, the version unchanged).
    pub fails: std::sync::Arc<dyn Fn(IpAddr) -> bool + Send + Sync>,
    /// Offer `MultipartHttpPushUri` (false: `SimpleUpdate` only, as BMCs
    /// before Redfish's UpdateService v1.6).
    pub push: bool,
}

impl FirmwareOptions {
    /// Updates of `task_time`, failing on a `share` of the machines (0 to
    /// 1), chosen by their address: the same machines on every run.
    pub fn failing_share(task_time: Duration, share: f64) -> FirmwareOptions {
        let per_10k = (share.clamp(0.0, 1.0) * 10_000.0).round() as u64;
        FirmwareOptions {
            task_time,
            fails: std::sync::Arc::new(move |ip| {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                ip.hash(&mut h);
                h.finish() % 10_000 < per_10k
            }),
            push: true,
        }
    }
}

impl Default for FirmwareOptions {
    fn default() -> Self {
        FirmwareOptions {
            task_time: Duration::from_secs(2),
            fails: std::sync::Arc::new(|_| false),
            push: true,
        }
    }
}

/// An update's task.
pub(super) struct Task {
    pub id: u64,
    pub machine: IpAddr,
    /// The components its `Targets` stand for.
    pub targets: Vec<&'static str>,
    /// What is updated, once the image is read: (component, version).
    pub target: Option<(String, String)>,
    /// When its work ends (None: still fetching the image).
    pub ends_at: Option<Instant>,
    pub started: Instant,
    /// Why it failed at once (its image could not be had or read).
    pub failed: Option<String>,
    /// Why it fails when its time is up (on cue).
    pub fails_with: Option<String>,
    /// Its version runs: a reset came after it completed.
    pub activated: bool,
}

impl Task {
    fn running(&self) -> bool {
        self.failed.is_none() && self.ends_at.is_none_or(|e| Instant::now() < e)
    }

    /// Completed without an error: its version waits for a reset.
    pub fn succeeded(&self) -> bool {
        self.failed.is_none()
            && self.fails_with.is_none()
            && self.ends_at.is_some_and(|e| Instant::now() >= e)
    }

    /// Why it failed, once it has.
    fn failure(&self) -> Option<&String> {
        match (&self.failed, &self.fails_with, self.ends_at) {
            (Some(why), _, _) => Some(why),
            (None, Some(why), Some(end)) if Instant::now() >= end => Some(why),
            _ => None,
        }
    }

    fn json(&self, task_time: Duration) -> Value {
        let now = Instant::now();
        let (state, status, percent, messages) = match (self.failure(), self.ends_at) {
            (Some(why), _) => (
                "Exception",
                "Critical",
                100,
                json!([{"MessageId": "Update.1.0.ApplyFailed", "Message": why}]),
            ),
            (None, Some(end)) if now >= end => {
                let (c, v) = self.target.clone().unwrap_or_default();
                (
                    "Completed",
                    "OK",
                    100,
                    json!([{"MessageId": "Update.1.0.AwaitToActivate",
                            "Message": format!("Awaiting a reset to activate {v} on {c}."),
                            "Resolution": "Reset the system."}]),
                )
            }
            (None, Some(end)) => {
                let left = end.saturating_duration_since(now).as_secs_f64();
                let done = 1.0 - left / task_time.as_secs_f64().max(0.001);
                ("Running", "OK", (done * 99.0) as u64, json!([]))
            }
            (None, None) => ("Running", "OK", 0, json!([])),
        };
        json!({
            "@odata.id": format!("/redfish/v1/TaskService/Tasks/{}", self.id),
            "@odata.type": "#Task.v1_7_0.Task",
            "Id": self.id.to_string(),
            "Name": "Firmware update",
            "TaskState": state,
            "TaskStatus": status,
            "PercentComplete": percent,
            "StartTime": format!("{} s ago", self.started.elapsed().as_secs()),
            "Messages": messages,
        })
    }
}

/// A machine's firmware.
pub(super) struct Firmware {
    /// Versions running, by inventory `Id`.
    pub running: Vec<(String, String)>,
}

impl Firmware {
    pub fn new(ip: IpAddr) -> Firmware {
        let last = match ip {
            IpAddr::V4(v4) => v4.octets()[3],
            IpAddr::V6(v6) => v6.octets()[15],
        };
        Firmware {
            running: vec![
                ("BIOS".into(), format!("1.4.{last}")),
                ("BMC".into(), "5.10.0".into()),
                ("NIC.1".into(), "22.31.6".into()),
            ],
        }
    }

    pub fn version(&self, id: &str) -> &str {
        self.running
            .iter()
            .find(|(c, _)| c == id)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    }

    /// A reset: what `tasks` of this machine completed runs.
    pub fn activate(&mut self, machine: IpAddr, tasks: &mut [Task]) {
        for t in tasks.iter_mut() {
            if t.machine != machine || t.activated || !t.succeeded() {
                continue;
            }
            t.activated = true;
            if let Some((c, v)) = &t.target
                && let Some(r) = self.running.iter_mut().find(|(rc, _)| rc == c)
            {
                r.1 = v.clone();
            }
        }
    }
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/redfish/v1/UpdateService", web::get().to(update_service))
        .route(
            "/redfish/v1/UpdateService/FirmwareInventory",
            web::get().to(inventory),
        )
        .route(
            "/redfish/v1/UpdateService/FirmwareInventory/{id}",
            web::get().to(inventory_item),
        )
        .route(
            "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
            web::post().to(simple_update),
        )
        .route("/redfish/v1/UpdateService/upload", web::post().to(push))
        .route("/redfish/v1/TaskService/Tasks/{id}", web::get().to(task))
        .route("/redfish/v1/Managers", web::get().to(managers))
        .route("/redfish/v1/Managers/1", web::get().to(manager));
}

async fn update_service(req: HttpRequest, st: web::Data<State>) -> HttpResponse {
    authorize!(req, st);
    let mut service = json!({
        "@odata.id": "/redfish/v1/UpdateService",
        "Id": "UpdateService",
        "ServiceEnabled": true,
        "FirmwareInventory": {"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory"},
        "Actions": {"#UpdateService.SimpleUpdate": {
            "target": "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
            "TransferProtocol@Redfish.AllowableValues": ["HTTP", "HTTPS"],
        }},
    });
    if st.firmware.push {
        service["MultipartHttpPushUri"] = json!("/redfish/v1/UpdateService/upload");
    }
    HttpResponse::Ok().json(service)
}

async fn inventory(req: HttpRequest, st: web::Data<State>) -> HttpResponse {
    authorize!(req, st);
    HttpResponse::Ok().json(json!({
        "@odata.id": "/redfish/v1/UpdateService/FirmwareInventory",
        "Members@odata.count": COMPONENTS.len(),
        "Members": COMPONENTS.iter()
            .map(|c| json!({"@odata.id": format!("/redfish/v1/UpdateService/FirmwareInventory/{c}")}))
            .collect::<Vec<_>>(),
    }))
}

async fn inventory_item(
    req: HttpRequest,
    st: web::Data<State>,
    id: web::Path<String>,
) -> HttpResponse {
    authorize!(req, st);
    if !COMPONENTS.contains(&id.as_str()) {
        return HttpResponse::NotFound()
            .json(error("Base.1.0.ResourceMissingAtURI", "no such component"));
    }
    let version = st.with_system(machine(&req), |s| s.firmware.version(&id).to_string());
    HttpResponse::Ok().json(json!({
        "@odata.id": format!("/redfish/v1/UpdateService/FirmwareInventory/{id}"),
        "Id": *id,
        "Name": match id.as_str() { "BIOS" => "System BIOS", "BMC" => "BMC firmware", _ => "NIC firmware" },
        "Version": version,
        "Updateable": true,
        "Status": {"State": "Enabled", "Health": "OK"},
    }))
}

async fn managers(req: HttpRequest, st: web::Data<State>) -> HttpResponse {
    authorize!(req, st);
    HttpResponse::Ok().json(json!({
        "@odata.id": "/redfish/v1/Managers",
        "Members@odata.count": 1,
        "Members": [{"@odata.id": "/redfish/v1/Managers/1"}],
    }))
}

async fn manager(req: HttpRequest, st: web::Data<State>) -> HttpResponse {
    authorize!(req, st);
    let version = st.with_system(machine(&req), |s| s.firmware.version("BMC").to_string());
    HttpResponse::Ok().json(json!({
        "@odata.id": "/redfish/v1/Managers/1",
        "Id": "1",
        "Name": "Manager",
        "ManagerType": "BMC",
        "Model": "Simulated BMC",
        "FirmwareVersion": version,
    }))
}

async fn task(req: HttpRequest, st: web::Data<State>, id: web::Path<String>) -> HttpResponse {
    authorize!(req, st);
    let ip = machine(&req);
    let tasks = st.tasks.lock().unwrap();
    match tasks
        .iter()
        .find(|t| t.machine == ip && id.as_str() == t.id.to_string())
    {
        Some(t) => HttpResponse::Ok().json(t.json(st.firmware.task_time)),
        None => {
            HttpResponse::NotFound().json(error("Base.1.0.ResourceMissingAtURI", "no such task"))
        }
    }
}

/// Reads a simulated image: (component, version).
fn read_image(bytes: &[u8]) -> Result<(String, String), String> {
    let line = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = std::str::from_utf8(line).map_err(|_| "the image is not one for this machine")?;
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("shepherd-sim-firmware"), Some(c), Some(v)) if COMPONENTS.contains(&c) => {
            Ok((c.to_string(), v.to_string()))
        }
        _ => Err("the image is not one for this machine (no component of it named)".into()),
    }
}

/// The components the update's `Targets` stand for; a 400 naming what
/// is wrong when there are none or one is not this BMC's.
fn targets(v: &Value) -> Result<Vec<&'static str>, HttpResponse> {
    let bad =
        |m: String| HttpResponse::BadRequest().json(error("Base.1.0.ActionParameterMissing", &m));
    let list: Vec<&str> = v["Targets"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if list.is_empty() {
        return Err(bad("Missing Targets: name the resource to update".into()));
    }
    list.iter()
        .map(|t| {
            let t = t.trim_end_matches('/');
            let member = t.strip_prefix("/redfish/v1/UpdateService/FirmwareInventory/");
            match (t, member) {
                (_, Some(m)) => COMPONENTS.iter().copied().find(|c| *c == m),
                ("/redfish/v1/Systems/1", _) => Some("BIOS"),
                ("/redfish/v1/Managers/1", _) => Some("BMC"),
                _ => None,
            }
            .ok_or_else(|| bad(format!("{t} is not a resource this BMC can update")))
        })
        .collect()
}

/// Starts a task for the machine at `ip` on `targets`, unless one runs:
/// its 202, or the 503 of a busy BMC.
fn start_task(st: &State, ip: IpAddr, targets: Vec<&'static str>) -> Result<u64, HttpResponse> {
    let mut tasks = st.tasks.lock().unwrap();
    if tasks.iter().any(|t| t.machine == ip && t.running()) {
        st.count(ip, |c| c.busy += 1);
        return Err(HttpResponse::ServiceUnavailable()
            .insert_header(("Retry-After", "1"))
            .json(error(
                "Base.1.0.ServiceTemporarilyUnavailable",
                "an update is in progress: try again later",
            )));
    }
    st.count(ip, |c| c.updates += 1);
    let id = tasks.iter().map(|t| t.id).max().unwrap_or(0) + 1;
    tasks.push(Task {
        id,
        machine: ip,
        targets,
        target: None,
        ends_at: None,
        started: Instant::now(),
        failed: None,
        fails_with: None,
        activated: false,
    });
    Ok(id)
}

/// The image is in hand (or could not be had): the task runs its time,
/// then fails on cue or stages the version.
fn image_read(st: &State, id: u64, image: Result<Vec<u8>, String>) {
    let mut tasks = st.tasks.lock().unwrap();
    let Some(t) = tasks.iter_mut().find(|t| t.id == id) else {
        return;
    };
    match image.and_then(|b| read_image(&b)) {
        Err(e) => t.failed = Some(e),
        Ok((c, _)) if !t.targets.contains(&c.as_str()) => {
            t.failed = Some(format!(
                "the image is for {c}, which none of the update's Targets ({}) is",
                t.targets.join(", ")
            ));
        }
        Ok((c, v)) => {
            t.ends_at = Some(Instant::now() + st.firmware.task_time);
            if (st.firmware.fails)(t.machine) {
                t.fails_with = Some(format!(
                    "the update of {c} to {v} failed: the image did not verify"
                ));
            }
            t.target = Some((c, v));
        }
    }
}

fn accepted(id: u64) -> HttpResponse {
    let path = format!("/redfish/v1/TaskService/Tasks/{id}");
    HttpResponse::Accepted()
        .insert_header(("Location", path.clone()))
        .json(json!({"@odata.id": path, "Id": id.to_string(), "TaskState": "Running"}))
}

async fn simple_update(
    req: HttpRequest,
    st: web::Data<State>,
    body: web::Json<Value>,
) -> HttpResponse {
    authorize!(req, st);
    let Some(uri) = body["ImageURI"].as_str().map(String::from) else {
        return HttpResponse::BadRequest().json(error(
            "Base.1.0.ActionParameterMissing",
            "SimpleUpdate needs ImageURI",
        ));
    };
    let credentials = match (body["Username"].as_str(), body["Password"].as_str()) {
        (Some(u), Some(p)) => Some((u.to_string(), p.to_string())),
        _ => None,
    };
    let targets = match targets(&body) {
        Ok(t) => t,
        Err(bad) => return bad,
    };
    let ip = machine(&req);
    let id = match start_task(&st, ip, targets) {
        Ok(id) => id,
        Err(busy) => return busy,
    };
    let st = st.into_inner();
    actix_rt::spawn(async move {
        let image = fetch(&uri, credentials).await;
        image_read(&st, id, image);
    });
    accepted(id)
}

/// Fetches an image as a BMC does: any certificate (BMCs seldom hold the
/// operator's CA), the credentials given.
async fn fetch(uri: &str, credentials: Option<(String, String)>) -> Result<Vec<u8>, String> {
    let client = awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(std::sync::Arc::new(
            shepherd::redfish::tls::insecure_client_config(),
        )))
        .timeout(Duration::from_secs(30))
        .finish();
    let mut r = client.get(uri);
    if let Some((u, p)) = &credentials {
        r = r.basic_auth(u, p);
    }
    let mut resp = r
        .send()
        .await
        .map_err(|e| format!("could not fetch the image: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!(
            "could not fetch the image: HTTP {}",
            resp.status().as_u16()
        ));
    }
    resp.body()
        .limit(64 << 20)
        .await
        .map(|b| b.to_vec())
        .map_err(|e| format!("could not fetch the image: {e}"))
}

/// `MultipartHttpPushUri`: `UpdateParameters` (JSON) and `UpdateFile`
/// (the image) as multipart/form-data.
async fn push(req: HttpRequest, st: web::Data<State>, body: web::Bytes) -> HttpResponse {
    authorize!(req, st);
    if !st.firmware.push {
        return HttpResponse::NotFound()
            .json(error("Base.1.0.ResourceMissingAtURI", "no such resource"));
    }
    let boundary = req
        .headers()
        .get("Content-Type")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.starts_with("multipart/form-data"))
        .and_then(|v| v.split("boundary=").nth(1))
        .map(|b| b.trim_matches('"').to_string());
    let Some(boundary) = boundary else {
        return HttpResponse::UnsupportedMediaType().json(error(
            "Base.1.0.UnsupportedMediaType",
            "a multipart/form-data body with a boundary is needed",
        ));
    };
    let parts = multipart(&body, &boundary);
    let Some(file) = parts.iter().find(|(n, _)| n == "UpdateFile") else {
        return HttpResponse::BadRequest().json(error(
            "Base.1.0.ActionParameterMissing",
            "the UpdateFile part is missing",
        ));
    };
    let parameters = match parts.iter().find(|(n, _)| n == "UpdateParameters") {
        Some((_, p)) => match serde_json::from_slice::<Value>(p) {
            Ok(v) => v,
            Err(_) => {
                return HttpResponse::BadRequest().json(error(
                    "Base.1.0.MalformedJSON",
                    "UpdateParameters is not JSON",
                ));
            }
        },
        None => Value::Null,
    };
    let targets = match targets(&parameters) {
        Ok(t) => t,
        Err(bad) => return bad,
    };
    let id = match start_task(&st, machine(&req), targets) {
        Ok(id) => id,
        Err(busy) => return busy,
    };
    image_read(&st, id, Ok(file.1.to_vec()));
    accepted(id)
}

/// The parts of a multipart/form-data body: (name, content).
fn multipart<'a>(body: &'a [u8], boundary: &str) -> Vec<(String, &'a [u8])> {
    let delimiter = format!("--{boundary}");
    let d = delimiter.as_bytes();
    let mut out = Vec::new();
    let mut starts = Vec::new();
    let mut i = 0;
    while i + d.len() <= body.len() {
        if &body[i..i + d.len()] == d {
            starts.push(i);
            i += d.len();
        } else {
            i += 1;
        }
    }
    for w in starts.windows(2) {
        let part = &body[w[0] + d.len()..w[1]];
        let Some(split) = part.windows(4).position(|x| x == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&part[..split]);
        let mut content = &part[split + 4..];
        if content.ends_with(b"\r\n") {
            content = &content[..content.len() - 2];
        }
        let name = head
            .split("name=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("")
            .to_string();
        out.push((name, content));
    }
    out
}
