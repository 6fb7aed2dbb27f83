//! Redfish, for owned hardware: the BMC of an inventory host reboots it and
//! reports its power state (and, for the machine page, what it is made of).
//!
//! - [`client`]: the `BmcClient` actor, one per BMC (one request in flight
//!   each, a global cap over all), sessions with a basic-auth fallback.
//! - [`Bmcs`]: the actors by BMC address, made on first use and replaced
//!   when a host's BMC settings change (the inventory file is re-read every
//!   round).
//! - [`reboot`]: picks the reset the system advertises and sends it.
//! - [`media`]: booting a system from a URL through virtual media (insert,
//!   one-time `Cd` override, power), and ending it (eject, override
//!   cleared): [`boot_from_media`], [`end_media_boot`].
//! - [`firmware`]: what is below the system, read; [`servicing`]: changed
//!   (a firmware update followed through its task, BIOS settings, RAID
//!   volumes).
//!
//! A small client on awc rather than a Redfish crate: shepherd needs the
//! service root, sessions, one system and its reset action, and the
//! maintained crates (`nv-redfish`, `libredfish`, `redfish`) bring a second
//! HTTP stack (reqwest) and, for `nv-redfish`, schema code generated from
//! the whole CSDL; none runs on actix's client.

/// A [`client::BmcClient`] message's handler: its sequence run atomically
/// on the BMC's connection (one request in flight, nothing else between
/// its steps).
macro_rules! sequence {
    ($msg:ty => $out:ty, |$c:ident, $m:ident| $body:expr) => {
        impl Handler<$msg> for BmcClient {
            type Result = AtomicResponse<Self, Result<$out, BmcError>>;

            fn handle(&mut self, $m: $msg, _: &mut Context<Self>) -> Self::Result {
                self.atomic(|mut $c| async move {
                    let r = async { $body }.await;
                    ($c, r)
                })
            }
        }
    };
}

pub mod client;
pub mod firmware;
mod http;
pub mod media;
pub mod servicing;
pub mod system;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;

pub use client::{BmcClient, BmcError, BmcErrorKind, GetSystem, Reset};
pub use media::{
    BootFromDisk, BootFromMedia, BootFromNetwork, ClearBootOverride, EndMediaBoot, GetVirtualCd,
    MediaBoot, VirtualCd,
};
pub use system::SystemInfo;

use crate::bmc::ByUrl;
use crate::bmdb::ProviderStatus;
use crate::config::{BmcConfig, RedfishConfig};

/// The BMC actors, by BMC URL. Not `Send`: lives with the provider on the
/// system's arbiter.
pub struct Bmcs {
    limit: Arc<tokio::sync::Semaphore>,
    timeout: Duration,
    /// How long a system may take to come on after a reset.
    pub power_timeout: Duration,
    clients: ByUrl<BmcClient>,
}

impl Bmcs {
    pub fn new(cfg: &RedfishConfig) -> Bmcs {
        Bmcs {
            limit: Arc::new(tokio::sync::Semaphore::new(cfg.max_concurrent as usize)),
            timeout: cfg.timeout,
            power_timeout: cfg.power_timeout,
            clients: ByUrl::default(),
        }
    }

    /// The actor for `bmc`, made now if there is none or its settings
    /// changed. `host` names the machine in errors.
    pub fn get(&self, host: &str, bmc: &BmcConfig) -> Result<Addr<BmcClient>, BmcError> {
        self.clients.get(host, bmc, || self.client(host, bmc))
    }

    fn client(&self, host: &str, bmc: &BmcConfig) -> Result<BmcClient, crate::bmc::BmcErrorKind> {
        BmcClient::new(host, bmc.clone(), self.limit.clone(), self.timeout)
            .map_err(|e| crate::bmc::BmcErrorKind::Config(e.to_string()))
    }
}

/// One host's Redfish BMC, handed out for servicing: its actor (which
/// every caller shares: one BMC, one queue), its URL and its system.
#[derive(Clone)]
pub struct RedfishBmc {
    pub host: String,
    pub config: BmcConfig,
    pub client: Addr<BmcClient>,
}

impl RedfishBmc {
    /// `msg` to this BMC's actor; its answer.
    pub async fn ask<M, T>(&self, msg: M) -> Result<T, BmcError>
    where
        M: actix::Message<Result = Result<T, BmcError>> + Send + 'static,
        T: Send + 'static,
        BmcClient: actix::Handler<M>,
    {
        self.client.send(msg).await.map_err(|e| {
            BmcError::of(
                &self.host,
                &self.config,
                crate::bmc::BmcErrorKind::Unreachable(format!("the BMC's client stopped: {e}")),
            )
        })?
    }

