//! What the agent did with the last generation it was asked to install,
//! kept in a small file beside its state (written whole or not at all, so
//! a crash leaves the old record or the new one). An agent
//! that restarts finds it and answers that generation from it instead of
//! installing it again.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Begun and not known to have ended: the agent restarted midway.
    Started,
    Succeeded,
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub generation: i64,
    pub outcome: Outcome,
    /// The disk written.
    pub disk: Option<PathBuf>,
    /// Whether the request asked for a reboot once reported.
    pub reboot: bool,
    /// The generation erases disks (cut short, it is run again).
    pub erase: bool,
}

/// `key=value` lines; the error is the last line, so it may hold anything.
pub fn write(path: &Path, r: &Record) -> std::io::Result<()> {
    let (state, error) = match &r.outcome {
        Outcome::Started => ("started", None),
        Outcome::Succeeded => ("succeeded", None),
        Outcome::Failed(e) => ("failed", Some(e.replace('\n', " "))),
    };
    let mut text = format!(
        "generation={}\nstate={state}\nreboot={}\n",
        r.generation, r.reboot
    );
    if r.erase {
        text += "erase=true\n";
    }
    if let Some(d) = &r.disk {
        text += &format!("disk={}\n", d.display());
    }
    if let Some(e) = error {
        text += &format!("error={e}\n");
    }
    crate::files::write_private(path, text.as_bytes())
}

/// The record at `path`, if there is a readable one.
pub fn read(path: &Path) -> Option<Record> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut generation = None;
    let mut state = None;
    let mut disk = None;
    let mut error = String::new();
    let mut reboot = false;
    let mut erase = false;
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        match k {
            "generation" => generation = v.parse().ok(),
            "state" => state = Some(v.to_string()),
            "disk" => disk = Some(PathBuf::from(v)),
            "error" => error = v.to_string(),
            "reboot" => reboot = v == "true",
            "erase" => erase = v == "true",
            _ => {}
        }
    }
    let outcome = match state.as_deref()? {
        "started" => Outcome::Started,
        "succeeded" => Outcome::Succeeded,
        "failed" => Outcome::Failed(error),
        _ => return None,
    };
    Some(Record {
        generation: generation?,
        outcome,
        disk,
        reboot,
        erase,
    })
}
