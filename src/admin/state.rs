//! What the admin routes read from ([`Admin`], in the app data) and who a
//! request acts for ([`Operator`], with the key its forms are signed by).

use actix::Recipient;
use prometheus_client::registry::Registry;

use super::text::{hex, unhex};
use crate::bmdb::Bmdb;
use crate::secret::Secret;
use crate::status::GetSupervisorStatus;

/// What the admin routes read from.
#[derive(Clone)]
pub struct Admin {
    pub bmdb: Bmdb,
    pub supervisor: Option<Recipient<GetSupervisorStatus>>,
    /// The process's metric series (Equinix API requests, heartbeats);
    /// `/metrics` adds the fleet's, read from the BMDB at each scrape.
    pub registry: std::sync::Arc<Registry>,
    /// An agent silent this long counts as silent (the Recoverer's
    /// `heartbeat_stale_after`).
    pub heartbeat_stale_after: std::time::Duration,
    /// Bearer tokens by name (`admin.token` is `admin`); none: no auth
    /// (loopback only), actions by `anonymous`.
    pub tokens: Vec<(String, Secret)>,
    /// Signs the pages' forms.
    pub csrf: std::sync::Arc<CsrfKey>,
    /// The Equinix API's request budget, when this process calls it.
    pub equinix: Option<RequestBudget>,
    /// How the Recoverer judges silence and brakes (the brake's state is
    /// shown from it); None: no brake shown.
    pub judge: Option<crate::bmdb::brake::Judge>,
    /// How long an operator's release of the brake lasts by default.
    pub brake_release: std::time::Duration,
    /// Runs a loop now: the `rollouts` loop when a rollout was created or
    /// canceled (moves it at once).
    pub loops: Option<Recipient<crate::control::NudgeLoop>>,
    /// The images this process serves, when it does.
    pub images: Option<crate::images::ImageCatalog>,
    /// How long a route waits for the BMDB before it answers 503
    /// (`admin.database_timeout`).
    pub database_timeout: std::time::Duration,
    /// What should be below machines' operating systems (`[[baselines]]`):
    /// the drift the pages, the API and `/metrics` show.
    pub baselines: std::sync::Arc<crate::baselines::Baselines>,
    /// The configured plans' slugs (`metal.plans`), in order: the fleet's
    /// plan filter offers them.
    pub plans: Vec<String>,
}

impl Admin {
    /// Admin routes over `bmdb`, with no supervisor, metrics or tokens.
    pub fn new(bmdb: Bmdb) -> Self {
        Admin {
            bmdb,
            supervisor: None,
            registry: Default::default(),
            heartbeat_stale_after: crate::bmdb::selectors::RecoveryThresholds::default()
                .heartbeat_stale_after,
            tokens: Vec::new(),
            csrf: std::sync::Arc::new(CsrfKey::random()),
            equinix: None,
            judge: None,
            brake_release: std::time::Duration::from_secs(3600),
            loops: None,
            images: None,
            database_timeout: std::time::Duration::from_secs(1),
            baselines: Default::default(),
            plans: Vec::new(),
        }
    }
}

/// What the Equinix client may spend and has spent.
#[derive(Clone, Debug)]
pub struct RequestBudget {
    pub metrics: crate::equinix::ApiMetrics,
    /// One request per `interval` per slot…
    pub interval: std::time::Duration,
    /// …with this many slots.
    pub parallelism: u32,
}

impl RequestBudget {
    /// Requests an hour the client can make at most.
    pub fn per_hour(&self) -> u64 {
        let per_slot = 3600.0 / self.interval.as_secs_f64().max(0.001);
        (per_slot * f64::from(self.parallelism)) as u64
    }
}

/// The operator a request acts for: a token's name, or `anonymous`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator(pub String);

/// The key CSRF tokens are made with: random, this process's own.
pub struct CsrfKey(ring::hmac::Key);

impl CsrfKey {
    pub fn random() -> Self {
        let bytes: [u8; 32] = rand::random();
        CsrfKey(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &bytes))
    }

    fn message(operator: &str, machine: &str) -> Vec<u8> {
        [operator.as_bytes(), b"\0", machine.as_bytes()].concat()
    }

    /// The token a form for `machine`, shown to `operator`, carries.
    pub fn token(&self, operator: &Operator, machine: &str) -> String {
        let tag = ring::hmac::sign(&self.0, &Self::message(&operator.0, machine));
        hex(tag.as_ref())
    }

    pub fn verify(&self, operator: &Operator, machine: &str, token: &str) -> bool {
        let Some(tag) = unhex(token) else {
            return false;
        };
        ring::hmac::verify(&self.0, &Self::message(&operator.0, machine), &tag).is_ok()
    }
}

impl std::fmt::Debug for CsrfKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CsrfKey(…)")
    }
}
