//! The agent callback as the fleet shares it: one CA for every shepherd on
//! this BMDB (`callback_ca`), and which callback endpoints are served, and
//! since when without a break (`callback_endpoint`).
//!
//! Silence is judged only while someone was listening: a machine's agent
//! counts as silent only if the endpoint it was given has been served for
//! the whole threshold (plus the agents' retry allowance). A shepherd's
//! session heartbeat extends `served_until` for the endpoint it serves;
//! `serving_since` starts over when `served_until` had passed, so a
//! fleet-wide callback outage (every shepherd down, or the database away
//! for longer than a session interval) restarts the clock, while one
//! shepherd of several dying does not.

use std::time::{Duration, SystemTime};

use super::{BmdbError, Tx};

const CA_READ: &str = "SELECT certificate, private_key FROM callback_ca WHERE callback_ca_id = 1";
const CA_STORE: &str = "INSERT INTO callback_ca (callback_ca_id, certificate, private_key) \
     VALUES (1, $1, $2) ON CONFLICT (callback_ca_id) DO NOTHING";

/// Extends the endpoint's service by `$2` seconds from now; restarts its
/// unbroken stretch if it had lapsed.
pub(crate) const SERVE: &str = "INSERT INTO callback_endpoint (endpoint, serving_since, served_until) \
     VALUES ($1, now(), now() + make_interval(secs => $2)) \
     ON CONFLICT (endpoint) DO UPDATE SET \
       serving_since = CASE WHEN callback_endpoint.served_until < now() \
                            THEN now() ELSE callback_endpoint.serving_since END, \
       served_until = GREATEST(callback_endpoint.served_until, EXCLUDED.served_until)";

const JUDGEABLE: &str = "SELECT endpoint FROM callback_endpoint \
     WHERE served_until > now() AND serving_since <= now() - make_interval(secs => $1)";

/// Every endpoint, with the agents told it: their tally (migration V26),
/// not a count of every agent.
const ALL: &str = "SELECT endpoint, serving_since, served_until, served_until > now(), \
       machine_tally_count('endpoint/' || endpoint) FROM callback_endpoint \
     ORDER BY endpoint";

/// The fleet's callback CA: the DER certificate and its key (PKCS#8 PEM).
pub struct CallbackCa {
    pub certificate: Vec<u8>,
    pub private_key: String,
}

impl std::fmt::Debug for CallbackCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallbackCa")
            .field("certificate_bytes", &self.certificate.len())
            .finish_non_exhaustive()
    }
}

/// The CA every shepherd on this BMDB serves agents with: the stored one,
/// or `candidate` (made only when none is stored) stored as the fleet's.
/// Concurrent first starts agree: one insert wins, every caller reads it.
pub async fn ca(
    tx: &mut Tx<'_>,
    candidate: impl FnOnce() -> Result<CallbackCa, String>,
) -> Result<CallbackCa, BmdbError> {
    if let Some(r) = tx.query_opt(CA_READ, &[]).await? {
        return Ok(CallbackCa {
            certificate: r.get(0),
            private_key: r.get(1),
        });
    }
    let c = candidate().map_err(BmdbError::Invalid)?;
    tx.execute(CA_STORE, &[&c.certificate, &c.private_key])
        .await?;
    let r = tx.query_one(CA_READ, &[]).await?;
    Ok(CallbackCa {
        certificate: r.get(0),
        private_key: r.get(1),
    })
}

/// Records that `endpoint` is served for `for_` from now.
pub async fn serve(tx: &mut Tx<'_>, endpoint: &str, for_: Duration) -> Result<(), BmdbError> {
    tx.execute(SERVE, &[&endpoint, &for_.as_secs_f64()]).await?;
    Ok(())
}

/// The endpoints served without a break for at least `served_for`: only
/// agents given one of these can be judged silent.
pub async fn judgeable(tx: &mut Tx<'_>, served_for: Duration) -> Result<Vec<String>, BmdbError> {
    Ok(tx
        .query(JUDGEABLE, &[&served_for.as_secs_f64()])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// One endpoint as the pages show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedEndpoint {
    pub endpoint: String,
    pub serving_since: SystemTime,
    pub served_until: SystemTime,
    pub served: bool,
    /// Agents told this endpoint at their takeover.
    pub agents: i64,
}

/// Every endpoint ever served, served or not now.
pub async fn endpoints(tx: &mut Tx<'_>) -> Result<Vec<ServedEndpoint>, BmdbError> {
    Ok(tx
        .query(ALL, &[])
        .await?
        .iter()
        .map(|r| ServedEndpoint {
            endpoint: r.get(0),
            serving_since: r.get(1),
            served_until: r.get(2),
            served: r.get(3),
            agents: r.get(4),
        })
        .collect())
}
