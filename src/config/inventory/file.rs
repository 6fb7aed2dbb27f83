//! The inventory file: `[[machines]]` entries read one by one, a bad
//! entry skipped and named by line and host, the rest kept.

use std::path::Path;

use super::*;

/// An inventory file, read: the hosts that are valid, and a message for
/// each entry that is not (file, line, host, what is wrong).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FileHosts {
    pub hosts: Vec<InventoryMachine>,
    pub problems: Vec<String>,
}

/// Why an inventory file as a whole is unusable, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum InventoryFileError {
    #[error("{file}: {source}")]
    Unreadable {
        file: String,
        source: std::io::Error,
    },
    /// Not TOML (`at`: " line N:" when known).
    #[error("{file}:{at} {message}")]
    Syntax {
        file: String,
        at: String,
        message: String,
    },
    #[error("{file}: unknown key `{key}` (an inventory file holds `[[machines]]` entries)")]
    UnknownKey { file: String, key: String },
    #[error("{file}: machines: {message}")]
    Machines { file: String, message: String },
}

/// Why one entry is skipped.
#[derive(Debug, thiserror::Error)]
enum BadEntry {
    #[error("{key} must be a string, not {found}")]
    NotAString { key: String, found: &'static str },
    #[error("id is missing")]
    NoId,
    #[error("unknown key `{0}`")]
    UnknownKey(String),
    /// A value that is not what its key takes, in the checks' own words.
    #[error("{0}")]
    Value(String),
}

impl From<String> for BadEntry {
    fn from(why: String) -> Self {
        BadEntry::Value(why)
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Reads an inventory file. Err: the file as a whole is unusable (unreadable,
/// not TOML, no `machines` array), naming the file and, for syntax, the
/// line. Each bad entry is skipped and described in `problems`.
pub fn read_file(path: &Path) -> Result<FileHosts, InventoryFileError> {
    let file = path.display();
    let text = std::fs::read_to_string(path).map_err(|source| InventoryFileError::Unreadable {
        file: file.to_string(),
        source,
    })?;
    let mut table: toml::Table = toml::from_str(&text).map_err(|e| InventoryFileError::Syntax {
        file: file.to_string(),
        at: e
            .span()
            .map(|s| format!(" line {}:", line_of(&text, s.start)))
            .unwrap_or_default(),
        message: e.message().to_string(),
    })?;
    #[derive(serde::Deserialize)]
    struct Doc {
        #[serde(default)]
        machines: Vec<toml::Spanned<toml::Table>>,
    }
    if let Some(other) = table.keys().find(|k| *k != "machines") {
        return Err(InventoryFileError::UnknownKey {
            file: file.to_string(),
            key: other.clone(),
        });
    }
    let entries = match table.remove("machines") {
        None => Vec::new(),
        Some(_) => {
            // Parsed again for spans: a `Table`'s values carry none.
            toml::from_str::<Doc>(&text)
                .map_err(|e| InventoryFileError::Machines {
                    file: file.to_string(),
                    message: e.message().to_string(),
                })?
                .machines
        }
    };
    let mut out = FileHosts::default();
    let mut seen = HashSet::new();
    for (i, entry) in entries.into_iter().enumerate() {
        let line = line_of(&text, entry.span().start);
        let entry = entry.into_inner();
        let name = entry
            .get("id")
            .and_then(|v| v.as_str())
            .filter(|id| !id.is_empty() && id.len() <= 80)
            .map(|id| format!("host {id}"))
            .unwrap_or_else(|| format!("machines[{i}]"));
        let problem = |what: String| format!("{file}:{line}: {name}: {what}; skipped");
        match parse_entry(entry) {
            Ok(m) if !seen.insert(m.id.clone()) => out
                .problems
                .push(problem("listed more than once in the file".into())),
            Ok(m) => out.hosts.push(m),
            Err(what) => out.problems.push(problem(what.to_string())),
        }
    }
    Ok(out)
}

fn parse_entry(mut entry: toml::Table) -> Result<InventoryMachine, BadEntry> {
    let text = |entry: &mut toml::Table, key: &str| -> Result<Option<String>, BadEntry> {
        match entry.remove(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(BadEntry::NotAString {
                key: key.to_string(),
                found: other.type_str(),
            }),
        }
    };
    let id = text(&mut entry, "id")?.ok_or(BadEntry::NoId)?;
    check_id(&id)?;
    let address = match text(&mut entry, "address")? {
        None => None,
        Some(a) => Some(
            a.parse()
                .map_err(|_| format!("address {a:?} is not an IP address"))?,
        ),
    };
    let boot = match text(&mut entry, "boot")?.as_deref() {
        None => None,
        Some("ssh") => Some(BootMethod::Ssh),
        Some("virtual-media") => Some(BootMethod::VirtualMedia),
        Some("network") => Some(BootMethod::Network),
        Some(other) => {
            return Err(BadEntry::Value(format!(
                "boot {other:?} is not \"ssh\", \"virtual-media\" or \"network\""
            )));
        }
    };
    let mac = match text(&mut entry, "mac")? {
        None => None,
        Some(m) => Some(m.parse::<MacAddr>().map_err(|e| format!("mac: {e}"))?),
    };
    let macs = match entry.remove("macs") {
        None => Vec::new(),
        Some(toml::Value::Array(a)) => a
            .into_iter()
            .map(|v| match v {
                toml::Value::String(s) => s.parse::<MacAddr>().map_err(|e| format!("macs: {e}")),
                other => Err(format!("macs: {} is not a string", other.type_str())),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(BadEntry::Value(format!(
                "macs must be an array, not {}",
                other.type_str()
            )));
        }
    };
    let firmware = match text(&mut entry, "firmware")?.as_deref() {
        None => None,
        Some("uefi") => Some(Firmware::Uefi),
        Some("bios") => Some(Firmware::Bios),
        Some(other) => {
            return Err(BadEntry::Value(format!(
                "firmware {other:?} is not \"uefi\" or \"bios\""
            )));
        }
    };
    let location = text(&mut entry, "location")?;
    let bmc = match entry.remove("bmc") {
        None => None,
        Some(v) => {
            let mut bmc: BmcConfig = v
                .try_into()
                .map_err(|e: toml::de::Error| format!("bmc: {}", e.message()))?;
            bmc.validate().map_err(|(k, e)| format!("bmc.{k}: {e}"))?;
            Some(bmc)
        }
    };
    let ports: Vec<crate::config::network::HostPort> = match entry.remove("ports") {
        None => Vec::new(),
        Some(v) => v
            .try_into()
            .map_err(|e: toml::de::Error| format!("ports: {}", e.message()))?,
    };
    for (j, p) in ports.iter().enumerate() {
        crate::config::network::check_port_name(&p.port)
            .map_err(|e| format!("ports[{j}].port: {e}"))?;
    }
    if let Some(k) = entry.keys().next() {
        return Err(BadEntry::UnknownKey(k.clone()));
    }
    let m = InventoryMachine {
        id,
        address,
        location,
        bmc,
        boot,
        mac,
        macs,
        firmware,
        ports,
    };
    m.check_reach()?;
    Ok(m)
}
