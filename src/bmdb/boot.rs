//! Boots into shepherd's boot image and their credentials (CONTRACTS.md
//! §5): each boot of a machine through its BMC gets a random credential,
//! carried only in that boot's copy of the image; the live agent presents
//! it once, with the key it made, and that key becomes the machine's agent
//! key as a takeover's would. A credential is good for one enrollment of
//! its own machine, until it expires; a newer boot of the machine voids
//! the older ones.

use std::time::{Duration, SystemTime};

use sha2::Digest as _;

use uuid::Uuid;

use super::{BmdbError, Tx};

/// A credential's length in bytes.
pub const CREDENTIAL_LEN: usize = 32;

/// A boot issued: the URL's id, and what its data carries.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedBoot {
    pub boot_id: Uuid,
    pub machine_id: Uuid,
    pub credential: Vec<u8>,
    pub expires_at: SystemTime,
    /// Its copy of the boot image is served only to a fetcher presenting
    /// the boot's [`media_credentials`].
    pub media_auth: bool,
}

impl std::fmt::Debug for IssuedBoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedBoot")
            .field("boot_id", &self.boot_id)
            .field("machine_id", &self.machine_id)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

const VOID_OLDER: &str = "UPDATE machine_boot_credential SET expires_at = least(expires_at, now()) \
     WHERE machine_id = $1 AND used_at IS NULL";
const ISSUE: &str = "INSERT INTO machine_boot_credential \
         (machine_id, credential, issued_at, expires_at) \
     VALUES ($1, $2, now(), now() + make_interval(secs => $3)) \
     RETURNING boot_id, expires_at";

/// Issues a boot of `machine_id` whose credential is good for `ttl`; the
/// machine's earlier boots not yet used are void from now on.
pub async fn issue(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    ttl: Duration,
) -> Result<IssuedBoot, BmdbError> {
    let credential: [u8; CREDENTIAL_LEN] = rand::random();
    tx.execute(VOID_OLDER, &[&machine_id]).await?;
    let r = tx
        .query_one(
            ISSUE,
            &[&machine_id, &credential.as_slice(), &ttl.as_secs_f64()],
        )
        .await?;
    Ok(IssuedBoot {
        boot_id: r.get(0),
        machine_id,
        credential: credential.to_vec(),
        expires_at: r.get(1),
        media_auth: false,
    })
}

/// The user name and password a BMC presents when it fetches a boot's copy
/// of the boot image (Redfish `InsertMedia`'s `UserName`/`Password`),
/// derived from the boot's credential: nothing more to store, and useless
/// once the boot is.
pub fn media_credentials(credential: &[u8]) -> (String, String) {
    let mut h = sha2::Sha256::new();
    h.update(b"shepherd boot media\0");
    h.update(credential);
    let d = h.finalize();
    ("shepherd-boot".to_string(), hex::encode(&d[..10]))
}

/// Whether boot `boot_id`'s copy is served only with its media
/// credentials.
pub async fn set_media_auth(tx: &mut Tx<'_>, boot_id: Uuid, on: bool) -> Result<(), BmdbError> {
    tx.execute(
        "UPDATE machine_boot_credential SET media_auth = $2 WHERE boot_id = $1",
        &[&boot_id, &on],
    )
    .await?;
    Ok(())
}

const TO_SERVE: &str = "SELECT machine_id, credential, expires_at, media_auth FROM machine_boot_credential \
     WHERE boot_id = $1 AND used_at IS NULL AND expires_at > now()";

/// The boot `boot_id`, while its copy of the image may be served: not
/// used, not expired.
pub async fn to_serve(tx: &mut Tx<'_>, boot_id: Uuid) -> Result<Option<IssuedBoot>, BmdbError> {
    Ok(tx
        .query_opt(TO_SERVE, &[&boot_id])
        .await?
        .map(|r| IssuedBoot {
            boot_id,
            machine_id: r.get(0),
            credential: r.get(1),
            expires_at: r.get(2),
            media_auth: r.get(3),
        }))
}

/// How an enrollment ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enrolled {
    /// The key is the machine's agent key now.
    Enrolled { boot_id: Uuid },
    /// The same agent again (its answer was lost): nothing changed.
    Again { boot_id: Uuid },
    /// Refused, and why (the same words for an unknown machine and a
    /// wrong credential).
    Refused(String),
}

const CANDIDATES: &str = "SELECT boot_id, credential, expires_at <= now(), used_at IS NOT NULL, \
            agent_public_key \
     FROM machine_boot_credential WHERE machine_id = $1 \
     ORDER BY issued_at DESC FOR UPDATE";
