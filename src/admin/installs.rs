//! Installations in the API: asking one machine to install an image or to
//! be deprovisioned (rollouts over many: `rollouts.rs`). The pages and the
//! CLI go through the same functions.
//!
//! Long on purpose: each route's OpenAPI annotation stands beside it.

use actix_web::http::StatusCode;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use serde::Deserialize;
use shepherd_proto::api::{DiskHints, ImageInstallation};
use uuid::Uuid;

use super::request::ApiError;
use super::request::{check_reason, error_response, internal, json_body, json_post, no_nul};
use super::state::{Admin, Operator};
use crate::bmdb::installations::{self, Asked, Asker};

/// Which disk, as the API takes it: exactly one disk must match every
/// hint given.
#[derive(Deserialize, Default, Debug, Clone, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DiskBody {
    pub serial: Option<String>,
    pub wwn: Option<String>,
    pub model: Option<String>,
    pub by_path: Option<String>,
    #[schema(minimum = 0)]
    pub min_size_bytes: Option<i64>,
    #[schema(minimum = 0)]
    pub max_size_bytes: Option<i64>,
    pub rotational: Option<bool>,
}

/// The image, as the API takes it: a URL and its digest, or the name of an
/// image this shepherd serves (`served`; URL, digest and size are then
/// shepherd's).
#[derive(Deserialize, Default, Debug, Clone, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageBody {
    /// An http:// or https:// URL (give `url` and `digest`, or `served`).
    pub url: Option<String>,
    /// The name of an image this shepherd serves (`GET /api/v1/images`).
    pub served: Option<String>,
    /// `sha256:<hex>` or `sha512:<hex>`.
    pub digest: Option<String>,
    #[schema(minimum = 0)]
    pub size_bytes: Option<i64>,
    pub disk: Option<DiskBody>,
    #[serde(default)]
    pub allow_boot_disk: bool,
    /// Reboot into the installed system once the report is in.
    #[serde(default)]
    pub reboot: bool,
    /// Make the installed disk the first EFI boot entry.
    #[serde(default)]
    pub set_efi_boot_entry: bool,
    /// How long the agent may take, as `90m`, `2h` (default 2 h).
    pub deadline: Option<String>,
    /// Data for the installed system's first boot (cloud-init).
    pub first_boot: Option<FirstBootBody>,
}

/// First-boot data: a NoCloud seed (`cidata`) or a config drive
/// (`config-2`), written by the agent after the image.
#[derive(Deserialize, Default, Debug, Clone, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FirstBootBody {
    /// The NoCloud seed's files: `user-data`, `meta-data`,
    /// `network-config` (and any other, by name).
    pub nocloud: Option<std::collections::BTreeMap<String, String>>,
    /// The config drive's files by path (`openstack/latest/meta_data.json`,
    /// `openstack/latest/user_data`…).
    pub config_drive: Option<std::collections::BTreeMap<String, String>>,
    /// Put the volume on the one other disk these hints choose (default: a
    /// new partition on the installed disk).
    pub disk: Option<DiskBody>,
}

/// The first-boot payload a [`FirstBootBody`] becomes, or a 400's message.
pub fn first_boot_request(
    b: FirstBootBody,
) -> Result<shepherd_proto::api::image_installation::FirstBoot, String> {
    use shepherd_proto::api::FirstBootFiles;
    use shepherd_proto::api::image_installation::FirstBoot;
    let (files, make): (_, fn(FirstBootFiles) -> FirstBoot) = match (b.nocloud, b.config_drive) {
        (Some(_), Some(_)) => {
            return Err("image.first_boot: give nocloud or config_drive, not both".into());
        }
        (None, None) => return Err("image.first_boot: nocloud or config_drive is required".into()),
        (Some(f), None) => (f, FirstBoot::Nocloud),
        (None, Some(f)) => (f, FirstBoot::ConfigDrive),
    };
    Ok(make(FirstBootFiles {
        files: files
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect(),
        disk: b.disk.map(disk_hints),
    }))
}

fn disk_hints(h: DiskBody) -> DiskHints {
    DiskHints {
        serial: h.serial.unwrap_or_default(),
        wwn: h.wwn.unwrap_or_default(),
        model: h.model.unwrap_or_default(),
        by_path: h.by_path.unwrap_or_default(),
        min_size_bytes: h.min_size_bytes,
        max_size_bytes: h.max_size_bytes,
        rotational: h.rotational,
    }
}

