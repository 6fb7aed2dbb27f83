//! The pages' shell: escaping, the one style sheet, a whole page, an error
//! page and the login form. Below both the pages and the login that
//! `auth` serves, so neither reaches the other for it.

use actix_web::HttpResponse;

/// Pages reload themselves this often.
pub const REFRESH_SECONDS: u32 = 30;

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:2em;color:#222}\
    table{border-collapse:collapse;margin:.5em 0}\
    td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}\
    th{background:#f4f4f4}.failed{color:#a00}.operator{background:#fff8e0}\
    .held{background:#fde8c8}.notice{padding:.5em 1em;border:1px solid #e0b050;background:#fff8e0}\
    .error{padding:.5em 1em;border:1px solid #c33;background:#fde8e8}\
    form.filters{margin:1em 0}form.filters label{margin-right:1em}\
    .actions form{display:inline-block;margin:0 1em .5em 0;padding:.5em;border:1px solid #ddd}\
    section{margin-top:1.5em}.row{display:flex;flex-wrap:wrap;gap:0 2em;align-items:flex-start}.row>*{max-width:36em}.row>#activity{max-width:none}.muted{color:#777}nav a{margin-right:1em}\
    .chart text{font:11px system-ui,sans-serif;fill:#444}";

/// A whole page. `refresh`: reload itself every `REFRESH_SECONDS`.
pub fn html(title: &str, body: &str, refresh: bool) -> String {
    let refresh = if refresh {
        format!("<meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">")
    } else {
        String::new()
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">{refresh}\
         <meta name=\"viewport\" content=\"width=device-width\"><title>{t}</title>\
         <style>{STYLE}</style></head><body><h1>{t}</h1>{body}</body></html>",
        t = esc(title)
    )
}

pub fn page(title: &str, body: &str, refresh: bool) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(html(title, body, refresh))
}

/// After a machine page's form: back to the machine's page (the posted
/// path without its last segment, `action`, wherever the routes are
/// mounted), showing what was done (`done`) at `anchor`.
pub fn back_to_machine(
    req: &actix_web::HttpRequest,
    action: &str,
    done: uuid::Uuid,
    anchor: &str,
) -> HttpResponse {
    let page = req.path().trim_end_matches(action).trim_end_matches('/');
    HttpResponse::SeeOther()
        .insert_header(("Location", format!("{page}?done={done}#{anchor}")))
        .finish()
}

pub fn error_page(status: actix_web::http::StatusCode, message: &str, back: &str) -> HttpResponse {
    let body = format!(
        "<p class=\"error\" id=\"error\">{}</p><p><a href=\"{}\">back</a></p>",
        esc(message),
        esc(back)
    );
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .body(html("shepherd: not done", &body, false))
}

/// The login form (for servers with tokens).
pub fn login_form(root: &str, error: Option<&str>) -> String {
    let error = error
        .map(|e| format!("<p class=\"error\">{}</p>", esc(e)))
        .unwrap_or_default();
    html(
        "shepherd: log in",
        &format!(
            "{error}<form method=\"post\" action=\"{root}login\">\
             <label>Admin token <input type=\"password\" name=\"token\" autocomplete=\"current-password\" required></label> \
             <button type=\"submit\">Log in</button></form>\
             <p class=\"muted\">Or send <code>Authorization: Bearer &lt;token&gt;</code>.</p>",
            root = esc(root)
        ),
        false,
    )
}
