//! A rack at once: N owned machines (`fleet-sim --provider static`, 1,000
//! by default) brought to tenant-ready by one shepherd on this machine,
//! phase by phase:
//!
//! 1. enroll: from shepherd's start to every machine's agent running and
//!    reporting. With `SHEPHERD_BENCH_BOOT=network` (the default as root)
//!    the machines are blank and off: shepherd powers each on through its
//!    simulated Redfish BMC (200 ms a request) with a one-time `Pxe`
//!    override, and the machine boots through shepherd's real proxyDHCP-
//!    less DHCP, TFTP and HTTP on a veth link between two network
//!    namespaces (`fleet-sim --boot network`, `sim/src/pxe.rs`), then its
//!    live agent enrolls with the boot's credential. With `ssh` the
//!    machines answer SSH and are taken over;
//! 2. erase: every machine deprovisioned (`discard`) to `available`;
//! 3. creates: N devices created through the Metal API, 8 in flight;
//! 4. install: from the first create to every device `active` (each
//!    machine installs a served image, `SHEPHERD_BENCH_IMAGE_MIB`, 16 by
//!    default, fetching it from the image server and from the machines
//!    installing it with it).
//!
//! Prints per phase its wall time, shepherd's CPU seconds and its BMDB
//! statements and transactions per machine (from its `/metrics`); then
//! shepherd's peak RSS, the simulated floor's CPU, and the image's bytes
//! from the image server and between machines (the agents' progress);
//! booting the network, the DHCP packets answered and dropped (by
//! reason), TFTP and HTTP transfers, and the machines' own DHCP resends.
//!
//!     cargo bench --bench rack
//!
//! Booting the network, the machines' switch ports are real: Open vSwitch
//! in user space, `SHEPHERD_BENCH_SWITCHES` switches (21 of 48 ports by
//! default; 0: none) each in a namespace of its own and managed over SSH,
//! every machine's NIC cabled to one port. The simulated machines' traffic
//! goes over the provisioning link, not through the switches, so the ports
//! are OVS internal ports; shepherd moves each through the life cycle
//! (provisioning, idle, provisioning, the tenant's VLAN) and reads every
//! change back, and nothing boots or goes `active` before its port holds
//! what it needs. Then: the changes, the switch sessions per device, the
//! changes per second of a switch's session, and every port's VLAN as the
//! switch holds it at the end.
//!
//! SHEPHERD_BENCH_MACHINES sizes the rack; SHEPHERD_BENCH_INTERVAL sets
//! the agents' heartbeat interval (5s). Needs PostgreSQL at
//! 127.0.0.1:5432 (or its server binaries) and sfdisk.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use serde_json::json;
use shepherd_sim::testing::{OwnedRack, RackNetwork, cpu_seconds, ovs_usable};

#[path = "rack/switches.rs"]
mod switches;
use switches::{switch_figures, switches};

fn env<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What one phase cost.
struct Phase {
    name: String,
    wall: f64,
    cpu: f64,
    statements: f64,
    transactions: f64,
}

/// Shepherd's counters at one moment.
struct Mark {
    at: Instant,
    cpu: f64,
    statements: f64,
    transactions: f64,
}

async fn mark(rack: &OwnedRack) -> Mark {
    Mark {
        at: Instant::now(),
        cpu: cpu_seconds(rack.shepherd.pid()),
        statements: rack
            .admin
            .metric("shepherd_bmdb_statements_total", "")
            .await,
        transactions: rack
            .admin
            .metric("shepherd_bmdb_transactions_total", "committed")
            .await,
    }
}

/// The phase from `from` to `to`, its row printed at once (stderr): a
/// run stopped later still shows what it measured.
fn phase(name: String, from: &Mark, to: &Mark) -> Phase {
    let p = phase_of(name, from, to);
    eprintln!(
        "rack: {}: {:.1} s wall, {:.1} s shepherd CPU, {:.0} statements",
        p.name, p.wall, p.cpu, p.statements
    );
    p
}

