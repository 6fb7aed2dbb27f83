//! Switch ports (V31): the cabling declared in the inventory, what
//! shepherd wants on each port (from the machine's life cycle, in one
//! statement: [`WANT`]), what the switch answered when read back, the
//! changes made, and which session changes a switch at a time.

use std::time::Duration;

use uuid::Uuid;

use super::{BmdbError, Tx};

/// A port as the round works it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRow {
    pub port: String,
    pub machine_id: Option<Uuid>,
    pub purpose: String,
    pub want_native: Option<u16>,
    pub want_tagged: Vec<u16>,
    /// As last read back (None: never read).
    pub seen: Option<(Option<u16>, Vec<u16>)>,
}

/// What a declared port is cabled to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortRole {
    /// One of a machine's NICs.
    Nic,
    /// A machine's BMC: kept on the BMCs' network.
    Bmc,
    /// Another switch (a trunk): it carries every network but idle.
    Uplink,
}

impl PortRole {
    pub fn as_str(self) -> &'static str {
        match self {
            PortRole::Nic => "nic",
            PortRole::Bmc => "bmc",
            PortRole::Uplink => "uplink",
        }
    }
}

/// A declared port (a host's, or a switch's uplink), for [`sync_declared`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Declared {
    /// The host's inventory ID (None: an uplink).
    pub host: Option<String>,
    pub switch: String,
    pub port: String,
    pub mac: Option<String>,
    pub role: PortRole,
}

impl Declared {
    /// Host `host`'s port `p`.
    pub fn of(host: &str, p: &crate::config::HostPort) -> Declared {
        Declared {
            host: Some(host.to_string()),
            switch: p.switch.clone(),
            port: p.port.clone(),
            mac: p.mac.map(|m| m.to_string()),
            role: if p.bmc { PortRole::Bmc } else { PortRole::Nic },
        }
    }

    /// `switch`'s uplink `port`.
    pub fn uplink(switch: &str, port: &str) -> Declared {
        Declared {
            host: None,
            switch: switch.to_string(),
            port: port.to_string(),
            mac: None,
            role: PortRole::Uplink,
        }
    }
}

