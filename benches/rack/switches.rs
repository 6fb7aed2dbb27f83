//! The rack bench's switches: Open vSwitch instances cabled to the
//! machines, and what they did.

use shepherd_sim::testing::{OvsSwitch, OwnedRack, RackNetwork};

/// The VLANs the bench's switches carry.
const PROVISIONING: u16 = 10;
const IDLE: u16 = 4000;

/// The rack's switches and where each machine is cabled: `k` switches in
/// namespaces of their own, `n` internal ports among them, shepherd (in
/// `net.server`) reaching each sshd through a forwarded port. The
/// `[network]` section, and each machine's (switch, port).
pub fn switches(
    net: &RackNetwork,
    n: usize,
    k: usize,
    dir: &std::path::Path,
) -> (Vec<OvsSwitch>, toml::Table, Vec<(String, String)>) {
    let per = n.div_ceil(k);
    let mut section = format!(
        "provisioning_vlan = {PROVISIONING}\nidle_vlan = {IDLE}\ntenant_vlans = \"1000-3999\"\n"
    );
    let mut switches = Vec::new();
    let mut cabling = Vec::new();
    for i in 0..k {
        let name = format!("leaf{:02}", i + 1);
        let sw = OvsSwitch::start(&name);
        let ports = sw.internal_ports(per.min(n - cabling.len()), 999);
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&key, &sw.client_key).unwrap();
        section.push_str(&format!(
            "[[switches]]\nname = \"{name}\"\ndriver = \"ovs\"\naddress = \"{}\"\n\
             private_key = {{ file = \"{}\" }}\novs_db = \"unix:{}\"\n",
            sw.ssh_from(&net.server),
            key.display(),
            sw.db.display()
        ));
        cabling.extend(ports.into_iter().map(|p| (name.clone(), p)));
        switches.push(sw);
    }
    (switches, toml::from_str(&section).unwrap(), cabling)
}

/// What the switches did, from shepherd's `/metrics` and read from the
/// switches themselves: every port's VLAN at the end against the one its
/// machine's device is on.
pub async fn switch_figures(
    rack: &OwnedRack,
    switches: &[OvsSwitch],
    cabling: &[(String, String)],
    devices: usize,
) -> Vec<(String, String)> {
    let m =
        |name: &'static str, labels: String| async move { rack.admin.metric(name, &labels).await };
    let mut rows = Vec::new();
    let (mut changes, mut sessions, mut seconds) = (0.0, 0.0, 0.0);
    let mut rates = Vec::new();
    for sw in switches {
        let l = format!("switch=\"{}\"", sw.name);
        let c = m("shepherd_switch_port_changes_total", l.clone()).await;
        let s = m("shepherd_switch_sessions_total", l.clone()).await;
        let t = m("shepherd_switch_session_seconds_total", l).await;
        changes += c;
        sessions += s;
        seconds += t;
        if t > 0.0 {
            rates.push(c / t);
        }
    }
    rates.sort_by(f64::total_cmp);
    rows.push((
        "port changes made and read back".into(),
        format!(
            "{changes} ({:.1} a port)",
            changes / cabling.len().max(1) as f64
        ),
    ));
    rows.push((
        "switch sessions (SSH, each read, changed, read back)".into(),
        format!(
            "{sessions} ({:.2} per device)",
            sessions / devices.max(1) as f64
        ),
    ));
    rows.push((
        "a session's time, mean".into(),
        format!("{:.2} s", seconds / sessions.max(1.0)),
    ));
    if let (Some(lo), Some(hi)) = (rates.first(), rates.last()) {
        rows.push((
            "changes per second of a switch's sessions (all sessions: slowest switch, mean, fastest)".into(),
            format!("{lo:.1}, {:.1}, {hi:.1}", changes / seconds.max(f64::MIN_POSITIVE)),
        ));
    }
    // The purposes each port went through, in order, from shepherd's
    // audit of changes: the most common paths.
    let (client, conn) = tokio_postgres::connect(&rack.db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    actix_rt::spawn(async move {
        let _ = conn.await;
    });
    let paths = client
        .query(
            "SELECT path, count(*) FROM (SELECT string_agg(purpose, ' > ' ORDER BY change_id) AS path \
               FROM switch_change GROUP BY switch_name, port_name) p \
              GROUP BY path ORDER BY count(*) DESC LIMIT 3",
            &[],
        )
        .await
        .unwrap();
    for r in paths {
        let (path, count): (String, i64) = (r.get(0), r.get(1));
        rows.push((format!("ports changed {path}"), count.to_string()));
    }
    rows.push((
        "ports pending at the end (shepherd's view)".into(),
        format!(
            "{}",
            m("shepherd_switch_ports_pending", String::new()).await
        ),
    ));
    // Each port as the switch holds it, against its machine's VLAN as
    // shepherd's API shows it.
    let mut want = std::collections::BTreeMap::new();
    for d in rack.admin.machine_details().await {
        for p in d["ports"].as_array().into_iter().flatten() {
            want.insert(
                (
                    p["switch"].as_str().unwrap_or_default().to_string(),
                    p["port"].as_str().unwrap_or_default().to_string(),
                ),
                (p["purpose"].clone(), p["vlan"].as_i64()),
            );
        }
    }
    let (mut on_tenant, mut wrong) = (0, Vec::new());
    for sw in switches {
        let tags = sw.vsctl(&[
            "--format=csv",
            "--data=bare",
            "--no-heading",
            "--columns=name,tag",
            "list",
            "Port",
        ]);
        for line in tags.lines() {
            let Some((port, tag)) = line.split_once(',') else {
                continue;
            };
            let Some((purpose, vlan)) = want.get(&(sw.name.clone(), port.to_string())) else {
                continue;
            };
            let held = tag.parse::<i64>().ok();
            if purpose == "tenant"
                && held == *vlan
                && held.is_some_and(|v| (1000..4000).contains(&v))
            {
                on_tenant += 1;
            } else {
                wrong.push(format!(
                    "{}:{port} holds {tag:?}, wanted {purpose} {vlan:?}",
                    sw.name
                ));
            }
        }
    }
    rows.push((
        "ports the switches hold on the tenant's VLAN at the end (read with ovs-vsctl)".into(),
        format!("{on_tenant} of {}", cabling.len()),
    ));
    if !wrong.is_empty() {
        rows.push(("ports not where wanted".into(), wrong.join("; ")));
    }
    rows
}
