//! What is below machines' operating systems: `shepherd machines firmware
//! | bios | raid ID` (one machine's, as its BMC listed it, against its
//! baseline) and `shepherd baselines` (the fleet against each baseline).

use shepherd::baselines::{Baselines, Conformance, Part};
use shepherd::bmdb::Bmdb;
use shepherd::bmdb::firmware::{self, Below, Firmware};
use shepherd::config::Config;

/// Which part of one machine's to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    Firmware,
    Bios,
    Raid,
}

fn t(s: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(s).to_string()
}

/// `shepherd machines firmware|bios|raid ID`.
pub async fn machine(mut cfg: Config, id: uuid::Uuid, shown: Shown) -> anyhow::Result<()> {
    cfg.bmdb.pool_size = 2;
    let bmdb = Bmdb::open(&cfg.bmdb).await?;
    let (f, below) = bmdb
        .snapshot(async |tx| {
            Ok((
                firmware::of_machine(tx, id).await?,
                firmware::below(tx, Some(&[id]), true).await?.pop(),
            ))
        })
        .await?;
    let Some(below) = below else {
        anyhow::bail!(
            "machine {id}: no Redfish BMC of it is read (not in the BMDB, or not an inventory host with a Redfish BMC)"
        );
    };
    let Some(read_at) = f.read_at else {
        anyhow::bail!("machine {id}: its firmware was never read (the Updater reads it)");
    };
    println!("read at   {}", t(read_at));
    if let Some(e) = &f.read_error {
        println!("read error {e}");
    }
    match shown {
        Shown::Firmware => components(&f),
        Shown::Bios => bios(&f),
        Shown::Raid => raid(&f),
    }
    let baselines = Baselines::new(&cfg.baselines, &cfg.metal.plans);
    let c = baselines.conformance(&below);
    // Secure Boot's difference shows with the firmware's.
    let parts: &[Part] = match shown {
        Shown::Firmware => &[Part::Component, Part::SecureBoot],
        Shown::Bios => &[Part::Bios],
        Shown::Raid => &[Part::Raid],
    };
    conformance(&c, parts, &below);
    Ok(())
}

fn components(f: &Firmware) {
    println!(
        "{:<28} {:<24} {:<10} SINCE",
        "COMPONENT", "VERSION", "UPDATEABLE"
    );
    for r in &f.components {
        let c = &r.component;
        println!(
            "{:<28} {:<24} {:<10} {}",
            c.component,
            c.version,
            match c.updateable {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            },
            t(r.since)
        );
    }
    for s in f.history.iter().filter(|s| s.previous.is_some()) {
        println!(
            "  {} {} {} -> {}",
            t(s.seen_at),
            s.component,
            s.previous.as_deref().unwrap_or(""),
            s.version
        );
    }
}

fn bios(f: &Firmware) {
    let Some((b, changed)) = &f.bios else {
        println!("its BMC lists no BIOS settings");
        return;
    };
    println!(
        "registry  {} (changed {})",
        b.registry.as_deref().unwrap_or("-"),
        t(*changed)
    );
    for (k, v) in &b.attributes {
        println!("  {k:<32} {}", shepherd::baselines::shown(v));
    }
}

fn raid(f: &Firmware) {
    let Some((storage, changed)) = &f.storage else {
        println!("its BMC lists no storage");
        return;
    };
    println!("changed   {}", t(*changed));
    for s in storage {
        println!(
            "{} {}: {}",
            s.id,
            s.name.as_deref().unwrap_or(""),
            if s.volumes_offered {
                "volumes (RAID) through the BMC"
            } else {
                "no volumes through this BMC"
            }
        );
        for d in &s.drives {
            println!(
                "  drive  {:<20} {:>12} {} {}",
                d.id,
                d.capacity_bytes
                    .map(|c| format!("{:.1} GB", c as f64 / 1e9))
                    .unwrap_or_default(),
                d.media_type.as_deref().unwrap_or(""),
                d.protocol.as_deref().unwrap_or("")
            );
        }
        for v in &s.volumes {
            println!(
                "  volume {:<20} {} of {}",
                v.id,
                v.raid_type.as_deref().unwrap_or("?"),
                v.drives.join(", ")
            );
        }
    }
}

fn conformance(c: &Conformance, parts: &[Part], below: &Below) {
    match c {
        Conformance::Unbound => println!(
            "baseline  none selects it (manufacturer {}, model {})",
            below.manufacturer.as_deref().unwrap_or("-"),
            below.model.as_deref().unwrap_or("-")
        ),
        c => {
            println!("baseline  {}: {}", c.baseline().unwrap_or(""), c.as_str());
            for d in c.differences().iter().filter(|d| parts.contains(&d.part)) {
                println!("  drift   {d}");
            }
        }
    }
}

/// `shepherd baselines`: each baseline, its machines by how they stand.
pub async fn baselines(mut cfg: Config) -> anyhow::Result<()> {
    cfg.bmdb.pool_size = 2;
    if cfg.baselines.is_empty() {
        println!("no baselines are declared ([[baselines]] in the configuration)");
        return Ok(());
    }
    let bmdb = Bmdb::open(&cfg.bmdb).await?;
    let baselines = Baselines::new(&cfg.baselines, &cfg.metal.plans);
    let reports = baselines.needs_reports();
    let below = bmdb
        .snapshot(async |tx| firmware::below(tx, None, reports).await)
        .await?;
    let survey = baselines.survey(&below);
    println!(
        "{:<24} {:>8} {:>10} {:>8} {:>6}  SELECTS",
        "BASELINE", "MACHINES", "CONFORMING", "DRIFTING", "UNREAD"
    );
    for (b, s) in cfg.baselines.iter().zip(&survey.baselines) {
        println!(
            "{:<24} {:>8} {:>10} {:>8} {:>6}  {}",
            b.name,
            s.machines,
            s.conforming,
            s.drifting,
            s.unread,
            b.selection()
        );
    }
    for (id, c) in &survey.machines {
        for d in c.differences() {
            println!("{id} {}: {d}", c.baseline().unwrap_or(""));
        }
    }
    Ok(())
}
