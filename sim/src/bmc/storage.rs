//! A simulated system's storage, as real RAID controllers offer it
//! through their BMC: one controller (`RAID.1`) with four drives, and a
//! `Volumes` collection that takes a new volume (`RAIDType`, its drives'
//! links) or a volume's deletion with an `@Redfish.OperationApplyTime` of
//! `Immediate` or `OnReset`; the latter waits for the system's next
//! restart. A drive in a volume (or pending for one) is refused for
//! another, as is a RAID type its drive count cannot make.

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Value, json};

use super::{State, error, machine};

const CONTROLLER: &str = "/redfish/v1/Systems/1/Storage/RAID.1";
const DRIVES: usize = 4;
const DRIVE_BYTES: u64 = 960_197_124_096;

#[derive(Clone)]
pub(super) struct Volume {
    pub id: u32,
    pub raid_type: String,
    pub drives: Vec<usize>,
}

/// A system's volumes: made, and waiting for a reset (new ones, and the
/// IDs of those to delete).
#[derive(Default)]
pub(super) struct Storage {
    pub volumes: Vec<Volume>,
    pub pending_new: Vec<Volume>,
    pub pending_delete: Vec<u32>,
    next: u32,
}

impl Storage {
    /// A reset: what waits for it is done.
    pub fn apply(&mut self) {
        let delete = std::mem::take(&mut self.pending_delete);
        self.volumes.retain(|v| !delete.contains(&v.id));
        let new = std::mem::take(&mut self.pending_new);
        self.volumes.extend(new);
    }

    fn in_use(&self, drive: usize) -> bool {
        self.volumes
            .iter()
            .chain(&self.pending_new)
            .filter(|v| !self.pending_delete.contains(&v.id))
            .any(|v| v.drives.contains(&drive))
    }
}

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/redfish/v1/Systems/1/Storage", web::get().to(collection))
        .route(CONTROLLER, web::get().to(controller))
        .route(&format!("{CONTROLLER}/Drives/{{id}}"), web::get().to(drive))
        .route(&format!("{CONTROLLER}/Volumes"), web::get().to(volumes))
        .route(&format!("{CONTROLLER}/Volumes"), web::post().to(create))
        .route(
            &format!("{CONTROLLER}/Volumes/{{id}}"),
            web::get().to(volume),
        )
        .route(
            &format!("{CONTROLLER}/Volumes/{{id}}"),
            web::delete().to(delete),
        );
}

fn missing() -> HttpResponse {
    HttpResponse::NotFound().json(error("Base.1.0.ResourceMissingAtURI", "no such resource"))
}

async fn collection(req: HttpRequest, st: web::Data<State>) -> HttpResponse {
    authorize!(req, st);
    HttpResponse::Ok().json(json!({
        "@odata.id": "/redfish/v1/Systems/1/Storage",
        "Members@odata.count": 1,
        "Members": [{"@odata.id": CONTROLLER}],
    }))
}

async fn controller(req: HttpRequest, st: web::Data<State>) -> HttpResponse {
    authorize!(req, st);
    HttpResponse::Ok().json(json!({
        "@odata.id": CONTROLLER,
        "Id": "RAID.1",
        "Name": "Simulated RAID controller",
        "Drives": (0..DRIVES).map(|d| json!({"@odata.id": format!("{CONTROLLER}/Drives/{d}")})).collect::<Vec<_>>(),
        "Volumes": {"@odata.id": format!("{CONTROLLER}/Volumes")},
    }))
}

async fn drive(req: HttpRequest, st: web::Data<State>, id: web::Path<usize>) -> HttpResponse {
    authorize!(req, st);
    if *id >= DRIVES {
        return missing();
    }
    HttpResponse::Ok().json(json!({
        "@odata.id": format!("{CONTROLLER}/Drives/{id}"),
        "Id": id.to_string(),
        "Name": format!("Solid State Disk 0:1:{id}"),
        "CapacityBytes": DRIVE_BYTES,
        "MediaType": "SSD",
        "Protocol": "SATA",
        "SerialNumber": format!("SIMSSD{:04}-{}", *id, machine(&req)),
    }))
}

fn volume_json(v: &Volume) -> Value {
    let data = match v.raid_type.as_str() {
        "RAID0" => v.drives.len(),
        "RAID1" | "RAID10" => v.drives.len() / 2,
        "RAID5" => v.drives.len() - 1,
        "RAID6" => v.drives.len() - 2,
        _ => 1,
    } as u64;
    json!({
        "@odata.id": format!("{CONTROLLER}/Volumes/{}", v.id),
        "Id": v.id.to_string(),
        "Name": format!("Virtual Disk {}", v.id),
        "RAIDType": v.raid_type,
        "CapacityBytes": data * DRIVE_BYTES,
        "Links": {"Drives": v.drives.iter().map(|d| json!({"@odata.id": format!("{CONTROLLER}/Drives/{d}")})).collect::<Vec<_>>()},
    })
}

