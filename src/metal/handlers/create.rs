//! `POST /projects/{id}/devices`: the input checked, the first-boot data
//! and installation made, a machine claimed.

use super::*;
use crate::admin::ApiError;

/// A new device's SSH key: `{"key": …, "label": …}`.
#[derive(Deserialize, Default)]
pub struct KeyInput {
    key: Option<String>,
    label: Option<String>,
}

/// A metro, as the Metal API takes it: a code, or (the SDK's) a list.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum MetroInput {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
pub struct CreateDevice {
    metro: Option<MetroInput>,
    facility: Option<Vec<String>>,
    plan: Option<String>,
    operating_system: Option<String>,
    hostname: Option<String>,
    description: Option<String>,
    userdata: Option<String>,
    customdata: Option<Value>,
    #[serde(default)]
    tags: Vec<String>,
    hardware_reservation_id: Option<String>,
    #[serde(default)]
    locked: bool,
    #[serde(default)]
    no_ssh_keys: bool,
    #[serde(default)]
    ssh_keys: Vec<KeyInput>,
    #[serde(default)]
    project_ssh_keys: Vec<Uuid>,
    #[serde(default)]
    user_ssh_keys: Vec<Uuid>,
    #[serde(default)]
    always_pxe: bool,
    ipxe_script_url: Option<String>,
    spot_instance: Option<bool>,
}

/// A host name: 1 to 253 of letters, digits, `-` and `.`, in labels of
/// at most 63.
pub(super) fn check_hostname(h: &str) -> Result<(), String> {
    // Never echoed whole when long: an error names what is wrong with it.
    if h.len() > 253 {
        return Err(format!(
            "hostname: {} characters is too long (at most 253)",
            h.chars().count()
        ));
    }
    if let Some(l) = h.split('.').find(|l| l.len() > 63) {
        return Err(format!(
            "hostname: a label of {} characters is too long (at most 63 between dots)",
            l.chars().count()
        ));
    }
    let ok = !h.is_empty()
        && h.split('.').all(|l| {
            !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "hostname: {h:?} is not a host name (letters, digits and '-', in labels of 1 to 63 separated by '.')"
        ))
    }
}

pub(super) fn check_tags(tags: &[String]) -> Result<(), String> {
    if tags.len() > 64 {
        return Err("tags: at most 64".into());
    }
    for t in tags {
        if t.is_empty() || t.len() > 255 || t.chars().any(char::is_control) {
            return Err(format!(
                "tags: {t:?} is not a tag (1 to 255 printable characters)"
            ));
        }
    }
    Ok(())
}

pub(super) fn check_description(d: &Option<String>) -> Result<(), String> {
    match d {
        Some(d) if d.len() > 1000 || d.contains('\0') => {
            Err("description: at most 1000 characters, no NUL".into())
        }
        _ => Ok(()),
    }
}

/// The first-boot data a device is installed with: NoCloud, its
/// user-data the tenant's, its meta-data the host name and public keys.
pub(super) fn first_boot(
    hostname: &str,
    userdata: &str,
    keys: &[String],
) -> crate::admin::installs::FirstBootBody {
    let meta = json!({
        "local-hostname": hostname,
        "hostname": hostname,
        "public-keys": keys,
    });
    let user = if userdata.trim().is_empty() {
        "#cloud-config\n{}\n".to_string()
    } else {
        userdata.to_string()
    };
    crate::admin::installs::FirstBootBody {
        nocloud: Some(
            [
                ("meta-data".to_string(), meta.to_string()),
                ("user-data".to_string(), user),
            ]
            .into_iter()
            .collect(),
        ),
        config_drive: None,
        disk: None,
    }
}

