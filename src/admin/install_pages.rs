//! The pages' side of installations: a machine's installation (image, who
//! asked, phase, progress bar, rate, result, error) and the form that asks
//! for one; the rollouts page (the latest rollouts, and the form that rolls
//! an image over the fleet page's filtered set) and a rollout's page (its
//! counts and machines, a cancel button). Forms post through the same
//! functions as the API, with the pages' CSRF tokens.
//!
//! Long on purpose: HTML written out for two pages and their forms, each
//! piece beside the one it renders.

use std::fmt::Write as _;

use actix_web::http::StatusCode;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};

use super::api::phase_name;
use super::auth;
use super::html::{back_to_machine, error_page, esc, page};
use super::installs::{self, DiskBody, ImageBody, InstallBody, RolloutBody};
use super::request::internal;
use super::state::{Admin, Operator};
use super::text::rfc3339;
use crate::bmdb::installations::Kind;
use crate::bmdb::machines::MachineDetail;

/// What the rollouts' forms' CSRF tokens are bound to.
const ROLLOUT_FORMS: &str = "rollouts";

fn bytes(n: i64) -> String {
    shepherd_proto::summary::bytes(n.max(0))
}

/// The served images as `<option>`s (none when shepherd serves none).
fn served_options(admin: &Admin) -> String {
    let Some(c) = &admin.images else {
        return String::new();
    };
    let mut s = String::from("<option value=\"\">(a URL below)</option>");
    for (name, size) in c.list().unwrap_or_default() {
        let _ = write!(
            s,
            "<option value=\"{n}\">{n} ({})</option>",
            bytes(size as i64),
            n = esc(&name)
        );
    }
    s
}

/// The image fields of the install and rollout forms.
fn image_fields(admin: &Admin) -> String {
    let mut b = String::new();
    let served = served_options(admin);
    if !served.is_empty() {
        let _ = write!(
            b,
            "<label>served image <select name=\"served\">{served}</select></label> or "
        );
    }
    b.push_str(
        "<label>URL <input name=\"url\" size=\"40\" placeholder=\"https://…/image.raw.zst\"></label> \
         <label>digest <input name=\"digest\" size=\"24\" placeholder=\"sha256:…\"></label><br>\
         <label>disk serial <input name=\"disk_serial\" size=\"14\"></label> \
         <label>disk at least <input name=\"disk_min_bytes\" size=\"12\" placeholder=\"bytes\"></label> \
         <label><input type=\"checkbox\" name=\"reboot\" value=\"true\"> reboot when done</label> \
         <label><input type=\"checkbox\" name=\"efi\" value=\"true\"> first EFI boot entry</label> \
         <label>deadline <input name=\"deadline\" size=\"5\" placeholder=\"2h\"></label> ",
    );
    b
}

