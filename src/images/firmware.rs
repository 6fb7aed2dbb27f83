//! Firmware images fetched by BMCs (`/firmware/{grant}/{name}`): a BMC
//! updating through `SimpleUpdate` fetches its image itself, with the
//! user name and password of a grant made for that one update
//! (`bmdb::firmware_grants`): the grant's ID and its secret, over HTTP
//! basic authentication. Anything else is refused before the file is
//! looked at.

use std::path::PathBuf;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};

use super::gate::{DownloadGate, basic_auth, refuse, serve_file};

pub(super) async fn fetch(
    dir: web::Data<PathBuf>,
    gate: web::Data<DownloadGate>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> HttpResponse {
    let (grant, name) = path.into_inner();
    let credentials = basic_auth(&req)
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|c| {
            let (user, secret) = c.split_once(':')?;
            Some((user.parse::<uuid::Uuid>().ok()?, secret.to_string()))
        })
        .filter(|(user, _)| user.to_string() == grant);
    let Some((grant_id, secret)) = credentials else {
        return HttpResponse::Unauthorized()
            .insert_header(("WWW-Authenticate", "Basic realm=\"shepherd firmware\""))
            .content_type("text/plain; charset=utf-8")
            .body("a firmware image is served with its grant's user name and password\n");
    };
    let checked = gate
        .ask(
            &req,
            &name,
            "whether this grant lets it be fetched",
            async |tx| crate::bmdb::firmware_grants::check(tx, grant_id, &secret, &name).await,
        )
        .await;
    match checked {
        Err(unavailable) => unavailable,
        Ok(None) => refuse(
            &req,
            &name,
            StatusCode::FORBIDDEN,
            "no such grant for this image (unknown, expired, or a wrong secret)",
        ),
        Ok(Some(machine_id)) => {
            tracing::info!(image = %name, machine = %machine_id, grant = %grant_id, "firmware image fetched by a BMC");
            serve_file(dir.get_ref(), &name, &req, machine_id).await
        }
    }
}
