//! Ports through a machine's life: provisioning, idle, the tenant's
//! network; isolation by traffic; a switch that stops answering or
//! refuses, shepherd killed meanwhile.

use super::*;

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
        device(&rack, project, token, host).await;
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
    // When the port left the tenant's VLAN for provisioning, by the
    // switch's own transaction log.
    let tags = sw.tag_log(&b1_port);
    let tenant_at = tags
        .iter()
        .rposition(|(_, t)| t.is_some_and(|t| (1000..2000).contains(&t)))
        .unwrap_or_else(|| panic!("{b1_port} was never on a tenant's VLAN: {tags:?}"));
    let moved = tags[tenant_at..]
        .iter()
        .find(|(_, t)| *t == Some(PROVISIONING))
        .unwrap_or_else(|| panic!("{b1_port} never went back to provisioning: {tags:?}"))
        .0;
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
        "the erasure was asked ({erase_asked:?}) before the switch put the port on provisioning ({moved:?})"
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
