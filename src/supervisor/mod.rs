//! The Supervisor: owns the BMDB pool, the session, the provider (and its
//! EquinixClient), the Provisioner and the Initializer's mailbox.
//!
//! - It opens a session and hands it to its children; when the session
//!   dies it takes it from them, opens a new one (with backoff) and hands
//!   that over.
//! - A child that stops is restarted, with backoff.
//! - On SIGINT or SIGTERM it stops leasing and provisioning, lets running
//!   takeovers finish for up to `supervisor.drain_timeout`, then closes the
//!   session (which cancels what is left, in the history) and stops.

use std::rc::Rc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::bmdb::{Bmdb, BmdbSession, CloseSession, GetSession, SessionEnded, Subscribe};
use crate::config::{Config, ProviderKind};
use crate::control::{
    GetRoundStatus, GetStatus, Round, RoundRunner, RoundStopped, SetSession, StopLeasing,
    StopRounds, WorkMailbox,
};
use crate::enroller::{BootMetrics, BootUrl, BootWaits, Enroller};
use crate::equinix::{ApiMetrics, ClientSettings, EquinixApi};
use crate::initializer::{Initializer, TakeoverSettings};
use crate::provider::SharedProvider;
use crate::provider::equinix::Equinix;
use crate::provider::inventory::Inventory;
use crate::provisioner::Provisioner;
use crate::recoverer::{AgentWaits, BrakeWatch, RebootWait, Recoverer};
use crate::rollouts::RolloutDriver;
use crate::status::{GetSupervisorStatus, SupervisorStatus};
use crate::updater::Updater;

/// A new session is tried at most this far apart while the database is
/// away (or `restart_backoff`, if longer): an attempt costs one connection
/// attempt, and shepherd should be back within seconds of the database.
const MAX_SESSION_RETRY: Duration = Duration::from_secs(2);

/// Everything built from the configuration before the actors start.
pub struct Parts {
    pub bmdb: Bmdb,
    pub provider: SharedProvider,
    pub api: Option<EquinixApi>,
    /// None when no endpoint for agents is set: no takeovers.
    pub takeover: Option<Rc<TakeoverSettings>>,
    /// The endpoint this process serves agents at (the callback is on and
    /// `bmaas.endpoint` set): recorded with every session heartbeat.
    pub serves: Option<String>,
    /// The agent callback's certificates, when it is enabled.
    pub callback: Option<crate::callback::ServerIdentity>,
}

/// Where agents fetch served images: `installations.images_endpoint`, else
/// the agents' callback host with the image server's port, else the image
/// server's own address.
pub fn images_endpoint(cfg: &Config, callback: Option<&str>) -> String {
    if let Some(e) = &cfg.installations.images_endpoint {
        return e.clone();
    }
    let port = cfg.installations.images_listen.port();
    match callback.and_then(crate::config::endpoint_host) {
        Some(h) if h.contains(':') => format!("[{h}]:{port}"),
        Some(h) => format!("{h}:{port}"),
        None => cfg.installations.images_listen.to_string(),
    }
}

