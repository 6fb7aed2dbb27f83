//! The `BmcClient` actor: every request to one BMC goes through it.
//!
//! - One request in flight per BMC, by construction: each message is
//!   handled as an `AtomicResponse` (BMCs are small computers; many fall over
//!   under concurrent requests). Across BMCs, a shared semaphore caps the
//!   requests in flight (`redfish.max_concurrent`).
//! - Authentication: a Redfish session (`SessionService`, found from the
//!   service root) whose `X-Auth-Token` is reused until a 401, then made
//!   anew once; basic authentication when the BMC has no session service.
//!   The password goes into the session request or the `Authorization`
//!   header and nowhere else.
//! - Errors name the host, the BMC and what Redfish said
//!   (`error.message`, `@Message.ExtendedInfo`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use awc::http::{Method, StatusCode};
use serde_json::Value;

use super::system::SystemInfo;
use super::system::secure_boot_facts;
pub use crate::bmc::{BmcError, BmcErrorKind};

use crate::config::BmcConfig;

/// A BMC's answers are small; anything bigger is refused.
const MAX_RESPONSE_BYTES: usize = 4 << 20;

/// Redfish's error body: `error.message` and each
/// `@Message.ExtendedInfo[].Message`.
fn redfish_message(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return String::from_utf8_lossy(&body[..body.len().min(200)])
            .trim()
            .to_string();
    };
    let e = &v["error"];
    let mut parts: Vec<String> = Vec::new();
    if let Some(m) = e["message"].as_str() {
        parts.push(m.to_string());
    }
    if let Some(infos) = e["@Message.ExtendedInfo"].as_array() {
        for i in infos {
            if let Some(m) = i["Message"].as_str()
                && !parts.iter().any(|p| p == m)
            {
                parts.push(m.to_string());
            }
        }
    }
    parts.join("; ")
}

/// A request's body.
#[derive(Clone, Copy)]
pub(super) enum Body<'a> {
    Json(&'a Value),
    /// Bytes of a content type (a multipart push of an image).
    Raw {
        content_type: &'a str,
        bytes: &'a [u8],
    },
}

/// A successful answer: its status, `Location` (a path), JSON (Null when
/// empty).
pub(super) struct Answer {
    pub status: u16,
    pub location: Option<String>,
    pub json: Value,
}

/// How requests are authenticated.
#[derive(Clone)]
enum Auth {
    /// Not decided yet: the service root says whether sessions exist.
    Unknown,
    /// `X-Auth-Token` of a session created at `sessions` (None: none yet).
    Session {
        sessions: String,
        token: Option<String>,
    },
    Basic,
}

/// The HTTP side of the actor, moved into each call's future and back.
pub(super) struct Conn {
    http: awc::Client,
    cfg: BmcConfig,
    host: String,
    auth: Auth,
    /// Resolved system paths, by configured system (None: the only one).
    systems: HashMap<Option<String>, String>,
    limit: Arc<tokio::sync::Semaphore>,
    timeout: Duration,
}

impl Conn {
    pub(super) fn err(&self, kind: BmcErrorKind) -> BmcError {
        BmcError {
            host: self.host.clone(),
            bmc: self.cfg.url.clone(),
            kind,
        }
    }

