//! Hardware reservations: a project's machines, each of its plan.

use super::*;

#[derive(Deserialize)]
pub struct ReservationsQuery {
    provisionable: Option<String>,
    #[serde(flatten)]
    paging: Paging,
}

/// `GET /projects/{id}/hardware-reservations`: the machines assigned to
/// the project.
pub async fn project_reservations(
    admin: web::Data<Admin>,
    req: HttpRequest,
    pid: Id,
    q: web::Query<ReservationsQuery>,
) -> HttpResponse {
    let c = catalog(&req);
    let p = attempt!(visible_project(&admin, &caller(&req), &pid).await);
    let (offset, limit, page) = attempt!(q.paging.window());
    let all = attempt!(
        read(&admin, async |tx| devices::reservations(
            tx,
            Some(p.id),
            None
        )
        .await)
        .await
    );
    let only = q.provisionable.as_deref() == Some("only");
    let shown: Vec<Value> = all
        .iter()
        .map(|r| json::reservation(r, &c))
        .filter(|v| !only || v["provisionable"] == json!(true))
        .collect();
    let (items, total) = page_of(shown, offset, limit);
    ok(json!({
        "hardware_reservations": items,
        "meta": json::meta(&format!("/projects/{}/hardware-reservations", p.id), page, limit, total),
    }))
}

/// `GET /hardware-reservations/{id}`.
pub async fn reservation(admin: web::Data<Admin>, req: HttpRequest, rid: Id) -> HttpResponse {
    let c = catalog(&req);
    let who = caller(&req);
    let rid = attempt!(id(&rid));
    let found = attempt!(
        read(&admin, async |tx| devices::reservations(
            tx,
            None,
            Some(rid)
        )
        .await)
        .await
    );
    match found.first() {
        Some(r) if who.sees(r.project_id) => ok(json::reservation(r, &c)),
        _ => not_found(),
    }
}
