//! Tenants on networks of their own: the switch ports machines are
//! cabled to follow their life cycle. While shepherd works on a machine
//! its NICs' ports are on the provisioning network, a free machine waits
//! on an idle VLAN that reaches nothing, a tenant's machine is on its
//! project's network before its system boots, and a BMC stays on the
//! BMCs' network (`bmdb::switches` says which, from the BMDB).
//!
//! [`SwitchRound`] runs on the round runner: each round it makes the
//! declared cabling the BMDB's, and for every switch this shepherd holds
//! (one session per switch at a time, `switch_state`) reads the ports
//! whose VLANs should change, changes those that differ in one batch,
//! reads them back and records them; a change counts only once read
//! back. A switch that fails is named with its cause, its ports keep
//! their last known VLANs, and it is left alone for a backoff.
//!
//! - [`driver`]: the seam a switch's driver plugs into;
//! - [`ovs`]: Open vSwitch over SSH.

pub mod driver;
pub mod ovs;

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use driver::{PortVlans, SwitchDriver, SwitchError};

use crate::bmdb::switches::{self, Declared, PortRow, ReadBack};
use crate::bmdb::{BmdbError, Session};
use crate::config::network::ssh_target;
use crate::config::{InventoryConfig, NetworkConfig, SwitchConfig};
use crate::control::Round;

/// Why a round of the switches failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum NetworkRoundError {
    #[error("the switch ports' BMDB: {0}")]
    Bmdb(#[from] BmdbError),
}

impl crate::fault::Blame for NetworkRoundError {
    fn whose(&self) -> crate::fault::Whose {
        match self {
            NetworkRoundError::Bmdb(e) => crate::fault::Blame::whose(e),
        }
    }
}

/// What one switch came to in a round.
#[derive(Debug)]
pub enum SwitchTurn {
    /// Another shepherd holds it, or its backoff runs.
    StoodBy,
    /// Nothing to change or read.
    Settled,
    /// Read (and changed): ports read back, of them changed.
    Worked { read: usize, changed: usize },
    /// It failed; its ports are left as last known.
    Failed(SwitchError),
}

/// A round's outcome: each switch's turn, and the projects left without
/// a VLAN (the tenants' range is spent).
#[derive(Debug, Default)]
pub struct NetworkRound {
    pub switches: Vec<(String, SwitchTurn)>,
    pub projects_without_vlan: Vec<uuid::Uuid>,
}

/// What this shepherd's rounds did so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortsSeen {
    /// SSH sessions opened to switches.
    pub sessions: u64,
    /// Ports changed and read back.
    pub changes: u64,
    /// Ports read back.
    pub reads: u64,
    pub failures: u64,
}

/// The loop that keeps switch ports where the life cycle wants them.
pub struct SwitchRound {
    cfg: NetworkConfig,
    inventory: InventoryConfig,
    /// The declared cabling last made the BMDB's (its hash): made again
    /// only when it changes (a host the provisioner records later is
    /// cabled as it is recorded).
    synced: Cell<Option<u64>>,
    /// Switches held since this process took them and read whole once.
    read_whole: RefCell<HashSet<String>>,
}

impl SwitchRound {
    pub fn new(cfg: NetworkConfig, inventory: InventoryConfig) -> SwitchRound {
        SwitchRound {
            cfg,
            inventory,
            synced: Cell::new(None),
            read_whole: RefCell::new(HashSet::new()),
        }
    }

    /// The cabling the inventory declares (its file re-read each time, as
    /// the provider reads it).
    fn declared(&self) -> Vec<Declared> {
        let mut hosts = self.inventory.machines.clone();
        if let Some(f) = &self.inventory.file {
            match crate::config::inventory::read_file(f) {
                Ok(fh) => hosts.extend(fh.hosts),
                Err(e) => {
                    tracing::warn!(file = %f.display(), error = %e, "the inventory file's cabling not read")
                }
            }
        }
        let mut out: Vec<Declared> = Vec::new();
        for h in &hosts {
            for p in &h.ports {
                if self.cfg.is_uplink(&p.switch, &p.port) {
                    tracing::warn!(host = %h.id, switch = %p.switch, port = %p.port,
                        "a host's port is one of its switch's uplinks: not cabled to the host");
                } else {
                    out.push(Declared::of(&h.id, p));
                }
            }
        }
        for sw in &self.cfg.switches {
            out.extend(sw.uplinks.iter().map(|u| Declared::uplink(&sw.name, u)));
        }
        out.sort();
        out.dedup_by(|a, b| a.switch == b.switch && a.port == b.port);
        out
    }

