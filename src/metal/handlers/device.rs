//! Devices: a project's list, one device, its update, delete and actions.

use super::*;

#[derive(Deserialize)]
pub struct DevicesQuery {
    hostname: Option<String>,
    tag: Option<String>,
    search: Option<String>,
    metro: Option<String>,
    state: Option<String>,
    #[serde(flatten)]
    paging: Paging,
}

/// `GET /projects/{id}/devices`.
pub async fn project_devices(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    q: web::Query<DevicesQuery>,
) -> HttpResponse {
    let c = catalog(&req);
    let p = attempt!(visible_project(&admin, &caller(&req), &pid).await);
    let (offset, limit, page) = attempt!(q.paging.window());
    let (all, _) = attempt!(
        read(&admin, async |tx| devices::list(
            tx,
            Some(p.id),
            0,
            i64::MAX
        )
        .await)
        .await
    );
    let matching: Vec<_> = all
        .into_iter()
        .filter(|d| q.hostname.as_deref().is_none_or(|h| d.hostname.contains(h)))
        .filter(|d| {
            q.tag
                .as_deref()
                .is_none_or(|t| d.tags.iter().any(|x| x == t))
        })
        .filter(|d| q.metro.as_deref().is_none_or(|m| d.metro == m))
        .filter(|d| q.state.as_deref().is_none_or(|s| d.state() == s))
        .filter(|d| {
            q.search.as_deref().is_none_or(|s| {
                d.hostname.contains(s)
                    || d.id.to_string().starts_with(s)
                    || d.description.as_deref().is_some_and(|x| x.contains(s))
                    || d.tags.iter().any(|t| t.contains(s))
            })
        })
        .collect();
    let (items, total) = page_of(matching, offset, limit);
    ok(json!({
        "devices": items.iter().map(|d| json::device(d, &c)).collect::<Vec<_>>(),
        "meta": json::meta(&format!("/projects/{}/devices", p.id), page, limit, total),
    }))
}

/// `GET /devices/{id}`.
pub async fn device(admin: web::Data<Admin>, req: HttpRequest, did: Id) -> HttpResponse {
    let c = catalog(&req);
    let d = attempt!(visible_device(&admin, &caller(&req), &did).await);
    ok(json::device(&d, &c))
}

#[derive(Deserialize)]
pub struct UpdateDevice {
    hostname: Option<String>,
    description: Option<String>,
    tags: Option<Vec<String>>,
    locked: Option<bool>,
    userdata: Option<String>,
    customdata: Option<Value>,
    always_pxe: Option<bool>,
    ipxe_script_url: Option<String>,
}

/// `PUT /devices/{id}`: host name, description, tags, locked (and the
/// userdata and customdata kept for the next reinstall).
pub async fn update_device(
    admin: web::Data<Admin>,
    req: HttpRequest,
    did: Id,
    raw: web::Bytes,
) -> HttpResponse {
    let c = catalog(&req);
    let who = caller(&req);
    let d = attempt!(writable_device(&admin, &who, &did).await);
    let b: UpdateDevice = attempt!(body(&req, &raw));
    if b.always_pxe == Some(true) || b.ipxe_script_url.as_deref().is_some_and(|u| !u.is_empty()) {
        return unprocessable("always_pxe and ipxe_script_url: custom iPXE is not offered here");
    }
    let hostname = b.hostname.map(|h| h.trim().to_string());
    if let Some(h) = &hostname
        && let Err(m) = check_hostname(h)
    {
        return unprocessable(&m);
    }
    if let Err(m) =
        check_tags(b.tags.as_deref().unwrap_or(&[])).and(check_description(&b.description))
    {
        return unprocessable(&m);
    }
    let customdata = match b.customdata {
        None => None,
        Some(v @ Value::Object(_)) => Some(v),
        Some(_) => return unprocessable("customdata: must be an object"),
    };
    let u = DeviceUpdate {
        hostname,
        description: b.description,
        tags: b.tags,
        locked: b.locked,
        userdata: b.userdata,
        customdata,
    };
    let updated = attempt!(write(&admin, async |tx| devices::update(tx, d.id, &u).await).await);
    match updated {
        Some(d) => ok(json::device(&d, &c)),
        None => not_found(),
    }
}

#[derive(Deserialize)]
pub struct DeleteQuery {
    force_delete: Option<bool>,
}

/// `DELETE /devices/{id}`: 204; the machine is erased, then available.
pub async fn delete_device(
    admin: web::Data<Admin>,
    req: HttpRequest,
    did: Id,
    q: web::Query<DeleteQuery>,
) -> HttpResponse {
    let who = caller(&req);
    let d = attempt!(writable_device(&admin, &who, &did).await);
    let force = q.force_delete.unwrap_or(false) && matches!(who, Caller::Operator(_));
    let actor = who.actor();
    let mode = catalog(&req).erase_mode.clone();
    let done = attempt!(
        write(&admin, async |tx| devices::delete(
            tx, d.id, &actor, force, &mode
        )
        .await)
        .await
    );
    acted(done, StatusCode::NO_CONTENT, || {
        tracing::info!(device_id = %d.id, machine_id = %d.machine_id, actor = %actor, "device deleted: its machine is erased");
    })
}

fn acted(a: Acted, status: StatusCode, log: impl FnOnce()) -> HttpResponse {
    match a {
        Acted::Done => {
            log();
            HttpResponse::build(status).finish()
        }
        Acted::Refused(why) => unprocessable(&why),
        Acted::NotFound => not_found(),
    }
}

#[derive(Deserialize)]
pub struct ActionInput {
    #[serde(rename = "type")]
    kind: Option<String>,
    operating_system: Option<String>,
}

/// `POST /devices/{id}/actions`: `power_on`, `power_off`, `reboot`,
/// `reinstall` (202).
pub async fn device_action(
    admin: web::Data<Admin>,
    req: HttpRequest,
    did: Id,
    raw: web::Bytes,
) -> HttpResponse {
    let c = catalog(&req);
    let who = caller(&req);
    let d = attempt!(writable_device(&admin, &who, &did).await);
    let b: ActionInput = attempt!(body(&req, &raw));
    let actor = who.actor();
    let kind = b.kind.unwrap_or_default();
    let done = match kind.as_str() {
        "power_on" | "power_off" | "reboot" => {
            let power = match kind.as_str() {
                "power_on" => "on",
                "power_off" => "off",
                _ => "reboot",
            };
            attempt!(
                write(&admin, async |tx| devices::power(tx, d.id, power, &actor)
                    .await)
                .await
            )
        }
        "reinstall" => {
            let slug = b
                .operating_system
                .unwrap_or_else(|| d.operating_system.clone());
            let Some(os) = c.operating_system(&slug).cloned() else {
                return unprocessable(&format!(
                    "operating_system: {slug:?} is not an operating system of this shepherd"
                ));
            };
            let image = attempt!(
                installation(
                    &admin,
                    &os.image,
                    first_boot(&d.hostname, &d.userdata, &d.ssh_keys)
                )
                .await
            );
            attempt!(
                write(&admin, async |tx| devices::reinstall(
                    tx, d.id, &image, &os.slug, &actor
                )
                .await)
                .await
            )
        }
        "rescue" => return unprocessable("type: rescue is not offered here"),
        "" => return unprocessable("type: required"),
        other => {
            return unprocessable(&format!(
                "type: {other:?} is not one of power_on, power_off, reboot, reinstall"
            ));
        }
    };
    acted(done, StatusCode::ACCEPTED, || {
        tracing::info!(device_id = %d.id, machine_id = %d.machine_id, action = %kind, actor = %actor, "device action");
    })
}
