//! The fleet's filters beyond the state (location, project, BMC protocol,
//! boot path, plan), and the plan labels they read: labeled by the
//! plan-labels round, again when a report or the configured plans change.

use prost::Message;
use shepherd::bmdb::machines::{self, BmcFacts, BmcKind, FleetFilter, NewProvidedMachine};
use shepherd::bmdb::{Bmdb, Provider, tenants};
use shepherd::config::{BootMethod, PlanConfig};
use shepherd::control::Round;
use shepherd::plan_labels::PlanLabels;
use shepherd_sim::testing::TestDb;
use uuid::Uuid;

async fn machine(bmdb: &Bmdb, name: &str, location: &str) -> Uuid {
    let m = NewProvidedMachine {
        provider: Provider::None,
        provider_id: name.into(),
        reservation_id: None,
        ip_address: None,
        location: Some(location.into()),
        status: None,
    };
    bmdb.transact(async |tx| machines::create_provided(tx, &m).await)
        .await
        .unwrap()
}

/// The agent's report of a machine with this many CPU threads.
fn report(threads: i32) -> Vec<u8> {
    let mut r = shepherd_sim::machine::simulated_hardware("127.0.0.9".parse().unwrap());
    r.report.as_mut().unwrap().cpu[0].hardware_threads = threads;
    r.encode_to_vec()
}

async fn reported(bmdb: &Bmdb, id: Uuid, threads: i32) {
    let raw = report(threads);
    bmdb.transact(async |tx| {
        tx.execute(
            "INSERT INTO machine_hardware_report (machine_id, hardware_report_raw) VALUES ($1, $2) \
             ON CONFLICT (machine_id) DO UPDATE SET hardware_report_raw = EXCLUDED.hardware_report_raw",
            &[&id, &raw],
        )
        .await?;
        Ok(())
    })
    .await
    .unwrap();
}

fn plan(slug: &str, cpus_min: u32) -> PlanConfig {
    PlanConfig {
        slug: slug.into(),
        cpus_min,
        ..Default::default()
    }
}

async fn listed(bmdb: &Bmdb, filter: FleetFilter) -> Vec<Uuid> {
    let (page, matching) = bmdb
        .transact(async |tx| machines::fleet_page(tx, &filter, 100, 0).await)
        .await
        .unwrap();
    assert_eq!(
        matching.count as usize,
        page.len(),
        "{filter:?}: counted as listed"
    );
    let mut ids: Vec<Uuid> = page.iter().map(|m| m.machine_id).collect();
    ids.sort();
    ids
}

fn sorted(mut ids: Vec<Uuid>) -> Vec<Uuid> {
    ids.sort();
    ids
}

async fn label(bmdb: &Bmdb, plans: &[PlanConfig]) -> shepherd::plan_labels::Labeled {
    let session = bmdb.start_session("plan-labels-test", None).await.unwrap();
    let out = PlanLabels::new(plans.to_vec(), std::time::Duration::from_secs(1))
        .round(&session, &Default::default())
        .await
        .unwrap();
    session.close().await.unwrap();
    out
}

