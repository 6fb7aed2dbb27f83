//! The static inventory: an operator's own hosts, listed in the
//! configuration or in a TOML file it names (re-read every round, so an
//! edit takes effect without a restart). Every host is ours; there is no
//! capacity to create machines from, and no way to reboot one.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{Fut, MachineKind, Provider, ProviderError, ProviderMachine};
use crate::bmdb::{Provider as ProviderKind, ProviderStatus};
use crate::config::{InventoryConfig, InventoryMachine};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InventoryFile {
    #[serde(default)]
    machines: Vec<InventoryMachine>,
}

/// Reads an inventory file; the error names the file and what is wrong.
pub fn read_file(path: &Path) -> Result<Vec<InventoryMachine>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let parsed: InventoryFile =
        toml::from_str(&text).map_err(|e| format!("{}: {}", path.display(), e.message()))?;
    let mut seen = std::collections::HashSet::new();
    for m in &parsed.machines {
        if !seen.insert(m.id.clone()) {
            return Err(format!("{}: host {} is listed twice", path.display(), m.id));
        }
    }
    Ok(parsed.machines)
}

pub struct Inventory {
    listed: Vec<InventoryMachine>,
    file: Option<PathBuf>,
}

impl Inventory {
    pub fn new(cfg: &InventoryConfig) -> Self {
        Inventory {
            listed: cfg.machines.clone(),
            file: cfg.file.clone(),
        }
    }

    fn hosts(&self) -> Result<Vec<InventoryMachine>, ProviderError> {
        let mut all = self.listed.clone();
        if let Some(f) = &self.file {
            let from_file = read_file(f).map_err(ProviderError::Inventory)?;
            for m in from_file {
                if all.iter().any(|x| x.id == m.id) {
                    return Err(ProviderError::Inventory(format!(
                        "host {} is in both the configuration and {}",
                        m.id,
                        f.display()
                    )));
                }
                all.push(m);
            }
        }
        Ok(all)
    }
}

fn machine(m: &InventoryMachine) -> ProviderMachine {
    ProviderMachine {
        provider_id: m.id.clone(),
        address: Some(m.address),
        location: m.location.clone(),
        reservation_id: None,
        status: ProviderStatus::Running,
        kind: MachineKind::Ours,
    }
}

impl Provider for Inventory {
    fn kind(&self) -> ProviderKind {
        ProviderKind::None
    }

    fn list_machines(&self) -> Fut<'_, Vec<ProviderMachine>> {
        Box::pin(async move { Ok(self.hosts()?.iter().map(machine).collect()) })
    }

    fn get_machine<'a>(&'a self, provider_id: &'a str) -> Fut<'a, Option<ProviderMachine>> {
        Box::pin(async move {
            Ok(self
                .hosts()?
                .iter()
                .find(|m| m.id == provider_id)
                .map(machine))
        })
    }

    fn create_machine<'a>(&'a self, _capacity: &'a ProviderMachine) -> Fut<'a, ProviderMachine> {
        Box::pin(async {
            Err(ProviderError::Unsupported(
                "a static inventory has no capacity".into(),
            ))
        })
    }

    fn reboot<'a>(&'a self, provider_id: &'a str) -> Fut<'a, ()> {
        Box::pin(async move {
            Err(ProviderError::Unsupported(format!(
                "host {provider_id}: a static inventory cannot reboot hosts"
            )))
        })
    }
}
