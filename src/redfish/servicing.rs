//! Changing what is below the system through its BMC: a firmware update
//! (started, then followed through its task), BIOS settings (PATCHed to
//! the settings object with an apply time), RAID volumes (made and
//! deleted with an apply time).
//!
//! An update's image reaches the BMC one of two ways, the first where the
//! BMC offers it:
//! - **pushed** (`UpdateService.MultipartHttpPushUri`): shepherd sends the
//!   file in the request. Preferred: the BMC needs no route to shepherd's
//!   image server and is handed no credential, and shepherd sees the
//!   upload through.
//! - **fetched** (`UpdateService.SimpleUpdate` with `ImageURI`, and the
//!   `Username` and `Password` of a grant made for this one update): for
//!   BMCs older than the push (Redfish's `UpdateService` before v1.6).
//!
//! Every answer of 503 is `BmcErrorKind::Busy`, with the BMC's
//! `Retry-After`: the caller waits and asks again (one update per BMC at a
//! time).

use std::path::PathBuf;

use actix::prelude::*;
use awc::http::Method;
use serde_json::{Value, json};

use super::client::{BmcClient, BmcError, BmcErrorKind, Body, Conn};
use super::system::text;

/// The largest image shepherd pushes.
pub const MAX_IMAGE_BYTES: u64 = 512 << 20;

/// How an update's image reaches the BMC.
#[derive(Debug, Clone)]
pub struct UpdateImage {
    /// The file, pushed where the BMC takes a push.
    pub path: PathBuf,
    /// Its name, as the push names it.
    pub name: String,
    /// Where the BMC may fetch it instead, and the user name and password
    /// it fetches with (a grant for this one update).
    pub fetch: Option<(String, String, crate::secret::Secret)>,
}

/// How an update was started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// Its task, to follow (`GetTask`); `pushed` tells how the image went.
    Task { monitor: String, pushed: bool },
    /// The BMC answered without a task: done as far as it says.
    Done { pushed: bool },
}

/// Starts the update of `component` (`bios`, `bmc`, `nic:<Id>`,
/// `inventory:<Id>`, as `GetFirmware` names it) of `system` with
/// `image`. The update names its target (`Targets`, the resource the
/// component is: `super::firmware::update_target`), and a BMC's refusal
/// names it too.
#[derive(Message)]
#[rtype(result = "Result<Started, BmcError>")]
pub struct StartUpdate {
    pub image: UpdateImage,
    pub system: Option<String>,
    pub component: String,
}

sequence!(StartUpdate => Started, |c, msg| {
    let target = super::firmware::update_target(&mut c, &msg.system, &msg.component).await?;
    let root = c.call(Method::GET, "/redfish/v1/", None, "the service root").await?;
    let Some(service) = text(&root["UpdateService"]["@odata.id"]) else {
        return Err(c.err(BmcErrorKind::Protocol(
            "the BMC offers no UpdateService: firmware cannot be updated through it".into(),
        )));
    };
    let service = c.call(Method::GET, &service, None, "the UpdateService").await?;
    if let Some(push) = text(&service["MultipartHttpPushUri"]) {
        return push_image(&mut c, &push, &msg.image, &target).await;
    }
    let action = &service["Actions"]["#UpdateService.SimpleUpdate"];
    match (text(&action["target"]), &msg.image.fetch) {
        (Some(action), Some((uri, user, password))) => {
            let mut body = json!({
                "ImageURI": uri,
                "Username": user,
                "Password": password.expose(),
            });
            if uri.starts_with("https://") {
                body["TransferProtocol"] = json!("HTTPS");
            } else if uri.starts_with("http://") {
                body["TransferProtocol"] = json!("HTTP");
            }
            body["Targets"] = json!([target]);
            let what = format!("UpdateService.SimpleUpdate of {target}");
            let a = c
                .answer(Method::POST, &action, Some(Body::Json(&body)), &what)
                .await?;
            Ok(started(a, false))
        }
        (Some(_), None) => Err(c.err(BmcErrorKind::Protocol(
            "the BMC takes no pushed image and no address to fetch it from was given".into(),
        ))),
        (None, _) => Err(c.err(BmcErrorKind::Protocol(
            "the BMC's UpdateService offers neither a push (MultipartHttpPushUri) nor SimpleUpdate".into(),
        ))),
    }
});

