//! The Servicer: brings a machine to its baseline through its Redfish BMC
//! while it is free (`bmdb::servicing`). A [`LeaseLoop`] under the
//! `ShepherdAgentStart` lease beside the Initializer and the Enroller, so
//! that none of them works on a machine it services.
//!
//! A servicing in two leases:
//! 1. **apply** (`asked`): read the BMC, compare with the baseline, and
//!    change what differs: each firmware update started (pushed, or
//!    fetched with a grant for that one update) and followed through its
//!    task to its end, one at a time per BMC, a busy BMC (503) waited for;
//!    the BIOS attributes in one PATCH for the next reset; the RAID layout
//!    (volumes deleted and made, for the next reset); Secure Boot. Then
//!    the one restart, recorded before it is made: the Enroller's boot
//!    into the live agent for a machine booted through its BMC (its
//!    restart from the disk when a system is installed there), else a
//!    reset through the BMC (its agent comes back by itself, or the
//!    Recoverer brings it back once the servicing is over).
//! 2. **check** (`restarting`, the restart over): read the BMC until it
//!    shows the baseline, or say what it still lacks.
//!
//! The BMC's refusals, failed tasks and a check that finds the machine
//! short end the servicing `failed`, with the BMC's words: the machine
//! shows `service-failed` and is not handed out. A BMC that does not
//! answer, or the database, fails the lease with the loop's backoff (the
//! servicing stands and is taken up again): shepherd's faults and a BMC's
//! silence are not a machine's failure.
//!
//! Here the loop and a servicing's phases; `steps.rs` the steps on a BMC
//! (an update through its task, the RAID layout) and whose fault a failed
//! step is.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use uuid::Uuid;

use crate::baselines::{Baselines, Part, differences};
use crate::bmdb::firmware::{self, Below, Reading};
use crate::bmdb::selectors::{self, ProvidedMachine};
use crate::bmdb::servicing::{self, Restart, Service};
use crate::bmdb::{BmdbError, Process, Tx, Work, firmware_grants};
use crate::config::{BaselineConfig, ServicingConfig};
use crate::control::{LeaseLoop, Outcome, Record};
use crate::images::ImageCatalog;
use crate::provider::SharedProvider;
use crate::redfish::RedfishBmc;
use crate::redfish::client::GetSystem;
use crate::redfish::firmware::GetFirmware;
use crate::redfish::servicing::{SetBios, SetSecureBoot, UpdateImage};

mod steps;

use steps::{Fault, OneUpdatePerBmc, applies, named, on_off};

/// What a servicing's lease writes when it ends.
#[derive(Debug)]
pub enum Serviced {
    /// The servicing ended: Ok(what was done) or Err(why it failed).
    Ended {
        service_id: Uuid,
        result: Result<String, String>,
    },
    /// Applied; its restart asked or made (recorded already).
    Restarting { detail: String },
    /// Nothing to write (the lease failed; the servicing stands).
    Nothing,
}

impl Record for Serviced {
    fn detail(&self) -> Option<&str> {
        match self {
            Serviced::Ended { result, .. } => Some(match result {
                Ok(d) | Err(d) => d,
            }),
            Serviced::Restarting { detail } => Some(detail),
            Serviced::Nothing => None,
        }
    }

    async fn write(&self, tx: &mut Tx<'_>, mid: Uuid) -> Result<(), BmdbError> {
        if let Serviced::Ended { service_id, result } = self {
            servicing::end(tx, mid, *service_id, result).await?;
        }
        Ok(())
    }
}

/// How a servicing's lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ServiceStep {
    /// Applied; the restart asked or made.
    restarted,
    /// The machine is at its baseline (after its restart, or already).
    done,
    /// The servicing failed: the machine's (`service-failed`).
    failed,
    /// The lease failed: shepherd's, or a BMC that did not answer (the
    /// backoff runs, the servicing stands).
    faulted,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct StepLabel {
    pub step: ServiceStep,
}

/// Servicings' leases by how they ended, for `/metrics`
/// (`shepherd_servicing_steps_total`).
#[derive(Clone, Default)]
pub struct ServiceMetrics {
    pub steps: Family<StepLabel, Counter>,
}

