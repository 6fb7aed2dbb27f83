//! Network boot in the BMDB (CONTRACTS.md §6): which MACs belong to which
//! machine (kept by the Provisioner from the inventory), the boot a PXE
//! client's MAC is answered with, and the addresses handed out when the
//! network boot service is the provisioning network's DHCP server.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use uuid::Uuid;

use super::{BmdbError, Provider, Tx};
use crate::mac::MacAddr;

/// `hosts` as the statements below take them: each (provider ID, MAC)
/// pair as two parallel arrays, and the provider IDs.
fn pairs(hosts: &[(String, Vec<MacAddr>)]) -> (Vec<String>, Vec<String>, Vec<String>) {
    let (ids, macs) = hosts
        .iter()
        .flat_map(|(id, macs)| macs.iter().map(move |m| (id.clone(), m.to_string())))
        .unzip();
    (ids, macs, hosts.iter().map(|(id, _)| id.clone()).collect())
}

/// Each (provider ID, MAC) of `$2`/`$3` recorded for `$1`'s machine of
/// that ID (a MAC moved to another machine follows it).
const ADD_MACS: &str = "INSERT INTO machine_boot_mac (mac, machine_id) \
     SELECT l.mac::macaddr, p.machine_id \
       FROM unnest($2::text[], $3::text[]) AS l(id, mac) \
       JOIN machine_provided p ON p.provider = $1 AND p.provider_id = l.id \
     ON CONFLICT (mac) DO UPDATE SET machine_id = EXCLUDED.machine_id \
      WHERE machine_boot_mac.machine_id <> EXCLUDED.machine_id";

/// Makes the boot MACs of `provider`'s machines those of `hosts`
/// (provider ID, its MACs) and their `machine_bmc_boot.via` what `hosts`
/// says (`network` for the listed ones). Returns how many rows changed.
pub async fn set_boot_macs(
    tx: &mut Tx<'_>,
    provider: Provider,
    hosts: &[(String, Vec<MacAddr>)],
) -> Result<u64, BmdbError> {
    let (ids, macs, network) = pairs(hosts);
    let removed = tx
        .execute(
            "DELETE FROM machine_boot_mac b USING machine_provided p \
              WHERE p.machine_id = b.machine_id AND p.provider = $1 \
                AND NOT EXISTS (SELECT 1 FROM unnest($2::text[], $3::text[]) AS l(id, mac) \
                                 WHERE l.id = p.provider_id AND l.mac::macaddr = b.mac)",
            &[&provider, &ids, &macs],
        )
        .await?;
    let added = tx.execute(ADD_MACS, &[&provider, &ids, &macs]).await?;
    let via = tx
        .execute(
            "UPDATE machine_bmc_boot b \
                SET via = CASE WHEN p.provider_id = ANY($2) THEN 'network' ELSE 'virtual-media' END \
               FROM machine_provided p \
              WHERE p.machine_id = b.machine_id AND p.provider = $1 \
                AND b.via <> CASE WHEN p.provider_id = ANY($2) THEN 'network' ELSE 'virtual-media' END",
            &[&provider, &network],
        )
        .await?;
    Ok(removed + added + via)
}

/// Records `hosts`' boot MACs (a machine just created), leaving the others
/// be; its `machine_bmc_boot.via` becomes `network`.
pub async fn add_boot_macs(
    tx: &mut Tx<'_>,
    provider: Provider,
    hosts: &[(String, Vec<MacAddr>)],
) -> Result<u64, BmdbError> {
    let (ids, macs, network) = pairs(hosts);
    let added = tx.execute(ADD_MACS, &[&provider, &ids, &macs]).await?;
    tx.execute(
        "UPDATE machine_bmc_boot b SET via = 'network' FROM machine_provided p \
          WHERE p.machine_id = b.machine_id AND p.provider = $1 AND p.provider_id = ANY($2)",
        &[&provider, &network],
    )
    .await?;
    Ok(added)
}

/// The boot a PXE client's MAC is answered with: its machine has a boot
/// issued, not used, not expired, not ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacBoot {
    pub machine_id: Uuid,
    pub boot_id: Uuid,
}

/// What the network boot service knows of a MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacLookup {
    /// A machine's, with a boot to answer.
    Boot(MacBoot),
    /// A machine's, with nothing to boot now (it boots its disk);
    /// `discovered`: one that enlisted itself and is not accepted yet.
    NoBoot { machine_id: Uuid, discovered: bool },
    /// No machine's.
    Unknown,
}

