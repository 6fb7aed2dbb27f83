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

/// Writes a BMC's facts for `m`: its manufacturer and model.
async fn bmc_says(bmdb: &shepherd::bmdb::Bmdb, m: uuid::Uuid, manufacturer: &str, model: &str) {
    use shepherd::bmdb::hardware::{BmcFacts, SystemFacts};
    let facts = BmcFacts {
        bmc_url: format!("https://bmc-{m}.example:443"),
        system: SystemFacts {
            manufacturer: Some(manufacturer.into()),
            model: Some(model.into()),
            ..SystemFacts::default()
        },
        ..BmcFacts::default()
    };
    bmdb.transact(async |tx| {
        shepherd::bmdb::machines::write_bmc_facts(tx, &[(m, facts.clone())]).await
    })
    .await
    .unwrap();
}

#[actix_rt::test]
async fn a_machine_is_compared_with_the_first_baseline_that_selects_it() {
    use shepherd::baselines::{Baselines, Conformance, Difference, Part};
    use shepherd::config::{BaselineConfig, ComponentConfig, VolumeConfig};
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let ids = crate::provided_machines(&bmdb, Provider::None, 4).await;
    let (conforming, drifting, unread, other) = (ids[0], ids[1], ids[2], ids[3]);
    for m in [conforming, drifting, unread] {
        bmc_says(&bmdb, m, "Dell Inc.", "PowerEdge R650").await;
    }
    bmc_says(&bmdb, other, "Supermicro", "SYS-1029").await;
    let baselines = Baselines::new(
        &[
            BaselineConfig {
                name: "r650".into(),
                manufacturer: Some("Dell Inc.".into()),
                model: Some("PowerEdge R650".into()),
                components: vec![ComponentConfig {
                    component: "bios".into(),
                    version: "1.1.0".into(),
                    image: "r650-bios-1.1.0.exe".into(),
                }],
                bios: [("ProcTurboMode".to_string(), serde_json::json!("Enabled"))]
                    .into_iter()
                    .collect(),
                raid: Some(vec![VolumeConfig {
                    raid_type: "RAID1".into(),
                    drives: 2,
                }]),
                ..BaselineConfig::default()
            },
            // Every other Dell: never reached by an R650 (the first wins).
            BaselineConfig {
                name: "dell".into(),
                manufacturer: Some("Dell Inc.".into()),
                raid: Some(Vec::new()),
                ..BaselineConfig::default()
            },
        ],
        &[],
    );
    let read = |m, bios_version: &'static str, turbo: &'static str, raid: bool| {
        let bmdb = bmdb.clone();
        async move {
            let mut s = storage();
            if !raid {
                s[0].volumes.clear();
                s[0].volumes_offered = false;
            }
            let read = Ok(Reading {
                components: vec![component("bios", bios_version), component("bmc", "5.10")],
                bios: Some(Bios {
                    registry: None,
                    attributes: serde_json::json!({"ProcTurboMode": turbo})
                        .as_object()
                        .unwrap()
                        .clone(),
                }),
                storage: Some(s),
                partial: Vec::new(),
            });
            bmdb.transact(async |tx| firmware::record(tx, m, &read).await)
                .await
                .unwrap();
        }
    };
    read(conforming, "1.1.0", "Enabled", true).await;
    read(drifting, "1.0.0", "Disabled", false).await;
    read(other, "3.0", "Disabled", false).await;

    let below = bmdb
        .snapshot(async |tx| firmware::below(tx, None, true).await)
        .await
        .unwrap();
    assert_eq!(below.len(), 4, "every machine whose BMC is read: {below:?}");
    let survey = baselines.survey(&below);
    let of = |m| {
        survey
            .machines
            .iter()
            .find(|(id, _)| *id == m)
            .unwrap()
            .1
            .clone()
    };
    assert_eq!(
        of(conforming),
        Conformance::Conforming {
            baseline: "r650".into()
        }
    );
    assert_eq!(
        of(unread),
        Conformance::Unread {
            baseline: "r650".into()
        }
    );
    assert_eq!(of(other), Conformance::Unbound, "a Supermicro: no baseline");
    let Conformance::Drifting {
        baseline,
        differences,
    } = of(drifting)
    else {
        panic!("{:?}", of(drifting));
    };
    assert_eq!(baseline, "r650");
    assert_eq!(
        differences,
        [
            Difference {
                part: Part::Component,
                item: "bios".into(),
                desired: "1.1.0".into(),
                actual: Some("1.0.0".into()),
            },
            Difference {
                part: Part::Bios,
                item: "ProcTurboMode".into(),
                desired: "Enabled".into(),
                actual: Some("Disabled".into()),
            },
            // Its BMC offers no volumes: said, not passed over.
            Difference {
                part: Part::Raid,
                item: "volumes".into(),
                desired: "RAID1 of 2 drives".into(),
                actual: Some("not offered by its BMC".into()),
            },
        ]
    );
    let r650 = &survey.baselines[0];
    assert_eq!(
        (r650.machines, r650.conforming, r650.drifting, r650.unread),
        (3, 1, 1, 1)
    );
    assert_eq!(survey.baselines[1].machines, 0, "the first baseline wins");
    let bios = &survey.components["bios"];
    assert_eq!((bios.at_desired, bios.elsewhere), (1, 1), "{bios:?}");

    // The drifting machine updated: it conforms, but for its volumes.
    read(drifting, "1.1.0", "Enabled", true).await;
    let below = bmdb
        .snapshot(async |tx| firmware::below(tx, Some(&[drifting]), true).await)
        .await
        .unwrap();
    assert_eq!(
        baselines.conformance(&below[0]),
        Conformance::Conforming {
            baseline: "r650".into()
        }
    );

    // Secure Boot wanted on: a BMC that does not say is a difference, one
    // that says on conforms.
    let secure = Baselines::new(
        &[BaselineConfig {
            name: "secure".into(),
            secure_boot: Some(true),
            ..BaselineConfig::default()
        }],
        &[],
    );
    let secure = &secure;
    let standing = |bmdb: shepherd::bmdb::Bmdb| async move {
        let below = bmdb
            .snapshot(async |tx| firmware::below(tx, Some(&[conforming]), true).await)
            .await
            .unwrap();
        secure.conformance(&below[0])
    };
    assert_eq!(
        standing(bmdb.clone()).await.differences(),
        [Difference {
            part: Part::SecureBoot,
            item: "SecureBootEnable".into(),
            desired: "on".into(),
            actual: None,
        }]
    );
    use shepherd::bmdb::hardware::{BmcFacts, SecureBootFacts, SystemFacts};
    let facts = BmcFacts {
        bmc_url: format!("https://bmc-{conforming}.example:443"),
        system: SystemFacts {
            manufacturer: Some("Dell Inc.".into()),
            model: Some("PowerEdge R650".into()),
            secure_boot: Some(SecureBootFacts {
                enable: Some(true),
                ..SecureBootFacts::default()
            }),
            ..SystemFacts::default()
        },
        ..BmcFacts::default()
    };
    bmdb.transact(async |tx| {
        shepherd::bmdb::machines::write_bmc_facts(tx, &[(conforming, facts.clone())]).await
    })
    .await
    .unwrap();
    assert_eq!(standing(bmdb.clone()).await.as_str(), "conforming");
}
