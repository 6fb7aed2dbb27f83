//! Starting a shepherd: the parts, the servers (image server, agent
//! callback, admin), the metrics registry and the Supervisor with its
//! loops; `shepherd run` waits for SIGINT or SIGTERM, then drains.

use std::rc::Rc;

use actix::prelude::*;

use super::Supervisor;
use super::loops::{LoopInputs, registrations};
use super::parts::{Parts, boot_image};
use crate::bmdb::brake::Judge;
use crate::config::Config;
use crate::control::{Registration, Registry};
use crate::enroller::BootMetrics;

/// A running shepherd: the Supervisor and what the admin routes need.
pub struct Running {
    pub supervisor: Addr<Supervisor>,
    pub admin: crate::admin::Admin,
    /// The Metal API's catalog, when it is served (`metal.enabled`).
    pub metal: Option<crate::metal::Catalog>,
    /// The agent callback server, when enabled.
    pub callback: Option<crate::callback::Callback>,
    /// The image server, when `installations.images_dir` is set.
    pub images: Option<crate::images::ImageServer>,
    /// The network boot service, when `[netboot]` is configured.
    pub netboot: Option<Addr<crate::netboot::NetbootService>>,
    /// The consoles over SSH, when `console.listen` is set.
    pub console_server: Option<crate::sos::ConsoleServer>,
}

impl Running {
    /// Drains (as on SIGTERM) and closes the session.
    pub async fn shutdown(self) {
        if let Err(e) = self.supervisor.send(super::Shutdown).await {
            tracing::warn!(error = %e, "supervisor gone before shutdown");
        }
        if let Some(n) = self.netboot {
            let _ = n.send(crate::netboot::Stop).await;
        }
    }
}

/// Starts shepherd in the current actix system: the BMDB (migrated), the
/// provider, and the Supervisor with its parts. For embedding: mount
/// `admin::routes` with `Running::admin` as app data, and call
/// `Running::shutdown` when the application stops.
pub async fn start(cfg: Config) -> anyhow::Result<Running> {
    start_with(cfg, Vec::new()).await
}

