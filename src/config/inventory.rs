//! The static inventory's file: an operator's hosts as `[[machines]]`
//! entries, read and checked entry by entry. Configuration, like the
//! inline list: the provider re-reads the file every round, and the
//! configuration's check reads it once at load.

use std::collections::HashSet;
use std::path::Path;

use super::{BmcConfig, InventoryMachine};

/// The longest provider ID the BMDB holds (`machine_provided.provider_id`).
pub const MAX_ID_LEN: usize = 128;

/// What is wrong with a host's ID, if anything. Shared by the inline list
/// (a configuration error) and the file (the entry is skipped).
pub fn check_id(id: &str) -> Result<(), String> {
    if id.trim().is_empty() {
        return Err("id is empty".into());
    }
    if id.chars().count() > MAX_ID_LEN {
        return Err(format!(
            "id is {} characters long, at most {MAX_ID_LEN} are allowed",
            id.chars().count()
        ));
    }
    if id.chars().any(char::is_control) {
        return Err("id contains control characters".into());
    }
    Ok(())
}

/// An inventory file, read: the hosts that are valid, and a message for
/// each entry that is not (file, line, host, what is wrong).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FileHosts {
    pub hosts: Vec<InventoryMachine>,
    pub problems: Vec<String>,
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Reads an inventory file. Err: the file as a whole is unusable (unreadable,
/// not TOML, no `machines` array), naming the file and, for syntax, the
/// line. Each bad entry is skipped and described in `problems`.
pub fn read_file(path: &Path) -> Result<FileHosts, String> {
    let file = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{file}: {e}"))?;
    let mut table: toml::Table = toml::from_str(&text).map_err(|e| {
        let at = e
            .span()
            .map(|s| format!(" line {}:", line_of(&text, s.start)))
            .unwrap_or_default();
        format!("{file}:{at} {}", e.message())
    })?;
    #[derive(serde::Deserialize)]
    struct Doc {
        #[serde(default)]
        machines: Vec<toml::Spanned<toml::Table>>,
    }
    if let Some(other) = table.keys().find(|k| *k != "machines") {
        return Err(format!(
            "{file}: unknown key `{other}` (an inventory file holds `[[machines]]` entries)"
        ));
    }
    let entries = match table.remove("machines") {
        None => Vec::new(),
        Some(_) => {
            // Parsed again for spans: a `Table`'s values carry none.
            toml::from_str::<Doc>(&text)
                .map_err(|e| format!("{file}: machines: {}", e.message()))?
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
            Err(what) => out.problems.push(problem(what)),
        }
    }
    Ok(out)
}

fn parse_entry(mut entry: toml::Table) -> Result<InventoryMachine, String> {
    let text = |entry: &mut toml::Table, key: &str| -> Result<Option<String>, String> {
        match entry.remove(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(format!("{key} must be a string, not {}", other.type_str())),
        }
    };
    let id = text(&mut entry, "id")?.ok_or("id is missing")?;
    check_id(&id)?;
    let address = text(&mut entry, "address")?.ok_or("address is missing")?;
    let address = address
        .parse()
        .map_err(|_| format!("address {address:?} is not an IP address"))?;
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
    if let Some(k) = entry.keys().next() {
        return Err(format!("unknown key `{k}`"));
    }
    Ok(InventoryMachine {
        id,
        address,
        location,
        bmc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_entry_is_skipped_and_named_by_line_and_host() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("inventory.toml");
        let long = "x".repeat(200);
        std::fs::write(
            &f,
            format!(
                r#"[[machines]]
id = "good-1"
address = "192.0.2.1"

[[machines]]
id = "{long}"
address = "192.0.2.2"

[[machines]]
id = ""
address = "192.0.2.3"

[[machines]]
id = "bad-address"
address = "192.0.2.300"

[[machines]]
id = "good-2"
address = "2001:db8::2"
location = "rack 2"

[[machines]]
id = "good-1"
address = "192.0.2.9"

[[machines]]
id = "typo"
adress = "192.0.2.10"
"#
            ),
        )
        .unwrap();
        let read = read_file(&f).unwrap();
        let ids: Vec<&str> = read.hosts.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["good-1", "good-2"]);
        let p = &read.problems;
        assert_eq!(p.len(), 5, "{p:#?}");
        let file = f.display().to_string();
        assert!(
            p[0].starts_with(&format!("{file}:5: machines[1]: id is 200 characters long")),
            "{}",
            p[0]
        );
        assert!(
            p[1].starts_with(&format!("{file}:9: machines[2]: id is empty")),
            "{}",
            p[1]
        );
        assert!(
            p[2].starts_with(&format!(
                "{file}:13: host bad-address: address \"192.0.2.300\" is not an IP address"
            )),
            "{}",
            p[2]
        );
        assert!(
            p[3].starts_with(&format!("{file}:22: host good-1: listed more than once")),
            "{}",
            p[3]
        );
        assert!(
            p[4].starts_with(&format!("{file}:26: host typo: address is missing")),
            "{}",
            p[4]
        );
    }
}
