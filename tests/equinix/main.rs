//! The EquinixClient actor against the simulator, over HTTP on loopback.

mod openapi;
mod sdk;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use shepherd::equinix::model::{Device, DeviceCreateRequest};
use shepherd::equinix::{
    ApiMetrics, ClientSettings, EquinixApi, EquinixError, Operation, WITNESS_TAG_PREFIX,
};
use shepherd::secret::Secret;
use shepherd_sim::equinix::{Faults, SimConfig, Simulator, Stats};

const ANY_PORT: &str = "127.0.0.1:0";

pub async fn simulator(reservations: usize) -> Simulator {
    let cfg = SimConfig {
        reservations,
        ..SimConfig::default()
    };
    Simulator::start(cfg, ANY_PORT.parse::<SocketAddr>().unwrap())
        .await
        .unwrap()
}

/// Fast settings against `sim`: no interval, quick retries.
pub fn settings(sim: &Simulator) -> ClientSettings {
    ClientSettings {
        api_url: sim.api_url(),
        project_id: sim.project_id().to_string(),
        api_key: Secret::inline(sim.token()),
        api_interval: Duration::ZERO,
        parallelism: 1,
        request_timeout: Duration::from_secs(5),
        call_deadline: Duration::from_secs(60),
        retry_initial: Duration::from_millis(5),
        retry_max: Duration::from_millis(50),
        per_page: 10,
    }
}

pub fn client(settings: ClientSettings) -> EquinixApi {
    EquinixApi::start(settings, ApiMetrics::default()).unwrap()
}

/// A device created from every reservation of `sim` at once; each
/// reservation with its outcome.
async fn create_one_per_reservation(
    sim: &Simulator,
    api: &EquinixApi,
) -> Vec<(String, Result<Device, EquinixError>)> {
    let calls: Vec<_> = sim
        .reservation_ids()
        .into_iter()
        .enumerate()
        .map(|(n, r)| {
            let api = api.clone();
            actix_rt::spawn(async move {
                let d = api.create_device(create_request(&r, n)).await;
                (r, d)
            })
        })
        .collect();
    let mut out = Vec::new();
    for c in calls {
        out.push(c.await.unwrap());
    }
    out
}

pub fn create_request(reservation: &str, n: usize) -> DeviceCreateRequest {
    DeviceCreateRequest {
        hostname: format!("shepherd-{n}"),
        plan: "c3.small.x86".into(),
        operating_system: "ubuntu_22_04".into(),
        metro: Some("sv".into()),
        facility: None,
        hardware_reservation_id: reservation.to_string(),
        project_ssh_keys: vec![],
        tags: vec!["shepherd".into()],
    }
}

fn count(stats: &Stats, op: Operation) -> u64 {
    stats.requests.get(op.as_str()).copied().unwrap_or(0)
}

/// Polls the simulator's stats until `f` holds.
async fn until(sim: &Simulator, what: &str, f: impl Fn(&Stats) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f(&sim.stats()) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[actix_rt::test]
async fn two_hundred_callers_one_request_in_flight_spaced_by_the_interval() {
    let sim = simulator(5).await;
    let interval = Duration::from_millis(15);
    let api = client(ClientSettings {
        api_interval: interval,
        ..settings(&sim)
    });
    let ids = sim.reservation_ids();
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let api = api.clone();
            let id = ids[i % ids.len()].clone();
            actix_rt::spawn(async move { (id.clone(), api.get_reservation(&id).await) })
        })
        .collect();
    for c in calls {
        let (id, r) = c.await.unwrap();
        assert_eq!(r.unwrap().id, id);
    }
    let stats = sim.stats();
    assert_eq!(count(&stats, Operation::GetReservation), 200);
    assert_eq!(stats.peak_in_flight, 1, "more than one request in flight");
    let mut starts: Vec<u64> = stats.log.iter().map(|e| e.start_us).collect();
    starts.sort();
    let min_gap = starts.windows(2).map(|w| w[1] - w[0]).min().unwrap();
    assert!(
        min_gap >= interval.as_micros() as u64,
        "two requests {min_gap} µs apart, interval {interval:?}"
    );
}

