//! Machines that enlist themselves (CONTRACTS.md §6, `netboot.discover`):
//! an unknown MAC that boots the provisioning network becomes a machine in
//! state `discovered` with a discovery boot (one boot of the live agent,
//! a short TTL); its agent enrolls with that boot's credential and
//! reports its hardware. No control loop works on it (it has no provider
//! record and no BMC) until an operator accepts it with its BMC: then it
//! is an inventory machine like any other (`machine_provided` under the
//! static inventory, `machine_bmc_boot` booting the network, its BMC in
//! `machine_accepted_bmc`, which the inventory lists).

use std::time::SystemTime;

use uuid::Uuid;

use super::{BmdbError, Provider, Tx};
use crate::mac::MacAddr;

/// A machine's firmware as its PXE client named it.
pub fn firmware_of_arch(arch: u16) -> &'static str {
    if arch == 0 { "bios" } else { "uefi" }
}

const ENLIST_MAC: &str = "INSERT INTO machine_boot_mac (mac, machine_id) VALUES ($1::text::macaddr, $2) \
     ON CONFLICT (mac) DO NOTHING";
const ENLIST: &str = "INSERT INTO machine_discovered (machine_id, mac, firmware, discovered_at, last_boot_at) \
     VALUES ($1, $2::text::macaddr, $3, now(), now())";

/// Enlists `mac` as a new discovered machine: its ID (the caller issues
/// its discovery boot, `boot::issue`, in the same transaction). None when
/// the MAC became a machine's meanwhile (another shepherd, or another
/// packet of the same client, enlisted it): nothing is written, and the
/// caller looks it up again.
pub async fn enlist(
    tx: &mut Tx<'_>,
    mac: MacAddr,
    firmware: &str,
) -> Result<Option<Uuid>, BmdbError> {
    let machine_id = Uuid::new_v4();
    tx.execute(
        "INSERT INTO machines (machine_id, machine_created_at) VALUES ($1, now())",
        &[&machine_id],
    )
    .await?;
    let mac_s = mac.to_string();
    if tx.execute(ENLIST_MAC, &[&mac_s, &machine_id]).await? == 0 {
        tx.execute("DELETE FROM machines WHERE machine_id = $1", &[&machine_id])
            .await?;
        return Ok(None);
    }
    tx.execute(ENLIST, &[&machine_id, &mac_s, &firmware])
        .await?;
    Ok(Some(machine_id))
}

/// A discovered machine (not accepted) boots the network again: counted,
/// true (the caller issues its new discovery boot, which voids the older
/// ones). False when it is not a discovered machine (accepted meanwhile,
/// or never was).
pub async fn boot_again(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<bool, BmdbError> {
    let n = tx
        .execute(
            "UPDATE machine_discovered SET last_boot_at = now(), boots = boots + 1 \
              WHERE machine_id = $1 AND accepted_at IS NULL",
            &[&machine_id],
        )
        .await?;
    Ok(n == 1)
}

/// What the fleet knows of a machine that enlisted itself.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Discovery {
    pub mac: String,
    pub firmware: String,
    #[serde(with = "humantime_serde")]
    pub discovered_at: SystemTime,
    #[serde(with = "humantime_serde")]
    pub last_boot_at: SystemTime,
    pub boots: i32,
    #[serde(with = "humantime_serde")]
    pub accepted_at: Option<SystemTime>,
    pub accepted_by: Option<String>,
    /// Accepted, its erasure not asked yet (waiting for its BMC).
    pub erase_pending: bool,
    /// Why the erasure's last ask was refused.
    pub erase_refused: Option<String>,
}

