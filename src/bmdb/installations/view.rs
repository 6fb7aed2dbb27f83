//! An installation read back, as the pages and the API show it: the
//! request, the agent's latest progress, the report's error, the history.

use std::time::SystemTime;

use prost::Message as _;
use shepherd_proto::api::{InstallationProgress, OsInstallationReport, os_installation_report};
use uuid::Uuid;

use crate::bmdb::{BmdbError, InstallationResult, Tx};

/// A machine's installation as the pages and the API show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Installation {
    pub generation: i32,
    pub image_url: String,
    pub image_digest: String,
    pub requested_by: String,
    pub requested_at: SystemTime,
    pub rollout_id: Option<Uuid>,
    /// `installing`, `installed` or `install-failed`; for an erasure
    /// `cleaning`, `available` or `clean-failed`.
    pub state: String,
    pub kind: super::Kind,
    /// An erasure's mode.
    pub erase_mode: Option<String>,
    /// The first-boot data, as digests ([`first_boot_summary`]).
    pub first_boot: Option<String>,
    /// The agent's latest progress, and when it came.
    pub progress: Option<(InstallationProgress, SystemTime)>,
    /// The report of this generation: its result and, for an error, what
    /// the agent said.
    pub result: Option<(InstallationResult, Option<String>)>,
    pub history: Vec<HistoryEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    pub generation: i32,
    pub event: String,
    pub timestamp: SystemTime,
    pub detail: Option<String>,
}

const VIEW: &str = "SELECT i.generation, i.image_url, i.image_digest, i.requested_by, i.requested_at, \
            i.rollout_id, s.installation, p.progress_raw, p.progress_at, p.generation, \
            rp.generation, rp.os_installation_result, rp.os_installation_report_raw, \
            i.kind, i.erase_mode, i.first_boot \
     FROM machine_installation i \
     JOIN machine_summary s ON s.machine_id = i.machine_id \
     LEFT JOIN machine_installation_progress p ON p.machine_id = i.machine_id \
     LEFT JOIN machine_os_installation_report rp ON rp.machine_id = i.machine_id \
     WHERE i.machine_id = $1";
const HISTORY: &str = "SELECT generation, event, \"timestamp\", detail FROM installation_history \
     WHERE machine_id = $1 ORDER BY \"timestamp\", generation LIMIT 200";

/// The error an `OSInstallationReport`'s bytes carry, if they decode to
/// one.
pub fn report_error(raw: &[u8]) -> Option<String> {
    match OsInstallationReport::decode(raw).ok()?.result? {
        os_installation_report::Result::Error(e) => Some(e.error),
        os_installation_report::Result::Success(_) => None,
    }
}

/// The installation shepherd asked of `machine_id`, if any.
pub async fn installation(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
) -> Result<Option<Installation>, BmdbError> {
    let Some(r) = tx.query_opt(VIEW, &[&machine_id]).await? else {
        return Ok(None);
    };
    let generation: i32 = r.get(0);
    let progress = match (
        r.get::<_, Option<Vec<u8>>>(7),
        r.get::<_, Option<SystemTime>>(8),
        r.get::<_, Option<i64>>(9),
    ) {
        (Some(raw), Some(at), Some(g)) if g == i64::from(generation) => {
            InstallationProgress::decode(raw.as_slice())
                .ok()
                .map(|p| (p, at))
        }
        _ => None,
    };
    let result = match (
        r.get::<_, Option<i32>>(10),
        r.get::<_, Option<InstallationResult>>(11),
        r.get::<_, Option<Vec<u8>>>(12),
    ) {
        (Some(g), Some(res), raw) if g == generation => {
            Some((res, raw.as_deref().and_then(report_error)))
        }
        _ => None,
    };
    let history = tx
        .query(HISTORY, &[&machine_id])
        .await?
        .iter()
        .map(|h| HistoryEntry {
            generation: h.get(0),
            event: h.get(1),
            timestamp: h.get(2),
            detail: h.get(3),
        })
        .collect();
    Ok(Some(Installation {
        generation,
        image_url: r.get(1),
        image_digest: r.get(2),
        requested_by: r.get(3),
        requested_at: r.get(4),
        rollout_id: r.get(5),
        state: r
            .get::<_, Option<String>>(6)
            .unwrap_or_else(|| "installing".into()),
        kind: r.get(13),
        erase_mode: r.get(14),
        first_boot: r.get(15),
        progress,
        result,
        history,
    }))
}

/// A machine installing or erasing now, with the agent's latest progress.
#[derive(Debug, Clone, PartialEq)]
pub struct UnderWay {
    pub machine_id: Uuid,
    pub provider_id: Option<String>,
    /// `installing` or `cleaning` (erasing its disks).
    pub state: String,
    /// The agent's latest progress of this generation, and when it came.
    pub progress: Option<(InstallationProgress, SystemTime)>,
}

impl UnderWay {
    /// How far, in percent, when the agent knows the total.
    pub fn percent(&self) -> Option<f64> {
        let (p, _) = self.progress.as_ref()?;
        let done = if p.phase() == shepherd_proto::api::installation_progress::Phase::Erasing {
            p.bytes_written
        } else {
            p.bytes_fetched
        };
        (p.bytes_total > 0).then(|| (done as f64 * 100.0 / p.bytes_total as f64).clamp(0.0, 100.0))
    }

    /// The agent's phase, in words (`writing`, `erasing`, …).
    pub fn phase(&self) -> Option<String> {
        let (p, _) = self.progress.as_ref()?;
        Some(
            p.phase()
                .as_str_name()
                .trim_start_matches("PHASE_")
                .to_lowercase()
                .replace('_', " "),
        )
    }
}

/// The machines installing or erasing now (a range of the kept states'
/// index), `limit` at most, in provider ID order.
const UNDER_WAY: &str = "SELECT s.machine_id, s.provider_id, s.state, r.progress_raw, r.progress_at, \
       r.generation, i.generation FROM machine_summary s \
       LEFT JOIN machine_installation_progress r ON r.machine_id = s.machine_id \
       LEFT JOIN machine_os_installation_request i ON i.machine_id = s.machine_id \
     WHERE s.state IN ('installing', 'cleaning') \
     ORDER BY s.state, s.provider_id, s.machine_id LIMIT $1";

pub async fn under_way(tx: &mut Tx<'_>, limit: i64) -> Result<Vec<UnderWay>, BmdbError> {
    Ok(tx
        .query(UNDER_WAY, &[&limit])
        .await?
        .iter()
        .map(|r| {
            let progress = match (
                r.get::<_, Option<Vec<u8>>>(3),
                r.get::<_, Option<SystemTime>>(4),
                r.get::<_, Option<i64>>(5),
                r.get::<_, Option<i32>>(6),
            ) {
                (Some(raw), Some(at), Some(g), Some(asked)) if g == i64::from(asked) => {
                    InstallationProgress::decode(raw.as_slice())
                        .ok()
                        .map(|p| (p, at))
                }
                _ => None,
            };
            UnderWay {
                machine_id: r.get(0),
                provider_id: r.get(1),
                state: r.get(2),
                progress,
            }
        })
        .collect())
}