/// The VLANs a purpose stands for: `$2` provisioning, `$3` idle, `$4` the
/// BMCs' (NULL: BMC ports left alone); an uplink's, every network but
/// idle tagged (provisioning, the BMCs', every virtual network's) and
/// nothing untagged; a tenant's as its device's ports
/// say (`device_port`: a NIC in the bond as the bond, on the project's
/// own network untagged unless layer 2, its virtual networks tagged; a
/// layer-2 port with no VLAN waits on idle).
///
/// A port's purpose, from its machine's life cycle: a BMC's is `bmc`; a
/// machine an open device holds, installed and its installation fulfilled,
/// is the tenant's (its system is to boot); a free machine whose live
/// agent waits is `idle`; anything else shepherd works on is on
/// `provisioning`; a held machine's ports are left as they are. A port of
/// no machine waits on idle.
const WANT: &str = "\
WITH intent AS ( \
    SELECT sp.switch_name, sp.port_name, d.device_id, d.project_id, \
           CASE WHEN sp.role = 'uplink' THEN 'uplink' \
                WHEN sp.role = 'bmc' THEN 'bmc' \
                WHEN sp.machine_id IS NULL THEN 'idle' \
                WHEN s.held THEN NULL \
                WHEN d.device_id IS NOT NULL AND d.deleting_at IS NULL \
                     AND s.installation = 'installed' AND s.installation_fulfilled THEN 'tenant' \
                WHEN d.device_id IS NULL AND machine_state(s) = 'available' THEN 'idle' \
                ELSE 'provisioning' END AS purpose \
      FROM switch_port sp \
      LEFT JOIN machine_summary s ON s.machine_id = sp.machine_id \
      LEFT JOIN device d ON d.machine_id = sp.machine_id AND d.deleted_at IS NULL \
     WHERE sp.switch_name = $1), \
tenant AS ( \
    SELECT i.switch_name, i.port_name, ep.port_id, COALESCE(ep.layer2, false) AS layer2, \
           CASE WHEN COALESCE(ep.layer2, false) THEN nv.vxlan ELSE own.vxlan END AS native \
      FROM intent i \
      LEFT JOIN device_port eth ON eth.device_id = i.device_id \
           AND eth.switch_name = i.switch_name AND eth.port_name = i.port_name \
      LEFT JOIN device_port ep ON ep.device_id = i.device_id \
           AND ep.name = CASE WHEN eth.bonded THEN 'bond0' ELSE eth.name END \
      LEFT JOIN virtual_network nv ON nv.virtual_network_id = ep.native_network \
      LEFT JOIN virtual_network own ON own.project_id = i.project_id AND own.own \
     WHERE i.purpose = 'tenant'), \
tenant_vlans AS ( \
    SELECT t.switch_name, t.port_name, t.layer2, t.native, \
           COALESCE((SELECT array_agg(vn.vxlan ORDER BY vn.vxlan) \
                       FROM device_port_vlan a \
                       JOIN virtual_network vn ON vn.virtual_network_id = a.virtual_network_id \
                      WHERE a.port_id = t.port_id AND vn.vxlan IS DISTINCT FROM t.native), \
                    '{}') AS tagged \
      FROM tenant t), \
wanted AS ( \
    SELECT i.switch_name, i.port_name, i.purpose, \
           CASE i.purpose WHEN 'provisioning' THEN $2::int WHEN 'idle' THEN $3::int \
                WHEN 'bmc' THEN $4::int \
                WHEN 'tenant' THEN CASE WHEN tv.layer2 AND tv.native IS NULL \
                                             AND cardinality(tv.tagged) = 0 THEN $3::int \
                                        ELSE tv.native END END AS native, \
           CASE WHEN i.purpose = 'tenant' THEN tv.tagged \
                WHEN i.purpose = 'uplink' THEN (SELECT array_agg(v ORDER BY v) FROM ( \
                     SELECT $2::int UNION SELECT $4::int WHERE $4::int IS NOT NULL \
                     UNION SELECT vxlan FROM virtual_network) carried(v)) \
                ELSE '{}'::int[] END AS tagged, \
           CASE WHEN i.purpose = 'tenant' THEN tv.layer2 OR tv.native IS NOT NULL \
                WHEN i.purpose = 'bmc' THEN $4::int IS NOT NULL ELSE true END AS known \
      FROM intent i \
      LEFT JOIN tenant_vlans tv ON tv.switch_name = i.switch_name AND tv.port_name = i.port_name \
     WHERE i.purpose IS NOT NULL) \
UPDATE switch_port sp \
   SET want_purpose = w.purpose, want_native = w.native, want_tagged = w.tagged, want_since = now() \
  FROM wanted w \
 WHERE sp.switch_name = w.switch_name AND sp.port_name = w.port_name AND w.known \
   AND (sp.want_purpose IS DISTINCT FROM w.purpose OR sp.want_native IS DISTINCT FROM w.native \
        OR sp.want_tagged <> w.tagged)";

/// Projects holding a device on a cabled machine, with no network of
/// their own yet: the device's metro.
const PROJECTS_WITHOUT_VLAN: &str = "\
SELECT DISTINCT ON (d.project_id) d.project_id, d.metro FROM device d \
  JOIN switch_port sp ON sp.machine_id = d.machine_id AND sp.role = 'nic' \
 WHERE d.deleted_at IS NULL AND d.deleting_at IS NULL \
   AND NOT EXISTS (SELECT 1 FROM virtual_network v WHERE v.project_id = d.project_id AND v.own)";

/// The lowest VLAN of `$1..=$2` no network has.
const FREE_VLAN: &str = "\
SELECT v FROM generate_series($1::int, $2::int) v \
 WHERE NOT EXISTS (SELECT 1 FROM virtual_network n WHERE n.vxlan = v) ORDER BY v LIMIT 1";