/// The agent callback's identity: the fleet's CA, shared by every shepherd
/// on this BMDB (`bmdb::callback`; on a first start seeded from the CA a
/// shepherd kept beside its SSH key, or in `bmaas.tls_dir`, so agents that
/// trust it keep working, else generated), and a server certificate it
/// issues for this process's names.
async fn callback_identity(
    cfg: &Config,
    endpoint: Option<&str>,
    bmdb: &Bmdb,
) -> anyhow::Result<crate::callback::ServerIdentity> {
    let (dir, dir_key) = match &cfg.bmaas.tls_dir {
        Some(d) => (d.clone(), "bmaas.tls_dir"),
        None => (
            cfg.ssh
                .key_file
                .parent()
                .map(|p| p.to_path_buf())
                .unwrap_or_default(),
            "ssh.key_file",
        ),
    };
    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into()];
    if let Some(host) = endpoint.and_then(crate::config::endpoint_host) {
        names.insert(0, host.to_string());
    }
    let ip = cfg.bmaas.listen.ip();
    if !ip.is_unspecified() && !names.contains(&ip.to_string()) {
        names.push(ip.to_string());
    }
    // The image server presents the same certificate.
    if cfg.installations.images_dir.is_some() {
        let images = images_endpoint(cfg, endpoint);
        let boots = cfg.installations.boot_endpoint.as_deref();
        for e in std::iter::once(images.as_str()).chain(boots) {
            if let Some(h) = crate::config::endpoint_host(e) {
                if !names.iter().any(|n| n == h) {
                    names.push(h.to_string());
                }
            }
        }
        let ip = cfg.installations.images_listen.ip();
        if !ip.is_unspecified() && !names.contains(&ip.to_string()) {
            names.push(ip.to_string());
        }
    }
    let files = crate::callback::CertFiles::in_dir(&dir);
    let local = crate::callback::tls::local_ca(&files)
        .map_err(|e| crate::ConfigError::key(dir_key, e.to_string()))?;
    let ca = bmdb
        .transact(async |tx| {
            crate::bmdb::callback::ca(tx, || match &local {
                Some((certificate, private_key)) => Ok(crate::bmdb::callback::CallbackCa {
                    certificate: certificate.clone(),
                    private_key: private_key.clone(),
                }),
                None => crate::callback::tls::new_ca()
                    .map(
                        |(certificate, private_key)| crate::bmdb::callback::CallbackCa {
                            certificate,
                            private_key,
                        },
                    )
                    .map_err(|e| e.to_string()),
            })
            .await
        })
        .await?;
    match &local {
        Some((d, _)) if *d != ca.certificate => tracing::warn!(
            path = %files.ca_cert.display(),
            "this callback CA is not the fleet's (the one in the BMDB): agents taken over with it will not trust this shepherd; they fall silent and are restarted over SSH with the fleet's"
        ),
        Some(_) => tracing::debug!("the callback CA beside the SSH key is the fleet's"),
        None => {}
    }
    Ok(crate::callback::ServerIdentity::issued_by(
        &ca.certificate,
        &ca.private_key,
        &names,
    )?)
}

impl Parts {
    /// Opens the BMDB (migrating it), builds the provider (for Equinix:
    /// ensures shepherd's SSH key in the project) and the takeover settings.
    pub async fn build(cfg: &Config) -> anyhow::Result<Parts> {
        let endpoint = match (&cfg.bmaas.endpoint, &cfg.initializer.agent_endpoint) {
            (Some(e), _) => Some(e.clone()),
            (None, Some(e)) => {
                tracing::warn!(
                    "initializer.agent_endpoint is the older name of bmaas.endpoint; using it"
                );
                Some(e.clone())
            }
            (None, None) => None,
        };
        let bmdb = Bmdb::open(&cfg.bmdb).await?;
        let callback = if cfg.bmaas.enabled {
            Some(callback_identity(cfg, endpoint.as_deref(), &bmdb).await?)
        } else {
            None
        };
        let serves = endpoint.clone().filter(|_| callback.is_some());
        let takeover = if let Some(endpoint) = endpoint {
            let t = TakeoverSettings::from_config(
                cfg,
                endpoint,
                callback.as_ref().map(|c| c.ca_der.clone()),
            )?;
            tracing::info!(
                public_key = %t.identity.public_key(),
                "shepherd's SSH public key: machines must accept it for {}",
                cfg.ssh.user
            );
            Some(Rc::new(t))
        } else {
            tracing::warn!(
                "bmaas.endpoint is not set: the Initializer is off, no machine will be taken over"
            );
            None
        };
        let (provider, api): (SharedProvider, Option<EquinixApi>) = match cfg.provider.kind {
            ProviderKind::Static => (
                Rc::new(Inventory::new(&cfg.provider.inventory, &cfg.redfish)),
                None,
            ),
            ProviderKind::Equinix => {
                let api = EquinixApi::start(
                    ClientSettings::from_config(&cfg.equinix)?,
                    ApiMetrics::default(),
                )?;
                let identity = crate::ssh::SshIdentity::load_or_generate(&cfg.ssh.key_file)
                    .map_err(|e| crate::ConfigError::key("ssh.key_file", e.to_string()))?;
                let p = Equinix::start(
                    api.clone(),
                    cfg.provider.equinix.clone(),
                    identity.public_key(),
                )
                .await
                .map_err(|e| -> anyhow::Error {
                    // Refusals at start are configuration problems: exit 2,
                    // naming the key to fix.
                    use crate::equinix::EquinixError as E;
                    match &e {
                        E::Unauthorized { .. } | E::Forbidden { .. } => {
                            crate::ConfigError::key("equinix.api_key", e.to_string()).into()
                        }
                        E::NotFound { .. } => crate::ConfigError::key(
                            "equinix.project_id",
                            format!("{e} (is the project ID right, and does the key reach it?)"),
                        )
                        .into(),
                        _ => e.into(),
                    }
                })?;
                // One device listing per round serves the Provisioner and
                // the Updater alike.
                let ttl = cfg.provisioner.interval.min(cfg.updater.interval) * 9 / 10;
                (Rc::new(p.with_listing_ttl(ttl)), Some(api))
            }
        };
        Ok(Parts {
            bmdb,
            provider,
            api,
            takeover,
            serves,
            callback,
        })
    }
}

