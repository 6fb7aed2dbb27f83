//! SSH keys: a project's, the caller's, a device's.

use super::*;

/// `GET /projects/{id}/ssh-keys`.
pub async fn project_keys(admin: web::Data<Admin>, req: HttpRequest, pid: Id) -> HttpResponse {
    let p = attempt!(visible_project(&admin, &caller(&req), &pid).await);
    let keys = attempt!(read(&admin, async |tx| tenants::keys(tx, Some(p.id)).await).await);
    ok(json!({ "ssh_keys": keys.iter().map(json::key).collect::<Vec<_>>() }))
}

#[derive(Deserialize)]
pub struct KeyBody {
    key: Option<String>,
    label: Option<String>,
}

fn check_label(label: &str) -> Result<(), HttpResponse> {
    if label.trim().is_empty() || label.len() > 255 || label.chars().any(char::is_control) {
        Err(unprocessable("label: 1 to 255 printable characters"))
    } else {
        Ok(())
    }
}

/// `POST /projects/{id}/ssh-keys` (201).
pub async fn create_project_key(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    raw: web::Bytes,
) -> HttpResponse {
    let who = caller(&req);
    let p = attempt!(visible_project(&admin, &who, &pid).await);
    attempt!(who.may_write());
    let b: KeyBody = attempt!(body(&req, &raw));
    let Some(line) = b.key.as_deref() else {
        return unprocessable("key: required");
    };
    let (line, fingerprint) = match tenants::parse_public_key(line) {
        Ok(v) => v,
        Err(e) => return unprocessable(&format!("key: {e}")),
    };
    let label = b.label.unwrap_or_else(|| fingerprint.clone());
    attempt!(check_label(&label));
    let added = attempt!(
        write(&admin, async |tx| tenants::add_key(
            tx,
            p.id,
            &label,
            &line,
            &fingerprint
        )
        .await)
        .await
    );
    match added {
        Ok(k) => json::answer(StatusCode::CREATED, json::key(&k)),
        Err(why) => unprocessable(&why),
    }
}

/// `GET /ssh-keys`: the keys of the caller's project.
pub async fn keys(admin: web::Data<Admin>, req: HttpRequest) -> HttpResponse {
    let c = caller(&req);
    let keys = attempt!(read(&admin, async |tx| tenants::keys(tx, c.project()).await).await);
    ok(json!({ "ssh_keys": keys.iter().map(json::key).collect::<Vec<_>>() }))
}

async fn visible_key(
    admin: &Admin,
    who: &Caller,
    raw: &str,
) -> Result<tenants::SshKey, HttpResponse> {
    let kid = id(raw)?;
    match read(admin, async |tx| tenants::key(tx, kid).await).await? {
        Some(k) if who.sees(k.project_id) => Ok(k),
        _ => Err(not_found()),
    }
}

/// `GET /ssh-keys/{id}`.
pub async fn key(admin: web::Data<Admin>, req: HttpRequest, kid: Id) -> HttpResponse {
    let k = attempt!(visible_key(&admin, &caller(&req), &kid).await);
    ok(json::key(&k))
}

/// `PUT /ssh-keys/{id}`.
pub async fn update_key(
    admin: web::Data<Admin>,
    req: HttpRequest,
    kid: Id,
    raw: web::Bytes,
) -> HttpResponse {
    let who = caller(&req);
    let k = attempt!(visible_key(&admin, &who, &kid).await);
    attempt!(who.may_write());
    let b: KeyBody = attempt!(body(&req, &raw));
    if let Some(l) = &b.label {
        attempt!(check_label(l));
    }
    let parsed = match b.key.as_deref().map(tenants::parse_public_key) {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(e)) => return unprocessable(&format!("key: {e}")),
    };
    let updated = attempt!(
        write(&admin, async |tx| {
            tenants::update_key(
                tx,
                k.id,
                b.label.as_deref(),
                parsed.as_ref().map(|(l, f)| (l.as_str(), f.as_str())),
            )
            .await
        })
        .await
    );
    match updated {
        Some(k) => ok(json::key(&k)),
        None => not_found(),
    }
}

/// `DELETE /ssh-keys/{id}` (204).
pub async fn delete_key(admin: web::Data<Admin>, req: HttpRequest, kid: Id) -> HttpResponse {
    let who = caller(&req);
    let k = attempt!(visible_key(&admin, &who, &kid).await);
    attempt!(who.may_write());
    match attempt!(write(&admin, async |tx| tenants::delete_key(tx, k.id).await).await) {
        true => HttpResponse::NoContent().finish(),
        false => not_found(),
    }
}

/// `GET /devices/{id}/ssh-keys`: the project's keys the device was
/// installed with.
pub async fn device_keys(admin: web::Data<Admin>, req: HttpRequest, did: Id) -> HttpResponse {
    let d = attempt!(visible_device(&admin, &caller(&req), &did).await);
    let keys = attempt!(
        read(&admin, async |tx| tenants::keys(tx, Some(d.project_id))
            .await)
        .await
    );
    ok(json!({
        "ssh_keys": keys.iter()
            .filter(|k| d.ssh_keys.iter().any(|l| l.trim() == k.key.trim()))
            .map(json::key)
            .collect::<Vec<_>>(),
    }))
}