    /// The system this host is (None: the BMC's only one).
    pub fn system(&self) -> Option<String> {
        self.config.system.clone()
    }
}

/// `msg` to the actor of `host`'s BMC; its answer.
pub async fn ask<M, T>(bmcs: &Bmcs, host: &str, bmc: &BmcConfig, msg: M) -> Result<T, BmcError>
where
    M: actix::Message<Result = Result<T, BmcError>> + Send + 'static,
    T: Send + 'static,
    BmcClient: actix::Handler<M>,
{
    bmcs.clients
        .ask(host, bmc, || bmcs.client(host, bmc), msg)
        .await
}

/// The system's firmware components and BIOS settings (`firmware`).
pub async fn firmware(
    bmcs: &Bmcs,
    host: &str,
    bmc: &BmcConfig,
) -> Result<crate::bmdb::firmware::Reading, BmcError> {
    let msg = firmware::GetFirmware {
        system: bmc.system.clone(),
    };
    ask(bmcs, host, bmc, msg).await
}

/// The system's state and facts (its Secure Boot read too).
pub async fn system(bmcs: &Bmcs, host: &str, bmc: &BmcConfig) -> Result<SystemInfo, BmcError> {
    let system = bmc.system.clone();
    let msg = GetSystem {
        system,
        secure_boot: true,
    };
    ask(bmcs, host, bmc, msg).await
}

/// What a Redfish power state means to the Recoverer: `On` is running,
/// `Off` stopped, anything between is neither.
pub fn provider_status(power_state: &str) -> ProviderStatus {
    match power_state {
        "On" => ProviderStatus::Running,
        "Off" => ProviderStatus::Stopped,
        _ => ProviderStatus::Unknown,
    }
}

/// The resets that restart a system, best first.
const RESTARTS: [&str; 3] = ["GracefulRestart", "ForceRestart", "PowerCycle"];

/// How long an Off-then-On reboot waits for the system to be off.
const OFF_TIMEOUT: Duration = Duration::from_secs(120);

/// Reboots the system: the best restart it advertises (`GracefulRestart`,
/// then `ForceRestart`, then `PowerCycle`), else off then on; a system that
/// is off is switched on. Returns once the BMC accepted the reset: the
/// caller watches the power state go down and come back.
pub async fn reboot(bmcs: &Bmcs, host: &str, bmc: &BmcConfig) -> Result<String, BmcError> {
    let info = system(bmcs, host, bmc).await?;
    let target = info
        .reset_target
        .clone()
        .unwrap_or_else(|| format!("{}/Actions/ComputerSystem.Reset", info.path));
    let reset = |reset_type: &str| {
        let msg = Reset {
            system: bmc.system.clone(),
            target: Some(target.clone()),
            reset_type: reset_type.to_string(),
        };
        ask(bmcs, host, bmc, msg)
    };
    let offers = |t: &str| info.reset_types.is_empty() || info.reset_types.iter().any(|x| x == t);
    if info.power() == "Off" {
        let on = if offers("On") { "On" } else { "ForceOn" };
        reset(on).await?;
        return Ok(on.to_string());
    }
    if let Some(restart) = RESTARTS.iter().find(|t| offers(t)) {
        match reset(restart).await {
            Ok(()) => return Ok(restart.to_string()),
            // The system did not say what it takes and refused this one:
            // try the next way.
            Err(BmcError {
                kind: BmcErrorKind::Http { status: 400, .. },
                ..
            }) if info.reset_types.is_empty() => {}
            Err(e) => return Err(e),
        }
    }
    let off = ["ForceOff", "GracefulShutdown"]
        .into_iter()
        .find(|t| offers(t))
        .ok_or_else(|| {
            BmcError::of(
                host,
                bmc,
                BmcErrorKind::Config(format!(
                    "the system offers no way to restart (reset types {:?})",
                    info.reset_types
                )),
            )
        })?;
    reset(off).await?;
    let started = std::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = system(bmcs, host, bmc).await;
        if matches!(&now, Ok(s) if s.power() == "Off") {
            break;
        }
        if started.elapsed() > OFF_TIMEOUT {
            return Err(BmcError::of(
                host,
                bmc,
                BmcErrorKind::Protocol(format!(
                    "{off} accepted but the system was not off after {OFF_TIMEOUT:?}"
                )),
            ));
        }
    }
    let on = if offers("On") { "On" } else { "ForceOn" };
    reset(on).await?;
    Ok(format!("{off}, then {on}"))
}

