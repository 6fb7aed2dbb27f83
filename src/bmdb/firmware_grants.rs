//! Grants to fetch one firmware image from shepherd's image server, one
//! for each update through a BMC that fetches its image itself
//! (`SimpleUpdate`): the grant's ID is the BMC's user name, a random
//! secret its password; only the secret's SHA-256 is kept, compared as a
//! digest. A grant is good for one image, until it expires.

use std::time::{Duration, SystemTime};

use sha2::Digest as _;
use uuid::Uuid;

use super::{BmdbError, Tx};

/// A grant as issued: its ID and secret (shown once, to the BMC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub grant_id: Uuid,
    pub secret: String,
    pub expires_at: SystemTime,
}

/// Issues a grant to fetch `image` for `machine_id`, good for `ttl`.
/// Grants expired a day ago are dropped on the way.
pub async fn issue(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    image: &str,
    ttl: Duration,
) -> Result<Grant, BmdbError> {
    tx.execute(
        "DELETE FROM firmware_grant WHERE expires_at < now() - interval '1 day'",
        &[],
    )
    .await?;
    let grant_id = Uuid::new_v4();
    let secret = format!("{:032x}", rand::random::<u128>());
    let digest = sha2::Sha256::digest(secret.as_bytes()).to_vec();
    let ttl_s = ttl.as_secs_f64();
    let expires_at: SystemTime = tx
        .query_one(
            "INSERT INTO firmware_grant (grant_id, machine_id, image, secret_sha256, expires_at) \
             VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5)) RETURNING expires_at",
            &[&grant_id, &machine_id, &image, &digest, &ttl_s],
        )
        .await?
        .get(0);
    Ok(Grant {
        grant_id,
        secret,
        expires_at,
    })
}

/// Whether `grant_id` with `secret` lets its holder fetch `image` now:
/// the machine it was issued for (its fetch recorded), or None (unknown,
/// another image, a wrong secret, expired).
pub async fn check(
    tx: &mut Tx<'_>,
    grant_id: Uuid,
    secret: &str,
    image: &str,
) -> Result<Option<Uuid>, BmdbError> {
    let digest = sha2::Sha256::digest(secret.as_bytes()).to_vec();
    Ok(tx
        .query_opt(
            "UPDATE firmware_grant SET fetched_at = now() \
             WHERE grant_id = $1 AND image = $2 AND secret_sha256 = $3 AND expires_at > now() \
             RETURNING machine_id",
            &[&grant_id, &image, &digest],
        )
        .await?
        .map(|r| r.get(0)))
}