fn phase_of(name: String, from: &Mark, to: &Mark) -> Phase {
    Phase {
        name,
        wall: (to.at - from.at).as_secs_f64(),
        cpu: to.cpu - from.cpu,
        statements: to.statements - from.statements,
        transactions: to.transactions - from.transactions,
    }
}

fn main() {
    let n: usize = env("SHEPHERD_BENCH_MACHINES", 1000);
    let image_mib: u64 = env("SHEPHERD_BENCH_IMAGE_MIB", 16);
    let interval: String = env("SHEPHERD_BENCH_INTERVAL", "5s".to_string());
    // Every fourth machine's BMC speaks IPMI (ipmitool), the rest Redfish.
    let ipmi_every: usize = env("SHEPHERD_BENCH_IPMI_EVERY", 4);
    let root = shepherd_sim::testing::is_root();
    let network = match std::env::var("SHEPHERD_BENCH_BOOT").as_deref() {
        Ok("network") if !root => {
            eprintln!("rack: SHEPHERD_BENCH_BOOT=network needs root (network namespaces)");
            std::process::exit(2);
        }
        Ok("network") => true,
        Ok("ssh") => false,
        Ok(other) => {
            eprintln!("rack: SHEPHERD_BENCH_BOOT={other:?} is not \"network\" or \"ssh\"");
            std::process::exit(2);
        }
        Err(_) => {
            if !root {
                eprintln!(
                    "rack: not root, so no network namespaces: the machines are taken over over SSH (SHEPHERD_BENCH_BOOT=ssh)"
                );
            }
            root
        }
    };
    // The simulated agents' lines in fleet-sim's log: why each chunk came
    // from the image server rather than from another machine.
    if std::env::var_os("FLEET_SIM_LOG").is_none() {
        // SAFETY: no other thread runs yet.
        unsafe { std::env::set_var("FLEET_SIM_LOG", "warn,shepherd_sim::machine=debug") };
    }
    let switches: usize = if network {
        env("SHEPHERD_BENCH_SWITCHES", if ovs_usable() { 21 } else { 0 })
    } else {
        0
    };
    actix_rt::System::new().block_on(run(n, image_mib, interval, network, ipmi_every, switches));
}

