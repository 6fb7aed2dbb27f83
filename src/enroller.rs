//! The Enroller: boots machines into shepherd's live agent through their
//! BMC (CONTRACTS.md §5). A [`LeaseLoop`] on the `ShepherdAgentStart`
//! lease: the selector is "needs a boot through the BMC" (a blank machine
//! listed with `boot = "virtual-media"` and no address, or a boot asked
//! for: `inspect`, the Recoverer's last step, an installation asked of an
//! installed machine); the work issues the boot (its credential, its copy
//! of the boot image), has the BMC boot the machine from it, waits for the
//! live agent to call back with the credential, and ejects the media and
//! clears the override, so the machine boots from its disk afterwards.
//!
//! A boot interrupted (a dead shepherd, a lost session) is resumed, not
//! repeated: the request stays until the work finishes, and the next
//! worker finds the boot issued for it. Enrolled already: the media is
//! ejected and the work is done. Not yet and unexpired: the agent is
//! waited for again, with no second reset.

use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use uuid::Uuid;

use crate::bmc::BmcErrorKind;
use crate::bmdb::bmc_boot::{self, BootCause};
use crate::bmdb::boot::{self, LatestBoot};
use crate::bmdb::selectors::{self, ProvidedMachine};
use crate::bmdb::{BmdbError, Process, Tx, Work};
use crate::control::{LeaseLoop, Outcome, Record, WorkOutcome, wait_until};
use crate::provider::{ProviderError, SharedProvider};

/// Why the BMC was not brought to boot the agent.
#[derive(Debug, thiserror::Error)]
enum BootError {
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// The BMC refused the image's credentials; asking without them needs
    /// the boot recorded as open first.
    #[error("recording an open boot image: {0}")]
    Record(BmdbError),
}

/// Where the BMC fetches a boot's copy of the boot image.
pub type BootUrl = Rc<dyn Fn(Uuid) -> String>;

/// How long a boot may take.
#[derive(Debug, Clone, Copy)]
pub struct BootWaits {
    /// A boot's credential (and its copy of the image) is good this long
    /// after it is issued.
    pub credential_ttl: Duration,
    /// From the BMC's reset to the agent's call.
    pub callback_timeout: Duration,
    /// How often the BMDB is asked whether the agent called.
    pub poll: Duration,
}

/// How a boot through a BMC ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum BootOutcome {
    /// The live agent called back.
    enrolled,
    /// The BMC refused or failed a step.
    bmc_failed,
    /// The machine was booted but its agent did not call back in time.
    no_callback,
    /// The BMDB failed the work.
    failed,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: BootOutcome,
}

/// Boots through BMCs: how each ended and how long it took.
#[derive(Clone)]
pub struct BootMetrics {
    pub boots: Family<OutcomeLabel, Counter>,
    pub seconds: Family<OutcomeLabel, Histogram>,
    /// BMCs that refused a boot image's user name and password.
    pub media_auth_refused: Counter,
}

impl Default for BootMetrics {
    fn default() -> Self {
        BootMetrics {
            boots: Family::default(),
            seconds: Family::new_with_constructor(|| {
                Histogram::new([5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0])
            }),
            media_auth_refused: Counter::default(),
        }
    }
}

impl BootMetrics {
    const OUTCOMES: [BootOutcome; 4] = [
        BootOutcome::enrolled,
        BootOutcome::bmc_failed,
        BootOutcome::no_callback,
        BootOutcome::failed,
    ];

    /// Adds the series to `registry`, every outcome at 0 until it happens.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        for outcome in Self::OUTCOMES {
            let _ = self.boots.get_or_create(&OutcomeLabel { outcome });
            let _ = self.seconds.get_or_create(&OutcomeLabel { outcome });
        }
        registry.register(
            "shepherd_bmc_boots",
            "Boots into the live agent through a BMC, by outcome: enrolled (the agent called back), bmc_failed, no_callback (booted, the agent never called), failed (recording it)",
            self.boots.clone(),
        );
        registry.register(
            "shepherd_bmc_boot_media_auth_refused",
            "Boots through virtual media whose BMC refused the image URL's per-boot user name and password (the URL was then open until the agent enrolled)",
            self.media_auth_refused.clone(),
        );
        registry.register(
            "shepherd_bmc_boot_seconds",
            "Seconds from a boot's first Redfish call to its agent's call back (or the failure), by outcome",
            self.seconds.clone(),
        );
    }

    fn observe(&self, outcome: BootOutcome, took: Duration) {
        let label = OutcomeLabel { outcome };
        self.boots.get_or_create(&label).inc();
        self.seconds
            .get_or_create(&label)
            .observe(took.as_secs_f64());
    }
}

