//! Firmware on the pages and in the API: a machine's components and the
//! versions it ran, and how it stands against its baseline (the machine
//! page); machines per component version, and per baseline (the firmware
//! page, `GET /api/v1/baselines`), from `bmdb::firmware` and `baselines`.
//! The survey reads every machine's facts: it has a page of its own, so
//! the fleet page stays flat with the fleet's size.

use actix_web::{HttpResponse, web};
use maud::{Markup, html};

use crate::baselines::{Conformance, Standing, Survey};
use crate::bmdb::firmware::Firmware;

use super::Admin;

use super::text::rfc3339;

/// `GET /firmware`: machines per component version and per baseline.
pub(super) async fn firmware_page(admin: web::Data<Admin>) -> HttpResponse {
    let r = admin
        .bmdb
        .snapshot(async |tx| {
            Ok((
                crate::bmdb::firmware::versions(tx).await?,
                if admin.baselines.is_empty() {
                    Vec::new()
                } else {
                    crate::bmdb::firmware::below(tx, None, admin.baselines.needs_reports()).await?
                },
            ))
        })
        .await;
    let (versions, below) = match r {
        Ok(v) => v,
        Err(e) => return super::request::internal(e),
    };
    let body = html! {
        nav { a href="./" { "fleet" } }
        @if versions.is_empty() && admin.baselines.is_empty() {
            p #no-firmware { "No firmware read yet, and no baseline declared." }
        } @else {
            (fleet_section(&versions, &admin.baselines.survey(&below)))
        }
    };
    super::html::page("shepherd: firmware", body, true)
}

/// The machine page's firmware section; empty when it was never read.
pub(super) fn machine_section(f: &Firmware) -> Markup {
    let Some(read_at) = f.read_at else {
        return html! {};
    };
    let gb = |c: Option<i64>| c.map(|c| format!("{:.1} GB", c as f64 / 1e9));
    html! {
        h2 { "Firmware" }
        p.muted { "as its BMC listed it at " (rfc3339(read_at)) }
        @if let Some(e) = &f.read_error {
            p.error #firmware-error { "the last read failed: " (e) }
        }
        table #firmware {
            tr { th { "component" } th { "name" } th { "version" } th { "updateable" } th { "since" } }
            @for r in &f.components {
                @let c = &r.component;
                tr data-component=(c.component) {
                    td { (c.component) }
                    td { (c.name.as_deref().unwrap_or("")) }
                    td.version { (c.version) }
                    td { @match c.updateable { Some(true) => "yes", Some(false) => "no", None => "" } }
                    td { (rfc3339(r.since)) }
                }
            }
        }
        @if f.history.iter().any(|s| s.previous.is_some()) {
            table #firmware-history {
                tr { th { "time" } th { "component" } th { "from" } th { "to" } }
                @for s in f.history.iter().filter(|s| s.previous.is_some()) {
                    tr {
                        td { (rfc3339(s.seen_at)) }
                        td { (s.component) }
                        td { (s.previous.as_deref().unwrap_or("")) }
                        td { (s.version) }
                    }
                }
            }
        }
        @if let Some((bios, changed)) = &f.bios {
            h3 { "BIOS settings" }
            p.muted {
                (bios.registry.as_deref().unwrap_or("no attribute registry named"))
                "; changed " (rfc3339(*changed))
            }
            table #bios {
                tr { th { "attribute" } th { "value" } }
                @for (k, v) in &bios.attributes {
                    tr { td { (k) } td { (crate::baselines::shown(v)) } }
                }
            }
        }
        @if let Some((storage, changed)) = &f.storage {
            h3 { "Storage" }
            p.muted { "changed " (rfc3339(*changed)) }
            @for s in storage {
                table.storage data-storage=(s.id) {
                    tr { th colspan="4" {
                        (s.id) " " (s.name.as_deref().unwrap_or("")) ": "
                        @if s.volumes_offered { "volumes (RAID) through the BMC" }
                        @else { "no volumes through this BMC" }
                    } }
                    tr { th { "drive" } th { "capacity" } th { "media" } th { "serial" } }
                    @for d in &s.drives {
                        (row(None, [
                            Some(d.id.clone()),
                            gb(d.capacity_bytes),
                            Some([d.media_type.as_deref(), d.protocol.as_deref()]
                                .into_iter().flatten().collect::<Vec<_>>().join(" ")),
                            d.serial_number.clone(),
                        ]))
                    }
                    @for v in &s.volumes {
                        (row(Some("volume"), [
                            Some(format!("volume {}", v.id)),
                            gb(v.capacity_bytes),
                            v.raid_type.clone(),
                            Some(format!("of {}", v.drives.join(", "))),
                        ]))
                    }
                }
            }
        }
    }
}

