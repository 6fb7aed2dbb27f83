//! The `EquinixClient` actor: every Equinix Metal API call goes through it.
//!
//! - One call in flight, by construction: each message is handled as an
//!   `AtomicResponse`, so the actor takes the next message only when the
//!   call (with its retries and pages) is done. With `equinix.parallelism`
//!   N > 1, [`EquinixApi`] spreads calls over N such actors, each spacing its
//!   requests N intervals apart, so the total rate stays one per interval.
//! - At least `api_interval` between the end of one request and the start of
//!   the next, retries included.
//! - Transient failures (connect errors, timeouts, a broken response, 5xx,
//!   429) are retried with jittered exponential backoff until the call's
//!   deadline, waiting at least as long as `Retry-After` says. 401, 403, 404,
//!   422 and a lost race are final.
//! - Lists follow pagination to the last page, each item made what the
//!   caller keeps as its page arrives (`Keep`): a listing of 100,000
//!   devices is never held whole as the API's objects.
//! - Creating a device is idempotent per hardware reservation: the request
//!   carries a witness tag; after an attempt whose outcome is unknown, and
//!   after a 422, the reservation is looked up. A device there with our
//!   witness is ours (a lost response); anyone else's is `RaceLost`. On the
//!   fault-free path a device costs one request.
//! - The API key goes into the `X-Auth-Token` header and nowhere else.
//!
//! Long on purpose: one actor, one method per operation of the API
//! subset, around the one call path that paces and retries.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use awc::http::{Method, StatusCode};
use rand::Rng;
use serde::de::DeserializeOwned;

use super::metrics::{ApiMetrics, Operation};
use super::model::*;
use crate::config::EquinixConfig;
use crate::secret::Secret;

/// Responses larger than this are refused (a full device list of a large
/// project is a few MB).
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// Prefix of the idempotency witness tag put on every device we create.
pub const WITNESS_TAG_PREFIX: &str = "shepherd-witness-";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EquinixError {
    #[error("equinix {op}: the API rejected the API key (401 Unauthorized)")]
    Unauthorized { op: Operation },
    #[error("equinix {op}: forbidden (403): {message}")]
    Forbidden { op: Operation, message: String },
    #[error("equinix {op}: {what} not found (404)")]
    NotFound { op: Operation, what: String },
    #[error("equinix {op}: rejected (422): {message}")]
    Unprocessable { op: Operation, message: String },
    #[error(
        "equinix {op}: hardware reservation {reservation} was taken by another device ({device})"
    )]
    RaceLost {
        op: Operation,
        reservation: String,
        device: String,
    },
    #[error("equinix {op}: HTTP {status}: {message}")]
    Http {
        op: Operation,
        status: u16,
        message: String,
    },
    #[error("equinix {op}: gave up after {attempts} attempts within the call deadline: {last}")]
    GaveUp {
        op: Operation,
        attempts: u32,
        last: String,
    },
    #[error("equinix {op}: unreadable response: {message}")]
    Decode { op: Operation, message: String },
    #[error("equinix client: {0}")]
    Client(String),
}

impl EquinixError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, EquinixError::NotFound { .. })
    }

    /// The API or the way to it failed, not the request: the client
    /// retried for its whole call deadline, or could not send at all.
    /// Asking again later may succeed, and says nothing of the machine.
    pub fn is_transient(&self) -> bool {
        matches!(self, EquinixError::GaveUp { .. } | EquinixError::Client(_))
    }
}

/// What one HTTP exchange came to.
enum Outcome {
    Done(StatusCode, actix_web::web::Bytes),
    Final(EquinixError),
    Transient {
        /// The HTTP status, if a response came.
        status: Option<u16>,
        cause: String,
        retry_after: Option<Duration>,
    },
}

/// Client settings, from `EquinixConfig` plus credentials.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    pub api_url: String,
    pub project_id: String,
    pub api_key: Secret,
    pub api_interval: Duration,
    pub parallelism: u32,
    pub request_timeout: Duration,
    pub call_deadline: Duration,
    pub retry_initial: Duration,
    pub retry_max: Duration,
    pub per_page: u32,
}