/// The Enroller control loop.
pub struct Enroller {
    provider: SharedProvider,
    boot_url: BootUrl,
    waits: BootWaits,
    metrics: BootMetrics,
    /// Where a boot's serial console is captured (None: not read).
    consoles: Option<crate::console::Consoles>,
}

impl Enroller {
    pub fn new(
        provider: SharedProvider,
        boot_url: BootUrl,
        waits: BootWaits,
        metrics: BootMetrics,
    ) -> Self {
        Enroller {
            provider,
            boot_url,
            waits,
            metrics,
            consoles: None,
        }
    }

    /// Captures each boot's serial console with `consoles`.
    pub fn with_consoles(self, consoles: crate::console::Consoles) -> Self {
        Enroller {
            consoles: Some(consoles),
            ..self
        }
    }

    /// Begins capturing the machine's console for a boot of `cause`.
    async fn capture(&self, work: &Work<Boot>, cause: &str) -> Option<crate::console::Capture> {
        let m = &work.item().machine;
        crate::provider::capture_console(
            &self.provider,
            self.consoles.as_ref(),
            work.machine_id(),
            &m.provider_id,
            cause,
        )
        .await
    }
}

/// What a boot writes when its lease ends.
#[derive(Debug)]
pub enum Enrollment {
    /// The live agent called back (its key is the machine's already): the
    /// request is done. `detail` says the cause, the boot and how.
    Enrolled {
        detail: String,
        outcome: Option<(BootOutcome, Duration)>,
    },
    /// Not done; the request stays for the next try.
    NotYet {
        outcome: Option<(BootOutcome, Duration)>,
    },
}

impl Record for Enrollment {
    fn detail(&self) -> Option<&str> {
        match self {
            Enrollment::Enrolled { detail, .. } => Some(detail),
            Enrollment::NotYet { .. } => None,
        }
    }

    async fn write(&self, tx: &mut Tx<'_>, mid: Uuid) -> Result<(), BmdbError> {
        match self {
            Enrollment::Enrolled { .. } => bmc_boot::request_done(tx, mid).await,
            Enrollment::NotYet { .. } => Ok(()),
        }
    }
}

/// Where the work stands on a machine when it begins.
#[derive(Clone)]
enum Resume {
    /// Installed: restart it from its disk through the BMC (`reason`),
    /// Secure Boot as its device's plan asks (`secure_boot`).
    Disk {
        reason: Option<String>,
        secure_boot: Option<bool>,
    },
    /// A boot issued: have the BMC start it.
    Boot {
        cause: BootCause,
        issued: boot::IssuedBoot,
    },
    /// The boot issued for this request is under way: wait for its agent.
    Wait { cause: BootCause, boot: LatestBoot },
    /// Its agent called back; only the media is left to eject.
    Eject { cause: BootCause, boot: LatestBoot },
}

impl Enroller {
    /// Reads the request (asking one for a blank machine, so that an
    /// interrupted boot is resumed) and the latest boot, and issues a new
    /// boot if there is none under way.
    async fn begin(&self, tx: &mut Tx<'_>, mid: Uuid) -> Result<Resume, BmdbError> {
        bmc_boot::request(tx, mid, BootCause::Enroll, "shepherd", None, false).await?;
        let request = bmc_boot::requested(tx, mid)
            .await?
            .ok_or_else(|| BmdbError::Invalid("the boot request vanished".into()))?;
        let cause = request.cause;
        if cause == BootCause::Disk {
            // It restarts: its agent stops serving its image's swarm.
            crate::bmdb::installations::swarm::restarting(tx, mid).await?;
            return Ok(Resume::Disk {
                reason: request.reason,
                secure_boot: crate::bmdb::devices::secure_boot_wanted(tx, mid).await?,
            });
        }
        Ok(match boot::latest(tx, mid).await? {
            Some(b) if b.issued_at >= request.requested_at && b.media_ended_at.is_none() => {
                if b.used_at.is_some() {
                    Resume::Eject { cause, boot: b }
                } else if b.live && b.media_inserted_at.is_some() {
                    Resume::Wait { cause, boot: b }
                } else {
                    let issued = self.issue(tx, mid).await?;
                    Resume::Boot { cause, issued }
                }
            }
            _ => {
                let issued = self.issue(tx, mid).await?;
                Resume::Boot { cause, issued }
            }
        })
    }

    /// A new boot of `mid`; one through virtual media is served only with
    /// its media credentials (a network boot's files are fetched by the
    /// machine itself, which has none to give).
    async fn issue(&self, tx: &mut Tx<'_>, mid: Uuid) -> Result<boot::IssuedBoot, BmdbError> {
        // It restarts: its agent stops serving its image's swarm.
        crate::bmdb::installations::swarm::restarting(tx, mid).await?;
        let mut issued = boot::issue(tx, mid, self.waits.credential_ttl).await?;
        if crate::bmdb::netboot::via(tx, mid).await?.as_deref() != Some("network") {
            boot::set_media_auth(tx, issued.boot_id, true).await?;
            issued.media_auth = true;
        }
        Ok(issued)
    }