pub struct Supervisor {
    cfg: Config,
    bmdb: Bmdb,
    provider: SharedProvider,
    takeover: Option<Rc<TakeoverSettings>>,
    serves: Option<String>,
    endpoint: Option<String>,
    recovery_metrics: crate::recoverer::RecoveryMetrics,
    brake_watch: Option<Addr<RoundRunner<BrakeWatch>>>,
    session: Option<Addr<BmdbSession>>,
    provisioner: Option<Addr<RoundRunner<Provisioner>>>,
    initializer: Option<Addr<WorkMailbox<Initializer>>>,
    enroller: Option<Addr<WorkMailbox<Enroller>>>,
    /// Where BMCs fetch a boot's image: set when the image server serves
    /// the boot image (no Enroller without it).
    boot_url: Option<BootUrl>,
    boot_metrics: BootMetrics,
    recoverer: Option<Addr<WorkMailbox<Recoverer>>>,
    updater: Option<Addr<RoundRunner<Updater>>>,
    rollouts: Option<Addr<RoundRunner<RolloutDriver>>>,
    session_backoff: Duration,
    sessions_opened: u64,
    sessions_lost: u64,
    shutting_down: bool,
}

/// Drain and stop. Resolves when the session is closed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown;

impl Supervisor {
    pub fn new(
        cfg: Config,
        parts: Parts,
        recovery_metrics: crate::recoverer::RecoveryMetrics,
    ) -> Supervisor {
        Supervisor {
            cfg,
            bmdb: parts.bmdb,
            provider: parts.provider,
            endpoint: parts.takeover.as_ref().map(|t| t.endpoint.clone()),
            takeover: parts.takeover,
            serves: parts.serves,
            recovery_metrics,
            brake_watch: None,
            session: None,
            provisioner: None,
            initializer: None,
            enroller: None,
            boot_url: None,
            boot_metrics: BootMetrics::default(),
            recoverer: None,
            updater: None,
            rollouts: None,
            session_backoff: Duration::ZERO,
            sessions_opened: 0,
            sessions_lost: 0,
            shutting_down: false,
        }
    }

    /// Boots machines through their BMC, fetching boot images at
    /// `boot_url` (the image server's per-boot copies), counted in
    /// `metrics`.
    pub fn with_bmc_boots(mut self, boot_url: BootUrl, metrics: BootMetrics) -> Self {
        self.boot_url = Some(boot_url);
        self.boot_metrics = metrics;
        self
    }