impl ClientSettings {
    pub fn from_config(cfg: &EquinixConfig) -> Result<Self, crate::config::ConfigError> {
        let (project_id, api_key) = cfg.credentials()?;
        Ok(ClientSettings {
            api_url: cfg.api_url.clone(),
            project_id,
            api_key,
            api_interval: cfg.api_interval,
            parallelism: cfg.parallelism,
            request_timeout: cfg.request_timeout,
            call_deadline: cfg.call_deadline,
            retry_initial: cfg.retry_initial,
            retry_max: cfg.retry_max,
            per_page: cfg.per_page,
        })
    }
}

/// The HTTP side of the actor, moved into each call's future and back.
struct Api {
    http: awc::Client,
    settings: ClientSettings,
    /// Spacing between requests of this actor.
    interval: Duration,
    next_allowed: Instant,
    metrics: ApiMetrics,
}

impl Api {
    fn url(&self, path: &str) -> String {
        format!("{}{}", self.settings.api_url, path)
    }

    async fn pace(&mut self) {
        let now = Instant::now();
        if self.next_allowed > now {
            tokio::time::sleep(self.next_allowed - now).await;
        }
    }

    /// One HTTP exchange, paced and counted.
    async fn attempt(
        &mut self,
        op: Operation,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&[u8]>,
    ) -> Outcome {
        self.pace().await;
        let mut req = self
            .http
            .request(method, self.url(path))
            .insert_header(("X-Auth-Token", self.settings.api_key.expose()))
            .insert_header(("Accept", "application/json"))
            .timeout(self.settings.request_timeout);
        if !query.is_empty() {
            req = match req.query(&query) {
                Ok(r) => r,
                Err(e) => return Outcome::Final(EquinixError::Client(format!("{op}: query: {e}"))),
            };
        }
        let started = Instant::now();
        let sent = match body {
            Some(b) => {
                req.insert_header(("Content-Type", "application/json"))
                    .send_body(b.to_vec())
                    .await
            }
            None => req.send().await,
        };
        let outcome = match sent {
            Err(e) => Outcome::Transient {
                status: None,
                cause: format!("request failed: {e}"),
                retry_after: None,
            },
            Ok(mut resp) => {
                let status = resp.status();
                let retry_after = retry_after(resp.headers());
                match resp.body().limit(MAX_RESPONSE_BYTES).await {
                    Err(e) => Outcome::Transient {
                        status: None,
                        cause: format!("HTTP {} with a broken body: {e}", status.as_u16()),
                        retry_after: None,
                    },
                    Ok(bytes) => classify(op, status, bytes, retry_after, path),
                }
            }
        };
        let status = match &outcome {
            Outcome::Done(s, _) => s.as_u16().to_string(),
            Outcome::Final(e) => final_status(e),
            Outcome::Transient {
                status: Some(s), ..
            } => s.to_string(),
            Outcome::Transient { status: None, .. } => "error".to_string(),
        };
        self.metrics.record(op, &status, started.elapsed());
        self.next_allowed = Instant::now() + self.interval;
        outcome
    }

    /// The wait before retry `attempt` (1-based): exponential with full
    /// jitter in its upper half, at least `retry_after`.
    fn retry_wait(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let exp = self
            .settings
            .retry_initial
            .saturating_mul(1u32 << (attempt - 1).min(16))
            .min(self.settings.retry_max);
        let jittered = exp.mul_f64(0.5 + rand::rng().random::<f64>() * 0.5);
        jittered.max(retry_after.unwrap_or_default())
    }

    /// Waits before retry `attempts`, or gives up if that would pass the
    /// call's deadline.
    async fn back_off(
        &self,
        op: Operation,
        attempts: u32,
        cause: String,
        retry_after: Option<Duration>,
        deadline: Instant,
    ) -> Result<(), EquinixError> {
        let wait = self.retry_wait(attempts, retry_after);
        if Instant::now() + wait > deadline {
            return Err(EquinixError::GaveUp {
                op,
                attempts,
                last: cause,
            });
        }
        tracing::debug!(%op, attempts, wait_ms = wait.as_millis() as u64, %cause, "retrying Equinix API call");
        tokio::time::sleep(wait).await;
        Ok(())
    }