/// [`start`], with loops of the embedding application's own beside
/// shepherd's: each runs under the Supervisor like any other (started,
/// handed the session, drained, in the status, the pages and `/metrics`).
pub async fn start_with(cfg: Config, extra: Vec<Registration>) -> anyhow::Result<Running> {
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
            &cfg.installations.images_endpoint(parts.serves.as_deref()),
            identity.ca_der.clone(),
        )
        .with_peers(cfg.installations.peers)
        .with_peer_port(cfg.installations.peer_port);
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
    let ca_der = parts.callback.as_ref().map(|c| c.ca_der.clone());
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
    let service_metrics = crate::servicer::ServiceMetrics::default();
    service_metrics.register(&mut registry);
    let boot_metrics = BootMetrics::default();
    let mut boot_url: Option<crate::enroller::BootUrl> =
        catalog.as_ref().filter(|c| c.serves_boot_image()).map(|c| {
            let c = c.clone();
            Rc::new(move |boot_id| c.boot_url(boot_id)) as crate::enroller::BootUrl
        });
    let mut netboot = None;
    if let Some(n) = &cfg.netboot {
        let (Some(boot), Some(ca_der)) = (boot_image(&cfg, parts.serves.as_deref())?, ca_der)
        else {
            return Err(crate::ConfigError::key(
                "netboot",
                "the network boot serves the boot image's kernel and initramfs: it needs bmaas.enabled (the agents' callback) and the boot image (installations.boot_image, built by scripts/boot-image)",
            )
            .into());
        };
        if boot.image.netboot.is_none() {
            return Err(crate::ConfigError::key(
                "netboot",
                format!(
                    "{} has no .vmlinuz and .initrd beside it (scripts/boot-image writes them)",
                    boot.image.path.display()
                ),
            )
            .into());
        }
        let metrics = crate::netboot::NetbootMetrics::default();
        metrics.register(&mut registry);
        let (service, listening) = crate::netboot::NetbootService::new(
            n,
            parts.bmdb.clone(),
            boot,
            ca_der,
            metrics,
            n.database_timeout,
        )?;
        if boot_url.is_none() {
            // No virtual media served: a boot's URL in the logs is its
            // script's.
            let base = listening.http_base.clone();
            boot_url = Some(Rc::new(move |boot_id| {
                format!("{base}/boot/{boot_id}.ipxe")
            }));
        }
        netboot = Some(service.start());
    }
    if boot_url.is_some() {
        boot_metrics.register(&mut registry);
    }
    let baselines = std::sync::Arc::new(crate::baselines::Baselines::new(
        &cfg.baselines,
        &cfg.metal.plans,
    ));
    let admin = crate::admin::Admin {
        registry: std::sync::Arc::new(registry),
        heartbeat_stale_after: cfg.recoverer.heartbeat_stale_after,
        tokens: cfg.admin.named_tokens(),
        database_timeout: cfg.admin.database_timeout,
        baselines: baselines.clone(),
        equinix: parts.api.as_ref().map(|api| crate::admin::RequestBudget {
            metrics: api.metrics().clone(),
            interval: cfg.equinix.api_interval,
            parallelism: cfg.equinix.parallelism,
        }),
        ..crate::admin::Admin::new(parts.bmdb.with_own_pool(cfg.admin.database_connections))
    };
    let endpoint = parts.takeover.as_ref().map(|t| t.endpoint.clone());
    let judge = Judge::new(&cfg.recoverer, parts.provider.kind(), endpoint);
    let admin = crate::admin::Admin {
        judge: cfg.recoverer.enabled.then_some(judge),
        brake_release: cfg.recoverer.brake_release,
        ..admin
    };
    let consoles =
        crate::console::Consoles::new(cfg.console.clone(), cfg.ipmi.clone(), parts.bmdb.clone());
    let console_server = crate::sos::serve(
        &cfg.console,
        consoles.clone(),
        parts.provider.clone(),
        parts.bmdb.clone(),
    )
    .await?;
    let mut loops = registrations(
        &cfg,
        LoopInputs {
            provider: parts.provider.clone(),
            takeover: parts.takeover.clone(),
            recovery_metrics,
            boot_url,
            boot_metrics,
            baselines,
            images: catalog.clone(),
            service_metrics,
            consoles: consoles.clone(),
        },
    );
    loops.extend(extra);
    let (metal_enabled, metal_cfg) = (cfg.metal.enabled, cfg.metal.clone());
    let tenant_vlans = cfg.network.tenant_range();
    let supervisor = Supervisor::new(cfg, parts, Registry::new(loops)).start();
    Ok(Running {
        admin: crate::admin::Admin {
            supervisor: Some(supervisor.clone().recipient()),
            loops: Some(supervisor.clone().recipient()),
            images: catalog,
            plans: metal_cfg.plans.iter().map(|p| p.slug.clone()).collect(),
            ..admin
        },
        supervisor,
        metal: metal_enabled
            .then(|| crate::metal::Catalog::new(&metal_cfg).with_tenant_vlans(tenant_vlans)),
        callback,
        images,
        netboot,
        console_server,
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
    let tls_cfg = cfg.clone();
    let running = start(cfg).await?;
    if admin_cfg.enabled {
        let tls = if admin_cfg.tls.enabled {
            Some(admin_tls(&tls_cfg, &running.admin.bmdb).await?)
        } else {
            None
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let addr = crate::metal::serve(
            running.admin.clone(),
            running.metal.clone(),
            admin_cfg.listen,
            tls,
        )
        .map_err(|e| anyhow::anyhow!("admin.listen {}: {e}", admin_cfg.listen))?;
        tracing::info!("admin server: {scheme}://{addr}/");
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

/// The admin server's TLS (`admin.tls`): its files, read again when they
/// change, or a certificate issued now by the fleet's CA, whose own
/// certificate is written as `fleet-ca.pem` beside the callback's files.
async fn admin_tls(cfg: &Config, bmdb: &crate::bmdb::Bmdb) -> anyhow::Result<rustls::ServerConfig> {
    use crate::admin::tls;
    let t = &cfg.admin.tls;
    if let (Some(cert), Some(key)) = (&t.cert_file, &t.key_file) {
        let resolver = tls::ReloadingCert::new(cert, key)
            .map_err(|e| crate::ConfigError::key("admin.tls.cert_file", e.to_string()))?;
        return Ok(tls::server_config(std::sync::Arc::new(resolver)));
    }
    let ca = super::parts::fleet_ca(cfg, bmdb).await?;
    let names = tls::names(t, cfg.admin.listen);
    let config = tls::issued(&ca.certificate, &ca.private_key, &names)
        .map_err(|e| anyhow::anyhow!("admin TLS: {e}"))?;
    let (dir, dir_key) = super::parts::tls_dir(cfg);
    let path = dir.join("fleet-ca.pem");
    let pem = pem::encode(&pem::Pem::new("CERTIFICATE", ca.certificate.clone()));
    if std::fs::read_to_string(&path).ok().as_deref() != Some(pem.as_str()) {
        std::fs::create_dir_all(&dir)
            .and_then(|()| shepherd_proto::files::write_whole(&path, pem.as_bytes(), 0o644))
            .map_err(|e| crate::ConfigError::key(dir_key, format!("{}: {e}", path.display())))?;
    }
    tracing::info!(ca = %path.display(), names = %names.join(", "), "admin TLS: a certificate issued by the fleet's CA");
    Ok(config)
}