    fn start_enroller(&mut self) {
        if !self.cfg.enroller.enabled {
            return;
        }
        let Some(boot_url) = self.boot_url.clone() else {
            if self.provider.kind() == crate::bmdb::Provider::None {
                tracing::info!(
                    "no boot image is served (installations.images_dir, installations.boot_image): machines listed with boot = \"virtual-media\" are not booted"
                );
            }
            return;
        };
        let e = &self.cfg.enroller;
        let enroller = Enroller::new(
            self.provider.clone(),
            boot_url,
            e.backoff(),
            BootWaits {
                credential_ttl: e.credential_ttl,
                callback_timeout: e.callback_timeout,
                poll: Duration::from_millis(500),
            },
            self.boot_metrics.clone(),
        );
        self.enroller =
            Some(WorkMailbox::new(enroller, e.parallelism as usize, e.poll_interval).start());
    }

    fn start_children(&mut self, ctx: &mut Context<Self>) {
        self.start_provisioner(ctx);
        self.start_enroller();
        if let Some(takeover) = self.takeover.clone() {
            let initializer = Initializer::new(
                self.provider.kind(),
                takeover,
                self.cfg.initializer.backoff(),
                Some(crate::provisioner::address_lookup(self.provider.clone())),
            );
            let mailbox = WorkMailbox::new(
                initializer,
                self.cfg.initializer.parallelism as usize,
                self.cfg.initializer.poll_interval,
            )
            .start();
            self.initializer = Some(mailbox);
        }
        let r = &self.cfg.recoverer;
        if r.enabled {
            let judge = self.judge();
            let recoverer = Recoverer::new(
                self.provider.clone(),
                judge.clone(),
                r.backoff(),
                RebootWait {
                    timeout: r.reboot_timeout,
                    poll: r.reboot_poll,
                    settle: r.reboot_settle,
                },
                AgentWaits {
                    restart: r.agent_restart_wait,
                    after_reboot: r.agent_return_wait,
                },
                self.takeover.clone(),
                self.recovery_metrics.clone(),
            )
            .rehoming_after(r.rehome_after);
            self.brake_watch =
                Some(RoundRunner::new(BrakeWatch::new(judge, r.poll_interval)).start());
            self.recoverer =
                Some(WorkMailbox::new(recoverer, r.parallelism as usize, r.poll_interval).start());
        }
        if self.cfg.updater.enabled {
            self.updater = Some(
                RoundRunner::new(Updater::new(
                    self.provider.clone(),
                    self.cfg.updater.interval,
                ))
                .start(),
            );
        }
        self.rollout_driver();
    }

    /// The rollout driver (started with the children, or now), for the
    /// admin routes to nudge.
    pub fn rollout_driver(&mut self) -> Addr<RoundRunner<RolloutDriver>> {
        self.rollouts
            .get_or_insert_with(|| {
                RoundRunner::new(RolloutDriver::new(self.cfg.installations.rollout_interval))
                    .start()
            })
            .clone()
    }

    /// How this shepherd judges silence: the provider, the thresholds,
    /// its own endpoint (for agents whose endpoint was not recorded), the
    /// brake.
    pub fn judge(&self) -> crate::bmdb::brake::Judge {
        judge(&self.cfg, self.provider.kind(), self.endpoint.clone())
    }

    /// Hands `session` (or None) to every part that works under one.
    fn hand_over(&self, session: Option<crate::bmdb::Session>) {
        if let Some(b) = &self.brake_watch {
            b.do_send(SetSession(session.clone()));
        }
        if let Some(p) = &self.provisioner {
            p.do_send(SetSession(session.clone()));
        }
        if let Some(i) = &self.initializer {
            i.do_send(SetSession(session.clone()));
        }
        if let Some(e) = &self.enroller {
            e.do_send(SetSession(session.clone()));
        }
        if let Some(r) = &self.recoverer {
            r.do_send(SetSession(session.clone()));
        }
        if let Some(d) = &self.rollouts {
            d.do_send(SetSession(session.clone()));
        }
        if let Some(u) = &self.updater {
            u.do_send(SetSession(session));
        }
    }