    /// An exchange retried on transient failures until `deadline`.
    async fn request(
        &mut self,
        op: Operation,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&[u8]>,
        deadline: Instant,
    ) -> Result<(StatusCode, actix_web::web::Bytes), EquinixError> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.attempt(op, method.clone(), path, query, body).await {
                Outcome::Done(s, b) => return Ok((s, b)),
                Outcome::Final(e) => return Err(e),
                Outcome::Transient {
                    cause, retry_after, ..
                } => {
                    self.back_off(op, attempts, cause, retry_after, deadline)
                        .await?;
                }
            }
        }
    }

    async fn get_json<T: DeserializeOwned>(
        &mut self,
        op: Operation,
        path: &str,
        query: &[(&str, String)],
        deadline: Instant,
    ) -> Result<T, EquinixError> {
        let (_, body) = self
            .request(op, Method::GET, path, query, None, deadline)
            .await?;
        decode(op, &body)
    }

    /// Every item of a paginated list, each made what `keep` keeps as its
    /// page arrives.
    async fn list<T: DeserializeOwned, L: DeserializeOwned, U>(
        &mut self,
        op: Operation,
        path: &str,
        extra: &[(&str, String)],
        deadline: Instant,
        split: impl Fn(L) -> (Vec<T>, Option<Meta>),
        keep: &(dyn Fn(T) -> Option<U> + Send + Sync),
    ) -> Result<Vec<U>, EquinixError> {
        let mut out = Vec::new();
        let mut page = 1i64;
        loop {
            let mut query = vec![
                ("page", page.to_string()),
                ("per_page", self.settings.per_page.to_string()),
            ];
            query.extend(extra.iter().cloned());
            let list: L = self.get_json(op, path, &query, deadline).await?;
            let (items, meta) = split(list);
            let n = items.len();
            out.extend(items.into_iter().filter_map(keep));
            let more = match &meta {
                Some(m) => match m.last_page {
                    Some(last) => page < last,
                    None => m.next.is_some(),
                },
                None => false,
            };
            if !more || n == 0 {
                return Ok(out);
            }
            page += 1;
        }
    }

    async fn list_devices<U>(
        &mut self,
        keep: &Keep<Device, U>,
        deadline: Instant,
    ) -> Result<Vec<U>, EquinixError> {
        let path = format!("/projects/{}/devices", self.settings.project_id);
        self.list(
            Operation::ListDevices,
            &path,
            &[],
            deadline,
            |l: DeviceList| (l.devices, Some(l.meta)),
            &**keep,
        )
        .await
    }

    async fn get_device(&mut self, id: &str, deadline: Instant) -> Result<Device, EquinixError> {
        check_id(Operation::GetDevice, id)?;
        self.get_json(
            Operation::GetDevice,
            &format!("/devices/{id}"),
            &[],
            deadline,
        )
        .await
    }

    async fn list_reservations<U>(
        &mut self,
        keep: &Keep<HardwareReservation, U>,
        deadline: Instant,
    ) -> Result<Vec<U>, EquinixError> {
        let path = format!(
            "/projects/{}/hardware-reservations",
            self.settings.project_id
        );
        self.list(
            Operation::ListReservations,
            &path,
            &[],
            deadline,
            |l: HardwareReservationList| (l.hardware_reservations, Some(l.meta)),
            &**keep,
        )
        .await
    }

    async fn get_reservation(
        &mut self,
        id: &str,
        deadline: Instant,
    ) -> Result<HardwareReservation, EquinixError> {
        check_id(Operation::GetReservation, id)?;
        self.get_json(
            Operation::GetReservation,
            &format!("/hardware-reservations/{id}"),
            &[("include", "device".to_string())],
            deadline,
        )
        .await
    }

    /// Creates a device from a hardware reservation, at most once.
    async fn create_device(
        &mut self,
        mut req: DeviceCreateRequest,
        deadline: Instant,
    ) -> Result<Device, EquinixError> {
        let op = Operation::CreateDevice;
        check_id(op, &req.hardware_reservation_id)?;
        let witness = format!("{WITNESS_TAG_PREFIX}{}", uuid::Uuid::new_v4());
        req.tags.push(witness.clone());
        let body = serde_json::to_vec(&req).map_err(|e| EquinixError::Client(e.to_string()))?;
        let path = format!("/projects/{}/devices", self.settings.project_id);
        let reservation = req.hardware_reservation_id.clone();
        let mut attempts = 0;
        loop {
            attempts += 1;
            // After an attempt whose outcome is unknown (lost response,
            // timeout, 5xx): did it take the reservation? The first attempt
            // needs no look-up: a reservation taken by anyone answers 422,
            // which is looked into below.
            if attempts > 1 {
                let r = self.get_reservation(&reservation, deadline).await?;
                if let Some(existing) = self.occupant(&r, deadline).await? {
                    return claim(op, &reservation, &witness, existing);
                }
            }
            match self
                .attempt(op, Method::POST, &path, &[], Some(&body))
                .await
            {
                Outcome::Done(_, b) => return decode(op, &b),
                Outcome::Final(EquinixError::Unprocessable { message, .. }) => {
                    // Perhaps a slow earlier attempt of ours got there first.
                    let r = self.get_reservation(&reservation, deadline).await?;
                    if let Some(existing) = self.occupant(&r, deadline).await? {
                        return claim(op, &reservation, &witness, existing);
                    }
                    return Err(EquinixError::Unprocessable { op, message });
                }
                Outcome::Final(e) => return Err(e),
                Outcome::Transient {
                    cause, retry_after, ..
                } => {
                    tracing::info!(reservation = %reservation, attempts, %cause,
                        "device creation may have failed; checking the reservation before retrying");
                    self.back_off(op, attempts, cause, retry_after, deadline)
                        .await?;
                }
            }
        }
    }

    /// The device occupying a reservation, fetched if only referenced.
    async fn occupant(
        &mut self,
        r: &HardwareReservation,
        deadline: Instant,
    ) -> Result<Option<Device>, EquinixError> {
        match &r.device {
            None => Ok(None),
            Some(DeviceOrHref::Device(d)) => Ok(Some((**d).clone())),
            Some(DeviceOrHref::Href(h)) => {
                let id = h.href.rsplit('/').next().unwrap_or_default().to_string();
                match self.get_device(&id, deadline).await {
                    Ok(d) => Ok(Some(d)),
                    // Deleted meanwhile: the reservation is free again.
                    Err(e) if e.is_not_found() => Ok(None),
                    Err(e) => Err(e),
                }
            }
        }
    }

    async fn delete_device(&mut self, id: &str, deadline: Instant) -> Result<(), EquinixError> {
        check_id(Operation::DeleteDevice, id)?;
        match self
            .request(
                Operation::DeleteDevice,
                Method::DELETE,
                &format!("/devices/{id}"),
                &[],
                None,
                deadline,
            )
            .await
        {
            Ok(_) => Ok(()),
            // Gone already: perhaps a retry after a lost response.
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn reboot_device(&mut self, id: &str, deadline: Instant) -> Result<(), EquinixError> {
        check_id(Operation::RebootDevice, id)?;
        let body = serde_json::to_vec(&DeviceAction {
            kind: "reboot".into(),
        })
        .map_err(|e| EquinixError::Client(e.to_string()))?;
        self.request(
            Operation::RebootDevice,
            Method::POST,
            &format!("/devices/{id}/actions"),
            &[],
            Some(&body),
            deadline,
        )
        .await
        .map(|_| ())
    }

    async fn list_ssh_keys(&mut self, deadline: Instant) -> Result<Vec<SshKey>, EquinixError> {
        let path = format!("/projects/{}/ssh-keys", self.settings.project_id);
        self.list(
            Operation::ListSshKeys,
            &path,
            &[],
            deadline,
            |l: SshKeyList| (l.ssh_keys, l.meta),
            &Some,
        )
        .await
    }

    /// Makes sure the project has a key with `label` and exactly `key`:
    /// creates it if missing, updates it if different, else does nothing.
    /// A mutation whose response is lost is checked by listing again.
    async fn ensure_ssh_key(
        &mut self,
        label: &str,
        key: &str,
        deadline: Instant,
    ) -> Result<SshKey, EquinixError> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let keys = self.list_ssh_keys(deadline).await?;
            let existing = keys.into_iter().find(|k| k.label == label);
            let (op, method, path, body) = match &existing {
                Some(k) if k.key.trim() == key.trim() => return Ok(k.clone()),
                Some(k) => {
                    check_id(Operation::UpdateSshKey, &k.id)?;
                    let input = SshKeyInput {
                        label: None,
                        key: Some(key.to_string()),
                        tags: None,
                    };
                    (
                        Operation::UpdateSshKey,
                        Method::PUT,
                        format!("/ssh-keys/{}", k.id),
                        input,
                    )
                }
                None => {
                    let input = SshKeyInput {
                        label: Some(label.to_string()),
                        key: Some(key.to_string()),
                        tags: None,
                    };
                    let path = format!("/projects/{}/ssh-keys", self.settings.project_id);
                    (Operation::CreateSshKey, Method::POST, path, input)
                }
            };
            let body =
                serde_json::to_vec(&body).map_err(|e| EquinixError::Client(e.to_string()))?;
            match self.attempt(op, method, &path, &[], Some(&body)).await {
                Outcome::Done(_, b) => return decode(op, &b),
                Outcome::Final(e) => return Err(e),
                Outcome::Transient {
                    cause, retry_after, ..
                } => {
                    self.back_off(op, attempts, cause, retry_after, deadline)
                        .await?;
                }
            }
        }
    }
}