/// The machine page's installation section.
pub(super) fn machine_section(
    admin: &Admin,
    d: &MachineDetail,
    operator: Option<&Operator>,
) -> String {
    let mid = d.summary.machine_id.to_string();
    let mut b = String::from("<section id=\"installation\"><h2>Installation</h2>");
    match &d.installation {
        None => b.push_str("<p class=\"muted\" id=\"install-none\">No installation asked yet.</p>"),
        Some(i) => {
            let what = if i.kind == Kind::Erase {
                format!(
                    "erase ({})",
                    esc(i.erase_mode.as_deref().unwrap_or("metadata"))
                )
            } else {
                format!(
                    "{}<br><span class=\"muted\">{}</span>{}",
                    esc(&i.image_url),
                    esc(&i.image_digest),
                    i.first_boot
                        .as_deref()
                        .map(|f| format!(
                            "<br><span id=\"install-first-boot\">first boot: {}</span>",
                            esc(f)
                        ))
                        .unwrap_or_default()
                )
            };
            let _ = write!(
                b,
                "<table id=\"install\"><tr><th>generation</th><td>{}</td></tr>\
                 <tr><th>{}</th><td id=\"install-image\">{}</td></tr>\
                 <tr><th>asked by</th><td id=\"install-by\">{} at {}{}</td></tr>\
                 <tr><th>state</th><td id=\"install-state\">{}</td></tr>",
                i.generation,
                if i.kind == Kind::Erase {
                    "deprovisioning"
                } else {
                    "image"
                },
                what,
                esc(&i.requested_by),
                rfc3339(i.requested_at),
                i.rollout_id
                    .map(|r| format!(" (rollout <a href=\"../rollouts/{r}\">{r}</a>)"))
                    .unwrap_or_default(),
                esc(&i.state),
            );
            if let Some((p, at)) = &i.progress {
                let total = p.bytes_total.max(0);
                let _ = write!(
                    b,
                    "<tr><th>phase</th><td id=\"install-phase\">{}</td></tr>\
                     <tr><th>progress</th><td><progress id=\"install-progress\" max=\"{}\" value=\"{}\"></progress> \
                     <span id=\"install-bytes\">{} of {} fetched, {} written</span></td></tr>\
                     <tr><th>rate</th><td id=\"install-rate\">{}/s</td></tr>\
                     <tr><th>disk</th><td id=\"install-disk\">{}</td></tr>\
                     <tr><th>reported</th><td>{}{}</td></tr>",
                    phase_name(p.phase),
                    total.max(1),
                    p.bytes_fetched.min(total.max(1)),
                    bytes(p.bytes_fetched),
                    if total > 0 { bytes(total) } else { "?".into() },
                    bytes(p.bytes_written),
                    bytes(p.rate_bytes_per_second),
                    esc(&p.disk),
                    rfc3339(*at),
                    if p.resumes > 0 {
                        format!("; the download was resumed {} times", p.resumes)
                    } else {
                        String::new()
                    },
                );
            }
            if let Some((r, e)) = &i.result {
                let _ = write!(
                    b,
                    "<tr><th>result</th><td id=\"install-result\">{r}</td></tr>"
                );
                if let Some(e) = e {
                    let _ = write!(
                        b,
                        "<tr class=\"failed\"><th>error</th><td id=\"install-error\">{}</td></tr>",
                        esc(e)
                    );
                }
            }
            b.push_str("</table><table id=\"install-history\"><tr><th>time</th><th>generation</th><th>event</th><th>detail</th></tr>");
            for h in &i.history {
                let _ = write!(
                    b,
                    "<tr class=\"install-event\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    rfc3339(h.timestamp),
                    h.generation,
                    esc(&h.event),
                    esc(h.detail.as_deref().unwrap_or(""))
                );
            }
            b.push_str("</table>");
        }
    }
    use crate::bmdb::lifecycle::Operation;
    if let Some(op) = operator {
        if Operation::Install.allows(d.summary.state) {
            let _ = write!(
                b,
                "<form method=\"post\" action=\"{mid}/install\" id=\"form-install\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{}\">{}\
                 <details><summary>first boot (cloud-init NoCloud)</summary>\
                 <label>host name <input name=\"hostname\" size=\"16\"></label> \
                 <label>SSH keys <textarea name=\"ssh_keys\" rows=\"2\" cols=\"40\"></textarea></label> \
                 <label>user-data <textarea name=\"user_data\" rows=\"4\" cols=\"40\" placeholder=\"#cloud-config\"></textarea></label>\
                 </details>\
                 <input type=\"text\" name=\"reason\" placeholder=\"reason\" size=\"20\"> \
                 <button type=\"submit\" id=\"button-install\">Install</button></form>",
                admin.csrf.token(op, &mid),
                image_fields(admin)
            );
        }
        if Operation::Deprovision.allows(d.summary.state) {
            let _ = write!(
                b,
                "<form method=\"post\" action=\"{mid}/deprovision\" id=\"form-deprovision\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
                 <label>erase <select name=\"mode\"><option>metadata</option><option>discard</option>\
                 <option>secure</option><option>overwrite</option></select></label> \
                 <input type=\"text\" name=\"reason\" placeholder=\"reason\" size=\"20\"> \
                 <button type=\"submit\" id=\"button-deprovision\">Deprovision</button></form>",
                admin.csrf.token(op, &mid),
            );
        }
    }
    b.push_str("</section>");
    b
}

/// The install and rollout forms, as posted.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct ImageForm {
    csrf: String,
    #[serde(default)]
    served: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    digest: String,
    #[serde(default)]
    disk_serial: String,
    #[serde(default)]
    disk_min_bytes: String,
    #[serde(default)]
    reboot: Option<String>,
    #[serde(default)]
    efi: Option<String>,
    #[serde(default)]
    deadline: String,
    #[serde(default)]
    reason: String,
    // One machine's first boot.
    #[serde(default)]
    hostname: String,
    #[serde(default)]
    ssh_keys: String,
    #[serde(default)]
    user_data: String,
    // Rollouts only.
    #[serde(default)]
    max_parallel: String,
    #[serde(default)]
    max_failures: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    provider_status: String,
    #[serde(default)]
    heartbeat: String,
    #[serde(default)]
    q: String,
}