/// The lowest VLAN of `tenant` no network has, if any is left.
pub async fn free_vlan(
    tx: &mut Tx<'_>,
    tenant: &std::ops::RangeInclusive<u16>,
) -> Result<Option<i32>, BmdbError> {
    let (lo, hi) = (i32::from(*tenant.start()), i32::from(*tenant.end()));
    Ok(tx
        .query_opt(FREE_VLAN, &[&lo, &hi])
        .await?
        .map(|r| r.get(0)))
}

/// Gives each project that needs one its own network, a VLAN of `tenant`
/// (the lowest free). A project past the range's end waits (its devices
/// stay `provisioning`) and is returned.
pub async fn allocate_project_vlans(
    tx: &mut Tx<'_>,
    tenant: std::ops::RangeInclusive<u16>,
) -> Result<Vec<Uuid>, BmdbError> {
    let mut without = Vec::new();
    for r in tx.query(PROJECTS_WITHOUT_VLAN, &[]).await? {
        let (p, metro): (Uuid, String) = (r.get(0), r.get(1));
        match free_vlan(tx, &tenant).await? {
            Some(v) => {
                tx.execute(
                    "INSERT INTO virtual_network (virtual_network_id, project_id, vxlan, metro, \
                         description, own) \
                     VALUES ($1, $2, $3, $4, 'the project''s own network', true) \
                     ON CONFLICT DO NOTHING",
                    &[&Uuid::new_v4(), &p, &v, &metro],
                )
                .await?;
            }
            None => without.push(p),
        }
    }
    Ok(without)
}

/// Makes the declared ports the BMDB's: each `(switch, port)` names its
/// host's machine (by the inventory ID); a declared port no longer listed
/// goes.
pub async fn sync_declared(tx: &mut Tx<'_>, declared: &[Declared]) -> Result<(), BmdbError> {
    let switches: Vec<&str> = declared.iter().map(|d| d.switch.as_str()).collect();
    let ports: Vec<&str> = declared.iter().map(|d| d.port.as_str()).collect();
    tx.execute(
        "DELETE FROM switch_port sp WHERE sp.declared AND NOT EXISTS ( \
             SELECT 1 FROM unnest($1::text[], $2::text[]) AS x(sw, p) \
              WHERE x.sw = sp.switch_name AND x.p = sp.port_name)",
        &[&switches, &ports],
    )
    .await?;
    cable(tx, declared).await
}

/// Records hosts' cabling (the provisioner, as it records a new host;
/// [`sync_declared`]): each port names its host's machine, if it is one.
pub async fn cable(tx: &mut Tx<'_>, declared: &[Declared]) -> Result<(), BmdbError> {
    let hosts: Vec<Option<&str>> = declared.iter().map(|d| d.host.as_deref()).collect();
    let switches: Vec<&str> = declared.iter().map(|d| d.switch.as_str()).collect();
    let ports: Vec<&str> = declared.iter().map(|d| d.port.as_str()).collect();
    let macs: Vec<Option<&str>> = declared.iter().map(|d| d.mac.as_deref()).collect();
    let roles: Vec<&str> = declared.iter().map(|d| d.role.as_str()).collect();
    tx.execute(
        "INSERT INTO switch_port AS sp (switch_name, port_name, machine_id, role, mac, declared) \
         SELECT x.sw, x.p, mp.machine_id, x.role, x.mac, true \
           FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) \
                AS x(host, sw, p, role, mac) \
           LEFT JOIN machine_provided mp ON mp.provider_id = x.host AND mp.provider = 'None' \
         ON CONFLICT (switch_name, port_name) DO UPDATE \
            SET machine_id = EXCLUDED.machine_id, role = EXCLUDED.role, mac = EXCLUDED.mac, \
                declared = true \
          WHERE (sp.machine_id, sp.role, sp.mac, sp.declared) \
                IS DISTINCT FROM (EXCLUDED.machine_id, EXCLUDED.role, EXCLUDED.mac, true)",
        &[&hosts, &switches, &ports, &roles, &macs],
    )
    .await?;
    Ok(())
}