/// Ours if it carries our witness, else the race is lost.
fn claim(
    op: Operation,
    reservation: &str,
    witness: &str,
    d: Device,
) -> Result<Device, EquinixError> {
    if d.tags.iter().any(|t| t == witness) {
        tracing::info!(device = %d.id, %reservation, "device creation had succeeded after all");
        Ok(d)
    } else {
        Err(EquinixError::RaceLost {
            op,
            reservation: reservation.to_string(),
            device: d.id,
        })
    }
}

/// IDs go into paths: refuse anything that could change the path.
fn check_id(op: Operation, id: &str) -> Result<(), EquinixError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(EquinixError::Client(format!("{op}: invalid ID {id:?}")))
    }
}

fn decode<T: DeserializeOwned>(op: Operation, body: &[u8]) -> Result<T, EquinixError> {
    serde_json::from_slice(body).map_err(|e| EquinixError::Decode {
        op,
        message: e.to_string(),
    })
}

fn error_message(body: &[u8]) -> String {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) if !e.message().is_empty() => e.message(),
        _ => String::from_utf8_lossy(&body[..body.len().min(200)])
            .trim()
            .to_string(),
    }
}

fn classify(
    op: Operation,
    status: StatusCode,
    body: actix_web::web::Bytes,
    retry_after: Option<Duration>,
    path: &str,
) -> Outcome {
    if status.is_success() {
        return Outcome::Done(status, body);
    }
    let message = error_message(&body);
    match status.as_u16() {
        401 => Outcome::Final(EquinixError::Unauthorized { op }),
        403 => Outcome::Final(EquinixError::Forbidden { op, message }),
        404 => Outcome::Final(EquinixError::NotFound {
            op,
            what: path.to_string(),
        }),
        422 => Outcome::Final(EquinixError::Unprocessable { op, message }),
        429 => Outcome::Transient {
            status: Some(429),
            cause: format!("HTTP 429 Too Many Requests: {message}"),
            retry_after,
        },
        s if s >= 500 => Outcome::Transient {
            status: Some(s),
            cause: format!("HTTP {s}: {message}"),
            retry_after,
        },
        s => Outcome::Final(EquinixError::Http {
            op,
            status: s,
            message,
        }),
    }
}