fn started(a: super::client::Answer, pushed: bool) -> Started {
    let monitor = a
        .location
        .or_else(|| text(&a.json["@odata.id"]).filter(|_| a.json["TaskState"].is_string()));
    match monitor {
        Some(monitor) if a.status == 202 || a.json["TaskState"].is_string() => {
            Started::Task { monitor, pushed }
        }
        _ => Started::Done { pushed },
    }
}

/// Pushes the image as multipart/form-data: `UpdateParameters` (the
/// targets, applied at the next reset) and `UpdateFile`.
async fn push_image(
    c: &mut Conn,
    push: &str,
    image: &UpdateImage,
    target: &str,
) -> Result<Started, BmcError> {
    let read = async {
        let meta = tokio::fs::metadata(&image.path).await?;
        if meta.len() > MAX_IMAGE_BYTES {
            return Err(std::io::Error::other(format!(
                "{} bytes, more than the {MAX_IMAGE_BYTES} pushed at most",
                meta.len()
            )));
        }
        tokio::fs::read(&image.path).await
    };
    let bytes = read.await.map_err(|e| {
        c.err(BmcErrorKind::Config(format!(
            "the image {}: {e}",
            image.path.display()
        )))
    })?;
    let boundary = format!("shepherd-{:032x}", rand::random::<u128>());
    let parameters = json!({
        "Targets": [target],
        "@Redfish.OperationApplyTime": "OnReset",
    });
    let name: String = image
        .name
        .chars()
        .filter(|c| !matches!(c, '"' | '\r' | '\n'))
        .collect();
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"UpdateParameters\"\r\n\
         Content-Type: application/json\r\n\r\n{parameters}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"UpdateFile\"; filename=\"{name}\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(&bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let a = c
        .answer(
            Method::POST,
            push,
            Some(Body::Raw {
                content_type: &content_type,
                bytes: &body,
            }),
            &format!("the image's push (MultipartHttpPushUri) to {target}"),
        )
        .await?;
    Ok(started(a, true))
}

/// Where an update's task is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStatus {
    /// `TaskState`: `New`, `Starting`, `Running`, `Completed`,
    /// `Exception`, `Killed`, `Cancelled`… (`Completed` when the monitor
    /// answered with the operation's own result).
    pub state: String,
    pub percent: Option<u8>,
    /// What the BMC said of it (`Messages[].Message`).
    pub messages: Vec<String>,
}

impl TaskStatus {
    /// Still running.
    pub fn running(&self) -> bool {
        matches!(
            self.state.as_str(),
            "New" | "Starting" | "Running" | "Pending" | "Stopping" | "Suspended" | "Service"
        )
    }

    /// Ended well.
    pub fn succeeded(&self) -> bool {
        self.state == "Completed"
    }

    /// Its messages in one line.
    pub fn said(&self) -> String {
        self.messages.join("; ")
    }
}

/// Reads a task (its monitor or the task resource).
#[derive(Message)]
#[rtype(result = "Result<TaskStatus, BmcError>")]
pub struct GetTask {
    pub monitor: String,
}

sequence!(GetTask => TaskStatus, |c, msg| {
    let a = c
        .answer(Method::GET, &msg.monitor, None, &format!("the task {}", msg.monitor))
        .await?;
    let v = &a.json;
    let state = match text(&v["TaskState"]) {
        Some(s) => s,
        // A task monitor answers with the operation's own result once it
        // is done.
        None if a.status != 202 => "Completed".to_string(),
        None => "Running".to_string(),
    };
    Ok(TaskStatus {
        state,
        percent: v["PercentComplete"].as_u64().map(|p| p.min(100) as u8),
        messages: v["Messages"]
            .as_array()
            .map(|m| m.iter().filter_map(|m| text(&m["Message"])).collect())
            .unwrap_or_default(),
    })
});

/// Asks for BIOS attributes through the system's settings object, to take
/// effect at the next reset where the BMC offers that (its
/// `SupportedApplyTimes`). A refused attribute is an error with the BMC's
/// words (which name it). Ok: the apply time asked (None: the BMC's own).
#[derive(Message)]
#[rtype(result = "Result<Option<String>, BmcError>")]
pub struct SetBios {
    pub system: Option<String>,
    pub attributes: serde_json::Map<String, Value>,
}