    /// How long a switch is held past a round: a few rounds, and a whole
    /// session with it.
    fn hold(&self) -> Duration {
        self.cfg.interval * 3 + self.cfg.timeout
    }

    async fn one_switch(
        &self,
        session: &Session,
        sw: &SwitchConfig,
    ) -> Result<SwitchTurn, BmdbError> {
        let (sid, hold) = (session.id(), self.hold());
        let Some(recorded) = session
            .transact(async |tx| switches::claim(tx, &sw.name, sid, hold).await)
            .await?
        else {
            self.read_whole.borrow_mut().remove(&sw.name);
            return Ok(SwitchTurn::StoodBy);
        };
        let whole = !self.read_whole.borrow().contains(&sw.name);
        let vlans = (
            self.cfg.provisioning_vlan,
            self.cfg.idle_vlan,
            self.cfg.bmc_vlan,
        );
        let due = session
            .transact(async |tx| switches::due(tx, &sw.name, vlans, whole).await)
            .await?;
        if due.is_empty() {
            self.read_whole.borrow_mut().insert(sw.name.clone());
            return Ok(SwitchTurn::Settled);
        }
        let known = sw.host_key.clone().or(recorded.clone());
        let began = std::time::Instant::now();
        let worked =
            match tokio::time::timeout(self.cfg.timeout, change(sw, known, &due, self.cfg.timeout))
                .await
            {
                Ok(r) => r,
                Err(_) => Err(SwitchError::Timeout {
                    switch: sw.name.clone(),
                    after: self.cfg.timeout,
                }),
            };
        let took = began.elapsed();
        match worked {
            Ok((read, shown)) => {
                let first_key = (sw.host_key.is_none() && recorded.is_none()).then_some(shown);
                session
                    .transact(async |tx| {
                        switches::record(tx, &sw.name, sid, &read, first_key.as_deref(), took).await
                    })
                    .await?;
                self.read_whole.borrow_mut().insert(sw.name.clone());
                let changed = read.iter().filter(|r| r.changed.is_some()).count();
                Ok(SwitchTurn::Worked {
                    read: read.len(),
                    changed,
                })
            }
            Err(e) => {
                let ports: Vec<String> = due.iter().map(|p| p.port.clone()).collect();
                let why = e.to_string();
                session
                    .transact(async |tx| {
                        switches::record_failure(tx, &sw.name, &ports, &why, took).await
                    })
                    .await?;
                Ok(SwitchTurn::Failed(e))
            }
        }
    }
}

/// One session with `sw`: reads `due`, changes those that differ, reads
/// those back. The ports as read, and the host key the switch showed.
async fn change(
    sw: &SwitchConfig,
    known: Option<String>,
    due: &[PortRow],
    timeout: Duration,
) -> Result<(Vec<ReadBack>, String), SwitchError> {
    let (host, port) = ssh_target(&sw.address).map_err(|e| SwitchError::Unreadable {
        switch: sw.name.clone(),
        command: "its address".into(),
        why: e.to_string(),
    })?;
    let addr = tokio::net::lookup_host((host.as_str(), port))
        .await
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| SwitchError::Ssh {
            switch: sw.name.clone(),
            source: crate::ssh::SshError::Connect {
                addr: std::net::SocketAddr::from(([0, 0, 0, 0], port)),
                message: format!("{host} does not resolve"),
            },
        })?;
    let known = known.and_then(|k| russh::keys::PublicKey::from_openssh(k.trim()).ok());
    let mut driver = match sw.driver {
        crate::config::SwitchDriverKind::Ovs => ovs::Ovs::connect(sw, addr, known, timeout).await?,
    };
    let shown = driver.host_key().to_openssh().unwrap_or_default();
    let outcome = session_of(&mut driver, &sw.name, due).await;
    driver.close().await;
    outcome.map(|read| (read, shown))
}