async fn run(
    n: usize,
    image_mib: u64,
    interval: String,
    network: bool,
    ipmi_every: usize,
    k: usize,
) {
    // The image server's downloads and refusals are counted from its log.
    let log = (
        "SHEPHERD__LOG__LEVEL",
        "warn,shepherd::images=info,shepherd::enroller=info,shepherd::recoverer=info,\
         shepherd::control=info,shepherd::bmdb::session=info,shepherd::devices=info"
            .to_string(),
    );
    let keys = tempfile::tempdir().unwrap();
    let mut fabric = None;
    let mut rack = if network {
        let every = ipmi_every.to_string();
        let net = RackNetwork::new();
        let (sws, section, cabling) = if k > 0 {
            switches(&net, n, k, keys.path())
        } else {
            (Vec::new(), toml::Table::new(), Vec::new())
        };
        let edit = |t: &mut toml::Table| {
            if cabling.is_empty() {
                return;
            }
            t.insert("network".into(), section.clone().into());
            let machines = t["provider"]["inventory"]["machines"]
                .as_array_mut()
                .unwrap();
            for (m, (switch, port)) in machines.iter_mut().zip(&cabling) {
                let mut p = toml::Table::new();
                p.insert("switch".into(), switch.clone().into());
                p.insert("port".into(), port.clone().into());
                m.as_table_mut()
                    .unwrap()
                    .insert("ports".into(), toml::Value::Array(vec![p.into()]));
            }
        };
        let rack = OwnedRack::start_network_edited(
            net,
            n,
            &interval,
            image_mib << 20,
            std::slice::from_ref(&log),
            &["--ipmi-every", &every],
            &edit,
        )
        .await;
        if k > 0 {
            fabric = Some((sws, cabling));
        }
        rack
    } else {
        OwnedRack::start(
            n,
            Ipv4Addr::new(127, 0, 96, 1),
            &interval,
            image_mib << 20,
            std::slice::from_ref(&log),
        )
        .await
    };
    let fleet_cpu = cpu_seconds(rack.fleet.pid());
    let limit = Duration::from_secs(1800);
    let mut phases = Vec::new();
    let start = Mark {
        at: rack.started,
        cpu: 0.0,
        statements: 0.0,
        transactions: 0.0,
    };

    // 1. Enroll: a machine booted into the live agent is `available`
    // at once (blank, it held nothing); one taken over `agent-started`.
    let (enrolled_state, enroll) = if network {
        (
            "available",
            "enroll: start to every machine powered on, booted the network, enrolled",
        )
    } else {
        ("agent-started", "enroll: start to every agent running")
    };
    rack.admin
        .wait(&mut rack.shepherd, enrolled_state, n, limit)
        .await;
    let enrolled = mark(&rack).await;
    phases.push(phase(enroll.into(), &start, &enrolled));
    let boot_figures = if network {
        Some(network_boot_figures(&rack).await)
    } else {
        None
    };

    // 2. Erase.
    let deprovisions = rack.deprovision_all().await;
    rack.admin
        .wait(&mut rack.shepherd, "available", n, limit)
        .await;
    let available = mark(&rack).await;
    phases.push(phase(
        "erase: deprovisioned to every machine available".into(),
        &enrolled,
        &available,
    ));

    // 3. Creates, 8 in flight.
    let (project, token) = rack.project("rack");
    let create_path = format!("/metal/v1/projects/{project}/devices");
    let before_creates = mark(&rack).await;
    let next = std::cell::Cell::new(0usize);
    let admin = &rack.admin;
    let log = &rack.shepherd.log;
    // A 503 (the BMDB did not answer within admin.database_timeout) is
    // asked again after 250 ms, as Equinix's clients do: how many were.
    let workers = (0..8).map(|_| {
        let (create_path, token, next, log) = (&create_path, &token, &next, log);
        async move {
            let mut busy = 0;
            loop {
                let i = next.get();
                if i >= n {
                    return busy;
                }
                next.set(i + 1);
                let body = json!({"metro": "sv", "plan": OwnedRack::PLAN,
                    "operating_system": OwnedRack::OPERATING_SYSTEM,
                    "hostname": format!("rack-{i:04}")});
                loop {
                    let (s, d) = admin
                        .call("POST", create_path, Some(token), Some(body.clone()))
                        .await;
                    if s == 503 && busy < 10_000 {
                        busy += 1;
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        continue;
                    }
                    // No machine available while some are leased (work
                    // that ends, or the leases of a session that ended,
                    // until they are collected): asked again a second
                    // later, counted.
                    if s == 422
                        && busy < 10_000
                        && admin.counts().await.get("leased").copied().unwrap_or(0) > 0
                    {
                        busy += 1;
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                    if s != 201 {
                        let kept = std::env::temp_dir().join("rack-bench-shepherd.log");
                        let _ = std::fs::copy(log, &kept);
                        // The machines no device can have, as shepherd
                        // shows them (state, history, last errors).
                        for m in admin.machines().await {
                            let state = m["state"].as_str().unwrap_or_default();
                            if !matches!(state, "installed" | "available") {
                                let id = m["machine_id"].as_str().unwrap_or_default();
                                let (_, d) = admin.read(&format!("/api/v1/machines/{id}")).await;
                                eprintln!("machine {id} ({state}): {d:#}");
                            }
                        }
                        panic!(
                            "create {i}: {s} {d}; machines {:?}; shepherd's log kept in {}",
                            admin.counts().await,
                            kept.display()
                        );
                    }
                    break;
                }
            }
        }
    });
    let creates_busy: usize = futures::future::join_all(workers).await.iter().sum();
    let created = mark(&rack).await;
    phases.push(phase(
        format!("creates: {n} through the Metal API, 8 in flight"),
        &before_creates,
        &created,
    ));

    // 4. Every device active.
    rack.admin
        .wait_active(&mut rack.shepherd, &create_path, &token, n, limit)
        .await;
    let active = mark(&rack).await;
    phases.push(phase(
        "install: first create to every device active".into(),
        &before_creates,
        &active,
    ));
    let total = phase(
        "total: start to every device active".into(),
        &start,
        &active,
    );

    // The image's bytes, as the agents reported them.
    let (mut from_server, mut from_peers, mut image) = (0u64, 0u64, 0u64);
    for d in rack.admin.machine_details().await {
        let p = &d["installation"]["progress"];
        let fetched = p["bytes_fetched"].as_u64().unwrap_or(0);
        let peers = p["bytes_from_peers"].as_u64().unwrap_or(0);
        image = image.max(p["bytes_total"].as_u64().unwrap_or(0));
        from_server += fetched - peers.min(fetched);
        from_peers += peers;
    }
    let images = |b: u64| b as f64 / image.max(1) as f64;

    println!(
        "A rack of {n} simulated owned machines to tenant-ready, one shepherd, 2 cores (agents every {interval}, a {image_mib} MiB image)"
    );
    println!(
        "| phase | wall s | shepherd CPU s | BMDB statements/machine | transactions/machine |"
    );
    println!("|---|---|---|---|---|");
    let per = |v: f64| v / n as f64;
    for p in phases.iter().chain([&total]) {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} |",
            p.name,
            p.wall,
            p.cpu,
            per(p.statements),
            per(p.transactions)
        );
    }
    println!();
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| shepherd's peak RSS | {:.0} MB |",
        rack.shepherd.peak_rss_mb()
    );
    println!(
        "| the simulated floor's CPU (fleet-sim: {n} machines, their agents and disks) | {:.1} s |",
        cpu_seconds(rack.fleet.pid()) - fleet_cpu
    );
    println!(
        "| deprovisions answered 503 (BMDB busy), asked again | {} |",
        deprovisions.busy
    );
    println!(
        "| deprovisions answered 409 (the BMC not read yet), asked again | {} |",
        deprovisions.bmc_unread
    );
    println!(
        "| creates answered 503 (BMDB busy), or 422 while machines were leased, asked again | {creates_busy} |"
    );
    println!(
        "| image bytes from the image server | {from_server} ({:.2} images) |",
        images(from_server)
    );
    println!(
        "| image bytes between machines | {from_peers} ({:.2} images) |",
        images(from_peers)
    );
    // From shepherd's log: whole images the image server was asked for
    // (an agent that could not join the swarm fetches alone), and the
    // downloads and joins it answered 503 (the BMDB did not answer in
    // time).
    let whole = std::fs::read_to_string(&rack.shepherd.log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("image download") && l.contains("range=false"))
        .filter(|l| !l.contains("manifest"))
        .count();
    println!("| whole-image downloads from the image server | {whole} |");
    println!(
        "| image downloads and swarm joins answered 503 | {} |",
        rack.shepherd.log_count("did not answer within")
    );
    // From fleet-sim's log (the agents' own lines): why each chunk came
    // from the image server.
    let agents = std::fs::read_to_string(rack.dir.path().join("fleet-sim.log")).unwrap_or_default();
    let mut why: std::collections::BTreeMap<String, usize> = Default::default();
    let mut failed: std::collections::BTreeMap<String, usize> = Default::default();
    for l in agents.lines() {
        // The line's fields after the message (`machine=…`) and its
        // colours out.
        let plain: String = {
            let mut out = String::new();
            let mut esc = false;
            for c in l.chars() {
                match c {
                    '\u{1b}' => esc = true,
                    'm' if esc => esc = false,
                    _ if esc => {}
                    c => out.push(c),
                }
            }
            out
        };
        let l = plain.split(" machine=").next().unwrap_or(&plain);
        if let Some((_, cause)) = l.split_once("from the image server: ") {
            *why.entry(cause.trim().to_string()).or_default() += 1;
        } else if let Some((_, cause)) = l.split_once(" failed (") {
            let cause = cause.split_once("): not asked").map_or(cause, |c| c.0);
            // Addresses and figures out, so that like causes count together.
            let kind: String = cause
                .split(|c: char| c.is_ascii_digit())
                .filter(|p| !p.is_empty())
                .collect::<Vec<_>>()
                .join("#");
            *failed.entry(kind).or_default() += 1;
        }
    }
    for (cause, count) in &why {
        println!("| chunks from the image server: {cause} | {count} |");
    }
    for (cause, count) in &failed {
        println!("| members that failed an ask: {cause} | {count} |");
    }
    if let Some((switches, cabling)) = &fabric {
        println!();
        println!(
            "The switches ({} Open vSwitch in user space, managed over SSH; {} ports, OVS internal ports):",
            switches.len(),
            cabling.len()
        );
        println!();
        println!("| figure | value |");
        println!("|---|---|");
        for (k, v) in switch_figures(&rack, switches, cabling, n).await {
            println!("| {k} | {v} |");
        }
    }
    if let Some(rows) = boot_figures {
        println!();
        println!("The network boot, to every machine enrolled:");
        println!();
        println!("| figure | value |");
        println!("|---|---|");
        for (k, v) in rows {
            println!("| {k} | {v} |");
        }
    }
}

