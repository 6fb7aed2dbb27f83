//! The fleet page's machines: the filters (state, provider status,
//! heartbeat, location, project, BMC, boot path, plan, text), paging, the
//! table, and the selection that bulk actions take (`bulk.rs` confirms and
//! acts).

use maud::{Markup, html};
use uuid::Uuid;

use super::super::request::Page;
use super::parts::{labeled_options, options};
use crate::bmdb::ProviderStatus;
use crate::bmdb::actions::Action;
use crate::bmdb::machines::{BmcKind, FleetFilter, Heartbeat, Listing, MachineState};
use crate::config::BootMethod;

/// What the filters offer besides the fixed lists.
pub(super) struct Choices {
    /// Every project's ID and name.
    pub projects: Vec<(Uuid, String)>,
    /// The configured plans' slugs.
    pub plans: Vec<String>,
}

/// A query string of these pairs.
fn query_string<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    format!("?{}", s.finish())
}

/// The query string of a fleet page with `offset` (its filters and page
/// size kept).
fn page_query(q: &Page, offset: i64) -> String {
    let (limit, offset) = (q.limit.map(|l| l.to_string()), offset.to_string());
    let paging = [
        limit.as_deref().map(|l| ("limit", l)),
        (offset != "0").then_some(("offset", offset.as_str())),
    ];
    query_string(q.given().into_iter().chain(paging.into_iter().flatten()))
}

/// The fleet in `state`, the other filters kept (a click on the drawn
/// life cycle or the counts narrows what is shown).
pub(super) fn in_state(q: &Page, state: MachineState) -> String {
    let others = q.given().into_iter().filter(|(k, _)| *k != "state");
    query_string(others.chain([("state", state.as_str())]))
}

/// The filter form: a plain GET form.
fn filters(q: &Page, filter: &FleetFilter, choices: &Choices) -> Markup {
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    html! {
        form.filters method="get" action="" {
            label { "state " select name="state" {
                (options(MachineState::ALL.map(|s| (s, s.to_string())), filter.state))
            } }
            label { "provider status " select name="provider_status" {
                (options(ProviderStatus::ALL.map(|s| (s, s.to_string())), filter.provider_status))
            } }
            label { "heartbeat " select name="heartbeat" {
                (options(Heartbeat::ALL.map(|h| (h, h.as_str().to_string())), filter.heartbeat))
            } }
            label { "plan " select name="plan" {
                (labeled_options(choices.plans.iter().map(|p| (p.clone(), p.clone())), filter.plan.as_deref()))
            } }
            label { "project " select name="project" {
                (labeled_options(
                    choices.projects.iter().map(|(id, name)| (id.to_string(), name.clone())),
                    q.project.as_deref(),
                ))
            } }
            label { "BMC " select name="bmc" {
                (options(BmcKind::ALL.map(|b| (b, b.as_str().to_string())), filter.bmc))
            } }
            label { "boot " select name="boot" {
                (options(BootMethod::ALL.map(|b| (b, b.as_str().to_string())), filter.boot))
            } }
            label { "location "
                input name="location" value=(text(&q.location)) size="10";
            }
            label { "search "
                input type="search" name="q" value=(text(&q.q))
                    placeholder="machine ID, provider ID, address" size="32";
            }
            button type="submit" { "Show" }
            " "
            a href="./" { "clear" }
        }
    }
}

/// The bulk actions' form: the checked rows go with it (their boxes name
/// it), to a page that lists them and asks to confirm.
fn bulk_form() -> Markup {
    html! {
        form #bulk method="get" action="bulk" {
            label { "With the checked machines: "
                select name="action" #bulk-action {
                    @for a in Action::ACTIONS {
                        option value=(a.as_str()) { (a.label()) }
                    }
                }
            }
            " "
            button type="submit" #button-bulk { "Review…" }
        }
    }
}

/// The machines: the filter form, paging, the bulk form and the table.
pub(super) fn machines_section(
    q: &Page,
    filter: &FleetFilter,
    listing: &Listing,
    (offset, limit): (i64, i64),
    choices: &Choices,
) -> Markup {
    let list = &listing.machines;
    let matching = listing.matching;
    let shown_to = offset + list.len() as i64;
    html! {
        section #machines {
            h2 { "Machines" }
            (filters(q, filter, choices))
            @if list.is_empty() {
                p #matching { "no machines match" @if offset > 0 { " on this page" } }
            } @else {
                p #matching {
                    span #match-count { (matching) } " matching; showing " (offset + 1) " to " (shown_to)
                }
                (bulk_form())
            }
            p.paging {
                @if offset > 0 {
                    a rel="prev" href=(page_query(q, (offset - limit).max(0))) { "previous" }
                    " "
                }
                @if shown_to < matching.count || matching.more {
                    a rel="next" href=(page_query(q, shown_to)) { "next" }
                }
            }
            table #machine-list {
                tr {
                    th { input type="checkbox" #check-all title="all on this page" hidden; }
                    th { "machine" } th { "provider ID" } th { "address" } th { "provider status" }
                    th { "state" } th { "last heartbeat" } th { "tenant" }
                }
                @for m in list {
                    tr.machine.held[m.state == MachineState::Held] data-machine=(m.machine_id) {
                        td { input type="checkbox" name="machine" value=(m.machine_id) form="bulk"; }
                        td { a href={ "machines/" (m.machine_id) } { (m.machine_id) } }
                        td { (m.provider_id.as_deref().unwrap_or("-")) }
                        td { (m.address.as_deref().unwrap_or("-")) }
                        td { @match m.provider_status { Some(s) => (s), None => "-" } }
                        td.state { (m.state) }
                        td { @match m.agent_heartbeat { Some(t) => (super::parts::ago(t)), None => "-" } }
                        td.tenant {
                            @match listing.tenants.get(&m.machine_id) {
                                None => "-",
                                Some(t) => {
                                    (t.project.as_deref().unwrap_or("shared pool"))
                                    @if let Some((_, host)) = &t.device { ": " (host) }
                                },
                            }
                        }
                    }
                }
            }
        }
    }
}