/// Names, on each port of a switch not configured, why it is not moved.
pub async fn unknown_switches(tx: &mut Tx<'_>, configured: &[String]) -> Result<u64, BmdbError> {
    tx.execute(
        "UPDATE switch_port SET error = 'switch ' || switch_name || ' is not in network.switches', \
                error_at = now() \
          WHERE switch_name <> ALL($1) AND error IS DISTINCT FROM \
                'switch ' || switch_name || ' is not in network.switches'",
        &[&configured],
    )
    .await
}

/// Takes `switch` for `session` until `hold` from now, unless another
/// live session holds it or its backoff runs: its recorded host key
/// when taken.
pub async fn claim(
    tx: &mut Tx<'_>,
    switch: &str,
    session: Uuid,
    hold: Duration,
) -> Result<Option<Option<String>>, BmdbError> {
    let secs = hold.as_secs_f64();
    Ok(tx
        .query_opt(
            "INSERT INTO switch_state AS st (switch_name, session_id, held_until) \
             VALUES ($1, $2, now() + make_interval(secs => $3)) \
             ON CONFLICT (switch_name) DO UPDATE \
                SET session_id = EXCLUDED.session_id, held_until = EXCLUDED.held_until \
              WHERE st.not_before <= now() \
                AND (st.session_id IS NULL OR st.session_id = EXCLUDED.session_id \
                     OR st.held_until IS NULL OR st.held_until < now() \
                     OR NOT EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = st.session_id \
                                    AND s.session_deadline > now())) \
             RETURNING host_key",
            &[&switch, &session, &secs],
        )
        .await?
        .map(|r| r.get(0)))
}

/// Lets `switch` go (a shepherd stopping), so another takes it at once.
pub async fn release(tx: &mut Tx<'_>, switch: &str, session: Uuid) -> Result<(), BmdbError> {
    tx.execute(
        "UPDATE switch_state SET session_id = NULL, held_until = NULL \
          WHERE switch_name = $1 AND session_id = $2",
        &[&switch, &session],
    )
    .await?;
    Ok(())
}

/// Brings the wanted VLANs of `switch`'s ports up to date with their
/// machines' life cycles; returns the ports whose switch is to be
/// changed or read (`all`: every port with a want, to read back).
pub async fn due(
    tx: &mut Tx<'_>,
    switch: &str,
    vlans: (u16, u16, Option<u16>),
    all: bool,
) -> Result<Vec<PortRow>, BmdbError> {
    let (prov, idle, bmc) = (
        i32::from(vlans.0),
        i32::from(vlans.1),
        vlans.2.map(i32::from),
    );
    tx.execute(WANT, &[&switch, &prov, &idle, &bmc]).await?;
    let rows = tx
        .query(
            "SELECT port_name, machine_id, want_purpose, want_native, want_tagged, \
                    seen_native, seen_tagged, seen_at IS NOT NULL \
               FROM switch_port \
              WHERE switch_name = $1 AND want_purpose IS NOT NULL \
                AND ($2 OR seen_at IS NULL OR seen_native IS DISTINCT FROM want_native \
                     OR seen_tagged IS DISTINCT FROM want_tagged OR seen_at < want_since) \
              ORDER BY port_name",
            &[&switch, &all],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let tagged = |v: Option<Vec<i32>>| -> Vec<u16> {
                v.unwrap_or_default()
                    .into_iter()
                    .map(|x| x as u16)
                    .collect()
            };
            PortRow {
                port: r.get(0),
                machine_id: r.get(1),
                purpose: r.get(2),
                want_native: r.get::<_, Option<i32>>(3).map(|v| v as u16),
                want_tagged: tagged(r.get(4)),
                seen: r.get::<_, bool>(7).then(|| {
                    (
                        r.get::<_, Option<i32>>(5).map(|v| v as u16),
                        tagged(r.get(6)),
                    )
                }),
            }
        })
        .collect())
}

/// Marks the switch ports of `device`'s machine to be looked at again (a
/// tenant changed its ports): the next round works out what they want and
/// reads them back, whether or not that changed.
pub async fn touch_device(tx: &mut Tx<'_>, device: Uuid) -> Result<(), BmdbError> {
    tx.execute(
        "UPDATE switch_port sp SET want_since = now() FROM device d \
          WHERE d.device_id = $1 AND sp.machine_id = d.machine_id AND sp.role = 'nic'",
        &[&device],
    )
    .await?;
    Ok(())
}

