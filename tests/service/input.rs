//! Bad input and small faults: a bad inventory file, two shepherds provisioning.

use super::*;

#[actix_rt::test]
async fn a_bad_inventory_file_adopts_the_good_hosts_and_reports_each_bad_one_once() {
    let rig = Rig::new().await;
    let file = rig.dir.path().join("inventory.toml");
    let long = "y".repeat(200);
    std::fs::write(
        &file,
        format!(
            "[[machines]]\nid = \"good-1\"\naddress = \"127.0.0.1\"\n\n\
             [[machines]]\nid = \"{long}\"\naddress = \"127.0.0.1\"\n\n\
             [[machines]]\nid = \"\"\naddress = \"127.0.0.1\"\n\n\
             [[machines]]\nid = \"bad-address\"\naddress = \"127.0.0.300\"\n\n\
             [[machines]]\nid = \"good-2\"\naddress = \"127.0.0.1\"\n"
        ),
    )
    .unwrap();
    let text = format!(
        "{}\n[provider]\nkind = \"static\"\n\n[provider.inventory]\nfile = \"{}\"\n",
        rig.base_config(),
        file.display()
    );
    let config = rig.write_config("shepherd.toml", &text);
    let mut s = rig.shepherd(&config, "shepherd.log");
    rig.wait_for(
        "the 2 good hosts taken over",
        AGENTS,
        2,
        Duration::from_secs(30),
        &mut s,
    )
    .await;
    // Several more rounds (every 500 ms): still reported once each.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rig.count(MACHINES).await, 2);
    let log = std::fs::read_to_string(&s.log).unwrap();
    let f = file.display();
    for problem in [
        format!("{f}:5: machines[1]: id is 200 characters long"),
        format!("{f}:9: machines[2]: id is empty"),
        format!("{f}:13: host bad-address: address \"127.0.0.300\" is not an IP address"),
    ] {
        assert_eq!(
            log.matches(problem.as_str()).count(),
            1,
            "{problem} must be reported once:\n{log}"
        );
    }
    assert!(!log.contains("provisioner round failed"), "{log}");
    s.terminate().await;
}

#[actix_rt::test]
async fn two_shepherds_share_forty_reservations_and_one_of_them_provisions() {
    let rig = Rig::new().await;
    let sim = Sim::start(40, &[]);
    let config = rig.write_config("shepherd.toml", &rig.equinix_config(&sim));
    let mut a = rig.shepherd(&config, "a.log");
    let _b = rig.shepherd(&config, "b.log");
    rig.wait_for("40 machines", MACHINES, 40, Duration::from_secs(60), &mut a)
        .await;
    // A little longer: nothing more may be created.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sim.devices().await, (40, 40), "one device per reservation");
    // Provisioning is a fleet duty: one shepherd creates, the other stands
    // by, so no create races another and each device costs one request.
    let stats = sim.stats().await;
    let creates = stats["requests"]["create_device"].as_u64().unwrap();
    let lookups = stats["requests"]["get_reservation"].as_u64().unwrap_or(0);
    assert_eq!(
        (creates, lookups),
        (40, 0),
        "creates and look-ups for 40 devices: {}",
        stats["statuses"]
    );
}
