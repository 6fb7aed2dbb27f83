//! The protocol's names as people write and read them, and the checks of
//! a request that both ends make: one home, so that the API, the command
//! line, the pages, the BMDB and the agent spell and judge them alike.
//!
//! - erase modes: [`erase_mode_name`], [`parse_erase_mode`], [`ERASE_MODES`];
//! - installation phases: [`phase_name`];
//! - a request's checks: [`check_disk_hints`], [`check_erasure`] (beside
//!   the service's `check_image`, which needs the first-boot limits).

use crate::api::disk_erasure::Mode;
use crate::api::installation_progress::Phase;
use crate::api::{DiskErasure, DiskHints};

/// Every erase mode, as operators name them, in the order of their cost.
pub const ERASE_MODES: [(&str, Mode); 4] = [
    ("metadata", Mode::Metadata),
    ("discard", Mode::Discard),
    ("secure", Mode::Secure),
    ("overwrite", Mode::Overwrite),
];

/// An erase mode's name: `metadata`, `discard`, `secure`, `overwrite`.
pub fn erase_mode_name(m: Mode) -> &'static str {
    ERASE_MODES
        .iter()
        .find(|(_, mode)| *mode == m)
        .map(|(n, _)| *n)
        .unwrap_or("unknown")
}

/// The name of the mode a message carries (`unknown` for a number this
/// build does not know).
pub fn erase_mode_name_of(m: i32) -> &'static str {
    Mode::try_from(m).map(erase_mode_name).unwrap_or("unknown")
}

/// An erase mode from its name (surrounding spaces ignored; empty is the
/// default, `metadata`). The error names the values allowed.
pub fn parse_erase_mode(s: &str) -> Result<Mode, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(Mode::Metadata);
    }
    ERASE_MODES
        .iter()
        .find(|(n, _)| *n == s)
        .map(|(_, m)| *m)
        .ok_or_else(|| {
            format!(
                "{s:?} is not {}",
                ERASE_MODES
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// An installation phase's name, for people and JSON.
pub fn phase_name(p: i32) -> &'static str {
    match Phase::try_from(p).unwrap_or(Phase::Unknown) {
        Phase::Unknown => "unknown",
        Phase::Preparing => "preparing",
        Phase::Writing => "writing",
        Phase::Verifying => "verifying",
        Phase::Done => "done",
        Phase::Failed => "failed",
        Phase::Rebooting => "rebooting",
        Phase::Erasing => "erasing",
        Phase::FirstBoot => "first-boot",
    }
}

/// The longest deadline a request may give its agent.
pub const MAX_DEADLINE_SECONDS: i64 = 7 * 86400;

/// Checks disk hints; the error names the field under `prefix`
/// (`image.disk`, `disk`).
pub fn check_disk_hints(prefix: &str, h: &DiskHints) -> Result<(), String> {
    for (field, v) in [
        ("min_size_bytes", h.min_size_bytes),
        ("max_size_bytes", h.max_size_bytes),
    ] {
        if v.is_some_and(|v| v < 0) {
            return Err(format!("{prefix}.{field}: negative"));
        }
    }
    if let (Some(min), Some(max)) = (h.min_size_bytes, h.max_size_bytes) {
        if min > max {
            return Err(format!(
                "{prefix}: min_size_bytes {min} is more than max_size_bytes {max}"
            ));
        }
    }
    Ok(())
}

/// Checks what can be checked of an erasure before any agent sees it: a
/// known mode, a deadline within 7 days, sane disk hints. The error names
/// the field.
pub fn check_erasure(e: &DiskErasure) -> Result<(), String> {
    if Mode::try_from(e.mode).is_err() {
        return Err(format!("mode: {} is not a known erase mode", e.mode));
    }
    if !(0..=MAX_DEADLINE_SECONDS).contains(&e.deadline_seconds) {
        return Err(format!(
            "deadline: {} s is not from 1s to 7d",
            e.deadline_seconds
        ));
    }
    if let Some(h) = &e.disk {
        check_disk_hints("disk", h)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_name_parses_back_to_its_mode() {
        for (name, mode) in ERASE_MODES {
            assert_eq!(erase_mode_name(mode), name);
            assert_eq!(parse_erase_mode(name), Ok(mode));
            assert_eq!(erase_mode_name_of(mode as i32), name);
        }
        assert_eq!(parse_erase_mode(" "), Ok(Mode::Metadata));
        let e = parse_erase_mode("shred").unwrap_err();
        assert!(e.contains("\"shred\"") && e.contains("overwrite"), "{e}");
        assert_eq!(erase_mode_name_of(99), "unknown");
    }

    #[test]
    fn an_erasure_is_checked_naming_the_field() {
        let ok = DiskErasure::default();
        assert_eq!(check_erasure(&ok), Ok(()));
        let e = DiskErasure {
            deadline_seconds: MAX_DEADLINE_SECONDS + 1,
            ..ok.clone()
        };
        assert!(check_erasure(&e).unwrap_err().starts_with("deadline:"));
        let e = DiskErasure {
            deadline_seconds: -1,
            ..ok.clone()
        };
        assert!(check_erasure(&e).unwrap_err().starts_with("deadline:"));
        let e = DiskErasure {
            disk: Some(DiskHints {
                min_size_bytes: Some(10),
                max_size_bytes: Some(5),
                ..DiskHints::default()
            }),
            ..ok.clone()
        };
        assert!(
            check_erasure(&e)
                .unwrap_err()
                .starts_with("disk: min_size_bytes 10")
        );
        let e = DiskErasure {
            disk: Some(DiskHints {
                max_size_bytes: Some(-5),
                ..DiskHints::default()
            }),
            ..ok.clone()
        };
        assert_eq!(
            check_erasure(&e).unwrap_err(),
            "disk.max_size_bytes: negative"
        );
        let e = DiskErasure { mode: 42, ..ok };
        assert!(check_erasure(&e).unwrap_err().starts_with("mode:"));
    }
}