    /// One HTTP exchange under the global cap. Ok: status and body.
    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        auth: bool,
    ) -> Result<(StatusCode, awc::http::header::HeaderMap, Vec<u8>), BmcError> {
        self.exchange_body(method, path, body.map(Body::Json), auth)
            .await
    }

    /// One HTTP exchange under the global cap, with any body.
    async fn exchange_body(
        &self,
        method: Method,
        path: &str,
        body: Option<Body<'_>>,
        auth: bool,
    ) -> Result<(StatusCode, awc::http::header::HeaderMap, Vec<u8>), BmcError> {
        let _permit = self
            .limit
            .acquire()
            .await
            .expect("the BMC semaphore is never closed");
        let idempotent = method != Method::POST;
        let send = || async {
            let mut req = self
                .http
                .request(method.clone(), format!("{}{}", self.cfg.url, path))
                .insert_header(("Accept", "application/json"))
                .timeout(self.timeout);
            if auth {
                match &self.auth {
                    Auth::Session { token: Some(t), .. } => {
                        req = req.insert_header(("X-Auth-Token", t.as_str()))
                    }
                    _ => {
                        req = req.basic_auth(&self.cfg.username, self.cfg.password.expose());
                    }
                }
            }
            match body {
                Some(Body::Json(b)) => req.send_json(b).await,
                Some(Body::Raw {
                    content_type,
                    bytes,
                }) => {
                    req.insert_header(("Content-Type", content_type))
                        .send_body(bytes.to_vec())
                        .await
                }
                None => req.send().await,
            }
        };
        let sent = match send().await {
            // A kept connection the BMC closed meanwhile (its idle timeout
            // raced ours): a request that changes nothing twice is sent
            // again on a new one; an action is not, its caller backs off.
            Err(e) if idempotent && super::http::stale_connection(&e) => {
                tracing::debug!(bmc = %self.cfg.url, %path, error = %e, "the BMC closed a kept connection: asking again on a new one");
                send().await
            }
            sent => sent,
        };
        let mut resp = sent.map_err(|e| self.err(BmcErrorKind::Unreachable(e.to_string())))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.body().limit(MAX_RESPONSE_BYTES).await.map_err(|e| {
            self.err(BmcErrorKind::Unreachable(format!(
                "reading the answer: {e}"
            )))
        })?;
        Ok((status, headers, bytes.to_vec()))
    }

    /// Finds out how to authenticate: a session when the service root
    /// links a session collection, basic otherwise.
    async fn decide_auth(&mut self) -> Result<(), BmcError> {
        if !matches!(self.auth, Auth::Unknown) {
            return Ok(());
        }
        let (status, _, body) = self
            .exchange(Method::GET, "/redfish/v1/", None, false)
            .await?;
        if !status.is_success() {
            return Err(self.err(BmcErrorKind::Http {
                status: status.as_u16(),
                what: "the service root /redfish/v1/".into(),
                message: redfish_message(&body),
            }));
        }
        let root: Value = serde_json::from_slice(&body).map_err(|e| {
            self.err(BmcErrorKind::Protocol(format!(
                "the service root is not JSON: {e}"
            )))
        })?;
        self.auth = match root["Links"]["Sessions"]["@odata.id"].as_str() {
            Some(sessions) => Auth::Session {
                sessions: sessions.to_string(),
                token: None,
            },
            None => Auth::Basic,
        };
        Ok(())
    }

    /// Creates a session; a BMC that turns session creation down (not with
    /// 401) is spoken to with basic authentication instead.
    async fn log_in(&mut self) -> Result<(), BmcError> {
        let Auth::Session { sessions, .. } = self.auth.clone() else {
            return Ok(());
        };
        let body = serde_json::json!({
            "UserName": self.cfg.username,
            "Password": self.cfg.password.expose(),
        });
        let (status, headers, answer) = self
            .exchange(Method::POST, &sessions, Some(&body), false)
            .await?;
        let token = headers
            .get("X-Auth-Token")
            .and_then(|t| t.to_str().ok())
            .map(str::to_string);
        match (status, token) {
            (s, Some(token)) if s.is_success() => {
                self.auth = Auth::Session {
                    sessions,
                    token: Some(token),
                };
                Ok(())
            }
            (StatusCode::UNAUTHORIZED, _) => {
                Err(self.err(BmcErrorKind::Unauthorized(redfish_message(&answer))))
            }
            _ => {
                tracing::debug!(bmc = %self.cfg.url, status = status.as_u16(), "no Redfish session; using basic authentication");
                self.auth = Auth::Basic;
                Ok(())
            }
        }
    }

    /// An authenticated request; a session refused with 401 is made anew
    /// once. Ok: the answer's JSON (Null for an empty body).
    pub(super) async fn call(
        &mut self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        what: &str,
    ) -> Result<Value, BmcError> {
        self.answer(method, path, body.map(Body::Json), what)
            .await
            .map(|a| a.json)
    }

    /// As `call`, with any body, the answer's status and headers kept (a
    /// task's `Location`); a 503 is `BmcErrorKind::Busy` with its
    /// `Retry-After`.
    pub(super) async fn answer(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Body<'_>>,
        what: &str,
    ) -> Result<Answer, BmcError> {
        self.decide_auth().await?;
        let mut fresh = false;
        if matches!(self.auth, Auth::Session { token: None, .. }) {
            self.log_in().await?;
            fresh = true;
        }
        loop {
            let (status, headers, answer) =
                self.exchange_body(method.clone(), path, body, true).await?;
            if status == StatusCode::UNAUTHORIZED {
                if let Auth::Session { token, .. } = &mut self.auth
                    && !fresh
                {
                    *token = None;
                    self.log_in().await?;
                    fresh = true;
                    continue;
                }
                return Err(self.err(BmcErrorKind::Unauthorized(redfish_message(&answer))));
            }
            if status == StatusCode::SERVICE_UNAVAILABLE {
                let retry_after = headers
                    .get("Retry-After")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs)
                    .unwrap_or(Duration::from_secs(5));
                return Err(self.err(BmcErrorKind::Busy {
                    what: what.to_string(),
                    retry_after,
                    message: redfish_message(&answer),
                }));
            }
            if !status.is_success() {
                return Err(self.err(BmcErrorKind::Http {
                    status: status.as_u16(),
                    what: what.to_string(),
                    message: redfish_message(&answer),
                }));
            }
            let location = headers
                .get("Location")
                .and_then(|v| v.to_str().ok())
                .map(|l| match l.find("/redfish/") {
                    // An absolute URL: its path (the BMC is this one).
                    Some(i) if l.starts_with("http") => l[i..].to_string(),
                    _ => l.to_string(),
                });
            let json = if answer.iter().all(u8::is_ascii_whitespace) {
                Value::Null
            } else {
                serde_json::from_slice(&answer).map_err(|e| {
                    self.err(BmcErrorKind::Protocol(format!("{what}: not JSON: {e}")))
                })?
            };
            return Ok(Answer {
                status: status.as_u16(),
                location,
                json,
            });
        }
    }

    /// The path of the configured system (or the only one).
    async fn system_path(&mut self, system: &Option<String>) -> Result<String, BmcError> {
        if let Some(p) = self.systems.get(system) {
            return Ok(p.clone());
        }
        let list = self
            .call(Method::GET, "/redfish/v1/Systems", None, "the system list")
            .await?;
        let members: Vec<String> = list["Members"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter_map(|m| m["@odata.id"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let path = match system {
            Some(want) => members
                .iter()
                .find(|p| {
                    *p == want || p.trim_end_matches('/').rsplit('/').next() == Some(want.as_str())
                })
                .cloned()
                .ok_or_else(|| {
                    self.err(BmcErrorKind::Config(format!(
                        "no system {want:?} among {members:?}"
                    )))
                })?,
            None => match members.as_slice() {
                [only] => only.clone(),
                [] => return Err(self.err(BmcErrorKind::Config("the BMC lists no system".into()))),
                many => {
                    return Err(self.err(BmcErrorKind::Config(format!(
                        "the BMC has {} systems ({}); name one with bmc.system",
                        many.len(),
                        many.join(", ")
                    ))));
                }
            },
        };
        self.systems.insert(system.clone(), path.clone());
        Ok(path)
    }

    /// Sets `SecureBootEnable` to `on` where it differs (Redfish's
    /// `SecureBoot` resource; it takes effect at the next reset). Ok(what
    /// was done, for the boot's history), Err: the system has no
    /// `SecureBoot`, or the BMC refused.
    pub(super) async fn set_secure_boot(
        &mut self,
        info: &SystemInfo,
        on: bool,
    ) -> Result<Option<String>, BmcError> {
        let Some(path) = info.secure_boot.clone() else {
            return Err(self.err(BmcErrorKind::Protocol(format!(
                "{} has no SecureBoot resource: Secure Boot cannot be set {} (bmc.secure_boot)",
                info.path,
                if on { "on" } else { "off" }
            ))));
        };
        let now = self.call(Method::GET, &path, None, &path).await?;
        if now["SecureBootEnable"].as_bool() == Some(on) {
            return Ok(None);
        }
        let what = format!("SecureBootEnable = {on} on {path}");
        self.call(
            Method::PATCH,
            &path,
            Some(&serde_json::json!({ "SecureBootEnable": on })),
            &what,
        )
        .await?;
        Ok(Some(format!(
            "Secure Boot set {}",
            if on { "on" } else { "off" }
        )))
    }

    /// `SecureBootEnable` now (None: the system has no `SecureBoot`, or it
    /// cannot be read), read before a boot override: what "leave it"
    /// restores.
    pub(super) async fn secure_boot_now(&mut self, info: &SystemInfo) -> Option<bool> {
        let path = info.secure_boot.clone()?;
        match self.call(Method::GET, &path, None, &path).await {
            Ok(v) => v["SecureBootEnable"].as_bool(),
            Err(e) => {
                tracing::debug!(bmc = %self.cfg.url, error = %e, "Secure Boot not read before the boot override");
                None
            }
        }
    }

    /// Secure Boot as asked before the reset that starts a boot shepherd
    /// makes, after its boot override: `wanted` (this boot's, e.g. a
    /// tenant's plan), else the host's configuration (`bmc.secure_boot`),
    /// else `before`, the state read before the override. Some BMCs,
    /// sushy-tools among them, turn Secure Boot off when the override
    /// names a boot mode; "leave it" puts it back. Ok(what was done, when
    /// anything was).
    pub(super) async fn secure_boot_as_asked(
        &mut self,
        info: &SystemInfo,
        wanted: Option<bool>,
        before: Option<bool>,
    ) -> Result<Option<String>, BmcError> {
        match (wanted.or(self.cfg.secure_boot), before) {
            (Some(on), _) => self.set_secure_boot(info, on).await,
            (None, Some(on)) => Ok(self
                .set_secure_boot(info, on)
                .await?
                .map(|s| format!("{s} again (the boot override had changed it)"))),
            (None, None) => Ok(None),
        }
    }

    pub(super) async fn get_system(
        &mut self,
        system: &Option<String>,
    ) -> Result<SystemInfo, BmcError> {
        let path = self.system_path(system).await?;
        let v = self.call(Method::GET, &path, None, &path).await?;
        let mut info = SystemInfo::from_json(&v);
        if info.path.is_empty() {
            info.path = path;
        }
        Ok(info)
    }

    pub(super) async fn reset(
        &mut self,
        system: &Option<String>,
        target: Option<String>,
        reset_type: &str,
    ) -> Result<(), BmcError> {
        let target = match target {
            Some(t) => t,
            None => {
                let info = self.get_system(system).await?;
                info.reset_target
                    .clone()
                    .unwrap_or_else(|| format!("{}/Actions/ComputerSystem.Reset", info.path))
            }
        };
        let body = serde_json::json!({ "ResetType": reset_type });
        self.call(
            Method::POST,
            &target,
            Some(&body),
            &format!("ComputerSystem.Reset {reset_type}"),
        )
        .await
        .map(|_| ())
    }
}

/// The actor for one BMC.
pub struct BmcClient {
    conn: Option<Conn>,
}

impl Actor for BmcClient {
    type Context = Context<Self>;
}

impl BmcClient {
    /// `host` names the machine in errors; `limit` is shared by every BMC.
    pub fn new(
        host: &str,
        cfg: BmcConfig,
        limit: Arc<tokio::sync::Semaphore>,
        timeout: Duration,
    ) -> Result<BmcClient, super::tls::CaFileError> {
        let http = super::http::client(&cfg.tls, timeout)?;
        Ok(BmcClient {
            conn: Some(Conn {
                http,
                cfg,
                host: host.to_string(),
                auth: Auth::Unknown,
                systems: HashMap::new(),
                limit,
                timeout,
            }),
        })
    }

    pub(super) fn atomic<T: 'static, F>(
        &mut self,
        call: impl FnOnce(Conn) -> F,
    ) -> AtomicResponse<Self, Result<T, BmcError>>
    where
        F: Future<Output = (Conn, Result<T, BmcError>)> + 'static,
    {
        let conn = self.conn.take().expect("BmcClient runs one call at a time");
        AtomicResponse::new(Box::pin(call(conn).into_actor(self).map(
            |(conn, r), act, _| {
                act.conn = Some(conn);
                r
            },
        )))
    }
}

/// The system's power state and facts.
#[derive(Message)]
#[rtype(result = "Result<SystemInfo, BmcError>")]
pub struct GetSystem {
    pub system: Option<String>,
    /// Its `SecureBoot` resource read too, into the facts (a BMC that
    /// answers it with an error leaves them without).
    pub secure_boot: bool,
}

sequence!(GetSystem => SystemInfo, |c, msg| {
    let mut info = c.get_system(&msg.system).await?;
    if let (true, Some(path)) = (msg.secure_boot, info.secure_boot.clone()) {
        match c.call(Method::GET, &path, None, &path).await {
            Ok(v) => info.facts.secure_boot = Some(secure_boot_facts(&v)),
            Err(e) => tracing::debug!(error = %e, "the BMC's SecureBoot resource did not read"),
        }
    }
    Ok(info)
});

/// `ComputerSystem.Reset` with this `ResetType`, at `target` (the action's
/// target from a `GetSystem` just made; None: look it up).
#[derive(Message)]
#[rtype(result = "Result<(), BmcError>")]
pub struct Reset {
    pub system: Option<String>,
    pub target: Option<String>,
    pub reset_type: String,
}

sequence!(Reset => (), |c, msg| c.reset(&msg.system, msg.target, &msg.reset_type).await);
