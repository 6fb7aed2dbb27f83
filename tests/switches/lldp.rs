//! The agent's LLDP listener against a real lldpd on a switch port.

use super::*;

/// The agent learns which switch port its NIC is on from the LLDP frames
/// a real lldpd sends on the switch's side of the port, as a vendor's
/// switch names it.
#[actix_rt::test]
async fn the_agent_hears_which_switch_port_its_nic_is_on() {
    if !is_root() {
        eprintln!("SKIPPED: the switch test needs root (network namespaces)");
        return;
    }
    let sw = OvsSwitch::start("leaf7");
    let nic = sw.nic(nic_ip(1), PROVISIONING);
    let _lldpd = sw.lldp(&nic, "Ethernet12");
    let heard = nic.inside(|| shepherd_agent::lldp::listen("eth0", Duration::from_secs(20)));
    let n = heard.unwrap().expect("no LLDP frame heard in 20 s");
    assert_eq!(n.system_name, "leaf7", "{n:?}");
    assert_eq!(n.port_id, "Ethernet12", "{n:?}");
    assert_eq!(n.port_description, "leaf7:Ethernet12", "{n:?}");
    let summary = shepherd_proto::summary::LldpSummary {
        chassis_id: n.chassis_id.clone(),
        port_id: n.port_id.clone(),
        system_name: n.system_name.clone(),
        port_description: n.port_description.clone(),
    };
    // The cabling check takes it as leaf7's Ethernet12, and no other.
    assert!(summary.names("leaf7", "Ethernet12"));
    assert!(!summary.names("leaf7", "Ethernet13"));
    assert!(!summary.names("leaf8", "Ethernet12"));
}

/// The switch's word against the declared cabling, end to end: two blank
/// machines booted through their BMCs and the network (their ports on a
/// real switch, moved by shepherd), each hearing over LLDP the port it is
/// on (`fleet-sim --lldp`: the Nth machine on p<N>). The second is
/// declared on p3: its hardware check names the difference, no device
/// is placed on it (the create answers no capacity once the first
/// machine holds one), until an operator accepts the difference.
#[actix_rt::test]
async fn a_machine_its_switch_places_elsewhere_is_no_tenant_s_until_accepted() {
    if !is_root() {
        eprintln!("SKIPPED: the switch test needs root (network namespaces)");
        return;
    }
    let net = RackNetwork::new();
    let sw = OvsSwitch::start("leaf1");
    let ports = sw.internal_ports(3, 999);
    assert_eq!(ports, ["p1", "p2", "p3"]);
    let key = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key.path(), &sw.client_key).unwrap();
    let network: toml::Table = toml::from_str(&format!(
        "provisioning_vlan = {PROVISIONING}\nidle_vlan = {IDLE}\ntenant_vlans = \"1000-1999\"\n\
         interval = \"500ms\"\ntimeout = \"5s\"\n\
         [[switches]]\nname = \"leaf1\"\ndriver = \"ovs\"\naddress = \"{}\"\n\
         private_key = {{ file = \"{}\" }}\novs_db = \"unix:{}\"\n",
        sw.ssh_from(&net.server),
        key.path().display(),
        sw.db.display()
    ))
    .unwrap();
    // The simulated machines' first NICs' MACs (from their BMCs'
    // addresses, 10.78.0.1 and .2).
    let cabled = [("p1", "02:5e:00:01:00:00"), ("p3", "02:5e:00:02:00:00")];
    let edit = move |t: &mut toml::Table| {
        t.insert("network".into(), network.clone().into());
        let machines = t["provider"]["inventory"]["machines"]
            .as_array_mut()
            .unwrap();
        for (m, (port, mac)) in machines.iter_mut().zip(cabled) {
            let p: toml::Table = toml::from_str(&format!(
                "p = [{{ switch = \"leaf1\", port = \"{port}\", mac = \"{mac}\" }}]"
            ))
            .unwrap();
            m.as_table_mut()
                .unwrap()
                .insert("ports".into(), p["p"].clone());
        }
    };
    let mut rack =
        OwnedRack::start_network_edited(net, 2, "1s", 16 << 20, &[], &["--lldp", "leaf1"], &edit)
            .await;
    let limit = Duration::from_secs(240);
    rack.admin
        .wait(&mut rack.shepherd, "available", 2, limit)
        .await;
    // Both checked (each BMC read against its agent's report): the second
    // machine's names its cabling.
    let admin = &rack.admin;
    let checked = rack
        .shepherd
        .until(limit, Duration::from_millis(500), async || {
            let details = admin.machine_details().await;
            if details.iter().all(|d| !d["hardware_check"].is_null()) {
                Ok(details)
            } else {
                Err("not every machine checked yet".to_string())
            }
        })
        .await;
    let flagged: Vec<&Value> = checked
        .iter()
        .filter(|d| d["hardware_check"]["blocks_installation"] == true)
        .collect();
    assert_eq!(flagged.len(), 1, "{checked:#?}");
    let miscabled = flagged[0]["machine"]["machine_id"]
        .as_str()
        .unwrap()
        .to_string();
    let said = flagged[0]["hardware_check"]["differences"].to_string();
    assert!(
        said.contains("cabling: NIC 02:5e:00:02:00:00 is declared on leaf1 port p3")
            && said.contains("p2"),
        "{said}"
    );

    // One device: on the machine cabled as declared. A second: none left.
    let (project, token) = rack.project("delta");
    let first = device(&rack, project, &token, "d1").await;
    let path = format!("/metal/v1/projects/{project}/devices");
    rack.admin
        .wait_active(&mut rack.shepherd, &path, &token, 1, limit)
        .await;
    let (s, d) = rack
        .admin
        .call(
            "GET",
            &format!("/metal/v1/devices/{first}"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(s, 200, "{d}");
    let body = json!({"metro": "sv", "plan": OwnedRack::PLAN,
                      "operating_system": OwnedRack::OPERATING_SYSTEM, "hostname": "d2"});
    let (s, d) = rack
        .admin
        .call("POST", &path, Some(&token), Some(body.clone()))
        .await;
    assert_eq!(s, 422, "the miscabled machine was given to a tenant: {d}");
    let (_, m) = rack
        .admin
        .read(&format!("/api/v1/machines/{miscabled}"))
        .await;
    assert!(m["tenancy"]["device"].is_null(), "{m:#}");

    // Recabled (the operator says so): accepted, it is a tenant's.
    rack.admin.cli(&[
        "machines",
        "accept-hardware",
        &miscabled,
        "--reason",
        "moved to leaf1 p3",
    ]);
    let (s, d) = rack
        .admin
        .call("POST", &path, Some(&token), Some(body))
        .await;
    assert_eq!(s, 201, "{d}");
    rack.admin
        .wait_active(&mut rack.shepherd, &path, &token, 2, limit)
        .await;
}
