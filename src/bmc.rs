//! What every BMC protocol shares (Redfish in [`crate::redfish`], IPMI in
//! [`crate::ipmi`]): the error an operator reads, naming the host, the BMC
//! and what it said.

use std::cell::RefCell;
use std::collections::HashMap;

use actix::{Actor, Addr, Context, Handler, Message};

use crate::config::BmcConfig;

/// The actors of one BMC protocol, by BMC URL: each made on first use,
/// and made again when its host's BMC settings change or it stopped.
pub struct ByUrl<A: Actor> {
    actors: RefCell<HashMap<String, (BmcConfig, Addr<A>)>>,
}

impl<A: Actor<Context = Context<A>>> Default for ByUrl<A> {
    fn default() -> Self {
        ByUrl {
            actors: RefCell::new(HashMap::new()),
        }
    }
}

impl<A: Actor<Context = Context<A>>> ByUrl<A> {
    /// The actor for `bmc`; `make` builds a new one (Err: what is wrong
    /// with the settings). `host` names the machine in errors.
    pub fn get(
        &self,
        host: &str,
        bmc: &BmcConfig,
        make: impl FnOnce() -> Result<A, BmcErrorKind>,
    ) -> Result<Addr<A>, BmcError> {
        let mut actors = self.actors.borrow_mut();
        if let Some((cfg, addr)) = actors.get(&bmc.url)
            && cfg == bmc
            && addr.connected()
        {
            return Ok(addr.clone());
        }
        let addr = make()
            .map_err(|kind| BmcError::of(host, bmc, kind))?
            .start();
        actors.insert(bmc.url.clone(), (bmc.clone(), addr.clone()));
        Ok(addr)
    }

    /// `msg` to `host`'s BMC's actor (made by `make` if needed); its answer.
    pub async fn ask<M, T>(
        &self,
        host: &str,
        bmc: &BmcConfig,
        make: impl FnOnce() -> Result<A, BmcErrorKind>,
        msg: M,
    ) -> Result<T, BmcError>
    where
        M: Message<Result = Result<T, BmcError>> + Send + 'static,
        T: Send + 'static,
        A: Handler<M>,
    {
        self.get(host, bmc, make)?.send(msg).await.map_err(|e| {
            BmcError::of(
                host,
                bmc,
                BmcErrorKind::Unreachable(format!("the BMC's client stopped: {e}")),
            )
        })?
    }
}

/// What went wrong talking to a BMC, for an operator: `host node-1: BMC
/// https://10.0.0.5: …`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("host {host}: BMC {bmc}: {kind}")]
pub struct BmcError {
    pub host: String,
    pub bmc: String,
    pub kind: BmcErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BmcErrorKind {
    #[error("credentials refused (HTTP 401){}", detail(.0))]
    Unauthorized(String),
    #[error("HTTP {status} for {what}{}", detail(.message))]
    Http {
        status: u16,
        what: String,
        message: String,
    },
    /// IPMI: no session with these credentials.
    #[error("credentials refused: {0}")]
    Credentials(String),
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// Redfish: `InsertMedia` refused with a user name and password for the
    /// image's URL (the caller may ask again without them).
    #[error("InsertMedia refused with a user name and password: {0}")]
    MediaAuthRefused(String),
    /// Redfish: 503, the BMC busy (an update in flight): ask again after
    /// this long (its `Retry-After`, else a default).
    #[error("busy (HTTP 503) for {what}, ask again in {}s{}", .retry_after.as_secs(), detail(.message))]
    Busy {
        what: String,
        retry_after: std::time::Duration,
        message: String,
    },
    #[error("unexpected answer: {0}")]
    Protocol(String),
    #[error("{0}")]
    Config(String),
}

impl BmcError {
    pub fn of(host: &str, bmc: &BmcConfig, kind: BmcErrorKind) -> BmcError {
        BmcError {
            host: host.to_string(),
            bmc: bmc.url.clone(),
            kind,
        }
    }
}

fn detail(m: &str) -> String {
    if m.is_empty() {
        String::new()
    } else {
        format!(": {m}")
    }
}

impl BmcErrorKind {
    /// A failure that may pass by itself (the BMC is busy or unreachable).
    pub fn is_transient(&self) -> bool {
        match self {
            BmcErrorKind::Unreachable(_) | BmcErrorKind::Busy { .. } => true,
            BmcErrorKind::Http { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }
}
