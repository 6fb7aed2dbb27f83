//! Changing what is below a system through its BMC (`redfish::servicing`),
//! against the simulated BMCs (`shepherd_sim::bmc`), which do it as real
//! ones do: an update pushed (or fetched by the BMC from shepherd's image
//! server with a grant's credentials) and followed through its task to
//! its end, running only after the reset; a BMC busy with one update answering 503 with its
//! `Retry-After`; an update failing with the BMC's words; BIOS settings
//! and volumes asked for the next reset, a refused attribute named.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use shepherd::bmc::BmcErrorKind;
use shepherd::config::{BmcConfig, RedfishConfig};
use shepherd::provider::Provider as _;
use shepherd::redfish::servicing::{
    CreateVolume, DeleteVolume, GetTask, SetBios, StartUpdate, Started, TaskStatus, UpdateImage,
};
use shepherd::redfish::{self, Bmcs, Reset};
use shepherd::secret::Secret;
use shepherd_sim::bmc::{BmcSim, FirmwareOptions, firmware_image};
use shepherd_sim::testing::{inventory_host, inventory_of, sim_bmc, sim_bmcs};

const GOOD: &str = "127.0.62.1";
const FAILING: &str = "127.0.62.2";

struct Rig {
    sim: BmcSim,
    bmcs: Bmcs,
    dir: tempfile::TempDir,
}

