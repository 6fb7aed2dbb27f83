//! The agent's chunk server: the chunks it holds, to the members of its
//! swarm. HTTP/1.1 over TLS 1.3 (`tls`), `GET /chunks/<manifest>/<index>`:
//! 200 with the chunk, 404 when it is not held (the asker goes on to the
//! next source), 403 to a key that is not a member's (after asking
//! shepherd again, for a while, in case the asker joined since).

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};

use super::store::ChunkStore;
use super::tls::{Key, key_of};

/// How long an asker is held for a chunk the fetch is still to bring
/// (less the time its admission took).
pub const WAIT: Duration = Duration::from_secs(20);
/// How long a key not (yet) a member's is held while shepherd is asked
/// again who the members are.
const ADMIT_WAIT: Duration = Duration::from_secs(12);
/// Connections served at once; more are closed at once (the asker goes on
/// to the next source). The members near the tree's root are every
/// deeper member's last sources: at a thousand members 32 were too few.
const CONNECTIONS: usize = 128;
/// A connection that sends no request head for this long is closed (its
/// slot freed for the next asker).
const IDLE: Duration = Duration::from_secs(20);
const HANDSHAKE: Duration = Duration::from_secs(10);

/// The keys of the swarm's members, as shepherd last listed them.
#[derive(Debug, Default)]
pub struct Members {
    keys: RwLock<HashSet<Key>>,
    /// Asks the fetch to join again (and so learn of new members).
    pub stale: Notify,
    /// Told once the list was renewed.
    pub renewed: Notify,
}

impl Members {
    pub fn set(&self, keys: impl IntoIterator<Item = Key>) {
        *self.keys.write().unwrap() = keys.into_iter().collect();
        self.renewed.notify_waiters();
    }

    pub fn contains(&self, key: &Key) -> bool {
        self.keys.read().unwrap().contains(key)
    }

    /// Whether `key` is a member, asking shepherd again while it is not,
    /// up to [`ADMIT_WAIT`]: the asker joined after this member's last
    /// join, and the join in flight when it asked (one at a time) may
    /// predate it, so one renewal is not enough; under load a join takes
    /// seconds.
    async fn admits(&self, key: &Key) -> bool {
        let deadline = tokio::time::Instant::now() + ADMIT_WAIT;
        while !self.contains(key) {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            self.renew().await;
        }
        true
    }

    /// Asks shepherd who the members are now, waiting for the answer up
    /// to 5 s.
    pub async fn renew(&self) {
        let renewed = self.renewed.notified();
        self.stale.notify_one();
        let _ = tokio::time::timeout(Duration::from_secs(5), renewed).await;
    }
}

/// Serves `store` to `members` on `listener` until the task is aborted.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    store: Arc<ChunkStore>,
    members: Arc<Members>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(CONNECTIONS));
    loop {
        let Ok((tcp, from)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let (acceptor, store, members) = (acceptor.clone(), store.clone(), members.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let _ = tcp.set_nodelay(true);
            let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await else {
                return;
            };
            let Some(key) = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| key_of(c))
            else {
                return;
            };
            let service = hyper::service::service_fn(move |req| {
                let (store, members) = (store.clone(), members.clone());
                async move { Ok::<_, Infallible>(answer(req, from, key, &store, &members).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(IDLE)
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

fn text(status: StatusCode, why: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(why + "\n")))
        .unwrap()
}

async fn answer<B>(
    req: Request<B>,
    from: SocketAddr,
    key: Key,
    store: &ChunkStore,
    members: &Members,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only".into());
    }
    let asked = tokio::time::Instant::now();
    if !members.admits(&key).await {
        return text(
            StatusCode::FORBIDDEN,
            format!("{from} is not a member of this image's swarm"),
        );
    }
    let path = req.uri().path();
    let Some((manifest, index)) = path
        .strip_prefix("/chunks/")
        .and_then(|rest| rest.split_once('/'))
    else {
        return text(StatusCode::NOT_FOUND, "not a chunk".into());
    };
    if manifest != store.manifest {
        return text(
            StatusCode::NOT_FOUND,
            "this agent installs another image (another manifest)".into(),
        );
    }
    let Ok(index) = index.parse::<u64>() else {
        return text(StatusCode::NOT_FOUND, format!("{index:?} is not a chunk"));
    };
    match store.get(index, WAIT.saturating_sub(asked.elapsed())).await {
        Some(chunk) => Response::builder()
            .header(http::header::CONTENT_TYPE, "application/octet-stream")
            .body(Full::new(chunk))
            .unwrap(),
        None => text(StatusCode::NOT_FOUND, format!("chunk {index} is not held")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The join in flight when a new member asked predates it (its list
    /// lacks the asker): the asker is held until a later join lists it,
    /// not refused at the first renewal.
    #[tokio::test]
    async fn a_key_is_admitted_once_a_join_after_the_ask_lists_it() {
        let members = Arc::new(Members::default());
        let key: Key = [7; 32];
        let m = members.clone();
        tokio::spawn(async move {
            m.stale.notified().await;
            m.set([]);
            m.stale.notified().await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            m.set([key]);
        });
        assert!(members.admits(&key).await);
        // A stranger is refused once ADMIT_WAIT has passed.
        let stranger: Key = [9; 32];
        let m = members.clone();
        let renewing = tokio::spawn(async move {
            loop {
                m.stale.notified().await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                m.set([key]);
            }
        });
        let asked = tokio::time::Instant::now();
        assert!(!members.admits(&stranger).await);
        assert!(asked.elapsed() >= ADMIT_WAIT);
        renewing.abort();
    }
}