/// Why an [`ImageBody`] is not taken.
#[derive(Debug)]
pub enum ImageError {
    /// A field is wrong: a 400's message naming it.
    Field(String),
    /// The served image is new or changed and still being hashed: a 503.
    Hashing(crate::images::Hashing),
}

impl From<String> for ImageError {
    fn from(m: String) -> Self {
        ImageError::Field(m)
    }
}

impl From<&str> for ImageError {
    fn from(m: &str) -> Self {
        ImageError::Field(m.to_string())
    }
}

impl From<ImageError> for ApiError {
    fn from(e: ImageError) -> ApiError {
        match e {
            ImageError::Field(m) => ApiError::Invalid(m),
            ImageError::Hashing(h) => ApiError::Unavailable(format!("image.served: {h}")),
        }
    }
}

/// What an [`ImageBody`] becomes, or why not.
pub async fn image_request(admin: &Admin, b: ImageBody) -> Result<ImageInstallation, ImageError> {
    for (field, v) in [
        ("image.url", &b.url),
        ("image.served", &b.served),
        ("image.digest", &b.digest),
        ("image.deadline", &b.deadline),
    ] {
        no_nul(field, v.as_deref())?;
    }
    let mut image = ImageInstallation {
        size_bytes: b.size_bytes,
        allow_boot_disk: b.allow_boot_disk,
        reboot: b.reboot,
        set_efi_boot_entry: b.set_efi_boot_entry,
        ..Default::default()
    };
    match (
        b.url.filter(|u| !u.trim().is_empty()),
        b.served.filter(|s| !s.trim().is_empty()),
    ) {
        (Some(_), Some(_)) => return Err("image: give url or served, not both".into()),
        (None, None) => return Err("image: url (with digest) or served is required".into()),
        (Some(url), None) => {
            image.url = url.trim().to_string();
            image.digest = b.digest.unwrap_or_default().trim().to_string();
        }
        (None, Some(name)) => {
            let Some(catalog) = admin.images.clone() else {
                return Err(
                    "image.served: this shepherd serves no images (installations.images_dir)"
                        .into(),
                );
            };
            let name = name.trim().to_string();
            // A new image's hash is waited for a quarter of the bound the
            // whole answer has (admin.database_timeout), then computed on.
            let wait = admin.database_timeout / 4;
            let served = web::block(move || catalog.resolve_soon(&name, wait))
                .await
                .map_err(|e| format!("image.served: {e}"))?
                .map_err(|e| format!("image.served: {e}"))?
                .map_err(ImageError::Hashing)?;
            if let Some(d) = b.digest.as_deref().filter(|d| !d.trim().is_empty())
                && !d.trim().eq_ignore_ascii_case(&served.digest)
            {
                return Err(format!(
                    "image.digest: {d} is not the served image's ({})",
                    served.digest
                )
                .into());
            }
            served.apply_to(&mut image);
        }
    }
    if let Some(d) = b.deadline.as_deref().filter(|d| !d.trim().is_empty()) {
        let d = humantime::parse_duration(d.trim())
            .ok()
            .filter(|d| !d.is_zero() && d.as_secs() <= 7 * 86400)
            .ok_or_else(|| format!("image.deadline: {d:?} is not a duration from 1s to 7d"))?;
        image.deadline_seconds = d.as_secs() as i64;
    }
    if let Some(h) = b.disk {
        image.disk = Some(disk_hints(h));
    }
    if let Some(f) = b.first_boot {
        image.first_boot = Some(first_boot_request(f)?);
    }
    installations::check_image(&image)?;
    Ok(image)
}

/// An installation on one machine.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InstallBody {
    #[schema(value_type = ImageBody, required = true)]
    pub image: Option<ImageBody>,
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
    pub request_id: Option<Uuid>,
}

/// Asks `machine` to install; the generation and audit, or the error.
pub async fn install(
    admin: &Admin,
    operator: &Operator,
    machine: &str,
    body: InstallBody,
) -> Result<(i32, crate::bmdb::actions::Audit), ApiError> {
    let bad = ApiError::Invalid;
    let machine_id: Uuid = machine
        .parse()
        .map_err(|_| bad("the path's machine ID is not a UUID".into()))?;
    let image = image_request(
        admin,
        body.image.ok_or_else(|| bad("image: required".into()))?,
    )
    .await?;
    ask_one(
        admin,
        operator,
        machine_id,
        body.reason,
        body.request_id,
        installations::Work::Install(&image),
    )
    .await
}