    fn start_provisioner(&mut self, ctx: &mut Context<Self>) {
        let p = RoundRunner::new(Provisioner::new(
            self.provider.clone(),
            self.cfg.provisioner.clone(),
        ))
        .supervised_by(ctx.address().recipient())
        .start();
        self.provisioner = Some(p);
    }

    fn open_session(&mut self, ctx: &mut Context<Self>) {
        if self.shutting_down {
            return;
        }
        let bmdb = self.bmdb.clone();
        let me = ctx.address();
        let serves = self.serves.clone();
        ctx.spawn(
            async move {
                let addr = BmdbSession::open_serving(&bmdb, "shepherd", serves).await?;
                addr.send(Subscribe(me.recipient())).await.map_err(|e| crate::BmdbError::Invalid(e.to_string()))?;
                let session = addr.send(GetSession).await.map_err(|e| crate::BmdbError::Invalid(e.to_string()))?;
                Ok::<_, crate::BmdbError>((addr, session))
            }
            .into_actor(self)
            .map(|r, act, ctx| match r {
                Ok((addr, session)) => {
                    tracing::info!(session_id = %session.id(), "session open; provisioning and taking over");
                    act.session_backoff = Duration::ZERO;
                    act.sessions_opened += 1;
                    act.session = Some(addr);
                    act.hand_over(Some(session));
                }
                Err(e) => {
                    act.session_backoff = next_backoff(act.session_backoff, act.cfg.supervisor.restart_backoff);
                    tracing::warn!(error = %e, retry_in = %humantime::format_duration(act.session_backoff), "could not open a session");
                    ctx.run_later(act.session_backoff, |act, ctx| act.open_session(ctx));
                }
            }),
        );
    }
}

/// How a shepherd with this configuration judges silence.
pub fn judge(
    cfg: &Config,
    provider: crate::bmdb::Provider,
    endpoint: Option<String>,
) -> crate::bmdb::brake::Judge {
    crate::bmdb::brake::Judge {
        provider,
        thresholds: (&cfg.recoverer).into(),
        own_endpoint: endpoint,
        brake: (&cfg.recoverer).into(),
    }
}

fn next_backoff(last: Duration, initial: Duration) -> Duration {
    if last.is_zero() {
        initial
    } else {
        (last * 2).min(MAX_SESSION_RETRY.max(initial))
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.start_children(ctx);
        self.open_session(ctx);
    }
}

impl Handler<SessionEnded> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: SessionEnded, ctx: &mut Context<Self>) {
        if self.shutting_down {
            return;
        }
        tracing::warn!(session_id = %msg.session_id, reason = %msg.reason, "session ended; opening a new one");
        self.sessions_lost += 1;
        self.session = None;
        self.hand_over(None);
        self.session_backoff =
            next_backoff(self.session_backoff, self.cfg.supervisor.restart_backoff);
        ctx.run_later(self.session_backoff, |act, ctx| act.open_session(ctx));
    }
}

impl Handler<RoundStopped> for Supervisor {
    type Result = ();

    /// Only the Provisioner is supervised: the others' rounds cannot stop
    /// them.
    fn handle(&mut self, msg: RoundStopped, ctx: &mut Context<Self>) {
        if self.shutting_down || msg.name != Provisioner::NAME {
            return;
        }
        let wait = self.cfg.supervisor.restart_backoff;
        tracing::error!(restart_in = %humantime::format_duration(wait), "the provisioner stopped; restarting it");
        self.provisioner = None;
        ctx.run_later(wait, |act, ctx| {
            act.start_provisioner(ctx);
            let (Some(s), Some(p)) = (act.session.clone(), act.provisioner.clone()) else {
                return;
            };
            actix_rt::spawn(async move {
                if let Ok(session) = s.send(GetSession).await {
                    p.do_send(SetSession(Some(session)));
                }
            });
        });
    }
}