#[actix_rt::test]
async fn parallelism_spreads_calls_but_keeps_the_total_rate() {
    let sim = simulator(5).await;
    let interval = Duration::from_millis(10);
    let api = client(ClientSettings {
        api_interval: interval,
        parallelism: 2,
        ..settings(&sim)
    });
    let id = sim.reservation_ids()[0].clone();
    let calls: Vec<_> = (0..60)
        .map(|_| {
            let (api, id) = (api.clone(), id.clone());
            actix_rt::spawn(async move { api.get_reservation(&id).await.unwrap() })
        })
        .collect();
    let t = Instant::now();
    for c in calls {
        c.await.unwrap();
    }
    let stats = sim.stats();
    assert!(stats.peak_in_flight <= 2);
    // 60 calls at one per 10 ms on the whole take at least ~590 ms.
    assert!(
        t.elapsed() >= Duration::from_millis(580),
        "{:?}",
        t.elapsed()
    );
}

#[actix_rt::test]
async fn server_errors_are_retried_until_success() {
    let sim = simulator(3).await;
    let api = client(settings(&sim));
    let id = sim.reservation_ids()[0].clone();
    sim.set_faults(Faults {
        error_rate: 1.0,
        ..Faults::default()
    });
    let call = {
        let api = api.clone();
        actix_rt::spawn(async move { api.get_reservation(&id).await })
    };
    until(&sim, "three 503s", |s| {
        s.statuses.get(&503).copied().unwrap_or(0) >= 3
    })
    .await;
    sim.set_faults(Faults::default());
    let r = call.await.unwrap();
    assert!(r.is_ok(), "{r:?}");
    let stats = sim.stats();
    assert_eq!(stats.statuses.get(&200), Some(&1));
    assert_eq!(
        api.metrics().count(Operation::GetReservation, "503"),
        stats.statuses[&503]
    );
}

#[actix_rt::test]
async fn permanent_errors_are_not_retried() {
    let sim = simulator(3).await;
    let api = client(settings(&sim));
    let e = api
        .get_device("00000000-0000-0000-0000-000000000000")
        .await
        .unwrap_err();
    assert!(matches!(e, EquinixError::NotFound { .. }), "{e}");
    assert_eq!(count(&sim.stats(), Operation::GetDevice), 1);

    let mut bad = create_request(&sim.reservation_ids()[0], 0);
    bad.plan = String::new();
    let e = api.create_device(bad).await.unwrap_err();
    assert!(
        matches!(&e, EquinixError::Unprocessable { message, .. } if message.contains("plan")),
        "{e}"
    );
    assert_eq!(count(&sim.stats(), Operation::CreateDevice), 1);
}

#[actix_rt::test]
async fn too_many_requests_waits_for_retry_after() {
    let sim = simulator(3).await;
    let api = client(settings(&sim));
    sim.set_faults(Faults {
        rate_limit_rate: 1.0,
        retry_after_secs: 1,
        ..Faults::default()
    });
    let call = {
        let api = api.clone();
        actix_rt::spawn(async move { api.list_devices().await })
    };
    until(&sim, "a 429", |s| s.statuses.contains_key(&429)).await;
    sim.set_faults(Faults::default());
    call.await.unwrap().unwrap();
    let log = sim.stats().log;
    let first_429 = log.iter().find(|e| e.status == 429).unwrap();
    let next = log
        .iter()
        .find(|e| e.start_us > first_429.start_us)
        .unwrap();
    let waited = Duration::from_micros(next.start_us - first_429.end_us);
    assert!(
        waited >= Duration::from_secs(1),
        "retried {waited:?} after a 429 with Retry-After: 1"
    );
}