/// What `mac` is answered with.
pub async fn lookup(tx: &mut Tx<'_>, mac: MacAddr) -> Result<MacLookup, BmdbError> {
    let r = tx
        .query_opt(
            "SELECT m.machine_id, \
                    (SELECT b.boot_id FROM machine_boot_credential b \
                      WHERE b.machine_id = m.machine_id AND b.used_at IS NULL \
                        AND b.expires_at > now() AND b.media_ended_at IS NULL \
                      ORDER BY b.issued_at DESC LIMIT 1), \
                    EXISTS (SELECT 1 FROM machine_discovered d \
                             WHERE d.machine_id = m.machine_id AND d.accepted_at IS NULL) \
               FROM machine_boot_mac m WHERE m.mac = $1::text::macaddr",
            &[&mac.to_string()],
        )
        .await?;
    Ok(match r {
        None => MacLookup::Unknown,
        Some(r) => match r.get::<_, Option<Uuid>>(1) {
            Some(boot_id) => MacLookup::Boot(MacBoot {
                machine_id: r.get(0),
                boot_id,
            }),
            None => MacLookup::NoBoot {
                machine_id: r.get(0),
                discovered: r.get(2),
            },
        },
    })
}

/// A machine's boot MACs, for the pages and the API.
pub async fn macs_of(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Vec<MacAddr>, BmdbError> {
    let rows = tx
        .query(
            "SELECT mac::text FROM machine_boot_mac WHERE machine_id = $1 ORDER BY mac",
            &[&machine_id],
        )
        .await?;
    Ok(rows
        .iter()
        .filter_map(|r| r.get::<_, String>(0).parse().ok())
        .collect())
}

/// How a machine booted through its BMC boots (`virtual-media`,
/// `network`), None when it does not.
pub async fn via(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<Option<String>, BmdbError> {
    Ok(tx
        .query_opt(
            "SELECT via FROM machine_bmc_boot WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?
        .map(|r| r.get(0)))
}

fn v4(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(_) => None,
    }
}

/// The first free address of the pool (`$2` and `$3` more), `$4` first if
/// it is free and in the pool, held for `$1` for `$5` seconds.
const OFFER_FREE: &str = "INSERT INTO netboot_lease (address, mac, expires_at, granted, updated_at) \
     SELECT a, $1::text::macaddr, now() + make_interval(secs => $5), false, now() FROM ( \
       SELECT a FROM ( \
           SELECT $2::inet + ((g + $6::bigint) % ($3::bigint + 1)) AS a, 0 AS pref, g AS ord \
             FROM generate_series(0, $3::bigint) g \
           UNION ALL SELECT $4::inet, -1, 0 \
            WHERE $4::inet IS NOT NULL AND $4::inet BETWEEN $2::inet AND $2::inet + $3::bigint \
         ) c WHERE NOT EXISTS (SELECT 1 FROM netboot_lease l WHERE l.address = c.a) \
         ORDER BY pref, ord LIMIT 1) f \
     ON CONFLICT DO NOTHING RETURNING address";

/// How long an offered address is held for the request that takes it.
pub const OFFER_HOLD: Duration = Duration::from_secs(60);

/// Times an offer looks for an address again after its insert conflicted
/// with another offer's (both picked one free address; or one MAC's
/// discover resent while the first was answered).
const OFFER_TRIES: usize = 8;

/// Where in a pool of `size + 1` addresses `mac` looks first: its own
/// place (so that machines booting at once rarely pick one address, and a
/// machine tends to get the same one each boot).
fn pool_place(mac: &MacAddr, size: i64) -> i64 {
    let h = mac
        .to_string()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    (h % (size as u64 + 1)) as i64
}

/// An address for `mac` from `first..=last` (in `mode = "dhcp"`): the one
/// it holds, else `wanted` if it is free and in the pool, else the first
/// free one from the MAC's own place in the pool; held for
/// [`OFFER_HOLD`] (or kept as granted). None: the pool is full.
pub async fn offer(
    tx: &mut Tx<'_>,
    mac: MacAddr,
    first: Ipv4Addr,
    last: Ipv4Addr,
    wanted: Option<Ipv4Addr>,
) -> Result<Option<Ipv4Addr>, BmdbError> {
    let mac_addr = mac;
    let mac = mac.to_string();
    // Expired leases and offers give their addresses back.
    tx.execute(
        "DELETE FROM netboot_lease WHERE expires_at < now() - interval '10 seconds'",
        &[],
    )
    .await?;
    let size = i64::from(u32::from(last) - u32::from(first));
    let place = pool_place(&mac_addr, size);
    let wanted = wanted.map(IpAddr::V4);
    for _ in 0..OFFER_TRIES {
        if let Some(r) = tx
            .query_opt(
                "UPDATE netboot_lease SET expires_at = greatest(expires_at, now() + make_interval(secs => $2)), \
                        updated_at = now() \
                  WHERE mac = $1::text::macaddr AND address BETWEEN $3 AND $4 RETURNING address",
                &[&mac, &OFFER_HOLD.as_secs_f64(), &IpAddr::V4(first), &IpAddr::V4(last)],
            )
            .await?
        {
            return Ok(v4(r.get(0)));
        }
        // A lease outside today's pool is given up.
        tx.execute(
            "DELETE FROM netboot_lease WHERE mac = $1::text::macaddr",
            &[&mac],
        )
        .await?;
        let r = tx
            .query_opt(
                OFFER_FREE,
                &[
                    &mac,
                    &IpAddr::V4(first),
                    &size,
                    &wanted,
                    &OFFER_HOLD.as_secs_f64(),
                    &place,
                ],
            )
            .await?;
        if let Some(r) = r {
            return Ok(v4(r.get(0)));
        }
        // Nothing inserted: the pool is full, or another offer took the
        // address (or this MAC's row) meanwhile; its commit is seen now.
        let free = tx
            .query_one(
                "SELECT count(*) < $2 FROM netboot_lease WHERE address BETWEEN $1::inet AND $1::inet + $3::bigint",
                &[&IpAddr::V4(first), &(size + 1), &size],
            )
            .await?;
        if !free.get::<_, bool>(0) {
            return Ok(None);
        }
    }
    Ok(None)
}

/// A DHCPREQUEST for `address`: granted for `lease` when it is `mac`'s (or
/// free and in the pool), else refused (None).
pub async fn grant(
    tx: &mut Tx<'_>,
    mac: MacAddr,
    address: Ipv4Addr,
    first: Ipv4Addr,
    last: Ipv4Addr,
    lease: Duration,
) -> Result<Option<Ipv4Addr>, BmdbError> {
    if !(u32::from(first)..=u32::from(last)).contains(&u32::from(address)) {
        return Ok(None);
    }
    let mac = mac.to_string();
    let ip = IpAddr::V4(address);
    // Someone else's (unexpired) address is refused, before anything of
    // this MAC's is given up.
    let holder = tx
        .query_opt(
            "SELECT mac::text, expires_at < now() FROM netboot_lease WHERE address = $1",
            &[&ip],
        )
        .await?;
    if let Some(h) = holder {
        let (holder, expired): (String, bool) = (h.get(0), h.get(1));
        if holder != mac && !expired {
            return Ok(None);
        }
    }
    // Another address held by this MAC goes back first.
    tx.execute(
        "DELETE FROM netboot_lease WHERE mac = $1::text::macaddr AND address <> $2",
        &[&mac, &ip],
    )
    .await?;
    let r = tx
        .query_opt(
            "INSERT INTO netboot_lease (address, mac, expires_at, granted, updated_at) \
             VALUES ($2, $1::text::macaddr, now() + make_interval(secs => $3), true, now()) \
             ON CONFLICT (address) DO UPDATE SET mac = EXCLUDED.mac, expires_at = EXCLUDED.expires_at, \
                    granted = true, updated_at = now() \
              WHERE netboot_lease.mac = EXCLUDED.mac OR netboot_lease.expires_at < now() \
             RETURNING address",
            &[&mac, &ip, &lease.as_secs_f64()],
        )
        .await?;
    Ok(r.and_then(|r| v4(r.get(0))))
}

/// A DHCPRELEASE (or DECLINE): `mac`'s hold on `address` ends.
pub async fn release(tx: &mut Tx<'_>, mac: MacAddr, address: Ipv4Addr) -> Result<(), BmdbError> {
    tx.execute(
        "DELETE FROM netboot_lease WHERE mac = $1::text::macaddr AND address = $2",
        &[&mac.to_string(), &IpAddr::V4(address)],
    )
    .await?;
    Ok(())
}