fn final_status(e: &EquinixError) -> String {
    match e {
        EquinixError::Unauthorized { .. } => "401".into(),
        EquinixError::Forbidden { .. } => "403".into(),
        EquinixError::NotFound { .. } => "404".into(),
        EquinixError::Unprocessable { .. } => "422".into(),
        EquinixError::Http { status, .. } => status.to_string(),
        _ => "error".into(),
    }
}

/// `Retry-After`: delay-seconds or an HTTP date.
fn retry_after(headers: &awc::http::header::HeaderMap) -> Option<Duration> {
    let v = headers.get("retry-after")?.to_str().ok()?.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs.min(3600)));
    }
    let when = httpdate::parse_http_date(v).ok()?;
    Some(
        when.duration_since(std::time::SystemTime::now())
            .unwrap_or_default()
            .min(Duration::from_secs(3600)),
    )
}

/// The actor. Start it with [`EquinixApi::start`].
pub struct EquinixClient {
    api: Option<Api>,
}

impl Actor for EquinixClient {
    type Context = Context<Self>;
}

impl EquinixClient {
    /// Runs `call` on the API with this actor taking no other message until
    /// it is done.
    fn atomic<T, F>(
        &mut self,
        call: impl FnOnce(Api, Instant) -> F,
    ) -> AtomicResponse<Self, Result<T, EquinixError>>
    where
        T: 'static,
        F: Future<Output = (Api, Result<T, EquinixError>)> + 'static,
    {
        let api = self
            .api
            .take()
            .expect("EquinixClient runs one call at a time");
        let deadline = Instant::now() + api.settings.call_deadline;
        AtomicResponse::new(Box::pin(call(api, deadline).into_actor(self).map(
            |(api, r), act, _| {
                act.api = Some(api);
                r
            },
        )))
    }
}

