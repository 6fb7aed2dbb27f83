//! Tenants on networks of their own, on a real switch: Open vSwitch in
//! user space in a network namespace, managed over SSH by an sshd in that
//! namespace (`shepherd_sim::testing::OvsSwitch`). Each machine's NIC is
//! a namespace of its own on a switch port, so isolation is shown by
//! traffic (ARP and TCP), never by reading configuration back.
//!
//! The machines are a simulated owned rack (`fleet-sim --provider
//! static`, taken over over SSH); their agents reach shepherd over the
//! host's loopback, so the NIC namespaces stand for their data ports. A
//! namespace on the provisioning VLAN stands for shepherd's services, one
//! on the BMC VLAN for a BMC.
//!
//! Needs root (network namespaces); skipped, saying so, without it.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use serde_json::{Value, json};
use shepherd_sim::testing::{Admin, Nic, OvsSwitch, OwnedRack, ShepherdProcess, bin, is_root};

const PROVISIONING: u16 = 10;
const BMC: u16 = 20;
const IDLE: u16 = 4000;
const SERVICES: Ipv4Addr = Ipv4Addr::new(10, 90, 0, 100);
const A_BMC: Ipv4Addr = Ipv4Addr::new(10, 90, 0, 200);
const PORT: u16 = 8080;

/// Changes made twice: a port set to what shepherd set it to last time
/// while the switch still held that (read back before the change).
/// Setting it again after someone else changed it is no repeat.
const TWICE: &str = "SELECT count(*) FROM (SELECT after_native, after_tagged, before_native, \
        before_tagged, lag(after_native) OVER w AS n, lag(after_tagged) OVER w AS t \
      FROM switch_change WINDOW w AS (PARTITION BY switch_name, port_name ORDER BY change_id)) c \
     WHERE c.after_native IS NOT DISTINCT FROM c.n AND c.after_tagged = c.t \
       AND c.before_native IS NOT DISTINCT FROM c.n AND c.before_tagged IS NOT DISTINCT FROM c.t";

fn nic_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 90, 1, i as u8)
}

/// Each switch port's machine, and the project of the device on it.
async fn ports_of(admin: &Admin) -> BTreeMap<String, (String, Option<String>, Value)> {
    let mut out = BTreeMap::new();
    for d in admin.machine_details().await {
        let project = d["tenancy"]["device"]["project"]["id"]
            .as_str()
            .map(str::to_string);
        for p in d["ports"].as_array().into_iter().flatten() {
            out.insert(
                p["port"].as_str().unwrap().to_string(),
                (
                    d["machine"]["machine_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    project.clone(),
                    p.clone(),
                ),
            );
        }
    }
    out
}

/// Waits until every port in `want` holds its VLAN on the switch (read
/// by the test, with `ovs-vsctl`).
async fn until_tags(rack: &mut OwnedRack, sw: &OvsSwitch, want: &[(&str, u16)], what: &str) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(p, v)| (p.to_string(), v.to_string()))
        .collect();
    rack.shepherd
        .until(
            Duration::from_secs(120),
            Duration::from_millis(200),
            async || {
                let seen: Vec<(String, String)> =
                    want.iter().map(|(p, _)| (p.clone(), sw.tag(p))).collect();
                if seen == want {
                    Ok(())
                } else {
                    Err(format!("{what}: the switch holds {seen:?}, not {want:?}"))
                }
            },
        )
        .await
}

/// The reachability of every pair, as seen: (from, to, reached).
async fn pairs(nics: &[(&str, &Nic)], to: &[(&str, Ipv4Addr)]) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    for (from, nic) in nics {
        for (name, ip) in to {
            if *ip == nic.ip {
                continue;
            }
            out.push((
                from.to_string(),
                name.to_string(),
                nic.reaches(*ip, PORT, Duration::from_secs(2)).await,
            ));
        }
    }
    out
}