async fn volumes(req: HttpRequest, st: web::Data<State>) -> HttpResponse {
    authorize!(req, st);
    let ids: Vec<u32> = st.with_system(machine(&req), |s| {
        s.storage.volumes.iter().map(|v| v.id).collect()
    });
    HttpResponse::Ok().json(json!({
        "@odata.id": format!("{CONTROLLER}/Volumes"),
        "Members@odata.count": ids.len(),
        "Members": ids.iter().map(|i| json!({"@odata.id": format!("{CONTROLLER}/Volumes/{i}")})).collect::<Vec<_>>(),
        "@Redfish.OperationApplyTimeSupport": {
            "@odata.type": "#Settings.v1_3_5.OperationApplyTimeSupport",
            "SupportedValues": ["Immediate", "OnReset"],
        },
    }))
}

async fn volume(req: HttpRequest, st: web::Data<State>, id: web::Path<u32>) -> HttpResponse {
    authorize!(req, st);
    let v = st.with_system(machine(&req), |s| {
        s.storage.volumes.iter().find(|v| v.id == *id).cloned()
    });
    match v {
        Some(v) => HttpResponse::Ok().json(volume_json(&v)),
        None => missing(),
    }
}

/// `@Redfish.OperationApplyTime`: `Immediate` (the default) or `OnReset`.
fn on_reset(body: &Value) -> Result<bool, HttpResponse> {
    match body["@Redfish.OperationApplyTime"].as_str() {
        None | Some("Immediate") => Ok(false),
        Some("OnReset") => Ok(true),
        Some(other) => Err(HttpResponse::BadRequest().json(error(
            "Base.1.0.PropertyValueNotInList",
            &format!("OperationApplyTime {other:?} is not supported: Immediate, OnReset"),
        ))),
    }
}

fn bad(message: &str) -> HttpResponse {
    HttpResponse::BadRequest().json(error("Base.1.0.PropertyValueConflict", message))
}

async fn create(req: HttpRequest, st: web::Data<State>, body: web::Json<Value>) -> HttpResponse {
    authorize!(req, st);
    let later = match on_reset(&body) {
        Ok(l) => l,
        Err(r) => return r,
    };
    let raid_type = body["RAIDType"].as_str().unwrap_or("").to_string();
    let fewest = match raid_type.as_str() {
        "RAID0" => 1,
        "RAID1" => 2,
        "RAID5" => 3,
        "RAID6" | "RAID10" => 4,
        _ => {
            return bad(&format!(
                "RAIDType {raid_type:?} is not supported: RAID0, RAID1, RAID5, RAID6, RAID10"
            ));
        }
    };
    let mut drives = Vec::new();
    for d in body["Links"]["Drives"].as_array().into_iter().flatten() {
        let parsed = d["@odata.id"]
            .as_str()
            .and_then(|p| p.strip_prefix(&format!("{CONTROLLER}/Drives/")))
            .and_then(|i| i.parse::<usize>().ok())
            .filter(|i| *i < DRIVES);
        match parsed {
            Some(i) if !drives.contains(&i) => drives.push(i),
            _ => {
                return bad(&format!(
                    "{d} is not a drive of this controller, or is named twice"
                ));
            }
        }
    }
    if drives.len() < fewest || (raid_type == "RAID10" && drives.len() % 2 == 1) {
        return bad(&format!(
            "a {raid_type} volume cannot be made of {} drives",
            drives.len()
        ));
    }
    st.with_system(machine(&req), |s| {
        let storage = &mut s.storage;
        if let Some(d) = drives.iter().find(|d| storage.in_use(**d)) {
            return bad(&format!("drive {d} is in a volume already"));
        }
        storage.next += 1;
        let v = Volume {
            id: storage.next,
            raid_type: raid_type.clone(),
            drives: drives.clone(),
        };
        let path = format!("{CONTROLLER}/Volumes/{}", v.id);
        if later {
            storage.pending_new.push(v);
            HttpResponse::Accepted().json(
                json!({"@Message.ExtendedInfo": [{"MessageId": "Base.1.0.Success",
                    "Message": format!("{path} is made at the next reset")}]}),
            )
        } else {
            let body = volume_json(&v);
            storage.volumes.push(v);
            HttpResponse::Created()
                .insert_header(("Location", path))
                .json(body)
        }
    })
}

async fn delete(
    req: HttpRequest,
    st: web::Data<State>,
    id: web::Path<u32>,
    body: web::Bytes,
) -> HttpResponse {
    authorize!(req, st);
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let later = match on_reset(&body) {
        Ok(l) => l,
        Err(r) => return r,
    };
    st.with_system(machine(&req), |s| {
        let storage = &mut s.storage;
        if !storage.volumes.iter().any(|v| v.id == *id) {
            return missing();
        }
        if later {
            storage.pending_delete.push(*id);
            HttpResponse::Accepted().finish()
        } else {
            storage.volumes.retain(|v| v.id != *id);
            HttpResponse::NoContent().finish()
        }
    })
}
