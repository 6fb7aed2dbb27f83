//! Firmware on the pages: a machine's components and the versions it ran
//! (the machine page), and machines per component version (the fleet
//! page), from `bmdb::firmware`.

use std::fmt::Write as _;

use crate::bmdb::firmware::Firmware;

use super::html::esc;
use super::text::rfc3339;

/// The machine page's firmware section; empty when it was never read.
pub(super) fn machine_section(f: &Firmware) -> String {
    let Some(read_at) = f.read_at else {
        return String::new();
    };
    let mut b = format!(
        "<h2>Firmware</h2><p class=\"muted\">as its BMC listed it at {}</p>",
        rfc3339(read_at)
    );
    if let Some(e) = &f.read_error {
        let _ = write!(
            b,
            "<p class=\"error\" id=\"firmware-error\">the last read failed: {}</p>",
            esc(e)
        );
    }
    b.push_str(
        "<table id=\"firmware\"><tr><th>component</th><th>name</th><th>version</th>\
         <th>updateable</th><th>since</th></tr>",
    );
    for r in &f.components {
        let c = &r.component;
        let _ = write!(
            b,
            "<tr data-component=\"{}\"><td>{}</td><td>{}</td><td class=\"version\">{}</td><td>{}</td><td>{}</td></tr>",
            esc(&c.component),
            esc(&c.component),
            esc(c.name.as_deref().unwrap_or("")),
            esc(&c.version),
            match c.updateable {
                Some(true) => "yes",
                Some(false) => "no",
                None => "",
            },
            rfc3339(r.since)
        );
    }
    b.push_str("</table>");
    if f.history.iter().any(|s| s.previous.is_some()) {
        b.push_str("<table id=\"firmware-history\"><tr><th>time</th><th>component</th><th>from</th><th>to</th></tr>");
        for s in f.history.iter().filter(|s| s.previous.is_some()) {
            let _ = write!(
                b,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                rfc3339(s.seen_at),
                esc(&s.component),
                esc(s.previous.as_deref().unwrap_or("")),
                esc(&s.version)
            );
        }
        b.push_str("</table>");
    }
    if let Some((bios, changed)) = &f.bios {
        let _ = write!(
            b,
            "<h3>BIOS settings</h3><p class=\"muted\">{}; changed {}</p><table id=\"bios\"><tr><th>attribute</th><th>value</th></tr>",
            esc(bios
                .registry
                .as_deref()
                .unwrap_or("no attribute registry named")),
            rfc3339(*changed)
        );
        for (k, v) in &bios.attributes {
            let v = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let _ = write!(b, "<tr><td>{}</td><td>{}</td></tr>", esc(k), esc(&v));
        }
        b.push_str("</table>");
    }
    if let Some((storage, changed)) = &f.storage {
        let _ = write!(
            b,
            "<h3>Storage</h3><p class=\"muted\">changed {}</p>",
            rfc3339(*changed)
        );
        for s in storage {
            let _ = write!(
                b,
                "<table class=\"storage\" data-storage=\"{id}\"><tr><th colspan=\"4\">{id} {name}: {volumes}</th></tr>\
                 <tr><th>drive</th><th>capacity</th><th>media</th><th>serial</th></tr>",
                id = esc(&s.id),
                name = esc(s.name.as_deref().unwrap_or("")),
                volumes = if s.volumes_offered {
                    "volumes (RAID) through the BMC"
                } else {
                    "no volumes through this BMC"
                },
            );
            let gb = |c: Option<i64>| c.map(|c| format!("{:.1} GB", c as f64 / 1e9));
            for d in &s.drives {
                let media = [d.media_type.as_deref(), d.protocol.as_deref()]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(" ");
                let serial = d.serial_number.clone();
                row(
                    &mut b,
                    "",
                    [
                        Some(d.id.clone()),
                        gb(d.capacity_bytes),
                        Some(media),
                        serial,
                    ],
                );
            }
            for v in &s.volumes {
                let cells = [
                    Some(format!("volume {}", v.id)),
                    gb(v.capacity_bytes),
                    v.raid_type.clone(),
                    Some(format!("of {}", v.drives.join(", "))),
                ];
                row(&mut b, " class=\"volume\"", cells);
            }
            b.push_str("</table>");
        }
    }
    b
}

/// The fleet page's firmware section: machines per component and version
/// (`versions`: from `bmdb::firmware::versions`); empty when none is known.
pub(super) fn fleet_section(versions: &[(String, String, i64)]) -> String {
    if versions.is_empty() {
        return String::new();
    }
    let mut b = String::from(
        "<section id=\"firmware\"><h2>Firmware</h2><table id=\"firmware-versions\">\
         <tr><th>component</th><th>version</th><th>machines</th></tr>",
    );
    for (component, version, n) in versions {
        let _ = write!(
            b,
            "<tr><td>{}</td><td class=\"version\">{}</td><td class=\"count\">{n}</td></tr>",
            esc(component),
            esc(version)
        );
    }
    b.push_str("</table></section>");
    b
}

/// A table row of four cells, each escaped (an unknown one empty).
fn row(b: &mut String, attributes: &str, cells: [Option<String>; 4]) {
    let _ = write!(b, "<tr{attributes}>");
    for c in cells {
        let _ = write!(b, "<td>{}</td>", esc(c.as_deref().unwrap_or("")));
    }
    b.push_str("</tr>");
}
