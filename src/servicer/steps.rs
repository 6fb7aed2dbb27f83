//! The Servicer's steps on a BMC: one firmware update followed through
//! its task (one at a time per BMC), the RAID layout made, and whose fault
//! a failed step is.

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::bmc::{BmcError, BmcErrorKind};
use crate::bmdb::BmdbError;
use crate::bmdb::firmware::Below;
use crate::config::{ServicingConfig, VolumeConfig};
use crate::redfish::RedfishBmc;
use crate::redfish::servicing::{
    CreateVolume, DeleteVolume, GetTask, StartUpdate, Started, UpdateImage,
};

/// Why a step failed, and whose fault it is.
#[derive(Debug)]
pub(super) enum Fault {
    /// The machine's (its BMC refused, a task failed, the check found it
    /// short): the servicing fails.
    Machine(String),
    /// Shepherd's, or a BMC that did not answer: the lease fails with the
    /// backoff and the servicing is taken up again.
    Ours(String),
}

impl From<BmcError> for Fault {
    fn from(e: BmcError) -> Fault {
        if e.kind.is_transient() {
            Fault::Ours(e.to_string())
        } else {
            Fault::Machine(e.to_string())
        }
    }
}

impl From<BmdbError> for Fault {
    fn from(e: BmdbError) -> Fault {
        Fault::Ours(format!("the BMDB: {e}"))
    }
}

/// The BMCs (by URL) with an update of this process in flight: one each.
#[derive(Clone, Default)]
pub(super) struct OneUpdatePerBmc(Rc<RefCell<HashSet<String>>>);

impl OneUpdatePerBmc {
    /// Waits until no other update of this process runs on `url`, then
    /// holds it.
    pub(super) async fn hold(&self, url: &str) -> Updating {
        while !self.0.borrow_mut().insert(url.to_string()) {
            actix_rt::time::sleep(Duration::from_millis(200)).await;
        }
        Updating {
            set: self.0.clone(),
            url: url.to_string(),
        }
    }
}

/// The one update in flight on a BMC, for as long as it lives.
pub(super) struct Updating {
    set: Rc<RefCell<HashSet<String>>>,
    url: String,
}

impl Drop for Updating {
    fn drop(&mut self) {
        self.set.borrow_mut().remove(&self.url);
    }
}

/// One firmware update of `component`, started (a busy BMC waited for)
/// and followed through its task to its end; Ok(how it went).
pub(super) async fn update(
    bmc: &RedfishBmc,
    component: &str,
    image: UpdateImage,
    what: &str,
    cfg: &ServicingConfig,
    updates: &OneUpdatePerBmc,
) -> Result<String, Fault> {
    let _one = updates.hold(&bmc.config.url).await;
    let timeout = cfg.task_timeout;
    let deadline = Instant::now() + timeout;
    let over = || {
        Fault::Machine(format!(
            "{what}: not done within {} (servicing.task_timeout)",
            humantime::format_duration(timeout)
        ))
    };
    let started = loop {
        let msg = StartUpdate {
            image: image.clone(),
            system: bmc.system(),
            component: component.to_string(),
        };
        match bmc.ask(msg).await {
            Ok(s) => break s,
            Err(e) => match e.kind {
                BmcErrorKind::Busy { retry_after, .. } => {
                    if Instant::now() + retry_after > deadline {
                        return Err(over());
                    }
                    actix_rt::time::sleep(retry_after).await;
                }
                _ => return Err(named(what, e)),
            },
        }
    };
    let (monitor, pushed) = match started {
        Started::Done { pushed } => {
            return Ok(format!("{}; done without a task", way(pushed)));
        }
        Started::Task { monitor, pushed } => (monitor, pushed),
    };
    loop {
        let msg = GetTask {
            monitor: monitor.clone(),
        };
        match bmc.ask(msg).await {
            Ok(t) if t.running() => {}
            Ok(t) if t.succeeded() => {
                let said = t.said();
                return Ok(match said.is_empty() {
                    true => way(pushed).to_string(),
                    false => format!("{}; the BMC: {said}", way(pushed)),
                });
            }
            Ok(t) => {
                return Err(Fault::Machine(format!(
                    "{what}: its BMC's update task ended {}: {}",
                    t.state,
                    t.said()
                )));
            }
            // Busy or unreachable a moment: the task is read again.
            Err(e) if e.kind.is_transient() => {}
            Err(e) => return Err(named(what, e)),
        }
        if Instant::now() >= deadline {
            return Err(over());
        }
        actix_rt::time::sleep(cfg.poll).await;
    }
}

/// Makes the RAID layout `want` on the first storage that offers
/// volumes: its volumes deleted, then each wanted one made of the next
/// drives, all for the next reset where the BMC offers that.
pub(super) async fn raid(
    bmc: &RedfishBmc,
    want: &[VolumeConfig],
    below: &Below,
) -> Result<String, Fault> {
    let storage = below.storage.as_deref().unwrap_or_default();
    let Some(s) = storage.iter().find(|s| s.volumes_offered) else {
        return Err(Fault::Machine(
            "RAID: its BMC offers no volumes on any storage: the layout cannot be made through it"
                .into(),
        ));
    };
    let needed: usize = want.iter().map(|v| v.drives as usize).sum();
    if needed > s.drives.len() {
        return Err(Fault::Machine(format!(
            "RAID: the layout needs {needed} drives; storage {} has {}",
            s.id,
            s.drives.len()
        )));
    }
    let mut said = Vec::new();
    for v in &s.volumes {
        let msg = DeleteVolume {
            system: bmc.system(),
            storage: s.id.clone(),
            volume: v.id.clone(),
        };
        let when = bmc.ask(msg).await.map_err(|e| named("RAID", e))?;
        said.push(format!("volume {} deleted ({})", v.id, applies(when)));
    }
    let mut drives = s.drives.iter().map(|d| d.id.clone());
    for v in want {
        let msg = CreateVolume {
            system: bmc.system(),
            storage: s.id.clone(),
            raid_type: v.raid_type.clone(),
            drives: drives.by_ref().take(v.drives as usize).collect(),
        };
        let when = bmc.ask(msg).await.map_err(|e| named("RAID", e))?;
        said.push(format!(
            "{} of {} drives made ({})",
            v.raid_type,
            v.drives,
            applies(when)
        ));
    }
    Ok(format!("RAID on {}: {}", s.id, said.join(", ")))
}

/// A BMC's error on `what`, as the servicing's fault.
pub(super) fn named(what: &str, e: BmcError) -> Fault {
    match Fault::from(e) {
        Fault::Machine(m) => Fault::Machine(format!("{what}: {m}")),
        Fault::Ours(m) => Fault::Ours(format!("{what}: {m}")),
    }
}

pub(super) fn applies(when: Option<String>) -> String {
    match when {
        Some(t) => format!("applied {t}"),
        None => "applied as the BMC applies it".into(),
    }
}

fn way(pushed: bool) -> &'static str {
    if pushed {
        "pushed to the BMC"
    } else {
        "fetched by the BMC with its grant"
    }
}

pub(super) fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}