impl Handler<GetSupervisorStatus> for Supervisor {
    type Result = ResponseFuture<SupervisorStatus>;

    fn handle(&mut self, _: GetSupervisorStatus, _: &mut Context<Self>) -> Self::Result {
        let session = self.session.clone();
        let init = self.initializer.clone();
        let enr = self.enroller.clone();
        let rec = self.recoverer.clone();
        let prov = self.provisioner.clone();
        let upd = self.updater.clone();
        let (sessions_opened, sessions_lost) = (self.sessions_opened, self.sessions_lost);
        Box::pin(async move {
            let mut st = SupervisorStatus {
                sessions_opened,
                sessions_lost,
                ..SupervisorStatus::default()
            };
            if let Some(s) = session {
                st.session = s
                    .send(GetSession)
                    .await
                    .ok()
                    .filter(|s| !s.is_expired())
                    .map(|s| s.id());
            }
            if let Some(i) = init {
                st.initializer = i.send(GetStatus).await.ok();
            }
            if let Some(e) = enr {
                st.enroller = e.send(GetStatus).await.ok();
            }
            if let Some(r) = rec {
                st.recoverer = r.send(GetStatus).await.ok();
            }
            if let Some(p) = prov {
                st.provisioner = p.send(GetRoundStatus::default()).await.ok();
            }
            if let Some(u) = upd {
                st.updater = u.send(GetRoundStatus::default()).await.ok();
            }
            st
        })
    }
}