#[actix_rt::test]
async fn pagination_returns_every_item_exactly_once() {
    let sim = simulator(25).await;
    let api = client(settings(&sim)); // 10 per page: 3 pages
    let got = api.list_reservations().await.unwrap();
    let ids: Vec<String> = got.iter().map(|r| r.id.clone()).collect();
    let distinct: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(ids.len(), 25);
    assert_eq!(distinct.len(), 25);
    assert_eq!(ids, sim.reservation_ids());
    assert_eq!(count(&sim.stats(), Operation::ListReservations), 3);

    for (n, r) in ids.iter().take(21).enumerate() {
        api.create_device(create_request(r, n)).await.unwrap();
    }
    let devices = api.list_devices().await.unwrap();
    assert_eq!(devices.len(), 21);
    assert_eq!(
        devices.iter().map(|d| &d.id).collect::<BTreeSet<_>>().len(),
        21
    );
    assert_eq!(count(&sim.stats(), Operation::ListDevices), 3);
}

#[actix_rt::test]
async fn creates_are_idempotent_through_lost_responses_and_errors() {
    let sim = simulator(200).await;
    let api = client(settings(&sim));
    sim.set_faults(Faults {
        lost_rate: 0.3,
        error_rate: 0.1,
        ..Faults::default()
    });
    let mut by_reservation = HashMap::new();
    for (r, d) in create_one_per_reservation(&sim, &api).await {
        let d = d.unwrap_or_else(|e| panic!("reservation {r}: {e}"));
        assert_eq!(d.reservation_id(), Some(r.as_str()));
        by_reservation.insert(r, d.id);
    }
    sim.set_faults(Faults::default());
    let stats = sim.stats();
    assert!(
        stats.statuses.get(&500).copied().unwrap_or(0) > 0,
        "no response was lost: {:?}",
        stats.statuses
    );
    let devices = sim.devices();
    assert_eq!(devices.len(), 200, "exactly one device per reservation");
    for d in &devices {
        let r = d.reservation_id().unwrap();
        assert_eq!(
            by_reservation.get(r),
            Some(&d.id),
            "device {} is not the one returned",
            d.id
        );
        assert!(d.tags.iter().any(|t| t.starts_with(WITNESS_TAG_PREFIX)));
    }
}

#[actix_rt::test]
async fn without_faults_a_device_costs_one_request() {
    let sim = simulator(200).await;
    let api = client(settings(&sim));
    for (r, d) in create_one_per_reservation(&sim, &api).await {
        d.unwrap_or_else(|e| panic!("reservation {r}: {e}"));
    }
    let stats = sim.stats();
    assert_eq!(count(&stats, Operation::CreateDevice), 200);
    assert_eq!(count(&stats, Operation::GetReservation), 0, "no look-ups");
    assert_eq!(stats.log.len(), 200, "nothing but the creates");
    assert_eq!(sim.devices().len(), 200);
}

#[actix_rt::test]
async fn a_reservation_taken_by_someone_else_is_a_lost_race() {
    let sim = simulator(2).await;
    let api = client(settings(&sim));
    let r = sim.reservation_ids()[0].clone();
    let theirs = sim.steal_reservation(&r).unwrap();
    let e = api.create_device(create_request(&r, 0)).await.unwrap_err();
    assert!(
        matches!(&e, EquinixError::RaceLost { reservation, device, .. } if *reservation == r && *device == theirs.id),
        "{e}"
    );
    // The create is tried once, refused (422), and only then is the
    // reservation looked up to tell a lost race from an earlier success.
    assert_eq!(count(&sim.stats(), Operation::CreateDevice), 1);
    assert_eq!(count(&sim.stats(), Operation::GetReservation), 1);
    assert_eq!(sim.devices().len(), 1);
}

