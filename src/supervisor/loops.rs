//! The control loops a shepherd runs: one registration each, built from
//! the configuration and the parts. Everything else a loop gets (start,
//! restart, the session, the drain, status, `/metrics`) is the registry's.

use std::rc::Rc;

use crate::bmdb::brake::Judge;
use crate::brake_watch::BrakeWatch;
use crate::config::Config;
use crate::control::Registration;
use crate::deadlines::InstallationDeadline;
use crate::devices::DeviceRound;
use crate::enroller::{BootMetrics, BootUrl, BootWaits, Enroller};
use crate::fleet_tally::FleetTally;
use crate::initializer::{AddressLookup, Initializer};
use crate::provider::SharedProvider;
use crate::provisioner::Provisioner;
use crate::recoverer::{AgentWaits, RebootWait, Recoverer, RecoveryMetrics};
use crate::rollouts::RolloutDriver;
use crate::servicer::Servicer;
use crate::takeover::TakeoverSettings;
use crate::updater::Updater;

/// What the loops are built from, besides the configuration.
pub struct LoopInputs {
    pub provider: SharedProvider,
    /// None when no endpoint for agents is set: no takeovers.
    pub takeover: Option<Rc<TakeoverSettings>>,
    pub recovery_metrics: RecoveryMetrics,
    /// Where BMCs fetch a boot's image: set when the image server serves
    /// the boot image (no Enroller without it).
    pub boot_url: Option<BootUrl>,
    pub boot_metrics: BootMetrics,
    /// The declared baselines (the Servicer's, the admin's).
    pub baselines: std::sync::Arc<crate::baselines::Baselines>,
    /// The image server's catalog, when images are served (firmware
    /// images reach BMCs from it).
    pub images: Option<crate::images::ImageCatalog>,
    pub service_metrics: crate::servicer::ServiceMetrics,
    /// The machines' serial consoles, read during the boots shepherd makes.
    pub consoles: crate::console::Consoles,
}

/// The loops this configuration runs, in the order they start.
pub fn registrations(cfg: &Config, x: LoopInputs) -> Vec<Registration> {
    let provider = x.provider;
    let kind = provider.kind();
    let mut loops = Vec::new();

    let (p, c) = (provider.clone(), cfg.provisioner.clone());
    loops.push(Registration::round(move || {
        Provisioner::new(p.clone(), c.clone())
    }));

    match (&x.boot_url, cfg.enroller.enabled) {
        (Some(boot_url), true) => {
            let e = &cfg.enroller;
            let (p, url, metrics) = (provider.clone(), boot_url.clone(), x.boot_metrics);
            let waits = BootWaits {
                credential_ttl: e.credential_ttl,
                callback_timeout: e.callback_timeout,
                poll: std::time::Duration::from_millis(500),
            };
            let consoles = x.consoles.clone();
            loops.push(Registration::lease(&e.lease, move || {
                Enroller::new(p.clone(), url.clone(), waits, metrics.clone())
                    .with_consoles(consoles.clone())
            }));
        }
        (None, true) if kind == crate::bmdb::Provider::None => tracing::info!(
            "no boot image is served (installations.images_dir, installations.boot_image): machines listed with boot = \"virtual-media\" are not booted"
        ),
        _ => {}
    }

    if let Some(takeover) = x.takeover.clone() {
        let p = provider.clone();
        loops.push(Registration::lease(&cfg.initializer.lease, move || {
            Initializer::new(kind, takeover.clone(), Some(address_lookup(p.clone())))
        }));
    }

    let r = &cfg.recoverer;
    if r.enabled {
        let endpoint = x.takeover.as_ref().map(|t| t.endpoint.clone());
        let judge = Judge::new(r, kind, endpoint);
        let (p, j, takeover, metrics) = (
            provider.clone(),
            judge.clone(),
            x.takeover.clone(),
            x.recovery_metrics,
        );
        let (reboot, agent, rehome) = (
            RebootWait {
                timeout: r.reboot_timeout,
                poll: r.reboot_poll,
                settle: r.reboot_settle,
            },
            AgentWaits {
                restart: r.agent_restart_wait,
                after_reboot: r.agent_return_wait,
            },
            r.rehome_after,
        );
        let consoles = x.consoles.clone();
        loops.push(Registration::lease(&r.lease, move || {
            Recoverer::new(
                p.clone(),
                j.clone(),
                reboot.clone(),
                agent,
                takeover.clone(),
                metrics.clone(),
            )
            .rehoming_after(rehome)
            .with_consoles(consoles.clone())
        }));
        let every = r.lease.poll_interval;
        loops.push(Registration::round(move || {
            BrakeWatch::new(judge.clone(), every)
        }));
    }

    if cfg.updater.enabled {
        let (p, updater) = (provider.clone(), cfg.updater.clone());
        loops.push(Registration::round(move || {
            Updater::new(p.clone(), &updater)
        }));
    }

    if cfg.servicing.enabled && !x.baselines.is_empty() {
        let (p, b, i, c, m) = (
            provider.clone(),
            x.baselines.clone(),
            x.images.clone(),
            cfg.servicing.clone(),
            x.service_metrics.clone(),
        );
        let consoles = x.consoles.clone();
        loops.push(Registration::lease(&cfg.servicing.lease, move || {
            Servicer::new(p.clone(), b.clone(), i.clone(), c.clone(), m.clone())
                .with_consoles(consoles.clone())
        }));
    }

    let every = cfg.installations.rollout_interval;
    loops.push(Registration::round(move || RolloutDriver::new(every)));

    let (deadline, allowance) = (cfg.installations.deadline, cfg.recoverer.callback_grace);
    loops.push(Registration::round(move || {
        InstallationDeadline::new(deadline, allowance)
    }));
    loops.push(Registration::round(FleetTally::default));
    let (plans, every) = (cfg.metal.plans.clone(), cfg.metal.interval);
    loops.push(Registration::round(move || {
        crate::plan_labels::PlanLabels::new(plans.clone(), every)
    }));

    if cfg.metal.enabled {
        let every = cfg.metal.interval;
        loops.push(Registration::round(move || DeviceRound::new(every)));
    }

    if !cfg.network.switches.is_empty() {
        let (network, inventory) = (cfg.network.clone(), cfg.provider.inventory.clone());
        loops.push(Registration::round(move || {
            crate::switches::SwitchRound::new(network.clone(), inventory.clone())
        }));
    }
    loops
}

/// For the Initializer: the provider's address of a machine the BMDB has
/// none for.
fn address_lookup(provider: SharedProvider) -> AddressLookup {
    Rc::new(move |m| {
        let provider = provider.clone();
        Box::pin(async move {
            provider
                .get_machine(&m.provider_id)
                .await
                .map(|found| found.and_then(|f| f.address))
        })
    })
}