impl auth::Form for ImageForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

impl auth::Form for CancelForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// A checkbox's value: checked or not.
fn checked(v: &Option<String>) -> bool {
    v.as_deref().is_some_and(|v| v == "true" || v == "on")
}

fn some(s: &str) -> Option<String> {
    Some(s.trim().to_string()).filter(|s| !s.is_empty())
}

impl ImageForm {
    fn image(&self) -> Result<ImageBody, String> {
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

pub(super) fn form_operator(req: &HttpRequest) -> Option<Operator> {
    req.extensions().get::<Operator>().cloned()
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

/// The fleet page's rollout form for the machines its filters show.
pub(super) fn fleet_rollout_form(
    admin: &Admin,
    operator: Option<&Operator>,
    filters: &[(&str, Option<&str>)],
    matching: i64,
) -> String {
    let Some(op) = operator else {
        return String::new();
    };
    let mut b = format!(
        "<details id=\"rollout-form\"><summary>Install an image on these {matching} machines (a rollout)</summary>\
         <form method=\"post\" action=\"rollouts\" id=\"form-rollout\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        admin.csrf.token(op, ROLLOUT_FORMS)
    );
    for (k, v) in filters {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            let _ = write!(
                b,
                "<input type=\"hidden\" name=\"{k}\" value=\"{}\">",
                esc(v)
            );
        }
    }
    let _ = write!(
        b,
        "{}<br><label>at once <input name=\"max_parallel\" size=\"3\" value=\"1\"></label> \
         <label>stop after more than <input name=\"max_failures\" size=\"3\" value=\"0\"> failures</label> \
         <button type=\"submit\" id=\"button-rollout\">Start the rollout</button></form></details>",
        image_fields(admin)
    );
    b
}

/// `POST /rollouts` from the fleet page.
pub(super) async fn rollout_form(
    admin: web::Data<Admin>,
    req: HttpRequest,
    form: web::Bytes,
) -> HttpResponse {
    let back = "./".to_string();
    let (form, operator) = attempt!(auth::checked_form::<ImageForm>(
        &admin,
        &req,
        &form,
        ROLLOUT_FORMS,
        &back
    ));
    let image = match form.image() {
        Ok(i) => i,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e, &back),
    };
    let number = |what: &str, s: &str| -> Result<Option<i32>, String> {
        match some(s) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| format!("{what}: {v:?} is not a number")),
        }
    };
    let (max_parallel, max_failures) = match (
        number("at once", &form.max_parallel),
        number("failures", &form.max_failures),
    ) {
        (Ok(p), Ok(f)) => (p, f),
        (Err(e), _) | (_, Err(e)) => return error_page(StatusCode::BAD_REQUEST, &e, &back),
    };
    let body = RolloutBody {
        image: Some(image),
        deprovision: None,
        max_parallel,
        max_failures,
        machines: None,
        state: some(&form.state),
        provider_status: some(&form.provider_status),
        heartbeat: some(&form.heartbeat),
        q: some(&form.q),
        request_id: None,
    };
    match installs::create_rollout(&admin, &operator, body).await {
        Ok(r) => HttpResponse::SeeOther()
            .insert_header((
                "Location",
                format!("{}/{}", req.path().trim_end_matches('/'), r.id),
            ))
            .finish(),
        Err(e) => error_page(e.status(), &e.to_string(), &back),
    }
}

fn counts_html(c: &crate::bmdb::rollouts::Counts) -> String {
    format!(
        "<span class=\"counts\"><span data-count=\"done\">{} done</span>, <span data-count=\"running\">{} running</span>, \
         <span data-count=\"failed\">{} failed</span>, <span data-count=\"waiting\">{} waiting</span>, \
         <span data-count=\"skipped\">{} skipped</span></span>",
        c.done, c.running, c.failed, c.waiting, c.skipped
    )
}