sequence!(SetBios => Option<String>, |c, msg| {
    let info = c.get_system(&msg.system).await?;
    let Some(bios) = info.bios else {
        return Err(c.err(BmcErrorKind::Protocol(
            "the system has no Bios resource: its settings cannot be changed through the BMC".into(),
        )));
    };
    let b = c.call(Method::GET, &bios, None, &bios).await?;
    let settings = &b["@Redfish.Settings"];
    let target = text(&settings["SettingsObject"]["@odata.id"]).unwrap_or_else(|| bios.clone());
    let apply = on_reset(&settings["SupportedApplyTimes"]);
    let mut body = json!({ "Attributes": msg.attributes });
    if let Some(a) = &apply {
        body["@Redfish.SettingsApplyTime"] = json!({ "ApplyTime": a });
    }
    c.answer(Method::PATCH, &target, Some(Body::Json(&body)), &format!("the BIOS settings {target}"))
        .await?;
    Ok(apply)
});

/// `OnReset` when the listed apply times have it (None: the BMC lists
/// none, or not that one).
fn on_reset(supported: &Value) -> Option<String> {
    supported
        .as_array()?
        .iter()
        .any(|v| v == "OnReset")
        .then(|| "OnReset".to_string())
}

/// Makes a volume of `raid_type` of `drives` (their `Id`s) on the storage
/// `storage` (its `Id`), at the next reset where the BMC offers that.
/// Ok: the apply time asked (None: at once).
#[derive(Message)]
#[rtype(result = "Result<Option<String>, BmcError>")]
pub struct CreateVolume {
    pub system: Option<String>,
    pub storage: String,
    pub raid_type: String,
    pub drives: Vec<String>,
}

sequence!(CreateVolume => Option<String>, |c, msg| {
    let (storage, volumes, apply) = volumes_of(&mut c, &msg.system, &msg.storage).await?;
    let mut body = json!({
        "RAIDType": msg.raid_type,
        "Links": {"Drives": msg.drives.iter()
            .map(|d| json!({"@odata.id": format!("{storage}/Drives/{d}")}))
            .collect::<Vec<_>>()},
    });
    if let Some(a) = &apply {
        body["@Redfish.OperationApplyTime"] = json!(a);
    }
    c.answer(Method::POST, &volumes, Some(Body::Json(&body)), &format!("a {} volume on {}", msg.raid_type, msg.storage))
        .await?;
    Ok(apply)
});

/// Deletes the volume `volume` (its `Id`) of the storage `storage`, at the
/// next reset where the BMC offers that. Ok: the apply time asked.
#[derive(Message)]
#[rtype(result = "Result<Option<String>, BmcError>")]
pub struct DeleteVolume {
    pub system: Option<String>,
    pub storage: String,
    pub volume: String,
}

sequence!(DeleteVolume => Option<String>, |c, msg| {
    let (_, volumes, apply) = volumes_of(&mut c, &msg.system, &msg.storage).await?;
    let path = format!("{volumes}/{}", msg.volume);
    let body = match &apply {
        Some(a) => json!({"@Redfish.OperationApplyTime": a}),
        None => json!({}),
    };
    c.answer(Method::DELETE, &path, Some(Body::Json(&body)), &format!("the volume {path}"))
        .await?;
    Ok(apply)
});

/// The storage `id` of the system: its path, its `Volumes` collection and
/// the apply time to ask (`OnReset` where offered). An error when it
/// offers no volumes: RAID cannot be made through this BMC.
async fn volumes_of(
    c: &mut Conn,
    system: &Option<String>,
    id: &str,
) -> Result<(String, String, Option<String>), BmcError> {
    let info = c.get_system(system).await?;
    let Some(collection) = info.storage else {
        return Err(c.err(BmcErrorKind::Protocol(
            "the system has no Storage: volumes cannot be made through its BMC".into(),
        )));
    };
    let storage = format!("{collection}/{id}");
    let s = c.call(Method::GET, &storage, None, &storage).await?;
    let Some(volumes) = text(&s["Volumes"]["@odata.id"]) else {
        return Err(c.err(BmcErrorKind::Protocol(format!(
            "the storage {id} offers no Volumes: RAID cannot be made through this BMC"
        ))));
    };
    let v = c.call(Method::GET, &volumes, None, &volumes).await?;
    let apply = on_reset(&v["@Redfish.OperationApplyTimeSupport"]["SupportedValues"]);
    Ok((storage, volumes, apply))
}

/// Sets the system's `SecureBootEnable` (its `SecureBoot` resource; it
/// takes effect at the next reset). Ok: what was done (None: it was so).
#[derive(Message)]
#[rtype(result = "Result<Option<String>, BmcError>")]
pub struct SetSecureBoot {
    pub system: Option<String>,
    pub on: bool,
}

sequence!(SetSecureBoot => Option<String>, |c, msg| {
    let info = c.get_system(&msg.system).await?;
    c.set_secure_boot(&info, msg.on).await
});