#[tokio::test]
async fn the_fleet_filters_by_location_project_bmc_boot_and_plan() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let a = machine(&bmdb, "a", "rack-a").await;
    let b = machine(&bmdb, "b", "rack-a").await;
    let c = machine(&bmdb, "c", "rack-b").await;
    let d = machine(&bmdb, "d", "rack-b").await;

    // BMCs: a IPMI, b and d Redfish, c none read.
    let facts = |url: &str| BmcFacts {
        bmc_url: url.into(),
        system_path: None,
        system: Default::default(),
        read_error: None,
        changed_at: None,
    };
    let rows = vec![
        (a, facts("ipmi://127.0.0.1:6230")),
        (b, facts("https://127.0.0.1:8000")),
        (d, facts("http://127.0.0.1:8001")),
    ];
    bmdb.transact(async |tx| machines::write_bmc_facts(tx, &rows).await)
        .await
        .unwrap();
    // Booted by their BMC: a over the network, b from virtual media.
    bmdb.transact(async |tx| {
        let ids = vec!["a".to_string(), "b".to_string()];
        shepherd::bmdb::bmc_boot::set_bmc_boot(tx, Provider::None, &ids).await?;
        shepherd::bmdb::netboot::add_boot_macs(
            tx,
            Provider::None,
            &[("a".into(), vec!["02:00:00:00:00:0a".parse().unwrap()])],
        )
        .await?;
        Ok(())
    })
    .await
    .unwrap();
    // c is assigned to a project.
    let project = bmdb
        .transact(async |tx| {
            let p = tenants::create_project(tx, "acme", "test", None, false)
                .await?
                .unwrap();
            tenants::assign(tx, p.id, c, "test").await?;
            Ok(p.id)
        })
        .await
        .unwrap();

    let f = FleetFilter::default;
    let cases = [
        (
            FleetFilter {
                location: Some("rack-a".into()),
                ..f()
            },
            vec![a, b],
        ),
        (
            FleetFilter {
                project: Some(project),
                ..f()
            },
            vec![c],
        ),
        (
            FleetFilter {
                project: Some(Uuid::new_v4()),
                ..f()
            },
            vec![],
        ),
        (
            FleetFilter {
                bmc: Some(BmcKind::Ipmi),
                ..f()
            },
            vec![a],
        ),
        (
            FleetFilter {
                bmc: Some(BmcKind::Redfish),
                ..f()
            },
            vec![b, d],
        ),
        (
            FleetFilter {
                bmc: Some(BmcKind::None),
                ..f()
            },
            vec![c],
        ),
        (
            FleetFilter {
                boot: Some(BootMethod::Network),
                ..f()
            },
            vec![a],
        ),
        (
            FleetFilter {
                boot: Some(BootMethod::VirtualMedia),
                ..f()
            },
            vec![b],
        ),
        (
            FleetFilter {
                boot: Some(BootMethod::Ssh),
                ..f()
            },
            vec![c, d],
        ),
        // Filters together: each narrows.
        (
            FleetFilter {
                location: Some("rack-b".into()),
                bmc: Some(BmcKind::Redfish),
                ..f()
            },
            vec![d],
        ),
    ];
    for (filter, want) in cases {
        assert_eq!(
            listed(&bmdb, filter.clone()).await,
            sorted(want),
            "{filter:?}"
        );
    }

    // Plans: labeled by the round from the reports.
    let plans = vec![plan("big", 32), plan("small", 1)];
    reported(&bmdb, a, 16).await;
    reported(&bmdb, b, 64).await;
    reported(&bmdb, d, 8).await;
    let by_plan = async |p: &str| {
        listed(
            &bmdb,
            FleetFilter {
                plan: Some(p.into()),
                ..f()
            },
        )
        .await
    };
    assert_eq!(
        by_plan("small").await,
        Vec::<Uuid>::new(),
        "nothing labeled before a round"
    );
    let out = label(&bmdb, &plans).await;
    assert_eq!(out.labeled, 3, "{out:?}");
    assert_eq!(by_plan("big").await, vec![b]);
    assert_eq!(by_plan("small").await, sorted(vec![a, d]));
    assert_eq!(
        label(&bmdb, &plans).await.labeled,
        0,
        "nothing stale, nothing read"
    );

    // A new report is labeled again; the others are not read.
    reported(&bmdb, d, 48).await;
    assert_eq!(by_plan("big").await, vec![b], "stale until the round");
    assert_eq!(label(&bmdb, &plans).await.labeled, 1);
    assert_eq!(by_plan("big").await, sorted(vec![b, d]));

    // Other plans configured: every machine is labeled anew.
    let plans = vec![plan("huge", 60), plan("any", 1)];
    let out = label(&bmdb, &plans).await;
    assert_eq!((out.marked, out.labeled), (3, 3), "{out:?}");
    assert_eq!(by_plan("big").await, Vec::<Uuid>::new());
    assert_eq!(by_plan("huge").await, vec![b]);
    assert_eq!(by_plan("any").await, sorted(vec![a, d]));
    // A machine without a report has no plan; the plan and a location
    // together narrow.
    assert_eq!(
        listed(
            &bmdb,
            FleetFilter {
                plan: Some("any".into()),
                location: Some("rack-a".into()),
                ..f()
            }
        )
        .await,
        vec![a]
    );
}

/// A report written while the round computes keeps its row stale: the
/// label is written over the generation read only.
#[tokio::test]
async fn a_report_changed_while_labeling_is_labeled_again() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let a = machine(&bmdb, "a", "rack-a").await;
    reported(&bmdb, a, 16).await;
    let read = bmdb
        .transact(async |tx| shepherd::bmdb::plan_labels::stale(tx, 10).await)
        .await
        .unwrap();
    assert_eq!(read.len(), 1);
    reported(&bmdb, a, 64).await;
    let written = bmdb
        .transact(async |tx| {
            shepherd::bmdb::plan_labels::label(tx, &[(a, read[0].generation, Some("small".into()))])
                .await
        })
        .await
        .unwrap();
    assert_eq!(written, 0, "the row changed since it was read");
    let plans = vec![plan("big", 32), plan("small", 1)];
    assert_eq!(label(&bmdb, &plans).await.labeled, 1);
    let big = listed(
        &bmdb,
        FleetFilter {
            plan: Some("big".into()),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(big, vec![a]);
}
