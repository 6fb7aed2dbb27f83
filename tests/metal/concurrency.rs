//! Creates racing for the last machines: each machine goes to one device,
//! the rest are told there is no capacity, and nothing is half made.

use std::net::Ipv4Addr;

use super::{Rig, device_body};

#[actix_rt::test]
async fn fifty_creates_racing_for_ten_machines_make_ten_devices() {
    let rig = Rig::new(10, Ipv4Addr::new(127, 0, 72, 1)).await;
    let p = rig.project("racers", &[]);
    let (_, token) = rig.token(p, false);
    // A 503 (the BMDB did not answer within admin.database_timeout, as
    // fifty requests at once on a loaded machine may see) is asked again,
    // as Equinix's clients do; every other answer is final.
    let creates = (0..50).map(|i| {
        let (rig, token) = (&rig, &token);
        async move {
            let mut tries = 0;
            loop {
                let answer = rig
                    .create(p, token, device_body(&format!("racer-{i}")))
                    .await;
                tries += 1;
                if answer.0 != 503 || tries == 20 {
                    return answer;
                }
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
        }
    });
    let answers = futures::future::join_all(creates).await;
    let created: Vec<_> = answers.iter().filter(|(s, _)| *s == 201).collect();
    let refused: Vec<_> = answers.iter().filter(|(s, _)| *s == 422).collect();
    assert_eq!(created.len(), 10, "{answers:?}");
    assert_eq!(refused.len(), 40, "{answers:?}");
    for (_, body) in &refused {
        let e = body["errors"][0].as_str().unwrap();
        assert!(e.contains("There aren't available servers"), "{e}");
    }
    // In the BMDB: ten devices, ten machines, each asked one installation.
    let pairs: Vec<(uuid::Uuid, uuid::Uuid)> = shepherd_sim::testing::pairs(
        &rig.bmdb,
        "SELECT device_id, machine_id FROM device WHERE deleted_at IS NULL",
    )
    .await;
    assert_eq!(pairs.len(), 10);
    let machines: std::collections::BTreeSet<_> = pairs.iter().map(|(_, m)| *m).collect();
    assert_eq!(machines.len(), 10, "a machine in two devices: {pairs:?}");
    let asked = shepherd_sim::testing::count(
        &rig.bmdb,
        "SELECT count(*) FROM machine_installation WHERE kind = 'install'",
    )
    .await;
    assert_eq!(asked, 10);
    // The API shows the same ten.
    let (_, list) = rig
        .get(&format!("/projects/{p}/devices?per_page=100"), &token)
        .await;
    assert_eq!(list["meta"]["total"], 10, "{list}");
    assert_eq!(list["devices"].as_array().unwrap().len(), 10);
}
