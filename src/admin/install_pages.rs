//! The pages' side of installations: a machine's installation (image, who
//! asked, phase, progress bar, rate, result, error), the forms that ask
//! for one or for its erasure, and the image fields the rollout form
//! shares (`rollout_pages.rs`). Forms post through the same functions as
//! the API, with the pages' CSRF tokens.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, html};

use super::api::phase_name;
use super::auth;
use super::html::{back_to_machine, error_page};
use super::installs::{self, DiskBody, ImageBody, InstallBody};
use super::state::{Admin, Operator};
use super::text::rfc3339;
use crate::bmdb::installations::Kind;
use crate::bmdb::machines::MachineDetail;

fn bytes(n: i64) -> String {
    shepherd_proto::summary::bytes(n.max(0))
}

/// The image fields of the install and rollout forms: a served image
/// (when shepherd serves any) or a URL, the disk, and what follows.
pub(super) fn image_fields(admin: &Admin) -> Markup {
    let served = admin.images.as_ref().map(|c| c.list().unwrap_or_default());
    html! {
        @if let Some(served) = &served {
            label { "served image "
                select name="served" {
                    option value="" { "(a URL below)" }
                    @for (name, size) in served {
                        option value=(name) { (name) " (" (bytes(*size as i64)) ")" }
                    }
                }
            }
            " or "
        }
        label { "URL " input name="url" size="40" placeholder="https://…/image.raw.zst"; } " "
        label { "digest " input name="digest" size="24" placeholder="sha256:…"; }
        br;
        label { "disk serial " input name="disk_serial" size="14"; } " "
        label { "disk at least " input name="disk_min_bytes" size="12" placeholder="bytes"; } " "
        label { input type="checkbox" name="reboot" value="true"; " reboot when done" } " "
        label { input type="checkbox" name="efi" value="true"; " first EFI boot entry" } " "
        label { "deadline " input name="deadline" size="5" placeholder="2h"; } " "
    }
}

