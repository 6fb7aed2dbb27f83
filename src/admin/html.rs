//! The pages' shell: the one style sheet, a whole page, an error page and
//! the login form. Below both the pages and the login that `auth` serves,
//! so neither reaches the other for it.
//!
//! Every page is written with maud's `html!`: what a page splices in is
//! escaped by construction (`(value)`), so no field an operator or a
//! tenant sets can become markup. Nothing here builds HTML from strings;
//! `PreEscaped` holds only constants of this crate (the style sheet, the
//! pages' script).

use actix_web::HttpResponse;
use maud::{DOCTYPE, Markup, PreEscaped, html};

/// Pages without the live updates (no script) reload this often.
pub const REFRESH_SECONDS: u32 = 30;

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:2em;color:#222}\
    table{border-collapse:collapse;margin:.5em 0}\
    td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}\
    th{background:#f4f4f4}.failed{color:#a00}.operator{background:#fff8e0}\
    .held{background:#fde8c8}.notice{padding:.5em 1em;border:1px solid #e0b050;background:#fff8e0}\
    .error{padding:.5em 1em;border:1px solid #c33;background:#fde8e8}\
    form.filters{margin:1em 0}form.filters label{margin-right:1em}\
    .actions form{display:inline-block;margin:0 1em .5em 0;padding:.5em;border:1px solid #ddd}\
    section{margin-top:1.5em}.row{display:flex;flex-wrap:wrap;gap:0 2em;align-items:flex-start}.row>*{max-width:36em}.row>#activity,.row>#overview{max-width:none}.muted{color:#777}nav a{margin-right:1em}\
    .chart text{font:11px system-ui,sans-serif;fill:#444}progress{width:12em}";

/// A whole page. `refresh`: reload itself every `REFRESH_SECONDS`.
pub fn document(title: &str, body: Markup, refresh: bool) -> Markup {
    shell(
        title,
        body,
        if refresh { Live::Reload } else { Live::Still },
    )
}

/// How a page keeps up with the fleet.
enum Live {
    Still,
    /// Reloads every `REFRESH_SECONDS`.
    Reload,
    /// Runs this script (a constant of the crate), which keeps it up to
    /// date; reloads without scripts.
    Script(&'static str),
}

fn shell(title: &str, body: Markup, live: Live) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                @match live {
                    Live::Reload => { meta http-equiv="refresh" content=(REFRESH_SECONDS); },
                    Live::Script(_) => {
                        noscript { meta http-equiv="refresh" content=(REFRESH_SECONDS); }
                    },
                    Live::Still => {},
                }
                meta name="viewport" content="width=device-width";
                title { (title) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                h1 { (title) }
                (body)
                @if let Live::Script(js) = live {
                    script { (PreEscaped(js)) }
                }
            }
        }
    }
}

/// A page kept up to date by `script` (a constant of the crate), which
/// reloads every `REFRESH_SECONDS` where scripts do not run.
pub fn live_page(title: &str, body: Markup, script: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(shell(title, body, Live::Script(script)).into_string())
}

pub fn page(title: &str, body: Markup, refresh: bool) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(document(title, body, refresh).into_string())
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
    let body = html! {
        p.error #error { (message) }
        p { a href=(back) { "back" } }
    };
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .body(document("shepherd: not done", body, false).into_string())
}

/// The login form (for servers with tokens).
pub fn login_form(root: &str, error: Option<&str>) -> String {
    let body = html! {
        @if let Some(e) = error {
            p.error { (e) }
        }
        form method="post" action={ (root) "login" } {
            label {
                "Admin token "
                input type="password" name="token" autocomplete="current-password" required;
            }
            " "
            button type="submit" { "Log in" }
        }
        p.muted { "Or send " code { "Authorization: Bearer <token>" } "." }
    };
    document("shepherd: log in", body, false).into_string()
}
