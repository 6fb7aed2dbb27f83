//! A machine's firmware as recorded: each version seen once in its history,
//! a component gone from the BMC's list removed, a failed read keeping what
//! the read before found, and machines per version for the fleet.

use shepherd::bmdb::Provider;
use shepherd::bmdb::firmware::{self, Bios, Component, Drive, Reading, Storage, Volume};
use shepherd_sim::testing::TestDb;

fn component(name: &str, version: &str) -> Component {
    Component {
        component: name.into(),
        name: None,
        version: version.into(),
        updateable: Some(true),
    }
}

#[actix_rt::test]
async fn each_version_is_seen_once_a_component_gone_is_removed_and_a_failed_read_keeps_the_last() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let ids = crate::provided_machines(&bmdb, Provider::None, 2).await;
    let (m, other) = (ids[0], ids[1]);
    let record = |id, read: Result<Vec<Component>, String>| {
        let bmdb = bmdb.clone();
        async move {
            let read = read.map(|components| Reading {
                components,
                bios: None,
                storage: None,
                partial: Vec::new(),
            });
            bmdb.transact(async |tx| firmware::record(tx, id, &read).await)
                .await
                .unwrap()
        }
    };

    // The first read: every component seen for the first time.
    let three = vec![
        component("bios", "1.0.0"),
        component("bmc", "5.10"),
        component("nic:1", "22.1"),
    ];
    let first = record(m, Ok(three.clone())).await;
    assert_eq!(
        first
            .iter()
            .map(|s| (
                s.component.as_str(),
                s.previous.as_deref(),
                s.version.as_str()
            ))
            .collect::<Vec<_>>(),
        [
            ("bios", None, "1.0.0"),
            ("bmc", None, "5.10"),
            ("nic:1", None, "22.1")
        ]
    );
    // The same again: nothing new.
    let same = record(m, Ok(three)).await;
    assert!(same.is_empty(), "{same:?}");
    // The BIOS updated, the NIC gone from the list.
    let updated = record(
        m,
        Ok(vec![component("bios", "1.1.0"), component("bmc", "5.10")]),
    )
    .await;
    assert_eq!(updated.len(), 1, "{updated:?}");
    assert_eq!(updated[0].previous.as_deref(), Some("1.0.0"));
    assert_eq!(updated[0].version, "1.1.0");
    // A partial read (the BMC failed the manager's part): what it left
    // out is not gone.
    let partial = Ok(Reading {
        components: vec![component("bios", "1.1.0")],
        bios: None,
        storage: None,
        partial: vec!["the manager's firmware: HTTP 500 for /redfish/v1/Managers/1".into()],
    });
    bmdb.transact(async |tx| firmware::record(tx, m, &partial).await)
        .await
        .unwrap();
    let kept = bmdb
        .transact(async |tx| firmware::of_machine(tx, m).await)
        .await
        .unwrap();
    assert_eq!(kept.components.len(), 2, "{kept:?}");
    assert_eq!(
        kept.read_error.as_deref(),
        Some("partly read: the manager's firmware: HTTP 500 for /redfish/v1/Managers/1")
    );
    // A failed read: the components stay, its cause is recorded.
    let failed = record(m, Err("host node-1: BMC http://x: unreachable".into())).await;
    assert!(failed.is_empty());
    record(other, Ok(vec![component("bios", "1.0.0")])).await;

    let f = bmdb
        .transact(async |tx| firmware::of_machine(tx, m).await)
        .await
        .unwrap();
    assert_eq!(
        f.components
            .iter()
            .map(|r| (r.component.component.as_str(), r.component.version.as_str()))
            .collect::<Vec<_>>(),
        [("bios", "1.1.0"), ("bmc", "5.10")]
    );
    assert_eq!(
        f.read_error.as_deref(),
        Some("host node-1: BMC http://x: unreachable")
    );
    let bios_since = f.components[0].since;
    assert!(
        bios_since >= f.components[1].since,
        "the BIOS's version is newer"
    );
    // Newest first: the update, then the three first versions.
    assert_eq!(f.history.len(), 4, "{:?}", f.history);
    assert_eq!(
        (
            f.history[0].component.as_str(),
            f.history[0].previous.as_deref(),
            f.history[0].version.as_str()
        ),
        ("bios", Some("1.0.0"), "1.1.0")
    );
    assert_eq!(f.history[0].seen_at, bios_since);
    // When each was read, and the BIOS then recorded.
    let last = bmdb
        .transact(async |tx| firmware::last_reads(tx, &ids).await)
        .await
        .unwrap();
    assert_eq!(last[&m].1.as_deref(), Some("1.1.0"));
    assert_eq!(last[&other].1.as_deref(), Some("1.0.0"));
    // The fleet: machines per component and version.
    let versions = bmdb
        .transact(async |tx| firmware::versions(tx).await)
        .await
        .unwrap();
    assert_eq!(
        versions,
        [
            ("bios".to_string(), "1.0.0".to_string(), 1),
            ("bios".to_string(), "1.1.0".to_string(), 1),
            ("bmc".to_string(), "5.10".to_string(), 1),
        ]
    );
}

/// A RAID controller with two drives mirrored.
fn storage() -> Vec<Storage> {
    let drive = |id: &str| Drive {
        id: id.into(),
        name: Some(format!("Drive {id}")),
        capacity_bytes: Some(899_527_000_000),
        media_type: Some("HDD".into()),
        protocol: Some("SAS".into()),
        serial_number: Some(format!("SN-{id}")),
    };
    vec![Storage {
        id: "RAID.1".into(),
        name: Some("Integrated RAID".into()),
        volumes_offered: true,
        drives: vec![drive("0"), drive("1")],
        volumes: vec![Volume {
            id: "1".into(),
            name: Some("boot".into()),
            raid_type: Some("RAID1".into()),
            capacity_bytes: Some(899_527_000_000),
            drives: vec!["0".into(), "1".into()],
        }],
    }]
}

#[actix_rt::test]
async fn bios_settings_and_storage_are_rewritten_only_when_they_change() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let m = crate::provided_machines(&bmdb, Provider::None, 1).await[0];
    let bios = |turbo: &str| Bios {
        registry: Some("BiosAttributeRegistryP89.v1_0_0".into()),
        attributes: serde_json::json!({"BootMode": "Uefi", "ProcTurboMode": turbo})
            .as_object()
            .unwrap()
            .clone(),
    };
    let read = |turbo: &'static str| {
        let bmdb = bmdb.clone();
        async move {
            let read = Ok(Reading {
                components: Vec::new(),
                bios: Some(bios(turbo)),
                storage: Some(storage()),
                partial: Vec::new(),
            });
            bmdb.transact(async |tx| firmware::record(tx, m, &read).await)
                .await
                .unwrap();
            let f = bmdb
                .transact(async |tx| firmware::of_machine(tx, m).await)
                .await
                .unwrap();
            assert_eq!(
                f.storage.as_ref().unwrap().0,
                storage(),
                "the storage read back"
            );
            f.bios.unwrap()
        }
    };
    let (first, at) = read("Enabled").await;
    assert_eq!(first, bios("Enabled"));
    let (_, again) = read("Enabled").await;
    assert_eq!(again, at, "unchanged settings were rewritten");
    let (changed, later) = read("Disabled").await;
    assert_eq!(changed.attributes["ProcTurboMode"], "Disabled");
    assert!(later > at);
}