/// `machine_id`'s discovery, if it enlisted itself.
pub async fn of(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Option<Discovery>, BmdbError> {
    Ok(tx
        .query_opt(
            "SELECT mac::text, firmware, discovered_at, last_boot_at, boots, accepted_at, accepted_by, \
                    erase_pending, erase_refused \
               FROM machine_discovered WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?
        .map(|r| Discovery {
            mac: r.get(0),
            firmware: r.get(1),
            discovered_at: r.get(2),
            last_boot_at: r.get(3),
            boots: r.get(4),
            accepted_at: r.get(5),
            accepted_by: r.get(6),
            erase_pending: r.get(7),
            erase_refused: r.get(8),
        }))
}

/// An operator's acceptance: the machine's BMC, and the inventory host ID
/// it is listed under.
#[derive(Clone, PartialEq, Eq)]
pub struct Acceptance {
    /// None: `discovered-` and the MAC's twelve hex digits.
    pub host_id: Option<String>,
    pub url: String,
    pub username: String,
    pub password: String,
    pub system: Option<String>,
    /// `verify`, `insecure`, or a CA file's path.
    pub tls: String,
}

impl std::fmt::Debug for Acceptance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptance")
            .field("host_id", &self.host_id)
            .field("url", &self.url)
            .field("username", &self.username)
            .field("system", &self.system)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// The inventory host ID a discovered machine gets by default.
pub fn default_host_id(mac: &str) -> String {
    format!(
        "discovered-{}",
        mac.chars()
            .filter(char::is_ascii_hexdigit)
            .collect::<String>()
            .to_lowercase()
    )
}

/// Accepts discovered machine `machine_id` (the caller checked its state
/// and writes the audit): Ok(what was done) or Err(why not).
pub async fn accept(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    a: &Acceptance,
    actor: &str,
) -> Result<Result<String, String>, BmdbError> {
    let Some(row) = tx
        .query_opt(
            "SELECT mac::text, accepted_at IS NOT NULL FROM machine_discovered \
              WHERE machine_id = $1 AND (accepted_at IS NULL OR erase_pending) FOR UPDATE",
            &[&machine_id],
        )
        .await?
    else {
        return Ok(Err(format!(
            "machine {machine_id} did not enlist itself, or was accepted already"
        )));
    };
    let mac: String = row.get(0);
    if row.get::<_, bool>(1) {
        // Accepted before, its erasure still waiting (its BMC unread, or
        // not agreeing with its agent): this acceptance's BMC replaces
        // that one's, read afresh.
        tx.execute(
            "WITH a AS (DELETE FROM machine_accepted_bmc WHERE machine_id = $1), \
                  f AS (DELETE FROM machine_bmc_facts WHERE machine_id = $1) \
             DELETE FROM machine_provided WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?;
    }
    let host_id = a.host_id.clone().unwrap_or_else(|| default_host_id(&mac));
    let taken = tx
        .query_opt(
            "SELECT machine_id FROM machine_provided WHERE provider = $1 AND provider_id = $2 \
             UNION SELECT machine_id FROM machine_accepted_bmc WHERE host_id = $2",
            &[&Provider::None, &host_id],
        )
        .await?;
    if let Some(r) = taken {
        let other: Uuid = r.get(0);
        return Ok(Err(format!(
            "inventory host ID {host_id} is machine {other}'s already; give another (host_id)"
        )));
    }
    tx.execute(
        "INSERT INTO machine_accepted_bmc (machine_id, host_id, url, username, password, system, tls, accepted_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, now())",
        &[
            &machine_id,
            &host_id,
            &a.url,
            &a.username,
            &a.password,
            &a.system,
            &a.tls,
        ],
    )
    .await?;
    tx.execute(
        "INSERT INTO machine_provided (machine_id, provider, provider_id, provider_status) \
         VALUES ($1, $2, $3, 'Running')",
        &[&machine_id, &Provider::None, &host_id],
    )
    .await?;
    // Booted through its BMC, from the network at the MAC it enlisted
    // from: the Provisioner's own writers, as for a host listed so.
    let ids = [host_id.clone()];
    super::bmc_boot::set_bmc_boot_of(tx, Provider::None, &ids).await?;
    if let Ok(m) = mac.parse::<MacAddr>() {
        super::netboot::add_boot_macs(tx, Provider::None, &[(host_id.clone(), vec![m])]).await?;
    }
    tx.execute(
        "UPDATE machine_discovered SET accepted_at = now(), accepted_by = $2, erase_pending = true \
          WHERE machine_id = $1",
        &[&machine_id, &actor],
    )
    .await?;
    // Its discovery boots not used yet are void: from now on the Enroller
    // boots it through its BMC, when it needs to.
    tx.execute(
        "UPDATE machine_boot_credential SET expires_at = least(expires_at, now()) \
          WHERE machine_id = $1 AND used_at IS NULL",
        &[&machine_id],
    )
    .await?;
    Ok(Ok(format!(
        "accepted as inventory host {host_id} with BMC {} (boots the network from {mac}); \
         its disks are erased once its BMC is read and agrees with its agent, then it is available",
        a.url
    )))
}

/// An accepted machine as the static inventory lists it: its acceptance
/// (`host_id` always set), and what it enlisted with.
#[derive(Clone, Debug)]
pub struct AcceptedHost {
    pub machine_id: Uuid,
    pub mac: MacAddr,
    pub firmware: String,
    pub acceptance: Acceptance,
}

impl AcceptedHost {
    pub fn host_id(&self) -> &str {
        self.acceptance.host_id.as_deref().unwrap_or_default()
    }
}

/// Every accepted machine, by host ID.
pub async fn accepted(tx: &mut Tx<'_>) -> Result<Vec<AcceptedHost>, BmdbError> {
    let rows = tx
        .query(
            "SELECT a.machine_id, a.host_id, d.mac::text, d.firmware, a.url, a.username, a.password, \
                    a.system, a.tls \
               FROM machine_accepted_bmc a JOIN machine_discovered d ON d.machine_id = a.machine_id \
              ORDER BY a.host_id",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            Some(AcceptedHost {
                machine_id: r.get(0),
                mac: r.get::<_, String>(2).parse().ok()?,
                firmware: r.get(3),
                acceptance: Acceptance {
                    host_id: Some(r.get(1)),
                    url: r.get(4),
                    username: r.get(5),
                    password: r.get(6),
                    system: r.get(7),
                    tls: r.get(8),
                },
            })
        })
        .collect())
}

/// Accepted machines whose erasure waits, now that their BMC has been read
/// (`machine_bmc_facts`, its last read a success): each with who accepted
/// it. Locked for the
/// caller's transaction.
pub async fn erasures_due(tx: &mut Tx<'_>) -> Result<Vec<(Uuid, String)>, BmdbError> {
    Ok(tx
        .query(
            "SELECT d.machine_id, COALESCE(d.accepted_by, 'shepherd') FROM machine_discovered d \
               JOIN machine_bmc_facts f ON f.machine_id = d.machine_id AND f.read_error IS NULL \
              WHERE d.erase_pending FOR UPDATE OF d SKIP LOCKED",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// The erasure of accepted machine `machine_id` is asked (`Ok`) or was
/// refused (`Err`, why: kept, and its erasure still pending). True when
/// the refusal is new (worth a line in the log).
pub async fn erasure_asked(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    refused: Option<&str>,
) -> Result<bool, BmdbError> {
    Ok(tx
        .query_opt(
            "WITH old AS (SELECT erase_refused FROM machine_discovered WHERE machine_id = $1) \
             UPDATE machine_discovered SET erase_pending = ($2::text IS NOT NULL), erase_refused = $2 \
              WHERE machine_id = $1 \
             RETURNING (SELECT erase_refused FROM old) IS DISTINCT FROM $2::text",
            &[&machine_id, &refused],
        )
        .await?
        .is_some_and(|r| r.get(0)))
}

/// Clears the pending flag for the ask in hand (the life cycle allows a
/// deprovisioning only once the machine is no longer `discovered`).
pub async fn erasure_asking(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<(), BmdbError> {
    tx.execute(
        "UPDATE machine_discovered SET erase_pending = false WHERE machine_id = $1",
        &[&machine_id],
    )
    .await?;
    Ok(())
}