/// Asks one machine for `work` on an operator's behalf: the generation and
/// audit, or the status and why.
async fn ask_one(
    admin: &Admin,
    operator: &Operator,
    machine_id: Uuid,
    reason: Option<String>,
    request_id: Option<Uuid>,
    work: installations::Work<'_>,
) -> Result<(i32, crate::bmdb::actions::Audit), ApiError> {
    let reason = check_reason(reason).map_err(ApiError::Invalid)?;
    let asker = Asker {
        actor: &operator.0,
        action_id: request_id.unwrap_or_else(Uuid::new_v4),
        rollout_id: None,
        reason: reason.as_deref(),
    };
    match admin
        .bmdb
        .transact(async |tx| installations::ask_for(tx, machine_id, work, &asker).await)
        .await
    {
        Ok(Asked::Done { generation, audit }) => {
            tracing::info!(%machine_id, generation, action = %audit.action, detail = %audit.detail, actor = %operator.0, "asked");
            Ok((generation, audit))
        }
        Ok(Asked::Refused(why)) => Err(ApiError::Refused(why)),
        Ok(Asked::NotFound) => Err(ApiError::NotFound(format!(
            "machine {machine_id} is not in the BMDB"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// An API POST, checked: JSON from this site, its body parsed (empty: the
/// defaults), and who sends it.
pub(super) fn api_post<T: serde::de::DeserializeOwned + Default>(
    req: &HttpRequest,
    body: &[u8],
) -> Result<(T, Operator), HttpResponse> {
    json_post(req, body)?;
    let parsed = json_body(body)?;
    let operator =
        req.extensions().get::<Operator>().cloned().ok_or_else(|| {
            error_response(StatusCode::UNAUTHORIZED, "a bearer token is required")
        })?;
    Ok((parsed, operator))
}

/// `POST /api/v1/machines/{id}/install`.
#[utoipa::path(post, path = "/api/v1/machines/{id}/install", tag = "installations",
    params(("id" = Uuid, Path, description = "the machine's ID")),
    request_body(content = InstallBody, content_type = "application/json"),
    responses(
        (status = 200, description = "asked: the generation and the audit row", body = super::api::InstallAsked),
        (status = 409, description = "the previous installation is unanswered, the machine is held, or its BMC and its agent's report disagree (not accepted)", body = super::api::ErrorBody),
        (status = 503, description = "the BMDB failed or did not answer within admin.database_timeout, or the served image is new and still being hashed (ask again)", body = super::api::ErrorBody)))]
pub async fn api_install(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let (parsed, op) = attempt!(api_post::<InstallBody>(&req, &body));
    answer_asked(install(&admin, &op, &id, parsed).await)
}

/// An asking route's answer: the generation asked and the audit row, or
/// the error with its status.
fn answer_asked(asked: Result<(i32, crate::bmdb::actions::Audit), ApiError>) -> HttpResponse {
    match asked {
        Ok((generation, a)) => HttpResponse::Ok().json(super::api::InstallAsked {
            generation,
            action: (&a).into(),
        }),
        Err(e) => e.answer(),
    }
}

/// A deprovisioning: erase the machine's disks and leave it available.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeprovisionBody {
    /// `metadata` (the default), `discard`, `secure` or `overwrite`.
    #[schema(value_type = Option<EraseModeName>)]
    pub mode: Option<String>,
    /// Only the disks matching every hint given (default: every disk).
    pub disk: Option<DiskBody>,
    /// The disk the running system boots from may be erased.
    #[serde(default)]
    pub allow_boot_disk: bool,
    /// How long the agent may take, as `90m`, `2h` (default 2 h).
    pub deadline: Option<String>,
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
    pub request_id: Option<Uuid>,
}

/// How disks are erased (a rollout's `deprovision`).
#[derive(Deserialize, Default, Clone, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErasureBody {
    /// `metadata` (the default), `discard`, `secure` or `overwrite`.
    #[schema(value_type = Option<EraseModeName>)]
    pub mode: Option<String>,
    /// Only the disks matching every hint given (default: every disk).
    pub disk: Option<DiskBody>,
    /// The disk the running system boots from may be erased.
    #[serde(default)]
    pub allow_boot_disk: bool,
    /// How long each agent may take, as `90m`, `2h` (default 2 h).
    pub deadline: Option<String>,
}

impl DeprovisionBody {
    fn erasure(&self) -> ErasureBody {
        ErasureBody {
            mode: self.mode.clone(),
            disk: self.disk.clone(),
            allow_boot_disk: self.allow_boot_disk,
            deadline: self.deadline.clone(),
        }
    }
}

/// The erase modes, as the API names them: the protocol's list
/// (`shepherd_proto::names::ERASE_MODES`), not a copy of it.
pub struct EraseModeName;

impl utoipa::PartialSchema for EraseModeName {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .enum_values(Some(
                shepherd_proto::names::ERASE_MODES.map(|(name, _)| name),
            ))
            .into()
    }
}