/// What a port was read back as, and whether shepherd changed it to that
/// (a change, recorded in `switch_change`).
#[derive(Debug, Clone)]
pub struct ReadBack {
    pub port: PortRow,
    pub native: Option<u16>,
    pub tagged: Vec<u16>,
    /// Set by shepherd this time (from `before`).
    pub changed: Option<(Option<u16>, Vec<u16>)>,
}

/// Records what `switch` answered, and the changes made, under `session`.
pub async fn record(
    tx: &mut Tx<'_>,
    switch: &str,
    session: Uuid,
    read: &[ReadBack],
    host_key: Option<&str>,
    took: std::time::Duration,
) -> Result<(), BmdbError> {
    let v = |x: &[u16]| -> Vec<i32> { x.iter().map(|&t| i32::from(t)).collect() };
    // Each port's row moves its machine's summary (a trigger): in the
    // machines' order, as the heartbeat writer's batches lock them, so the
    // two never wait on each other in a circle.
    let mut in_order: Vec<&ReadBack> = read.iter().collect();
    in_order.sort_by_key(|r| r.port.machine_id);
    for r in in_order {
        let native = r.native.map(i32::from);
        tx.execute(
            "UPDATE switch_port SET seen_native = $3, seen_tagged = $4, seen_at = now(), \
                    changed_at = CASE WHEN $5 THEN now() ELSE changed_at END, \
                    error = NULL, error_at = NULL \
              WHERE switch_name = $1 AND port_name = $2",
            &[
                &switch,
                &r.port.port,
                &native,
                &v(&r.tagged),
                &r.changed.is_some(),
            ],
        )
        .await?;
        if let Some((before_native, before_tagged)) = &r.changed {
            tx.execute(
                "INSERT INTO switch_change (switch_name, port_name, machine_id, purpose, \
                     before_native, before_tagged, after_native, after_tagged, session_id) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                &[
                    &switch,
                    &r.port.port,
                    &r.port.machine_id,
                    &r.port.purpose,
                    &before_native.map(i32::from),
                    &v(before_tagged),
                    &native,
                    &v(&r.tagged),
                    &session,
                ],
            )
            .await?;
        }
    }
    let changes = read.iter().filter(|r| r.changed.is_some()).count() as i64;
    tx.execute(
        "UPDATE switch_state SET reached_at = now(), error = NULL, failures = 0, \
                not_before = now(), changes = changes + $2, host_key = COALESCE(host_key, $3), \
                sessions = sessions + 1, session_seconds = session_seconds + $4 \
          WHERE switch_name = $1",
        &[&switch, &changes, &host_key, &took.as_secs_f64()],
    )
    .await?;
    Ok(())
}

/// Records that `switch` failed (`error`, naming the ports it was to
/// change); it is left alone for a backoff, doubled with each failure in
/// a row up to a minute.
pub async fn record_failure(
    tx: &mut Tx<'_>,
    switch: &str,
    ports: &[String],
    error: &str,
    took: std::time::Duration,
) -> Result<i32, BmdbError> {
    tx.execute(
        "UPDATE switch_port SET error = $3, error_at = now() \
          WHERE switch_name = $1 AND port_name = ANY($2)",
        &[&switch, &ports, &error],
    )
    .await?;
    Ok(tx
        .query_one(
            "UPDATE switch_state SET failed_at = now(), error = $2, failures = failures + 1, \
                    not_before = now() + make_interval(secs => least(60, 2 ^ least(failures, 6))), \
                    sessions = sessions + 1, session_seconds = session_seconds + $3 \
              WHERE switch_name = $1 RETURNING failures",
            &[&switch, &error, &took.as_secs_f64()],
        )
        .await?
        .get(0))
}