#[actix_rt::test]
async fn a_wrong_token_fails_once_and_is_never_shown() {
    let sim = simulator(2).await;
    let token = "wrong-token-7f3a9c";
    let api = client(ClientSettings {
        api_key: Secret::inline(token),
        ..settings(&sim)
    });
    let e = api.list_devices().await.unwrap_err();
    assert!(matches!(e, EquinixError::Unauthorized { .. }), "{e}");
    assert_eq!(sim.stats().log.len(), 1, "no retry storm on 401");
    assert!(!e.to_string().contains(token) && !format!("{e:?}").contains(token));
    assert!(e.to_string().contains("API key"), "{e}");
    let s = ClientSettings {
        api_key: Secret::inline(token),
        ..settings(&sim)
    };
    assert!(!format!("{s:?}").contains(token));
}

#[actix_rt::test]
async fn ssh_key_ensure_creates_once_then_updates_only_on_change() {
    let sim = simulator(1).await;
    let api = client(settings(&sim));
    let (k1, k2) = (
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOne shepherd",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITwo shepherd",
    );
    let a = api.ensure_ssh_key("shepherd", k1).await.unwrap();
    let b = api.ensure_ssh_key("shepherd", k1).await.unwrap();
    assert_eq!(a.id, b.id);
    let s = sim.stats();
    assert_eq!(
        (
            count(&s, Operation::CreateSshKey),
            count(&s, Operation::UpdateSshKey)
        ),
        (1, 0)
    );
    let c = api.ensure_ssh_key("shepherd", k2).await.unwrap();
    assert_eq!(c.id, a.id);
    api.ensure_ssh_key("shepherd", k2).await.unwrap();
    let s = sim.stats();
    assert_eq!(
        (
            count(&s, Operation::CreateSshKey),
            count(&s, Operation::UpdateSshKey)
        ),
        (1, 1)
    );
    let keys = sim.ssh_keys();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].key, k2);
}

