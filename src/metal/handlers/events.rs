//! Events: a device's, a project's, the caller's, one.

use super::*;

async fn event_list(admin: &Admin, which: Events, paging: &Paging, path: &str) -> HttpResponse {
    let (offset, limit, page) = attempt!(paging.window());
    let (list, total) = attempt!(
        read(admin, async |tx| devices::events(tx, which, offset, limit)
            .await)
        .await
    );
    ok(json!({
        "events": list.iter().map(json::event).collect::<Vec<_>>(),
        "meta": json::meta(path, page, limit, total),
    }))
}

/// `GET /devices/{id}/events`.
pub async fn device_events(
    admin: web::Data<Admin>,
    req: HttpRequest,
    did: Id,
    q: web::Query<Paging>,
) -> HttpResponse {
    let d = attempt!(visible_device(&admin, &caller(&req), &did).await);
    event_list(
        &admin,
        Events::Device(d.id),
        &q,
        &format!("/devices/{}/events", d.id),
    )
    .await
}

/// `GET /projects/{id}/events`.
pub async fn project_events(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    q: web::Query<Paging>,
) -> HttpResponse {
    let p = attempt!(visible_project(&admin, &caller(&req), &pid).await);
    event_list(
        &admin,
        Events::Project(p.id),
        &q,
        &format!("/projects/{}/events", p.id),
    )
    .await
}

/// `GET /events`: the caller's project's (every project's, for an
/// operator).
pub async fn events(
    admin: web::Data<Admin>,
    req: HttpRequest,
    q: web::Query<Paging>,
) -> HttpResponse {
    let c = caller(&req);
    event_list(&admin, Events::All(c.project()), &q, "/events").await
}

/// `GET /events/{id}`.
pub async fn event(admin: web::Data<Admin>, req: HttpRequest, eid: Id) -> HttpResponse {
    let c = caller(&req);
    let eid = attempt!(id(&eid));
    let (list, _) = attempt!(
        read(&admin, async |tx| devices::events(
            tx,
            Events::One(eid),
            0,
            1
        )
        .await)
        .await
    );
    match list.first() {
        Some(e) if c.sees(e.project_id) => ok(json::event(e)),
        _ => not_found(),
    }
}