impl ServiceMetrics {
    /// Adds the series to `registry`, each at 0 until it happens.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        use ServiceStep::*;
        for step in [restarted, done, failed, faulted] {
            let _ = self.steps.get_or_create(&StepLabel { step });
        }
        registry.register(
            "shepherd_servicing_steps",
            "Servicings' leases by how they ended: restarted (applied, the restart asked or made), done (at the baseline), failed (the machine's: service-failed), faulted (shepherd's or a silent BMC's: backed off, taken up again)",
            self.steps.clone(),
        );
    }
}

/// The Servicer control loop.
pub struct Servicer {
    provider: SharedProvider,
    baselines: Arc<Baselines>,
    images: Option<ImageCatalog>,
    cfg: ServicingConfig,
    updates: OneUpdatePerBmc,
    metrics: ServiceMetrics,
    /// Where a restart's serial console is captured (None: not read).
    consoles: Option<crate::console::Consoles>,
}

impl Servicer {
    pub fn new(
        provider: SharedProvider,
        baselines: Arc<Baselines>,
        images: Option<ImageCatalog>,
        cfg: ServicingConfig,
        metrics: ServiceMetrics,
    ) -> Self {
        Servicer {
            provider,
            baselines,
            images,
            cfg,
            updates: OneUpdatePerBmc::default(),
            metrics,
            consoles: None,
        }
    }

    /// Captures each restart's serial console with `consoles`.
    pub fn with_consoles(mut self, consoles: crate::console::Consoles) -> Self {
        self.consoles = Some(consoles);
        self
    }
}

/// A machine to service, with its servicing and how it restarts.
pub struct Job {
    machine: ProvidedMachine,
    service: Service,
    restart: Restart,
}

impl LeaseLoop for Servicer {
    type Pick = ProvidedMachine;
    type Item = Job;
    type Record = Serviced;
    const SHARES_PROCESS: bool = true;
    const WORK: &'static str = "servicing";
    const PROCESS: Process = Process::ShepherdAgentStart;

    async fn select(&self, tx: &mut Tx<'_>) -> Result<Option<(Uuid, ProvidedMachine)>, BmdbError> {
        let mut m = selectors::needs_service(tx, self.provider.kind(), 1).await?;
        Ok(m.pop().map(|m| (m.machine_id, m)))
    }

    async fn prepare(
        &self,
        tx: &mut Tx<'_>,
        machine_id: Uuid,
        machine: ProvidedMachine,
    ) -> Result<Job, BmdbError> {
        let service = servicing::of_machine(tx, machine_id)
            .await?
            .ok_or_else(|| BmdbError::Invalid("the servicing vanished".into()))?;
        let restart = servicing::restart_of(tx, machine_id).await?;
        Ok(Job {
            machine,
            service,
            restart,
        })
    }

    fn span(&self, machine_id: Uuid, j: &Job) -> tracing::Span {
        tracing::info_span!("servicing", %machine_id, provider_id = %j.machine.provider_id,
            service = %j.service.service_id, baseline = %j.service.baseline)
    }

    async fn work(&self, work: &Work<Job>) -> Outcome<Serviced> {
        let job = work.item();
        let service_id = job.service.service_id;
        let ended = |result| Outcome::Finished(Serviced::Ended { service_id, result });
        let bmc = match self.provider.redfish_bmc(&job.machine.provider_id).await {
            Ok(Some(b)) => b,
            Ok(None) => {
                return ended(Err(
                    "its BMC is not a Redfish BMC of the inventory: nothing below its system can be changed through it".into(),
                ));
            }
            Err(e) => {
                return Outcome::Failed {
                    cause: format!("finding its BMC: {e}"),
                    record: Serviced::Nothing,
                };
            }
        };
        let Some(baseline) = self.baselines.named(&job.service.baseline) else {
            return ended(Err(format!(
                "baseline {} is not declared (any more): nothing to bring it to",
                job.service.baseline
            )));
        };
        let done = if job.service.phase == "restarting" {
            self.check(work, &bmc, baseline).await
        } else {
            self.apply(work, &bmc, baseline).await
        };
        match done {
            Ok(record) => Outcome::Finished(record),
            Err(Fault::Machine(why)) => ended(Err(why)),
            Err(Fault::Ours(cause)) => Outcome::Failed {
                cause,
                record: Serviced::Nothing,
            },
        }
    }