async fn session_of(
    driver: &mut impl SwitchDriver,
    switch: &str,
    due: &[PortRow],
) -> Result<Vec<ReadBack>, SwitchError> {
    let want = |p: &PortRow| PortVlans::new(p.want_native, p.want_tagged.iter().copied());
    let names: Vec<String> = due.iter().map(|p| p.port.clone()).collect();
    let before = driver.read(&names).await?;
    let missing = |port: &str| SwitchError::NoSuchPort {
        switch: switch.to_string(),
        port: port.to_string(),
    };
    let mut changes = Vec::new();
    for p in due {
        let now = before.get(&p.port).ok_or_else(|| missing(&p.port))?;
        if *now != want(p) {
            changes.push((p.port.clone(), want(p)));
        }
    }
    driver.apply(&changes).await?;
    let changed: Vec<String> = changes.iter().map(|(p, _)| p.clone()).collect();
    let after = driver.read(&changed).await?;
    let mut read = Vec::with_capacity(due.len());
    for p in due {
        let was = &before[&p.port];
        let (now, changed) = match after.get(&p.port) {
            Some(a) => (a, Some((was.native, was.tagged.clone()))),
            None => (was, None),
        };
        if changed.is_some() && *now != want(p) {
            return Err(SwitchError::NotApplied {
                switch: switch.to_string(),
                port: p.port.clone(),
                seen: now.to_string(),
                wanted: want(p).to_string(),
            });
        }
        read.push(ReadBack {
            port: p.clone(),
            native: now.native,
            tagged: now.tagged.clone(),
            changed,
        });
    }
    Ok(read)
}

impl Round for SwitchRound {
    type Outcome = NetworkRound;
    type Counters = PortsSeen;
    type Error = NetworkRoundError;
    const NAME: &'static str = "switch-ports";
    const AT_SESSION: bool = true;

    fn interval(&self) -> Duration {
        self.cfg.interval
    }

    async fn round(
        &self,
        session: &Session,
        _: &PortsSeen,
    ) -> Result<NetworkRound, NetworkRoundError> {
        self.work(session).await
    }

    fn tally(&self, seen: &mut PortsSeen, out: NetworkRound) {
        for (name, turn) in out.switches {
            match turn {
                SwitchTurn::Worked { read, changed } => {
                    seen.sessions += 1;
                    seen.reads += read as u64;
                    seen.changes += changed as u64;
                    if changed > 0 {
                        tracing::info!(switch = %name, ports = changed, "switch ports changed and read back");
                    }
                }
                SwitchTurn::Failed(e) => {
                    seen.sessions += 1;
                    seen.failures += 1;
                    tracing::warn!(switch = %name, error = %e, "switch not changed");
                }
                SwitchTurn::Settled => {}
                SwitchTurn::StoodBy => {}
            }
        }
        for p in out.projects_without_vlan {
            tracing::warn!(project = %p, range = %self.cfg.tenant_vlans, "no VLAN left for a project's network: its devices wait");
        }
    }
}

impl SwitchRound {
    async fn work(&self, session: &Session) -> Result<NetworkRound, NetworkRoundError> {
        let declared = self.declared();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        declared.hash(&mut h);
        let h = h.finish();
        if self.synced.get() != Some(h) {
            let configured: Vec<String> =
                self.cfg.switches.iter().map(|s| s.name.clone()).collect();
            session
                .transact(async |tx| {
                    switches::sync_declared(tx, &declared).await?;
                    switches::unknown_switches(tx, &configured).await
                })
                .await?;
            self.synced.set(Some(h));
        }
        let range = self.cfg.tenant_range();
        let projects_without_vlan = session
            .transact(async |tx| switches::allocate_project_vlans(tx, range.clone()).await)
            .await?;
        let turns = futures::future::join_all(
            self.cfg
                .switches
                .iter()
                .map(|sw| async move { (sw.name.clone(), self.one_switch(session, sw).await) }),
        )
        .await;
        let mut out = NetworkRound {
            switches: Vec::new(),
            projects_without_vlan,
        };
        for (name, turn) in turns {
            out.switches.push((name, turn?));
        }
        Ok(out)
    }
}