/// Switches the system on, or off (hard: `ForceOff` where offered), and
/// waits until it says so (within `timeout`). Ok: the reset used.
pub async fn set_power(
    bmcs: &Bmcs,
    host: &str,
    bmc: &BmcConfig,
    on: bool,
    timeout: Duration,
) -> Result<String, BmcError> {
    let info = system(bmcs, host, bmc).await?;
    let want = if on { "On" } else { "Off" };
    if info.power() == want {
        return Ok(format!("already {}", want.to_lowercase()));
    }
    let target = info
        .reset_target
        .clone()
        .unwrap_or_else(|| format!("{}/Actions/ComputerSystem.Reset", info.path));
    let offers = |t: &str| info.reset_types.is_empty() || info.reset_types.iter().any(|x| x == t);
    let choices: &[&str] = if on {
        &["On", "ForceOn"]
    } else {
        &["ForceOff", "GracefulShutdown"]
    };
    let reset_type = choices.iter().find(|t| offers(t)).ok_or_else(|| {
        BmcError::of(
            host,
            bmc,
            BmcErrorKind::Config(format!(
                "the system offers no way to power {} (reset types {:?})",
                want.to_lowercase(),
                info.reset_types
            )),
        )
    })?;
    let msg = Reset {
        system: bmc.system.clone(),
        target: Some(target),
        reset_type: reset_type.to_string(),
    };
    ask(bmcs, host, bmc, msg).await?;
    let started = std::time::Instant::now();
    loop {
        if matches!(system(bmcs, host, bmc).await, Ok(s) if s.power() == want) {
            return Ok(reset_type.to_string());
        }
        if started.elapsed() > timeout {
            return Err(BmcError::of(
                host,
                bmc,
                BmcErrorKind::Protocol(format!(
                    "{reset_type} accepted but the system was not {} after {timeout:?}",
                    want.to_lowercase()
                )),
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Boots the system from `image_url` through its virtual CD (see
/// [`media`]); Ok once it is on.
pub async fn boot_from_media(
    bmcs: &Bmcs,
    host: &str,
    bmc: &BmcConfig,
    image_url: &str,
) -> Result<MediaBoot, BmcError> {
    boot_from_media_with(bmcs, host, bmc, image_url, None).await
}

/// [`boot_from_media`], the BMC given `credentials` (user, password) for
/// the image's URL.
pub async fn boot_from_media_with(
    bmcs: &Bmcs,
    host: &str,
    bmc: &BmcConfig,
    image_url: &str,
    credentials: Option<(String, String)>,
) -> Result<MediaBoot, BmcError> {
    let msg = BootFromMedia {
        system: bmc.system.clone(),
        image_url: image_url.to_string(),
        power_timeout: bmcs.power_timeout,
        credentials,
    };
    ask(bmcs, host, bmc, msg).await
}

/// Ejects the system's virtual CD (`eject`), clears its boot override and
/// restarts it from its disk, Secure Boot set as `secure_boot` asks (else
/// as the host's configuration does); Ok(the reset used).
pub async fn boot_from_disk(
    bmcs: &Bmcs,
    host: &str,
    bmc: &BmcConfig,
    eject: bool,
    secure_boot: Option<bool>,
) -> Result<String, BmcError> {
    let msg = BootFromDisk {
        system: bmc.system.clone(),
        power_timeout: bmcs.power_timeout,
        eject,
        secure_boot,
    };
    ask(bmcs, host, bmc, msg).await
}

/// Boots the system from the network once (a `Pxe` override, then the
/// reset); Ok(the reset used) once it is on.
pub async fn boot_from_network(
    bmcs: &Bmcs,
    host: &str,
    bmc: &BmcConfig,
) -> Result<String, BmcError> {
    let msg = BootFromNetwork {
        system: bmc.system.clone(),
        power_timeout: bmcs.power_timeout,
    };
    ask(bmcs, host, bmc, msg).await
}

/// Clears the system's boot override.
pub async fn clear_boot_override(bmcs: &Bmcs, host: &str, bmc: &BmcConfig) -> Result<(), BmcError> {
    let system = bmc.system.clone();
    ask(bmcs, host, bmc, ClearBootOverride { system }).await
}

/// Ejects the system's virtual CD and clears its boot override; Ok(true)
/// if media was inserted.
pub async fn end_media_boot(bmcs: &Bmcs, host: &str, bmc: &BmcConfig) -> Result<bool, BmcError> {
    let system = bmc.system.clone();
    ask(bmcs, host, bmc, EndMediaBoot { system }).await
}

/// What the system's virtual CD holds.
pub async fn virtual_cd(bmcs: &Bmcs, host: &str, bmc: &BmcConfig) -> Result<VirtualCd, BmcError> {
    let system = bmc.system.clone();
    ask(bmcs, host, bmc, GetVirtualCd { system }).await
}