/// The machine page's installation section.
pub(super) fn machine_section(
    admin: &Admin,
    d: &MachineDetail,
    operator: Option<&Operator>,
) -> Markup {
    use crate::bmdb::lifecycle::Operation;
    let mid = d.summary.machine_id.to_string();
    let csrf = operator.map(|op| admin.csrf.token(op, &mid));
    html! {
        section #installation {
            h2 { "Installation" }
            @match &d.installation {
                None => p.muted #install-none { "No installation asked yet." },
                Some(i) => {
                    table #install {
                        tr { th { "generation" } td { (i.generation) } }
                        tr {
                            th { @if i.kind == Kind::Erase { "deprovisioning" } @else { "image" } }
                            td #install-image {
                                @if i.kind == Kind::Erase {
                                    "erase (" (i.erase_mode.as_deref().unwrap_or("metadata")) ")"
                                } @else {
                                    (i.image_url) br; span.muted { (i.image_digest) }
                                    @if let Some(f) = &i.first_boot {
                                        br; span #install-first-boot { "first boot: " (f) }
                                    }
                                }
                            }
                        }
                        tr { th { "asked by" } td #install-by {
                            (i.requested_by) " at " (rfc3339(i.requested_at))
                            @if let Some(r) = i.rollout_id {
                                " (rollout " a href={ "../rollouts/" (r) } { (r) } ")"
                            }
                        } }
                        tr { th { "state" } td #install-state { (i.state) } }
                        @if let Some((p, at)) = &i.progress {
                            @let total = p.bytes_total.max(0);
                            tr { th { "phase" } td #install-phase { (phase_name(p.phase)) } }
                            @let erase = i.kind == Kind::Erase;
                            @let done = if erase { p.bytes_written } else { p.bytes_fetched };
                            tr { th { "progress" } td {
                                progress #install-progress max=(total.max(1)) value=(done.min(total.max(1))) {}
                                " "
                                span #install-bytes {
                                    @if erase {
                                        (bytes(p.bytes_written)) " of "
                                        @if total > 0 { (bytes(total)) } @else { "?" }
                                        " erased (written or discarded)"
                                    } @else {
                                        (bytes(p.bytes_fetched)) " of "
                                        @if total > 0 { (bytes(total)) } @else { "?" }
                                        " fetched, " (bytes(p.bytes_written)) " written"
                                    }
                                }
                            } }
                            tr { th { "rate" } td #install-rate {
                                (bytes(p.rate_bytes_per_second)) "/s"
                                @if erase { " erased" } @else { " fetched" }
                            } }
                            @if p.bytes_from_peers > 0 || p.chunks_refused > 0 {
                                tr { th { "from peers" } td #install-peers {
                                    (bytes(p.bytes_from_peers)) " from other machines installing the image"
                                    @if p.chunks_refused > 0 { "; " (p.chunks_refused) " chunks refused (wrong) and fetched again" }
                                } }
                            }
                            tr { th { "disk" } td #install-disk { (p.disk) } }
                            tr { th { "reported" } td {
                                (rfc3339(*at))
                                @if p.resumes > 0 { "; the download was resumed " (p.resumes) " times" }
                            } }
                        }
                        @if let Some((r, e)) = &i.result {
                            tr { th { "result" } td #install-result { (r) } }
                            @if let Some(e) = e {
                                tr.failed { th { "error" } td #install-error { (e) } }
                            }
                        }
                    }
                    table #install-history {
                        tr { th { "time" } th { "generation" } th { "event" } th { "detail" } }
                        @for h in &i.history {
                            tr.install-event {
                                td { (rfc3339(h.timestamp)) }
                                td { (h.generation) }
                                td { (h.event) }
                                td { (h.detail.as_deref().unwrap_or("")) }
                            }
                        }
                    }
                },
            }
            @if let Some(csrf) = &csrf {
                @if Operation::Install.allows(d.summary.state) {
                    form method="post" action={ (mid) "/install" } #form-install {
                        (super::pages::csrf_field(csrf))
                        (image_fields(admin))
                        details {
                            summary { "first boot (cloud-init NoCloud)" }
                            label { "host name " input name="hostname" size="16"; } " "
                            label { "SSH keys " textarea name="ssh_keys" rows="2" cols="40" {} } " "
                            label { "user-data " textarea name="user_data" rows="4" cols="40" placeholder="#cloud-config" {} }
                        }
                        input type="text" name="reason" placeholder="reason" size="20";
                        " "
                        button type="submit" #button-install { "Install" }
                    }
                }
                @if Operation::Deprovision.allows(d.summary.state) {
                    form method="post" action={ (mid) "/deprovision" } #form-deprovision {
                        (super::pages::csrf_field(csrf))
                        label { "erase "
                            select name="mode" {
                                option { "metadata" } option { "discard" } option { "secure" } option { "overwrite" }
                            }
                        }
                        " "
                        input type="text" name="reason" placeholder="reason" size="20";
                        " "
                        button type="submit" #button-deprovision { "Deprovision" }
                    }
                }
            }
        }
    }
}

/// The install and rollout forms, as posted.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct ImageForm {
    pub(super) csrf: String,
    #[serde(default)]
    pub(super) served: String,
    #[serde(default)]
    pub(super) url: String,
    #[serde(default)]
    pub(super) digest: String,
    #[serde(default)]
    pub(super) disk_serial: String,
    #[serde(default)]
    pub(super) disk_min_bytes: String,
    #[serde(default)]
    pub(super) reboot: Option<String>,
    #[serde(default)]
    pub(super) efi: Option<String>,
    #[serde(default)]
    pub(super) deadline: String,
    #[serde(default)]
    pub(super) reason: String,
    // One machine's first boot.
    #[serde(default)]
    pub(super) hostname: String,
    #[serde(default)]
    pub(super) ssh_keys: String,
    #[serde(default)]
    pub(super) user_data: String,
    // Rollouts only.
    #[serde(default)]
    pub(super) max_parallel: String,
    #[serde(default)]
    pub(super) max_failures: String,
    #[serde(default)]
    pub(super) state: String,
    #[serde(default)]
    pub(super) provider_status: String,
    #[serde(default)]
    pub(super) heartbeat: String,
    #[serde(default)]
    pub(super) q: String,
    #[serde(default)]
    pub(super) location: String,
    #[serde(default)]
    pub(super) project: String,
    #[serde(default)]
    pub(super) bmc: String,
    #[serde(default)]
    pub(super) boot: String,
    #[serde(default)]
    pub(super) plan: String,
}