    fn ended(&self, record: &Serviced, outcome: &crate::control::WorkOutcome) {
        use crate::control::WorkOutcome;
        let step = match (outcome, record) {
            (WorkOutcome::Aborted | WorkOutcome::Canceled(_), _) => return,
            (WorkOutcome::Failed(_), _) => ServiceStep::faulted,
            (WorkOutcome::Finished, Serviced::Ended { result: Ok(_), .. }) => ServiceStep::done,
            (WorkOutcome::Finished, Serviced::Ended { result: Err(e), .. }) => {
                tracing::warn!(error = %e, "servicing failed");
                ServiceStep::failed
            }
            (WorkOutcome::Finished, Serviced::Restarting { .. }) => ServiceStep::restarted,
            (WorkOutcome::Finished, Serviced::Nothing) => return,
        };
        if let Some(d) = record.detail()
            && step != ServiceStep::failed
        {
            tracing::info!(detail = %d, ?step, "servicing");
        }
        self.metrics.steps.get_or_create(&StepLabel { step }).inc();
    }
}

impl Servicer {
    /// What is below the machine now, as its BMC says, recorded as the
    /// Updater records it.
    async fn read(&self, work: &Work<Job>, bmc: &RedfishBmc) -> Result<Below, Fault> {
        let system = bmc.system();
        let reading: Reading = bmc
            .ask(GetFirmware {
                system: system.clone(),
            })
            .await?;
        let info = bmc
            .ask(GetSystem {
                system,
                secure_boot: true,
            })
            .await?;
        let mid = work.machine_id();
        let below = Below {
            machine_id: mid,
            manufacturer: info.facts.manufacturer.clone(),
            model: info.facts.model.clone(),
            hardware_report: None,
            bmc_secure_boot: info.facts.secure_boot.as_ref().and_then(|s| s.enable),
            components: reading.components.clone(),
            bios: reading.bios.clone(),
            storage: reading.storage.clone(),
            read_at: Some(SystemTime::now()),
        };
        let read = Ok(reading);
        work.session()
            .transact(async |tx| firmware::record(tx, mid, &read).await)
            .await?;
        Ok(below)
    }

    /// Changes what differs from `baseline`, then has the machine
    /// restarted once.
    async fn apply(
        &self,
        work: &Work<Job>,
        bmc: &RedfishBmc,
        baseline: &BaselineConfig,
    ) -> Result<Serviced, Fault> {
        let job = work.item();
        let below = self.read(work, bmc).await?;
        let differ = differences(baseline, &below);
        if differ.is_empty() {
            return Ok(Serviced::Ended {
                service_id: job.service.service_id,
                result: Ok(format!(
                    "at baseline {} already: nothing to change",
                    baseline.name
                )),
            });
        }
        let mut done = Vec::new();
        for d in differ.iter().filter(|d| d.part == Part::Component) {
            let Some(c) = baseline.components.iter().find(|c| c.component == d.item) else {
                continue;
            };
            let listed = below.components.iter().find(|l| l.component == d.item);
            if listed.and_then(|l| l.updateable) == Some(false) {
                return Err(Fault::Machine(format!(
                    "firmware {}: its BMC says it cannot be updated",
                    d.item
                )));
            }
            let what = format!(
                "firmware {} {} → {}",
                d.item,
                d.actual.as_deref().unwrap_or("(not listed)"),
                d.desired
            );
            let image = self.update_image(work, &c.image).await?;
            let how = steps::update(bmc, &d.item, image, &what, &self.cfg, &self.updates).await?;
            done.push(format!("{what} ({how})"));
        }
        let bios: serde_json::Map<String, serde_json::Value> = differ
            .iter()
            .filter(|d| d.part == Part::Bios)
            .filter_map(|d| Some((d.item.clone(), baseline.bios.get(&d.item)?.clone())))
            .collect();
        if !bios.is_empty() {
            let names: Vec<String> = bios.keys().cloned().collect();
            let when = bmc
                .ask(SetBios {
                    system: bmc.system(),
                    attributes: bios,
                })
                .await
                .map_err(|e| named("BIOS settings", e))?;
            done.push(format!("BIOS {} ({})", names.join(", "), applies(when)));
        }
        if differ.iter().any(|d| d.part == Part::Raid) {
            let want = baseline.raid.as_deref().unwrap_or_default();
            done.push(steps::raid(bmc, want, &below).await?);
        }
        if let Some(on) = baseline.secure_boot
            && differ.iter().any(|d| d.part == Part::SecureBoot)
        {
            let said = bmc
                .ask(SetSecureBoot {
                    system: bmc.system(),
                    on,
                })
                .await
                .map_err(|e| named("Secure Boot", e))?;
            done.push(said.unwrap_or_else(|| format!("Secure Boot {}", on_off(on))));
        }
        self.restart(work, &done.join("; ")).await
    }

