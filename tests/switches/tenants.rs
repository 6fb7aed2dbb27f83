//! The Metal API's ports and virtual networks, through Equinix's SDK;
//! two shepherds; layer 2 shown by traffic.

use super::*;

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
    let vn = virtual_network(&rack, a, &token_a, "a1 and a2").await;
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
