//! `POST /swarms/<name>`: an agent with a pending installation of image
//! `name` joins the image's swarm (or leaves it), naming the port its
//! chunk server listens on; the answer says whom it asks for chunks before
//! the image server and whom it serves (`bmdb::installations::swarm`).
//! The grant is the image's own: a machine outside the fleet, or one not
//! asked to install the image, is no member and learns of none. A member
//! whose installation was answered meanwhile stays one while it serves
//! (it joins again to say so), and may leave; it cannot join anew.

use actix_web::{HttpRequest, HttpResponse, web};
use prost::Message as _;
use shepherd_proto::api::{SwarmJoin, SwarmPeer, SwarmView};

use super::gate::{DownloadGate, grant, refusal};
use crate::bmdb::installations::{DownloadGrant, swarm};

/// A join's body is a few bytes.
const MAX_JOIN: usize = 1024;

/// A join waits this long for the BMDB at least (a download waits
/// `admin.database_timeout`): a member that cannot join fetches its
/// chunks from the image server, so a join is worth more waiting than a
/// download asked again. A thousand machines installing one image join
/// a hundred times a second, each reading the whole membership.
const JOIN_BOUND: std::time::Duration = std::time::Duration::from_secs(5);

pub(super) async fn join(
    gate: web::Data<DownloadGate>,
    req: HttpRequest,
    name: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let gate = DownloadGate {
        bmdb: gate.bmdb.clone(),
        timeout: gate.timeout.max(JOIN_BOUND),
    };
    let grant = match grant(&gate, &req, &name).await {
        Ok(g) => g,
        Err(refused) => return refused,
    };
    let (machine_id, asked) = match grant {
        DownloadGrant::Allowed { machine_id, .. } => (machine_id, true),
        DownloadGrant::NotAsked { machine_id } => (machine_id, false),
        DownloadGrant::UnknownAgent => return refusal(&req, &name, &grant),
    };
    let bad = |why: String| {
        HttpResponse::BadRequest()
            .content_type("text/plain; charset=utf-8")
            .body(format!("{why}\n"))
    };
    if body.len() > MAX_JOIN {
        return bad(format!("a SwarmJoin is at most {MAX_JOIN} bytes"));
    }
    let join = match SwarmJoin::decode(body.as_ref()) {
        Ok(j) => j,
        Err(e) => return bad(format!("the body is not a SwarmJoin: {e}")),
    };
    if join.leaving {
        return match gate
            .ask(&req, &name, "the image's swarm", async |tx| {
                swarm::leave(tx, machine_id, &name).await
            })
            .await
        {
            Ok(()) => HttpResponse::NoContent().finish(),
            Err(unavailable) => unavailable,
        };
    }
    let port = match u16::try_from(join.port) {
        Ok(p) if p > 0 => p,
        _ => return bad(format!("port {} is not a TCP port", join.port)),
    };
    let Some(from) = req.peer_addr() else {
        return bad("the request's address is unknown".into());
    };
    let address = std::net::SocketAddr::new(from.ip().to_canonical(), port).to_string();
    let view = gate
        .ask(&req, &name, "the image's swarm", async |tx| {
            swarm::join(tx, machine_id, &name, &address, asked).await
        })
        .await;
    match view {
        Ok(None) => refusal(&req, &name, &DownloadGrant::NotAsked { machine_id }),
        Ok(Some(v)) => {
            tracing::debug!(image = %name, machine = %machine_id, %address, members = v.members, awaited = v.awaited, sources = v.sources.len(), "swarm joined");
            let answer = SwarmView {
                sources: v
                    .sources
                    .into_iter()
                    .map(|p| SwarmPeer {
                        address: p.address,
                        key: p.key,
                    })
                    .collect(),
                member_keys: v.member_keys,
                refresh_seconds: swarm::REFRESH.as_secs() as u32,
                awaited: u32::try_from(v.awaited).unwrap_or(u32::MAX),
            };
            HttpResponse::Ok()
                .content_type("application/x-protobuf")
                .insert_header((actix_web::http::header::CACHE_CONTROL, "no-store"))
                .body(answer.encode_to_vec())
        }
        Err(unavailable) => unavailable,
    }
}
