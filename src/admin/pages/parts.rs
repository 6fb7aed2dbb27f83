//! What the pages share: how long ago, a select's options, the operator
//! and a form's CSRF field.

use std::time::{Duration, SystemTime};

use actix_web::{HttpMessage, HttpRequest};
use maud::{Markup, html};

use super::super::state::Operator;

/// How long ago `t` was, to the second ("3m 12s ago").
pub(in super::super) fn ago(t: SystemTime) -> String {
    match SystemTime::now().duration_since(t) {
        Ok(d) => format!(
            "{} ago",
            humantime::format_duration(Duration::from_secs(d.as_secs()))
        ),
        Err(_) => "just now".into(),
    }
}

/// A `<select>`'s options: "any" (empty), then one per value, the chosen
/// one selected.
pub(in super::super) fn options<T: PartialEq + Copy>(
    values: impl IntoIterator<Item = (T, String)>,
    selected: Option<T>,
) -> Markup {
    let values: Vec<(T, String)> = values.into_iter().collect();
    let chosen = values
        .iter()
        .find(|(v, _)| Some(*v) == selected)
        .map(|(_, l)| l.clone());
    labeled_options(
        values.into_iter().map(|(_, l)| (l.clone(), l)),
        chosen.as_deref(),
    )
}

/// A `<select>`'s options where a value is not its label (a project's ID
/// and name): "any" (empty), then one per value, the chosen one selected.
pub(in super::super) fn labeled_options(
    values: impl IntoIterator<Item = (String, String)>,
    selected: Option<&str>,
) -> Markup {
    html! {
        option value="" { "any" }
        @for (v, label) in values {
            option value=(v) selected[selected == Some(v.as_str())] { (label) }
        }
    }
}

pub(in super::super) fn req_operator(req: &HttpRequest) -> Option<Operator> {
    req.extensions().get::<Operator>().cloned()
}

/// A form's hidden CSRF field.
pub(in super::super) fn csrf_field(token: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(token); }
}