    /// Records the restart, then has it made: the Enroller's boot (asked
    /// with the record) or a reset through the BMC.
    async fn restart(&self, work: &Work<Job>, applied: &str) -> Result<Serviced, Fault> {
        let job = work.item();
        let (mid, sid, restart) = (work.machine_id(), job.service.service_id, job.restart);
        let recorded = work
            .session()
            .transact(async |tx| servicing::restarting(tx, mid, sid, applied, restart).await)
            .await?;
        if !recorded {
            return Ok(Serviced::Restarting {
                detail: format!("applied {applied}; the servicing was asked anew meanwhile"),
            });
        }
        let detail = match restart {
            Restart::Boot => format!(
                "applied {applied}; its restart asked: the Enroller boots it into the live agent"
            ),
            Restart::Disk => format!(
                "applied {applied}; its restart asked: the Enroller restarts it from its disk (its installed system)"
            ),
            Restart::Reset => {
                // Read while the BMC is checked after the restart (a later
                // lease's): the capture runs on by itself that long.
                let capture = crate::provider::capture_console(
                    &self.provider,
                    self.consoles.as_ref(),
                    mid,
                    &job.machine.provider_id,
                    "servicing",
                )
                .await;
                match self.provider.reboot(&job.machine.provider_id).await {
                    Ok(()) => {
                        if let Some(c) = capture {
                            c.keep_for(self.cfg.verify_timeout);
                        }
                        format!("applied {applied}; restarted through its BMC")
                    }
                    Err(e) => {
                        let cause = format!(
                            "applied {applied}, but the restart through its BMC failed: {e}"
                        );
                        return Err(Fault::Machine(crate::console::told(capture, cause).await));
                    }
                }
            }
        };
        Ok(Serviced::Restarting { detail })
    }

    /// After the restart: reads the BMC until it shows the baseline, for
    /// up to `verify_timeout`.
    async fn check(
        &self,
        work: &Work<Job>,
        bmc: &RedfishBmc,
        baseline: &BaselineConfig,
    ) -> Result<Serviced, Fault> {
        let job = work.item();
        let applied = job.service.applied.clone().unwrap_or_default();
        let deadline = Instant::now() + self.cfg.verify_timeout;
        loop {
            let short = match self.read(work, bmc).await {
                Ok(below) => {
                    let d = differences(baseline, &below);
                    if d.is_empty() {
                        return Ok(Serviced::Ended {
                            service_id: job.service.service_id,
                            result: Ok(format!(
                                "{applied}; after the restart its BMC shows baseline {}",
                                baseline.name
                            )),
                        });
                    }
                    d.iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join("; ")
                }
                // Its BMC may be busy with the restart: asked again.
                Err(Fault::Ours(e) | Fault::Machine(e)) => format!("its BMC did not read: {e}"),
            };
            if Instant::now() >= deadline {
                return Err(Fault::Machine(format!(
                    "{applied}; {} after the restart, still: {short}",
                    humantime::format_duration(self.cfg.verify_timeout)
                )));
            }
            actix_rt::time::sleep(self.cfg.poll).await;
        }
    }

    /// The image `name` as a BMC gets it: the file to push, and where to
    /// fetch it with a grant made for this one update.
    async fn update_image(&self, work: &Work<Job>, name: &str) -> Result<UpdateImage, Fault> {
        let Some(images) = &self.images else {
            return Err(Fault::Machine(
                "no images are served (installations.images_dir): a firmware image cannot reach its BMC".into(),
            ));
        };
        let path = images.dir().join(name);
        if !path.is_file() {
            return Err(Fault::Machine(format!(
                "the firmware image {name} is not in installations.images_dir ({})",
                images.dir().display()
            )));
        }
        let (mid, ttl) = (work.machine_id(), self.cfg.grant_ttl);
        let grant = work
            .session()
            .transact(async |tx| firmware_grants::issue(tx, mid, name, ttl).await)
            .await?;
        Ok(UpdateImage {
            path,
            name: name.to_string(),
            fetch: Some((
                images.firmware_url(grant.grant_id, name),
                grant.grant_id.to_string(),
                crate::secret::Secret::inline(grant.secret),
            )),
        })
    }
}