/// A port as operators see it.
#[derive(Debug, Clone, PartialEq)]
pub struct PortView {
    pub switch: String,
    pub port: String,
    pub role: String,
    pub mac: Option<String>,
    pub purpose: Option<String>,
    pub want_native: Option<i32>,
    pub want_tagged: Vec<i32>,
    pub seen_native: Option<i32>,
    pub seen_tagged: Option<Vec<i32>>,
    pub seen_at: Option<std::time::SystemTime>,
    pub changed_at: Option<std::time::SystemTime>,
    pub error: Option<String>,
}

/// A machine's ports.
pub async fn machine_ports(tx: &mut Tx<'_>, machine: Uuid) -> Result<Vec<PortView>, BmdbError> {
    let rows = tx
        .query(
            "SELECT switch_name, port_name, role, mac, want_purpose, want_native, want_tagged, \
                    seen_native, seen_tagged, seen_at, changed_at, error \
               FROM switch_port WHERE machine_id = $1 ORDER BY role DESC, switch_name, port_name",
            &[&machine],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| PortView {
            switch: r.get(0),
            port: r.get(1),
            role: r.get(2),
            mac: r.get(3),
            purpose: r.get(4),
            want_native: r.get(5),
            want_tagged: r.get(6),
            seen_native: r.get(7),
            seen_tagged: r.get(8),
            seen_at: r.get(9),
            changed_at: r.get(10),
            error: r.get(11),
        })
        .collect())
}

#[derive(serde::Deserialize)]
struct UplinkRow {
    port: String,
    seen: Option<Vec<i32>>,
}

/// A switch as the pages and `/metrics` show it.
#[derive(Debug, Clone)]
pub struct SwitchView {
    pub name: String,
    pub ports: i64,
    pub ports_pending: i64,
    pub changes: i64,
    pub reached_at: Option<std::time::SystemTime>,
    pub failed_at: Option<std::time::SystemTime>,
    pub error: Option<String>,
    pub failures: i32,
    /// Sessions held with it (all shepherds, all time) and their seconds.
    pub sessions: i64,
    pub session_seconds: f64,
    /// Its uplinks and the VLANs each was last read back carrying
    /// (None: not read yet).
    pub uplinks: Vec<(String, Option<Vec<i32>>)>,
}

/// Every switch that has ports or a state.
pub async fn switches(tx: &mut Tx<'_>) -> Result<Vec<SwitchView>, BmdbError> {
    let rows = tx
        .query(
            "SELECT n.name, \
                    (SELECT count(*) FROM switch_port p WHERE p.switch_name = n.name \
                        AND p.role <> 'uplink'), \
                    (SELECT count(*) FROM switch_port p WHERE p.switch_name = n.name \
                        AND p.want_purpose IS NOT NULL \
                        AND (p.seen_native IS DISTINCT FROM p.want_native \
                             OR p.seen_tagged IS DISTINCT FROM p.want_tagged)), \
                    COALESCE(st.changes, 0), st.reached_at, st.failed_at, st.error, \
                    COALESCE(st.failures, 0), COALESCE(st.sessions, 0), \
                    COALESCE(st.session_seconds, 0), \
                    (SELECT json_agg(json_build_object('port', p.port_name, 'seen', p.seen_tagged) \
                                     ORDER BY p.port_name)::text \
                       FROM switch_port p WHERE p.switch_name = n.name AND p.role = 'uplink') \
               FROM (SELECT switch_name AS name FROM switch_port \
                     UNION SELECT switch_name FROM switch_state) n \
               LEFT JOIN switch_state st ON st.switch_name = n.name \
              ORDER BY n.name",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| SwitchView {
            name: r.get(0),
            ports: r.get(1),
            ports_pending: r.get(2),
            changes: r.get(3),
            reached_at: r.get(4),
            failed_at: r.get(5),
            error: r.get(6),
            failures: r.get(7),
            sessions: r.get(8),
            session_seconds: r.get(9),
            uplinks: r
                .get::<_, Option<String>>(10)
                .and_then(|j| serde_json::from_str::<Vec<UplinkRow>>(&j).ok())
                .unwrap_or_default()
                .into_iter()
                .map(|u| (u.port, u.seen))
                .collect(),
        })
        .collect())
}