impl Rig {
    fn start(push: bool) -> Rig {
        let failing: IpAddr = FAILING.parse().unwrap();
        let sim = sim_bmcs(
            &[GOOD, FAILING],
            FirmwareOptions {
                task_time: Duration::from_millis(1200),
                fails: Arc::new(move |ip| ip == failing),
                push,
            },
        );
        Rig {
            sim,
            bmcs: Bmcs::new(&RedfishConfig::default()),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn bmc(&self, machine: &str) -> BmcConfig {
        sim_bmc(&self.sim, machine)
    }

    async fn ask<M, T>(&self, machine: &str, msg: M) -> Result<T, shepherd::bmc::BmcError>
    where
        M: actix::Message<Result = Result<T, shepherd::bmc::BmcError>> + Send + 'static,
        T: Send + 'static,
        shepherd::redfish::BmcClient: actix::Handler<M>,
    {
        redfish::ask(&self.bmcs, machine, &self.bmc(machine), msg).await
    }

    /// An image file for `component` at `version`.
    fn image(&self, component: &str, version: &str) -> UpdateImage {
        let name = format!("{component}-{version}.bin");
        let path = self.dir.path().join(&name);
        std::fs::write(&path, firmware_image(component, version)).unwrap();
        UpdateImage {
            path,
            name,
            fetch: None,
        }
    }

    /// Follows a task to its end, as the Servicer does.
    async fn follow(&self, machine: &str, started: Started) -> (Vec<u8>, TaskStatus) {
        let Started::Task { monitor, .. } = started else {
            panic!("no task: {started:?}");
        };
        let mut percents = Vec::new();
        for _ in 0..100 {
            let t = self
                .ask(
                    machine,
                    GetTask {
                        monitor: monitor.clone(),
                    },
                )
                .await
                .unwrap();
            percents.extend(t.percent);
            if !t.running() {
                return (percents, t);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the task {monitor} never ended");
    }

    async fn reset(&self, machine: &str) {
        self.ask(
            machine,
            Reset {
                system: None,
                target: None,
                reset_type: "ForceRestart".into(),
            },
        )
        .await
        .unwrap();
    }

    /// What shepherd reads of the machine's firmware.
    async fn read(&self, machine: &str) -> shepherd::bmdb::firmware::Reading {
        let inv = inventory_of(vec![inventory_host(machine, Some(self.bmc(machine)))]);
        let mut r = inv.bmc_firmware(&[machine.to_string()]).await.unwrap();
        r.remove(0).firmware.unwrap()
    }

    async fn version(&self, machine: &str, component: &str) -> String {
        self.read(machine)
            .await
            .components
            .into_iter()
            .find(|c| c.component == component)
            .unwrap_or_else(|| panic!("no {component}"))
            .version
    }
}

#[actix_rt::test]
async fn an_update_is_pushed_followed_to_its_end_and_runs_after_the_reset() {
    let rig = Rig::start(true);
    let before = rig.version(GOOD, "bios").await;
    let started = rig
        .ask(
            GOOD,
            StartUpdate {
                image: rig.image("BIOS", "2.1.0"),
                system: None,
                component: "inventory:BIOS".into(),
            },
        )
        .await
        .unwrap();
    assert!(
        matches!(started, Started::Task { pushed: true, .. }),
        "{started:?}"
    );
    // One update at a time: the BMC is busy, and says for how long.
    let busy = rig
        .ask(
            GOOD,
            StartUpdate {
                image: rig.image("BMC", "6.0.0"),
                system: None,
                component: "bmc".into(),
            },
        )
        .await
        .unwrap_err();
    match &busy.kind {
        BmcErrorKind::Busy { retry_after, .. } => assert_eq!(*retry_after, Duration::from_secs(1)),
        other => panic!("{other:?}"),
    }
    let (percents, end) = rig.follow(GOOD, started).await;
    assert!(end.succeeded(), "{end:?}");
    assert!(
        percents.iter().any(|p| *p > 0 && *p < 100),
        "the percent as it ran: {percents:?}"
    );
    assert!(end.said().contains("reset"), "{end:?}");
    assert_eq!(
        rig.version(GOOD, "bios").await,
        before,
        "not before the reset"
    );
    rig.reset(GOOD).await;
    assert_eq!(rig.version(GOOD, "bios").await, "2.1.0");
    assert_eq!(rig.version(GOOD, "inventory:BIOS").await, "2.1.0");

    // An image for another part than the update's target: the BMC's
    // task says so; a component the BMC does not list has no target.
    let started = rig
        .ask(
            GOOD,
            StartUpdate {
                image: rig.image("BIOS", "2.2.0"),
                system: None,
                component: "bmc".into(),
            },
        )
        .await
        .unwrap();
    let (_, end) = rig.follow(GOOD, started).await;
    assert_eq!(end.state, "Exception", "{end:?}");
    assert!(
        end.said()
            .contains("the image is for BIOS, which none of the update's Targets (BMC) is"),
        "{end:?}"
    );
    let e = rig
        .ask(
            GOOD,
            StartUpdate {
                image: rig.image("BIOS", "2.2.0"),
                system: None,
                component: "inventory:CPLD".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains(
            "firmware inventory:CPLD: the BMC's FirmwareInventory lists no member \"CPLD\""
        ),
        "{e}"
    );

    // A machine whose update fails: the BMC's words, its version kept.
    let failing_before = rig.version(FAILING, "bios").await;
    let started = rig
        .ask(
            FAILING,
            StartUpdate {
                image: rig.image("BIOS", "2.1.0"),
                system: None,
                component: "bios".into(),
            },
        )
        .await
        .unwrap();
    let (_, end) = rig.follow(FAILING, started).await;
    assert_eq!(end.state, "Exception", "{end:?}");
    assert!(end.said().contains("did not verify"), "{end:?}");
    rig.reset(FAILING).await;
    assert_eq!(rig.version(FAILING, "bios").await, failing_before);
}

#[actix_rt::test]
async fn bios_settings_and_volumes_are_asked_for_the_next_reset() {
    let rig = Rig::start(true);
    let attributes = |k: &str, v: &str| serde_json::json!({ k: v }).as_object().unwrap().clone();
    let apply = rig
        .ask(
            GOOD,
            SetBios {
                system: None,
                attributes: attributes("SriovGlobalEnable", "Enabled"),
            },
        )
        .await
        .unwrap();
    assert_eq!(apply.as_deref(), Some("OnReset"));
    // A refused attribute: the BMC's words name it.
    let e = rig
        .ask(
            GOOD,
            SetBios {
                system: None,
                attributes: attributes("TurboBoostMax", "On"),
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e.kind, BmcErrorKind::Http { status: 400, .. })
            && e.to_string().contains("TurboBoostMax"),
        "{e}"
    );
    let apply = rig
        .ask(
            GOOD,
            CreateVolume {
                system: None,
                storage: "RAID.1".into(),
                raid_type: "RAID1".into(),
                drives: vec!["0".into(), "1".into()],
            },
        )
        .await
        .unwrap();
    assert_eq!(apply.as_deref(), Some("OnReset"));
    let r = rig.read(GOOD).await;
    assert_eq!(r.bios.unwrap().attributes["SriovGlobalEnable"], "Disabled");
    assert!(
        r.storage.unwrap()[0].volumes.is_empty(),
        "not before the reset"
    );

    rig.reset(GOOD).await;
    let r = rig.read(GOOD).await;
    assert_eq!(r.bios.unwrap().attributes["SriovGlobalEnable"], "Enabled");
    let volumes = &r.storage.unwrap()[0].volumes;
    assert_eq!(volumes.len(), 1);
    assert_eq!(volumes[0].raid_type.as_deref(), Some("RAID1"));
    assert_eq!(volumes[0].drives, ["0", "1"]);

    rig.ask(
        GOOD,
        DeleteVolume {
            system: None,
            storage: "RAID.1".into(),
            volume: volumes[0].id.clone(),
        },
    )
    .await
    .unwrap();
    assert_eq!(rig.read(GOOD).await.storage.unwrap()[0].volumes.len(), 1);
    rig.reset(GOOD).await;
    assert!(rig.read(GOOD).await.storage.unwrap()[0].volumes.is_empty());
}

#[actix_rt::test]
async fn a_bmc_fetches_its_image_from_shepherds_image_server_with_a_grant_made_for_the_update() {
    use shepherd::callback::tls::new_ca;
    use shepherd::images::ImageCatalog;
    use shepherd_sim::testing::TestDb;
    let rig = Rig::start(false);
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let machine = shepherd_sim::testing::machine(&bmdb, None).await;
    let image = rig.image("BIOS", "3.0.0");
    let (ca_der, ca_key) = new_ca().unwrap();
    let catalog = ImageCatalog::new(rig.dir.path().to_path_buf(), "127.0.0.1:1", ca_der.clone());
    let server = shepherd_sim::testing::image_server(&catalog, &bmdb, &ca_der, &ca_key);
    let grant = bmdb
        .transact(async |tx| {
            shepherd::bmdb::firmware_grants::issue(
                tx,
                machine,
                &image.name,
                Duration::from_secs(600),
            )
            .await
        })
        .await
        .unwrap();
    let url = catalog
        .firmware_url(grant.grant_id, &image.name)
        .replace("127.0.0.1:1", &server.addr.to_string());
    // Without a place to fetch from, a BMC that takes no push is named.
    let e = rig
        .ask(
            GOOD,
            StartUpdate {
                image: image.clone(),
                system: None,
                component: "bios".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no address to fetch it from"), "{e}");
    let update = |secret: &str| {
        let mut image = image.clone();
        image.fetch = Some((
            url.clone(),
            grant.grant_id.to_string(),
            Secret::inline(secret),
        ));
        StartUpdate {
            image,
            system: None,
            component: "bios".into(),
        }
    };
    // A wrong secret: the image server refuses, and the BMC's task says so.
    let started = rig
        .ask(GOOD, update("not-the-grants-secret"))
        .await
        .unwrap();
    let (_, end) = rig.follow(GOOD, started).await;
    assert_eq!(end.state, "Exception", "{end:?}");
    assert!(end.said().contains("HTTP 403"), "{end:?}");
    // The grant's: fetched over TLS, the update done at the reset.
    let started = rig.ask(GOOD, update(&grant.secret)).await.unwrap();
    let started_how = started.clone();
    let (_, end) = rig.follow(GOOD, started).await;
    assert!(end.succeeded(), "{end:?}");
    assert!(matches!(started_how, Started::Task { pushed: false, .. }));
    rig.reset(GOOD).await;
    assert_eq!(rig.version(GOOD, "bios").await, "3.0.0");
    let fetched = shepherd_sim::testing::count(
        &bmdb,
        "SELECT count(*) FROM firmware_grant WHERE fetched_at IS NOT NULL",
    )
    .await;
    assert_eq!(fetched, 1, "the fetch is recorded on its grant");
    // The grant is for that image only.
    std::fs::write(
        rig.dir.path().join("other.bin"),
        firmware_image("BMC", "9.9.9"),
    )
    .unwrap();
    let mut other = rig.image("BMC", "9.9.9");
    other.fetch = Some((
        url.replace(&image.name, "other.bin"),
        grant.grant_id.to_string(),
        Secret::inline(grant.secret.clone()),
    ));
    let started = rig
        .ask(
            GOOD,
            StartUpdate {
                image: other,
                system: None,
                component: "bmc".into(),
            },
        )
        .await
        .unwrap();
    let (_, end) = rig.follow(GOOD, started).await;
    assert!(end.said().contains("HTTP 403"), "{end:?}");
    server.stop().await;
}
