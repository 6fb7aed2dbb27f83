//! shepherd's own network boot services on the switch: shepherd (and the
//! simulated rack it takes over) runs in a NIC's namespace on the
//! provisioning VLAN, so its DHCP server, TFTP and boot HTTP answer there
//! as on a rack. Reached by the real clients (busybox `udhcpc` posing as
//! a PXE ROM, busybox `tftp`, curl) from NICs on each VLAN the life cycle
//! uses; a tenant runs a DHCP server (busybox `udhcpd`) on its own VLAN.

use std::path::Path;
use std::process::{Command, Stdio};

use shepherd_sim::testing::boot_image_stand_in;

use super::*;

/// shepherd's boot HTTP port, in its namespace.
const HTTP: u16 = 8067;
/// The addresses shepherd's DHCP hands out, and a tenant's server's.
const SHEPHERD_RANGE: (Ipv4Addr, Ipv4Addr) = (
    Ipv4Addr::new(10, 90, 200, 10),
    Ipv4Addr::new(10, 90, 200, 60),
);
const TENANT_RANGE: &str = "10.90.77.10 10.90.77.20";

/// What `udhcpc`, posing as a machine's PXE ROM, was leased on `nic`:
/// (address, server), or None after its tries.
fn lease(nic: &Nic, script: &Path) -> Option<(Ipv4Addr, Ipv4Addr)> {
    let out = nic.ns.udhcpc_as_pxe_rom("eth0", script, 3);
    let said = String::from_utf8_lossy(&out.stdout);
    said.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        match (w.next(), w.next(), w.next()) {
            (Some("bound"), Some(ip), Some(server)) => {
                Some((ip.parse().ok()?, server.parse().ok()?))
            }
            _ => None,
        }
    })
}

/// Whether busybox `tftp` on `nic` fetched `undionly.kpxe` from shepherd,
/// byte for byte.
fn tftp_fetches(nic: &Nic, want: &[u8], dir: &Path) -> bool {
    let out = dir.join(format!("{}.kpxe", nic.port));
    let _ = std::fs::remove_file(&out);
    let ok = nic
        .ns
        .cmd(&[
            "timeout",
            "6",
            "busybox",
            "tftp",
            "-g",
            "-r",
            "undionly.kpxe",
            "-l",
            out.to_str().unwrap(),
            &SERVICES.to_string(),
        ])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok && std::fs::read(&out).is_ok_and(|b| b == want)
}

/// Whether curl on `nic` got any HTTP answer from shepherd's boot HTTP.
fn http_answers(nic: &Nic) -> bool {
    let out = nic
        .ns
        .cmd(&[
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "3",
            &format!("http://{SERVICES}:{HTTP}/"),
        ])
        .output()
        .unwrap();
    let code = String::from_utf8_lossy(&out.stdout).to_string();
    !code.is_empty() && code != "000"
}