macro_rules! api_call {
    ($(#[$doc:meta])* $msg:ident { $($field:ident : $ty:ty),* } -> $out:ty, $method:ident($($arg:expr),*)) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $msg { $(pub $field: $ty),* }

        impl Message for $msg {
            type Result = Result<$out, EquinixError>;
        }

        impl Handler<$msg> for EquinixClient {
            type Result = AtomicResponse<Self, Result<$out, EquinixError>>;

            #[allow(unused_variables)]
            fn handle(&mut self, msg: $msg, _: &mut Context<Self>) -> Self::Result {
                self.atomic(move |mut api, deadline| async move {
                    let $msg { $($field),* } = msg;
                    let r = api.$method($($arg,)* deadline).await;
                    (api, r)
                })
            }
        }
    };
}

/// What a listing keeps of each item, as its page arrives (None: left
/// out).
pub type Keep<T, U> = Arc<dyn Fn(T) -> Option<U> + Send + Sync>;

/// Every item of a listing, as `keep` makes it.
macro_rules! kept_listing {
    ($(#[$doc:meta])* $msg:ident, $item:ty, $method:ident) => {
        $(#[$doc])*
        pub struct $msg<U> {
            pub keep: Keep<$item, U>,
        }

        impl<U: Send + 'static> Message for $msg<U> {
            type Result = Result<Vec<U>, EquinixError>;
        }

        impl<U: Send + 'static> Handler<$msg<U>> for EquinixClient {
            type Result = AtomicResponse<Self, Result<Vec<U>, EquinixError>>;

            fn handle(&mut self, msg: $msg<U>, _: &mut Context<Self>) -> Self::Result {
                self.atomic(move |mut api, deadline| async move {
                    let r = api.$method(&msg.keep, deadline).await;
                    (api, r)
                })
            }
        }
    };
}

kept_listing!(
    /// Every device of the project.
    ListDevices, Device, list_devices);
api_call!(GetDevice { id: String } -> Device, get_device(&id));
api_call!(
    /// Creates a device from a hardware reservation, at most once.
    CreateDevice { request: DeviceCreateRequest } -> Device, create_device(request));
api_call!(DeleteDevice { id: String } -> (), delete_device(&id));
api_call!(RebootDevice { id: String } -> (), reboot_device(&id));
kept_listing!(
    /// Every hardware reservation of the project.
    ListReservations, HardwareReservation, list_reservations);
api_call!(
    /// One reservation with its device included.
    GetReservation { id: String } -> HardwareReservation, get_reservation(&id));
api_call!(ListSshKeys {} -> Vec<SshKey>, list_ssh_keys());
api_call!(
    /// Creates or updates the project SSH key with this label.
    EnsureSshKey { label: String, key: String } -> SshKey, ensure_ssh_key(&label, &key));

/// A handle on the client actors: cheap to clone, async methods per call.
#[derive(Clone)]
pub struct EquinixApi {
    actors: Arc<[Addr<EquinixClient>]>,
    next: Arc<AtomicUsize>,
    metrics: ApiMetrics,
}

impl EquinixApi {
    /// Starts `settings.parallelism` client actors on the current arbiter.
    pub fn start(
        settings: ClientSettings,
        metrics: ApiMetrics,
    ) -> Result<EquinixApi, EquinixError> {
        let n = settings.parallelism.max(1);
        let interval = settings.api_interval * n;
        let actors: Vec<Addr<EquinixClient>> = (0..n)
            .map(|_| {
                let api = Api {
                    http: http_client(&settings),
                    settings: settings.clone(),
                    interval,
                    next_allowed: Instant::now(),
                    metrics: metrics.clone(),
                };
                EquinixClient { api: Some(api) }.start()
            })
            .collect();
        Ok(EquinixApi {
            actors: actors.into(),
            next: Arc::default(),
            metrics,
        })
    }

    pub fn metrics(&self) -> &ApiMetrics {
        &self.metrics
    }

    fn actor(&self) -> &Addr<EquinixClient> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.actors.len();
        &self.actors[i]
    }

    async fn send<M, T>(&self, msg: M) -> Result<T, EquinixError>
    where
        M: Message<Result = Result<T, EquinixError>> + Send + 'static,
        T: Send + 'static,
        EquinixClient: Handler<M>,
    {
        self.actor()
            .send(msg)
            .await
            .map_err(|e| EquinixError::Client(format!("client actor unavailable: {e}")))?
    }

    pub async fn list_devices(&self) -> Result<Vec<Device>, EquinixError> {
        self.list_devices_kept(Arc::new(Some)).await
    }

    /// Every device, each made what `keep` keeps as its page arrives.
    pub async fn list_devices_kept<U: Send + 'static>(
        &self,
        keep: Keep<Device, U>,
    ) -> Result<Vec<U>, EquinixError> {
        self.send(ListDevices { keep }).await
    }

    pub async fn get_device(&self, id: &str) -> Result<Device, EquinixError> {
        self.send(GetDevice { id: id.to_string() }).await
    }

    pub async fn create_device(
        &self,
        request: DeviceCreateRequest,
    ) -> Result<Device, EquinixError> {
        self.send(CreateDevice { request }).await
    }

    pub async fn delete_device(&self, id: &str) -> Result<(), EquinixError> {
        self.send(DeleteDevice { id: id.to_string() }).await
    }

    pub async fn reboot_device(&self, id: &str) -> Result<(), EquinixError> {
        self.send(RebootDevice { id: id.to_string() }).await
    }

    pub async fn list_reservations(&self) -> Result<Vec<HardwareReservation>, EquinixError> {
        self.list_reservations_kept(Arc::new(Some)).await
    }

    /// Every reservation, each made what `keep` keeps as its page arrives.
    pub async fn list_reservations_kept<U: Send + 'static>(
        &self,
        keep: Keep<HardwareReservation, U>,
    ) -> Result<Vec<U>, EquinixError> {
        self.send(ListReservations { keep }).await
    }

    pub async fn get_reservation(&self, id: &str) -> Result<HardwareReservation, EquinixError> {
        self.send(GetReservation { id: id.to_string() }).await
    }

    pub async fn list_ssh_keys(&self) -> Result<Vec<SshKey>, EquinixError> {
        self.send(ListSshKeys {}).await
    }

    pub async fn ensure_ssh_key(&self, label: &str, key: &str) -> Result<SshKey, EquinixError> {
        self.send(EnsureSshKey {
            label: label.to_string(),
            key: key.to_string(),
        })
        .await
    }
}

fn http_client(settings: &ClientSettings) -> awc::Client {
    awc::Client::builder()
        .timeout(settings.request_timeout)
        .connector(
            awc::Connector::new().timeout(settings.request_timeout.min(Duration::from_secs(10))),
        )
        .add_default_header((
            "User-Agent",
            concat!("shepherd/", env!("CARGO_PKG_VERSION")),
        ))
        .finish()
}