/// A rack of `n` machines (from `first`) whose NICs are `sw`'s ports p1..pn, shepherd
/// moving them (and the key file it logs in to the switch with).
async fn rack_on(
    sw: &OvsSwitch,
    n: usize,
    first: Ipv4Addr,
) -> (OwnedRack, tempfile::NamedTempFile) {
    let key_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key_file.path(), &sw.client_key).unwrap();
    let (address, key_path) = (sw.ssh.to_string(), key_file.path().display().to_string());
    let db = sw.db.display().to_string();
    let edit = move |t: &mut toml::Table| {
        let network: toml::Table = toml::from_str(&format!(
            "provisioning_vlan = {PROVISIONING}\nidle_vlan = {IDLE}\nbmc_vlan = {BMC}\n\
             tenant_vlans = \"1000-1999\"\ninterval = \"500ms\"\ntimeout = \"5s\"\n\
             [[switches]]\nname = \"leaf1\"\ndriver = \"ovs\"\naddress = \"{address}\"\n\
             private_key = {{ file = \"{key_path}\" }}\novs_db = \"unix:{db}\"\n"
        ))
        .unwrap();
        t.insert("network".into(), network.into());
        let machines = t["provider"]["inventory"]["machines"]
            .as_array_mut()
            .unwrap();
        for (i, m) in machines.iter_mut().enumerate() {
            let port: toml::Value = toml::from_str::<toml::Table>(&format!(
                "p = [{{ switch = \"leaf1\", port = \"p{}\" }}]",
                i + 1
            ))
            .unwrap()["p"]
                .clone();
            m.as_table_mut().unwrap().insert("ports".into(), port);
        }
    };
    let rack = OwnedRack::start_edited(n, first, "1s", 16 << 20, &[], &edit).await;
    (rack, key_file)
}

