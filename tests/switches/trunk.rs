//! Two switches joined by a trunk: shepherd keeps every network but idle
//! on the uplinks, so a project's machines on either switch reach each
//! other, and another project's on the same two switches do not.

use super::*;

/// A port's VLANs as `ovs-vsctl` shows them, once the trunk carries
/// exactly `vlans` (tagged, nothing untagged).
fn trunk(vlans: &[u16]) -> String {
    let list: Vec<String> = vlans.iter().map(u16::to_string).collect();
    format!("trunk [] [{}]", list.join(", "))
}

/// Waits until both ends of the trunk hold `vlans`.
async fn until_trunk(rack: &mut OwnedRack, ends: [(&OvsSwitch, &str); 2], vlans: &[u16]) {
    let want = trunk(vlans);
    rack.shepherd
        .until(
            Duration::from_secs(120),
            Duration::from_millis(200),
            async || {
                let seen: Vec<String> = ends.iter().map(|(sw, p)| sw.vlans(p)).collect();
                if seen.iter().all(|s| *s == want) {
                    Ok(())
                } else {
                    Err(format!("the trunk's ends hold {seen:?}, not {want}"))
                }
            },
        )
        .await
}

#[actix_rt::test]
async fn a_project_s_network_spans_two_switches_joined_by_a_trunk_and_no_other_project_s_does() {
    if !is_root() {
        eprintln!("SKIPPED: the switch test needs root (network namespaces)");
        return;
    }
    let leaf1 = OvsSwitch::start("leaf1");
    let leaf2 = OvsSwitch::start("leaf2");
    // The cable between them: both ends on idle until shepherd trunks them.
    leaf1.cable_to("trunk", &leaf2, "trunk", IDLE);
    // Machines 1 and 2 on leaf1's p1 and p2; 3 and 4 on leaf2's.
    let nics: Vec<Nic> = (1..=4)
        .map(|i| {
            let sw = if i <= 2 { &leaf1 } else { &leaf2 };
            sw.nic(nic_ip(i), 999)
        })
        .collect();
    let servers: Vec<std::process::Child> = nics.iter().map(|n| n.listen(PORT)).collect();
    let key2 = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key2.path(), &leaf2.client_key).unwrap();
    let leaf2_switch: toml::Value = toml::from_str::<toml::Table>(&format!(
        "s = {{ name = \"leaf2\", driver = \"ovs\", address = \"{}\", \
         private_key = {{ file = \"{}\" }}, ovs_db = \"unix:{}\", uplinks = [\"trunk\"] }}",
        leaf2.ssh,
        key2.path().display(),
        leaf2.db.display()
    ))
    .unwrap()["s"]
        .clone();
    let more = move |t: &mut toml::Table| {
        let network = t["network"].as_table_mut().unwrap();
        let switches = network["switches"].as_array_mut().unwrap();
        switches[0]
            .as_table_mut()
            .unwrap()
            .insert("uplinks".into(), toml::Value::Array(vec!["trunk".into()]));
        switches.push(leaf2_switch.clone());
        let machines = t["provider"]["inventory"]["machines"]
            .as_array_mut()
            .unwrap();
        for (i, m) in machines.iter_mut().enumerate().skip(2) {
            let port: toml::Value = toml::from_str::<toml::Table>(&format!(
                "p = [{{ switch = \"leaf2\", port = \"p{}\" }}]",
                i - 1
            ))
            .unwrap()["p"]
                .clone();
            m.as_table_mut().unwrap().insert("ports".into(), port);
        }
    };
    let (mut rack, _key) = rack_with(&leaf1, 4, Ipv4Addr::new(127, 0, 96, 1), None, &more).await;
    let limit = Duration::from_secs(240);
    let ends = [(&leaf1, "trunk"), (&leaf2, "trunk")];
    // No tenant yet: the trunk carries provisioning and the BMCs' network.
    until_trunk(&mut rack, ends, &[PROVISIONING, BMC]).await;
    rack.admin
        .wait(&mut rack.shepherd, "agent-started", 4, limit)
        .await;
    rack.deprovision_all().await;
    rack.admin
        .wait(&mut rack.shepherd, "available", 4, limit)
        .await;

    // Each project holds one machine on each switch: its hardware
    // reservations, chosen by the device's create.
    let mut machine_on = BTreeMap::new();
    for d in rack.admin.machine_details().await {
        for p in d["ports"].as_array().into_iter().flatten() {
            machine_on.insert(
                (
                    p["switch"].as_str().unwrap().to_string(),
                    p["port"].as_str().unwrap().to_string(),
                ),
                d["machine"]["machine_id"].as_str().unwrap().to_string(),
            );
        }
    }
    let on = |sw: &str, port: &str| machine_on[&(sw.to_string(), port.to_string())].clone();
    let (a, token_a) = rack.project("alpha");
    let (b, token_b) = rack.project("beta");
    let placed = [
        ("alpha", a, &token_a, "leaf1", "p1", &nics[0]),
        ("alpha", a, &token_a, "leaf2", "p1", &nics[2]),
        ("beta", b, &token_b, "leaf1", "p2", &nics[1]),
        ("beta", b, &token_b, "leaf2", "p2", &nics[3]),
    ];
    for (name, _, _, sw, port, _) in &placed {
        rack.admin.cli(&["projects", "assign", name, &on(sw, port)]);
    }
    for (i, (_, project, token, sw, port, _)) in placed.iter().enumerate() {
        let reserved = json!({"hardware_reservation_id": on(sw, port)});
        device_with(&rack, *project, token, &format!("d{i}"), reserved).await;
    }
    for (project, token) in [(a, &token_a), (b, &token_b)] {
        let path = format!("/metal/v1/projects/{project}/devices");
        rack.admin
            .wait_active(&mut rack.shepherd, &path, token, 2, limit)
            .await;
    }
    // Each project's own network, untagged on its machines' ports on
    // both switches, and both carried by the trunk.
    let ports: Vec<Value> = rack
        .admin
        .machine_details()
        .await
        .iter()
        .flat_map(|d| d["ports"].as_array().cloned().unwrap_or_default())
        .collect();
    let vlan_of = |sw: &str, port: &str| -> u16 {
        let p = ports
            .iter()
            .find(|p| p["switch"] == sw && p["port"] == port)
            .unwrap_or_else(|| panic!("no port {sw} {port} on a machine's page"));
        p["seen_vlan"].as_u64().unwrap() as u16
    };
    let (va, vb) = (vlan_of("leaf1", "p1"), vlan_of("leaf1", "p2"));
    assert_ne!(va, vb, "two projects on one VLAN");
    assert_eq!(vlan_of("leaf2", "p1"), va);
    assert_eq!(vlan_of("leaf2", "p2"), vb);
    let mut carried = vec![PROVISIONING, BMC, va, vb];
    carried.sort_unstable();
    until_trunk(&mut rack, ends, &carried).await;
    for (sw, p) in ends {
        assert_eq!(sw.tag(p), "[]", "the trunk carries a VLAN untagged");
    }

    // By traffic, every pair in both directions.
    let mut table = Vec::new();
    for (fname, _, _, fsw, fport, fnic) in &placed {
        for (tname, _, _, tsw, tport, tnic) in &placed {
            if fnic.ip == tnic.ip {
                continue;
            }
            let expected = fname == tname;
            let within = Duration::from_secs(if expected { 10 } else { 2 });
            let tcp = fnic.reaches(tnic.ip, PORT, within).await;
            let arp = fnic.resolves(tnic.ip).await;
            table.push((
                format!("{fname} on {fsw} {fport}"),
                format!("{tname} on {tsw} {tport}"),
                if fsw == tsw {
                    "same switch"
                } else {
                    "across the trunk"
                },
                expected,
                tcp,
                arp,
            ));
        }
    }
    println!("| from | to | path | expected | TCP | ARP |\n|---|---|---|---|---|---|");
    for (from, to, path, expected, tcp, arp) in &table {
        println!("| {from} | {to} | {path} | {expected} | {tcp} | {arp} |");
    }
    for (from, to, _, expected, tcp, arp) in &table {
        assert_eq!(expected, tcp, "TCP {from} → {to}");
        assert_eq!(expected, arp, "ARP {from} → {to}");
    }

    // A virtual network made later is carried as soon as it exists.
    let vn = virtual_network(&rack, a, &token_a, "alpha's second").await;
    carried.push(vn["vxlan"].as_u64().unwrap() as u16);
    carried.sort_unstable();
    until_trunk(&mut rack, ends, &carried).await;

    // The operators' view names the uplinks and what they were read back
    // carrying (recorded once the switch's session ends).
    let carried_text: Vec<String> = carried.iter().map(u16::to_string).collect();
    let want = format!("uplink trunk: {}", carried_text.join(","));
    let admin = &rack.admin;
    rack.shepherd
        .until(
            Duration::from_secs(30),
            Duration::from_millis(200),
            async || {
                let listed = admin.cli(&["switches"]);
                if listed.matches(want.as_str()).count() == 2 {
                    Ok(())
                } else {
                    Err(format!("shepherd switches says:\n{listed}"))
                }
            },
        )
        .await;
    for mut s in servers {
        let _ = s.kill();
        let _ = s.wait();
    }
}