#[actix_rt::test]
async fn devices_provision_reboot_and_delete() {
    use shepherd::equinix::model::DeviceState;
    let sim = simulator(1).await;
    let api = client(settings(&sim));
    let r = sim.reservation_ids()[0].clone();
    let d = api.create_device(create_request(&r, 0)).await.unwrap();
    assert_eq!(d.state, DeviceState::Queued);
    assert_eq!(d.public_address(), Some("127.0.0.1".parse().unwrap()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.get_device(&d.id).await.unwrap().state != DeviceState::Active {
        assert!(Instant::now() < deadline, "never became active");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    api.reboot_device(&d.id).await.unwrap();
    assert_eq!(sim.stats().reboots.get(&d.id), Some(&1));
    assert_ne!(
        api.get_device(&d.id).await.unwrap().state,
        DeviceState::Active
    );
    api.delete_device(&d.id).await.unwrap();
    assert!(api.get_device(&d.id).await.unwrap_err().is_not_found());
    // Deleting again is not an error: the device is gone either way.
    api.delete_device(&d.id).await.unwrap();
    // The reservation is free again.
    assert!(!api.get_reservation(&r).await.unwrap().is_occupied());
}

/// The Equinix provider on `api`, creating in metro `sv`.
async fn equinix_provider(api: EquinixApi) -> shepherd::provider::equinix::Equinix {
    let cfg = shepherd::config::EquinixProviderConfig {
        metro: Some("sv".into()),
        ..Default::default()
    };
    shepherd::provider::equinix::Equinix::start(api, cfg, "ssh-ed25519 AAAA test")
        .await
        .unwrap()
}

/// A reservation that vanished from the project between being chosen and
/// being used is named as such, not as a missing plan.
#[actix_rt::test]
async fn a_vanished_reservation_is_named_as_gone() {
    use shepherd::bmdb::ProviderStatus;
    use shepherd::provider::{MachineKind, Provider, ProviderMachine};
    let sim = simulator(2).await;
    let api = client(settings(&sim));
    let provider = equinix_provider(api).await;
    let gone = ProviderMachine {
        provider_id: "0b7c2c8e-0000-4000-8000-000000000000".into(),
        address: None,
        location: None,
        reservation_id: Some("0b7c2c8e-0000-4000-8000-000000000000".into()),
        status: ProviderStatus::Missing,
        kind: MachineKind::Capacity,
        boots_from_bmc: false,
        boot_macs: Vec::new(),
        ports: Vec::new(),
    };
    let e = provider
        .create_machine(&gone)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("no longer listed") && !e.contains("plan"), "{e}");
    assert_eq!(count(&sim.stats(), Operation::CreateDevice), 0);
}

/// One device listing serves every round within its time to live (the
/// Provisioner's and the Updater's), callers at the same moment share one
/// request, and what shepherd creates is in it without another listing.
#[actix_rt::test]
async fn one_device_listing_serves_both_loops_and_knows_what_was_created() {
    use shepherd::provider::{MachineKind, Provider};
    let sim = simulator(3).await;
    let api = client(settings(&sim));
    let provider = equinix_provider(api)
        .await
        .with_listing_ttl(Duration::from_secs(30));
    // Two loops listing at once, then again: one request.
    let (a, b) = futures::join!(provider.list_machines(), provider.list_machines());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b);
    provider.list_machines().await.unwrap();
    assert_eq!(
        count(&sim.stats(), Operation::ListDevices),
        1,
        "{:?}",
        sim.stats().log
    );
    let capacity: Vec<_> = a
        .iter()
        .filter(|m| m.kind == MachineKind::Capacity)
        .cloned()
        .collect();
    assert_eq!(capacity.len(), 3);
    // A device created: in the shared listing, its reservation no longer
    // capacity, and no listing made for it.
    let created = provider.create_machine(&capacity[0]).await.unwrap();
    let now = provider.list_machines().await.unwrap();
    assert!(
        now.iter()
            .any(|m| m.kind == MachineKind::Ours && m.provider_id == created.provider_id),
        "{now:?}"
    );
    assert!(
        !now.iter()
            .any(|m| m.kind == MachineKind::Capacity && m.provider_id == capacity[0].provider_id),
        "{now:?}"
    );
    let stats = sim.stats();
    assert_eq!(count(&stats, Operation::ListDevices), 1);
    assert_eq!(count(&stats, Operation::ListReservations), 1);
    assert_eq!(count(&stats, Operation::CreateDevice), 1);
    // Without a time to live, every call lists.
    let fresh = equinix_provider(client(settings(&sim))).await;
    fresh.list_machines().await.unwrap();
    fresh.list_machines().await.unwrap();
    assert_eq!(count(&sim.stats(), Operation::ListDevices), 3);
}

/// A create looks its reservation's plan up in the last listing, however
/// old: a listing's time to live running out does not cost a listing per
/// device (at 100,000 reservations, a hundred pages each).
#[actix_rt::test]
async fn creates_find_the_plan_in_the_last_listing_however_old() {
    use shepherd::provider::{MachineKind, Provider};
    let sim = simulator(4).await;
    let cfg = shepherd::config::EquinixProviderConfig {
        metro: Some("sv".into()),
        reservation_cache_ttl: Duration::from_millis(1),
        ..Default::default()
    };
    let provider = shepherd::provider::equinix::Equinix::start(
        client(settings(&sim)),
        cfg,
        "ssh-ed25519 AAAA test",
    )
    .await
    .unwrap();
    let capacity: Vec<_> = provider
        .list_machines()
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.kind == MachineKind::Capacity)
        .collect();
    assert_eq!(capacity.len(), 4);
    for m in &capacity {
        tokio::time::sleep(Duration::from_millis(5)).await;
        provider.create_machine(m).await.unwrap();
    }
    let stats = sim.stats();
    assert_eq!(count(&stats, Operation::CreateDevice), 4);
    assert_eq!(
        count(&stats, Operation::ListReservations),
        1,
        "{:?}",
        stats.log
    );
    // The next round lists again: the listing is stale for capacity.
    provider.list_machines().await.unwrap();
    assert_eq!(count(&sim.stats(), Operation::ListReservations), 2);
}