const USE: &str = "UPDATE machine_boot_credential SET used_at = now(), agent_public_key = $2 \
     WHERE boot_id = $1";

fn digest(b: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(b).into()
}

/// The live agent holding `key` presents `credential` for `machine_id`:
/// when it is this machine's, unused and unexpired, `key` becomes the
/// machine's agent key (with `endpoint`, as a takeover records it).
pub async fn enroll(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    credential: &[u8],
    key: &[u8],
    endpoint: &str,
) -> Result<Enrolled, BmdbError> {
    // Digests compared, not the secrets: no early exit on a secret's bytes.
    let presented = digest(credential);
    let rows = tx.query(CANDIDATES, &[&machine_id]).await?;
    let Some(r) = rows
        .iter()
        .find(|r| digest(&r.get::<_, Vec<u8>>(1)) == presented)
    else {
        return Ok(Enrolled::Refused(
            "no boot of this machine has this credential".into(),
        ));
    };
    let boot_id: Uuid = r.get(0);
    let (expired, used): (bool, bool) = (r.get(2), r.get(3));
    let enrolled_key: Option<Vec<u8>> = r.get(4);
    if used {
        return Ok(if enrolled_key.as_deref() == Some(key) {
            Enrolled::Again { boot_id }
        } else {
            Enrolled::Refused(format!(
                "the credential of boot {boot_id} was used already, by another agent"
            ))
        });
    }
    if expired {
        return Ok(Enrolled::Refused(format!(
            "the credential of boot {boot_id} expired (or a newer boot of the machine voided it)"
        )));
    }
    tx.execute(USE, &[&boot_id, &key]).await?;
    super::machines::set_agent_started(tx, machine_id, key, Some(endpoint)).await?;
    Ok(Enrolled::Enrolled { boot_id })
}

/// A machine's latest boot, as the Enroller resumes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatestBoot {
    pub boot_id: Uuid,
    pub issued_at: SystemTime,
    /// The BMC took it (media inserted, machine reset).
    pub media_inserted_at: Option<SystemTime>,
    /// Its credential has not expired (nor been voided).
    pub live: bool,
    pub used_at: Option<SystemTime>,
    pub media_ended_at: Option<SystemTime>,
}

/// `machine_id`'s latest boot, if any.
pub async fn latest(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Option<LatestBoot>, BmdbError> {
    let r = tx
        .query_opt(
            "SELECT boot_id, issued_at, used_at, media_ended_at, media_inserted_at, \
                    expires_at > now() \
               FROM machine_boot_credential \
             WHERE machine_id = $1 ORDER BY issued_at DESC LIMIT 1",
            &[&machine_id],
        )
        .await?;
    Ok(r.map(|r| LatestBoot {
        boot_id: r.get(0),
        issued_at: r.get(1),
        used_at: r.get(2),
        media_ended_at: r.get(3),
        media_inserted_at: r.get(4),
        live: r.get(5),
    }))
}

/// When boot `boot_id`'s agent enrolled, if it has.
pub async fn used_at(tx: &mut Tx<'_>, boot_id: Uuid) -> Result<Option<SystemTime>, BmdbError> {
    Ok(tx
        .query_opt(
            "SELECT used_at FROM machine_boot_credential WHERE boot_id = $1",
            &[&boot_id],
        )
        .await?
        .and_then(|r| r.get(0)))
}

/// Boot `boot_id` was handed to the BMC (media inserted, machine reset,
/// or about to be): a worker taking over waits for it, never resets again.
pub async fn media_inserted(tx: &mut Tx<'_>, boot_id: Uuid) -> Result<(), BmdbError> {
    tx.execute(
        "UPDATE machine_boot_credential SET media_inserted_at = now() WHERE boot_id = $1",
        &[&boot_id],
    )
    .await?;
    Ok(())
}

/// Boot `boot_id`'s media was ejected (and its override cleared); if it
/// was not used yet, its credential is void from now on.
pub async fn media_ended(tx: &mut Tx<'_>, boot_id: Uuid) -> Result<(), BmdbError> {
    tx.execute(
        "UPDATE machine_boot_credential SET media_ended_at = now(), \
                expires_at = CASE WHEN used_at IS NULL THEN least(expires_at, now()) ELSE expires_at END \
          WHERE boot_id = $1",
        &[&boot_id],
    )
    .await?;
    Ok(())
}