impl utoipa::ToSchema for EraseModeName {
    fn name() -> std::borrow::Cow<'static, str> {
        "EraseModeName".into()
    }
}

/// The erasure a [`DeprovisionBody`] asks for, or a 400's message.
pub fn erasure_request(b: &ErasureBody) -> Result<shepherd_proto::api::DiskErasure, String> {
    use shepherd_proto::names::{MAX_DEADLINE_SECONDS, check_erasure, parse_erase_mode};
    let mode =
        parse_erase_mode(b.mode.as_deref().unwrap_or("")).map_err(|e| format!("mode: {e}"))?;
    let mut e = shepherd_proto::api::DiskErasure {
        mode: mode as i32,
        disk: b.disk.clone().map(disk_hints),
        allow_boot_disk: b.allow_boot_disk,
        deadline_seconds: 0,
    };
    if let Some(d) = b.deadline.as_deref().filter(|d| !d.trim().is_empty()) {
        let d = humantime::parse_duration(d.trim())
            .ok()
            .filter(|d| !d.is_zero() && d.as_secs() as i64 <= MAX_DEADLINE_SECONDS)
            .ok_or_else(|| format!("deadline: {d:?} is not a duration from 1s to 7d"))?;
        e.deadline_seconds = d.as_secs() as i64;
    }
    check_erasure(&e)?;
    Ok(e)
}

/// Asks `machine` to be deprovisioned; the generation and audit, or the
/// error.
pub async fn deprovision(
    admin: &Admin,
    operator: &Operator,
    machine: &str,
    body: DeprovisionBody,
) -> Result<(i32, crate::bmdb::actions::Audit), ApiError> {
    let bad = ApiError::Invalid;
    let machine_id: Uuid = machine
        .parse()
        .map_err(|_| bad("the path's machine ID is not a UUID".into()))?;
    let erasure = erasure_request(&body.erasure()).map_err(bad)?;
    ask_one(
        admin,
        operator,
        machine_id,
        body.reason,
        body.request_id,
        installations::Work::Erase(&erasure),
    )
    .await
}

/// `POST /api/v1/machines/{id}/deprovision`.
#[utoipa::path(post, path = "/api/v1/machines/{id}/deprovision", tag = "installations",
    params(("id" = Uuid, Path, description = "the machine's ID")),
    request_body(content = Option<DeprovisionBody>, content_type = "application/json",
        description = "optional: without a body, every disk but the boot disk has its metadata erased"),
    responses(
        (status = 200, description = "asked: the generation and the audit row", body = super::api::InstallAsked),
        (status = 409, description = "not allowed in the machine's state (named), held, or its previous request is unanswered", body = super::api::ErrorBody)))]
pub async fn api_deprovision(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let (parsed, op) = attempt!(api_post::<DeprovisionBody>(&req, &body));
    answer_asked(deprovision(&admin, &op, &id, parsed).await)
}

/// `GET /api/v1/images`: what this shepherd serves.
#[utoipa::path(get, path = "/api/v1/images", tag = "installations",
    responses(
        (status = 200, description = "the images this shepherd serves", body = super::api::ImageList),
        (status = 404, description = "this shepherd serves no images", body = super::api::ErrorBody),
        (status = 500, description = "the image directory cannot be read", body = super::api::ErrorBody)))]
pub async fn api_images(admin: web::Data<Admin>) -> HttpResponse {
    let Some(c) = admin.images.clone() else {
        return error_response(
            StatusCode::NOT_FOUND,
            "this shepherd serves no images (installations.images_dir)",
        );
    };
    match web::block(move || c.list()).await {
        Ok(Ok(v)) => HttpResponse::Ok().json(super::api::ImageList {
            images: v
                .into_iter()
                .map(|(name, size_bytes)| super::api::Image { name, size_bytes })
                .collect(),
        }),
        Ok(Err(e)) => internal(format!("reading the image directory: {e}")),
        Err(e) => internal(e),
    }
}
