//! The parts a shepherd is built of, made from the configuration before
//! any actor starts: the BMDB (migrated), the provider (and its Equinix
//! client), the takeover settings, the agent callback's identity, and the
//! boot image the image server serves per boot.

use std::rc::Rc;

use crate::bmdb::Bmdb;
use crate::config::{Config, ProviderKind};
use crate::equinix::{ApiMetrics, ClientSettings, EquinixApi};
use crate::provider::SharedProvider;
use crate::provider::equinix::Equinix;
use crate::provider::inventory::Inventory;
use crate::takeover::TakeoverSettings;

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
        let images = cfg.installations.images_endpoint(endpoint);
        let boots = cfg.installations.boot_endpoint.as_deref();
        for e in std::iter::once(images.as_str()).chain(boots) {
            if let Some(h) = crate::config::endpoint_host(e)
                && !names.iter().any(|n| n == h)
            {
                names.push(h.to_string());
            }
        }
        let ip = cfg.installations.images_listen.ip();
        if !ip.is_unspecified() && !names.contains(&ip.to_string()) {
            names.push(ip.to_string());
        }
    }
    let ca = fleet_ca(cfg, bmdb).await?;
    Ok(crate::callback::ServerIdentity::issued_by(
        &ca.certificate,
        &ca.private_key,
        &names,
    )?)
}

/// The directory the callback's certificates live in (`bmaas.tls_dir`,
/// else beside shepherd's SSH key), and the key that names it.
pub fn tls_dir(cfg: &Config) -> (std::path::PathBuf, &'static str) {
    match &cfg.bmaas.tls_dir {
        Some(d) => (d.clone(), "bmaas.tls_dir"),
        None => (
            cfg.ssh
                .key_file
                .parent()
                .map(|p| p.to_path_buf())
                .unwrap_or_default(),
            "ssh.key_file",
        ),
    }
}

/// The fleet's CA, from the BMDB (seeded, on the first start of all, by
/// the CA a shepherd kept beside its SSH key, so that agents that trust it
/// keep working, else generated).
pub async fn fleet_ca(
    cfg: &Config,
    bmdb: &Bmdb,
) -> anyhow::Result<crate::bmdb::callback::CallbackCa> {
    let (dir, dir_key) = tls_dir(cfg);
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
    Ok(ca)
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
                Rc::new(Inventory::new(
                    &cfg.provider.inventory,
                    &cfg.redfish,
                    &cfg.ipmi,
                    Some(bmdb.clone()),
                )),
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

/// The boot image the image server serves per boot: `installations.
/// boot_image` (an error naming the key when it cannot be used), else
/// `shepherd-boot.iso` beside this binary when there is one (a warning
/// when it cannot be used). None without a callback endpoint to give the
/// boots' agents.
pub(super) fn boot_image(
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
            Err(crate::ConfigError::key("installations.boot_image", e.to_string()).into())
        }
        Err(e) => {
            tracing::warn!(error = %e, "the boot image beside shepherd is not served");
            Ok(None)
        }
    }
}