    /// Has the BMC boot the machine into boot `issued`, giving it the
    /// boot's media credentials; a BMC that refuses them is asked again
    /// without (the boot's copy then served to anyone with its URL;
    /// counted).
    async fn boot(
        &self,
        work: &Work<Boot>,
        issued: &boot::IssuedBoot,
        url: &str,
    ) -> Result<String, BootError> {
        let m = &work.item().machine;
        let credentials = issued
            .media_auth
            .then(|| boot::media_credentials(&issued.credential));
        match self
            .provider
            .boot_agent(&m.provider_id, url, credentials)
            .await
        {
            Err(ProviderError::Bmc(e)) if matches!(e.kind, BmcErrorKind::MediaAuthRefused(_)) => {
                tracing::warn!(boot = %issued.boot_id, error = %e, "the BMC refused the boot image's user name and password: asking without them (the image's URL is then open until the agent enrolls)");
                self.metrics.media_auth_refused.inc();
                let boot_id = issued.boot_id;
                work.session()
                    .transact(async |tx| boot::set_media_auth(tx, boot_id, false).await)
                    .await
                    .map_err(BootError::Record)?;
                Ok(self.provider.boot_agent(&m.provider_id, url, None).await?)
            }
            other => Ok(other?),
        }
    }

    /// Waits for boot `boot_id`'s agent to call back, until `deadline`.
    async fn wait_for_agent(
        &self,
        work: &Work<Boot>,
        boot_id: Uuid,
        deadline: Instant,
    ) -> Result<Option<SystemTime>, BmdbError> {
        wait_until(work.session(), self.waits.poll, deadline, async |tx| {
            boot::used_at(tx, boot_id).await
        })
        .await
    }

    /// Ejects boot `boot_id`'s media and records it (voiding the
    /// credential if it was not used).
    async fn end_boot(&self, work: &Work<Boot>, boot_id: Uuid) -> Result<bool, String> {
        let m = &work.item().machine;
        let inserted = self
            .provider
            .end_agent_boot(&m.provider_id)
            .await
            .map_err(|e| format!("ejecting the boot image: {e}"))?;
        work.session()
            .transact(async |tx| boot::media_ended(tx, boot_id).await)
            .await
            .map_err(|e| format!("recording the ejection of boot {boot_id}: {e}"))?;
        Ok(inserted)
    }
}

/// A machine to boot, with where its boot stands (read, and a boot
/// issued if none is under way, with its lease).
pub struct Boot {
    machine: ProvidedMachine,
    resume: Resume,
}

impl LeaseLoop for Enroller {
    type Pick = ProvidedMachine;
    type Item = Boot;
    type Record = Enrollment;
    const SHARES_PROCESS: bool = true;
    const WORK: &'static str = "boot";

    const PROCESS: Process = Process::ShepherdAgentStart;

    async fn select(&self, tx: &mut Tx<'_>) -> Result<Option<(Uuid, ProvidedMachine)>, BmdbError> {
        let mut m = selectors::needs_bmc_boot(tx, self.provider.kind(), 1).await?;
        Ok(m.pop().map(|m| (m.machine_id, m)))
    }

    /// The boot request (asked for a blank machine) and where its boot
    /// stands, a boot issued if none is under way: with the lease.
    async fn prepare(
        &self,
        tx: &mut Tx<'_>,
        machine_id: Uuid,
        machine: ProvidedMachine,
    ) -> Result<Boot, BmdbError> {
        let resume = self.begin(tx, machine_id).await?;
        Ok(Boot { machine, resume })
    }

    fn span(&self, machine_id: Uuid, b: &Boot) -> tracing::Span {
        tracing::info_span!("bmc_boot", %machine_id, provider_id = %b.machine.provider_id)
    }