#[actix_rt::test]
async fn ports_follow_the_life_cycle_and_tenants_reach_only_their_own() {
    if !is_root() {
        eprintln!("SKIPPED: the switch test needs root (network namespaces)");
        return;
    }
    let mut sw = OvsSwitch::start("leaf1");
    // Four machines' NICs, on a VLAN nothing is on until shepherd moves
    // them; shepherd's services and a BMC.
    let nics: Vec<Nic> = (1..=4).map(|i| sw.nic(nic_ip(i), 999)).collect();
    let services = sw.nic(SERVICES, PROVISIONING);
    let bmc = sw.nic(A_BMC, BMC);
    let mut servers: Vec<std::process::Child> = nics.iter().map(|n| n.listen(PORT)).collect();
    servers.push(services.listen(PORT));
    servers.push(bmc.listen(PORT));
    let (mut rack, _key) = rack_on(&sw, 4, Ipv4Addr::new(127, 0, 97, 1)).await;
    let limit = Duration::from_secs(240);
    let mut table = Vec::new();
    let (client, conn) = tokio_postgres::connect(&rack.db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    actix_rt::spawn(async move {
        let _ = conn.await;
    });

    // Taken over only once on the provisioning network: every port moved
    // there first, read back.
    until_tags(
        &mut rack,
        &sw,
        &[
            ("p1", PROVISIONING),
            ("p2", PROVISIONING),
            ("p3", PROVISIONING),
            ("p4", PROVISIONING),
        ],
        "taken over",
    )
    .await;
    rack.admin
        .wait(&mut rack.shepherd, "agent-started", 4, limit)
        .await;
    let early: i64 = client
        .query_one(
            "SELECT count(*) FROM machine_agent_started a WHERE a.agent_started_at <= \
               (SELECT min(c.at) FROM switch_change c WHERE c.machine_id = a.machine_id \
                  AND c.purpose = 'provisioning')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        early, 0,
        "an agent was started before its port was on provisioning"
    );
    let named: Vec<(&str, &Nic)> = vec![
        ("m1", &nics[0]),
        ("m2", &nics[1]),
        ("m3", &nics[2]),
        ("m4", &nics[3]),
    ];
    for (from, to, seen) in pairs(&named[..1], &[("services", SERVICES), ("bmc", A_BMC)]).await {
        let expected = to == "services";
        table.push(("taken over", from, to, expected, seen));
    }

    // Erased, free: each waits on the idle VLAN, reaching neither
    // shepherd's services nor a BMC.
    rack.deprovision_all().await;
    rack.admin
        .wait(&mut rack.shepherd, "available", 4, limit)
        .await;
    until_tags(
        &mut rack,
        &sw,
        &[("p1", IDLE), ("p2", IDLE), ("p3", IDLE), ("p4", IDLE)],
        "free",
    )
    .await;
    for (from, to, seen) in pairs(&named[..1], &[("services", SERVICES), ("bmc", A_BMC)]).await {
        table.push(("free", from, to, false, seen));
    }

    // Two projects: a device each on two machines, and one on a third.
    let (a, token_a) = rack.project("alpha");
    let (b, token_b) = rack.project("beta");
    let create = |project: uuid::Uuid, host: &str| {
        (
            format!("/metal/v1/projects/{project}/devices"),
            json!({"metro": "sv", "plan": OwnedRack::PLAN,
                   "operating_system": OwnedRack::OPERATING_SYSTEM, "hostname": host}),
        )
    };
    for (project, token, host) in [
        (a, &token_a, "a1"),
        (a, &token_a, "a2"),
        (b, &token_b, "b1"),
    ] {
        let (path, body) = create(project, host);
        let (s, d) = rack
            .admin
            .call("POST", &path, Some(token), Some(body))
            .await;
        assert_eq!(s, 201, "{d}");
    }
    let path_a = format!("/metal/v1/projects/{a}/devices");
    let path_b = format!("/metal/v1/projects/{b}/devices");
    rack.admin
        .wait_active(&mut rack.shepherd, &path_a, &token_a, 2, limit)
        .await;
    rack.admin
        .wait_active(&mut rack.shepherd, &path_b, &token_b, 1, limit)
        .await;
    let ports = ports_of(&rack.admin).await;
    let project_of = |port: &str| ports[port].1.clone();
    // Active only once read back on the project's network.
    for (port, (_, project, p)) in &ports {
        if project.is_some() {
            assert_eq!(p["purpose"], "tenant", "{port}: {p:#}");
            assert_eq!(p["settled"], true, "{port}: {p:#}");
            assert_eq!(sw.tag(port), p["vlan"].to_string(), "{port}: {p:#}");
        }
    }
    let by_project: Vec<(&str, &Nic, Option<String>)> = named
        .iter()
        .map(|(n, nic)| (*n, *nic, project_of(&nic.port)))
        .collect();
    for (from, fnic, fp) in &by_project {
        for (to, tnic, tp) in &by_project {
            if from == to {
                continue;
            }
            let expected = fp.is_some() && fp == tp || (fp.is_none() && tp.is_none());
            let seen = fnic
                .reaches(
                    tnic.ip,
                    PORT,
                    Duration::from_secs(if expected { 10 } else { 2 }),
                )
                .await;
            table.push(("tenants", from.to_string(), to.to_string(), expected, seen));
            if fp.is_some() && tp.is_some() && fp != tp {
                assert!(
                    !fnic.resolves(tnic.ip).await,
                    "{from} resolved {to}'s address (ARP) across projects"
                );
            }
        }
        if fp.is_some() {
            for (to, ip) in [("services", SERVICES), ("bmc", A_BMC)] {
                let seen = fnic.reaches(ip, PORT, Duration::from_secs(2)).await;
                table.push(("tenants", from.to_string(), to.into(), false, seen));
            }
        }
    }

    // The switch's sshd stopped: a device on the free machine stays
    // queued (its port cannot leave the idle VLAN, so its installation is
    // not handed to it), the port naming the switch's failure; once sshd
    // is back it completes.
    sw.stop_sshd();
    let (path, body) = create(b, "b2");
    let (s, d) = rack
        .admin
        .call("POST", &path, Some(&token_b), Some(body))
        .await;
    assert_eq!(s, 201, "{d}");
    let b2 = d["id"].as_str().unwrap().to_string();
    let free_port = by_project
        .iter()
        .find(|(_, _, p)| p.is_none())
        .map(|(_, n, _)| n.port.clone())
        .unwrap();
    rack.shepherd
        .until(limit, Duration::from_millis(500), async || {
            let p = &ports_of(&rack.admin).await[&free_port].2;
            match p["error"].as_str() {
                Some(e) if e.contains("switch leaf1") && p["purpose"] == "provisioning" => Ok(()),
                _ => Err(format!("no failure named on {free_port}: {p:#}")),
            }
        })
        .await;
    let (s, d) = rack
        .admin
        .call(
            "GET",
            &format!("/metal/v1/devices/{b2}"),
            Some(&token_b),
            None,
        )
        .await;
    assert_eq!(s, 200, "{d}");
    assert_eq!(
        d["state"], "queued",
        "installed before its port moved to provisioning: {d:#}"
    );
    let (_, switches) = rack.admin.call("GET", "/api/v1/switches", None, None).await;
    assert!(
        switches["switches"][0]["failures"].as_i64().unwrap() > 0,
        "{switches:#}"
    );
    assert_eq!(
        rack.admin
            .metric("shepherd_switch_up", "switch=\"leaf1\"")
            .await,
        0.0
    );
    sw.start_sshd();
    rack.admin
        .wait_active(&mut rack.shepherd, &path_b, &token_b, 2, limit)
        .await;
    assert_eq!(
        rack.admin
            .metric("shepherd_switch_up", "switch=\"leaf1\"")
            .await,
        1.0
    );

    // b1 deleted: its port is back on provisioning, read back, before its
    // erasure is asked; then it waits on idle.
    let b1_port = by_project
        .iter()
        .find(|(_, _, p)| p.as_deref() == Some(&b.to_string()))
        .map(|(_, n, _)| n.port.clone())
        .unwrap();
    let b1_machine = ports[&b1_port].0.clone();
    let (s, list) = rack.admin.call("GET", &path_b, Some(&token_b), None).await;
    assert_eq!(s, 200);
    let b1 = list["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["hostname"] == "b1")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, d) = rack
        .admin
        .call(
            "DELETE",
            &format!("/metal/v1/devices/{b1}"),
            Some(&token_b),
            None,
        )
        .await;
    assert!(s == 204 || s == 200, "{s} {d}");
    until_tags(&mut rack, &sw, &[(&b1_port, IDLE)], "b1 deleted and erased").await;
    let machine: uuid::Uuid = b1_machine.parse().unwrap();
    let moved: std::time::SystemTime = client
        .query_one(
            "SELECT min(at) FROM switch_change WHERE machine_id = $1 AND purpose = 'provisioning' \
               AND at > (SELECT max(at) FROM switch_change WHERE machine_id = $1 AND purpose = 'tenant')",
            &[&machine],
        )
        .await
        .unwrap()
        .get(0);
    let erase_asked: std::time::SystemTime = client
        .query_one(
            "SELECT requested_at FROM machine_installation WHERE machine_id = $1",
            &[&machine],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        moved < erase_asked,
        "the erasure was asked before the port left the tenant's network"
    );

    // The switch refuses the free machine's next change (its port is gone
    // from the bridge): the new device stays provisioning with the switch's
    // words on the port; shepherd SIGKILLed meanwhile, the port put back,
    // the next shepherd converges, and no port was changed twice to the
    // same VLAN.
    sw.vsctl(&["del-port", &sw.bridge, &b1_port]);
    let (path, body) = create(a, "a3");
    let (s, d) = rack
        .admin
        .call("POST", &path, Some(&token_a), Some(body))
        .await;
    assert_eq!(s, 201, "{d}");
    let a3 = d["id"].as_str().unwrap().to_string();
    rack.shepherd
        .until(limit, Duration::from_millis(500), async || {
            let p = &ports_of(&rack.admin).await[&b1_port].2;
            match p["error"].as_str() {
                Some(e) if e.contains(&format!("switch leaf1: port {b1_port} does not exist")) => {
                    Ok(())
                }
                _ => Err(format!("the refusal is not named on {b1_port}: {p:#}")),
            }
        })
        .await;
    let (_, d) = rack
        .admin
        .call(
            "GET",
            &format!("/metal/v1/devices/{a3}"),
            Some(&token_a),
            None,
        )
        .await;
    // Its installation waits too: nothing of shepherd's reaches a
    // machine off the provisioning network.
    assert_eq!(
        d["state"], "queued",
        "its installation went ahead with its port off provisioning: {d:#}"
    );
    rack.shepherd.kill();
    sw.vsctl(&["add-port", &sw.bridge, &b1_port, "tag=999"]);
    let log = rack.dir.path().join("shepherd-2.log");
    rack.shepherd =
        ShepherdProcess::start(&bin("shepherd"), &rack.admin.config, log, &rack.admin.env);
    rack.admin
        .wait_active(&mut rack.shepherd, &path_a, &token_a, 3, limit)
        .await;
    let twice: i64 = client.query_one(TWICE, &[]).await.unwrap().get(0);
    assert_eq!(twice, 0, "a port was changed twice to the same VLAN");

    println!("| step | from | to | expected | seen |\n|---|---|---|---|---|");
    for (step, from, to, expected, seen) in &table {
        println!(
            "| {step} | {from} | {to} | {} | {} |",
            if *expected {
                "reachable"
            } else {
                "unreachable"
            },
            if *seen { "reached" } else { "not reached" }
        );
    }
    for (step, from, to, expected, seen) in &table {
        assert_eq!(expected, seen, "{step}: {from} → {to}");
    }
    for mut s in servers {
        let _ = s.kill();
        let _ = s.wait();
    }
}

/// Creates a device named `host` in `project` and returns its ID.
async fn device(rack: &OwnedRack, project: uuid::Uuid, token: &str, host: &str) -> String {
    let (s, d) = rack
        .admin
        .call(
            "POST",
            &format!("/metal/v1/projects/{project}/devices"),
            Some(token),
            Some(json!({"metro": "sv", "plan": OwnedRack::PLAN,
                        "operating_system": OwnedRack::OPERATING_SYSTEM, "hostname": host})),
        )
        .await;
    assert_eq!(s, 201, "{d}");
    d["id"].as_str().unwrap().to_string()
}

/// A device's bond port's ID.
async fn bond_of(rack: &OwnedRack, device: &str, token: &str) -> String {
    let (s, d) = rack
        .admin
        .call(
            "GET",
            &format!("/metal/v1/devices/{device}"),
            Some(token),
            None,
        )
        .await;
    assert_eq!(s, 200, "{d}");
    d["network_ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "bond0")
        .unwrap_or_else(|| panic!("no bond0: {d:#}"))["id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[actix_rt::test]
async fn tenants_choose_their_networks_through_equinix_s_sdk_and_layer_2_holds() {
    if !is_root() {
        eprintln!("SKIPPED: the switch test needs root (network namespaces)");
        return;
    }
    let sw = OvsSwitch::start("leaf1");
    let nics: Vec<Nic> = (1..=3).map(|i| sw.nic(nic_ip(i), 999)).collect();
    let servers: Vec<std::process::Child> = nics.iter().map(|n| n.listen(PORT)).collect();
    let (mut rack, _key) = rack_on(&sw, 3, Ipv4Addr::new(127, 0, 98, 1)).await;
    let limit = Duration::from_secs(240);
    // A second shepherd on the same BMDB: one session changes the switch.
    let mut env = rack.admin.env.clone();
    for (k, v) in env.iter_mut() {
        if matches!(
            *k,
            "SHEPHERD__ADMIN__LISTEN"
                | "SHEPHERD__BMAAS__LISTEN"
                | "SHEPHERD__BMAAS__ENDPOINT"
                | "SHEPHERD__INSTALLATIONS__IMAGES_LISTEN"
        ) {
            *v = format!("127.0.0.1:{}", shepherd_sim::testing::Sshd::free_port());
        }
    }
    let mut second = ShepherdProcess::start(
        &bin("shepherd"),
        &rack.admin.config,
        rack.dir.path().join("shepherd-second.log"),
        &env,
    );
    rack.admin
        .wait(&mut rack.shepherd, "agent-started", 3, limit)
        .await;
    rack.deprovision_all().await;
    rack.admin
        .wait(&mut rack.shepherd, "available", 3, limit)
        .await;
    let (a, token_a) = rack.project("alpha");
    let (b, token_b) = rack.project("beta");
    let a1 = device(&rack, a, &token_a, "a1").await;
    let a2 = device(&rack, a, &token_a, "a2").await;
    let b1 = device(&rack, b, &token_b, "b1").await;
    let path_a = format!("/metal/v1/projects/{a}/devices");
    let path_b = format!("/metal/v1/projects/{b}/devices");
    rack.admin
        .wait_active(&mut rack.shepherd, &path_a, &token_a, 2, limit)
        .await;
    rack.admin
        .wait_active(&mut rack.shepherd, &path_b, &token_b, 1, limit)
        .await;

    // Equinix's SDK through the ports and virtual networks of a1.
    let ca = rack.dir.path().join("fleet/ssh/fleet-ca.pem");
    let out = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/sdk/metal_network_check.py"
        ))
        .arg(format!("{}/metal/v1", rack.admin.base))
        .arg(a.to_string())
        .arg(&token_a)
        .arg(&a1)
        .arg("sv")
        .arg(&ca)
        .output()
        .expect("python3 with Equinix's SDK (scripts/test installs it)");
    assert!(
        out.status.success(),
        "the SDK's network check failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let sdk: Value = serde_json::from_slice(&out.stdout).unwrap();
    println!("the SDK's steps: {sdk}");
    assert_eq!(sdk["batch"], "completed", "{sdk}");
    assert_eq!(sdk["refused"].as_array().unwrap().len(), 4, "{sdk}");

    // Layer 2: a1 and a2 on one virtual network of alpha's, untagged; b1
    // on beta's own. Each NIC is found by its machine's ports.
    let (s, vn) = rack
        .admin
        .call(
            "POST",
            &format!("/metal/v1/projects/{a}/virtual-networks"),
            Some(&token_a),
            Some(json!({"metro": "sv", "description": "a1 and a2"})),
        )
        .await;
    assert_eq!(s, 201, "{vn}");
    let vxlan = vn["vxlan"].as_i64().unwrap();
    // The VLAN is alpha's: beta cannot have it, or see it.
    let (s, d) = rack
        .admin
        .call(
            "POST",
            &format!("/metal/v1/projects/{b}/virtual-networks"),
            Some(&token_b),
            Some(json!({"metro": "sv", "vxlan": vxlan})),
        )
        .await;
    assert_eq!(s, 422, "{d}");
    let vn_id = vn["id"].as_str().unwrap();
    let (s, _) = rack
        .admin
        .call(
            "GET",
            &format!("/metal/v1/virtual-networks/{vn_id}"),
            Some(&token_b),
            None,
        )
        .await;
    assert_eq!(s, 404);
    let a1_bond = bond_of(&rack, &a1, &token_a).await;
    let (s, _) = rack
        .admin
        .call(
            "GET",
            &format!("/metal/v1/ports/{a1_bond}"),
            Some(&token_b),
            None,
        )
        .await;
    assert_eq!(s, 404, "beta sees alpha's port");
    let read_only = rack
        .admin
        .cli(&[
            "tokens",
            "create",
            "--project",
            &a.to_string(),
            "--read-only",
        ])
        .lines()
        .last()
        .unwrap()
        .to_string();
    let (s, _) = rack
        .admin
        .call(
            "POST",
            &format!("/metal/v1/ports/{a1_bond}/assign"),
            Some(&read_only),
            Some(json!({"vnid": vn_id})),
        )
        .await;
    assert_eq!(s, 403, "a read-only token changed a port");
    for dev in [&a1, &a2] {
        let bond = bond_of(&rack, dev, &token_a).await;
        let (s, p) = rack
            .admin
            .call(
                "POST",
                &format!("/metal/v1/ports/{bond}/convert/layer-2"),
                Some(&token_a),
                Some(json!({"vnid": vn_id})),
            )
            .await;
        assert_eq!(s, 200, "{p}");
        let (s, p) = rack
            .admin
            .call(
                "POST",
                &format!("/metal/v1/ports/{bond}/native-vlan?vnid={vxlan}"),
                Some(&token_a),
                None,
            )
            .await;
        assert_eq!(s, 200, "{p}");
        assert_eq!(p["network_type"], "layer2-bonded", "{p}");
    }
    let ports = ports_of(&rack.admin).await;
    let nic_of = |dev_project: &uuid::Uuid, nth: usize| -> &Nic {
        let port = ports
            .iter()
            .filter(|(_, (_, p, _))| p.as_deref() == Some(&dev_project.to_string()))
            .map(|(port, _)| port.clone())
            .nth(nth)
            .unwrap();
        nics.iter().find(|n| n.port == port).unwrap()
    };
    let (n_a1, n_a2, n_b1) = (nic_of(&a, 0), nic_of(&a, 1), nic_of(&b, 0));
    until_tags(
        &mut rack,
        &sw,
        &[(&n_a1.port, vxlan as u16), (&n_a2.port, vxlan as u16)],
        "layer 2 on alpha's network",
    )
    .await;
    let mut table = Vec::new();
    for (from, fnic, to, tnic, expected) in [
        ("a1", n_a1, "a2", n_a2, true),
        ("a2", n_a2, "a1", n_a1, true),
        ("a1", n_a1, "b1", n_b1, false),
        ("b1", n_b1, "a1", n_a1, false),
        ("b1", n_b1, "a2", n_a2, false),
    ] {
        let seen = fnic
            .reaches(
                tnic.ip,
                PORT,
                Duration::from_secs(if expected { 10 } else { 2 }),
            )
            .await;
        table.push((from, to, expected, seen));
    }
    println!("| layer 2 | from | to | expected | seen |\n|---|---|---|---|---|");
    for (from, to, expected, seen) in &table {
        println!("| a1, a2 on VLAN {vxlan} | {from} | {to} | {expected} | {seen} |");
    }
    for (from, to, expected, seen) in &table {
        assert_eq!(expected, seen, "{from} → {to}");
    }
    // Both shepherds ran all along; the switch's changes were one
    // session's, none made twice.
    second.assert_running();
    let (client, conn) = tokio_postgres::connect(&rack.db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    actix_rt::spawn(async move {
        let _ = conn.await;
    });
    let row = client
        .query_one(
            "SELECT count(DISTINCT session_id), count(*) FROM switch_change",
            &[],
        )
        .await
        .unwrap();
    let twice: i64 = client.query_one(TWICE, &[]).await.unwrap().get(0);
    let (sessions, changes): (i64, i64) = (row.get(0), row.get(1));
    println!("two shepherds: {changes} changes by {sessions} session(s), {twice} made twice");
    assert_eq!(sessions, 1, "two sessions changed the switch");
    assert_eq!(twice, 0, "a port was changed twice to the same VLANs");
    second.kill();
    // In use: not deleted; the tenant's network stays.
    let (s, d) = rack
        .admin
        .call(
            "DELETE",
            &format!("/metal/v1/virtual-networks/{vn_id}"),
            Some(&token_a),
            None,
        )
        .await;
    assert_eq!(s, 422, "{d}");
    let _ = b1;
    for mut s in servers {
        let _ = s.kill();
        let _ = s.wait();
    }
}

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