impl Handler<Shutdown> for Supervisor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _: Shutdown, _: &mut Context<Self>) -> Self::Result {
        self.shutting_down = true;
        let provisioner = self.provisioner.take();
        let mailboxes: Vec<Recipient<StopLeasing>> = self
            .initializer
            .iter()
            .map(|a| a.clone().recipient())
            .chain(self.enroller.iter().map(|a| a.clone().recipient()))
            .chain(self.recoverer.iter().map(|a| a.clone().recipient()))
            .collect();
        let statuses: Vec<Recipient<GetStatus>> = self
            .initializer
            .iter()
            .map(|a| a.clone().recipient())
            .chain(self.enroller.iter().map(|a| a.clone().recipient()))
            .chain(self.recoverer.iter().map(|a| a.clone().recipient()))
            .collect();
        let updater = self.updater.take();
        let session = self.session.take();
        // Nothing may start under the session once the drain begins.
        if let Some(u) = &updater {
            u.do_send(SetSession(None));
        }
        if let Some(d) = &self.rollouts {
            d.do_send(SetSession(None));
        }
        let drain = self.cfg.supervisor.drain_timeout;
        Box::pin(
            async move {
                if let Some(p) = provisioner {
                    let _ = p.send(StopRounds).await;
                }
                drop(updater);
                for m in &mailboxes {
                    let _ = m.send(StopLeasing).await;
                }
                {
                    let deadline = Instant::now() + drain;
                    loop {
                        let mut running = 0;
                        for s in &statuses {
                            running += s.send(GetStatus).await.map(|s| s.running).unwrap_or(0);
                        }
                        if running == 0 {
                            tracing::info!("drained: no takeover running");
                            break;
                        }
                        if Instant::now() >= deadline {
                            tracing::warn!(running, "drain timeout: cancelling the takeovers still running");
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                if let Some(s) = session {
                    match s.send(CloseSession).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!(error = %e, "could not close the session; it will expire"),
                        Err(e) => tracing::warn!(error = %e, "session actor gone"),
                    }
                }
            }
            .into_actor(self),
        )
    }
}

/// A running shepherd: the Supervisor and what the admin routes need.
pub struct Running {
    pub supervisor: Addr<Supervisor>,
    pub admin: crate::admin::Admin,
    /// The agent callback server, when enabled.
    pub callback: Option<crate::callback::Callback>,
    /// The image server, when `installations.images_dir` is set.
    pub images: Option<crate::images::ImageServer>,
}

impl Running {
    /// Drains (as on SIGTERM) and closes the session.
    pub async fn shutdown(self) {
        if let Err(e) = self.supervisor.send(Shutdown).await {
            tracing::warn!(error = %e, "supervisor gone before shutdown");
        }
    }
}

/// The boot image the image server serves per boot: `installations.
/// boot_image` (an error naming the key when it cannot be used), else
/// `shepherd-boot.iso` beside this binary when there is one (a warning
/// when it cannot be used). None without a callback endpoint to give the
/// boots' agents.
fn boot_image(
    cfg: &Config,
    callback_endpoint: Option<&str>,
) -> anyhow::Result<Option<crate::images::BootServing>> {
    let configured = cfg.installations.boot_image.clone();
    let path = match configured.clone().or_else(|| {
        let exe = std::env::current_exe().ok()?;
        Some(exe.parent()?.join("shepherd-boot.iso")).filter(|p| p.exists())
    }) {
        Some(p) => p,
        None => return Ok(None),
    };
    let Some(endpoint) = callback_endpoint else {
        tracing::warn!(path = %path.display(), "the boot image is not served: no agent callback (bmaas.endpoint) to give its agents");
        return Ok(None);
    };
    match crate::images::BootImage::open(&path) {
        Ok(image) => {
            tracing::info!(path = %path.display(), bytes = image.len, "serving the boot image per boot");
            Ok(Some(crate::images::BootServing {
                image,
                callback_endpoint: endpoint.to_string(),
            }))
        }
        Err(e) if configured.is_some() => {
            Err(crate::ConfigError::key("installations.boot_image", e).into())
        }
        Err(e) => {
            tracing::warn!(error = %e, "the boot image beside shepherd is not served");
            Ok(None)
        }
    }
}

/// Starts shepherd in the current actix system: the BMDB (migrated), the
/// provider, and the Supervisor with its parts. For embedding: mount
/// `admin::routes` with `Running::admin` as app data, and call
/// `Running::shutdown` when the application stops.
pub async fn start(cfg: Config) -> anyhow::Result<Running> {
    let mut parts = Parts::build(&cfg).await?;
    let mut images = None;
    let mut catalog = None;
    if let Some(dir) = &cfg.installations.images_dir {
        let Some(identity) = parts.callback.as_ref() else {
            return Err(crate::ConfigError::key(
                "installations.images_dir",
                "the image server needs the agent callback's CA: set bmaas.enabled",
            )
            .into());
        };
        if !dir.is_dir() {
            return Err(crate::ConfigError::key(
                "installations.images_dir",
                format!("{} is not a directory", dir.display()),
            )
            .into());
        }
        let c = crate::images::ImageCatalog::new(
            dir.clone(),
            &images_endpoint(&cfg, parts.serves.as_deref()),
            identity.ca_der.clone(),
        );
        let c = match boot_image(&cfg, parts.serves.as_deref())? {
            Some(b) => c.with_boot_image(b, cfg.installations.boot_endpoint.as_deref()),
            None => c,
        };
        let tls = identity.web_server_config()?;
        images = Some(
            crate::images::ImageServer::start(
                &c,
                crate::images::DownloadGate {
                    bmdb: parts.bmdb.clone(),
                    timeout: cfg.admin.database_timeout,
                },
                cfg.installations.images_listen,
                tls,
                2,
            )
            .map_err(|e| anyhow::anyhow!("installations.images_listen {e}"))?,
        );
        // Each served image's digest, computed now on a thread of its own:
        // the first installation of a large image then does not wait for
        // its hash. (One added later is hashed when first asked for; the
        // API answers 503 until it is.)
        let warm = c.clone();
        std::thread::Builder::new()
            .name("image-digests".into())
            .spawn(move || warm.hash_all())
            .map_err(|e| anyhow::anyhow!("starting the image digest thread: {e}"))?;
        catalog = Some(c);
    }
    let callback = match parts.callback.take() {
        Some(identity) => Some(
            crate::callback::Callback::start(
                parts.bmdb.clone(),
                &identity,
                cfg.bmaas.listen,
                cfg.bmaas.max_batch as usize,
                cfg.bmaas.max_writes_in_flight as usize,
            )
            .await
            .map_err(|e| anyhow::anyhow!("bmaas.listen {e}"))?,
        ),
        None => None,
    };
    // The process's metric series; the admin server adds the fleet's at
    // each scrape.
    let mut registry = prometheus_client::registry::Registry::default();
    if let Some(api) = &parts.api {
        api.metrics().register(&mut registry);
    }
    if let Some(c) = &callback {
        c.metrics.register(&mut registry);
    }
    let recovery_metrics = crate::recoverer::RecoveryMetrics::default();
    recovery_metrics.register(&mut registry);
    let boot_metrics = BootMetrics::default();
    let boot_url: Option<BootUrl> = catalog.as_ref().filter(|c| c.serves_boot_image()).map(|c| {
        boot_metrics.register(&mut registry);
        let c = c.clone();
        Rc::new(move |boot_id| c.boot_url(boot_id)) as BootUrl
    });
    let admin = crate::admin::Admin {
        registry: std::sync::Arc::new(registry),
        heartbeat_stale_after: cfg.recoverer.heartbeat_stale_after,
        tokens: cfg.admin.named_tokens(),
        database_timeout: cfg.admin.database_timeout,
        equinix: parts.api.as_ref().map(|api| crate::admin::RequestBudget {
            metrics: api.metrics().clone(),
            interval: cfg.equinix.api_interval,
            parallelism: cfg.equinix.parallelism,
        }),
        ..crate::admin::Admin::new(parts.bmdb.clone())
    };
    let judge = judge(
        &cfg,
        parts.provider.kind(),
        parts.takeover.as_ref().map(|t| t.endpoint.clone()),
    );
    let admin = crate::admin::Admin {
        judge: cfg.recoverer.enabled.then_some(judge),
        brake_release: cfg.recoverer.brake_release,
        ..admin
    };
    let mut supervisor = Supervisor::new(cfg, parts, recovery_metrics);
    if let Some(url) = boot_url {
        supervisor = supervisor.with_bmc_boots(url, boot_metrics);
    }
    let driver = supervisor.rollout_driver();
    let supervisor = supervisor.start();
    Ok(Running {
        admin: crate::admin::Admin {
            supervisor: Some(supervisor.clone().recipient()),
            rollouts: Some(driver.recipient()),
            images: catalog,
            ..admin
        },
        supervisor,
        callback,
        images,
    })
}

/// `shepherd run`: starts, serves the admin routes on `admin.listen`, runs
/// until SIGINT or SIGTERM, drains.
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    let admin_cfg = cfg.admin.clone();
    // Each agent keeps a connection to the callback: a fleet needs a file
    // descriptor per machine (an embedding application sets its own).
    let files = crate::telemetry::raise_open_files_limit();
    if files < 4096 {
        tracing::warn!(
            limit = files,
            "the open-files limit caps the agents that can call back at once; raise it (LimitNOFILE=, ulimit -n)"
        );
    }
    let running = start(cfg).await?;
    if admin_cfg.enabled {
        let addr = crate::admin::serve(running.admin.clone(), admin_cfg.listen)
            .map_err(|e| anyhow::anyhow!("admin.listen {}: {e}", admin_cfg.listen))?;
        tracing::info!("admin server: http://{addr}/");
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining"),
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
    }
    running.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}