/// The firmware page's section: machines per component and version
/// (`versions`: from `bmdb::firmware::versions`), each version marked
/// against what the baselines want, and each baseline's machines by how
/// they stand; empty when nothing is known.
pub(super) fn fleet_section(versions: &[(String, String, i64)], survey: &Survey) -> Markup {
    if versions.is_empty() && survey.baselines.is_empty() {
        return html! {};
    }
    html! {
        section #firmware {
            h2 { "Firmware" }
            @if !survey.baselines.is_empty() {
                table #baselines {
                    tr { th { "baseline" } th { "machines" } th { "conforming" } th { "drifting" } th { "unread" } }
                    @for s in &survey.baselines {
                        tr data-baseline=(s.baseline) {
                            td { (s.baseline) }
                            td.count { (s.machines) }
                            td.conforming { (s.conforming) }
                            td.drifting { (s.drifting) }
                            td.unread { (s.unread) }
                        }
                    }
                }
            }
            @if !versions.is_empty() {
                table #firmware-versions {
                    tr { th { "component" } th { "version" } th { "machines" } th { "baseline" } }
                    @for (component, version, n) in versions {
                        @let mark = match survey.components.get(component) {
                            None => "",
                            Some(w) if w.desired.contains(version) => "wanted",
                            Some(_) => "drift",
                        };
                        tr class=(mark) data-component=(component) {
                            td { (component) }
                            td.version { (version) }
                            td.count { (n) }
                            td { (mark) }
                        }
                    }
                }
            }
        }
    }
}

/// The machine page's baseline section: the baseline that selects it and
/// how it differs; empty when none does.
pub(super) fn baseline_section(c: &Conformance) -> Markup {
    let Some(name) = c.baseline() else {
        return html! {};
    };
    html! {
        h2 { "Baseline" }
        p #conformance class=(c.as_str()) { (name) ": " (c.as_str()) }
        @if !c.differences().is_empty() {
            table #drift {
                tr { th { "part" } th { "item" } th { "listed" } th { "wanted" } }
                @for d in c.differences() {
                    (row(None, [
                        Some(d.part.as_str().to_string()),
                        Some(d.item.clone()),
                        d.actual.clone(),
                        Some(d.desired.clone()),
                    ]))
                }
            }
        }
    }
}

/// `GET /api/v1/baselines`: each baseline as declared, with its machines
/// by how they stand against it.
#[utoipa::path(get, path = "/api/v1/baselines", tag = "machines",
    responses(
        (status = 200, description = "the baselines, in the order machines are matched against them", body = BaselineList),
        (status = 500, description = "the BMDB failed", body = super::api::ErrorBody)))]
pub async fn api_baselines(admin: web::Data<Admin>) -> HttpResponse {
    let below = if admin.baselines.is_empty() {
        Ok(Vec::new())
    } else {
        admin
            .bmdb
            .snapshot(async |tx| {
                crate::bmdb::firmware::below(tx, None, admin.baselines.needs_reports()).await
            })
            .await
    };
    let below = match below {
        Ok(b) => b,
        Err(e) => return super::request::internal(e),
    };
    let survey = admin.baselines.survey(&below);
    HttpResponse::Ok().json(BaselineList {
        baselines: admin
            .baselines
            .baselines
            .iter()
            .zip(survey.baselines)
            .map(|(b, standing)| BaselineBody {
                selection: b.selection(),
                declared: serde_json::to_value(b).unwrap_or_default(),
                standing,
            })
            .collect(),
    })
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct BaselineList {
    pub baselines: Vec<BaselineBody>,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct BaselineBody {
    /// Which machines it selects, for people: `plan=… model=…` or `every
    /// machine`.
    pub selection: String,
    /// As configured (`[[baselines]]`): `name`, `plan`, `manufacturer`,
    /// `model`, `components[]` (`component`, `version`, `image`), `bios`,
    /// `raid[]` (`raid_type`, `drives`).
    #[schema(value_type = Object)]
    pub declared: serde_json::Value,
    /// `baseline`, `machines`, `conforming`, `drifting`, `unread`.
    #[schema(value_type = Object)]
    pub standing: Standing,
}

/// A table row of four cells (an unknown one empty).
fn row(class: Option<&str>, cells: [Option<String>; 4]) -> Markup {
    html! {
        tr class=[class] {
            @for c in cells { td { (c.as_deref().unwrap_or("")) } }
        }
    }
}