/// shepherd's boot services answer machines on the provisioning network
/// only: a tenant's machine and a free one reach neither its DHCP, TFTP
/// and boot HTTP, nor a BMC; and a DHCP server a tenant runs is never
/// heard by a machine that boots the network, while a machine on the
/// tenant's own network hears it.
#[actix_rt::test]
async fn only_the_provisioning_network_reaches_shepherd_s_boot_services() {
    if !is_root() {
        eprintln!("SKIPPED: the switch test needs root (network namespaces)");
        return;
    }
    let sw = OvsSwitch::start("leaf3");
    // The machines' NICs (p1, p2: shepherd moves them); shepherd's own NIC
    // on provisioning, where it runs; a BMC.
    let nics: Vec<Nic> = (1..=2).map(|i| sw.nic(nic_ip(i), 999)).collect();
    let services = sw.nic(SERVICES, PROVISIONING);
    let bmc = sw.nic(A_BMC, BMC);
    let mut bmc_server = bmc.listen(PORT);
    let dir = tempfile::tempdir().unwrap();
    let tftp_root = dir.path().join("ipxe");
    std::fs::create_dir(&tftp_root).unwrap();
    let undionly: Vec<u8> = (0..74_213u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    std::fs::write(tftp_root.join("undionly.kpxe"), &undionly).unwrap();
    let netboot = format!(
        "interface = \"eth0\"\nmode = \"dhcp\"\naddress = \"{SERVICES}\"\n\
         range = \"{}-{}\"\nlease = \"10m\"\ntftp_root = \"{}\"\n\
         http_listen = \"0.0.0.0:{HTTP}\"\nuefi = \"ipxe\"\ndiscover = true\n",
        SHEPHERD_RANGE.0,
        SHEPHERD_RANGE.1,
        tftp_root.display()
    );
    // The boot image a discovered machine's boot is served from, its
    // kernel and initramfs beside it.
    let (iso, _) = boot_image_stand_in(dir.path());
    for (ext, n) in [("vmlinuz", 300_001), ("initrd", 500_003)] {
        std::fs::write(
            dir.path().join(format!("shepherd-boot.iso.{ext}")),
            vec![7u8; n],
        )
        .unwrap();
    }
    let more = move |t: &mut toml::Table| {
        t.insert(
            "netboot".into(),
            toml::from_str::<toml::Table>(&netboot).unwrap().into(),
        );
        let installations = t
            .entry("installations")
            .or_insert_with(|| toml::Table::new().into());
        installations
            .as_table_mut()
            .unwrap()
            .insert("boot_image".into(), iso.display().to_string().into());
    };
    let (mut rack, _key) = rack_with(
        &sw,
        2,
        Ipv4Addr::new(127, 0, 98, 1),
        Some(&services.ns),
        &more,
    )
    .await;
    let limit = Duration::from_secs(240);
    rack.admin
        .wait(&mut rack.shepherd, "agent-started", 2, limit)
        .await;
    rack.deprovision_all().await;
    rack.admin
        .wait(&mut rack.shepherd, "available", 2, limit)
        .await;
    let (project, token) = rack.project("gamma");
    device(&rack, project, &token, "g1").await;
    let path = format!("/metal/v1/projects/{project}/devices");
    rack.admin
        .wait_active(&mut rack.shepherd, &path, &token, 1, limit)
        .await;
    let ports = ports_of(&rack.admin).await;
    let (tenant, free): (Vec<&Nic>, Vec<&Nic>) =
        nics.iter().partition(|n| ports[&n.port].1.is_some());
    let (tenant, free) = (tenant[0], free[0]);
    let vlan: u16 = sw.tag(&tenant.port).parse().unwrap();
    assert_eq!(
        ports[&tenant.port].2["vlan"], vlan,
        "{:#}",
        ports[&tenant.port].2
    );
    assert_eq!(sw.tag(&free.port), IDLE.to_string());
    // A machine booting the network: its port on provisioning, as shepherd
    // puts a machine's while it works on it.
    let booting = sw.nic(Ipv4Addr::new(10, 90, 3, 1), PROVISIONING);
    let script = dir.path().join("udhcpc.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n[ \"$1\" = bound ] && echo \"bound $ip $serverid\"\nexit 0\n",
    )
    .unwrap();
    assert!(
        Command::new("chmod")
            .args(["755", script.to_str().unwrap()])
            .status()
            .unwrap()
            .success()
    );

    // Every NIC against every service, as seen.
    let mut table = Vec::new();
    for (step, nic, expected) in [
        ("booting the network (provisioning)", &booting, true),
        ("a tenant's machine", tenant, false),
        ("a free machine (idle)", free, false),
    ] {
        let leased = lease(nic, &script);
        if let Some((ip, server)) = leased {
            assert_eq!(server, SERVICES, "{step}: leased {ip} by {server}");
            assert!(
                (SHEPHERD_RANGE.0..=SHEPHERD_RANGE.1).contains(&ip),
                "{step}: {ip}"
            );
        }
        table.push((step, "shepherd's DHCP", expected, leased.is_some()));
        table.push((
            step,
            "shepherd's TFTP",
            expected,
            tftp_fetches(nic, &undionly, dir.path()),
        ));
        table.push((step, "shepherd's boot HTTP", expected, http_answers(nic)));
        let bmc_seen = nic.reaches(A_BMC, PORT, Duration::from_secs(2)).await;
        table.push((step, "a BMC", false, bmc_seen));
    }

    // The tenant runs a DHCP server on its machine: a machine on its own
    // network is leased by it; one booting the network never hears it.
    let conf = dir.path().join("udhcpd.conf");
    std::fs::write(
        &conf,
        format!(
            "start {}\nend {}\ninterface eth0\nlease_file {}\nopt subnet 255.255.0.0\n",
            TENANT_RANGE.split(' ').next().unwrap(),
            TENANT_RANGE.split(' ').nth(1).unwrap(),
            dir.path().join("udhcpd.leases").display()
        ),
    )
    .unwrap();
    let mut udhcpd = tenant
        .ns
        .cmd(&["busybox", "udhcpd", "-f", conf.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let neighbour = sw.nic(Ipv4Addr::new(10, 90, 4, 1), vlan);
    let heard = lease(&neighbour, &script);
    assert!(
        heard.is_some_and(|(_, server)| server == tenant.ip),
        "the tenant's own network did not hear its DHCP server: {heard:?}"
    );
    table.push((
        "the tenant's network",
        "the tenant's DHCP server",
        true,
        heard.is_some(),
    ));
    // Three machines booting the network, each a stranger shepherd
    // discovers (a NIC of its own, a MAC of its own).
    for i in 0..3 {
        let booting = sw.nic(Ipv4Addr::new(10, 90, 3, 2 + i), PROVISIONING);
        let leased = lease(&booting, &script);
        assert!(
            leased.is_some_and(|(_, server)| server == SERVICES),
            "a machine booting the network was leased {leased:?}, not by shepherd"
        );
        table.push((
            "booting the network (provisioning)",
            "the tenant's DHCP server",
            false,
            leased.is_some_and(|(_, server)| server == tenant.ip),
        ));
    }
    let _ = udhcpd.kill();
    let _ = udhcpd.wait();

    eprintln!("| from | to | expected | seen |\n|---|---|---|---|");
    for (from, to, expected, seen) in &table {
        eprintln!("| {from} | {to} | {expected} | {seen} |");
    }
    let _ = bmc_server.kill();
    let _ = bmc_server.wait();
    let wrong: Vec<_> = table.iter().filter(|(_, _, e, s)| e != s).collect();
    assert!(
        wrong.is_empty(),
        "reachability not as the life cycle wants it: {wrong:?}\n{}",
        rack.shepherd.log_tail()
    );
}