/// `GET /rollouts`: the latest rollouts.
pub(super) async fn rollouts_page(admin: web::Data<Admin>) -> HttpResponse {
    let list = match admin
        .bmdb
        .transact(async |tx| crate::bmdb::rollouts::list(tx, 100).await)
        .await
    {
        Ok(l) => l,
        Err(e) => return internal(e),
    };
    let mut b = String::from(
        "<p><a href=\"./\">fleet</a></p><p class=\"muted\">Start a rollout from the fleet page: \
         filter the machines, then install an image on them.</p><table id=\"rollouts\">\
         <tr><th>rollout</th><th>state</th><th>machines</th><th>image</th><th>selection</th><th>by</th><th>created</th></tr>",
    );
    for r in &list {
        let _ = write!(
            b,
            "<tr data-rollout=\"{id}\"><td><a href=\"rollouts/{id}\">{id}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.state),
            counts_html(&r.counts),
            esc(&r.image_url),
            esc(&r.selection),
            esc(&r.created_by),
            rfc3339(r.created_at),
            id = r.id,
        );
    }
    if list.is_empty() {
        b.push_str("<tr><td colspan=\"7\" class=\"muted\">no rollout yet</td></tr>");
    }
    b.push_str("</table>");
    page("shepherd: rollouts", &b, true)
}

/// `GET /rollouts/{id}`: one rollout, its machines, a cancel button.
pub(super) async fn rollout_page(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
) -> HttpResponse {
    let (r, members) = match installs::load_rollout(&admin, &id).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let mut b = format!(
        "<p><a href=\"../\">fleet</a> · <a href=\"../rollouts\">rollouts</a></p>\
         <table id=\"rollout\"><tr><th>state</th><td id=\"rollout-state\">{}</td></tr>\
         <tr><th>machines</th><td id=\"rollout-counts\">{}</td></tr>\
         <tr><th>image</th><td>{}</td></tr><tr><th>selection</th><td>{}</td></tr>\
         <tr><th>at once</th><td>{}</td></tr><tr><th>stops after</th><td>more than {} failures</td></tr>\
         <tr><th>by</th><td>{} at {}</td></tr>",
        esc(&r.state),
        counts_html(&r.counts),
        esc(&r.image_url),
        esc(&r.selection),
        r.max_parallel,
        r.max_failures,
        esc(&r.created_by),
        rfc3339(r.created_at),
    );
    if let Some(why) = &r.end_reason {
        let _ = write!(
            b,
            "<tr><th>ended</th><td id=\"rollout-end\">{}: {}</td></tr>",
            r.ended_at.map(rfc3339).unwrap_or_default(),
            esc(why)
        );
    }
    b.push_str("</table>");
    if r.state == "running" {
        if let Some(op) = form_operator(&req) {
            let _ = write!(
                b,
                "<form method=\"post\" action=\"{}/cancel\" id=\"form-cancel\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
                 <button type=\"submit\" id=\"button-cancel\">Cancel (machines installing finish)</button></form>",
                r.id,
                admin.csrf.token(&op, ROLLOUT_FORMS)
            );
        }
    }
    b.push_str("<table id=\"rollout-machines\"><tr><th>#</th><th>machine</th><th>state</th><th>generation</th><th>started</th><th>ended</th><th>error</th></tr>");
    for m in &members {
        let _ = write!(
            b,
            "<tr data-state=\"{s}\"><td>{}</td><td><a href=\"../machines/{id}\">{id}</a></td><td>{s}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            m.position,
            m.generation.map(|g| g.to_string()).unwrap_or_default(),
            m.started_at.map(rfc3339).unwrap_or_default(),
            m.ended_at.map(rfc3339).unwrap_or_default(),
            esc(m.error.as_deref().unwrap_or("")),
            s = esc(&m.state),
            id = m.machine_id,
        );
    }
    b.push_str("</table>");
    page(&format!("shepherd: rollout {}", r.id), &b, true)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CancelForm {
    csrf: String,
}

/// `POST /rollouts/{id}/cancel` from a rollout's page.
pub(super) async fn cancel_form(
    admin: web::Data<Admin>,
    req: HttpRequest,
    id: web::Path<String>,
    form: web::Bytes,
) -> HttpResponse {
    let back = format!("../{}", esc(&id));
    let (_, operator) = attempt!(auth::checked_form::<CancelForm>(
        &admin,
        &req,
        &form,
        ROLLOUT_FORMS,
        &back
    ));
    match installs::cancel_rollout(&admin, &operator, &id).await {
        Ok(r) => HttpResponse::SeeOther()
            .insert_header((
                "Location",
                format!(
                    "{}/{}",
                    req.path().trim_end_matches(&format!("/{}/cancel", r.id)),
                    r.id
                ),
            ))
            .finish(),
        Err(resp) => resp,
    }
}