/// The installation of `os` with this first-boot data, as asked of the
/// machine's agent; the error is the answer (422, or 503 while the image
/// is hashed).
pub(super) async fn installation(
    admin: &Admin,
    image: &str,
    first: crate::admin::installs::FirstBootBody,
) -> Result<shepherd_proto::api::ImageInstallation, HttpResponse> {
    let body = crate::admin::installs::ImageBody {
        served: Some(image.to_string()),
        reboot: true,
        first_boot: Some(first),
        ..Default::default()
    };
    crate::admin::installs::image_request(admin, body)
        .await
        .map_err(|e| match ApiError::from(e) {
            // The Metal API's refusal of a field is a 422, as Equinix's.
            ApiError::Invalid(m) => unprocessable(&m),
            other => json::error(other.status(), &other.to_string()),
        })
}

/// `POST /projects/{id}/devices`: claims an available machine of the
/// plan in the metro (or the reservation's) and asks its installation.
pub async fn create_device(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    raw: web::Bytes,
) -> HttpResponse {
    let c = catalog(&req);
    let who = caller(&req);
    let project = attempt!(visible_project(&admin, &who, &pid).await);
    attempt!(who.may_write());
    let b: CreateDevice = attempt!(body(&req, &raw));
    let plan_slug = match b.plan.as_deref().map(str::trim) {
        Some(p) if !p.is_empty() => p.to_string(),
        _ => return unprocessable("plan: required"),
    };
    let Some(plan) = c.plan_by(&plan_slug).cloned() else {
        return unprocessable(&format!(
            "plan: {plan_slug:?} is not a plan of this shepherd"
        ));
    };
    let os_slug = match b.operating_system.as_deref().map(str::trim) {
        Some(o) if !o.is_empty() => o.to_string(),
        _ => return unprocessable("operating_system: required"),
    };
    let Some(os) = c.operating_system(&os_slug).cloned() else {
        return unprocessable(&format!(
            "operating_system: {os_slug:?} is not an operating system of this shepherd"
        ));
    };
    if b.always_pxe || b.ipxe_script_url.as_deref().is_some_and(|u| !u.is_empty()) {
        return unprocessable("always_pxe and ipxe_script_url: custom iPXE is not offered here");
    }
    if b.spot_instance == Some(true) {
        return unprocessable("spot_instance: spot instances are not offered here");
    }
    let metros = attempt!(metro_codes(&admin, &c).await);
    let wanted: Vec<String> = match (&b.metro, &b.facility) {
        (Some(MetroInput::One(m)), _) => vec![m.trim().to_string()],
        (Some(MetroInput::Many(ms)), _) => ms.iter().map(|m| m.trim().to_string()).collect(),
        (None, Some(f)) => f.iter().map(|m| m.trim().to_string()).collect(),
        (None, None) => return unprocessable("metro: required"),
    };
    let any = wanted.iter().any(|m| m == "any");
    let chosen: Vec<String> = if any {
        metros.clone()
    } else {
        wanted
            .iter()
            .filter_map(|w| {
                metros
                    .iter()
                    .find(|m| *m == w || stable_id("metro", m).to_string() == *w)
                    .cloned()
            })
            .collect()
    };
    if chosen.is_empty() {
        return unprocessable(&format!(
            "metro: {} is not a metro of this shepherd (its metros: {})",
            wanted.join(", "),
            metros.join(", ")
        ));
    }
    let hostname = match b.hostname.as_deref().map(str::trim) {
        Some(h) if !h.is_empty() => h.to_string(),
        _ => String::new(),
    };
    let device_id = Uuid::new_v4();
    let hostname = if hostname.is_empty() {
        format!(
            "{}-{}",
            plan.slug.split('.').next().unwrap_or("device"),
            json::short_id(device_id)
        )
    } else {
        hostname
    };
    if let Err(m) = check_hostname(&hostname)
        .and(check_tags(&b.tags))
        .and(check_description(&b.description))
    {
        return unprocessable(&m);
    }
    let customdata = match b.customdata {
        None => json!({}),
        Some(v @ Value::Object(_)) => v,
        Some(_) => return unprocessable("customdata: must be an object"),
    };
    if !b.user_ssh_keys.is_empty() {
        return unprocessable(
            "user_ssh_keys: users' keys are not kept here; use project_ssh_keys or ssh_keys",
        );
    }
    let reservation = match b.hardware_reservation_id.as_deref().map(str::trim) {
        None | Some("") | Some("next-available") => None,
        Some(r) => match r.parse::<Uuid>() {
            Ok(u) => Some(u),
            Err(_) => return not_found(),
        },
    };
    // The keys: those given, else every key of the project.
    let project_keys =
        attempt!(read(&admin, async |tx| tenants::keys(tx, Some(project.id)).await).await);
    let mut keys: Vec<String> = Vec::new();
    for (i, k) in b.ssh_keys.iter().enumerate() {
        let Some(line) = k.key.as_deref() else {
            return unprocessable(&format!("ssh_keys[{i}].key: required"));
        };
        match tenants::parse_public_key(line) {
            Ok((line, _)) => keys.push(line),
            Err(e) => return unprocessable(&format!("ssh_keys[{i}].key: {e}")),
        }
        let _ = &k.label;
    }
    for kid in &b.project_ssh_keys {
        match project_keys.iter().find(|k| k.id == *kid) {
            Some(k) => keys.push(k.key.clone()),
            None => {
                return unprocessable(&format!(
                    "project_ssh_keys: {kid} is not a key of this project"
                ));
            }
        }
    }
    if b.ssh_keys.is_empty() && b.project_ssh_keys.is_empty() && !b.no_ssh_keys {
        keys.extend(project_keys.iter().map(|k| k.key.clone()));
    }
    keys.dedup();
    let userdata = b.userdata.unwrap_or_default();
    let image =
        attempt!(installation(&admin, &os.image, first_boot(&hostname, &userdata, &keys)).await);
    let new = NewDevice {
        id: device_id,
        project_id: project.id,
        hostname,
        description: b.description,
        tags: b.tags,
        plan: plan.slug.clone(),
        metro: chosen[0].clone(),
        operating_system: os.slug.clone(),
        userdata,
        customdata,
        ssh_keys: keys,
        locked: b.locked,
        reservation,
        actor: who.actor(),
    };
    let cat = c.clone();
    let chosen_metros = chosen.clone();
    let plan_slug = plan.slug.clone();
    let by_reservation = reservation.is_some();
    let place = move |cand: &devices::Candidate| -> Result<devices::Placed, String> {
        let metro = cat.metro_of(cand.location.as_deref());
        let Some(of) = cat.plan_of_raw(cand.hardware_report.as_deref(), cand.bmc_secure_boot)
        else {
            return Err(format!("machine {} meets no plan", cand.machine_id));
        };
        // A reservation is its machine, of its plan, where it is.
        if by_reservation || (of.slug == plan_slug && chosen_metros.contains(&metro)) {
            Ok(devices::Placed {
                plan: of.slug.clone(),
                metro,
                secure_boot: of.secure_boot,
            })
        } else {
            Err(format!(
                "machine {} is a {} in {metro}",
                cand.machine_id, of.slug
            ))
        }
    };
    let claimed = attempt!(
        write(&admin, async |tx| devices::claim(tx, &new, &image, &place)
            .await)
        .await
    );
    match claimed {
        Claimed::Done(d) => {
            let d = *d;
            tracing::info!(device_id = %d.id, machine_id = %d.machine_id, project = %project.name, actor = %who.actor(), plan = %d.plan, "device created");
            json::answer(StatusCode::CREATED, json::device(&d, &c))
        }
        Claimed::NoCapacity(_) => unprocessable(&format!(
            "There aren't available servers in that metro: no {} server is available in {}",
            plan.slug,
            chosen.join(", ")
        )),
        Claimed::Limit(why) => {
            unprocessable(&format!("The project's device limit is reached: {why}"))
        }
        Claimed::NoReservation => not_found(),
        Claimed::ReservationBusy(why) => unprocessable(&format!(
            "The hardware reservation is not provisionable: {why}"
        )),
    }
}
