//! A rack of blank owned machines brought to tenant-ready through the real
//! services, end to end: shepherd (`shepherd run`) in one network
//! namespace, the rack (`fleet-sim --boot network`) in another, joined by
//! a veth link. shepherd powers each machine on through its simulated BMC
//! with a one-time PXE boot (two through Redfish's `Pxe` override, the
//! third through IPMI's boot flags, ipmitool speaking RMCP+ to the
//! simulated BMC); the machine's PXE ROM and
//! iPXE (`shepherd_sim::pxe`) lease an address from shepherd's DHCP, fetch
//! iPXE over TFTP and the script, kernel and initramfs over HTTP; the live
//! agent enrolls with the credential the initramfs carries. Then every
//! machine is erased and gets a device through the Metal API, whose image
//! it installs.
//!
//! Needs root (network namespaces) and PostgreSQL's unix socket; skipped,
//! saying so, without root.

use std::os::unix::fs::FileExt as _;
use std::time::Duration;

use serde_json::json;
use shepherd_sim::testing::{OwnedRack, is_root};

const MACHINES: usize = 3;

/// The disk file of the machine whose BMC is `10.78.0.{i}`.
fn disk(rack: &OwnedRack, i: usize) -> std::path::PathBuf {
    rack.dir
        .path()
        .join(format!("fleet/machines/10.78.0.{i}/disk0"))
}

fn read_at(path: &std::path::Path, at: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut b, at)
        .unwrap();
    b
}

#[actix_rt::test]
async fn blank_machines_boot_the_network_through_their_bmcs_are_erased_and_installed() {
    if !is_root() {
        eprintln!("SKIPPED: the rack test needs root (network namespaces)");
        return;
    }
    // The third machine's BMC speaks IPMI, the others Redfish.
    let mut rack =
        OwnedRack::start_network(MACHINES, "2s", 16 << 20, &[], &["--ipmi-every", "3"]).await;
    let limit = Duration::from_secs(240);

    // Powered on through the BMC, booted the network, enrolled.
    rack.admin
        .wait(&mut rack.shepherd, "available", MACHINES, limit)
        .await;
    let m = |name: &'static str, labels: &'static str| rack.admin.metric(name, labels);
    let n = MACHINES as f64;
    assert_eq!(
        m("shepherd_bmc_boots_total", "outcome=\"enrolled\"").await,
        n,
        "every machine enrolled through its BMC's boot"
    );
    // Each machine leased twice (the PXE ROM, then iPXE): an offer and an
    // ack each time, the ROM's naming iPXE's binary, iPXE's the script.
    for (labels, what) in [
        (
            "message=\"offer\",path=\"bios-pxe\"",
            "offers to the PXE ROMs",
        ),
        ("message=\"ack\",path=\"bios-pxe\"", "acks to the PXE ROMs"),
        ("message=\"offer\",path=\"ipxe-script\"", "offers to iPXE"),
        ("message=\"ack\",path=\"ipxe-script\"", "acks to iPXE"),
    ] {
        let v = rack
            .admin
            .metric("shepherd_netboot_dhcp_answers_total", labels)
            .await;
        assert!(v >= n, "{what}: {v}");
    }
    assert!(
        m(
            "shepherd_netboot_tftp_transfers_total",
            "result=\"complete\""
        )
        .await
            >= n,
        "every PXE ROM fetched iPXE over TFTP"
    );
    for what in ["script", "kernel", "initrd"] {
        let v = rack
            .admin
            .metric(
                "shepherd_netboot_http_requests_total",
                &format!("what=\"{what}\",result=\"served\""),
            )
            .await;
        assert!(v >= n, "{what} served {v} times");
    }
    let fleet = rack.fleet.report().await;
    assert_eq!(fleet["network_boots"]["booted"], MACHINES, "{fleet:#}");
    assert_eq!(fleet["network_boots"]["failed"], 0, "{fleet:#}");
    for i in 1..=MACHINES {
        assert_eq!(
            fleet["runs"][format!("10.78.0.{i}")]["agents"],
            1,
            "one live agent per machine: {fleet:#}"
        );
    }
    // Every machine reported its hardware through the agent.
    for d in rack.admin.machine_details().await {
        assert!(
            d.to_string().contains("Simulated Xeon E-2278G"),
            "{}'s hardware report: {d:#}",
            d["machine_id"]
        );
    }

    // The third machine, enrolled through its IPMI BMC above, is read
    // through it too: its FRU names it, its power is on.
    let started = std::time::Instant::now();
    loop {
        let mut facts = None;
        let mut seen = Vec::new();
        for d in rack.admin.machine_details().await {
            if d["tags"]["bmc"]["protocol"] == "ipmi" {
                facts = Some(d["tags"]["bmc"].clone());
            }
            seen.push(d["tags"]["bmc"].clone());
        }
        let facts = facts.unwrap_or_default();
        if facts["serial_number"] == "SIM-10.78.0.3" {
            assert_eq!(
                facts["manufacturer"], "Shepherd Simulated Metal",
                "{facts:#}"
            );
            assert_eq!(facts["power_state"], "On", "{facts:#}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the IPMI BMC's FRU was not read: {facts:#}; the BMCs: {seen:#?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // A previous owner's data on every disk, then every machine erased.
    for i in 1..=MACHINES {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(disk(&rack, i))
            .unwrap();
        f.write_all_at(&[0xa5; 4096], 1 << 20).unwrap();
        f.write_all_at(&[0x5a; 4096], 100 << 30).unwrap();
    }
    assert_eq!(rack.deprovision_all().await.busy, 0);
    rack.admin
        .wait(&mut rack.shepherd, "available", MACHINES, limit)
        .await;
    for i in 1..=MACHINES {
        let d = disk(&rack, i);
        assert!(
            read_at(&d, 1 << 20, 4096).iter().all(|b| *b == 0)
                && read_at(&d, 100 << 30, 4096).iter().all(|b| *b == 0),
            "{} holds its old data after the erasure",
            d.display()
        );
    }

    // A device on every machine, each installing the served image.
    let (project, token) = rack.project("rack");
    let path = format!("/metal/v1/projects/{project}/devices");
    for i in 0..MACHINES {
        let body = json!({"metro": "sv", "plan": OwnedRack::PLAN,
            "operating_system": OwnedRack::OPERATING_SYSTEM, "hostname": format!("rack-{i}")});
        let (s, d) = rack
            .admin
            .call("POST", &path, Some(&token), Some(body))
            .await;
        assert_eq!(s, 201, "{d}");
    }
    rack.admin
        .wait_active(&mut rack.shepherd, &path, &token, MACHINES, limit)
        .await;
    let image = std::fs::read(rack.dir.path().join("images/os.img")).unwrap();
    let part = &image[1 << 20..9 << 20];
    assert!(
        part.iter().any(|b| *b != 0),
        "the image's partition holds data"
    );
    for i in 1..=MACHINES {
        let d = disk(&rack, i);
        assert!(
            read_at(&d, 1 << 20, part.len()) == part,
            "{} does not hold the image",
            d.display()
        );
    }
}