impl auth::Form for ImageForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// A checkbox's value: checked or not.
fn checked(v: &Option<String>) -> bool {
    v.as_deref().is_some_and(|v| v == "true" || v == "on")
}

pub(super) fn some(s: &str) -> Option<String> {
    Some(s.trim().to_string()).filter(|s| !s.is_empty())
}

impl ImageForm {
    pub(super) fn image(&self) -> Result<ImageBody, String> {
        let min = match some(&self.disk_min_bytes) {
            None => None,
            Some(s) => Some(
                s.parse::<i64>()
                    .map_err(|_| format!("disk at least: {s:?} is not a number of bytes"))?,
            ),
        };
        let disk = (some(&self.disk_serial).is_some() || min.is_some()).then(|| DiskBody {
            serial: some(&self.disk_serial),
            min_size_bytes: min,
            ..DiskBody::default()
        });
        let first_boot = (some(&self.hostname).is_some()
            || some(&self.ssh_keys).is_some()
            || some(&self.user_data).is_some())
        .then(|| {
            let q = |v: &str| serde_json::Value::from(v).to_string();
            let mut meta = String::new();
            if let Some(h) = some(&self.hostname) {
                meta += &format!("local-hostname: {}\n", q(&h));
            }
            let keys: Vec<&str> = self
                .ssh_keys
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            if !keys.is_empty() {
                meta += "public-keys:\n";
                for k in keys {
                    meta += &format!("  - {}\n", q(k));
                }
            }
            let mut files = std::collections::BTreeMap::new();
            files.insert("meta-data".to_string(), meta);
            files.insert(
                "user-data".to_string(),
                some(&self.user_data)
                    .map(|u| u.replace("\r\n", "\n") + "\n")
                    .unwrap_or_else(|| "#cloud-config\n{}\n".into()),
            );
            super::installs::FirstBootBody {
                nocloud: Some(files),
                ..Default::default()
            }
        });
        Ok(ImageBody {
            url: some(&self.url),
            served: some(&self.served),
            digest: some(&self.digest),
            disk,
            reboot: checked(&self.reboot),
            set_efi_boot_entry: checked(&self.efi),
            deadline: some(&self.deadline),
            first_boot,
            ..ImageBody::default()
        })
    }
}

/// `POST /machines/{id}/install` from the machine page.
pub(super) async fn install_form(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
    form: web::Bytes,
) -> HttpResponse {
    let (form, operator, back) =
        attempt!(auth::machine_form::<ImageForm>(&admin, &req, &form, &id));
    let image = match form.image() {
        Ok(i) => i,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e, &back),
    };
    let body = InstallBody {
        image: Some(image),
        reason: some(&form.reason),
        request_id: None,
    };
    match installs::install(&admin, &operator, &id, body).await {
        Ok((_, a)) => back_to_machine(&req, "install", a.id, "installation"),
        Err(e) => error_page(e.status(), &e.to_string(), &back),
    }
}

/// The machine page's deprovisioning form, as posted.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct DeprovisionForm {
    csrf: String,
    #[serde(default)]
    mode: String,
    #[serde(default)]
    reason: String,
}

impl auth::Form for DeprovisionForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// `POST /machines/{id}/deprovision` from the machine page.
pub(super) async fn deprovision_form(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
    form: web::Bytes,
) -> HttpResponse {
    let (form, operator, back) = attempt!(auth::machine_form::<DeprovisionForm>(
        &admin, &req, &form, &id
    ));
    let body = installs::DeprovisionBody {
        mode: some(&form.mode),
        reason: some(&form.reason),
        ..Default::default()
    };
    match installs::deprovision(&admin, &operator, &id, body).await {
        Ok((_, a)) => back_to_machine(&req, "deprovision", a.id, "installation"),
        Err(e) => error_page(e.status(), &e.to_string(), &back),
    }
}