/// What the network boot's services and the machines counted, as rows.
async fn network_boot_figures(rack: &OwnedRack) -> Vec<(String, String)> {
    let m = |name: &'static str, labels: &'static str| rack.admin.metric(name, labels);
    let mut rows = vec![
        (
            "DHCP answers sent (offers, acks)".to_string(),
            format!(
                "{} ({}, {})",
                m("shepherd_netboot_dhcp_answers_total", "").await,
                m("shepherd_netboot_dhcp_answers_total", "message=\"offer\"").await,
                m("shepherd_netboot_dhcp_answers_total", "message=\"ack\"").await
            ),
        ),
        (
            "DHCP packets dropped".to_string(),
            // A sum of no series is -0: printed as 0.
            format!(
                "{}",
                m("shepherd_netboot_dhcp_ignored_total", "").await + 0.0
            ),
        ),
    ];
    for reason in [
        "busy",
        "bmdb_unavailable",
        "pool_full",
        "no_boot",
        "unknown_mac",
    ] {
        let v = rack
            .admin
            .metric(
                "shepherd_netboot_dhcp_ignored_total",
                &format!("reason=\"{reason}\""),
            )
            .await;
        if v > 0.0 {
            rows.push((format!("… of which {reason}"), format!("{v}")));
        }
    }
    // Transfers that ended well, and the rest.
    for (what, name, good) in [
        (
            "TFTP transfers complete / not",
            "shepherd_netboot_tftp_transfers_total",
            "complete",
        ),
        (
            "HTTP boot files served / not",
            "shepherd_netboot_http_requests_total",
            "served",
        ),
    ] {
        let (ok, all) = (m(name, good).await, m(name, "").await);
        rows.push((what.to_string(), format!("{ok} / {}", all - ok)));
    }
    rows.push((
        "BMC boots enrolled / failed / no callback".to_string(),
        format!(
            "{} / {} / {}",
            m("shepherd_bmc_boots_total", "outcome=\"enrolled\"").await,
            m("shepherd_bmc_boots_total", "outcome=\"bmc_failed\"").await,
            m("shepherd_bmc_boots_total", "outcome=\"no_callback\"").await
        ),
    ));
    let fleet = rack.fleet.report().await;
    let b = &fleet["network_boots"];
    for (k, what) in [
        (
            "started",
            "network boots started (power ons with the Pxe override)",
        ),
        ("failed", "network boots failed"),
        ("dhcp_sent", "DHCP messages the machines sent"),
        ("dhcp_resent", "… sent again after a wait unanswered"),
        ("tftp_bytes", "TFTP bytes received"),
        (
            "http_bytes",
            "HTTP bytes received (scripts, kernels, initramfs)",
        ),
    ] {
        rows.push((what.to_string(), b[k].to_string()));
    }
    rows
}