    async fn work(&self, work: &Work<Boot>) -> Outcome<Enrollment> {
        let m = &work.item().machine;
        let started = Instant::now();
        let resume = work.item().resume.clone();
        let failed = |outcome: BootOutcome, cause: String| Outcome::Failed {
            cause,
            record: Enrollment::NotYet {
                outcome: Some((outcome, started.elapsed())),
            },
        };
        let mut capture = None;
        let (cause, boot_id, how) = match resume {
            // Installed: restarted from its disk, nothing to enroll.
            Resume::Disk {
                reason,
                secure_boot,
            } => {
                return match self
                    .provider
                    .boot_from_disk(&m.provider_id, secure_boot)
                    .await
                {
                    Ok(reset) => Outcome::Finished(Enrollment::Enrolled {
                        detail: format!(
                            "disk: restarted from its disk through the BMC ({reset}){}",
                            reason.map(|w| format!(": {w}")).unwrap_or_default()
                        ),
                        outcome: None,
                    }),
                    Err(e) => Outcome::Failed {
                        cause: format!("restarting from the disk through the BMC: {e}"),
                        record: Enrollment::NotYet { outcome: None },
                    },
                };
            }
            Resume::Boot { cause, issued } => {
                let url = (self.boot_url)(issued.boot_id);
                tracing::debug!(boot = %issued.boot_id, %cause, "booting into the agent through the BMC");
                // Recorded before the BMC is asked: a worker taking over
                // from this one (this process killed while the BMC resets
                // the machine, or waits for its power) waits for this boot
                // instead of resetting the machine a second time; if the
                // reset never happened, that wait ends at the callback
                // timeout and the next boot is a new one.
                if let Err(e) = work
                    .session()
                    .transact(async |tx| boot::media_inserted(tx, issued.boot_id).await)
                    .await
                {
                    return failed(
                        BootOutcome::failed,
                        format!(
                            "recording boot {} as handed to the BMC: {e}",
                            issued.boot_id
                        ),
                    );
                }
                capture = self.capture(work, &cause.to_string()).await;
                match self.boot(work, &issued, &url).await {
                    Ok(how) => (cause, issued.boot_id, how),
                    Err(e) => {
                        // Nothing may boot from it now: ejected and the
                        // override cleared where the BMC answers (else
                        // before the next boot inserts anything), and
                        // voided.
                        let mut cause = format!("booting into the agent through the BMC: {e}");
                        if let Err(end) = self.end_boot(work, issued.boot_id).await {
                            cause
                                .push_str(&format!("; then {end} (the next boot ejects it first)"));
                            let _ = work
                                .session()
                                .transact(async |tx| boot::media_ended(tx, issued.boot_id).await)
                                .await;
                        }
                        return failed(
                            BootOutcome::bmc_failed,
                            crate::console::told(capture, cause).await,
                        );
                    }
                }
            }
            Resume::Wait { cause, boot } => {
                tracing::info!(boot = %boot.boot_id, "resuming a boot under way: waiting for its agent");
                capture = self.capture(work, &cause.to_string()).await;
                (
                    cause,
                    boot.boot_id,
                    "resumed: handed to the BMC by a worker that stopped, which may not have reset it"
                        .to_string(),
                )
            }
            Resume::Eject { cause, boot } => (
                cause,
                boot.boot_id,
                "resumed after the agent called".to_string(),
            ),
        };

        let deadline = Instant::now() + self.waits.callback_timeout;
        match self.wait_for_agent(work, boot_id, deadline).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                let ejected = self.end_boot(work, boot_id).await;
                let mut cause = format!(
                    "the live agent of boot {boot_id} did not call back within {} of the BMC's reset ({how})",
                    humantime::format_duration(self.waits.callback_timeout)
                );
                if let Err(e) = ejected {
                    cause.push_str(&format!("; then {e}"));
                }
                return failed(
                    BootOutcome::no_callback,
                    crate::console::told(capture, cause).await,
                );
            }
            Err(e) => {
                return failed(
                    BootOutcome::failed,
                    format!("waiting for boot {boot_id}'s agent: {e}"),
                );
            }
        }
        // The agent called: the boot's console is kept as it stands.
        if let Some(c) = capture {
            c.end().await;
        }
        // The agent is up: the next boot is from the disk.
        let ended = match self.end_boot(work, boot_id).await {
            Ok(true) => "media ejected, override cleared",
            Ok(false) => "the next boot from the disk",
            Err(e) => {
                return failed(
                    BootOutcome::bmc_failed,
                    format!("the agent of boot {boot_id} called back, but {e}"),
                );
            }
        };
        let took = started.elapsed();
        Outcome::Finished(Enrollment::Enrolled {
            detail: format!(
                "{cause}: booted into the agent through the BMC (boot {boot_id}, {how}); it called back after {:.1} s; {ended}",
                took.as_secs_f64()
            ),
            outcome: Some((BootOutcome::enrolled, took)),
        })
    }

    fn ended(&self, record: &Enrollment, outcome: &WorkOutcome) {
        let seen = match record {
            Enrollment::Enrolled { outcome: o, .. } | Enrollment::NotYet { outcome: o } => *o,
        };
        let Some((mut what, took)) = seen else {
            return;
        };
        match outcome {
            WorkOutcome::Finished => {
                if let Some(d) = record.detail() {
                    tracing::info!(detail = %d, "live agent enrolled");
                }
            }
            WorkOutcome::Failed(cause) => {
                if what == BootOutcome::enrolled {
                    what = BootOutcome::failed;
                }
                tracing::warn!(%cause, "boot through the BMC failed");
            }
            WorkOutcome::Aborted | WorkOutcome::Canceled(_) => return,
        }
        self.metrics.observe(what, took);
    }
}
